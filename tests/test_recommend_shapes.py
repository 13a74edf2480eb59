"""The "what to run" panel on a grid over output lengths (issue 22 follow-up): the cost model is
fitted on one workload shape, never on TPOTs of several context lengths pooled against one
AR median. No database: points as the page loads them (duck-typed benchkit.point.Point)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis import recommend as rec
from benchkit.compare.costmodel import MeasuredPoint, recommend

# (output length, repeats, AR TPOT ms): longer outputs decode over a longer context, so slower
SHAPES = ((1024, 2, 20.0), (2048, 2, 26.0))
# ddtree budget -> (relative step cost, tau)
TREE = {8: (1.10, 3.0), 16: (1.25, 3.6), 32: (1.60, 4.1)}


def _p(method: str, budget: int | None, tpot: float, tau: float | None, out_len: int):
    return SimpleNamespace(method=method, tree_budget=budget, num_speculative_tokens=None, concurrency=1, tp=1,
                           host_id=1, gpu_names=("H200",), engine_build="b1", model="m", drafter="",
                           input_len=512, output_len=out_len, median_tpot_ms=tpot, acceptance_length=tau,
                           per_position_acceptance_rate=None,
                           label="auto" if method == "auto" else f"{method} b{budget}")


def _grid(shapes=SHAPES, tree=TREE):
    pts = []
    for out_len, repeats, ar in shapes:
        for r in range(repeats):
            jitter = 1 + 0.01 * r
            pts.append(_p("auto", None, ar * jitter, None, out_len))
            for b, (cost, tau) in tree.items():
                pts.append(_p("ddtree", b, cost * ar / tau * jitter, tau, out_len))
    return pts


def _direct(points, out_len):
    mps = [MeasuredPoint(p.method, p.tree_budget or 0, 1, p.median_tpot_ms,
                         p.acceptance_length if p.method != "auto" else None, label=p.label)
           for p in points if p.output_len == out_len]
    return recommend(mps)


def test_fitted_on_one_shape_the_longest_output_on_a_tie():
    pts = _grid()
    entry = rec.recommend_for(pts, None, 1, 1)
    assert entry.rec is not None and (entry.input_len, entry.output_len) == (512, 2048)
    want = _direct(pts, 2048)
    assert [p.label for p in entry.rec.predictions] == [p.label for p in want.predictions]
    assert entry.rec.best.speedup.value == pytest.approx(want.best.speedup.value)
    assert entry.rec.cost_fit.baseline_tpot_ms == pytest.approx(26.0 * 1.005)
    assert any("2 groups at TP 1" in n and "input 512, output 2048 tokens" in n for n in entry.notes), entry.notes
    # each shape's own costs are exactly TREE's: the fit is exact (no residual) on one shape ...
    assert entry.rec.cost_fit.residual_sd == pytest.approx(0.0, abs=0.02)
    # ... and would not be over both pooled against one AR median (what the panel did before)
    mixed = recommend([MeasuredPoint(p.method, p.tree_budget or 0, 1, p.median_tpot_ms,
                                     p.acceptance_length if p.method != "auto" else None, label=p.label) for p in pts])
    assert mixed.cost_fit.residual_sd > 0.05


def test_the_shape_with_more_runs_is_fitted_and_the_next_sweep_pins_it():
    pts = _grid(((1024, 3, 20.0), (2048, 2, 26.0)))
    entry = rec.recommend_for(pts, None, 1, 1)
    assert entry.output_len == 1024
    assert entry.rec.cost_fit.baseline_tpot_ms == pytest.approx(20.0 * 1.01)
    spec = {"name": "grid", "grid": {"tp": [1], "concurrency": [1], "output_len": [1024, 2048], "input_len": [512],
                                     "methods": ["auto", {"method": "ddtree", "tree_budget": 8}]}}
    nxt = rec.sweep_file_for(spec, entry, n=2)
    assert nxt["grid"]["output_len"] == [1024] and nxt["grid"]["input_len"] == [512]


def test_one_shape_has_no_note():
    pts = [p for p in _grid() if p.output_len == 1024]
    entry = rec.recommend_for(pts, None, 1, 1)
    assert entry.output_len == 1024 and not any("groups at TP" in n for n in entry.notes)
