"""GuideLLM reports (`guidellm run --output kind=json|yaml`), read: one run per benchmark.

Layout (GuideLLM 0.8, report `metadata.version` 2; vllm-project/guidellm
`guidellm/benchmark/schemas/`; the fixture `tests/fixtures/harnesses/guidellm/` and its NOTES.md):
one document (`benchmarks.json`, or the same report as `benchmarks.yaml`) with `metadata`
(`guidellm_version`), `config` (`spec.backend.model`, `spec.data[]` with `prompt_tokens`,
`output_tokens` and their spreads), `benchmarks[]` (one per load level) and `conclusions`. Each
benchmark: `config.strategy` (`type_` synchronous | concurrent (`streams`) | throughput
(`max_concurrency`) | constant | poisson (`rate`, req/s)), `duration` (s, the measured window),
`metrics` (each a status distribution `{successful, errored, incomplete, total}` of `{mean,
median, std_dev, count, total_sum, percentiles: {p90, p95, p99, ...}}`), and `requests`
(`successful[]` per-request stats with the generated text, which is never stored).

What maps where (GuideLLM's definitions, `guidellm/schemas/base/request_stats.py`,
`guidellm/benchmark/schemas/metrics.py`, `guidellm/schemas/base/statistics.py`):

- `request_totals`: `successful` -> completed, `errored` -> failed; `incomplete` (requests cut off
  when the benchmark ended) is kept apart in `extra`.
- `time_to_first_token_ms` -> TTFT and `request_latency` (s) x 1000 -> E2EL, both one value per
  request: mean, median, std_dev (population), and p90/p95/p99, which GuideLLM takes from a
  weighted CDF without interpolation (not numpy's linear percentiles: said in the definitions).
- GuideLLM's `inter_token_latency_ms` is per request (last token - first token) / (n - 1),
  draftboard's TPOT, but its run distribution weights each request by n - 1: a **token-weighted**
  TPOT, which is not draftboard's request-weighted TPOT. It is kept in `extra` under its own
  name (`inter_token_latency_ms`, token-weighted); the TPOT fields are computed from the
  per-request `inter_token_latency_ms` of `requests.successful` (numpy, request-weighted) when
  that list holds every successful request, else left unknown. `time_per_output_token_ms` (E2EL
  / n, TTFT included) has no field and is kept in `extra`.
- Output and input tokens: `output_token_count` / `prompt_token_count` `.successful.total_sum`
  (the server's usage, GuideLLM asks for it). Throughputs are draftboard's (tokens or requests /
  `duration`); GuideLLM's own `*_per_second` are means of rate distributions over time (the
  request one differs from requests / duration) and are kept in `extra`.
- `output_tokens_per_iteration` -> `mean_tokens_per_chunk`; `iter_tokens_per_iteration` (the
  same leaving out each request's first iteration) -> `mean_decode_tokens_per_chunk`.
- Spec decode: vLLM's per-request `response_metrics.speculative_decoding` (server flag
  `--per-request-spec-decode-metrics`) of every successful request, summed: steps, draft and
  accepted tokens, acceptance rate, tau (1 + sum accepted / sum steps: `acceptance_length` and
  `acceptance_length_token_weighted`), the mean of the requests' `mean_acceptance_length`
  (`acceptance_length_request_weighted`), per-position rates from the pooled histograms.

Layouts GuideLLM has written (vllm-project/guidellm, by tag), each read from a real file:

- 0.2.x-0.3.x (`guidellm/benchmark/benchmark.py` `GenerativeBenchmark`, `output.py`
  `GenerativeBenchmarksReport`): `{"benchmarks": [...]}` only, no `metadata`; each benchmark has
  `args` (`strategy`), `run_stats`, `worker` (`backend_type`, `backend_model`), `request_loader`
  (`data`, e.g. "prompt_tokens=512,output_tokens=128"), `metrics` (the same distributions, without
  `request_totals` and the per-iteration ones), `request_totals` and `request_samples` (not None when
  `requests` was sampled) beside `metrics`, `requests.successful[]` with `inter_token_latency_ms`
  per request, and `duration`. Real file: graz-dev/vllm-benchmark `benchmarks.json` (GuideLLM 0.2,
  percentiles without p50), trimmed copy in tests/fixtures/harnesses/guidellm/v0.2-throughput/.
- 0.7.x-0.8 (report `metadata.version` 2, described above): the fixture's layout.

0.1.x (`core/report.py` `GuidanceReport`: `benchmarks[].benchmarks[].results[]`) and 0.4-0.6
(`args` at the top, `metadata.version` 1 from 0.5) have no real file here: a benchmark with neither
`metrics.request_totals` nor `request_totals` is refused naming both layouts (`LAYOUTS`).

The format (`FORMAT`, registry name "guidellm", tool "GuideLLM"): a file (JSON, or YAML by its
suffix), recognised by `metadata.guidellm_version` and GuideLLM's benchmark keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import ConfigDict, ValidationError

from benchkit.formats.base import Recognition, ResultFormat, Source
from benchkit.formats.common import (
    INT_MAX,
    TEXT_LIMITS,
    ImportedRun,
    Number,
    ResultModel,
    Text,
    Whole,
    finish_window,
    kept,
    latency_fields,
    make_workload,
    per_position_rates,
    validate,
)
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonFile, JsonObject
from benchkit.measure.metrics import latency_stats

TOOL_GUIDELLM = "GuideLLM"
#: Key paths whose text is never stored (the generated outputs and request bodies, which may
#: hold NUL characters): not checked for storable text.
SKIP_TEXT = (("benchmarks", "*", "requests"),)
YAML_SUFFIXES = (".yaml", ".yml")

GUIDELLM_DEFINITIONS = {
    "ttft": "time_to_first_token_ms: first token iteration minus request start, one value per request",
    "e2el": "request_latency (s, x 1000): request end minus start, one value per request",
    "percentiles": "TTFT and E2EL p90/p95/p99 and median as GuideLLM writes them: the first value whose "
    "cumulative weight reaches p (no interpolation; statistics.py Percentiles.from_pdf); std is the "
    "population std",
    "failed": "request_totals.errored; request_totals.incomplete (cut off at the benchmark's end) is kept apart",
    "itl": "not in the file: GuideLLM has no per-token or per-chunk gap figure",
    "tokens_per_chunk": "output_tokens_per_iteration / iter_tokens_per_iteration (first iteration left out)",
}


class Percentiles(ResultModel):
    p90: Number() | None = None
    p95: Number() | None = None
    p99: Number() | None = None


class Distribution(ResultModel):
    """One status of a GuideLLM distribution (non-negative; the rest is not read)."""

    mean: Number() | None = None
    median: Number() | None = None
    std_dev: Number() | None = None
    count: Number() | None = None
    total_sum: Number() | None = None
    percentiles: Percentiles | None = None


class StatusDistribution(ResultModel):
    successful: Distribution | None = None


class RequestTotals(ResultModel):
    successful: Whole(0, INT_MAX) | None = None
    errored: Whole(0, INT_MAX) | None = None
    incomplete: Whole(0, INT_MAX) | None = None
    total: Whole(0, INT_MAX) | None = None


class Metrics(ResultModel):
    request_totals: RequestTotals | None = None
    request_latency: StatusDistribution | None = None
    time_to_first_token_ms: StatusDistribution | None = None
    inter_token_latency_ms: StatusDistribution | None = None
    time_per_output_token_ms: StatusDistribution | None = None
    prompt_token_count: StatusDistribution | None = None
    output_token_count: StatusDistribution | None = None
    requests_per_second: StatusDistribution | None = None
    output_tokens_per_second: StatusDistribution | None = None
    tokens_per_second: StatusDistribution | None = None
    output_tokens_per_iteration: StatusDistribution | None = None
    iter_tokens_per_iteration: StatusDistribution | None = None


class Strategy(ResultModel):
    type_: Text(100) | None = None
    streams: Whole(1, INT_MAX) | None = None
    max_concurrency: Whole(1, INT_MAX) | None = None
    rate: Number(gt=0) | None = None


class Backend(ResultModel):
    kind: Text(100) | None = None
    model: Text(TEXT_LIMITS["model"]) | None = None
    request_format: Text(100) | None = None


class Worker(ResultModel):
    """GuideLLM 0.2-0.3 `benchmarks[].worker` (`GenerativeRequestsWorkerDescription`)."""

    backend_type: Text(100) | None = None
    backend_model: Text(TEXT_LIMITS["model"]) | None = None


class Args(ResultModel):
    """GuideLLM 0.2-0.3 `benchmarks[].args` (`BenchmarkArgs`): the strategy read."""

    strategy: Strategy | None = None


class RequestLoader(ResultModel):
    """GuideLLM 0.2-0.3 `benchmarks[].request_loader`: `data` as given on the command line."""

    data: Any = None


class BenchmarkConfig(ResultModel):
    id_: Text(200) | None = None
    strategy: Strategy | None = None
    backend: Backend | None = None


class Speculative(ResultModel):
    model_config = ConfigDict(extra="ignore")
    mean_acceptance_length: Number(1.0) | None = None
    num_spec_steps: Whole() | None = None
    num_accepted_draft_tokens: Whole() | None = None
    num_draft_tokens: Whole() | None = None
    acceptance_histogram: list[Whole()] | None = None


class ResponseMetrics(ResultModel):
    model_config = ConfigDict(extra="ignore")
    speculative_decoding: Speculative | None = None


class RequestStats(ResultModel):
    """One entry of `requests.successful`: the figures read (its text is neither read nor kept)."""

    model_config = ConfigDict(extra="ignore")
    inter_token_latency_ms: Number() | None = None
    output_tokens: Whole(0, INT_MAX) | None = None
    response_metrics: ResponseMetrics | None = None


class Requests(ResultModel):
    model_config = ConfigDict(extra="ignore")
    successful: list[RequestStats] | None = None


class Benchmark(ResultModel):
    """One entry of `benchmarks[]`: the keys read; `requests` is read for its numbers only."""

    config: BenchmarkConfig | None = None
    metrics: Metrics | None = None
    requests: Requests | None = None
    duration: Number() | None = None
    # GuideLLM 0.2-0.3 (module docstring)
    args: Args | None = None
    worker: Worker | None = None
    request_loader: RequestLoader | None = None
    request_totals: RequestTotals | None = None
    request_samples: RequestTotals | None = None
    warmup_duration: Number() | None = None
    cooldown_duration: Number() | None = None


class DataSpec(ResultModel):
    kind: Text(TEXT_LIMITS["dataset"]) | None = None
    prompt_tokens: Whole(1, INT_MAX) | None = None
    prompt_tokens_stdev: Number() | None = None
    output_tokens: Whole(1, INT_MAX) | None = None
    output_tokens_stdev: Number() | None = None


class RunSpec(ResultModel):
    backend: Backend | None = None
    data: list[DataSpec] | None = None


class RunConfig(ResultModel):
    spec: RunSpec | None = None


class Meta(ResultModel):
    guidellm_version: Text(TEXT_LIMITS["engine_version"]) | None = None


class Report(ResultModel):
    """A GuideLLM report (module docstring): the keys read."""

    metadata: Meta | None = None
    config: RunConfig | None = None
    benchmarks: list[Benchmark]


#: What each known layout keeps its request counts under (the refusal of an unknown layout names them).
LAYOUTS = ("GuideLLM 0.7-0.8: benchmarks[].metrics.request_totals (with metadata.guidellm_version)",
           "GuideLLM 0.2-0.3: benchmarks[].request_totals beside benchmarks[].metrics, args and worker")


def _legacy(b: Benchmark) -> bool:
    """A benchmark of GuideLLM 0.2-0.3's layout: `request_totals` beside `metrics`."""
    return (b.metrics is None or b.metrics.request_totals is None) and b.request_totals is not None


