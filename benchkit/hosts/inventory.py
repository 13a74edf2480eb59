"""What GPU host a run ran on: GPUs (through NVML), their interconnect, and the host itself.

`collect_inventory()` reads NVML (`benchkit.hosts.nvml`), `nvidia-smi topo -m` for the
interconnect matrix, sysfs for NUMA nodes, and /proc + psutil for the host. Every optional
query is guarded on its own: when one is unsupported its field is None and
`missing[field] = reason` records why, and collection goes on. A host without NVML or without
GPUs is valid (`gpus == []`, the reason in `missing["gpus"]`).

NVML is injectable: pass any object with pynvml's function names (the tests pass
`tests/nvml_replay.ReplayNvml`, fed by readings `benchkit.hosts.nvml.read_nvml_raw` recorded on
a real host).

Units: memory in MiB (NVML reports bytes; MiB = bytes // 2**20), power in W (NVML: mW),
clocks in MHz.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchkit.hosts.nvml import (
    MIB,
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_NVLINK_MAX_LINKS,
    NVML_TOPOLOGY_CODES,
    gpu_used_mib,
    load_pynvml,
    nvml_error_text,
    nvml_str,
    read_nvml_raw,
)
from benchkit.hosts.topology import TopologyError, TopoMatrix, is_nvlink, parse_cpu_list, parse_topo_matrix

RunCmd = Callable[[Sequence[str]], str]


def _cpus_from_mask(words: Sequence[int], bits: int = 64) -> list[int]:
    """CPU numbers set in an NVML CPU affinity mask (array of `unsigned long`, 64 bits each)."""
    return [w * bits + b for w, word in enumerate(words) for b in range(bits) if (int(word) >> b) & 1]


def cpu_ranges(cpus: Sequence[int]) -> str:
    """Compress CPU numbers into Linux cpulist text: [0,1,2,3,8] -> "0-3,8"."""
    out: list[str] = []
    cpus = sorted(set(cpus))
    k = 0
    while k < len(cpus):
        j = k
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[k]) if j == k else f"{cpus[k]}-{cpus[j]}")
        k = j + 1
    return ",".join(out)


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML bus id (`00000000:00:06.0`, 8-digit domain) -> sysfs name (`0000:00:06.0`, lower case)."""
    domain, rest = pci_bus_id.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


@dataclass
class GpuInfo:
    """One GPU as NVML sees it. Optional fields are None when NVML could not say; see `missing`.

    `index` is the NVML index (PCI bus order, what `CUDA_DEVICE_ORDER=PCI_BUS_ID` gives).
    `compute_capability` is "major.minor"; PCIe `gen`/`width` are current and max; `nvlink`
    is the state of each NVLink (True = active) by link number, None without NVLink;
    `nvlink_remote` the PCI bus id at the other end of each active link. `power_limit_w` is the
    power-management limit (W); `max_sm_clock_mhz`/`max_mem_clock_mhz` in MHz; `cpu_affinity`
    a Linux cpulist ("0-31"); `numa_node` -1 when unknown, with `numa_source` one of
    "nvml", "sysfs", "topo", "cpu_affinity" or "".
    """

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: str | None = None
    pcie_gen_current: int | None = None
    pcie_width_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    nvlink: list[bool] | None = None
    nvlink_remote: dict[int, str] | None = None
    power_limit_w: float | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    cpu_affinity: str | None = None
    numa_node: int = -1
    numa_source: str = ""
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def nvlink_active(self) -> int:
        """Number of active NVLinks (0 without NVLink)."""
        return sum(1 for s in (self.nvlink or []) if s)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        """Inverse of `asdict`; JSON turns `nvlink_remote`'s int keys into strings, undone here."""
        data = dict(data)
        if data.get("nvlink_remote") is not None:
            data["nvlink_remote"] = {int(k): v for k, v in data["nvlink_remote"].items()}
        return cls(**data)


