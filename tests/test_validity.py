"""Validity rules (MEASUREMENT.md "When a run does not count") on hand-built request logs.

The logs are ground truth written here; the window metrics come from the real
`benchkit.measure.metrics.compute_run_metrics` over the same logs.
"""

from __future__ import annotations

import pytest

from benchkit.hosts.teardown import TeardownReport
from benchkit.measure.counters import AcceptanceBoundsError, CounterResetError
from benchkit.measure.loadclient import ClientHeadroom, ProcessHeadroom
from benchkit.measure.logs import MessageEvent, RequestLog
from benchkit.measure.metrics import WindowMetrics, compute_run_metrics
from benchkit.measure.validity import (
    CLIENT_MAX_CORE_SHARE,
    CLIENT_MAX_LOOP_LAG_P99_MS,
    REASON_CODES,
    REQUEST_FAILURE_CODES,
    Violation,
    check_run,
    client_saturation,
    failures,
    request_failure_code,
)

MS = 1_000_000


def make_log(
    index: int,
    n: int = 16,
    *,
    per_chunk: int = 4,
    ok: bool = True,
    prompt_tokens: int | None = 128,
    input_len: int = 128,
    output_len: int = 16,
    warmup: bool = False,
) -> RequestLog:
    """A request sent at index*100 ms: first message of 1 token after 20 ms, then messages of
    `per_chunk` tokens every 10 ms until `n` tokens; server usage reports `n`."""
    send = index * 100 * MS
    if not ok:
        return RequestLog(index=index, warmup=warmup, send_ns=send, ok=False, error="http 500: boom",
                          input_len=input_len, output_len=output_len, end_ns=send + 5 * MS)
    events = [MessageEvent(send + 20 * MS, 1)]
    left, t = n - 1, send + 20 * MS
    while left > 0:
        t += 10 * MS
        k = min(per_chunk, left)
        events.append(MessageEvent(t, k))
        left -= k
    events.append(MessageEvent(t, 0, "usage"))
    return RequestLog(index=index, warmup=warmup, send_ns=send, events=events, ok=True,
                      prompt_tokens=prompt_tokens, completion_tokens=n, input_len=input_len,
                      output_len=output_len, end_ns=t)


def window(logs: list[RequestLog]) -> WindowMetrics:
    end = max((log.end_ns for log in logs), default=0)
    return compute_run_metrics(logs, 0, end + MS)


def codes(violations: list[Violation]) -> list[str]:
    return [v.code for v in violations]


def test_clean_run_counts():
    logs = [make_log(i) for i in range(10)]
    assert check_run(logs, window(logs), True, 0.01, teardown=TeardownReport(pgid=1, clean=True)) == []


def test_error_rate_above_threshold_fails_and_at_threshold_passes():
    logs = [make_log(i, ok=i >= 2) for i in range(10)]
    v = check_run(logs, window(logs), True, 0.01)
    assert codes(v) == ["error_rate_exceeded"]
    assert "20.00%" in v[0].message and "2 of 10" in v[0].message
    at = [make_log(i, ok=i != 0) for i in range(100)]
    assert check_run(at, window(at), True, max_error_rate=0.01) == []


def test_error_rate_is_computed_from_logs_when_metrics_lack_it():
    logs = [make_log(i, ok=i != 0) for i in range(4)]
    assert codes(check_run(logs, WindowMetrics(), False, 0.1)) == ["error_rate_exceeded"]
    assert check_run(logs, WindowMetrics(), False, 0.25) == []


def test_zero_output_tokens_counts_as_failed():
    logs = [make_log(i) for i in range(3)] + [make_log(3, n=0)]
    logs[3].events = []
    logs[3].completion_tokens = 0
    assert codes(check_run(logs, WindowMetrics(), False, 0.01)) == ["error_rate_exceeded"]


def test_no_measured_request_fails():
    logs = [make_log(0, warmup=True)]
    v = check_run(logs, window(logs), True)
    assert codes(v) == ["error_rate_exceeded"] and "no measured request" in v[0].message


