"""NVIDIA AIPerf result files (`aiperf profile`), read.

Layout (AIPerf 0.13, schema_version 1.4; ai-dynamo/aiperf `aiperf/exporters/`; the fixture
`tests/fixtures/harnesses/aiperf/` and its NOTES.md): `profile_export_aiperf.json` is one JSON
object with `aiperf_version`, `benchmark_id`, `input_config` (models, endpoint, datasets with
`prompts.isl` / `prompts.osl`, `phases[]` with `kind`, `type`, `concurrency`, `requests`),
`run_info` (`cli_command`), `was_cancelled`, `is_complete`, `error_summary`, `warmup_metrics`
(the warmup phase, not read), `pooled_spec_decode_acceptance_histogram`, and one key per metric
tag, each `{"unit", "avg", "std", "min", "max", "p1".."p99", "count", "sum"}` (a scalar metric
has only `unit` and `avg`). Units are per tag (`ms`, `sec`, `%`, ...) and read, never assumed.
Beside it, `profile_export.jsonl` (the per-record export, where AIPerf wrote one) holds one
object per request, `metadata.benchmark_phase` `warmup` or `profiling`: warmup records are
left out.

What maps where (AIPerf's definitions, `aiperf/metrics/types/*.py`):

- `time_to_first_token` -> TTFT, `request_latency` (last content response - start) -> E2EL,
  `inter_chunk_latency` (every gap between content chunks, pooled) -> ICL: the same definitions
  as draftboard's; `avg`, `p50`, `std`, `p90`, `p95`, `p99` -> mean, median, std, p90, p95, p99
  (numpy linear percentiles, population std, as draftboard).
- AIPerf's `inter_token_latency` is per request (request_latency - TTFT) / (OSL - 1): draftboard's
  TPOT, but with OSL counted by re-tokenizing the text on the client unless the server's counts
  were used. With the per-record export, TPOT is recomputed per profiling record with the
  server's n, `(request_latency - time_to_first_token) / (usage_completion_tokens - 1)`
  (draftboard's TPOT exactly), and AIPerf's own block is kept in `extra` as
  `inter_token_latency`. Without it AIPerf's figure is stored as TPOT, and
  `output_tokens_from_text` says the n came from the client unless every request's
  `usage_completion_tokens_diff_pct` was 0.
- Output tokens: the server's `total_usage_completion_tokens` where present (then output and
  total token throughput = tokens / `benchmark_duration`, AIPerf's client-count throughputs kept
  in `extra` under their tags), else the client's `total_osl` (flagged).
- Spec decode (vLLM's per-request `metrics.speculative_decoding`, summed by AIPerf over the
  profiling requests): `spec_decode_token_weighted_acceptance_length` (1 + sum accepted / sum
  steps) -> `acceptance_length` and `acceptance_length_token_weighted`;
  `spec_decode_acceptance_length` (the mean over requests) -> `acceptance_length_request_weighted`,
  its `count` -> `spec_requests_reported`; `spec_decode_overall_draft_acceptance_rate` (%) ->
  `acceptance_rate`; `total_spec_decode_steps`, `total_draft_tokens`,
  `total_accepted_draft_tokens` -> the draft counts; the pooled histogram -> the per-position
  rates (k = draft tokens / steps).

The format (`FORMAT`, registry name "aiperf", tool "AIPerf"): a file, recognised by AIPerf's own
top-level keys (`AIPERF_MARKERS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import StrictBool

from benchkit.formats.base import JsonObjectsFormat, Source
from benchkit.formats.common import (
    INT_MAX,
    TEXT_LIMITS,
    ImportedRun,
    Number,
    ResultModel,
    Text,
    Whole,
    extra_of,
    finish_window,
    latency_fields,
    make_workload,
    per_position_rates,
    validate,
)
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonObject
from benchkit.measure.metrics import latency_stats

TOOL_AIPERF = "AIPerf"
#: The per-record export AIPerf writes beside the summary.
RECORDS_FILE = "profile_export.jsonl"
#: A time unit AIPerf writes -> ms per unit.
TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0}
#: draftboard statistic -> AIPerf's key of it.
STATS = {"mean": "avg", "median": "p50", "std": "std", "p90": "p90", "p95": "p95", "p99": "p99"}

AIPERF_DEFINITIONS = {
    "ttft": "time_to_first_token: first content response minus request start (AIPerf ttft_metric.py)",
    "e2el": "request_latency: last content response minus request start (usage-only chunks excluded)",
    "icl": "inter_chunk_latency: every gap between consecutive content chunks, pooled over requests",
    "percentiles": "numpy-style linear interpolation, population std (AIPerf metric_dicts.py); latency "
    "statistics over successful requests",
    "duration": "benchmark_duration: first request to last response of the profiling phase",
    "itl": "not in the file: AIPerf's inter_token_latency is per request (latency - TTFT) / (OSL - 1), "
    "draftboard's TPOT, and it has no per-token gap figure",
}

MODEL_TEXT = Text(TEXT_LIMITS["model"])


class Stat(ResultModel):
    """One AIPerf metric tag: its unit and statistics (non-negative; unknown keys kept)."""

    unit: Text(40) | None = None
    avg: Number() | None = None
    std: Number() | None = None
    p50: Number() | None = None
    p90: Number() | None = None
    p95: Number() | None = None
    p99: Number() | None = None
    count: Whole(0, INT_MAX) | None = None


class SignedStat(Stat):
    """A tag whose values may be negative (a difference in percent)."""

    avg: Number(None) | None = None
    std: Number() | None = None
    p50: Number(None) | None = None
    p90: Number(None) | None = None
    p95: Number(None) | None = None
    p99: Number(None) | None = None
    min: Number(None) | None = None
    max: Number(None) | None = None


class Dist(ResultModel):
    mean: Number() | None = None
    stddev: Number() | None = None


class Prompts(ResultModel):
    isl: Dist | None = None
    osl: Dist | None = None


class Dataset(ResultModel):
    name: Text(200) | None = None
    type: Text(TEXT_LIMITS["dataset"]) | None = None
    prompts: Prompts | None = None


class Phase(ResultModel):
    name: Text(200) | None = None
    kind: Text(100) | None = None
    type: Text(100) | None = None
    concurrency: Whole(1, INT_MAX) | None = None
    requests: Whole(1, INT_MAX) | None = None
    exclude_from_results: StrictBool | None = None


class ModelItem(ResultModel):
    name: MODEL_TEXT | None = None


class Models(ResultModel):
    items: list[ModelItem] | None = None


class Endpoint(ResultModel):
    type: Text(100) | None = None
    streaming: StrictBool | None = None


class Tokenizer(ResultModel):
    name: MODEL_TEXT | None = None


class InputConfig(ResultModel):
    models: Models | None = None
    endpoint: Endpoint | None = None
    datasets: list[Dataset] | None = None
    phases: list[Phase] | None = None
    tokenizer: Tokenizer | None = None


#: The metric tags read, each one Stat.
READ_TAGS = ("request_throughput", "request_latency", "time_to_first_token", "inter_token_latency",
             "inter_chunk_latency", "output_token_throughput", "total_token_throughput", "benchmark_duration",
             "request_count", "completed_request_count", "error_request_count", "total_output_tokens", "total_osl",
             "total_isl", "total_usage_completion_tokens", "total_usage_prompt_tokens",
             "spec_decode_acceptance_length", "spec_decode_token_weighted_acceptance_length",
             "spec_decode_overall_draft_acceptance_rate", "total_spec_decode_steps", "total_draft_tokens",
             "total_accepted_draft_tokens")


class Profile(ResultModel):
    """`profile_export_aiperf.json` (module docstring): the keys read; the rest is kept."""

    aiperf_version: Text(TEXT_LIMITS["engine_version"]) | None = None
    schema_version: Text(40) | None = None
    benchmark_id: Text(200) | None = None
    was_cancelled: StrictBool | None = None
    is_complete: StrictBool | None = None
    error_summary: list[Any] | None = None
    input_config: InputConfig | None = None
    warmup_metrics: Any = None
    pooled_spec_decode_acceptance_histogram: dict[str, Whole()] | None = None
    usage_completion_tokens_diff_pct: SignedStat | None = None
    request_throughput: Stat | None = None
    request_latency: Stat | None = None
    time_to_first_token: Stat | None = None
    inter_token_latency: Stat | None = None
    inter_chunk_latency: Stat | None = None
    output_token_throughput: Stat | None = None
    total_token_throughput: Stat | None = None
    benchmark_duration: Stat | None = None
    request_count: Stat | None = None
    completed_request_count: Stat | None = None
    error_request_count: Stat | None = None
    total_output_tokens: Stat | None = None
    total_osl: Stat | None = None
    total_isl: Stat | None = None
    total_usage_completion_tokens: Stat | None = None
    total_usage_prompt_tokens: Stat | None = None
    spec_decode_acceptance_length: Stat | None = None
    spec_decode_token_weighted_acceptance_length: Stat | None = None
    spec_decode_overall_draft_acceptance_rate: Stat | None = None
    total_spec_decode_steps: Stat | None = None
    total_draft_tokens: Stat | None = None
    total_accepted_draft_tokens: Stat | None = None


class Value(ResultModel):
    value: Number() | None = None
    unit: Text(40) | None = None


class ListValue(ResultModel):
    value: list[Number()] | None = None
    unit: Text(40) | None = None


class CountValue(ResultModel):
    value: Whole(0, INT_MAX) | None = None


class RecordMetrics(ResultModel):
    time_to_first_token: Value | None = None
    request_latency: Value | None = None
    usage_completion_tokens: CountValue | None = None
    inter_chunk_latency: ListValue | None = None


class RecordMeta(ResultModel):
    benchmark_phase: Text(100) | None = None
    was_cancelled: StrictBool | None = None


class Record(ResultModel):
    """One line of `profile_export.jsonl`: the keys read (the rest is not kept)."""

    metadata: RecordMeta | None = None
    metrics: RecordMetrics | None = None
    error: Any = None


def _whole(stat: Stat | None) -> int | None:
    """A count tag's `avg` as a whole number (None when absent or not whole)."""
    if stat is None or stat.avg is None or not float(stat.avg).is_integer():
        return None
    return int(stat.avg)


