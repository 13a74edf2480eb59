"""Choose which GPUs a tensor-parallel (TP) group runs on, from the host's topology.

Rules (docs/DOMAIN.md, "A TP4 run loaded on GPUs 1-4 instead of 0-3"):

1. only free GPUs (not in `busy`);
2. stay inside one NVLink island and one NUMA node whenever such a set of `n` free GPUs exists
   (an island first: TP all-reduce traffic rides NVLink where there is one, whereas a NUMA
   crossing then costs only host-side traffic);
3. among those, the best-connected set: highest worst-pair link quality, then highest sum of
   pair qualities (`benchkit.hosts.topology.link_quality`: NV# > PIX > PXB > PHB > NODE > SYS);
4. then the lowest indices (lexicographic), so the choice is deterministic.

When no set satisfies rule 2, the best remaining set is taken and the `Allocation` records
that it crosses (`crosses_numa`, `crosses_nvlink_island`), so the run can be flagged.
GPU indices are NVML indices (PCI bus order, as with `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from benchkit.hosts.inventory import HostInventory
from benchkit.hosts.topology import TopoMatrix, link_quality
from benchkit.specs import GpuRef

#: Above this many candidate sets, the search is restricted (see `_candidates`).
MAX_COMBINATIONS = 200_000


class AllocationError(ValueError):
    """No valid GPU set: too few free GPUs, a pinned GPU unknown or busy, or a bad TP size."""


@dataclass
class Allocation:
    """The GPUs of one TP group.

    `indices` NVML indices ascending; `uuids` in the same order ("" where unknown, e.g. from a
    bare topology); `numa_nodes` per GPU (-1 unknown); `crosses_numa` True when the known NUMA
    nodes of the group differ; `crosses_nvlink_island` True when the group holds GPUs of more
    than one NVLink island, or an island GPU together with a GPU outside any island (never on
    a host without NVLink); `worst_link` the weakest pair's link code ("" for one GPU or no
    topology); `reason` says how the set was chosen.
    """

    indices: list[int]
    uuids: list[str]
    numa_nodes: list[int]
    crosses_numa: bool
    crosses_nvlink_island: bool
    reason: str
    worst_link: str = ""
    pci_bus_ids: list[str] = field(default_factory=list)

    def gpu_refs(self) -> list[GpuRef]:
        """The group as `benchkit.specs.GpuRef`s (what a RunSpec stores)."""
        buses = self.pci_bus_ids or [""] * len(self.indices)
        return [
            GpuRef(index=i, uuid=u, pci_bus_id=b, numa_node=n)
            for i, u, b, n in zip(self.indices, self.uuids, buses, self.numa_nodes, strict=True)
        ]

    @property
    def cuda_visible_devices(self) -> str:
        """Value for CUDA_VISIBLE_DEVICES: UUIDs where all are known, else indices."""
        if self.uuids and all(self.uuids):
            return ",".join(self.uuids)
        return ",".join(str(i) for i in self.indices)


@dataclass
class _HostView:
    indices: list[int]
    uuids: dict[int, str]
    buses: dict[int, str]
    numa: dict[int, int]
    topology: TopoMatrix | None


def _view(source: HostInventory | TopoMatrix) -> _HostView:
    if isinstance(source, TopoMatrix):
        idx = source.indices
        return _HostView(
            idx,
            {i: "" for i in idx},
            {i: "" for i in idx},
            {i: source.numa_affinity.get(i, -1) for i in idx},
            source,
        )
    if isinstance(source, HostInventory):
        idx = sorted(g.index for g in source.gpus)
        return _HostView(
            idx,
            {g.index: g.uuid or "" for g in source.gpus},
            {g.index: g.pci_bus_id or "" for g in source.gpus},
            {g.index: g.numa_node for g in source.gpus},
            source.topology,
        )
    raise TypeError(f"choose_gpus needs a HostInventory or TopoMatrix, got {type(source).__name__}")


def _islands(view: _HostView) -> dict[int, int]:
    """GPU index -> island number, for GPUs in an NVLink island."""
    if view.topology is None:
        return {}
    return {g: k for k, island in enumerate(view.topology.nvlink_islands()) for g in island}


def _describe(view: _HostView, group: Sequence[int], island_of: dict[int, int]) -> tuple[bool, bool, str]:
    known = {view.numa[i] for i in group if view.numa.get(i, -1) >= 0}
    crosses_numa = len(known) > 1
    islands = {island_of.get(i) for i in group}
    crosses_island = len(group) > 1 and bool(island_of) and len(islands) > 1 and islands != {None}
    worst = ""
    if view.topology is not None and len(group) > 1:
        pairs = [view.topology.links[(a, b)] for k, a in enumerate(group) for b in group[k + 1 :]]
        worst = min(pairs, key=link_quality)
    return crosses_numa, crosses_island, worst


def _quality(view: _HostView, group: Sequence[int]) -> tuple[int, int]:
    if view.topology is None:
        return (0, 0)
    return view.topology.group_quality(list(group))


def _candidates(free: list[int], n: int) -> Iterable[tuple[int, ...]]:
    """All n-subsets of `free`; on huge hosts only contiguous runs plus the lowest-index set."""
    from math import comb

    if comb(len(free), n) <= MAX_COMBINATIONS:
        return itertools.combinations(free, n)
    return [tuple(free[k : k + n]) for k in range(len(free) - n + 1)]


def _make(view: _HostView, group: Sequence[int], reason: str, island_of: dict[int, int]) -> Allocation:
    crosses_numa, crosses_island, worst = _describe(view, group, island_of)
    notes = []
    if crosses_numa:
        notes.append("crosses NUMA nodes " + str(sorted({view.numa[i] for i in group if view.numa[i] >= 0})))
    if crosses_island:
        notes.append("crosses NVLink islands")
    return Allocation(
        indices=list(group),
        uuids=[view.uuids.get(i, "") for i in group],
        numa_nodes=[view.numa.get(i, -1) for i in group],
        crosses_numa=crosses_numa,
        crosses_nvlink_island=crosses_island,
        reason=reason + (" (" + "; ".join(notes) + ")" if notes else ""),
        worst_link=worst,
        pci_bus_ids=[view.buses.get(i, "") for i in group],
    )


def choose_gpus(
    source: HostInventory | TopoMatrix,
    n: int,
    busy: Iterable[int] = (),
    pinned: Sequence[int] | None = None,
) -> Allocation:
    """Pick `n` GPUs for one TP group (rules in the module docstring).

    `source`: a HostInventory (UUIDs, NUMA nodes and topology from it) or a bare TopoMatrix
    (UUIDs unknown, NUMA from its `NUMA Affinity` column). `busy`: GPU indices not to use.
    `pinned`: use exactly these GPU indices (the allocation still records any crossing).
    Raises AllocationError when n < 1, when fewer than n GPUs are free, or when a pinned GPU
    is unknown, busy or the pinned count is not n.
    """
    view = _view(source)
    busy_set = set(busy)
    if n < 1:
        raise AllocationError(f"TP size must be >= 1, got {n}")
    island_of = _islands(view)
    if pinned is not None:
        group = sorted(pinned)
        if len(group) != n or len(set(group)) != n:
            raise AllocationError(f"pinned GPUs {list(pinned)} are not {n} distinct GPUs for TP{n}")
        unknown = [i for i in group if i not in view.indices]
        if unknown:
            raise AllocationError(f"pinned GPUs {unknown} do not exist on this host (GPUs {view.indices})")
        taken = [i for i in group if i in busy_set]
        if taken:
            raise AllocationError(f"pinned GPUs {taken} are busy")
        return _make(view, group, f"pinned to GPUs {group}", island_of)
    free = [i for i in view.indices if i not in busy_set]
    if len(free) < n:
        raise AllocationError(
            f"TP{n} needs {n} free GPUs; host has {len(view.indices)} GPUs {view.indices}, "
            f"busy {sorted(busy_set & set(view.indices))}, free {free}"
        )

    def key(group: tuple[int, ...]):
        crosses_numa, crosses_island, _ = _describe(view, group, island_of)
        worst, total = _quality(view, group)
        return (crosses_island, crosses_numa, -worst, -total, group)

    best = min(_candidates(free, n), key=key)
    crosses_numa, crosses_island, _ = _describe(view, best, island_of)
    if crosses_numa or crosses_island:
        reason = f"no {n} free GPUs share one NUMA node and NVLink island; best-connected set"
    else:
        reason = f"best-connected {n} free GPUs within one NUMA node and NVLink island"
    return _make(view, best, reason, island_of)


def plan_sweep_gpus(
    source: HostInventory | TopoMatrix,
    tps: Iterable[int],
    pinned: dict[int, Sequence[int]] | None = None,
    busy: Iterable[int] = (),
) -> dict[int, Allocation]:
    """TP degree -> its Allocation, one fixed GPU set per TP degree for every run of a sweep.

    Every run of one TP degree gets the same GPUs, so results of that degree compare on the
    same hardware (the TP1-on-GPU1-vs-GPU0 problem in docs/DOMAIN.md). `pinned` maps a TP
    degree to the GPU indices a sweep file pins for it; the others are chosen from the
    topology (`choose_gpus`). On a host without GPUs (an inventory with none) every TP degree
    gets an empty Allocation when all are 1 (CPU servers take no GPU). Raises AllocationError
    for a TP degree the host cannot hold, or TP > 1 on a host without GPUs.
    """
    tps = sorted(set(tps))
    busy = list(busy)
    pinned = pinned or {}
    if isinstance(source, HostInventory) and not source.gpus:
        if tps and tps[-1] > 1:
            raise AllocationError(f"host {source.hostname} has no GPUs (its latest inventory), so TP {tps[-1]} "
                                  "cannot run there; record the inventory of the GPU host")
        return {tp: Allocation(indices=[], uuids=[], numa_nodes=[], crosses_numa=False,
                               crosses_nvlink_island=False, reason="host without GPUs: the server runs on the CPU")
                for tp in tps}
    return {tp: choose_gpus(source, tp, busy=busy, pinned=pinned.get(tp)) for tp in tps}


def inconsistent_tp_gpus(runs: Iterable[tuple[int, Sequence[str]]]) -> list[int]:
    """TP degrees whose runs used different GPU sets (compared by UUID set), ascending.

    `runs`: (tp, gpu uuids) per run of one sweep. Feeds the dashboard's "inconsistent GPUs"
    flag.
    """
    seen: dict[int, set[frozenset[str]]] = {}
    for tp, uuids in runs:
        seen.setdefault(int(tp), set()).add(frozenset(uuids))
    return sorted(tp for tp, sets in seen.items() if len(sets) > 1)