@dataclass
class HostInventory:
    """A GPU host: its GPUs, their topology, and the host's CPU, memory, kernel and driver.

    `cuda_driver_version` is the CUDA version the driver supports ("13.0", from
    nvmlSystemGetCudaDriverVersion). `topology` is the GPU-to-GPU matrix,
    `topology_source` "nvidia-smi topo -m" or "nvml" (rebuilt from NVML common ancestors and
    NVLink peers) or "" when neither worked. `memory_total_mib` is host RAM. `missing` maps a
    host-level field (or "gpus") to why it is None/empty.
    """

    hostname: str = ""
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cpu_model: str | None = None
    cpu_sockets: int | None = None
    cpu_cores: int | None = None
    cpu_threads: int | None = None
    memory_total_mib: int | None = None
    kernel: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    topology: TopoMatrix | None = None
    topology_source: str = ""
    missing: dict[str, str] = field(default_factory=dict)

    def gpu_by_uuid(self, uuid: str) -> GpuInfo:
        """The GPU with this UUID. Raises KeyError naming the UUID."""
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise KeyError(f"no GPU with uuid {uuid!r} on {self.hostname}")

    def fingerprint(self) -> str:
        """A stable hash (16 hex digits of SHA-256) of what makes results comparable across runs.

        Inputs, in canonical JSON: the GPU model of each GPU in index order (so also the
        count), the driver version, the CUDA driver version and the GPU-to-GPU link matrix
        (codes such as NV18/SYS, row by row). Deliberately left out: hostname, UUIDs, bus ids,
        memory in use, clocks, power limits and the CPU, so that two identical hosts, or one
        host after a reboot, share a fingerprint, while a driver update or a different
        interconnect changes it.
        """
        matrix = None
        if self.topology is not None:
            idx = self.topology.indices
            matrix = [[self.topology.links.get((i, j), "?") for j in idx] for i in idx]
        payload = {
            "gpu_models": [g.name for g in sorted(self.gpus, key=lambda g: g.index)],
            "driver": self.driver_version,
            "cuda": self.cuda_driver_version,
            "topology": matrix,
        }
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; inverse of `from_dict`."""
        data = asdict(self)
        data["topology"] = self.topology.to_dict() if self.topology is not None else None
        data["fingerprint"] = self.fingerprint()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostInventory:
        """Build from `to_dict` output (its `fingerprint` key is recomputed, not read)."""
        data = {k: v for k, v in data.items() if k != "fingerprint"}
        data["gpus"] = [GpuInfo.from_dict(g) for g in data.get("gpus", [])]
        topo = data.get("topology")
        data["topology"] = TopoMatrix.from_dict(topo) if topo else None
        return cls(**data)


# ----------------------------------------------------------------------------------------------
# Collection


def default_run_cmd(argv: Sequence[str], timeout_s: float = 30.0) -> str:
    """Run a command and return its stdout. Raises OSError (not found), CalledProcessError or
    TimeoutExpired."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=timeout_s).stdout


