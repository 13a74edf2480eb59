"""Metrics and log encoding on hand-built logs: exact values from docs/MEASUREMENT.md."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchkit.measure.logs import KINDS, MessageEvent, RequestLog, decode_logs, encode_logs
from benchkit.measure.metrics import (
    METRIC_FIELDS,
    METRICS,
    WindowMetrics,
    compute_run_metrics,
    distributions,
    latency_stats,
    meets_slo,
    request_metrics,
    split_known,
)

MS = 1_000_000
S = 1_000_000_000


def ev(ms: float, tokens: int, kind: str = "content") -> MessageEvent:
    return MessageEvent(t_ns=round(ms * MS), tokens=tokens, kind=kind)


def make_log(
    index=0,
    send_ms=0.0,
    events=(),
    completion_tokens=None,
    prompt_tokens=10,
    ok=True,
    warmup=False,
    error="",
    tokens_from_text=False,
    end_ms=None,
) -> RequestLog:
    events = list(events)
    end = end_ms if end_ms is not None else (max((e.t_ns for e in events), default=0) / MS + 1)
    return RequestLog(
        index=index,
        warmup=warmup,
        send_ns=round(send_ms * MS),
        events=events,
        ok=ok,
        error=error,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        tokens_from_text=tokens_from_text,
        input_len=10,
        output_len=6,
        end_ns=round(end * MS),
    )


# -- per request ------------------------------------------------------------------------


def test_request_metrics_exact_values():
    log = make_log(events=[ev(10, 1), ev(30, 3), ev(40, 2), ev(41, 0, "usage")], completion_tokens=6)
    rm = request_metrics(log)
    assert rm.completed
    assert rm.ttft_ms == 10.0
    assert rm.e2el_ms == 40.0
    assert rm.n_output_tokens == 6 and rm.n_from_server
    assert rm.tpot_ms == pytest.approx((40 - 10) / 5)
    assert rm.icl_ms == [20.0, 10.0]
    assert rm.itl_ms == pytest.approx([20 / 3] * 3 + [5.0] * 2)
    assert rm.tokens_per_chunk == [1, 3, 2]
    assert rm.mean_itl_ms == pytest.approx(30 / 5)


def test_reasoning_counts_for_ttft_and_empty_messages_do_not():
    log = make_log(
        send_ms=5, events=[ev(6, 0), ev(20, 2, "reasoning"), ev(35, 2, "content")], completion_tokens=4
    )
    rm = request_metrics(log)
    assert rm.ttft_ms == 15.0
    assert rm.e2el_ms == 30.0
    assert rm.tokens_per_chunk == [2, 2]


def test_server_count_wins_over_client_count():
    # The server says 8 tokens; the client saw 4 in text-estimated messages.
    log = make_log(
        events=[ev(10, 1), ev(20, 1), ev(30, 1), ev(40, 1)], completion_tokens=8, tokens_from_text=True
    )
    rm = request_metrics(log)
    assert rm.n_output_tokens == 8
    assert rm.client_tokens == 4
    assert rm.tpot_ms == pytest.approx(30 / 7)


def test_client_count_is_the_flagged_fallback():
    logs = [make_log(events=[ev(10, 2), ev(20, 3)], completion_tokens=None)]
    rm = request_metrics(logs[0])
    assert rm.n_output_tokens == 5 and not rm.n_from_server
    assert compute_run_metrics(logs, 0, S).output_tokens_from_text is True
    logs[0].completion_tokens = 5
    assert compute_run_metrics(logs, 0, S).output_tokens_from_text is False


def test_single_token_has_no_tpot():
    rm = request_metrics(make_log(events=[ev(12, 1)], completion_tokens=1))
    assert rm.completed and rm.ttft_ms == rm.e2el_ms == 12.0
    assert rm.tpot_ms is None and rm.itl_ms == [] and rm.icl_ms == []


def test_failures():
    err = request_metrics(make_log(ok=False, error="http 500: boom", completion_tokens=None))
    assert not err.completed and err.failure == "http 500: boom" and err.ttft_ms is None
    zero = request_metrics(make_log(events=[ev(5, 0, "usage")], completion_tokens=0))
    assert not zero.completed and zero.failure == "zero output tokens"
    no_chunk = request_metrics(make_log(events=[], completion_tokens=None))
    assert not no_chunk.completed


# -- per run ------------------------------------------------------------------------------


def run_logs() -> list[RequestLog]:
    return [
        make_log(0, warmup=True, events=[ev(1, 1)], completion_tokens=1),  # ignored
        make_log(
            1, send_ms=0, events=[ev(100, 1), ev(600, 4), ev(1200, 5)], completion_tokens=10, prompt_tokens=7
        ),
        make_log(2, send_ms=500, events=[ev(700, 2), ev(1100, 2)], completion_tokens=4, prompt_tokens=9),
        make_log(3, send_ms=600, ok=False, error="timeout after 1.0 s"),
        make_log(4, send_ms=700, events=[ev(900, 0, "usage")], completion_tokens=0),
    ]


def test_run_metrics_exact():
    m = compute_run_metrics(run_logs(), 0, 2 * S)
    assert (m.completed, m.failed) == (2, 2)
    assert m.error_rate == 0.5
    assert m.duration_s == 2.0
    assert m.total_input_tokens == 16
    assert m.total_output_tokens == 14
    assert m.request_throughput_req_s == 1.0
    assert m.output_throughput_tok_s == 7.0
    assert m.total_token_throughput_tok_s == 15.0
    # per-second buckets: second 0 holds 1 + 4 + 2 tokens, second 1 holds 5 + 2
    assert m.max_output_tokens_per_s == 7.0
    assert m.mean_tokens_per_chunk == pytest.approx(14 / 5)
    assert m.mean_ttft_ms == pytest.approx((100 + 200) / 2)
    assert m.median_e2el_ms == pytest.approx((1200 + 600) / 2)
    assert m.mean_tpot_ms == pytest.approx(((1100 / 9) + (400 / 3)) / 2)
    # ITL is token-weighted: 4 samples of 500/4, 5 of 600/5, 2 of 400/2.
    assert m.mean_itl_ms == pytest.approx((500 + 600 + 400) / 11)
    assert m.mean_icl_ms == pytest.approx((500 + 600 + 400) / 3)
    assert m.request_goodput_req_s is None
    assert not m.has_spec_decode and m.acceptance_length is None  # from the server's counters, not the logs


def test_peak_is_token_weighted_per_second():
    logs = [make_log(1, events=[ev(100, 1), ev(200, 1), ev(300, 1), ev(1500, 9)], completion_tokens=12)]
    m = compute_run_metrics(logs, 0, 2 * S)
    assert (
        m.max_output_tokens_per_s == 9.0
    )  # three messages in second 0 carry 3 tokens; one in second 1 carries 9


def test_goodput_counts_requests_meeting_every_slo():
    logs = run_logs()
    m = compute_run_metrics(logs, 0, 2 * S, {"ttft_ms": 150})
    assert m.request_goodput_req_s == 0.5  # only request 1 (TTFT 100 ms) in 2 s
    m = compute_run_metrics(logs, 0, 2 * S, {"ttft_ms": 250, "e2el_ms": 1000})
    assert m.request_goodput_req_s == 0.5  # request 2 only (E2EL 600 ms)
    m = compute_run_metrics(logs, 0, 2 * S, {"itl_ms": 130})
    # request 1 mean ITL = 1100/9 = 122.2 ms (meets); request 2 mean ITL = 200 ms (misses)
    assert m.request_goodput_req_s == 0.5
    m = compute_run_metrics(logs, 0, 2 * S, {"tpot_ms": 1000})
    assert m.request_goodput_req_s == 1.0


def test_slo_edge_cases():
    single = request_metrics(make_log(events=[ev(12, 1)], completion_tokens=1))
    assert meets_slo(single, {"tpot_ms": 1.0, "itl_ms": 1.0})
    failed = request_metrics(make_log(ok=False, error="x"))
    assert not meets_slo(failed, {"ttft_ms": 1e9})
    with pytest.raises(ValueError, match=r"unknown SLO key\(s\) 'ttf_ms'"):
        compute_run_metrics(run_logs(), 0, S, {"ttf_ms": 1.0})


def test_window_and_empty_run():
    with pytest.raises(ValueError, match="before it starts"):
        compute_run_metrics([], 10, 5)
    m = compute_run_metrics([], 5, 5)
    assert (m.completed, m.failed, m.error_rate, m.output_throughput_tok_s) == (0, 0, 0.0, 0.0)
    assert m.mean_ttft_ms is None and m.mean_tokens_per_chunk is None


def test_latency_stats_numpy_linear():
    s = latency_stats([1.0, 2.0, 3.0, 4.0])
    assert s["mean"] == 2.5 and s["median"] == 2.5
    assert s["std"] == pytest.approx(math.sqrt(1.25))
    assert s["p90"] == pytest.approx(3.7) and s["p95"] == pytest.approx(3.85) and s["p99"] == pytest.approx(3.97)
    assert latency_stats([]) is None


def test_window_dict_round_trip_and_missing_is_none():
    m = compute_run_metrics(run_logs(), 0, 2 * S, {"ttft_ms": 150})
    d = m.to_dict()
    assert list(d) == [f.name for f in METRIC_FIELDS]
    assert d["duration_s"] == 2.0 and d["error_rate"] == 0.5 and d["p99_itl_ms"] == m.p99_itl_ms
    assert WindowMetrics.from_dict(d) == m
    single = compute_run_metrics([make_log(1, events=[ev(5, 1)], completion_tokens=1)], 0, S)
    assert single.mean_tpot_ms is None and single.p99_icl_ms is None  # n = 1: no TPOT, no gap
    assert WindowMetrics.from_dict({"completed": 3}).failed is None  # absent = unknown, never 0
    with pytest.raises(ValueError, match="'duration'"):
        WindowMetrics.from_dict({"duration": 2.0})
    assert split_known({"duration_s": 1.0, "rtfx": 0.0}) == ({"duration_s": 1.0}, {"rtfx": 0.0})
    spec = m.with_spec_decode({"acceptance_length": 2.5, "spec_num_drafts": 4.0, "spec_source": "vllm"})
    assert spec.has_spec_decode and spec.acceptance_length == 2.5 and spec.acceptance_rate is None
    assert spec.mean_ttft_ms == m.mean_ttft_ms and not m.has_spec_decode


def test_schema_metadata_units_vllm_keys_and_bounds():
    """Every field says its unit, label, vLLM key and bounds (issue 8); the ITL/ICL mapping of
    MEASUREMENT.md: vLLM's "itl" keys are draftboard's ICL, per-token ITL has no vLLM key."""
    for f in METRIC_FIELDS:
        assert f.label and (f.unit or f.kind in (bool, str)), f.name
        if f.kind not in (bool, str):
            assert f.lo is not None and f.lo >= 0, f.name
    assert METRICS["median_icl_ms"].vllm_key == "median_itl_ms" and METRICS["median_itl_ms"].vllm_key is None
    assert METRICS["mean_tpot_ms"].unit == "ms/token" and METRICS["mean_icl_ms"].unit == "ms"
    assert (METRICS["acceptance_length"].lo, METRICS["acceptance_rate"].hi, METRICS["error_rate"].hi) == (1, 1, 1)
    rate = METRICS["acceptance_rate"]
    assert rate.vllm_key == "spec_decode_acceptance_rate" and rate.to_vllm(0.25) == 25.0  # vLLM writes percent
    assert rate.from_vllm(25.0) == 0.25 and rate.to_vllm(None) is None
    vllm_keys = [f.vllm_key for f in METRIC_FIELDS if f.vllm_key]
    assert len(vllm_keys) == len(set(vllm_keys))
    assert {"duration", "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
            "max_output_tokens_per_s", "p99_e2el_ms"} <= set(vllm_keys)
    for f in METRIC_FIELDS:  # the unit is in the name wherever it is not a count or a fraction
        if f.unit in ("ms", "ms/token"):
            assert f.name.endswith("_ms"), f.name
        if f.unit in ("tok/s", "req/s", "s"):
            assert f.name.endswith(("_tok_s", "_req_s", "_per_s", "_s")), f.name


def test_distributions_cap_keeps_extremes():
    events = [ev(1 + i, 1) for i in range(6001)]
    events[-1] = ev(9000, 1)
    d = distributions([make_log(1, events=events, completion_tokens=6001)])
    assert len(d["itl_ms"]) == 5000 and len(d["icl_ms"]) == 5000 and len(d["tokens_per_chunk"]) == 5000
    assert max(d["itl_ms"]) == pytest.approx(9000 - 6000) and min(d["itl_ms"]) == pytest.approx(1.0)
    assert d["ttft_ms"] == [1.0]
    small = distributions(run_logs())
    assert sorted(small["ttft_ms"]) == [100.0, 200.0]
    assert sorted(small["tokens_per_chunk"]) == [1, 2, 2, 4, 5]


# -- properties ---------------------------------------------------------------------------

chunk_lists = st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 16)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(first=st.integers(1, 10**10), chunks=chunk_lists, server=st.booleans())
def test_identities(first, chunks, server):
    t = first
    events = []
    for i, (gap, tokens) in enumerate(chunks):
        t += gap if i else 0
        events.append(MessageEvent(t, tokens, "content"))
    n_client = sum(tok for _, tok in chunks)
    log = RequestLog(
        index=0, warmup=False, send_ns=0, events=events, completion_tokens=n_client if server else None
    )
    rm = request_metrics(log)
    assert rm.completed and rm.n_output_tokens == n_client
    # ITL and ICL both add up to E2EL - TTFT; ITL has one sample per token after the first message.
    assert sum(rm.itl_ms) == pytest.approx(rm.e2el_ms - rm.ttft_ms, rel=1e-9, abs=1e-6)
    assert sum(rm.icl_ms) == pytest.approx(rm.e2el_ms - rm.ttft_ms, rel=1e-9, abs=1e-6)
    assert len(rm.itl_ms) == n_client - chunks[0][1]
    assert len(rm.icl_ms) == len(chunks) - 1
    if n_client >= 2:
        assert rm.tpot_ms * (n_client - 1) + rm.ttft_ms == pytest.approx(rm.e2el_ms, rel=1e-9, abs=1e-6)
    # token weighting: the mean ITL is total gap time over tokens after the first message
    if rm.itl_ms:
        assert np.mean(rm.itl_ms) == pytest.approx(
            (rm.e2el_ms - rm.ttft_ms) / (n_client - chunks[0][1]), rel=1e-9, abs=1e-9
        )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200))
def test_percentiles_monotone(samples):
    s = latency_stats(samples)
    lo, hi = min(samples), max(samples)
    assert lo <= s["median"] <= s["p90"] <= s["p95"] <= s["p99"] <= hi
    assert lo - 1e-6 <= s["mean"] <= hi + 1e-6 and s["std"] >= 0


events_st = st.builds(
    MessageEvent, t_ns=st.integers(0, 2**62), tokens=st.integers(0, 10**6), kind=st.sampled_from(KINDS)
)
logs_st = st.lists(
    st.builds(
        RequestLog,
        index=st.integers(-(2**40), 2**40),
        warmup=st.booleans(),
        send_ns=st.integers(0, 2**62),
        events=st.lists(events_st, max_size=8),
        ok=st.booleans(),
        error=st.text(max_size=30),
        prompt_tokens=st.none() | st.integers(0, 10**7),
        completion_tokens=st.none() | st.integers(0, 10**7),
        tokens_from_text=st.booleans(),
        input_len=st.integers(0, 10**7),
        output_len=st.integers(0, 10**7),
        end_ns=st.integers(0, 2**62),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(logs_st)
def test_encode_decode_round_trip(logs):
    assert decode_logs(encode_logs(logs)) == logs


def test_encoding_is_compact():
    logs = [
        make_log(
            i, send_ms=i * 10, events=[ev(i * 10 + 5 + j * 2, 3) for j in range(300)], completion_tokens=900
        )
        for i in range(50)
    ]
    blob = encode_logs(logs)
    assert decode_logs(blob) == logs
    assert len(blob) < 50 * 300 * 4  # well under 4 bytes per message


def test_decode_errors():
    with pytest.raises(ValueError, match="not an encoded log blob"):
        decode_logs(b"garbage")
    with pytest.raises(ValueError, match="format version"):
        decode_logs(zlib.compress(b'{"v": 99}'))
    with pytest.raises(ValueError, match="missing column"):
        decode_logs(zlib.compress(b'{"v": 1, "index": []}'))
    with pytest.raises(ValueError, match="kind must be one of"):
        MessageEvent(0, 1, "text")
