"""What each measured request generated, kept small enough to store with every run, and the
pure comparison of two runs' outputs prompt by prompt (the lossless check of issue 18).

At temperature 0 a speculative configuration must produce what autoregressive decoding produces
for the same prompt (MEASUREMENT.md, "Comparing runs"). To say so, a run keeps per request:

- `kind`: what was compared: the token ids the server returned (vLLM completions with
  `return_token_ids: true` put `token_ids` on every streamed choice), else the text (unit: one
  Unicode code point), else nothing (a failed request);
- `length` (tokens or characters), `whole`: an 8-byte BLAKE2b hash of the whole output;
- `blocks`: a 4-byte BLAKE2b hash of each block of BLOCK_TOKENS ids (BLOCK_CHARS characters),
  the last block possibly shorter;
- for the first FULL_REQUESTS measured prompts (by prompt index) the whole output itself; for
  every measured request when the workload sends several samples per prompt (`full_requests`).

`prompt`: an 8-byte hash of the prompt text, so two runs are compared only where they sent the
same prompt. Size: 33 bytes per request plus 4 per block, i.e. about 160 bytes for a
2 000-token output; a 10 000-request x 2 000-token run keeps about 1.6 MB of hashes plus 256 KB
of full ids for 32 requests (`encoded_size_estimate`).

`compare_outputs(a, b, by=)` answers per prompt present in both (paired by prompt index, or by
prompt hash for runs whose warmup differs): identical, or the first
position (tokens or characters) where they differ: exact where both runs kept that prompt's
whole output, else to the block (the first differing block's first position; the divergence lies
in [position, position + block)). A prompt sent with different text, or compared across units
(ids in one run, text in the other), or failed in either run, is `not_comparable` with the
reason. Hash equality stands for equality (a false match has odds of 2^-64 for the whole
output; block hashes only locate a divergence already known).
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from benchkit.inflate import MAX_BLOB_BYTES, inflate_zlib

#: Token ids per block hash, and characters per block where only text is known.
BLOCK_TOKENS = 64
BLOCK_CHARS = 256
#: Measured prompts (the lowest prompt indices) whose whole output is kept.
FULL_REQUESTS = 32
#: A workload with samples_per_prompt > 1 keeps every measured output whole (`full_requests`):
#: the T > 0 check (benchkit.compare.sampling) reads the token ids of every sample; such outputs
#: are short (max_tokens 9 is enough), e.g. 3 200 requests x 9 ids = 115 KB.


def full_requests(num_prompts: int, samples_per_prompt: int = 1, full: int = FULL_REQUESTS) -> int:
    """How many measured requests (the lowest prompt indices) keep their whole output: every one
    (`num_prompts`) when the workload sends `samples_per_prompt` > 1 samples per prompt, else
    `full` (FULL_REQUESTS). The blob layout is the same either way (old blobs decode)."""
    return num_prompts if samples_per_prompt > 1 else full


#: Version tag of the encoded layout; `decode_outputs` refuses others.
FORMAT_VERSION = 1

KINDS = ("none", "ids", "text")
UNITS = {"ids": "token", "text": "char"}


def _h8(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _h4(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


def prompt_hash(text: str) -> int:
    """8-byte hash of a prompt's text (UTF-8), as an unsigned int."""
    return _h8(text.encode("utf-8"))


@dataclass
class OutputRecord:
    """One request's output digest (module docstring). `full`: the whole output (a list of ids or
    a str) where it was kept, else None."""

    index: int
    prompt: int
    kind: str
    length: int
    whole: int
    blocks: list[int]
    full: list[int] | str | None = None


def digest_output(index: int, prompt_text: str, ids: Sequence[int] | None, text: str | None,
                  keep_full: bool, block_tokens: int = BLOCK_TOKENS, block_chars: int = BLOCK_CHARS) -> OutputRecord:
    """The OutputRecord of one request: over `ids` when given (int32 little-endian bytes), else
    over `text` (UTF-8 per block of `block_chars` code points), else kind "none"."""
    ph = prompt_hash(prompt_text)
    if ids is not None:
        arr = ids if isinstance(ids, array) and ids.typecode == "i" else array("i", ids)
        raw = arr.tobytes()
        step = block_tokens * arr.itemsize
        blocks = [_h4(raw[i:i + step]) for i in range(0, len(raw), step)]
        return OutputRecord(index, ph, "ids", len(arr), _h8(raw), blocks, list(arr) if keep_full else None)
    if text is not None:
        blocks = [_h4(text[i:i + block_chars].encode("utf-8")) for i in range(0, len(text), block_chars)]
        return OutputRecord(index, ph, "text", len(text), _h8(text.encode("utf-8")), blocks,
                            text if keep_full else None)
    return OutputRecord(index, ph, "none", 0, 0, [])


