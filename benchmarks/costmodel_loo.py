"""Issue 20 on the users' grid: the ceilings of every point, leave-one-out of the fitted cost model,
and the ranking it gives (docs/CEILINGS.md).

    .venv/bin/python benchmarks/costmodel_loo.py

Prints four tables and exits 0 (a benchmark, not a test: tests/test_costmodel.py holds the
asserts):

1. the 27B / H200 check of issue 20 (ceilings of the users' model on one H200 in bf16);
2. per grid point (TP x method x concurrency): verified tokens per step V, the ridge, which
   ceiling binds, the binding ceiling and the measured decode rate (B x 1000 / median TPOT) as %
   of it;
3. leave-one-out: per (TP, concurrency) group, each DDTree budget dropped in turn, cost and
   acceptance fitted on the rest, its decode speedup predicted with a 95 % interval, against
   the measurement;
4. per group, the top candidates of the full fit.

The grid's points come from tests/usersgrid.py (the users' figures where they exist, the rest
invented and labelled so there), measured from request logs in memory: no database. Needs
Django's settings only because tests/usersgrid.py imports the run models.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsite.settings")
os.environ.setdefault("DRAFTBOARD_VAR_DIR", tempfile.mkdtemp(prefix="costmodel-loo-"))

import django  # noqa: E402

django.setup()

from benchkit.ceilings.gpus import find_gpu_spec  # noqa: E402
from benchkit.ceilings.roofline import DecodePoint, decode_ceiling, weights_ridge_tokens_per_step  # noqa: E402
from benchkit.compare.costmodel import leave_one_out, recommend  # noqa: E402
from tests import usersgrid_costs as grid  # noqa: E402


def table(header: list[str], rows: list[list[str]]) -> None:
    """Print a plain-text table, columns right-aligned but the first."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                                     strict=True))))
    print()


def interval(est) -> str:
    return f"[{est.low:.2f}, {est.high:.2f}]" if est.low is not None else "[none]"


def check_27b_h200() -> None:
    _, model = grid.gpu_and_model()
    h200 = find_gpu_spec("NVIDIA H200").spec
    print("1. Issue 20's check: the 27B model (tests/fixtures/models/qwen3.5-27b) on one H200, bf16, "
          f"context {grid.CONTEXT_TOKENS:.0f} tokens")
    print(f"   parameters read per step {model.read_params(1):,.0f} ({model.weight_bytes(1) / 1e9:.2f} GB), "
          f"KV {model.kv_bytes_per_token:,} B/token, state {model.state_bytes_per_sequence:,} B/sequence; "
          f"weights-only ridge {weights_ridge_tokens_per_step(h200, model):.1f} tokens/step\n")
    rows = []
    for B, k, tau in ((1, 0, 1.0), (1, 15, 6.0), (8, 15, 6.0), (12, 15, 6.0), (16, 15, 6.0), (64, 15, 6.0)):
        c = decode_ceiling(h200, model, DecodePoint(B, k, grid.CONTEXT_TOKENS, tau=tau))
        rows.append([f"B={B} k={k} tau={tau:g}", c.verified_tokens_per_step, f"{c.ridge_tokens_per_step:.1f}",
                     f"{c.memory_ceiling_tok_s:.1f}", f"{c.compute_ceiling_tok_s:.1f}", c.binding,
                     f"{c.per_sequence_ceiling_tok_s:.1f}"])
    table(["point", "V", "ridge", "memory tok/s", "compute tok/s", "binds", "per seq tok/s"], rows)


def ceilings(points) -> None:
    gpu, _ = grid.gpu_and_model()
    print(f"2. Ceilings of the users' grid ({gpu.gpu_name}, {gpu.memory_bandwidth_tb_s} TB/s, "
          f"{gpu.dense_bf16_tflop_s} dense bf16 TFLOP/s per GPU; drafter not modelled)\n")
    rows = []
    for p in points:
        c = grid.ceiling(p)
        decode_tok_s = p.concurrency * 1000 / p.point.tpot_ms
        rows.append([f"TP{p.tp} c{p.concurrency} {p.point.label}", c.verified_tokens_per_step,
                     f"{c.ridge_tokens_per_step:.0f}", c.binding, f"{c.ceiling_tok_s:.0f}", f"{decode_tok_s:.0f}",
                     f"{c.achieved_pct:.0f} %"])
    table(["point", "V", "ridge", "binds", "ceiling tok/s", "measured tok/s", "achieved"], rows)


def loo(points) -> None:
    print("3. Leave-one-out: each DDTree budget dropped, fitted on the rest of its (TP, concurrency) group\n")
    rows, errors, inside = [], [], 0
    for (tp, conc), pts in grid.groups(points).items():
        for r in leave_one_out(pts, knee_tokens_per_step=grid.knee(conc)):
            if r.error:
                rows.append([f"TP{tp} c{conc} {r.label}", "-", r.error, f"{r.measured_speedup:.2f}", "", "", "", ""])
                continue
            p = r.predicted
            err = p.speedup.value / r.measured_speedup - 1
            errors.append((abs(err), f"TP{tp} c{conc} {r.label}", err))
            inside += bool(r.inside)
            rows.append([f"TP{tp} c{conc} {r.label}", f"{p.speedup.value:.2f}", interval(p.speedup),
                         f"{r.measured_speedup:.2f}", "yes" if r.inside else "NO", f"{err:+.1%}",
                         f"{p.tau.value:.2f} / {r.measured_tau:.2f}",
                         f"{p.relative_cost.value:.3f} / {r.measured_cost:.3f}"])
    table(["dropped", "predicted", "95 % interval", "measured", "inside", "error", "tau pred / meas",
           "cost pred / meas"], rows)
    errors.sort(reverse=True)
    n = len(errors)
    print(f"   inside the interval: {inside} of {n}; |error| median {errors[n // 2][0]:.1%}, "
          f"max {errors[0][0]:.1%} ({errors[0][1]})")
    print("   largest errors: " + ", ".join(f"{name} {err:+.1%}" for _, name, err in errors[:5]) + "\n")


def ranking(points) -> None:
    print("4. What to run: the top candidates of each group (full fit over every budget 1-64 and k; "
          "* measured, ~ extrapolated) and the best within the measured range\n")
    rows = []
    for (tp, conc), pts in grid.groups(points).items():
        rec = recommend(pts, knee_tokens_per_step=grid.knee(conc))
        def cell(p) -> str:
            mark = ("*" if p.measured_speedup is not None else "") + ("~" if p.extrapolated else "")
            return f"{p.label}{mark} {p.speedup.value:.2f} {interval(p.speedup)}"
        rows.append([f"TP{tp} c{conc}", *(cell(p) for p in rec.predictions[:3]), cell(rec.best_within_range)])
    table(["group", "1st", "2nd", "3rd", "best within range"], rows)


def main() -> int:
    points = grid.grid_points()
    check_27b_h200()
    ceilings(points)
    loo(points)
    ranking(points)
    return 0


if __name__ == "__main__":
    sys.exit(main())
