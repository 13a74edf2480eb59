"""Speedup matching and figure builders (pure functions)."""

import pytest

from analysis import figures
from benchkit.compare.speedups import bootstrap_ratio_ci, compute_speedups, inconsistent_gpu_tps
from benchkit.measure.metrics import WindowMetrics


def point(run_id, method="auto", k=None, tps=100.0, tp=1, conc=1, gpus=("GPU-a",), repeat=0, tau=None, **kw):
    p = dict(run_id=run_id, engine="vllm", engine_version="0.32.0", engine_build="", model="/m", gpu_uuids=gpus,
             tp=tp, dataset="random", input_len=32, output_len=128, concurrency=conc, request_rate=None,
             temperature=0.0, seed=0, method=method, num_speculative_tokens=k, tree_budget=None, drafter="",
             label=method if k is None else f"{method} k={k}", repeat_index=repeat,
             **{**WindowMetrics().to_dict(), "output_throughput_tok_s": tps, "acceptance_length": tau,
                "mean_tokens_per_chunk": tau})
    p.update(kw)
    return p


def by_label(sps):
    return {(s.label, s.key[9]): s for s in sps}  # key[9] = concurrency


def test_speedup_divides_by_matched_auto():
    sps = by_label(compute_speedups([point(1, tps=100), point(2, "draft_model", 4, tps=250),
                                     point(3, conc=4, tps=300), point(4, "draft_model", 4, conc=4, tps=330)]))
    assert sps[("draft_model k=4", 1)].value == pytest.approx(2.5)
    assert sps[("draft_model k=4", 1)].baseline_run_ids == [1]
    assert sps[("draft_model k=4", 4)].value == pytest.approx(1.1)
    assert sps[("auto", 1)].value == pytest.approx(1.0)


def test_no_baseline_means_no_number():
    # auto ran on other GPUs: not comparable, so no speedup is shown
    sps = compute_speedups([point(1, gpus=("GPU-b",)), point(2, "ngram", 4, tps=120)])
    ngram = [s for s in sps if s.label == "ngram k=4"][0]
    assert ngram.value is None and ngram.reason == "no matching auto baseline"


def test_unknown_output_throughput_gives_no_number():
    """An imported run without output tok/s (None: unknown, MEASUREMENT.md "Missing is not zero")
    yields no speedup and no throughput point, and does not break its neighbours."""
    pts = [point(1, tps=100), point(2, "ngram", 4, tps=None), point(3, "linear", tps=150), point(4, tps=None, repeat=1)]
    sps = {s.label: s for s in compute_speedups(pts)}
    assert sps["ngram k=4"].value is None and sps["ngram k=4"].reason == "output tok/s unknown"
    assert sps["linear"].value == pytest.approx(1.5) and sps["auto"].median_output_throughput == 100
    assert sorted(t["name"] for t in figures.throughput_figure(pts)["data"]) == ["auto · TP1", "linear · TP1"]


def test_repeats_use_medians_and_ci_needs_three():
    pts = [point(i, tps=t, repeat=i) for i, t in enumerate([100, 110, 90])]
    pts += [point(10 + i, "linear", tps=t, repeat=i) for i, t in enumerate([200, 180, 220])]
    lin = [s for s in compute_speedups(pts) if s.label == "linear"][0]
    assert lin.value == pytest.approx(2.0)
    lo, hi = lin.ci95
    assert lo <= 2.0 <= hi and lo < hi
    two = [s for s in compute_speedups(pts[:2] + pts[3:5]) if s.label == "linear"][0]
    assert two.ci95 is None
    (trace,) = figures.speedup_figure(compute_speedups(pts), {p["run_id"]: p for p in pts})["data"]
    assert trace["x"] == ["auto", "linear"] and trace["error_y"]["visible"] is True
    assert trace["error_y"]["arrayminus"][1] > 0 and "95% CI" in trace["hovertext"][1]


def test_bootstrap_ci_of_identical_samples_is_a_point():
    assert bootstrap_ratio_ci([2, 2, 2], [1, 1, 1]) == (2.0, 2.0)


def test_inconsistent_gpus_flagged_per_tp():
    pts = [point(1, gpus=("GPU-0",)), point(2, "linear", gpus=("GPU-1",)), point(3, tp=4, gpus=("a", "b", "c", "d"))]
    assert inconsistent_gpu_tps(pts) == [1]


def test_figures_hold_the_numbers():
    pts = [point(1, tps=100), point(2, "draft_model", 4, tps=250, tau=2.5)]
    sps = compute_speedups(pts)
    fig = figures.speedup_figure(sps, {p["run_id"]: p for p in pts})
    (trace,) = fig["data"]
    assert trace["x"] == ["auto", "draft_model k=4"] and trace["y"] == [1.0, 2.5]
    assert "single run" in trace["hovertext"][1] and trace["error_y"]["visible"] is False
    thr = figures.throughput_figure(pts)
    assert sorted(t["y"][0] for t in thr["data"]) == [100.0, 250.0]
    acc = figures.acceptance_figure(pts)
    assert acc["data"][0]["x"] == ["draft_model k=4"] and acc["data"][0]["y"] == [2.5]


def test_topology_figure_colours_links():
    fig = figures.topology_figure(["GPU0", "GPU1"], {(0, 1): "NV18", (1, 0): "NV18", (0, 0): "X", (1, 1): "X"})
    assert fig["data"][0]["text"] == [["X", "NV18"], ["NV18", "X"]]
