"""Compare two sweeps point by point (issue 9, "Compare page"): pure functions over points
(benchkit.point.Point; `runs.selectors.history_points` loads them with their
`hardware_fingerprint`, the host's `HostInventory.fingerprint()` in force when the run started).

- **The same point** in two sweeps: equal `Point.identity_key()` (engine, model, drafter,
  decoding configuration, TP, workload; not GPUs, not repeat index). Repeats of one identity
  are pooled.
- **Comparable**: equal environment (`Point.env_key()`: engine version, build and commit,
  hardware fingerprint). Where the environments differ the two sides are put apart
  (`SweepDiff.apart`), with the reason, and given no verdict: they are never compared silently.
- **Change** of a metric: median(new) / median(old) - 1, in %. With >= `MIN_REPEATS_FOR_CI`
  repeats on both sides, a 95 % percentile-bootstrap interval of that change
  (benchkit.compare.stats, MEASUREMENT.md "Repeats"); the verdict is better / worse only when
  the interval excludes 0 (in the metric's good / bad direction), else "no significant change".
  With fewer repeats the verdict compares |change| with `noise_pct` and says "single run".
- The point's verdict is the verdict of its speed (`benchkit.point.SPEED_FIELD`, output tok/s,
  the figure an end-to-end speedup divides); TPOT, TTFT and tau carry their own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from benchkit.compare.speedups import MIN_REPEATS_FOR_CI
from benchkit.compare.stats import median, median_ratio_cis
from benchkit.point import ENV_FIELDS, SPEED_FIELD, Point

#: Compared metrics (benchkit.measure.metrics.WindowMetrics fields) -> +1 when higher is better,
#: -1 when lower is better; the first is the point's verdict.
COMPARE_METRICS: dict[str, int] = {
    SPEED_FIELD: +1,
    "median_tpot_ms": -1,
    "median_ttft_ms": -1,
    "acceptance_length": +1,
}

BETTER, WORSE, SAME, UNKNOWN = "better", "worse", "no significant change", "unknown"


def env_difference(old: tuple, new: tuple) -> str:
    """Human sentence naming what differs between two `Point.env_key()`s ("" when equal), e.g.
    `engine version 0.9.1 -> 0.10.0; hardware fingerprint 3fa2.. -> 77c1..`."""
    parts = []
    for name, a, b in zip(ENV_FIELDS, old, new, strict=True):
        if a != b:
            if name == "hardware_fingerprint":
                a, b = (a or "?")[:8], (b or "?")[:8]
            parts.append(f"{name.replace('_', ' ')} {a or '?'} -> {b or '?'}")
    return "; ".join(parts)


@dataclass
class MetricChange:
    """One metric of one matched point: medians of each side (the metric's unit), change in %
    (new vs old), its 95 % CI in % (None without enough repeats) and the verdict."""

    metric: str
    old: float | None
    new: float | None
    change_pct: float | None = None
    ci95_pct: tuple[float, float] | None = None
    verdict: str = UNKNOWN


@dataclass
class PointDiff:
    """One point present in both sweeps. `point`: the new sweep's first run of it (its
    configuration: `d.point.tp`, `d.label`); `key` its `identity_key()`. `changes`: metric ->
    MetricChange (COMPARE_METRICS); `verdict`: the speed figure's; `single_run`: fewer than
    MIN_REPEATS_FOR_CI repeats on a side (verdict by the noise threshold). `apart_reason` is
    non-empty when the environments differ (then every verdict is "unknown")."""

    key: tuple
    point: Point
    old_run_ids: list[int]
    new_run_ids: list[int]
    changes: dict[str, MetricChange]
    verdict: str
    single_run: bool
    old_env: tuple
    new_env: tuple
    apart_reason: str = ""

    @property
    def label(self) -> str:
        return self.point.label


@dataclass
class Unmatched:
    """A point only one sweep has: its first run (`point`) and the runs of its repeats."""

    point: Point
    run_ids: list[int]


@dataclass
class SweepDiff:
    """Result of `compare_sweeps`: `matched` (comparable, with verdicts), `apart` (same point,
    different environment: values side by side, no verdict), `only_old` / `only_new` (points
    one sweep lacks), and `counts` of matched verdicts."""

    matched: list[PointDiff] = field(default_factory=list)
    apart: list[PointDiff] = field(default_factory=list)
    only_old: list[Unmatched] = field(default_factory=list)
    only_new: list[Unmatched] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """{better, worse, no significant change, unknown: count} over `matched`."""
        out = {BETTER: 0, WORSE: 0, SAME: 0, UNKNOWN: 0}
        for d in self.matched:
            out[d.verdict] += 1
        return out


def _verdict(change: float, lo: float | None, hi: float | None, direction: int, noise: float) -> str:
    """better / worse / no significant change for a change (fraction), its CI (or None) and the
    metric's direction (+1 higher is better)."""
    if lo is not None and hi is not None:
        if lo > 0 or hi < 0:
            return BETTER if (lo > 0) == (direction > 0) else WORSE
        return SAME
    if abs(change) < noise:
        return SAME
    return BETTER if (change > 0) == (direction > 0) else WORSE


