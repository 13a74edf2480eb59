"""Comparing two sweeps and detecting regressions over a nightly series (pure benchkit.compare)."""

from __future__ import annotations

import numpy as np
import pytest

from benchkit.compare.regressions import RegressionRule, detect_regressions
from benchkit.compare.sweepdiff import BETTER, SAME, UNKNOWN, WORSE, compare_sweeps
from benchkit.point import Point

_ids = iter(range(1, 1_000_000))


def pt(method="auto", tps=100.0, tp=1, conc=1, tpot=10.0, ttft=50.0, tau=None, fp="hw1", version="0.10.0",
       budget=None, repeat=0, **kw):
    return Point(run_id=next(_ids), engine="sglang", model="/m", method=method, tree_budget=budget, tp=tp,
                 input_len=512, output_len=1024, concurrency=conc, repeat_index=repeat, hardware_fingerprint=fp,
                 engine_version=version, **kw,
                 figures_=dict(output_throughput_tok_s=tps, median_tpot_ms=tpot, median_ttft_ms=ttft,
                               acceptance_length=tau))


# --- compare -------------------------------------------------------------------------------------


def test_single_runs_use_the_noise_threshold():
    old = [pt(tps=100), pt("linear", tps=200, tau=3.0), pt("ddtree", budget=15, tps=300, tau=4.0)]
    new = [pt(tps=102), pt("linear", tps=170, tau=3.0), pt("ddtree", budget=15, tps=330, tau=4.4)]
    d = compare_sweeps(old, new, noise_pct=5)
    by = {x.label: x for x in d.matched}
    assert by["auto"].verdict == SAME and by["auto"].changes["output_throughput_tok_s"].change_pct == pytest.approx(2)
    assert by["linear"].verdict == WORSE and by["linear"].changes["output_throughput_tok_s"].change_pct == \
        pytest.approx(-15)
    assert by["b15"].verdict == BETTER
    assert by["b15"].changes["acceptance_length"].change_pct == pytest.approx(10)
    assert by["auto"].single_run and by["auto"].changes["output_throughput_tok_s"].ci95_pct is None
    # TPOT: lower is better, so a lower TPOT is "better"
    assert by["auto"].changes["median_tpot_ms"].verdict == SAME
    assert d.counts == {BETTER: 1, WORSE: 1, SAME: 1, UNKNOWN: 0}


def test_lower_tpot_is_better_and_unknown_tau_has_no_verdict():
    d = compare_sweeps([pt(tpot=10.0)], [pt(tpot=8.0)])
    c = d.matched[0].changes
    assert c["median_tpot_ms"].verdict == BETTER and c["median_tpot_ms"].change_pct == pytest.approx(-20)
    assert c["acceptance_length"].verdict == UNKNOWN and c["acceptance_length"].change_pct is None


def test_repeats_give_a_bootstrap_ci_and_overlap_means_no_change():
    rng = np.random.default_rng(1)
    old = [pt(tps=100 + x, repeat=i) for i, x in enumerate(rng.normal(0, 1, 5))]
    faster = [pt(tps=110 + x, repeat=i) for i, x in enumerate(rng.normal(0, 1, 5))]
    noisy = [pt(tps=v, repeat=i) for i, v in enumerate([80, 125, 101, 95, 110])]
    d = compare_sweeps(old, faster)
    c = d.matched[0].changes["output_throughput_tok_s"]
    assert not d.matched[0].single_run
    assert c.ci95_pct[0] > 0 and c.verdict == BETTER and d.matched[0].verdict == BETTER
    # a 1 % median change with overlapping repeats is no significant change even under a 0.5 % noise bar
    d2 = compare_sweeps(old, noisy, noise_pct=0.5)
    c2 = d2.matched[0].changes["output_throughput_tok_s"]
    assert c2.ci95_pct[0] < 0 < c2.ci95_pct[1] and c2.verdict == SAME


def test_different_environment_is_put_apart_never_compared():
    old = [pt(tps=100), pt("linear", tps=200)]
    new = [pt(tps=60, version="0.11.0"), pt("linear", tps=200, fp="hw2")]
    d = compare_sweeps(old, new)
    assert d.matched == []
    reasons = {x.label: x.apart_reason for x in d.apart}
    assert reasons == {"auto": "engine version 0.10.0 -> 0.11.0", "linear": "hardware fingerprint hw1 -> hw2"}
    assert all(x.verdict == UNKNOWN for x in d.apart)
    assert d.counts[WORSE] == 0


