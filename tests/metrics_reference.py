"""The pure-Python metric and log-decoding code as it was at commit 74508a7 (and the two functions
h-stream added on top of it), kept unchanged as a
reference: tests/test_metrics_columns.py checks that the column (numpy) implementation in
benchkit.measure gives the identical figures, and benchmarks/recompute_speed.py times
`manage.py recompute_metrics` against this path ("today's ~138 ms per run", issue 9).

Not used by the product. Definitions: docs MEASUREMENT.md, as in benchkit.measure.metrics.
"""
# ruff: noqa

from __future__ import annotations

import json
import zlib

import numpy as np

from benchkit.measure.logs import KINDS, MessageEvent, RequestLog, _COLUMNS

FORMAT_VERSION = 1  # the layout this reference decodes (benchkit.measure.logs.encode_logs_v1)
from benchkit.measure.metrics import (
    DISTRIBUTION_CAP, NS_PER_MS, NS_PER_S, SLO_KEYS, RequestMetrics, WindowMetrics, latency_stats,
)

_TOKEN_KINDS = ("reasoning", "content")

def decode_logs(data: bytes) -> list[RequestLog]:
    """Decode bytes written by `encode_logs` back into the identical list of RequestLog.

    Raises ValueError naming the problem when the bytes are not zlib data, not JSON, of an
    unknown format version, or when a column is missing or has the wrong length.
    """
    try:
        doc = json.loads(zlib.decompress(data).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"request logs: not an encoded log blob ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise ValueError(f"request logs: unsupported format version {version!r} (expected {FORMAT_VERSION})")
    missing = [c for c in _COLUMNS if not isinstance(doc.get(c), list)]
    if missing:
        raise ValueError(f"request logs: missing column(s) {', '.join(missing)}")
    n = len(doc["index"])
    for c in _COLUMNS[:12]:
        if len(doc[c]) != n:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n}")
    n_ev = sum(doc["n_events"])
    for c in ("ev_dt_ns", "ev_tokens", "ev_kind"):
        if len(doc[c]) != n_ev:
            raise ValueError(f"request logs: column {c!r} has {len(doc[c])} entries, expected {n_ev}")
    logs: list[RequestLog] = []
    pos = 0
    for i in range(n):
        send_ns = doc["send_ns"][i]
        events = []
        t = send_ns
        for j in range(pos, pos + doc["n_events"][i]):
            t += doc["ev_dt_ns"][j]
            code = doc["ev_kind"][j]
            if not isinstance(code, int) or not 0 <= code < len(KINDS):
                raise ValueError(f"request logs: request {i}: bad event kind code {code!r}")
            events.append(MessageEvent(t_ns=t, tokens=doc["ev_tokens"][j], kind=KINDS[code]))
        pos += doc["n_events"][i]
        logs.append(
            RequestLog(
                index=doc["index"][i],
                warmup=bool(doc["warmup"][i]),
                send_ns=send_ns,
                events=events,
                ok=bool(doc["ok"][i]),
                error=doc["error"][i],
                prompt_tokens=doc["prompt_tokens"][i],
                completion_tokens=doc["completion_tokens"][i],
                tokens_from_text=bool(doc["tokens_from_text"][i]),
                input_len=doc["input_len"][i],
                output_len=doc["output_len"][i],
                end_ns=send_ns + doc["end_dns"][i],
            )
        )
    return logs

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
        mean_decode_tokens_per_chunk=mean_decode_tokens_per_chunk(logs),
        coalesced_share=coalesced_share(logs),
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


# --- added to main after 74508a7 (h-stream), kept here as they were written -------------------

def coalesced_share(logs, gap_ms=0.1):
    gaps = [g for rm in (request_metrics(log) for log in _measured(logs)) if rm.completed for g in rm.icl_ms]
    if not gaps:
        return None
    return sum(1 for g in gaps if g < gap_ms) / len(gaps)


def mean_decode_tokens_per_chunk(logs):
    chunks = [t for rm in (request_metrics(log) for log in _measured(logs)) if rm.completed
              for t in rm.tokens_per_chunk[1:]]
    return sum(chunks) / len(chunks) if chunks else None
