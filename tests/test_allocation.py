"""GPU allocation for TP groups from the host topology (fixtures: pcie8-2numa, h200x2-nvlink)."""

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchkit.hosts.allocation import (
    AllocationError,
    GpusBusyError,
    HostFitError,
    choose_gpus,
    fit_sweep_gpus,
    inconsistent_tp_gpus,
    plan_sweep_gpus,
)
from benchkit.hosts.inventory import GpuInfo, HostInventory
from benchkit.hosts.topology import parse_topo_matrix

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hardware"
PCIE8 = parse_topo_matrix((SHARED / "pcie8-2numa" / "topo-m.txt").read_text())
H200 = parse_topo_matrix((SHARED / "h200x2-nvlink" / "topo-m.txt").read_text())
#: The inventory a real 2 x H200 machine computed from NVML (tests/fixtures/hardware/h200x2-device).
H200_DEVICE = Path(__file__).resolve().parent / "fixtures" / "hardware" / "h200x2-device" / "inventory.json"


def h200_inventory() -> HostInventory:
    """The real 2-GPU H200 host (NV18, one NUMA node), as its worker records it."""
    return HostInventory.from_dict(json.loads(H200_DEVICE.read_text()))
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]


def pcie8_inventory() -> HostInventory:
    gpus = [
        GpuInfo(
            index=i,
            uuid=UUIDS[i],
            pci_bus_id=f"00000000:{i + 1:02X}:00.0",
            name="RTX PRO 6000",
            numa_node=PCIE8.numa_affinity[i],
        )
        for i in range(8)
    ]
    return HostInventory(hostname="ws", gpus=gpus, topology=PCIE8, topology_source="nvidia-smi topo -m")


def test_tp4_stays_in_one_socket():
    a = choose_gpus(PCIE8, 4)
    assert a.indices == [0, 1, 2, 3]
    assert a.numa_nodes == [0, 0, 0, 0]
    assert not a.crosses_numa and not a.crosses_nvlink_island
    assert a.worst_link == "NODE"


def test_tp4_with_gpu0_busy_takes_other_socket():
    a = choose_gpus(PCIE8, 4, busy={0})
    assert a.indices == [4, 5, 6, 7]
    assert not a.crosses_numa


def test_tp4_crosses_when_both_sockets_are_partly_busy():
    a = choose_gpus(PCIE8, 4, busy={0, 7})
    assert a.crosses_numa
    assert a.worst_link == "SYS"
    assert "crosses NUMA nodes [0, 1]" in a.reason


def test_tp8_crosses_numa_and_is_recorded():
    a = choose_gpus(PCIE8, 8)
    assert a.indices == list(range(8))
    assert a.crosses_numa
    assert not a.crosses_nvlink_island  # no NVLink on this host: nothing to cross


def test_tp1_gets_gpu0():
    a = choose_gpus(PCIE8, 1)
    assert a.indices == [0] and not a.crosses_numa and a.worst_link == ""


def test_inventory_gives_uuids_and_bus_ids():
    a = choose_gpus(pcie8_inventory(), 2, busy={0, 1, 2, 3})
    assert a.indices == [4, 5]
    assert a.uuids == UUIDS[4:6]
    assert a.cuda_visible_devices == ",".join(UUIDS[4:6])
    refs = a.gpu_refs()
    assert [r.numa_node for r in refs] == [1, 1]
    assert refs[0].pci_bus_id == "00000000:05:00.0"


def test_bare_topology_falls_back_to_indices_for_visible_devices():
    assert choose_gpus(PCIE8, 2).cuda_visible_devices == "0,1"


def test_nvlink_host():
    a = choose_gpus(H200, 2)
    assert a.indices == [0, 1] and a.worst_link == "NV18" and not a.crosses_nvlink_island


def test_nvlink_island_preferred_over_pcie_neighbour():
    # GPUs 0,1 on NVLink; 2 only on PCIe; all on one NUMA node.
    text = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tPIX\tNV4\t0-7\t0\nGPU1\tPIX\t X \tPIX\t0-7\t0\nGPU2\tNV4\tPIX\t X \t0-7\t0\n"
    )
    topo = parse_topo_matrix(text)
    a = choose_gpus(topo, 2)
    assert a.indices == [0, 2] and a.worst_link == "NV4"
    b = choose_gpus(topo, 2, busy={2})
    assert b.indices == [0, 1] and b.crosses_nvlink_island


