"""Import result files of other benchmark tools, and export a run in `vllm bench serve`'s layout.

Import (`load_result_file`):

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

Both tools' "ITL" is the gap between consecutive streamed messages, which draftboard calls ICL
(docs/MEASUREMENT.md); their ITL statistics are imported under draftboard's `*_icl_ms` keys and
draftboard's per-token `*_itl_ms` stay None. A key a file lacks imports as None, never as an
error. A malformed file (not JSON, a line that is not JSON, a field of the wrong type, per-request
lists of different lengths) raises `ResultFileError` naming the file, the line (JSON lines) and
the field; nothing is returned then.

Export (`export_vllm_layout`): see its docstring.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchkit.metrics import FLAT_KEYS, STAT_NAMES

FORMATS = ("auto", "vllm", "sglang")

TOOL_VLLM = "vllm bench serve"
TOOL_SGLANG = "sglang.bench_serving"
TOOL_DRAFTBOARD = "draftboard"

#: Version of the `draftboard` block written by `export_vllm_layout`.
EXPORT_FORMAT = 1

_STATS = STAT_NAMES

_COMMON_DEFINITIONS = {
    "itl": "per chunk: gap between consecutive streamed messages (the tool's ITL is draftboard's ICL); "
    "imported as icl, draftboard's per-token itl is not available",
    "ttft": "first streamed message carrying text minus send time",
    "tpot": "(latency - TTFT) / (output tokens - 1) per request",
    "percentiles": "numpy.percentile, linear interpolation; std is the population std (ddof=0)",
}

VLLM_DEFINITIONS: dict[str, str] = {
    **_COMMON_DEFINITIONS,
    "e2el": "request latency: last streamed message minus send time",
    "output_tokens": "the server's usage.completion_tokens where the endpoint reports it, "
    "else the text re-tokenized",
    "acceptance_rate": "window delta of the server's vllm:spec_decode_* counters; percent in the file, "
    "stored as a fraction",
    "acceptance_length": "1 + d accepted / d drafts over the benchmark window (same as draftboard's tau)",
    "goodput": "request_goodput: requests meeting every --goodput SLO per second",
}

SGLANG_DEFINITIONS: dict[str, str] = {
    **_COMMON_DEFINITIONS,
    "e2el": "e2e_latency: last streamed message minus send time",
    "output_tokens": "the tool's output_len per request (server usage where reported, "
    "else the requested length)",
    "acceptance_length": "accept_length: the server-wide avg_spec_accept_length from /get_server_info "
    "(generation tokens / verify calls, not a delta over the benchmark window)",
    "failed": "not in the file; counted from the per-request errors when --output-details was used",
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


class ResultFileError(ValueError):
    """A result file cannot be imported. The message names the file, the line (for JSON lines,
    1-based) and the field where known; `path`, `line` and `field` hold them too."""

    def __init__(self, path: str | Path, message: str, line: int | None = None, field: str | None = None):
        self.path = str(path)
        self.line = line
        self.field = field
        where = self.path if line is None else f"{self.path}, line {line}"
        what = f"field {field!r}: " if field else ""
        super().__init__(f"{where}: {what}{message}")


@dataclass
class ImportedRun:
    """One run read from another tool's result file.

    `source_tool`: "vllm bench serve", "sglang.bench_serving" or "draftboard" (a file written by
    `export_vllm_layout`). `source_version`: the tool or server version when the file records
    one (SGLang's `server_info.version`, a vLLM `--metadata` key `version`/`vllm_version`),
    else None. `definitions`: how the tool defines its numbers where they differ from or need
    saying beside draftboard's (docs/MEASUREMENT.md). `metrics_flat`: draftboard's flat keys
    (`FLAT_KEYS`; ms, tok/s, req/s, s), None where the file does not give the value.
    `spec_decode`: acceptance figures (keys of `SpecDecodeMetrics.to_flat()`: acceptance_rate
    as a fraction, acceptance_length = tau, ...) or None. `workload`: input_len, output_len
    (tokens, intended), num_prompts, concurrency, request_rate (req/s, None = unbounded),
    burstiness, model, tokenizer, backend, dataset (None where unrecorded). `per_request`: lists
    of equal length (input_lens, output_lens, ttfts_ms, icls_ms (list per request),
    e2els_ms, errors) where the file has them, else None. `source_extra`: every other key of
    the source object, untouched. `origin`: "path" or "path:line".
    """

    source_tool: str
    source_version: str | None
    definitions: dict[str, str]
    metrics_flat: dict[str, Any]
    workload: dict[str, Any]
    spec_decode: dict[str, Any] | None = None
    per_request: dict[str, list] | None = None
    source_extra: dict[str, Any] = field(default_factory=dict)
    origin: str = ""


# ---------------------------------------------------------------------------------------------
# typed field access


class _Obj:
    """A source object with its place in the file, for typed reads that name the field."""

    def __init__(self, data: dict[str, Any], path: str, line: int | None):
        self.data = data
        self.path = path
        self.line = line
        self.used: set[str] = set()

    def error(self, key: str | None, message: str) -> ResultFileError:
        return ResultFileError(self.path, message, self.line, key)

    def _raw(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def num(self, key: str) -> float | int | None:
        value = self._raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"expected a number, got {type(value).__name__} {value!r:.40}")
        return value

    def int_(self, key: str) -> int | None:
        value = self.num(key)
        if value is None:
            return None
        if isinstance(value, float):
            if not value.is_integer():
                raise self.error(key, f"expected a whole number, got {value!r}")
            value = int(value)
        return value

    def str_(self, key: str) -> str | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {type(value).__name__} {value!r:.40}")
        return value

    def rate(self, key: str) -> float | None:
        """A request rate: a number, or "inf" / Infinity (unbounded, returned as None)."""
        value = self._raw(key)
        if value is None:
            return None
        if isinstance(value, str):
            if value.strip().lower() in ("inf", "infinity"):
                return None
            raise self.error(key, f"expected a number or 'inf', got {value!r:.40}")
        value = self.num(key)
        return None if value is None or math.isinf(value) else float(value)

    def dict_(self, key: str) -> dict[str, Any] | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"expected an object, got {type(value).__name__}")
        return value

    def num_list(self, key: str) -> list[float] | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of numbers, got {type(value).__name__}")
        for i, x in enumerate(value):
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
                raise self.error(key, f"item {i}: expected a number, got {type(x).__name__} {x!r:.40}")
        return value

    def nested_num_list(self, key: str) -> list[list[float]] | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of lists of numbers, got {type(value).__name__}")
        for i, inner in enumerate(value):
            if not isinstance(inner, list):
                raise self.error(key, f"item {i}: expected a list of numbers, got {type(inner).__name__}")
            for j, x in enumerate(inner):
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    raise self.error(key, f"item {i}[{j}]: expected a number, got {type(x).__name__}")
        return value

    def str_list(self, key: str) -> list[str] | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of strings, got {type(value).__name__}")
        for i, x in enumerate(value):
            if x is not None and not isinstance(x, str):
                raise self.error(key, f"item {i}: expected a string, got {type(x).__name__}")
        return value

    def extra(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in self.used}


def _ms(values: list[float] | None) -> list[float] | None:
    return None if values is None else [v * 1000.0 if v is not None else None for v in values]


def _empty_flat() -> dict[str, Any]:
    return {k: None for k in FLAT_KEYS}


def _error_rate(completed: int | None, failed: int | None) -> float | None:
    if completed is None or failed is None:
        return None
    total = completed + failed
    return failed / total if total else 0.0


def _per_request(o: _Obj, e2el_key: str | None) -> dict[str, list] | None:
    lists: dict[str, list | None] = {
        "input_lens": o.num_list("input_lens"),
        "output_lens": o.num_list("output_lens"),
        "ttfts_ms": _ms(o.num_list("ttfts")),
        "icls_ms": None,
        "e2els_ms": _ms(o.num_list(e2el_key)) if e2el_key else None,
        "errors": o.str_list("errors"),
    }
    itls = o.nested_num_list("itls")
    if itls is not None:
        lists["icls_ms"] = [[x * 1000.0 for x in inner] for inner in itls]
    o.used.add("generated_texts")  # kept out of the import: large and not a measurement
    present = {k: v for k, v in lists.items() if v is not None}
    if not present:
        return None
    source_names = {"ttfts_ms": "ttfts", "icls_ms": "itls", "e2els_ms": e2el_key or ""}
    lengths = {k: len(v) for k, v in present.items()}
    if len(set(lengths.values())) > 1:
        first_key, first_len = next(iter(lengths.items()))
        for k, n in lengths.items():
            if n != first_len:
                raise o.error(
                    source_names.get(k, k),
                    f"has {n} entries but {source_names.get(first_key, first_key)!r} has {first_len}",
                )
    return present


def _failed_from_errors(per_request: dict[str, list] | None) -> int | None:
    if not per_request or "errors" not in per_request:
        return None
    return sum(1 for e in per_request["errors"] if e)


def _tokens_per_chunk(per_request: dict[str, list] | None) -> float | None:
    """Mean tokens per streamed message over successful requests: sum(output_lens) /
    sum(len(itls) + 1). Needs output_lens and itls; requests with an error or no output skip."""
    if not per_request or "output_lens" not in per_request or "icls_ms" not in per_request:
        return None
    errors = per_request.get("errors") or [""] * len(per_request["output_lens"])
    tokens = chunks = 0
    for n, gaps, err in zip(per_request["output_lens"], per_request["icls_ms"], errors, strict=False):
        if err or not n:
            continue
        tokens += n
        chunks += len(gaps) + 1
    return tokens / chunks if chunks else None


def _stat_block(o: _Obj, flat: dict[str, Any], src_metric: str, our_metric: str) -> None:
    for stat in _STATS:
        flat[f"{stat}_{our_metric}_ms"] = o.num(f"{stat}_{src_metric}_ms")


# ---------------------------------------------------------------------------------------------
# vLLM


def _vllm_spec(o: _Obj) -> dict[str, Any] | None:
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


def _import_vllm(o: _Obj) -> ImportedRun:
    flat = _empty_flat()
    for key in ("duration", "request_throughput", "output_throughput", "total_token_throughput",
                "max_output_tokens_per_s"):
        flat[key] = o.num(key)
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        flat[key] = o.int_(key)
    flat["goodput"] = o.num("request_goodput")
    for metric in ("ttft", "tpot", "e2el"):
        _stat_block(o, flat, metric, metric)
    _stat_block(o, flat, "itl", "icl")
    per_request = _per_request(o, "latencies")
    if flat["failed"] is None:
        flat["failed"] = _failed_from_errors(per_request)
    flat["error_rate"] = _error_rate(flat["completed"], flat["failed"])
    flat["mean_tokens_per_chunk"] = _tokens_per_chunk(per_request)
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


def _import_draftboard(o: _Obj) -> ImportedRun:
    """A file written by `export_vllm_layout`: the vLLM keys plus the `draftboard` block, whose
    metrics (with per-token ITL) and definitions win."""
    run = _import_vllm(o)
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
    flat = _empty_flat()
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


# ---------------------------------------------------------------------------------------------
# SGLang


def _import_sglang(o: _Obj) -> ImportedRun:
    flat = _empty_flat()
    for key in ("duration", "request_throughput", "output_throughput", "max_output_tokens_per_s"):
        flat[key] = o.num(key)
    for key in ("completed", "total_input_tokens", "total_output_tokens"):
        flat[key] = o.int_(key)
    flat["total_token_throughput"] = o.num("total_throughput")
    for metric in ("ttft", "tpot"):
        _stat_block(o, flat, metric, metric)
    _stat_block(o, flat, "itl", "icl")
    _stat_block(o, flat, "e2e_latency", "e2el")
    per_request = _per_request(o, None)
    flat["failed"] = _failed_from_errors(per_request)
    flat["error_rate"] = _error_rate(flat["completed"], flat["failed"])
    flat["mean_tokens_per_chunk"] = _tokens_per_chunk(per_request)

    accept_length = o.num("accept_length")
    spec = None
    if accept_length is not None:
        spec = {
            "spec_num_drafts": None,
            "spec_num_draft_tokens": None,
            "spec_num_accepted_tokens": None,
            "acceptance_rate": None,
            "acceptance_length": accept_length,
            "per_position_acceptance_rate": [],
            "spec_source": "sglang.bench_serving accept_length: server-wide /get_server_info "
            "avg_spec_accept_length, not a window delta",
        }
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
        metrics_flat=flat,
        workload=workload,
        spec_decode=spec,
        per_request=per_request,
        source_extra=extra,
    )


# ---------------------------------------------------------------------------------------------
# detection and loading

_VLLM_MARKERS = frozenset({
    "endpoint_type", "model_id", "tokenizer_id", "num_prompts", "burstiness", "failed",
    "total_token_throughput", "request_goodput", "mean_e2el_ms", "latencies", "best_of",
    "spec_decode_acceptance_length",
})
_SGLANG_MARKERS = frozenset({
    "dataset_name", "random_input_len", "random_output_len", "sharegpt_output_len",
    "random_range_ratio", "total_output_tokens_retokenized", "input_throughput", "total_throughput",
    "mean_e2e_latency_ms", "accept_length", "server_info", "concurrency",
})


def detect_tool(obj: dict[str, Any]) -> str | None:
    """"vllm" or "sglang" from the keys of one result object (the draftboard export counts as
    vllm), or None when the keys do not tell."""
    if "draftboard" in obj:
        return "vllm"
    v = len(_VLLM_MARKERS & obj.keys())
    s = len(_SGLANG_MARKERS & obj.keys())
    if v > s:
        return "vllm"
    if s > v:
        return "sglang"
    return None


def _read_objects(path: Path) -> list[tuple[int | None, dict[str, Any]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ResultFileError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ResultFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    if not text.strip():
        raise ResultFileError(path, "the file is empty")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise ResultFileError(
                path, f"not valid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
            ) from exc
    else:
        if not isinstance(whole, dict):
            raise ResultFileError(
                path, f"expected a JSON object per run, got a {type(whole).__name__}", line=1
            )
        return [(None, whole)]
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ResultFileError(
                path, f"not valid JSON: {exc.msg} (column {exc.colno})", line=number
            ) from exc
        if not isinstance(obj, dict):
            raise ResultFileError(path, f"expected a JSON object, got a {type(obj).__name__}", line=number)
        objects.append((number, obj))
    return objects


def load_result_file(path: str | Path, fmt: str = "auto") -> list[ImportedRun]:
    """Import every run in a result file of `vllm bench serve` or `sglang.bench_serving`.

    `fmt`: "vllm", "sglang" or "auto" (each object's keys decide; see `detect_tool`). A single
    JSON object (vLLM's `--save-result`, also pretty-printed) or JSON lines (SGLang's output,
    vLLM's `--append-result`) are both read. Returns one ImportedRun per object, in file order.
    Raises ResultFileError (file, line, field) for an unreadable or malformed file, an object
    whose tool cannot be told, or an unknown `fmt`; never returns part of a file.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ResultFileError(path, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    runs = []
    for line, obj in _read_objects(path):
        tool = fmt if fmt != "auto" else detect_tool(obj)
        if tool is None:
            raise ResultFileError(
                path, "cannot tell whether vllm bench serve or sglang.bench_serving wrote this object; "
                "pass fmt='vllm' or fmt='sglang'", line=line)
        o = _Obj(obj, str(path), line)
        if tool == "vllm":
            run = _import_draftboard(o) if "draftboard" in obj else _import_vllm(o)
        else:
            run = _import_sglang(o)
        run.origin = str(path) if line is None else f"{path}:{line}"
        runs.append(run)
    return runs


# ---------------------------------------------------------------------------------------------
# export


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


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
        for stat in _STATS:
            out[f"{stat}_{metric}_ms"] = metrics_flat.get(f"{stat}_{ours}_ms")
    out["draftboard"] = {
        "format": EXPORT_FORMAT,
        "metrics": {**{k: None for k in FLAT_KEYS}, **metrics_flat},
        "definitions": dict(DRAFTBOARD_DEFINITIONS),
        "spec_decode": spec or None,
        "run": meta,
    }
    return _json_safe(out)
