"""Drafter or verify path (benchkit.compare.attribution, issue 21): the verdicts on synthetic
figures, their thresholds, and the whole path from a change point of the users'-grid series
(tests/nightly_figures) and an acceptance-pinned twin's nights. No Django."""

from __future__ import annotations

import dataclasses

import pytest

from benchkit.compare.attribution import (
    BOTH,
    DRAFTER,
    NO_TWIN,
    UNKNOWN,
    VERIFY_PATH,
    Across,
    AttributionRule,
    attribute,
    attribute_change,
)
from benchkit.compare.changepoints import Night, detect_change_points
from tests.nightly_figures import ISSUE21_CHANGES, Planted, point_nights

TPOT_DIR = -1


def test_drafter_when_only_tau_falls():
    a = attribute(tau=Across(6.1, 5.61), speed=Across(1270.8, 1169.1), twin_speed=Across(905.0, 902.3))
    assert a.verdict == DRAFTER
    assert a.reason.startswith("drafter: tau fell, the twin's speed unchanged")
    for figure in ("-8.0 % (6.1 -> 5.61)", "-0.3 % (905 -> 902.3)", "-8.0 % (1271 -> 1169)", "tau 3 %", "twin 3 %"):
        assert figure in a.reason, (figure, a.reason)
    assert a.expected_change_pct == pytest.approx((5.61 / 6.1 * 902.3 / 905.0 - 1) * 100)
    assert abs(a.unexplained_pct) < 0.5


def test_verify_path_when_the_twin_slows_too():
    a = attribute(tau=Across(4.2, 4.19), speed=Across(629.0, 571.0), twin_speed=Across(480.0, 436.0))
    assert a.verdict == VERIFY_PATH
    assert a.reason.startswith("verify path: the twin slowed too, tau unchanged")


def test_both_when_tau_falls_and_the_twin_slows():
    a = attribute(tau=Across(6.1, 5.6), speed=Across(1270.0, 1100.0), twin_speed=Across(900.0, 850.0))
    assert a.verdict == BOTH


def test_no_twin_and_unknown():
    assert attribute(Across(6.1, 5.6), Across(1270.0, 1160.0), None).verdict == NO_TWIN
    # the speed fell, but neither tau nor the twin moved: something else (TTFT, scheduling)
    a = attribute(Across(6.1, 6.08), Across(1270.0, 1150.0), Across(900.0, 895.0))
    assert a.verdict == UNKNOWN
    assert a.unexplained_pct == pytest.approx((1150 / 1270 / (6.08 / 6.1 * 895 / 900) - 1) * 100)
    # the twin's own tau moved: its acceptance was not pinned, so it cannot separate anything
    a = attribute(Across(6.1, 5.6), Across(1270.0, 1160.0), Across(900.0, 899.0), twin_tau=Across(6.0, 5.5))
    assert a.verdict == UNKNOWN and "not pinned" in a.reason


def test_thresholds_are_inclusive_and_settable():
    speed, twin = Across(100.0, 95.0), Across(100.0, 100.0)
    assert attribute(Across(5.0, 4.86), speed, twin).verdict == UNKNOWN  # tau -2.8 %
    assert attribute(Across(5.0, 4.85), speed, twin).verdict == DRAFTER  # tau -3.0 %
    assert attribute(Across(5.0, 4.86), speed, twin, AttributionRule(tau_pct=2.5)).verdict == DRAFTER
    assert attribute(Across(5.0, 5.0), speed, Across(100.0, 97.0)).verdict == VERIFY_PATH  # twin -3.0 %
    assert attribute(Across(5.0, 5.0), speed, Across(100.0, 97.0), AttributionRule(twin_pct=4)).verdict == UNKNOWN


def test_tpot_as_the_speed_and_improvements():
    # TPOT up 10 % on the real run and on the twin: the verify path got slower
    a = attribute(Across(4.2, 4.2), Across(10.0, 11.0, TPOT_DIR), Across(12.0, 13.2, TPOT_DIR))
    assert a.verdict == VERIFY_PATH and a.expected_change_pct == pytest.approx((12.0 / 13.2 - 1) * 100)
    # a faster night explained by a better drafter
    a = attribute(Across(6.1, 6.6), Across(1200.0, 1300.0), Across(900.0, 902.0))
    assert a.verdict == DRAFTER and a.reason.startswith("drafter: tau rose")
    # tau fell while the twin sped up: not "unchanged"
    a = attribute(Across(6.1, 5.6), Across(1200.0, 1150.0), Across(900.0, 960.0))
    assert a.verdict == DRAFTER and "moved the other way" in a.reason


def test_bad_figures_are_refused():
    with pytest.raises(ValueError, match="before must be finite and > 0"):
        Across(0.0, 1.0)
    with pytest.raises(ValueError, match="direction"):
        Across(1.0, 1.0, 2)
    with pytest.raises(ValueError, match="same figure"):
        attribute(Across(5.0, 4.0), Across(10.0, 11.0, TPOT_DIR), Across(100.0, 90.0))
    with pytest.raises(ValueError, match="tau_pct"):
        AttributionRule(tau_pct=0)


def _twin(real: list[Night], pinned_tau: float) -> list[Night]:
    """The acceptance-pinned twin of `real`: tau pinned, the real run's step cost, so its speed
    is the real speed x pinned / real tau (speed = tau / step cost)."""
    out = []
    for night in real:
        tau = sum(night.values["acceptance_length"]) / len(night.values["acceptance_length"])
        out.append(Night(night.sweep_id, {
            "output_throughput_tok_s": tuple(v * pinned_tau / tau for v in night.values["output_throughput_tok_s"]),
            "median_tpot_ms": tuple(v * tau / pinned_tau for v in night.values["median_tpot_ms"]),
            "acceptance_length": (pinned_tau,)}))
    return out


@pytest.mark.parametrize("name, expected", [("tau drop", DRAFTER), ("tpot step", VERIFY_PATH)])
def test_change_points_of_the_planted_series_are_attributed(name, expected):
    """The tau drop on b15 (step cost unchanged) is the drafter; the TPOT step on TP8 linear
    (tau unchanged, the twin slows too) is the verify path; without a twin, "no twin"."""
    change = next(c for c in ISSUE21_CHANGES if c.name == name)
    real = point_nights(change.label, change.tp, change.concurrency, seed=2, tau_noise_pct=1.0,
                        planted=Planted(drop_pct=0.0), changes=(change,), dip=False)
    [cp] = detect_change_points(real)
    twin = _twin(real, pinned_tau=5.0)
    a = attribute_change(cp, real, twin)
    assert a.verdict == expected, a.reason
    assert attribute_change(cp, real, twin, speed_metric="median_tpot_ms", speed_direction=-1).verdict == expected
    assert attribute_change(cp, real, None).verdict == NO_TWIN
    # a twin that only started after the change has nothing before it: no twin
    late = [n for n in twin if n.sweep_id >= cp.sweep_id]
    assert attribute_change(cp, real, late).verdict == NO_TWIN


def test_attribute_change_needs_a_speculative_point():
    real = point_nights("auto", 4, 8, planted=Planted(drop_pct=0.0), changes=(), dip=False)
    real = [dataclasses.replace(n, values={**n.values, "output_throughput_tok_s": tuple(
        v * (0.8 if i >= 7 else 1.0) for v in n.values["output_throughput_tok_s"])}) for i, n in enumerate(real)]
    [cp] = detect_change_points(real)
    assert attribute_change(cp, real, None) is None
