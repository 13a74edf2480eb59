"""Change points over a nightly series (benchkit.compare.changepoints, issue 21), on series built
directly from the users'-grid figures (tests/nightly_figures.point_nights: no database): the
planted changes found at their night with their metric, nothing raised on identical nights, the
environment named, the rule's statistics checked against scipy. No Django."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import linregress, ttest_ind

from benchkit.compare.changepoints import (
    DRIFT,
    ENVIRONMENT,
    JOINT,
    STEP,
    WORSE,
    ChangePointRule,
    Night,
    SeriesMetric,
    detect_change_points,
    env_changes,
)
from tests.nightly_figures import (
    ISSUE21_CHANGES,
    PLANTED,
    Planted,
    PlantedChange,
    point_nights,
    special_nights,
)

NO_PLANT = Planted(drop_pct=0.0)
CHANGE = {c.name: c for c in ISSUE21_CHANGES}
SEEDS = range(5)
TOK_S, TPOT, TAU = "output_throughput_tok_s", "median_tpot_ms", "acceptance_length"


def planted_series(change: PlantedChange, seed: int, **kw) -> list[Night]:
    """One point of the 14-night series with only `change` planted; 2 % uniform noise on tok/s
    (as tests/nightly.py draws it) and on tau."""
    kw = {"noise_pct": 2.0, "tau_noise_pct": 2.0, "planted": NO_PLANT, "dip": False, **kw}
    return point_nights(change.label, change.tp, change.concurrency, seed=seed, changes=(change,), **kw)


@pytest.mark.parametrize("seed", SEEDS)
def test_tpot_step_on_tp8_linear_found_at_night_9(seed):
    cps = detect_change_points(planted_series(CHANGE["tpot step"], seed))
    assert [(cp.index + 1, cp.kind) for cp in cps] == [(9, STEP)], [cp.sentence() for cp in cps]
    cp = cps[0]
    tpot = cp.shift(TPOT)
    assert tpot is not None and tpot.verdict == WORSE and 7.0 < tpot.change_pct < 16.0, cp.sentence()
    assert cp.shift(TOK_S).verdict == WORSE
    assert cp.shift(TAU) is None  # the step cost moved, acceptance did not
    assert cp.sweep_id == 109 and cp.before == (0, 8) and cp.after == (8, 14)
    assert JOINT in cp.found_by and f"metric:{TPOT}" in cp.found_by


@pytest.mark.parametrize("seed", SEEDS)
def test_slow_tau_drift_on_b32_found_within_two_nights_of_night_5(seed):
    cps = detect_change_points(planted_series(CHANGE["tau drift"], seed))
    assert len(cps) == 1 and cps[0].kind == DRIFT, [cp.sentence() for cp in cps]
    cp = cps[0]
    assert abs(cp.index + 1 - 5) <= 2, cp.sentence()
    tau = cp.shift(TAU)
    assert tau is not None and tau.kind == DRIFT and tau.verdict == WORSE, cp.sentence()
    # about 1 %/night, each night below the minimum magnitude, the whole at least that
    assert -2.0 < tau.rate_pct_per_night < -0.5 and abs(tau.change_pct) >= 3.0
    assert tau.start_index == cp.index and tau.end_index > tau.start_index + 2


@pytest.mark.parametrize("seed", SEEDS)
def test_tau_drop_on_b15_found_at_its_night_with_tau_named(seed):
    change = CHANGE["tau drop"]
    cps = detect_change_points(planted_series(change, seed))
    assert [(cp.index + 1, cp.kind) for cp in cps] == [(change.from_night, STEP)], [cp.sentence() for cp in cps]
    tau = cps[0].shift(TAU)
    assert tau is not None and tau.verdict == WORSE and -11.0 < tau.change_pct < -5.0
    assert cps[0].shift(TOK_S).verdict == WORSE  # unchanged step cost: tok/s follows tau


@pytest.mark.parametrize("seed", SEEDS)
def test_identical_nights_with_2pct_noise_raise_nothing(seed):
    """benchmarks/changepoint_rates.py reports the rate over 200 seeds."""
    for label, tp, c in (("b15", 1, 1), ("linear", 8, 8), ("auto", 4, 8)):
        for noise in ("uniform", "normal"):
            nights = point_nights(label, tp, c, noise_pct=2.0, tau_noise_pct=2.0, seed=seed, planted=NO_PLANT,
                                  changes=(), dip=False, noise=noise)
            assert detect_change_points(nights) == [], (label, tp, c, noise)


def test_nightly_fixture_whole_story_on_its_points():
    """The series of tests/nightly.py with ISSUE21_CHANGES on top of its own planted
    regression and dip: each planted point has its one change point; the single-night dip and
    a quiet point have none; the engine upgrade next to the old planted regression is named."""
    found = {}
    for label, tp, c in {(ch.label, ch.tp, ch.concurrency) for ch in ISSUE21_CHANGES} | {
            (PLANTED.label, PLANTED.tp, PLANTED.concurrency), ("b32", 1, 8), ("b64", 4, 1)}:
        cps = detect_change_points(point_nights(label, tp, c, seed=3, tau_noise_pct=2.0))
        found[(label, tp, c)] = [(cp.index + 1, cp.kind) for cp in cps]
    assert found[("linear", 8, 8)] == [(9, STEP)]
    assert found[("b32", 1, 1)][0][1] == DRIFT and abs(found[("b32", 1, 1)][0][0] - 5) <= 2
    assert found[("b15", 4, 8)] == [(7, STEP)]
    assert found[("b32", 1, 8)] == []  # one bad night is not a change
    assert found[("b64", 4, 1)] == []
    special = special_nights(14)
    assert found[("linear", 8, 1)] == [(14 - PLANTED.nights + 1, STEP)]
    cp = detect_change_points(point_nights("linear", 8, 1, seed=3, tau_noise_pct=2.0))[0]
    assert [(e.index + 1, e.name, e.before, e.after) for e in cp.env_changes] == [
        (special.engine_upgrade, "engine_version", "0.5.2", "0.5.3")]
    assert "engine_version 0.5.2 -> 0.5.3" in cp.sentence()


def _flat(n: int, levels: dict[str, float], seed: int = 0, noise_pct: float = 1.0, repeats: int = 1,
          env=lambda i: {}) -> list[Night]:
    rng = np.random.default_rng(seed)
    return [Night(100 + i, {m: tuple(v * (1 + rng.normal(0, noise_pct) / 100) for _ in range(repeats))
                            for m, v in levels.items()}, env(i)) for i in range(n)]


def _scale(nights: list[Night], start: int, factors: dict[str, float], stop: int | None = None) -> list[Night]:
    out = []
    for i, night in enumerate(nights):
        if start <= i < (stop if stop is not None else len(nights)):
            night = dataclasses.replace(night, values={m: tuple(v * factors.get(m, 1.0) for v in vals)
                                                       for m, vals in night.values.items()})
        out.append(night)
    return out


LEVELS = {TOK_S: 1000.0, TPOT: 8.0, TAU: 5.0}


def test_a_change_at_an_environment_change_is_named_not_hidden():
    def env(i):
        return {"drafter": "dflash-ckpt-a" if i < 8 else "dflash-ckpt-b", "engine_build": "sglang-ddtree-pr"}

    nights = _scale(_flat(14, LEVELS, env=env), 8, {TAU: 0.9, TOK_S: 0.9})
    [cp] = detect_change_points(nights)
    assert cp.index == 8 and ENVIRONMENT in cp.found_by
    assert [(e.name, e.before, e.after) for e in cp.env_changes] == [("drafter", "dflash-ckpt-a", "dflash-ckpt-b")]
    assert {s.metric for s in cp.shifts} == {TAU, TOK_S}


def test_an_environment_change_that_moves_nothing_raises_nothing_but_is_listed():
    nights = _flat(14, LEVELS, env=lambda i: {"driver_version": "575" if i < 5 else "580"})
    assert detect_change_points(nights) == []
    assert [(e.index, e.sweep_id, e.sentence()) for e in env_changes(nights)] == [(5, 105, "driver_version 575 -> 580")]


def test_a_small_change_at_a_known_boundary_is_tested_there():
    """PELT's penalty need not see it: the environment boundary is a candidate of its own."""
    env = {"engine_commit": "aaa"}
    nights = _scale(_flat(14, LEVELS, noise_pct=0.5, env=lambda i: env if i < 7 else {"engine_commit": "bbb"}),
                    7, {TOK_S: 0.96})
    [cp] = detect_change_points(nights)
    assert cp.index == 7 and ENVIRONMENT in cp.found_by and [s.metric for s in cp.shifts] == [TOK_S]