def time_scale(stat: Stat | Value | ListValue | None, obj: JsonObject, key: str, to: str = "ms") -> float:
    """ms (or s, `to="s"`) per unit of a tag, from its `unit`; ResultFileError for a unit that is
    not a time (`ms` when the tag has none: AIPerf's default for latencies)."""
    unit = (stat.unit if stat is not None else None) or "ms"
    if unit not in TIME_UNITS_MS:
        raise obj.error((key, "unit"), f"unit {unit!r}: expected a time unit ({', '.join(TIME_UNITS_MS)})")
    return TIME_UNITS_MS[unit] / (1000.0 if to == "s" else 1.0)


def _fraction(stat: Stat | None, obj: JsonObject, key: str) -> float | None:
    if stat is None or stat.avg is None:
        return None
    if stat.unit in ("%", "percent"):
        return stat.avg / 100.0
    if stat.unit in (None, "ratio", "fraction"):
        return stat.avg
    raise obj.error((key, "unit"), f"unit {stat.unit!r}: expected % or ratio")


def _latency(metric: str, stat: Stat | None, obj: JsonObject, key: str) -> dict[str, float | None]:
    if stat is None:
        return {}
    return latency_fields(metric, {s: getattr(stat, k) for s, k in STATS.items()}, time_scale(stat, obj, key))


