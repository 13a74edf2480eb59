"""benchkit.execution.runner against a synthetic server with known timings and counters (ground truth):
runs that share one server each get their own window and their own counter deltas."""

import pytest

from benchkit.execution.runner import NullHooks, execute_runs
from benchkit.specs import Limits, RunSpec, ServerConfig, WorkloadSpec
from tests.synthetic_server import SyntheticConfig, SyntheticServer


class Recorder(NullHooks):
    def __init__(self):
        self.states = []

    def state(self, name, note=""):
        self.states.append(name)


def spec(url, concurrency, num_prompts=4):
    return RunSpec(server=ServerConfig(engine="external", endpoint_url=url, served_model_name="synthetic",
                                       method="draft_model", num_speculative_tokens=3),
                   workload=WorkloadSpec(input_len=8, output_len=16, num_prompts=num_prompts, concurrency=concurrency),
                   limits=Limits(request_timeout_s=30))


def test_shared_server_runs_get_their_own_windows_and_counters(tmp_path):
    # 16 output tokens per request: 1 token first (prefill), then messages of 4, 4, 4, 3 tokens,
    # i.e. 4 draft steps per request with 3 + 3 + 3 + 2 = 11 accepted tokens
    cfg = SyntheticConfig(ttft_ms=5, gap_ms=4, tokens_per_message=4, first_message_tokens=1, spec_k=3)
    with SyntheticServer(cfg) as url:
        specs = [spec(url, 1), spec(url, 2, num_prompts=6)]
        hooks = [Recorder(), Recorder()]
        outs = execute_runs(specs, hooks, tmp_path)
    for out, n in zip(outs, (4, 6), strict=True):
        assert out.ok, (out.reason, out.message)
        assert out.server_shared
        m = out.metrics
        assert m.completed == n and m.total_output_tokens == 16 * n
        assert (m.spec_num_drafts, m.spec_num_draft_tokens, m.spec_num_accepted_tokens) == (4 * n, 12 * n, 11 * n)
        assert m.acceptance_length == pytest.approx(1 + 11 / 4) and m.acceptance_rate == pytest.approx(11 / 12)
        assert out.spec_source == "vllm"
    assert hooks[0].states == ["preflight", "starting", "warming", "measuring", "stopping"]
    assert hooks[1].states == ["preflight", "starting", "warming", "measuring", "stopping"]


def test_runs_with_different_servers_cannot_share(tmp_path):
    a, b = spec("http://127.0.0.1:1", 1), spec("http://127.0.0.1:2", 1)
    assert a.server_key() != b.server_key()
    with pytest.raises(ValueError, match="cannot share"):
        execute_runs([a, b], [NullHooks(), NullHooks()], tmp_path)


def test_dead_external_endpoint_is_not_ready_and_no_load_is_sent(tmp_path):
    """Issue 11 item 7: an external endpoint is readiness-checked like a managed server; a dead
    one ends `server_not_ready` (it used to end `workload_error` after trying to send load)."""
    with SyntheticServer() as url:
        pass  # closed again: nothing listens there now
    specs = [spec(url, 1), spec(url, 2)]
    for s in specs:
        s.limits.ready_timeout_s = 1.5
    hooks = [Recorder(), Recorder()]
    outs = execute_runs(specs, hooks, tmp_path)
    assert not outs[0].ok and outs[0].reason == "server_not_ready", (outs[0].reason, outs[0].message)
    assert "not ready after 2 s" in outs[0].message and "Connect" in outs[0].message
    assert f"external endpoint {url}" in outs[0].message
    assert outs[1].reason == "not_run_server_died" and "earlier run" in outs[1].message
    assert hooks[0].states == ["preflight", "starting"]  # never warmed up, never measured


