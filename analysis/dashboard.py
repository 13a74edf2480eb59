"""Build the context of dashboard pages from loaded rows (no queries here)."""

from __future__ import annotations

import shlex
from collections import defaultdict
from typing import Any

from analysis import figures
from analysis.filters import QueryError, Selection
from benchkit.compare import categories, lossless, verdicts
from benchkit.compare.lossless import lossless_mark
from benchkit.compare.speedups import DECODE, END_TO_END, Speedup, compute_speedups, inconsistent_gpu_tps
from benchkit.compare.stats import median
from benchkit.measure.gpu_validity import bit_names
from benchkit.measure.gpu_window import NO_GPUS_NOTE
from benchkit.measure.metrics import COALESCED_GAP_MS, COALESCED_NOTE_SHARE, LATENCY_METRICS, METRICS, STAT_NAMES
from benchkit.methods import config_order, method_label, method_title
from benchkit.point import DECODING_FIELDS, SHAPE_FIELDS, SPEED_FIELD, Point
from benchkit.specs import RunSpec
from benchkit.sweeps.fragment import point_sweep_file, spec_from_stored
from runs.models import ACTIVE_STATES, RunState
from runs.selectors import counted_points

#: Figures of the sweep page, in page order (each drawn into the element `fig-<key>`).
SWEEP_FIGURES = ("speedup", "decomposition", "tp_scaling", "tradeoff", "temperature")
#: Columns of the point table data.json gives with `?points=1`: the run, its configuration's
#: label, where it sits in the grid (benchkit.point.SHAPE_FIELDS), its repeat and its figures.
POINT_TABLE = ("run_id", "label", *SHAPE_FIELDS, "repeat_index", *figures.POINT_METRICS)


#: The speedups every sweep page and export computes (benchkit.compare.speedups: both named).
SPEEDUP_FIGURES = (END_TO_END, DECODE)


def verdict_speedups(points: list[Point], baseline: str = "auto") -> tuple[list[Speedup], dict[int, str]]:
    """(speedups vs `baseline` with both ratios, over the points that may feed a verdict;
    {run id: exclusion reason} of the others: benchkit.compare.verdicts.split_excluded)."""
    kept, excluded = verdicts.split_excluded(points)
    return compute_speedups(kept, baseline, figures=SPEEDUP_FIGURES), excluded


def sweep_results(runs, prices: dict[str, float | None] | None = None) -> tuple[list[Point], list[Speedup]]:
    """(points, speedups vs auto) of a sweep's counted runs (loaded Run rows; only succeeded runs
    count), priced at `prices` when given; the speedups (decode and end-to-end) leave the
    excluded points out (`verdict_speedups`). Used by the exports."""
    points = counted_points(runs, prices)
    return points, verdict_speedups(points)[0]


def _decoding(d: dict[str, Any]) -> tuple:
    """The decoding configuration (method, k, budget) of a dimension row."""
    return tuple(d[f] for f in DECODING_FIELDS)


def dimension_labels(dims: list[dict[str, Any]]) -> list[str]:
    """The configuration labels of a sweep's dimension rows (runs.selectors.sweep_dimensions),
    in benchkit.methods.config_order."""
    first = {method_label(*_decoding(d)): d for d in dims}
    return sorted(first, key=lambda lab: config_order(*_decoding(first[lab])))


def baseline_config(selection: Selection, dims: list[dict[str, Any]]) -> tuple[str, int | None, int | None]:
    """The (method, k, budget) of the selection's baseline. Raises QueryError (`baseline`)
    when no counted run of the sweep has that configuration (an empty sweep accepts `auto`)."""
    for d in dims:
        cfg = _decoding(d)
        if method_label(*cfg) == selection.baseline:
            return cfg
    if selection.baseline == "auto":
        return ("auto", None, None)
    present = ", ".join(dimension_labels(dims)) or "none"
    raise QueryError("baseline", f"{selection.baseline!r} is not a configuration of this sweep's counted runs "
                                     f"(present: {present})")