def test_two_metrics_moving_a_little_together_are_found_jointly():
    """The issue's night where tok/s fell 4 % while tau fell 6 %."""
    nights = _scale(_flat(14, LEVELS, seed=1, noise_pct=1.0), 7, {TOK_S: 0.96, TAU: 0.94})
    [cp] = detect_change_points(nights)
    assert cp.index == 7 and JOINT in cp.found_by
    assert {s.metric: round(s.change_pct) for s in cp.shifts} == {TOK_S: -4, TAU: -6}


def test_two_steps_in_one_series_are_two_change_points():
    nights = _scale(_scale(_flat(16, LEVELS, seed=2), 5, {TOK_S: 0.9}), 11, {TOK_S: 0.9})
    assert [(cp.index, cp.kind) for cp in detect_change_points(nights)] == [(5, STEP), (11, STEP)]


def test_an_improvement_is_better_and_tpot_direction_is_respected():
    nights = _scale(_flat(12, LEVELS, seed=3), 6, {TOK_S: 1.15, TPOT: 1 / 1.15})
    [cp] = detect_change_points(nights)
    assert {s.metric: s.verdict for s in cp.shifts} == {TOK_S: "better", TPOT: "better"}


def test_below_the_minimum_magnitude_nothing_even_when_significant():
    quiet = _flat(14, LEVELS, seed=4, noise_pct=0.1)
    assert detect_change_points(_scale(quiet, 7, {TOK_S: 0.98})) == []  # p tiny, 2 % < 3 %
    [cp] = detect_change_points(_scale(quiet, 7, {TOK_S: 0.96}))
    assert cp.index == 7
    assert detect_change_points(_scale(quiet, 7, {TOK_S: 0.98}), ChangePointRule(min_magnitude_pct=1.5))


