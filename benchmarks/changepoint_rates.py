"""How often change-point detection (benchkit.compare.changepoints) raises something on nights
where nothing changed, and how often it finds issue 21's planted changes at the right night.

Series are one point of the 14-night users'-grid series built directly
(tests/nightly_figures.point_nights: users' figures, tok/s and tau noise, metrics computed from
request logs; no database), one series per seed:

- false positives: identical nights (no planted change, no dip) with 2 % noise on tok/s and on
  tau, uniform in +-2 % (as tests/nightly.py draws it) and normal with a 2 % standard deviation
  (harsher: 1.7x the spread), on TP1 b15 at concurrency 1 and TP8 linear at concurrency 8
  (each its own seeds, so the two points' noise differs); a series counts once when it raises
  any change point.
- planted changes (ISSUE21_CHANGES, 2 % uniform noise on tok/s and tau): found when exactly one
  change point is raised, on the planted night (the drift: within two nights), naming the
  planted metric (median TPOT for the step-cost step, tau for the tau changes), and of the
  planted kind.

    .venv/bin/python benchmarks/changepoint_rates.py [--seeds 200] [--processes 2] \
        [--alpha 0.001] [--min-magnitude 3.0]

Prints the rates and the nights found; never fails on a figure (exit 0).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchkit.compare.changepoints import ChangePointRule, detect_change_points  # noqa: E402
from tests.nightly_figures import ISSUE21_CHANGES, Planted, PlantedChange, point_nights  # noqa: E402

NO_PLANT = Planted(drop_pct=0.0)
QUIET_POINTS = (("b15", 1, 1), ("linear", 8, 8))
PLANTED_METRIC = {"step_cost": "median_tpot_ms", "tau": "acceptance_length"}


def _fp_one(job: tuple[str, int, int, int, str, ChangePointRule]) -> list[str]:
    label, tp, c, seed, noise, rule = job
    nights = point_nights(label, tp, c, noise_pct=2.0, tau_noise_pct=2.0, seed=seed, planted=NO_PLANT,
                          changes=(), dip=False, noise=noise)
    return [f"{label} tp{tp} c{c} seed {seed}: {cp.sentence()}" for cp in detect_change_points(nights, rule)]


def false_positives(pool, seeds: int, noise: str, rule: ChangePointRule) -> tuple[int, int, list[str]]:
    """(series raising something, series, the sentences of the first few raised)."""
    jobs = [(label, tp, c, k * 100_000 + seed, noise, rule)
            for k, (label, tp, c) in enumerate(QUIET_POINTS) for seed in range(seeds)]
    results = pool.map(_fp_one, jobs, chunksize=8)
    raised = [r for r in results if r]
    return len(raised), len(jobs), [line for r in raised[:4] for line in r]


def _planted_one(job: tuple[PlantedChange, int, ChangePointRule]) -> tuple[bool, list[int], str]:
    ch, seed, rule = job
    nights = point_nights(ch.label, ch.tp, ch.concurrency, noise_pct=2.0, tau_noise_pct=2.0, seed=seed,
                          planted=NO_PLANT, changes=(ch,), dip=False)
    cps = detect_change_points(nights, rule)
    tolerance = 2 if ch.kind == "drift" else 0
    ok = (len(cps) == 1 and abs(cps[0].index + 1 - ch.from_night) <= tolerance
          and cps[0].shift(PLANTED_METRIC[ch.target]) is not None and cps[0].kind == ch.kind)
    return ok, [cp.index + 1 for cp in cps], f"seed {seed}: " + (" | ".join(cp.sentence() for cp in cps) or "nothing")


def planted(pool, seeds: int, rule: ChangePointRule) -> None:
    for ch in ISSUE21_CHANGES:
        results = pool.map(_planted_one, [(ch, seed, rule) for seed in range(seeds)], chunksize=8)
        found = sum(ok for ok, _, _ in results)
        nights_found = collections.Counter(n for _, ns, _ in results for n in ns)
        print(f"{ch.name} ({ch.label} tp{ch.tp} c{ch.concurrency}, {ch.pct:+g} % {ch.target} {ch.kind} from night "
              f"{ch.from_night}): found as planted in {found}/{seeds} ({100 * found / seeds:.1f} %); "
              f"change points raised per night: {dict(sorted(nights_found.items()))}")
        for _, _, line in [r for r in results if not r[0]][:3]:
            print(f"    miss {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=ChangePointRule.alpha)
    ap.add_argument("--min-magnitude", type=float, default=ChangePointRule.min_magnitude_pct)
    args = ap.parse_args()
    rule = ChangePointRule(alpha=args.alpha, min_magnitude_pct=args.min_magnitude)
    print(f"rule: alpha {rule.alpha}, min magnitude {rule.min_magnitude_pct} %, penalty "
          f"{rule.penalty_scale} x (d + 1) ln n, min segment {rule.min_segment_nights} nights, "
          f"min drift {rule.min_drift_nights} nights; 14 nights per series, {args.seeds} seeds")
    t0 = time.perf_counter()
    with multiprocessing.Pool(args.processes) as pool:
        for noise in ("uniform", "normal"):
            raised, total, examples = false_positives(pool, args.seeds, noise, rule)
            print(f"false positives, identical nights, 2 % {noise} noise on tok/s and tau: {raised}/{total} "
                  f"series ({100 * raised / total:.2f} %)")
            for e in examples:
                print(f"    {e}")
        planted(pool, args.seeds, rule)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
