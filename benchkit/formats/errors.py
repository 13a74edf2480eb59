"""The one error of the result-file boundary: `ResultFileError`, printed `file:line: field:
reason`. Its own module so that every reader (benchkit.formats.jsontext, the value types of
benchkit.formats.common, each format module) imports it without importing the others."""

from __future__ import annotations

from pathlib import Path


def printable(text: str) -> str:
    """`text` with every non-printable character (NUL, other controls, lone surrogates) written
    as its Python escape, so it can be shown and printed to any terminal."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class ResultFileError(ValueError):
    """A result file cannot be imported. Printed `file:line: field: reason` (line and field
    where known); `path`, `line` (1-based), `field` (dotted key path as the file spells it) and
    `reason` hold the parts, made printable (`printable`: a key may hold a NUL)."""

    def __init__(self, path: str | Path, message: str, line: int | None = None, field: str | None = None):
        self.path = printable(str(path))
        self.line = line
        self.field = None if field is None else printable(field)
        self.reason = message = printable(message)
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"{self.field}: " if self.field else ""
        super().__init__(f"{where}: {what}{message}")
