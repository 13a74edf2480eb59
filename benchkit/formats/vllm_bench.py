"""`vllm bench serve` result files, read and written.

- `vllm bench serve --save-result` writes one JSON object per file (`--append-result` appends
  further objects, one per line). Key layout from vllm-project/vllm
  `vllm/benchmarks/serve.py` (`benchmark()` result dict and `main_async()` result_json):
  setup keys `date`, `endpoint_type`, `backend`, `label`, `model_id`, `tokenizer_id`,
  `num_prompts`, `request_rate` (number or the string "inf"), `burstiness`, `max_concurrency`;
  results `duration` (s), `completed`, `failed`, `total_input_tokens`, `total_output_tokens`,
  `request_throughput`, `request_goodput`, `output_throughput`, `total_token_throughput`,
  `max_output_tokens_per_s`, `max_concurrent_requests`; `{mean,median,std}_{m}_ms` and
  `p{P}_{m}_ms` for m in ttft, tpot, itl, e2el and each `--metric-percentiles` P (default 99);
  speculative decoding `spec_decode_acceptance_rate` (percent), `spec_decode_acceptance_length`,
  `spec_decode_num_drafts`, `spec_decode_draft_tokens`, `spec_decode_accepted_tokens`,
  `spec_decode_per_position_acceptance_rates` (fractions); per request (`--save-detailed`)
  `input_lens`, `output_lens`, `ttfts` (s), `itls` (lists, s), `latencies` (s), `start_times`,
  `queue_times`, `generated_texts`, `errors`. Older versions (`benchmarks/benchmark_serving.py`)
  lack `failed`, `endpoint_type`, `burstiness`, `max_concurrency`, `max_output_tokens_per_s`,
  the e2el block and `latencies`, and carry `best_of` / `use_beam_search`.

Which vLLM key carries which draftboard figure (and vLLM's percent for the acceptance rate) is
the schema's metadata (`MetricField.vllm_key`, `vllm_scale` in benchkit.measure.metrics); both
directions go through it. The draftboard export (`export_vllm_layout`) is a vLLM-layout file
with draftboard's own figures under "draftboard"; `import_draftboard` reads it back.

The format (`FORMAT`, registry name "vllm"): recognised by the keys in `VLLM_MARKERS` (or, for
an export, the "draftboard" block alone); an object must hold at least one vLLM figure key.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, create_model, model_validator

from benchkit.engines.registry import LaunchedEngineName, launched_engines
from benchkit.formats.base import JsonObjectsFormat
from benchkit.formats.common import (
    COMMON_DEFINITIONS,
    INT_MAX,
    TEXT_LIMITS,
    TOOL_DRAFTBOARD,
    TOOL_VLLM,
    ImportedRun,
    Number,
    PerRequest,
    RequestRate,
    ResultModel,
    Text,
    Whole,
    extra_of,
    finish_window,
    json_safe,
    kept,
    make_workload,
    metrics_model,
    per_request_lists,
    validate,
    window_from,
)
from benchkit.formats.jsontext import JsonObject
from benchkit.measure.metrics import METRIC_FIELDS, METRICS, WindowMetrics

#: Version of the `draftboard` block written by `export_vllm_layout`. Format 1 (before the
#: metric schema) named five figures differently and kept the acceptance figures apart in
#: `draftboard.spec_decode`; `import_draftboard` still reads it.
EXPORT_FORMAT = 2
_FORMAT1_NAMES = {"duration": "duration_s", "request_throughput": "request_throughput_req_s",
                  "output_throughput": "output_throughput_tok_s",
                  "total_token_throughput": "total_token_throughput_tok_s", "goodput": "request_goodput_req_s"}

VLLM_DEFINITIONS: dict[str, str] = {
    **COMMON_DEFINITIONS,
    "e2el": "request latency: last streamed message minus send time",
    "output_tokens": "the server's usage.completion_tokens where the endpoint reports it, "
    "else the text re-tokenized",
    "acceptance_rate": "window delta of the server's vllm:spec_decode_* counters; percent in the file, "
    "stored as a fraction",
    "acceptance_length": "1 + d accepted / d drafts over the benchmark window (same as draftboard's tau)",
    "goodput": "request_goodput: requests meeting every --goodput SLO per second",
}

DRAFTBOARD_DEFINITIONS: dict[str, str] = {
    "itl": "per token: each gap between token-carrying messages divided by the tokens the later message "
    "carried (token-weighted)",
    "icl": "per chunk: raw gap between consecutive token-carrying messages",
    "export_itl_keys": "the top-level {mean,median,std,pNN}_itl_ms keys carry vLLM's definition (per chunk, "
    "draftboard's ICL) so the file reads correctly in vLLM tooling; draftboard's per-token ITL is under "
    "draftboard.metrics",
    "acceptance_rate": "d accepted / d draft tokens over the window (fraction; the top-level "
    "spec_decode_acceptance_rate is in percent like vLLM's)",
    "acceptance_length": "tau = 1 + d accepted / d drafts over the window",
}

VLLM_SPEC_SOURCE = "vllm bench serve: window delta of vllm:spec_decode_* counters"

MODEL_TEXT = Text(TEXT_LIMITS["model"])
VERSION_TEXT = Text(TEXT_LIMITS["engine_version"])


class VllmSetup(PerRequest):
    """The setup keys of a `vllm bench serve` result (see the module docstring), all optional;
    `version` / `vllm_version` are `--metadata` keys some users add."""

    date: Text(100) | None = None
    endpoint_type: Text(100) | None = None
    backend: Text(100) | None = None
    label: Text(200) | None = None
    model_id: MODEL_TEXT | None = None
    tokenizer_id: MODEL_TEXT | None = None
    num_prompts: Whole(1, INT_MAX) | None = None
    request_rate: RequestRate = None
    burstiness: Number(None, gt=0) | None = None
    max_concurrency: Whole(1, INT_MAX) | None = None
    vllm_version: VERSION_TEXT | None = None
    version: VERSION_TEXT | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_drafts_placeholder(cls, data: Any) -> Any:
        """vllm/benchmarks/serve.py writes acceptance_length 0.0 when no draft was made
        (`1 + accepted / drafts if drafts > 0 else 0.0`): a placeholder, not a tau."""
        if isinstance(data, dict) and data.get("spec_decode_num_drafts") == 0 \
                and data.get("spec_decode_acceptance_length") == 0:
            data = {**data, "spec_decode_acceptance_length": None}
        return data


#: A `vllm bench serve` result object: the setup keys, the per-request lists and every
#: WindowMetrics field that has a vLLM key, read from that key in vLLM's scale.
VllmResult = metrics_model("VllmResult", lambda f: f.vllm_key, scaled=True, base=VllmSetup)
#: metric or workload field -> the key a vLLM file writes it under (for errors).
VLLM_KEYS: dict[str, str] = {**{f.name: f.vllm_key for f in METRIC_FIELDS if f.vllm_key},
                             "concurrency": "max_concurrency", "model": "model_id"}


def _export_format(value: Any) -> Any:
    if value not in (1, EXPORT_FORMAT) or isinstance(value, bool):
        raise ValueError(f"unknown export format {value!r} (this draftboard reads 1 and {EXPORT_FORMAT})")
    return value


class ExportRun(ResultModel):
    """`draftboard.run` of an export: the run's configuration as `run_export` wrote it; the
    workload keys read back (others are kept as they are)."""

    engine: LaunchedEngineName | None = None
    model: MODEL_TEXT | None = None
    engine_version: VERSION_TEXT | None = None
    dataset: Text(TEXT_LIMITS["dataset"]) | None = None
    input_len: Whole(1, INT_MAX) | None = None
    output_len: Whole(1, INT_MAX) | None = None
    num_prompts: Whole(1, INT_MAX) | None = None
    concurrency: Whole(1, INT_MAX) | None = None


#: draftboard.metrics: every WindowMetrics field under its own name, in draftboard's scale.
DraftboardMetrics = metrics_model("DraftboardMetrics", lambda f: f.name, scaled=False)


class ExportBlock(ResultModel):
    """The `draftboard` block of an export (format 2; format 1 is renamed on the way in)."""

    format: Annotated[int, BeforeValidator(_export_format)]
    metrics: DraftboardMetrics
    spec_source: Text(TEXT_LIMITS["spec_source"]) | None = None
    definitions: dict[str, Text(4000)] | None = None
    run: ExportRun | None = None
    spec_decode: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _format1(cls, data: Any) -> Any:
        """Format 1 named five figures differently and kept the acceptance figures and their
        source in `spec_decode`."""
        if not (isinstance(data, dict) and data.get("format") == 1 and isinstance(data.get("metrics"), dict)):
            return data
        spec = data.get("spec_decode") if isinstance(data.get("spec_decode"), dict) else {}
        metrics = {_FORMAT1_NAMES.get(k, k): v for k, v in data["metrics"].items()}
        metrics.update({k: v for k, v in spec.items() if k in METRICS})
        return {**data, "metrics": metrics, "spec_source": spec.get("spec_source")}


#: A file written by `export_vllm_layout`: a vLLM result plus the `draftboard` block.
VllmExport = create_model("VllmExport", __base__=VllmResult, draftboard=(ExportBlock, Field(...)))


def _workload(m: Any) -> dict[str, Any]:
    return make_workload(num_prompts=m.num_prompts, concurrency=m.max_concurrency, request_rate=m.request_rate,
                         burstiness=m.burstiness, model=m.model_id, tokenizer=m.tokenizer_id,
                         backend=m.backend or m.endpoint_type)


def _kept_setup(m: Any, extra: dict[str, Any]) -> dict[str, Any]:
    for key in ("date", "label"):
        if getattr(m, key) is not None:
            extra[key] = getattr(m, key)
    return extra


def import_vllm(obj: JsonObject) -> ImportedRun:
    """One `vllm bench serve` result object (see the module docstring for its keys), validated
    (`VllmResult`). Raises ResultFileError naming the key."""
    m = validate(VllmResult, obj)
    workload = _workload(m)
    definitions = dict(VLLM_DEFINITIONS)
    per_request = per_request_lists(m)
    window, failure = finish_window(window_from(m), per_request, workload, definitions,
                                    lambda name, reason: obj.error((VLLM_KEYS.get(name, name),), reason))
    return ImportedRun(
        source_tool=TOOL_VLLM,
        source_version=m.vllm_version or m.version,
        definitions=definitions,
        metrics=window,
        workload=workload,
        spec_source=VLLM_SPEC_SOURCE if window.has_spec_decode else None,
        per_request=per_request,
        source_extra=_kept_setup(m, extra_of(m)),
        failure=failure,
        source=obj,
        keys=VLLM_KEYS,
    )


def import_draftboard(obj: JsonObject) -> ImportedRun:
    """A file written by `export_vllm_layout` (format 2, or the older format 1), validated
    (`VllmExport`): the vLLM keys plus the `draftboard` block, whose metrics (per-token ITL
    included), definitions and run configuration (engine, model, dataset, input and output
    length, num_prompts, concurrency) win. Keys of draftboard.metrics that are not WindowMetrics
    fields are kept in `source_extra["draftboard_metrics"]`, the whole draftboard.run in
    `source_extra["draftboard_run"]`."""
    m = validate(VllmExport, obj)
    block = m.draftboard
    workload = _workload(m)
    run = block.run or ExportRun()
    for key in ("model", "dataset", "input_len", "output_len", "num_prompts", "concurrency", "engine"):
        if getattr(run, key) is not None:
            workload[key] = getattr(run, key)
    if workload["engine"] is None and m.backend in launched_engines():
        workload["engine"] = m.backend  # exports before draftboard.run.engine wrote the engine as backend
    definitions = dict(block.definitions) if block.definitions is not None else dict(DRAFTBOARD_DEFINITIONS)
    keys = {f.name: f"draftboard.metrics.{f.name}" for f in METRIC_FIELDS}
    window, failure = finish_window(window_from(block.metrics, scaled=False), None, workload, definitions,
                                    lambda name, reason: obj.error(tuple(keys.get(name, name).split(".")), reason))
    extra = _kept_setup(m, extra_of(m))
    extra["draftboard_run"] = kept(obj.data["draftboard"].get("run") or {})
    if block.metrics.model_extra:
        extra["draftboard_metrics"] = extra_of(block.metrics)
    return ImportedRun(
        source_tool=TOOL_DRAFTBOARD,
        source_version=f"export format {block.format}",
        definitions=definitions,
        metrics=window,
        workload=workload,
        spec_source=block.spec_source,
        per_request=per_request_lists(m),
        source_extra=extra,
        failure=failure,
        source=obj,
        keys=keys,
    )


def export_vllm_layout(
    window: WindowMetrics, run_meta: dict[str, Any] | None = None, spec_source: str | None = None
) -> dict[str, Any]:
    """One run as a dict in the key layout of `vllm bench serve --save-result`, plus draftboard's
    own keys under "draftboard". Write it with `json.dump` to get a file vLLM tooling reads.

    `window`: the run's WindowMetrics. `run_meta` (all optional): `model`, `tokenizer`,
    `backend`, `label`, `date` (str or datetime), `num_prompts`, `concurrency`, `request_rate`
    (req/s, None = unbounded, written "inf"), `burstiness`; every key of `run_meta` is also kept
    verbatim under draftboard.run, where `import_draftboard` reads back `engine`, `model`,
    `dataset`, `input_len`, `output_len`, `num_prompts` and `concurrency`. `spec_source`: where
    the acceptance figures came from.

    Top-level keys, as vLLM names them: the setup keys date, endpoint_type, backend, label,
    model_id, tokenizer_id, num_prompts, request_rate, burstiness, max_concurrency; then every
    WindowMetrics field that has a `vllm_key`, under that key and in vLLM's scale (duration,
    completed, failed, total_input_tokens, total_output_tokens, request_throughput,
    output_throughput, total_token_throughput, max_output_tokens_per_s, request_goodput,
    {mean,median,std,p90,p95,p99}_{ttft,tpot,itl,e2el}_ms, and the spec_decode_* keys, written
    only when the window has acceptance figures, the acceptance rate in percent), null where
    unknown.

    The top-level `*_itl_ms` keys carry vLLM's definition of ITL (per chunk, draftboard's ICL),
    so a number means the same in vLLM tooling as in a vLLM-written file. Every draftboard
    figure (per-token ITL, ICL under its own name, error_rate, mean_tokens_per_chunk, ...) is
    under draftboard.metrics (`WindowMetrics.to_dict()`), with draftboard.spec_source,
    draftboard.definitions and draftboard.format. `load_result_file` reads such a file back with
    the identical WindowMetrics. Non-finite floats become null (JSON has no NaN).
    """
    meta = dict(run_meta or {})
    date = meta.get("date")
    if isinstance(date, datetime):
        date = date.strftime("%Y%m%d-%H%M%S")
    rate = meta.get("request_rate")
    backend = meta.get("backend") or "draftboard"
    out: dict[str, Any] = {
        "date": date,
        "endpoint_type": backend,
        "backend": backend,
        "label": meta.get("label"),
        "model_id": meta.get("model"),
        "tokenizer_id": meta.get("tokenizer") or meta.get("model"),
        "num_prompts": meta.get("num_prompts"),
        "request_rate": "inf" if rate is None or (isinstance(rate, float) and math.isinf(rate)) else rate,
        "burstiness": meta.get("burstiness", 1.0),
        "max_concurrency": meta.get("concurrency", meta.get("max_concurrency")),
    }
    for f in METRIC_FIELDS:
        if f.vllm_key and (f.group != "spec_decode" or window.has_spec_decode):
            out[f.vllm_key] = f.to_vllm(getattr(window, f.name))
    out["draftboard"] = {
        "format": EXPORT_FORMAT,
        "metrics": window.to_dict(),
        "spec_source": spec_source,
        "definitions": dict(DRAFTBOARD_DEFINITIONS),
        "run": meta,
    }
    return json_safe(out)


#: Top-level keys that `vllm bench serve` (or benchmark_serving.py) writes and
#: sglang.bench_serving does not: how detection tells a vLLM object.
VLLM_MARKERS = frozenset({
    "endpoint_type", "model_id", "tokenizer_id", "num_prompts", "burstiness", "failed",
    "total_token_throughput", "request_goodput", "mean_e2el_ms", "latencies", "best_of",
    "spec_decode_acceptance_length",
})


class VllmBench(JsonObjectsFormat):
    """`vllm bench serve` result files (the module docstring): one JSON object per run, a file of
    one object or JSON lines; an object with a `draftboard` block is a draftboard export
    (`import_draftboard`), any other a vLLM result (`import_vllm`)."""

    name: ClassVar[str] = "vllm"
    tool: ClassVar[str] = TOOL_VLLM
    reads: ClassVar[str] = ("JSON of --save-result / --append-result, also benchmarks/benchmark_serving.py's "
                            "and draftboard's own export")
    markers: ClassVar[frozenset[str]] = VLLM_MARKERS
    figure_keys: ClassVar[frozenset[str]] = frozenset(f.vllm_key for f in METRIC_FIELDS if f.vllm_key)

    def object_score(self, obj: JsonObject) -> int:
        """An export is recognised by its `draftboard` block alone, ahead of any marker count."""
        return len(self.markers) + 1 if "draftboard" in obj.data else super().object_score(obj)

    def tool_of(self, objects: list[JsonObject]) -> str:
        if any("draftboard" in obj.data for obj in objects):
            return f"{TOOL_DRAFTBOARD} export ({TOOL_VLLM} layout)"
        return TOOL_VLLM

    def require(self, obj: JsonObject) -> None:
        if "draftboard" not in obj.data:  # an export's figures are in its block (validated there)
            super().require(obj)

    def read_object(self, obj: JsonObject) -> ImportedRun:
        return import_draftboard(obj) if "draftboard" in obj.data else import_vllm(obj)


FORMAT = VllmBench()
