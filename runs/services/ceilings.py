"""Writes of the decode-step ceilings' inputs (issue 20, docs/CEILINGS.md): GPU specifications
(`GpuSpec`, seeded from benchkit/ceilings/gpu_specs.yaml, edited in the admin like GPU prices) and
models' config.json (`ModelConfig`); the reads are runs.ceilings.

- `seed_gpu_specs(path)`: load a GPU specification file into the table (`manage.py seed_gpu_specs`);
- `store_model_config(name, path)`: keep a model's config.json under the name runs record.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.db import transaction

from benchkit.ceilings.gpus import load_gpu_specs
from benchkit.ceilings.modelconfig import ModelConfigError, read_model_config
from runs.ceilings import ROW_FIELDS
from runs.models import GpuSpec, ModelConfig


@transaction.atomic
def seed_gpu_specs(path: str | Path | None = None, *, overwrite: bool = False) -> tuple[int, int, int]:
    """Load a GPU specification file (default the shipped one) into GpuSpec: (created, updated,
    kept). A row already in the table is kept as the admin left it unless `overwrite`. Raises
    benchkit.ceilings.gpus.GpuSpecFileError for a malformed file."""
    created = updated = kept = 0
    for row in load_gpu_specs(path):
        values = {f: getattr(row, f) for f in ROW_FIELDS if f != "gpu_name"}
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