@dataclass
class RunOutputs:
    """Every measured request's OutputRecord of one run, by prompt index, plus the block sizes
    used. Build with `RunOutputs.from_records`; store with `encode_outputs`."""

    records: dict[int, OutputRecord] = field(default_factory=dict)
    block_tokens: int = BLOCK_TOKENS
    block_chars: int = BLOCK_CHARS

    @classmethod
    def from_records(cls, records: Iterable[OutputRecord], block_tokens: int = BLOCK_TOKENS,
                     block_chars: int = BLOCK_CHARS) -> RunOutputs:
        return cls({r.index: r for r in records}, block_tokens, block_chars)

    def __len__(self) -> int:
        return len(self.records)


def encode_outputs(outputs: RunOutputs) -> bytes:
    """Bytes of `outputs` (zlib over msgpack: numpy columns as raw little-endian bytes, the kept
    full outputs as lists). Inverse: `decode_outputs`."""
    recs = sorted(outputs.records.values(), key=lambda r: r.index)
    doc = {
        "v": FORMAT_VERSION,
        "block_tokens": outputs.block_tokens,
        "block_chars": outputs.block_chars,
        "index": np.asarray([r.index for r in recs], dtype="<i4").tobytes(),
        "prompt": np.asarray([r.prompt for r in recs], dtype="<u8").tobytes(),
        "kind": bytes(KINDS.index(r.kind) for r in recs),
        "length": np.asarray([r.length for r in recs], dtype="<i4").tobytes(),
        "whole": np.asarray([r.whole for r in recs], dtype="<u8").tobytes(),
        "n_blocks": np.asarray([len(r.blocks) for r in recs], dtype="<i4").tobytes(),
        "blocks": np.asarray([b for r in recs for b in r.blocks], dtype="<u4").tobytes(),
        "full_index": [r.index for r in recs if r.full is not None],
        "full_ids": [np.asarray(r.full, dtype="<i4").tobytes() for r in recs if isinstance(r.full, list)],
        "full_text": [r.full for r in recs if isinstance(r.full, str)],
    }
    return zlib.compress(msgspec.msgpack.encode(doc), 6)


def decode_outputs(data: bytes) -> RunOutputs:
    """Decode bytes written by `encode_outputs`. Raises ValueError naming the problem (not zlib /
    msgpack data, unknown version, columns of inconsistent length); InflateLimitError (a
    ValueError) when they decompress to more than MAX_BLOB_BYTES (256 MiB, benchkit.inflate;
    about 1.6 MB per 10 000 requests is real), reading stopped there."""
    try:
        doc = msgspec.msgpack.decode(inflate_zlib(data, "outputs", MAX_BLOB_BYTES, "MAX_BLOB_BYTES"))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise ValueError(f"outputs: not an encoded outputs blob ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        raise ValueError(f"outputs: unsupported format version {doc.get('v') if isinstance(doc, dict) else None!r}")
    try:
        index = np.frombuffer(doc["index"], dtype="<i4")
        cols = {k: np.frombuffer(doc[k], dtype=t) for k, t in
                (("prompt", "<u8"), ("length", "<i4"), ("whole", "<u8"), ("n_blocks", "<i4"))}
        kinds = list(doc["kind"])
        blocks = np.frombuffer(doc["blocks"], dtype="<u4")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"outputs: bad column ({exc})") from exc
    n = len(index)
    if any(len(c) != n for c in cols.values()) or len(kinds) != n:
        raise ValueError("outputs: columns of different lengths")
    if int(cols["n_blocks"].sum()) != len(blocks) or any(k >= len(KINDS) for k in kinds):
        raise ValueError("outputs: block count or kind code out of range")
    full_ids = iter(doc.get("full_ids", []))
    full_text = iter(doc.get("full_text", []))
    keep = set(doc.get("full_index", []))
    records, pos = {}, 0
    for i in range(n):
        nb = int(cols["n_blocks"][i])
        kind = KINDS[kinds[i]]
        idx = int(index[i])
        full: list[int] | str | None = None
        if idx in keep:
            full = np.frombuffer(next(full_ids), dtype="<i4").tolist() if kind == "ids" else next(full_text)
        records[idx] = OutputRecord(idx, int(cols["prompt"][i]), kind, int(cols["length"][i]),
                                    int(cols["whole"][i]), blocks[pos:pos + nb].tolist(), full)
        pos += nb
    return RunOutputs(records, int(doc["block_tokens"]), int(doc["block_chars"]))


