"""Change points over the whole history of one point of a nightly series (issue 21): pure,
Django-free, deterministic. docs/CHANGEPOINTS.md states the method; in short:

A *series* is one point (configuration x TP x concurrency x output length) night by night,
oldest first (`Night`: the sweep id, the night's repeats per metric, its environment). Each
metric of `ChangePointRule.metrics` (default: output tok/s, median TPOT, tau, each with its good
direction) is analysed as follows.

1. **Candidates.** Each metric's per-night means become `100 ln(mean / median)` (per cent
   around the series' median) divided by a robust night-to-night noise estimate (the median
   absolute first difference x 1.4826 / sqrt 2, at least `noise_floor_pct`), so that every
   metric has unit noise. `ruptures.Pelt` (cost `l2`, a change in mean, `min_size` =
   `min_segment_nights`, every night a possible boundary) segments each metric alone and all
   metrics together (the standardised metrics stacked as one d-dimensional signal) with the
   penalty `penalty_scale x (d + 1) x ln n` (BIC for a change in the mean of d unit-variance
   signals: d means and one location per change point; n nights). Every environment change
   (hardware fingerprint, driver, engine build or commit, drafter: whatever `Night.env`
   holds) is a candidate too, a known boundary. Candidates within one night of each other are
   one candidate, at the night where a two-segment split fits best.
2. **Significance and magnitude** (the merge step of Apache Otava, formerly DataStax Hunter,
   `otava/analysis.py` `merge`: Fleming et al., "Hunter: Using Change Point Detection to Hunt
   for Performance Regressions", ICPE 2023). Each candidate is tested on its two adjacent
   segments (bounded by its neighbouring candidates), metric by metric, with the per-night
   repeats where a night has several: a two-sided Student's t-test
   (`scipy.stats.ttest_ind`, equal variances, as Otava's `TTestSignificanceTester`) at level
   `alpha` (Otava's default 0.001), and the change of the means must be at least
   `min_magnitude_pct`. A metric that passes both *moved*. The candidate whose best metric is
   weakest (largest p among metrics past the magnitude; 1 where none is) is removed while it
   fails, and its neighbours are re-tested against the wider segments, until every candidate
   has a metric that moved.
3. **Step or drift.** Each kept change is a step at its boundary, or a *ramp* through it (flat
   up to night k1, a straight line to the new level at night k2 >= k1 + `min_drift_nights`,
   flat after), whichever fits the metrics that moved there better (least squares over every
   k1 < boundary <= k2, the metrics standardised as in 1), fitted on the nights between its
   neighbours' shapes, repeated until no shape changes. A ramp is a *drift* only when at least
   one metric's ramp coefficient is significant at `alpha` (Student's t) with a total change of
   at least `min_magnitude_pct`, and no metric moves `min_magnitude_pct` or more per night (a
   run of small same-direction changes; faster is a step seen through noise). Neighbouring
   changes that move the same way are joined into one drift where the level between them holds
   for at most `min_drift_nights` nights, or one ramp fits them within PELT's penalty for one
   more change. A drift's night is its first changed night (k1 + 1); its figures are the ramp's
   fitted levels before and after.

Environment changes never hide a change point: a change point at, or one night next to, an
environment change names the difference (`ChangePoint.env_changes`), and `env_changes(nights)`
lists every one, moved or not.

Which rule proposed each change point is kept (`ChangePoint.found_by`: `joint`, `metric:NAME`,
`environment`). Nothing is random: the same nights give the same change points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date

import numpy as np

from benchkit.measure.metrics import METRICS

STEP, DRIFT = "step", "drift"
BETTER, WORSE = "better", "worse"
JOINT, ENVIRONMENT = "joint", "environment"


@dataclass(frozen=True)
class SeriesMetric:
    """One figure of a series: `name` a `WindowMetrics` field (unit in the name), `direction`
    +1 where higher is better (tok/s, tau), -1 where lower is (TPOT). Raises ValueError for an
    unknown name or a direction other than +1/-1."""

    name: str
    direction: int

    def __post_init__(self) -> None:
        if self.name not in METRICS:
            raise ValueError(f"change-point metric {self.name!r} is not a WindowMetrics field")
        if self.direction not in (1, -1):
            raise ValueError(f"change-point metric {self.name}: direction must be +1 or -1, got {self.direction}")

    @property
    def label(self) -> str:
        """Display name with unit, e.g. `median TPOT (ms)`."""
        return METRICS[self.name].header


#: Output tok/s (higher is better), median TPOT (lower is), tau (higher is).
DEFAULT_METRICS: tuple[SeriesMetric, ...] = (
    SeriesMetric("output_throughput_tok_s", +1),
    SeriesMetric("median_tpot_ms", -1),
    SeriesMetric("acceptance_length", +1),
)


@dataclass(frozen=True)
class ChangePointRule:
    """Settings of the detection (docs/CHANGEPOINTS.md says why each default).

    `metrics`: the figures analysed. `alpha`: level of the two-sided t-tests (0 < alpha < 1).
    `min_magnitude_pct`: smallest change of the means that counts (> 0, %). `penalty_scale`:
    multiplies PELT's BIC penalty (> 0). `min_segment_nights`: fewest nights on each side of a
    change point (>= 2: a t-test needs a variance). `min_drift_nights`: fewest nights a drift
    spreads over (>= 2). `noise_floor_pct`: the smallest night-to-night noise assumed when
    standardising (> 0, %; a series of identical figures would otherwise divide by zero).
    Raises ValueError naming the bad field.
    """

    metrics: tuple[SeriesMetric, ...] = DEFAULT_METRICS
    alpha: float = 0.001
    min_magnitude_pct: float = 3.0
    penalty_scale: float = 1.0
    min_segment_nights: int = 2
    min_drift_nights: int = 3
    noise_floor_pct: float = 0.5

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("change-point metrics: at least one metric is needed")
        if len({m.name for m in self.metrics}) != len(self.metrics):
            raise ValueError("change-point metrics: a metric is listed twice")
        if not 0 < self.alpha < 1:
            raise ValueError(f"change-point alpha must be in (0, 1), got {self.alpha}")
        for name in ("min_magnitude_pct", "penalty_scale", "noise_floor_pct"):
            if not getattr(self, name) > 0:
                raise ValueError(f"change-point {name} must be > 0, got {getattr(self, name)}")
        if self.min_segment_nights < 2:
            raise ValueError(f"change-point min_segment_nights must be >= 2, got {self.min_segment_nights}")
        if self.min_drift_nights < 2:
            raise ValueError(f"change-point min_drift_nights must be >= 2, got {self.min_drift_nights}")


@dataclass(frozen=True)
class Night:
    """One night of one point.

    `sweep_id`: the night's sweep. `values`: metric name -> the night's repeats (one figure per
    counted run of the point that night, in the metric's unit; a metric absent or empty is
    unknown that night, never 0). `env`: environment field -> value (e.g.
    `hardware_fingerprint`, `driver_version`, `engine_version`, `engine_build`,
    `engine_commit`, `drafter`; "" = unknown); the fields compared are those either night has.
    `day`: the night's date, for sentences.
    """

    sweep_id: int
    values: Mapping[str, Sequence[float]]
    env: Mapping[str, str] = field(default_factory=dict)
    day: date | None = None


@dataclass(frozen=True)
class EnvChange:
    """An environment field that differs from the night before: first seen at night `index`
    (0-based position in the series) of sweep `sweep_id`."""

    index: int
    sweep_id: int
    name: str
    before: str
    after: str

    def sentence(self) -> str:
        """E.g. `driver_version 575.57.08 -> 580.65.06`."""
        return f"{self.name} {self.before or '?'} -> {self.after or '?'}"


@dataclass(frozen=True)
class MetricShift:
    """How one metric moved at a change point.

    Step: `before_mean`, `after_mean` are the means (metric's unit) of every repeat of the
    nights before and after it (`ChangePoint.before` / `.after`), `p_value` the two-sided
    Student's t-test's on those repeats, `start_index` = `end_index` = the change point's night.
    Drift: the ramp's fitted levels before and after, `p_value` the ramp coefficient's,
    `start_index` its first changed night, `end_index` its first night at the new level,
    `rate_pct_per_night` the change per night. `change_pct` = after / before - 1, in %;
    `verdict` "better" or "worse" by the metric's direction; `nights_before` / `nights_after`:
    nights with the metric before the change and from its new level on.
    """

    metric: str
    kind: str
    before_mean: float
    after_mean: float
    change_pct: float
    verdict: str
    p_value: float
    start_index: int
    end_index: int
    nights_before: int
    nights_after: int
    rate_pct_per_night: float | None = None


@dataclass(frozen=True)
class ChangePoint:
    """One change point of a series.

    `index`: 0-based position of its night in the series (the first night of the new level; a
    drift's first changed night), `sweep_id` that night's sweep. `kind`: "step" or "drift" (the
    kind of its strongest metric). `shifts`: the metrics that moved, strongest (smallest p)
    first. `env_changes`: environment changes at this night or one night before or after.
    `found_by`: the rules that proposed it (`joint`, `metric:NAME`, `environment`). `before`,
    `after`: the nights compared, as [start, stop) positions: from the previous change's new
    level to this change, and from this change's new level to the next change (for a drift:
    before its ramp, and from the ramp's end on); `benchkit.compare.attribution` reads the
    twin's figures over the same nights.
    """

    index: int
    sweep_id: int
    kind: str
    shifts: tuple[MetricShift, ...]
    env_changes: tuple[EnvChange, ...]
    found_by: tuple[str, ...]
    before: tuple[int, int]
    after: tuple[int, int]

    def shift(self, metric: str) -> MetricShift | None:
        """The shift of `metric`, None when it did not move here."""
        return next((s for s in self.shifts if s.metric == metric), None)

    def sentence(self) -> str:
        """One line for a page, e.g. `night 9 (sweep 109), step: median TPOT (ms) 12.10 -> 13.31
        (+10.0 %, worse); found by joint, metric:median_tpot_ms`."""
        moved = "; ".join(
            f"{METRICS[s.metric].header} {s.before_mean:.4g} -> {s.after_mean:.4g} ({s.change_pct:+.1f} %, {s.verdict}"
            + (f", {s.rate_pct_per_night:+.2f} %/night over nights {s.start_index + 1}-{s.end_index + 1}"
               if s.kind == DRIFT else "") + ")"
            for s in self.shifts)
        env = "; environment: " + "; ".join(e.sentence() for e in self.env_changes) if self.env_changes else ""
        found = ", ".join(self.found_by)
        return f"night {self.index + 1} (sweep {self.sweep_id}), {self.kind}: {moved}{env}; found by {found}"


def env_changes(nights: Sequence[Night]) -> list[EnvChange]:
    """Every environment field that differs from the night before, oldest first (fields in name
    order within a night)."""
    out = []
    for i in range(1, len(nights)):
        a, b = nights[i - 1].env, nights[i].env
        for name in sorted(set(a) | set(b)):
            if (a.get(name) or "") != (b.get(name) or ""):
                out.append(EnvChange(i, nights[i].sweep_id, name, a.get(name) or "", b.get(name) or ""))
    return out


# ---------------------------------------------------------------------------------------------
# one metric's figures


class _Figures:
    """One metric over the series: `t` night index and `y` value of every repeat; per night the
    mean (NaN where unknown)."""

    def __init__(self, nights: Sequence[Night], metric: SeriesMetric):
        ts, ys = [], []
        for i, night in enumerate(nights):
            for v in night.values.get(metric.name) or ():
                if v is not None and math.isfinite(float(v)):
                    ts.append(i)
                    ys.append(float(v))
        self.metric = metric
        self.t = np.asarray(ts, dtype=int)
        self.y = np.asarray(ys, dtype=float)
        counts = np.bincount(self.t, minlength=len(nights))
        sums = np.bincount(self.t, weights=self.y, minlength=len(nights))
        with np.errstate(invalid="ignore", divide="ignore"):
            self.mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        self.present = counts > 0
        self._z: tuple[float, np.ndarray] | None = None

    def nights_in(self, lo: int, hi: int) -> int:
        """Nights in [lo, hi) with the metric."""
        return int(self.present[lo:hi].sum())

    def values(self, lo: int, hi: int) -> np.ndarray:
        """Every repeat of the nights in [lo, hi)."""
        return self.y[(self.t >= lo) & (self.t < hi)]

    def by_night(self, floor_pct: float) -> np.ndarray:
        """`standardised` at every night's position, NaN where the metric is unknown."""
        if self._z is None or self._z[0] != floor_pct:
            z = np.full(len(self.present), np.nan)
            z[self.present] = self.standardised(floor_pct)
            self._z = (floor_pct, z)
        return self._z[1]

    def standardised(self, floor_pct: float) -> np.ndarray:
        """Per-night means (present nights only) as 100 ln(mean / median) / noise, noise = the
        median absolute first difference x 1.4826 / sqrt 2 (the standard deviation of one night's
        figure, for normal noise, robust to steps), at least `floor_pct`."""
        m = self.mean[self.present]
        if (m <= 0).any():
            raise ValueError(f"{self.metric.name}: figures must be > 0 to compare in per cent")
        pct = 100.0 * np.log(m / np.median(m))
        noise = 1.4826 * float(np.median(np.abs(np.diff(pct)))) / math.sqrt(2) if len(pct) > 1 else 0.0
        return pct / max(noise, floor_pct)


def _t_p(t: float, dof: int) -> float:
    """Two-sided p of Student's t with `dof` degrees of freedom (scipy.special.stdtr, the
    distribution function `scipy.stats.t` evaluates, without its per-call overhead)."""
    from scipy.special import stdtr

    return float(2.0 * stdtr(dof, -abs(t)))


def _ttest(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Student's t-test p, equal variances: the p of `scipy.stats.ttest_ind(a, b)`
    (tests/test_changepoints.py checks they agree), computed directly because the merge runs it
    hundreds of times per series. Both sides without spread: 0 when the means differ, 1 when
    they are equal (scipy would give NaN)."""
    na, nb = len(a), len(b)
    dof = na + nb - 2
    if dof < 1:
        return 1.0
    ma, mb = float(a.mean()), float(b.mean())
    pooled = (float(((a - ma) ** 2).sum()) + float(((b - mb) ** 2).sum())) / dof
    if pooled == 0:
        return 0.0 if ma != mb else 1.0
    return _t_p((ma - mb) / math.sqrt(pooled * (1 / na + 1 / nb)), dof)


def _verdict(change: float, direction: int) -> str:
    return BETTER if change * direction > 0 else WORSE


def _step_shift(f: _Figures, lo: int, c: int, hi: int) -> MetricShift | None:
    """Student's t-test of the repeats of [lo, c) against [c, hi); None when a side lacks nights."""
    nb, na = f.nights_in(lo, c), f.nights_in(c, hi)
    if nb < 2 or na < 2:  # a t-test needs a spread on each side; one night is not a level
        return None
    a, b = f.values(lo, c), f.values(c, hi)
    before, after = float(a.mean()), float(b.mean())
    change = (after / before - 1.0) * 100.0
    return MetricShift(f.metric.name, STEP, before, after, change, _verdict(change, f.metric.direction),
                       _ttest(a, b), c, c, nb, na)


def _moved(s: MetricShift | None, rule: ChangePointRule) -> bool:
    return s is not None and s.p_value < rule.alpha and abs(s.change_pct) >= rule.min_magnitude_pct


def _ramp_rss(t: np.ndarray, y: np.ndarray, k1s: range, k2_min: int, hi: int) -> np.ndarray:
    """Residual sums of squares of the least-squares fits y = a + delta g(t),
    g = clip((t - k1) / (k2 - k1), 0, 1), as an (hi, hi) array indexed [k1, k2] for every k1 in
    `k1s` and max(k1 + 1, k2_min) <= k2 <= hi - 1 (k2 - k1 = 1 is a step at k2); inf elsewhere
    and where g is constant over t."""
    out = np.full((hi, hi), np.inf)
    if len(y) < 3:
        return out
    yc = y - y.mean()
    syy = float(yc @ yc)
    for k1 in k1s:
        k2 = np.arange(max(k1 + 1, k2_min), hi)
        if not len(k2):
            continue
        g = np.clip((t[None, :] - k1) / (k2[:, None] - k1), 0.0, 1.0)
        gc = g - g.mean(axis=1, keepdims=True)
        sgg = (gc * gc).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            rss = np.where(sgg > 0, syy - (gc @ yc) ** 2 / sgg, np.inf)
        out[k1, k2] = np.maximum(rss, 0.0)
    return out


def _ramp_shift(f: _Figures, lo: int, hi: int, k1: int, k2: int, rule: ChangePointRule
                ) -> tuple[MetricShift, bool] | None:
    """The ramp k1 -> k2 (a step where k2 = k1 + 1) fitted to f's repeats over [lo, hi) (None
    when it cannot be fitted), and whether it is significant on its own: its coefficient
    significant at `alpha` (Student's t, n - 2 degrees of freedom) and its total change at
    least `min_magnitude_pct`."""
    sel = (f.t >= lo) & (f.t < hi)
    t, y = f.t[sel], f.y[sel]
    g = np.clip((t - k1) / (k2 - k1), 0.0, 1.0)
    gc, yc = g - g.mean(), y - y.mean()
    sgg = float(gc @ gc)
    if len(y) < 3 or sgg == 0:
        return None
    delta = float(gc @ yc) / sgg
    a = float(y.mean() - delta * g.mean())
    if a <= 0:
        return None
    rss = max(float(yc @ yc) - delta * float(gc @ yc), 0.0)
    se = math.sqrt(rss / (len(y) - 2) / sgg)
    p = (0.0 if delta else 1.0) if se == 0 else _t_p(delta / se, len(y) - 2)
    change = delta / a * 100.0
    shift = MetricShift(f.metric.name, DRIFT, a, a + delta, change, _verdict(change, f.metric.direction), p,
                        k1 + 1, k2, f.nights_in(lo, k1 + 1), f.nights_in(k2, hi), change / (k2 - k1))
    return shift, p < rule.alpha and abs(change) >= rule.min_magnitude_pct


# ---------------------------------------------------------------------------------------------
# 1. candidates and the merge


def _pelt(signal: np.ndarray, rule: ChangePointRule) -> list[int]:
    """PELT (ruptures, l2 cost) boundaries of a (n,) or (n, d) unit-noise signal, excluding n."""
    import ruptures

    n = signal.shape[0]
    if n < 2 * rule.min_segment_nights:
        return []
    d = 1 if signal.ndim == 1 else signal.shape[1]
    pen = rule.penalty_scale * (d + 1) * math.log(n)
    algo = ruptures.Pelt(model="l2", min_size=rule.min_segment_nights, jump=1).fit(signal)
    return [int(b) for b in algo.predict(pen=pen)[:-1]]


def _candidates(figs: list[_Figures], envs: list[EnvChange], n: int, rule: ChangePointRule) -> dict[int, set[str]]:
    """Night index -> the rules that proposed a boundary there."""
    out: dict[int, set[str]] = {}
    joint = []
    for f in figs:
        nights = np.flatnonzero(f.present)
        z = f.standardised(rule.noise_floor_pct)
        for b in _pelt(z, rule):
            out.setdefault(int(nights[b]), set()).add(f"metric:{f.metric.name}")
        if f.present.all():
            joint.append(z)
    if len(joint) > 1:
        for b in _pelt(np.column_stack(joint), rule):
            out.setdefault(b, set()).add(JOINT)
    for e in envs:
        out.setdefault(e.index, set()).add(ENVIRONMENT)
    return out


def _shapes_cost(figs: list[_Figures], lo: int, hi: int, shapes: Sequence[tuple[int, int]], floor_pct: float
                 ) -> float:
    """Summed squares over nights [lo, hi) of the least-squares fit z = a + sum_j delta_j g_j(t),
    g_j = clip((t - k1_j) / (k2_j - k1_j), 0, 1) for each change's (k1, k2) in `shapes` (a step
    at c is (c - 1, c)), each metric of `figs` standardised to unit noise and fitted alone."""
    total = 0.0
    for f in figs:
        z = f.by_night(floor_pct)
        t = np.flatnonzero(~np.isnan(z[lo:hi])) + lo
        if not len(t):
            continue
        x = np.column_stack([np.ones(len(t))] + [np.clip((t - k1) / (k2 - k1), 0.0, 1.0) for k1, k2 in shapes])
        coef = np.linalg.lstsq(x, z[t], rcond=None)[0]
        r = z[t] - x @ coef
        total += float(r @ r)
    return total


def _one_per_cluster(cands: dict[int, set[str]], figs: list[_Figures], n: int, rule: ChangePointRule
                     ) -> dict[int, set[str]]:
    """Candidates within one night of each other become one, at the night of the cluster where a
    step fits the span between the neighbouring clusters best (ties: the earlier night); the
    rules of the cluster are kept together."""
    idx = sorted(i for i in cands if rule.min_segment_nights <= i <= n - rule.min_segment_nights)
    clusters: list[list[int]] = []
    for i in idx:
        if clusters and i - clusters[-1][-1] <= 1:
            clusters[-1].append(i)
        else:
            clusters.append([i])
    out = {}
    for k, cl in enumerate(clusters):
        lo = clusters[k - 1][-1] if k else 0
        hi = clusters[k + 1][0] if k + 1 < len(clusters) else n
        best = min(cl, key=lambda c: (_shapes_cost(figs, lo, hi, [(c - 1, c)], rule.noise_floor_pct), c))
        out[best] = set().union(*(cands[c] for c in cl))
    return out


def _step_shifts(figs: list[_Figures], edges: Sequence[int], i: int) -> list[MetricShift | None]:
    """Each metric's step test at boundary edges[i + 1] between edges[i] and edges[i + 2]."""
    return [_step_shift(f, edges[i], edges[i + 1], edges[i + 2]) for f in figs]


def _merge(bounds: list[int], figs: list[_Figures], n: int, rule: ChangePointRule) -> list[int]:
    """Otava's merge: drop the weakest failing candidate and re-test, until all pass. A
    candidate's strength is the p of its best metric past the minimum magnitude (1.0 where none
    is)."""
    bounds = sorted(bounds)
    while bounds:
        edges = [0, *bounds, n]
        strength = [min((s.p_value for s in _step_shifts(figs, edges, i)
                         if s is not None and abs(s.change_pct) >= rule.min_magnitude_pct), default=1.0)
                    for i in range(len(bounds))]
        weakest = max(range(len(bounds)), key=lambda i: (strength[i], -bounds[i]))
        if strength[weakest] < rule.alpha:
            break
        del bounds[weakest]
    return bounds


# ---------------------------------------------------------------------------------------------
# 2. each change's shape: step or ramp; 3. joins


@dataclass
class _Change:
    """A kept change: its boundary (from the merge), the metrics that moved there, the rules
    that proposed it, and its shape: flat up to night k1, the new level from night k2
    (k2 = k1 + 1: a step at k2)."""

    boundary: int
    moved: list[_Figures]
    found_by: set[str]
    k1: int
    k2: int

    @property
    def is_step(self) -> bool:
        return self.k2 == self.k1 + 1


def _span(changes: list[_Change], j: int, n: int) -> tuple[int, int]:
    """The nights [lo, hi) change j is fitted on: from the first night at the new level of the
    change before (0) to the last night at the old level of the change after (n)."""
    lo = changes[j - 1].k2 if j else 0
    hi = changes[j + 1].k1 + 1 if j + 1 < len(changes) else n
    return lo, hi


def _ramp_is_drift(figs: list[_Figures], moved: list[_Figures], lo: int, hi: int, k1: int, k2: int,
                   rule: ChangePointRule) -> bool:
    """A ramp k1 -> k2 over [lo, hi) is a drift: at least one metric's ramp is significant on its
    own (`_ramp_shift`) and no metric that moved, or whose ramp is significant, moves
    `min_magnitude_pct` or more per night (that is a step seen through noise)."""
    names = {f.metric.name for f in moved}
    fits = [(f, _ramp_shift(f, lo, hi, k1, k2, rule)) for f in figs]
    fits = [(f, fit) for f, fit in fits if fit is not None]
    if not any(ok for _, (_, ok) in fits):
        return False
    return all(abs(s.rate_pct_per_night) < rule.min_magnitude_pct
               for f, (s, ok) in fits if ok or f.metric.name in names)


def _best_ramp(moved: list[_Figures], lo: int, hi: int, k1_max: int, k2_min: int, rule: ChangePointRule
               ) -> tuple[float, int, int]:
    """The ramp over [lo, hi) that fits `moved` together best (their standardised summed
    squares), with k1 <= k1_max, k2 >= k2_min, k2 - k1 >= min_drift_nights and, as for a step,
    `min_segment_nights` nights at the old level (k1 >= lo + min_segment_nights - 1): (summed
    squares, k1, k2), (inf, -1, -1) where none fits. Ties: the earliest start, then the
    shortest."""
    k1s = range(lo + rule.min_segment_nights - 1, min(k1_max, hi - 2) + 1)
    total = np.zeros((hi, hi))
    for f in moved:
        z = f.by_night(rule.noise_floor_pct)
        t = np.flatnonzero(~np.isnan(z[lo:hi])) + lo
        total = total + _ramp_rss(t, z[t], k1s, k2_min, hi)
    k1_grid, k2_grid = np.indices(total.shape)
    total[k2_grid - k1_grid < rule.min_drift_nights] = np.inf
    if not np.isfinite(total).any():
        return math.inf, -1, -1
    k1, k2 = np.unravel_index(int(np.argmin(total)), total.shape)
    return float(total[k1, k2]), int(k1), int(k2)


def _fit_shapes(changes: list[_Change], figs: list[_Figures], n: int, rule: ChangePointRule) -> None:
    """Each change is a step at its boundary or the best ramp through it (k1 < boundary <= k2)
    that fits its metrics better (`_best_ramp` against the step's summed squares) and is a drift
    (`_ramp_is_drift`), fitted on the nights between its neighbours' shapes (`_span`); repeated
    until no shape changes (at most 5 passes)."""
    for _ in range(5):
        changed = False
        for j, ch in enumerate(changes):
            lo, hi = _span(changes, j, n)
            c = ch.boundary
            shape = (c - 1, c)
            step_cost = _shapes_cost(ch.moved, lo, hi, [shape], rule.noise_floor_pct)
            ramp_cost, k1, k2 = _best_ramp(ch.moved, lo, hi, c - 1, c, rule)
            if ramp_cost < step_cost and _ramp_is_drift(figs, ch.moved, lo, hi, k1, k2, rule):
                shape = (k1, k2)
            if shape != (ch.k1, ch.k2):
                ch.k1, ch.k2 = shape
                changed = True
        if not changed:
            break


def _join(changes: list[_Change], figs: list[_Figures], n: int, rule: ChangePointRule) -> bool:
    """Join the first pair of neighbouring changes that is one drift: both move their metrics the
    same way; the level between them holds for at most `min_drift_nights` nights (a run of
    same-direction changes), or one ramp over both fits their metrics (standardised) about as
    well as the two shapes do (its summed squares at most theirs plus PELT's penalty for the
    extra change, (d + 1) ln n); and that ramp is a drift (`_ramp_is_drift`). Returns whether
    it joined one."""
    pen = rule.penalty_scale * math.log(n)
    for j in range(len(changes) - 1):
        a, b = changes[j], changes[j + 1]
        lo, hi = _span(changes, j, n)[0], _span(changes, j + 1, n)[1]
        moved = [f for f in figs if f in a.moved or f in b.moved]
        sa = [s for s, _ in filter(None, (_ramp_shift(f, lo, b.k1 + 1, a.k1, a.k2, rule) for f in a.moved))]
        sb = [s for s, _ in filter(None, (_ramp_shift(f, a.k2, hi, b.k1, b.k2, rule) for f in b.moved))]
        if len({s.verdict for s in (*sa, *sb)}) != 1:
            continue
        two = _shapes_cost(moved, lo, hi, [(a.k1, a.k2), (b.k1, b.k2)], rule.noise_floor_pct)
        one, k1, k2 = _best_ramp(moved, lo, hi, a.boundary - 1, b.boundary, rule)
        touching = b.k1 - a.k2 + 1 <= rule.min_drift_nights
        if (touching or one <= two + (len(moved) + 1) * pen) and _ramp_is_drift(figs, moved, lo, hi, k1, k2, rule):
            changes[j:j + 2] = [_Change(a.boundary, moved, a.found_by | b.found_by, k1, k2)]
            return True
    return False


def _report(changes: list[_Change], figs: list[_Figures], nights: Sequence[Night], envs: list[EnvChange],
            rule: ChangePointRule) -> list[ChangePoint]:
    """A ChangePoint per change: a step's shifts from the t-test of the nights before and after
    it within its span; a drift's from its ramp fitted over its span. Listed: the metrics that
    moved at the merge and any other whose shift is significant past the minimum magnitude."""
    out = []
    for j, ch in enumerate(changes):
        lo, hi = _span(changes, j, len(nights))
        names = {f.metric.name for f in ch.moved}
        shifts = []
        for f in figs:
            if ch.is_step:
                s = _step_shift(f, lo, ch.k2, hi)
                ok = _moved(s, rule)
            else:
                fit = _ramp_shift(f, lo, hi, ch.k1, ch.k2, rule)
                s, ok = fit if fit is not None else (None, False)
            if s is not None and (ok or f.metric.name in names):
                shifts.append(s)
        shifts.sort(key=lambda s: (s.p_value, s.metric))
        night = ch.k1 + 1
        near = tuple(e for e in envs if abs(e.index - night) <= 1 or abs(e.index - ch.boundary) <= 1)
        out.append(ChangePoint(index=night, sweep_id=nights[night].sweep_id, kind=STEP if ch.is_step else DRIFT,
                               shifts=tuple(shifts), env_changes=near, found_by=tuple(sorted(ch.found_by)),
                               before=(lo, night), after=(ch.k2, hi)))
    return out


def detect_change_points(nights: Sequence[Night], rule: ChangePointRule | None = None) -> list[ChangePoint]:
    """The change points of one point's series, oldest first.

    `nights`: oldest first; each night's `values` per metric name of `rule.metrics` (repeats,
    metric's unit, > 0). Metrics with fewer than 2 x `min_segment_nights` nights are not
    analysed; a series shorter than that has none. Raises ValueError for a figure <= 0.
    Deterministic. See the module doc for the method.
    """
    rule = rule or ChangePointRule()
    n = len(nights)
    figs = [f for f in (_Figures(nights, m) for m in rule.metrics) if f.present.sum() >= 2 * rule.min_segment_nights]
    if not figs:
        return []
    envs = env_changes(nights)
    cands = _one_per_cluster(_candidates(figs, envs, n, rule), figs, n, rule)
    bounds = _merge(list(cands), figs, n, rule)
    edges = [0, *bounds, n]
    changes = []
    for i, c in enumerate(bounds):
        moved = [f for f, s in zip(figs, _step_shifts(figs, edges, i), strict=True) if _moved(s, rule)]
        changes.append(_Change(c, moved, set(cands[c]), c - 1, c))
    _fit_shapes(changes, figs, n, rule)
    while _join(changes, figs, n, rule):
        _fit_shapes(changes, figs, n, rule)
    return _report(changes, figs, nights, envs, rule)
