"""SGLang: every fact draftboard relies on, with the file it was read from.

Read in sgl-project/sglang (public snapshots of `main`, paths under python/sglang/; SGLang is not
installed here, so nothing below was run):

- start: `python -m sglang.launch_server --model-path DIR` (flags: engine_flags.yaml); main port
  30000 (DOMAIN.md "Engine reference"; srt/server_args.py `ServerArgs.port`, not re-read). In its
  TCP ZMQ mode it also binds `port + 233` (srt/server_args.py `ZMQ_TCP_PORT_DELTA = 233`, the
  dist-init port) and the six ports after it (`PortArgs.init_new`); single-node IPC mode uses
  fewer, so all eight are checked before a start.
- ready: `GET /health_generate` (srt/entrypoints/http_server.py; it runs one generation).
- cache reset: `POST /flush_cache` (srt/entrypoints/http_server.py, `GET` or `POST`; it refuses
  while requests run).
- counters: `/metrics` with `--enable-metrics` (srt/observability/metrics_collector.py, earlier
  srt/metrics/collector.py). There is no draft-token counter. Newer builds count
  `sglang:spec_verify_calls_total` (each finished request's `spec_verify_ct`: target verify
  passes) beside `sglang:generation_tokens_total` and `sglang:num_requests_total`. Per request of
  `n` output tokens with `V` verify passes (the first token comes from prefill, each pass emits
  its accepted drafts plus one bonus token, so `n = 1 + V + accepted`): drafts = verify calls,
  accepted = generation tokens - verify calls - requests, so tau = 1 + accepted / drafts is the
  same quantity as vLLM's (SGLang's own `avg_spec_accept_length` = generation tokens / verify
  calls counts the prefill token too). The gauges `sglang:spec_accept_length` /
  `sglang:spec_accept_rate` cover only the last logging interval: kept raw, never used.
- speculative config: none; methods are flags (`--speculative-algorithm ...`, engine_flags.yaml).
- version: distribution `sglang`.

Capabilities (benchkit.engines.capabilities):

- (a) token ids: `return_token_ids: true` on /v1/completions (srt/entrypoints/openai/protocol.py
  `CompletionRequest.return_token_ids`); each choice then has `token_ids`, in a stream the ids of
  that message (serving_completions.py slices `output_ids` per chunk), `prompt_token_ids` on the
  first.
- (b) per-request speculative figures: only on the native `/generate`, in the finished message's
  `meta_info` (srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics`:
  `spec_verify_ct`, `spec_num_correct_drafts`, `spec_num_proposed_drafts` = verify passes x
  (speculative_num_draft_tokens - 1), `spec_accept_length`, `spec_correct_drafts_histogram`; older
  builds name them `spec_accept_token_num` / `spec_draft_token_num`, with
  `spec_accepted_drafts` / `spec_proposed_drafts` as aliases), whenever a speculative algorithm
  is set (no flag). The OpenAI-compatible /v1/completions does not forward them
  (srt/entrypoints/openai/serving_completions.py builds its chunks without meta_info's spec keys).
  A `spec_tokens_details` key was not found in the source read.
- (c) forced acceptance: environment `SGLANG_SIMULATE_ACC_LEN` (srt/environ.py, EnvFloat, < 0 =
  off), the accepted tokens per verify pass including the bonus token, clamped to [1, steps + 1]
  (srt/speculative/spec_utils.py `_generate_simulated_accept_index`); with
  `SGLANG_SIMULATE_ACC_METHOD=match-expected` (the newer default; older builds default to
  `multinomial`, a rounded normal draw) its mean matches the target. Outputs are then not the
  model's (the predicted ids are filled with a fixed token).
- (d) continuous usage: `stream_options.continuous_usage_stats: true` puts cumulative usage on
  every chunk, independently of `include_usage` (srt/entrypoints/openai/utils.py
  `should_include_usage`; serving_completions.py `UsageProcessor.calculate_token_usage` from the
  counts in meta_info). Cost: one small usage object per message, no extra engine work; not
  measured here.
"""