def sweep_figures(points: list[Point], selection: Selection) -> tuple[dict[str, Any], list[Speedup]]:
    """({figure key: figure dict} of SWEEP_FIGURES, speedups) for the points of a selection.

    `points` may hold the baseline's and auto's runs beyond the method filter (Selection.load_kwargs);
    speedups are computed over all of them but the excluded ones (`verdict_speedups`), the
    figures show the selected configurations (the heatmap also the baseline's row); excluded
    points are drawn hollow with their reason (heatmap, TP scaling) or named in the caption
    (decomposition, trade-off), never used. The heatmap shows `selection.speedup`."""
    speedups, reasons = verdict_speedups(points, selection.baseline)
    by_run = {p.run_id: p for p in points}
    shown = [p for p in points if selection.shows(p) and p.run_id not in reasons]
    excluded = [(p, reasons[p.run_id]) for p in points if p.run_id in reasons
                and (selection.shows(p) or p.label == selection.baseline)]
    shown_sp = [sp for sp in speedups if sp.label == selection.baseline or selection.shows(sp.point)]
    figs = {
        "speedup": figures.speedup_heatmap(shown_sp, by_run, selection.baseline, choice=selection.speedup,
                                           excluded=excluded),
        "decomposition": figures.decomposition_figure([p for p in points if p.run_id not in reasons
                                                       and (selection.shows(p) or p.method == "auto")],
                                                      speedups=speedups if selection.baseline == "auto" else None,
                                                      excluded=excluded),
        "tp_scaling": figures.tp_scaling_figure(shown, excluded=excluded),
        "tradeoff": figures.tradeoff_figure(shown, excluded=excluded),
        "temperature": figures.temperature_figure(
            [p for p in points if p.run_id not in reasons and (selection.shows(p) or p.label == selection.baseline)],
            speedups if selection.baseline == "auto" else (), excluded=excluded),
    }
    return figs, speedups


def sweep_data(sweep, points: list[Point], selection: Selection, with_points: bool = False) -> dict[str, Any]:
    """The sweep's JSON endpoint: {"sweep", "selection", "figures", "inconsistent_tps",
    "throughput_y"}, plus the point table {"columns": POINT_TABLE, "rows": [[...]]} of the shown
    runs when `with_points`. `throughput_y`: {"options": [{"key", "label"}], "figures": {key:
    the throughput (TP scaling) figure with that y-axis}} for the keys of figures.THROUGHPUT_Y
    (output tok/s, output tok/s per GPU, J per output token, USD per million output tokens;
    the points need figures.EFFICIENCY_POINT_FIELDS and the priced figures: runs.selectors.figure_points
    with prices)."""
    figs, _ = sweep_figures(points, selection)
    reasons = {p.run_id: verdicts.exclusion_reason(p) for p in points}
    shown = [p for p in points if selection.shows(p) and not reasons[p.run_id]]
    excluded = [(p, reasons[p.run_id]) for p in points if selection.shows(p) and reasons[p.run_id]]
    out: dict[str, Any] = {
        "sweep": {"id": sweep.pk, "name": sweep.name, "is_demo": sweep.is_demo},
        "selection": {"tp": selection.tp, "concurrency": selection.concurrency, "output_len": selection.output_len,
                      "method": selection.method, "host": selection.host, "baseline": selection.baseline,
                      "speedup": selection.speedup},
        "excluded": excluded_rows(points, selection),
        "figures": figs,
        "inconsistent_tps": inconsistent_gpu_tps(points),
        "throughput_y": {"options": [{"key": k, "label": v[1]} for k, v in figures.THROUGHPUT_Y.items()],
                         "figures": figures.throughput_figures(shown, excluded)},
    }
    if with_points:
        out["points"] = {"columns": POINT_TABLE,
                         "rows": [[getattr(p, c) for c in POINT_TABLE] for p in points if selection.shows(p)]}
    return out


def excluded_rows(points: list[Point], selection: Selection) -> list[dict[str, Any]]:
    """The selected points excluded from verdicts (benchkit.compare.verdicts.exclusion_reason):
    [{"run_id", "label", "tp", "concurrency", "output_len", "reason"}], in the points' order."""
    out = []
    for p in points:
        if selection.shows(p) or p.label == selection.baseline:
            why = verdicts.exclusion_reason(p)
            if why:
                out.append({"run_id": p.run_id, "label": p.label, "tp": p.tp, "concurrency": p.concurrency,
                            "output_len": p.output_len, "reason": why})
    return out