def test_points_only_on_one_side():
    d = compare_sweeps([pt(), pt(tp=4)], [pt(), pt(tp=8)])
    assert [x.point.tp for x in d.only_old] == [4] and [x.point.tp for x in d.only_new] == [8]
    assert len(d.matched) == 1


def test_identity_ignores_environment_and_repeat():
    assert pt(fp="a", repeat=0).identity_hash() == pt(fp="b", repeat=2, version="x").identity_hash()
    assert pt(tp=1).identity_hash() != pt(tp=4).identity_hash()


# --- regressions ---------------------------------------------------------------------------------


def series(values_by_night, **kw):
    """One point (auto TP1 c1) with these tok/s per night; a second, steady point beside it."""
    return [(night + 1, [pt(tps=v, **kw), pt("linear", tps=200.0, **kw)]) for night, v in enumerate(values_by_night)]


RULE = RegressionRule(window=5, threshold_pct=10, test="hud", min_history=3)


def test_hud_flags_the_second_consecutive_worse_night():
    steady = [100, 101, 99, 100, 102, 100]
    assert detect_regressions(series(steady + [80]), RULE) == []  # one bad night: not yet
    (f,) = detect_regressions(series(steady + [80, 82]), RULE)
    assert f.label == "auto" and f.sweep_id == 8 and f.rule == "hud"
    # nights 3-7: 99, 100, 102, 100, 80 -> median 100 (the first slow night barely moves it)
    assert f.baseline == pytest.approx(100) and f.change_pct == pytest.approx(-18)
    assert f.previous_change_pct == pytest.approx(-20, abs=0.6)
    assert f.baseline_sweep_ids == [3, 4, 5, 6, 7]
    # the episode was flagged on night 8: night 9, still slow, raises nothing new
    assert detect_regressions(series(steady + [80, 82, 81]), RULE) == []


def test_hud_ignores_single_dips_small_changes_and_short_history():
    assert detect_regressions(series([100, 100, 100, 100, 80, 100, 80, 100]), RULE) == []  # never two in a row
    assert detect_regressions(series([100, 100, 100, 100, 95, 93]), RULE) == []  # under 10 %
    assert detect_regressions(series([100, 100, 80, 80]), RULE) == []  # night 3 has 2 earlier nights < 3
    assert detect_regressions(series([100]), RULE) == []


def test_hud_for_lower_is_better_metric():
    rule = RegressionRule(window=3, threshold_pct=10, test="hud", metrics=(("median_tpot_ms", -1),))
    nights = [(i + 1, [pt(tpot=v)]) for i, v in enumerate([10, 10, 10, 10, 12, 12])]
    (f,) = detect_regressions(nights, rule)
    assert f.metric == "median_tpot_ms" and f.change_pct == pytest.approx(20)


def test_environment_change_is_named_not_hidden():
    nights = series([100, 100, 100, 100])
    nights += [(5, [pt(tps=70, version="0.11.0")]), (6, [pt(tps=70, version="0.11.0")])]
    (f,) = detect_regressions(nights, RULE)
    assert f.note == "sweep 5: engine version 0.10.0 -> 0.11.0"


def repeats(night, values, **kw):
    return (night, [pt(tps=v, repeat=i, **kw) for i, v in enumerate(values)])


def test_mann_whitney_flags_one_night_with_repeats():
    base = [repeats(n, [100 + d for d in (-1, 0, 1)]) for n in range(1, 6)]
    rule = RegressionRule(window=5, threshold_pct=10, test="auto")
    (f,) = detect_regressions(base + [repeats(6, [85, 86, 84])], rule)
    assert f.rule == "mannwhitney" and f.p_value < 0.05 and f.change_pct == pytest.approx(-15)
    assert f.previous_change_pct is None
    # overlapping repeats: not significant even though the median moved 12 %
    assert detect_regressions(base + [repeats(6, [70, 88, 105])], rule) == []
    # second slow night of the same episode: nothing new
    assert detect_regressions(base + [repeats(6, [85, 86, 84]), repeats(7, [85, 86, 84])], rule) == []


def test_rule_settings_are_checked():
    for bad in (dict(window=0), dict(threshold_pct=0), dict(test="ttest"), dict(alpha=1.5),
                dict(min_history=9), dict(metrics=(("x", 2),))):
        with pytest.raises(ValueError, match="regression"):
            RegressionRule(**bad)
