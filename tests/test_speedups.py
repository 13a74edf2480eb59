"""Speedup matching and the sweep figure builders (pure functions): the figures are read back
as data (which cell is best, which line goes down), not just built."""

import numpy as np
import pytest

from analysis import figures
from benchkit.compare.speedups import (
    DECODE,
    END_TO_END,
    best_by,
    compute_speedups,
    inconsistent_gpu_tps,
    relative_step_costs,
)
from benchkit.measure.metrics import WindowMetrics
from benchkit.point import Point


def point(run_id, method="auto", k=None, tps=100.0, tp=1, conc=1, gpus=("GPU-a",), repeat=0, tau=None, budget=None,
          tpot=None, out_len=128, **kw):
    return Point(run_id=run_id, engine="vllm", engine_version="0.32.0", model="/m", gpu_uuids=gpus, tp=tp,
                 input_len=32, output_len=out_len, concurrency=conc, method=method, num_speculative_tokens=k,
                 tree_budget=budget, repeat_index=repeat, **kw,
                 figures_={**WindowMetrics().to_dict(), "output_throughput_tok_s": tps, "acceptance_length": tau,
                           "mean_tokens_per_chunk": tau, "median_tpot_ms": tpot})


def by_label(sps):
    return {(s.label, s.point.concurrency): s for s in sps}


def test_speedup_divides_by_matched_auto():
    sps = by_label(compute_speedups([point(1, tps=100), point(2, "draft_model", 4, tps=250),
                                     point(3, conc=4, tps=300), point(4, "draft_model", 4, conc=4, tps=330)]))
    assert sps[("draft_model k=4", 1)].value == pytest.approx(2.5)
    assert sps[("draft_model k=4", 1)].baseline_run_ids == [1]
    assert sps[("draft_model k=4", 4)].value == pytest.approx(1.1)
    assert sps[("auto", 1)].value == pytest.approx(1.0)


def test_hosts_without_gpus_never_pair_across_hosts():
    # a sweep over two CPU hosts (no GPU UUIDs to tell them apart): each host's method run is
    # divided by its own host's auto run, and a host without one gets no number, naming the host
    pts = [point(1, tps=100, gpus=(), host_id=1), point(2, "ngram", 4, tps=300, gpus=(), host_id=1),
           point(3, tps=50, gpus=(), host_id=2), point(4, "ngram", 4, tps=200, gpus=(), host_id=2),
           point(5, "draft_model", 2, tps=90, gpus=(), host_id=2)]
    sps = {(s.label, s.point.host_id): s for s in compute_speedups(pts)}
    assert sps[("ngram k=4", 1)].value == pytest.approx(3.0) and sps[("ngram k=4", 1)].baseline_run_ids == [1]
    assert sps[("ngram k=4", 2)].value == pytest.approx(4.0) and sps[("ngram k=4", 2)].baseline_run_ids == [3]
    lone = compute_speedups([point(1, tps=100, gpus=(), host_id=1), point(5, "draft_model", 2, tps=90, gpus=(),
                                                                         host_id=2)])
    lone = {s.label: s for s in lone}["draft_model k=2"]
    assert lone.value is None and "host_id" in lone.reason


def test_no_baseline_means_no_number_and_names_the_difference():
    # auto ran on other GPUs: not comparable, so no speedup is shown, and the reason says why
    sps = compute_speedups([point(1, gpus=("GPU-b",)), point(2, "ngram", 4, tps=120)])
    ngram = [s for s in sps if s.label == "ngram k=4"][0]
    assert ngram.value is None and ngram.baseline_run_ids == []
    assert ngram.reason == "no matching auto baseline (nearest auto run 1 differs in gpu_uuids)"
    # the users' grid file once put auto and DDTree on different engine builds
    sps = compute_speedups([point(1), point(2, "ddtree", budget=15, tps=650, engine_build="sglang-ddtree-pr")])
    assert "differs in engine_build" in [s for s in sps if s.label == "b15"][0].reason


def test_baseline_can_be_any_configuration():
    """DDTree against linear DFlash, as the users report it (DOMAIN.md: 1.63x at TP1)."""
    pts = [point(1, tps=28.0), point(2, "linear", tps=28.0 * 6.5 / 1.63), point(3, "ddtree", budget=15, tps=182.0),
           point(4, tp=4, gpus=("a", "b", "c", "d"), tps=61.0)]
    sps = {(s.label, s.point.tp): s for s in compute_speedups(pts, baseline="linear")}
    assert sps[("b15", 1)].value == pytest.approx(1.63) and sps[("b15", 1)].baseline == "linear"
    assert sps[("b15", 1)].baseline_run_ids == [2]
    assert sps[("auto", 1)].value == pytest.approx(1.63 / 6.5)
    assert sps[("linear", 1)].value == pytest.approx(1.0)
    assert sps[("auto", 4)].value is None and sps[("auto", 4)].reason == "no matching linear baseline"


