"""GPU telemetry sample streams: what NVML said about each GPU of a run, tick by tick, before any
figure is computed.

Like the request logs (`benchkit.measure.logs`), the stream is raw data: every power, energy and
validity figure (`benchkit.measure.efficiency`, `benchkit.measure.gpu_validity`) is a pure
function of a stream plus the run's window, so it is stored with the run and a formula fix can
recompute old runs. `benchkit.hosts.telemetry` records streams from NVML.

One tick = one reading of every field of every GPU, taken at `t_ns[i]`
(`time.perf_counter_ns()`, which on Linux is CLOCK_MONOTONIC: one clock for every process of the
host, so the sampler process's times compare with the load client's window). A value is None
when its query failed at that tick; `GpuSeries.missing[field]` counts the ticks per reason
(`benchkit.hosts.nvml.nvml_error_text`, e.g. `NVMLError_NotSupported(3)`).

Fields (`FIELDS`; NVML function names as in nvml.h, e.g. NVIDIA/go-nvml `gen/nvml/nvml.h`):

| field | NVML query | unit |
| --- | --- | --- |
| `power_mw` | `nvmlDeviceGetPowerUsage` (on Ampere and newer a 1 s average, nvml.h) | mW |
| `energy_mj` | `nvmlDeviceGetTotalEnergyConsumption` (since the driver was loaded; Volta+) | mJ |
| `sm_mhz`, `mem_mhz` | `nvmlDeviceGetClockInfo(NVML_CLOCK_SM / NVML_CLOCK_MEM)` | MHz |
| `util_gpu_pct`, `util_mem_pct` | `nvmlDeviceGetUtilizationRates` `.gpu` / `.memory` | % |
| `mem_used_mib` | `nvmlDeviceGetMemoryInfo` v2 `used` (v1 where v2 is refused) // 2**20 | MiB |
| `temp_c` | `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)` | C |
| `clock_events` | `nvmlDeviceGetCurrentClocksEventReasons` (bit mask) | bits |

Compute processes (`nvmlDeviceGetComputeRunningProcesses`: pid and used memory in MiB, None
where NVML reports none) change rarely, so each GPU stores only the ticks where its list changed
(`GpuSeries.procs`); the query's failures count under the pseudo-field `procs`. Each pid seen is
described once in `TelemetryStream.processes` (its process group at first sight, so a foreign
process can be told from the run's server group).

The stored form (`encode_telemetry`) is zlib-compressed JSON of column arrays, tick times and the
energy counter kept as integer deltas, so the round trip is exact; `to_dict` / `from_dict` give
the same layout without deltas (fixtures and JSON dumps are written in it).
"""

from __future__ import annotations

import bisect
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from benchkit.inflate import MAX_BLOB_BYTES, inflate_zlib

#: Version tag of the stored layout; `decode_telemetry` and `from_dict` refuse others.
FORMAT_VERSION = 1

#: Per-tick fields of each GPU (see the module docstring for query and unit).
FIELDS = (
    "power_mw",
    "energy_mj",
    "sm_mhz",
    "mem_mhz",
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_mib",
    "temp_c",
    "clock_events",
)
#: Pseudo-field under which failures of the process query are counted in `GpuSeries.missing`.
PROCS = "procs"
#: Fields stored as deltas to their previous non-missing value in the encoded form.
_DELTA_FIELDS = ("energy_mj",)

ProcList = tuple[tuple[int, int | None], ...]


@dataclass
class ProcessInfo:
    """A process seen on a GPU: `pid`, its process-group id `pgid` at first sight (None: the pid
    is not visible from the sampler, e.g. another PID namespace) and its `name` ("" unknown)."""

    pid: int
    pgid: int | None
    name: str = ""


