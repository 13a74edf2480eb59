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
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from benchkit.formats.common import (
    COMMON_DEFINITIONS,
    TOOL_DRAFTBOARD,
    TOOL_VLLM,
    ImportedRun,
    SourceObject,
    json_safe,
    read_metric,
    read_window,
)
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


def import_vllm(o: SourceObject) -> ImportedRun:
    """One `vllm bench serve` result object (see the module docstring for its keys)."""
    window, per_request = read_window(o, "latencies")
    backend = o.str_("backend")
    endpoint_type = o.str_("endpoint_type")
    workload = {
        "input_len": None,
        "output_len": None,
        "num_prompts": o.int_("num_prompts"),
        "concurrency": o.int_("max_concurrency"),
        "request_rate": o.rate("request_rate"),
        "burstiness": o.num("burstiness"),
        "model": o.str_("model_id"),
        "tokenizer": o.str_("tokenizer_id"),
        "backend": backend or endpoint_type,
        "dataset": None,
    }
    for key in ("date", "label"):
        o.str_(key)
    version = None
    for key in ("vllm_version", "version"):
        value = o.data.get(key)
        if isinstance(value, str):
            version = value
            break
    extra = o.extra()
    for key in ("date", "label"):
        if o.data.get(key) is not None:
            extra[key] = o.data[key]
    return ImportedRun(
        source_tool=TOOL_VLLM,
        source_version=version,
        definitions=dict(VLLM_DEFINITIONS),
        metrics=window,
        workload=workload,
        spec_source=VLLM_SPEC_SOURCE if window.has_spec_decode else None,
        per_request=per_request,
        source_extra=extra,
    )


def import_draftboard(o: SourceObject) -> ImportedRun:
    """A file written by `export_vllm_layout` (format 2, or the older format 1): the vLLM keys
    plus the `draftboard` block, whose metrics (per-token ITL included) and definitions win.
    Keys of draftboard.metrics that are not WindowMetrics fields are kept in
    `source_extra["draftboard_metrics"]`."""
    run = import_vllm(o)
    block = o.data["draftboard"]
    if not isinstance(block, dict):
        raise o.error("draftboard", f"expected an object, got {type(block).__name__}")
    metrics = block.get("metrics")
    if not isinstance(metrics, dict):
        raise o.error("draftboard.metrics", "expected an object of draftboard metric keys")
    spec_source = block.get("spec_source")
    if block.get("format") == 1:
        spec = block.get("spec_decode") or {}
        if not isinstance(spec, dict):
            raise o.error("draftboard.spec_decode", f"expected an object, got {type(spec).__name__}")
        metrics = {_FORMAT1_NAMES.get(k, k): v for k, v in metrics.items()}
        metrics.update({k: v for k, v in spec.items() if k in METRICS})
        spec_source = spec.get("spec_source")
    elif block.get("format") != EXPORT_FORMAT:
        raise o.error("draftboard.format", f"unknown export format {block.get('format')!r} "
                                           f"(this draftboard reads 1 and {EXPORT_FORMAT})")
    inner = SourceObject(metrics, o.path, o.line, prefix="draftboard.metrics.")
    window = WindowMetrics(**{f.name: read_metric(inner, f, f.name) for f in METRIC_FIELDS})
    definitions = block.get("definitions")
    if not isinstance(definitions, dict):
        definitions = dict(DRAFTBOARD_DEFINITIONS)
    run.source_tool = TOOL_DRAFTBOARD
    run.source_version = f"export format {block.get('format')}"
    run.definitions = definitions
    run.metrics = window
    run.spec_source = spec_source if isinstance(spec_source, str) else None
    run.source_extra.pop("draftboard", None)
    run.source_extra["draftboard_run"] = block.get("run") or {}
    if inner.extra():
        run.source_extra["draftboard_metrics"] = inner.extra()
    return run


def export_vllm_layout(
    window: WindowMetrics, run_meta: dict[str, Any] | None = None, spec_source: str | None = None
) -> dict[str, Any]:
    """One run as a dict in the key layout of `vllm bench serve --save-result`, plus draftboard's
    own keys under "draftboard". Write it with `json.dump` to get a file vLLM tooling reads.

    `window`: the run's WindowMetrics. `run_meta` (all optional): `model`, `tokenizer`,
    `backend`, `label`, `date` (str or datetime), `num_prompts`, `concurrency`, `request_rate`
    (req/s, None = unbounded, written "inf"), `burstiness`; every key of `run_meta` is also kept
    verbatim under draftboard.run. `spec_source`: where the acceptance figures came from.

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
