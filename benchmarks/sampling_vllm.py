"""The T > 0 lossless check on the real CPU vLLM server, Django-free (issue 33, "A lossless check
for sampling"; docs/LOSSLESS.md, "Sampling (T > 0)").

Builds (or reuses) the demo target and draft (benchkit.engines.demo_models, cached under
$DRAFTBOARD_MODELS_DIR, default $DRAFTBOARD_VAR_DIR/models, default ./var/models) and runs through
benchkit.execution.runner, at temperature 0.7 with `samples_per_prompt` N and output_len 9:
`auto` twice (repeats 0 and 1: the same seeds) and `draft_model` k=4. Judges the draft_model run
as the product does (benchkit.compare.lossless.judge_sampling: against the first auto run, the AR
floor being that run's own halves of disjoint seeds) and prints the verdict, its p, power and
the samples needed; also how many of the second auto run's outputs equal the first's (the reason
a repeat with the same seeds is not a floor).

    .venv/bin/python benchmarks/sampling_vllm.py [--prompts 16] [--samples 48] [--concurrency 16]

Exit 1 when a run fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchkit.compare import lossless as ll  # noqa: E402
from benchkit.compare import sampling  # noqa: E402
from benchkit.engines.demo_models import build_demo_models  # noqa: E402
from benchkit.execution.runner import NullHooks, execute_runs  # noqa: E402
from benchkit.sweeps import sweepfile  # noqa: E402


def var_dir() -> Path:
    return Path(os.environ.get("DRAFTBOARD_VAR_DIR") or REPO / "var").resolve()


def models_dir() -> Path:
    return Path(os.environ.get("DRAFTBOARD_MODELS_DIR") or var_dir() / "models")


def sweep(target: Path, draft: Path, prompts: int, samples: int, concurrency: int, k: int, temperature: float):
    """auto (2 repeats) and draft_model k at `temperature`, `prompts` x `samples` requests of 9 tokens."""
    return sweepfile.parse_sweep({
        "name": "sampling-vllm", "engine": "vllm", "model": str(target), "drafter": str(draft), "repeats": 1,
        "server": {"served_model_name": "demo", "dtype": "float32", "max_model_len": 512,
                   "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                   "extra_args": ["--gpu-memory-utilization", "0.2", "--enforce-eager"], "engine_cpus": "0"},
        "grid": {"tp": [1], "concurrency": [concurrency], "output_len": [9], "input_len": [32],
                 "temperature": [temperature],
                 "methods": ["auto", {"method": "draft_model", "num_speculative_tokens": k}]},
        "workload": {"dataset": "random", "num_prompts": prompts * samples, "samples_per_prompt": samples,
                     "warmup_requests": concurrency, "ignore_eos": True, "seed": 0},
        "limits": {"ready_timeout_s": 600, "request_timeout_s": 120, "run_timeout_s": 900, "stop_timeout_s": 30},
    }, source="benchmarks/sampling_vllm.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=48, help="samples_per_prompt")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args()
    t0 = time.monotonic()
    demo = build_demo_models(models_dir())
    print(f"demo models in {demo.root} ({time.monotonic() - t0:.0f} s)", flush=True)
    runs = sweep(demo.target, demo.draft, args.prompts, args.samples, args.concurrency, args.k,
                 args.temperature).expand()
    auto = next(r for r in runs if r.server.method == "auto")
    spec = next(r for r in runs if r.server.method == "draft_model")
    plan = [("auto #1", auto), ("auto #2 (repeat)", dataclasses.replace(auto, repeat_index=1)),
            (f"draft_model k={args.k}", spec)]
    work = var_dir() / "sampling_vllm"
    samples: dict[str, dict] = {}
    for i, (label, run) in enumerate(plan):
        t1 = time.monotonic()
        out = execute_runs([run], [NullHooks()], work / f"run-{i}")[0]
        n = len(out.outputs) if out.outputs is not None else 0
        print(f"{label}: {'ok' if out.ok else 'FAILED ' + out.reason + ': ' + out.message[:300]}, {n} outputs kept "
              f"({time.monotonic() - t1:.0f} s incl. server start)", flush=True)
        if not out.ok or out.outputs is None:
            return 1
        samples[label] = ll.run_samples(out.outputs)
    ar, ar2, sp = (samples[label] for label, _ in plan)
    same = sum(a == b for k in ar for a, b in zip(ar[k], ar2.get(k, []), strict=False))
    total = sum(len(v) for v in ar.values())
    print(f"\nauto #2 vs auto #1 (same seeds seed + j): {same} of {total} outputs identical "
          "(a repeat is not an independent AR sample, so the floor is auto #1's own halves)")
    sv = sampling.check_sampling(ar, sp, sampling.halves(ar))
    v = ll.judge_sampling(sp, ar, 1)
    print(f"sampling check: {args.prompts} prompts x {args.samples} samples, T={args.temperature}, "
          f"positions {sampling.DEFAULT_POSITIONS[0]}..{sampling.DEFAULT_POSITIONS[-1]}")
    print(f"  verdict {sv.verdict}: power {sv.power:.2f} against d={sv.effect:g}, need "
          f"{sv.need if sv.need is not None else '-'} per prompt (at {args.prompts} prompts), "
          f"p={sv.p_value}, AR-halves floor p={sv.floor_p_value}")
    print(f"  stored as: {v.verdict}: {v.sentence}")
    print(f"  recommended size: {sampling.RECOMMENDED_PROMPTS} prompts x "
          f"{sampling.samples_needed(sampling.RECOMMENDED_PROMPTS, 8)} samples for power {sampling.POWER}")
    print(f"total wall {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