def _guard(missing: dict[str, str], name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every optional query is guarded on its own
        missing[name] = nvml_error_text(exc)
        return None


def _read_gpu(
    nv: Any, index: int, handle: Any, sysfs_root: Path, node_cpus: dict[int, set[int]]
) -> tuple[GpuInfo, int | None]:
    """Read one GPU; also returns the single NUMA node holding all its affine CPUs (or None)."""
    g = GpuInfo(index=index)
    miss = g.missing
    g.uuid = _guard(miss, "uuid", lambda: nvml_str(nv.nvmlDeviceGetUUID(handle)))
    g.name = _guard(miss, "name", lambda: nvml_str(nv.nvmlDeviceGetName(handle)))
    g.pci_bus_id = _guard(miss, "pci_bus_id", lambda: nvml_str(nv.nvmlDeviceGetPciInfo(handle).busId))
    g.memory_total_mib = _guard(
        miss, "memory_total_mib", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).total) // MIB
    )
    g.memory_used_mib = _guard(miss, "memory_used_mib", lambda: gpu_used_mib(nv, handle))
    cc = _guard(miss, "compute_capability", lambda: nv.nvmlDeviceGetCudaComputeCapability(handle))
    g.compute_capability = f"{cc[0]}.{cc[1]}" if cc else None
    g.pcie_gen_current = _guard(
        miss, "pcie_gen_current", lambda: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(handle))
    )
    g.pcie_width_current = _guard(
        miss, "pcie_width_current", lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(handle))
    )
    g.pcie_gen_max = _guard(miss, "pcie_gen_max", lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
    g.pcie_width_max = _guard(miss, "pcie_width_max", lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle)))

    states: list[bool] = []
    remote: dict[int, str] = {}
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            states.append(bool(nv.nvmlDeviceGetNvLinkState(handle, link)))
        except Exception as exc:  # noqa: BLE001 - past the last link, or no NVLink at all
            if link == 0:
                miss["nvlink"] = nvml_error_text(exc)
            break
        if states[-1]:
            try:
                remote[link] = nvml_str(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except Exception as exc:  # noqa: BLE001
                miss.setdefault("nvlink_remote", nvml_error_text(exc))
    g.nvlink = states or None
    g.nvlink_remote = remote if states and "nvlink_remote" not in miss else None

    mw = _guard(miss, "power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(handle))
    g.power_limit_w = mw / 1000.0 if mw is not None else None
    g.max_sm_clock_mhz = _guard(
        miss, "max_sm_clock_mhz", lambda: int(nv.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM))
    )
    g.max_mem_clock_mhz = _guard(
        miss, "max_mem_clock_mhz", lambda: int(nv.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM))
    )
    mask = _guard(miss, "cpu_affinity", lambda: nv.nvmlDeviceGetCpuAffinity(handle, 64))
    cpus = _cpus_from_mask(mask) if mask is not None else []
    g.cpu_affinity = cpu_ranges(cpus) if cpus else None
    if mask is not None and not cpus:
        miss["cpu_affinity"] = "NVML returned an empty CPU mask"

    # NUMA node: NVML -> sysfs -> (topo -m, filled in by collect_inventory) -> CPU affinity.
    reasons = []
    try:
        node = int(nv.nvmlDeviceGetNumaNodeId(handle))
        if node >= 0:
            g.numa_node, g.numa_source = node, "nvml"
        else:
            reasons.append(f"nvml: {node}")
    except Exception as exc:  # noqa: BLE001
        reasons.append(f"nvml: {nvml_error_text(exc)}")
    if g.numa_node < 0 and g.pci_bus_id:
        path = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(g.pci_bus_id) / "numa_node"
        try:
            node = int(path.read_text().strip())
            if node >= 0:
                g.numa_node, g.numa_source = node, "sysfs"
            else:
                reasons.append(f"sysfs: {path} says {node}")
        except (OSError, ValueError) as exc:
            reasons.append(f"sysfs: {path}: {type(exc).__name__}")
    cpu_node = None
    if g.numa_node < 0 and cpus and node_cpus:
        nodes = {n for n, s in node_cpus.items() if s & set(cpus)}
        if len(nodes) == 1:
            cpu_node = nodes.pop()  # used after the topo -m step
        else:
            reasons.append(f"cpu_affinity: CPUs span NUMA nodes {sorted(nodes)}")
    if g.numa_node < 0:
        miss["numa_node"] = "; ".join(reasons)
    return g, cpu_node


def _node_cpus(sysfs_root: Path) -> dict[int, set[int]]:
    """NUMA node -> its CPUs, from /sys/devices/system/node/node*/cpulist (empty if unreadable)."""
    out: dict[int, set[int]] = {}
    base = sysfs_root / "devices" / "system" / "node"
    try:
        for d in base.iterdir():
            m = re.fullmatch(r"node(\d+)", d.name)
            if m:
                out[int(m.group(1))] = set(parse_cpu_list((d / "cpulist").read_text().strip()))
    except (OSError, ValueError):
        return {}
    return out


