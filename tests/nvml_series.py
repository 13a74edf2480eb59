"""A time-series stand-in for the `pynvml` module: it answers the sampler's queries from a recorded
GPU sample stream (`benchkit.measure.gpu_samples.TelemetryStream.to_dict()` layout, e.g. the
files in tests/fixtures/telemetry/), so the real sampler (`benchkit.hosts.telemetry`) can run on
a machine without a GPU. `tests/nvml_replay.py` is its static sibling (one reading per query,
for inventory and preflight).

Which tick answers: the stream's tick i whose offset `t_ns[i] - t_ns[0]` is the latest at or
before the time elapsed since `nvmlInit` on `clock` (default `time.perf_counter_ns`), the last
tick once the recording is over. A value recorded as None raises SeriesError with the first
reason the stream's `missing` table gives for that field (`NVMLError_Unknown(999)` when none).
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchkit.hosts.nvml import MIB, NVML_CLOCK_MEM, NVML_CLOCK_SM, NVML_TEMPERATURE_GPU
from benchkit.measure.gpu_samples import TelemetryStream


class SeriesError(Exception):
    """A query the recording answers with an error. `recorded` is the reason text, which
    `benchkit.hosts.nvml.nvml_error_text` returns as is."""

    def __init__(self, recorded: str):
        super().__init__(recorded)
        self.recorded = recorded


class _Struct:
    def __init__(self, **kw: Any):
        self.__dict__.update(kw)


class SeriesNvml:
    """The stand-in. `stream`: a TelemetryStream (or its `to_dict()`); `clock`: ns clock
    deciding which tick answers; `memory_total_mib`: what `nvmlDeviceGetMemoryInfo` reports as
    total; `init_error`: when set, `nvmlInit` raises it (an NVML that does not start).
    `calls` counts queries (by function name)."""

    def __init__(self, stream: TelemetryStream | dict, clock: Callable[[], int] = time.perf_counter_ns,
                 memory_total_mib: int = 143771, init_error: str = ""):
        self.stream = stream if isinstance(stream, TelemetryStream) else TelemetryStream.from_dict(stream)
        self.clock = clock
        self.memory_total_mib = memory_total_mib
        self.init_error = init_error
        self._offsets = [t - self.stream.t_ns[0] for t in self.stream.t_ns]
        self._t0: int | None = None
        self.calls: dict[str, int] = {}

    @classmethod
    def from_file(cls, path: str) -> SeriesNvml:
        """A stand-in answering from a JSON file in the `to_dict()` layout (the child process's
        `--nvml nvml_series:SeriesNvml.from_file --nvml-arg PATH` form)."""
        return cls(json.loads(Path(path).read_text()))

    # -- helpers -----------------------------------------------------------------------------
    def _row(self) -> int:
        if self._t0 is None:
            raise SeriesError("NVMLError_Uninitialized(1)")
        elapsed = self.clock() - self._t0
        return max(bisect.bisect_right(self._offsets, elapsed) - 1, 0)

    def _value(self, h: int, field: str, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        g = self.stream.gpus[h]
        v = g.values[field][self._row()]
        if v is None:
            reasons = g.missing.get(field) or {"NVMLError_Unknown(999)": 1}
            raise SeriesError(next(iter(reasons)))
        return v

    # -- pynvml's names -----------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802
        if self.init_error:
            raise SeriesError(self.init_error)
        self._t0 = self.clock()

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._t0 = None

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.stream.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        for h, g in enumerate(self.stream.gpus):
            if g.index == index:
                return h
        raise SeriesError("NVMLError_InvalidArgument(2)")

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        for h, g in enumerate(self.stream.gpus):
            if g.uuid == uuid:
                return h
        raise SeriesError("NVMLError_NotFound(6)")

    def nvmlDeviceGetIndex(self, h: int) -> int:  # noqa: N802
        return self.stream.gpus[h].index

    def nvmlDeviceGetName(self, h: int) -> str:  # noqa: N802
        return self.stream.gpus[h].name

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:  # noqa: N802
        v = self.stream.gpus[h].power_limit_mw
        if v is None:
            raise SeriesError("NVMLError_NotSupported(3)")
        return v

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:  # noqa: N802
        v = self.stream.gpus[h].max_sm_mhz if clock == NVML_CLOCK_SM else None
        if v is None:
            raise SeriesError("NVMLError_NotSupported(3)")
        return v

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:  # noqa: N802
        return self._value(h, "power_mw", "power")

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:  # noqa: N802
        return self._value(h, "energy_mj", "energy")

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:  # noqa: N802
        field = {NVML_CLOCK_SM: "sm_mhz", NVML_CLOCK_MEM: "mem_mhz"}[clock]
        return self._value(h, field, "clock")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> _Struct:  # noqa: N802
        return _Struct(gpu=self._value(h, "util_gpu_pct", "util"), memory=self._value(h, "util_mem_pct", "util"))

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> _Struct:  # noqa: N802
        used = self._value(h, "mem_used_mib", "memory") * MIB
        total = self.memory_total_mib * MIB
        return _Struct(total=total, used=used, free=total - used, reserved=0)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:  # noqa: N802
        assert sensor == NVML_TEMPERATURE_GPU
        return self._value(h, "temp_c", "temperature")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:  # noqa: N802
        return self._value(h, "clock_events", "clock_events")

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[_Struct]:  # noqa: N802
        self.calls["procs"] = self.calls.get("procs", 0) + 1
        g = self.stream.gpus[h]
        row = self._row()
        if "procs" in g.missing and not g.procs:
            raise SeriesError(next(iter(g.missing["procs"])))
        return [_Struct(pid=pid, usedGpuMemory=None if mib is None else mib * MIB) for pid, mib in g.procs_at(row)]


def failing(reason: str) -> SeriesNvml:
    """A stand-in whose `nvmlInit` raises `reason` (an NVML that does not start)."""
    empty = TelemetryStream(hz=10.0, t_ns=[0], query_ns=[0])
    return SeriesNvml(empty, init_error=reason)


class SwitchedNvml(SeriesNvml):
    """A stand-in whose answer is switched by a file rather than by time: while `flag` exists it
    answers from the stream's LAST tick, otherwise from its first (e.g. tick 0 loaded, tick 1
    throttled), so a test can set a reading at a known point of a run (say, after its third
    measured request). The energy counter is not read from the stream: it integrates the power
    the stand-in reports (mJ += mW x elapsed s at each read, per GPU, from the stream's first
    value), so counter and power readings agree as on a real GPU."""

    def __init__(self, stream: TelemetryStream | dict, flag: str, **kw: Any):
        super().__init__(stream, **kw)
        self.flag = Path(flag)
        self._energy: dict[int, tuple[int, float]] = {}

    @classmethod
    def from_arg(cls, arg: str) -> SwitchedNvml:
        """`arg` = "<stream JSON path>::<flag file path>" (the child process's --nvml-arg)."""
        path, _, flag = arg.partition("::")
        return cls(json.loads(Path(path).read_text()), flag)

    def _row(self) -> int:
        if self._t0 is None:
            raise SeriesError("NVMLError_Uninitialized(1)")
        return len(self.stream.t_ns) - 1 if self.flag.exists() else 0

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:  # noqa: N802
        self.calls["energy"] = self.calls.get("energy", 0) + 1
        now = time.perf_counter_ns()
        power_mw = self._value(h, "power_mw", "power")
        if h not in self._energy:
            self._energy[h] = (now, float(self.stream.gpus[h].values["energy_mj"][0] or 0))
        t, e = self._energy[h]
        e += power_mw * (now - t) / 1e9
        self._energy[h] = (now, e)
        return int(e)
