"""The fitted step-cost model and its recommendation (issue 20; benchkit/compare/costmodel.py,
docs/CEILINGS.md "The cost model"): exact recovery on data made from the model's own form,
intervals that exclude a wrong measurement, and leave-one-out on the users' grid.

No database: the grid's points are measured from request logs in memory (tests/usersgrid_costs.py)."""

from __future__ import annotations

import math

import pytest

from benchkit.compare.costmodel import (
    CostModelError,
    MeasuredPoint,
    chain_tau,
    fit_step_cost,
    fit_tree_acceptance,
    leave_one_out,
    recommend,
)
from tests import usersgrid_costs as grid

BASE_TPOT = 20.0


def _point(method: str, k: int, cost: float, tau: float, B: int = 1, **kw) -> MeasuredPoint:
    """A point whose relative step cost is `cost`: TPOT = cost x baseline TPOT / tau."""
    return MeasuredPoint(method, k, B, cost * BASE_TPOT / tau, tau, **kw)


def _auto(B: int = 1) -> MeasuredPoint:
    return MeasuredPoint("auto", 0, B, BASE_TPOT)


def test_chain_tau_sums_the_per_position_rates():
    rates = (0.9, 0.8, 0.6)
    assert chain_tau(rates, 0) == 1.0
    assert chain_tau(rates, 2) == pytest.approx(1 + 0.9 + 0.8)
    assert chain_tau(rates, 3) == pytest.approx(3.3)
    with pytest.raises(ValueError, match="k must be in 0..3"):
        chain_tau(rates, 4)


def test_cost_fit_recovers_an_exact_line():
    B = 4
    def c(v: int) -> float:  # 1 + d + a (V - B), d = 0.15, a = 0.004
        return 1 + 0.15 + 0.004 * (v - B)
    pts = [_auto(B)] + [_point("ddtree", k, c(B * (k + 1)), tau, B) for k, tau in ((3, 2.0), (7, 3.0), (15, 4.0))]
    fit = fit_step_cost(pts)
    assert fit.coef == pytest.approx((0.15, 0.004, 0.0)) and fit.knee_tokens_per_step is None
    assert fit.baseline_tpot_ms == BASE_TPOT and fit.dof == 1 and fit.residual_sd == pytest.approx(0, abs=1e-12)
    assert fit.v_range == (16, 64)
    est = fit.predict(48)
    assert est.value == pytest.approx(c(48)) and est.low == pytest.approx(c(48)) and est.high == pytest.approx(c(48))
    assert fit.extrapolates(80) and not fit.extrapolates(40)


def test_knee_term_is_fitted_only_with_points_on_both_sides():
    B, knee = 8, 100.0
    def c(v: int) -> float:  # slope 0.002 to the knee, 0.002 + 0.01 past it
        return 1 + 0.2 + 0.002 * (v - B) + 0.01 * max(0, v - knee)
    ks = (1, 3, 7, 15, 31)  # V = 16, 32, 64 | 128, 256
    pts = [_auto(B)] + [_point("ddtree", k, c(B * (k + 1)), 2.0, B) for k in ks]
    fit = fit_step_cost(pts, knee_tokens_per_step=knee)
    assert fit.knee_tokens_per_step == knee and fit.coef == pytest.approx((0.2, 0.002, 0.01))
    assert fit.predict(200).value == pytest.approx(c(200))
    one_above = fit_step_cost(pts[:-1], knee_tokens_per_step=knee)  # only V = 128 above the knee
    assert one_above.knee_tokens_per_step is None and "not fitted" in one_above.notes[0]


