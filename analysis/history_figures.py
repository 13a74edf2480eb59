"""Pure figure builders of the history pages (compare, trend, home): plain data in, Plotly figure
dicts out, handed to plotly.js with `json_script`.

Written as plain dicts in Plotly's JSON figure schema (https://plotly.com/javascript/reference/),
not through plotly.graph_objects: building a trend figure of 6 panels with its lines and
annotations through graph_objects' validation took about 700 ms per figure (profiled: add_vline
and property validation), the dict is built in about a millisecond. Kept apart from
analysis/figures.py (the sweep page's figures) so the two pages evolve alone.
"""

from __future__ import annotations

from typing import Any

from analysis.display import is_known, lengths_text, workload_text
from benchkit.compare.sweepdiff import BETTER, SAME, WORSE, PointDiff
from benchkit.point import SPEED_FIELD

VERDICT_COLOURS = {WORSE: "#dc2626", BETTER: "#16a34a", SAME: "#6b7280"}
#: plotly's D3 then Set2 qualitative palettes (plotly.colors.qualitative), one colour per configuration.
PALETTE = ["#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F", "#BCBD22",
           "#17BECF", "#66C2A5", "#FC8D62", "#8DA0CB", "#E78AC3", "#A6D854", "#FFD92F", "#E5C494", "#B3B3B3"]
_FONT = {"family": "system-ui, sans-serif", "size": 12, "color": "#222"}
_AXIS = {"gridcolor": "#e5e7eb", "zerolinecolor": "#d1d5db", "linecolor": "#d1d5db", "automargin": True}
CHANGE_COLOUR = "#7c3aed"


def colour_of(labels: list[str]) -> dict[str, str]:
    """A stable colour per configuration label (sorted, so `auto` and `linear` keep theirs)."""
    return {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(sorted(labels))}


def _lengths(input_len: Any, output_len: Any) -> str:
    """ "128/256 tokens" (input/output), the unit only after a known length: "lengths not in the
    file" when neither is known (was "not in the file tokens")."""
    text = lengths_text(input_len, output_len)
    return text + " tokens" if is_known(input_len) or is_known(output_len) else "lengths " + text


def _axis_name(i: int, axis: str) -> str:
    """Trace axis reference of panel i (1-based): x, x2, x3, ..."""
    return axis if i == 1 else f"{axis}{i}"


