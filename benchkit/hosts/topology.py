"""Parse the GPU interconnect matrix that `nvidia-smi topo -m` prints, and rank its links.

Input format (NVIDIA's `nvidia-smi topo -m`): a header line of column names, one row per GPU and
per NIC whose first cell is the row's name, a blank line, then a `Legend:` block (and, with NICs
on newer drivers, a `NIC Legend:` block mapping `NIC0: mlx5_0`). Columns, in order:
`GPU0 .. GPUn`, the NIC columns, then `CPU Affinity`, `NUMA Affinity` and, on newer drivers,
`GPU NUMA ID`. Cells are tab separated; text that went through a web page often has its tabs
expanded to spaces, so columns 2+ spaces apart are read too. The header line may carry terminal
escape codes (ANSI underline `ESC[4m ... ESC[0m`); they are stripped. Drivers pad short value
cells with extra tabs (an empty cell after `NUMA Affinity`, or after a short `CPU Affinity`),
so value cells are matched to value columns in order, empty cells ignored.

Variants seen in real outputs (tests/fixtures/hardware/topo/README.md names each source):
- older drivers name NIC columns and rows after the device (`mlx4_0`, `mlx5_0`; seen on R418
  and R455) instead of `NIC#`; older still print no `NUMA Affinity` column and call the
  inter-socket link `SOC` (2017-era outputs);
- POWER hosts report NUMA nodes such as 8; a GPU whose CPUs span nodes prints `N/A`.

Tolerance: a column this parser does not know must not throw away the GPU matrix. A column
that also names a row is a device (a NIC under its device name); any other unknown column is
kept raw (`raw_columns`), an unknown row likewise (`raw_rows`), and `skipped` says what was
not understood, one line each. Only what the GPU matrix itself needs is an error.

Link codes, from the legend, best first:

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
    - `nic_names`: the `NIC Legend` (`{"NIC0": "mlx5_0"}`); empty on drivers that name NIC
      columns after the device, where `nics` already holds `mlx5_0`.
    - `raw_columns[column][i]`: the cell text of a column this parser does not understand, per
      GPU index; `raw_rows[name]`: the text of a row it does not understand.
    - `skipped`: one line per thing not understood (kept raw, not parsed); empty when the whole
      text was understood.
    """

    gpus: list[str]
    links: dict[tuple[int, int], str]
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, int] = field(default_factory=dict)
    gpu_numa_id: dict[int, int] = field(default_factory=dict)
    nics: list[str] = field(default_factory=list)
    nic_links: dict[tuple[int, str], str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)
    raw_columns: dict[str, dict[int, str]] = field(default_factory=dict)
    raw_rows: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

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
            "nic_names": dict(self.nic_names),
            "raw_columns": {c: {str(i): v for i, v in vals.items()} for c, vals in self.raw_columns.items()},
            "raw_rows": dict(self.raw_rows),
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopoMatrix:
        """Build from `to_dict` output (keys added later default to empty, so snapshots stored
        before them still load). Raises KeyError/ValueError on a malformed dict."""
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
            nic_names=dict(data.get("nic_names", {})),
            raw_columns={
                c: {int(i): v for i, v in vals.items()} for c, vals in data.get("raw_columns", {}).items()
            },
            raw_rows=dict(data.get("raw_rows", {})),
            skipped=list(data.get("skipped", [])),
        )


_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S.*?)\s*$")


def _split(line: str) -> list[str]:
    if "\t" in line:
        return line.split("\t")
    # Fallback for text whose tabs were expanded to spaces: columns are 2+ spaces apart.
    return re.split(r" {2,}", line)


def _check_link(code: str, lineno: int, row: str, col: str) -> None:
    """Raise TopologyError unless `code` is a valid cell at (row, col): `X` exactly on the diagonal."""
    if code == "X":
        if col != row:
            raise TopologyError(f"line {lineno}: 'X' (self) off the diagonal at column {col!r}")
        return
    if col == row:
        raise TopologyError(f"line {lineno}: diagonal cell of {row!r} is {code!r}, expected 'X'")
    try:
        link_quality(code)
    except TopologyError as exc:
        raise TopologyError(f"line {lineno}: row {row!r}, column {col!r}: {exc}") from None


