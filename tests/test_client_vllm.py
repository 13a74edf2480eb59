"""The load client against a real vLLM CPU server with speculative decoding (draft_model) and
per-request spec-decode metrics: token ids per streamed message, the output digests of two runs
of the same prompts at temperature 0, and the per-request acceptance figures."""

from __future__ import annotations

import socket
import sys

import pytest

from benchkit.engines.server import ManagedServer
from benchkit.measure import outputs
from benchkit.measure.loadclient import ClientOptions
from benchkit.measure.loadgen import run_load_sync
from benchkit.measure.metrics import compute_run_metrics
from benchkit.specs import WorkloadSpec

pytestmark = pytest.mark.vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_token_ids_outputs_and_per_request_acceptance_on_real_vllm(demo_models, tmp_path):
    port = _free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo_models.target),
            "--served-model-name", "demo", "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "1024",
            "--gpu-memory-utilization", "0.2", "--port", str(port), "--seed", "0",
            "--speculative-config",
            f'{{"method": "draft_model", "model": "{demo_models.draft}", "num_speculative_tokens": 3}}',
            "--per-request-spec-decode-metrics", "summary"]
    server = ManagedServer(argv, {"VLLM_CPU_KVCACHE_SPACE": "1"}, tmp_path / "server.log")
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait_ready([f"{url}/health", f"{url}/v1/models"], 600)
        wl = WorkloadSpec(num_prompts=6, concurrency=2, input_len=24, output_len=24, ignore_eos=True, seed=0)
        opts = ClientOptions(return_token_ids=True)
        first = run_load_sync(url, "demo", wl, options=opts)
        again = run_load_sync(url, "demo", wl, options=opts)
    finally:
        server.stop()
    measured = [log for log in first.logs if not log.warmup]
    assert all(log.ok for log in measured), [log.error for log in measured]
    for log in measured:
        # every token counted from the ids the server returned: the per-message counts add up to
        # the server's final usage, nothing estimated from text
        assert not log.tokens_from_text
        assert sum(e.tokens for e in log.events) == log.completion_tokens == 24
        assert log.spec_steps and log.spec_steps >= 1 and log.spec_histogram and len(log.spec_histogram) == 4
    assert {r.kind for r in first.outputs.records.values()} == {"ids"}
    assert all(len(r.full) == 24 for r in first.outputs.records.values())  # fewer than 32 prompts: all full
    matches = outputs.compare_outputs(first.outputs, outputs.decode_outputs(outputs.encode_outputs(again.outputs)))
    summary = outputs.summarize_matches(matches)
    assert summary.compared == 6
    print(f"real vLLM, same prompts twice at temperature 0: {summary}")
    m = compute_run_metrics(first.logs, first.window_start_ns, first.window_end_ns)
    assert m.spec_requests_reported == 6
    assert 1.0 <= m.acceptance_length_token_weighted <= 4.0
    assert 1.0 <= m.acceptance_length_request_weighted <= 4.0
    assert first.client.stamps == "kernel"


def test_request_and_token_weighted_tau_differ_on_mixed_lengths_on_real_vllm(demo_models, tmp_path):
    """Issue 20: per-request spec-decode figures from a real vLLM server, a workload of short (4
    tokens) and long (64 tokens) completions: the run's request-weighted and token-weighted tau
    are both kept, with the per-request tau distribution and the accepted-per-step histogram, and
    they differ (a long completion counts once in the first, by its steps in the second). At
    temperature 0 the demo models' dummy weights accept every draft (tau = k + 1 everywhere; the
    synthetic rejection sampler is refused on CPU), so the requests sample at temperature 1:
    rejection sampling of two different near-uniform distributions then accepts at random, and
    each request's tau varies, the short ones' most."""
    from benchkit.measure.metrics import distributions
    from benchkit.measure.workloads import Prompt

    port = _free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo_models.target),
            "--served-model-name", "demo", "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "1024",
            "--gpu-memory-utilization", "0.2", "--port", str(port), "--seed", "0",
            "--speculative-config",
            f'{{"method": "draft_model", "model": "{demo_models.draft}", "num_speculative_tokens": 3}}',
            "--per-request-spec-decode-metrics", "summary"]
    server = ManagedServer(argv, {"VLLM_CPU_KVCACHE_SPACE": "1"}, tmp_path / "server.log")
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait_ready([f"{url}/health", f"{url}/v1/models"], 600)
        wl = WorkloadSpec(num_prompts=8, concurrency=2, input_len=16, output_len=64, ignore_eos=True, seed=0,
                          temperature=1.0)
        prompts = [Prompt(f"mixed lengths prompt number {i} " * 2, 16, 64 if i % 2 else 4) for i in range(10)]
        res = run_load_sync(url, "demo", wl, prompts=prompts, options=ClientOptions(return_token_ids=True))
    finally:
        server.stop()
    measured = [log for log in res.logs if not log.warmup]
    assert all(log.ok for log in measured), [log.error for log in measured]
    m = compute_run_metrics(res.logs, res.window_start_ns, res.window_end_ns)
    d = distributions(res.logs)
    assert 2 <= m.spec_requests_reported <= len(measured)
    rw, tw = m.acceptance_length_request_weighted, m.acceptance_length_token_weighted
    assert 1.0 <= rw <= 4.0 and 1.0 <= tw <= 4.0
    assert len(d["tau_per_request"]) >= 2 and len(d["accepted_per_step_histogram"]) == 4
    assert 0 < sum(d["accepted_per_step_histogram"]) <= sum(log.spec_steps for log in measured)
    assert abs(rw - tw) > 1e-6, (rw, tw, d["tau_per_request"])
    print(f"real vLLM, mixed lengths: request-weighted tau {rw:.4f}, token-weighted tau {tw:.4f}")
