"""Reads of the decode-step ceilings' inputs kept in the database (issue 20, docs/CEILINGS.md),
for pages, exports and commands (the writes are runs.services.ceilings):

- `gpu_spec_rows()`: the GpuSpec table's rows as `GpuSpecRow`s when it has any, else the shipped
  gpu_specs.yaml's;
- `ceiling_inputs(models, hosts)`: those rows, the stored config.json of the models and the GPU
  model of each host's latest snapshot, read once per page (three queries), handed to the pure
  `analysis.ceilings` functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchkit.ceilings.gpus import GpuSpecRow, load_gpu_specs
from runs.models import GpuSpec, HardwareSnapshot, ModelConfig

ROW_FIELDS = ("gpu_name", "memory_bandwidth_tb_s", "memory_bandwidth_source", "dense_bf16_tflop_s",
               "dense_fp16_tflop_s", "dense_fp8_tflop_s", "dense_fp32_tflop_s", "flops_source", "as_of", "note")


def _row(spec: GpuSpec) -> GpuSpecRow:
    aliases = [a.strip() for a in spec.aliases.split(",") if a.strip()]
    return GpuSpecRow(aliases=aliases, **{f: getattr(spec, f) for f in ROW_FIELDS})


def gpu_spec_rows() -> tuple[list[GpuSpecRow], str]:
    """(rows, where from): the GpuSpec table's rows when it has any ("admin table"), else the
    shipped gpu_specs.yaml ("benchkit/ceilings/gpu_specs.yaml"). A table row the admin left
    invalid (no peak at all) is skipped rather than guessed."""
    rows = []
    for spec in GpuSpec.objects.all():
        try:
            rows.append(_row(spec))
        except ValueError:
            continue
    if rows:
        return rows, "admin table (GPU specs)"
    return load_gpu_specs(), "benchkit/ceilings/gpu_specs.yaml"


@dataclass
class CeilingInputs:
    """What the ceilings read from the database: the GPU rows (`rows`, `rows_source`) and the
    stored config.json of each model name (`configs`)."""

    rows: list[GpuSpecRow]
    rows_source: str
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    host_gpus: dict[int, str] = field(default_factory=dict)


def ceiling_inputs(models: set[str] | None = None, hosts: set[int] | None = None) -> CeilingInputs:
    """The GPU rows, the config.json of `models` (every stored one when None) and the GPU model
    of each host's latest hardware snapshot (`hosts`; every host when None), for runs whose GPU
    entries carry no name: three queries."""
    rows, source = gpu_spec_rows()
    qs = ModelConfig.objects.all()
    if models is not None:
        qs = qs.filter(model__in=[m for m in models if m])
    snaps = HardwareSnapshot.objects.order_by("host_id", "taken_at", "id")
    if hosts is not None:
        snaps = snaps.filter(host_id__in=hosts)
    host_gpus = dict(snaps.values_list("host_id", "gpu_name"))  # the latest per host wins
    return CeilingInputs(rows, source, {m.model: m.config for m in qs}, host_gpus)
