"""Verdicts per prompt category (issue 33): a category x configuration matrix of speedups with
95 % intervals over repeats, and one verdict sentence per category. Pure functions over points
(benchkit.point.Point) and each run's stored per-category figures
(benchkit.measure.categories.CategoryFigures as dicts, `RunMetrics.categories`).

How a category's speedup is formed: each counted run becomes one point per category, the run's
point with its figures replaced by that category's (`median_tpot_ms`, `output_throughput_tok_s`,
`acceptance_length` from the category's token-weighted tau where the engine reported per-request
figures). The category's points go through the same `benchkit.compare.speedups.compute_speedups`
and `benchkit.compare.verdicts.verdict` as the all-prompts headline: the speculative
configuration's category is divided by the matched AR run's same category (the same prompts:
every run of a sweep samples its prompts with the workload's seed), medians over repeats, a
bootstrap interval with >= 3 repeats on each side, a winner only when its interval is separated
from the runner-up's. A category with fewer than MIN_CATEGORY_REQUESTS measured requests in a run
gives that run no figure for it (its median TPOT would rest on a handful of requests), and the
matrix says so.

The all-prompts headline pools the categories: `pooled_note` says so, and says when the
categories' verdicts disagree beyond noise (two categories with different separated winners), so
that no page names one winner for every kind of traffic without saying it pools.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchkit.compare import verdicts
from benchkit.compare.speedups import AUTO, DECODE, Ratio, Speedup, SpeedupFigure, compute_speedups
from benchkit.point import Point

#: Fewest measured requests of a category in one run for the run to give it a figure.
MIN_CATEGORY_REQUESTS = 4


@dataclass
class CategoryRow:
    """One category of the matrix: `category`, `verdict` (benchkit.compare.verdicts.Verdict over
    the configurations' speedups on this category), `ratios` {configuration label: Ratio (value,
    ci95; None value with a reason)}, `taus` {label: median tau on the category (tokens per
    verify step; None unknown)}, `requests` (median measured requests of the category per run),
    `sentence` ("on coding, X is fastest ..." / "on writing, X and Y tie within noise" / why no
    verdict)."""

    category: str
    verdict: verdicts.Verdict
    ratios: dict[str, Ratio] = field(default_factory=dict)
    taus: dict[str, float | None] = field(default_factory=dict)
    requests: int = 0
    sentence: str = ""
    #: per label of the matrix, in its order: {"label", "ratio" (Ratio or None), "tau", "winner"}
    cells: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CategoryMatrix:
    """The matrix of one cell (a TP degree, concurrency and output length): `figure` (the speedup
    it ranks by), `labels` (configurations, baseline first), `rows` (a CategoryRow per category,
    sorted), `pooled_note` (what the all-prompts headline pools, and whether the categories
    disagree beyond noise), `disagree` (two categories name different separated winners)."""

    figure: SpeedupFigure
    labels: list[str]
    rows: list[CategoryRow]
    pooled_note: str
    disagree: bool
    cell: dict[str, Any] = field(default_factory=dict)


#: Separates a point's dataset from its category in the `dataset` of a category point (the
#: dataset is a match field: the category's points match only the same category's baseline).
_TAG = "\x1f"


def category_points(points: Iterable[Point], figures_by_run: Mapping[int, Sequence[Mapping[str, Any]]],
                    min_requests: int = MIN_CATEGORY_REQUESTS) -> dict[str, list[Point]]:
    """{category: the points of that category}: each point's figures replaced by its run's
    figures on the category (`figures_by_run[run_id]`: CategoryFigures dicts) and its `dataset`
    tagged with the category (a match field, so a category's speedup divides by the baseline's
    same category). A run without categories (none, or only the "" category) gives none; a
    category with fewer than `min_requests` measured requests in a run gives that run's point no
    TPOT or throughput (so no speedup: compute_speedups names the figure unknown). Only the
    figures the matrix reads are kept (median_tpot_ms, output_throughput_tok_s,
    acceptance_length, completed)."""
    out: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        figs = figures_by_run.get(p.run_id) or ()
        if not any(f.get("category") for f in figs):
            continue
        for f in figs:
            enough = (f.get("requests") or 0) >= min_requests
            out[f["category"]].append(p.with_only(dataset=f"{p.dataset}{_TAG}{f['category']}", figures={
                "median_tpot_ms": f.get("median_tpot_ms") if enough else None,
                "output_throughput_tok_s": f.get("output_throughput_tok_s") if enough else None,
                "acceptance_length": f.get("tau_token_weighted"), "completed": f.get("requests")}))
    return dict(sorted(out.items()))


def category_matrix(points: Sequence[Point], figures_by_run: Mapping[int, Sequence[Mapping[str, Any]]],
                    figure: SpeedupFigure = DECODE, baseline: str = AUTO,
                    min_requests: int = MIN_CATEGORY_REQUESTS) -> CategoryMatrix | None:
    """The category matrix of the points of ONE cell (one match key per configuration: callers
    pass the points of one TP degree, concurrency and output length), or None when no run has
    categories. Speedups and verdicts as the module docstring says (`figure`: decode by default,
    the headline's figure at concurrency 1); one `compute_speedups` over every category (the
    bootstrap intervals in one batch)."""
    by_cat = category_points(points, figures_by_run, min_requests)
    if not by_cat:
        return None
    by_run = {p.run_id: p for p in points}
    every = [p for ps in by_cat.values() for p in ps]
    sps_of: dict[str, list[Speedup]] = defaultdict(list)
    for sp in compute_speedups(every, baseline, figures=(figure,)):
        sps_of[sp.point.dataset.rpartition(_TAG)[2]].append(sp)
    labels: list[str] = []
    rows = []
    for cat, ps in by_cat.items():
        sps = sps_of[cat]
        v = verdicts.verdict(sps, figure, by_run)
        row = CategoryRow(cat, v)
        reqs = sorted(p.completed or 0 for p in ps)
        row.requests = reqs[len(reqs) // 2]
        taus_of = {p.run_id: p.acceptance_length for p in ps}
        for sp in sps:
            if sp.label not in labels:
                labels.append(sp.label)
            row.ratios[sp.label] = sp.ratios[figure.name]
            taus = sorted(t for t in (taus_of.get(i) for i in sp.run_ids) if t is not None)
            row.taus[sp.label] = taus[len(taus) // 2] if taus else None
        if row.requests < min_requests:
            row.sentence = (f"on {cat}: {row.requests} request(s) per run, too few for a figure "
                            f"(at least {min_requests})")
        else:
            row.sentence = f"on {cat}: {v.sentence}"
        rows.append(row)
    order = {lab: i for i, lab in enumerate(labels)}
    labels.sort(key=lambda lab: (lab != baseline, order[lab]))
    for row in rows:
        won = row.verdict.winner.label if row.verdict.kind == verdicts.WINNER and row.verdict.winner else None
        row.cells = [{"label": lab, "ratio": row.ratios.get(lab), "tau": row.taus.get(lab), "winner": lab == won}
                     for lab in labels]
    winners = {r.verdict.winner.label for r in rows if r.verdict.kind == verdicts.WINNER and r.verdict.winner}
    disagree = len(winners) > 1
    cats = ", ".join(r.category for r in rows)
    note = f"pools {len(rows)} categories ({cats})"
    if disagree:
        note += f"; the categories disagree beyond noise ({', '.join(sorted(winners))} each win one): " \
                "choose by your traffic's category"
    return CategoryMatrix(figure, labels, rows, note, disagree)
