"""What the result-file readers share: the error type, the imported-run shape, the validated
value types of the boundary (pydantic v2), the metric models derived from the schema, and the
rules that turn a validated file object into draftboard's figures.

The boundary (issue 10): every value read from another tool's file passes a pydantic model
before anything is stored.

- Numbers: finite, within the physical bounds of the schema (`MetricField.lo`/`hi` in
  benchkit.measure.metrics, scaled to the file's unit: vLLM writes the acceptance rate in percent,
  so the file's bound is [0, 100] and the value is divided by 100 once, by `MetricField.from_vllm`),
  integers within the database's column (`BIGINT_MAX` for metric counts, `INT_MAX` for the run's
  workload columns), no bool where a number belongs, no string where a number belongs.
- Strings: within the column's `max_length` (`TEXT_LIMITS`, which runs.models uses for the
  columns themselves); NUL and lone surrogates were refused when the text was read
  (benchkit.formats.jsontext).
- Every field is optional: a key the file lacks is None (unknown), never 0 and never an error.
  Unknown keys are kept (`ImportedRun.source_extra`), non-finite floats among them as the
  strings "NaN", "Infinity", "-Infinity" (JSON has no NaN).
- Errors: `ResultFileError`, printed `file:line: field: reason`.

Both tools' "ITL" is the gap between consecutive streamed messages, which draftboard calls ICL
(docs/MEASUREMENT.md); their ITL statistics are imported as draftboard's `*_icl_ms` and
draftboard's per-token `*_itl_ms` stay None.

After validation, `finish_window` applies the rules that need several fields (MEASUREMENT.md
"Missing is not zero"): placeholders of a file whose every request failed become None and the
run is marked failed (`all_requests_failed`); a partial file (fewer requests than `num_prompts`:
an aborted run) is refused; what is derivable from the file is derived (failed from the
per-request errors, error rate, request / output / total throughput from counts and duration,
num_prompts from completed + failed) and recorded in the run's definitions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    create_model,
    model_validator,
)

from benchkit import config_record
from benchkit.configfile import FieldProblem, first_problem
from benchkit.formats.errors import ResultFileError
from benchkit.formats.jsontext import JsonObject
from benchkit.formats.limits import BIGINT_MAX, EXTRA_MAX_BYTES, INT_MAX, TEXT_LIMITS  # noqa: F401 - re-exported
from benchkit.measure.metrics import METRIC_FIELDS, STAT_NAMES, MetricField, WindowMetrics
from benchkit.methods import MethodChoice

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

#: The keys of `ImportedRun.workload` (see there): the configuration fields a result file may
#: give (benchkit.config_record, `imported`), then what only a file says (its tokenizer, backend).
WORKLOAD_KEYS = (*config_record.imported_keys(), "tokenizer", "backend")


def make_workload(**values: Any) -> dict[str, Any]:
    """An `ImportedRun.workload`: every key of WORKLOAD_KEYS, None unless given in `values`.
    Raises TypeError for a key that is not one (a format author's typo, not a file's)."""
    unknown = values.keys() - set(WORKLOAD_KEYS)
    if unknown:
        raise TypeError(f"not workload keys: {', '.join(sorted(unknown))} (known: {', '.join(WORKLOAD_KEYS)})")
    return {key: values.get(key) for key in WORKLOAD_KEYS}


@dataclass
class ImportedRun:
    """One run read from another tool's result file.

    `source_tool`: the tool that wrote the file, as its format names it ("vllm bench serve",
    "sglang.bench_serving", or "draftboard" for a file written by `export_vllm_layout`).
    `source_version`: the tool or server version when the file records one (SGLang's
    `server_info.version`, a vLLM `--metadata` key `version`/`vllm_version`), else None.
    `definitions`: how the tool defines its numbers where they differ from or need saying beside
    draftboard's (docs/MEASUREMENT.md), plus `derived` naming the figures computed from others
    because the file lacks them. `metrics`: the window's figures (`WindowMetrics`,
    acceptance figures included: acceptance_rate as a fraction, acceptance_length = tau), None
    where the file does not give a value. `spec_source`: where the acceptance figures come from,
    None without them. `workload` (`make_workload`, keys `WORKLOAD_KEYS`): input_len,
    output_len (tokens, intended), num_prompts, concurrency, request_rate (req/s, None =
    unbounded), burstiness, model, tokenizer, backend, dataset, engine (the engine a draftboard
    export names; None otherwise), None where unrecorded. `failure`: (reason code, message)
    when the file records a run that must not count (`all_requests_failed`), else None.
    `per_request`: lists of equal length (input_lens, output_lens, ttfts_ms, icls_ms (list per
    request), e2els_ms, errors) where the file has them, else None. `source_extra`: every other
    key of the source object (unknown keys included), JSON-safe. `origin`: where in the source
    the run stands, set by its format ("path", "path:line", "path#benchmarks[2]",
    "folder/sub/file.json"). `source`: the parsed object, for errors that name a field
    (`refuse`); `keys`: metric field name -> the file's key for it. `tool_version`: the version
    of the tool that wrote the file when it says (AIPerf's `aiperf_version`), stored in the run's
    definitions as `tool_version`. `method`: the decoding configuration when the file states it
    (a `vllm bench sweep` run's serve parameters), else None and the importer's `--method`
    decides. `server_args`: the server's parameters the file records beyond the method (a `vllm
    bench sweep` run's serve parameters as `vllm serve` flags, e.g. `--max-num-seqs 4`): part of
    the run's configuration (its server's `extra_args`). `repeat_index`: which repeat of its
    configuration the run is, when the file numbers them (a sweep's `run_number`), else None.
    `file_sha256` / `file_size_bytes`: the one file of a folder source that holds this run (the
    import's idempotency key per file, so that a folder imported again, or one of its files
    imported alone, stores nothing); "" / 0 for a single-file source (the source's digest is).
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
    failure: tuple[str, str] | None = None
    source: JsonObject | None = field(default=None, repr=False, compare=False)
    keys: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    tool_version: str | None = None
    method: MethodChoice | None = None
    server_args: tuple[str, ...] = ()
    repeat_index: int | None = None
    file_sha256: str = ""
    file_size_bytes: int = 0

    def refuse(self, name: str, reason: str) -> ResultFileError:
        """A ResultFileError about metric or workload field `name`, located by the file's key for it."""
        key = self.keys.get(name, name)
        if self.source is None:
            return ResultFileError(self.origin, reason, None, key)
        return self.source.error((key,), reason)


# ---------------------------------------------------------------------------------------------
# validated value types


def describe(value: Any) -> str:
    """`str 'four'`, `list`, `bool True`: a value's type and a short repr for error reasons."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    return f"{type(value).__name__} {value!r:.40}"


def _number(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {describe(value)}")
    if isinstance(value, int):
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"number too large ({value.bit_length()} bits)") from None
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    return value


def _whole(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a whole number, got {describe(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected a whole number, got {value!r}")
        value = int(value)
    return value


def Number(lo: float | None = 0.0, hi: float | None = None, *, gt: float | None = None) -> Any:  # noqa: N802
    """A finite number (int or float in the file, float here; not a bool, not text) within
    [lo, hi] (or > gt). Validated by pydantic-core itself (strict float, allow_inf_nan=False):
    per-request lists hold millions of them."""
    return Annotated[float, Strict(), Field(ge=lo, le=hi, gt=gt, allow_inf_nan=False)]


def Whole(lo: int = 0, hi: int = BIGINT_MAX) -> Any:  # noqa: N802
    """A whole number (an int, or a float with no fraction) within [lo, hi]."""
    return Annotated[int, BeforeValidator(_whole), Field(ge=lo, le=hi)]


def Text(max_chars: int | None = None) -> Any:  # noqa: N802
    """A string of at most `max_chars` characters (no coercion from numbers)."""
    return Annotated[str, Strict(), Field(max_length=max_chars)]


def _request_rate(value: Any) -> Any:
    """A request rate in req/s: a positive finite number; "inf" / Infinity / None = unbounded (None)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("inf", "infinity")):
        return None
    if isinstance(value, float) and value == math.inf:
        return None
    if isinstance(value, str):
        raise ValueError(f"expected a number or 'inf', got str {value!r:.40}")
    value = _number(value)
    if value <= 0:
        raise ValueError(f"must be > 0 req/s or 'inf' (unbounded), got {value!r}")
    return value


#: A request rate (see `_request_rate`).
RequestRate = Annotated[float | None, BeforeValidator(_request_rate)]


class ResultModel(BaseModel):
    """Base of the result-file models: keys are read by alias (the file's spelling), unknown
    keys are kept in `model_extra`, numbers are checked by the value types above."""

    model_config = ConfigDict(extra="allow", populate_by_name=False, arbitrary_types_allowed=False)


def metric_type(f: MetricField, scale: float = 1.0) -> Any:
    """The validated type of metric `f` in a file whose value = draftboard's x `scale`: its bounds
    from the schema (scaled), counts within BIGINT_MAX, optional (None = unknown)."""
    lo = None if f.lo is None else f.lo * scale
    hi = None if f.hi is None else f.hi * scale
    if f.kind is int:
        inner = Whole(int(lo or 0), int(hi) if hi is not None else BIGINT_MAX)
    elif f.kind is bool:
        inner = Annotated[bool, Strict()]
    elif f.kind is str:
        inner = Text(40)
    elif f.kind is list:
        inner = list[Number(lo, hi)]
    else:
        inner = Number(lo, hi)
    return inner | None


def metrics_model(name: str, key_of: Callable[[MetricField], str | None], scaled: bool,
                  base: type[BaseModel] = ResultModel) -> type[BaseModel]:
    """A model with one optional field per WindowMetrics field that has a key in the file
    (`key_of(f)`, None: the file has none), named as the WindowMetrics field and read from the
    file's key; `scaled`: values are in vLLM's scale (`MetricField.vllm_scale`)."""
    fields = {}
    for f in METRIC_FIELDS:
        key = key_of(f)
        if key:
            fields[f.name] = (metric_type(f, f.vllm_scale if scaled else 1.0), Field(None, alias=key))
    return create_model(name, __base__=base, **fields)


class PerRequest(ResultModel):
    """The per-request lists both tools write with `--save-detailed` / `--output-details`:
    `input_lens`, `output_lens` (tokens), `ttfts`, `latencies` (s), `itls` (s, one list per
    request), `errors` (text, empty for success). `generated_texts` is read past and dropped (not
    a measurement). All present lists must have one entry per request."""

    input_lens: list[Whole(0, INT_MAX) | None] | None = None
    output_lens: list[Whole(0, INT_MAX) | None] | None = None
    ttfts: list[Number() | None] | None = None
    itls: list[list[Number()]] | None = None
    latencies: list[Number() | None] | None = None
    errors: list[Text() | None] | None = None
    generated_texts: Any = None

    @model_validator(mode="after")
    def _same_lengths(self):
        present = [(k, len(v)) for k in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "errors")
                   if isinstance(v := getattr(self, k), list)]
        for key, n in present[1:]:
            if n != present[0][1]:
                raise FieldProblem(key, f"has {n} entries but {present[0][0]!r} has {present[0][1]}")
        return self


def validate(model: type[BaseModel], obj: JsonObject) -> Any:
    """`model` validated from `obj.data`, or ResultFileError `file:line: field: reason` naming the
    first problem (the key path as the file spells it)."""
    try:
        return model.model_validate(obj.data)
    except ValidationError as exc:
        p = first_problem(exc, obj.data, model)
        raise obj.error(p.loc or None, p.reason) from None


def kept(value: Any) -> Any:
    """A source value as it is kept in JSON: non-finite floats as "NaN" / "Infinity" /
    "-Infinity", datetimes as ISO text, keys as strings, containers copied."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): kept(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [kept(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def extra_of(model: BaseModel) -> dict[str, Any]:
    """The unknown keys of a validated object (`model_extra`), JSON-safe (`kept`)."""
    return {k: kept(v) for k, v in (model.model_extra or {}).items()}


# ---------------------------------------------------------------------------------------------
# figures from a validated object


def seconds_to_ms(values: list[float | None] | None) -> list[float | None] | None:
    return None if values is None else [v * 1000.0 if v is not None else None for v in values]


def error_rate_of(completed: int | None, failed: int | None) -> float | None:
    """failed / (completed + failed); None when either is unknown or there were no requests."""
    if completed is None or failed is None or completed + failed == 0:
        return None
    return failed / (completed + failed)


def per_request_lists(m: PerRequest) -> dict[str, list] | None:
    """The per-request lists of a validated object in draftboard's units (ms), None without any."""
    lists: dict[str, list | None] = {
        "input_lens": m.input_lens,
        "output_lens": m.output_lens,
        "ttfts_ms": seconds_to_ms(m.ttfts),
        "icls_ms": None if m.itls is None else [[x * 1000.0 for x in inner] for inner in m.itls],
        "e2els_ms": seconds_to_ms(m.latencies),
        "errors": m.errors,
    }
    present = {k: v for k, v in lists.items() if v is not None}
    return present or None


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


def window_from(m: BaseModel, scaled: bool = True) -> dict[str, Any]:
    """{WindowMetrics field: value in draftboard's scale} of a validated metrics model (fields it
    lacks are absent)."""
    out = {}
    for f in METRIC_FIELDS:
        if f.name in type(m).model_fields:
            value = getattr(m, f.name)
            out[f.name] = f.from_vllm(value) if scaled else value
    return out


#: Fields whose value in a file with no completed request is a placeholder (both tools write
#: 0.0 for the statistics of an empty list: vllm/benchmarks/serve.py `np.mean(ttfts or 0)`).
PLACEHOLDER_GROUPS = ("latency",)
PLACEHOLDER_FIELDS = ("max_output_tokens_per_s", "mean_tokens_per_chunk")


def finish_window(values: dict[str, Any], per_request: dict[str, list] | None, workload: dict[str, Any],
                  definitions: dict[str, str], refuse: Callable[[str, str], ResultFileError]
                  ) -> tuple[WindowMetrics, tuple[str, str] | None]:
    """The run's WindowMetrics and failure from validated `values` (WindowMetrics fields, in
    draftboard's scale), its per-request lists and its workload (num_prompts may be derived in
    place). Derivations are named in `definitions["derived"]`. Raises `refuse(field, reason)`
    for a partial file (completed + failed < num_prompts: an aborted run) or more accepted than
    drafted tokens.
    """
    w = dict(values)
    derived = []
    if w.get("failed") is None:
        w["failed"] = failed_from_errors(per_request)
        if w["failed"] is not None:
            derived.append("failed = requests with an error in the per-request list")
    completed, failed = w.get("completed"), w.get("failed")
    if w.get("error_rate") is None:
        w["error_rate"] = error_rate_of(completed, failed)
    if w.get("mean_tokens_per_chunk") is None:
        w["mean_tokens_per_chunk"] = tokens_per_chunk_of(per_request)
    num_prompts = workload.get("num_prompts")
    if completed is not None and num_prompts is not None:
        if completed + (failed or 0) < num_prompts:
            raise refuse("completed", f"partial result: {completed} completed + {failed or 0} failed of "
                                      f"num_prompts {num_prompts} requests (the file of an aborted run?)")
    elif num_prompts is None and completed is not None and failed is not None:
        workload["num_prompts"] = completed + failed
        derived.append("num_prompts = completed + failed")
    accepted, drafted = w.get("spec_num_accepted_tokens"), w.get("spec_num_draft_tokens")
    if accepted is not None and drafted is not None and accepted > drafted:
        raise refuse("spec_num_accepted_tokens", f"{accepted:g} accepted tokens is more than {drafted:g} drafted")
    duration = w.get("duration_s")
    if duration:
        for name, parts in (("request_throughput_req_s", ("completed",)),
                            ("output_throughput_tok_s", ("total_output_tokens",)),
                            ("total_token_throughput_tok_s", ("total_input_tokens", "total_output_tokens"))):
            if w.get(name) is None and all(w.get(p) is not None for p in parts):
                w[name] = sum(w[p] for p in parts) / duration
                derived.append(f"{name} = {' + '.join(parts)} / duration_s")
    failure = None
    if completed == 0:
        for f in METRIC_FIELDS:
            if f.group in PLACEHOLDER_GROUPS or f.name in PLACEHOLDER_FIELDS:
                w[f.name] = None
        total = f" of {completed + failed}" if failed is not None else ""
        failure = ("all_requests_failed", f"0{total} requests completed: the file's latency figures are the "
                                          "tool's placeholders, stored as unknown")
    if derived:
        definitions["derived"] = "; ".join(derived) + " (not in the file)"
    return WindowMetrics(**w), failure


def latency_fields(metric: str, stats: dict[str, float | None], scale: float = 1.0) -> dict[str, float | None]:
    """{`{stat}_{metric}_ms`: value x `scale`} for the statistics in `stats` (keys of STAT_NAMES:
    mean, median, std, p90, p95, p99; a tool's own names mapped by the caller), e.g. a tool's
    seconds with scale 1000. Statistics the tool does not give are absent (unknown)."""
    unknown = stats.keys() - set(STAT_NAMES)
    if unknown:
        raise TypeError(f"not statistics: {', '.join(sorted(unknown))}")
    return {f"{stat}_{metric}_ms": None if v is None else v * scale for stat, v in stats.items()}


def per_position_rates(histogram: dict[int, float], k: int) -> list[float] | None:
    """Per-position acceptance rates from a pooled acceptance histogram (steps that accepted
    exactly j draft tokens, j = 0..k; vLLM's per-request `acceptance_histogram` summed): rate at
    position p (1-based) = steps that accepted >= p / all steps, p = 1..k (MEASUREMENT.md: d
    accepted at position p / d drafts). None without steps or with a j outside 0..k."""
    total = sum(histogram.values())
    if total <= 0 or k < 1 or any(not 0 <= j <= k for j in histogram):
        return None
    return [sum(n for j, n in histogram.items() if j >= p) / total for p in range(1, k + 1)]


#: The key of RunMetrics.extra that names the keys `bound_extra` left out.
DROPPED_KEY = "draftboard_left_out"


def bound_extra(extra: dict[str, Any], limit: int = EXTRA_MAX_BYTES) -> dict[str, Any]:
    """`extra` within `limit` bytes of UTF-8 JSON: keys are kept in order while they fit; the
    rest are left out and named under DROPPED_KEY with their sizes ({"bound_bytes", "keys":
    {key: bytes}}, at most 50 names, each cut to 100 characters). The result always fits."""
    def size(value: Any) -> int:
        return len(json.dumps(value, ensure_ascii=False, allow_nan=False, default=str).encode("utf-8",
                                                                                              "surrogatepass"))

    if size(extra) <= limit:
        return extra
    budget = limit - 8 * 1024  # room for the note
    kept_: dict[str, Any] = {}
    left: dict[str, int] = {}
    used = 2
    for key, value in extra.items():
        n = size({key: value})
        if used + n <= budget:
            kept_[key] = value
            used += n
        else:
            left[key] = n
    kept_[DROPPED_KEY] = {"bound_bytes": limit, "keys": {k[:100]: n for k, n in list(left.items())[:50]},
                          "n_left_out": len(left)}
    return kept_


def json_safe(value: Any) -> Any:
    """`value` as plain JSON: non-finite floats become null, datetimes ISO text (exports)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value
