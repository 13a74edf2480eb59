"""Parsing `nvidia-smi topo -m` (real and hand-written fixtures) and ranking its links.

The files under tests/fixtures/hardware/topo/ are real outputs of other hosts and drivers (each
source in the README there); the expected values below were read off each text by hand.
"""

from pathlib import Path

import pytest

from benchkit.hosts.allocation import choose_gpus
from benchkit.hosts.topology import (
    TopologyError,
    TopoMatrix,
    link_quality,
    parse_topo_matrix,
    rank_links,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hardware"
LOCAL = Path(__file__).resolve().parent / "fixtures" / "hardware"
TOPO = LOCAL / "topo"


def read(path: Path) -> str:
    return path.read_text()


def test_h200_real_output_with_ansi_header():
    text = read(SHARED / "h200x2-nvlink" / "topo-m.txt")
    assert "\x1b[4m" in text  # the fixture really carries the escape codes
    topo = parse_topo_matrix(text)
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.link(0, 1) == "NV18" and topo.link(1, 0) == "NV18"
    assert topo.link(0, 0) == "X"
    assert topo.cpu_affinity == {0: "0-31", 1: "0-31"}
    assert topo.numa_affinity == {0: 0, 1: 0}
    assert topo.gpu_numa_id == {}  # N/A on this host
    assert topo.nvlink_islands() == [[0, 1]]
    assert topo.cpus(0) == list(range(32))


def test_pcie8_two_sockets():
    topo = parse_topo_matrix(read(SHARED / "pcie8-2numa" / "topo-m.txt"))
    assert topo.indices == list(range(8))
    assert topo.numa_affinity == {i: (0 if i < 4 else 1) for i in range(8)}
    assert topo.link(0, 3) == "NODE"
    assert topo.link(3, 4) == "SYS"
    assert topo.cpu_affinity[5] == "32-63"
    assert topo.nvlink_islands() == []
    assert topo.group_quality([0, 1, 2, 3]) > topo.group_quality([1, 2, 3, 4])


def test_device_capture_parses():
    path = LOCAL / "h200x2-device" / "topo-m.txt"
    topo = parse_topo_matrix(read(path))
    assert len(topo.gpus) == 2
    assert all(topo.link(i, i) == "X" for i in topo.indices)
    assert topo.link(0, 1) == topo.link(1, 0)
    assert topo.nvlink_islands() == ([[0, 1]] if topo.link(0, 1).startswith("NV") else [])


NIC_TEXT = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV12\tNV12\tSYS\tPIX\tSYS\t0-15,32-47\t0\t\tN/A\n"
    "GPU1\tNV12\t X \tNV12\tSYS\tPXB\tSYS\t0-15,32-47\t0\t\tN/A\n"
    "GPU2\tNV12\tNV12\t X \tSYS\tSYS\tPHB\t16-31,48-63\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tSYS\t X \tSYS\tPIX\t16-31,48-63\t1\t\t9\n"
    "NIC0\tPIX\tPXB\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPHB\tPIX\tSYS\t X \n"
    "\n"
    "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
    "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
)


def test_nic_rows_and_columns():
    topo = parse_topo_matrix(NIC_TEXT)
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.nics == ["NIC0", "NIC1"]
    assert topo.nic_links[(0, "NIC0")] == "PIX"
    assert topo.nic_links[(3, "NIC1")] == "PIX"
    assert (0, 4) not in topo.links  # NIC columns are not GPU links
    assert topo.numa_affinity == {0: 0, 1: 0, 2: 1, 3: 1}
    assert topo.gpu_numa_id == {3: 9}
    assert topo.cpus(2) == list(range(16, 32)) + list(range(48, 64))
    assert topo.nvlink_islands() == [[0, 1, 2]]
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}  # from the NIC Legend block


def test_round_trip_dict():
    topo = parse_topo_matrix(NIC_TEXT)
    assert TopoMatrix.from_dict(topo.to_dict()) == topo


