"""A fitted step-cost model and the speedup it predicts for every K or tree budget (issue 20;
docs/CEILINGS.md "The cost model").

One group is one (host, GPU model, TP, engine build, model, concurrency B): the caller groups.
From its measured points (median TPOT, acceptance length tau):

- relative step cost c = TPOT x tau / TPOT_auto (MEASUREMENT.md: decode speedup = tau / c);
  verified tokens per step V = B x (k + 1) (k drafted tokens, or a DDTree budget of k nodes).
- Cost fit, by least squares over the speculative points (each repeat one observation):

      c(V) = 1 + d + a x (V - B) + b x max(0, V - V_knee)

  d: the fixed cost of speculating (the drafter pass, tree building) in AR steps; a: the cost of
  one more verified token; b: the extra slope past the knee. The knee is not fitted: it is the
  roofline ridge (benchkit.ceilings.roofline), given by the caller, and the b term enters only
  with measured points at >= 2 different V on each side of it (otherwise c is one line and a
  prediction past the knee is marked extrapolated).
- Acceptance: a chain method (DFlash linear, draft model, EAGLE, MTP, n-gram) with measured
  per-position acceptance rates r_i has tau(k) = 1 + sum(r_i for i <= k) for every k up to the
  measured one; without them only the measured k is predicted, at its measured tau. DDTree:
  tau(B) = alpha + beta x ln(1 + B), beta >= 0 (monotone), fitted by least squares to the
  measured budgets and clamped to [1, B + 1].
- Speedup = tau / c. Interval: an approximate 95 % prediction interval from each fit's
  covariance plus its residual variance (delta method, combined in log space as if tau and c
  were independent; Student t with the smaller of the fits' residual degrees of freedom). A fit
  with no residual degrees of freedom gives no interval (None), never a made-up one.

`recommend(points, ...)` ranks every candidate; `leave_one_out(points, ...)` drops each DDTree
budget in turn and predicts it from the rest. Pure functions over `MeasuredPoint`s; raises
`CostModelError` (with the reason) where a group cannot be fitted.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy import stats

from benchkit.methods import METHODS, method_label

#: Two-sided level of every interval.
LEVEL = 0.95


class CostModelError(ValueError):
    """A group cannot be fitted (no autoregressive baseline, mixed concurrencies, too few
    speculative points); the message says what is missing."""


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured run of a group.

    `method`: a benchkit.methods name; `draft_tokens`: k (num_speculative_tokens) for a chain
    method, the tree budget for DDTree, 0 for `auto`; `tpot_ms`: median TPOT (ms/token);
    `tau`: mean acceptance length (None for auto); `per_position_rates`: acceptance rate of
    draft position 1, 2, ... (accepted at that position / drafts), where the engine reports it.
    `label`: how pages name the configuration (`method_label` when empty)."""

    method: str
    draft_tokens: int
    concurrency: int
    tpot_ms: float
    tau: float | None = None
    per_position_rates: tuple[float, ...] = ()
    label: str = ""

    @property
    def verified_tokens_per_step(self) -> int:
        """V = B x (k + 1)."""
        return self.concurrency * (self.draft_tokens + 1)

    @property
    def name(self) -> str:
        """The label, or the method's standard label."""
        return self.label or _label(self.method, self.draft_tokens)


def _label(method: str, k: int) -> str:
    info = METHODS.get(method)
    if info is not None and info.needs_budget:
        return method_label(method, budget=k)
    return method_label(method, k=k or None)


@dataclass(frozen=True)
class Estimate:
    """A predicted figure: `value`, its interval [`low`, `high`] at LEVEL (None: no interval),
    `se` its standard error of prediction (0: taken as exact) and `dof` the residual degrees of
    freedom behind it (None: exact)."""

    value: float
    low: float | None
    high: float | None
    se: float = 0.0
    dof: int | None = None

    def contains(self, x: float) -> bool | None:
        """Whether x lies in the interval; None when there is none."""
        if self.low is None or self.high is None:
            return None
        return self.low <= x <= self.high


@functools.lru_cache(maxsize=256)
def _t(dof: int) -> float:
    """Student's t quantile at 0.5 + LEVEL / 2 for `dof` degrees of freedom (scipy.stats.t.ppf);
    cached: a sweep page asks for a few distinct dofs thousands of times, and each scipy call
    costs about 0.1 ms."""
    return float(stats.t.ppf(0.5 + LEVEL / 2, dof))


