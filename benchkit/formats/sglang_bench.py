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

The format (`FORMAT`, registry name "sglang"): recognised by the keys in `SGLANG_MARKERS`; an
object must hold at least one figure key of SGLang's.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator

from benchkit.formats.base import JsonObjectsFormat
from benchkit.formats.common import (
    COMMON_DEFINITIONS,
    INT_MAX,
    TEXT_LIMITS,
    TOOL_SGLANG,
    ImportedRun,
    Number,
    PerRequest,
    ResultModel,
    Text,
    Whole,
    _request_rate,
    extra_of,
    finish_window,
    make_workload,
    metrics_model,
    per_request_lists,
    validate,
    window_from,
)
from benchkit.formats.jsontext import JsonObject
from benchkit.measure.metrics import METRIC_FIELDS, STAT_NAMES

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


def _sglang_key(f) -> str | None:
    return SGLANG_KEYS.get(f.vllm_key, f.vllm_key) if f.vllm_key else None


#: metric or workload field -> the key an SGLang line writes it under (for errors).
SGLANG_FIELD_KEYS: dict[str, str] = {**{f.name: _sglang_key(f) for f in METRIC_FIELDS if f.vllm_key},
                                     "concurrency": "max_concurrency", "num_prompts": "input_lens"}

MODEL_TEXT = Text(TEXT_LIMITS["model"])


class ServerInfo(ResultModel):
    """The keys of `server_info` (the server's /get_server_info) that an import reads; the rest
    is kept."""

    version: Text(TEXT_LIMITS["engine_version"]) | None = None
    model_path: MODEL_TEXT | None = None
    served_model_name: MODEL_TEXT | None = None
    tokenizer_path: MODEL_TEXT | None = None


def _sglang_rate(value: Any) -> Any:
    """sglang.bench_serving's request_rate: a number, Infinity (unbounded, None) or "trace"
    (replayed timestamps: no rate; noted in the extra keys)."""
    return "trace" if value == "trace" else _request_rate(value)


class SglangSetup(PerRequest):
    """The setup keys of an `sglang.bench_serving` line (see the module docstring), all optional."""

    tag: Text(200) | None = None
    backend: Text(100) | None = None
    dataset_name: Text(TEXT_LIMITS["dataset"]) | None = None
    request_rate: Annotated[float | Literal["trace"] | None, BeforeValidator(_sglang_rate)] = None
    max_concurrency: Whole(1, INT_MAX) | None = None
    sharegpt_output_len: Whole(1, INT_MAX) | None = None
    random_input_len: Whole(0, INT_MAX) | None = None
    random_output_len: Whole(0, INT_MAX) | None = None
    random_range_ratio: Number(0.0, 1.0) | None = None
    server_info: ServerInfo | None = None


#: An `sglang.bench_serving` result line: setup keys, per-request lists, and every WindowMetrics
#: field with a vLLM key, read from SGLang's key for it (`SGLANG_KEYS`).
SglangResult = metrics_model("SglangResult", _sglang_key, scaled=True, base=SglangSetup)


def import_sglang(obj: JsonObject) -> ImportedRun:
    """One `sglang.bench_serving` result line (see the module docstring for its keys), validated
    (`SglangResult`). num_prompts is the length of the per-request lists; without per-request
    errors, failed = num_prompts - completed. Raises ResultFileError naming the key."""
    m = validate(SglangResult, obj)
    per_request = per_request_lists(m)
    dataset = m.dataset_name
    input_len = output_len = None
    if dataset and dataset.startswith("random"):
        input_len, output_len = m.random_input_len or None, m.random_output_len or None
    elif dataset == "sharegpt":
        output_len = m.sharegpt_output_len
    info = m.server_info or ServerInfo()
    num_prompts = len(m.input_lens) if m.input_lens is not None else None
    values = window_from(m)
    definitions = dict(SGLANG_DEFINITIONS)
    if values.get("failed") is None and m.errors is None and num_prompts is not None \
            and values.get("completed") is not None and values["completed"] <= num_prompts:
        values["failed"] = num_prompts - values["completed"]
        definitions["failed"] = "num_prompts (per-request lists) - completed: the file has no per-request errors"
    setup = make_workload(input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                          concurrency=m.max_concurrency,
                          request_rate=None if m.request_rate == "trace" else m.request_rate,
                          model=info.model_path or info.served_model_name, tokenizer=info.tokenizer_path,
                          backend=m.backend, dataset=dataset)
    window, failure = finish_window(values, per_request, setup, definitions,
                                    lambda name, reason: obj.error((SGLANG_FIELD_KEYS.get(name, name),), reason))
    extra = extra_of(m)
    if m.request_rate == "trace":
        extra["request_rate"] = "trace"
    return ImportedRun(
        source_tool=TOOL_SGLANG,
        source_version=info.version,
        definitions=definitions,
        metrics=window,
        workload=setup,
        spec_source=SGLANG_SPEC_SOURCE if window.acceptance_length is not None else None,
        per_request=per_request,
        source_extra=extra,
        failure=failure,
        source=obj,
        keys=SGLANG_FIELD_KEYS,
    )


#: Top-level keys that sglang.bench_serving writes and `vllm bench serve` does not: how
#: detection tells an SGLang object.
SGLANG_MARKERS = frozenset({
    "dataset_name", "random_input_len", "random_output_len", "sharegpt_output_len",
    "random_range_ratio", "total_output_tokens_retokenized", "input_throughput", "total_throughput",
    "mean_e2e_latency_ms", "accept_length", "server_info", "concurrency",
})


class SglangBench(JsonObjectsFormat):
    """`sglang.bench_serving` result files (the module docstring): JSON lines, one run per line."""

    name: ClassVar[str] = "sglang"
    tool: ClassVar[str] = TOOL_SGLANG
    reads: ClassVar[str] = "JSON lines of --output-file"
    markers: ClassVar[frozenset[str]] = SGLANG_MARKERS
    figure_keys: ClassVar[frozenset[str]] = frozenset(_sglang_key(f) for f in METRIC_FIELDS if f.vllm_key)

    def read_object(self, obj: JsonObject) -> ImportedRun:
        return import_sglang(obj)


FORMAT = SglangBench()