def headline(speedups: list[Speedup], points: list[Point], selection: Selection) -> dict[str, Any] | None:
    """The answer in words, at the largest output length selected: per TP degree and concurrency
    level the verdict over the configurations (the baseline included) by the speedup the
    selection chooses (benchkit.compare.verdicts.figure_for: decode at concurrency 1, end-to-end
    above it by default), named only beyond noise (benchkit.compare.verdicts.verdict: a winner,
    a tie within noise, or "single runs: no verdict" with the ranking greyed); and per concurrency
    level the highest output tok/s (configuration, TP), named only when separated from the
    runner-up (`verdicts.separated`). `speedups` must leave the excluded points out
    (`verdict_speedups`); excluded points never appear here. None without points.

    A named configuration whose outputs differ from AR's carries its lossless mark
    (benchkit.compare.lossless.lossless_mark): never named fastest without it.

    {"output_len", "baseline", "choice" (the sentence saying which speedup is shown),
     "concurrency": [c...], "figures": [SpeedupFigure per c], "rows": [{"tp", "cells": [Verdict
     per c]}], "fastest": [{"concurrency", "label", "tp", "tok_s", "runs", "mark", "kind",
     "runner_up"}]}"""
    by_run = {p.run_id: p for p in points}
    shown = [p for p in points if selection.shows(p) and not verdicts.exclusion_reason(p)]
    if not shown:
        return None
    out_len = figures.highest(p.output_len for p in shown)
    sps = [sp for sp in speedups if sp.point.output_len == out_len
           and (sp.label == selection.baseline or selection.shows(sp.point))]
    concs = sorted({p.concurrency for p in shown if p.output_len == out_len}, key=figures.nulls_last)
    tps = sorted({p.tp for p in shown if p.output_len == out_len})
    figs = [verdicts.figure_for(selection.speedup, c) for c in concs]
    cells: dict[tuple, list[Speedup]] = defaultdict(list)
    for sp in sps:
        cells[(sp.point.tp, sp.point.concurrency)].append(sp)
    rows = [{"tp": tp, "cells": [verdicts.verdict(cells.get((tp, c), []), fig, by_run)
                                 for c, fig in zip(concs, figs, strict=True)]} for tp in tps]
    medians: dict[tuple, list[Point]] = defaultdict(list)
    for p in shown:
        if p.output_len == out_len and getattr(p, SPEED_FIELD) is not None:
            medians[(p.concurrency, p.label, p.tp)].append(p)
    fastest = []
    for c in concs:
        cands = sorted(((median(getattr(q, SPEED_FIELD) for q in ps), lab, tp, ps)
                        for (cc, lab, tp), ps in medians.items() if cc == c), key=lambda t: -t[0])
        if not cands:
            continue
        tok_s, lab, tp, ps = cands[0]
        kind, runner = verdicts.WINNER, None
        if len(cands) > 1:
            runner = f"TP{cands[1][2]} · {cands[1][1]}"
            sep = verdicts.separated([getattr(q, SPEED_FIELD) for q in ps],
                                     [getattr(q, SPEED_FIELD) for q in cands[1][3]])
            # no interval: "single runs" only where both have one run, else "fewer than 3 repeats"
            few = verdicts.SINGLE if max(len(ps), len(cands[1][3])) == 1 else verdicts.FEW
            kind = few if sep is None else verdicts.WINNER if sep else verdicts.TIE
        runs = [q.run_id for q in ps]
        fastest.append({"concurrency": c, "label": lab, "tp": tp, "tok_s": tok_s, "runs": runs, "kind": kind,
                        "runner_up": runner, "mark": lossless_mark(by_run[r] for r in runs)})
    return {"output_len": out_len, "concurrency": concs, "figures": figs, "rows": rows, "fastest": fastest,
            "baseline": selection.baseline, "choice": verdicts.choice_sentence(selection.speedup)}


#: Most category matrices one sweep page shows (one per TP degree, concurrency and temperature:
#: the lowest concurrency first, each TP; the filters narrow to others).
MAX_CATEGORY_CELLS = 3


