"""Regression detection over a nightly series (issue 9): pure functions over points
(benchkit.point.Point).

A *series* is the sequence of sweeps of one sweep file on one host, oldest first; each sweep is
a *night*. Points are matched across nights by `Point.identity_key()`; the
repeats of a point in one night are pooled. Each rule is checked per point and per metric of
`RegressionRule.metrics` (default: output tok/s, higher is better), on the newest night only
(`detect_regressions`); a back-fill calls it once per night.

- **Rolling-median rule** (`hud`, PyTorch HUD's rule as issue 9 states it): night i is *worse*
  when its median is worse than the median of the per-night medians of the previous
  `window` nights that have the point (at least `min_history` of them) by more than
  `threshold_pct`. A point is flagged on the second of two consecutive worse nights; a third
  worse night raises nothing new (one flag per episode: flagged at t when t and t-1 are worse
  and t-2 is not).
- **Mann-Whitney rule** (`mannwhitney`, needs repeats): night i is worse when its repeats
  (>= `MIN_REPEATS` of them) are stochastically worse than the pooled repeats of the previous
  `window` nights (one-sided Mann-Whitney U, `scipy.stats.mannwhitneyu`, p < `alpha`) *and*
  its median is worse by more than `threshold_pct`. One such night is enough; a point is flagged
  on the first night of an episode (t worse, t-1 not).
- `test="auto"` uses the Mann-Whitney rule where the newest night has >= MIN_REPEATS repeats
  and the baseline pool does too, the rolling-median rule elsewhere.

An environment change (hardware fingerprint, engine version, build) inside the window does
not stop detection — a driver or engine update that slows a point is exactly what a nightly
series is for — but the finding names it (`Finding.note`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from benchkit.compare.stats import median
from benchkit.compare.sweepdiff import env_difference
from benchkit.point import SPEED_FIELD, Point

TESTS = ("auto", "hud", "mannwhitney")
MIN_REPEATS = 3


@dataclass(frozen=True)
class RegressionRule:
    """Settings of the detection (settings.DRAFTBOARD_REGRESSION_*).

    `window`: N previous nights whose median is the baseline (>= 1). `threshold_pct`: how much
    worse than the baseline counts (> 0, in %). `test`: one of TESTS. `alpha`: the Mann-Whitney
    level (0 < alpha < 1). `min_history`: fewest earlier nights a baseline needs (1..window).
    `metrics`: (WindowMetrics field, +1 if higher is better else -1) pairs. Raises ValueError
    naming the bad field.
    """

    window: int = 5
    threshold_pct: float = 10.0
    test: str = "auto"
    alpha: float = 0.05
    min_history: int = 3
    metrics: tuple[tuple[str, int], ...] = ((SPEED_FIELD, +1),)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"regression window must be >= 1 night, got {self.window}")
        if not self.threshold_pct > 0:
            raise ValueError(f"regression threshold_pct must be > 0, got {self.threshold_pct}")
        if self.test not in TESTS:
            raise ValueError(f"regression test must be one of {', '.join(TESTS)}, got {self.test!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"regression alpha must be in (0, 1), got {self.alpha}")
        if not 1 <= self.min_history <= self.window:
            raise ValueError(f"regression min_history must be 1..window ({self.window}), got {self.min_history}")
        for name, direction in self.metrics:
            if direction not in (1, -1):
                raise ValueError(f"regression metric {name}: direction must be +1 or -1, got {direction}")


@dataclass
class Finding:
    """One flagged point on the newest night: `point` is its first run that night (its
    configuration: `f.point.tp`), `point_key` its `identity_hash()`.

    `value` and `baseline`: medians in the metric's unit; `change_pct`: value / baseline - 1 in
    % (negative = slower for tok/s); `previous_change_pct`: the night before's change against
    its own baseline (rolling-median rule; None for Mann-Whitney); `p_value` (Mann-Whitney
    only); `rule`: "hud" or "mannwhitney"; `baseline_sweep_ids`: the nights the baseline used;
    `note`: environment changes in the window ("" when none)."""

    point_key: str
    point: Point
    metric: str
    sweep_id: int
    value: float
    baseline: float
    change_pct: float
    previous_change_pct: float | None
    p_value: float | None
    rule: str
    run_ids: list[int]
    baseline_sweep_ids: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def label(self) -> str:
        return self.point.label


@dataclass
class _Cell:
    """One point on one night: its repeats' values per metric, run ids, environment and first run."""

    values: dict[str, list[float]]
    run_ids: list[int]
    env: tuple
    point: Point


def _cells(points: list[Point], metrics: list[str]) -> dict[tuple, _Cell]:
    out: dict[tuple, _Cell] = {}
    for p in points:
        k = p.identity_key()
        c = out.get(k)
        if c is None:
            c = out[k] = _Cell({m: [] for m in metrics}, [], p.env_key(), p)
        c.run_ids.append(p.run_id)
        for m in metrics:
            if (v := getattr(p, m)) is not None:
                c.values[m].append(float(v))
    return out