@dataclass(frozen=True)
class _Ols:
    """A least-squares fit y ~ X coef: covariance sigma^2 (X'X)^-1, residual sd, dof."""

    coef: np.ndarray
    cov: np.ndarray
    sd: float
    dof: int

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray) -> _Ols:
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        dof = len(y) - X.shape[1]
        rss = float(np.sum((y - X @ coef) ** 2))
        sd = math.sqrt(rss / dof) if dof > 0 else 0.0
        cov = sd ** 2 * np.linalg.pinv(X.T @ X)
        return cls(coef, cov, sd, dof)


def _predict(x: tuple[float, ...], coef: tuple[float, ...], cov: tuple[tuple[float, ...], ...],
             sd: float) -> tuple[float, float]:
    """(value, standard error of a new observation at x) of a least-squares fit (coefficients
    `coef`, their covariance `cov`, residual sd `sd`): x'coef and sqrt(x'cov x + sd^2). Plain
    floats: the fits here have 2 or 3 parameters, where numpy's per-call cost was most of the
    work, and a "what to run" panel predicts about a thousand candidates per request (issue 22).
    Equal to numpy's `x @ coef` and `(x @ cov) @ x` to rounding (relative difference at most
    2e-13 over 20 000 random fits)."""
    n = len(coef)
    value = 0.0
    for i in range(n):
        value += x[i] * coef[i]
    var = 0.0
    for j in range(n):
        col = 0.0
        for i in range(n):
            col += x[i] * cov[i][j]
        var += col * x[j]
    return value, math.sqrt(max(var, 0.0) + sd ** 2)


def _exact(value: float) -> Estimate:
    return Estimate(value, value, value)


def _estimate(value: float, se: float, dof: int | None, lo_clip: float = -math.inf,
              hi_clip: float = math.inf) -> Estimate:
    if dof is not None and dof <= 0:
        return Estimate(value, None, None, se, dof)
    q = 0.0 if dof is None else _t(dof)
    return Estimate(value, max(value - q * se, lo_clip), min(value + q * se, hi_clip), se, dof)


@dataclass(frozen=True)
class StepCostFit:
    """The fitted relative step cost of one group (module docstring for the form).

    `coef` = (d, a, b) (b 0 and not fitted when `knee_tokens_per_step` is None), `cov` their
    covariance, `residual_sd` and `dof` the residual standard deviation and degrees of freedom,
    `v_range` the verified tokens per step the fit saw, `observations` (label, V, c) of every
    point fitted, `baseline_tpot_ms` the median TPOT of the group's auto points."""

    concurrency: int
    baseline_tpot_ms: float
    knee_tokens_per_step: float | None
    coef: tuple[float, float, float]
    cov: tuple[tuple[float, ...], ...]
    residual_sd: float
    dof: int
    v_range: tuple[int, int]
    observations: tuple[tuple[str, int, float], ...]
    notes: tuple[str, ...] = ()

    def _row(self, v: float) -> tuple[float, ...]:
        v = float(v)
        if self.knee_tokens_per_step is None:
            return (1.0, v - self.concurrency)
        return (1.0, v - self.concurrency, max(0.0, v - self.knee_tokens_per_step))

    @functools.cached_property
    def _coef(self) -> tuple[float, ...]:
        """The fitted coefficients (2 without a knee, else 3)."""
        return tuple(self.coef[: 3 if self.knee_tokens_per_step is not None else 2])

    def predict(self, verified_tokens_per_step: float) -> Estimate:
        """Relative step cost at V, with its prediction interval (None when dof is 0)."""
        value, se = _predict(self._row(verified_tokens_per_step), self._coef, self.cov, self.residual_sd)
        return _estimate(1.0 + value, se, self.dof, lo_clip=0.0)

    def extrapolates(self, verified_tokens_per_step: float) -> bool:
        """V outside the fitted points' range."""
        return not self.v_range[0] <= verified_tokens_per_step <= self.v_range[1]


def _median(values: Iterable[float]) -> float:
    return float(np.median(list(values)))


