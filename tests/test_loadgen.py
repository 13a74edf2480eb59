"""The load client against a real HTTP server whose timings and failures the test sets.

Exact assertions on counts (completed, failed, n, tokens per chunk); latency values only with
one-sided bounds the server guarantees (it never sends early) or loose tolerances for scheduler
jitter on a busy 2-core machine.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchkit.measure import loadgen
from benchkit.measure import loadworkers as loadgen_workers
from benchkit.measure.loadclient import ClientOptions
from benchkit.measure.loadgen import arrival_offsets_s, run_load_sync
from benchkit.measure.logs import decode_logs, encode_logs
from benchkit.measure.metrics import compute_run_metrics, request_metrics
from benchkit.measure.workloads import Prompt
from benchkit.specs import WorkloadSpec
from tests.synthetic_server import SyntheticConfig, SyntheticServer


def prompts(n: int, output_len: int = 12) -> list[Prompt]:
    return [Prompt(f"prompt number {i} " * 3, 54, output_len) for i in range(n)]


def test_closed_loop_exact_counts_and_timings():
    cfg = SyntheticConfig(ttft_ms=60, gap_ms=20, tokens_per_message=3)
    wl = WorkloadSpec(num_prompts=6, concurrency=2, output_len=12, temperature=0.5, seed=7)
    server = SyntheticServer(cfg)
    with server as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(8), options=ClientOptions(continuous_usage=True))
    assert [log.warmup for log in res.logs] == [True, True] + [False] * 6
    measured = res.logs[2:]
    assert res.window_start_ns == min(log.send_ns for log in measured)
    assert res.window_end_ns == max(log.end_ns for log in measured)
    assert all(
        log.send_ns >= max(w.end_ns for w in res.logs[:2]) for log in measured
    )  # warmup finished first
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    assert (m.completed, m.failed) == (6, 0)
    assert m.total_output_tokens == 6 * 12
    assert m.total_input_tokens == 6 * len(prompts(1)[0].text)  # server counts 1 token per character
    assert m.mean_tokens_per_chunk == 3.0
    assert not m.output_tokens_from_text
    for log in measured:
        rm = request_metrics(log)
        assert rm.tokens_per_chunk == [3, 3, 3, 3]
        assert rm.n_output_tokens == 12 and rm.n_from_server
        assert rm.ttft_ms >= 60.0  # the server never sends before its TTFT
        assert rm.e2el_ms >= 60.0 + 3 * 20.0
    # every chunk holds 3 tokens, so each ITL sample is its gap / 3 and the medians agree exactly
    assert m.median_itl_ms == pytest.approx(m.median_icl_ms / 3)
    assert m.median_icl_ms == pytest.approx(20.0, abs=8.0)
    assert m.median_ttft_ms == pytest.approx(60.0, abs=30.0)
    bodies = [body for _, body in server.requests]
    assert len(bodies) == 8
    for body in bodies:
        assert body["stream"] is True and body["max_tokens"] == 12 and body["ignore_eos"] is True
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert body["temperature"] == 0.5 and body["seed"] == 7 and body["model"] == "synthetic"
    assert [log.events[-1].kind for log in measured] == ["usage"] * 6


def test_failures_are_recorded_not_raised():
    failures = {2: "http_500", 3: "hang", 4: "no_tokens", 5: "stream_error", 6: "drop", 7: "early_eos",
                8: "truncate"}
    cfg = SyntheticConfig(
        ttft_ms=5, gap_ms=5, tokens_per_message=2, failures=failures, hang_s=20, early_eos_tokens=4
    )
    wl = WorkloadSpec(num_prompts=8, concurrency=1, output_len=10)
    with SyntheticServer(cfg) as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(9, 10), request_timeout_s=1.0,
                            options=ClientOptions(return_token_ids=True))
    by_index = {log.index: log for log in res.logs}
    assert by_index[2].error.startswith("http 500")
    assert by_index[3].error == "timeout after 1.0 s"
    assert by_index[4].ok and by_index[4].completion_tokens == 0
    assert by_index[5].error.startswith("stream error: synthetic in-stream error")
    assert by_index[6].error.startswith("transport: ")
    assert by_index[7].ok and by_index[7].completion_tokens == 4
    # a clean close after 4 tokens with no finish reason, usage message or [DONE] is not a success
    assert not by_index[8].ok and by_index[8].error.startswith("truncated_stream: the stream ended after 4 output")
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    # completed: index 1 (normal) and 7 (early EOS, 4 tokens); failed: 2, 3, 4 (zero tokens), 5, 6, 8
    assert (m.completed, m.failed) == (2, 6)
    assert m.error_rate == pytest.approx(6 / 8)
    assert m.total_output_tokens == 10 + 4
    assert decode_logs(encode_logs(res.logs)) == res.logs


@pytest.mark.parametrize("usage", ["final", "none"])
def test_tokens_from_text_when_no_continuous_usage(usage):
    cfg = SyntheticConfig(ttft_ms=5, gap_ms=5, tokens_per_message=3, usage=usage)
    wl = WorkloadSpec(num_prompts=2, concurrency=1, output_len=9)
    with SyntheticServer(cfg) as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(3, 9))
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    assert m.completed == 2 and m.output_tokens_from_text is True
    for log in res.logs[1:]:
        assert log.tokens_from_text
        assert [e.tokens for e in log.events if e.kind == "content"] == [1, 1, 1]  # one per non-empty message
        if usage == "final":
            assert log.completion_tokens == 9 and request_metrics(log).n_output_tokens == 9
        else:
            assert log.completion_tokens is None and request_metrics(log).n_output_tokens == 3


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_chat_reasoning_tokens_count(field):
    cfg = SyntheticConfig(
        ttft_ms=30, gap_ms=10, tokens_per_message=3, reasoning_tokens=6, reasoning_field=field
    )
    wl = WorkloadSpec(num_prompts=2, concurrency=1, output_len=12)
    server = SyntheticServer(cfg)
    with server as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(3), api="chat",
                            options=ClientOptions(return_token_ids=True))
    assert all(path == "/v1/chat/completions" for path, _ in server.requests)
    assert server.requests[0][1]["messages"] == [{"role": "user", "content": prompts(1)[0].text}]
    for log in res.logs[1:]:
        kinds = [(e.kind, e.tokens) for e in log.events]
        # role-only first chunk (0 tokens), 2 reasoning chunks, 2 content chunks, final usage
        assert kinds == [
            ("content", 0),
            ("reasoning", 3),
            ("reasoning", 3),
            ("content", 3),
            ("content", 3),
            ("usage", 0),
        ]
        rm = request_metrics(log)
        assert rm.n_output_tokens == 12
        assert (
            rm.ttft_ms == (log.events[1].t_ns - log.send_ns) / 1e6
        )  # first reasoning chunk, not the role chunk
        assert rm.ttft_ms >= 30.0


def test_progress_and_window_start_callbacks():
    calls = []
    server = SyntheticServer(SyntheticConfig(ttft_ms=1, gap_ms=1))

    def on_window_start():
        calls.append(("window", len(server.requests)))

    wl = WorkloadSpec(num_prompts=4, concurrency=2, output_len=3)
    with server as url:
        res = run_load_sync(
            url,
            "synthetic",
            wl,
            prompts=prompts(6),
            progress=lambda d, t: calls.append((d, t)),
            on_window_start=on_window_start,
        )
    # called after the 2 warmup requests, before any measured one; progress counts measured requests only
    assert calls == [("window", 2)] + [(i, 4) for i in range(1, 5)]
    assert len(res.logs) == 6


def test_open_loop_follows_the_schedule():
    wl = WorkloadSpec(num_prompts=8, concurrency=8, output_len=2, request_rate=40.0, burstiness=1.0, seed=3)
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=2)) as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(16))
    offsets = arrival_offsets_s(8, 40.0, 1.0, 3)
    sends = [log.send_ns for log in res.logs[8:]]
    assert sends == sorted(sends)
    # each send waits for its absolute due time: gaps from the first send never fall short of the schedule
    # by more than the first send's own lateness (bounded here by 20 ms)
    for s, off in zip(sends, offsets, strict=True):
        assert (s - sends[0]) / 1e9 >= off - 0.02
    assert res.achieved_rate_req_s == pytest.approx(7 / offsets[-1], rel=0.3)


def test_arrival_offsets():
    a = arrival_offsets_s(20000, 10.0, 1.0, seed=1)
    assert a == arrival_offsets_s(20000, 10.0, 1.0, seed=1)
    assert a != arrival_offsets_s(20000, 10.0, 1.0, seed=2)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # Poisson: CV = 1
    bursty = np.diff(arrival_offsets_s(20000, 10.0, 0.25, seed=1))
    assert bursty.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # gamma: CV = 1/sqrt(shape)
    with pytest.raises(ValueError):
        arrival_offsets_s(3, 0.0, 1.0, 0)


def test_bad_arguments():
    wl = WorkloadSpec(num_prompts=4, concurrency=2)
    with pytest.raises(ValueError, match="6 \\(2 warmup \\+ 4 measured"):
        run_load_sync("http://127.0.0.1:9", "m", wl, prompts=prompts(5))
    with pytest.raises(ValueError, match="plain http only"):
        run_load_sync("https://127.0.0.1:9", "m", wl, prompts=prompts(6))
    with pytest.raises(ValueError, match="api must be one of"):
        run_load_sync("http://127.0.0.1:9", "m", wl, prompts=prompts(6), api="responses")


def test_unreachable_server_fails_every_request():
    wl = WorkloadSpec(num_prompts=2, concurrency=1)
    with SyntheticServer() as url:
        pass  # started and stopped: the port is now closed
    res = run_load_sync(url, "m", wl, prompts=prompts(3), request_timeout_s=5.0)
    assert all(not log.ok and log.error.startswith("transport: ConnectionRefusedError") and "connecting to" in log.error
               for log in res.logs)
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    assert (m.completed, m.failed) == (0, 2)


def test_prompts_built_from_the_server_tokenizer():
    wl = WorkloadSpec(num_prompts=3, concurrency=1, input_len=40, output_len=4)
    with SyntheticServer(SyntheticConfig(ttft_ms=1, gap_ms=1, bos=True)) as url:
        res = run_load_sync(url, "synthetic", wl)
    assert res.prompts_flagged_approx is False
    assert [log.prompt_tokens for log in res.logs] == [40] * 4
    assert [log.input_len for log in res.logs] == [40] * 4


# -- several client processes ------------------------------------------------------------------


def test_perf_counter_is_one_system_wide_clock():
    """The logs of several client processes merge without offsets only if perf_counter_ns is
    CLOCK_MONOTONIC (one clock for the whole host); a child's reading must fall between two of ours."""
    import subprocess
    import sys
    import time

    assert loadgen.clock_is_system_wide()
    before = time.perf_counter_ns()
    out = subprocess.run([sys.executable, "-c", "import time; print(time.perf_counter_ns())"],
                         capture_output=True, text=True, check=True).stdout
    after = time.perf_counter_ns()
    assert before < int(out) < after


