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
that it crosses (`crosses_numa`, `crosses_nvlink_island`), so the run can be flagged; with
`cross_numa=False` (a sweep file's `cross_numa: false`) only sets inside one NUMA node count.
GPU indices are NVML indices (PCI bus order, as with `CUDA_DEVICE_ORDER=PCI_BUS_ID`).

Two kinds of refusal, kept apart because they call for different fixes:

- `HostFitError`: the host can never hold the group (more GPUs than it has, a pinned GPU it
  lacks, a group that must cross NUMA nodes when that is forbidden): fix the sweep or pick
  another host. Its message states what the host has ("the host has 2 GPUs [0, 1]").
- `GpusBusyError`: the host could hold it, but GPUs in `busy` leave too few free now.
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


class HostFitError(AllocationError):
    """The host cannot hold TP group `tp` whatever is busy. `cause`: `gpu_count` (TP larger than
    the host's GPU count, or TP > 1 on a host without GPUs), `pinned_missing` (a pinned GPU the
    host lacks), `numa` (the group must cross NUMA nodes and `cross_numa` is False). `pinned`:
    the blame lies on the pinned GPU list (a sweep file's `gpus:` entry), else on the TP degree.
    The message is the reason alone, without file or host name (callers add them)."""

    def __init__(self, tp: int, cause: str, message: str, pinned: bool = False):
        super().__init__(message)
        self.tp, self.cause, self.pinned = tp, cause, pinned


class GpusBusyError(AllocationError):
    """The host holds enough GPUs for the group, but GPUs in `busy` leave too few free now."""


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


def _has(view: _HostView) -> str:
    """`the host has 2 GPUs [0, 1]` (what a host-fit message states)."""
    n = len(view.indices)
    if not n:
        return "the host has no GPUs"
    return f"the host has {n} GPU{'s' if n != 1 else ''} {view.indices}"


def _numa_layout(view: _HostView) -> str:
    """`node 0: [0, 1, 2, 3]; node 1: [4, 5, 6, 7]` (GPUs of unknown node as `node ?`)."""
    nodes: dict[int, list[int]] = {}
    for i in view.indices:
        nodes.setdefault(view.numa.get(i, -1), []).append(i)
    ordered = sorted(nodes.items(), key=lambda kv: (kv[0] < 0, kv[0]))
    return "; ".join(f"node {k if k >= 0 else '?'}: {v}" for k, v in ordered)


def _most_in_one_node(view: _HostView) -> int:
    """The largest group that crosses no known NUMA node boundary: the GPUs of unknown node plus
    those of the fullest known node (unknown nodes never count as a crossing, as in `_describe`)."""
    counts: dict[int, int] = {}
    for i in view.indices:
        counts[view.numa.get(i, -1)] = counts.get(view.numa.get(i, -1), 0) + 1
    unknown = counts.pop(-1, 0)
    return unknown + max(counts.values(), default=0)


def choose_gpus(
    source: HostInventory | TopoMatrix,
    n: int,
    busy: Iterable[int] = (),
    pinned: Sequence[int] | None = None,
    cross_numa: bool = True,
) -> Allocation:
    """Pick `n` GPUs for one TP group (rules in the module docstring).

    `source`: a HostInventory (UUIDs, NUMA nodes and topology from it) or a bare TopoMatrix
    (UUIDs unknown, NUMA from its `NUMA Affinity` column). `busy`: GPU indices not to use.
    `pinned`: use exactly these GPU indices (the allocation still records any crossing).
    `cross_numa`: False refuses a group whose known NUMA nodes differ (GPUs of unknown node
    never count as crossing).
    Raises HostFitError when the host cannot hold the group at all (n above its GPU count, a
    pinned GPU it lacks, a group that must cross NUMA nodes with `cross_numa` False),
    GpusBusyError when GPUs in `busy` leave too few free (or a pinned GPU is busy), and
    AllocationError when n < 1 or the pinned list is not n distinct GPUs.
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
            raise HostFitError(n, "pinned_missing", f"pinned GPUs {unknown} are not on the host: {_has(view)}",
                               pinned=True)
        if not cross_numa and _describe(view, group, island_of)[0]:
            raise HostFitError(n, "numa", f"pinned GPUs {group} span NUMA nodes "
                               f"{sorted({view.numa[i] for i in group if view.numa[i] >= 0})} and the sweep forbids "
                               f"crossing NUMA nodes (cross_numa: false); the host's GPUs by NUMA node: "
                               f"{_numa_layout(view)}", pinned=True)
        taken = [i for i in group if i in busy_set]
        if taken:
            raise GpusBusyError(f"pinned GPUs {taken} are busy")
        return _make(view, group, f"pinned to GPUs {group}", island_of)
    if n > len(view.indices):
        raise HostFitError(n, "gpu_count", f"TP{n} needs {n} GPUs; {_has(view)}")
    if not cross_numa and _most_in_one_node(view) < n:
        raise HostFitError(n, "numa", f"TP{n} cannot stay inside one NUMA node and the sweep forbids crossing NUMA "
                           f"nodes (cross_numa: false): {_has(view)}, at most {_most_in_one_node(view)} on one "
                           f"NUMA node ({_numa_layout(view)})")
    free = [i for i in view.indices if i not in busy_set]
    if len(free) < n:
        raise GpusBusyError(
            f"TP{n} needs {n} free GPUs; host has {len(view.indices)} GPUs {view.indices}, "
            f"busy {sorted(busy_set & set(view.indices))}, free {free}"
        )
    candidates = _candidates(free, n)
    if not cross_numa:
        candidates = [c for c in candidates if not _describe(view, c, island_of)[0]]
        if not candidates:
            raise GpusBusyError(
                f"TP{n} needs {n} free GPUs inside one NUMA node (cross_numa: false); host has "
                f"{len(view.indices)} GPUs ({_numa_layout(view)}), busy {sorted(busy_set & set(view.indices))}"
            )

    def key(group: tuple[int, ...]):
        crosses_numa, crosses_island, _ = _describe(view, group, island_of)
        worst, total = _quality(view, group)
        return (crosses_island, crosses_numa, -worst, -total, group)

    best = min(candidates, key=key)
    crosses_numa, crosses_island, _ = _describe(view, best, island_of)
    if crosses_numa or crosses_island:
        reason = f"no {n} free GPUs share one NUMA node and NVLink island; best-connected set"
    else:
        reason = f"best-connected {n} free GPUs within one NUMA node and NVLink island"
    return _make(view, best, reason, island_of)


_CPU_ONLY = "host without GPUs: the server runs on the CPU"


def _on_cpu_host(tp: int, pinned: Sequence[int] | None) -> Allocation:
    """The Allocation of TP group `tp` on a host whose inventory lists no GPU (CPU servers take
    none); HostFitError for pinned GPUs or TP > 1."""
    no_gpus = "the host has no GPUs in its inventory"
    if pinned:
        raise HostFitError(tp, "pinned_missing", f"pinned GPUs {sorted(pinned)} are not on the host: {no_gpus}",
                           pinned=True)
    if tp > 1:
        raise HostFitError(tp, "gpu_count", f"TP{tp} needs {tp} GPUs; {no_gpus} (a CPU host runs TP1 only; a GPU "
                                            "host whose inventory lists none: record its inventory on it)")
    return Allocation(indices=[], uuids=[], numa_nodes=[], crosses_numa=False, crosses_nvlink_island=False,
                      reason=_CPU_ONLY)


def fit_sweep_gpus(
    source: HostInventory | TopoMatrix,
    tps: Iterable[int],
    pinned: dict[int, Sequence[int]] | None = None,
    busy: Iterable[int] = (),
    cross_numa: bool = True,
) -> tuple[dict[int, Allocation], dict[int, HostFitError]]:
    """Plan one fixed GPU set per TP degree of a sweep, and say which TP degrees the host cannot
    hold: (TP degree -> Allocation, TP degree -> HostFitError), each ascending, together every
    degree of `tps` once.

    Every run of one TP degree gets the same GPUs, so results of that degree compare on the
    same hardware (the TP1-on-GPU1-vs-GPU0 problem in docs/DOMAIN.md). `pinned` maps a TP
    degree to the GPU indices a sweep file pins for it; the others are chosen from the
    topology (`choose_gpus`, with `cross_numa`). On a host without GPUs (an inventory with
    none) TP1 gets an empty Allocation (CPU servers take no GPU) and TP > 1 or pinned GPUs are
    refused. GpusBusyError (GPUs in `busy`) and AllocationError (a bad pinned list) still raise.
    """
    pinned = pinned or {}
    busy = list(busy)
    cpu_host = isinstance(source, HostInventory) and not source.gpus
    plan: dict[int, Allocation] = {}
    refused: dict[int, HostFitError] = {}
    for tp in sorted(set(tps)):
        try:
            plan[tp] = (_on_cpu_host(tp, pinned.get(tp)) if cpu_host
                        else choose_gpus(source, tp, busy=busy, pinned=pinned.get(tp), cross_numa=cross_numa))
        except HostFitError as exc:
            refused[tp] = exc
    return plan, refused


def plan_sweep_gpus(
    source: HostInventory | TopoMatrix,
    tps: Iterable[int],
    pinned: dict[int, Sequence[int]] | None = None,
    busy: Iterable[int] = (),
    cross_numa: bool = True,
) -> dict[int, Allocation]:
    """TP degree -> its Allocation, one fixed GPU set per TP degree for every run of a sweep
    (`fit_sweep_gpus`), all or nothing: raises the HostFitError of the lowest TP degree the host
    cannot hold (GpusBusyError / AllocationError as `fit_sweep_gpus`)."""
    plan, refused = fit_sweep_gpus(source, tps, pinned, busy, cross_numa)
    if refused:
        raise refused[min(refused)]
    return plan


def inconsistent_tp_gpus(runs: Iterable[tuple[int, Sequence[str]]]) -> list[int]:
    """TP degrees whose runs used different GPU sets (compared by UUID set), ascending.

    `runs`: (tp, gpu uuids) per run of one sweep. Feeds the dashboard's "inconsistent GPUs"
    flag.
    """
    seen: dict[int, set[frozenset[str]]] = {}
    for tp, uuids in runs:
        seen.setdefault(int(tp), set()).add(frozenset(uuids))
    return sorted(tp for tp, sets in seen.items() if len(sets) > 1)
