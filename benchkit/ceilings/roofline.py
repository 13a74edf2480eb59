"""Decode-step ceilings (docs/CEILINGS.md): the least time one decode step can take on given GPUs,
from the bytes it must read and the FLOPs it must do, and the output tok/s that bounds.

For a step of B sequences (the concurrency), each verifying k + 1 tokens (k drafted tokens, or a
DDTree budget of k nodes, plus the root), on TP t GPUs with memory bandwidth BW and dense peak
F FLOP/s each, with measured acceptance length tau:

    V            = B x (k + 1)                       verified tokens per step
    bytes        = weights(V) + B x context x KV/token + B x state/sequence  (+ drafter)
    memory time  = bytes / (t x BW)
    compute time = 2 x P_active x V / (t x F)        (+ drafter)
    ceiling      = B x tau / max(memory time, compute time)   output tok/s, all sequences
    ridge        = V at which compute time = memory time (the step's bytes held fixed)

`decode_ceiling(gpu, model, point)` computes one `StepCeiling`; `point_ceiling(gpu_name, ...)`
looks the GPU up first and returns no ceiling, with the reason, for an unknown GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from benchkit.ceilings.gpus import GpuSpecRow, find_gpu_spec
from benchkit.ceilings.modelconfig import DrafterFootprint, ModelFootprint

#: What every ceiling leaves out, in words (docs/CEILINGS.md "Assumptions"): a page prints these once
#: beside the ceilings; a StepCeiling's own `notes` add what applies to that point only.
IGNORED = ("all-reduce and other communication time (TP > 1)", "kernel launch and scheduling overhead",
           "attention FLOPs (score and value products over the context)", "KV-cache and state writes",
           "sampling, tree building and rejection logic")


@dataclass(frozen=True)
class DecodePoint:
    """One measured (or planned) point, in the terms of the formulas above.

    `concurrency` B (sequences decoded together), `draft_tokens` k (num_speculative_tokens, or
    the DDTree budget; 0 for autoregressive), `context_tokens` (mean context length per sequence
    while decoding, e.g. input_len + output_len / 2), `tp` (GPUs the model is split over),
    `tau` (measured mean acceptance length; None means 1, autoregressive)."""

    concurrency: int
    draft_tokens: int
    context_tokens: float
    tp: int = 1
    tau: float | None = None

    @property
    def verified_tokens_per_step(self) -> int:
        """V = B x (k + 1)."""
        return self.concurrency * (self.draft_tokens + 1)


@dataclass(frozen=True)
class StepCeiling:
    """The ceilings of one decode step (units in the names; aggregate over all GPUs and all
    sequences unless `per_sequence`).

    `binding` is "memory" or "compute", whichever time is longer; `ceiling_tok_s` the smaller
    ceiling; `achieved_pct` the measured decode rate (B x 1000 / TPOT) as % of it (None without a
    TPOT). `compute_dtype` names the peak FLOP/s used; `notes` the assumptions in force."""

    gpu_name: str
    compute_dtype: str
    verified_tokens_per_step: int
    tau: float
    weight_bytes: float
    kv_bytes: float
    state_bytes: float
    drafter_bytes: float
    flops: float
    memory_time_ms: float
    compute_time_ms: float
    memory_ceiling_tok_s: float
    compute_ceiling_tok_s: float
    ridge_tokens_per_step: float
    binding: Literal["memory", "compute"]
    ceiling_tok_s: float
    per_sequence_ceiling_tok_s: float
    achieved_pct: float | None
    notes: tuple[str, ...]


def decode_ceiling(gpu: GpuSpecRow, model: ModelFootprint, point: DecodePoint, *,
                   drafter: DrafterFootprint | None = None, measured_tpot_ms: float | None = None,
                   compute_dtype: str | None = None) -> StepCeiling:
    """The ceilings of `point` for `model` on `gpu` (module docstring for the formulas).

    `drafter`: the drafter's footprint, whose passes are then added to both times (one DFlash
    pass over B x block positions, or k passes of B tokens for a draft model); without it a
    speculative point's drafter is not modelled and a note says so. `compute_dtype` overrides
    the model's (bf16, fp16, fp8, fp32); where the GPU has no peak for it the activation dtype's
    is used, with a note. Raises ValueError for a point with B, t < 1, k < 0 or tau < 1."""
    if point.concurrency < 1 or point.tp < 1 or point.draft_tokens < 0:
        raise ValueError(f"concurrency and tp must be >= 1 and draft_tokens >= 0, got {point}")
    tau = 1.0 if point.tau is None else float(point.tau)
    if tau < 1:
        raise ValueError(f"tau must be >= 1 (acceptance length), got {tau}")
    notes = list(model.notes)
    dtype = compute_dtype or model.compute_dtype
    peak = gpu.peak_flop_s(dtype)
    if peak is None:
        fallback = model.activation_dtype
        notes.append(f"{gpu.gpu_name} has no dense {dtype} peak: compute time at its {fallback} peak")
        dtype, peak = fallback, gpu.peak_flop_s(fallback)
        if peak is None:
            raise ValueError(f"{gpu.gpu_name} has no dense {dtype} peak FLOP/s")
    B, V = point.concurrency, point.verified_tokens_per_step
    weight_bytes = model.weight_bytes(V)
    kv_bytes = B * point.context_tokens * model.kv_bytes_per_token
    state_bytes = float(B * model.state_bytes_per_sequence)
    target_bytes = weight_bytes + kv_bytes + state_bytes
    target_flops = 2.0 * model.active_params_per_token * V
    drafter_bytes = drafter_flops = 0.0
    if drafter is not None and point.draft_tokens:
        passes = drafter.passes_per_step(point.draft_tokens)
        drafter_bytes = passes * drafter.weight_bytes_per_pass + B * point.context_tokens * drafter.kv_bytes_per_token
        drafter_flops = 2.0 * drafter.active_params_per_token * B * passes * drafter.tokens_per_pass(point.draft_tokens)
        notes.extend(drafter.notes)
    elif point.draft_tokens:
        notes.append("the drafter's own passes are not modelled (no drafter config)")
    bw = point.tp * gpu.memory_bandwidth_bytes_s
    flop_s = point.tp * peak
    memory_s = (target_bytes + drafter_bytes) / bw
    compute_s = (target_flops + drafter_flops) / flop_s
    ridge = peak * target_bytes / (gpu.memory_bandwidth_bytes_s * 2.0 * model.active_params_per_token)
    memory_tok_s, compute_tok_s = B * tau / memory_s, B * tau / compute_s
    binding: Literal["memory", "compute"] = "memory" if memory_s >= compute_s else "compute"
    ceiling = min(memory_tok_s, compute_tok_s)
    achieved = None
    if measured_tpot_ms is not None and measured_tpot_ms > 0:
        achieved = 100.0 * (B * 1000.0 / measured_tpot_ms) / ceiling
    if point.tp > 1:
        notes.append(f"TP {point.tp}: bytes and FLOPs split evenly over the GPUs; all-reduce time ignored")
    return StepCeiling(
        gpu_name=gpu.gpu_name, compute_dtype=dtype, verified_tokens_per_step=V, tau=tau, weight_bytes=weight_bytes,
        kv_bytes=kv_bytes, state_bytes=state_bytes, drafter_bytes=drafter_bytes,
        flops=target_flops + drafter_flops, memory_time_ms=memory_s * 1e3, compute_time_ms=compute_s * 1e3,
        memory_ceiling_tok_s=memory_tok_s, compute_ceiling_tok_s=compute_tok_s, ridge_tokens_per_step=ridge,
        binding=binding, ceiling_tok_s=ceiling, per_sequence_ceiling_tok_s=ceiling / B, achieved_pct=achieved,
        notes=tuple(dict.fromkeys(notes)))


def weights_ridge_tokens_per_step(gpu: GpuSpecRow, model: ModelFootprint, compute_dtype: str | None = None) -> float:
    """The ridge of the weights alone (no KV or state): F x weight bytes / (BW x 2 x P_active),
    in verified tokens per step; the same at every TP (both sides split by t). For a dense bf16
    model it is F / BW (206 on an H200). Raises ValueError where the GPU has no such peak."""
    dtype = compute_dtype or model.compute_dtype
    peak = gpu.peak_flop_s(dtype)
    if peak is None:
        raise ValueError(f"{gpu.gpu_name} has no dense {dtype} peak FLOP/s")
    return peak * model.weight_bytes(1) / (gpu.memory_bandwidth_bytes_s * 2.0 * model.active_params_per_token)


@dataclass(frozen=True)
class CeilingAnswer:
    """`ceiling` (None when there is none) and `note` saying why there is none."""

    ceiling: StepCeiling | None
    note: str = ""


def point_ceiling(gpu_name: str | None, model: ModelFootprint | None, point: DecodePoint, *,
                  rows: Sequence[GpuSpecRow] | None = None, drafter: DrafterFootprint | None = None,
                  measured_tpot_ms: float | None = None) -> CeilingAnswer:
    """`decode_ceiling` for a GPU named as NVML names it (looked up in `rows`, default the
    shipped table): an unknown or ambiguous GPU, or no model footprint, gives no ceiling and a
    note, never a guess."""
    lookup = find_gpu_spec(gpu_name, rows)
    if lookup.spec is None:
        return CeilingAnswer(None, lookup.note)
    if model is None:
        return CeilingAnswer(None, "no model config.json read: no ceiling")
    return CeilingAnswer(decode_ceiling(lookup.spec, model, point, drafter=drafter,
                                        measured_tpot_ms=measured_tpot_ms))