from __future__ import annotations

from typing import ClassVar

from benchkit.engines.adapters import EngineAdapter
from benchkit.engines.capabilities import ContinuousUsage, RequestSpecMetrics, TokenIds, TwinChange
from benchkit.measure.counters import MetricsPage, SpecCounters

VERIFY_CALLS = "sglang:spec_verify_calls_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
NUM_REQUESTS = "sglang:num_requests_total"
#: srt/server_args.py: the dist-init port is the main port + this; seven ports follow from it.
ZMQ_TCP_PORT_DELTA = 233


class SGLang(EngineAdapter):
    """SGLang (module docstring: each fact and where it was read)."""

    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    default_port: ClassVar[int] = 30000
    distributions: ClassVar[tuple[str, ...]] = ("sglang",)
    ready_paths: ClassVar[tuple[str, ...]] = ("/health_generate",)
    counter_prefixes: ClassVar[tuple[str, ...]] = ("sglang:spec_", GENERATION_TOKENS, NUM_REQUESTS)
    reset_cache_path: ClassVar[str | None] = "/flush_cache"
    result_tools: ClassVar[tuple[str, ...]] = ("sglang.bench_serving",)
    token_ids: ClassVar[TokenIds | None] = TokenIds(
        body={"return_token_ids": True}, choice_key="token_ids",
        source="python/sglang/srt/entrypoints/openai/protocol.py CompletionRequest.return_token_ids")
    request_spec_metrics: ClassVar[RequestSpecMetrics | None] = RequestSpecMetrics(
        server_args={"summary": ()}, endpoint="/generate", path=("meta_info",),
        steps_keys=("spec_verify_ct",),
        accepted_keys=("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num"),
        drafted_keys=("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"),
        streamed_on="the finished message of the native /generate stream (not on /v1/completions)",
        source="python/sglang/srt/managers/tokenizer_manager.py _calculate_spec_decoding_metrics")
    continuous_usage: ClassVar[ContinuousUsage | None] = ContinuousUsage(
        stream_options={"include_usage": True, "continuous_usage_stats": True}, requires_include_usage=False,
        cost="one small usage object per message from counts in meta_info: no extra engine work "
             "(not measured here)",
        source="python/sglang/srt/entrypoints/openai/utils.py should_include_usage; serving_completions.py")

    def port_span(self, port: int) -> list[int]:
        """`port`, the dist-init port `port + 233` and the six after it (module docstring)."""
        return [port] + [port + ZMQ_TCP_PORT_DELTA + i for i in range(7)]

    def acceptance_twin(self, tau: float, k: int | None) -> TwinChange:
        """`SGLANG_SIMULATE_ACC_LEN=tau` with the `match-expected` method (so the mean is tau on
        every build); tau in [1, k + 1] (EngineConfigError otherwise)."""
        self.check_tau(tau, k)
        return TwinChange(env={"SGLANG_SIMULATE_ACC_LEN": repr(float(tau)),
                               "SGLANG_SIMULATE_ACC_METHOD": "match-expected"},
                          note="SGLang simulated acceptance (srt/speculative/spec_utils.py): "
                               "outputs are not the model's")

    def read_counters(self, page: MetricsPage) -> SpecCounters:
        """Verify passes as drafts and accepted = generation tokens - verify passes - requests
        (module docstring); draft tokens and per-position counts are not exposed (None, {})."""
        if not page.has(VERIFY_CALLS):
            return SpecCounters(num_draft_tokens=None, source="none")
        verify = page.total(VERIFY_CALLS)
        return SpecCounters(num_drafts=verify, num_draft_tokens=None,
                            num_accepted_tokens=page.total(GENERATION_TOKENS) - verify - page.total(NUM_REQUESTS),
                            source=self.name)
