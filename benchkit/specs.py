"""Plain dataclasses describing one benchmark run: the server to start and the load to send.

These are the inputs of `benchkit.sweeps.runner.execute_run` and the unit that a sweep file expands
into (`benchkit.sweeps.sweepfile`). They are JSON-serialisable through `dataclasses.asdict` and
`RunSpec.from_dict`, which is how the Django layer stores them on a run row.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from benchkit.point import SERVER, WORKLOAD, spec_fields


@dataclass
class GpuRef:
    """One GPU a run uses: NVML index, UUID, PCI bus id and NUMA node (-1 when unknown)."""

    index: int
    uuid: str
    pci_bus_id: str = ""
    numa_node: int = -1
    name: str = ""


@dataclass
class ServerConfig:
    """How the inference server is started (everything that forbids sharing a server).

    `engine` is one of benchkit.engines.catalog.ENGINES; `method` a name of the method table
    (benchkit.methods, which says what each method needs); `num_speculative_tokens` is the
    draft length per step (tokens); `tree_budget` is DDTree's node budget B (root not counted).
    `extra_args` is appended verbatim to the engine's argv. For engine `external`,
    `endpoint_url` names a server someone else started and nothing is launched.
    """

    engine: str = "vllm"
    model: str = ""
    served_model_name: str = ""
    drafter: str = ""
    method: str = "auto"
    num_speculative_tokens: int | None = None
    tree_budget: int | None = None
    tp: int = 1
    dtype: str = ""
    max_model_len: int | None = None
    load_format: str = ""
    prefix_caching: bool | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    endpoint_url: str = ""
    engine_build: str = ""  # key into engine_flags.yaml overrides, e.g. "sglang-ddtree-pr"
    is_demo_model: bool = False


@dataclass
class WorkloadSpec:
    """The load sent to the server for one run.

    Closed loop when `request_rate` is None (at most `concurrency` requests in flight);
    otherwise open loop at `request_rate` req/s with gamma `burstiness` (1.0 = Poisson), still
    capped at `concurrency`. Lengths are in the server's tokens. `slo` maps metric names
    (`ttft_ms`, `tpot_ms`, `e2el_ms`) to upper bounds in ms for goodput.
    """

    dataset: str = "random"  # random | sharegpt | jsonl
    dataset_path: str = ""
    input_len: int = 128
    output_len: int = 128
    num_prompts: int = 16
    concurrency: int = 1
    request_rate: float | None = None
    burstiness: float = 1.0
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0
    warmup_requests: int | None = None  # None -> max(concurrency, 1)
    slo: dict[str, float] = field(default_factory=dict)

    @property
    def n_warmup(self) -> int:
        """Warmup requests sent before the window: at least the concurrency (MEASUREMENT.md)."""
        if self.warmup_requests is None:
            return max(self.concurrency, 1)
        return max(self.warmup_requests, self.concurrency)


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
        temperature, seed) and the repeat index. Not included: GPUs, port, limits, SLOs, warmup.
        Which fields: `benchkit.point.spec_fields` (the point's field groups)."""
        s, w = self.server, self.workload
        return {
            "server": {f: getattr(s, f) for f in spec_fields(SERVER)},
            "workload": {f: getattr(w, f) for f in spec_fields(WORKLOAD)},
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
