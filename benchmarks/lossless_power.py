"""The lossless check's false-alarm rate and power (issue 31; the rule: benchkit.compare.lossless,
"the pooled rule"; docs/LOSSLESS.md), by seeded simulation through the real code path
(`check_runs` over output digests built with benchkit.measure.outputs; no database).

Each trial is one sweep cell: `--ar` autoregressive repeats (the floor and the baselines) and
`--repeats` repeats of one speculative configuration, `--prompts` prompts of 64 tokens each.

- Noise (every run, AR and speculative alike): batch-variant numerics, independent per (prompt,
  run): with probability `--noise` a request's output changes from a position drawn uniformly in
  1..63 on (a new output, unlike every other run's). 0.053 gives AR vs AR about 10 % of prompts
  differing per pair (2 p (1 - p)), issue 31's floor.
- Fragile noise (the assumption broken on purpose): a share of the prompts are fragile (a near
  tie at one position): each run flips there with probability 0.5, to the same other output;
  the rest as above. Not what the rule assumes; printed to show what happens then.
- Bug: a systematic divergence: each prompt is hit with probability EFFECT (10 %; or exactly 5
  of 24, issue 31's case) and then diverges at token 30 to the same output in every repeat.

Verdicts counted per trial (each repeat of a cell gets the cell's verdict): false alarm = "not
lossless" (beyond_floor) where no bug was planted; detection = beyond_floor where one was.

    .venv/bin/python benchmarks/lossless_power.py [--trials 200] [--seed 0]

Prints one row per scenario, and the analytic power (`systematic_power`) and prompts needed
(`prompts_needed`) beside it; never fails on a figure (exit 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchkit.compare import lossless as ll  # noqa: E402
from benchkit.measure import outputs as out  # noqa: E402
from benchkit.point import Point  # noqa: E402

LENGTH = 64
BUG_AT = 30
NOISE = 0.053


def _outputs(rows: list[list[int]]) -> out.RunOutputs:
    return out.RunOutputs.from_records(out.digest_output(i, f"prompt {i}", ids, None, True)
                                       for i, ids in enumerate(rows))


def trial(rng: np.random.Generator, prompts: int, repeats: int, ar: int, noise: float, bug: str,
          fragile: float = 0.0) -> str:
    """One cell's verdict (module docstring). `bug`: "" (none), "effect" (each prompt with
    probability EFFECT), or "5of24" (exactly 5 prompts)."""
    base = [[1000 * i + j for j in range(LENGTH)] for i in range(prompts)]
    frag = rng.random(prompts) < fragile
    frag_at = rng.integers(1, LENGTH, prompts)
    if bug == "effect":
        hit = rng.random(prompts) < ll.EFFECT
    elif bug == "5of24":
        hit = np.zeros(prompts, bool)
        hit[rng.choice(prompts, 5, replace=False)] = True
    else:
        hit = np.zeros(prompts, bool)
    serial = iter(range(1, 10**9))

    def one_run(spec: bool) -> out.RunOutputs:
        rows = []
        for i in range(prompts):
            ids = list(base[i])
            if spec and hit[i]:
                ids[BUG_AT:] = [t + 500_000 for t in ids[BUG_AT:]]  # the same wrong output every repeat
            if frag[i]:
                if rng.random() < 0.5:
                    ids[frag_at[i]:] = [t + 700_000 for t in ids[frag_at[i]:]]
            elif rng.random() < noise:
                at, tag = int(rng.integers(1, LENGTH)), next(serial)
                ids[at:] = [t + 1_000_000 * tag for t in ids[at:]]
            rows.append(ids)
        return _outputs(rows)

    outs, points = {}, []
    for k in range(ar):
        points.append(Point(run_id=1 + k, method="auto", repeat_index=k))
        outs[1 + k] = one_run(False)
    for k in range(repeats):
        rid = 100 + k
        points.append(Point(run_id=rid, method="ngram", num_speculative_tokens=3, repeat_index=k))
        outs[rid] = one_run(True)
    got = ll.check_runs(points, outs.get)
    verdicts = {v.verdict for v in got.values()}
    assert len(verdicts) == 1, verdicts  # a configuration's repeats share the pooled verdict
    return verdicts.pop()


SCENARIOS = [
    # (name, prompts, repeats, bug, fragile)
    ("lossless, 24 x 3", 24, 3, "", 0.0),
    ("bug on 10 % of prompts, 24 x 3", 24, 3, "effect", 0.0),
    ("issue 31: bug on 5 of 24, 24 x 3", 24, 3, "5of24", 0.0),
    ("lossless, recommended 48 x 3", 48, 3, "", 0.0),
    ("bug on 10 % of prompts, recommended 48 x 3", 48, 3, "effect", 0.0),
    ("lossless, 24 x 2", 24, 2, "", 0.0),
    ("bug on 10 % of prompts, 24 x 2", 24, 2, "effect", 0.0),
    ("lossless, 8 x 3 (too few prompts)", 8, 3, "", 0.0),
    ("bug on 10 % of prompts, 8 x 3", 8, 3, "effect", 0.0),
    ("lossless, 24 x 1 (one run)", 24, 1, "", 0.0),
    ("issue 31: bug on 5 of 24, 24 x 1", 24, 1, "5of24", 0.0),
    ("lossless, fragile 10 % of prompts (assumption broken), 24 x 3", 24, 3, "", 0.10),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ar", type=int, default=3, help="AR repeats (the floor: every pair)")
    ap.add_argument("--noise", type=float, default=NOISE)
    a = ap.parse_args()
    t0 = time.perf_counter()
    print(f"lossless check, {a.trials} seeded trials per scenario (seed {a.seed}); {a.ar} AR repeats, noise "
          f"{a.noise:g} per request (AR vs AR ~{100 * 2 * a.noise * (1 - a.noise):.0f} % per pair); alpha "
          f"{ll.ALPHA:g}, effect {100 * ll.EFFECT:g} % of prompts, power target {ll.POWER:g}")
    print(f"{'scenario':<64} {'not lossless':>12} {'inconclusive':>12} {'lossless':>9}  {'power(q=.1)':>11}"
          f" {'need(q=.1)':>10}")
    for s_i, (name, prompts, repeats, bug, fragile) in enumerate(SCENARIOS):
        rng = np.random.default_rng([a.seed, s_i])
        c = Counter(trial(rng, prompts, repeats, a.ar, a.noise, bug, fragile) for _ in range(a.trials))
        pw = ll.systematic_power(prompts, repeats, 0.1)
        need = ll.prompts_needed(repeats, 0.1)
        print(f"{name:<64} {c[ll.BEYOND_FLOOR] / a.trials:>12.3f} {c[ll.INCONCLUSIVE] / a.trials:>12.3f} "
              f"{c[ll.LOSSLESS] / a.trials:>9.3f}  {pw:>11.2f} {need if need else '-':>10}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
