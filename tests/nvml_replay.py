"""A stand-in for the `pynvml` module that answers from NVML readings recorded on a real host
(`python -m benchkit.hosts.inventory --raw` writes them; `benchkit.hosts.nvml.read_nvml_raw`), so
the tests replay a real host's readings on a machine without a GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from benchkit.hosts.nvml import NVML_CLOCK_MEM, NVML_CLOCK_SM
from benchkit.hosts.nvml import nvml_str as _text


class ReplayError(Exception):
    """A query the recorded readings answer with an error (or do not contain)."""

    def __init__(self, recorded: str):
        super().__init__(recorded)
        self.recorded = recorded


class _Struct:
    def __init__(self, **kw: Any):
        self.__dict__.update(kw)


class ReplayNvml:
    """A stand-in for the `pynvml` module that answers from recorded readings.

    `data` is the layout `read_nvml_raw()` writes (and `shared/fixtures/hardware/*/nvml.json`
    holds): `{"driver": str, "cuda": int (e.g. 13000), "gpus": [{"index", "name", "uuid",
    "pci_bus_id", "mem": [total, used, free] bytes, "mem_v2": [total, reserved, free, used],
    "numa_node", "cpu_affinity": [ulong, ...], "pcie": [gen_cur, width_cur, gen_max,
    width_max], "cc": [major, minor], "procs": [[pid, used_bytes], ...], "topo": {other_index:
    nvml level}, "nvlink": [[link, state], ...], "nvlink_remote": [[link, bus_id], ...],
    "power_limit_mw", "max_clocks": {"sm": MHz, "mem": MHz}}]}`. A value written as
    `"ERR <reason>"` raises ReplayError(reason); a key that was never recorded raises
    ReplayError("not recorded: <key>").
    """

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self._gpus = {int(g["index"]): g for g in data.get("gpus", [])}

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ReplayNvml:
        """Load readings from a JSON file. Raises ValueError naming the file on bad JSON."""
        try:
            return cls(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None

    @staticmethod
    def _val(src: dict[str, Any], key: str) -> Any:
        if key not in src:
            raise ReplayError(f"not recorded: {key}")
        v = src[key]
        if isinstance(v, str) and v.startswith("ERR "):
            raise ReplayError(v[4:])
        return v

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._val(self.data, "gpus")

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self._val(self.data, "driver")

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return self._val(self.data, "cuda")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:  # noqa: N802
        try:
            return self._gpus[index]
        except KeyError:
            raise ReplayError(f"NVMLError_InvalidArgument(2): no GPU index {index}") from None

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> dict[str, Any]:  # noqa: N802
        for g in self._gpus.values():
            if g.get("uuid") == _text(uuid):
                return g
        raise ReplayError("NVMLError_NotFound(6)")

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return self._val(h, "name")

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return self._val(h, "uuid")

    def nvmlDeviceGetPciInfo(self, h):  # noqa: N802
        return _Struct(busId=self._val(h, "pci_bus_id"))

    def nvmlDeviceGetMemoryInfo(self, h, version=None):  # noqa: N802
        if version:
            total, reserved, free, used = self._val(h, "mem_v2")
            return _Struct(total=total, reserved=reserved, free=free, used=used)
        total, used, free = self._val(h, "mem")
        return _Struct(total=total, used=used, free=free)

    def nvmlDeviceGetCudaComputeCapability(self, h):  # noqa: N802
        return tuple(self._val(h, "cc"))

    def _pcie(self, h, k):
        return self._val(h, "pcie")[k]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):  # noqa: N802
        return self._pcie(h, 0)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):  # noqa: N802
        return self._pcie(h, 1)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):  # noqa: N802
        return self._pcie(h, 2)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):  # noqa: N802
        return self._pcie(h, 3)

    def nvmlDeviceGetNvLinkState(self, h, link):  # noqa: N802
        states = dict((int(k), v) for k, v in self._val(h, "nvlink"))
        if link not in states:
            raise ReplayError("NVMLError_InvalidArgument(2)")
        v = states[link]
        if isinstance(v, str) and v.startswith("ERR "):
            raise ReplayError(v[4:])
        return v

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):  # noqa: N802
        remote = dict((int(k), v) for k, v in self._val(h, "nvlink_remote"))
        v = remote.get(link, "ERR NVMLError_InvalidArgument(2)")
        if isinstance(v, str) and v.startswith("ERR "):
            raise ReplayError(v[4:])
        return _Struct(busId=v)

    def nvmlDeviceGetPowerManagementLimit(self, h):  # noqa: N802
        return self._val(h, "power_limit_mw")

    def nvmlDeviceGetMaxClockInfo(self, h, clock):  # noqa: N802
        clocks = self._val(h, "max_clocks")
        return self._val(clocks, {NVML_CLOCK_SM: "sm", NVML_CLOCK_MEM: "mem"}[clock])

    def nvmlDeviceGetCpuAffinity(self, h, size):  # noqa: N802
        return list(self._val(h, "cpu_affinity"))[:size]

    def nvmlDeviceGetNumaNodeId(self, h):  # noqa: N802
        return self._val(h, "numa_node")

    def nvmlDeviceGetTopologyCommonAncestor(self, h1, h2):  # noqa: N802
        topo = self._val(h1, "topo")
        key = str(h2["index"])
        if key not in topo:
            raise ReplayError(f"not recorded: topo[{key}]")
        return topo[key]

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        return [_Struct(pid=p, usedGpuMemory=m) for p, m in self._val(h, "procs")]
