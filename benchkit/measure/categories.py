"""A run's figures cut by prompt category (issue 33): pure functions of the request logs and the
measured window, like every metric (docs/MEASUREMENT.md, "Raw data first").

Each request keeps its prompt's category (`RequestLog.category`, stored in the log blob:
benchkit.measure.logs). `category_figures` splits the measured requests by category and computes
each category's figures with the run's own definitions: `benchkit.measure.metrics.measure_window`
over that category's requests (so TTFT, TPOT, ITL, the output tokens and the acceptance lengths
are exactly the per-request definitions of `_requests` / `request_metrics`, and the per-request
speculative figures are `benchkit.measure.specrequests.acceptance_from`'s), over the run's window.

Where acceptance comes from: only the engine's per-request speculative-decoding figures
(`spec_*` fields: vLLM `--per-request-spec-decode-metrics`, SGLang `spec_tokens_details`) are
exact per category; the server's Prometheus counters are pooled over the whole window and cannot
be cut by category. Without per-request figures the tau fields are None, and the only estimate
given is the client's `mean_decode_tokens_per_chunk` (tokens per streamed message after the
first), which coalesced arrivals bias upwards and a server that streams one token per message
biases to 1 (MEASUREMENT.md, "Coalesced arrivals").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchkit.measure.logs import LogColumns, RequestLog, columns_of
from benchkit.measure.metrics import DISTRIBUTION_CAP, measure_window


@dataclass(frozen=True)
class CategoryFigures:
    """One category's figures over the run's measured window.

    `category` ("" for prompts without one); `requests` (measured requests of the category),
    `completed`, `failed`; `median_ttft_ms`, `median_tpot_ms` (request-weighted, ms; ms/token),
    `median_itl_ms` (token-weighted, ms/token), None without samples; `output_tokens` (tokens of
    the completed requests); `output_throughput_tok_s` (those tokens / the run's window, tok/s:
    the category's part of the run's output tok/s); `output_share` (the category's tokens / all
    categories' tokens, 0..1; None when the run produced none); `tau_request_weighted`,
    `tau_token_weighted` (tokens per verify step, from the per-request spec figures; None where
    no request of the category reported one), `spec_requests` (requests that did);
    `acceptance_per_position` (index p - 1: the share of verify steps that accepted at least p
    draft tokens, p = 1..K, from the summed accepted-per-step histograms; the counters'
    accepted_per_pos[p] / drafts; None without histograms); `mean_decode_tokens_per_chunk` (the
    client's estimate of acceptance length, tokens per message after each request's first;
    biased, module docstring)."""

    category: str
    requests: int
    completed: int
    failed: int
    median_ttft_ms: float | None
    median_tpot_ms: float | None
    median_itl_ms: float | None
    output_tokens: int
    output_throughput_tok_s: float
    output_share: float | None
    tau_request_weighted: float | None
    tau_token_weighted: float | None
    spec_requests: int
    acceptance_per_position: list[float] | None
    mean_decode_tokens_per_chunk: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def per_position(histogram: list[int] | None) -> list[float] | None:
    """Acceptance per draft position from an accepted-per-step histogram (`histogram[j]`: verify
    steps that accepted exactly j draft tokens): index p - 1 is sum(histogram[p:]) / sum(histogram),
    p = 1..len(histogram) - 1. None for no histogram or no steps."""
    if not histogram or sum(histogram) == 0:
        return None
    h = np.asarray(histogram, dtype=np.int64)
    at_least = np.cumsum(h[::-1])[::-1]  # at_least[p] = steps accepting >= p draft tokens
    return (at_least[1:] / h.sum()).tolist()


def category_figures(logs: list[RequestLog] | LogColumns, window_start_ns: int,
                     window_end_ns: int) -> list[CategoryFigures]:
    """The figures of each category of the run's measured requests (CategoryFigures), in sorted
    category order; categories with only warmup requests are left out. `logs`: the run's
    RequestLogs or their LogColumns (e.g. `decode_columns(blob)`); the window in perf_counter ns.
    A run without categories gives one entry, category "". Raises ValueError as measure_window does."""
    cols = logs if isinstance(logs, LogColumns) else columns_of(logs)
    names = np.asarray(cols.category_names(), dtype=object)
    parts = []
    for cat in sorted(set(names[~cols.warmup].tolist())):
        window, dists = measure_window(cols.select(names == cat), window_start_ns, window_end_ns, None,
                                       cap=DISTRIBUTION_CAP)
        parts.append((cat, window, dists))
    total = sum(w.total_output_tokens for _, w, _ in parts)
    out = []
    for cat, w, dists in parts:
        hist = dists.get("accepted_per_step_histogram")
        out.append(CategoryFigures(
            category=cat, requests=w.completed + w.failed, completed=w.completed, failed=w.failed,
            median_ttft_ms=w.median_ttft_ms, median_tpot_ms=w.median_tpot_ms, median_itl_ms=w.median_itl_ms,
            output_tokens=w.total_output_tokens, output_throughput_tok_s=w.output_throughput_tok_s,
            output_share=w.total_output_tokens / total if total else None,
            tau_request_weighted=w.acceptance_length_request_weighted,
            tau_token_weighted=w.acceptance_length_token_weighted, spec_requests=w.spec_requests_reported or 0,
            acceptance_per_position=per_position([int(c) for c in hist] if hist else None),
            mean_decode_tokens_per_chunk=w.mean_decode_tokens_per_chunk))
    return out
