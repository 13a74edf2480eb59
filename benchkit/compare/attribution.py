"""Did the drafter get worse, or did verification get slower? (issue 21): pure, Django-free.

A speculative run's decode speed is acceptance x step cost: tokens per target step (tau)
divided by the time of one step (drafting plus verifying). MEASUREMENT.md "Comparing runs":
decode speedup = tau / relative step cost. A *twin* is a second run of the same point with the
engine's synthetic acceptance pinned to a reference tau (vLLM `rejection_sample_method:
synthetic` with `synthetic_acceptance_length`, SGLang `SGLANG_SIMULATE_ACC_LEN`, TensorRT-LLM
`TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`): its tau cannot move, so its speed moves with the
step cost alone. Across a change (a change point or a flag), with the real run's tau and speed
and the twin's speed before and after:

- **drafter**: the real tau moved the way the speed did by at least `tau_pct`, the twin's speed
  did not (less than `twin_pct`);
- **verify path**: the twin's speed moved the way the real speed did by at least `twin_pct`, tau
  did not;
- **both**: both did;
- **unknown**: neither did (the change is elsewhere: TTFT, scheduling, the client), or the
  twin's own tau moved by `tau_pct` or more (its acceptance was not pinned);
- **no twin**: no twin figures on one side of the change (the point has no twin, or the engine
  has no way to force acceptance).

"The way the speed did": worse when the real speed got worse (tau fell, the twin slowed),
better when it got better. The figures and the thresholds used are in every `Attribution`;
`expected_change_pct` is what tau and the twin together predict for the real speed (speed =
tau / step cost, so the ratio after / before is tau's ratio x the twin's ratio), and
`unexplained_pct` what is left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from benchkit.compare.changepoints import ChangePoint, Night

DRAFTER, VERIFY_PATH, BOTH, UNKNOWN, NO_TWIN = "drafter", "verify path", "both", "unknown", "no twin"
VERDICTS = (DRAFTER, VERIFY_PATH, BOTH, UNKNOWN, NO_TWIN)


@dataclass(frozen=True)
class Across:
    """One figure across a change: `before`, `after` in the figure's unit (> 0, finite), e.g.
    mean output tok/s or median TPOT ms of the nights on each side; `direction` +1 where higher
    is better (tok/s, tau), -1 where lower is (TPOT). Raises ValueError otherwise."""

    before: float
    after: float
    direction: int = 1

    def __post_init__(self) -> None:
        for name in ("before", "after"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"attribution figure {name} must be finite and > 0, got {v}")
        if self.direction not in (1, -1):
            raise ValueError(f"attribution figure direction must be +1 or -1, got {self.direction}")

    @property
    def change_pct(self) -> float:
        """after / before - 1, in %."""
        return (self.after / self.before - 1.0) * 100.0

    @property
    def worse_pct(self) -> float:
        """The change in %, positive when worse (for tok/s a fall, for TPOT a rise)."""
        return -self.direction * self.change_pct

    @property
    def speed_ratio(self) -> float:
        """How much faster after than before (> 1 faster): after / before for a higher-is-better
        figure, before / after for a lower-is-better one."""
        return (self.after / self.before) ** self.direction


@dataclass(frozen=True)
class AttributionRule:
    """Thresholds (%, > 0): `tau_pct`, the smallest change of the real tau that counts as the
    drafter (and of the twin's tau that says its acceptance was not pinned); `twin_pct`, the
    smallest change of the twin's speed that counts as the verify path. The default 3 % is the
    change-point detector's minimum magnitude (ChangePointRule.min_magnitude_pct)."""

    tau_pct: float = 3.0
    twin_pct: float = 3.0

    def __post_init__(self) -> None:
        for name in ("tau_pct", "twin_pct"):
            if not getattr(self, name) > 0:
                raise ValueError(f"attribution {name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Attribution:
    """The verdict (one of VERDICTS), a sentence with the figures and thresholds (`reason`),
    the figures (`tau`, `speed`, `twin_speed`, `twin_tau`; None where not given), the speed
    change that tau and the twin predict (`expected_change_pct`, %, None without a twin) and the
    rest (`unexplained_pct`: real speed ratio / predicted - 1, %), and the rule used."""

    verdict: str
    reason: str
    tau: Across
    speed: Across
    twin_speed: Across | None
    twin_tau: Across | None
    expected_change_pct: float | None
    unexplained_pct: float | None
    rule: AttributionRule


def _fmt(a: Across) -> str:
    return f"{a.change_pct:+.1f} % ({a.before:.4g} -> {a.after:.4g})"


def attribute(tau: Across, speed: Across, twin_speed: Across | None, rule: AttributionRule | None = None,
              twin_tau: Across | None = None) -> Attribution:
    """Name what moved the real speed across a change (module doc for the verdicts).

    `tau`: the real run's acceptance length (direction +1); `speed`: the real run's speed
    (output tok/s, direction +1, or median TPOT, direction -1); `twin_speed`: the twin's same
    figure, None without a twin; `twin_tau`: the twin's measured tau, to check it stayed
    pinned (optional). Raises ValueError when tau's direction is not +1 or the two speeds
    differ in direction (not the same figure).
    """
    rule = rule or AttributionRule()
    if tau.direction != 1:
        raise ValueError("attribution: tau is higher-is-better (direction +1)")
    if twin_speed is not None and twin_speed.direction != speed.direction:
        raise ValueError("attribution: the twin's speed must be the same figure as the real speed")
    worse = speed.worse_pct >= 0  # the sense to explain: a slowdown (or no change), or a speed-up
    sense = 1 if worse else -1
    fell, slowed = ("fell", "slowed") if worse else ("rose", "sped up")
    thresholds = f"thresholds: tau {rule.tau_pct:g} %, twin {rule.twin_pct:g} %"
    speed_txt = f"speed {_fmt(speed)}"
    if twin_speed is None:
        return Attribution(NO_TWIN, f"no twin: the point has no acceptance-pinned twin on both sides; {speed_txt}, "
                                    f"tau {_fmt(tau)}", tau, speed, None, twin_tau, None, None, rule)
    expected = (tau.speed_ratio * twin_speed.speed_ratio - 1.0) * 100.0
    unexplained = (speed.speed_ratio / (tau.speed_ratio * twin_speed.speed_ratio) - 1.0) * 100.0
    figures = (f"{speed_txt}, tau {_fmt(tau)}, twin's speed {_fmt(twin_speed)}; tau x twin predict "
               f"{expected:+.1f} %, unexplained {unexplained:+.1f} %; {thresholds}")
    if twin_tau is not None and abs(twin_tau.change_pct) >= rule.tau_pct:
        return Attribution(UNKNOWN, f"unknown: the twin's tau moved {_fmt(twin_tau)}, so its acceptance was not "
                                    f"pinned; {figures}", tau, speed, twin_speed, twin_tau, expected, unexplained,
                           rule)
    drafter = sense * tau.worse_pct >= rule.tau_pct
    verify = sense * twin_speed.worse_pct >= rule.twin_pct
    twin_state = "the twin's speed unchanged" if abs(twin_speed.change_pct) < rule.twin_pct else \
        "the twin's speed moved the other way"
    tau_state = "tau unchanged" if abs(tau.change_pct) < rule.tau_pct else "tau moved the other way"
    if drafter and verify:
        verdict, head = BOTH, f"both: tau {fell} and the twin {slowed} too"
    elif drafter:
        verdict, head = DRAFTER, f"drafter: tau {fell}, {twin_state}"
    elif verify:
        verdict, head = VERIFY_PATH, f"verify path: the twin {slowed} too, {tau_state}"
    else:
        verdict, head = UNKNOWN, "unknown: neither tau nor the twin's speed moved with the speed"
    return Attribution(verdict, f"{head}; {figures}", tau, speed, twin_speed, twin_tau, expected, unexplained, rule)


def _mean_over(nights: Sequence[Night], sweep_ids: set[int], metric: str) -> float | None:
    vals = [float(v) for night in nights if night.sweep_id in sweep_ids for v in night.values.get(metric) or ()]
    return sum(vals) / len(vals) if vals else None


def attribute_change(cp: ChangePoint, real: Sequence[Night], twin: Sequence[Night] | None,
                     rule: AttributionRule | None = None, speed_metric: str = "output_throughput_tok_s",
                     speed_direction: int = 1) -> Attribution | None:
    """`attribute` for a change point `cp` of the series `real` (the nights it was found on):
    each figure is the mean of every repeat over the nights `cp.before` and `cp.after` (by
    position in `real`; the twin's nights matched by sweep id). `twin`: the twin's nights
    (any order, any subset; None or no twin figures on a side: "no twin"). Returns None when
    the real series lacks tau or the speed on a side (not a speculative point).
    """
    before_ids = {n.sweep_id for n in real[cp.before[0]:cp.before[1]]}
    after_ids = {n.sweep_id for n in real[cp.after[0]:cp.after[1]]}

    def across(nights: Sequence[Night] | None, metric: str, direction: int) -> Across | None:
        if nights is None:
            return None
        b, a = _mean_over(nights, before_ids, metric), _mean_over(nights, after_ids, metric)
        return Across(b, a, direction) if b is not None and a is not None else None

    tau = across(real, "acceptance_length", 1)
    speed = across(real, speed_metric, speed_direction)
    if tau is None or speed is None:
        return None
    return attribute(tau, speed, across(twin, speed_metric, speed_direction), rule,
                     across(twin, "acceptance_length", 1))