def encoded_size_estimate(n_requests: int, output_tokens: int, full_requests: int = FULL_REQUESTS,
                          block_tokens: int = BLOCK_TOKENS) -> int:
    """Bytes `encode_outputs` needs at most for `n_requests` outputs of `output_tokens` ids each
    (before compression, which cannot shrink hashes): 33 bytes per request plus 4 per block plus
    4 per token of each kept full output."""
    blocks = -(-output_tokens // block_tokens)
    return n_requests * (33 + 4 * blocks) + min(full_requests, n_requests) * 4 * output_tokens


@dataclass(frozen=True)
class OutputMatch:
    """One prompt compared across two runs.

    `status`: "identical", "diverged" or "not_comparable". `first_divergence`: for "diverged",
    the first position (in `unit`: "token" or "char") where the outputs differ, a shorter output
    that is a prefix of the longer diverging at its own length; `precision`: "exact" (both runs
    kept this prompt's whole output) or "block" (the divergence lies in [first_divergence,
    first_divergence + `block`)). `length_a` / `length_b`: output lengths. `reason`: why not
    comparable."""

    index: int
    status: str
    first_divergence: int | None = None
    precision: str | None = None
    unit: str | None = None
    block: int | None = None
    length_a: int = 0
    length_b: int = 0
    reason: str = ""


def _first_diff(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _by_prompt(run: RunOutputs) -> dict[tuple[int, int], OutputRecord]:
    """{(prompt hash, occurrence): record}: the n-th request of one prompt text (in index order)."""
    seen: dict[int, int] = {}
    out = {}
    for idx in sorted(run.records):
        r = run.records[idx]
        n = seen[r.prompt] = seen.get(r.prompt, -1) + 1
        out[(r.prompt, n)] = r
    return out


def compare_outputs(run_a: RunOutputs, run_b: RunOutputs, by: str = "index") -> list[OutputMatch]:
    """An OutputMatch (module docstring) per prompt present in both runs, in run a's index order
    (`OutputMatch.index` is run a's). `by`: "index" pairs requests by prompt index (runs that sent
    the same prompt list with the same warmup); "prompt" pairs them by prompt hash (the n-th
    request of a prompt text in one run with the n-th in the other), so runs whose warmup or
    prompt count differ (another concurrency: at least as many warmup requests as the
    concurrency) compare on the prompts they share. Pure. Runs with different block sizes compare
    exactly where both kept full outputs and are otherwise not comparable per prompt (say so in
    `reason`). Raises ValueError for another `by`."""
    if by == "index":
        pairs = [(run_a.records[i], run_b.records[i]) for i in sorted(set(run_a.records) & set(run_b.records))]
    elif by == "prompt":
        ka, kb = _by_prompt(run_a), _by_prompt(run_b)
        pairs = sorted(((ka[k], kb[k]) for k in set(ka) & set(kb)), key=lambda ab: ab[0].index)
    else:
        raise ValueError(f"compare_outputs: by must be 'index' or 'prompt', got {by!r}")
    out = []
    for a, b in pairs:
        idx = a.index
        if a.prompt != b.prompt:
            out.append(OutputMatch(idx, "not_comparable", reason="the two runs sent different prompt text"))
            continue
        if a.kind == "none" or b.kind == "none":
            out.append(OutputMatch(idx, "not_comparable", length_a=a.length, length_b=b.length,
                                   reason="no output kept in " + ("both runs" if a.kind == b.kind else
                                                                  ("run a" if a.kind == "none" else "run b"))))
            continue
        if a.kind != b.kind:
            out.append(OutputMatch(idx, "not_comparable", length_a=a.length, length_b=b.length,
                                   reason=f"run a kept {a.kind}, run b kept {b.kind}"))
            continue
        unit = UNITS[a.kind]
        block = run_a.block_tokens if a.kind == "ids" else run_a.block_chars
        if a.length == b.length and a.whole == b.whole:
            out.append(OutputMatch(idx, "identical", unit=unit, length_a=a.length, length_b=b.length))
            continue
        if a.full is not None and b.full is not None:
            out.append(OutputMatch(idx, "diverged", _first_diff(a.full, b.full), "exact", unit, None,
                                   a.length, b.length))
            continue
        block_b = run_b.block_tokens if a.kind == "ids" else run_b.block_chars
        if block != block_b:
            out.append(OutputMatch(idx, "not_comparable", unit=unit, length_a=a.length, length_b=b.length,
                                   reason=f"different block sizes ({block} and {block_b}) and no full output"))
            continue
        j = _first_diff(a.blocks, b.blocks)
        out.append(OutputMatch(idx, "diverged", min(j * block, a.length, b.length), "block", unit, block,
                               a.length, b.length))
    return out


@dataclass(frozen=True)
class OutputsSummary:
    """`compared` prompts (identical + diverged), `identical`, `identical_share` (0..1, None when
    nothing was compared), `not_comparable`, `median_first_divergence` (in `unit`, over diverged
    prompts; None without any), `exact` (every divergence position is exact)."""

    compared: int
    identical: int
    identical_share: float | None
    not_comparable: int
    median_first_divergence: float | None
    unit: str | None
    exact: bool


def summarize_matches(matches: Sequence[OutputMatch]) -> OutputsSummary:
    """Counts and the median first divergence of `compare_outputs`' answer."""
    diverged = [m for m in matches if m.status == "diverged"]
    identical = sum(1 for m in matches if m.status == "identical")
    compared = identical + len(diverged)
    units = {m.unit for m in matches if m.unit}
    return OutputsSummary(
        compared=compared, identical=identical, identical_share=identical / compared if compared else None,
        not_comparable=sum(1 for m in matches if m.status == "not_comparable"),
        median_first_divergence=float(np.median([m.first_divergence for m in diverged])) if diverged else None,
        unit=units.pop() if len(units) == 1 else None,
        exact=all(m.precision == "exact" for m in diverged))
