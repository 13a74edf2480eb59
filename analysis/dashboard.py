"""Build the context of dashboard pages from loaded rows (no queries here)."""

from __future__ import annotations

from typing import Any

from analysis import figures
from benchkit.compare.speedups import compute_speedups, inconsistent_gpu_tps
from benchkit.measure.metrics import LATENCY_METRICS, STAT_NAMES, SUMMARY_FIELDS
from benchkit.methods import method_title
from runs.selectors import counted_points


def sweep_results(runs) -> tuple[list[dict[str, Any]], list]:
    """(points, speedups) of a sweep's counted runs: only succeeded runs count."""
    points = counted_points(runs)
    return points, compute_speedups(points)


def build_sweep(sweep, runs) -> dict[str, Any]:
    """Points, speedups, the three sweep figures and per-run table rows for a sweep page.

    Only succeeded runs count; every run still gets a table row (with its state), whose
    `summary` holds the values of the schema's summary metrics (`summary_headers`), None where
    unknown or the run does not count."""
    points, speedups = sweep_results(runs)
    by_point = {p["run_id"]: p for p in points}
    sp_by_run = {rid: sp for sp in speedups for rid in sp.run_ids}
    rows = []
    for r in runs:
        sp = sp_by_run.get(r.pk)
        m = r.metrics if r.counts else None
        rows.append({"run": r, "metrics": m, "summary": [getattr(m, f.name) if m else None for f in SUMMARY_FIELDS],
                     "speedup": sp.value if sp else None, "baseline": sp.baseline_run_ids if sp else [],
                     "speedup_reason": sp.reason if sp else ""})
    figs = {
        "speedup": figures.speedup_figure(speedups, by_point),
        "throughput": figures.throughput_figure(points),
        "acceptance": figures.acceptance_figure(points),
    }
    return {"points": points, "speedups": speedups, "rows": rows, "figures": figs,
            "summary_headers": [f.header for f in SUMMARY_FIELDS],
            "inconsistent_tps": inconsistent_gpu_tps(points), "n_counted": len(points)}


def build_run(run) -> dict[str, Any]:
    """Distribution figures of a run page (TTFT, ITL per token, ICL per chunk, tokens per chunk),
    its latency statistics (one row ("TTFT (ms)", [mean, median, std, p90, p95, p99]) per latency
    metric of the schema) and the method's title (benchkit.methods)."""
    m = getattr(run, "metrics", None)
    d = (m.distributions if m else None) or {}
    figs = {}
    for key, title, unit in (("ttft_ms", "TTFT", "ms"), ("itl_ms", "ITL (per token)", "ms/token"),
                             ("icl_ms", "ICL (per chunk)", "ms"), ("tokens_per_chunk", "Tokens per chunk", "tokens")):
        if d.get(key):
            figs[key] = figures.distribution_figure(d[key], title, unit)
    stats_rows = []
    if m:
        for key, (label, unit) in LATENCY_METRICS.items():
            stats_rows.append((f"{label} ({unit})", [getattr(m, f"{stat}_{key}_ms") for stat in STAT_NAMES]))
    return {"figures": figs, "stats_rows": stats_rows, "stat_names": STAT_NAMES,
            "method_title": method_title(run.method)}
