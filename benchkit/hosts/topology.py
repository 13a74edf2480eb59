"""Parse the GPU interconnect matrix that `nvidia-smi topo -m` prints, and rank its links.

Input format (NVIDIA's `nvidia-smi topo -m`, driver 5xx): a header line of tab-separated column
names (`GPU0 .. GPUn`, optional `NIC0 .. NICm`, then `CPU Affinity`, `NUMA Affinity` and, on
newer drivers, `GPU NUMA ID`), one row per GPU and per NIC whose first cell is the row's name,
a blank line, then a `Legend:` block (and, with NICs, a `NIC Legend:` block). The header line
may carry terminal escape codes (ANSI underline `ESC[4m ... ESC[0m`); they are stripped. Real
drivers print an empty cell between `NUMA Affinity` and `GPU NUMA ID`; empty trailing cells
are ignored. Link codes, from the legend, best first:

    NV#   a bonded set of # NVLinks (more links is better)
    PIX   at most a single PCIe bridge
    PXB   multiple PCIe bridges, not the host bridge
    PHB   a PCIe host bridge (typically the CPU)
    NODE  PCIe plus the interconnect between host bridges within one NUMA node
    SYS   PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI); `SOC` on old drivers
    X     self

Errors raise `TopologyError` naming the 1-based line number of the offending line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^(GPU|NIC)(\d+)$")
_NV = re.compile(r"^NV(\d+)$")

#: Quality of the PCIe / socket link codes, higher is better. NVLink (`NV#`) ranks above all of
#: them (see `link_quality`).
PCIE_QUALITY = {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1, "SOC": 1}
#: Trailing (non-device) columns `topo -m` may print, in order.
TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


class TopologyError(ValueError):
    """A `topo -m` text (or a link code) that cannot be understood; the message names the line."""


def link_quality(link: str) -> int:
    """Rank one link code: higher is better-connected.

    `NV#` -> 100 + # (so NV18 > NV12 > any PCIe path), PIX 5, PXB 4, PHB 3, NODE 2, SYS/SOC 1
    (order from the `nvidia-smi topo -m` legend). Raises TopologyError for `X` or an unknown
    code.
    """
    code = link.strip()
    m = _NV.match(code)
    if m:
        return 100 + int(m.group(1))
    if code in PCIE_QUALITY:
        return PCIE_QUALITY[code]
    raise TopologyError(f"unknown link code {link!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)")


def is_nvlink(link: str) -> bool:
    """True for an `NV#` link code."""
    return bool(_NV.match(link.strip()))


def parse_cpu_list(text: str) -> list[int]:
    """Expand a CPU list such as `0-31,64-95` into CPU numbers. Raises ValueError."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return cpus


