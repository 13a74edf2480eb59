"""inference-perf report folders (`inference-perf --config_file ...`), read: one run per stage.

Layout (inference-perf 0.7; kubernetes-sigs/inference-perf `inference_perf/reportgen/base.py`,
docs/reports.md; the fixture `tests/fixtures/harnesses/inference-perf/` and its NOTES.md): a
report folder holds `stage_<N>_lifecycle_metrics.json` per load stage,
`summary_lifecycle_metrics.json` (every stage pooled), `per_request_lifecycle_metrics.json`
(not read: request and response texts), and `config.yaml` (the run's configuration as the tool
normalised it: `server.type`, `server.model_name`, `load.type`, `load.stages[]`
`concurrency_level` / `rate`, `data.input_distribution` / `output_distribution`,
`report.request_lifecycle.use_server_output_tokens`). A lifecycle report has
`benchmark_time_seconds` (stage files), `load_summary` (`count`, `requested_rate`, `concurrency`),
`successes` (`count`, `latency.{request_latency, time_to_first_token, time_per_output_token,
normalized_time_per_output_token, inter_token_latency}` each `{mean, median, p90, p95, p99,
...}` in **seconds**, `throughput`, `prompt_tokens` / `output_tokens` (the server's usage, with
`total`), `output_len` (the client's re-tokenized count), `client_fallback_requests`) and
`failures.count`. The tool's version is not in the reports.

What maps where (inference-perf's definitions, `reportgen/base.py`):

- `time_to_first_token` -> TTFT, `request_latency` -> E2EL, x 1000 (mean, median, p90, p95, p99;
  inference-perf writes no std).
- `time_per_output_token` = (last token - first token) / (n - 1) per request: draftboard's TPOT,
  with n re-tokenized on the client unless `use_server_output_tokens` is set in config.yaml
  (then `output_tokens_from_text` is False; otherwise True and the definitions say so).
- `inter_token_latency` pools every consecutive-token delta with each chunk's tokens given the
  chunk's arrival time (a chunk of k tokens adds its gap once and k - 1 zeros): neither
  draftboard's per-token ITL nor its ICL. It is kept in `extra` under its own name, as is
  `normalized_time_per_output_token` (E2EL / n).
- Counts: `successes.count`, `failures.count`, `load_summary.count` -> completed, failed,
  num_prompts; `successes.prompt_tokens.total`, `successes.output_tokens.total` (the server's) ->
  the token totals. `benchmark_time_seconds` (first start to last end of the stage's requests)
  -> duration_s; request throughput `requests_per_sec`; output and total token throughput are
  draftboard's (server tokens / duration), the tool's client-count ones kept in `extra`.
- No spec-decode figure.

The format (`FORMAT`, registry name "inference-perf", tool "inference-perf"): a folder,
recognised by its `stage_<N>_lifecycle_metrics.json` / `summary_lifecycle_metrics.json` files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import StrictBool

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

TOOL_INFERENCE_PERF = "inference-perf"
CONFIG = "config.yaml"
SUMMARY = "summary_lifecycle_metrics.json"
_STAGE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json")

INFERENCE_PERF_DEFINITIONS = {
    "ttft": "time_to_first_token: arrival of the first chunk with a (re-tokenized) token minus start, per request",
    "e2el": "request_latency: request end minus start, per request",
    "percentiles": "numpy.percentile (linear); inference-perf writes no std",
    "duration": "benchmark_time_seconds: first request start to last request end of the stage",
    "output_tokens": "successes.output_tokens.total: the server's usage counts",
    "itl": "not stored: inference-perf's inter_token_latency pools every token delta with a chunk's tokens at the "
    "chunk's arrival (zeros inside a chunk): neither draftboard's per-token ITL nor its ICL; kept in extra",
}


class Dist(ResultModel):
    mean: Number() | None = None
    median: Number() | None = None
    p90: Number() | None = None
    p95: Number() | None = None
    p99: Number() | None = None
    total: Number() | None = None


class Latency(ResultModel):
    request_latency: Dist | None = None
    time_to_first_token: Dist | None = None
    time_per_output_token: Dist | None = None


class Throughput(ResultModel):
    requests_per_sec: Number() | None = None


class Fallbacks(ResultModel):
    prompt: Whole(0, INT_MAX) | None = None
    output: Whole(0, INT_MAX) | None = None


class Successes(ResultModel):
    count: Whole(0, INT_MAX) | None = None
    latency: Latency | None = None
    throughput: Throughput | None = None
    prompt_tokens: Dist | None = None
    output_tokens: Dist | None = None
    client_fallback_requests: Fallbacks | None = None


class Failures(ResultModel):
    count: Whole(0, INT_MAX) | None = None


class LoadSummary(ResultModel):
    count: Whole(1, INT_MAX) | None = None
    requested_rate: Number(gt=0) | None = None
    concurrency: Whole(1, INT_MAX) | None = None


class Report(ResultModel):
    """A lifecycle report (module docstring): the keys read; the rest is kept."""

    benchmark_time_seconds: Number() | None = None
    load_summary: LoadSummary | None = None
    successes: Successes | None = None
    failures: Failures | None = None


class Stage(ResultModel):
    concurrency_level: Whole(1, INT_MAX) | None = None
    rate: Number(gt=0) | None = None


class Load(ResultModel):
    type: Text(100) | None = None
    stages: list[Stage] | None = None


class Server(ResultModel):
    type: Text(100) | None = None
    model_name: Text(TEXT_LIMITS["model"]) | None = None


class Tokenizer(ResultModel):
    pretrained_model_name_or_path: Text(TEXT_LIMITS["model"]) | None = None


class Distribution(ResultModel):
    min: Whole(0, INT_MAX) | None = None
    max: Whole(0, INT_MAX) | None = None


class Data(ResultModel):
    type: Text(TEXT_LIMITS["dataset"]) | None = None
    input_distribution: Distribution | None = None
    output_distribution: Distribution | None = None


class Lifecycle(ResultModel):
    use_server_output_tokens: StrictBool | None = None


class ReportConfig(ResultModel):
    request_lifecycle: Lifecycle | None = None


class Config(ResultModel):
    """config.yaml: the keys read."""

    server: Server | None = None
    tokenizer: Tokenizer | None = None
    load: Load | None = None
    data: Data | None = None
    report: ReportConfig | None = None


def _stats(d: Dist | None) -> dict[str, float | None]:
    if d is None:
        return {}
    return {"mean": d.mean, "median": d.median, "p90": d.p90, "p95": d.p95, "p99": d.p99}


def _total(d: Dist | None) -> int | None:
    return int(d.total) if d is not None and d.total is not None and float(d.total).is_integer() else None


def _fixed(d: Distribution | None) -> int | None:
    return d.min if d is not None and d.min is not None and d.min == d.max and d.min > 0 else None


def import_report(obj: JsonObject, config: Config, stage: int | None, n_stages: int) -> ImportedRun:
    """One lifecycle report (validated): stage `stage` of `n_stages`, or the pooled summary
    (`stage` None)."""
    m = validate(Report, obj)
    s = m.successes or Successes()
    lat = s.latency or Latency()
    load = m.load_summary or LoadSummary()
    lifecycle = (config.report.request_lifecycle if config.report else None) or Lifecycle()
    server_n = bool(lifecycle.use_server_output_tokens)
    definitions = dict(INFERENCE_PERF_DEFINITIONS)
    fallback = s.client_fallback_requests or Fallbacks()
    values: dict[str, Any] = {
        "completed": s.count, "failed": (m.failures or Failures()).count, "duration_s": m.benchmark_time_seconds,
        "total_input_tokens": _total(s.prompt_tokens), "total_output_tokens": _total(s.output_tokens),
        "request_throughput_req_s": (s.throughput or Throughput()).requests_per_sec,
    }
    values.update(latency_fields("ttft", _stats(lat.time_to_first_token), 1000.0))
    values.update(latency_fields("e2el", _stats(lat.request_latency), 1000.0))
    values.update(latency_fields("tpot", _stats(lat.time_per_output_token), 1000.0))
    if lat.time_per_output_token is not None or fallback.output:
        values["output_tokens_from_text"] = not server_n or bool(fallback.output)
    definitions["tpot"] = ("time_per_output_token: (last token - first token) / (n - 1) per request, n "
                           + ("the server's (use_server_output_tokens)" if server_n else
                              "re-tokenized on the client (use_server_output_tokens is off)"))
    load_cfg = (config.load or Load())
    stages = load_cfg.stages or []
    stage_cfg = stages[stage] if stage is not None and stage < len(stages) else (
        stages[0] if n_stages == 1 and len(stages) == 1 else Stage())
    concurrent = load_cfg.type == "concurrent"
    data = config.data or Data()
    server = config.server or Server()
    workload = make_workload(
        input_len=_fixed(data.input_distribution), output_len=_fixed(data.output_distribution),
        num_prompts=load.count, concurrency=(load.concurrency or stage_cfg.concurrency_level) if concurrent else None,
        request_rate=(load.requested_rate or stage_cfg.rate) if load_cfg.type in ("constant", "poisson") else None,
        model=server.model_name,
        tokenizer=config.tokenizer.pretrained_model_name_or_path if config.tokenizer else None,
        backend=server.type, dataset=data.type,
        engine=next((e for e in launched_engines() if server.type and e == server.type.lower()), None))
    if stage is None:
        definitions["stage"] = f"{SUMMARY}: every stage pooled (no stage file in the folder)"
    keys = {"completed": "successes.count", "failed": "failures.count", "num_prompts": "load_summary.count",
            "duration_s": "benchmark_time_seconds"}
    window, failure = finish_window(values, None, workload, definitions,
                                    lambda name, reason: obj.error(tuple(keys.get(name, name).split(".")), reason))
    extra = extra_of(m)  # the tool's own figures without a field, under their paths (latencies in s)
    extra.update({"successes.latency": extra_of(lat), "successes.throughput": extra_of(s.throughput or Throughput()),
                  "successes": extra_of(s), "load_summary": extra_of(load)})
    extra = {k: v for k, v in extra.items() if v not in (None, {})}
    return ImportedRun(source_tool=TOOL_INFERENCE_PERF, source_version=None, tool_version=None,
                       definitions=definitions, metrics=window, workload=workload, source_extra=extra,
                       failure=failure, source=obj, keys=keys)


def _stage_files(source: Source) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in source.files() if (m := _STAGE.fullmatch(p.name))]
    return sorted(found)


class InferencePerf(ResultFormat):
    """An inference-perf report folder (module docstring): one run per stage file."""

    name: ClassVar[str] = "inference-perf"
    tool: ClassVar[str] = TOOL_INFERENCE_PERF
    takes: ClassVar[str] = "folder"
    reads: ClassVar[str] = "a report folder (stage_<N>_lifecycle_metrics.json, config.yaml; one run per stage)"
    expected: ClassVar[str] = "successes with count, latency (time_to_first_token, time_per_output_token, " \
                              "request_latency) and benchmark_time_seconds"

    def recognise(self, source: Source) -> Recognition | None:
        names = {p.name for p in source.files()}
        seen = [n for n in sorted(names) if _STAGE.fullmatch(n)][:3] + [n for n in (SUMMARY,) if n in names]
        return Recognition(len(seen), TOOL_INFERENCE_PERF, tuple(seen)) if seen else None

    def read(self, source: Source) -> Iterable[ImportedRun]:
        if not source.is_folder:
            raise ResultFileError(source.path, "is a file; inference-perf writes a report folder")
        stages = _stage_files(source)
        folders = {p.parent for _, p in stages} or {p.parent for p in source.files() if p.name == SUMMARY}
        if not folders:
            raise ResultFileError(source.path, "no stage_<N>_lifecycle_metrics.json or "
                                               f"{SUMMARY}: not an inference-perf report folder")
        if len(folders) > 1:
            raise ResultFileError(source.path, f"{len(folders)} report folders inside: import each one")
        folder = folders.pop()
        config = Config()
        if (folder / CONFIG).is_file():
            config = validate(Config, source.read_yaml(folder / CONFIG).objects[0])
        files = [(n, p) for n, p in stages] or [(None, folder / SUMMARY)]
        for n, path in files:
            text = source.read_json(path)
            if len(text.objects) != 1:
                raise ResultFileError(path, f"{len(text.objects)} JSON objects: a lifecycle report is one")
            run = import_report(text.objects[0], config, n, len(files))
            run.origin = str(path)
            yield run


FORMAT = InferencePerf()