def _baseline(points: Sequence[MeasuredPoint]) -> tuple[int, float]:
    concurrencies = {p.concurrency for p in points}
    if len(concurrencies) != 1:
        raise CostModelError(f"one group has one concurrency; got {sorted(concurrencies)}")
    auto = [p.tpot_ms for p in points if p.method == "auto"]
    if not auto:
        raise CostModelError("no autoregressive (auto) point: relative step cost has no baseline")
    for p in points:
        if p.tpot_ms is None or not p.tpot_ms > 0:
            raise CostModelError(f"{p.name}: median TPOT must be > 0 ms, got {p.tpot_ms!r}")
        if p.method != "auto" and (p.tau is None or p.tau < 1):
            raise CostModelError(f"{p.name}: acceptance length tau must be >= 1, got {p.tau!r}")
    return concurrencies.pop(), _median(auto)


def fit_step_cost(points: Sequence[MeasuredPoint], knee_tokens_per_step: float | None = None) -> StepCostFit:
    """Fit c(V) over the speculative points of one group (module docstring). `knee_tokens_per_step`:
    the roofline ridge of the group (benchkit.ceilings.roofline StepCeiling.ridge_tokens_per_step),
    or None for a single line. Raises CostModelError for mixed concurrencies, no auto point, or
    speculative points at fewer than 2 different V."""
    concurrency, base = _baseline(points)
    spec = [p for p in points if p.method != "auto"]
    vs = np.array([p.verified_tokens_per_step for p in spec], dtype=float)
    if len(set(vs)) < 2:
        raise CostModelError("the cost fit needs speculative points at >= 2 different verified tokens per step; "
                             f"got {sorted({int(v) for v in vs})}")
    cost = np.array([p.tpot_ms * p.tau / base for p in spec])
    notes = []
    knee = knee_tokens_per_step
    if knee is not None:
        above, below = set(vs[vs > knee]), set(vs[vs <= knee])
        if len(above) < 2 or len(below) < 2:
            notes.append(f"knee at the ridge ({knee:.0f} tokens/step) not fitted: measured points at "
                         f"{len(below)} V at or below it and {len(above)} above (2 each needed); one line")
            knee = None
    X = np.column_stack([np.ones_like(vs), vs - concurrency] + ([np.maximum(0.0, vs - knee)] if knee is not None
                                                                 else []))
    ols = _Ols.fit(X, cost - 1.0)
    fitted = [float(c) for c in ols.coef]
    coef = (fitted[0], fitted[1], fitted[2] if knee is not None else 0.0)
    if ols.dof <= 0:
        notes.append("as many parameters as points: no residual degrees of freedom, no interval")
    return StepCostFit(
        concurrency=concurrency, baseline_tpot_ms=base, knee_tokens_per_step=knee, coef=coef,
        cov=tuple(tuple(float(x) for x in row) for row in ols.cov), residual_sd=ols.sd, dof=ols.dof,
        v_range=(int(vs.min()), int(vs.max())),
        observations=tuple((p.name, p.verified_tokens_per_step, float(c)) for p, c in zip(spec, cost, strict=True)),
        notes=tuple(notes))


def fit_pooled_step_cost(groups: Sequence[Sequence[MeasuredPoint]], concurrency: int,
                         knee_of: Callable[[int], float | None] | None = None) -> StepCostFit:
    """The cost fit at a concurrency B never measured, from the groups measured at other
    concurrencies of the same (host, GPU, TP, build, model): each point's relative cost against
    its own group's baseline, regressed on the same form with each point's own B and knee,

        c = 1 + d + a x (V - B_i) + b x max(0, V - knee(B_i)),

    then predicted at B (`knee_of(B)`). Assumes the cost of one more verified token and of
    speculating do not change with B, which is what the pooled residuals test; the note says
    so. Raises CostModelError when a group has no baseline or fewer than 2 different V remain."""
    rows, ys, obs, vs = [], [], [], []
    knee_b = knee_of(concurrency) if knee_of else None
    use_knee = knee_b is not None
    for group in groups:
        b_i, base = _baseline(group)
        k_i = knee_of(b_i) if knee_of else None
        use_knee = use_knee and k_i is not None
        for p in group:
            if p.method == "auto":
                continue
            v = p.verified_tokens_per_step
            c = p.tpot_ms * p.tau / base
            rows.append((v, b_i, k_i))
            ys.append(c - 1.0)
            vs.append(v)
            obs.append((f"{p.name} B={b_i}", v, float(c)))
    if len(set(vs)) < 2:
        raise CostModelError(f"the pooled cost fit needs speculative points at >= 2 different V; got {sorted(set(vs))}")
    measured_bs = ", ".join(str(b) for b in sorted({r[1] for r in rows}))
    notes = [f"B={concurrency} not measured: cost fitted on B={measured_bs} pooled (d and a assumed the same at "
             "every B)"]
    if use_knee:
        above = {v for v, _, k in rows if v > k}
        below = {v for v, _, k in rows if v <= k}
        if len(above) < 2 or len(below) < 2:
            notes.append("knee at the ridge not fitted (fewer than 2 V on a side): one line")
            use_knee = False
    X = np.array([[1.0, v - b] + ([max(0.0, v - k)] if use_knee else []) for v, b, k in rows])
    ols = _Ols.fit(X, np.array(ys))
    fitted = [float(c) for c in ols.coef]
    if ols.dof <= 0:
        notes.append("as many parameters as points: no residual degrees of freedom, no interval")
    return StepCostFit(
        concurrency=concurrency, baseline_tpot_ms=float("nan"), knee_tokens_per_step=knee_b if use_knee else None,
        coef=(fitted[0], fitted[1], fitted[2] if use_knee else 0.0),
        cov=tuple(tuple(float(x) for x in row) for row in ols.cov), residual_sd=ols.sd, dof=ols.dof,
        v_range=(int(min(vs)), int(max(vs))), observations=tuple(obs), notes=tuple(notes))