@dataclass
class TopoMatrix:
    """The parsed `nvidia-smi topo -m` matrix.

    - `gpus`: GPU column names in order (`["GPU0", "GPU1"]`); GPU `i` is index `i` (NVML order).
    - `links[(i, j)]`: link code between GPU indices i and j (`"NV18"`, `"SYS"`, ...; `"X"` on
      the diagonal); both (i, j) and (j, i) are present.
    - `nics`: NIC column names; `nic_links[(gpu_index, nic_name)]`: GPU-to-NIC link code.
    - `cpu_affinity[i]`: the CPU list text (`"0-31"`), absent where `N/A`.
    - `numa_affinity[i]`: NUMA node of GPU i's CPUs; -1 where `N/A` or several nodes.
    - `gpu_numa_id[i]`: the GPU's own NUMA id (CPU-less GPU memory nodes, e.g. Grace Hopper),
      absent where `N/A`.
    """

    gpus: list[str]
    links: dict[tuple[int, int], str]
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, int] = field(default_factory=dict)
    gpu_numa_id: dict[int, int] = field(default_factory=dict)
    nics: list[str] = field(default_factory=list)
    nic_links: dict[tuple[int, str], str] = field(default_factory=dict)

    @property
    def indices(self) -> list[int]:
        """GPU indices, ascending."""
        return [int(_DEVICE.match(g).group(2)) for g in self.gpus]

    def link(self, i: int, j: int) -> str:
        """Link code between GPU indices i and j. Raises KeyError for an unknown index."""
        return self.links[(i, j)]

    def cpus(self, i: int) -> list[int]:
        """CPU numbers GPU i is affine to (empty when unknown)."""
        text = self.cpu_affinity.get(i)
        return parse_cpu_list(text) if text else []

    def nvlink_islands(self) -> list[list[int]]:
        """GPUs joined by NVLink, as connected components (each sorted, ordered by first index).

        Only GPUs with at least one `NV#` link appear; a host without NVLink has no islands.
        Shape: list of lists of GPU indices, e.g. `[[0, 1]]` for two NV18-joined GPUs.
        """
        idx = self.indices
        adj: dict[int, set[int]] = {i: set() for i in idx}
        for (i, j), code in self.links.items():
            if i != j and is_nvlink(code):
                adj[i].add(j)
                adj[j].add(i)
        seen: set[int] = set()
        islands: list[list[int]] = []
        for start in idx:
            if start in seen or not adj[start]:
                continue
            stack, comp = [start], set()
            while stack:
                node = stack.pop()
                if node in comp:
                    continue
                comp.add(node)
                stack.extend(adj[node] - comp)
            seen |= comp
            islands.append(sorted(comp))
        return islands

    def group_quality(self, group: list[int] | tuple[int, ...]) -> tuple[int, int]:
        """(worst link quality, sum of link qualities) over all pairs of `group` (GPU indices).

        A single GPU scores (1000, 0): nothing to cross. Higher tuples are better-connected.
        """
        pairs = [(a, b) for k, a in enumerate(group) for b in group[k + 1 :]]
        if not pairs:
            return (1000, 0)
        q = [link_quality(self.links[p]) for p in pairs]
        return (min(q), sum(q))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuple keys become `"i,j"` / `"i,NIC0"` strings); inverse of from_dict."""
        return {
            "gpus": list(self.gpus),
            "links": {f"{i},{j}": v for (i, j), v in sorted(self.links.items())},
            "cpu_affinity": {str(k): v for k, v in self.cpu_affinity.items()},
            "numa_affinity": {str(k): v for k, v in self.numa_affinity.items()},
            "gpu_numa_id": {str(k): v for k, v in self.gpu_numa_id.items()},
            "nics": list(self.nics),
            "nic_links": {f"{i},{n}": v for (i, n), v in sorted(self.nic_links.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopoMatrix:
        """Build from `to_dict` output. Raises KeyError/ValueError on a malformed dict."""
        links = {}
        for key, v in data["links"].items():
            a, b = key.split(",")
            links[(int(a), int(b))] = v
        nic_links = {}
        for key, v in data.get("nic_links", {}).items():
            a, b = key.split(",")
            nic_links[(int(a), b)] = v
        return cls(
            gpus=list(data["gpus"]),
            links=links,
            cpu_affinity={int(k): v for k, v in data.get("cpu_affinity", {}).items()},
            numa_affinity={int(k): int(v) for k, v in data.get("numa_affinity", {}).items()},
            gpu_numa_id={int(k): int(v) for k, v in data.get("gpu_numa_id", {}).items()},
            nics=list(data.get("nics", [])),
            nic_links=nic_links,
        )


def _split(line: str) -> list[str]:
    if "\t" in line:
        return line.split("\t")
    # Fallback for text whose tabs were expanded to spaces: columns are 2+ spaces apart.
    return re.split(r" {2,}", line)


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the text of `nvidia-smi topo -m` into a `TopoMatrix`.

    Raises TopologyError (naming the 1-based line) when there is no header, a row names a
    device the header lacks, a row has the wrong number of link cells, a link code is unknown,
    the diagonal is not `X`, the matrix is not symmetric, or a GPU has no row.
    """
    lines = [_ANSI.sub("", raw).rstrip("\r\n") for raw in text.splitlines()]
    header_no = next((n for n, line in enumerate(lines) if line.strip()), None)
    if header_no is None:
        raise TopologyError("line 1: empty `nvidia-smi topo -m` output")
    header = [c.strip() for c in _split(lines[header_no])]
    if header and header[0] == "":
        header = header[1:]
    devices: list[str] = []
    trailing: list[str] = []
    for col in header:
        if not col:
            continue
        if _DEVICE.match(col):
            if trailing:
                raise TopologyError(f"line {header_no + 1}: device column {col!r} after {trailing[-1]!r}")
            devices.append(col)
        elif col in TRAILING_COLUMNS:
            trailing.append(col)
        else:
            raise TopologyError(f"line {header_no + 1}: unknown header column {col!r}")
    gpus = [d for d in devices if d.startswith("GPU")]
    if not gpus:
        raise TopologyError(f"line {header_no + 1}: header names no GPU column: {lines[header_no]!r}")
    nics = [d for d in devices if d.startswith("NIC")]
    gpu_index = {g: int(g[3:]) for g in gpus}

    topo = TopoMatrix(gpus=gpus, links={}, nics=nics)
    rows_seen: set[str] = set()
    for n in range(header_no + 1, len(lines)):
        line = lines[n]
        lineno = n + 1
        if not line.strip():
            break  # the blank line before the legend ends the matrix
        if line.strip().startswith("Legend"):
            break
        cells = _split(line)
        name = cells[0].strip()
        if not _DEVICE.match(name):
            raise TopologyError(f"line {lineno}: row name {name!r} is not GPU# or NIC#")
        if name not in devices:
            raise TopologyError(f"line {lineno}: row {name!r} has no column in the header")
        if name in rows_seen:
            raise TopologyError(f"line {lineno}: row {name!r} appears twice")
        rows_seen.add(name)
        link_cells = [c.strip() for c in cells[1 : 1 + len(devices)]]
        if len(link_cells) != len(devices):
            raise TopologyError(
                f"line {lineno}: row {name!r} has {len(link_cells)} link cells, header has {len(devices)}"
            )
        rest = [c.strip() for c in cells[1 + len(devices) :] if c.strip()]
        for col, code in zip(devices, link_cells, strict=True):
            if code != "X":
                try:
                    link_quality(code)
                except TopologyError as exc:
                    raise TopologyError(f"line {lineno}: row {name!r}, column {col!r}: {exc}") from None
            elif col != name:
                raise TopologyError(f"line {lineno}: 'X' (self) off the diagonal at column {col!r}")
            if col == name and code != "X":
                raise TopologyError(f"line {lineno}: diagonal cell of {name!r} is {code!r}, expected 'X'")
        if name.startswith("NIC"):
            continue  # NIC rows repeat the GPU->NIC links and carry no affinity
        i = gpu_index[name]
        for col, code in zip(devices, link_cells, strict=True):
            if col.startswith("GPU"):
                topo.links[(i, gpu_index[col])] = code
            else:
                topo.nic_links[(i, col)] = code
        if len(rest) > len(trailing):
            raise TopologyError(
                f"line {lineno}: row {name!r} has {len(rest)} trailing cells {rest}, header names {trailing}"
            )
        for col, value in zip(trailing, rest, strict=False):  # rest may be shorter
            if value == "N/A":
                if col == "NUMA Affinity":
                    topo.numa_affinity[i] = -1
                continue
            if col == "CPU Affinity":
                try:
                    parse_cpu_list(value)
                except ValueError:
                    raise TopologyError(f"line {lineno}: bad CPU Affinity {value!r} for {name}") from None
                topo.cpu_affinity[i] = value
            else:
                try:
                    node = int(value)
                except ValueError:
                    if col == "NUMA Affinity" and re.fullmatch(r"[\d,\- ]+", value):
                        node = -1  # spans several nodes
                    else:
                        raise TopologyError(f"line {lineno}: bad {col} {value!r} for {name}") from None
                if col == "NUMA Affinity":
                    topo.numa_affinity[i] = node
                else:
                    topo.gpu_numa_id[i] = node
    missing = [g for g in gpus if g not in rows_seen]
    if missing:
        raise TopologyError(f"line {header_no + 1}: header names {missing} but no row follows for them")
    for (i, j), code in topo.links.items():
        if topo.links.get((j, i)) != code:
            raise TopologyError(
                f"matrix not symmetric: GPU{i}->GPU{j} is {code!r} but GPU{j}->GPU{i} is "
                f"{topo.links.get((j, i))!r} (rows GPU{i} and GPU{j})"
            )
    return topo


def rank_links(codes: list[str]) -> list[str]:
    """Sort link codes best-connected first (NV# by link count, then PIX > PXB > PHB > NODE > SYS)."""
    return sorted(codes, key=link_quality, reverse=True)