def test_not_enough_gpus():
    with pytest.raises(
        AllocationError, match=r"TP4 needs 4 free GPUs; host has 8 GPUs .* busy \[0, 1, 2, 4, 5\]"
    ):
        choose_gpus(PCIE8, 4, busy={0, 1, 2, 4, 5})
    with pytest.raises(AllocationError, match="TP size must be >= 1"):
        choose_gpus(PCIE8, 0)


def test_pinned():
    a = choose_gpus(PCIE8, 4, pinned=[4, 1, 2, 3])
    assert a.indices == [1, 2, 3, 4] and a.crosses_numa and a.reason.startswith("pinned")
    with pytest.raises(AllocationError, match=r"pinned GPUs \[3\] are busy"):
        choose_gpus(PCIE8, 2, busy={3}, pinned=[2, 3])
    with pytest.raises(HostFitError, match=r"pinned GPUs \[9\] are not on the host: the host has 8 GPUs"):
        choose_gpus(PCIE8, 2, pinned=[2, 9])
    with pytest.raises(AllocationError, match="not 2 distinct GPUs"):
        choose_gpus(PCIE8, 2, pinned=[2])


def test_a_tp_above_the_hosts_gpu_count_says_what_the_host_has_and_busy_gpus_stay_distinct():
    """Issue 19: "TP3 needs 3 free GPUs; host has 2 GPUs [0, 1], busy [], free [0, 1]" read as if
    GPUs were busy. A host too small is a HostFitError naming its GPUs; busy GPUs keep their own
    error and wording."""
    inv = h200_inventory()
    with pytest.raises(HostFitError) as err:
        choose_gpus(inv, 3)
    assert str(err.value) == "TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]"
    assert (err.value.tp, err.value.cause, err.value.pinned) == (3, "gpu_count", False)
    with pytest.raises(GpusBusyError) as busy:
        choose_gpus(inv, 2, busy={1})
    assert str(busy.value) == "TP2 needs 2 free GPUs; host has 2 GPUs [0, 1], busy [1], free [0]"
    assert not isinstance(busy.value, HostFitError)
    with pytest.raises(HostFitError) as pinned:
        choose_gpus(inv, 2, pinned=[4, 5])
    assert str(pinned.value) == "pinned GPUs [4, 5] are not on the host: the host has 2 GPUs [0, 1]"
    assert (pinned.value.cause, pinned.value.pinned) == ("pinned_missing", True)
    with pytest.raises(GpusBusyError, match=r"pinned GPUs \[0\] are busy"):
        choose_gpus(inv, 2, busy={0}, pinned=[0, 1])


def test_cross_numa_false_keeps_groups_inside_one_node_or_refuses():
    """pcie8-2numa: GPUs 0-3 on node 0, 4-7 on node 1. With crossing forbidden TP4 still fits,
    TP8 can never fit (a HostFitError naming the layout), a pinned set across the socket link is
    refused at the pin, and busy GPUs that leave no one-node set are a GpusBusyError."""
    assert choose_gpus(PCIE8, 4, cross_numa=False).indices == [0, 1, 2, 3]
    assert choose_gpus(PCIE8, 4, busy={0}, cross_numa=False).indices == [4, 5, 6, 7]
    with pytest.raises(HostFitError) as err:
        choose_gpus(PCIE8, 8, cross_numa=False)
    assert err.value.cause == "numa" and not err.value.pinned
    assert str(err.value) == ("TP8 cannot stay inside one NUMA node and the sweep forbids crossing NUMA nodes "
                              "(cross_numa: false): the host has 8 GPUs [0, 1, 2, 3, 4, 5, 6, 7], at most 4 on one "
                              "NUMA node (node 0: [0, 1, 2, 3]; node 1: [4, 5, 6, 7])")
    with pytest.raises(HostFitError, match=r"pinned GPUs \[1, 2, 3, 4\] span NUMA nodes \[0, 1\]") as pin:
        choose_gpus(PCIE8, 4, pinned=[1, 2, 3, 4], cross_numa=False)
    assert pin.value.pinned and pin.value.cause == "numa"
    assert choose_gpus(PCIE8, 4, busy={0, 7}).crosses_numa  # allowed by default, recorded
    with pytest.raises(GpusBusyError, match=r"TP4 needs 4 free GPUs inside one NUMA node \(cross_numa: false\)"):
        choose_gpus(PCIE8, 4, busy={0, 7}, cross_numa=False)
    assert choose_gpus(H200, 2, cross_numa=False).indices == [0, 1]  # one node: nothing to cross


