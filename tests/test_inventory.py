"""Host inventory from NVML readings replayed from fixtures, and from this (GPU-less) host."""

import copy
import csv
import json
import subprocess
from pathlib import Path

import pytest

from benchkit.hosts.inventory import (
    HostInventory,
    collect_inventory,
    cpu_ranges,
    sysfs_bus_id,
)
from benchkit.hosts.topology import parse_topo_matrix
from tests.nvml_replay import ReplayNvml

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hardware"
LOCAL = Path(__file__).resolve().parent / "fixtures" / "hardware"
H200 = SHARED / "h200x2-nvlink"


def nvml_data(d: Path = H200) -> dict:
    return json.loads((d / "nvml.json").read_text())


def topo_cmd(d: Path = H200):
    def run(argv):
        assert list(argv) == ["nvidia-smi", "topo", "-m"]
        return (d / "topo-m.txt").read_text()

    return run


def no_nvidia_smi(argv):
    raise FileNotFoundError(2, "No such file or directory", argv[0])


def empty_sysfs(tmp_path: Path) -> Path:
    (tmp_path / "sys").mkdir()
    return tmp_path / "sys"


def test_replay_matches_nvidia_smi_query(tmp_path):
    """NVML readings replayed through the inventory agree with nvidia-smi's CSV of the same host."""
    inv = collect_inventory(
        nvml=ReplayNvml(nvml_data()), run_cmd=topo_cmd(), sysfs_root=empty_sysfs(tmp_path)
    )
    with (H200 / "query-gpu.csv").open() as f:
        rows = [
            {k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(f, skipinitialspace=True)
        ]
    assert [g.index for g in inv.gpus] == [int(r["index"]) for r in rows]
    for g, r in zip(inv.gpus, rows, strict=True):
        assert g.uuid == r["uuid"]
        assert g.pci_bus_id == r["pci.bus_id"]
        assert g.name == r["name"]
        assert f"{g.memory_total_mib} MiB" == r["memory.total [MiB]"]
        assert g.compute_capability == r["compute_cap"]
        assert str(g.pcie_gen_current) == r["pcie.link.gen.current"]
        assert str(g.pcie_width_current) == r["pcie.link.width.current"]
        assert inv.driver_version == r["driver_version"]
    assert inv.cuda_driver_version == "13.0"


def test_replay_nvlink_numa_and_missing(tmp_path):
    inv = collect_inventory(
        nvml=ReplayNvml(nvml_data()), run_cmd=topo_cmd(), sysfs_root=empty_sysfs(tmp_path)
    )
    g0 = inv.gpus[0]
    assert g0.nvlink == [True] * 18 and g0.nvlink_active == 18
    assert g0.cpu_affinity == "0-31"
    # NVML says NotSupported and sysfs has nothing: the NUMA node comes from topo -m
    assert (g0.numa_node, g0.numa_source) == (0, "topo")
    assert "numa_node" not in g0.missing
    # the fixture recorded neither power limit nor clocks: None plus a reason, the rest goes on
    assert g0.power_limit_w is None and g0.missing["power_limit_w"] == "not recorded: power_limit_mw"
    assert g0.max_sm_clock_mhz is None and "max_sm_clock_mhz" in g0.missing
    assert inv.topology_source == "nvidia-smi topo -m"
    assert inv.topology.link(0, 1) == "NV18"


def test_numa_from_sysfs(tmp_path):
    sysfs = empty_sysfs(tmp_path)
    dev = sysfs / "bus" / "pci" / "devices" / sysfs_bus_id("00000000:00:07.0")
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    dev0 = sysfs / "bus" / "pci" / "devices" / "0000:00:06.0"
    dev0.mkdir(parents=True)
    (dev0 / "numa_node").write_text("-1\n")  # unknown: fall through to topo -m
    inv = collect_inventory(nvml=ReplayNvml(nvml_data()), run_cmd=topo_cmd(), sysfs_root=sysfs)
    assert (inv.gpus[1].numa_node, inv.gpus[1].numa_source) == (1, "sysfs")
    assert (inv.gpus[0].numa_node, inv.gpus[0].numa_source) == (0, "topo")


def test_numa_from_nvml_when_supported(tmp_path):
    data = nvml_data()
    data["gpus"][1]["numa_node"] = 3
    inv = collect_inventory(nvml=ReplayNvml(data), run_cmd=topo_cmd(), sysfs_root=empty_sysfs(tmp_path))
    assert (inv.gpus[1].numa_node, inv.gpus[1].numa_source) == (3, "nvml")


def test_without_nvidia_smi_topology_comes_from_nvml(tmp_path):
    data = nvml_data()
    for g, other in zip(data["gpus"], ("00000000:00:07.0", "00000000:00:06.0"), strict=True):
        g["nvlink_remote"] = [[k, other] for k in range(18)]
    sysfs = empty_sysfs(tmp_path)
    node0 = sysfs / "devices" / "system" / "node" / "node0"
    node0.mkdir(parents=True)
    (node0 / "cpulist").write_text("0-31\n")
    inv = collect_inventory(nvml=ReplayNvml(data), run_cmd=no_nvidia_smi, sysfs_root=sysfs)
    assert inv.topology_source == "nvml"
    assert inv.topology.link(0, 1) == "NV18"
    assert "FileNotFoundError" in inv.missing["topology_text"]
    # NUMA: not from NVML, sysfs or topo -m, but all affine CPUs sit on node 0
    assert (inv.gpus[0].numa_node, inv.gpus[0].numa_source) == (0, "cpu_affinity")
    assert inv.topology.numa_affinity == {0: 0, 1: 0}


def test_nvml_topology_without_nvlink_uses_common_ancestor(tmp_path):
    data = nvml_data()
    for g in data["gpus"]:
        g["nvlink"] = [[0, "ERR NVMLError_NotSupported(3)"]]
    inv = collect_inventory(nvml=ReplayNvml(data), run_cmd=no_nvidia_smi, sysfs_root=empty_sysfs(tmp_path))
    assert inv.gpus[0].nvlink is None
    assert inv.gpus[0].missing["nvlink"] == "NVMLError_NotSupported(3)"
    assert inv.topology.link(0, 1) == "PHB"  # NVML_TOPOLOGY_HOSTBRIDGE (30) in the fixture
    assert inv.gpus[0].numa_node == -1 and "sysfs" in inv.gpus[0].missing["numa_node"]


def test_bad_topo_text_is_recorded_not_raised(tmp_path):
    inv = collect_inventory(
        nvml=ReplayNvml(nvml_data()), run_cmd=lambda argv: "garbage\n", sysfs_root=empty_sysfs(tmp_path)
    )
    assert "TopologyError" in inv.missing["topology_text"]
    assert inv.topology_source == "nvml"


def test_older_driver_text_is_used_not_replaced_by_nvml(tmp_path):
    """A 2-GPU `topo -m` from a driver that names NIC columns `mlx5_0` (real text, della host):
    it used to be refused as a whole (unknown column) and the matrix rebuilt from NVML."""
    text = (LOCAL / "topo" / "a100x2-della-mlx5-numa-tabs.txt").read_text()
    inv = collect_inventory(nvml=ReplayNvml(nvml_data()), run_cmd=lambda argv: text, sysfs_root=empty_sysfs(tmp_path))
    assert inv.topology_source == "nvidia-smi topo -m" and "topology_text" not in inv.missing
    assert inv.topology.link(0, 1) == "SYS" and inv.topology.nics == ["mlx5_0", "mlx5_1"]
    assert [(g.numa_node, g.numa_source) for g in inv.gpus] == [(0, "topo"), (1, "topo")]
    assert "topology_skipped" not in inv.missing


def test_topo_columns_kept_raw_are_reported_in_missing(tmp_path):
    text = (SHARED / "h200x2-nvlink" / "topo-m.txt").read_text()
    text = text.replace("GPU NUMA ID", "GPU NUMA ID\tFabric Clique").replace("\tN/A\n", "\tN/A\t7\n")
    inv = collect_inventory(nvml=ReplayNvml(nvml_data()), run_cmd=lambda argv: text, sysfs_root=empty_sysfs(tmp_path))
    assert inv.topology_source == "nvidia-smi topo -m" and inv.topology.link(0, 1) == "NV18"
    assert inv.topology.raw_columns == {"Fabric Clique": {0: "7", 1: "7"}}
    assert inv.missing["topology_skipped"] == (
        "nvidia-smi topo -m: line 1: column 'Fabric Clique' not understood; its cells are kept raw"
    )
    assert HostInventory.from_dict(json.loads(json.dumps(inv.to_dict()))).topology == inv.topology


def test_failing_nvidia_smi(tmp_path):
    def fail(argv):
        raise subprocess.CalledProcessError(9, argv)

    inv = collect_inventory(nvml=ReplayNvml(nvml_data()), run_cmd=fail, sysfs_root=empty_sysfs(tmp_path))
    assert "CalledProcessError" in inv.missing["topology_text"]


def test_this_host_without_gpu_is_valid():
    inv = collect_inventory(run_cmd=no_nvidia_smi)
    if inv.gpus:
        pytest.skip("this host has an NVIDIA GPU")
    assert inv.gpus == [] and inv.missing["gpus"]
    assert inv.hostname and inv.memory_total_mib > 0 and inv.cpu_threads >= 1
    assert HostInventory.from_dict(json.loads(json.dumps(inv.to_dict()))) == inv


def test_round_trip_and_fingerprint(tmp_path):
    inv = collect_inventory(
        nvml=ReplayNvml(nvml_data()), run_cmd=topo_cmd(), sysfs_root=empty_sysfs(tmp_path)
    )
    back = HostInventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert back == inv
    fp = inv.fingerprint()
    assert len(fp) == 16 and back.fingerprint() == fp
    other = copy.deepcopy(inv)
    other.hostname = "elsewhere"
    other.gpus[0].uuid = "GPU-ffffffff-0000-0000-0000-000000000000"
    other.gpus[0].memory_used_mib = 9999
    assert other.fingerprint() == fp  # not part of comparability
    other.driver_version = "580.200.01"
    assert other.fingerprint() != fp
    fewer = copy.deepcopy(inv)
    fewer.gpus = fewer.gpus[:1]
    assert fewer.fingerprint() != fp
    relinked = copy.deepcopy(inv)
    relinked.topology.links[(0, 1)] = relinked.topology.links[(1, 0)] = "SYS"
    assert relinked.fingerprint() != fp


def test_nvml_init_failure_is_a_gpu_less_host():
    class Broken:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    inv = collect_inventory(nvml=Broken(), run_cmd=no_nvidia_smi)
    assert inv.gpus == [] and "libnvidia-ml" in inv.missing["gpus"]


def test_helpers():
    assert sysfs_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert cpu_ranges([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"


def test_replay_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "nvml.json"
    bad.write_text('{"gpus": [\n')
    with pytest.raises(ValueError, match=r"nvml.json: line 2: not valid JSON"):
        ReplayNvml.from_file(bad)


DEVICE = LOCAL / "h200x2-device"


def test_device_capture_replays_to_the_live_inventory(tmp_path):
    """Raw NVML readings saved on the H200 machine, replayed here, give the inventory that
    machine computed live from the real NVML (GPU fields; host fields belong to each host)."""
    live = HostInventory.from_dict(json.loads((DEVICE / "inventory.json").read_text()))
    replay = collect_inventory(
        nvml=ReplayNvml.from_file(DEVICE / "nvml.json"),
        run_cmd=topo_cmd(DEVICE),
        sysfs_root=empty_sysfs(tmp_path),
    )
    assert len(replay.gpus) == len(live.gpus) == 2
    for r, g in zip(replay.gpus, live.gpus, strict=True):
        for name in (
            "uuid",
            "pci_bus_id",
            "name",
            "memory_total_mib",
            "compute_capability",
            "pcie_gen_max",
            "pcie_width_max",
            "nvlink",
            "power_limit_w",
            "max_sm_clock_mhz",
            "max_mem_clock_mhz",
            "cpu_affinity",
        ):
            assert getattr(r, name) == getattr(g, name), name
    assert replay.topology == live.topology
    assert replay.driver_version == live.driver_version
    assert replay.fingerprint() == live.fingerprint()


def test_device_capture_without_nvidia_smi_finds_the_nvswitch_links(tmp_path):
    """On the H200 machine every NVLink ends at an NVSwitch (remote bus FFFFFFFF:FF:FF.0); the
    NVML-only rebuild must still give the NV18 that nvidia-smi printed there."""
    data = json.loads((DEVICE / "nvml.json").read_text())
    assert {bus for g in data["gpus"] for _, bus in g["nvlink_remote"]} == {"FFFFFFFF:FF:FF.0"}
    inv = collect_inventory(nvml=ReplayNvml(data), run_cmd=no_nvidia_smi, sysfs_root=empty_sysfs(tmp_path))
    printed = parse_topo_matrix((DEVICE / "topo-m.txt").read_text())
    assert inv.topology_source == "nvml"
    assert inv.topology.links == printed.links
