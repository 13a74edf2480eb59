"""What the GPU samples say about a measured window's validity (issue 12): pure verdicts.

A run is marked SUSPECT (it still counts; the dashboard flags it, like
`benchkit.measure.validity`'s `suspect` mark) when, during its window, a GPU of the run:

- `gpu_throttled`: reported a clock-event reason that slows the clocks for a cause outside the
  benchmark: 0x8 HW slowdown, 0x20 SW thermal slowdown, 0x40 HW thermal slowdown, 0x80 HW power
  brake slowdown. Values and meanings from nvml.h, `nvmlClocksEventReason*` /
  `nvmlClocksThrottleReason*` (NVIDIA/go-nvml `gen/nvml/nvml.h`, NVML API version 13; the same
  values in nvidia-ml-py 13.615's `pynvml.py`). 0x1 (GPU idle) and 0x4 (SW power cap: "the
  clocks have been optimized to ensure not to exceed currently set power limits", normal at full
  load on an H200) are recorded in `clock_events_seen` and never flagged; so are 0x2, 0x10 and
  0x100.
- `gpu_clock_drop`: ran its SM clock more than `clock_drop_share` (default 10 %) below its start
  value for at least `min_duration_s` (default 1 s) of consecutive readings. Start value: the
  median of the first readings worth `min_duration_s` in the window. Readings taken while the GPU
  reported 0x1 (idle: nothing to clock up for) are left out of both.
- `gpu_foreign_process`: listed a compute process outside the run's process group
  (`group_pgid`, the server's pgid; or pids given in `allowed_pids`). A pid the sampler could not
  see (another PID namespace) is foreign too: nothing shows it belongs to the run.
- `gpu_unexplained_memory`: held more memory than its listed processes plus its idle baseline
  (`idle_used_mib`, e.g. from the preflight; 0 when not given) plus `memory_tolerance_mib`
  (default 1024 MiB), for at least `min_duration_s`: memory of a process NVML does not list
  (another container, a MIG or vGPU neighbour).
- `gpu_unexplained_use`: was busy (utilisation > `util_threshold_pct`, default 10 %) for at least
  `min_duration_s` while listing no compute process at all.

A check that cannot be made says so in `notes` (no process group known, a process list NVML
did not answer, per-process memory NVML does not report); missing is never taken as fine
silently. Utilisation cannot be split per process here, so a foreign process that NVML does not
list, sharing a GPU the server also uses, is seen only through its memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from benchkit.measure.gpu_samples import PROCS, GpuSeries, TelemetryStream

#: nvml.h clock-event reason bits -> names (nvmlClocksEventReason*, NVIDIA/go-nvml gen/nvml/nvml.h).
CLOCK_EVENT_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: Bits that make a window suspect (a slowdown the benchmark did not cause).
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
IDLE_BIT = 0x1

CODES: dict[str, str] = {
    "gpu_throttled": "a GPU reported a thermal / hardware slowdown or power brake during the window",
    "gpu_clock_drop": "a GPU's SM clock fell well below its start value during the window",
    "gpu_foreign_process": "a process outside the run's process group used a GPU of the run during the window",
    "gpu_unexplained_memory": "a GPU held memory that none of its listed processes explains during the window",
    "gpu_unexplained_use": "a GPU was busy during the window while listing no compute process",
}

DEFAULT_CLOCK_DROP_SHARE = 0.10
DEFAULT_MIN_DURATION_S = 1.0
DEFAULT_MEMORY_TOLERANCE_MIB = 1024
DEFAULT_UTIL_THRESHOLD_PCT = 10


def bit_names(mask: int) -> str:
    """`0x44 (sw_power_cap, hw_thermal_slowdown)`: a mask with the nvml.h names of its bits."""
    names = [n for b, n in CLOCK_EVENT_BITS.items() if mask & b]
    unknown = mask & ~sum(CLOCK_EVENT_BITS)
    if unknown:
        names.append(f"unknown 0x{unknown:x}")
    return f"0x{mask:x} ({', '.join(names) or 'none'})"


@dataclass(frozen=True)
class GpuVerdict:
    """One finding: `code` (a key of CODES), the GPU (`gpu_index`, `gpu_uuid`), `message` (what was
    read, for people), `first_s` (seconds into the window where it was first read),
    `duration_s` (readings that showed it / hz) and `detail` (JSON-ready facts: bits, pid, MiB)."""

    code: str
    gpu_index: int
    gpu_uuid: str
    message: str
    first_s: float
    duration_s: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class GpuWindowCheck:
    """Result of `check_gpu_window`: `verdicts` (empty = nothing suspect), `clock_events_seen`
    (uuid -> OR of the masks read in the window, flagged or not) and `notes` (checks that could
    not be made, and why)."""

    verdicts: list[GpuVerdict] = field(default_factory=list)
    clock_events_seen: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def suspect(self) -> bool:
        """True when any verdict was found."""
        return bool(self.verdicts)

    def messages(self) -> list[str]:
        """One line per verdict, for a run's suspect reasons."""
        return [v.message for v in self.verdicts]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"verdicts": [asdict(v) for v in self.verdicts],
                "clock_events_seen": dict(self.clock_events_seen), "notes": list(self.notes)}


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """(start, length) of each stretch of consecutive True values."""
    out, start = [], None
    for i, f in enumerate([*flags, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i - start))
            start = None
    return out


