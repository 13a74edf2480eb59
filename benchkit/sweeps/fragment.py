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

from benchkit.specs import Limits, RunSpec, ServerConfig, WorkloadSpec

#: ServerConfig fields that go to the file's `server:` section when they differ from the default.
_SERVER_KEYS = ("served_model_name", "dtype", "max_model_len", "load_format", "extra_args", "env", "endpoint_url",
                "is_demo_model")
#: WorkloadSpec fields that go to `workload:` (the grid axes and the SLO go elsewhere).
_WORKLOAD_KEYS = ("dataset", "dataset_path", "num_prompts", "request_rate", "burstiness", "ignore_eos",
                  "temperature", "seed", "warmup_requests")


def point_sweep_dict(spec: RunSpec, name: str, description: str = "") -> dict[str, Any]:
    """The sweep-file document (a dict in the sweep file's layout) that reproduces `spec`.

    Only values that differ from the sweep file's defaults are written, except the point's own
    coordinates (engine, model, TP, method, concurrency, lengths), which are always written.
    """
    s, w = spec.server, spec.workload
    default_server, default_workload = ServerConfig(), WorkloadSpec()
    method: dict[str, Any] = {"method": s.method}
    if s.num_speculative_tokens is not None:
        method["num_speculative_tokens"] = s.num_speculative_tokens
    if s.tree_budget is not None:
        method["tree_budget"] = s.tree_budget
    if s.drafter:
        method["drafter"] = s.drafter
    if s.prefix_caching is not None:
        method["prefix_caching"] = s.prefix_caching
    doc: dict[str, Any] = {"name": name}
    if description:
        doc["description"] = description
    doc.update(engine=s.engine, model=s.model)
    if s.engine_build:
        doc["engine_build"] = s.engine_build
    if spec.port is not None:  # pinned by its sweep; otherwise the runner picks a free one again
        doc["port"] = spec.port
    server = {k: getattr(s, k) for k in _SERVER_KEYS if getattr(s, k) != getattr(default_server, k)}
    if server:
        doc["server"] = server
    doc["grid"] = {"tp": [s.tp], "methods": [method], "concurrency": [w.concurrency], "output_len": [w.output_len],
                   "input_len": [w.input_len]}
    workload = {k: getattr(w, k) for k in _WORKLOAD_KEYS if getattr(w, k) != getattr(default_workload, k)}
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

