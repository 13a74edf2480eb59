"""Build the prompts a run sends: `random` (exact lengths in the server's tokens), `sharegpt`
and `jsonl` datasets, and the categorized kinds of `benchkit.measure.datasets` (`speed_bench`,
`mt_bench`, `spec_bench`; `jsonl` with an optional `category`): each prompt keeps its category,
which the load client copies into its request's log (`RequestLog.category`).

Exact input lengths come from the server's own tokenizer through vLLM's endpoints
(`vllm/entrypoints/serve/tokenize/protocol.py`):

- `POST /tokenize {"model", "prompt", "add_special_tokens"}` -> `{"count", "max_model_len",
  "tokens"}`;
- `POST /detokenize {"model", "tokens"}` -> `{"prompt"}`.

`input_len` is counted the way `/v1/completions` counts `usage.prompt_tokens`: with the
tokenizer's special tokens (e.g. BOS) included. For the chat API the chat template adds further
tokens, which these lengths do not include. A server without these endpoints (HTTP 404/405/501)
gets a local approximation instead and every prompt is
flagged `approx=True`.

Everything is deterministic for a given seed. `build_prompts` returns `workload.n_warmup +
workload.num_prompts` prompts by default: the first `n_warmup` are the warmup prompts, so warmup
never warms the prefix cache for a measured prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np

from benchkit.measure import datasets
from benchkit.specs import WorkloadSpec

#: Text whose tokens seed the random-token pool (any varied text works; it only has to
#: produce many distinct ordinary tokens in the server's vocabulary).
_POOL_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches; "
    "numbers 0123456789 and words like measurement, throughput, latency, token, server, river, "
    "mountain, garden, window, yellow, system, history, between, picture, quality, thousand, "
    "question, science, problem, morning, because, through, country, example, government, "
    "company, student, program, family, market, result, change, public, research, general, "
    "Speculative decoding drafts several tokens and verifies them in one target pass. "
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz .,:;!?()[]{}<>+-*/=%&#@$"
)

#: Words for the local approximation (about one token each for common BPE tokenizers).
_APPROX_WORDS = _POOL_TEXT.replace(";", " ").replace(",", " ").split()

#: HTTP statuses meaning "this server has no tokenizer endpoint".
_NO_ENDPOINT = (404, 405, 501)


class WorkloadError(ValueError):
    """A workload cannot be built; the message names the file, line or field at fault."""


class NoTokenizerEndpoint(Exception):
    """The server answered that it has no /tokenize or /detokenize endpoint."""


@dataclass
class Prompt:
    """One prompt: `text`, `input_len` (tokens, in the server's tokenizer incl. special tokens
    unless `approx`), `output_len` (tokens requested, sent as max_tokens) and `approx` (True
    when `input_len` is a local approximation because the server has no tokenizer endpoint),
    `category` (the dataset's category of the prompt, "" where it has none), `seed` (the request's
    sampling seed; None: the workload's `seed`)."""

    text: str
    input_len: int
    output_len: int
    approx: bool = False
    category: str = ""
    seed: int | None = None


class TokenizerClient:
    """Synchronous client for a vLLM-style server's /tokenize and /detokenize endpoints.

    Raises NoTokenizerEndpoint when the server answers 404/405/501, httpx errors for transport
    problems, and WorkloadError for any other non-2xx answer or a malformed body.
    """

    def __init__(
        self, base_url: str, model: str, timeout_s: float = 30.0, client: httpx.Client | None = None
    ):
        self.model = model
        self._own = client is None
        self._client = client or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s)

    def close(self) -> None:
        """Close the HTTP client when this object created it."""
        if self._own:
            self._client.close()

    def _post(self, path: str, body: dict) -> dict:
        resp = self._client.post(path, json=body)
        if resp.status_code in _NO_ENDPOINT:
            raise NoTokenizerEndpoint(f"{path}: HTTP {resp.status_code}")
        if resp.status_code // 100 != 2:
            raise WorkloadError(f"{path}: HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            return resp.json()
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}: response is not JSON ({exc})") from exc

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` in the server's tokenizer (`POST /tokenize`)."""
        body = self._post(
            "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        )
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise WorkloadError(f"/tokenize: response has no 'tokens' list: {str(body)[:200]}")
        return tokens

    def detokenize(self, tokens: list[int]) -> str:
        """Text of token ids `tokens` (`POST /detokenize`)."""
        body = self._post("/detokenize", {"model": self.model, "tokens": [int(t) for t in tokens]})
        text = body.get("prompt")
        if not isinstance(text, str):
            raise WorkloadError(f"/detokenize: response has no 'prompt' string: {str(body)[:200]}")
        return text


def approx_token_count(text: str) -> int:
    """Local approximation of a text's token count: about 4 characters per token (the usual
    rule of thumb for English BPE tokenizers), at least 1."""
    return max(1, round(len(text) / 4))


def random_prompts(
    n: int,
    input_len: int,
    output_len: int,
    seed: int,
    tok: TokenizerClient | None,
    max_retries: int = 10,
) -> list[Prompt]:
    """`n` prompts of exactly `input_len` server tokens made of random tokens (seeded).

    With a tokenizer client: learn a pool of ordinary token ids by tokenizing a fixed text,
    draw `input_len - n_special` ids from it (n_special = tokens the tokenizer adds to an empty
    prompt), detokenize, re-tokenize, and adjust (cut or extend the re-tokenized ids) until
    `/tokenize` counts exactly `input_len`, at most `max_retries` rounds per prompt. Without
    one (tok is None): random words, `input_len` words, flagged approx. Raises WorkloadError
    when input_len is below the special-token count or a prompt does not converge.
    """
    if input_len < 1 or output_len < 1:
        raise WorkloadError(
            f"workload: input_len and output_len must be >= 1 (got {input_len}, {output_len})"
        )
    rng = np.random.default_rng(seed)
    if tok is None:
        words = np.array(_APPROX_WORDS)
        return [
            Prompt(" ".join(rng.choice(words, size=input_len)), input_len, output_len, approx=True)
            for _ in range(n)
        ]
    pool = np.array(sorted(set(tok.tokenize(_POOL_TEXT, add_special_tokens=False))))
    n_special = len(tok.tokenize("", add_special_tokens=True))
    target = input_len - n_special
    if target < 1:
        raise WorkloadError(
            f"workload: input_len {input_len} leaves no room beside {n_special} special token(s)"
        )
    prompts = []
    for i in range(n):
        ids = list(rng.choice(pool, size=target))
        for _ in range(max_retries):
            text = tok.detokenize(ids)
            count = len(tok.tokenize(text, add_special_tokens=True))
            if count == input_len:
                prompts.append(Prompt(text, input_len, output_len))
                break
            # Continue from the canonical (re-tokenized) ids: they round-trip far more often.
            plain = tok.tokenize(text, add_special_tokens=False)
            if len(plain) > target:
                ids = plain[:target]
            elif len(plain) < target:
                ids = plain + list(rng.choice(pool, size=target - len(plain)))
            else:
                ids = plain[:-1] + list(rng.choice(pool, size=1))
        else:
            raise WorkloadError(
                f"workload: random prompt {i}: could not reach exactly {input_len} tokens in "
                f"{max_retries} rounds (last count {count}); the server's tokenizer does not "
                "round-trip these tokens"
            )
    return prompts


def _count(tok: TokenizerClient | None, text: str) -> tuple[int, bool]:
    if tok is None:
        return approx_token_count(text), True
    return len(tok.tokenize(text, add_special_tokens=True)), False


def load_sharegpt(path: str | Path) -> list[str]:
    """First human turn of every conversation in a ShareGPT JSON file.

    Format: a JSON list of {"conversations": [{"from": "human", "value": str}, {"from": "gpt",
    ...}, ...]}. Entries whose first turn is not a non-empty human turn are skipped. Raises
    WorkloadError naming the file (and entry) for unreadable files or wrong shapes.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{p}: cannot read ShareGPT JSON ({exc})") from exc
    if not isinstance(data, list):
        raise WorkloadError(f"{p}: ShareGPT file must hold a JSON list, got {type(data).__name__}")
    texts = []
    for i, entry in enumerate(data):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise WorkloadError(f"{p}: entry {i}: missing 'conversations' list")
        if not conv or not isinstance(conv[0], dict):
            continue
        first = conv[0]
        if (
            first.get("from") in ("human", "user")
            and isinstance(first.get("value"), str)
            and first["value"].strip()
        ):
            texts.append(first["value"])
    return texts


def load_jsonl(path: str | Path) -> list[tuple[str, int | None]]:
    """(prompt, output_len or None) per line of a JSON-lines file, in file order (`load_jsonl_rows`
    without the categories)."""
    return [(prompt, out) for prompt, out, _ in load_jsonl_rows(path)]


def load_jsonl_rows(path: str | Path) -> list[tuple[str, int | None, str]]:
    """(prompt, output_len or None, category or "") per line of a JSON-lines file, in file order.

    Each non-blank line is {"prompt": str, "output_len": int >= 1 (optional), "category":
    non-empty str (optional)}. Raises WorkloadError naming the file and 1-based line for bad
    JSON, a missing/empty prompt, a bad output_len or an empty category.
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{p}: cannot read JSON lines ({exc})") from exc
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise WorkloadError(f"{p}:{lineno}: expected an object with 'prompt', got {type(obj).__name__}")
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise WorkloadError(f"{p}:{lineno}: field 'prompt' must be a non-empty string")
        out = obj.get("output_len")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise WorkloadError(f"{p}:{lineno}: field 'output_len' must be an integer >= 1, got {out!r}")
        cat = obj.get("category", "")
        if "category" in obj and (not isinstance(cat, str) or not cat.strip()):
            raise WorkloadError(f"{p}:{lineno}: field 'category' must be a non-empty string, got {cat!r}")
        rows.append((prompt, out, cat))
    return rows


def build_prompts(
    workload: WorkloadSpec,
    *,
    base_url: str | None = None,
    model: str = "",
    count: int | None = None,
    timeout_s: float = 30.0,
) -> list[Prompt]:
    """Build `count` prompts (default `workload.n_warmup + workload.num_prompts`) for `workload`.

    `random`: exact `workload.input_len` server tokens (see `random_prompts`). `sharegpt`: the
    first human turns of `workload.dataset_path`, shuffled with `workload.seed`, the first
    `count` taken. `jsonl`: the file's prompts in file order, the first `count` taken; a line's
    `output_len` overrides `workload.output_len`. `speed_bench`, `mt_bench`, `spec_bench` (and
    `jsonl` when the workload names categories or a per-category count): `categorized_rows`;
    every prompt carries its category. Input lengths come from the server's
    /tokenize at `base_url` when it has one; otherwise (or with base_url None) they are
    approximated and flagged. Raises WorkloadError for an unknown dataset, a bad file, or a
    dataset with fewer than `count` usable prompts.
    """
    n = workload.n_warmup + workload.num_prompts if count is None else count
    samples = workload.samples_per_prompt
    if samples > 1 and count is None:
        return repeat_samples(build_prompts(workload, base_url=base_url, model=model, timeout_s=timeout_s,
                                            count=workload.n_warmup + distinct_prompts(workload)), workload)
    tok = TokenizerClient(base_url, model, timeout_s) if base_url else None
    try:
        return _build(workload, n, tok)
    except NoTokenizerEndpoint:
        return _build(workload, n, None)
    finally:
        if tok is not None:
            tok.close()


def distinct_prompts(workload: WorkloadSpec) -> int:
    """The distinct measured prompts of `workload`: num_prompts / samples_per_prompt. WorkloadError
    when num_prompts is not a multiple of samples_per_prompt."""
    samples = workload.samples_per_prompt
    if samples < 1 or workload.num_prompts % samples:
        raise WorkloadError(f"workload: num_prompts {workload.num_prompts} must be a multiple of "
                            f"samples_per_prompt {samples}")
    return workload.num_prompts // samples


def repeat_samples(prompts: list[Prompt], workload: WorkloadSpec) -> list[Prompt]:
    """The request list of a workload with samples_per_prompt N (the seed policy, docs/LOSSLESS.md
    "Sampling (T > 0)"): the warmup prompts (the first `n_warmup` of `prompts`) once each with
    seed None (the workload's seed), then N rounds over the P = len(prompts) - n_warmup measured
    prompts in order, round j with seed `workload.seed + j`: measured request j * P + i is prompt i's
    occurrence j. Interleaved rather than back to back, so one prompt's samples are not batched with
    each other and a drift over the window spreads over every prompt."""
    n_warm = workload.n_warmup
    samples = workload.samples_per_prompt
    warm, measured = prompts[:n_warm], prompts[n_warm:]
    return warm + [replace(p, seed=workload.seed + j) for j in range(samples) for p in measured]


def categorized_rows(workload: WorkloadSpec, n: int) -> list[tuple[str, int | None, str]]:
    """(text, output_len or None, category) of the `n` prompts of a categorized workload
    (`datasets.CATEGORIZED_KINDS`; `jsonl` only when the workload names categories or a
    per-category count): warmup prompts first (`datasets.with_warmup`: outside the measured
    sample), then the measured selection (`datasets.load_prompts`). Needs no server. Raises
    WorkloadError (`file:line: field: reason`) for a bad file or too few prompts."""
    try:
        chosen = datasets.run_selection(workload, n)
    except (datasets.DatasetError, ValueError) as exc:
        raise WorkloadError(str(exc)) from exc
    return [(p.text, p.output_len, p.category) for p in chosen]


def _build(workload: WorkloadSpec, n: int, tok: TokenizerClient | None) -> list[Prompt]:
    if workload.dataset == "random":
        return random_prompts(n, workload.input_len, workload.output_len, workload.seed, tok)
    opts = datasets.DatasetOptions.of_workload(workload)
    if workload.dataset == "sharegpt":
        texts = load_sharegpt(workload.dataset_path)
        order = np.random.default_rng(workload.seed).permutation(len(texts))
        rows = [(texts[i], None, "") for i in order]
    elif workload.dataset == "jsonl" and not (opts.categories or opts.per_category):
        rows = load_jsonl_rows(workload.dataset_path)
    elif workload.dataset in datasets.CATEGORIZED_KINDS:
        rows = categorized_rows(workload, n)
    else:
        raise WorkloadError(
            f"workload: unknown dataset {workload.dataset!r} (expected random, sharegpt, "
            f"{', '.join(datasets.CATEGORIZED_KINDS)})"
        )
    if len(rows) < n:
        raise WorkloadError(
            f"{workload.dataset_path}: {len(rows)} usable prompt(s), the run needs {n} "
            f"(warmup + num_prompts; prompts are not reused, so the prefix cache stays cold)"
        )
    prompts = []
    for text, out, category in rows[:n]:
        length, approx = _count(tok, text)
        prompts.append(Prompt(text, length, out or workload.output_len, approx=approx, category=category))
    return prompts
