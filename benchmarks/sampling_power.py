"""The T > 0 lossless check's false-alarm rate and power (issue 33; benchkit.compare.sampling;
docs/LOSSLESS.md, "Sampling (T > 0)"), by seeded simulation through `check_sampling`.

Each trial draws new prompts (one known bigram target p and draft q per prompt, 8 tokens,
temperature 1: `prompt_models(prompts, seed=trial)`), then three runs of `samples` outputs per
prompt with their own seeds: the AR run, a second AR run (the floor), and the speculative run of
the row's sampler (k = 4 drafts per step; `benchkit.compare.sampling.simulate`):

- "AR vs AR": `check_sampling(ar, floor)`: the floor pair alone (false alarm = differs).
- "speculative": correct speculative sampling, `check_sampling(ar, spec, floor)` (false alarm =
  differs; floor differs counted apart).
- "greedy_draft", "argmax_match": the two biased samplers (detection = differs).
- "temperature x1.2": a subtle bug near the stated effect: the spec run samples the target at
  1.2 times the temperature (AR decoding of softmax(log p / 1.1)); its rms chi-square distance
  over the checked positions (exact, from the chain's marginals) is printed beside it, and the
  analytic power at that distance.

    .venv/bin/python benchmarks/sampling_power.py [--trials 100] [--seed 0]

Prints one row per scenario and size; never fails on a figure (exit 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread: the permutations' small products run faster

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchkit.compare import sampling as sp  # noqa: E402

TEMPERATURE_BUG = 1.2


def tempered(model: sp.BigramModel, factor: float) -> sp.BigramModel:
    """The model whose target is sampled at `factor` times the temperature."""
    t = sp._softmax(np.log(model.target) / factor)
    return sp.BigramModel(t, model.draft, model.start)


def marginals(model: sp.BigramModel, length: int) -> np.ndarray:
    """(length, V) exact marginal of each output position under AR decoding of the target."""
    out = [model.target[model.start]]
    for _ in range(1, length):
        out.append(out[-1] @ model.target)
    return np.array(out)


def rms_distance(models: list[sp.BigramModel], factor: float, positions: tuple[int, ...]) -> float:
    """sqrt(mean over prompts and positions of d^2 = sum_k (s_k - a_k)^2 / m_k), exact."""
    d2 = []
    for m in models:
        a = marginals(m, positions[-1] + 1)[list(positions)]
        s = marginals(tempered(m, factor), positions[-1] + 1)[list(positions)]
        mix = (a + s) / 2
        d2.extend(((s - a) ** 2 / mix).sum(1))
    return float(np.sqrt(np.mean(d2)))


def trial(scenario: str, prompts: int, samples: int, seed: int) -> str:
    """One trial's verdict code (module docstring)."""
    models = sp.prompt_models(prompts, seed=seed)
    ar = sp.simulate_run(models, "ar", samples, seed=10 * seed + 1)
    floor = sp.simulate_run(models, "ar", samples, seed=10 * seed + 2)
    if scenario == "AR vs AR":
        return sp.check_sampling(ar, floor, seed=seed).verdict
    if scenario.startswith("temperature"):
        spec = sp.simulate_run([tempered(m, TEMPERATURE_BUG) for m in models], "ar", samples, seed=10 * seed + 3)
    else:
        spec = sp.simulate_run(models, scenario, samples, seed=10 * seed + 3)
    return sp.check_sampling(ar, spec, floor, seed=seed).verdict


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100, help="seeded trials per row (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="first trial's seed (default 0)")
    args = ap.parse_args(argv)
    rec = (sp.RECOMMENDED_PROMPTS, sp.RECOMMENDED_SAMPLES)
    rows = [("AR vs AR", *rec), ("speculative", *rec), ("greedy_draft", *rec), ("argmax_match", *rec),
            (f"temperature x{TEMPERATURE_BUG}", *rec),
            ("AR vs AR", 8, 16), ("speculative", 8, 16), ("greedy_draft", 8, 16), ("argmax_match", 8, 16),
            (f"temperature x{TEMPERATURE_BUG}", 8, 16)]
    pos = sp.DEFAULT_POSITIONS
    results = []
    t0 = time.perf_counter()
    with tqdm(total=len(rows) * args.trials, unit="trial", file=sys.stderr) as bar:
        for scenario, prompts, samples in rows:
            c: Counter[str] = Counter()
            for t in range(args.trials):
                c[trial(scenario, prompts, samples, args.seed + t)] += 1
                bar.update()
            results.append((scenario, prompts, samples, c))
    print(f".venv/bin/python benchmarks/sampling_power.py --trials {args.trials} --seed {args.seed}"
          f"  ({time.perf_counter() - t0:.0f} s)")
    print(f"positions {pos[0]}..{pos[-1]}, {sp.CATEGORIES - 1} tokens + other per table, alpha {sp.ALPHA}, "
          f"{sp.PERMUTATIONS} permutations, effect d={sp.EFFECT}, k=4 drafts, vocabulary 8, temperature 1")
    head = (f"{'sampler':<20} {'prompts':>7} {'samples':>7} {'rate':>13} {'differs':>8} {'preserved':>9} "
            f"{'not enough':>10} {'floor differs':>13} {'power(d=.1)':>11} {'need':>5}")
    print(head)
    for scenario, prompts, samples, c in results:
        n = sum(c.values())
        share = {v: c[v] / n for v in sp.VERDICTS}
        lossless = scenario in ("AR vs AR", "speculative")
        rate = f"{'false alarm' if lossless else 'detected'} {share[sp.DIFFERS]:.3f}"
        pw = sp.power([(samples, samples)] * prompts, len(pos))
        need = sp.samples_needed(prompts, len(pos))
        print(f"{scenario:<20} {prompts:>7} {samples:>7} {rate:>13} {share[sp.DIFFERS]:>8.3f} "
              f"{share[sp.PRESERVED]:>9.3f} {share[sp.NOT_ENOUGH]:>10.3f} {share[sp.FLOOR_DIFFERS]:>13.3f} "
              f"{pw:>11.2f} {need:>5}")
    models = sp.prompt_models(rec[0], seed=args.seed)
    d = rms_distance(models, TEMPERATURE_BUG, pos)
    print(f"temperature x{TEMPERATURE_BUG}: rms d = {d:.3f} over the checked tables (trial {args.seed}'s prompts; "
          f"full vocabulary); analytic power at that d: "
          f"{sp.power([(rec[1], rec[1])] * rec[0], len(pos), effect=d):.2f} at {rec[0]} x {rec[1]}, "
          f"{sp.power([(16, 16)] * 8, len(pos), effect=d):.2f} at 8 x 16")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