def test_two_configurations_with_the_baseline_label_give_no_number():
    pts = [point(1, "linear", drafter="/d1"), point(2, "linear", drafter="/d2", tps=120), point(3, tps=50)]
    sps = compute_speedups(pts, baseline="linear")
    assert all(s.value is None and "ambiguous linear baseline" in s.reason for s in sps)


def test_unknown_output_throughput_gives_no_number():
    """An imported run without output tok/s (None: unknown, MEASUREMENT.md "Missing is not zero")
    yields no speedup and no throughput point, and does not break its neighbours."""
    pts = [point(1, tps=100), point(2, "ngram", 4, tps=None), point(3, "linear", tps=150), point(4, tps=None, repeat=1)]
    sps = {s.label: s for s in compute_speedups(pts)}
    assert sps["ngram k=4"].value is None and sps["ngram k=4"].reason == "output tok/s unknown"
    assert sps["linear"].value == pytest.approx(1.5) and sps["auto"].median_output_throughput == 100
    pts += [point(5, tp=2, gpus=("a", "b"), tps=180), point(6, "linear", tp=2, gpus=("a", "b"), tps=250)]
    fig = figures.tp_scaling_figure(pts)
    assert sorted(t["name"] for t in fig["data"]) == ["auto", "linear"]  # ngram has no known tok/s


def test_repeats_use_medians_and_ci_needs_three():
    pts = [point(i, tps=t, repeat=i) for i, t in enumerate([100, 110, 90])]
    pts += [point(10 + i, "linear", tps=t, repeat=i) for i, t in enumerate([200, 180, 220])]
    lin = [s for s in compute_speedups(pts) if s.label == "linear"][0]
    assert lin.value == pytest.approx(2.0)
    lo, hi = lin.ci95
    assert lo <= 2.0 <= hi and lo < hi and lin.spread.startswith("95% CI")
    two = [s for s in compute_speedups(pts[:2] + pts[3:5]) if s.label == "linear"][0]
    assert two.ci95 is None and two.spread == "2 repeats (median; CI needs 3)"
    fig = figures.speedup_heatmap(compute_speedups(pts, figures=(END_TO_END, DECODE)), {p.run_id: p for p in pts},
                                  "auto", choice="e2e")
    (trace,) = fig["data"]
    assert trace["y"] == ["auto", "linear"] and trace["meta"]["speedup"] == "end_to_end"
    assert trace["text"][1][0].endswith(f"2.00×<br>{lo:.2f}–{hi:.2f}")  # the CI under the number
    assert "95% CI" in trace["hovertext"][1][0] and trace["customdata"][1][0]["runs"] == [10, 11, 12]


def test_best_ranks_by_speed_never_by_acceptance_length():
    pts = [point(1), point(2, "ddtree", budget=15, tps=650, tau=7.4), point(3, "ddtree", budget=64, tps=450, tau=9.0)]
    best = best_by(compute_speedups(pts), lambda s: s.point.tp)
    assert best[1].label == "b15"
    assert best_by([s for s in compute_speedups(pts[1:])], lambda s: 0) == {}  # no baseline: nothing is best


def test_inconsistent_gpus_flagged_per_tp():
    pts = [point(1, gpus=("GPU-0",)), point(2, "linear", gpus=("GPU-1",)), point(3, tp=4, gpus=("a", "b", "c", "d"))]
    assert inconsistent_gpu_tps(pts) == [1]


# --- the figures, read as data ----------------------------------------------------------------

def grid_points():
    """A small users'-grid shape: TP 1/4/8 x auto/linear/b15/b64 x concurrency 1/8."""
    ar = {(1, 1): 28, (4, 1): 61, (8, 1): 52, (1, 8): 190, (4, 8): 440, (8, 8): 420}
    factor = {"auto": 1.0, "linear": 4.0, "b15": 6.5, "b64": 4.5}
    tau = {"auto": None, "linear": 4.3, "b15": 7.4, "b64": 9.0}
    pts, i = [], 0
    for (tp, conc), base in ar.items():
        for lab, f in factor.items():
            i += 1
            method, budget = ("ddtree", int(lab[1:])) if lab.startswith("b") else (lab, None)
            tps = base * (f if conc == 1 else 1 + (f - 1) / 2)
            pts.append(point(i, method, budget=budget, tps=tps, tp=tp, conc=conc,
                             gpus=tuple(f"G{g}" for g in range(tp)), tau=tau[lab], tpot=1000.0 / (tps / conc)))
    return pts


