"""genai-bench experiment folders (`genai-bench benchmark`), read: one run per run file.

Layout (genai-bench 0.0.5; sgl-project/genai-bench `genai_bench/metrics/`,
`genai_bench/cli/cli.py`; the fixture `tests/fixtures/harnesses/genai-bench/` and its NOTES.md):
an experiment folder holds `experiment_metadata.json` (`benchmark_version`, `api_backend`,
`api_model_name`, `server_engine`, `server_version` as the user typed them,
`server_model_tokenizer`, `task`, `metrics_time_unit`, ...) and one JSON file per (traffic
scenario, concurrency) `{"aggregated_metrics": {...}, "individual_request_metrics": [...],
"_time_unit": "s"}`. A folder may hold several experiments (each with its metadata file): every
`experiment_metadata.json` under the source is read with the run files beside it.

What maps where (`genai_bench/metrics/request_metrics_collector.py`,
`aggregated_metrics_collector.py`, docs/getting-started/metrics-definition.md):

- `stats.ttft`, `stats.tpot` ((e2e - ttft) / (n - 1) per request), `stats.e2e_latency`: one
  value per request (request-weighted), in `_time_unit` (s, x 1000): mean, p50 -> median,
  stddev -> std, p90, p95, p99 -> TTFT, TPOT, E2EL.
- `num_completed_requests`, `num_error_requests`, `num_requests`, `error_rate` -> completed,
  failed, num_prompts, error_rate; `stats.num_input_tokens.sum`, `stats.num_output_tokens.sum`
  (the server's usage) -> the token totals.
- `run_duration` is the runner's start to stop (users spawned and stopped included): wider than
  draftboard's window. It is stored as `duration_s` and the tool's throughputs over it
  (`mean_output_throughput_tokens_per_s`, `mean_total_tokens_throughput_tokens_per_s`,
  `requests_per_second`) as draftboard's, with that definition recorded: they read lower than a
  window-based figure of the same run.
- Per-request speeds (`output_inference_speed`, `output_throughput`, `input_throughput`) and
  `output_latency` have no field and are kept in `extra`. No chunk, ITL or spec-decode figure.
- `scenario` `D(in,out)` (deterministic lengths) gives the requested input and output length.

The format (`FORMAT`, registry name "genai-bench", tool "genai-bench"): a folder, recognised by
`experiment_metadata.json` with `benchmark_version` and run files with `aggregated_metrics`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from benchkit.engines.registry import launched_engines
from benchkit.formats.base import Recognition, ResultFormat, Source
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
    validate,
)
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonObject

TOOL_GENAI_BENCH = "genai-bench"
METADATA = "experiment_metadata.json"
#: genai-bench's time units -> ms per unit.
TIME_UNITS_MS = {"s": 1000.0, "ms": 1.0}
#: The per-request list is never stored (its error messages are not checked for storable text).
SKIP_TEXT = (("individual_request_metrics",),)
_DETERMINISTIC = re.compile(r"D\((\d+),(\d+)\)")

GENAI_DEFINITIONS = {
    "ttft": "stats.ttft: first token time minus start (time.monotonic), one value per request",
    "tpot": "stats.tpot: (e2e_latency - ttft) / (num_output_tokens - 1) per request, request-weighted",
    "e2el": "stats.e2e_latency: end minus start per request",
    "percentiles": "numpy.percentile (linear), np.std (population); p50 is the median",
    "duration": "run_duration: the runner's start to stop (user spawning and the stop included), wider than "
    "draftboard's window (first send to last completion): throughputs over it read lower",
    "output_tokens": "the server's usage.completion_tokens (the client tokenizer only as a fallback)",
    "itl": "not in the file: genai-bench has no per-token or per-chunk gap figure",
}


class Stat(ResultModel):
    mean: Number() | None = None
    p50: Number() | None = None
    stddev: Number() | None = None
    p90: Number() | None = None
    p95: Number() | None = None
    p99: Number() | None = None
    sum: Number() | None = None


class Stats(ResultModel):
    ttft: Stat | None = None
    tpot: Stat | None = None
    e2e_latency: Stat | None = None
    num_input_tokens: Stat | None = None
    num_output_tokens: Stat | None = None


class Aggregated(ResultModel):
    scenario: Text(200) | None = None
    num_concurrency: Whole(1, INT_MAX) | None = None
    iteration_type: Text(100) | None = None
    run_duration: Number() | None = None
    mean_output_throughput_tokens_per_s: Number() | None = None
    mean_total_tokens_throughput_tokens_per_s: Number() | None = None
    requests_per_second: Number() | None = None
    error_rate: Number(0.0, 1.0) | None = None
    num_error_requests: Whole(0, INT_MAX) | None = None
    num_completed_requests: Whole(0, INT_MAX) | None = None
    num_requests: Whole(1, INT_MAX) | None = None
    stats: Stats | None = None


class RunFile(ResultModel):
    """One run file: the aggregate read; the per-request list is not kept."""

    aggregated_metrics: Aggregated
    individual_request_metrics: Any = None
    time_unit: Text(10) | None = Field(None, alias="_time_unit")


class Metadata(ResultModel):
    benchmark_version: Text(TEXT_LIMITS["engine_version"]) | None = None
    api_backend: Text(100) | None = None
    api_model_name: Text(TEXT_LIMITS["model"]) | None = None
    server_model_tokenizer: Text(TEXT_LIMITS["model"]) | None = None
    server_engine: Text(100) | None = None
    server_version: Text(TEXT_LIMITS["engine_version"]) | None = None
    task: Text(100) | None = None
    metrics_time_unit: Text(10) | None = None
    dataset_path: Text(TEXT_LIMITS["dataset"]) | None = None


def _stats(stat: Stat | None) -> dict[str, float | None]:
    if stat is None:
        return {}
    return {"mean": stat.mean, "median": stat.p50, "std": stat.stddev, "p90": stat.p90, "p95": stat.p95,
            "p99": stat.p99}


def _sum(stat: Stat | None) -> int | None:
    return int(stat.sum) if stat is not None and stat.sum is not None and float(stat.sum).is_integer() else None


def _engine(typed: str | None) -> str | None:
    """The registered engine the user named with --server-engine (case aside), else None."""
    if not typed:
        return None
    return next((e for e in launched_engines() if e.lower() == typed.strip().lower()), None)


def import_run_file(obj: JsonObject, meta: Metadata) -> ImportedRun:
    """One genai-bench run file (validated) of an experiment whose metadata is `meta`."""
    m = validate(RunFile, obj)
    a = m.aggregated_metrics
    unit = m.time_unit or meta.metrics_time_unit or "s"
    if unit not in TIME_UNITS_MS:
        raise obj.error(("_time_unit",), f"unit {unit!r}: expected s or ms")
    scale = TIME_UNITS_MS[unit]
    stats = a.stats or Stats()
    values: dict[str, Any] = {
        "completed": a.num_completed_requests, "failed": a.num_error_requests, "error_rate": a.error_rate,
        "duration_s": a.run_duration, "total_input_tokens": _sum(stats.num_input_tokens),
        "total_output_tokens": _sum(stats.num_output_tokens), "request_throughput_req_s": a.requests_per_second,
        "output_throughput_tok_s": a.mean_output_throughput_tokens_per_s,
        "total_token_throughput_tok_s": a.mean_total_tokens_throughput_tokens_per_s,
    }
    values.update(latency_fields("ttft", _stats(stats.ttft), scale))
    values.update(latency_fields("tpot", _stats(stats.tpot), scale))
    values.update(latency_fields("e2el", _stats(stats.e2e_latency), scale))
    lengths = _DETERMINISTIC.fullmatch((a.scenario or "").replace(" ", ""))
    concurrency = a.num_concurrency if a.iteration_type in (None, "num_concurrency") else None
    workload = make_workload(input_len=int(lengths.group(1)) or None if lengths else None,
                             output_len=int(lengths.group(2)) or None if lengths else None,
                             num_prompts=a.num_requests, concurrency=concurrency, model=meta.api_model_name,
                             tokenizer=meta.server_model_tokenizer, backend=meta.api_backend,
                             dataset=meta.dataset_path if meta.dataset_path not in (None, "None") else None,
                             engine=_engine(meta.server_engine))
    definitions = dict(GENAI_DEFINITIONS)
    if unit != "s":
        definitions["units"] = f"latencies in {unit} (_time_unit)"
    keys = {"completed": "aggregated_metrics.num_completed_requests", "failed": "aggregated_metrics.num_error_requests",
            "duration_s": "aggregated_metrics.run_duration"}
    window, failure = finish_window(values, None, workload, definitions,
                                    lambda name, reason: obj.error(tuple(keys.get(name, name).split(".")), reason))
    extra = extra_of(a)
    if extra_of(stats):
        extra["stats"] = extra_of(stats)
    for key in ("scenario", "iteration_type"):
        if getattr(a, key) is not None:
            extra[key] = getattr(a, key)
    if meta.task:
        extra["task"] = meta.task
    return ImportedRun(source_tool=TOOL_GENAI_BENCH, source_version=meta.server_version,
                       tool_version=meta.benchmark_version, definitions=definitions, metrics=window,
                       workload=workload, source_extra=extra, failure=failure, source=obj, keys=keys)


def _experiments(source: Source) -> list[Path]:
    return [p for p in source.files() if p.name == METADATA]


def _run_files(folder: Path, source: Source) -> list[Path]:
    """The run files of one experiment: JSON files beside its metadata, sorted."""
    return [p for p in source.files() if p.parent == folder and p.suffix == ".json" and p.name != METADATA]


class GenaiBench(ResultFormat):
    """A genai-bench experiment folder (module docstring): one run per run file."""

    name: ClassVar[str] = "genai-bench"
    tool: ClassVar[str] = TOOL_GENAI_BENCH
    takes: ClassVar[str] = "folder"
    reads: ClassVar[str] = f"an experiment folder ({METADATA} and one JSON per scenario and concurrency)"
    expected: ClassVar[str] = "aggregated_metrics with num_completed_requests, run_duration and stats (ttft, tpot, " \
                              "e2e_latency)"

    def recognise(self, source: Source) -> Recognition | None:
        """One marker per experiment_metadata.json with `benchmark_version`, one more when a run
        file beside it has `aggregated_metrics`."""
        seen: list[str] = []
        for meta in _experiments(source)[:20]:
            try:
                data = source.read_json(meta).objects[0].data
            except ResultFileError:
                continue
            if "benchmark_version" in data:
                seen.append(f"{meta.name}: benchmark_version")
                for run in _run_files(meta.parent, source)[:1]:
                    try:
                        if "aggregated_metrics" in source.read_json(run, SKIP_TEXT).objects[0].data:
                            seen.append(f"{run.name}: aggregated_metrics")
                    except ResultFileError:
                        pass
        return Recognition(len(seen), TOOL_GENAI_BENCH, tuple(seen[:4])) if seen else None

    def read(self, source: Source) -> Iterable[ImportedRun]:
        if not source.is_folder:
            raise ResultFileError(source.path, "is a file; genai-bench writes an experiment folder")
        metas = _experiments(source)
        if not metas:
            raise ResultFileError(source.path, f"no {METADATA}: not a genai-bench experiment folder")
        for path in metas:
            text = source.read_json(path)
            if len(text.objects) != 1:
                raise ResultFileError(path, f"{len(text.objects)} JSON objects: {METADATA} is one")
            meta = validate(Metadata, text.objects[0])
            runs = _run_files(path.parent, source)
            if not runs:
                raise ResultFileError(path.parent, "no run file beside experiment_metadata.json")
            for run_path in runs:
                run_text = source.read_json(run_path, SKIP_TEXT)
                if len(run_text.objects) != 1:
                    raise ResultFileError(run_path, f"{len(run_text.objects)} JSON objects: a run file is one")
                run = import_run_file(run_text.objects[0], meta)
                run.origin = str(run_path)
                yield run


FORMAT = GenaiBench()
