"""Pure figure builders of the history pages (compare, trend, home): plain data in, Plotly figure
dicts out (JSON-ready, through plotly's own encoder), handed to plotly.js with `json_script`.

Kept apart from analysis/figures.py (the sweep page's figures) so the two pages evolve alone.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from benchkit.compare.sweepdiff import BETTER, SAME, WORSE, PointDiff

_LAYOUT = dict(margin=dict(l=70, r=20, t=60, b=50), template="plotly_white")
VERDICT_COLOURS = {WORSE: "#dc2626", BETTER: "#16a34a", SAME: "#6b7280"}
PALETTE = qualitative.D3 + qualitative.Set2


def _to_dict(fig: go.Figure) -> dict[str, Any]:
    return json.loads(fig.to_json())


def colour_of(labels: list[str]) -> dict[str, str]:
    """A stable colour per configuration label (sorted, so `auto` and `linear` keep theirs)."""
    return {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(sorted(labels))}


def compare_figure(diffs: list[PointDiff], noise_pct: float, old_name: str, new_name: str) -> dict[str, Any]:
    """Strip chart of the change in output tok/s per matched point (%), one panel per TP, one
    row per configuration; one trace per verdict (worse / better / no significant change) so
    colour and legend say the verdict; error bars give the 95 % bootstrap CI where repeats
    exist; the grey band is the single-run noise threshold (±`noise_pct`)."""
    tps = sorted({d.fields["tp"] for d in diffs}) or [1]
    labels = sorted({d.label for d in diffs}, key=lambda s: (s != "auto", s))
    fig = make_subplots(rows=1, cols=len(tps), shared_yaxes=True, subplot_titles=[f"TP{tp}" for tp in tps],
                        horizontal_spacing=0.03)
    for verdict in (WORSE, BETTER, SAME):
        for col, tp in enumerate(tps, start=1):
            ds = [d for d in diffs if d.verdict == verdict and d.fields["tp"] == tp]
            if not ds:
                continue
            c = [d.changes["output_throughput_tok_s"] for d in ds]
            has_ci = any(x.ci95_pct for x in c)
            fig.add_scatter(
                x=[round(x.change_pct, 2) for x in c], y=[d.label for d in ds], mode="markers",
                name=verdict, legendgroup=verdict, showlegend=col == 1 or not any(
                    dd.verdict == verdict and dd.fields["tp"] in tps[: col - 1] for dd in diffs),
                marker=dict(color=VERDICT_COLOURS[verdict], size=10, symbol="circle", line=dict(width=0)),
                error_x=dict(type="data", symmetric=False, visible=has_ci,
                             array=[(x.ci95_pct[1] - x.change_pct) if x.ci95_pct else None for x in c],
                             arrayminus=[(x.change_pct - x.ci95_pct[0]) if x.ci95_pct else None for x in c]),
                customdata=[[d.fields["concurrency"], d.fields["output_len"], ",".join(map(str, d.new_run_ids))]
                            for d in ds],
                hovertemplate="%{y} · TP" + str(tp) + " · concurrency %{customdata[0]} · %{customdata[1]} tok"
                              "<br>output tok/s %{x:+.1f} %<br>runs %{customdata[2]}<extra>" + verdict + "</extra>",
                row=1, col=col)
    for col in range(1, len(tps) + 1):
        fig.add_vrect(x0=-noise_pct, x1=noise_pct, fillcolor="#9ca3af", opacity=0.15, line_width=0, row=1, col=col)
        fig.add_vline(x=0, line_color="#9ca3af", line_dash="dot", row=1, col=col)
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], type="category")
    fig.update_xaxes(title_text="output tok/s change (%)", ticksuffix="%")
    fig.update_layout(title=f"Output tok/s: {new_name} vs {old_name}", height=140 + 34 * max(len(labels), 3),
                      legend=dict(orientation="h", y=-0.25), **_LAYOUT)
    return _to_dict(fig)


def trend_figure(title: str, yaxis: str, cells: dict[tuple[int, int], dict[str, list[tuple[str, float, str]]]],
                 tps: list[int], concurrencies: list[int], colours: dict[str, str],
                 flags: list[dict[str, Any]], changes: list[dict[str, Any]]) -> dict[str, Any]:
    """Lines over the nights, one panel per (concurrency row, TP column), one line per
    configuration (legend grouped: one entry per configuration).

    `cells[(concurrency, tp)][label]`: [(night ISO time, value, hover text)]. `flags`: markers
    {x, y, concurrency, tp, text, open} drawn as a "regression flag" trace (open, red X) and an
    "acknowledged flag" trace (grey). `changes`: {x, text} drawn as a dotted vertical line
    across every panel with the text once at the top (hardware, driver, engine changes).
    """
    rows, cols = len(concurrencies) or 1, len(tps) or 1
    fig = make_subplots(rows=rows, cols=cols, shared_xaxes=True, shared_yaxes=False,
                        subplot_titles=[f"TP{tp} · concurrency {c}" for c in concurrencies for tp in tps],
                        vertical_spacing=0.12 / max(rows, 1), horizontal_spacing=0.05)
    seen: set[str] = set()
    for r, conc in enumerate(concurrencies, start=1):
        for c, tp in enumerate(tps, start=1):
            for label, pts in sorted(cells.get((conc, tp), {}).items(), key=lambda kv: (kv[0] != "auto", kv[0])):
                fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], text=[p[2] for p in pts],
                                mode="lines+markers", name=label, legendgroup=label, showlegend=label not in seen,
                                line=dict(color=colours.get(label)), marker=dict(size=5),
                                hovertemplate="%{text}<extra>" + label + "</extra>", row=r, col=c)
                seen.add(label)
    for is_open, name, colour in ((True, "regression flag", "#dc2626"), (False, "acknowledged flag", "#9ca3af")):
        for r, conc in enumerate(concurrencies, start=1):
            for c, tp in enumerate(tps, start=1):
                fs = [f for f in flags if f["open"] == is_open and f["tp"] == tp and f["concurrency"] == conc]
                if not fs:
                    continue
                fig.add_scatter(x=[f["x"] for f in fs], y=[f["y"] for f in fs], text=[f["text"] for f in fs],
                                mode="markers", name=name, legendgroup=name, showlegend=name not in seen,
                                marker=dict(symbol="x-thin-open", size=16, line=dict(width=3, color=colour),
                                            color=colour),
                                hovertemplate="%{text}<extra>" + name + "</extra>", row=r, col=c)
                seen.add(name)
    for ch in changes:
        for r in range(1, rows + 1):
            for c in range(1, cols + 1):
                fig.add_vline(x=ch["x"], line_dash="dot", line_color="#7c3aed", line_width=1, row=r, col=c)
        fig.add_annotation(x=ch["x"], y=1.0, xref="x", yref="paper", text=ch["text"], showarrow=False,
                           xanchor="left", yanchor="bottom", yshift=22 + 14 * (changes.index(ch) % 2),
                           font=dict(size=11, color="#6d28d9"), bgcolor="rgba(255,255,255,0.8)")
    fig.update_yaxes(title_text=yaxis, col=1, rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title=dict(text=title, y=0.995, yanchor="top"), height=150 + 260 * rows,
                      legend=dict(orientation="h", y=-0.08 - 0.04 / rows), hovermode="closest",
                      **{**_LAYOUT, "margin": dict(l=70, r=20, t=110, b=60)})
    return _to_dict(fig)


def flags_figure(flags: list[dict[str, Any]]) -> dict[str, Any]:
    """Horizontal bars: change vs baseline (%) of each open regression flag, labelled
    `series · configuration · TP · concurrency`, worst first (at the top)."""
    flags = sorted(flags, key=lambda f: f["change_pct"], reverse=True)
    fig = go.Figure()
    fig.add_bar(x=[round(f["change_pct"], 2) for f in flags], y=[f["name"] for f in flags], orientation="h",
                name="open regression flags", marker_color="#dc2626", text=[f"{f['change_pct']:+.1f}%" for f in flags],
                textposition="auto", customdata=[[f["night"], f["baseline"], f["value"]] for f in flags],
                hovertemplate="%{y}<br>%{customdata[0]}: %{customdata[2]:.1f} vs rolling median "
                              "%{customdata[1]:.1f}<extra></extra>")
    fig.update_layout(title="Open regression flags (change vs the rolling median)", showlegend=False,
                      height=150 + 36 * max(len(flags), 1), xaxis=dict(ticksuffix="%", title="change (%)"),
                      yaxis=dict(automargin=True), **_LAYOUT)
    return _to_dict(fig)