def _set_value(topo: TopoMatrix, col: str, i: int, value: str, lineno: int, name: str) -> None:
    """Store one value cell (`CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`) of GPU `i`."""
    if value == "N/A":
        if col == "NUMA Affinity":
            topo.numa_affinity[i] = -1
        return
    if col == "CPU Affinity":
        try:
            parse_cpu_list(value)
        except ValueError:
            raise TopologyError(f"line {lineno}: bad CPU Affinity {value!r} for {name}") from None
        topo.cpu_affinity[i] = value
        return
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


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the text of `nvidia-smi topo -m` into a `TopoMatrix`.

    The header's columns are sorted into three kinds. Link columns run from the first column to
    the last device column: `GPU#`, `NIC#` and any column that also names a row (a NIC under its
    device name, `mlx5_0`); each takes one cell per row. Value columns follow them:
    `CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID` are parsed, any other is kept raw. A link
    column that is not a device (no row, no `GPU#`/`NIC#` name) is kept raw too. Rows of NICs
    repeat the GPU-to-NIC links and are not read; a row naming no column is kept raw. What was
    kept raw is listed in `TopoMatrix.skipped`. The `NIC Legend` block, when present, fills
    `nic_names`.

    Raises TopologyError (naming the 1-based line) when the text is empty, the header names no
    GPU column, a value column stands before a device column, a GPU row names a GPU the header
    lacks or appears twice, a GPU row has fewer link cells than link columns or more value cells
    than value columns, a GPU-to-GPU link code is unknown, the diagonal is not `X` (or `X`
    stands off it), a value cell does not parse, a GPU has no row, or the matrix is not
    symmetric.
    """
    lines = [_ANSI.sub("", raw).rstrip("\r\n") for raw in text.splitlines()]
    header_no = next((n for n, line in enumerate(lines) if line.strip()), None)
    if header_no is None:
        raise TopologyError("line 1: empty `nvidia-smi topo -m` output")
    header_line = header_no + 1
    header = [c.strip() for c in _split(lines[header_no])]
    if header and header[0] == "":
        header = header[1:]
    header = [c for c in header if c]

    # Matrix rows: from the header to the blank line (or the legend) that ends the matrix.
    rows: list[tuple[int, str, list[str]]] = []  # (line number, row name, cells after the name)
    for n in range(header_no + 1, len(lines)):
        line = lines[n]
        if not line.strip() or line.strip().startswith("Legend"):
            break
        cells = _split(line)
        rows.append((n + 1, cells[0].strip(), [c.strip() for c in cells[1:]]))
    row_names = {name for _, name, _ in rows}

    def is_device(col: str) -> bool:
        return bool(_DEVICE.match(col)) or col in row_names

    device_pos = [k for k, col in enumerate(header) if is_device(col)]
    n_link = device_pos[-1] + 1 if device_pos else 0
    link_cols, value_cols = header[:n_link], header[n_link:]
    misplaced = [c for c in link_cols if c in TRAILING_COLUMNS]
    if misplaced:
        after = link_cols[link_cols.index(misplaced[0]) + 1 :]
        device = next(c for c in after if is_device(c))
        raise TopologyError(f"line {header_line}: device column {device!r} after {misplaced[0]!r}")
    gpus = [c for c in link_cols if c.startswith("GPU") and _DEVICE.match(c)]
    if not gpus:
        raise TopologyError(
            f"line {header_line}: header names no GPU column (columns read: {header}; a header whose "
            "tabs were lost runs names together, e.g. 'GPU0GPU1')"
        )
    devices = [c for c in link_cols if is_device(c)]
    nics = [c for c in devices if c not in gpus]
    gpu_index = {g: int(g[3:]) for g in gpus}

    topo = TopoMatrix(gpus=gpus, links={}, nics=nics)
    for col in header:
        if not is_device(col) and col not in TRAILING_COLUMNS:
            topo.raw_columns[col] = {}
            topo.skipped.append(f"line {header_line}: column {col!r} not understood; its cells are kept raw")

    rows_seen: set[str] = set()
    for lineno, name, cells in rows:
        if name not in gpu_index:
            if _DEVICE.match(name) and name.startswith("GPU"):
                raise TopologyError(f"line {lineno}: row {name!r} has no column in the header")
            if name not in devices:
                topo.raw_rows[name] = lines[lineno - 1]
                topo.skipped.append(f"line {lineno}: row {name!r} names no column; kept raw")
            continue  # NIC rows repeat the GPU->NIC links
        if name in rows_seen:
            raise TopologyError(f"line {lineno}: row {name!r} appears twice")
        rows_seen.add(name)
        link_cells = cells[:n_link]
        if len(link_cells) != n_link:
            raise TopologyError(f"line {lineno}: row {name!r} has {len(link_cells)} link cells, header has {n_link}")
        i = gpu_index[name]
        for col, code in zip(link_cols, link_cells, strict=True):
            if col in gpu_index:
                _check_link(code, lineno, name, col)
                topo.links[(i, gpu_index[col])] = code
            elif col in nics:
                if code == "X" or col == name:
                    _check_link(code, lineno, name, col)
                if code not in PCIE_QUALITY and not _NV.match(code):
                    topo.skipped.append(f"line {lineno}: {name}->{col} link {code!r} not understood; kept raw")
                topo.nic_links[(i, col)] = code
            else:
                topo.raw_columns[col][i] = code
        values = [c for c in cells[n_link:] if c]
        if len(values) > len(value_cols):
            raise TopologyError(
                f"line {lineno}: row {name!r} has {len(values)} trailing cells {values}, header names {value_cols}"
            )
        for col, value in zip(value_cols, values, strict=False):  # values may be shorter
            if col in TRAILING_COLUMNS:
                _set_value(topo, col, i, value, lineno, name)
            else:
                topo.raw_columns[col][i] = value
    missing = [g for g in gpus if g not in rows_seen]
    if missing:
        raise TopologyError(f"line {header_line}: header names {missing} but no row follows for them")
    for (i, j), code in topo.links.items():
        if topo.links.get((j, i)) != code:
            raise TopologyError(
                f"matrix not symmetric: GPU{i}->GPU{j} is {code!r} but GPU{j}->GPU{i} is "
                f"{topo.links.get((j, i))!r} (rows GPU{i} and GPU{j})"
            )
    in_legend = False
    for line in lines:
        if line.strip() == "NIC Legend:":
            in_legend = True
        elif in_legend and (m := _NIC_LEGEND.match(line)):
            topo.nic_names[m.group(1)] = m.group(2)
    return topo


def rank_links(codes: list[str]) -> list[str]:
    """Sort link codes best-connected first (NV# by link count, then PIX > PXB > PHB > NODE > SYS)."""
    return sorted(codes, key=link_quality, reverse=True)
