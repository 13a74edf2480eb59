"""Parsing `nvidia-smi topo -m` (real and hand-written fixtures) and ranking its links."""

from pathlib import Path

import pytest

from benchkit.hosts.topology import (
    TopologyError,
    TopoMatrix,
    link_quality,
    parse_topo_matrix,
    rank_links,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "hardware"
LOCAL = Path(__file__).resolve().parent / "fixtures" / "hardware"


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
        ("\tGPU0\tFOO\n", r"line 1: unknown header column 'FOO'"),
        ("hello\nworld\n", r"line 1: unknown header column 'hello'"),
        ("\tGPU0\tNUMA Affinity\nGPU0\t X \tzero\n", r"line 2: bad NUMA Affinity 'zero'"),
    ],
)
def test_errors_name_the_line(text, message):
    with pytest.raises(TopologyError, match=message):
        parse_topo_matrix(text)
