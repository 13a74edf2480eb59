"""Change points and per-position acceptance on the trend and home pages (issue 21): context
builders only (the rows are stored by runs.services.changepoints; nothing is detected on a page
request).

The trend page draws each change point as a vertical dashed mark in its panel (TP x
concurrency) of the tok/s figure, with its explanation on hover, and lists them with the rule
that found them (`joint`, `metric:NAME`, `environment`) beside the regression flags (rolling
median / Mann-Whitney: "is last night bad"). With `?point=KEY` (a point's identity hash, linked
from each row) it shows that point's per-position acceptance rates night by night.
"""

from __future__ import annotations

from typing import Any

from analysis import history_figures as hf
from benchkit.measure.metrics import METRICS
from benchkit.point import Point
from runs import selectors

#: Colour of a change point's mark (open; acknowledged ones are grey).
MARK_COLOUR, ACK_COLOUR = "#7c3aed", "#9ca3af"
#: The rules, as the pages name them.
RULES = {
    "changepoint": "change point (PELT over the whole history, t-test at alpha 0.001, >= 3 %; docs/CHANGEPOINTS.md)",
    "hud": "regression flag: rolling median, two nights",
    "mannwhitney": "regression flag: Mann-Whitney on repeats",
}


def _found_by(found: list[str]) -> str:
    names = {"joint": "all metrics jointly", "environment": "an environment change (known boundary)"}
    return ", ".join(names.get(f, f.replace("metric:", "") + " alone") for f in found)


def change_point_row(cp, night_x: dict[int, str] | None = None) -> dict[str, Any]:
    """A ChangePoint as a page / JSON row: where, what moved (each metric's before -> after and
    change %), the environment differences, which rule found it, the attribution."""
    attr = cp.attribution or {}
    return {
        "id": cp.pk, "sweep": cp.sweep_id, "night": (night_x or {}).get(cp.sweep_id) or cp.sweep.created_at.isoformat(),
        "series": cp.series, "host": cp.host.name if night_x is None else None, "label": cp.label, "tp": cp.tp,
        "concurrency": cp.concurrency, "input_len": cp.input_len, "output_len": cp.output_len, "kind": cp.kind,
        "point_key": cp.point_key,
        "moved": [{"metric": s["metric"], "header": METRICS[s["metric"]].header, "before": s["before_mean"],
                   "after": s["after_mean"], "change_pct": s["change_pct"], "verdict": s["verdict"],
                   "p_value": s["p_value"]} for s in cp.shifts],
        "env": [f"{e['name']} {e['before'] or '?'} -> {e['after'] or '?'}" for e in cp.env_changes],
        "found_by": list(cp.found_by), "found_by_text": _found_by(list(cp.found_by)),
        "rule": RULES["changepoint"], "sentence": cp.sentence,
        "attribution": attr.get("verdict", ""), "attribution_reason": attr.get("reason", ""),
        "open": cp.is_open, "acknowledged_by": cp.acknowledged_by, "ack_reason": cp.ack_reason,
    }


def add_marks(fig: dict[str, Any] | None, rows: list[dict[str, Any]], points: list[Point]) -> None:
    """Draw change points `rows` (change_point_row, `night` an ISO time on the figure's x axis) on
    the trend figure `fig` (analysis.history_figures.trend_figure of `points`): a dashed vertical
    line in the row's panel and a marker at its top whose hover is the explanation. Rows whose
    panel is not shown (filtered out) are skipped."""
    if not fig or not rows:
        return
    tps = sorted({p.tp for p in points})
    concs = sorted({p.concurrency for p in points})
    for is_open, name, colour in ((True, "change point", MARK_COLOUR), (False, "acknowledged change point",
                                                                         ACK_COLOUR)):
        for r in (r for r in rows if r["open"] == is_open and r["tp"] in tps and r["concurrency"] in concs):
            i = concs.index(r["concurrency"]) * len(tps) + tps.index(r["tp"]) + 1
            x, y = hf._axis_name(i, "x"), hf._axis_name(i, "y")
            fig["layout"]["shapes"].append({"type": "line", "xref": x, "yref": f"{y} domain", "x0": r["night"],
                                            "x1": r["night"], "y0": 0, "y1": 1,
                                            "line": {"color": colour, "dash": "dash", "width": 2}})
            fig["data"].append({"type": "scatter", "mode": "markers", "name": name, "legendgroup": name,
                                "showlegend": not any(t.get("name") == name for t in fig["data"]),
                                "xaxis": x, "yaxis": f"{y}", "x": [r["night"]], "y": [0],
                                "text": [f"{r['label']} {r['kind']}: {r['sentence']}"
                                         + (f"<br>{r['attribution_reason']}" if r["attribution_reason"] else "")],
                                "marker": {"symbol": "triangle-up", "size": 12, "color": colour},
                                "hovertemplate": "%{text}<extra>" + name + "</extra>"})


