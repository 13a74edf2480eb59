"""Plain dataclasses describing one benchmark run: the server to start and the load to send.

These are the inputs of `benchkit.execution.runner.execute_run` and the unit that a sweep file expands
into (`benchkit.sweeps.sweepfile`). They are JSON-serialisable through `dataclasses.asdict` and
`RunSpec.from_dict`, which is how the Django layer stores them on a run row.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Any

from benchkit import config_record
from benchkit.config_record import WHEN_SET, ConfigField


def _dataclass_field(f: ConfigField) -> tuple[str, Any, Any]:
    """(name, type, dataclasses.field) of a record field; the metadata carries the record entry."""
    meta = {"config": f, "defines_point": f.point_key is True}
    if f.factory is not None:
        return f.name, f.type, field(default_factory=f.factory, metadata=meta)
    return f.name, f.type, field(default=f.default, metadata=meta)


@dataclass
class GpuRef:
    """One GPU a run uses: NVML index, UUID, PCI bus id and NUMA node (-1 when unknown)."""

    index: int
    uuid: str
    pci_bus_id: str = ""
    numa_node: int = -1
    name: str = ""


_SERVER_DOC = """How the inference server is started (everything that forbids sharing a server).

    `engine` is a name of the engine registry (benchkit.engines.registry); `method` a name of the method table
    (benchkit.methods, which says what each method needs); `num_speculative_tokens` is the
    draft length per step (tokens); `tree_budget` is DDTree's node budget B (root not counted).
    `extra_args` is appended verbatim to the engine's argv. For engine `external`,
    `endpoint_url` names a server someone else started and nothing is launched. Every field
    but the served name and the demo flag defines the point. The fields are benchkit.config_record's
    `server` part (type, default, unit, group, sweep-file section), in its order.
    """


def _n_warmup(self: Any) -> int:
    """Warmup requests sent before the window: at least the concurrency (MEASUREMENT.md)."""
    if self.warmup_requests is None:
        return max(self.concurrency, 1)
    return max(self.warmup_requests, self.concurrency)


_WORKLOAD_DOC = """The load sent to the server for one run.

    Closed loop when `request_rate` is None (at most `concurrency` requests in flight);
    otherwise open loop at `request_rate` req/s with gamma `burstiness` (1.0 = Poisson), still
    capped at `concurrency`. Lengths are in the server's tokens. `slo` maps metric names
    (`ttft_ms`, `tpot_ms`, `e2el_ms`) to upper bounds in ms for goodput. Every field but the
    warmup and the SLOs defines the point. The fields are benchkit.config_record's `workload` part.
    """

#: How the inference server is started: the record's `server` fields (benchkit.config_record).
ServerConfig = make_dataclass("ServerConfig", [_dataclass_field(f) for f in config_record.of_part("server")],
                              namespace={"__doc__": _SERVER_DOC, "__module__": __name__})
#: The load sent to the server for one run: the record's `workload` fields.
WorkloadSpec = make_dataclass("WorkloadSpec", [_dataclass_field(f) for f in config_record.of_part("workload")],
                              namespace={"__doc__": _WORKLOAD_DOC, "__module__": __name__,
                                         "n_warmup": property(_n_warmup)})


@dataclass
class Limits:
    """Bounds for one run: timeouts in seconds, the sweep's error-rate threshold, and the GPU
    telemetry rate `telemetry_hz` (NVML readings per second, benchkit.hosts.telemetry; the sweep
    parser accepts telemetry.MIN_HZ..MAX_HZ)."""

    ready_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    run_timeout_s: float = 3600.0
    stop_timeout_s: float = 30.0
    max_error_rate: float = 0.01
    telemetry_hz: float = 10.0


@dataclass
class RunSpec:
    """Everything needed to execute one run: server, workload, GPUs, port and limits.

    `port` is the server's main TCP port when the sweep file pins one (then it is used as given,
    and a taken port fails the run `port_in_use`); None means a free one is chosen when the
    server starts (with the ports the engine derives from it, `EngineAdapter.port_span`) and
    recorded with the run, never written back here."""

    server: ServerConfig = field(default_factory=ServerConfig)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    gpus: list[GpuRef] = field(default_factory=list)
    port: int | None = None
    repeat_index: int = 0
    limits: Limits = field(default_factory=Limits)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (inverse of `from_dict`)."""
        return asdict(self)

    def point_fields(self) -> dict[str, Any]:
        """Everything that defines the measurement, as a JSON-ready dict: the server fields that
        forbid sharing a server (engine, build, model, drafter, method, k, tree budget, TP,
        dtype, max_model_len, load format, prefix caching, extra args, env, endpoint), the
        workload (dataset, lengths, prompts, concurrency, rate, burstiness, ignore_eos,
        temperature, seed) and the repeat index; a twin's pinned `acceptance_tau` and
        `engine_cpus` when set.
        Not included: GPUs, port, limits, SLOs, warmup.
        Which fields: the record's (benchkit.config_record) with `point_key` (WHEN_SET: only when
        not the default, so that runs stored before the field existed keep their keys)."""
        s, w = self.server, self.workload
        return {
            "server": _point_part(s, _SERVER_POINT_FIELDS),
            "workload": _point_part(w, _WORKLOAD_POINT_FIELDS),
            "repeat": self.repeat_index,
        }

    def point_key(self) -> str:
        """The run's natural key within a sweep ("already done" means a succeeded run with this
        key exists): sha256 hex (64 characters) of `point_fields()` as canonical JSON (sorted
        keys, no spaces)."""
        return hashlib.sha256(_canonical(self.point_fields()).encode()).hexdigest()

    def server_key(self) -> str:
        """Everything a server is started with (server config, GPUs, pinned port) as canonical JSON:
        runs with equal keys may share one server start (MEASUREMENT.md, "Reusing a server"). A
        port chosen at run time is not part of it (`port` stays None on the spec)."""
        return _canonical({"server": asdict(self.server), "gpus": [asdict(g) for g in self.gpus], "port": self.port})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """Build from `to_dict` output. Raises TypeError naming an unknown key."""
        return cls(
            server=ServerConfig(**data.get("server", {})),
            workload=WorkloadSpec(**data.get("workload", {})),
            gpus=[GpuRef(**g) for g in data.get("gpus", [])],
            port=data.get("port"),
            repeat_index=data.get("repeat_index", 0),
            limits=Limits(**data.get("limits", {})),
        )


