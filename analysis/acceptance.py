"""The run page's per-request acceptance (issue 20, "Acceptance per request"): request- and
token-weighted tau, how per-request tau is spread and the accepted-per-step histogram, from the
stored metrics (benchkit.measure.specrequests, computed with the window's metrics); no queries.

Unknown stays unknown: a run whose engine returned no per-request figures shows why, never 0.
"""

from __future__ import annotations

from typing import Any

from analysis import figures


def histogram_figure(counts: list[float]) -> dict[str, Any]:
    """Bar figure of verify steps that accepted exactly i draft tokens (i = 0, 1, ...)."""
    total = sum(counts)
    data = [{"type": "bar", "x": list(range(len(counts))), "y": [float(c) for c in counts],
             "hovertext": [f"{i} accepted: {c:.0f} steps ({c / total:.1%})" if total else f"{i}: {c:.0f}"
                           for i, c in enumerate(counts)], "hoverinfo": "text", "marker": {"color": "#4c78a8"},
             "name": "steps"}]
    mean = sum(i * c for i, c in enumerate(counts)) / total if total else 0.0
    return figures._figure(data, figures._layout(300, top=20, showlegend=False,
                                                 xaxis={"title": {"text": "draft tokens accepted in the step"},
                                                        "dtick": 1},
                                                 yaxis={"title": {"text": "verify steps"}}),
                           "Accepted draft tokens per verify step (summed over requests)",
                           f"{total:.0f} verify steps; mean {mean:.3f} accepted per step (tau = 1 + mean)")


def acceptance_section(run, m) -> dict[str, Any]:
    """{"known": bool, "request_weighted", "token_weighted", "requests", "counters" (the server
    counters' tau), "gap_pct" (token-weighted vs counters, %), "note" (why unknown), "figures":
    {key: figure}} of a run's metrics row (None: no metrics)."""
    out: dict[str, Any] = {"known": False, "figures": {}, "note": ""}
    if m is None:
        out["note"] = "no metrics"
        return out
    if run.method == "auto":
        out["note"] = "autoregressive: no speculative decoding"
        return out
    rw, tw = m.acceptance_length_request_weighted, m.acceptance_length_token_weighted
    counters = m.acceptance_length
    out.update(request_weighted=rw, token_weighted=tw, requests=m.spec_requests_reported, counters=counters)
    if rw is None and tw is None:
        out["note"] = ("unknown: the engine returned no per-request spec-decode figures (vLLM needs the server flag "
                       "--per-request-spec-decode-metrics summary; SGLang returns spec_tokens_details)")
        return out
    out["known"] = True
    if tw is not None and counters:
        out["gap_pct"] = 100.0 * (tw - counters) / counters
    d = m.distributions or {}
    if d.get("tau_per_request"):
        out["figures"]["tau_per_request"] = figures.distribution_figure(
            d["tau_per_request"], "Acceptance length per request (tau_i = 1 + accepted / verify steps)", "tokens/step")
    if d.get("accepted_per_step_histogram"):
        out["figures"]["accepted_per_step"] = histogram_figure(d["accepted_per_step_histogram"])
    return out