def test_link_ranking():
    assert rank_links(["SYS", "PIX", "NV4", "NODE", "PHB", "NV18", "PXB"]) == [
        "NV18",
        "NV4",
        "PIX",
        "PXB",
        "PHB",
        "NODE",
        "SYS",
    ]
    assert link_quality("SOC") == link_quality("SYS")
    with pytest.raises(TopologyError, match="unknown link code 'FOO'"):
        link_quality("FOO")


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "line 1: empty"),
        (
            "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV2\t0-3\nGPU1\tNV2\t X \t0-3\tjunk\n",
            r"line 3: row 'GPU1' has 2 trailing cells",
        ),
        ("\tGPU0\tGPU1\nGPU0\t X \tBAD\nGPU1\tBAD\t X \n", r"line 2: row 'GPU0', column 'GPU1'.*'BAD'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU2\tSYS\t X \n", r"line 3: row 'GPU2' has no column"),
        ("\tGPU0\tGPU1\nGPU0\t X \tSYS\n", r"line 1: header names \['GPU1'\] but no row"),
        ("\tGPU0\tGPU1\nGPU0\tSYS\t X \nGPU1\tSYS\t X \n", r"line 2: .*"),
        ("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tNODE\t X \n", r"not symmetric: GPU0->GPU1 is 'SYS'"),
        ("\tGPU0\tGPU1\nGPU0\t X \n", r"line 2: row 'GPU0' has 1 link cells, header has 2"),
        ("hello\nworld\n", r"line 1: header names no GPU column \(columns read: \['hello'\]"),
        ("\tGPU0\tCPU Affinity\tGPU1\n", r"line 1: device column 'GPU1' after 'CPU Affinity'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\t X \nGPU0\t X \tNV2\n", r"line 4: row 'GPU0' appears twice"),
        ("\tGPU0\tNUMA Affinity\nGPU0\t X \tzero\n", r"line 2: bad NUMA Affinity 'zero'"),
    ],
)
def test_errors_name_the_line(text, message):
    with pytest.raises(TopologyError, match=message):
        parse_topo_matrix(text)


# --------------------------------------------------------------------------------------------
# Real outputs from other drivers and hosts (tests/fixtures/hardware/topo/README.md)


def topo(name: str):
    return parse_topo_matrix((TOPO / name).read_text())


def test_every_real_variant_has_a_test_and_a_source():
    files = sorted(p.name for p in TOPO.glob("*.txt"))
    readme = (TOPO / "README.md").read_text()
    assert len(files) >= 10
    assert all(f"`{f}`" in readme for f in files)
    tested = Path(__file__).read_text()
    assert all(f'"{f}"' in tested for f in files)


def test_old_driver_mlx4_column_and_soc_codes():
    t = topo("k40x4-mlx4-soc-tabs.txt")
    assert t.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert (t.link(0, 1), t.link(0, 2), t.link(1, 3), t.link(2, 3)) == ("PHB", "SOC", "SOC", "PHB")
    assert t.nics == ["mlx4_0"]
    assert t.nic_links[(0, "mlx4_0")] == "SOC" and t.nic_links[(3, "mlx4_0")] == "PHB"
    assert t.cpu_affinity == {0: "0-5", 1: "0-5", 2: "6-11", 3: "6-11"}
    assert t.numa_affinity == {} and t.skipped == []
    # SOC ranks as SYS: a pair is chosen inside one socket.
    assert choose_gpus(t, 2).indices == [0, 1]


def test_glued_header_is_refused_naming_the_line():
    with pytest.raises(TopologyError, match=r"line 1: header names no GPU column .*'GPU0GPU1GPU2"):
        topo("dgx1-p100-mlx5-soc-glued-header.txt")


