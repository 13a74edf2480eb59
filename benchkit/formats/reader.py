"""Read any supported result source: pick its format (named, or detected from its markers by
benchkit.formats.registry), let the format read it into runs, and check what every import needs
whatever the format: at least one run, at most `MAX_RUNS`, no run whose every figure is unknown
(a document of another tool forced as this format stops here if its own checks let it through),
every figure within the metric schema's bounds, and the keys kept without a column within
`EXTRA_MAX_BYTES` (`common.bound_extra`). A source refused under a forced format that another
format recognises says so (which tool wrote it, the markers seen, the `--format` to use)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from benchkit.configfile import first_problem
from benchkit.formats.base import ResultFormat, Source
from benchkit.formats.common import ImportedRun, bound_extra, metrics_model
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
        return _read(source, form, tool)
    form = get_format(fmt, source)
    try:
        return _read(source, form, form.tool)
    except ResultFileError as exc:
        raise _named_by_markers(exc, source.path, form) from None


#: Every WindowMetrics field within the schema's bounds (the same check as a stored outcome's).
_Bounded = metrics_model("ImportedWindow", lambda f: f.name, scaled=False)


def _read(source: Source, form: ResultFormat, tool: str) -> ResultFile:
    source.begin_read()
    runs = []
    for run in form.read(source):
        if len(runs) == MAX_RUNS:
            raise ResultFileError(source.path, f"more than the {MAX_RUNS} runs one import stores")
        _check_run(run, tool, form)
        run.source_extra = bound_extra(run.source_extra)
        runs.append(run)
    if not runs:
        raise ResultFileError(source.path, f"no run in this {source.kind} ({tool})")
    sha256, size_bytes = source.digest()
    return ResultFile(source.path, sha256, size_bytes, runs, form.name, tool)


def _check_run(run: ImportedRun, tool: str, form: ResultFormat) -> None:
    """Refuse a run without any figure (naming what the format expected) or with a figure
    outside the schema's bounds (a format's derivation gone wrong on a hostile file)."""
    values = run.metrics.to_dict()
    if all(values[f.name] is None for f in METRIC_FIELDS):
        reason = f"no measured figure could be read from this {tool} run: every figure is unknown" + (
            f" (expected {form.expected})" if form.expected else "")
        raise run.source.error(None, reason) if run.source else ResultFileError(run.origin, reason)
    try:
        _Bounded.model_validate(values)
    except ValidationError as exc:
        p = first_problem(exc, values, _Bounded)
        name = p.loc[0] if p.loc else ""
        raise run.refuse(str(name), f"{p.reason} (as computed from the file)") from None


def _named_by_markers(exc: ResultFileError, path: Path, forced: ResultFormat) -> ResultFileError:
    """`exc` (a refusal under the forced format), saying which tool wrote the source when another
    format recognises it."""
    try:
        other, recognition = detect(Source(path))
    except ResultFileError:
        return exc
    if other.name == forced.name:
        return exc
    hint = (f"; {recognition.tool} wrote this {'folder' if Path(path).is_dir() else 'file'} (saw "
            f"{', '.join(recognition.markers)}), not {forced.tool}: import it with --format {other.name} or auto")
    return ResultFileError(exc.path, exc.reason + hint, exc.line, exc.field)


def load_result_file(path: str | Path, fmt: str = AUTO) -> list[ImportedRun]:
    """The runs of `read_result_file(path, fmt)`, in source order (same errors)."""
    return read_result_file(path, fmt).runs
