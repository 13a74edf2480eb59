"""The one escaping function of every TeX draftboard writes: the sweep report
(templates/report/report.tex through analysis.templatetags.report_tex, analysis.report) and the
`export.tex` table (analysis.exports.to_latex: caption, headers and cells). A value from a user (a
sweep name, a method label, a failure message, a host name) is text, never TeX: `\\input{...}`
or `\\immediate\\write18{...}` in a sweep name is typeset as those characters.

`verbatim_lines` keeps lines that go into a `verbatim` environment (the report's command lines)
from ending it early."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

#: An underscore that is a glyph in any document (OT1's \_ is a drawn rule: copied from the PDF
#: it is a space), with no macro of the report's preamble needed (export.tex is a fragment).
UNDERSCORE = r"{\ttfamily\char95}"
_TEX_SPECIAL = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
                "%": r"\%", "_": UNDERSCORE, "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}", '"': "''"}
#: The Unicode the pages print, as LaTeX (anything else non-ASCII is transliterated or '?').
_TEX_UNICODE = {"τ": r"$\tau$", "×": r"$\times$", "★": r"$\star$", "≠": r"$\neq$", "≈": r"$\approx$",
                "÷": r"$\div$", "–": "--", "—": "---", "·": r"$\cdot$", "…": r"\dots{}", "≥": r"$\geq$",
                "≤": r"$\leq$", "±": r"$\pm$", "→": r"$\to$", "μ": r"$\mu$", "µ": r"$\mu$", "°": r"$^\circ$",
                "‘": "`", "’": "'", "“": "``", "”": "''", "−": "-", "\u00a0": "~", "%": r"\%"}
#: What ends a verbatim environment wherever it appears in a line.
_END_VERBATIM = "\\end{verbatim}"


def tex_escape(value: Any) -> str:
    """`value` as LaTeX text that pdflatex (plain ASCII input) typesets as written: the special
    characters escaped (a backslash, braces, `%`, `#`, `&`, `~`, `^`, `_`, `$` are characters,
    never commands, groups or comments), the pages' Unicode as LaTeX (`_TEX_UNICODE`), other
    accented letters without their accent, anything else '?'. HTML line breaks (`<br>`), newlines
    and tabs become spaces; other control characters too. None -> '--'."""
    if value is None:
        return "--"
    text = re.sub(r"<br\s*/?>", " ", str(value))
    out = []
    for ch in text:
        if ch in _TEX_SPECIAL:
            out.append(_TEX_SPECIAL[ch])
        elif ch in _TEX_UNICODE:
            out.append(_TEX_UNICODE[ch])
        elif ord(ch) < 128:
            out.append(ch if ch.isprintable() else " ")
        else:
            plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append("".join(_TEX_SPECIAL.get(c, c) for c in plain) or "?")
    return "".join(out)


def verbatim_lines(lines: list[str]) -> list[str]:
    """`lines` (printable ASCII) made safe inside `\\begin{verbatim}`: a line holding
    `\\end{verbatim}` (which would end the environment there and make the rest TeX) is cut after
    `\\end`, the piece marked with a trailing `\\\\` and the rest on the next line indented by four
    spaces, as analysis.report.wrap_command marks a word cut at the line width."""
    out: list[str] = []
    for line in lines:
        while (i := line.find(_END_VERBATIM)) >= 0:
            out.append(line[:i + 4] + "\\\\")
            line = "    " + line[i + 4:]
        out.append(line)
    return out