@dataclass(frozen=True)
class TreeAcceptanceFit:
    """tau(B) = alpha + beta x ln(1 + B), beta >= 0, fitted over a tree method's points.
    `coef` = (alpha, beta); beta is 0 (a constant fit) when the free fit fell with the budget."""

    method: str
    coef: tuple[float, float]
    cov: tuple[tuple[float, ...], ...]
    residual_sd: float
    dof: int
    budgets: tuple[int, ...]
    notes: tuple[str, ...] = ()

    def predict(self, budget: int) -> Estimate:
        """tau at `budget`, clamped to [1, budget + 1], with its prediction interval."""
        value, se = _predict((1.0, math.log1p(budget)), self.coef, self.cov, self.residual_sd)
        est = _estimate(value, se, self.dof, lo_clip=1.0, hi_clip=budget + 1.0)
        return Estimate(min(max(est.value, 1.0), budget + 1.0), est.low, est.high, est.se, est.dof)

    def extrapolates(self, budget: int) -> bool:
        """Budget outside the measured ones' range."""
        return not min(self.budgets) <= budget <= max(self.budgets)


def fit_tree_acceptance(points: Sequence[MeasuredPoint]) -> TreeAcceptanceFit:
    """Fit the monotone tau(budget) curve over the points of one tree method (each repeat one
    observation). Raises CostModelError with fewer than 2 different budgets."""
    budgets = np.array([p.draft_tokens for p in points], dtype=float)
    taus = np.array([p.tau for p in points], dtype=float)
    if len(set(budgets)) < 2:
        raise CostModelError(f"{points[0].method if points else 'tree'}: the acceptance curve needs >= 2 "
                             f"different budgets; got {sorted({int(b) for b in budgets})}")
    ols = _Ols.fit(np.column_stack([np.ones_like(budgets), np.log1p(budgets)]), taus)
    notes: tuple[str, ...] = ()
    coef, cov = (float(ols.coef[0]), float(ols.coef[1])), ols.cov
    if ols.coef[1] < 0:
        ols = _Ols.fit(np.ones((len(taus), 1)), taus)
        notes = ("measured tau falls with the budget: fitted as a constant (the curve is monotone by design)",)
        coef, cov = (float(ols.coef[0]), 0.0), np.array([[ols.cov[0, 0], 0.0], [0.0, 0.0]])
    return TreeAcceptanceFit(points[0].method, coef, tuple(tuple(float(x) for x in r) for r in cov), ols.sd,
                             ols.dof, tuple(sorted({int(b) for b in budgets})), notes)


def chain_tau(per_position_rates: Sequence[float], k: int) -> float:
    """tau(k) = 1 + sum of the per-position acceptance rates of positions 1..k (a chain drafted
    to k tokens accepts position i only when it would have at the measured length). Raises
    ValueError for k beyond the measured positions or < 0."""
    if not 0 <= k <= len(per_position_rates):
        raise ValueError(f"k must be in 0..{len(per_position_rates)} (measured positions), got {k}")
    return 1.0 + float(sum(per_position_rates[:k]))