def _group(points: Iterable[Point]) -> dict[tuple, list[Point]]:
    out: dict[tuple, list[Point]] = defaultdict(list)
    for p in points:
        out[p.identity_key()].append(p)
    return out


def _columns(ps: list[Point], names: tuple[str, ...]) -> dict[str, list[float]]:
    """{metric: its known values over the points `ps`, in order} (None left out)."""
    return {m: [v for p in ps if (v := getattr(p, m)) is not None] for m in names}


def compare_sweeps(old_points: Iterable[Point], new_points: Iterable[Point], noise_pct: float = 5.0,
                   metrics: dict[str, int] | None = None) -> SweepDiff:
    """Compare the counted points of sweep `old` with those of sweep `new` (see module doc).

    `noise_pct`: with fewer than MIN_REPEATS_FOR_CI repeats on a side, a change smaller than
    this (in %) is "no significant change". `metrics`: name -> direction (default
    COMPARE_METRICS; the points must carry them). A point whose repeats span several
    environments on one side takes the environment of its first run and is put apart if the
    sides differ. Output lists are in the grid's order (`Point.grid_key`).
    """
    metrics = metrics or COMPARE_METRICS
    noise = noise_pct / 100.0
    names = tuple(metrics)
    old_g, new_g = _group(old_points), _group(new_points)
    diff = SweepDiff()
    values: dict[tuple, tuple[dict[str, list[float]], dict[str, list[float]]]] = {}
    for key, new_ps in new_g.items():
        old_ps = old_g.get(key)
        if old_ps is None:
            diff.only_new.append(Unmatched(new_ps[0], [p.run_id for p in new_ps]))
            continue
        oe, ne = old_ps[0].env_key(), new_ps[0].env_key()
        ov, nv = _columns(old_ps, names), _columns(new_ps, names)
        values[key] = (ov, nv)
        changes = {}
        for m in metrics:
            c = changes[m] = MetricChange(m, median(ov[m]), median(nv[m]))
            if c.old is not None and c.new is not None and c.old > 0:
                c.change_pct = (c.new / c.old - 1.0) * 100.0
        d = PointDiff(key=key, point=new_ps[0], old_run_ids=[p.run_id for p in old_ps],
                      new_run_ids=[p.run_id for p in new_ps], changes=changes, verdict=UNKNOWN,
                      single_run=min(len(old_ps), len(new_ps)) < MIN_REPEATS_FOR_CI, old_env=oe, new_env=ne,
                      apart_reason=env_difference(oe, ne) if oe != ne else "")
        (diff.apart if d.apart_reason else diff.matched).append(d)
    for key, old_ps in old_g.items():
        if key not in new_g:
            diff.only_old.append(Unmatched(old_ps[0], [p.run_id for p in old_ps]))
    # bootstrap CIs for every matched (metric, point) with enough repeats, in one call
    todo, olds, news = [], [], []
    for m, direction in metrics.items():
        for d in diff.matched:
            c = d.changes[m]
            if c.change_pct is None:
                continue
            ov, nv = values[d.key][0][m], values[d.key][1][m]
            if len(ov) >= MIN_REPEATS_FOR_CI and len(nv) >= MIN_REPEATS_FOR_CI:
                todo.append((c, direction))
                olds.append(ov)
                news.append(nv)
            else:
                c.verdict = _verdict(c.change_pct / 100.0, None, None, direction, noise)
    if todo:
        cis = median_ratio_cis(news, olds) - 1.0
        for (c, direction), (lo, hi) in zip(todo, cis.tolist(), strict=True):
            c.ci95_pct = (lo * 100.0, hi * 100.0)
            c.verdict = _verdict(c.change_pct / 100.0, lo, hi, direction, noise)
    for d in diff.matched:
        d.verdict = d.changes[SPEED_FIELD].verdict if SPEED_FIELD in d.changes else UNKNOWN
    for lst in (diff.matched, diff.apart, diff.only_old, diff.only_new):
        lst.sort(key=lambda x: x.point.grid_key())
    return diff