def test_driver418_spaces_and_hybrid_cube_mesh():
    t = topo("v100x4-driver418-mlx5-spaces.txt")
    assert t.indices == [0, 1, 2, 3]
    assert (t.link(0, 1), t.link(0, 2), t.link(0, 3), t.link(1, 2), t.link(2, 3)) == (
        "NV2",
        "NV1",
        "NODE",
        "NODE",
        "NV2",
    )
    assert t.nics == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert t.nic_links[(0, "mlx5_0")] == "PIX" and t.nic_links[(2, "mlx5_0")] == "NODE"
    assert t.cpu_affinity == {i: "14-27" for i in range(4)} and t.numa_affinity == {}
    assert t.nvlink_islands() == [[0, 1, 2, 3]]
    assert choose_gpus(t, 2).worst_link == "NV2"


def test_driver455_spaces_with_numa_column():
    t = topo("a100pcie-x2-driver455-mlx5-spaces.txt")
    assert t.gpus == ["GPU0", "GPU1"] and t.link(0, 1) == "NODE"
    assert t.nics == ["mlx5_0"] and t.nic_links == {(0, "mlx5_0"): "NODE", (1, "mlx5_0"): "NODE"}
    assert t.cpu_affinity == {0: "32-63", 1: "32-63"} and t.numa_affinity == {0: 1, 1: 1}


def test_della_two_numa_nodes_and_padded_nic_rows():
    t = topo("a100x2-della-mlx5-numa-tabs.txt")
    assert t.link(0, 1) == "SYS"
    assert t.numa_affinity == {0: 0, 1: 1} and t.cpu_affinity == {0: "0-63", 1: "64-127"}
    assert t.nic_links[(0, "mlx5_0")] == "NODE" and t.nic_links[(1, "mlx5_1")] == "NODE"
    assert t.skipped == [] and t.raw_rows == {}


def test_power9_numa_node_8_and_two_nvlink_pairs():
    t = topo("v100x4-power9-nv3-numa8-tabs.txt")
    assert (t.link(0, 1), t.link(0, 2), t.link(2, 3)) == ("NV3", "SYS", "NV3")
    assert t.numa_affinity == {0: 0, 1: 0, 2: 8, 3: 8}
    assert t.nvlink_islands() == [[0, 1], [2, 3]]
    assert choose_gpus(t, 2, busy={0}).indices == [2, 3]


def test_eight_device_named_nics():
    t = topo("a100x2-nv12-8mlx5-numa-tabs.txt")
    assert t.link(0, 1) == "NV12" and len(t.nics) == 8
    assert t.nic_links[(0, "mlx5_6")] == "PXB" and t.nic_links[(1, "mlx5_0")] == "SYS"
    assert t.numa_affinity == {0: 1, 1: 1} and t.cpus(0)[:2] == [48, 49] and len(t.cpus(1)) == 96


def test_nic_columns_with_gpu_numa_id_padding():
    t = topo("rtx4090x8-nic-gpunumaid-tabs.txt")
    assert len(t.gpus) == 8 and {t.link(i, j) for i in range(8) for j in range(8) if i != j} == {"SYS"}
    assert t.nics == ["NIC0", "NIC1"] and t.nic_links[(6, "NIC0")] == "PHB" and t.nic_links[(0, "NIC1")] == "SYS"
    assert t.numa_affinity == {i: (0 if i < 4 else 1) for i in range(8)}
    assert t.cpu_affinity[5] == "56-111,168-223" and t.gpu_numa_id == {}
    assert t.nic_names == {}  # the paste carries no NIC Legend
    assert choose_gpus(t, 4).numa_nodes == [0, 0, 0, 0]


def test_nvswitch_h100_spaces():
    t = topo("h100x8-nv18-nvswitch-spaces.txt")
    assert len(t.gpus) == 8 and t.link(3, 4) == "NV18" and t.link(0, 7) == "NV18"
    assert t.nvlink_islands() == [list(range(8))]
    assert t.numa_affinity == {i: (0 if i < 4 else 1) for i in range(8)}
    assert t.cpu_affinity[4] == "48-95,144-191" and len(t.cpus(4)) == 96