def cell(fig, conc, label, tp):
    trace = next(t for t in fig["data"] if t["meta"]["concurrency"] == conc)
    r, c = trace["y"].index(label), trace["x"].index(f"TP{tp}")
    return trace["z"][r][c], trace["text"][r][c]


def test_heatmap_marks_the_best_cell_of_each_tp_only_beyond_noise():
    pts = grid_points()
    fig = figures.speedup_heatmap(compute_speedups(pts, figures=(END_TO_END, DECODE)), {p.run_id: p for p in pts},
                                  "auto")
    assert len(fig["data"]) == 2  # one panel per concurrency
    trace = fig["data"][0]
    assert trace["y"] == ["auto", "linear", "b15", "b64"] and trace["x"] == ["TP1", "TP4", "TP8"]
    assert [t["meta"]["speedup"] for t in fig["data"]] == ["decode", "end_to_end"]  # the default choice
    z, text = cell(fig, 1, "b15", 1)
    assert z == pytest.approx(6.5) and text == "6.50×<br>single run"  # single runs: no star, no verdict
    assert not any(t.startswith("★") for tr in fig["data"] for row in tr["text"] for t in row)
    # three repeats a few per cent apart: b15's interval is separated from b64's, so it is starred
    reps = [p.replace(run_id=p.run_id + 1000 * r, repeat_index=r,
                      output_throughput_tok_s=p.output_throughput_tok_s * (1 + 0.01 * r),
                      median_tpot_ms=p.median_tpot_ms / (1 + 0.01 * r)) for r in range(3) for p in pts]
    fig = figures.speedup_heatmap(compute_speedups(reps, figures=(END_TO_END, DECODE)),
                                  {p.run_id: p for p in reps}, "auto")
    assert cell(fig, 1, "b15", 1)[1].startswith("★ 6.50×")
    assert not cell(fig, 1, "b64", 1)[1].startswith("★")
    assert sum(t.startswith("★") for tr in fig["data"] for row in tr["text"] for t in row) == 6  # 3 TP x 2 panels
    assert len(fig["layout"]["shapes"]) == 6


def test_heatmap_without_any_baseline_says_why():
    pts = [point(1, "linear"), point(2, "ddtree", budget=15)]
    fig = figures.speedup_heatmap(compute_speedups(pts), {p.run_id: p for p in pts}, "auto")
    assert "data" not in fig and "no matching auto baseline" in fig["empty"]


def test_tp_scaling_at_concurrency_one_goes_down_from_tp4_to_tp8():
    fig = figures.tp_scaling_figure(grid_points())
    c1 = [t for t in fig["data"] if t["meta"]["concurrency"] == 1]
    assert {t["name"] for t in c1} == {"auto", "linear", "b15", "b64"}
    for t in c1:
        y = dict(zip(t["x"], t["y"], strict=True))
        assert y["TP4"] > y["TP8"], t["name"]
    assert {t["meta"]["concurrency"] for t in fig["data"]} == {1, 8}
    one_tp = figures.tp_scaling_figure([p for p in grid_points() if p.tp == 1])
    assert one_tp["empty"] == "One TP degree only (TP1): nothing to scale."


def test_decomposition_shows_tau_and_step_cost():
    fig = figures.decomposition_figure(grid_points())
    tp1 = [t for t in fig["data"] if t["xaxis"] == "x"]
    tau = next(t for t in tp1 if t["name"] == "τ (server counters)")
    assert tau["x"] == ["linear", "b15", "b64"] and tau["y"] == [4.3, 7.4, 9.0]
    cost = next(t for t in fig["data"] if t["type"] == "bar" and t["xaxis"] == "x2")
    # step time / AR TPOT = TPOT x tau / AR TPOT = tau / speedup at concurrency 1
    assert cost["y"] == pytest.approx([4.3 / 4.0, 7.4 / 6.5, 9.0 / 4.5], abs=1e-3)
    no_counters = [p.replace(acceptance_length=None) for p in grid_points()]
    assert "no spec-decode counters" in figures.decomposition_figure(no_counters)["caption"]
    nothing = [p.replace(acceptance_length=None, mean_tokens_per_chunk=None) for p in grid_points()]
    assert "no spec-decode counters and no client" in figures.decomposition_figure(nothing)["empty"].lower()
    only_auto = [p for p in grid_points() if p.method == "auto"]
    assert "only autoregressive" in figures.decomposition_figure(only_auto)["empty"]


