"""benchkit.sweeps.runner against a synthetic server with known timings and counters (ground truth):
runs that share one server each get their own window and their own counter deltas."""

import pytest

from benchkit.specs import Limits, RunSpec, ServerConfig, WorkloadSpec
from benchkit.sweeps.runner import NullHooks, execute_runs
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
        assert out.metrics_flat["completed"] == n and out.metrics_flat["total_output_tokens"] == 16 * n
        sd = out.spec_decode
        assert (sd["num_drafts"], sd["num_draft_tokens"], sd["num_accepted_tokens"]) == (4 * n, 12 * n, 11 * n)
        assert sd["acceptance_length"] == pytest.approx(1 + 11 / 4)
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