def test_pcie_pair_phb():
    t = topo("rtx5090x2-phb-gpunumaid-tabs.txt")
    assert t.link(0, 1) == "PHB" and t.numa_affinity == {0: 0, 1: 0} and t.cpu_affinity == {0: "0-63", 1: "0-63"}


def test_five_gpus_one_alone_on_its_node():
    t = topo("geforce-x5-2numa-spaces.txt")
    assert len(t.gpus) == 5
    assert (t.link(0, 1), t.link(1, 2), t.link(1, 3), t.link(3, 4)) == ("SYS", "PHB", "NODE", "PHB")
    assert t.numa_affinity == {0: 1, 1: 0, 2: 0, 3: 0, 4: 0} and t.cpu_affinity[0] == "8-15,24-31"
    assert choose_gpus(t, 2).indices == [1, 2]


def test_single_gpu_numa_not_available():
    t = topo("p4x1-numa-na-tabs.txt")
    assert t.gpus == ["GPU0"] and t.link(0, 0) == "X"
    assert t.cpu_affinity == {0: "0-7"} and t.numa_affinity == {0: -1} and t.gpu_numa_id == {}


# Column kinds no real output has shown yet, written by hand from the real 4090 text above.
UNKNOWN_COLUMNS = (
    "\tGPU0\tGPU1\tBRIDGE0\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\tC2C Mode\n"
    "GPU0\t X \tSYS\tB1\tPHB\t0-55,112-167\t0\t\tN/A\tdisabled\n"
    "GPU1\tSYS\t X \tB2\tNEWCODE\t56-111,168-223\t1\t\t9\tenabled\n"
    "NIC0\tPHB\tNEWCODE\t\t X \n"
    "CPU0\tPHB\tSYS\n"
    "\n"
    "Legend:\n\n  X    = Self\n\n"
    "NIC Legend:\n\n  NIC0: mlx5_bond_0\n"
)


def test_unknown_columns_and_rows_are_kept_raw_not_fatal():
    t = parse_topo_matrix(UNKNOWN_COLUMNS)
    assert t.gpus == ["GPU0", "GPU1"] and t.link(0, 1) == "SYS"
    assert t.numa_affinity == {0: 0, 1: 1} and t.gpu_numa_id == {1: 9}
    assert t.cpu_affinity == {0: "0-55,112-167", 1: "56-111,168-223"}
    assert t.nics == ["NIC0"] and t.nic_links == {(0, "NIC0"): "PHB", (1, "NIC0"): "NEWCODE"}
    assert t.nic_names == {"NIC0": "mlx5_bond_0"}
    assert t.raw_columns == {"BRIDGE0": {0: "B1", 1: "B2"}, "C2C Mode": {0: "disabled", 1: "enabled"}}
    assert t.raw_rows == {"CPU0": "CPU0\tPHB\tSYS"}
    assert t.skipped == [
        "line 1: column 'BRIDGE0' not understood; its cells are kept raw",
        "line 1: column 'C2C Mode' not understood; its cells are kept raw",
        "line 3: GPU1->NIC0 link 'NEWCODE' not understood; kept raw",
        "line 5: row 'CPU0' names no column; kept raw",
    ]
    assert TopoMatrix.from_dict(t.to_dict()) == t


def test_unknown_gpu_link_code_is_still_an_error():
    text = UNKNOWN_COLUMNS.replace("GPU1\tSYS\t X", "GPU1\tNVX\t X").replace("GPU0\t X \tSYS", "GPU0\t X \tNVX")
    with pytest.raises(TopologyError, match=r"line 2: row 'GPU0', column 'GPU1'.*'NVX'"):
        parse_topo_matrix(text)


def test_snapshot_dict_from_before_the_raw_fields_still_loads():
    d = parse_topo_matrix(NIC_TEXT).to_dict()
    for key in ("nic_names", "raw_columns", "raw_rows", "skipped"):
        d.pop(key)
    old = TopoMatrix.from_dict(d)
    assert old.links == parse_topo_matrix(NIC_TEXT).links and old.skipped == [] and old.nic_names == {}
