"""The result formats draftboard reads: one line per format module (see benchkit.formats.base for
what a format module provides). Detection (`detect`), the importer
(benchkit.formats.reader.read_result_file) and the `import_results --format` choices
(`format_choices`) are derived from `FORMATS`, read at call time.

To add a format: write its module (a `ResultFormat` subclass and an instance `FORMAT`) and add
`module.FORMAT` to the tuple below.
"""

from __future__ import annotations

from benchkit.formats import aiperf, genai_bench, guidellm, inference_perf, sglang_bench, vllm_bench, vllm_sweep
from benchkit.formats.base import Recognition, ResultFormat, Source
from benchkit.formats.errors import ResultFileError

#: name -> format, in the order detection asks them and listings show them.
FORMATS: dict[str, ResultFormat] = {f.name: f for f in (
    vllm_bench.FORMAT,
    sglang_bench.FORMAT,
    aiperf.FORMAT,
    guidellm.FORMAT,
    genai_bench.FORMAT,
    inference_perf.FORMAT,
    vllm_sweep.FORMAT,
)}

#: The `fmt` value that lets the source's markers decide.
AUTO = "auto"


def format_choices() -> list[str]:
    """`auto` and every registered format's name (the `--format` choices)."""
    return [AUTO, *FORMATS]


def known_formats(kind: str | None = None) -> str:
    """The registered formats (those that take a `kind` of path, "file" or "folder", when given)
    in one line for messages: `name (tool: what it reads, ...); ...`."""
    return "; ".join(f.hint() for f in FORMATS.values() if kind in (None, f.takes))


def get_format(name: str, source: Source) -> ResultFormat:
    """The registered format called `name`, checked against the kind of `source` (a file format
    refuses a folder and the reverse). Raises ResultFileError naming the known formats."""
    form = FORMATS.get(name)
    if form is None:
        raise ResultFileError(source.path, f"unknown format {name!r}; expected one of {', '.join(format_choices())}")
    if form.takes != source.kind:
        raise ResultFileError(source.path, f"format {name!r} ({form.tool}) reads a {form.takes}, and this is a "
                                           f"{source.kind}")
    return form


def detect(source: Source) -> tuple[ResultFormat, Recognition]:
    """The format whose markers `source` carries, and what it recognised. Every registered format
    that takes this kind of path is asked; the highest score wins.

    Raises ResultFileError: when two formats tie ("cannot tell whether A or B wrote this file",
    with the markers each saw); when none recognises the source, the first error a format met
    reading it (invalid JSON, say) or else "no known result format recognised this file", naming
    what the source holds and every known format with what it reads."""
    found: list[tuple[ResultFormat, Recognition]] = []
    first_error: ResultFileError | None = None
    for form in FORMATS.values():
        if form.takes != source.kind:
            continue
        try:
            recognition = form.recognise(source)
        except ResultFileError as exc:
            first_error = first_error or exc
            continue
        if recognition is not None and recognition.score > 0:
            found.append((form, recognition))
    if not found:
        if first_error is not None:
            raise first_error
        holds = source.describe()
        known = known_formats(source.kind)
        advice = (f"known formats: {known}. If it is one of these, name it: --format NAME on the command line "
                  "(import_results), fmt=NAME in Python" if known
                  else f"no known format reads a {source.kind} (they read a "
                       f"{' or a '.join(sorted({f.takes for f in FORMATS.values()}))}: {', '.join(FORMATS)})")
        raise ResultFileError(source.path, f"no known result format recognised this {source.kind}"
                                           f"{f' ({holds})' if holds else ''}; {advice}")
    best = max(r.score for _, r in found)
    top = [(f, r) for f, r in found if r.score == best]
    if len(top) > 1:
        tools = " or ".join(f"{r.tool} (saw {', '.join(r.markers)})" for _, r in top)
        names = " or ".join(f"--format {f.name} (fmt={f.name!r} in Python)" for f, _ in top)
        raise ResultFileError(source.path, f"cannot tell whether {tools} wrote this {source.kind}; pass {names}")
    return top[0]
