"""Acceptance per prompt category of the demo models on the real CPU vLLM server, Django-free
(issue 33, "A demo on real text").

Builds (or reuses) the demo target and draft (benchkit.engines.demo_models, cached under
$DRAFTBOARD_MODELS_DIR, default $DRAFTBOARD_VAR_DIR/models, default ./var/models: the demo's own
cache), writes the categorized real-text prompts (benchkit.engines.demo_prompts: held-out
standard-library code, licence prose, generated records; a 64-token window of the demo
tokenizer) and runs, through benchkit.execution.runner (one server start per method),
autoregressive, `ngram` k=4 and `draft_model` k=4 at concurrency 1 with dataset `jsonl` on that
file. Speculative servers are started with `--per-request-spec-decode-metrics summary` so that
each response carries its own acceptance: benchkit.measure.categories.category_figures then cuts
tau (token-weighted) and acceptance per position by category exactly.

    .venv/bin/python benchmarks/demo_categories.py [--per-category 8] [--output-len 128]

One warmup request per category comes from the head of the file (outside the measured sample).
Prints one row per method and category: requests, tau (token- and request-weighted, with a
seeded bootstrap interval of the latter), acceptance per draft position, output tok/s (the
category's share of the run's window: equal for equal token counts) and median TPOT; then each
speculative run's pooled counter tau beside its categories', and per category how much the AR
greedy output repeats its own 4-grams and how many speculative outputs equal AR's. Writes the
prompt file and the server logs under $DRAFTBOARD_VAR_DIR/demo_categories/. Exit 1 when a run
fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchkit.engines.demo_models import build_demo_models, read_marker  # noqa: E402
from benchkit.engines.demo_prompts import CATEGORIES, write_demo_dataset  # noqa: E402
from benchkit.execution.runner import NullHooks, execute_runs  # noqa: E402
from benchkit.measure.categories import category_figures  # noqa: E402
from benchkit.measure.outputs import prompt_hash  # noqa: E402
from benchkit.sweeps import sweepfile  # noqa: E402

PER_REQUEST = ["--per-request-spec-decode-metrics", "summary"]


def var_dir() -> Path:
    """$DRAFTBOARD_VAR_DIR (default ./var of the repository), as benchsite.settings reads it."""
    return Path(os.environ.get("DRAFTBOARD_VAR_DIR") or REPO / "var").resolve()


def models_dir() -> Path:
    """$DRAFTBOARD_MODELS_DIR (default VAR_DIR/models), as benchsite.settings reads it."""
    return Path(os.environ.get("DRAFTBOARD_MODELS_DIR") or var_dir() / "models")


def sweep(target: Path, draft: Path, dataset: Path, per_category: int, output_len: int, k: int):
    """The three runs (AR, ngram k, draft_model k) as a parsed sweep, the demo's server settings."""
    n_cat = len(CATEGORIES)
    return sweepfile.parse_sweep({
        "name": "demo-categories", "engine": "vllm", "model": str(target), "drafter": str(draft),
        "server": {"served_model_name": "demo", "dtype": "float32", "max_model_len": 2048,
                   "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                   "extra_args": ["--gpu-memory-utilization", "0.2", "--enforce-eager"], "engine_cpus": "0"},
        "grid": {"tp": [1], "concurrency": [1], "output_len": [output_len], "input_len": [64],
                 "methods": ["auto",
                             {"method": "ngram", "num_speculative_tokens": k, "extra_args": PER_REQUEST},
                             {"method": "draft_model", "num_speculative_tokens": k, "extra_args": PER_REQUEST}]},
        "workload": {"dataset": "jsonl", "dataset_path": str(dataset), "num_prompts": per_category * n_cat,
                     "warmup_requests": n_cat, "ignore_eos": True, "temperature": 0.0, "seed": 0},
        "limits": {"ready_timeout_s": 600, "request_timeout_s": 120, "run_timeout_s": 900, "stop_timeout_s": 30},
    }, source="benchmarks/demo_categories.py")


def repeated_share(ids: list[int], n: int = 4) -> float | None:
    """Share of an output's n-grams (n tokens ending at each position >= n - 1) that already
    occurred earlier in the same output: how much the greedy text repeats itself (a looping
    output is easy for any drafter, n-gram lookup included)."""
    seen, rep, total = set(), 0, 0
    for i in range(n - 1, len(ids)):
        g = tuple(ids[i - n + 1:i + 1])
        rep += g in seen
        total += 1
        seen.add(g)
    return rep / total if total else None


def tau_interval(logs, category: str, seed: int = 0, draws: int = 2000) -> tuple[float, float] | None:
    """95 % bootstrap interval (seeded) of the request-weighted mean tau of a category's measured
    requests (per request: 1 + accepted / verify steps); None without per-request figures."""
    import numpy as np

    taus = [1 + r.spec_accepted_tokens / r.spec_steps for r in logs
            if not r.warmup and r.category == category and r.spec_steps]
    if len(taus) < 2:
        return None
    a = np.asarray(taus)
    means = a[np.random.default_rng(seed).integers(0, len(a), (draws, len(a)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-category", type=int, default=8, help="measured prompts per category")
    ap.add_argument("--output-len", type=int, default=128, help="output tokens per request (ignore_eos)")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens of ngram and draft_model")
    ap.add_argument("--max-tokens", type=int, default=64, help="prompt window, tokens of the demo tokenizer")
    args = ap.parse_args()
    t0 = time.monotonic()
    demo = build_demo_models(models_dir())
    report = read_marker(demo.root).get("report", {})
    print(f"demo models in {demo.root} ({time.monotonic() - t0:.0f} s): target loss {report.get('target_loss')}, "
          f"held-out greedy agreement {report.get('greedy_agreement')}")
    work = var_dir() / "demo_categories"
    dataset = write_demo_dataset(work / "prompts.jsonl", per_category=args.per_category, warmup=len(CATEGORIES),
                                 tokenizer=demo.target, max_tokens=args.max_tokens)
    print(f"prompts: {dataset} ({args.per_category} per category of {', '.join(CATEGORIES)}, "
          f"+{len(CATEGORIES)} warmup; window {args.max_tokens} tokens)")
    spec = sweep(demo.target, demo.draft, dataset, args.per_category, args.output_len, args.k)
    runs = spec.expand()
    category_of = {prompt_hash(r["prompt"]): r["category"]
                   for r in map(json.loads, dataset.read_text(encoding="utf-8").splitlines())}
    rows, pooled, failed = [], [], False
    outputs: dict[str, dict[int, list[int]]] = {}
    for i, run in enumerate(runs):
        s = run.server
        label = s.method if s.method == "auto" else f"{s.method} k={s.num_speculative_tokens}"
        t1 = time.monotonic()
        out = execute_runs([run], [NullHooks()], work / f"run-{i}-{s.method}")[0]
        print(f"{label}: {'ok' if out.ok else 'FAILED ' + out.reason + ': ' + out.message[:300]} "
              f"({time.monotonic() - t1:.0f} s incl. server start)", flush=True)
        if not out.logs:
            failed = True
            continue
        failed |= not out.ok
        figs = category_figures(out.logs, out.window_start_ns, out.window_end_ns)
        for f in figs:
            rows.append((label, f, tau_interval(out.logs, f.category)))
        if out.outputs is not None:
            outputs[label] = {rec.prompt: list(rec.full) for rec in out.outputs.records.values()
                              if isinstance(rec.full, list)}
        m = out.metrics
        pooled.append((label, getattr(m, "acceptance_length", None), getattr(m, "per_position_acceptance_rate", None),
                       figs))
    print()
    head = (f"{'method':<16} {'category':<11} {'req':>3} {'tau':>5} {'tau/req':>7} {'95% CI':>11} "
            f"{'acceptance per position':<24} {'out tok/s':>9} {'TPOT ms':>7} {'1/TPOT':>6}")
    print(head)
    print("-" * len(head))
    for label, f, ci in rows:
        pos = " ".join(f"{p:.2f}" for p in f.acceptance_per_position) if f.acceptance_per_position else "-"
        ci_s = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
        inv = 1000 / f.median_tpot_ms if f.median_tpot_ms else None
        print(f"{label:<16} {f.category:<11} {f.requests:>3} {_fmt(f.tau_token_weighted):>5} "
              f"{_fmt(f.tau_request_weighted):>7} {ci_s:>11} "
              f"{pos:<24} {f.output_throughput_tok_s:>9.1f} {_fmt(f.median_tpot_ms, '.1f'):>7} "
              f"{_fmt(inv, '.0f'):>6}")
    print("tau: token-weighted, tau/req: request-weighted, both from the per-request figures; 95% CI: seeded "
          "bootstrap of tau/req over the category's requests; out tok/s: "
          "the category's tokens / the run's whole window (its share of the run's output tok/s); "
          "1/TPOT: decode tok/s of one stream")
    print()
    for label, tau, per_pos, figs in pooled:
        if label == "auto":
            continue
        cats = [f.tau_token_weighted for f in figs if f.tau_token_weighted is not None]
        pos = " ".join(f"{p:.2f}" for p in per_pos) if per_pos else "-"
        print(f"{label}: counters (pooled over the window) tau {_fmt(tau)}, per position {pos}; "
              f"categories' tau {', '.join(f'{f.category} {_fmt(f.tau_token_weighted)}' for f in figs)}"
              f"{'' if cats else ' (no per-request figures)'}")
    ar = outputs.get("auto", {})
    if ar:
        print()
        for cat in CATEGORIES:
            shares = [x for h, ids in ar.items() if category_of.get(h) == cat
                      for x in [repeated_share(ids)] if x is not None]
            same = {label: sum(outs.get(h) == ids for h, ids in ar.items() if category_of.get(h) == cat)
                    for label, outs in outputs.items() if label != "auto"}
            print(f"{cat}: AR greedy output repeats its own 4-grams at "
                  f"{100 * sum(shares) / len(shares) if shares else float('nan'):.0f} % of positions "
                  f"({len(shares)} outputs); speculative outputs equal to AR's: "
                  + ", ".join(f"{label} {n}/{len(shares)}" for label, n in same.items()))
    print(f"\nwall time {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