def category_cells(points: list[Point], selection: Selection) -> dict[str, Any] | None:
    """The cells the sweep page's category matrices are drawn for: (TP, concurrency,
    temperature) at the headline's output length, over the points that may feed a verdict, the
    first MAX_CATEGORY_CELLS of them (lowest concurrency, then temperature, then TP); None when
    no point is on a dataset (random prompts have no category). {"output_len", "cells": [((tp,
    concurrency, temperature), [Point])], "more": cells left out, "run_ids": the runs whose
    category figures the matrices need}."""
    kept = [p for p in verdicts.split_excluded(points)[0]
            if p.dataset != "random" and (selection.shows(p) or p.label == selection.baseline)]
    if not kept:
        return None
    out_len = figures.highest(p.output_len for p in kept)
    cells: dict[tuple, list[Point]] = defaultdict(list)
    for p in kept:
        if p.output_len == out_len:
            cells[(p.tp, p.concurrency, p.temperature)].append(p)
    order = sorted(cells, key=lambda k: (figures.nulls_last(k[1]), k[2], k[0]))
    shown = [(key, cells[key]) for key in order[:MAX_CATEGORY_CELLS]]
    return {"output_len": out_len, "cells": shown, "more": max(0, len(order) - MAX_CATEGORY_CELLS),
            "run_ids": [p.run_id for _, ps in shown for p in ps]}


def category_section(cells: dict[str, Any] | None, figures_by_run: dict[int, list[dict[str, Any]]],
                     selection: Selection) -> dict[str, Any] | None:
    """The sweep page's verdicts per prompt category (benchkit.compare.categories.category_matrix)
    of `category_cells`' cells, each ranked by the headline's figure for its concurrency, from
    `figures_by_run` (runs.selectors.category_figures of the cells' runs); None when no run has
    categories. {"output_len", "matrices": [CategoryMatrix with `cell` {"tp", "concurrency",
    "temperature"}], "more": cells left out (MAX_CATEGORY_CELLS), "pooled_note": what the
    all-prompts headline pools (a disagreeing matrix's note first), "disagree": some cell's
    categories name different winners beyond noise}."""
    if not cells or not figures_by_run:
        return None
    matrices = []
    for (tp, conc, temp), ps in cells["cells"]:
        m = categories.category_matrix(ps, figures_by_run, verdicts.figure_for(selection.speedup, conc),
                                       selection.baseline)
        if m is not None:
            m.cell = {"tp": tp, "concurrency": conc, "temperature": f"{temp:g}"}
            for row in m.rows:  # formatted here: floatformat on every cell cost the page ~40 ms
                for c in row.cells:
                    r = c["ratio"]
                    c["text"] = f"{r.value:.2f}×" if r is not None and r.value is not None else ""
                    c["ci"] = f"[{r.ci95[0]:.2f}–{r.ci95[1]:.2f}]" if r is not None and r.ci95 else ""
                    c["reason"] = r.reason if r is not None else "not measured"
                    c["tau_text"] = f"τ {c['tau']:.2f}" if c["tau"] is not None else ""
            matrices.append(m)
    if not matrices:
        return None
    return {"output_len": cells["output_len"], "matrices": matrices, "more": cells["more"],
            "pooled_note": next((m.pooled_note for m in matrices if m.disagree), matrices[0].pooled_note),
            "disagree": any(m.disagree for m in matrices)}