@dataclass(frozen=True)
class Prediction:
    """One candidate configuration of a group: predicted tau, relative step cost and decode
    speedup (Estimates), the measured decode speedup where the configuration was measured
    (baseline median TPOT / its median TPOT) and whether it falls outside the predicted
    interval; `extrapolated` when V or the budget lies outside what the fits saw;
    `overlaps_best` when its interval overlaps the top candidate's (the model cannot tell them
    apart)."""

    label: str
    method: str
    draft_tokens: int
    verified_tokens_per_step: int
    tau: Estimate
    relative_cost: Estimate
    speedup: Estimate
    measured_speedup: float | None = None
    outside_interval: bool | None = None
    extrapolated: bool = False
    overlaps_best: bool = False


def _speedup(tau: Estimate, cost: Estimate) -> Estimate:
    """tau / c with an interval from both standard errors in log space; the t quantile's degrees
    of freedom from the Welch-Satterthwaite formula over the two relative variances (an exact
    figure, dof None, adds no variance)."""
    value = tau.value / cost.value
    parts = [((e.se / e.value) ** 2, e.dof) for e in (tau, cost) if e.dof is not None]
    var = sum(v for v, _ in parts)
    se = value * math.sqrt(var)
    if any(d <= 0 for _, d in parts):
        return Estimate(value, None, None, se, 0)
    if not parts or var == 0:
        return Estimate(value, value, value, 0.0, None)
    dof = int(var ** 2 / sum(v ** 2 / d for v, d in parts if v > 0))
    q = _t(max(dof, 1))
    rel = math.sqrt(var)
    return Estimate(value, value * math.exp(-q * rel), value * math.exp(q * rel), se, dof)


