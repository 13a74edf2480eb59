"""The column (numpy) implementation of the metrics and log decoding gives exactly the figures
of the pure-Python reference it replaced (tests/metrics_reference.py, commit 74508a7), on
arbitrary logs: out-of-order and tied arrivals, usage-only and empty messages, reasoning,
failed requests, missing server counts, warmup, any window and SLO."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from benchkit.measure import metrics
from benchkit.measure.logs import (
    KINDS,
    MessageEvent,
    RequestLog,
    columns_of,
    decode_columns,
    decode_logs,
    encode_logs,
    encode_logs_v1,
)
from tests import metrics_reference as ref

MS = 1_000_000


@st.composite
def request_logs(draw) -> list[RequestLog]:
    logs = []
    for i in range(draw(st.integers(0, 6))):
        send = draw(st.integers(0, 50)) * MS * 10
        n_events = draw(st.integers(0, 12))
        times = sorted(draw(st.lists(st.integers(0, 400), min_size=n_events, max_size=n_events)))
        if draw(st.booleans()):  # arrivals out of order (sorted by the metrics)
            times = draw(st.permutations(times))
        events = [MessageEvent(t_ns=send + t * MS // 4, tokens=draw(st.integers(0, 5)),
                               kind=draw(st.sampled_from(KINDS))) for t in times]
        ok = draw(st.booleans()) or draw(st.booleans())
        logs.append(RequestLog(
            index=i, warmup=draw(st.booleans()) and draw(st.booleans()), send_ns=send, events=events, ok=ok,
            error="" if ok else draw(st.sampled_from(["", "http 500: boom", "timeout after 1.0 s"])),
            prompt_tokens=draw(st.none() | st.integers(0, 64)), completion_tokens=draw(st.none() | st.integers(0, 40)),
            tokens_from_text=draw(st.booleans()), input_len=32, output_len=16,
            end_ns=send + draw(st.integers(0, 200)) * MS))
    return logs


slos = st.none() | st.dictionaries(st.sampled_from(metrics.SLO_KEYS), st.floats(0.5, 200.0), max_size=4)


def same(a, b) -> bool:
    """Equal, NaN equal to NaN (dataclasses compare fields)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@settings(max_examples=300, deadline=None)
@given(logs=request_logs(), start_ms=st.integers(0, 400), length_ms=st.integers(0, 900), slo=slos)
def test_window_metrics_equal_the_reference(logs, start_ms, length_ms, slo):
    start, end = start_ms * MS, (start_ms + length_ms) * MS
    want = ref.compute_run_metrics(logs, start, end, slo)
    assert metrics.compute_run_metrics(logs, start, end, slo) == want
    window, dist = metrics.measure_window(decode_columns(encode_logs(logs)), start, end, slo)
    assert window == want
    assert dist == ref.distributions(logs) == metrics.distributions(logs)
    assert metrics.coalesced_share(logs) == ref.coalesced_share(logs)
    assert metrics.coalesced_share(logs, gap_ms=5.0) == ref.coalesced_share(logs, gap_ms=5.0)
    assert metrics.mean_decode_tokens_per_chunk(logs) == ref.mean_decode_tokens_per_chunk(logs)


@settings(max_examples=300, deadline=None)
@given(logs=request_logs())
def test_request_metrics_and_decoding_equal_the_reference(logs):
    for log in logs:
        got, want = metrics.request_metrics(log), ref.request_metrics(log)
        assert all(same(getattr(got, f), getattr(want, f)) for f in want.__dataclass_fields__), (got, want)
    old = encode_logs_v1(logs)  # a blob as stored before issue 22 (zlib JSON) still decodes exactly
    assert decode_logs(old) == ref.decode_logs(old) == logs
    assert decode_logs(encode_logs(logs)) == logs
    assert columns_of(logs).to_logs() == logs


def test_small_distributions_are_capped_like_the_reference():
    logs = [RequestLog(index=i, warmup=False, send_ns=0, events=[MessageEvent(t_ns=(j + 1) * MS * (i + 1), tokens=1)
                                                                  for j in range(40)], completion_tokens=40)
            for i in range(3)]
    assert metrics.distributions(logs, cap=7) == ref.distributions(logs, cap=7)
    assert len(metrics.distributions(logs, cap=7)["itl_ms"]) == 7


@settings(max_examples=150, deadline=None)
@given(logs=request_logs(), start_ms=st.integers(0, 400), length_ms=st.integers(0, 900), slo=slos,
       max_events=st.integers(1, 15), block=st.integers(1, 4))
def test_chunked_walks_equal_the_reference(logs, start_ms, length_ms, slo, max_events, block):
    """Issue 22: the metrics walk the logs in chunks of requests (LogChunks); any chunk size, from
    RequestLogs, LogColumns or a blob decoded block by block, gives the whole-run figures."""
    import pytest

    from benchkit.measure import logs as logs_mod

    start, end = start_ms * MS, (start_ms + length_ms) * MS
    want = ref.compute_run_metrics(logs, start, end, slo), ref.distributions(logs, cap=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logs_mod, "_BLOCK_REQUESTS", block)
        blob = encode_logs(logs)
        mp.setattr(logs_mod, "CHUNK_EVENTS", max_events)
        for source in (logs, columns_of(logs), logs_mod.LogChunks.decode(blob)):
            window, dist = metrics.measure_window(source, start, end, slo, cap=5)
            assert window == want[0]
            assert dist == want[1]
        got = metrics.measure_encoded(encode_logs_v1(logs), start, end, slo, cap=5)
        assert got == (want[0], want[1])
        assert metrics.coalesced_share(logs) == ref.coalesced_share(logs)
        assert metrics.mean_decode_tokens_per_chunk(logs) == ref.mean_decode_tokens_per_chunk(logs)


def test_long_runs_in_chunks_give_the_whole_run_figures_exactly():
    """Thousands of samples (numpy's pairwise sums then depend on the order and the split), walked
    in small chunks: every figure and distribution equals the whole-run reference bit for bit."""
    import numpy as np
    import pytest

    from benchkit.measure import logs as logs_mod

    rng = np.random.default_rng(5)
    logs = []
    for i in range(9):
        n = int(rng.integers(1, 3000))
        t = 10**9 * i + np.cumsum(rng.exponential(12 * MS, n).astype(np.int64) + 1)
        toks = rng.integers(0, 4, n)
        log = RequestLog(index=i, warmup=i == 0, send_ns=10**9 * i, completion_tokens=int(toks.sum()),
                         prompt_tokens=100, end_ns=int(t[-1]) + 5)
        log.set_columns(t, toks, rng.integers(0, 3, n).astype(np.int8))
        logs.append(log)
    start, end = 10**9, 10**9 * 12 + 10**11
    slo = {"ttft_ms": 30.0, "itl_ms": 12.0}
    want = ref.compute_run_metrics(logs, start, end, slo), ref.distributions(logs, cap=50)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logs_mod, "_BLOCK_REQUESTS", 2)
        blob = encode_logs(logs)
        mp.setattr(logs_mod, "CHUNK_EVENTS", 2500)
        assert metrics.measure_window(logs, start, end, slo, cap=50) == want
        assert metrics.measure_encoded(blob, start, end, slo, cap=50) == want
    assert metrics.measure_encoded(encode_logs(logs), start, end, slo, cap=50) == want
