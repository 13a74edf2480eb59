"""Per-request speculative-decoding figures: the engines' shapes, the run's two taus (they differ
on mixed output lengths), unknown where nothing came back, and the path through the real client,
the stored logs and the metric schema."""

from __future__ import annotations

import pytest

from benchkit.measure.loadclient import ClientOptions
from benchkit.measure.loadgen import run_load_sync
from benchkit.measure.logs import RequestLog, decode_columns, decode_logs, encode_logs
from benchkit.measure.metrics import compute_run_metrics, distributions
from benchkit.measure.specrequests import parse_spec_details, request_acceptance
from benchkit.measure.workloads import Prompt
from benchkit.specs import WorkloadSpec
from tests.synthetic_server import SyntheticConfig, SyntheticServer

# vLLM 0.32 `--per-request-spec-decode-metrics summary`, the final usage chunk of a stream
VLLM_FINAL = {"id": "cmpl-1", "object": "text_completion", "choices": [],
              "usage": {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17},
              "metrics": {"speculative_decoding": {
                  "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": [1, 0, 2, 1],
                  "num_spec_steps": 4, "num_accepted_draft_tokens": 7, "num_draft_tokens": 12,
                  "num_spec_tokens": 3}}}
# SGLang OpenAI API with return_spec_tokens_details
SGLANG = {"choices": [], "sglext": {"spec_tokens_details": {
    "spec_verify_ct": 5, "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 15, "spec_accept_length": 2.2,
    "spec_correct_drafts_histogram": [1, 2, 1, 1]}}}


def test_engine_shapes():
    v = parse_spec_details(VLLM_FINAL)
    assert (v.steps, v.draft_tokens, v.accepted_tokens, v.histogram) == (4, 12, 7, [1, 0, 2, 1])
    s = parse_spec_details(SGLANG)
    assert (s.steps, s.draft_tokens, s.accepted_tokens, s.histogram) == (5, 15, 6, [1, 2, 1, 1])
    native = parse_spec_details({"meta_info": {"spec_verify_ct": 3, "spec_accept_histogram": [0, 3]}})
    assert (native.steps, native.accepted_tokens) == (3, 3)  # accepted from the histogram
    assert parse_spec_details({"choices": [], "usage": {}}) is None
    assert parse_spec_details({"metrics": {"speculative_decoding": {"num_spec_steps": 0}}}) is None


def log(i: int, steps: int | None, accepted: int | None, ok: bool = True, warmup: bool = False,
        hist: list[int] | None = None) -> RequestLog:
    return RequestLog(index=i, warmup=warmup, send_ns=0, ok=ok, spec_steps=steps, spec_accepted_tokens=accepted,
                      spec_histogram=hist)


def test_request_and_step_weighted_tau_differ_on_mixed_lengths():
    # a short request accepting everything (tau 5) and a long one accepting little (tau 1.5)
    logs = [log(0, 2, 8, hist=[0, 0, 0, 0, 2]), log(1, 40, 20, hist=[20, 20, 0, 0, 0]),
            log(2, 10, 10, ok=False), log(3, 10, 10, warmup=True), log(4, None, None)]
    acc = request_acceptance(logs)
    assert acc.requests == 2
    assert acc.tau_request_weighted == pytest.approx((5.0 + 1.5) / 2)
    assert acc.tau_token_weighted == pytest.approx(1 + 28 / 42)
    assert acc.tau_per_request == [5.0, 1.5]
    assert acc.histogram == [20, 20, 0, 0, 2]
    assert request_acceptance([log(0, None, None)]) is None  # unknown, not zero


def test_logs_round_trip_with_and_without_spec_columns():
    logs = [log(0, 4, 7, hist=[1, 0, 2, 1]), log(1, None, None)]
    assert decode_logs(encode_logs(logs)) == logs
    plain = [log(0, None, None)]
    assert decode_columns(encode_logs(plain)).spec is None and decode_logs(encode_logs(plain)) == plain


def test_client_keeps_per_request_figures_and_the_schema_carries_them():
    cfg = SyntheticConfig(ttft_ms=1, gap_ms=1, tokens_per_message=3, spec_k=4, spec_metrics=True)
    wl = WorkloadSpec(num_prompts=6, concurrency=2, output_len=12)
    ps = [Prompt(f"spec prompt {i} " * 2, 30, 12 if i % 2 else 4) for i in range(8)]
    with SyntheticServer(cfg) as url:
        res = run_load_sync(url, "synthetic", wl, prompts=ps, options=ClientOptions(return_token_ids=True))
    measured = res.logs[2:]
    # 12 tokens in messages of 3: 3 verify steps accepting 2 each; 4 tokens: one step accepting 0
    assert [(lg.spec_steps, lg.spec_accepted_tokens) for lg in measured] == [(1, 0), (3, 6)] * 3
    assert measured[1].spec_histogram == [0, 0, 3, 0, 0] and measured[1].spec_draft_tokens == 12
    m = compute_run_metrics(decode_columns(encode_logs(res.logs)), res.window_start_ns, res.window_end_ns)
    assert m.acceptance_length_request_weighted == pytest.approx((1.0 + 3.0) / 2)
    assert m.acceptance_length_token_weighted == pytest.approx(1 + 18 / 12)
    assert m.spec_requests_reported == 6
    d = distributions(res.logs)
    assert sorted(d["tau_per_request"]) == [1.0] * 3 + [3.0] * 3
    assert d["accepted_per_step_histogram"] == [3.0, 0.0, 9.0, 0.0, 0.0]
    # without per-request figures from the engine the fields stay unknown
    with SyntheticServer(SyntheticConfig(ttft_ms=1, gap_ms=1, spec_k=4)) as url:
        res2 = run_load_sync(url, "synthetic", wl, prompts=ps)
    m2 = compute_run_metrics(res2.logs, res2.window_start_ns, res2.window_end_ns)
    assert m2.acceptance_length_request_weighted is None and m2.spec_requests_reported is None
    assert "tau_per_request" not in distributions(res2.logs)