def test_split_work_and_default_processes():
    shares = loadgen_workers.split_work(3, cap=8, n_warm=8, n_meas=10, open_loop=False)
    assert [c for c, _, _ in shares] == [3, 3, 2]
    assert [len(w) for _, w, _ in shares] == [3, 3, 2]  # each warms at least its own cap
    assert sorted(i for _, w, m in shares for i in w + m) == list(range(18))
    assert [m for _, _, m in shares] == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17]]
    open_shares = loadgen_workers.split_work(2, cap=4, n_warm=4, n_meas=5, open_loop=True)
    assert [m for _, _, m in open_shares] == [[4, 6, 8], [5, 7]]
    with pytest.raises(ValueError, match="processes <= concurrency"):
        loadgen_workers.split_work(5, cap=4, n_warm=4, n_meas=5, open_loop=False)
    assert [loadgen.default_client_processes(c, cpus=16) for c in (1, 8, 33, 64, 256, 1024)] == [1, 1, 2, 2, 8, 8]
    assert loadgen.default_client_processes(256, cpus=2) == 1


def test_several_processes_measure_like_one():
    calls = []
    cfg = SyntheticConfig(ttft_ms=20, gap_ms=10, tokens_per_message=3)
    wl = WorkloadSpec(num_prompts=9, concurrency=3, output_len=12)
    server = SyntheticServer(cfg)

    def on_window_start():
        calls.append(("window", len(server.requests)))

    with server as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(12), processes=3,
                            progress=lambda d, t: calls.append((d, t)), on_window_start=on_window_start,
                            options=ClientOptions(continuous_usage=True))
    assert calls == [("window", 3)] + [(i, 9) for i in range(1, 10)]
    assert [log.index for log in res.logs] == list(range(12))
    assert [log.warmup for log in res.logs] == [True] * 3 + [False] * 9
    warm, measured = res.logs[:3], res.logs[3:]
    assert min(log.send_ns for log in measured) > max(log.end_ns for log in warm)  # one clock, in order
    assert res.window_start_ns == min(log.send_ns for log in measured)
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    assert (m.completed, m.total_output_tokens) == (9, 9 * 12)
    for log in measured:
        rm = request_metrics(log)
        assert rm.tokens_per_chunk == [3, 3, 3, 3] and rm.ttft_ms >= 20.0
    assert res.client.processes == 3 and len(res.client.per_process) == 3
    assert all(p.lag_samples > 0 and 0 <= p.core_share < 1.5 for p in res.client.per_process)


