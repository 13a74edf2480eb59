"""GPU allocation for TP groups from the host topology (fixtures: pcie8-2numa, h200x2-nvlink)."""

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchkit.hosts.allocation import (
    AllocationError,
    choose_gpus,
    inconsistent_tp_gpus,
    plan_sweep_gpus,
)
from benchkit.hosts.inventory import GpuInfo, HostInventory
from benchkit.hosts.topology import parse_topo_matrix

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hardware"
PCIE8 = parse_topo_matrix((SHARED / "pcie8-2numa" / "topo-m.txt").read_text())
H200 = parse_topo_matrix((SHARED / "h200x2-nvlink" / "topo-m.txt").read_text())
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
    with pytest.raises(AllocationError, match=r"pinned GPUs \[9\] do not exist"):
        choose_gpus(PCIE8, 2, pinned=[2, 9])
    with pytest.raises(AllocationError, match="not 2 distinct GPUs"):
        choose_gpus(PCIE8, 2, pinned=[2])


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
        with pytest.raises(AllocationError):
            choose_gpus(PCIE8, n, busy=busy)
        return
    a = choose_gpus(PCIE8, n, busy=busy)
    assert len(a.indices) == n and not set(a.indices) & busy
    assert a.indices == sorted(a.indices)
    one_socket_exists = any(
        len({PCIE8.numa_affinity[i] for i in combo}) == 1 for combo in itertools.combinations(free, n)
    )
    assert a.crosses_numa == (not one_socket_exists)
    # the chosen set is the lowest-index set among the equally good ones
    if not a.crosses_numa:
        same_socket = [
            c for c in itertools.combinations(free, n) if len({PCIE8.numa_affinity[i] for i in c}) == 1
        ]
        assert tuple(a.indices) == min(same_socket)
    assert choose_gpus(PCIE8, n, busy=busy) == a
