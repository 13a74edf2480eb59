"""Per-request and per-run metrics, exactly as docs/MEASUREMENT.md defines them.

Pure functions of `benchkit.measure.logs.RequestLog` lists plus the run window, so old runs can be
recomputed after a formula fix. Names and units:

- TTFT (ms): first message carrying >= 1 output token (reasoning counts) minus send time.
- E2EL (ms): last token-carrying message minus send time.
- n (tokens): server `usage.completion_tokens`; the client's count of streamed tokens only as a
  flagged fallback (`output_tokens_from_text`).
- TPOT (ms/token): (E2EL - TTFT) / (n - 1), defined for n >= 2.
- ITL (ms/token): each gap between consecutive token-carrying messages divided by the tokens the
  later message carried, one sample per token (so ITL statistics are token-weighted: a message of
  k tokens contributes k equal samples). vLLM `bench serve` calls the raw gap "ITL"; here that is
  ICL, reported beside it under its own name.
- ICL (ms): the raw gaps between consecutive token-carrying messages.
- tokens per chunk (tokens): tokens each token-carrying message carried; its mean is a
  client-side estimate of acceptance length (tau).

A request is *completed* when the server answered 2xx, the stream ended without error and it
produced n >= 1 output tokens in at least one token-carrying message; everything else is
*failed* (non-2xx, transport error, timeout, 2xx with zero output tokens). Latency statistics use
completed, measured (non-warmup) requests only.

Percentiles are `numpy.percentile` with linear interpolation (numpy's default "linear" method);
std is the population standard deviation (ddof=0), as `vllm bench serve` computes it.

The metric schema lives here and nowhere else: `WindowMetrics` is one flat dataclass whose every
field carries its unit in its name and, in its `dataclasses.field` metadata, its unit, a short
label, its `vllm bench serve --save-result` key and its physical bounds. `METRIC_FIELDS`
describes the fields from that metadata; the database columns (runs.models.RunMetrics), the
result-file readers and writer (benchkit.formats), the point dicts, figures and exports are
derived from it. Adding a metric is one field here plus a migration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from benchkit.measure.logs import RequestLog

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

#: SLO keys accepted by goodput: upper bounds in ms. `itl_ms` bounds the request's own mean ITL.
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")

#: Latency metrics with a statistics block in WindowMetrics: name -> (label, unit). ITL and
#: TPOT are per token (ms/token); ICL, TTFT and E2EL are per chunk or per request (ms).
LATENCY_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("TTFT", "ms"),
    "tpot": ("TPOT", "ms/token"),
    "itl": ("ITL", "ms/token"),
    "icl": ("ICL", "ms"),
    "e2el": ("E2EL", "ms"),
}
#: The six statistics of each latency metric, in field order.
STAT_NAMES = ("mean", "median", "std", "p90", "p95", "p99")
#: vLLM's name for each latency metric: its "itl" is the gap per streamed message, draftboard's
#: ICL; draftboard's per-token ITL has no `vllm bench serve` key (MEASUREMENT.md).
_VLLM_LATENCY = {"ttft": "ttft", "tpot": "tpot", "icl": "itl", "e2el": "e2el"}

#: At most this many values per list in `distributions`.
DISTRIBUTION_CAP = 5000

_TOKEN_KINDS = ("reasoning", "content")


@dataclass(frozen=True)
class MetricField:
    """What one `WindowMetrics` field means, read from its `dataclasses.field` metadata.

    `name`: the field (unit in the name). `kind`: the type of a present value (int, float, bool,
    or list of floats); every field may also be None (unknown). `unit`, `label`: for display
    (`header` joins them). `group`: requests, tokens, throughput, latency or spec_decode.
    `vllm_key`: the key `vllm bench serve --save-result` writes the figure under
    (vllm/benchmarks/serve.py, the result dict of `benchmark()`), None where vLLM has none;
    `vllm_scale`: vLLM's value = draftboard's value x scale (100 for the acceptance rate, which
    vLLM writes in percent). `lo`, `hi`: physical bounds, inclusive, None where unbounded (for a
    list, bounds of each element). `summary`: shown in the sweep tables and exports.
    """

    name: str
    kind: type
    unit: str
    label: str
    group: str
    vllm_key: str | None = None
    vllm_scale: float = 1.0
    lo: float | None = None
    hi: float | None = None
    summary: bool = False

    @property
    def header(self) -> str:
        """Column header, e.g. `median TTFT (ms)`."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def to_vllm(self, value: Any) -> Any:
        """draftboard's value (a number, a list, or None) in vLLM's scale (x `vllm_scale`)."""
        if value is None or self.vllm_scale == 1.0:
            return value
        return [x * self.vllm_scale for x in value] if self.kind is list else value * self.vllm_scale

    def from_vllm(self, value: Any) -> Any:
        """The inverse of `to_vllm`: a value read from a vLLM-layout file in draftboard's scale."""
        if value is None or self.vllm_scale == 1.0:
            return value
        return [x / self.vllm_scale for x in value] if self.kind is list else value / self.vllm_scale


