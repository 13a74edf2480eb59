"""NVML access shared by inventory, preflight and telemetry: the `pynvml` module of the
`nvidia-ml-py` distribution (NVIDIA's own bindings; function names follow `nvml.h`), a few nvml.h
constants (so a stand-in NVML need not define them), error texts, and `read_nvml_raw`, which
records every reading the inventory and the preflight use (the layout of
`shared/fixtures/hardware/*/nvml.json`; tests replay it with `tests/nvml_replay.py`).

Units: memory in MiB (NVML reports bytes; MiB = bytes // 2**20), power in W (NVML: mW),
clocks in MHz.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MIB = 1 << 20
#: NVML constants (values from nvml.h), so that a stand-in NVML need not define them.
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t: the GPU die
NVML_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
NVML_NVLINK_MAX_LINKS = 18  # Hopper; the loop stops at the first link NVML refuses past link 0
#: nvmlDeviceGetTopologyCommonAncestor levels -> the `topo -m` code for the same path.
NVML_TOPOLOGY_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

def nvml_error_text(exc: BaseException) -> str:
    """Reason text for a failed query, e.g. `NVMLError_NotSupported(3)` (the fixtures' form)."""
    recorded = getattr(exc, "recorded", None)
    if recorded:
        return recorded
    value = getattr(exc, "value", None)
    if isinstance(value, int):
        return f"{type(exc).__name__}({value})"
    return f"{type(exc).__name__}: {exc}"


def nvml_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_pynvml():
    import pynvml  # nvidia-ml-py

    return pynvml

def read_nvml_raw(nvml: Any = None) -> dict[str, Any]:
    """Record every NVML reading `collect_inventory` and the preflight use, in the layout
    `tests/nvml_replay.py` replays.

    Each failed query is stored as `"ERR <reason>"`. Initialises and shuts down NVML itself.
    Raises whatever `nvmlInit` raises (no NVML on this host).
    """
    nv = nvml if nvml is not None else load_pynvml()
    nv.nvmlInit()
    try:

        def rec(fn: Callable[..., Any], *args: Any, post: Callable[[Any], Any] = int) -> Any:
            try:
                return post(fn(*args))
            except Exception as exc:  # noqa: BLE001 - each query is recorded on its own
                return "ERR " + nvml_error_text(exc)

        def mem1(h: Any) -> list[int]:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return [int(m.total), int(m.used), int(m.free)]

        def mem2(h: Any) -> list[int]:
            m = nv.nvmlDeviceGetMemoryInfo(h, version=NVML_MEMORY_V2)
            return [int(m.total), int(m.reserved), int(m.free), int(m.used)]

        def procs(h: Any) -> list[list[int]]:
            return [
                [int(p.pid), int(p.usedGpuMemory or 0)] for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
            ]

        def bus(info: Any) -> str:
            return nvml_str(info.busId)

        out: dict[str, Any] = {
            "driver": rec(nv.nvmlSystemGetDriverVersion, post=nvml_str),
            "cuda": rec(nv.nvmlSystemGetCudaDriverVersion),
            "gpus": [],
        }
        n = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        for i, h in enumerate(handles):
            g: dict[str, Any] = {"index": i}
            g["name"] = rec(nv.nvmlDeviceGetName, h, post=nvml_str)
            g["uuid"] = rec(nv.nvmlDeviceGetUUID, h, post=nvml_str)
            g["pci_bus_id"] = rec(nv.nvmlDeviceGetPciInfo, h, post=bus)
            g["mem"] = rec(mem1, h, post=list)
            g["mem_v2"] = rec(mem2, h, post=list)
            g["numa_node"] = rec(nv.nvmlDeviceGetNumaNodeId, h)
            g["cpu_affinity"] = rec(nv.nvmlDeviceGetCpuAffinity, h, 64, post=lambda ws: [int(w) for w in ws])
            g["pcie"] = [
                rec(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                rec(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
                rec(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                rec(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
            ]
            g["cc"] = rec(nv.nvmlDeviceGetCudaComputeCapability, h, post=list)
            g["procs"] = rec(procs, h, post=list)
            g["topo"] = {
                str(j): rec(nv.nvmlDeviceGetTopologyCommonAncestor, h, h2)
                for j, h2 in enumerate(handles)
                if j != i
            }
            links, remote = [], []
            for link in range(NVML_NVLINK_MAX_LINKS):
                state = rec(nv.nvmlDeviceGetNvLinkState, h, link)
                links.append([link, state])
                if isinstance(state, str):
                    break
                if state:
                    remote.append([link, rec(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link, post=bus)])
            g["nvlink"] = links
            g["nvlink_remote"] = remote
            g["power_limit_mw"] = rec(nv.nvmlDeviceGetPowerManagementLimit, h)
            g["max_clocks"] = {
                "sm": rec(nv.nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_SM),
                "mem": rec(nv.nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_MEM),
            }
            out["gpus"].append(g)
        return out
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

def gpu_used_mib(nv: Any, handle: Any) -> int:
    """GPU memory in use (MiB): NVML's v2 `used` (driver-reserved memory excluded, as nvidia-smi
    shows it) where available, else v1 `used`."""
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(handle, version=NVML_MEMORY_V2).used) // MIB
    except Exception:  # noqa: BLE001 - older drivers/bindings lack v2
        return int(nv.nvmlDeviceGetMemoryInfo(handle).used) // MIB
