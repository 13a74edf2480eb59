"""The sweep file of one benchmark point: the YAML that reproduces a stored run.

`point_sweep_file(spec, name)` writes a RunSpec back as a sweep file (benchkit.sweeps.sweepfile
layout) whose grid holds exactly that point: every axis a single value, the method as one
entry, its GPUs pinned by NVML index, its limits and SLOs. Loading it with
`sweepfile.loads_sweep` and expanding it gives one RunSpec with the same `point_fields()` (the
repeat index aside: the fragment measures the point once, as repeat 0). The run page shows it
beside the exact command line; `manage.py start_sweep FILE` runs it again.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import yaml

from benchkit import config_record
from benchkit.specs import Limits, RunSpec
from benchkit.sweeps.sweepfile import GRID_AXES


def _keys(section: config_record.Section, part: config_record.Part) -> tuple[str, ...]:
    """The record's `part` fields whose first section is `section` (benchkit.config_record)."""
    return tuple(f.name for f in config_record.in_section(section, primary=True) if f.part == part)


def point_sweep_dict(spec: RunSpec, name: str, description: str = "") -> dict[str, Any]:
    """The sweep-file document (a dict in the sweep file's layout) that reproduces `spec`.

    Only values that differ from the sweep file's defaults are written, except the point's own
    coordinates (engine, model, TP, method, concurrency, lengths), which are always written.
    """
    s, w = spec.server, spec.workload
    # the method entry: the method and its parameters, a drafter, prefix caching (None: unset)
    method: dict[str, Any] = {"method": s.method}
    for key in sorted(_keys("grid.methods", "server"), key=lambda k: config_record.field_named(k).group != "decoding"):
        if key != "method" and getattr(s, key) not in (None, ""):
            method[key] = getattr(s, key)
    doc: dict[str, Any] = {"name": name}
    if description:
        doc["description"] = description
    doc.update(engine=s.engine, model=s.model)
    for key in _keys("top", "server"):
        if key not in doc and getattr(s, key) != config_record.field_named(key).default_value():
            doc[key] = getattr(s, key)
    if spec.port is not None:  # pinned by its sweep; otherwise the runner picks a free one again
        doc["port"] = spec.port
    server = _changed(s, _keys("server", "server"))
    if server:
        doc["server"] = server
    doc["grid"] = {"tp": [s.tp], "methods": [method], **{k: [getattr(w, k)] for k in GRID_AXES}}
    workload = _changed(w, _keys("workload", "workload"))
    if workload:
        doc["workload"] = workload
    limits = {f.name: getattr(spec.limits, f.name) for f in fields(Limits)
              if getattr(spec.limits, f.name) != getattr(Limits(), f.name)}
    if limits:
        doc["limits"] = limits
    if w.slo:
        doc["slo"] = dict(w.slo)
    if spec.gpus:
        doc["gpus"] = {s.tp: [g.index for g in spec.gpus]}
    return doc


def _changed(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """{key: value} of the `keys` of `obj` whose value is not the record's default."""
    return {k: getattr(obj, k) for k in keys if getattr(obj, k) != config_record.field_named(k).default_value()}


def point_sweep_file(spec: RunSpec, name: str, description: str = "") -> str:
    """`point_sweep_dict` as YAML text (keys in the sweep file's order)."""
    return yaml.safe_dump(point_sweep_dict(spec, name, description), sort_keys=False, default_flow_style=None,
                          width=100)


def spec_from_stored(data: dict[str, Any]) -> RunSpec | None:
    """The RunSpec of a stored run's `spec` JSON, or None when it is not one (an imported run
    stores where it came from instead: no sweep file reproduces it)."""
    if "server" not in data or "imported" in data:
        return None
    try:
        return RunSpec.from_dict(data)
    except TypeError:
        return None