@dataclass
class GpuSeries:
    """One GPU's samples.

    `index`, `uuid`, `name`: the GPU (NVML index, UUID, product name). `power_limit_mw`: the
    enforced power limit at the start (`nvmlDeviceGetEnforcedPowerLimit`, mW; None unknown);
    `max_sm_mhz`: `nvmlDeviceGetMaxClockInfo(SM)` (MHz). `values[field]`: one value per tick of
    the stream (None = the query failed then). `missing[field][reason]`: ticks that failed with
    that reason. `procs`: (tick, ((pid, used_mib or None), ...)) at tick 0 and at every tick
    where the list changed, ticks increasing; pids sorted.
    """

    index: int
    uuid: str
    name: str = ""
    power_limit_mw: int | None = None
    max_sm_mhz: int | None = None
    values: dict[str, list[int | None]] = field(default_factory=lambda: {f: [] for f in FIELDS})
    missing: dict[str, dict[str, int]] = field(default_factory=dict)
    procs: list[tuple[int, ProcList]] = field(default_factory=list)

    def procs_at(self, tick: int) -> ProcList:
        """The compute processes listed at `tick`: ((pid, used_mib or None), ...); () when the
        list was never read by then."""
        i = bisect.bisect_right([t for t, _ in self.procs], tick) - 1
        return self.procs[i][1] if i >= 0 else ()