def test_tradeoff_draws_curves_and_the_pareto_frontier():
    fig = figures.tradeoff_figure(grid_points())
    b15_tp4 = next(t for t in fig["data"] if t["name"] == "b15" and t["meta"]["tp"] == 4)
    assert b15_tp4["text"] == ["c1", "c8"]
    assert b15_tp4["y"][0] == pytest.approx(61 * 6.5, rel=1e-3)  # per-user tok/s = 1000 / TPOT
    front = next(t for t in fig["data"] if t["name"].startswith("Pareto"))
    assert front["x"] == sorted(front["x"]) and front["y"] == sorted(front["y"], reverse=True)
    one_level = figures.tradeoff_figure([p for p in grid_points() if p.concurrency == 1])
    assert one_level["empty"].startswith("One concurrency level only")


def test_pareto_frontier_keeps_only_undominated_points():
    pts = [(1, 10, "a"), (2, 9, "b"), (2, 5, "c"), (3, 1, "d"), (0.5, 10, "e")]
    assert [t for *_, t in figures.pareto_frontier(pts)] == ["a", "b", "d"]


def test_histogram_is_binned_on_the_server():
    fig = figures.distribution_figure(list(np.linspace(0, 100, 5000)), "TTFT", "ms")
    (bars,) = fig["data"]
    assert len(bars["y"]) == 50 and sum(bars["y"]) == 5000
    chunks = figures.distribution_figure([1.0] * 10 + [4.0] * 30 + [5.0] * 60, "Tokens per chunk", "tokens")
    assert chunks["data"][0]["x"] == [1.0, 2.0, 3.0, 4.0, 5.0] and chunks["data"][0]["y"] == [10, 0, 0, 30, 60]
    assert figures.distribution_figure([], "TTFT", "ms")["empty"] == "No samples."


def test_topology_figure_colours_links():
    fig = figures.topology_figure(["GPU0", "GPU1"], {(0, 1): "NV18", (1, 0): "NV18", (0, 0): "X", (1, 1): "X"})
    assert fig["data"][0]["text"] == [["X", "NV18"], ["NV18", "X"]]


def test_decode_speedup_is_the_tpot_ratio_and_tau_over_the_step_cost():
    """MEASUREMENT.md "Comparing runs": decode speedup = baseline median TPOT / configuration
    median TPOT = tau / relative step cost (TPOT x tau / baseline TPOT); end-to-end speedup is
    the output tok/s ratio, a different figure when TTFT is not negligible."""
    pts = [point(1, tps=100, tpot=20.0), point(2, tps=110, tpot=20.4, repeat=1),
           point(3, "ddtree", budget=15, tps=300, tpot=8.0, tau=4.0),
           point(4, "ddtree", budget=15, tps=280, tpot=8.4, tau=4.2, repeat=1)]
    (b15,) = [s for s in compute_speedups(pts, figures=(END_TO_END, DECODE)) if s.label == "b15"]
    decode, e2e = b15.ratios["decode"], b15.ratios["end_to_end"]
    assert decode.value == pytest.approx(20.2 / 8.2) and decode.baseline_median == pytest.approx(20.2)
    assert e2e.value == pytest.approx(290 / 105) and b15.value == e2e.value  # the pages' figure
    costs = relative_step_costs(pts)
    assert costs[1] is None and costs[3] == pytest.approx(8.0 * 4.0 / 20.2)
    for run_id, tau, tpot in ((3, 4.0, 8.0), (4, 4.2, 8.4)):
        assert tau / costs[run_id] == pytest.approx(20.2 / tpot)  # per run: tau / step cost = decode speedup
    # only the figures asked for are computed; a TPOT of 0 gives no decode number, with the reason
    assert set(compute_speedups(pts)[0].ratios) == {"end_to_end"}
    zero = compute_speedups([point(1, tpot=20.0), point(2, "ngram", 4, tpot=0.0)], figures=(DECODE,))
    (ngram,) = [s.ratios["decode"] for s in zero if s.label == "ngram k=4"]
    assert ngram.value is None and ngram.reason == "median TPOT of the configuration is 0"
