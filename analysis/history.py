"""Build the contexts of the history pages from loaded rows (no queries here): compare two
sweeps, the trend of a nightly series, and the home page.

Each builder returns a dict whose `data` entry is JSON-ready (the page's JSON endpoint returns
it as is; the template renders the same dict), so a page and its JSON never disagree.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.template.defaultfilters import floatformat, slugify
from django.urls import reverse

from analysis import history_figures as hf
from analysis.display import lengths_text, workload_text
from analysis.figures import nulls_last
from benchkit.compare import lossless, verdicts
from benchkit.compare.speedups import AUTO, DECODE, END_TO_END, compute_speedups
from benchkit.compare.stats import median
from benchkit.compare.sweepdiff import (
    BETTER,
    COMPARE_METRICS,
    SAME,
    UNKNOWN,
    WORSE,
    PointDiff,
    Unmatched,
    compare_sweeps,
    env_difference,
)
from benchkit.measure.metrics import METRICS
from benchkit.point import ENV_FIELDS, FIELD_GROUP, SPEED_FIELD, Point

#: Metrics a history page loads per run: the compared ones (speedups divide the first).
HISTORY_METRICS = tuple(COMPARE_METRICS)
#: At most this many rows per JSON list, and per table of a page (PAGE_ROW_LIMIT: a template
#: row costs far more than a JSON one: 100 rows were a fifth of a 3 240-run compare page's time);
#: the counts always cover every point, the JSON lists ROW_LIMIT rows.
ROW_LIMIT = 200
PAGE_ROW_LIMIT = 50
_VERDICT_ORDER = {WORSE: 0, BETTER: 1, SAME: 2, UNKNOWN: 3}
_ONE_DAY = timedelta(days=1)


def _severity(d: PointDiff) -> tuple:
    """Table order: worse first (largest drop first), then better (largest gain first), then the rest."""
    change = d.changes[SPEED_FIELD].change_pct or 0.0
    return (_VERDICT_ORDER[d.verdict], change if d.verdict != BETTER else -change)


def _sweep_ref(s, host_name: str) -> dict[str, Any]:
    return {"id": s.pk, "name": s.name, "host": host_name, "created_at": s.created_at.isoformat(),
            "created": f"{s.created_at:%Y-%m-%d %H:%M}", "is_demo": s.is_demo}


def _lossless(points: list[Point]) -> dict[str, Any] | None:
    """The most severe lossless verdict of one side's runs of a point (benchkit.compare.lossless
    .worst): {"verdict", "short", "share", "sentence"}, None for none (`auto`, not computed)."""
    p = lossless.worst(points)
    if p is None:
        return None
    return {"verdict": p.lossless_verdict, "short": lossless.SHORT[p.lossless_verdict],
            "share": p.lossless_identical_share, "sentence": p.lossless_sentence}


def _diff_row(d: PointDiff, by_run: dict[int, Point]) -> dict[str, Any]:
    p = d.point
    return {
        "label": d.label, "tp": p.tp, "concurrency": p.concurrency,
        "input_len": p.input_len, "output_len": p.output_len, "verdict": d.verdict,
        "single_run": d.single_run, "old_run_ids": d.old_run_ids, "new_run_ids": d.new_run_ids,
        "apart_reason": d.apart_reason,
        "lossless": {"old": _lossless([by_run[i] for i in d.old_run_ids if i in by_run]),
                     "new": _lossless([by_run[i] for i in d.new_run_ids if i in by_run])},
        # in the order of the page's `metrics` list
        "metrics": [{"name": m, "old": c.old, "new": c.new, "change_pct": c.change_pct, "ci95_pct": c.ci95_pct,
                     "verdict": c.verdict} for m, c in d.changes.items()],
    }


def _unmatched_row(u: Unmatched) -> dict[str, Any]:
    """A point only one sweep has, as the JSON lists it: label, identity fields, run ids."""
    return {"label": u.point.label, **u.point.identity(), "run_ids": u.run_ids}


def build_compare(old, new, old_points: list[Point], new_points: list[Point], noise_pct: float,
                  limit: int = ROW_LIMIT) -> dict[str, Any]:
    """Context of the compare page of sweep `old` (before) vs `new` (after).

    `data` (also the JSON): sweeps, verdict counts, the rows of matched points (worst first;
    at most `limit`), points put apart (different hardware or engine; at most `limit`), points
    only one sweep has, and the figure. `truncated` says when rows were left out.
    """
    diff = compare_sweeps(old_points, new_points, noise_pct=noise_pct)
    by_run = {p.run_id: p for p in (*old_points, *new_points)}
    matched = sorted(diff.matched, key=_severity)
    metrics = [{"name": m, "label": METRICS[m].label, "unit": METRICS[m].unit,
                "better": "higher" if sign > 0 else "lower"} for m, sign in COMPARE_METRICS.items()]
    data = {
        "old": _sweep_ref(old, old.host.name), "new": _sweep_ref(new, new.host.name), "noise_pct": noise_pct,
        "metrics": metrics,
        "counts": {"worse": diff.counts[WORSE], "better": diff.counts[BETTER], "same": diff.counts[SAME],
                   "unknown": diff.counts[UNKNOWN], "apart": len(diff.apart), "only_old": len(diff.only_old),
                   "only_new": len(diff.only_new), "matched": len(diff.matched)},
        "points": [_diff_row(d, by_run) for d in matched[:limit]],
        "apart": [_diff_row(d, by_run) for d in diff.apart[:limit]],
        "apart_reasons": sorted({d.apart_reason for d in diff.apart}),
        "only_old": [_unmatched_row(u) for u in diff.only_old[:limit]],
        "only_new": [_unmatched_row(u) for u in diff.only_new[:limit]],
        "truncated": len(matched) > limit or len(diff.apart) > limit,
        "limit": limit,
        "figure": hf.compare_figure(diff.matched, noise_pct, f"#{old.pk}", f"#{new.pk}") if diff.matched else None,
    }
    return {"data": data, "verdicts": (WORSE, BETTER, SAME)}


def _f1(x: float | None) -> str:
    """`x` as the template filter `floatformat:1` writes it (one decimal, half up; "" for None),
    without its per-call localisation cost (a compare page formats about 2 000 figures)."""
    if x is None:
        return ""
    if not math.isfinite(x):
        return floatformat(x, 1)
    s = f"{Decimal(repr(float(x))).quantize(_TENTH, ROUND_HALF_UP):f}"
    return "0.0" if s == "-0.0" else s


_TENTH = Decimal("0.1")


def _run_links(ids: list[int]) -> list[tuple[int, str]]:
    """(run id, its run page URL) per id (one reverse() for all)."""
    pattern = reverse("analysis:run_detail", args=[987654321])
    return [(i, pattern.replace("987654321", str(i))) for i in ids]


def compare_page_tables(data: dict[str, Any]) -> dict[str, Any]:
    """The compare page's two tables from `build_compare`'s data: its `points` and `apart` rows,
    each with the run links and every figure already written as the page shows it (`old`, `new`,
    `change`, `lo`, `hi`: one decimal; "" when unknown) and the verdicts' CSS slugs."""

    def row(r: dict[str, Any]) -> dict[str, Any]:
        cells = [{"verdict": c["verdict"], "slug": slugify(c["verdict"]), "known": c["change_pct"] is not None,
                  "old": _f1(c["old"]), "new": _f1(c["new"]), "change": _f1(c["change_pct"]),
                  "ci": (_f1(c["ci95_pct"][0]), _f1(c["ci95_pct"][1])) if c["ci95_pct"] else None}
                 for c in r["metrics"]]
        return {**r, "slug": slugify(r["verdict"]), "cells": cells, "old_runs": _run_links(r["old_run_ids"]),
                "new_runs": _run_links(r["new_run_ids"])}

    return {"matched_rows": [row(r) for r in data["points"]], "apart_rows": [row(r) for r in data["apart"]]}