def _topology_from_nvml(nv: Any, handles: list[Any], gpus: list[GpuInfo]) -> TopoMatrix:
    """Rebuild the `topo -m` matrix from NVML when `nvidia-smi topo -m` is unavailable.

    NVLink: each active link's far end (nvmlDeviceGetNvLinkRemotePciInfo) is either a GPU of
    this host (a direct link) or not (an NVSwitch; NVML reports e.g. `FFFFFFFF:FF:FF.0` for
    it, as seen on the H200 machine in tests/fixtures/hardware/h200x2-device). Two GPUs get
    `NV<direct links>`, or, with no direct link but both on switches, `NV<min(switch links)>`
    (what nvidia-smi prints for NVSwitch systems, e.g. NV18 on HGX H200). Otherwise the PCIe
    common-ancestor level (nvmlDeviceGetTopologyCommonAncestor) is mapped to its code.
    """
    by_bus = {(g.pci_bus_id or "").upper(): g.index for g in gpus}
    nv_count: dict[tuple[int, int], int] = {}
    switch_links: dict[int, int] = {}
    for g in gpus:
        for bus in (g.nvlink_remote or {}).values():
            j = by_bus.get(bus.upper())
            if j is not None:
                nv_count[(g.index, j)] = nv_count.get((g.index, j), 0) + 1
            else:
                switch_links[g.index] = switch_links.get(g.index, 0) + 1
    for ga in gpus:
        for gb in gpus:
            key = (ga.index, gb.index)
            if (
                ga.index != gb.index
                and key not in nv_count
                and switch_links.get(ga.index)
                and switch_links.get(gb.index)
            ):
                nv_count[key] = min(switch_links[ga.index], switch_links[gb.index])
    links: dict[tuple[int, int], str] = {}
    for a, ga in enumerate(gpus):
        for b, gb in enumerate(gpus):
            if a == b:
                links[(ga.index, gb.index)] = "X"
            elif (ga.index, gb.index) in nv_count:
                links[(ga.index, gb.index)] = f"NV{nv_count[(ga.index, gb.index)]}"
            else:
                level = int(nv.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
                links[(ga.index, gb.index)] = NVML_TOPOLOGY_CODES.get(level, "SYS")
    return TopoMatrix(
        gpus=[f"GPU{g.index}" for g in gpus],
        links=links,
        cpu_affinity={g.index: g.cpu_affinity for g in gpus if g.cpu_affinity},
        numa_affinity={g.index: g.numa_node for g in gpus},
    )


def _host_facts(inv: HostInventory, proc_root: Path) -> None:
    import psutil

    miss = inv.missing
    inv.hostname = socket.gethostname()
    inv.kernel = _guard(miss, "kernel", platform.release)
    cpuinfo = _guard(miss, "cpu_model", lambda: (proc_root / "cpuinfo").read_text())
    if cpuinfo is not None:
        models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
        inv.cpu_model = models[0].strip() if models else None
        if not models:
            miss["cpu_model"] = f"no 'model name' line in {proc_root / 'cpuinfo'}"
        sockets = set(re.findall(r"^physical id\s*:\s*(\d+)$", cpuinfo, re.M))
        inv.cpu_sockets = len(sockets) if sockets else None
        if not sockets:
            miss["cpu_sockets"] = f"no 'physical id' lines in {proc_root / 'cpuinfo'}"
    else:
        miss["cpu_sockets"] = miss["cpu_model"]
    inv.cpu_cores = _guard(miss, "cpu_cores", lambda: psutil.cpu_count(logical=False))
    inv.cpu_threads = _guard(miss, "cpu_threads", lambda: psutil.cpu_count(logical=True))
    inv.memory_total_mib = _guard(miss, "memory_total_mib", lambda: psutil.virtual_memory().total // MIB)


def collect_inventory(
    nvml: Any = None,
    run_cmd: RunCmd | None = None,
    sysfs_root: str | os.PathLike = "/sys",
    proc_root: str | os.PathLike = "/proc",
) -> HostInventory:
    """Inventory this host. Never raises for a missing GPU, NVML, nvidia-smi or query.

    `nvml`: a pynvml-like object (default: `import pynvml`; `tests/nvml_replay.ReplayNvml` replays recordings).
    `run_cmd(argv) -> stdout` runs `nvidia-smi topo -m` (default: subprocess; raise on failure).
    `sysfs_root`/`proc_root` are read for NUMA nodes (`<sysfs>/bus/pci/devices/<bus id>/numa_node`,
    `<sysfs>/devices/system/node/node*/cpulist`) and the CPU model (`<proc>/cpuinfo`).
    What the `topo -m` parser kept raw rather than understood (an unknown column or row) is
    listed in `missing["topology_skipped"]`.

    Returns a HostInventory; with no NVML or no GPU, `gpus == []` and `missing["gpus"]` says why.
    The topology comes from `nvidia-smi topo -m` when it runs and parses, else is rebuilt from
    NVML (see `_topology_from_nvml`); a GPU's NUMA node falls back NVML -> sysfs -> the topo -m
    `NUMA Affinity` column -> the single NUMA node holding all of its affine CPUs.
    """
    sysfs = Path(sysfs_root)
    inv = HostInventory()
    _host_facts(inv, Path(proc_root))
    run = run_cmd or default_run_cmd

    nv = nvml
    if nv is None:
        try:
            nv = load_pynvml()
        except ImportError as exc:
            inv.missing["gpus"] = f"pynvml (nvidia-ml-py) not importable: {exc}"
            return inv
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver / no GPU: a valid GPU-less host
        inv.missing["gpus"] = f"NVML init failed: {nvml_error_text(exc)}"
        return inv
    try:
        inv.driver_version = _guard(
            inv.missing, "driver_version", lambda: nvml_str(nv.nvmlSystemGetDriverVersion())
        )
        cuda = _guard(inv.missing, "cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion)
        if cuda is not None:
            inv.cuda_driver_version = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        count = _guard(inv.missing, "gpus", nv.nvmlDeviceGetCount)
        if not count:
            inv.missing.setdefault("gpus", "NVML reports 0 GPUs")
            return inv
        node_cpus = _node_cpus(sysfs)
        handles = []
        cpu_nodes: dict[int, int | None] = {}
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as exc:  # noqa: BLE001 - e.g. a GPU that fell off the bus
                inv.missing[f"gpu{i}"] = nvml_error_text(exc)
                continue
            handles.append(h)
            g, cpu_nodes[i] = _read_gpu(nv, i, h, sysfs, node_cpus)
            inv.gpus.append(g)

        text = None
        try:
            text = run(["nvidia-smi", "topo", "-m"])
            inv.topology = parse_topo_matrix(text)
            inv.topology_source = "nvidia-smi topo -m"
            if inv.topology.skipped:
                inv.missing["topology_skipped"] = "nvidia-smi topo -m: " + "; ".join(inv.topology.skipped)
            if sorted(inv.topology.indices) != [g.index for g in inv.gpus]:
                inv.missing["topology"] = (
                    f"nvidia-smi topo -m lists {inv.topology.gpus}, NVML {[g.index for g in inv.gpus]}"
                )
        except (OSError, subprocess.SubprocessError, TopologyError) as exc:
            inv.missing["topology_text"] = nvml_error_text(exc)
            inv.topology = None
        if inv.topology is None:
            try:
                inv.topology = _topology_from_nvml(nv, handles, inv.gpus)
                inv.topology_source = "nvml"
            except Exception as exc:  # noqa: BLE001
                inv.missing["topology"] = nvml_error_text(exc)
        for g in inv.gpus:
            cpu_node = cpu_nodes.get(g.index)
            if g.numa_node >= 0:
                continue
            if (
                inv.topology_source == "nvidia-smi topo -m"
                and inv.topology.numa_affinity.get(g.index, -1) >= 0
            ):
                g.numa_node, g.numa_source = inv.topology.numa_affinity[g.index], "topo"
            elif cpu_node is not None:
                g.numa_node, g.numa_source = cpu_node, "cpu_affinity"
            if g.numa_node >= 0:
                g.missing.pop("numa_node", None)
        if inv.topology is not None and inv.topology_source == "nvml":
            inv.topology.numa_affinity = {g.index: g.numa_node for g in inv.gpus}
        return inv
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def nvlink_peers(inv: HostInventory) -> dict[int, list[int]]:
    """GPU index -> indices it reaches over NVLink, from the inventory's topology ({} without)."""
    if inv.topology is None:
        return {}
    out: dict[int, list[int]] = {}
    for (i, j), code in inv.topology.links.items():
        if i != j and is_nvlink(code):
            out.setdefault(i, []).append(j)
    return {k: sorted(v) for k, v in out.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchkit.hosts.inventory [--raw]`: print this host's inventory (or raw NVML readings) as JSON."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--raw", action="store_true", help="print raw NVML readings (replayed by tests/nvml_replay.py)")
    args = p.parse_args(argv)
    data = read_nvml_raw() if args.raw else collect_inventory().to_dict()
    print(json.dumps(data, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
