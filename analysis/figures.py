"""Pure figure builders: query results in, Plotly figure dicts out (JSON-ready).

Each builder takes plain data (points, benchkit.point.Point, as runs.selectors.figure_points loads
them; Speedups and step costs, benchkit.compare.speedups) and returns either a figure `{"data": [...], "layout": {...},
"title": str, "caption": str}` (data and layout in plotly.js's schema; the page prints title
and caption as text above the plot), or `{"empty": reason, "title": str}` when there is nothing
honest to draw (the page then prints the reason instead of empty axes). Templates and the sweep
page's script hand the dicts to plotly.js (json_script or the sweep's JSON endpoint), never
through |safe.

The sweep figures are small multiples along the grid's own dimensions (TP degree, concurrency,
output length, decoding configuration). They are built as plain dicts: plotly.graph_objects
validation and make_subplots cost about 70 ms for a 30-panel figure, more than a page's whole
budget; the browser tests render every figure in plotly.js and read its data back.

Conventions: a configuration is named by its label (benchkit.methods.method_label: `auto`,
`linear`, `b15`, `draft_model k=4`) and keeps one colour in every figure (`config_colours`); rows
and legends list configurations in `config_order`. Every plotted point carries the run ids it
came from in `customdata` (`{"runs": [ids]}`) so the page can link it to its run.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from analysis.display import stated_text, workload_text
from benchkit.compare import verdicts
from benchkit.compare.lossless import MARK, lossless_mark
from benchkit.compare.speedups import DECODE, MIN_REPEATS_FOR_CI, Speedup, compute_speedups
from benchkit.compare.stats import median
from benchkit.methods import config_order as _method_order
from benchkit.point import SPEED_FIELD, Point

#: WindowMetrics fields the sweep figures read (runs.selectors.figure_points loads only these).
POINT_METRICS = (SPEED_FIELD, "median_tpot_ms", "median_ttft_ms", "acceptance_length", "mean_tokens_per_chunk")
#: What the sweep page loads per point: POINT_METRICS and the figures the exclusion rules read
#: (benchkit.compare.verdicts.EXCLUSION_FIGURES).
SWEEP_POINT_FIELDS = tuple(dict.fromkeys((*POINT_METRICS, *verdicts.EXCLUSION_FIGURES)))
#: WindowMetrics fields the throughput figure's other y-axes need (cost is priced from the last
#: two when read: runs.selectors.figure_points with prices).
EFFICIENCY_POINT_FIELDS = ("output_tok_s_per_gpu", "energy_per_output_token_j", "duration_s", "total_output_tokens")
#: The throughput figure's y-axis choices (the sweep page's switch; data.json "throughput_y"):
#: key -> (point field, axis title, hover format, why a point may lack it). Every figure counts
#: OUTPUT tokens only and its axis says so.
THROUGHPUT_Y: dict[str, tuple[str, str, str, str]] = {
    "output_tok_s": (SPEED_FIELD, "output tokens/s", ".1f", "output tok/s unknown"),
    "output_tok_s_per_gpu": ("output_tok_s_per_gpu", "output tokens/s per GPU", ".1f",
                             "recorded before per-GPU figures, or no GPU"),
    "j_per_output_token": ("energy_per_output_token_j", "J per output token", ".3f", "no GPU energy recorded"),
    "usd_per_m_output_tokens": ("cost_usd_per_m_output_tokens", "USD per million output tokens", ".3f",
                                "no GPU-hour price set for its GPU model (admin: GPU prices)"),
}

_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
_PANEL_GAP = 0.06
_CATEGORICAL = ["#e45756", "#54a24b", "#b279a2", "#f58518", "#9d755d", "#eeca3b", "#ff9da6", "#72b7b2"]
_BUDGET_RAMP = ["#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]


def nothing_counted(excluded: Sequence[tuple[Point, str]] = ()) -> str:
    """Why a figure with no point to draw is empty: no counted run at all, or every counted run
    of the selection excluded by the degenerate-point rules (benchkit.compare.verdicts), which
    the page's excluded line names."""
    if not excluded:
        return "No counted runs in this selection."
    n = len({p.run_id for p, _ in excluded})
    return (f"Nothing to draw: {'the' if n == 1 else 'all'} {n} counted run{'s' if n != 1 else ''} of this selection "
            f"{'is' if n == 1 else 'are'} excluded (degenerate figures or suspect timing; the excluded line says why).")


def empty(title: str, reason: str) -> dict[str, Any]:
    """A figure that is not drawn: the page shows `title` and `reason` (why there is no data)."""
    return {"empty": reason, "title": title}


def config_order(p: Point) -> tuple:
    """Sort key of a point's decoding configuration (benchkit.methods.config_order): auto, linear,
    DDTree by budget, then the other methods in the method table's order, each by k, then drafter."""
    return _method_order(p.method, p.num_speculative_tokens, p.tree_budget, p.drafter)


def ordered_labels(points: Iterable[Point]) -> list[str]:
    """The configuration labels among `points`, in `config_order`."""
    first: dict[str, Point] = {}
    for p in points:
        first.setdefault(p.label, p)
    return sorted(first, key=lambda lab: config_order(first[lab]))