def _night_envs(points: list[Point]) -> dict[int, set[tuple]]:
    out: dict[int, set[tuple]] = defaultdict(set)
    for p in points:
        out[p.sweep_id].add(p.env_key())
    return out


#: Positions in `Point.env_key()` of the engine's fields (version, build, commit) and the others.
_ENGINE_ENV = tuple(i for i, f in enumerate(ENV_FIELDS) if FIELD_GROUP[f] == "engine")


def _snapshot_change(prev: dict[str, Any], cur: dict[str, Any]) -> str:
    parts = []
    for key, name in (("driver_version", "driver"), ("cuda_version", "CUDA"), ("gpu_name", "GPU"),
                      ("gpu_count", "GPUs")):
        if prev[key] != cur[key]:
            parts.append(f"{name} {prev[key] or '?'} → {cur[key] or '?'}")
    return ", ".join(parts) or "hardware fingerprint changed (topology)"


def environment_changes(nights, points: list[Point], snapshots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Annotations for the trend's time axis, in time order: {x (ISO time), text, kind}.

    - `hardware`: a host snapshot whose fingerprint differs from the one before it, dated when
      it was taken, inside the nights' span (from the day before the first night);
    - `engine`: a night whose runs' engine version / build / commit set differs from the night
      before (text names what changed).
    """
    out: list[dict[str, Any]] = []
    if not nights:
        return out
    first, last = nights[0].created_at, nights[-1].created_at
    for prev, cur in zip(snapshots, snapshots[1:], strict=False):
        if cur["fingerprint"] != prev["fingerprint"] and first - _ONE_DAY <= cur["taken_at"] <= last:
            out.append({"x": cur["taken_at"].isoformat(), "text": _snapshot_change(prev, cur), "kind": "hardware"})
    envs = _night_envs(points)
    prev_env = None
    for n in nights:
        env = envs.get(n.pk)
        if not env:
            continue
        if prev_env is not None and env != prev_env:
            engine = {_engine_only(e) for e in env}
            before = {_engine_only(e) for e in prev_env}
            if engine != before:
                a, b = sorted(before)[0], sorted(engine)[0]
                text = env_difference(a, b).replace(" -> ", " → ")
                out.append({"x": n.created_at.isoformat(), "text": text, "kind": "engine"})
        prev_env = env
    return sorted(out, key=lambda c: c["x"])


def _engine_only(env: tuple) -> tuple:
    """`env` (a `Point.env_key()`) with every field but the engine's blanked."""
    return tuple(v if i in _ENGINE_ENV else "" for i, v in enumerate(env))


def build_trend(host, name: str, nights, points: list[Point], flags, snapshots: list[dict[str, Any]],
                facets: dict[str, list], chosen: dict[str, list]) -> dict[str, Any]:
    """Context of the trend page of series (host, name) over `nights` (sweeps, oldest first).

    `points`: history points of those nights (already filtered by `chosen`); `flags`: the
    series' RegressionFlag rows on those nights; `snapshots`: the host's snapshot history
    (runs.selectors.snapshot_history); `facets`: every value present per filter column,
    `chosen`: the values shown. Figures: output tok/s and speedup vs autoregressive per night,
    one panel per (concurrency, TP), a line per configuration (median of repeats), regression
    flags as markers, hardware and engine changes as dotted lines.
    """
    night_x = {n.pk: n.created_at.isoformat() for n in nights}
    tps = sorted({p.tp for p in points})
    concs = sorted({p.concurrency for p in points}, key=nulls_last)
    labels = sorted({p.label for p in points})
    colours = hf.colour_of(labels)
    several_lengths = len({(p.input_len, p.output_len) for p in points}) > 1

    def series_label(p: Point) -> str:
        return f"{p.label} · {lengths_text(p.input_len, p.output_len)}" if several_lengths else p.label

    tok: dict[tuple, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for p in points:
        tok[(p.concurrency, p.tp)][series_label(p)][p.sweep_id].append(getattr(p, SPEED_FIELD))
    tok_cells = {cell: {lab: [(night_x[sid], m, f"night #{sid} · {m:.1f} tok/s")
                              for sid in sorted(by_night) if (m := median(by_night[sid])) is not None]
                        for lab, by_night in by_label.items()} for cell, by_label in tok.items()}
    sp_cells: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    by_night_points: dict[int, list[Point]] = defaultdict(list)
    for p in points:
        by_night_points[p.sweep_id].append(p)
    for sid in sorted(by_night_points, key=lambda s: night_x[s]):
        for sp in compute_speedups(by_night_points[sid], ci=False):
            p = sp.point
            if sp.value is None or p.method == "auto":
                continue
            sp_cells[(p.concurrency, p.tp)][series_label(p)].append(
                (night_x[sid], sp.value, f"night #{sid} · {sp.value:.2f}x vs autoregressive"))
    flag_rows = [f for f in flags if f.sweep_id in night_x]
    marks = [{"x": night_x[f.sweep_id], "y": f.value, "tp": f.tp, "concurrency": f.concurrency, "open": f.is_open,
              "text": f"{f.label}: {f.change_pct:+.1f}% vs rolling median {f.baseline:.1f}"}
             for f in flag_rows if f.metric == SPEED_FIELD]
    changes = environment_changes(nights, points, snapshots)
    figs = {}
    if points:
        figs["tok_s"] = hf.trend_figure(f"{name} on {host.name}: output tok/s per night", "output tok/s", tok_cells,
                                        tps, concs, colours, marks, changes)
        figs["speedup"] = hf.trend_figure(f"{name} on {host.name}: end-to-end speedup (output tok/s ratio) vs "
                                          "autoregressive per night", "end-to-end speedup (x)", sp_cells, tps, concs,
                                          colours, [], changes)
    data = {
        "host": host.name, "series": name, "nights": [_sweep_ref(n, host.name) for n in nights],
        "facets": facets, "chosen": chosen, "changes": changes, "n_points": len(points),
        # the form: one box per value of each filter with several values, ticked when shown
        "facet_choices": [{"name": col, "values": [{"value": v, "checked": col not in chosen or v in chosen[col]}
                                                   for v in vals]} for col, vals in facets.items() if len(vals) > 1],
        "flags": [{"id": f.pk, "sweep": f.sweep_id, "night": night_x[f.sweep_id], "label": f.label, "tp": f.tp,
                   "concurrency": f.concurrency, "input_len": f.input_len, "output_len": f.output_len,
                   "metric": f.metric, "value": f.value, "baseline": f.baseline, "change_pct": f.change_pct,
                   "rule": f.rule, "open": f.is_open, "acknowledged_by": f.acknowledged_by,
                   "ack_reason": f.ack_reason, "note": f.note} for f in flag_rows],
        "figures": figs,
    }
    return {"data": data}


def _mark(mark: Any) -> dict[str, Any] | None:
    """A LosslessMark as JSON-able data (the home page's data endpoint), or None."""
    return None if mark is None else {"symbol": mark.symbol, "text": mark.text, "run_ids": list(mark.run_ids),
                                      "words": mark.words}


def _headline(points: list[Point]) -> list[dict[str, Any]]:
    """Per TP degree and concurrency level, at the largest output length: the verdict over the
    configurations vs their matched autoregressive runs (benchkit.compare.verdicts: decode speedup
    at concurrency 1, end-to-end above it; a winner only beyond noise, else a tie or "single
    runs: no verdict"), excluded points left out. Each row: {"tp", "concurrency", "output_len",
    "kind", "sentence", "figure" (the speedup's name), "label" and "speedup" (the fastest measured,
    named a winner only when kind is "winner"), "tok_s", "n_repeats", "run_ids", "lossless_mark"}
    (None for the mark unless not lossless); a TP with nothing to compare: {"tp", "label": None,
    "speedup": None, "empty"}, "empty" saying why (only the baseline was run, or no configuration
    has a matched baseline)."""
    by_run = {p.run_id: p for p in points}
    kept, _ = verdicts.split_excluded(points)
    out_len = max((p.output_len for p in kept if p.output_len is not None), default=None)
    cells: dict[tuple, list] = defaultdict(list)
    for sp in compute_speedups(kept, figures=(END_TO_END, DECODE)):
        if sp.point.output_len == out_len:
            cells[(sp.point.tp, sp.point.concurrency)].append(sp)
    rows: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (tp, conc), sps in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or 0)):
        v = verdicts.verdict(sps, verdicts.figure_for(verdicts.AUTO_CHOICE, conc), by_run)
        top = next((c for c in v.ranking if c.label != "auto"), None) if v.kind != verdicts.WINNER else v.winner
        if top is None:
            continue
        rows[tp].append({"tp": tp, "concurrency": conc, "output_len": out_len, "kind": v.kind,
                         "sentence": v.sentence, "figure": v.figure.title, "label": top.label, "speedup": top.value,
                         "tok_s": top.speedup.end_to_end.median, "n_repeats": top.n_repeats,
                         "run_ids": top.run_ids, "lossless_mark": _mark(top.mark)})
    tps = sorted({p.tp for p in points})
    return [r for tp in tps for r in (rows.get(tp) or [{"tp": tp, "label": None, "speedup": None,
                                                        "empty": _nothing_to_compare(kept, tp)}])]


