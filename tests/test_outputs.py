"""Output digests for the lossless check: what a run keeps per request, its size, and the
comparison of two runs prompt by prompt, unit-level and through the real client against the
synthetic server (which can make a share of prompts diverge after token p)."""

from __future__ import annotations

import pytest

from benchkit.measure import outputs as out
from benchkit.measure.loadclient import ClientOptions
from benchkit.measure.loadgen import run_load_sync
from benchkit.measure.workloads import Prompt
from benchkit.specs import WorkloadSpec
from tests.synthetic_server import SyntheticConfig, SyntheticServer


def run_of(outputs: dict[int, list[int] | str], full_below: int = 0, prompts: dict[int, str] | None = None,
           block_tokens: int = 4, block_chars: int = 8) -> out.RunOutputs:
    recs = []
    for i, o in outputs.items():
        text = (prompts or {}).get(i, f"prompt {i}")
        if isinstance(o, str):
            recs.append(out.digest_output(i, text, None, o, i < full_below, block_tokens, block_chars))
        else:
            recs.append(out.digest_output(i, text, o, None, i < full_below, block_tokens, block_chars))
    return out.RunOutputs.from_records(recs, block_tokens, block_chars)


def test_identical_exact_and_block_divergence():
    base = {0: list(range(10)), 1: list(range(10)), 2: list(range(10)), 3: list(range(10))}
    other = {0: list(range(10)),  # identical
             1: [0, 1, 2, 3, 4, 99, 6, 7, 8, 9],  # differs at 5, full kept: exact
             2: [0, 1, 2, 3, 4, 5, 99, 7, 8, 9],  # differs at 6, no full: block [4, 8)
             3: list(range(7))}  # a prefix: diverges at its own length
    a, b = run_of(base, full_below=2), run_of(other, full_below=2)
    m = {x.index: x for x in out.compare_outputs(a, b)}
    assert m[0].status == "identical" and m[0].unit == "token"
    assert (m[1].status, m[1].first_divergence, m[1].precision) == ("diverged", 5, "exact")
    assert (m[2].status, m[2].first_divergence, m[2].precision, m[2].block) == ("diverged", 4, "block", 4)
    assert (m[3].status, m[3].first_divergence, m[3].length_a, m[3].length_b) == ("diverged", 4, 10, 7)
    s = out.summarize_matches(list(m.values()))
    assert (s.compared, s.identical, s.identical_share, s.exact) == (4, 1, 0.25, False)
    assert s.median_first_divergence == 4.0 and s.unit == "token"


def test_text_prompts_and_units_that_cannot_compare():
    a = run_of({0: "hello world", 1: "abc", 2: [1, 2], 3: "x"}, prompts={3: "one prompt"})
    b = run_of({0: "hello worlD", 1: "abc", 2: "ab", 3: "x"}, prompts={3: "another prompt"})
    m = {x.index: x for x in out.compare_outputs(a, b)}
    assert (m[0].status, m[0].unit, m[0].first_divergence, m[0].precision) == ("diverged", "char", 8, "block")
    assert m[1].status == "identical"
    assert m[2].status == "not_comparable" and "ids" in m[2].reason and "text" in m[2].reason
    assert m[3].status == "not_comparable" and "different prompt" in m[3].reason
    failed = out.RunOutputs.from_records([out.digest_output(0, "prompt 0", None, None, False)])
    assert out.compare_outputs(failed, a)[0].status == "not_comparable"


def test_encode_round_trip_and_errors():
    run = run_of({0: list(range(100)), 1: "text \u4e2d", 5: [7] * 3, 6: ""}, full_below=2)
    back = out.decode_outputs(out.encode_outputs(run))
    assert back == run
    with pytest.raises(ValueError, match="not an encoded outputs blob"):
        out.decode_outputs(b"junk")


def test_size_per_request_of_a_big_run():
    """10 000 requests x 2 000 tokens stay within a few MB (hashes do not compress)."""
    n, tokens = 2000, 2000  # a fifth of the run, encoded for real; the estimate scales linearly
    recs = [out.digest_output(i, f"p{i}", list(range(i, i + tokens)), None, i < out.FULL_REQUESTS)
            for i in range(n)]
    size = len(out.encode_outputs(out.RunOutputs.from_records(recs)))
    per_request = (size - out.FULL_REQUESTS * 4 * tokens) / n
    assert per_request <= 33 + 4 * 32 + 8  # 32 blocks of 64 ids
    estimate = out.encoded_size_estimate(10_000, tokens)
    assert estimate < 2.5e6
    assert size <= out.encoded_size_estimate(n, tokens)


def prompts(n: int, out_len: int) -> list[Prompt]:
    return [Prompt(f"lossless prompt {i} " * 2, 40, out_len) for i in range(n)]


@pytest.mark.parametrize("ids", [True, False])
def test_client_keeps_outputs_and_finds_the_lossy_share(ids):
    """A lossless run against itself is identical everywhere; a server that upper-cases every
    token from position 9 on for a share of prompts diverges exactly there (exact where full
    outputs are kept, to the block elsewhere), and only on that share."""
    wl = WorkloadSpec(num_prompts=40, concurrency=4, output_len=24)
    opts = ClientOptions(return_token_ids=ids, full_outputs=10)
    ps = prompts(44, 24)
    with SyntheticServer(SyntheticConfig(ttft_ms=1, gap_ms=1, tokens_per_message=2)) as url:
        ref = run_load_sync(url, "synthetic", wl, prompts=ps, options=opts)
        again = run_load_sync(url, "synthetic", wl, prompts=ps, options=opts)
    lossy_cfg = SyntheticConfig(ttft_ms=1, gap_ms=1, tokens_per_message=2, diverge_after=9, diverge_share=0.5)
    with SyntheticServer(lossy_cfg) as url:
        lossy = run_load_sync(url, "synthetic", wl, prompts=ps, options=opts)
    assert len(ref.outputs) == 40 and min(ref.outputs.records) == 4  # measured requests only
    assert {r.kind for r in ref.outputs.records.values()} == {"ids" if ids else "text"}
    assert sorted(i for i, r in ref.outputs.records.items() if r.full is not None) == list(range(4, 14))
    same = out.summarize_matches(out.compare_outputs(ref.outputs, again.outputs))
    assert (same.compared, same.identical) == (40, 40)
    matches = out.compare_outputs(ref.outputs, out.decode_outputs(out.encode_outputs(lossy.outputs)))
    expected = {i for i in range(4, 44) if lossy_cfg.diverges(ps[i].text)}
    assert 5 < len(expected) < 35
    assert {m.index for m in matches if m.status == "diverged"} == expected
    block = out.BLOCK_TOKENS if ids else out.BLOCK_CHARS
    for m in matches:
        if m.status == "diverged":
            want = (9, "exact") if m.index < 14 else (9 // block * block, "block")
            assert (m.first_divergence, m.precision) == want
    s = out.summarize_matches(matches)
    assert s.identical == 40 - len(expected) and s.unit == ("token" if ids else "char")