def _grid(rows: int, cols: int, titles: list[str], hgap: float = 0.04, vgap: float = 0.1) -> dict[str, Any]:
    """Layout entries of a rows x cols panel grid (what plotly's make_subplots writes): one x and
    one y axis per panel, panel i = (row - 1) * cols + col, and the panel titles as annotations."""
    layout: dict[str, Any] = {"annotations": []}
    w = (1 - hgap * (cols - 1)) / cols
    h = (1 - vgap * (rows - 1)) / rows
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c + 1
            x0, y1 = c * (w + hgap), 1 - r * (h + vgap)
            layout["xaxis" if i == 1 else f"xaxis{i}"] = {**_AXIS, "domain": [x0, x0 + w],
                                                          "anchor": _axis_name(i, "y")}
            layout["yaxis" if i == 1 else f"yaxis{i}"] = {**_AXIS, "domain": [y1 - h, y1],
                                                          "anchor": _axis_name(i, "x")}
            if i <= len(titles):
                layout["annotations"].append({"text": titles[i - 1], "x": x0 + w / 2, "y": y1, "xref": "paper",
                                              "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                                              "showarrow": False, "font": {"size": 13}})
    return layout


def _base_layout(title: str, height: int, top: int = 60) -> dict[str, Any]:
    return {"title": {"text": title, "x": 0.01, "xanchor": "left", "y": 1, "yref": "container", "yanchor": "top",
                      "pad": {"t": 12}}, "height": height, "font": _FONT,
            "paper_bgcolor": "#fff", "plot_bgcolor": "#fff", "hovermode": "closest",
            "margin": {"l": 70, "r": 20, "t": top, "b": 50}}


def compare_figure(diffs: list[PointDiff], noise_pct: float, old_name: str, new_name: str) -> dict[str, Any]:
    """Strip chart of the change in output tok/s per matched point (%), one panel per TP, one
    row per configuration; one trace per verdict and TP (worse red, better green, no significant
    change grey) so colour and legend say the verdict; error bars give the 95 % bootstrap CI
    where repeats exist; the grey band is the single-run noise threshold (±`noise_pct`)."""
    tps = sorted({d.point.tp for d in diffs}) or [1]
    labels = sorted({d.label for d in diffs}, key=lambda s: (s != "auto", s))
    layout = {**_base_layout(f"Output tok/s: {new_name} vs {old_name}", 150 + 34 * max(len(labels), 3)),
              **_grid(1, len(tps), [f"TP{tp}" for tp in tps]), "shapes": [],
              "legend": {"orientation": "h", "y": -0.3}}
    data = []
    shown: set[str] = set()
    for col, tp in enumerate(tps, start=1):
        for verdict in (WORSE, BETTER, SAME):
            ds = [d for d in diffs if d.verdict == verdict and d.point.tp == tp]
            if not ds:
                continue
            c = [d.changes[SPEED_FIELD] for d in ds]
            trace = {"type": "scatter", "mode": "markers", "name": verdict, "legendgroup": verdict,
                     "showlegend": verdict not in shown, "xaxis": _axis_name(col, "x"), "yaxis": _axis_name(col, "y"),
                     "x": [round(x.change_pct, 2) for x in c], "y": [d.label for d in ds],
                     "marker": {"color": VERDICT_COLOURS[verdict], "size": 10, "opacity": 0.85},
                     "text": [f"{d.label} · TP{tp} · concurrency {workload_text(d.point.concurrency)} · "
                              f"{_lengths(d.point.input_len, d.point.output_len)} · runs "
                              f"{','.join(map(str, d.old_run_ids))} → {','.join(map(str, d.new_run_ids))}"
                              for d in ds],
                     "hovertemplate": "%{text}<br>output tok/s %{x:+.1f} %<extra>" + verdict + "</extra>"}
            if any(x.ci95_pct for x in c):
                trace["error_x"] = {"type": "data", "symmetric": False, "visible": True,
                                    "array": [(x.ci95_pct[1] - x.change_pct) if x.ci95_pct else None for x in c],
                                    "arrayminus": [(x.change_pct - x.ci95_pct[0]) if x.ci95_pct else None
                                                   for x in c]}
            data.append(trace)
            shown.add(verdict)
        xa, ya = _axis_name(col, "x"), _axis_name(col, "y")
        layout["shapes"] += [
            {"type": "rect", "xref": xa, "yref": f"{ya} domain", "x0": -noise_pct, "x1": noise_pct, "y0": 0, "y1": 1,
             "fillcolor": "#9ca3af", "opacity": 0.15, "line": {"width": 0}, "layer": "below"},
            {"type": "line", "xref": xa, "yref": f"{ya} domain", "x0": 0, "x1": 0, "y0": 0, "y1": 1,
             "line": {"color": "#9ca3af", "dash": "dot", "width": 1}},
        ]
        key = "xaxis" if col == 1 else f"xaxis{col}"
        layout[key].update(title={"text": "output tok/s change (%)"}, ticksuffix="%")
        ykey = "yaxis" if col == 1 else f"yaxis{col}"
        layout[ykey].update(type="category", categoryorder="array", categoryarray=labels[::-1],
                            **({} if col == 1 else {"matches": "y", "showticklabels": False}))
    return {"data": data, "layout": layout}


def trend_figure(title: str, yaxis: str, cells: dict[tuple[int, int], dict[str, list[tuple[str, float, str]]]],
                 tps: list[int], concurrencies: list[int], colours: dict[str, str],
                 flags: list[dict[str, Any]], changes: list[dict[str, Any]]) -> dict[str, Any]:
    """Lines over the nights, one panel per (concurrency row, TP column), one line per
    configuration (legend grouped: one entry per configuration), x axes shared.

    `cells[(concurrency, tp)][label]`: [(night ISO time, value, hover text)]. `flags`: markers
    {x, y, concurrency, tp, text, open} drawn as a "regression flag" trace (open, red X) and an
    "acknowledged flag" trace (grey) in their panel. `changes`: {x, text} drawn as a dotted
    vertical line across every panel, with the text once above the grid (hardware, driver,
    engine changes).
    """
    rows, cols = max(len(concurrencies), 1), max(len(tps), 1)
    titles = [f"TP{tp} · concurrency {workload_text(c)}" for c in concurrencies for tp in tps]
    layout = {**_base_layout(title, 170 + 250 * rows, top=110), **_grid(rows, cols, titles, vgap=0.16 / rows),
              "legend": {"orientation": "h", "y": -0.06 - 0.05 / rows}, "shapes": []}
    data: list[dict[str, Any]] = []
    seen: set[str] = set()

    def panel(r: int, c: int) -> int:
        return (r - 1) * cols + c

    for r, conc in enumerate(concurrencies, start=1):
        for c, tp in enumerate(tps, start=1):
            i = panel(r, c)
            for label, pts in sorted(cells.get((conc, tp), {}).items(), key=lambda kv: (kv[0] != "auto", kv[0])):
                data.append({"type": "scatter", "mode": "lines+markers", "name": label, "legendgroup": label,
                             "showlegend": label not in seen, "xaxis": _axis_name(i, "x"),
                             "yaxis": _axis_name(i, "y"), "x": [p[0] for p in pts], "y": [round(p[1], 4) for p in pts],
                             "text": [p[2] for p in pts], "line": {"color": colours.get(label), "width": 1.5},
                             "marker": {"size": 4}, "hovertemplate": "%{text}<extra>" + label + "</extra>"})
                seen.add(label)
    for is_open, name, colour in ((True, "regression flag", "#dc2626"), (False, "acknowledged flag", "#9ca3af")):
        for r, conc in enumerate(concurrencies, start=1):
            for c, tp in enumerate(tps, start=1):
                fs = [f for f in flags if f["open"] == is_open and f["tp"] == tp and f["concurrency"] == conc]
                if not fs:
                    continue
                i = panel(r, c)
                data.append({"type": "scatter", "mode": "markers", "name": name, "legendgroup": name,
                             "showlegend": name not in seen, "xaxis": _axis_name(i, "x"), "yaxis": _axis_name(i, "y"),
                             "x": [f["x"] for f in fs], "y": [f["y"] for f in fs], "text": [f["text"] for f in fs],
                             "marker": {"symbol": "x-thin-open", "size": 18, "color": colour,
                                        "line": {"width": 3, "color": colour}},
                             "hovertemplate": "%{text}<extra>" + name + "</extra>"})
                seen.add(name)
    for k, ch in enumerate(changes):
        for i in range(1, rows * cols + 1):
            layout["shapes"].append({"type": "line", "xref": _axis_name(i, "x"), "yref": f"{_axis_name(i, 'y')} domain",
                                     "x0": ch["x"], "x1": ch["x"], "y0": 0, "y1": 1,
                                     "line": {"color": CHANGE_COLOUR, "dash": "dot", "width": 1}})
        layout["annotations"].append({"text": ch["text"], "x": ch["x"], "xref": "x", "y": 1, "yref": "paper",
                                      "yshift": 24 + 16 * (k % 2), "xanchor": "left", "yanchor": "bottom",
                                      "showarrow": False, "font": {"size": 11, "color": CHANGE_COLOUR},
                                      "bgcolor": "rgba(255,255,255,0.85)"})
    for i in range(1, rows * cols + 1):
        layout["xaxis" if i == 1 else f"xaxis{i}"].update(type="date", **({} if i == 1 else {"matches": "x"}))
        layout["yaxis" if i == 1 else f"yaxis{i}"].update(rangemode="tozero")
    for r in range(rows):
        i = r * cols + 1
        layout["yaxis" if i == 1 else f"yaxis{i}"]["title"] = {"text": yaxis}
    return {"data": data, "layout": layout}


def flags_figure(flags: list[dict[str, Any]]) -> dict[str, Any]:
    """Horizontal bars: change vs baseline (%) of each open regression flag, labelled
    `series · configuration · TP · concurrency`, worst at the top."""
    flags = sorted(flags, key=lambda f: f["change_pct"], reverse=True)
    layout = {**_base_layout("Open regression flags (change vs the rolling median)", 130 + 30 * max(len(flags), 1)),
              "showlegend": False, "xaxis": {**_AXIS, "ticksuffix": "%", "title": {"text": "change (%)"}},
              "yaxis": {**_AXIS, "type": "category"}}
    return {"data": [{"type": "bar", "orientation": "h", "name": "open regression flags",
                      "x": [round(f["change_pct"], 2) for f in flags], "y": [f["name"] for f in flags],
                      "marker": {"color": "#dc2626"}, "text": [f"{f['change_pct']:+.1f}%" for f in flags],
                      "textposition": "auto",
                      "customdata": [[f["night"], f["baseline"], f["value"]] for f in flags],
                      "hovertemplate": "%{y}<br>%{customdata[0]}: %{customdata[2]:.1f} vs rolling median "
                                       "%{customdata[1]:.1f}<extra></extra>"}],
            "layout": layout}