def test_fit_sweep_plans_what_the_host_holds_and_refuses_the_rest():
    plan, refused = fit_sweep_gpus(h200_inventory(), [3, 1, 2], pinned={2: [0, 1]})
    assert {tp: a.indices for tp, a in plan.items()} == {1: [0], 2: [0, 1]}
    assert list(refused) == [3] and str(refused[3]) == "TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]"
    with pytest.raises(HostFitError, match="TP3 needs 3 GPUs"):
        plan_sweep_gpus(h200_inventory(), [1, 2, 3])
    cpu = HostInventory(hostname="laptop", gpus=[])
    plan, refused = fit_sweep_gpus(cpu, [1, 2, 4], pinned={4: [0, 1, 2, 3]})
    assert plan[1].indices == [] and "CPU" in plan[1].reason
    assert str(refused[2]).startswith("TP2 needs 2 GPUs; the host has no GPUs in its inventory")
    assert str(refused[4]) == "pinned GPUs [0, 1, 2, 3] are not on the host: the host has no GPUs in its inventory"
    assert refused[4].pinned


def test_plan_sweep_gives_one_set_per_tp():
    plan = plan_sweep_gpus(PCIE8, [1, 4, 8, 4, 1])
    assert {tp: a.indices for tp, a in plan.items()} == {1: [0], 4: [0, 1, 2, 3], 8: list(range(8))}
    with pytest.raises(AllocationError):
        plan_sweep_gpus(H200, [1, 4])


def test_inconsistent_tp_gpus():
    runs = [
        (1, [UUIDS[0]]),
        (1, [UUIDS[1]]),  # the users' TP1-on-GPU1 problem
        (4, UUIDS[0:4]),
        (4, list(reversed(UUIDS[0:4]))),  # same set, other order: fine
        (8, UUIDS),
    ]
    assert inconsistent_tp_gpus(runs) == [1]
    assert inconsistent_tp_gpus([]) == []


def test_rejects_other_sources():
    with pytest.raises(TypeError, match="HostInventory or TopoMatrix"):
        choose_gpus({"gpus": []}, 1)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), busy=st.sets(st.integers(0, 7), max_size=7))
def test_properties_on_pcie8(n, busy):
    free = [i for i in range(8) if i not in busy]
    if len(free) < n:
        with pytest.raises(GpusBusyError):
            choose_gpus(PCIE8, n, busy=busy)
        return
    a = choose_gpus(PCIE8, n, busy=busy)
    assert len(a.indices) == n and not set(a.indices) & busy
    assert a.indices == sorted(a.indices)
    one_socket_exists = any(
        len({PCIE8.numa_affinity[i] for i in combo}) == 1 for combo in itertools.combinations(free, n)
    )
    assert a.crosses_numa == (not one_socket_exists)
    # with crossing forbidden: the same set when it stays inside a node, else a refusal that
    # blames the host (n > 4: no node holds n GPUs) or the busy GPUs
    if one_socket_exists:
        assert choose_gpus(PCIE8, n, busy=busy, cross_numa=False) == a
    else:
        with pytest.raises(HostFitError if n > 4 else GpusBusyError):
            choose_gpus(PCIE8, n, busy=busy, cross_numa=False)
    # the chosen set is the lowest-index set among the equally good ones
    if not a.crosses_numa:
        same_socket = [
            c for c in itertools.combinations(free, n) if len({PCIE8.numa_affinity[i] for i in c}) == 1
        ]
        assert tuple(a.indices) == min(same_socket)
    assert choose_gpus(PCIE8, n, busy=busy) == a