@dataclass(frozen=True)
class Recommendation:
    """Every candidate of one group ranked by predicted decode speedup (best first), the fits
    behind them and notes (assumptions in force, what could not be predicted)."""

    cost_fit: StepCostFit
    acceptance_fits: tuple[TreeAcceptanceFit, ...]
    predictions: tuple[Prediction, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Prediction:
        """The top candidate (it may be an extrapolation: see `best_within_range`)."""
        return self.predictions[0]

    @property
    def best_within_range(self) -> Prediction:
        """The top candidate that is not an extrapolation (auto at worst)."""
        return next(p for p in self.predictions if not p.extrapolated)


def recommend(points: Sequence[MeasuredPoint], *, knee_tokens_per_step: float | None = None,
              budgets: Sequence[int] | None = None, max_k: int | None = None,
              cost_fit: StepCostFit | None = None) -> Recommendation:
    """Predict the decode speedup of every candidate of one group and rank them.

    Candidates: `auto` (speedup 1); per tree method, `budgets` (default every budget from 1 to
    the largest measured); per chain method, k = 1.. the positions its per-position rates cover
    (capped at `max_k`), or the measured k alone where no rates were measured.
    `cost_fit`: a fit made elsewhere (fit_pooled_step_cost, for a concurrency never measured);
    then `points` only give acceptance (any concurrency) and nothing is "measured".
    Raises CostModelError (see fit_step_cost)."""
    pooled = cost_fit is not None
    cost_fit = cost_fit or fit_step_cost(points, knee_tokens_per_step)
    B, base = cost_fit.concurrency, cost_fit.baseline_tpot_ms
    by_config: dict[tuple[str, int], list[MeasuredPoint]] = defaultdict(list)
    for p in points:
        by_config[(p.method, p.draft_tokens)].append(p)
    measured = {} if pooled else {key: base / _median(p.tpot_ms for p in ps) for key, ps in by_config.items()}
    labels = {key: ps[0].name for key, ps in by_config.items()}
    notes: list[str] = list(cost_fit.notes)
    preds: list[dict[str, Any]] = [{  # Prediction fields but overlaps_best, known once they are ranked
        "label": "auto", "method": "auto", "draft_tokens": 0, "verified_tokens_per_step": B, "tau": _exact(1.0),
        "relative_cost": _exact(1.0), "speedup": _exact(1.0), "measured_speedup": measured.get(("auto", 0))}]
    tree_fits: list[TreeAcceptanceFit] = []
    methods = sorted({p.method for p in points if p.method != "auto"})
    for method in methods:
        mpoints = [p for p in points if p.method == method]
        info = METHODS.get(method)
        if info is not None and info.needs_budget:
            try:
                tree = fit_tree_acceptance(mpoints)
            except CostModelError as exc:
                notes.append(str(exc))
                continue
            tree_fits.append(tree)
            notes.extend(tree.notes)
            for b in budgets or range(1, max(tree.budgets) + 1):
                preds.append(_candidate(method, b, B, tree.predict(b), cost_fit, tree.extrapolates(b), measured,
                                        labels))
            continue
        rates = max((p.per_position_rates for p in mpoints), key=len)
        if rates:
            top = len(rates) if max_k is None else min(max_k, len(rates))
            for k in range(1, top + 1):
                preds.append(_candidate(method, k, B, _exact(chain_tau(rates, k)), cost_fit, False,
                                        measured, labels))
        else:
            notes.append(f"{method}: no per-position acceptance measured: only the measured k predicted")
            for k in sorted({p.draft_tokens for p in mpoints}):
                tau = _median(p.tau for p in mpoints if p.draft_tokens == k)
                preds.append(_candidate(method, k, B, _exact(tau), cost_fit, False, measured, labels))
    preds.sort(key=lambda p: -p["speedup"].value)
    best = preds[0]["speedup"]
    ranked = tuple(Prediction(**p, overlaps_best=_overlap(p["speedup"], best)) for p in preds)
    return Recommendation(cost_fit, tuple(tree_fits), ranked, tuple(dict.fromkeys(notes)))


def _overlap(a: Estimate, b: Estimate) -> bool:
    if a.low is None or a.high is None or b.low is None or b.high is None:
        return True  # no interval: cannot be told apart
    return a.high >= b.low and b.high >= a.low


def _candidate(method: str, k: int, B: int, tau: Estimate, cost_fit: StepCostFit, tau_extrapolated: bool,
               measured: dict[tuple[str, int], float], labels: dict[tuple[str, int], str]) -> dict[str, Any]:
    """A candidate's Prediction fields (all but overlaps_best)."""
    v = B * (k + 1)
    cost = cost_fit.predict(v)
    speedup = _speedup(tau, cost)
    got = measured.get((method, k))
    return {"label": labels.get((method, k), _label(method, k)), "method": method, "draft_tokens": k,
            "verified_tokens_per_step": v, "tau": tau, "relative_cost": cost, "speedup": speedup,
            "measured_speedup": got,
            "outside_interval": None if got is None or speedup.low is None else not speedup.contains(got),
            "extrapolated": tau_extrapolated or cost_fit.extrapolates(v)}


@dataclass(frozen=True)
class LooRow:
    """One left-out configuration: its prediction from the other points and the measurement.
    `inside`: the measured speedup lies in the predicted interval (None: no interval, or the
    rest could not be fitted, `error` then says why)."""

    label: str
    draft_tokens: int
    predicted: Prediction | None
    measured_speedup: float
    measured_tau: float
    measured_cost: float
    inside: bool | None
    error: str = ""


def leave_one_out(points: Sequence[MeasuredPoint], *, method: str = "ddtree",
                  knee_tokens_per_step: float | None = None) -> list[LooRow]:
    """Drop each budget (or k) of `method` in turn, fit cost and acceptance on the rest of the
    group, predict the dropped configuration and compare with its measurement (decode speedup =
    baseline median TPOT / its median TPOT). Raises CostModelError when the whole group has no
    baseline."""
    _, base = _baseline(points)
    rows = []
    for k in sorted({p.draft_tokens for p in points if p.method == method}):
        dropped = [p for p in points if p.method == method and p.draft_tokens == k]
        rest = [p for p in points if not (p.method == method and p.draft_tokens == k)]
        m_speedup = base / _median(p.tpot_ms for p in dropped)
        m_tau = _median(p.tau for p in dropped)
        row = LooRow(dropped[0].name, k, None, m_speedup, m_tau, m_tau / m_speedup, None)
        try:
            rec = recommend(rest, knee_tokens_per_step=knee_tokens_per_step, budgets=[k])
        except CostModelError as exc:
            rows.append(replace(row, error=str(exc)))
            continue
        pred = next((p for p in rec.predictions if p.method == method and p.draft_tokens == k), None)
        if pred is None:
            rows.append(replace(row, error="; ".join(rec.notes) or "no prediction"))
            continue
        rows.append(replace(row, predicted=pred, inside=pred.speedup.contains(m_speedup)))
    return rows
