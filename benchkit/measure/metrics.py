"""Per-request and per-run metrics, exactly as docs/MEASUREMENT.md defines them.

Pure functions of `benchkit.measure.logs.RequestLog` lists (or their columns, or their chunks:
`LogChunks`, walked one chunk of requests at a time so that a big run's figures need memory for
one sample array, not for every message's objects) plus the run window, so old runs can be
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
- tokens per chunk (tokens): tokens each token-carrying message carried. Its mean over the
  messages AFTER each request's first one (`mean_decode_tokens_per_chunk`; the first message
  holds the prefill token, no draft step) is the client-side estimate of acceptance length
  (tau); coalesced arrivals (several steps in one read) bias it high.

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

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from benchkit.measure.logs import KINDS, LogChunks, LogColumns, RequestLog, columns_of
from benchkit.measure.specrequests import acceptance_from

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

#: A gap between two token-carrying messages below this (ms) means they reached the client in one
#: read (or two reads back to back): a coalesced arrival (MEASUREMENT.md, "Coalesced arrivals").
COALESCED_GAP_MS = 0.1
#: Above this share of coalesced gaps, ITL / ICL medians mislead (they fall towards 0 while TPOT
#: is normal); a page showing ITL should say so and point to TPOT.
COALESCED_NOTE_SHARE = 0.2

#: At most this many values per list in `distributions`.
DISTRIBUTION_CAP = 5000

_TOKEN_KINDS = ("reasoning", "content")


@dataclass(frozen=True)
class MetricField:
    """What one `WindowMetrics` field means, read from its `dataclasses.field` metadata.

    `name`: the field (unit in the name). `kind`: the type of a present value (int, float, bool,
    str, or list of floats); every field may also be None (unknown). `unit`, `label`: for display
    (`header` joins them). `group`: requests, tokens, throughput, latency, arrivals, spec_decode,
    efficiency (from the run's GPU telemetry, benchkit.measure.efficiency) or client (the load
    client's own headroom, benchkit.measure.loadclient.ClientHeadroom).
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
                                             vllm_scale=vllm_scale, lo=None if kind in (bool, str) else lo, hi=hi,
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
    SLO), `mean_tokens_per_chunk` (tokens per token-carrying message, every message: MEASUREMENT.md's
    plain figure), `mean_decode_tokens_per_chunk` (the client-side estimate of tau: the same
    mean leaving out each request's FIRST message, the prefill token; see
    `mean_decode_tokens_per_chunk`). Arrivals: `coalesced_share` (share of ICL gaps below
    COALESCED_GAP_MS, 0..1; above COALESCED_NOTE_SHARE the ITL / ICL medians mislead, read
    TPOT). Latency statistics
    `{mean,median,std,p90,p95,p99}_{ttft,tpot,itl,icl,e2el}_ms` (ms; ms/token for TPOT and
    ITL): TTFT, TPOT and E2EL request-weighted, ITL token-weighted, ICL chunk-weighted; None
    without samples. Speculative decoding, from the server's counters over the window (None
    without drafts): `acceptance_length` (tau = 1 + d accepted / d drafts, >= 1),
    `acceptance_rate` (d accepted / d draft tokens, a fraction), `spec_num_drafts`,
    `spec_num_draft_tokens`, `spec_num_accepted_tokens` (deltas), and
    `per_position_acceptance_rate` (d accepted at position k / d drafts, fractions).
    Efficiency (from the run's GPU telemetry over the window, OUTPUT tokens only,
    benchkit.measure.efficiency; None without telemetry): `output_tok_s_per_gpu` (tok/s),
    `mean_power_w_per_gpu`, `peak_power_w_per_gpu` (W), `energy_j` (J, all the run's GPUs),
    `energy_per_output_token_j` (J/token), `output_tok_s_per_kw` (tok/s/kW), `energy_source`
    (`counter`, `integrated_power` or `mixed`). No cost: it depends on a price that can change,
    so it is computed when read. Client (benchkit.measure.loadclient.ClientHeadroom over the
    window): `client_processes`, `client_max_core_share` (the busiest client process's CPU
    share of one core), `client_loop_lag_p99_ms`, `client_loop_lag_max_ms` (worst process, ms),
    `client_stall_max_ms` (the longest time a client process ran nothing, ms),
    `client_stalled_share` (share of the window spent in stalls of at least
    loadclient.STALL_MIN_MS, worst process), `client_read_delay_p99_ms` (how long received bytes
    waited before the client read them, ms), `client_kernel_stamped_share` (share of reads
    stamped with the kernel's receive time; the rest were stamped when read). The GPU sampler's
    own health (efficiency group, from the telemetry stream): `telemetry_gap_max_ms` (longest
    interval without a reading inside the window, its edges included, ms) and
    `telemetry_gap_share` (share of the window in intervals longer than two sampling periods).
    Per-request acceptance (from the engine's per-request figures in the logs,
    benchkit.measure.specrequests; None where the engine returned none):
    `acceptance_length_request_weighted` (mean over requests of 1 + accepted / steps),
    `acceptance_length_token_weighted` (1 + sum accepted / sum steps), `spec_requests_reported`.
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
    mean_decode_tokens_per_chunk: float | None = _metric(float, "tokens", "tau estimate (tokens per chunk, "
                                                         "first chunk left out)", "tokens")
    coalesced_share: float | None = _metric(float, "fraction", "coalesced arrivals", "arrivals", hi=1.0)
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
    acceptance_length_request_weighted: float | None = _metric(
        float, "tokens/step", "tau, per-request mean", "spec_requests", lo=1.0)
    acceptance_length_token_weighted: float | None = _metric(
        float, "tokens/step", "tau, per verify step", "spec_requests", lo=1.0)
    spec_requests_reported: int | None = _metric(int, "requests", "requests with per-request spec figures",
                                                 "spec_requests")
    output_tok_s_per_gpu: float | None = _metric(float, "tok/s/GPU", "output throughput per GPU", "efficiency")
    mean_power_w_per_gpu: float | None = _metric(float, "W", "mean power per GPU", "efficiency")
    peak_power_w_per_gpu: float | None = _metric(float, "W", "peak power per GPU", "efficiency")
    energy_j: float | None = _metric(float, "J", "GPU energy", "efficiency")
    energy_per_output_token_j: float | None = _metric(float, "J/token", "energy per output token", "efficiency")
    output_tok_s_per_kw: float | None = _metric(float, "tok/s/kW", "output tok/s per kW", "efficiency")
    energy_source: str | None = _metric(str, "", "energy source", "efficiency")
    telemetry_gap_max_ms: float | None = _metric(float, "ms", "GPU sampler longest gap", "efficiency")
    telemetry_gap_share: float | None = _metric(float, "fraction", "GPU sampler gap share", "efficiency", hi=1.0)
    client_processes: int | None = _metric(int, "processes", "client processes", "client")
    client_max_core_share: float | None = _metric(float, "fraction of one core", "client CPU (busiest process)",
                                                  "client")
    client_loop_lag_p99_ms: float | None = _metric(float, "ms", "client event-loop lag p99", "client")
    client_loop_lag_max_ms: float | None = _metric(float, "ms", "client event-loop lag max", "client")
    client_stall_max_ms: float | None = _metric(float, "ms", "client longest stall", "client")
    client_stalled_share: float | None = _metric(float, "fraction", "client stalled share of window", "client",
                                                 hi=1.0)
    client_read_delay_p99_ms: float | None = _metric(float, "ms", "client read delay p99", "client")
    client_kernel_stamped_share: float | None = _metric(float, "fraction", "reads stamped by the kernel", "client",
                                                        hi=1.0)

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

    def with_group(self, group: str, figures: Mapping[str, Any]) -> WindowMetrics:
        """A copy whose fields of `group` (e.g. `efficiency`: keys as
        `benchkit.measure.efficiency.EfficiencyFigures.to_flat()`) are taken from `figures`;
        other keys are ignored, absent ones become None. Raises ValueError for an unknown group."""
        names = [f.name for f in METRIC_FIELDS if f.group == group]
        if not names:
            raise ValueError(f"no WindowMetrics field is in group {group!r}")
        return replace(self, **{n: figures.get(n) for n in names})

    def with_client(self, headroom: Mapping[str, Any] | None) -> WindowMetrics:
        """A copy with the client fields from a `benchkit.measure.loadclient.ClientHeadroom` as a
        dict (`dataclasses.asdict`: processes, max_core_share, loop_lag_p99_ms, loop_lag_max_ms,
        stall_max_ms, stalled_share, read_delay_p99_ms, kernel_stamped_share);
        None or {} -> the client fields None (an imported run, a run without measured requests)."""
        h = headroom or {}
        return self.with_group("client", {"client_processes": h.get("processes"),
                                          "client_max_core_share": h.get("max_core_share"),
                                          "client_loop_lag_p99_ms": h.get("loop_lag_p99_ms"),
                                          "client_loop_lag_max_ms": h.get("loop_lag_max_ms"),
                                          "client_stall_max_ms": h.get("stall_max_ms"),
                                          "client_stalled_share": h.get("stalled_share"),
                                          "client_read_delay_p99_ms": h.get("read_delay_p99_ms"),
                                          "client_kernel_stamped_share": h.get("kernel_stamped_share")})

    def group_values(self, group: str) -> dict[str, Any]:
        """{field: value} of the fields of `group`."""
        return {f.name: getattr(self, f.name) for f in METRIC_FIELDS if f.group == group}

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


@dataclass
class _Requests:
    """Per-request figures of every request of a LogColumns (arrays of length R, in list
    order), and its token-carrying messages sorted by (request, arrival time) (length M).

    `n`: output tokens (the server's count where it sent one, else the client's); `completed`:
    ok, n >= 1 and at least one token-carrying message; `ttft_ms`, `e2el_ms` (NaN without a
    message), `tpot_ms` (NaN for n < 2); `prompt`: the server's prompt tokens, else input_len.
    Messages: `msg_req` (request position), `msg_t` (ns), `msg_tok`, `first` (the request's
    first message), `gap_ms` (to the previous message of the same request; NaN for the first).
    """

    measured: np.ndarray
    completed: np.ndarray
    n: np.ndarray
    n_from_server: np.ndarray
    client_tokens: np.ndarray
    prompt: np.ndarray
    ttft_ms: np.ndarray
    e2el_ms: np.ndarray
    tpot_ms: np.ndarray
    msg_req: np.ndarray
    msg_t: np.ndarray
    msg_tok: np.ndarray
    first: np.ndarray
    gap_ms: np.ndarray

    def itl_of(self, mask: np.ndarray) -> np.ndarray:
        """Per-token ITL samples (ms/token) of the messages in `mask` (first messages excluded):
        each gap divided by the tokens of the later message, repeated once per token."""
        sel = mask & ~self.first
        return np.repeat(self.gap_ms[sel] / self.msg_tok[sel], self.msg_tok[sel])


_TOKEN_CODES = np.asarray([KINDS.index(k) for k in _TOKEN_KINDS], dtype=np.int8)


def _requests(c: LogColumns) -> _Requests:
    """The definitions of "Per request" (module docstring) over all requests at once."""
    n_req = len(c)
    req_of = np.repeat(np.arange(n_req), c.n_events)
    carries = np.isin(c.kind, _TOKEN_CODES) & (c.tokens > 0)
    order = np.lexsort((c.t_ns[carries], req_of[carries]))  # stable: ties keep arrival order
    msg_req, msg_t, msg_tok = req_of[carries][order], c.t_ns[carries][order], c.tokens[carries][order]
    m = np.bincount(msg_req, minlength=n_req)
    client = np.bincount(msg_req, weights=msg_tok, minlength=n_req).astype(np.int64)  # exact below 2**53
    n = np.where(c.completion_known, c.completion_tokens, client)
    has = m > 0
    first_at = np.minimum(np.cumsum(m) - m, max(len(msg_t) - 1, 0))
    last_at = np.maximum(np.cumsum(m) - 1, 0)
    nan = np.full(n_req, np.nan)
    ttft_ns = (msg_t[first_at] - c.send_ns) if len(msg_t) else np.zeros(n_req, np.int64)
    e2el_ns = (msg_t[last_at] - c.send_ns) if len(msg_t) else np.zeros(n_req, np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ttft_ms = np.where(has, ttft_ns / NS_PER_MS, nan)
        e2el_ms = np.where(has, e2el_ns / NS_PER_MS, nan)
        tpot_ms = np.where(has & (n >= 2), (e2el_ns - ttft_ns) / NS_PER_MS / (n - 1), nan)
    first = np.ones(len(msg_req), dtype=bool)
    first[1:] = msg_req[1:] != msg_req[:-1]
    gap_ms = np.full(len(msg_t), np.nan)
    gap_ms[1:] = np.diff(msg_t) / NS_PER_MS
    gap_ms[first] = np.nan
    return _Requests(measured=~c.warmup, completed=c.ok & (n > 0) & has, n=n, n_from_server=c.completion_known,
                     client_tokens=client, prompt=np.where(c.prompt_known, c.prompt_tokens, c.input_len),
                     ttft_ms=ttft_ms, e2el_ms=e2el_ms, tpot_ms=tpot_ms, msg_req=msg_req, msg_t=msg_t, msg_tok=msg_tok,
                     first=first, gap_ms=gap_ms)


class _Walk:
    """The chunks of a run with each chunk's `_Requests`, walked as often as needed: a run of one
    chunk (every small run) keeps its `_Requests`, so each request is computed once; a bigger run
    recomputes each chunk's on every walk (memory is bounded by one chunk, not the run)."""

    def __init__(self, logs: list[RequestLog] | LogColumns | LogChunks):
        self.chunks = logs if isinstance(logs, LogChunks) else LogChunks(logs)
        self._kept: list[tuple[LogColumns, _Requests]] | None = None

    def __iter__(self) -> Iterator[tuple[LogColumns, _Requests]]:
        if self._kept is not None:
            yield from self._kept
            return
        one = len(self.chunks.spans) <= 1
        kept = []
        for c in self.chunks:
            r = _requests(c)
            if one:
                kept.append((c, r))
            yield c, r
        if one:
            self._kept = kept


def _chunks(logs: list[RequestLog] | LogColumns | LogChunks) -> _Walk:
    return logs if isinstance(logs, _Walk) else _Walk(logs)


@dataclass
class _Scan:
    """What one walk over a run's chunks gathers (`_scan`): everything but the ITL / ICL samples,
    which `_fill` writes afterwards into one preallocated array each."""

    n_measured: int = 0
    n_done: int = 0
    total_in: int = 0
    total_out: int = 0
    from_text: bool = False
    n_meeting_slo: int = 0
    buckets: dict[int, float] = field(default_factory=dict)  # second -> tokens (exact integers)
    n_chunks: int = 0  # token-carrying messages of done requests, and their tokens
    chunk_tokens: int = 0
    n_decode: int = 0  # the same without each request's first message
    decode_tokens: int = 0
    n_coalesced: int = 0
    n_itl: int = 0
    chunk_counts: dict[int, int] = field(default_factory=dict)  # tokens per chunk -> messages
    small_chunks: list[np.ndarray] | None = field(default_factory=list)  # while there are at most `cap`
    per_request: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {"ttft": [], "tpot": [], "e2el": []})
    spec: bool = False
    spec_steps: list = field(default_factory=list)
    spec_accepted: list = field(default_factory=list)
    spec_histograms: list = field(default_factory=list)


def _scan(chunks: _Walk, window_start_ns: int, slo: dict[str, float] | None, cap: int | None,
          gap_ms: float = COALESCED_GAP_MS) -> _Scan:
    """One walk over the chunks: every figure of measure_window but the ITL / ICL samples.
    Requests are independent, so each chunk's per-request figures are those of the whole run."""
    s = _Scan()
    for c, r in chunks:
        done = r.measured & r.completed
        s.n_measured += int(r.measured.sum())
        s.n_done += int(done.sum())
        s.total_in += int(r.prompt[done].sum())
        s.total_out += int(r.n[done].sum())
        s.from_text = s.from_text or bool(np.any((c.tokens_from_text | ~r.n_from_server)[done]))
        if slo:
            s.n_meeting_slo += _n_meeting_slo(r, done, slo)
        s.per_request["ttft"].append(r.ttft_ms[done])
        s.per_request["tpot"].append(r.tpot_ms[done & ~np.isnan(r.tpot_ms)])
        s.per_request["e2el"].append(r.e2el_ms[done])
        done_msgs = done[r.msg_req]
        if done_msgs.any():
            seconds, bucket = np.unique((r.msg_t[done_msgs] - window_start_ns) // NS_PER_S, return_inverse=True)
            for sec, tok in zip(seconds.tolist(), np.bincount(bucket, weights=r.msg_tok[done_msgs]).tolist(),
                                strict=True):
                s.buckets[sec] = s.buckets.get(sec, 0.0) + tok
        chunk_tok = r.msg_tok[done_msgs]
        s.n_chunks += chunk_tok.size
        s.chunk_tokens += int(chunk_tok.sum())
        decode = done_msgs & ~r.first
        decode_tok = r.msg_tok[decode]
        s.n_decode += decode_tok.size
        s.decode_tokens += int(decode_tok.sum())
        s.n_itl += int(decode_tok.sum())
        s.n_coalesced += int((r.gap_ms[decode] < gap_ms).sum())
        if cap is not None:
            values, counts = np.unique(chunk_tok, return_counts=True)
            for v, k in zip(values.tolist(), counts.tolist(), strict=True):
                s.chunk_counts[v] = s.chunk_counts.get(v, 0) + k
            if s.small_chunks is not None:
                s.small_chunks.append(chunk_tok)
                if s.n_chunks > cap:
                    s.small_chunks = None
        if c.spec:
            s.spec = True
            for i in np.flatnonzero(done):
                n = c.spec["spec_steps"][i]
                if n:
                    s.spec_steps.append(n)
                    s.spec_accepted.append(c.spec["spec_accepted_tokens"][i] or 0)
                    s.spec_histograms.append(c.spec["spec_histogram"][i])
    return s


def _fill(chunks: _Walk, metric: str, out: np.ndarray) -> None:
    """Write the `metric` ("itl" or "icl") samples of the completed measured requests into `out`
    (exactly as many), in request order then message order: the order the whole-run arrays had."""
    pos = 0
    for _, r in chunks:
        done_msgs = (r.measured & r.completed)[r.msg_req]
        values = r.itl_of(done_msgs) if metric == "itl" else r.gap_ms[done_msgs & ~r.first]
        out[pos:pos + values.size] = values
        pos += values.size
    if pos != out.size:
        raise RuntimeError(f"{metric}: {pos} samples on the second walk, {out.size} on the first")


def _std_in_place(arr: np.ndarray) -> float:
    """`float(arr.std())` computed over `arr` itself (no temporary of its size), which it overwrites:
    the steps of numpy's own `_var` (sum, divide, subtract, square, sum, divide, sqrt)."""
    n = arr.size
    mean = np.add.reduce(arr, keepdims=True)
    np.true_divide(mean, n, out=mean)
    np.subtract(arr, mean, out=arr)
    np.multiply(arr, arr, out=arr)
    return float(np.sqrt(np.add.reduce(arr) / n))


def _sample_stats(chunks: _Walk, metric: str, count: int,
                  cap: int | None) -> tuple[dict[str, float] | None, list[float] | None]:
    """(latency_stats, the capped distribution or None without `cap`) of the `count` ITL or ICL
    samples, with one float64 array of `count` values as the only memory of the run's size:
    filled, mean, std in place; filled again, percentiles and median partitioned in place (the
    same order statistics numpy takes from its copy), sorted in place for the cap."""
    if count == 0:
        return None, ([] if cap is not None else None)
    arr = np.empty(count)
    _fill(chunks, metric, arr)
    dist = arr.tolist() if cap is not None and count <= cap else None
    mean = float(arr.mean())
    std = _std_in_place(arr)
    _fill(chunks, metric, arr)
    p90, p95, p99 = np.percentile(arr, [90, 95, 99], overwrite_input=True)
    median = float(np.median(arr, overwrite_input=True))
    if cap is not None and dist is None:
        arr.sort()
        dist = arr[np.linspace(0, count - 1, cap).round().astype(int)].tolist()
    return {"mean": mean, "median": median, "std": std, "p90": float(p90), "p95": float(p95),
            "p99": float(p99)}, dist


def _capped_counts(counts: dict[int, int], cap: int) -> list[float]:
    """`_cap` of the values counted in `counts` (value -> how many; more than `cap` in all)."""
    values = np.asarray(sorted(counts), dtype=np.int64)
    ends = np.cumsum([counts[v] for v in values.tolist()])
    idx = np.linspace(0, int(ends[-1]) - 1, cap).round().astype(int)
    return values[np.searchsorted(ends, idx, side="right")].astype(float).tolist()


def request_metrics(log: RequestLog) -> RequestMetrics:
    """Compute `RequestMetrics` for one request log.

    Token-carrying messages are the `reasoning` / `content` events with tokens >= 1, taken in
    arrival-time order (stable sort on `t_ns`); `usage` events never carry tokens. A failed
    request's `failure` is the log's `error`, or "zero output tokens" for a 2xx that produced
    none. (The same computation as a run's window, `_requests`, over this one request.)
    """
    prompt_tokens = log.prompt_tokens if log.prompt_tokens is not None else log.input_len
    if not log.ok:
        return RequestMetrics(index=log.index, completed=False, failure=log.error or "error",
                              prompt_tokens=prompt_tokens, tokens_from_text=log.tokens_from_text)
    r = _requests(columns_of([log]))
    n, client = int(r.n[0]), int(r.client_tokens[0])
    if not r.completed[0]:
        return RequestMetrics(index=log.index, completed=False, failure="zero output tokens", n_output_tokens=n,
                              n_from_server=bool(r.n_from_server[0]), prompt_tokens=prompt_tokens,
                              client_tokens=client, tokens_from_text=log.tokens_from_text)
    everything = np.ones(len(r.msg_req), dtype=bool)
    return RequestMetrics(
        index=log.index, completed=True, ttft_ms=float(r.ttft_ms[0]), e2el_ms=float(r.e2el_ms[0]),
        n_output_tokens=n, n_from_server=bool(r.n_from_server[0]),
        tpot_ms=None if np.isnan(r.tpot_ms[0]) else float(r.tpot_ms[0]), itl_ms=r.itl_of(everything).tolist(),
        icl_ms=r.gap_ms[~r.first].tolist(), tokens_per_chunk=r.msg_tok.tolist(), prompt_tokens=prompt_tokens,
        client_tokens=client, tokens_from_text=log.tokens_from_text)


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
    logs: list[RequestLog] | LogColumns | LogChunks,
    window_start_ns: int,
    window_end_ns: int,
    slo: dict[str, float] | None = None,
) -> WindowMetrics:
    """Compute `WindowMetrics` for the measured window [window_start_ns, window_end_ns] (ns),
    without the speculative-decoding fields (those come from the server's counters; see
    `WindowMetrics.with_spec_decode`). `logs`: RequestLogs, or their columns
    (benchkit.measure.logs.decode_columns, which builds no object per event), or their chunks
    (benchkit.measure.logs.LogChunks, e.g. `LogChunks.decode(blob)`).

    Warmup logs are ignored. Throughputs divide by the window length in seconds (0.0 for an
    empty window); error_rate is 0.0 for a window without measured requests. Peak output tok/s:
    every token-carrying message of a completed request puts its tokens into the one-second
    bucket of its arrival, counted from `window_start_ns`; the peak is the largest bucket (tok in
    that second). Goodput uses `slo` (keys in SLO_KEYS, ms); None when `slo` is None or empty.
    Raises ValueError when the window ends before it starts or an SLO key is unknown.
    """
    return measure_window(logs, window_start_ns, window_end_ns, slo, cap=None)[0]


def measure_window(logs: list[RequestLog] | LogColumns | LogChunks, window_start_ns: int, window_end_ns: int,
                   slo: dict[str, float] | None = None,
                   cap: int | None = DISTRIBUTION_CAP) -> tuple[WindowMetrics, dict[str, list[float]]]:
    """(`compute_run_metrics`, `distributions`) of the same logs, each request computed once
    (what recompute uses). With `cap` None the distributions are not built ({} instead).

    Memory (issue 22): the logs are walked in chunks of requests (LogChunks, about
    logs.CHUNK_EVENTS messages each), so the scratch memory is one chunk plus ONE float64 array of
    the run's ITL samples (8 bytes per output token), then one of its ICL samples (8 bytes per
    message), never both, and no per-message Python object or list: a 10 000 x 2 000-token run
    peaks at about 0.2 GB above the logs themselves. Each sample array is filled twice (once for
    the mean and the in-place std, once for the percentiles), so a run of several chunks is walked
    five times; a run of one chunk (every small run) keeps its per-request figures and computes
    each request once. The figures are bit for bit those of the whole-run arrays (same values,
    same order, the same numpy reductions)."""
    if window_end_ns < window_start_ns:
        raise ValueError(f"window ends ({window_end_ns} ns) before it starts ({window_start_ns} ns)")
    if slo:
        unknown = [k for k in slo if k not in SLO_KEYS]
        if unknown:
            raise ValueError(
                f"unknown SLO key(s) {', '.join(map(repr, unknown))}; expected {', '.join(SLO_KEYS)}"
            )
    chunks = _chunks(logs)
    sc = _scan(chunks, window_start_ns, slo, cap)
    duration_s = (window_end_ns - window_start_ns) / NS_PER_S

    def rate(x: float) -> float:
        return x / duration_s if duration_s > 0 else 0.0

    n_measured, n_done, total_in, total_out = sc.n_measured, sc.n_done, sc.total_in, sc.total_out
    samples = {k: np.concatenate(v) if v else np.zeros(0) for k, v in sc.per_request.items()}
    stats = {f"{stat}_{metric}_ms": value for metric, values in samples.items()
             for stat, value in (latency_stats(values) or {}).items()}
    dists: dict[str, list[float]] = {}
    for metric, count in (("itl", sc.n_itl), ("icl", sc.n_decode)):
        block, dists[f"{metric}_ms"] = _sample_stats(chunks, metric, count, cap)
        stats.update({f"{stat}_{metric}_ms": value for stat, value in (block or {}).items()})
    stats = {f"{stat}_{metric}_ms": stats[f"{stat}_{metric}_ms"] for metric in LATENCY_METRICS for stat in STAT_NAMES
             if f"{stat}_{metric}_ms" in stats}
    window = WindowMetrics(
        completed=n_done,
        failed=n_measured - n_done,
        error_rate=(n_measured - n_done) / n_measured if n_measured else 0.0,
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        output_tokens_from_text=sc.from_text,
        request_throughput_req_s=rate(n_done),
        output_throughput_tok_s=rate(total_out),
        total_token_throughput_tok_s=rate(total_in + total_out),
        max_output_tokens_per_s=float(max(sc.buckets.values())) if sc.buckets else 0.0,
        request_goodput_req_s=rate(sc.n_meeting_slo) if slo else None,
        # np.mean of the int64 chunk sizes: their float64 sum is exact (integers below 2**53)
        mean_tokens_per_chunk=float(np.float64(sc.chunk_tokens) / sc.n_chunks) if sc.n_chunks else None,
        mean_decode_tokens_per_chunk=sc.decode_tokens / sc.n_decode if sc.n_decode else None,
        coalesced_share=sc.n_coalesced / sc.n_decode if sc.n_decode else None,
        **stats,
    )
    acc = acceptance_from(sc.spec_steps, sc.spec_accepted, sc.spec_histograms) if sc.spec else None
    if acc is not None:
        window = replace(window, acceptance_length_request_weighted=acc.tau_request_weighted,
                         acceptance_length_token_weighted=acc.tau_token_weighted, spec_requests_reported=acc.requests)
    if cap is None:
        return window, {}
    if sc.small_chunks is not None:
        tokens_per_chunk = (np.concatenate(sc.small_chunks) if sc.small_chunks else np.zeros(0)).astype(float).tolist()
    else:
        tokens_per_chunk = _capped_counts(sc.chunk_counts, cap)
    dists = {
        "ttft_ms": _cap(samples["ttft"], cap),
        "itl_ms": dists["itl_ms"],
        "icl_ms": dists["icl_ms"],
        "tokens_per_chunk": tokens_per_chunk,
    }
    if acc is not None:
        dists["tau_per_request"] = _cap(np.asarray(acc.tau_per_request), cap)
        if acc.histogram:
            dists["accepted_per_step_histogram"] = [float(c) for c in acc.histogram]
    return window, dists


def _n_meeting_slo(r: _Requests, done: np.ndarray, slo: dict[str, float]) -> int:
    """Completed requests meeting every bound of `slo` (meets_slo's rule: a bound on a value the
    request does not have is met)."""
    ok = done.copy()
    for key, bound in slo.items():
        if key == "itl_ms":
            per_req = np.bincount(r.msg_req, minlength=len(done))
            ends = np.cumsum(per_req)
            for i in np.flatnonzero(ok):
                at = slice(int(ends[i] - per_req[i]), int(ends[i]))  # the request's messages (sorted by request)
                later = ~r.first[at]
                tok = r.msg_tok[at][later]
                itl = np.repeat(r.gap_ms[at][later] / tok, tok)
                if itl.size and float(np.mean(itl)) > bound:
                    ok[i] = False
            continue
        values = {"ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "e2el_ms": r.e2el_ms}[key]
        with np.errstate(invalid="ignore"):
            ok &= ~(values > bound)  # NaN (no value) is not above the bound
    return int(ok.sum())


def _cap(values: np.ndarray, cap: int) -> list[float]:
    """At most `cap` values: when there are more, the sorted values at `cap` evenly spaced
    ranks (quantile sampling: keeps min, max and the distribution's shape; deterministic)."""
    values = np.asarray(values, dtype=float)
    if len(values) <= cap:
        return values.tolist()
    ordered = np.sort(values)
    idx = np.linspace(0, len(ordered) - 1, cap).round().astype(int)
    return ordered[idx].tolist()


def distributions(logs: list[RequestLog] | LogColumns | LogChunks,
                  cap: int = DISTRIBUTION_CAP) -> dict[str, list[float]]:
    """Per-run sample lists for the run page's histograms, over completed measured requests.

    Returns {"ttft_ms": [...] (one per request), "itl_ms": [...] (one per token, ms/token),
    "icl_ms": [...] (one per gap, ms), "tokens_per_chunk": [...] (one per message)}, and where
    the engine returned per-request spec-decode figures "tau_per_request" (one per request,
    tokens/step) and "accepted_per_step_histogram" (verify steps that accepted exactly i draft
    tokens, summed over requests); each list holds at most `cap` values (quantile-sampled when
    longer, see `_cap`).
    """
    return measure_window(logs, 0, 0, None, cap=cap)[1]


def measure_encoded(data: bytes, window_start_ns: int, window_end_ns: int, slo: dict[str, float] | None = None,
                    cap: int = DISTRIBUTION_CAP) -> tuple[WindowMetrics, dict[str, list[float]]]:
    """`measure_window` of an encoded log blob (benchkit.measure.logs.encode_logs), decoded into
    columns chunk by chunk (LogChunks.decode: a version-2 blob is never decoded whole; a
    version-1 blob is): what recomputing a stored run costs, as one picklable call for a worker
    process. Raises ValueError for a blob decode_columns refuses."""
    return measure_window(LogChunks.decode(data), window_start_ns, window_end_ns, slo, cap)


def measure_encoded_batch(items: list[tuple[bytes, int, int, dict[str, float] | None]],
                          cap: int = DISTRIBUTION_CAP) -> list[tuple[WindowMetrics, dict[str, list[float]]]]:
    """`measure_encoded` of each (blob, window start ns, window end ns, slo), in order: one task
    for a worker process (Django-free, so a spawned worker imports only benchkit and numpy)."""
    return [measure_encoded(data, start, end, slo, cap) for data, start, end, slo in items]




def coalesced_share(logs: list[RequestLog] | LogColumns | LogChunks, gap_ms: float = COALESCED_GAP_MS) -> float | None:
    """Share (0..1) of the ICL gaps (between consecutive token-carrying messages of completed,
    measured requests) shorter than `gap_ms` (ms, default 0.1): how often several messages
    arrived in one read. None when there are no gaps (every request had one message).

    Source: MEASUREMENT.md, "Coalesced arrivals". Pure; warmup logs are ignored.
    """
    sc = _scan(_chunks(logs), 0, None, None, gap_ms)
    return sc.n_coalesced / sc.n_decode if sc.n_decode else None


def mean_decode_tokens_per_chunk(logs: list[RequestLog] | LogColumns | LogChunks) -> float | None:
    """The client's estimate of acceptance length tau (tokens per target step): the mean tokens
    per token-carrying message over completed, measured requests, leaving out each request's
    FIRST message, which comes from prefill (one token, no draft step). Keeping it, as
    MEASUREMENT.md's plain "mean tokens per chunk" does, biases the estimate low by up to
    1 / (messages per request), enough to flag a sound short-output run. None without decode
    messages. Coalesced arrivals (several steps in one read) bias it high.
    """
    sc = _scan(_chunks(logs), 0, None, None)
    return sc.decode_tokens / sc.n_decode if sc.n_decode else None
