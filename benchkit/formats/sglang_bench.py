"""`sglang.bench_serving` result files (JSON lines), read.

- `python -m sglang.bench_serving --output-file F` appends one JSON object per run as a line
  (JSON lines). Key layout from sgl-project/sglang `python/sglang/bench_serving.py`
  (`benchmark()` result dict): `tag`, `backend`, `dataset_name`, `request_rate`,
  `max_concurrency`, `sharegpt_output_len`, `random_input_len`, `random_output_len`,
  `random_range_ratio`, `server_info`, `duration`, `completed`, `total_input_tokens`,
  `total_output_tokens`, `total_output_tokens_retokenized`, `request_throughput`,
  `input_throughput`, `output_throughput`, `total_throughput`, `{mean,median,std,p99}_e2e_latency_ms`,
  `{mean,median,std,p99}_{ttft,tpot}_ms`, `{mean,median,std,p95,p99}_itl_ms`, `concurrency`,
  `accept_length`, `max_output_tokens_per_s`, `max_concurrent_requests`; with
  `--output-details` also `input_lens`, `output_lens`, `ttfts`, `itls`, `generated_texts`,
  `errors`. Older versions lack `tag`, `server_info`, `total_throughput`,
  `max_output_tokens_per_s`, `max_concurrent_requests` (and very old ones `accept_length`).

The summary keys are vLLM's (`MetricField.vllm_key`) but for the three in `SGLANG_KEYS`; the
figures SGLang does not write (failed, goodput, draft counts) import as None, `failed` is counted
from the per-request errors where the file has them.
"""

from __future__ import annotations

from benchkit.formats.common import COMMON_DEFINITIONS, TOOL_SGLANG, ImportedRun, SourceObject, read_window
from benchkit.measure.metrics import STAT_NAMES

SGLANG_DEFINITIONS: dict[str, str] = {
    **COMMON_DEFINITIONS,
    "e2el": "e2e_latency: last streamed message minus send time",
    "output_tokens": "the tool's output_len per request (server usage where reported, "
    "else the requested length)",
    "acceptance_length": "accept_length: the server-wide avg_spec_accept_length from /get_server_info "
    "(generation tokens / verify calls, not a delta over the benchmark window)",
    "failed": "not in the file; counted from the per-request errors when --output-details was used",
}

#: vLLM key -> the key sglang.bench_serving writes the same figure under.
SGLANG_KEYS: dict[str, str] = {
    "total_token_throughput": "total_throughput",
    "spec_decode_acceptance_length": "accept_length",
    **{f"{stat}_e2el_ms": f"{stat}_e2e_latency_ms" for stat in STAT_NAMES},
}
SGLANG_SPEC_SOURCE = ("sglang.bench_serving accept_length: server-wide /get_server_info avg_spec_accept_length, "
                      "not a window delta")


def import_sglang(o: SourceObject) -> ImportedRun:
    """One `sglang.bench_serving` result line (see the module docstring for its keys)."""
    window, per_request = read_window(o, None, SGLANG_KEYS)
    dataset = o.str_("dataset_name")
    random_in, random_out = o.int_("random_input_len"), o.int_("random_output_len")
    sharegpt_out = o.int_("sharegpt_output_len")
    input_len = output_len = None
    if dataset and dataset.startswith("random"):
        input_len, output_len = random_in, random_out
    elif dataset == "sharegpt":
        output_len = sharegpt_out
    server_info = o.dict_("server_info") or {}
    num_prompts = len(per_request["input_lens"]) if per_request and "input_lens" in per_request else None
    model = server_info.get("model_path") or server_info.get("served_model_name")
    tokenizer = server_info.get("tokenizer_path")
    rate_raw = o.data.get("request_rate")
    request_rate = None if rate_raw == "trace" else o.rate("request_rate")
    o.used.add("request_rate")
    workload = {
        "input_len": input_len,
        "output_len": output_len,
        "num_prompts": num_prompts,
        "concurrency": o.int_("max_concurrency"),
        "request_rate": request_rate,
        "burstiness": None,
        "model": model if isinstance(model, str) else None,
        "tokenizer": tokenizer if isinstance(tokenizer, str) else None,
        "backend": o.str_("backend"),
        "dataset": dataset,
    }
    version = server_info.get("version")
    extra = o.extra()
    if rate_raw == "trace":
        extra["request_rate"] = "trace"
    return ImportedRun(
        source_tool=TOOL_SGLANG,
        source_version=version if isinstance(version, str) else None,
        definitions=dict(SGLANG_DEFINITIONS),
        metrics=window,
        workload=workload,
        spec_source=SGLANG_SPEC_SOURCE if window.acceptance_length is not None else None,
        per_request=per_request,
        source_extra=extra,
    )