def test_the_step_test_is_students_t_on_every_repeat():
    """With repeats per night the test uses them: the p and means are scipy's Student's t-test
    (equal variances, two-sided) on the repeats of the two segments."""
    nights = _scale(_flat(10, LEVELS, seed=5, noise_pct=2.0, repeats=3), 5, {TOK_S: 0.9})
    [cp] = detect_change_points(nights)
    s = cp.shift(TOK_S)
    before = [v for n in nights[:5] for v in n.values[TOK_S]]
    after = [v for n in nights[5:] for v in n.values[TOK_S]]
    assert s.p_value == pytest.approx(ttest_ind(before, after).pvalue, rel=1e-9)
    assert (s.before_mean, s.after_mean) == pytest.approx((np.mean(before), np.mean(after)))
    assert (s.nights_before, s.nights_after) == (5, 5)


def test_a_drift_is_a_ramp_whose_coefficient_is_tested():
    """A 1 %/night fall in tok/s from night 6 of 16: the drift's p is the regression's on the
    ramp's shape (scipy.stats.linregress of the values on g(t))."""
    base = _flat(16, LEVELS, seed=6, noise_pct=0.5)
    nights = [dataclasses.replace(n, values={**n.values, TOK_S: tuple(v * (1 - 0.01 * max(0, i - 4))
                                                                      for v in n.values[TOK_S])})
              for i, n in enumerate(base)]
    [cp] = detect_change_points(nights)
    s = cp.shift(TOK_S)
    assert cp.kind == DRIFT and abs(cp.index - 5) <= 1 and s.rate_pct_per_night == pytest.approx(-1.0, abs=0.3)
    k1, k2 = s.start_index - 1, s.end_index
    t = np.arange(cp.before[0], cp.after[1])
    g = np.clip((t - k1) / (k2 - k1), 0, 1)
    y = [nights[i].values[TOK_S][0] for i in t]
    assert s.p_value == pytest.approx(linregress(g, y).pvalue, rel=1e-6)


def test_missing_figures_are_unknown_not_zero():
    """A night without tau (counters lost) or a point without tau (autoregressive) still
    analyses what it has."""
    nights = _scale(_flat(14, LEVELS, seed=7), 8, {TOK_S: 0.85})
    holes = [dataclasses.replace(n, values={k: (() if (k == TAU and i in (3, 10)) else v)
                                            for k, v in n.values.items()}) for i, n in enumerate(nights)]
    assert [cp.index for cp in detect_change_points(holes)] == [8]
    no_tau = [dataclasses.replace(n, values={k: v for k, v in n.values.items() if k != TAU}) for n in nights]
    assert [cp.index for cp in detect_change_points(no_tau)] == [8]
    assert detect_change_points(nights[:3]) == []  # too short to have a change point


def test_deterministic():
    nights = planted_series(CHANGE["tau drift"], seed=11)
    assert detect_change_points(nights) == detect_change_points(list(nights))


def test_bad_rules_and_figures_are_refused_by_name():
    with pytest.raises(ValueError, match="alpha"):
        ChangePointRule(alpha=0)
    with pytest.raises(ValueError, match="min_segment_nights"):
        ChangePointRule(min_segment_nights=1)
    with pytest.raises(ValueError, match="not a WindowMetrics field"):
        SeriesMetric("tok_per_s", 1)
    with pytest.raises(ValueError, match="direction"):
        SeriesMetric(TOK_S, 0)
    bad = _flat(8, LEVELS)
    bad[3] = dataclasses.replace(bad[3], values={**bad[3].values, TOK_S: (0.0,)})
    with pytest.raises(ValueError, match=f"{TOK_S}: figures must be > 0"):
        detect_change_points(bad)
