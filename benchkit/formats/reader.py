"""Read any supported result source: pick its format (named, or detected from its markers by
benchkit.formats.registry), let the format read it into runs, and check what every import needs
whatever the format: at least one run, at most `MAX_RUNS`, and no run whose every figure is
unknown (a document of another tool forced as this format stops here if its own checks let it
through)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchkit.formats.base import Source
from benchkit.formats.common import ImportedRun
from benchkit.formats.errors import ResultFileError
from benchkit.formats.registry import AUTO, detect, get_format
from benchkit.measure.metrics import METRIC_FIELDS

#: Most runs one source may hold (bounded work: one import is one transaction).
MAX_RUNS = 10_000


@dataclass
class ResultFile:
    """A result source read and validated: `runs` in source order; `sha256` (hex) and
    `size_bytes` of the bytes read (the import's idempotency key, `Source.digest`); `format`:
    the registry name of the format that read it; `tool`: the tool it was recognised as (or the
    forced format's tool)."""

    path: Path
    sha256: str
    size_bytes: int
    runs: list[ImportedRun]
    format: str = ""
    tool: str = ""


def read_result_file(path: str | Path, fmt: str = AUTO) -> ResultFile:
    """Read and validate every run of the result file or folder at `path`.

    `fmt`: a registered format's name (benchkit.formats.registry.FORMATS: "vllm", "sglang", ...)
    or "auto" (`registry.detect`: the source's markers decide; a tie or no match is refused
    naming the candidates or the known formats). A forced format still validates what it
    requires. Raises ResultFileError (`file:line: field: reason`) for an unreadable, malformed,
    impossible or unrecognised source, one without runs or with more than MAX_RUNS, a run whose
    every figure is unknown, or an unknown `fmt`; never returns part of a source. Raises nothing
    else for any content.
    """
    source = Source(path)
    if fmt == AUTO:
        form, recognition = detect(source)
        tool = recognition.tool
    else:
        form = get_format(fmt, source)
        tool = form.tool
    source.begin_read()
    runs = []
    for run in form.read(source):
        if len(runs) == MAX_RUNS:
            raise ResultFileError(source.path, f"more than the {MAX_RUNS} runs one import stores")
        if all(getattr(run.metrics, f.name) is None for f in METRIC_FIELDS):
            reason = f"no measured figure could be read from this {tool} run: every figure is unknown"
            raise run.source.error(None, reason) if run.source else ResultFileError(run.origin, reason)
        runs.append(run)
    if not runs:
        raise ResultFileError(source.path, f"no run in this {source.kind} ({tool})")
    sha256, size_bytes = source.digest()
    return ResultFile(source.path, sha256, size_bytes, runs, form.name, tool)


def load_result_file(path: str | Path, fmt: str = AUTO) -> list[ImportedRun]:
    """The runs of `read_result_file(path, fmt)`, in source order (same errors)."""
    return read_result_file(path, fmt).runs
