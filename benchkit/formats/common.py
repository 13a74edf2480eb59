"""What the result-file readers share: the error type, the imported-run shape, typed field
access that names the field, reading `WindowMetrics` from vLLM's key layout (`read_window`), the
per-request lists both tools write, and JSON reading (one object, or JSON lines).

Which key holds which figure is the schema's metadata (`MetricField.vllm_key`,
benchkit.measure.metrics), not a list here. Both tools' "ITL" is the gap between consecutive
streamed messages, which draftboard calls ICL (docs/MEASUREMENT.md); their ITL statistics are
imported as draftboard's `*_icl_ms` and draftboard's per-token `*_itl_ms` stay None. A key a file
lacks imports as None (unknown), never as 0 and never as an error. A malformed file (not JSON,
a line that is not JSON, a field of the wrong type, per-request lists of different lengths)
raises `ResultFileError` naming the file, the line (JSON lines) and the field; nothing is
returned then.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchkit.measure.metrics import METRIC_FIELDS, MetricField, WindowMetrics

TOOL_VLLM = "vllm bench serve"
TOOL_SGLANG = "sglang.bench_serving"
TOOL_DRAFTBOARD = "draftboard"

COMMON_DEFINITIONS = {
    "itl": "per chunk: gap between consecutive streamed messages (the tool's ITL is draftboard's ICL); "
    "imported as icl, draftboard's per-token itl is not available",
    "ttft": "first streamed message carrying text minus send time",
    "tpot": "(latency - TTFT) / (output tokens - 1) per request",
    "percentiles": "numpy.percentile, linear interpolation; std is the population std (ddof=0)",
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
    saying beside draftboard's (docs/MEASUREMENT.md). `metrics`: the window's figures
    (`WindowMetrics`, acceptance figures included: acceptance_rate as a fraction,
    acceptance_length = tau), None where the file does not give a value. `spec_source`: where
    the acceptance figures come from, None without them. `workload`: input_len, output_len
    (tokens, intended), num_prompts, concurrency, request_rate (req/s, None = unbounded),
    burstiness, model, tokenizer, backend, dataset (None where unrecorded). `per_request`: lists
    of equal length (input_lens, output_lens, ttfts_ms, icls_ms (list per request),
    e2els_ms, errors) where the file has them, else None. `source_extra`: every other key of
    the source object, untouched. `origin`: "path" or "path:line".
    """

    source_tool: str
    source_version: str | None
    definitions: dict[str, str]
    metrics: WindowMetrics
    workload: dict[str, Any]
    spec_source: str | None = None
    per_request: dict[str, list] | None = None
    source_extra: dict[str, Any] = field(default_factory=dict)
    origin: str = ""


# ---------------------------------------------------------------------------------------------
# typed field access


class SourceObject:
    """A source object with its place in the file, for typed reads that name the field.

    `prefix` names an object nested in the file's object (e.g. "draftboard.metrics.") in errors."""

    def __init__(self, data: dict[str, Any], path: str, line: int | None, prefix: str = ""):
        self.data = data
        self.path = path
        self.line = line
        self.prefix = prefix
        self.used: set[str] = set()

    def error(self, key: str | None, message: str) -> ResultFileError:
        return ResultFileError(self.path, message, self.line, f"{self.prefix}{key}" if key else None)

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

    def bool_(self, key: str) -> bool | None:
        value = self._raw(key)
        if value is not None and not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {type(value).__name__} {value!r:.40}")
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


def seconds_to_ms(values: list[float] | None) -> list[float] | None:
    return None if values is None else [v * 1000.0 if v is not None else None for v in values]


def error_rate_of(completed: int | None, failed: int | None) -> float | None:
    if completed is None or failed is None:
        return None
    total = completed + failed
    return failed / total if total else 0.0


def per_request_lists(o: SourceObject, e2el_key: str | None) -> dict[str, list] | None:
    lists: dict[str, list | None] = {
        "input_lens": o.num_list("input_lens"),
        "output_lens": o.num_list("output_lens"),
        "ttfts_ms": seconds_to_ms(o.num_list("ttfts")),
        "icls_ms": None,
        "e2els_ms": seconds_to_ms(o.num_list(e2el_key)) if e2el_key else None,
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


def failed_from_errors(per_request: dict[str, list] | None) -> int | None:
    if not per_request or "errors" not in per_request:
        return None
    return sum(1 for e in per_request["errors"] if e)


def tokens_per_chunk_of(per_request: dict[str, list] | None) -> float | None:
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


def read_metric(o: SourceObject, f: MetricField, key: str) -> Any:
    """The value of metric `f` under `key`, checked against `f.kind` (ResultFileError naming the
    key otherwise); None when absent."""
    readers = {int: o.int_, bool: o.bool_, list: o.num_list}
    return readers.get(f.kind, o.num)(key)


def read_window(o: SourceObject, e2el_key: str | None,
                renames: Mapping[str, str] | None = None) -> tuple[WindowMetrics, dict[str, list] | None]:
    """(WindowMetrics, per-request lists) of a source object in `vllm bench serve`'s key layout.

    Each field with a `vllm_key` is read from that key (or from `renames[vllm_key]`, for a tool
    that names the same figure differently) and brought to draftboard's scale
    (`MetricField.from_vllm`: percent -> fraction). The figures vLLM has no key for are derived
    from the per-request lists (`per_request_lists(o, e2el_key)`): `failed` (when the file lacks
    it) from the errors, `error_rate` from completed and failed, `mean_tokens_per_chunk`;
    per-token ITL and `output_tokens_from_text` stay None. Raises ResultFileError naming the key.
    """
    renames = renames or {}
    values = {f.name: f.from_vllm(read_metric(o, f, renames.get(f.vllm_key, f.vllm_key)))
              for f in METRIC_FIELDS if f.vllm_key}
    per_request = per_request_lists(o, e2el_key)
    if values["failed"] is None:
        values["failed"] = failed_from_errors(per_request)
    values["error_rate"] = error_rate_of(values["completed"], values["failed"])
    values["mean_tokens_per_chunk"] = tokens_per_chunk_of(per_request)
    return WindowMetrics(**values), per_request


def read_objects(path: Path) -> list[tuple[int | None, dict[str, Any]]]:
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


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
