"""The inputs of decode-step ceilings kept in the database (issue 20, docs/CEILINGS.md): GPU
specifications (`GpuSpec`, seeded from benchkit/ceilings/gpu_specs.yaml, edited in the admin like
GPU prices) and models' config.json (`ModelConfig`).

- `gpu_spec_rows()`: the table's rows as `GpuSpecRow`s when it has any, else the shipped file's;
- `ceiling_inputs()`: those rows and every stored config.json, read once per page (two queries),
  handed to the pure `analysis.ceilings` functions;
- `seed_gpu_specs(path)`: load a GPU specification file into the table (`manage.py seed_gpu_specs`);
- `store_model_config(name, path)`: keep a model's config.json under the name runs record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction

from benchkit.ceilings.gpus import GpuSpecRow, load_gpu_specs
from benchkit.ceilings.modelconfig import ModelConfigError, read_model_config
from runs.models import GpuSpec, HardwareSnapshot, ModelConfig

_ROW_FIELDS = ("gpu_name", "memory_bandwidth_tb_s", "memory_bandwidth_source", "dense_bf16_tflop_s",
               "dense_fp16_tflop_s", "dense_fp8_tflop_s", "dense_fp32_tflop_s", "flops_source", "as_of", "note")


def _row(spec: GpuSpec) -> GpuSpecRow:
    aliases = [a.strip() for a in spec.aliases.split(",") if a.strip()]
    return GpuSpecRow(aliases=aliases, **{f: getattr(spec, f) for f in _ROW_FIELDS})


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


@transaction.atomic
def seed_gpu_specs(path: str | Path | None = None, *, overwrite: bool = False) -> tuple[int, int, int]:
    """Load a GPU specification file (default the shipped one) into GpuSpec: (created, updated,
    kept). A row already in the table is kept as the admin left it unless `overwrite`. Raises
    benchkit.ceilings.gpus.GpuSpecFileError for a malformed file."""
    created = updated = kept = 0
    for row in load_gpu_specs(path):
        values = {f: getattr(row, f) for f in _ROW_FIELDS if f != "gpu_name"}
        values["aliases"] = ", ".join(row.aliases)
        obj = GpuSpec.objects.filter(gpu_name=row.gpu_name).first()
        if obj is None:
            GpuSpec.objects.create(gpu_name=row.gpu_name, **values)
            created += 1
        elif overwrite:
            for k, v in values.items():
                setattr(obj, k, v)
            obj.save()
            updated += 1
        else:
            kept += 1
    return created, updated, kept


def store_model_config(name: str, path: str | Path) -> ModelConfig:
    """Keep the config.json at `path` (a file or a model directory) under the model name `name`
    (as Run.model records it). Raises ModelConfigError when it cannot be read or its
    architecture is not supported (read_model_config's message)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{p}: cannot read config.json: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: not a JSON object")
    if data.get("architectures", [None])[0] != "DFlashDraftModel":
        read_model_config(data)  # refuse what the ceilings could not read
    obj, _ = ModelConfig.objects.update_or_create(model=name, defaults={"config": data, "note": f"from {p}"})
    return obj