def test_warmup_failures_count_nowhere():
    logs = [make_log(0, ok=False, warmup=True)] + [make_log(i) for i in range(1, 5)]
    assert check_run(logs, window(logs), True) == []


@pytest.mark.parametrize(("n", "ok"), [(100, True), (95, True), (105, True), (94, False), (106, False)])
def test_output_length_tolerance_is_five_percent(n, ok):
    logs = [make_log(i, n=n, output_len=100) for i in range(5)]
    v = check_run(logs, window(logs), True)
    assert (v == []) is ok
    if not ok:
        assert codes(v) == ["output_length_mismatch"]
        assert f"{n} tokens for 100 requested" in v[0].message


def test_output_length_needs_95_percent_of_requests():
    short_one_in_20 = [make_log(i, n=8 if i == 0 else 16) for i in range(20)]
    assert check_run(short_one_in_20, window(short_one_in_20), True) == []
    short_one_in_10 = [make_log(i, n=8 if i == 0 else 16) for i in range(10)]
    v = check_run(short_one_in_10, window(short_one_in_10), True)
    assert codes(v) == ["output_length_mismatch"]
    assert "90.0%" in v[0].message and "request 0: 8 tokens for 16 requested" in v[0].message


def test_output_length_is_not_checked_without_ignore_eos():
    logs = [make_log(i, n=4) for i in range(5)]
    assert check_run(logs, window(logs), False) == []


def test_input_length_mismatch_names_the_counts():
    logs = [make_log(i, prompt_tokens=140, input_len=128) for i in range(5)]
    v = check_run(logs, window(logs), True)
    assert codes(v) == ["input_length_mismatch"]
    assert "server counted 140 prompt tokens for 128 intended" in v[0].message
    close = [make_log(i, prompt_tokens=134, input_len=128) for i in range(5)]  # 4.7 % off
    assert check_run(close, window(close), True) == []


def test_input_length_is_skipped_without_server_counts():
    logs = [make_log(i, prompt_tokens=None, input_len=128) for i in range(5)]
    assert check_run(logs, window(logs), True) == []


def test_teardown_and_gpu_facts():
    logs = [make_log(i) for i in range(3)]
    report = TeardownReport(pgid=7, clean=False, killed=[8, 9], survivors=[9])
    v = check_run(logs, window(logs), True, teardown=report)
    assert codes(v) == ["teardown_incomplete"] and "[9]" in v[0].message
    as_dict = {"pgid": 7, "clean": True, "survivors": [], "gpus_freed": False,
               "gpus_message": "GPU-1234: 812 MiB used, baseline 3 MiB"}
    v = check_run(logs, window(logs), True, teardown=as_dict)
    assert codes(v) == ["gpus_not_freed"] and "812 MiB" in v[0].message
    v = check_run(logs, window(logs), True, server_ready=False, gpus_idle_before=False,
                  gpus_idle_detail="GPU-1 has pid 4242", teardown_clean=False)
    assert codes(v) == ["server_not_ready", "teardown_incomplete", "gpus_not_idle"]
    assert "pid 4242" in v[2].message


def test_unknown_facts_break_nothing():
    logs = [make_log(i) for i in range(3)]
    assert check_run(logs, window(logs), True, server_ready=None, teardown=None, teardown_clean=None,
                     gpus_idle_before=None, gpus_freed_after=None) == []


def test_suspect_is_a_mark_not_a_failure():
    # every request: 1 + 5 x 3 tokens, so mean tokens per chunk = 16 / 6 = 2.67
    logs = [make_log(i, per_chunk=3) for i in range(5)]
    measured = window(logs)
    assert check_run(logs, measured, True) == []  # no acceptance figures: nothing to cross-check
    # server says 3.9: the client estimates disagree
    v = check_run(logs, measured.with_spec_decode({"acceptance_length": 3.9}), True)
    assert v and set(codes(v)) == {"suspect"}
    assert all(not x.is_failure for x in v)
    assert failures(v) == []
    agree = check_run(logs, measured.with_spec_decode({"acceptance_length": 2.7}), True,
                      suspect_messages=["given by the caller"])
    assert codes(agree) == ["suspect"] and agree[0].message == "given by the caller"