def _gpu_label(g: GpuSeries) -> str:
    return f"GPU {g.index} ({g.uuid})"


def check_gpu_window(
    stream: TelemetryStream,
    window_start_ns: int,
    window_end_ns: int,
    *,
    group_pgid: int | None = None,
    allowed_pids: Iterable[int] = (),
    idle_used_mib: Mapping[str, int] | None = None,
    clock_drop_share: float = DEFAULT_CLOCK_DROP_SHARE,
    min_duration_s: float = DEFAULT_MIN_DURATION_S,
    memory_tolerance_mib: int = DEFAULT_MEMORY_TOLERANCE_MIB,
    util_threshold_pct: float = DEFAULT_UTIL_THRESHOLD_PCT,
) -> GpuWindowCheck:
    """Every verdict of the module docstring for the ticks with window_start_ns <= t <=
    window_end_ns. `group_pgid`: the run's server process group (default: the stream's).
    Durations become reading counts at the stream's rate (at least 1). Raises ValueError for a
    share outside (0, 1) or a negative duration / tolerance."""
    if not 0 < clock_drop_share < 1:
        raise ValueError(f"clock_drop_share must be in (0, 1), got {clock_drop_share}")
    if min_duration_s < 0 or memory_tolerance_mib < 0:
        raise ValueError("min_duration_s and memory_tolerance_mib must be >= 0")
    group = group_pgid if group_pgid is not None else stream.group_pgid
    allowed = set(allowed_pids)
    out = GpuWindowCheck()
    ticks = list(stream.ticks_between(window_start_ns, window_end_ns))
    hz = stream.hz
    min_n = max(1, round(min_duration_s * hz))
    if not ticks:
        out.notes.append("no GPU reading inside the window: nothing checked")
        return out
    if group is None and not allowed:
        out.notes.append("the run's process group is unknown (external server?): foreign-process check skipped")

    def at_s(tick: int) -> float:
        return (stream.t_ns[tick] - window_start_ns) / 1e9

    def ours(pid: int) -> bool:
        info = stream.processes.get(pid)
        return pid in allowed or (group is not None and info is not None and info.pgid == group)

    for g in stream.gpus:
        label = _gpu_label(g)
        masks = [g.values["clock_events"][i] for i in ticks]
        seen = 0
        for m in masks:
            seen |= m or 0
        out.clock_events_seen[g.uuid] = seen
        if all(m is None for m in masks):
            reasons = ", ".join(sorted(g.missing.get("clock_events", {}))) or "no readings"
            out.notes.append(f"{label}: clock-event reasons not read ({reasons}): throttle check skipped")

        # 1. throttle bits
        bad = seen & THROTTLE_BITS
        if bad:
            hits = [k for k, m in enumerate(masks) if m is not None and m & THROTTLE_BITS]
            per_bit = {CLOCK_EVENT_BITS[b]: sum(1 for m in masks if m is not None and m & b)
                       for b in CLOCK_EVENT_BITS if bad & b}
            first = ticks[hits[0]]
            out.verdicts.append(GpuVerdict(
                "gpu_throttled", g.index, g.uuid,
                f"{label} reported clock-event reason {bit_names(bad)} in {len(hits)} readings "
                f"({len(hits) / hz:.1f} s) from {at_s(first):.2f} s into the window",
                at_s(first), len(hits) / hz, {"bits": bad, "readings_per_bit": per_bit},
            ))

        # 2. SM clock drop (idle readings left out)
        eligible = [(i, g.values["sm_mhz"][i]) for i, m in zip(ticks, masks, strict=True)
                    if g.values["sm_mhz"][i] is not None and not ((m or 0) & IDLE_BIT)]
        if eligible:
            start_mhz = float(np.median([v for _, v in eligible[:min_n]]))
            limit = start_mhz * (1 - clock_drop_share)
            low = [v < limit for _, v in eligible]
            # consecutive in tick order: an idle reading or a gap between two low ones breaks the stretch
            stretches = []
            for s, n in _runs(low):
                part = eligible[s:s + n]
                cut = [0] + [k for k in range(1, n) if part[k][0] != part[k - 1][0] + 1] + [n]
                stretches += [part[a:b] for a, b in zip(cut, cut[1:], strict=False)]
            long = [p for p in stretches if len(p) >= min_n]
            if long:
                n_low = sum(len(p) for p in long)
                lowest = min(v for p in long for _, v in p)
                out.verdicts.append(GpuVerdict(
                    "gpu_clock_drop", g.index, g.uuid,
                    f"{label} SM clock fell to {lowest} MHz, {1 - lowest / start_mhz:.0%} below its start value "
                    f"{start_mhz:.0f} MHz (limit {clock_drop_share:.0%}), for {n_low / hz:.1f} s from "
                    f"{at_s(long[0][0][0]):.2f} s into the window",
                    at_s(long[0][0][0]), n_low / hz,
                    {"start_mhz": start_mhz, "lowest_mhz": lowest, "share_limit": clock_drop_share},
                ))

        # 3-5. processes, memory, utilisation
        if PROCS in g.missing:
            reasons = ", ".join(f"{r} x{n}" for r, n in sorted(g.missing[PROCS].items()))
            if not g.procs:
                out.notes.append(f"{label}: process list never read ({reasons}): process checks skipped")
                continue
            out.notes.append(f"{label}: process list not read in some readings ({reasons}); "
                             "the list read before stands in for them")
        lists = [g.procs_at(i) for i in ticks]
        if group is not None or allowed:
            foreign: dict[int, list[int]] = {}
            for k, plist in enumerate(lists):
                for pid, _ in plist:
                    if not ours(pid):
                        foreign.setdefault(pid, []).append(k)
            for pid, ks in foreign.items():
                info = stream.processes.get(pid)
                mib = max((m for k in ks for p, m in lists[k] if p == pid and m is not None), default=None)
                if info is not None and info.pgid is not None:
                    who = f"pid {pid} ({info.name or 'unnamed'}, process group {info.pgid})"
                else:
                    who = f"pid {pid} (not visible from the sampler: another PID namespace?)"
                held = f", holding {mib} MiB" if mib is not None else ""
                out.verdicts.append(GpuVerdict(
                    "gpu_foreign_process", g.index, g.uuid,
                    f"{label} ran {who}{held}, outside the run's process group {group}, in {len(ks)} readings "
                    f"({len(ks) / hz:.1f} s) from {at_s(ticks[ks[0]]):.2f} s into the window",
                    at_s(ticks[ks[0]]), len(ks) / hz,
                    {"pid": pid, "pgid": info.pgid if info else None, "name": info.name if info else "",
                     "used_mib": mib},
                ))

        used = [g.values["mem_used_mib"][i] for i in ticks]
        if any(m is None for plist in lists for _, m in plist):
            out.notes.append(f"{label}: NVML reports no per-process memory: memory check skipped")
        else:
            base = (idle_used_mib or {}).get(g.uuid, 0)
            extra = [None if u is None else u - sum(m for _, m in plist) - base
                     for u, plist in zip(used, lists, strict=True)]
            over = [x is not None and x > memory_tolerance_mib for x in extra]
            long = [(s, n) for s, n in _runs(over) if n >= min_n]
            if long:
                n_over = sum(n for _, n in long)
                worst = max(x for x in extra if x is not None)
                out.verdicts.append(GpuVerdict(
                    "gpu_unexplained_memory", g.index, g.uuid,
                    f"{label} held up to {worst} MiB beyond its listed processes and idle baseline {base} MiB "
                    f"(tolerance {memory_tolerance_mib} MiB) for {n_over / hz:.1f} s from "
                    f"{at_s(ticks[long[0][0]]):.2f} s into the window",
                    at_s(ticks[long[0][0]]), n_over / hz, {"unexplained_mib": worst, "idle_used_mib": base},
                ))

        util = [g.values["util_gpu_pct"][i] for i in ticks]
        busy_alone = [u is not None and u > util_threshold_pct and not plist
                      for u, plist in zip(util, lists, strict=True)]
        long = [(s, n) for s, n in _runs(busy_alone) if n >= min_n]
        if long:
            n_busy = sum(n for _, n in long)
            peak = max(util[k] for s, n in long for k in range(s, s + n))
            out.verdicts.append(GpuVerdict(
                "gpu_unexplained_use", g.index, g.uuid,
                f"{label} was busy (utilisation up to {peak} %) with no compute process listed for "
                f"{n_busy / hz:.1f} s from {at_s(ticks[long[0][0]]):.2f} s into the window",
                at_s(ticks[long[0][0]]), n_busy / hz, {"peak_util_pct": peak},
            ))
    return out