def _mannwhitney_p(new: list[float], pool: list[float], direction: int) -> float:
    """One-sided p that `new` is stochastically worse than `pool` (smaller when higher is better)."""
    from scipy.stats import mannwhitneyu

    alternative = "less" if direction > 0 else "greater"
    return float(mannwhitneyu(new, pool, alternative=alternative).pvalue)


class _PointHistory:
    """The per-night values of one point and metric, and the two rules over them."""

    def __init__(self, nights: list[tuple[int, _Cell | None]], metric: str, direction: int, rule: RegressionRule):
        self.ids = [sid for sid, _ in nights]
        self.vals = [c.values[metric] if c is not None else [] for _, c in nights]
        self.med = [median(v) for v in self.vals]
        self.direction, self.rule = direction, rule

    def _earlier(self, i: int) -> list[int]:
        """Indices of the `window` most recent nights before i that have the point."""
        return [j for j in range(i - 1, -1, -1) if self.med[j] is not None][: self.rule.window]

    def baseline(self, i: int) -> tuple[float, list[int]] | None:
        prev = self._earlier(i)
        if self.med[i] is None or len(prev) < self.rule.min_history:
            return None
        return median([self.med[j] for j in prev]), prev

    def change(self, i: int) -> float | None:
        """Night i's median vs its rolling baseline, as a fraction (None without a baseline)."""
        b = self.baseline(i) if i >= 0 else None
        if b is None or b[0] == 0:
            return None
        return self.med[i] / b[0] - 1.0

    def hud_worse(self, i: int) -> bool:
        c = self.change(i)
        return c is not None and self.direction * c < -self.rule.threshold_pct / 100.0

    def mw_p(self, i: int) -> float | None:
        """Mann-Whitney p of night i against the pooled repeats of its baseline nights, or None
        when either side has fewer than MIN_REPEATS values."""
        if i < 0 or len(self.vals[i]) < MIN_REPEATS:
            return None
        pool = [v for j in self._earlier(i) for v in self.vals[j]]
        if len(pool) < MIN_REPEATS or len(self._earlier(i)) < self.rule.min_history:
            return None
        return _mannwhitney_p(self.vals[i], pool, self.direction)

    def mw_worse(self, i: int) -> bool:
        p = self.mw_p(i)
        return p is not None and p < self.rule.alpha and self.hud_worse(i)


def detect_regressions(nights: list[tuple[int, list[Point]]], rule: RegressionRule) -> list[Finding]:
    """Findings on the newest night of a series.

    `nights`: (sweep id, counted points of that sweep) per night, oldest first, the night to
    judge last; only the last `window + 3` nights are read (older ones cannot change the
    result). Points need the rule's metrics (None = unknown, skipped). Returns one Finding per
    flagged (point, metric), in the newest night's point order; [] for a series of one night.
    """
    if len(nights) < 2:
        return []
    nights = nights[-(rule.window + 3):]
    metrics = [m for m, _ in rule.metrics]
    cells = [(sid, _cells(points, metrics)) for sid, points in nights]
    t = len(cells) - 1
    out: list[Finding] = []
    for key, cell in cells[t][1].items():
        per_night = [(sid, cs.get(key)) for sid, cs in cells]
        for metric, direction in rule.metrics:
            h = _PointHistory(per_night, metric, direction, rule)
            base = h.baseline(t)
            if base is None:
                continue
            prev_t = next((j for j in range(t - 1, -1, -1) if h.med[j] is not None), -1)
            use_mw = rule.test == "mannwhitney" or (rule.test == "auto" and h.mw_p(t) is not None)
            if use_mw:
                if not h.mw_worse(t) or h.mw_worse(prev_t):
                    continue
                name, p, previous = "mannwhitney", h.mw_p(t), None
            else:
                # two consecutive nights (the point ran on night t-1 too), first flag of the episode
                if prev_t != t - 1 or not (h.hud_worse(t) and h.hud_worse(prev_t)):
                    continue
                prev2 = next((j for j in range(prev_t - 1, -1, -1) if h.med[j] is not None), -1)
                if prev2 == prev_t - 1 and h.hud_worse(prev2):
                    continue
                name, p, previous = "hud", None, h.change(prev_t) * 100.0
            baseline, used = base
            out.append(Finding(
                point_key=cell.point.identity_hash(), point=cell.point, metric=metric,
                sweep_id=cells[t][0], value=h.med[t], baseline=baseline, change_pct=h.change(t) * 100.0,
                previous_change_pct=previous, p_value=p, rule=name, run_ids=list(cell.run_ids),
                baseline_sweep_ids=sorted(h.ids[j] for j in used),
                note=_env_note([(sid, cs.get(key)) for sid, cs in cells[min(used):]]),
            ))
    return out


def _env_note(per_night: list[tuple[int, _Cell | None]]) -> str:
    """Environment changes between consecutive nights that have the point, e.g.
    `sweep 12: engine version 0.9 -> 0.10`; "" when the environment never changed."""
    notes, last = [], None
    for sid, c in per_night:
        if c is None:
            continue
        if last is not None and c.env != last:
            notes.append(f"sweep {sid}: {env_difference(last, c.env)}")
        last = c.env
    return "; ".join(notes)