def test_several_processes_keep_the_open_loop_schedule():
    wl = WorkloadSpec(num_prompts=8, concurrency=4, output_len=2, request_rate=40.0, burstiness=1.0, seed=3)
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=2)) as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(12), processes=2)
    offsets = arrival_offsets_s(8, 40.0, 1.0, 3)
    sends = [log.send_ns for log in res.logs[4:]]
    # requests alternate between the two processes, yet every send keeps the common schedule
    for s, off in zip(sends, offsets, strict=True):
        assert (s - sends[0]) / 1e9 == pytest.approx(off, abs=0.02)


def test_client_headroom_is_recorded_in_process():
    wl = WorkloadSpec(num_prompts=4, concurrency=2, output_len=8)
    with SyntheticServer(SyntheticConfig(ttft_ms=5, gap_ms=5)) as url:
        res = run_load_sync(url, "synthetic", wl, prompts=prompts(6))
    c = res.client
    assert c.processes == 1 and c.cpu_s > 0 and 0 < c.max_core_share < 1.5
    assert c.per_process[0].lag_samples >= 5  # window >= 40 ms, one sample per 5 ms
    assert c.loop_lag_p99_ms is not None and c.loop_lag_p99_ms >= 0


def _run_in_daemon(url: str, out) -> None:
    wl = WorkloadSpec(num_prompts=4, concurrency=2, output_len=4)
    res = run_load_sync(url, "synthetic", wl, prompts=prompts(6), processes=2)
    out.put((res.client.processes, sum(log.ok for log in res.logs)))


def test_several_processes_start_inside_a_daemonic_process():
    """A Celery prefork worker is a daemonic process, which multiprocessing refuses to give
    children; the client's workers are plain subprocesses, so they start there too."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=2)) as url:
        proc = ctx.Process(target=_run_in_daemon, args=(url, out), daemon=True)
        proc.start()
        result = out.get(timeout=60)
        proc.join(30)
    assert result == (2, 6)
