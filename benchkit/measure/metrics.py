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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from benchkit.measure.logs import RequestLog

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

#: SLO keys accepted by goodput: upper bounds in ms. `itl_ms` bounds the request's own mean ITL.
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")

#: Latency metrics that get a full statistics block in `RunMetrics.to_flat`.
STAT_METRICS = ("ttft", "tpot", "itl", "icl", "e2el")
#: The six statistics of each latency metric, in `to_flat` key order.
STAT_NAMES = ("mean", "median", "std", "p90", "p95", "p99")
#: Every key of `RunMetrics.to_flat()`, in order (import/export use this list).
FLAT_KEYS: tuple[str, ...] = (
    "completed",
    "failed",
    "error_rate",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "goodput",
    "mean_tokens_per_chunk",
    "output_tokens_from_text",
) + tuple(f"{s}_{m}_ms" for m in STAT_METRICS for s in STAT_NAMES)

#: At most this many values per list in `distributions`.
DISTRIBUTION_CAP = 5000

_TOKEN_KINDS = ("reasoning", "content")


@dataclass
class LatencyStats:
    """Summary of latency samples, all in ms: mean, median, std (population, ddof=0) and the
    90th/95th/99th percentiles (numpy linear interpolation)."""

    mean: float
    median: float
    std: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, samples_ms: list[float] | np.ndarray) -> LatencyStats | None:
        """Statistics of `samples_ms` (ms), or None when there are no samples."""
        arr = np.asarray(samples_ms, dtype=float)
        if arr.size == 0:
            return None
        p90, p95, p99 = np.percentile(arr, [90, 95, 99])
        return cls(
            mean=float(arr.mean()),
            median=float(np.median(arr)),
            std=float(arr.std()),
            p90=float(p90),
            p95=float(p95),
            p99=float(p99),
        )


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