def test_cost_fit_refuses_what_it_cannot_fit():
    with pytest.raises(CostModelError, match="no autoregressive"):
        fit_step_cost([_point("ddtree", 15, 1.2, 5.0), _point("ddtree", 31, 1.5, 6.0)])
    with pytest.raises(CostModelError, match="one concurrency"):
        fit_step_cost([_auto(1), _auto(8), _point("ddtree", 15, 1.2, 5.0), _point("ddtree", 31, 1.5, 6.0)])
    with pytest.raises(CostModelError, match=r">= 2 different verified tokens per step; got \[16\]$"):
        fit_step_cost([_auto(), _point("ddtree", 15, 1.2, 5.0), _point("linear", 15, 1.1, 4.0)])
    with pytest.raises(CostModelError, match="b15: acceptance length tau must be >= 1"):
        fit_step_cost([_auto(), MeasuredPoint("ddtree", 15, 1, 5.0, None), _point("ddtree", 31, 1.5, 6.0)])


def test_tree_acceptance_is_monotone_and_clamped():
    exact = [_point("ddtree", b, 1.0, 1.5 + 1.2 * math.log1p(b)) for b in (8, 16, 32, 64)]
    fit = fit_tree_acceptance(exact)
    assert fit.coef == pytest.approx((1.5, 1.2)) and fit.budgets == (8, 16, 32, 64)
    assert fit.predict(24).value == pytest.approx(1.5 + 1.2 * math.log1p(24))
    assert fit.predict(2).value == pytest.approx(1.5 + 1.2 * math.log(3))
    assert fit.predict(1).value == 2.0  # 1.5 + 1.2 ln 2 = 2.33 > budget + 1: clamped
    assert fit.extrapolates(4) and not fit.extrapolates(20)
    falling = fit_tree_acceptance([_point("ddtree", b, 1.0, t) for b, t in ((8, 5.0), (16, 4.8), (32, 4.7))])
    assert falling.coef[1] == 0 and falling.coef[0] == pytest.approx((5.0 + 4.8 + 4.7) / 3)
    assert "fitted as a constant" in falling.notes[0]
    clamped = fit_tree_acceptance([_point("ddtree", b, 1.0, t) for b, t in ((2, 3.0), (4, 5.0), (8, 9.0))])
    assert clamped.predict(1).value <= 2.0  # a budget of 1 accepts at most 2 tokens per step
    with pytest.raises(CostModelError, match=r">= 2 different budgets; got \[8\]$"):  # plain ints, no np.int64
        fit_tree_acceptance(exact[:1])


def _group(noise: tuple[float, ...] = (0.02, -0.03, 0.01, -0.02, 0.03)) -> list[MeasuredPoint]:
    """B = 1: c = 1.1 + 0.015 (V - 1) (x 1 + noise), tau(b) = 2 + 1.5 ln(1 + b); linear k = 15 with
    per-position rates."""
    def c(v: int, e: float) -> float:
        return (1.1 + 0.015 * (v - 1)) * (1 + e)
    rates = tuple(0.8 ** i for i in range(1, 16))
    pts = [_auto(), _point("linear", 15, c(16, noise[0]), chain_tau(rates, 15), per_position_rates=rates)]
    for b, e in zip((8, 16, 32, 64), noise[1:], strict=True):
        pts.append(_point("ddtree", b, c(b + 1, e), 2 + 1.5 * math.log1p(b) + e))
    return pts


def test_recommend_ranks_every_candidate_with_intervals():
    rec = recommend(_group())
    labels = [p.label for p in rec.predictions]
    assert {"auto", "linear k=1", "linear k=15"} <= set(labels)
    assert {f"b{b}" for b in range(1, 65)} <= set(labels)
    speeds = [p.speedup.value for p in rec.predictions]
    assert speeds == sorted(speeds, reverse=True)
    best = rec.best
    assert best.method == "ddtree" and best.speedup.low < best.speedup.value < best.speedup.high
    assert best.overlaps_best
    auto = next(p for p in rec.predictions if p.label == "auto")
    assert auto.speedup.value == 1.0 and auto.measured_speedup == 1.0
    b16 = next(p for p in rec.predictions if p.label == "b16")
    assert b16.measured_speedup == pytest.approx(BASE_TPOT / _group()[3].tpot_ms)
    assert b16.outside_interval is False and not b16.extrapolated
    assert next(p for p in rec.predictions if p.label == "b4").extrapolated  # below the measured budgets
    k3 = next(p for p in rec.predictions if p.label == "linear k=3")
    assert k3.tau.value == pytest.approx(1 + 0.8 + 0.64 + 0.512) and k3.measured_speedup is None
    assert rec.predictions[-1].overlaps_best is False  # the worst candidate is told apart from the best