def _profiling_phase(config: InputConfig | None) -> Phase | None:
    phases = [p for p in (config.phases if config and config.phases else [])
              if p.kind == "profiling" or (p.kind is None and not p.exclude_from_results)]
    return phases[0] if len(phases) == 1 else None


def _exact_len(dist: Dist | None) -> int | None:
    """A requested length in tokens when the dataset fixes it (stddev 0, a whole mean)."""
    if dist is None or dist.mean is None or dist.stddev not in (0, 0.0) or not float(dist.mean).is_integer():
        return None
    return int(dist.mean) or None


class RecordsFigures:
    """What the per-record export adds: TPOT per profiling record with the server's n, and the
    per-request lists for tokens per chunk. `used` is False (with `why`) when the records do not
    cover the completed requests."""

    def __init__(self, records: list[tuple[JsonObject, Record]], completed: int | None):
        self.used = False
        self.why = ""
        self.tpot_ms: list[float] = []
        self.per_request: dict[str, list] | None = None
        profiling = [(o, r) for o, r in records if r.metadata and r.metadata.benchmark_phase == "profiling"]
        ok = [(o, r) for o, r in profiling if r.error is None and not (r.metadata and r.metadata.was_cancelled)]
        if completed is None or len(ok) != completed:
            self.why = (f"{len(ok)} successful profiling records for {completed} completed requests: TPOT not "
                        "recomputed")
            return
        lens, gaps = [], []
        for obj, rec in ok:
            m = rec.metrics or RecordMetrics()
            n = m.usage_completion_tokens.value if m.usage_completion_tokens else None
            if m.time_to_first_token is None or m.request_latency is None or n is None \
                    or m.time_to_first_token.value is None or m.request_latency.value is None:
                self.why = f"{obj.path}:{obj.line}: a profiling record without TTFT, latency or usage_completion_tokens"
                return
            ttft = m.time_to_first_token.value * time_scale(m.time_to_first_token, obj,
                                                            "metrics.time_to_first_token")
            e2el = m.request_latency.value * time_scale(m.request_latency, obj, "metrics.request_latency")
            if n >= 2:
                self.tpot_ms.append((e2el - ttft) / (n - 1))
            icl = m.inter_chunk_latency
            if icl is not None and icl.value is not None:
                lens.append(n)
                gaps.append([g * time_scale(icl, obj, "metrics.inter_chunk_latency") for g in icl.value])
        self.used = True
        if len(lens) == len(ok):
            self.per_request = {"output_lens": lens, "icls_ms": gaps}


