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

The draftboard export (`export_vllm_layout`) is a vLLM-layout file with draftboard's own keys
under "draftboard"; `import_draftboard` reads it back.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from benchkit.formats.common import (
    COMMON_DEFINITIONS,
    STATS,
    TOOL_DRAFTBOARD,
    TOOL_VLLM,
    ImportedRun,
    SourceObject,
    empty_flat,
    error_rate_of,
    failed_from_errors,
    json_safe,
    per_request_lists,
    stat_block,
    tokens_per_chunk_of,
)
from benchkit.measure.metrics import FLAT_KEYS

#: Version of the `draftboard` block written by `export_vllm_layout`.
EXPORT_FORMAT = 1

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


def _vllm_spec(o: SourceObject) -> dict[str, Any] | None:
    rate = o.num("spec_decode_acceptance_rate")
    length = o.num("spec_decode_acceptance_length")
    drafts = o.num("spec_decode_num_drafts")
    tokens = o.num("spec_decode_draft_tokens")
    accepted = o.num("spec_decode_accepted_tokens")
    per_pos = o.num_list("spec_decode_per_position_acceptance_rates")
    if all(v is None for v in (rate, length, drafts, tokens, accepted, per_pos)):
        return None
    return {
        "spec_num_drafts": drafts,
        "spec_num_draft_tokens": tokens,
        "spec_num_accepted_tokens": accepted,
        "acceptance_rate": rate / 100.0 if rate is not None else None,
        "acceptance_length": length,
        "per_position_acceptance_rate": list(per_pos) if per_pos is not None else [],
        "spec_source": "vllm bench serve: window delta of vllm:spec_decode_* counters",
    }


def import_vllm(o: SourceObject) -> ImportedRun:
    flat = empty_flat()
    for key in ("duration", "request_throughput", "output_throughput", "total_token_throughput",
                "max_output_tokens_per_s"):
        flat[key] = o.num(key)
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        flat[key] = o.int_(key)
    flat["goodput"] = o.num("request_goodput")
    for metric in ("ttft", "tpot", "e2el"):
        stat_block(o, flat, metric, metric)
    stat_block(o, flat, "itl", "icl")
    per_request = per_request_lists(o, "latencies")
    if flat["failed"] is None:
        flat["failed"] = failed_from_errors(per_request)
    flat["error_rate"] = error_rate_of(flat["completed"], flat["failed"])
    flat["mean_tokens_per_chunk"] = tokens_per_chunk_of(per_request)
    spec = _vllm_spec(o)

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
        metrics_flat=flat,
        workload=workload,
        spec_decode=spec,
        per_request=per_request,
        source_extra=extra,
    )


def import_draftboard(o: SourceObject) -> ImportedRun:
    """A file written by `export_vllm_layout`: the vLLM keys plus the `draftboard` block, whose
    metrics (with per-token ITL) and definitions win."""
    run = import_vllm(o)
    block = o.data["draftboard"]
    if not isinstance(block, dict):
        raise o.error("draftboard", f"expected an object, got {type(block).__name__}")
    metrics = block.get("metrics")
    if not isinstance(metrics, dict):
        raise o.error("draftboard.metrics", "expected an object of draftboard metric keys")
    for key, value in metrics.items():
        if value is not None and not isinstance(value, (int, float)):
            raise o.error(
                f"draftboard.metrics.{key}", f"expected a number, true/false or null, got {value!r:.40}"
            )
    flat = empty_flat()
    flat.update(metrics)
    spec = block.get("spec_decode")
    if spec is not None and not isinstance(spec, dict):
        raise o.error("draftboard.spec_decode", f"expected an object, got {type(spec).__name__}")
    definitions = block.get("definitions")
    if not isinstance(definitions, dict):
        definitions = dict(DRAFTBOARD_DEFINITIONS)
    run.source_tool = TOOL_DRAFTBOARD
    run.source_version = f"export format {block.get('format')}"
    run.definitions = definitions
    run.metrics_flat = flat
    run.spec_decode = spec
    run.source_extra.pop("draftboard", None)
    run.source_extra["draftboard_run"] = block.get("run") or {}
    return run


def export_vllm_layout(
    metrics_flat: dict[str, Any], run_meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One run as a dict in the key layout of `vllm bench serve --save-result`, plus draftboard's
    own keys under "draftboard". Write it with `json.dump` to get a file vLLM tooling reads.

    `metrics_flat`: `RunMetrics.to_flat()` (draftboard keys, see FLAT_KEYS). `run_meta`
    (all optional): `model`, `tokenizer`, `backend`, `label`, `date` (str or datetime),
    `num_prompts`, `concurrency`, `request_rate` (req/s, None = unbounded, written "inf"),
    `burstiness`, `spec_decode` (`SpecDecodeMetrics.to_flat()`); every key of `run_meta` is also
    kept verbatim under draftboard.run.

    Top-level keys, as vLLM names them: date, endpoint_type, backend, label, model_id,
    tokenizer_id, num_prompts, request_rate, burstiness, max_concurrency, duration (s),
    completed, failed, total_input_tokens, total_output_tokens, request_throughput,
    request_goodput (only when draftboard's goodput is set), output_throughput,
    total_token_throughput, max_output_tokens_per_s, the spec_decode_* keys when
    `run_meta["spec_decode"]` is set (acceptance rate in percent, as vLLM writes it), and
    {mean,median,std,p90,p95,p99}_{ttft,tpot,itl,e2el}_ms.

    The top-level `*_itl_ms` keys carry vLLM's definition of ITL (per chunk, draftboard's ICL),
    so a number means the same in vLLM tooling as in a vLLM-written file. draftboard's per-token
    ITL, ICL under its own name, error_rate, goodput, mean_tokens_per_chunk and
    output_tokens_from_text are under draftboard.metrics (every key of `metrics_flat`, and
    FLAT_KEYS missing from it as null), with
    draftboard.definitions and draftboard.format. `load_result_file` reads such a file back with
    the identical `metrics_flat`. Non-finite floats become null (JSON has no NaN).
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
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput"):
        out[key] = metrics_flat.get(key)
    if metrics_flat.get("goodput") is not None:
        out["request_goodput"] = metrics_flat["goodput"]
    for key in ("output_throughput", "total_token_throughput", "max_output_tokens_per_s"):
        out[key] = metrics_flat.get(key)
    spec = meta.get("spec_decode")
    if spec:
        rate_frac = spec.get("acceptance_rate")
        out["spec_decode_acceptance_rate"] = rate_frac * 100.0 if rate_frac is not None else None
        out["spec_decode_acceptance_length"] = spec.get("acceptance_length")
        out["spec_decode_num_drafts"] = spec.get("spec_num_drafts")
        out["spec_decode_draft_tokens"] = spec.get("spec_num_draft_tokens")
        out["spec_decode_accepted_tokens"] = spec.get("spec_num_accepted_tokens")
        per_pos = spec.get("per_position_acceptance_rate") or []
        out["spec_decode_per_position_acceptance_rates"] = list(per_pos)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        ours = "icl" if metric == "itl" else metric
        for stat in STATS:
            out[f"{stat}_{metric}_ms"] = metrics_flat.get(f"{stat}_{ours}_ms")
    out["draftboard"] = {
        "format": EXPORT_FORMAT,
        "metrics": {**{k: None for k in FLAT_KEYS}, **metrics_flat},
        "definitions": dict(DRAFTBOARD_DEFINITIONS),
        "spec_decode": spec or None,
        "run": meta,
    }
    return json_safe(out)