def _successful(d: StatusDistribution | None) -> Distribution | None:
    return d.successful if d is not None else None


def _stats(d: Distribution | None) -> dict[str, float | None]:
    """draftboard statistic -> GuideLLM's value of one distribution."""
    if d is None:
        return {}
    p = d.percentiles or Percentiles()
    return {"mean": d.mean, "median": d.median, "std": d.std_dev, "p90": p.p90, "p95": p.p95, "p99": p.p99}


def _summary(d: Distribution | None) -> dict[str, Any] | None:
    """A distribution as kept in `extra`: the statistics and the count."""
    if d is None:
        return None
    out = {k: v for k, v in _stats(d).items() if v is not None}
    if d.count is not None:
        out["count"] = d.count
    return out


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None and float(value).is_integer() else None


def _exact(tokens: int | None, stdev: float | None) -> int | None:
    return tokens if stdev in (None, 0, 0.0) else None


def _spec_decode(requests: list[RequestStats], values: dict[str, Any], definitions: dict[str, str]) -> bool:
    """The acceptance fields from every request's `speculative_decoding` (module docstring);
    False (nothing set) unless every request has one with its counts."""
    specs = [r.response_metrics.speculative_decoding if r.response_metrics else None for r in requests]
    if not specs or any(s is None or None in (s.num_spec_steps, s.num_accepted_draft_tokens, s.num_draft_tokens)
                        for s in specs):
        return False
    steps = sum(s.num_spec_steps for s in specs)
    accepted = sum(s.num_accepted_draft_tokens for s in specs)
    drafted = sum(s.num_draft_tokens for s in specs)
    if steps == 0 or drafted == 0:
        return False
    tau = 1 + accepted / steps
    means = [s.mean_acceptance_length for s in specs]
    values.update(spec_num_drafts=steps, spec_num_draft_tokens=drafted, spec_num_accepted_tokens=accepted,
                  acceptance_rate=accepted / drafted, acceptance_length=tau, acceptance_length_token_weighted=tau,
                  acceptance_length_request_weighted=sum(means) / len(means) if None not in means else None,
                  spec_requests_reported=len(specs))
    histograms = [s.acceptance_histogram for s in specs]
    if all(histograms) and len({len(h) for h in histograms}) == 1 and drafted % steps == 0 \
            and len(histograms[0]) == drafted // steps + 1:
        pooled = {j: sum(h[j] for h in histograms) for j in range(len(histograms[0]))}
        values["per_position_acceptance_rate"] = per_position_rates(pooled, drafted // steps)
    definitions["acceptance_length"] = ("1 + sum accepted / sum steps over the successful requests' "
                                        "response_metrics.speculative_decoding; acceptance_length_request_weighted "
                                        "is the mean of their mean_acceptance_length")
    return True


def import_benchmark(obj: JsonObject, i: int, report: Report) -> ImportedRun:
    """The run of `benchmarks[i]` of a validated report (module docstring)."""
    b = report.benchmarks[i]
    m = b.metrics or Metrics()
    legacy = _legacy(b)
    totals = (b.request_totals if legacy else m.request_totals) or RequestTotals()
    definitions = dict(GUIDELLM_DEFINITIONS)
    if legacy:
        definitions["layout"] = ("GuideLLM 0.2-0.3: request_totals beside metrics, model from worker.backend_model, "
                                 "strategy from args.strategy")
    values: dict[str, Any] = {"completed": totals.successful, "failed": totals.errored, "duration_s": b.duration}
    values["total_input_tokens"] = _whole(getattr(_successful(m.prompt_token_count), "total_sum", None))
    values["total_output_tokens"] = _whole(getattr(_successful(m.output_token_count), "total_sum", None))
    values.update(latency_fields("ttft", _stats(_successful(m.time_to_first_token_ms))))
    values.update(latency_fields("e2el", _stats(_successful(m.request_latency)), 1000.0))
    values["mean_tokens_per_chunk"] = getattr(_successful(m.output_tokens_per_iteration), "mean", None)
    values["mean_decode_tokens_per_chunk"] = getattr(_successful(m.iter_tokens_per_iteration), "mean", None)
    requests = (b.requests.successful if b.requests else None) or []
    sampled = b.request_samples is not None and b.request_samples.successful != totals.successful
    complete = not sampled and totals.successful is not None and len(requests) == totals.successful > 0
    spec = False
    if complete:
        tpots = [r.inter_token_latency_ms for r in requests if r.inter_token_latency_ms is not None]
        if tpots:
            values.update(latency_fields("tpot", latency_stats(tpots)))
            definitions["tpot"] = ("request-weighted, from requests.successful[].inter_token_latency_ms ((last token "
                                   "- first token) / (n - 1) per request, numpy statistics); GuideLLM's own "
                                   "inter_token_latency_ms distribution is token-weighted and kept apart")
        spec = _spec_decode(requests, values, definitions)
    else:
        definitions["tpot"] = (f"not computed: requests.successful holds {len(requests)} of {totals.successful} "
                               "successful requests (sampled); GuideLLM's token-weighted inter_token_latency_ms "
                               "is kept apart")
    raw = obj.data["benchmarks"][i]
    extra = {
        "inter_token_latency_ms": _summary(_successful(m.inter_token_latency_ms)),
        "time_per_output_token_ms": _summary(_successful(m.time_per_output_token_ms)),
        **{key: getattr(_successful(getattr(m, key)), "mean", None)
           for key in ("requests_per_second", "output_tokens_per_second", "tokens_per_second")},
        "request_totals": totals.model_dump(),
        "strategy": kept(((raw.get("args") if legacy else raw.get("config")) or {}).get("strategy")),
        "benchmark_id": b.config.id_ if b.config else None,
        "warmup_duration": b.warmup_duration, "cooldown_duration": b.cooldown_duration,
    }
    extra["inter_token_latency_ms"] = extra["inter_token_latency_ms"] and {
        **extra["inter_token_latency_ms"], "weighted_by": "output tokens - 1 per request (token-weighted TPOT)"}
    workload = _workload(report, b)
    totals_at = f"benchmarks[{i}].request_totals" if legacy else f"benchmarks[{i}].metrics.request_totals"
    keys = {"completed": f"{totals_at}.successful", "failed": f"{totals_at}.errored",
            "concurrency": f"benchmarks[{i}].args.strategy" if legacy else f"benchmarks[{i}].config.strategy"}

    def refuse(name: str, reason: str) -> ResultFileError:
        return ResultFileError(f"{obj.path}#benchmarks[{i}]", reason, None, keys.get(name, name))

    window, failure = finish_window(values, None, workload, definitions, refuse)
    return ImportedRun(source_tool=TOOL_GUIDELLM, source_version=None,
                       tool_version=report.metadata.guidellm_version if report.metadata else None,
                       definitions=definitions, metrics=window, workload=workload,
                       spec_source=GUIDELLM_SPEC_SOURCE if spec else None,
                       source_extra={k: v for k, v in extra.items() if v is not None}, failure=failure,
                       origin=f"{obj.path}#benchmarks[{i}]", keys=keys)


GUIDELLM_SPEC_SOURCE = ("GuideLLM: vLLM's per-request speculative_decoding figures (response_metrics) summed over "
                        "the benchmark's successful requests (not server counter deltas)")


def _loader_data(loader: RequestLoader | None) -> DataSpec:
    """GuideLLM 0.2-0.3's `request_loader.data` when it is a synthetic-data text
    ("prompt_tokens=512,output_tokens=128", or the same as JSON); else nothing known."""
    data = loader.data if loader is not None else None
    if isinstance(data, str):
        text = data.strip()
        try:
            data = json.loads(text) if text.startswith("{") else dict(p.split("=", 1) for p in text.split(","))
        except (ValueError, TypeError):
            return DataSpec()
    if not isinstance(data, dict):
        return DataSpec()
    try:
        return DataSpec.model_validate({k: (float(v) if k.endswith("_stdev") else int(v))
                                        for k, v in data.items() if k in _SYNTHETIC})
    except (ValueError, TypeError, ValidationError):
        return DataSpec()


_SYNTHETIC = ("prompt_tokens", "prompt_tokens_stdev", "output_tokens", "output_tokens_stdev")


def _workload(report: Report, b: Benchmark) -> dict[str, Any]:
    spec = (report.config.spec if report.config else None) or RunSpec()
    backend = (b.config.backend if b.config else None) or spec.backend or Backend()
    if b.worker is not None and backend.model is None and backend.kind is None:
        backend = Backend(model=b.worker.backend_model, kind=b.worker.backend_type)
    data = spec.data[0] if spec.data and len(spec.data) == 1 else _loader_data(b.request_loader)
    strategy = (b.config.strategy if b.config else None) or (b.args.strategy if b.args else None) or Strategy()
    kind = strategy.type_
    concurrency = {"synchronous": 1, "concurrent": strategy.streams}.get(kind, strategy.max_concurrency)
    return make_workload(input_len=_exact(data.prompt_tokens, data.prompt_tokens_stdev),
                         output_len=_exact(data.output_tokens, data.output_tokens_stdev), concurrency=concurrency,
                         request_rate=strategy.rate if kind in ("constant", "poisson") else None,
                         model=backend.model, backend=backend.request_format or backend.kind, dataset=data.kind)


def _document(source: Source) -> JsonFile:
    if source.path.suffix.lower() in YAML_SUFFIXES:
        return source.read_yaml(source.path, SKIP_TEXT)
    return source.json(SKIP_TEXT)


class GuideLLM(ResultFormat):
    """GuideLLM's `benchmarks.json` / `.yaml` (module docstring): one run per benchmark."""

    name: ClassVar[str] = "guidellm"
    tool: ClassVar[str] = TOOL_GUIDELLM
    reads: ClassVar[str] = "benchmarks.json or benchmarks.yaml of guidellm run (one run per benchmark)"
    expected: ClassVar[str] = ("benchmarks[].metrics with time_to_first_token_ms, request_latency, output_token_count "
                               "and request_totals (in metrics from GuideLLM 0.4, beside it in 0.2-0.3)")

    def recognise(self, source: Source) -> Recognition | None:
        """Recognised by `metadata.guidellm_version` (2) plus, per marker, a `benchmarks` list and
        a first benchmark with GuideLLM's `scheduler_metrics` / `scheduler_state` (0.4 on) or
        `run_stats` / `request_loader` / `worker` (0.2-0.3, which write no metadata); a document
        with neither the version nor those benchmark keys is not GuideLLM's."""
        if source.is_folder:
            return None
        objects = _document(source).objects
        if len(objects) != 1:
            return None
        data = objects[0].data
        meta = data.get("metadata")
        seen = ["metadata.guidellm_version"] if isinstance(meta, dict) and "guidellm_version" in meta else []
        benchmarks = data.get("benchmarks")
        if isinstance(benchmarks, list):
            first = benchmarks[0] if benchmarks and isinstance(benchmarks[0], dict) else {}
            seen += [f"benchmarks[0].{k}" for k in ("scheduler_metrics", "scheduler_state", "run_stats",
                                                     "request_loader", "worker") if k in first]
            if seen:
                seen.append("benchmarks")
        if not seen:
            return None
        return Recognition(len(seen) + ("metadata.guidellm_version" in seen), TOOL_GUIDELLM, tuple(seen))

    def read(self, source: Source) -> Iterable[ImportedRun]:
        if source.is_folder:
            raise ResultFileError(source.path, "is a folder; GuideLLM writes one report file")
        text = _document(source)
        if len(text.objects) != 1:
            raise ResultFileError(source.path, f"{len(text.objects)} JSON objects: a GuideLLM report is one")
        obj = text.objects[0]
        if not isinstance(obj.data.get("benchmarks"), list):
            raise obj.error(("benchmarks",), f"no benchmarks list: not a GuideLLM report (expected {self.expected}; "
                                             f"it has {', '.join(list(obj.data)[:10]) or 'no key'})")
        report = validate(Report, obj)
        if not report.benchmarks:
            raise obj.error(("benchmarks",), "no benchmark in benchmarks[]: GuideLLM recorded no run")
        for i, b in enumerate(report.benchmarks):
            if (b.metrics is None or b.metrics.request_totals is None) and b.request_totals is None:
                keys = ", ".join(list(obj.data["benchmarks"][i])[:10]) or "no key"
                raise obj.error(("benchmarks", i), f"a GuideLLM layout draftboard does not know (its keys: {keys}); "
                                                   f"expected one of: {'; '.join(LAYOUTS)}")
        for i in range(len(report.benchmarks)):
            yield import_benchmark(obj, i, report)


FORMAT = GuideLLM()