def import_aiperf(obj: JsonObject, records: list[tuple[JsonObject, Record]] | None,
                  records_name: str = RECORDS_FILE) -> ImportedRun:
    """One AIPerf profile (`profile_export_aiperf.json`, validated) and, when given, its
    per-record export's validated records (module docstring). Raises ResultFileError naming the
    key."""
    m = validate(Profile, obj)
    if m.was_cancelled or m.is_complete is False:
        raise obj.error(("was_cancelled" if m.was_cancelled else "is_complete"),
                        "AIPerf says this benchmark was cancelled or did not complete: a partial result")
    definitions = dict(AIPERF_DEFINITIONS)
    extra = extra_of(m)
    extra.pop("warmup_metrics", None)
    keys: dict[str, str] = {}
    values: dict[str, Any] = {}
    completed = _whole(m.completed_request_count) if m.completed_request_count else _whole(m.request_count)
    failed = _whole(m.error_request_count)
    if failed is None and m.error_summary == []:
        failed = 0
        definitions["failed"] = "0: error_request_count is absent and error_summary is empty (AIPerf writes the " \
                                "count only when a request failed)"
    values.update(completed=completed, failed=failed)
    if m.benchmark_duration is not None and m.benchmark_duration.avg is not None:
        values["duration_s"] = m.benchmark_duration.avg * time_scale(m.benchmark_duration, obj, "benchmark_duration",
                                                                     to="s")
    server_tokens = _whole(m.total_usage_completion_tokens)
    if server_tokens is not None:
        values["total_output_tokens"] = server_tokens
        values["total_input_tokens"] = _whole(m.total_usage_prompt_tokens)
        definitions["output_tokens"] = "total_usage_completion_tokens: the server's usage counts; AIPerf's " \
                                       "client counts (total_osl, output_token_throughput) are kept under their tags"
        for tag in ("output_token_throughput", "total_token_throughput", "inter_token_latency"):
            if getattr(m, tag) is not None:
                extra[tag] = getattr(m, tag).model_dump(exclude_none=True)
    else:
        values["total_output_tokens"] = _whole(m.total_osl) if m.total_osl else _whole(m.total_output_tokens)
        values["total_input_tokens"] = _whole(m.total_isl)
        values["output_throughput_tok_s"] = m.output_token_throughput.avg if m.output_token_throughput else None
        values["total_token_throughput_tok_s"] = m.total_token_throughput.avg if m.total_token_throughput else None
        values["output_tokens_from_text"] = values["total_output_tokens"] is not None
        definitions["output_tokens"] = "total_osl: re-tokenized on the client (no server usage in the file)"
    values["request_throughput_req_s"] = m.request_throughput.avg if m.request_throughput else None
    values.update(_latency("ttft", m.time_to_first_token, obj, "time_to_first_token"))
    values.update(_latency("e2el", m.request_latency, obj, "request_latency"))
    values.update(_latency("icl", m.inter_chunk_latency, obj, "inter_chunk_latency"))
    keys.update({f"{s}_{name}_ms": f"{tag}.{k}" for name, tag in (("ttft", "time_to_first_token"),
                 ("e2el", "request_latency"), ("icl", "inter_chunk_latency"), ("tpot", "inter_token_latency"))
                 for s, k in STATS.items()})

    figures = RecordsFigures(records, completed) if records is not None else None
    per_request = None
    if figures is not None and figures.used:
        stats = latency_stats(figures.tpot_ms) if figures.tpot_ms else None
        if stats:
            values.update(latency_fields("tpot", stats))
        values["output_tokens_from_text"] = False
        per_request = figures.per_request
        definitions["tpot"] = (f"recomputed from {records_name}: (request_latency - time_to_first_token) / "
                               "(usage_completion_tokens - 1) per successful profiling record (the server's n; "
                               "warmup records left out), numpy statistics; AIPerf's inter_token_latency uses the "
                               "client's OSL and is kept under its tag")
        extra["inter_token_latency"] = m.inter_token_latency.model_dump(exclude_none=True) \
            if m.inter_token_latency else None
    else:
        values.update(_latency("tpot", m.inter_token_latency, obj, "inter_token_latency"))
        diff = m.usage_completion_tokens_diff_pct
        same_n = diff is not None and diff.min == 0 and diff.max == 0
        if m.inter_token_latency is not None:
            values["output_tokens_from_text"] = not same_n
        definitions["tpot"] = ("inter_token_latency: (request_latency - TTFT) / (OSL - 1) per request, OSL "
                               + ("equal to the server's count for every request" if same_n else
                                  "re-tokenized on the client") + (f" ({figures.why})" if figures else
                                                                    f" (no {records_name} beside the file)"))
    _spec_decode(m, obj, values, keys, definitions)
    phase = _profiling_phase(m.input_config)
    config = m.input_config or InputConfig()
    prompts = (config.datasets[0].prompts if config.datasets and len(config.datasets) == 1 else None) or Prompts()
    model = next((i.name for i in (config.models.items or []) if i.name), None) if config.models else None
    workload = make_workload(
        input_len=_exact_len(prompts.isl), output_len=_exact_len(prompts.osl),
        num_prompts=phase.requests if phase else None,
        concurrency=phase.concurrency if phase and phase.type == "concurrency" else None,
        model=model, tokenizer=config.tokenizer.name if config.tokenizer else None,
        backend=config.endpoint.type if config.endpoint else None,
        dataset=config.datasets[0].type if config.datasets and len(config.datasets) == 1 else None)
    keys.update(concurrency="input_config.phases", num_prompts="input_config.phases",
                completed="completed_request_count")
    window, failure = finish_window(values, per_request, workload, definitions,
                                    lambda name, reason: obj.error((keys.get(name, name),), reason))
    return ImportedRun(source_tool=TOOL_AIPERF, source_version=None, tool_version=m.aiperf_version,
                       definitions=definitions, metrics=window, workload=workload,
                       spec_source=AIPERF_SPEC_SOURCE if window.has_spec_decode else None,
                       per_request=per_request, source_extra=extra, failure=failure, source=obj, keys=keys)