def config_table(state_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's runs per configuration (rows, in config order) and TP degree (columns), from
    runs.selectors.config_state_counts rows: {"tps": [tp...], "rows": [{"label", "title",
    "cells": [{"tp", "succeeded", "failed", "invalidated", "pending", "total"} | None per tp]}]}."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    first: dict[str, dict] = {}
    for r in state_rows:
        label = method_label(*_decoding(r))
        first.setdefault(label, r)
        cell = cells.setdefault((label, r["tp"]), {"tp": r["tp"], "succeeded": 0, "failed": 0, "invalidated": 0,
                                                   "pending": 0, "total": 0})
        key = r["state"] if r["state"] in (RunState.SUCCEEDED, RunState.FAILED, RunState.INVALIDATED) else "pending"
        cell[key] += r["n"]
        cell["total"] += r["n"]
    tps = sorted({tp for _, tp in cells})
    labels = sorted(first, key=lambda lab: config_order(*_decoding(first[lab])))
    return {"tps": tps, "rows": [{"label": lab, "title": method_title(first[lab]["method"]),
                                  "cells": [cells.get((lab, tp)) for tp in tps]} for lab in labels]}


def config_legend(dims: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(label, what it means) per configuration family present, e.g. ("b15, b16", "DDTree with
    that tree budget"), for readers who do not know the users' labels (benchkit.methods)."""
    seen: dict[str, list[str]] = {}
    for lab, d in sorted(((method_label(*_decoding(d)), d) for d in dims),
                         key=lambda t: config_order(*_decoding(t[1]))):
        seen.setdefault(d["method"], [])
        if lab not in seen[d["method"]]:
            seen[d["method"]].append(lab)
    out = []
    for method, labels in seen.items():
        what = method_title(method)
        if method == "ddtree":
            what += " with that tree budget (draft nodes per step)"
        elif any(" k=" in lab for lab in labels):
            what += ", k draft tokens per step"
        out.append((", ".join(labels), what))
    return out


def progress_of(state_rows: list[dict[str, Any]]) -> dict[str, int]:
    """{"total", "finished", "active"} run counts of a sweep from its config_state_counts rows."""
    total = sum(r["n"] for r in state_rows)
    finished = sum(r["n"] for r in state_rows
                   if r["state"] in (RunState.SUCCEEDED, RunState.FAILED, RunState.INVALIDATED))
    active = sum(r["n"] for r in state_rows if r["state"] in ACTIVE_STATES)
    return {"total": total, "finished": finished, "active": active}


def filter_options(dims: list[dict[str, Any]], selection: Selection) -> dict[str, Any]:
    """The sweep page's filter form: for tp, concurrency, output_len and method the values
    present (with `checked`), and the baseline choices (every configuration label present)."""
    labels = dimension_labels(dims)

    def ints(name: str) -> list[dict[str, Any]]:
        chosen = getattr(selection, name)
        # a value an imported file did not record (None) cannot be chosen in the URL
        return [{"value": v, "checked": v in chosen} for v in sorted({d[name] for d in dims} - {None})]

    return {"tp": ints("tp"), "concurrency": ints("concurrency"), "output_len": ints("output_len"),
            "method": [{"value": lab, "checked": lab in selection.method} for lab in labels],
            "baseline": [{"value": lab, "selected": lab == selection.baseline} for lab in labels or ["auto"]]}


def build_sweep_page(points: list[Point], dims: list[dict[str, Any]], selection: Selection,
                     state_rows: list[dict[str, Any]], failures: dict[str, int],
                     cells: dict[str, Any] | None = None,
                     figures_by_run: dict[int, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Context of the sweep page besides its figures (which the page's script reads from the
    JSON endpoint): the headline, the per-configuration run table, the filter form, the
    failure summary and the GPU-consistency flag; the excluded points (`excluded_rows`) and the
    page's line about them (benchkit.compare.verdicts.excluded_line); the speedup choices; the
    verdicts per prompt category (`category_section` of `category_cells`' `cells` and their
    runs' `figures_by_run`, runs.selectors.category_figures)."""
    speedups, reasons = verdict_speedups(points, selection.baseline)
    excluded = [p for p in points if p.run_id in reasons and (selection.shows(p) or p.label == selection.baseline)]
    return {
        "headline": headline(speedups, points, selection),
        "categories": category_section(cells, figures_by_run or {}, selection),
        "excluded_line": verdicts.excluded_line(excluded, reasons),
        "speedup_choices": [{"value": k, "text": v, "selected": k == selection.speedup}
                            for k, v in verdicts.SPEEDUP_CHOICES.items()],
        "config_table": config_table(state_rows),
        "legend": config_legend(dims),
        "progress_counts": progress_of(state_rows),
        "filters": filter_options(dims, selection),
        "selection": selection,
        "failures": failures,
        "n_counted": len(points),
        "inconsistent_tps": inconsistent_gpu_tps(points),
        "figure_keys": SWEEP_FIGURES,
    }


def run_row(run) -> dict[str, Any]:
    """One row of the paginated run list: the run and its summary figures (None when unknown
    or the run does not count)."""
    m = getattr(run, "metrics", None) if run.state == RunState.SUCCEEDED else None
    return {"run": run, "values": [getattr(m, f) if m else None for f in figures.POINT_METRICS]}


RUN_LIST_HEADERS = [METRICS[f].header for f in figures.POINT_METRICS]


def gpu_rows(m) -> list[dict[str, Any]]:
    """One row per GPU of a metrics row's `efficiency` (benchkit.measure.efficiency.GpuEnergy
    dicts) with its clock events seen (named, gpu_validity.bit_names) and its verdicts from
    `gpu_check`: {"index", "uuid", "mean_power_w", "peak_power_w", "energy_j", "energy_source",
    "energy_note", "sm_clock_min_mhz", "util_gpu_mean_pct", "temp_max_c", "clock_events",
    "verdicts": [message]}."""
    eff = (m.efficiency if m else None) or {}
    check = (m.gpu_check if m else None) or {}
    seen = check.get("clock_events_seen") or {}
    rows = []
    for g in eff.get("gpus") or []:
        mask = seen.get(g["uuid"], g.get("clock_events_seen", 0))
        rows.append({**g, "clock_events": bit_names(mask) if mask else "none",
                     "verdicts": [f"{v['code']}: {v['message']}" for v in check.get("verdicts") or []
                                  if v.get("gpu_uuid") == g["uuid"]]})
    return rows


def telemetry_message(run, m, has_series: bool) -> str:
    """What the run page says about the run's GPU telemetry: the CPU run's note, the notes of its
    efficiency figures and GPU check, or "" when there is nothing to say. An imported run says
    that its file carries no GPU telemetry (not that it had no GPUs)."""
    if (run.spec or {}).get("imported"):
        return "no GPU telemetry: the run was imported from another tool's result file"
    if not run.gpus:
        return NO_GPUS_NOTE
    notes = [*(((m.efficiency or {}).get("notes") or []) if m else []), *(((m.gpu_check or {}).get("notes") or [])
                                                                            if m else [])]
    if not has_series and not notes:
        return "no GPU telemetry was recorded for this run"
    return "; ".join(n for n in notes if not n.startswith("no GPU-hour price"))


def coalesced_note(m) -> str:
    """The run page's note beside ITL / ICL when more than COALESCED_NOTE_SHARE of the gaps
    between token-carrying messages were below COALESCED_GAP_MS ("coalesced arrivals", issue
    13): those medians fall towards 0 and TPOT is the figure to read; "" otherwise."""
    share = getattr(m, "coalesced_share", None) if m else None
    if share is None or share <= COALESCED_NOTE_SHARE:
        return ""
    return (f"{share:.0%} of the gaps between token-carrying messages were below {COALESCED_GAP_MS:g} ms "
            f"(coalesced arrivals: several messages reached the client in one read; above "
            f"{COALESCED_NOTE_SHARE:.0%} this note shows). ITL and ICL medians then fall towards 0 and do not "
            "measure the server's step time: read TPOT instead.")


def build_run(run, sweep_name: str, gpu_series: dict[str, Any] | None = None,
              cost: tuple[float | None, float | None] = (None, None)) -> dict[str, Any]:
    """Context of a run page: distribution figures (TTFT, ITL per token, ICL per chunk, tokens
    per chunk; binned here), its latency statistics (one row ("TTFT (ms)", [mean, median, std,
    p90, p95, p99]) per latency metric of the schema), the method's title (benchkit.methods),
    and how to reproduce it: the sweep-file fragment of the point (None for an imported run)
    and the exact command line with the server's environment. GPU telemetry (issue 12): the
    figure "GPU power, SM clock and utilisation" from `gpu_series` (runs.selectors.gpu_series),
    per-GPU rows (`gpu_rows`), what to say when there is none (`telemetry_message`) and `cost`
    ((USD per million output tokens, USD per GPU-hour used), runs.selectors.cost_of). Client
    (issue 13): the coalesced-arrivals note (`coalesced_note`). Lossless check (issue 18):
    `lossless` (`lossless_section`)."""
    m = getattr(run, "metrics", None)
    d = (m.distributions if m else None) or {}
    figs = {}
    for key, title, unit in (("ttft_ms", "TTFT", "ms"), ("itl_ms", "ITL (per token)", "ms/token"),
                             ("icl_ms", "ICL (per chunk)", "ms"),
                             ("tokens_per_chunk", "Tokens per chunk (every chunk, each request's first included)",
                              "tokens")):
        if d.get(key):
            figs[key] = figures.distribution_figure(d[key], title, unit)
    stats_rows = []
    coalesced = coalesced_note(m)
    if m:
        for key, (label, unit) in LATENCY_METRICS.items():
            head = f"{label} ({unit})"
            if coalesced and key in ("itl", "icl"):
                head += " · coalesced arrivals: read TPOT"
            stats_rows.append((head, [getattr(m, f"{stat}_{key}_ms") for stat in STAT_NAMES]))
    spec: RunSpec | None = spec_from_stored(run.spec or {})
    fragment = point_sweep_file(spec, f"{sweep_name} run {run.pk}",
                                f"Reproduces run {run.pk} (repeat {run.repeat_index})") if spec else None
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted((run.server_env or {}).items()))
    return {"figures": figs, "stats_rows": stats_rows, "stat_names": STAT_NAMES,
            "gpu_figure": figures.gpu_timeline_figure(gpu_series) if gpu_series else None,
            "gpu_rows": gpu_rows(m), "telemetry_message": telemetry_message(run, m, gpu_series is not None),
            "cost_usd_per_m_output_tokens": cost[0], "price_usd_per_gpu_hour": cost[1],
            "coalesced_note": coalesced, "coalesced_gap_ms": COALESCED_GAP_MS,
            "method_title": method_title(run.method), "fragment": fragment, "lossless": lossless_section(run),
            "command": f"env {env} {run.command_line}" if env and run.argv else run.command_line}


#: At most this many divergence positions are listed on the run page.
RUN_PAGE_DIVERGENCES = 40


def lossless_section(run) -> dict[str, Any]:
    """The run page's lossless check, from the run's LosslessCheck row and its outputs blob's
    small columns (loaded with the run: runs.selectors.RUN_PAGE_RELATED, the blob's data
    deferred and never read here).

    {"check": the LosslessCheck or None, "verdict", "sentence", "short", "marked", "divergences":
    [(position, prompt index)] sorted by position (at most RUN_PAGE_DIVERGENCES) and "more" (how
    many were left out), "floor_pairs": [(run a, run b, compared, identical, share)], "outputs":
    what the run kept ("16 requests, token ids, 16 whole" / why none), "client": what the load
    client asked ({option: value}), "note": what to say when there is no verdict}."""
    check = getattr(run, "lossless", None)
    blob = getattr(run, "outputs_blob", None)
    if blob is not None:
        outputs = f"{blob.n_requests} requests digested ({_KINDS.get(blob.kind, blob.kind)}), {blob.n_full} kept whole"
    elif run.result_file_id:
        outputs = "none: imported from another tool's result file"
    else:
        outputs = "none kept"
    out: dict[str, Any] = {"check": check, "outputs": outputs, "client": run.client_options or {}, "note": ""}
    if check is None:
        out["note"] = ("autoregressive: this run is a baseline of the lossless check" if run.method == "auto" else
                       "not computed yet (it is computed when the sweep's last run finishes; "
                       f"`manage.py check_lossless --sweep {run.sweep_id}`)")
        return out
    divs = sorted((pos, idx) for idx, pos in check.divergences)
    out.update(verdict=check.verdict, sentence=check.sentence, short=lossless.SHORT.get(check.verdict, ""),
               marked=check.verdict in lossless.MARKED, divergences=divs[:RUN_PAGE_DIVERGENCES],
               more=max(0, check.compared - check.identical - RUN_PAGE_DIVERGENCES),
               floor_pairs=[(a, b, n, i, i / n if n else None) for a, b, n, i in check.floor_pairs])
    return out


_KINDS = {"ids": "token ids", "text": "text only: the engine returns no token ids", "mixed": "token ids and text",
          "none": "no output: every request failed"}