def test_external_endpoint_that_answers_late_is_waited_for(tmp_path, monkeypatch):
    """Readiness polls until the endpoint answers (here /v1/models answers 503 twice first)."""
    import httpx

    calls = []
    real_get = httpx.Client.get

    def flaky_get(self, u, *a, **kw):
        calls.append(u)
        if len(calls) < 3:
            return httpx.Response(503, request=httpx.Request("GET", u))
        return real_get(self, u, *a, **kw)

    monkeypatch.setattr(httpx.Client, "get", flaky_get)
    with SyntheticServer(SyntheticConfig(ttft_ms=2, gap_ms=1)) as url:
        out = execute_runs([spec(url, 1)], [NullHooks()], tmp_path)[0]
    assert out.ok, (out.reason, out.message)
    assert len(calls) == 3 and all(c.endswith("/v1/models") for c in calls)
    assert out.timings_s["ready"] >= 2.0  # two polls one second apart


def test_counter_restart_inside_the_window_leaves_no_figures_and_marks_suspect(tmp_path):
    # request 0 is the warmup; the server "restarts" when measured request 2 (ordinal 2) arrives,
    # and by the second reading it has counted past the first one: no counter went down
    cfg = SyntheticConfig(ttft_ms=2, gap_ms=2, tokens_per_message=4, first_message_tokens=1, spec_k=3, restart_at=2)
    with SyntheticServer(cfg) as url:
        out = execute_runs([spec(url, 1)], [NullHooks()], tmp_path)[0]
    assert out.ok, (out.reason, out.message)  # the run still counts ...
    assert out.metrics.acceptance_length is None and out.spec_source == ""  # ... without acceptance figures
    assert len(out.suspect_reasons) == 1 and out.suspect_reasons[0].startswith("counters_restarted: ")
    assert "process_start_time_seconds moved" in out.suspect_reasons[0]
    assert out.client_headroom["processes"] == 1 and out.client_headroom["cpu_s"] > 0


def test_truncated_streams_count_in_the_error_rate(tmp_path):
    cfg = SyntheticConfig(ttft_ms=2, gap_ms=2, tokens_per_message=4, failures={2: "truncate"}, early_eos_tokens=5)
    with SyntheticServer(cfg) as url:
        out = execute_runs([spec(url, 1)], [NullHooks()], tmp_path)[0]
    assert not out.ok and out.reason == "error_rate_exceeded"
    assert "1 of 4 measured requests failed: truncated_stream 1" in out.message


@pytest.mark.vllm
def test_real_vllm_runs_stream_completely_with_bounded_counters(demo_models, tmp_path):
    """The load client and counter reader against vLLM's CPU build with a draft model (k=2, demo
    weights): two runs on one server start. Every stream must end complete (no truncated_stream or
    bad_stream), the counters must give in-bounds figures from one server life, and the client's
    headroom is recorded. The demo weights are random, so only invariants are asserted."""
    from benchkit.specs import RunSpec
    from tests.realserver import tiny_sweep

    specs = [RunSpec.from_dict(s.to_dict()) for s in tiny_sweep(demo_models, "stream", ["draft_model"],
                                                                concurrency=[1, 2]).expand()]
    for s in specs:  # no port pinned: the runner picks a free one for the shared server start
        s.server.num_speculative_tokens = 2
    assert len(specs) == 2 and len({s.server_key() for s in specs}) == 1
    outs = execute_runs(specs, [NullHooks() for _ in specs], tmp_path)
    for out in outs:
        assert out.ok, (out.reason, out.message)
        measured = [log for log in out.logs if not log.warmup]
        assert all(log.ok for log in measured), [log.error for log in measured if not log.ok]
        assert not any(r.startswith(("counters_restarted", "acceptance_out_of_bounds")) for r in out.suspect_reasons)
        m = out.metrics
        assert out.spec_source == "vllm" and m.spec_num_drafts > 0
        assert 0.0 <= m.acceptance_rate <= 1.0 and 1.0 <= m.acceptance_length <= 3.0
        assert all(0.0 <= r <= 1.0 for r in m.per_position_acceptance_rate)
        assert out.client_headroom["processes"] == 1 and out.client_headroom["cpu_s"] > 0
    assert outs[0].teardown.get("clean") is True