AIPERF_SPEC_SOURCE = ("AIPerf: vLLM's per-request speculative_decoding figures summed over the profiling requests "
                      "(not server counter deltas)")


def _spec_decode(m: Profile, obj: JsonObject, values: dict[str, Any], keys: dict[str, str],
                 definitions: dict[str, str]) -> None:
    """The acceptance fields from AIPerf's Spec Decode tags (module docstring)."""
    tau = m.spec_decode_token_weighted_acceptance_length
    per_request = m.spec_decode_acceptance_length
    steps, drafted, accepted = (_whole(m.total_spec_decode_steps), _whole(m.total_draft_tokens),
                                _whole(m.total_accepted_draft_tokens))
    values.update(acceptance_length=tau.avg if tau else None,
                  acceptance_length_token_weighted=tau.avg if tau else None,
                  acceptance_length_request_weighted=per_request.avg if per_request else None,
                  spec_requests_reported=per_request.count if per_request else None,
                  acceptance_rate=_fraction(m.spec_decode_overall_draft_acceptance_rate, obj,
                                            "spec_decode_overall_draft_acceptance_rate"),
                  spec_num_drafts=steps, spec_num_draft_tokens=drafted, spec_num_accepted_tokens=accepted)
    keys.update(acceptance_length="spec_decode_token_weighted_acceptance_length.avg",
                acceptance_length_token_weighted="spec_decode_token_weighted_acceptance_length.avg",
                acceptance_length_request_weighted="spec_decode_acceptance_length.avg",
                acceptance_rate="spec_decode_overall_draft_acceptance_rate.avg",
                spec_num_drafts="total_spec_decode_steps", spec_num_draft_tokens="total_draft_tokens",
                spec_num_accepted_tokens="total_accepted_draft_tokens",
                per_position_acceptance_rate="pooled_spec_decode_acceptance_histogram")
    histogram = m.pooled_spec_decode_acceptance_histogram
    if histogram and steps and drafted and drafted % steps == 0:
        if not all(k.isdigit() and len(k) < 6 for k in histogram):
            raise obj.error(("pooled_spec_decode_acceptance_histogram",), "keys must be accepted-token counts 0..k")
        values["per_position_acceptance_rate"] = per_position_rates({int(k): v for k, v in histogram.items()},
                                                                    drafted // steps)
        definitions["per_position_acceptance_rate"] = ("from pooled_spec_decode_acceptance_histogram: steps that "
                                                       "accepted >= p drafts / all steps, k = total_draft_tokens / "
                                                       "total_spec_decode_steps")
    if tau is not None:
        definitions["acceptance_length"] = ("spec_decode_token_weighted_acceptance_length: 1 + sum accepted / sum "
                                            "steps over the profiling requests; spec_decode_acceptance_length (the "
                                            "mean over requests) is acceptance_length_request_weighted")


#: Top-level keys AIPerf writes and the other tools do not: how detection tells its summary.
AIPERF_MARKERS = frozenset({"aiperf_version", "benchmark_id", "input_config", "run_info", "was_cancelled",
                            "is_complete", "error_summary", "warmup_metrics", "time_to_second_token",
                            "inter_chunk_latency", "output_sequence_length", "benchmark_duration",
                            "pooled_spec_decode_acceptance_histogram"})


class Aiperf(JsonObjectsFormat):
    """AIPerf's `profile_export_aiperf.json`, with the per-record `profile_export.jsonl` beside it
    when there is one (module docstring)."""

    name: ClassVar[str] = "aiperf"
    tool: ClassVar[str] = TOOL_AIPERF
    reads: ClassVar[str] = f"profile_export_aiperf.json (and {RECORDS_FILE} beside it)"
    markers: ClassVar[frozenset[str]] = AIPERF_MARKERS
    figure_keys: ClassVar[frozenset[str]] = frozenset(READ_TAGS)

    def read_object(self, obj: JsonObject) -> ImportedRun:
        return import_aiperf(obj, None)

    def read(self, source: Source) -> Iterable[ImportedRun]:
        text = source.json()
        if len(text.objects) != 1:
            raise ResultFileError(source.path, f"{len(text.objects)} JSON objects: an AIPerf profile export is one")
        obj = text.objects[0]
        self.require(obj)
        sibling = source.path.parent / RECORDS_FILE
        records = None
        if sibling.is_file():
            records = [(r, validate(Record, r)) for r in source.read_json(sibling).objects]
        run = import_aiperf(obj, records)
        run.origin = str(source.path)
        yield run


FORMAT = Aiperf()