def _metric(kind: type, unit: str, label: str, group: str, vllm: str | None = None, *, lo: float | None = 0.0,
            hi: float | None = None, vllm_scale: float = 1.0, summary: bool = False) -> Any:
    """A WindowMetrics field: default None (missing is unknown, never 0), its meaning as metadata."""
    return field(default=None, metadata=dict(kind=kind, unit=unit, label=label, group=group, vllm_key=vllm,
                                             vllm_scale=vllm_scale, lo=None if kind is bool else lo, hi=hi,
                                             summary=summary))


def _latency(stat: str, metric: str) -> Any:
    """The field `{stat}_{metric}_ms` of a latency statistics block (see LATENCY_METRICS)."""
    label, unit = LATENCY_METRICS[metric]
    vllm = _VLLM_LATENCY.get(metric)
    return _metric(float, unit, f"{stat} {label}", "latency", f"{stat}_{vllm}_ms" if vllm else None,
                   summary=stat == "median" and metric in ("ttft", "tpot", "itl"))


@dataclass
class WindowMetrics:
    """Metrics of one run's measured window (docs/MEASUREMENT.md, "Per run"); every field is
    None when unknown (an imported file without it), never a placeholder 0.

    Requests: `completed`, `failed` (measured requests only), `error_rate` (failed / all, 0..1),
    `duration_s` (window length). Tokens: `total_input_tokens` (prompt tokens of completed
    requests, server counts where given), `total_output_tokens` (sum of n over completed),
    `output_tokens_from_text` (some completed request's n or per-message tokens came from the
    client, not the server). Rates over the window: `request_throughput_req_s`,
    `output_throughput_tok_s`, `total_token_throughput_tok_s` (input + output),
    `max_output_tokens_per_s` (peak of per-second buckets, token-weighted),
    `request_goodput_req_s` (completed requests meeting every SLO per second; None without an
    SLO), `mean_tokens_per_chunk` (client-side estimate of tau). Latency statistics
    `{mean,median,std,p90,p95,p99}_{ttft,tpot,itl,icl,e2el}_ms` (ms; ms/token for TPOT and
    ITL): TTFT, TPOT and E2EL request-weighted, ITL token-weighted, ICL chunk-weighted; None
    without samples. Speculative decoding, from the server's counters over the window (None
    without drafts): `acceptance_length` (tau = 1 + d accepted / d drafts, >= 1),
    `acceptance_rate` (d accepted / d draft tokens, a fraction), `spec_num_drafts`,
    `spec_num_draft_tokens`, `spec_num_accepted_tokens` (deltas), and
    `per_position_acceptance_rate` (d accepted at position k / d drafts, fractions).
    Each field's unit, label, vLLM key and bounds: `METRIC_FIELDS`.
    """

    completed: int | None = _metric(int, "requests", "completed", "requests", "completed")
    failed: int | None = _metric(int, "requests", "failed", "requests", "failed")
    error_rate: float | None = _metric(float, "fraction", "error rate", "requests", hi=1.0)
    duration_s: float | None = _metric(float, "s", "window", "requests", "duration")
    total_input_tokens: int | None = _metric(int, "tokens", "input tokens", "tokens", "total_input_tokens")
    total_output_tokens: int | None = _metric(int, "tokens", "output tokens", "tokens", "total_output_tokens")
    output_tokens_from_text: bool | None = _metric(bool, "", "output tokens counted by the client", "tokens")
    request_throughput_req_s: float | None = _metric(float, "req/s", "request throughput", "throughput",
                                                     "request_throughput")
    output_throughput_tok_s: float | None = _metric(float, "tok/s", "output throughput", "throughput",
                                                    "output_throughput", summary=True)
    total_token_throughput_tok_s: float | None = _metric(float, "tok/s", "total token throughput", "throughput",
                                                         "total_token_throughput")
    max_output_tokens_per_s: float | None = _metric(float, "tok/s", "peak output throughput", "throughput",
                                                    "max_output_tokens_per_s")
    request_goodput_req_s: float | None = _metric(float, "req/s", "goodput", "throughput", "request_goodput")
    mean_tokens_per_chunk: float | None = _metric(float, "tokens", "mean tokens per chunk", "tokens")
    mean_ttft_ms: float | None = _latency("mean", "ttft")
    median_ttft_ms: float | None = _latency("median", "ttft")
    std_ttft_ms: float | None = _latency("std", "ttft")
    p90_ttft_ms: float | None = _latency("p90", "ttft")
    p95_ttft_ms: float | None = _latency("p95", "ttft")
    p99_ttft_ms: float | None = _latency("p99", "ttft")
    mean_tpot_ms: float | None = _latency("mean", "tpot")
    median_tpot_ms: float | None = _latency("median", "tpot")
    std_tpot_ms: float | None = _latency("std", "tpot")
    p90_tpot_ms: float | None = _latency("p90", "tpot")
    p95_tpot_ms: float | None = _latency("p95", "tpot")
    p99_tpot_ms: float | None = _latency("p99", "tpot")
    mean_itl_ms: float | None = _latency("mean", "itl")
    median_itl_ms: float | None = _latency("median", "itl")
    std_itl_ms: float | None = _latency("std", "itl")
    p90_itl_ms: float | None = _latency("p90", "itl")
    p95_itl_ms: float | None = _latency("p95", "itl")
    p99_itl_ms: float | None = _latency("p99", "itl")
    mean_icl_ms: float | None = _latency("mean", "icl")
    median_icl_ms: float | None = _latency("median", "icl")
    std_icl_ms: float | None = _latency("std", "icl")
    p90_icl_ms: float | None = _latency("p90", "icl")
    p95_icl_ms: float | None = _latency("p95", "icl")
    p99_icl_ms: float | None = _latency("p99", "icl")
    mean_e2el_ms: float | None = _latency("mean", "e2el")
    median_e2el_ms: float | None = _latency("median", "e2el")
    std_e2el_ms: float | None = _latency("std", "e2el")
    p90_e2el_ms: float | None = _latency("p90", "e2el")
    p95_e2el_ms: float | None = _latency("p95", "e2el")
    p99_e2el_ms: float | None = _latency("p99", "e2el")
    acceptance_length: float | None = _metric(float, "tokens/step", "acceptance length tau", "spec_decode",
                                              "spec_decode_acceptance_length", lo=1.0, summary=True)
    acceptance_rate: float | None = _metric(float, "fraction", "acceptance rate", "spec_decode",
                                            "spec_decode_acceptance_rate", hi=1.0, vllm_scale=100.0)
    spec_num_drafts: float | None = _metric(float, "drafts", "drafts", "spec_decode", "spec_decode_num_drafts")
    spec_num_draft_tokens: float | None = _metric(float, "tokens", "draft tokens", "spec_decode",
                                                  "spec_decode_draft_tokens")
    spec_num_accepted_tokens: float | None = _metric(float, "tokens", "accepted tokens", "spec_decode",
                                                     "spec_decode_accepted_tokens")
    per_position_acceptance_rate: list[float] | None = _metric(
        list, "fraction", "per-position acceptance rate", "spec_decode",
        "spec_decode_per_position_acceptance_rates", hi=1.0)

    def to_dict(self) -> dict[str, Any]:
        """{field name: value}, every field, in field order (None where unknown)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> WindowMetrics:
        """Build from {field name: value}; absent fields are None. Raises ValueError naming any
        key that is not a field (use `split_known` first for a source with other keys)."""
        unknown = [k for k in values if k not in METRICS]
        if unknown:
            raise ValueError(f"not WindowMetrics fields: {', '.join(map(repr, unknown))}")
        return cls(**values)

    def with_spec_decode(self, figures: Mapping[str, Any]) -> WindowMetrics:
        """A copy whose speculative-decoding fields (group spec_decode) are taken from `figures`
        (keys named as the fields, e.g. `benchkit.measure.counters.SpecDecodeMetrics.to_flat()`;
        other keys are ignored, absent ones become None)."""
        return replace(self, **{f.name: figures.get(f.name) for f in METRIC_FIELDS if f.group == "spec_decode"})

    @property
    def has_spec_decode(self) -> bool:
        """True when any speculative-decoding figure is known."""
        return any(getattr(self, f.name) is not None for f in METRIC_FIELDS if f.group == "spec_decode")


def _describe() -> tuple[MetricField, ...]:
    out = []
    for f in fields(WindowMetrics):
        info = MetricField(name=f.name, **f.metadata)
        if info.group == "latency" and f.name != "_".join(info.label.lower().split()) + "_ms":
            raise TypeError(f"WindowMetrics.{f.name}: name does not match its statistics block ({info.label})")
        out.append(info)
    return tuple(out)


#: Every WindowMetrics field described (unit, label, vLLM key, bounds), in field order.
METRIC_FIELDS: tuple[MetricField, ...] = _describe()
#: The same, by field name.
METRICS: dict[str, MetricField] = {f.name: f for f in METRIC_FIELDS}
#: The fields shown in sweep tables and exports, in field order.
SUMMARY_FIELDS: tuple[MetricField, ...] = tuple(f for f in METRIC_FIELDS if f.summary)


def split_known(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """({WindowMetrics field: value}, {every other key: value}) of `values`."""
    known = {k: v for k, v in values.items() if k in METRICS}
    return known, {k: v for k, v in values.items() if k not in METRICS}


def latency_stats(samples_ms: list[float] | np.ndarray) -> dict[str, float] | None:
    """{stat: value} for stat in STAT_NAMES (ms, as the samples): mean, median, std (population,
    ddof=0) and the 90th/95th/99th percentiles (numpy linear interpolation); None without samples."""
    arr = np.asarray(samples_ms, dtype=float)
    if arr.size == 0:
        return None
    p90, p95, p99 = np.percentile(arr, [90, 95, 99])
    return {"mean": float(arr.mean()), "median": float(np.median(arr)), "std": float(arr.std()),
            "p90": float(p90), "p95": float(p95), "p99": float(p99)}


@dataclass
class RequestMetrics:
    """Metrics of one request (docs/MEASUREMENT.md, "Per request").

    `completed`: see the module docstring; when False, `failure` says why and the latency
    fields are None / empty. `ttft_ms`, `e2el_ms` (ms); `n_output_tokens` (tokens, the server's
    count when `n_from_server`, else the client's); `tpot_ms` (ms/token, None for n < 2);
    `itl_ms`: one sample per token after the first message (ms/token); `icl_ms`: one sample per
    gap between token-carrying messages (ms); `tokens_per_chunk`: tokens of each token-carrying
    message. `prompt_tokens`: the server's prompt count, else the workload's input_len.
    `client_tokens`: sum of the streamed messages' tokens.
    """

    index: int
    completed: bool
    failure: str = ""
    ttft_ms: float | None = None
    e2el_ms: float | None = None
    n_output_tokens: int = 0
    n_from_server: bool = False
    tpot_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    icl_ms: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    client_tokens: int = 0
    tokens_from_text: bool = False

    @property
    def mean_itl_ms(self) -> float | None:
        """The request's own mean ITL (ms/token, token-weighted), None without ITL samples."""
        return float(np.mean(self.itl_ms)) if self.itl_ms else None


def request_metrics(log: RequestLog) -> RequestMetrics:
    """Compute `RequestMetrics` for one request log.

    Token-carrying messages are the `reasoning` / `content` events with tokens >= 1, taken in
    arrival-time order (stable sort on `t_ns`); `usage` events never carry tokens. A failed
    request's `failure` is the log's `error`, or "zero output tokens" for a 2xx that produced
    none.
    """
    prompt_tokens = log.prompt_tokens if log.prompt_tokens is not None else log.input_len
    if not log.ok:
        return RequestMetrics(
            index=log.index,
            completed=False,
            failure=log.error or "error",
            prompt_tokens=prompt_tokens,
            tokens_from_text=log.tokens_from_text,
        )
    chunks = sorted((e for e in log.events if e.kind in _TOKEN_KINDS and e.tokens > 0), key=lambda e: e.t_ns)
    client_tokens = sum(e.tokens for e in chunks)
    n_from_server = log.completion_tokens is not None
    n = log.completion_tokens if n_from_server else client_tokens
    if n <= 0 or not chunks:
        return RequestMetrics(
            index=log.index,
            completed=False,
            failure="zero output tokens",
            n_output_tokens=n,
            n_from_server=n_from_server,
            prompt_tokens=prompt_tokens,
            client_tokens=client_tokens,
            tokens_from_text=log.tokens_from_text,
        )
    ttft_ns = chunks[0].t_ns - log.send_ns
    e2el_ns = chunks[-1].t_ns - log.send_ns
    tpot_ms = (e2el_ns - ttft_ns) / NS_PER_MS / (n - 1) if n >= 2 else None
    icl_ms: list[float] = []
    itl_ms: list[float] = []
    for prev, cur in zip(chunks, chunks[1:], strict=False):
        gap_ms = (cur.t_ns - prev.t_ns) / NS_PER_MS
        icl_ms.append(gap_ms)
        itl_ms.extend([gap_ms / cur.tokens] * cur.tokens)
    return RequestMetrics(
        index=log.index,
        completed=True,
        ttft_ms=ttft_ns / NS_PER_MS,
        e2el_ms=e2el_ns / NS_PER_MS,
        n_output_tokens=n,
        n_from_server=n_from_server,
        tpot_ms=tpot_ms,
        itl_ms=itl_ms,
        icl_ms=icl_ms,
        tokens_per_chunk=[e.tokens for e in chunks],
        prompt_tokens=prompt_tokens,
        client_tokens=client_tokens,
        tokens_from_text=log.tokens_from_text,
    )


def meets_slo(rm: RequestMetrics, slo: dict[str, float]) -> bool:
    """True when completed request `rm` meets every bound in `slo` (ms; keys in SLO_KEYS).

    A bound on a value the request does not have (TPOT for n = 1, ITL with a single message)
    is met: there was no decode time to bound. Raises ValueError naming an unknown SLO key.
    """
    values = {"ttft_ms": rm.ttft_ms, "tpot_ms": rm.tpot_ms, "e2el_ms": rm.e2el_ms, "itl_ms": rm.mean_itl_ms}
    for key, bound in slo.items():
        if key not in values:
            raise ValueError(f"unknown SLO key {key!r}; expected one of {', '.join(SLO_KEYS)}")
        value = values[key]
        if rm.completed and value is not None and value > bound:
            return False
    return rm.completed


def _measured(logs: list[RequestLog]) -> list[RequestLog]:
    return [log for log in logs if not log.warmup]


def compute_run_metrics(
    logs: list[RequestLog],
    window_start_ns: int,
    window_end_ns: int,
    slo: dict[str, float] | None = None,
) -> WindowMetrics:
    """Compute `WindowMetrics` for the measured window [window_start_ns, window_end_ns] (ns),
    without the speculative-decoding fields (those come from the server's counters; see
    `WindowMetrics.with_spec_decode`).

    Warmup logs are ignored. Throughputs divide by the window length in seconds (0.0 for an
    empty window); error_rate is 0.0 for a window without measured requests. Peak output tok/s:
    every token-carrying message of a completed request puts its tokens into the one-second
    bucket of its arrival, counted from `window_start_ns`; the peak is the largest bucket (tok in
    that second). Goodput uses `slo` (keys in SLO_KEYS, ms); None when `slo` is None or empty.
    Raises ValueError when the window ends before it starts or an SLO key is unknown.
    """
    if window_end_ns < window_start_ns:
        raise ValueError(f"window ends ({window_end_ns} ns) before it starts ({window_start_ns} ns)")
    if slo:
        unknown = [k for k in slo if k not in SLO_KEYS]
        if unknown:
            raise ValueError(
                f"unknown SLO key(s) {', '.join(map(repr, unknown))}; expected {', '.join(SLO_KEYS)}"
            )
    measured = _measured(logs)
    per_request = [(log, request_metrics(log)) for log in measured]
    done = [(log, rm) for log, rm in per_request if rm.completed]
    duration_s = (window_end_ns - window_start_ns) / NS_PER_S

    def rate(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    total_in = sum(rm.prompt_tokens for _, rm in done)
    total_out = sum(rm.n_output_tokens for _, rm in done)
    buckets: dict[int, int] = {}
    for log, _ in done:
        for e in log.events:
            if e.kind in _TOKEN_KINDS and e.tokens > 0:
                b = (e.t_ns - window_start_ns) // NS_PER_S
                buckets[b] = buckets.get(b, 0) + e.tokens
    chunks = [t for _, rm in done for t in rm.tokens_per_chunk]
    samples = {
        "ttft": [rm.ttft_ms for _, rm in done],
        "tpot": [rm.tpot_ms for _, rm in done if rm.tpot_ms is not None],
        "itl": [x for _, rm in done for x in rm.itl_ms],
        "icl": [x for _, rm in done for x in rm.icl_ms],
        "e2el": [rm.e2el_ms for _, rm in done],
    }
    stats = {f"{stat}_{metric}_ms": value for metric, values in samples.items()
             for stat, value in (latency_stats(values) or {}).items()}
    return WindowMetrics(
        completed=len(done),
        failed=len(per_request) - len(done),
        error_rate=(len(per_request) - len(done)) / len(per_request) if per_request else 0.0,
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        output_tokens_from_text=any(rm.tokens_from_text or not rm.n_from_server for _, rm in done),
        request_throughput_req_s=rate(len(done)),
        output_throughput_tok_s=rate(total_out),
        total_token_throughput_tok_s=rate(total_in + total_out),
        max_output_tokens_per_s=float(max(buckets.values())) if buckets else 0.0,
        request_goodput_req_s=rate(sum(1 for _, rm in done if meets_slo(rm, slo))) if slo else None,
        mean_tokens_per_chunk=float(np.mean(chunks)) if chunks else None,
        **stats,
    )


def _cap(values: list[float], cap: int) -> list[float]:
    """At most `cap` values: when there are more, the sorted values at `cap` evenly spaced
    ranks (quantile sampling: keeps min, max and the distribution's shape; deterministic)."""
    if len(values) <= cap:
        return list(values)
    ordered = np.sort(np.asarray(values, dtype=float))
    idx = np.linspace(0, len(ordered) - 1, cap).round().astype(int)
    return [float(v) for v in ordered[idx]]


def distributions(logs: list[RequestLog], cap: int = DISTRIBUTION_CAP) -> dict[str, list[float]]:
    """Per-run sample lists for the run page's histograms, over completed measured requests.

    Returns {"ttft_ms": [...] (one per request), "itl_ms": [...] (one per token, ms/token),
    "icl_ms": [...] (one per gap, ms), "tokens_per_chunk": [...] (one per message)}; each list
    holds at most `cap` values (quantile-sampled when longer, see `_cap`).
    """
    done = [rm for rm in (request_metrics(log) for log in _measured(logs)) if rm.completed]
    return {
        "ttft_ms": _cap([rm.ttft_ms for rm in done], cap),
        "itl_ms": _cap([x for rm in done for x in rm.itl_ms], cap),
        "icl_ms": _cap([x for rm in done for x in rm.icl_ms], cap),
        "tokens_per_chunk": _cap([float(t) for rm in done for t in rm.tokens_per_chunk], cap),
    }


#: A gap between two token-carrying messages below this (ms) means they reached the client in one
#: read (or two reads back to back): a coalesced arrival (MEASUREMENT.md, "Coalesced arrivals").
COALESCED_GAP_MS = 0.1
#: Above this share of coalesced gaps, ITL / ICL medians mislead (they fall towards 0 while TPOT
#: is normal); a page showing ITL should say so and point to TPOT.
COALESCED_NOTE_SHARE = 0.2


def coalesced_share(logs: list[RequestLog], gap_ms: float = COALESCED_GAP_MS) -> float | None:
    """Share (0..1) of the ICL gaps (between consecutive token-carrying messages of completed,
    measured requests) shorter than `gap_ms` (ms, default 0.1): how often several messages
    arrived in one read. None when there are no gaps (every request had one message).

    Source: MEASUREMENT.md, "Coalesced arrivals". Pure; warmup logs are ignored.
    """
    gaps = [g for rm in (request_metrics(log) for log in _measured(logs)) if rm.completed for g in rm.icl_ms]
    if not gaps:
        return None
    return sum(1 for g in gaps if g < gap_ms) / len(gaps)


def mean_decode_tokens_per_chunk(logs: list[RequestLog]) -> float | None:
    """The client's estimate of acceptance length tau (tokens per target step): the mean tokens
    per token-carrying message over completed, measured requests, leaving out each request's
    FIRST message, which comes from prefill (one token, no draft step). Keeping it, as
    MEASUREMENT.md's plain "mean tokens per chunk" does, biases the estimate low by up to
    1 / (messages per request), enough to flag a sound short-output run. None without decode
    messages. Coalesced arrivals (several steps in one read) bias it high.
    """
    chunks = [t for rm in (request_metrics(log) for log in _measured(logs)) if rm.completed
              for t in rm.tokens_per_chunk[1:]]
    return sum(chunks) / len(chunks) if chunks else None
