"""Pure figure builders: query results in, Plotly figure dicts out (JSON-ready).

Each function takes plain dicts (see runs.selectors.point_from_run) and returns
`{"data": [...], "layout": {...}}` built with plotly.graph_objects and serialised through
plotly's own JSON encoder; templates hand it to plotly.js with `json_script`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np
import plotly.graph_objects as go

from benchkit.compare.speedups import SPEED_FIELD, Speedup
from benchkit.measure.metrics import METRICS

_LAYOUT = dict(margin=dict(l=60, r=20, t=50, b=60), template="plotly_white", height=380)


def _to_dict(fig: go.Figure) -> dict[str, Any]:
    return json.loads(fig.to_json())


def _series_name(tp: int, concurrency: int | None) -> str:
    return f"TP{tp} · concurrency {'not in the file' if concurrency is None else concurrency}"


def speedup_figure(speedups: list[Speedup], points_by_run: dict[int, dict]) -> dict[str, Any]:
    """Grouped bars: speedup vs the matched `auto` baseline per method, one trace per
    (TP, concurrency). Configurations without a baseline are left out (no number shown).
    Error bars show the 95 % bootstrap interval where both sides have >= 3 repeats; other
    bars have none and their hover text says "single run" or the repeat count."""
    traces: dict[tuple, dict[str, list]] = defaultdict(lambda: {"x": [], "y": [], "lo": [], "hi": [], "text": []})
    for sp in sorted(speedups, key=lambda s: (s.config[0] != "auto", s.label)):
        if sp.value is None:
            continue
        p = points_by_run[sp.run_ids[0]]
        t = traces[(p["tp"], p["concurrency"])]
        t["x"].append(sp.label)
        t["y"].append(round(sp.value, 4))
        if sp.ci95:
            t["lo"].append(sp.value - sp.ci95[0])
            t["hi"].append(sp.ci95[1] - sp.value)
            spread = f"95% CI {sp.ci95[0]:.2f}-{sp.ci95[1]:.2f}, {sp.n_repeats} repeats"
        else:
            t["lo"].append(None)
            t["hi"].append(None)
            spread = "single run" if sp.n_repeats == 1 else f"{sp.n_repeats} repeats (median; CI needs 3)"
        t["text"].append(f"{sp.value:.2f}x vs run {', '.join(map(str, sp.baseline_run_ids))} ({spread})")
    fig = go.Figure()
    for (tp, conc), t in sorted(traces.items()):
        has_ci = any(v is not None for v in t["hi"])
        fig.add_bar(name=_series_name(tp, conc), x=t["x"], y=t["y"], hovertext=t["text"],
                    error_y=dict(type="data", symmetric=False, array=t["hi"], arrayminus=t["lo"], visible=has_ci))
    fig.update_layout(title="Speedup vs autoregressive (output tok/s ratio)", barmode="group",
                      yaxis_title="speedup (x)", xaxis_title="decoding method", **_LAYOUT)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    return _to_dict(fig)


def throughput_figure(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Lines: output tok/s vs concurrency, one line per (method, TP); repeats as median; points
    whose output tok/s or concurrency is unknown (an imported file that does not say) are left
    out, never drawn at "concurrency 0"."""
    series: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if p[SPEED_FIELD] is not None and p["concurrency"] is not None:
            series[(p["label"], p["tp"])][p["concurrency"]].append(p[SPEED_FIELD])
    fig = go.Figure()
    for (label, tp), by_c in sorted(series.items()):
        cs = sorted(by_c)
        fig.add_scatter(name=f"{label} · TP{tp}", x=cs, y=[float(np.median(by_c[c])) for c in cs],
                        mode="lines+markers")
    fig.update_layout(title="Output throughput vs concurrency", xaxis_title="concurrent requests",
                      yaxis_title=METRICS[SPEED_FIELD].header, **_LAYOUT)
    fig.update_xaxes(type="category")
    return _to_dict(fig)


def acceptance_figure(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars: mean acceptance length tau per speculative method (server counters), with the
    client's mean tokens per chunk beside it as a cross-check. Methods without drafts
    (auto) have no tau and are left out."""
    taus: dict[str, list[float]] = defaultdict(list)
    chunks: dict[str, list[float]] = defaultdict(list)
    for p in points:
        if p["acceptance_length"] is None:
            continue
        taus[p["label"]].append(p["acceptance_length"])
        if p["mean_tokens_per_chunk"] is not None:
            chunks[p["label"]].append(p["mean_tokens_per_chunk"])
    labels = sorted(taus)
    fig = go.Figure()
    tau, chunk = METRICS["acceptance_length"], METRICS["mean_tokens_per_chunk"]
    fig.add_bar(name=f"{tau.label} (server counters)", x=labels, y=[float(np.mean(taus[lab])) for lab in labels])
    fig.add_bar(name=f"{chunk.label} (client)", x=labels,
                y=[float(np.mean(chunks[lab])) if chunks[lab] else None for lab in labels])
    fig.update_layout(title="Acceptance length per method", barmode="group", yaxis_title=tau.unit, **_LAYOUT)
    return _to_dict(fig)


def distribution_figure(values: list[float], title: str, unit: str) -> dict[str, Any]:
    """Histogram of one run's per-request or per-token samples (e.g. TTFT ms, ITL ms/token)."""
    fig = go.Figure()
    fig.add_histogram(x=values, nbinsx=50, name=title)
    fig.update_layout(title=title, xaxis_title=unit, yaxis_title="count", showlegend=False, **_LAYOUT)
    return _to_dict(fig)


_LINK_SCORE = {"X": 5, "NV": 4, "PIX": 3, "PXB": 2.5, "PHB": 2, "NODE": 1, "SYS": 0}


def topology_figure(gpus: list[str], links: dict[tuple[int, int], str]) -> dict[str, Any]:
    """Coloured grid of the GPU-to-GPU topology matrix (`nvidia-smi topo -m` link types).

    Colour encodes link quality: NV# (NVLink) > PIX > PXB > PHB > NODE > SYS (crosses sockets)."""
    n = len(gpus)
    z, text = [], []
    for i in range(n):
        row, trow = [], []
        for j in range(n):
            link = links.get((i, j), "X" if i == j else "")
            key = "NV" if link.startswith("NV") else link
            row.append(_LINK_SCORE.get(key))
            trow.append(link)
        z.append(row)
        text.append(trow)
    fig = go.Figure(go.Heatmap(z=z, x=gpus, y=gpus, text=text, texttemplate="%{text}", colorscale="Viridis",
                               showscale=False, zmin=0, zmax=5))
    fig.update_layout(title="GPU topology", yaxis_autorange="reversed", **{**_LAYOUT, "height": 120 + 45 * n})
    return _to_dict(fig)
