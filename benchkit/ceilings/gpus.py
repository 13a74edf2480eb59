"""GPU specifications for decode-step ceilings: memory bandwidth and dense peak FLOP/s per dtype,
every figure with its source, kept as data in `benchkit/ceilings/gpu_specs.yaml` (its header
documents the layout, the units and where the figures come from; docs/CEILINGS.md).

The file's rows are the seed data of an admin-editable table (one row per GPU model, like GPU
prices): `load_gpu_specs()` returns them as `GpuSpecRow`s, flat fields with the unit in every
name; `find_gpu_spec(name, rows)` picks the row of one NVML GPU name, or says why there is none
(an unknown or ambiguous name gives no ceiling, never a guess).

Errors in the file read `file:line: field: reason` (benchkit.configfile).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from benchkit.configfile import FieldProblem, StrictModel, first_problem, load_yaml, yaml_problem

DEFAULT_GPU_SPECS_FILE = Path(__file__).with_name("gpu_specs.yaml")
#: Input dtypes a dense peak is given for (tensor cores for bf16/fp16/fp8, CUDA cores for fp32).
Dtype = Literal["bf16", "fp16", "fp8", "fp32"]
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp32")
TERA = 1e12

_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Text = Annotated[str, Field(min_length=1, max_length=600)]


class GpuSpecFileError(ValueError):
    """The GPU specification file cannot be read or is malformed; the message names the file, the
    line and the field (`file:line: field: reason`)."""


class GpuSpecRow(StrictModel):
    """One GPU model's figures (one row of the future admin table; the YAML file's layout).

    Units: `memory_bandwidth_tb_s` in TB/s (1e12 bytes/s), `dense_*_tflop_s` in TFLOP/s (1e12
    FLOP/s), dense (no 2:4 sparsity). A dtype the GPU has no peak for is None, never 0.
    """

    gpu_name: Annotated[str, Field(min_length=1, max_length=200)]
    aliases: list[Annotated[str, Field(min_length=1, max_length=200)]] = []
    memory_bandwidth_tb_s: _Positive
    memory_bandwidth_source: _Text
    dense_bf16_tflop_s: _Positive | None = None
    dense_fp16_tflop_s: _Positive | None = None
    dense_fp8_tflop_s: _Positive | None = None
    dense_fp32_tflop_s: _Positive | None = None
    flops_source: _Text
    as_of: _Text
    note: Annotated[str, Field(max_length=600)] = ""

    @property
    def memory_bandwidth_bytes_s(self) -> float:
        """Peak memory bandwidth in bytes/s."""
        return self.memory_bandwidth_tb_s * TERA

    def peak_flop_s(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for inputs of `dtype` (one of DTYPES); None where the GPU has none.
        Raises ValueError for a dtype outside DTYPES."""
        if dtype not in DTYPES:
            raise ValueError(f"unknown compute dtype {dtype!r} (known: {', '.join(DTYPES)})")
        tflop_s = getattr(self, f"dense_{dtype}_tflop_s")
        return None if tflop_s is None else tflop_s * TERA

    @model_validator(mode="after")
    def _some_peak(self) -> GpuSpecRow:
        if all(getattr(self, f"dense_{d}_tflop_s") is None for d in DTYPES):
            raise FieldProblem("dense_bf16_tflop_s", "a GPU needs at least one dense peak FLOP/s figure")
        return self


class GpuSpecFile(StrictModel):
    """The layout of gpu_specs.yaml: `gpus:` a list of GpuSpecRow, names unique (aliases too)."""

    gpus: Annotated[list[GpuSpecRow], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> GpuSpecFile:
        seen: dict[str, str] = {}
        for i, row in enumerate(self.gpus):
            for j, name in enumerate([row.gpu_name, *row.aliases]):
                key = normalise_gpu_name(name)
                if key in seen:
                    where = ("gpus", i, "gpu_name") if j == 0 else ("gpus", i, "aliases", j - 1)
                    raise FieldProblem(where, f"{name!r} is already the name of {seen[key]!r}")
                seen[key] = row.gpu_name
        return self


def normalise_gpu_name(name: str) -> str:
    """The form names are matched in: case-folded, runs of whitespace as one space, without a
    leading "NVIDIA " ("NVIDIA  H200" and "nvidia h200" and "H200" match)."""
    text = re.sub(r"\s+", " ", name).strip().casefold()
    return text[len("nvidia "):] if text.startswith("nvidia ") else text


def load_gpu_specs(path: str | Path | None = None) -> list[GpuSpecRow]:
    """The rows of a GPU specification file (default: the shipped gpu_specs.yaml), validated.
    Raises GpuSpecFileError as `file:line: field: reason`. Parsed once per file version (path,
    mtime, size): the sweep page asks on every request and YAML parsing took about 25 ms."""
    source = Path(path) if path is not None else DEFAULT_GPU_SPECS_FILE
    try:
        st = source.stat()
    except OSError as exc:
        raise GpuSpecFileError(f"{source}: cannot read GPU specification file: {exc}") from exc
    return list(_parse_gpu_specs(source, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=16)
def _parse_gpu_specs(source: Path, mtime_ns: int, size: int) -> tuple[GpuSpecRow, ...]:
    """load_gpu_specs' parse of one version of `source` (the key's mtime and size)."""
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise GpuSpecFileError(f"{source}: cannot read GPU specification file: {exc}") from exc
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise GpuSpecFileError(f"{source}:{line}: invalid YAML: {problem}" if line else
                               f"{source}: invalid YAML: {problem}") from None
    try:
        parsed = GpuSpecFile.model_validate(data)
    except ValidationError as exc:
        p = first_problem(exc, data, GpuSpecFile)
        where = f"{source}:{p.line}" if p.line else str(source)
        raise GpuSpecFileError(f"{where}: {p.field}: {p.reason}" if p.field else f"{where}: {p.reason}") from None
    return tuple(parsed.gpus)


@dataclass(frozen=True)
class GpuLookup:
    """The answer for one GPU name: `spec` (None when there is no ceiling) and `note`, which says
    why there is none ("" when there is one)."""

    query: str
    spec: GpuSpecRow | None
    note: str = ""


def find_gpu_spec(name: str | None, rows: Sequence[GpuSpecRow] | None = None) -> GpuLookup:
    """The row for an NVML GPU name (exact match after `normalise_gpu_name`, aliases included).

    No row -> `spec` None with a note: no name recorded, a name that several rows begin with
    (e.g. "RTX PRO 6000": Server, Workstation and Max-Q editions differ), or an unknown name.
    `rows` default to the shipped file's."""
    query = name or ""
    if not query.strip():
        return GpuLookup(query, None, "no GPU model recorded: no ceiling")
    rows = load_gpu_specs() if rows is None else rows
    key = normalise_gpu_name(query)
    for row in rows:
        if key in {normalise_gpu_name(n) for n in (row.gpu_name, *row.aliases)}:
            return GpuLookup(query, row)
    partial = [row.gpu_name for row in rows if normalise_gpu_name(row.gpu_name).startswith(key)]
    if partial:
        return GpuLookup(query, None, f"GPU name {query!r} is ambiguous (could be {', '.join(partial)}): "
                                      "no ceiling; record the full NVML name")
    return GpuLookup(query, None, f"GPU model {query!r} has no specification (bandwidth, peak FLOP/s) in the "
                                  "GPU table: no ceiling")
