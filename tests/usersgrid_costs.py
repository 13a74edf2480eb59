"""The users' grid (tests/usersgrid.py) as cost-model and ceiling inputs, without the database.

Each point's median TPOT is measured the way a stored run's is: from the request logs
`tests.usersgrid.point_logs` builds for it, through `benchkit.measure.metrics.compute_run_metrics`;
tau is the grid's counter figure (`TAU`). One group per (TP, concurrency), as the cost model
fits them. The GPU is the users' RTX PRO 6000 Blackwell over PCIe: the grid's inventory records
only "RTX PRO 6000", which is ambiguous, so the Server Edition row is named here explicitly; the
model is tests/fixtures/models/qwen3.5-27b.

Used by tests/test_costmodel.py and benchmarks/costmodel_loo.py. Importing it needs Django's
settings (tests.usersgrid imports runs.models), not a database.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchkit.ceilings.gpus import GpuSpecRow, find_gpu_spec
from benchkit.ceilings.modelconfig import ModelFootprint, read_model_config
from benchkit.ceilings.roofline import DecodePoint, StepCeiling, decode_ceiling
from benchkit.compare.costmodel import MeasuredPoint
from benchkit.measure.metrics import compute_run_metrics
from benchkit.methods import parse_method_token
from tests import usersgrid as ug

LABELS = ("auto", "linear", "b15", "b16", "b32", "b64")
OUTPUT_LEN, INPUT_LEN = 1024, 512  # sweeps/users-grid-sglang.yaml
#: The mean context while decoding: the prompt plus half the output.
CONTEXT_TOKENS = INPUT_LEN + OUTPUT_LEN / 2
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
MODEL_CONFIG = Path(__file__).resolve().parent / "fixtures" / "models" / "qwen3.5-27b" / "config.json"


@dataclass(frozen=True)
class GridPoint:
    """One point of the grid: its group, the cost-model input and its measured figures."""

    tp: int
    concurrency: int
    point: MeasuredPoint
    output_tok_s: float


def grid_points(tpot_scale: dict[tuple[int, int, str], float] | None = None) -> list[GridPoint]:
    """Every point of the grid (6 groups x 6 labels). `tpot_scale` multiplies the median TPOT of
    the named (tp, concurrency, label) points (to corrupt a measurement on purpose)."""
    out = []
    for tp, concurrency in sorted(ug.AR_TOK_S, key=lambda key: (key[1], key[0])):
        for label in LABELS:
            choice = parse_method_token(label)
            k = choice.tree_budget or ug.DRAFT_TOKENS.get(label, 0)
            tok_s = ug.output_tok_s(tp, concurrency, label)
            logs, t0, t1 = ug.point_logs(concurrency, OUTPUT_LEN, tok_s, ug.TAU[label], INPUT_LEN)
            window = compute_run_metrics(logs, t0, t1, None)
            tpot = window.median_tpot_ms * (tpot_scale or {}).get((tp, concurrency, label), 1.0)
            out.append(GridPoint(tp, concurrency, MeasuredPoint(choice.method, k, concurrency, tpot, ug.TAU[label],
                                                                label=label), window.output_throughput_tok_s))
    return out


def groups(points: list[GridPoint]) -> dict[tuple[int, int], list[MeasuredPoint]]:
    """The points by (TP, concurrency)."""
    out: dict[tuple[int, int], list[MeasuredPoint]] = {}
    for p in points:
        out.setdefault((p.tp, p.concurrency), []).append(p.point)
    return out


def gpu_and_model() -> tuple[GpuSpecRow, ModelFootprint]:
    """The users' GPU row and the 27B model's footprint."""
    spec = find_gpu_spec(GPU_NAME).spec
    assert spec is not None, GPU_NAME
    return spec, read_model_config(MODEL_CONFIG)


def ceiling(p: GridPoint) -> StepCeiling:
    """The decode-step ceiling of one grid point, with its measured TPOT (drafter not modelled:
    the grid has no drafter config)."""
    gpu, model = gpu_and_model()
    point = DecodePoint(p.concurrency, p.point.draft_tokens, CONTEXT_TOKENS, tp=p.tp, tau=p.point.tau)
    return decode_ceiling(gpu, model, point, measured_tpot_ms=p.point.tpot_ms)


def knee(concurrency: int) -> float:
    """The roofline ridge of a group (tokens per step), the cost model's knee: the step's bytes at
    this concurrency, a chain of one token (the ridge moves little with V for a dense model)."""
    gpu, model = gpu_and_model()
    return decode_ceiling(gpu, model, DecodePoint(concurrency, 0, CONTEXT_TOKENS)).ridge_tokens_per_step