def config_colours(points: Iterable[Point]) -> dict[str, str]:
    """{label: colour}: auto dark grey, DDTree budgets a blue ramp (light = small budget), every
    other configuration a distinct categorical colour."""
    first: dict[str, Point] = {}
    for p in points:
        first.setdefault(p.label, p)
    labels = sorted(first, key=lambda lab: config_order(first[lab]))
    budgets = [lab for lab in labels if first[lab].method == "ddtree"]
    out, k = {}, 0
    for lab in labels:
        if first[lab].method == "auto":
            out[lab] = "#333333"
        elif lab in budgets:
            i = budgets.index(lab)
            out[lab] = _BUDGET_RAMP[min(len(_BUDGET_RAMP) - 1, 2 + i * max(1, (len(_BUDGET_RAMP) - 2) // len(budgets)))]
        else:
            out[lab] = _CATEGORICAL[k % len(_CATEGORICAL)]
            k += 1
    return out


def nulls_last(v: Any) -> tuple:
    """Sort key putting None (a value an imported file did not record) after every number."""
    return (v is None, v if v is not None else 0)


def shown(v: Any) -> str:
    """A workload value for display: 'not in the file' for None (analysis.display)."""
    return workload_text(v)


def output_tokens(v: Any) -> str:
    """ "128 output tokens", or "output length not in the file" (analysis.display)."""
    return stated_text(v, "output tokens", "output length")


def lowest(values: Iterable[Any]) -> Any:
    """The smallest known value (None only when none is known)."""
    return min(values, key=nulls_last, default=None)


def highest(values: Iterable[Any]) -> Any:
    """The largest known value (None only when none is known)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _num(x: float | None, digits: int = 4) -> float | None:
    """A JSON-safe rounded float (None for unknown or non-finite: JSON has no NaN)."""
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def _fmt(x: float | None, spec: str = ".1f", unknown: str = "unknown") -> str:
    return unknown if x is None else format(x, spec)


def _ids(ids: Iterable[int]) -> str:
    ids = list(ids)
    return ", ".join(map(str, ids[:6])) + (f" (+{len(ids) - 6})" if len(ids) > 6 else "")


def _grid(n_rows: int, n_cols: int, *, shared_x: bool = False, shared_y: bool = False,
          hgap: float = _PANEL_GAP, vgap: float = 0.12) -> tuple[dict[str, Any], list[list[tuple[str, str]]]]:
    """Axes of an n_rows x n_cols grid of panels (row 0 at the top): (layout axis entries,
    [[(xref, yref) of row r, column c]])."""
    layout: dict[str, Any] = {}
    refs: list[list[tuple[str, str]]] = []
    w = (1 - hgap * (n_cols - 1)) / n_cols
    h = (1 - vgap * (n_rows - 1)) / n_rows
    for r in range(n_rows):
        row = []
        for c in range(n_cols):
            i = r * n_cols + c + 1
            xa, ya = ("x", "y") if i == 1 else (f"x{i}", f"y{i}")
            x0 = c * (w + hgap)
            y1 = 1 - r * (h + vgap)
            layout["xaxis" if i == 1 else f"xaxis{i}"] = {"domain": [round(x0, 4), round(x0 + w, 4)], "anchor": ya,
                                                         "automargin": True}
            layout["yaxis" if i == 1 else f"yaxis{i}"] = {"domain": [round(y1 - h, 4), round(y1, 4)], "anchor": xa,
                                                         "automargin": True}
            if shared_x and i > 1:
                layout[f"xaxis{i}"]["matches"] = "x"
            if shared_y and i > 1:
                layout[f"yaxis{i}"]["matches"] = "y"
            row.append((xa, ya))
        refs.append(row)
    return layout, refs


def _axis(ref: str) -> str:
    """Layout key of an axis reference: 'x' -> 'xaxis', 'y3' -> 'yaxis3'."""
    return ref[0] + "axis" + ref[1:]


def _panel_title(text: str, xref: str, yref: str, layout: dict[str, Any], yshift: int = 0) -> dict[str, Any]:
    """An annotation centred above a panel (`yshift` px higher, e.g. above top tick labels)."""
    xd, yd = layout[_axis(xref)]["domain"], layout[_axis(yref)]["domain"]
    return {"text": text, "x": (xd[0] + xd[1]) / 2, "y": yd[1], "xref": "paper", "yref": "paper",
            "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 13}, "yshift": yshift}


def _diverging_at_one(lo: float, hi: float) -> dict[str, Any]:
    """A colour axis for ratios over [lo, hi]: red below 1 (slower than the baseline), white at
    1, blue above (faster), the white stop placed where 1 falls."""
    lo, hi = min(lo, 0.9), max(hi, 1.1)
    at_one = (1.0 - lo) / (hi - lo)
    return {"cmin": lo, "cmax": hi, "colorscale": [[0.0, "#b2182b"], [at_one, "#f7f7f7"], [1.0, "#2166ac"]]}


def _layout(height: int, top: int = 40, **extra: Any) -> dict[str, Any]:
    return {"height": height, "font": _FONT, "margin": {"l": 70, "r": 20, "t": top, "b": 50},
            "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff", "hoverlabel": {"align": "left"}, **extra}


def _figure(data: list[dict], layout: dict[str, Any], title: str, caption: str = "") -> dict[str, Any]:
    """A drawn figure: plotly.js `data` and `layout`, and the `title` and `caption` the page
    prints above it as text (HTML headings wrap and stay readable where a plot title would
    be clipped)."""
    return {"data": data, "layout": layout, "title": title, "caption": caption}


def _selection_note(points: list[Point], field: str, chosen: Any, what: str) -> str:
    """'; also measured at <what> a, b (filter to show one)' when `points` hold other values of
    `field` than the one a figure shows."""
    others = sorted({getattr(p, field) for p in points} - {chosen}, key=nulls_last)
    if not others:
        return ""
    return f"; also measured at {what} {', '.join(map(shown, others))} (filter to show one)"


# --------------------------------------------------------------------------------------------
# speedup heatmap


def cell_speedups(speedups: Iterable[Speedup]) -> dict[tuple, Speedup]:
    """{(concurrency, output length, label, TP): Speedup}: one per heatmap cell; where several
    match keys fall in one cell (other GPUs / engine version), the fullest (a number first, then
    the most repeats). The decomposition reads the same cells, so both show one figure."""
    cells: dict[tuple, Speedup] = {}
    for sp in speedups:
        cell = (sp.point.concurrency, sp.point.output_len, sp.label, sp.point.tp)
        have = cells.get(cell)
        if have is None or (have.value is None and sp.value is not None) or sp.n_repeats > have.n_repeats:
            cells[cell] = sp
    return cells


def speedup_heatmap(speedups: list[Speedup], points_by_run: dict[int, Point], baseline: str,
                    choice: str = verdicts.AUTO_CHOICE,
                    excluded: Sequence[tuple[Point, str]] = ()) -> dict[str, Any]:
    """Heatmaps of speedup vs `baseline`: one panel per (concurrency, output length), rows =
    decoding configuration (`config_order`, baseline first), columns = TP degree.

    Each panel shows the speedup `choice` picks at its concurrency (benchkit.compare.verdicts.
    figure_for: decode speedup at concurrency 1 and end-to-end above it by default), named in the
    panel's title. The Speedups need both ratios (decode and end-to-end). A cell's text is the
    speedup (`6.50×`) over its 95 % CI or "single run" (or the repeat count), and "TTFT moved"
    where decode and end-to-end differ by more than verdicts.DIFFER_SHARE (both on hover); a
    cell without a number (no matched baseline run, unknown figure) is blank with "no number" and
    its reason on hover. The winner of each column (verdicts.verdict: fastest with its interval
    separated from the runner-up's) starts with ★ and is outlined; a column whose fastest is not
    separated names no winner. A cell whose configuration's outputs differ from AR's
    (benchkit.compare.lossless.lossless_mark) gets MARK (≠) and the verdict on hover.

    `excluded`: (point, reason) of points left out of the speedups (verdicts.exclusion_reason):
    a cell all of whose runs are excluded is drawn hollow (dashed outline, no colour, text
    "excluded") with the reason on hover; a cell with some excluded says so on hover.
    customdata per cell: {"runs": [ids]}. Each trace's `meta` holds its panel:
    {"concurrency", "output_len", "speedup"} (the figure's name).
    """
    title = f"Speedup vs {baseline} per configuration and TP degree (★ = fastest beyond noise in its TP)"
    subtitle = (f"cell = speedup over the matched {baseline} run (same engine build, model, GPUs, TP and workload): "
                f"{verdicts.SPEEDUP_CHOICES[choice]}; decode = {baseline} median TPOT ÷ median TPOT, end-to-end "
                f"= output tok/s ratio; 95% CI over repeats, else 'single run'; ★ only where the fastest's CI is "
                f"separated from the runner-up's; {MARK} = outputs differ from AR's (lossless check, hover); "
                "hollow = excluded (hover)")
    with_number = [sp for sp in speedups if any(r.value is not None for r in sp.ratios.values())]
    out_cells: dict[tuple, list[tuple[Point, str]]] = defaultdict(list)
    for p, why in excluded:
        out_cells[(p.concurrency, p.output_len, p.label, p.tp)].append((p, why))
    if not with_number and not out_cells:
        reasons = sorted({sp.reason for sp in speedups if sp.reason})
        why = reasons[0] if len(reasons) == 1 else "; ".join(reasons[:3])
        return empty(title, f"No speedup to show: {why or 'no counted runs'}. A speedup needs a {baseline} run "
                            "with the same engine build, model, GPUs, TP and workload (MEASUREMENT.md).")
    first = {sp.label: sp.point for sp in speedups} | {p.label: p for p, _ in excluded if p.label}
    labels = sorted(first, key=lambda lab: (lab != baseline, config_order(first[lab])))
    keys = {(sp.point.concurrency, sp.point.output_len) for sp in speedups} | {k[:2] for k in out_cells}
    panels = sorted(keys, key=lambda cl: (nulls_last(cl[0]), nulls_last(cl[1])))
    tps = sorted({sp.point.tp for sp in speedups} | {k[3] for k in out_cells})
    several_len = len({ol for _, ol in panels}) > 1
    cells = cell_speedups(speedups)
    by_column: dict[tuple, list[Speedup]] = defaultdict(list)  # (concurrency, output length, TP) -> cells
    for (c, o, _, t), sp in cells.items():
        by_column[(c, o, t)].append(sp)
    n_cols = min(len(panels), 4)
    n_rows = math.ceil(len(panels) / n_cols)
    height = 90 + n_rows * (80 + 34 * len(labels))
    layout, refs = _grid(n_rows, n_cols, hgap=0.04, vgap=min(0.3, 75 / (height - 120)))
    x = [f"TP{tp}" for tp in tps]
    data, annotations, shapes, values = [], [], [], []
    for i, (conc, out_len) in enumerate(panels):
        xref, yref = refs[i // n_cols][i % n_cols]
        fig = verdicts.figure_for(choice, conc)
        winners = {}
        for tp in tps:
            v = verdicts.verdict(by_column.get((conc, out_len, tp), []), fig)
            if v.winner is not None:
                winners[tp] = v.winner.speedup
        z, text, hover, custom = [], [], [], []
        for r_i, lab in enumerate(labels):
            zr, tr, hr, cr = [], [], [], []
            for c_i, tp in enumerate(tps):
                sp = cells.get((conc, out_len, lab, tp))
                out = out_cells.get((conc, out_len, lab, tp), [])
                out_note = ("<br>excluded: " + "; ".join(f"run {p.run_id}: {why}" for p, why in out[:4])
                            + (f" (+{len(out) - 4})" if len(out) > 4 else "")) if out else ""
                if sp is None and out:
                    mark = lossless_mark(p for p, _ in out)
                    zr.append(None), tr.append((f"{mark.symbol} " if mark else "") + "excluded")
                    hr.append(f"<b>{lab} · TP{tp} · concurrency {shown(conc)}</b><br>no speedup: every run "
                              f"excluded{out_note}" + (f"<br>{mark.symbol} {mark.text}" if mark else ""))
                    cr.append({"runs": [p.run_id for p, _ in out], "excluded": True})
                    shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": c_i - 0.46, "x1": c_i + 0.46,
                                   "y0": r_i - 0.44, "y1": r_i + 0.44,
                                   "line": {"color": "#777", "width": 1.5, "dash": "dot"}})
                    continue
                if sp is None:
                    zr.append(None), tr.append(""), hr.append(f"{lab} · TP{tp}: not measured"), cr.append({"runs": []})
                    continue
                ratio = sp.ratios[fig.name]
                tau = median(points_by_run[r].acceptance_length for r in sp.run_ids)
                is_best = winners.get(tp) is sp
                if ratio.value is None:
                    zr.append(None)
                    tr.append("no number")
                    hr.append(f"<b>{lab} · TP{tp}</b><br>no {fig.title}: {ratio.reason}<br>runs {_ids(sp.run_ids)}"
                              + out_note)
                else:
                    zr.append(_num(ratio.value))
                    values.append(ratio.value)
                    second = (f"{ratio.ci95[0]:.2f}–{ratio.ci95[1]:.2f}" if ratio.ci95 else
                              "single run" if sp.n_repeats == 1 else f"{sp.n_repeats} runs")
                    mark = lossless_mark(points_by_run[r] for r in sp.run_ids)
                    lead = ("★ " if is_best else "") + (f"{mark.symbol} " if mark else "")
                    ttft = verdicts.ttft_note(
                        sp, median(getattr(points_by_run[r], "median_ttft_ms", None) for r in sp.run_ids),
                        median(getattr(points_by_run[r], "median_ttft_ms", None) for r in sp.baseline_run_ids))
                    tr.append(f"{lead}{ratio.value:.2f}×<br>{second}" + ("<br>TTFT moved" if ttft else ""))
                    e2e, dec = sp.end_to_end, sp.ratios.get(DECODE.name)
                    hr.append(f"<b>{lab} · TP{tp} · concurrency {shown(conc)}</b><br>"
                              f"{fig.title} {ratio.value:.2f}× vs {baseline} ({_spread(ratio, sp.n_repeats)})<br>"
                              f"end-to-end {_fmt(e2e.value, '.2f', 'no number')}× · decode "
                              f"{_fmt(dec.value if dec else None, '.2f', 'no number')}×<br>"
                              f"output {_fmt(e2e.median)} tok/s vs {_fmt(e2e.baseline_median)} tok/s · median TPOT "
                              f"{_fmt(dec.median if dec else None, '.2f')} ms vs "
                              f"{_fmt(dec.baseline_median if dec else None, '.2f')} ms<br>"
                              f"τ {_fmt(tau, '.2f', 'no counters')}<br>runs {_ids(sp.run_ids)} · "
                              f"{baseline} runs {_ids(sp.baseline_run_ids)}"
                              + (f"<br>{ttft}" if ttft else "")
                              + (f"<br>{mark.symbol} {mark.text}" if mark else "") + out_note)
                    if is_best:
                        shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": c_i - 0.48, "x1": c_i + 0.48,
                                       "y0": r_i - 0.46, "y1": r_i + 0.46, "line": {"color": "#111", "width": 2.5}})
                cr.append({"runs": sp.run_ids, "engine": sp.point.engine})
            z.append(zr), text.append(tr), hover.append(hr), custom.append(cr)
        data.append({"type": "heatmap", "x": x, "y": labels, "z": z, "text": text, "texttemplate": "%{text}",
                     "hovertext": hover, "hoverinfo": "text", "customdata": custom, "coloraxis": "coloraxis",
                     "xgap": 2, "ygap": 2, "xaxis": xref, "yaxis": yref, "name": f"concurrency {shown(conc)}",
                     "meta": {"concurrency": conc, "output_len": out_len, "speedup": fig.name}})
        layout[_axis(yref)].update(autorange="reversed", showticklabels=i % n_cols == 0, type="category")
        layout[_axis(xref)].update(side="top", type="category")
        annotations.append(_panel_title(f"concurrency {shown(conc)}"
                                        + (f" · {output_tokens(out_len)}" if several_len else "")
                                        + f" · {fig.title}", xref, yref, layout, yshift=22))
    # a fixed width: a cell stays about 170 px wide instead of stretching over the page
    width = min(1300, 200 + n_cols * len(tps) * 170)
    return _figure(data, _layout(
        height, top=70, width=width, annotations=annotations, shapes=shapes,
        coloraxis={**_diverging_at_one(min(values, default=1.0), max(values, default=1.0)),
                   "colorbar": {"title": {"text": f"× vs {baseline}"}, "thickness": 12, "len": 0.8}},
        **layout), title, subtitle)


def _spread(ratio: Any, n_repeats: int) -> str:
    """How sure one ratio is, in words: `95% CI 6.31-6.70, 5 repeats`, `single run`, or
    `2 repeats (median; CI needs 3)`."""
    if ratio.ci95:
        return f"95% CI {ratio.ci95[0]:.2f}-{ratio.ci95[1]:.2f}, {n_repeats} repeats"
    return "single run" if n_repeats == 1 else f"{n_repeats} repeats (median; CI needs {MIN_REPEATS_FOR_CI})"


# --------------------------------------------------------------------------------------------
# speedup decomposition


def decomposition_figure(points: list[Point], speedups: Iterable[Speedup] | None = None,
                         excluded: Sequence[tuple[Point, str]] = ()) -> dict[str, Any]:
    """Why a configuration wins, per TP degree (one row each), at the lowest concurrency and the
    largest output length of `points`:

    - left: acceptance length tau per speculative configuration (x, in `config_order`: budgets
      and k grow to the right): the server counters' tau and the client's mean tokens per chunk
      side by side (median over repeats);
    - right: relative cost of one decoding step, step time / autoregressive TPOT, where step
      time = TPOT x tau (tau from the counters, else the client's tokens per chunk), against the
      matched `auto` runs, over medians: median tau / decode speedup, where the decode speedup
      is the heatmap's own (the Speedup of the same cell, `cell_speedups`: auto's median TPOT /
      the configuration's median TPOT). So decode speedup = tau / relative cost exactly, and the
      panel's sentence names the fastest by the decode speedup: the heatmap and this panel agree.
      A larger budget accepts more but each step costs more.

    `speedups`: Speedups over `points` with the decode ratio (computed here when None).
    `points` must leave the excluded points out (benchkit.compare.verdicts.exclusion_reason);
    `excluded` ((point, reason)) are named in the caption, never drawn.

    Empty with a reason when no speculative configuration is selected or no point has an
    acceptance length from either source; notes inside the figure say when the counters are
    missing (client figure only) or no auto run matches (no relative cost).
    """
    title = "Why a configuration wins: acceptance length τ against the cost of one decoding step"
    if not points:
        return empty(title, nothing_counted(excluded))
    conc = lowest(p.concurrency for p in points)
    out_len = highest(p.output_len for p in points if p.concurrency == conc)
    sel = [p for p in points if p.concurrency == conc and p.output_len == out_len]
    spec = [p for p in sel if p.method != "auto"]
    if not spec:
        return empty(title, "No speculative configuration in this selection: only autoregressive runs, nothing to "
                            "decompose.")
    if all(p.acceptance_length is None and p.mean_tokens_per_chunk is None for p in spec):
        return empty(title, "No spec-decode counters and no client tokens-per-chunk in these runs: acceptance length "
                            "unknown.")
    if speedups is None:
        speedups = compute_speedups(sel, figures=(DECODE,))
    cells = {k: sp for k, sp in cell_speedups(sp for sp in speedups if DECODE.name in sp.ratios).items()
             if k[:2] == (conc, out_len)}
    tps = sorted({p.tp for p in spec})
    labels = ordered_labels(spec)
    colours = config_colours(points)
    layout, refs = _grid(len(tps), 2, hgap=0.1, vgap=0.14 if len(tps) > 1 else 0.1)
    data, annotations, said = [], [], []
    any_counters = any(p.acceptance_length is not None for p in spec)
    any_ar = False
    by_run = {p.run_id: p for p in points}
    for r, tp in enumerate(tps):
        (xl, yl), (xr, yr) = refs[r]
        by_label: dict[str, list[Point]] = defaultdict(list)
        for p in spec:
            if p.tp == tp:
                by_label[p.label].append(p)
        xs = [lab for lab in labels if lab in by_label]
        tau_s = [_num(median(p.acceptance_length for p in by_label[lab]), 3) for lab in xs]
        tau_c = [_num(median(p.mean_tokens_per_chunk for p in by_label[lab]), 3) for lab in xs]
        runs = [{"runs": [p.run_id for p in by_label[lab]]} for lab in xs]
        data.append({"type": "scatter", "mode": "lines+markers", "x": xs, "y": tau_s, "name": "τ (server counters)",
                     "legendgroup": "tau_s", "showlegend": r == 0, "line": {"color": "#1f4e9a"},
                     "marker": {"size": 9}, "xaxis": xl, "yaxis": yl, "customdata": runs,
                     "hovertemplate": "%{x}: τ %{y:.2f} (server counters)<extra>TP" + str(tp) + "</extra>"})
        data.append({"type": "scatter", "mode": "lines+markers", "x": xs, "y": tau_c,
                     "name": "tokens per chunk (client)", "legendgroup": "tau_c", "showlegend": r == 0,
                     "line": {"color": "#e45756", "dash": "dash"}, "marker": {"size": 8, "symbol": "diamond"},
                     "xaxis": xl, "yaxis": yl, "customdata": runs,
                     "hovertemplate": "%{x}: %{y:.2f} tokens per chunk (client)<extra>TP" + str(tp) + "</extra>"})
        costs, hover, decodes = [], [], []
        for lab, ts, tc in zip(xs, tau_s, tau_c, strict=True):
            sp = cells.get((conc, out_len, lab, tp))
            dec = sp.ratios[DECODE.name].value if sp is not None else None
            tau = ts if ts is not None else tc
            cost = tau / dec if tau is not None and dec else None
            costs.append(_num(cost, 3))
            decodes.append(dec)
            hover.append(f"{lab} · TP{tp}<br>step time / AR TPOT = {_fmt(cost, '.2f')}<br>τ {tau:.2f} ÷ "
                         f"{_fmt(cost, '.2f')} = decode speedup {dec:.2f}×" if cost is not None
                         else f"{lab} · TP{tp}<br>no matched auto run or no TPOT: cost unknown")
        any_ar = any_ar or any(c is not None for c in costs)
        said.append(_verdict(tp, xs, tau_s, tau_c, costs,
                             [sp for (c, o, _, t), sp in cells.items() if (c, o, t) == (conc, out_len, tp)],
                             by_run))
        data.append({"type": "bar", "x": xs, "y": costs, "marker": {"color": [colours[lab] for lab in xs]},
                     "name": "relative step cost", "showlegend": False, "xaxis": xr, "yaxis": yr,
                     "hovertext": hover, "hoverinfo": "text", "customdata": runs,
                     "text": [_fmt(c, ".2f", "") for c in costs], "textposition": "outside"})
        layout[_axis(yl)].update(title={"text": f"TP{tp}<br>τ (tokens/step)"}, rangemode="tozero")
        layout[_axis(yr)].update(title={"text": "step time / AR TPOT"}, rangemode="tozero")
        layout[_axis(xl)].update(type="category")
        layout[_axis(xr)].update(type="category")
        if r == 0:
            annotations.append(_panel_title("acceptance length τ (higher: more tokens per step)", xl, yl, layout))
            annotations.append(_panel_title("cost of one step relative to autoregressive (lower is cheaper)",
                                            xr, yr, layout))
    notes = []
    if not any_counters:
        notes.append("no spec-decode counters in these runs: τ is the client's tokens per chunk only")
    if not any_ar:
        notes.append("no matched auto run: relative cost unknown")
    subtitle = (f"concurrency {shown(conc)}, {output_tokens(out_len)}"
                + _selection_note(points, "concurrency", conc, "concurrency"))
    if notes:
        subtitle += " — " + "; ".join(notes)
    subtitle += ". decode speedup = τ ÷ relative step cost (the heatmap's decode speedup)."
    excluded_note = ""
    if excluded:
        excluded_note = (" Excluded (never drawn): "
                     + "; ".join(f"{p.label} TP{p.tp} c{shown(p.concurrency)} run {p.run_id}: {why}"
                                 for p, why in excluded[:4]) + (f"; +{len(excluded) - 4} more" if len(excluded) > 4
                                                                 else "") + ".")
    xd, yd = layout[_axis(refs[0][0][0])]["domain"], layout[_axis(refs[0][0][1])]["domain"]
    legend = {"x": xd[1], "xanchor": "right", "y": yd[0] + 0.01, "yanchor": "bottom",
              "bgcolor": "rgba(255,255,255,0.8)"}
    shapes = [{"type": "line", "xref": f"{xr} domain", "yref": yr, "x0": 0, "x1": 1, "y0": 1, "y1": 1,
               "line": {"color": "#888", "dash": "dot"}} for (_, _), (xr, yr) in refs]
    return _figure(data, _layout(60 + 260 * len(tps), annotations=annotations, shapes=shapes, legend=legend,
                                 **layout), title, subtitle + _why_caption(said) + excluded_note)


def _verdict(tp: int, labels: list[str], tau_s: list, tau_c: list, costs: list, speedups: list[Speedup],
             points_by_run: dict[int, Point]) -> str:
    """One sentence for a TP degree: which configuration accepts the most, and which one is
    fastest by the decode speedup (= tau / relative cost, the heatmap's decode speedup) only as
    benchkit.compare.verdicts.verdict says (separated 95 % intervals, the lossless mark kept);
    otherwise the verdict's own sentence (a tie within noise, or too few repeats). '' when there
    is nothing to compare."""
    rows = [(lab, s if s is not None else c, cost)
            for lab, s, c, cost in zip(labels, tau_s, tau_c, costs, strict=True)
            if (s if s is not None else c) is not None and cost]
    if len(rows) < 2:
        return ""
    most = max(rows, key=lambda r: r[1])
    v = verdicts.verdict(speedups, DECODE, points_by_run)
    lead = f"TP{tp}: {most[0]} accepts the most (τ {most[1]:.2f})"
    if v.kind == verdicts.NONE:
        return lead + "."
    if v.winner is None:
        return f"{lead}; by the decode speedup, {v.sentence}."
    w = v.winner
    if w.label == most[0]:
        return f"{lead} and {v.sentence}."
    return f"{lead} but one of its steps costs {most[2]:.2f}× an autoregressive step, so {v.sentence}."


def _why_caption(verdicts: list[str]) -> str:
    said = [v for v in verdicts if v]
    return (" " + " ".join(said)) if said else ""


# --------------------------------------------------------------------------------------------
# TP scaling


def tp_scaling_figure(points: list[Point], y: str = "output_tok_s",
                      excluded: Sequence[tuple[Point, str]] = ()) -> dict[str, Any]:
    """Output tok/s (or another `y` of THROUGHPUT_Y: output tok/s per GPU, J per output token,
    USD per million output tokens) vs TP degree, one line per configuration (median over
    repeats), at the largest output length of `points`: one panel at the lowest concurrency
    (latency: a single request when it is 1) and one at the highest (throughput). A line going
    down from TP4 to TP8 means the extra GPUs cost more (e.g. all-reduce across the CPU sockets)
    than they give. A point without the `y` figure is left out and counted in the caption.

    Empty with a reason when only one TP degree is selected or no point has the figure.
    customdata per point: {"runs"}. Raises KeyError for an unknown `y`. `excluded` ((point,
    reason), benchkit.compare.verdicts.exclusion_reason; not in `points`) are drawn hollow, one
    marker per run of the panel's concurrency, the reason on hover (trace name "excluded").
    """
    field, axis, fmt, why = THROUGHPUT_Y[y]
    title = "TP scaling: output tok/s vs TP degree" if y == "output_tok_s" else f"TP scaling: {axis} vs TP degree"
    if not points:
        return empty(title, nothing_counted(excluded))
    tps = sorted({p.tp for p in points})
    if len(tps) < 2:
        return empty(title, f"One TP degree only (TP{tps[0]}): nothing to scale.")
    out_len = highest(p.output_len for p in points)
    sel = [p for p in points if p.output_len == out_len]
    missing = [p for p in sel if getattr(p, field) is None]
    if len(missing) == len(sel):
        return empty(title, f"No run in this selection has {axis} ({why}).")
    concs = sorted({p.concurrency for p in sel}, key=nulls_last)
    panels = [concs[0]] if len(concs) == 1 else [concs[0], concs[-1]]
    colours = config_colours(points)
    layout, refs = _grid(1, len(panels), hgap=0.08)
    data, annotations = [], []
    for i, conc in enumerate(panels):
        xref, yref = refs[0][i]
        by_label: dict[str, dict[int, list[Point]]] = defaultdict(lambda: defaultdict(list))
        for p in sel:
            if p.concurrency == conc and getattr(p, field) is not None:
                by_label[p.label][p.tp].append(p)
        for lab in ordered_labels(p for p in sel if p.label in by_label):
            ts = sorted(by_label[lab])
            ys = [_num(median(getattr(p, field) for p in by_label[lab][tp]), 4) for tp in ts]
            data.append({"type": "scatter", "mode": "lines+markers", "name": lab, "legendgroup": lab,
                         "showlegend": i == 0, "x": [f"TP{tp}" for tp in ts], "y": ys,
                         "line": {"color": colours[lab], "width": 2.5 if lab == "auto" else 2},
                         "marker": {"size": 8}, "xaxis": xref, "yaxis": yref,
                         "customdata": [{"runs": [p.run_id for p in by_label[lab][tp]]} for tp in ts],
                         "meta": {"concurrency": conc},
                         "hovertemplate": f"{lab} · %{{x}} · concurrency {shown(conc)}<br>%{{y:{fmt}}} {axis}"
                                          "<extra></extra>"})
        out = [(p, why) for p, why in excluded if p.concurrency == conc and p.output_len == out_len
               and p.tp in tps and _finite(getattr(p, field, None))]
        if out:
            data.append({"type": "scatter", "mode": "markers", "name": "excluded (hover: why)",
                         "legendgroup": "excluded", "showlegend": i == 0, "x": [f"TP{p.tp}" for p, _ in out],
                         "y": [_num(getattr(p, field), 4) for p, _ in out],
                         "marker": {"size": 10, "symbol": "circle-open", "color": "#777", "line": {"width": 2}},
                         "xaxis": xref, "yaxis": yref, "customdata": [{"runs": [p.run_id]} for p, _ in out],
                         "meta": {"concurrency": conc, "excluded": True},
                         "hovertext": [f"{p.label} · TP{p.tp} · run {p.run_id}: excluded, {why}" for p, why in out],
                         "hoverinfo": "text"})
        layout[_axis(xref)].update(type="category", categoryorder="array", categoryarray=[f"TP{t}" for t in tps],
                                   title={"text": "TP degree"})
        layout[_axis(yref)].update(title={"text": axis if conc is None or conc > 1 else f"{axis} (one request)"},
                                   rangemode="tozero")
        kind = "latency" if i == 0 else "throughput"
        annotations.append(_panel_title(f"concurrency {shown(conc)} ({kind})" if len(panels) > 1
                                        else f"concurrency {shown(conc)}",
                                        xref, yref, layout))
    subtitle = f"{output_tokens(out_len)}" + _selection_note(points, "output_len", out_len, "output length")
    if len(panels) == 1:
        subtitle += "; one concurrency level only"
    if missing:
        subtitle += (f"; {len(missing)} run{'s' if len(missing) > 1 else ''} without {axis} left out ({why}), "
                     f"run{'s' if len(missing) > 1 else ''} {_ids(p.run_id for p in missing)}")
    if y in ("output_tok_s", "output_tok_s_per_gpu"):
        subtitle += ". " + " ".join(_fastest_tp(sel, field, conc) for conc in panels)
    else:
        subtitle += "; lower is better."
    return _figure(data, _layout(400, annotations=annotations, **layout), title, subtitle)


def throughput_figures(points: list[Point], excluded: Sequence[tuple[Point, str]] = ()) -> dict[str, dict[str, Any]]:
    """{key of THROUGHPUT_Y: tp_scaling_figure(points, key, excluded)}: the throughput figure with
    each y-axis the sweep page can switch to."""
    return {key: tp_scaling_figure(points, key, excluded) for key in THROUGHPUT_Y}


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _fastest_tp(sel: list[Point], field: str, conc: int | None) -> str:
    """Per configuration at concurrency `conc`, the TP degree with the highest median `field`,
    named only where benchkit.compare.verdicts.separated says its repeats beat the next TP
    degree's beyond noise, e.g. "Concurrency 1: fastest at TP4 (separated from the next TP over
    repeats) for all 6 configurations." or "...: TP degrees tie within noise for ngram k=4;
    fewer than 3 repeats, no verdict, for auto." (the points drawn in that panel)."""
    by_label: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in sel:
        v = getattr(p, field)
        if p.concurrency == conc and v is not None:
            by_label[p.label][p.tp].append(v)
    groups: dict[str, list[str]] = defaultdict(list)
    for lab in ordered_labels(p for p in sel if p.label in by_label):
        ranked = sorted(by_label[lab].items(), key=lambda kv: -median(kv[1]))
        if len(ranked) < 2:
            continue
        sep = verdicts.separated(ranked[0][1], ranked[1][1])
        key = (f"fastest at TP{ranked[0][0]} (separated from the next TP over repeats)" if sep
               else "TP degrees tie within noise" if sep is not None
               else f"fewer than {MIN_REPEATS_FOR_CI} repeats per TP degree, no verdict,")
        groups[key].append(lab)
    if not groups:
        return ""
    total = sum(len(v) for v in groups.values())
    if len(groups) == 1:
        (key, _), = groups.items()
        return f"Concurrency {shown(conc)}: {key.rstrip(',')} for all {total} configurations."
    parts = [f"{key} for {', '.join(names)}" for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    return f"Concurrency {shown(conc)}: " + "; ".join(parts) + "."


# --------------------------------------------------------------------------------------------
# throughput-latency trade-off


def pareto_frontier(xy: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The points (x, y, tag) not dominated by another (higher or equal x AND y, one strictly),
    both axes better when larger; sorted by x ascending."""
    front: list[tuple[float, float, Any]] = []
    best_y = -math.inf
    for x, y, tag in sorted(xy, key=lambda t: (-t[0], -t[1])):
        if y > best_y:
            front.append((x, y, tag))
            best_y = y
    return sorted(front, key=lambda t: t[0])


def tradeoff_figure(points: list[Point], excluded: Sequence[tuple[Point, str]] = ()) -> dict[str, Any]:
    """Per-user tok/s (1000 / median TPOT) vs aggregate output tok/s over the concurrency
    levels, at the largest output length of `points`: one panel per TP degree (shared axes),
    one curve per configuration through its concurrency levels (medians over repeats; markers
    labelled with the concurrency), and the Pareto frontier of every (configuration, TP,
    concurrency) point drawn in each panel, so each TP's curves read against the best there is.

    Empty with a reason when only one concurrency level is selected (a trade-off needs several)
    or no point has both a TPOT and an output tok/s. `excluded` ((point, reason); not in
    `points`) are counted in the caption, never drawn (a TPOT of 0 has no per-user speed).
    """
    title = "Throughput-latency trade-off: per-user speed vs aggregate throughput"
    if not points:
        return empty(title, nothing_counted(excluded))
    out_len = highest(p.output_len for p in points)
    # a point whose concurrency an imported file did not record has no place on the curve
    sel = [p for p in points if p.output_len == out_len and getattr(p, SPEED_FIELD) is not None
           and p.median_tpot_ms and p.concurrency is not None]
    concs = sorted({p.concurrency for p in points if p.concurrency is not None})
    if len(concs) < 2:
        known = f"concurrency {concs[0]}" if concs else "concurrency not in the file"
        return empty(title, f"One concurrency level only ({known}): a trade-off curve needs several.")
    if not sel:
        return empty(title, "No run with both a median TPOT and an output tok/s.")
    colours = config_colours(points)
    groups: dict[tuple[str, int], dict[int, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for p in sel:
        groups[(p.label, p.tp)][p.concurrency].append(p)
    curves: dict[tuple[str, int], list[tuple[int, float, float, list[int]]]] = {}
    for key, by_c in groups.items():
        curves[key] = [(c, median(getattr(p, SPEED_FIELD) for p in by_c[c]),
                        median(1000.0 / p.median_tpot_ms for p in by_c[c]), [p.run_id for p in by_c[c]])
                       for c in sorted(by_c)]
    front = pareto_frontier([(x, y, (lab, tp, c)) for (lab, tp), pts in curves.items() for c, x, y, _ in pts])
    tps = sorted({tp for _, tp in curves})
    labels = ordered_labels(sel)
    layout, refs = _grid(1, len(tps), shared_x=True, shared_y=True, hgap=0.05)
    data, annotations = [], []
    for i, tp in enumerate(tps):
        xref, yref = refs[0][i]
        data.append({"type": "scatter", "mode": "lines", "name": "Pareto frontier (all TP)", "legendgroup": "front",
                     "showlegend": i == 0, "x": [_num(x, 2) for x, _, _ in front],
                     "y": [_num(y, 2) for _, y, _ in front],
                     "line": {"color": "#999", "dash": "dash", "width": 1.5}, "xaxis": xref,
                     "yaxis": yref, "hoverinfo": "skip"})
        for lab in labels:
            pts = curves.get((lab, tp))
            if not pts:
                continue
            on_front = {c for (fl, ft, c) in (t for _, _, t in front) if fl == lab and ft == tp}
            data.append({"type": "scatter", "mode": "lines+markers+text", "name": lab, "legendgroup": lab,
                         "showlegend": i == 0, "x": [_num(x, 2) for _, x, _, _ in pts],
                         "y": [_num(y, 2) for _, _, y, _ in pts], "text": [f"c{c}" for c, _, _, _ in pts],
                         "textposition": "top center", "textfont": {"size": 10},
                         "line": {"color": colours[lab]},
                         "marker": {"size": [13 if c in on_front else 8 for c, _, _, _ in pts],
                                    "symbol": ["star" if c in on_front else "circle" for c, _, _, _ in pts]},
                         "xaxis": xref, "yaxis": yref, "customdata": [{"runs": ids} for _, _, _, ids in pts],
                         "meta": {"tp": tp},
                         "hovertemplate": f"{lab} · TP{tp} · concurrency %{{text}}<br>%{{x:.1f}} tok/s aggregate"
                                          "<br>%{y:.1f} tok/s per user<extra></extra>"})
        layout[_axis(xref)].update(title={"text": "aggregate output tok/s"}, rangemode="tozero")
        layout[_axis(yref)].update(title={"text": "per-user tok/s (1000 / median TPOT)"} if i == 0 else {},
                                   rangemode="tozero")
        annotations.append(_panel_title(f"TP{tp}", xref, yref, layout))
    subtitle = (f"{output_tokens(out_len)}" + _selection_note(points, "output_len", out_len, "output length")
                + "; ★ = on the Pareto frontier (no other point is faster on both axes)")
    if excluded:
        subtitle += (f"; {len(excluded)} excluded run{'s' if len(excluded) > 1 else ''} not drawn (run "
                     f"{_ids(p.run_id for p, _ in excluded)}: see the excluded line)")
    return _figure(data, _layout(410, annotations=annotations, **layout), title, subtitle)


def temperature_figure(points: list[Point], speedups: Iterable[Speedup] = (),
                       excluded: Sequence[tuple[Point, str]] = ()) -> dict[str, Any]:
    """Acceptance length (tau, tokens per verify step) and decode speedup vs the sampling
    temperature (the `grid.temperature` axis), one curve per configuration, at the lowest TP
    degree and concurrency and the largest output length of `points`: medians over repeats;
    the speedups (`speedups`: compute_speedups with DECODE, the baseline's matched run at the same
    temperature) with their 95 % interval as error bars where there are >= 3 repeats.

    Empty with a reason when only one temperature is measured. `excluded` are counted in the
    caption, never drawn."""
    title = "Acceptance length and decode speedup vs temperature"
    if not points:
        return empty(title, nothing_counted(excluded))
    temps = sorted({p.temperature for p in points})
    if len(temps) < 2:
        return empty(title, f"One temperature only ({temps[0]:g}): list several in grid.temperature, e.g. "
                            "[0.0, 0.7, 1.0], to see how sampling moves acceptance and speed.")
    tp, conc = min(p.tp for p in points), lowest(p.concurrency for p in points)
    out_len = highest(p.output_len for p in points)
    cell = [p for p in points if (p.tp, p.concurrency, p.output_len) == (tp, conc, out_len)]
    colours = config_colours(points)
    layout, refs = _grid(1, 2, shared_x=True, hgap=0.1)
    data, annotations = [], []
    by: dict[str, dict[float, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for p in cell:
        by[p.label][p.temperature].append(p)
    sp_by = {(sp.label, sp.point.temperature): sp for sp in speedups
             if (sp.point.tp, sp.point.concurrency, sp.point.output_len) == (tp, conc, out_len)}
    (x1, y1), (x2, y2) = refs[0]
    for lab in ordered_labels(cell):
        ts = sorted(by[lab])
        taus = [median(p.acceptance_length for p in by[lab][t]) for t in ts]
        runs = [{"runs": [p.run_id for p in by[lab][t]]} for t in ts]
        if any(v is not None for v in taus) and lab != "auto":
            data.append({"type": "scatter", "mode": "lines+markers", "name": lab, "legendgroup": lab,
                         "x": ts, "y": [_num(v, 3) for v in taus], "line": {"color": colours[lab]},
                         "xaxis": x1, "yaxis": y1, "customdata": runs,
                         "hovertemplate": f"{lab}<br>temperature %{{x}}<br>tau %{{y:.2f}}<extra></extra>"})
        ratios = [sp_by[(lab, t)].ratios.get("decode") if (lab, t) in sp_by else None for t in ts]
        ys = [_num(r.value, 3) if r is not None else None for r in ratios]
        if any(v is not None for v in ys):
            err_hi = [_num(r.ci95[1] - r.value, 3) if r is not None and r.ci95 and r.value else None for r in ratios]
            err_lo = [_num(r.value - r.ci95[0], 3) if r is not None and r.ci95 and r.value else None for r in ratios]
            data.append({"type": "scatter", "mode": "lines+markers", "name": lab, "legendgroup": lab,
                         "showlegend": lab == "auto", "x": ts, "y": ys, "line": {"color": colours[lab]},
                         "error_y": {"type": "data", "array": err_hi, "arrayminus": err_lo, "visible": True},
                         "xaxis": x2, "yaxis": y2, "customdata": runs,
                         "hovertemplate": f"{lab}<br>temperature %{{x}}<br>decode speedup %{{y:.2f}}×"
                                          "<extra></extra>"})
    layout[_axis(x1)].update(title={"text": "temperature"})
    layout[_axis(x2)].update(title={"text": "temperature"})
    layout[_axis(y1)].update(title={"text": "tau (tokens per verify step)"}, rangemode="tozero")
    layout[_axis(y2)].update(title={"text": "decode speedup vs auto (×)"}, rangemode="tozero")
    annotations += [_panel_title("acceptance length", x1, y1, layout), _panel_title("decode speedup", x2, y2, layout)]
    caption = (f"TP{tp}, concurrency {shown(conc)}, {output_tokens(out_len)}: medians over repeats; error bars: "
               "95% bootstrap CI (>= 3 repeats each side); every request of a run sends the workload's seed")
    if excluded:
        caption += f"; {len(excluded)} excluded run{'s' if len(excluded) > 1 else ''} not drawn"
    return _figure(data, _layout(380, annotations=annotations, **layout), title, caption)


# --------------------------------------------------------------------------------------------
# run page and host page


def distribution_figure(values: list[float], title: str, unit: str, bins: int = 50) -> dict[str, Any]:
    """Histogram of one run's samples (e.g. TTFT ms, ITL ms/token), binned here (numpy) so the
    page ships the counts, not the samples: `bins` equal bins over [min, max], or one bin per
    integer when every sample is an integer spanning at most 64 values (tokens per chunk)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return empty(title, "No samples.")
    lo, hi = float(arr.min()), float(arr.max())
    if np.all(arr == np.round(arr)) and hi - lo <= 64:
        edges = np.arange(lo - 0.5, hi + 1.5)
    else:
        edges = np.histogram_bin_edges(arr, bins=bins if hi > lo else 1)
    counts, edges = np.histogram(arr, bins=edges)
    centres = (edges[:-1] + edges[1:]) / 2
    hover = [f"{a:.3g}–{b:.3g} {unit}: {n}" for a, b, n in zip(edges[:-1], edges[1:], counts, strict=True)]
    data = [{"type": "bar", "x": [_num(c, 6) for c in centres], "y": counts.tolist(),
             "width": [_num(w, 6) for w in np.diff(edges)], "hovertext": hover, "hoverinfo": "text",
             "marker": {"color": "#4c78a8"}, "name": title}]
    sub = f"{arr.size} samples, median {np.median(arr):.3g} {unit}"
    return _figure(data, _layout(300, top=20, showlegend=False, bargap=0.02, xaxis={"title": {"text": unit}},
                                 yaxis={"title": {"text": "count"}}), title, sub)


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
    data = [{"type": "heatmap", "z": z, "x": gpus, "y": gpus, "text": text, "texttemplate": "%{text}",
             "colorscale": "Viridis", "showscale": False, "zmin": 0, "zmax": 5}]
    return _figure(data, _layout(80 + 45 * n, top=20, yaxis={"autorange": "reversed"}), "GPU topology",
                   "link types of nvidia-smi topo -m: NV# (NVLink) best, SYS crosses the CPU sockets")


# --------------------------------------------------------------------------------------------
# run page: GPU telemetry

_GPU_PANELS = (("power_w", "power (W)", "y", [0.70, 1.0]), ("sm_mhz", "SM clock (MHz)", "y2", [0.36, 0.64]),
               ("util_pct", "utilisation (%)", "y3", [0.0, 0.30]))


def gpu_timeline_figure(series: dict[str, Any] | None) -> dict[str, Any]:
    """"GPU power, SM clock and utilisation" of one run: x = seconds from the window's start
    (the warmup at negative x), three stacked panels sharing x (power W on y, SM clock MHz on
    y2, utilisation % on y3), one trace per GPU and quantity, the measured window shaded
    (`layout.shapes`, 0 to window_s), readings with a throttle bit (0x8, 0x20, 0x40, 0x80)
    marked with a red x on the power panel. `series`: runs.selectors.gpu_series (already
    downsampled); empty with a reason when None or without readings."""
    title = "GPU power, SM clock and utilisation"
    if not series or not series.get("t_s"):
        return empty(title, "No GPU telemetry was recorded for this run.")
    colours = _CATEGORICAL
    x = series["t_s"]
    data = []
    for k, g in enumerate(series["gpus"]):
        colour = colours[k % len(colours)]
        for key, label, yref, _ in _GPU_PANELS:
            data.append({"type": "scatter", "mode": "lines",
                         "name": f"GPU {g['index']}", "legendgroup": f"gpu{g['index']}", "showlegend": key == "power_w",
                         "x": x, "y": g[key], "xaxis": "x", "yaxis": yref, "line": {"color": colour, "width": 1.5},
                         "meta": {"gpu": g["uuid"], "quantity": key},
                         "hovertemplate": f"GPU {g['index']} · %{{x:.2f}} s<br>%{{y}} {label}<extra></extra>"})
        hot = [i for i, t in enumerate(g["throttled"]) if t]
        if hot:
            data.append({"type": "scatter", "mode": "markers", "name": f"GPU {g['index']} throttled",
                         "legendgroup": f"gpu{g['index']}", "x": [x[i] for i in hot],
                         "y": [g["power_w"][i] for i in hot],
                         "xaxis": "x", "yaxis": "y", "marker": {"color": "#d62728", "symbol": "x", "size": 8},
                         "meta": {"gpu": g["uuid"], "quantity": "throttled"},
                         "hovertemplate": f"GPU {g['index']} · %{{x:.2f}} s<br>throttle bit set<extra></extra>"})
    layout = _layout(520, top=20, showlegend=True, legend={"orientation": "h", "y": -0.12},
                     xaxis={"title": {"text": "seconds from the window start"}, "anchor": "y3", "zeroline": False})
    for _, label, yref, domain in _GPU_PANELS:
        layout[_axis(yref)] = {"title": {"text": label}, "domain": domain, "anchor": "x", "rangemode": "tozero"}
    window_s = series.get("window_s")
    if window_s:
        layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "paper", "x0": 0, "x1": window_s, "y0": 0, "y1": 1,
                             "fillcolor": "#4c78a8", "opacity": 0.08, "line": {"width": 0}, "layer": "below"}]
    caption = (f"{series['n_ticks']} readings at {series['hz']:g} Hz"
               + (f", averaged {series['bin_ticks']} per point" if series["bin_ticks"] > 1 else "")
               + ("; the shaded span is the measured window" if window_s else "; no request window stored")
               + "; power is NVML's 1 s average (board power only).")
    return _figure(data, layout, title, caption)