def test_a_measurement_far_from_its_prediction_is_marked():
    pts = _group()
    wrong = [p if p.draft_tokens != 32 or p.method != "ddtree" else
             MeasuredPoint(p.method, p.draft_tokens, p.concurrency, p.tpot_ms * 2.5, p.tau) for p in pts]
    row = next(r for r in leave_one_out(wrong) if r.draft_tokens == 32)
    assert row.inside is False and row.measured_speedup < row.predicted.speedup.low
    right = next(r for r in leave_one_out(pts) if r.draft_tokens == 32)
    assert right.inside is True


def _loo_rows(tpot_scale=None):
    points = grid.grid_points(tpot_scale)
    out = []
    for (tp, concurrency), pts in grid.groups(points).items():
        for row in leave_one_out(pts, knee_tokens_per_step=grid.knee(concurrency)):
            out.append((tp, concurrency, row))
    return out


def test_leave_one_out_on_the_users_grid():
    """Drop each DDTree budget of each (TP, concurrency) group in turn, fit on the rest, predict it
    (benchmarks/costmodel_loo.py prints the table)."""
    rows = _loo_rows()
    assert len(rows) == 3 * 2 * 4 and all(not r.error for _, _, r in rows)
    inside = [r.inside for _, _, r in rows]
    assert sum(inside) >= 0.75 * len(rows)  # "the interval contains the dropped measurement for most"
    errors = sorted(abs(r.predicted.speedup.value / r.measured_speedup - 1) for _, _, r in rows)
    assert errors[len(errors) // 2] < 0.10  # median error of the point prediction
    # the grid's own figures: TP1 c1 b15 is 6.5x end to end; its decode speedup (TPOT ratio) is close
    tp1_b15 = next(r for tp, c, r in rows if (tp, c) == (1, 1) and r.label == "b15")
    assert tp1_b15.measured_speedup == pytest.approx(6.5, rel=0.02)


def test_leave_one_out_marks_a_corrupted_measurement():
    rows = _loo_rows({(4, 1, "b32"): 2.0})  # b32 at TP4 c1 measured twice as slow as the grid says
    bad = next(r for tp, c, r in rows if (tp, c) == (4, 1) and r.label == "b32")
    assert bad.inside is False and bad.measured_speedup < bad.predicted.speedup.low


def test_ceilings_of_the_users_grid():
    """Every grid point gets a binding ceiling and a % of it; at concurrency 8 the budgets whose
    B x (budget + 1) passes the ridge turn compute-bound."""
    points = grid.grid_points()
    ridge8 = grid.knee(8)
    for p in points:
        c = grid.ceiling(p)
        assert c.ceiling_tok_s > 0 and 0 < c.achieved_pct < 100, (p.tp, p.concurrency, p.point.label)
        expected = "compute" if p.point.verified_tokens_per_step > c.ridge_tokens_per_step else "memory"
        assert c.binding == expected
    compute_bound = {p.point.label for p in points if p.concurrency == 8 and grid.ceiling(p).binding == "compute"}
    assert compute_bound == {label for label in ("b15", "b16", "b32", "b64")
                             if 8 * (int(label[1:]) + 1) > ridge8}


def test_no_residual_degrees_of_freedom_gives_no_interval():
    pts = [_auto(), _point("ddtree", 15, 1.2, 5.0), _point("ddtree", 31, 1.5, 6.0)]  # 2 points, 2 parameters
    fit = fit_step_cost(pts)
    assert fit.dof == 0 and "no interval" in fit.notes[-1]
    est = fit.predict(20)
    assert est.low is None and est.high is None and est.contains(1.3) is None
    rec = recommend(pts)
    b15 = next(p for p in rec.predictions if p.label == "b15")
    assert b15.speedup.low is None and b15.outside_interval is None and b15.measured_speedup == pytest.approx(
        5.0 / 1.2)