@dataclass
class TelemetryStream:
    """Every tick of one sampling session.

    `hz`: the configured rate (ticks per second). `t_ns`: tick start times (perf_counter_ns,
    increasing). `query_ns`: how long each tick's NVML queries took (ns). `gpus`: one GpuSeries
    per GPU sampled. `processes`: pid -> ProcessInfo for every pid any GPU listed.
    `group_pgid`: the run's process group when the caller knew it (the server's pgid), else None.
    `truncated`: sampling stopped at its duration bound before it was asked to. `note`: what the
    sampler wants a reader to know (e.g. why it stopped). `sampler`: how it ran (`process`,
    `thread`, `inline`). `sampler_cpu_ns`: CPU time the sampler's process used (ns; None unknown).
    """

    hz: float
    t_ns: list[int] = field(default_factory=list)
    query_ns: list[int] = field(default_factory=list)
    gpus: list[GpuSeries] = field(default_factory=list)
    processes: dict[int, ProcessInfo] = field(default_factory=dict)
    group_pgid: int | None = None
    truncated: bool = False
    note: str = ""
    sampler: str = "process"
    sampler_cpu_ns: int | None = None

    @property
    def n_ticks(self) -> int:
        """Number of ticks."""
        return len(self.t_ns)

    def gpu(self, uuid: str) -> GpuSeries:
        """The series of the GPU with this UUID. Raises KeyError naming it when absent."""
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise KeyError(f"no GPU {uuid} in the telemetry stream")

    def ticks_between(self, start_ns: int, end_ns: int) -> range:
        """Indices of the ticks with start_ns <= t_ns <= end_ns (a range, possibly empty)."""
        return range(bisect.bisect_left(self.t_ns, start_ns), bisect.bisect_right(self.t_ns, end_ns))

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistency: unknown or missing fields, a column
        whose length is not the number of ticks, times not increasing, process changes out of
        order or naming a pid `processes` does not describe."""
        n = len(self.t_ns)
        if len(self.query_ns) != n:
            raise ValueError(f"telemetry: query_ns has {len(self.query_ns)} entries, expected {n}")
        if any(b <= a for a, b in zip(self.t_ns, self.t_ns[1:], strict=False)):
            raise ValueError("telemetry: tick times are not strictly increasing")
        for g in self.gpus:
            if set(g.values) != set(FIELDS):
                raise ValueError(f"telemetry: GPU {g.uuid}: fields {sorted(g.values)} != {sorted(FIELDS)}")
            for f, col in g.values.items():
                if len(col) != n:
                    raise ValueError(f"telemetry: GPU {g.uuid}: column {f!r} has {len(col)} entries, expected {n}")
            bad = set(g.missing) - set(FIELDS) - {PROCS}
            if bad:
                raise ValueError(f"telemetry: GPU {g.uuid}: missing-reason table names unknown fields {sorted(bad)}")
            ticks = [t for t, _ in g.procs]
            if ticks != sorted(set(ticks)) or any(not 0 <= t < max(n, 1) for t in ticks):
                raise ValueError(f"telemetry: GPU {g.uuid}: process changes not at increasing ticks in 0..{n - 1}")
            for _, plist in g.procs:
                for pid, _mib in plist:
                    if pid not in self.processes:
                        raise ValueError(f"telemetry: GPU {g.uuid}: pid {pid} listed but not described")

    # -- readable layout -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready layout (no deltas): {"v", "hz", "group_pgid", "truncated", "note",
        "sampler", "sampler_cpu_ns", "t_ns", "query_ns", "processes": [[pid, pgid, name]],
        "gpus": [{"index", "uuid", "name", "power_limit_mw", "max_sm_mhz", "values": {field:
        [...]}, "missing": {field: {reason: ticks}}, "procs": [[tick, [[pid, mib], ...]]]}]}."""
        return {
            "v": FORMAT_VERSION,
            "hz": self.hz,
            "group_pgid": self.group_pgid,
            "truncated": self.truncated,
            "note": self.note,
            "sampler": self.sampler,
            "sampler_cpu_ns": self.sampler_cpu_ns,
            "t_ns": list(self.t_ns),
            "query_ns": list(self.query_ns),
            "processes": [[p.pid, p.pgid, p.name] for p in sorted(self.processes.values(), key=lambda p: p.pid)],
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "power_limit_mw": g.power_limit_mw,
                    "max_sm_mhz": g.max_sm_mhz,
                    "values": {f: list(g.values[f]) for f in FIELDS},
                    "missing": {f: dict(r) for f, r in g.missing.items()},
                    "procs": [[t, [list(p) for p in plist]] for t, plist in g.procs],
                }
                for g in self.gpus
            ],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TelemetryStream:
        """Inverse of `to_dict`. Raises ValueError naming what is wrong (version, a missing key,
        a bad value or any `validate` failure)."""
        if not isinstance(doc, Mapping) or doc.get("v") != FORMAT_VERSION:
            version = doc.get("v") if isinstance(doc, Mapping) else None
            raise ValueError(f"telemetry: unsupported format version {version!r} (expected {FORMAT_VERSION})")
        try:
            gpus = []
            for g in doc["gpus"]:
                values = g["values"]
                gpus.append(GpuSeries(
                    index=int(g["index"]),
                    uuid=str(g["uuid"]),
                    name=str(g.get("name", "")),
                    power_limit_mw=g.get("power_limit_mw"),
                    max_sm_mhz=g.get("max_sm_mhz"),
                    values={f: [None if v is None else int(v) for v in values[f]] for f in values},
                    missing={str(f): {str(r): int(n) for r, n in rs.items()} for f, rs in g.get("missing", {}).items()},
                    procs=[(int(t), tuple((int(p), None if m is None else int(m)) for p, m in plist))
                           for t, plist in g.get("procs", [])],
                ))
            stream = cls(
                hz=float(doc["hz"]),
                t_ns=[int(t) for t in doc["t_ns"]],
                query_ns=[int(q) for q in doc["query_ns"]],
                gpus=gpus,
                processes={int(p): ProcessInfo(int(p), None if pg is None else int(pg), str(name))
                           for p, pg, name in doc.get("processes", [])},
                group_pgid=None if doc.get("group_pgid") is None else int(doc["group_pgid"]),
                truncated=bool(doc.get("truncated", False)),
                note=str(doc.get("note", "")),
                sampler=str(doc.get("sampler", "process")),
                sampler_cpu_ns=None if doc.get("sampler_cpu_ns") is None else int(doc["sampler_cpu_ns"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"telemetry: malformed stream ({type(exc).__name__}: {exc})") from None
        stream.validate()
        return stream


def sampler_gaps(stream: TelemetryStream, window_start_ns: int, window_end_ns: int) -> tuple[float, float] | None:
    """The sampler's own gaps inside [window_start_ns, window_end_ns]: (longest interval without a
    reading in ms, the window's edges counted as readings; share 0..1 of the window spent in
    intervals longer than two sampling periods, counting each such interval's excess over one
    period). None for an empty window or a stream without readings: unknown, not 0."""
    span = window_end_ns - window_start_ns
    if span <= 0 or not stream.t_ns:
        return None
    ticks = stream.ticks_between(window_start_ns, window_end_ns)
    times = [window_start_ns, *(stream.t_ns[i] for i in ticks), window_end_ns]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    period = 1e9 / stream.hz if stream.hz > 0 else 0.0
    excess = sum(g - period for g in gaps if period and g > 2 * period)
    return max(gaps) / 1e6, min(1.0, excess / span)


def _deltas(col: list[int | None]) -> list[int | None]:
    out: list[int | None] = []
    prev = 0
    for v in col:
        if v is None:
            out.append(None)
        else:
            out.append(v - prev)
            prev = v
    return out


def _undeltas(col: list[int | None]) -> list[int | None]:
    out: list[int | None] = []
    prev = 0
    for d in col:
        if d is None:
            out.append(None)
        else:
            prev += d
            out.append(prev)
    return out


def encode_telemetry(stream: TelemetryStream) -> bytes:
    """Encode a stream into compact bytes: zlib (level 9) over the `to_dict` JSON with `t_ns`
    replaced by `t0_ns` + `t_dns` (deltas to the previous tick) and each GPU's `energy_mj` stored
    as deltas to its previous non-missing value. Raises ValueError when the stream is
    inconsistent (`validate`). Inverse: `decode_telemetry`."""
    stream.validate()
    doc = stream.to_dict()
    t = doc.pop("t_ns")
    doc["t0_ns"] = t[0] if t else 0
    doc["t_dns"] = [b - a for a, b in zip(t, t[1:], strict=False)]
    for g in doc["gpus"]:
        for f in _DELTA_FIELDS:
            g["values"][f] = _deltas(g["values"][f])
    doc["n_ticks"] = len(t)
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode("utf-8"), 9)


def decode_telemetry(data: bytes) -> TelemetryStream:
    """Decode bytes written by `encode_telemetry` back into the identical TelemetryStream.

    Raises ValueError naming the problem when the bytes are not zlib data or JSON, of an unknown
    format version, or inconsistent (a column of the wrong length, ...); InflateLimitError (a
    ValueError) when they decompress to more than MAX_BLOB_BYTES (256 MiB, benchkit.inflate;
    an hour at 50 Hz on 8 GPUs is about 80 MB), reading stopped there."""
    try:
        doc = json.loads(inflate_zlib(data, "telemetry", MAX_BLOB_BYTES, "MAX_BLOB_BYTES").decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"telemetry: not an encoded telemetry stream ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise ValueError(f"telemetry: unsupported format version {version!r} (expected {FORMAT_VERSION})")
    try:
        n = int(doc.pop("n_ticks"))
        t0, dts = int(doc.pop("t0_ns")), doc.pop("t_dns")
        if len(dts) != max(n - 1, 0):
            raise ValueError(f"t_dns has {len(dts)} entries for {n} ticks")
        t = [t0] if n else []
        for d in dts:
            t.append(t[-1] + int(d))
        doc["t_ns"] = t
        for g in doc["gpus"]:
            for f in _DELTA_FIELDS:
                g["values"][f] = _undeltas(g["values"][f])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"telemetry: malformed stream ({type(exc).__name__}: {exc})") from None
    return TelemetryStream.from_dict(doc)
