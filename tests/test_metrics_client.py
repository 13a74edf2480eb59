"""Per-run figures about how the client saw the stream (issue 13, part 5): the share of coalesced
arrivals, and the client's tau estimate without each request's prefill chunk. Logs are written
here as ground truth."""

from __future__ import annotations

import pytest

from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.measure.metrics import (
    COALESCED_NOTE_SHARE,
    coalesced_share,
    compute_run_metrics,
    mean_decode_tokens_per_chunk,
)

MS = 1_000_000


def log_from(index: int, times_ms: list[float], tokens: list[int], *, warmup: bool = False,
             ok: bool = True) -> RequestLog:
    send = index * 1000 * MS
    events = [MessageEvent(send + round(t * MS), n) for t, n in zip(times_ms, tokens, strict=True)]
    return RequestLog(index=index, warmup=warmup, send_ns=send, events=events, ok=ok,
                      error="" if ok else "http 500: x", completion_tokens=sum(tokens),
                      end_ns=events[-1].t_ns if events else send)


def test_coalesced_reads_make_itl_median_zero_and_the_share_says_so():
    # the demo case: concurrency 1, the server flushes 4 one-token events per TCP write
    # every 19.6 ms, so 3 of every 4 gaps are 0 ms; TPOT stays ~4.9 ms
    times, t = [10.0], 10.0
    for _ in range(31):
        t += 19.6
        times += [t] * 4
    log = log_from(0, times[:125], [1] * 125)
    m = compute_run_metrics([log], log.send_ns, log.end_ns)
    assert m.median_itl_ms == 0.0 and m.median_tpot_ms == pytest.approx(4.9, abs=0.05)
    share = coalesced_share([log])
    assert share == pytest.approx(93 / 124)  # 124 gaps, 31 of them 19.6 ms
    assert share > COALESCED_NOTE_SHARE


def test_coalesced_share_threshold_edges_and_missing():
    log = log_from(0, [10, 10.05, 10.1, 20], [1, 1, 1, 1])  # gaps 0.05, 0.05 (< 0.1) and 9.9
    assert coalesced_share([log]) == pytest.approx(2 / 3)
    assert coalesced_share([log], gap_ms=0.01) == 0.0
    assert coalesced_share([log_from(0, [10], [5])]) is None  # one message: no gap at all
    assert coalesced_share([]) is None
    # warmup and failed requests count nowhere
    assert coalesced_share([log_from(0, [1, 1], [1, 1], warmup=True), log_from(1, [1, 1], [1, 1], ok=False),
                            log_from(2, [1, 5], [1, 1])]) == 0.0


def test_decode_tokens_per_chunk_leaves_out_the_prefill_chunk():
    # tau = 4 for every decode step; 2 decode steps per request, so keeping the 1-token prefill
    # chunk would give (1 + 4 + 4) / 3 = 3.0
    logs = [log_from(i, [10, 20, 30], [1, 4, 4]) for i in range(3)]
    assert mean_decode_tokens_per_chunk(logs) == pytest.approx(4.0)
    assert compute_run_metrics(logs, 0, logs[-1].end_ns).mean_tokens_per_chunk == pytest.approx(3.0)
    assert mean_decode_tokens_per_chunk([log_from(0, [10], [1])]) is None