def _nothing_to_compare(kept: list[Point], tp: int) -> str:
    """Why a TP degree of a sweep has no headline row: only the autoregressive baseline ran there
    (nothing to compare it with), or no configuration has a matched baseline."""
    if all(p.method == AUTO for p in kept if p.tp == tp):
        return "only the autoregressive baseline ran: nothing to compare"
    return "no autoregressive baseline matched"


def build_home(latest, counts: dict[int, dict[str, int]], points: list[Point], open_flags) -> dict[str, Any]:
    """Context of the home page: per series (its newest sweep): host, state counts, headline
    (best configuration and speedup per TP) and its open flags; every open flag in one list and
    a figure."""
    by_sweep: dict[int, list[Point]] = defaultdict(list)
    for p in points:
        by_sweep[p.sweep_id].append(p)
    flags_by_series: dict[tuple, list] = defaultdict(list)
    for f in open_flags:
        flags_by_series[(f.host_id, f.series)].append(f)
    series = []
    for s in latest:
        c = counts.get(s.pk, {})
        series.append({"sweep": _sweep_ref(s, s.host.name), "counts": c, "total": sum(c.values()),
                       "headline": _headline(by_sweep.get(s.pk, [])),
                       "open_flags": len(flags_by_series.get((s.host_id, s.name), []))})
    flag_rows = [{"id": f.pk, "series": f.series, "host": f.host.name, "sweep": f.sweep_id,
                  "night": f.sweep.created_at.isoformat(), "label": f.label, "tp": f.tp, "concurrency": f.concurrency,
                  "input_len": f.input_len, "output_len": f.output_len, "metric": f.metric, "value": f.value,
                  "baseline": f.baseline, "change_pct": f.change_pct, "rule": f.rule, "note": f.note,
                  "name": f"{f.series} · {f.label} · TP{f.tp} · c{workload_text(f.concurrency)}"} for f in open_flags]
    data = {"series": series, "open_flags": flag_rows,
            "figure": hf.flags_figure([{**r, "night": f"night #{r['sweep']}"} for r in flag_rows])
            if flag_rows else None}
    return {"data": data}