def acceptance_by_position(points: list[Point], night_x: dict[int, str]) -> dict[str, Any] | None:
    """Per-position acceptance of one point night by night (`points`: its runs with
    `per_position_acceptance_rate` and `acceptance_length` loaded): {label, positions, rows:
    [{sweep, night, tau, rates (mean over the night's runs; None where unknown)}], figure (a
    heatmap, nights x positions)}; None when no run has per-position rates."""
    by_night: dict[int, list[Point]] = {}
    for p in points:
        by_night.setdefault(p.sweep_id, []).append(p)
    width = max((len(p.per_position_acceptance_rate or ()) for p in points), default=0)
    if not width:
        return None
    rows = []
    for sid in sorted(by_night, key=lambda s: night_x.get(s, "")):
        ps = by_night[sid]
        rates = []
        for k in range(width):
            vals = [p.per_position_acceptance_rate[k] for p in ps
                    if p.per_position_acceptance_rate and len(p.per_position_acceptance_rate) > k]
            rates.append(sum(vals) / len(vals) if vals else None)
        taus = [p.acceptance_length for p in ps if p.acceptance_length is not None]
        rows.append({"sweep": sid, "night": night_x.get(sid, ""), "tau": sum(taus) / len(taus) if taus else None,
                     "rates": rates})
    first = points[0]
    label = f"{first.label} · TP{first.tp} · c{first.concurrency} · {first.input_len}/{first.output_len}"
    figure = {"data": [{"type": "heatmap", "x": [f"position {k + 1}" for k in range(width)],
                        "y": [f"#{r['sweep']} {r['night'][:10]}" for r in rows],
                        "z": [[None if v is None else round(v, 4) for v in r["rates"]] for r in rows],
                        "zmin": 0, "zmax": 1, "colorscale": "Viridis",
                        "hovertemplate": "%{y}, %{x}: %{z:.3f}<extra>acceptance rate</extra>"}],
              "layout": {**hf._base_layout(f"{label}: acceptance rate per draft position, night by night",
                                           160 + 24 * len(rows)), "yaxis": {"type": "category"}}}
    return {"label": label, "positions": list(range(1, width + 1)), "rows": rows, "figure": figure}


def home_rows(cps) -> list[dict[str, Any]]:
    """Open change points for the home page, beside the open flags."""
    return [change_point_row(cp) for cp in cps]


def extend_trend(ctx: dict[str, Any], host, name: str, nights, points: list[Point], point_key: str = "") -> None:
    """Add to the trend page's context (`ctx["data"]`, analysis.history.build_trend of `points`
    over `nights`): `change_points` (rows, drawn on the tok/s figure), `rules` (which rule finds
    what) and, for `point_key` (`?point=`), `acceptance` (acceptance_by_position; None when the
    point has no per-position rates on these nights). Reads the stored rows (two queries)."""
    data = ctx["data"]
    night_x = {n.pk: n.created_at.isoformat() for n in nights}
    rows = [change_point_row(cp, night_x) for cp in selectors.series_change_points(host.pk, name, list(night_x))]
    data["change_points"] = rows
    data["rules"] = RULES
    add_marks(data.get("figures", {}).get("tok_s"), rows, points)
    data["acceptance"] = None
    if point_key:
        data["acceptance"] = acceptance_by_position(selectors.point_acceptance_history(list(night_x), point_key),
                                                    night_x)
        data["acceptance_point"] = point_key