def test_every_code_has_a_text():
    logs = [make_log(i, ok=i > 0, n=4, prompt_tokens=200) for i in range(4)]
    v = check_run(logs, window(logs), True, server_ready=False, teardown_clean=False, gpus_idle_before=False,
                  gpus_freed_after=False, suspect_messages=["x"], counter_error=CounterResetError("restart"),
                  client={"max_core_share": 1.0, "loop_lag_p99_ms": 1.0, "processes": 1, "stall_max_ms": 3000.0})
    v += [x for x in check_run(logs, window(logs), True, counter_error=AcceptanceBoundsError("tau 9"))
          if x.code == "acceptance_out_of_bounds"]
    assert set(codes(v)) == set(REASON_CODES)
    marks = {"suspect", "counters_restarted", "acceptance_out_of_bounds", "client_saturated", "client_stalled"}
    assert [x.code for x in failures(v)] == [c for c in REASON_CODES if c not in marks]


def headroom(share: float, lag_p99_ms: float | None) -> ClientHeadroom:
    part = ProcessHeadroom(cpu_s=share, wall_s=1.0, core_share=share, loop_lag_p50_ms=0.2,
                           loop_lag_p99_ms=lag_p99_ms, loop_lag_max_ms=lag_p99_ms, lag_samples=200)
    return ClientHeadroom.merge([part])


@pytest.mark.parametrize(
    ("share", "lag", "expected"),
    [
        (0.5, 1.0, None),
        (CLIENT_MAX_CORE_SHARE, CLIENT_MAX_LOOP_LAG_P99_MS, None),  # at the thresholds: fine
        (0.97, 1.0, "97% of one core (> 90%); more client processes would help"),
        (0.5, 12.0, "event-loop lag p99 12.00 ms (> 10 ms); while using only 50% of a core: the client was not "
                    "scheduled"),
        (0.5, None, None),  # no lag samples: only the CPU share counts
    ],
)
def test_client_saturation(share, lag, expected):
    msg = client_saturation(headroom(share, lag))
    if expected is None:
        assert msg is None
    else:
        assert msg.startswith("client_saturated: ") and expected in msg
    logs = [make_log(i) for i in range(3)]
    v = check_run(logs, window(logs), True, client=headroom(share, lag))
    assert codes(v) == ([] if expected is None else ["client_saturated"])
    assert failures(v) == []  # a mark, not a failure


def test_counter_problems_are_marks_with_their_code():
    logs = [make_log(i) for i in range(3)]
    v = check_run(logs, window(logs), True, counter_error=CounterResetError("process_start_time_seconds moved"))
    assert codes(v) == ["counters_restarted"] and failures(v) == []
    assert v[0].message.startswith("counters_restarted: process_start_time_seconds moved")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ("http 500: boom", "http_error"),
        ("timeout after 1.0 s", "timeout"),
        ("transport: ClientConnectorError: refused", "transport"),
        ("stream error: engine overloaded", "stream_error"),
        ("error body: HTTP 200 application/json: too long", "error_body"),
        ("bad_stream: event 3 is not valid UTF-8", "bad_stream"),
        ("truncated_stream: the stream ended after 2 output tokens", "truncated_stream"),
        ("zero output tokens", "zero_output_tokens"),
        ("something new", "other"),
    ],
)
def test_request_failure_codes(error, code):
    assert request_failure_code(error) == code and code in REQUEST_FAILURE_CODES


def test_error_rate_message_counts_failures_by_code():
    logs = [make_log(i) for i in range(6)]
    logs[1] = RequestLog(index=1, warmup=False, send_ns=0, ok=False, error="truncated_stream: ended early")
    logs[2] = RequestLog(index=2, warmup=False, send_ns=0, ok=False, error="truncated_stream: ended early")
    logs[3] = RequestLog(index=3, warmup=False, send_ns=0, ok=False, error="bad_stream: not UTF-8")
    v = check_run(logs, window(logs), True)
    assert codes(v) == ["error_rate_exceeded"]
    assert "3 of 6 measured requests failed: truncated_stream 2, bad_stream 1" in v[0].message