_SERVER_POINT_FIELDS = tuple(f.metadata["config"] for f in fields(ServerConfig) if f.metadata["config"].point_key)
_WORKLOAD_POINT_FIELDS = tuple(f.metadata["config"] for f in fields(WorkloadSpec) if f.metadata["config"].point_key)


def _point_part(obj: Any, point_fields: tuple[ConfigField, ...]) -> dict[str, Any]:
    """{name: value} of `point_fields` on `obj` (a WHEN_SET field only when not its default)."""
    out = {}
    for f in point_fields:
        value = getattr(obj, f.name)
        if f.point_key != WHEN_SET or value != f.default_value():
            out[f.name] = value
    return out


def _canonical(data: Any) -> str:
    """Canonical JSON: sorted keys, no spaces (stable across runs and Python versions)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def server_groups(specs: list[RunSpec], share_server: bool = True) -> list[list[int]]:
    """Indices of `specs` grouped for execution: consecutive specs (in the given order, which is a
    sweep's expansion order) with the same `server_key()` share one server start when
    `share_server`; otherwise every spec is a group of its own. Shape: a list of non-empty index
    lists covering 0..len(specs)-1 in order."""
    groups: list[list[int]] = []
    last_key = None
    for i, spec in enumerate(specs):
        key = spec.server_key()
        if share_server and groups and key == last_key:
            groups[-1].append(i)
        else:
            groups.append([i])
        last_key = key
    return groups