@dataclass
class RunMetrics:
    """Metrics of one run's measured window (docs/MEASUREMENT.md, "Per run").

    Counts: `completed`, `failed` (measured requests only). `duration_s`: window length (s).
    Tokens: `total_input_tokens` (prompt tokens of completed requests, server counts where
    given), `total_output_tokens` (sum of n over completed). Rates over the window:
    `request_throughput` (req/s), `output_throughput` (tok/s), `total_token_throughput`
    (input + output tok/s), `max_output_tokens_per_s` (peak of per-second buckets, tok/s),
    `goodput` (completed requests meeting every SLO per second; None without an SLO).
    `mean_tokens_per_chunk` (tokens; None without chunks). `output_tokens_from_text`: some
    completed request's n or per-message token counts came from the client, not the server.
    Latency blocks (`LatencyStats`, ms; None without samples): `ttft`, `tpot`, `e2el`
    request-weighted; `itl` token-weighted (each token one sample); `icl` chunk-weighted.
    """

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    goodput: float | None
    mean_tokens_per_chunk: float | None
    output_tokens_from_text: bool
    ttft: LatencyStats | None = None
    tpot: LatencyStats | None = None
    itl: LatencyStats | None = None
    icl: LatencyStats | None = None
    e2el: LatencyStats | None = None

    @property
    def error_rate(self) -> float:
        """failed / (completed + failed); 0.0 for a run without measured requests."""
        total = self.completed + self.failed
        return self.failed / total if total else 0.0

    def to_flat(self) -> dict[str, Any]:
        """Flat dict in the `vllm bench serve --save-result` key layout plus draftboard keys.

        Keys: completed, failed, error_rate, duration (s), total_input_tokens,
        total_output_tokens, request_throughput, output_throughput, total_token_throughput,
        max_output_tokens_per_s, goodput, mean_tokens_per_chunk, output_tokens_from_text, and
        for X in ttft, tpot, itl, icl, e2el: mean_X_ms, median_X_ms, std_X_ms, p90_X_ms,
        p95_X_ms, p99_X_ms (None when there were no samples). Inverse: `from_flat`.
        """
        flat: dict[str, Any] = {
            "completed": self.completed,
            "failed": self.failed,
            "error_rate": self.error_rate,
            "duration": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "goodput": self.goodput,
            "mean_tokens_per_chunk": self.mean_tokens_per_chunk,
            "output_tokens_from_text": self.output_tokens_from_text,
        }
        for name in STAT_METRICS:
            stats = getattr(self, name)
            for f in fields(LatencyStats):
                flat[f"{f.name}_{name}_ms"] = getattr(stats, f.name) if stats is not None else None
        return flat

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> RunMetrics:
        """Rebuild from `to_flat` output (extra keys are ignored; `error_rate` is derived).

        Raises ValueError naming the first missing key. A statistics block whose six values are
        all None becomes None.
        """
        scalar = {
            "completed": "completed",
            "failed": "failed",
            "duration_s": "duration",
            "total_input_tokens": "total_input_tokens",
            "total_output_tokens": "total_output_tokens",
            "request_throughput": "request_throughput",
            "output_throughput": "output_throughput",
            "total_token_throughput": "total_token_throughput",
            "max_output_tokens_per_s": "max_output_tokens_per_s",
            "goodput": "goodput",
            "mean_tokens_per_chunk": "mean_tokens_per_chunk",
            "output_tokens_from_text": "output_tokens_from_text",
        }
        kwargs: dict[str, Any] = {}
        for attr, key in scalar.items():
            if key not in flat:
                raise ValueError(f"run metrics: missing key {key!r}")
            kwargs[attr] = flat[key]
        for name in STAT_METRICS:
            values = {}
            for f in fields(LatencyStats):
                key = f"{f.name}_{name}_ms"
                if key not in flat:
                    raise ValueError(f"run metrics: missing key {key!r}")
                values[f.name] = flat[key]
            kwargs[name] = None if all(v is None for v in values.values()) else LatencyStats(**values)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Nested dict (`dataclasses.asdict`)."""
        return asdict(self)


def _measured(logs: list[RequestLog]) -> list[RequestLog]:
    return [log for log in logs if not log.warmup]


def compute_run_metrics(
    logs: list[RequestLog],
    window_start_ns: int,
    window_end_ns: int,
    slo: dict[str, float] | None = None,
) -> RunMetrics:
    """Compute `RunMetrics` for the measured window [window_start_ns, window_end_ns] (ns).

    Warmup logs are ignored. Throughputs divide by the window length in seconds (0.0 for an
    empty window). Peak output tok/s: every token-carrying message of a completed request puts
    its tokens into the one-second bucket of its arrival, counted from `window_start_ns`;
    the peak is the largest bucket (tok in that second). Goodput uses `slo` (keys in SLO_KEYS,
    ms); None when `slo` is None or empty. Raises ValueError when the window ends before it
    starts or an SLO key is unknown.
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
    goodput = None
    if slo:
        goodput = rate(sum(1 for _, rm in done if meets_slo(rm, slo)))
    return RunMetrics(
        completed=len(done),
        failed=len(per_request) - len(done),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=rate(len(done)),
        output_throughput=rate(total_out),
        total_token_throughput=rate(total_in + total_out),
        max_output_tokens_per_s=float(max(buckets.values())) if buckets else 0.0,
        goodput=goodput,
        mean_tokens_per_chunk=float(np.mean(chunks)) if chunks else None,
        output_tokens_from_text=any(rm.tokens_from_text or not rm.n_from_server for _, rm in done),
        ttft=LatencyStats.of([rm.ttft_ms for _, rm in done]),
        tpot=LatencyStats.of([rm.tpot_ms for _, rm in done if rm.tpot_ms is not None]),
        itl=LatencyStats.of([x for _, rm in done for x in rm.itl_ms]),
        icl=LatencyStats.of([x for _, rm in done for x in rm.icl_ms]),
        e2el=LatencyStats.of([rm.e2el_ms for _, rm in done]),
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
