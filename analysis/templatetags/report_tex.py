"""Template filters of the sweep report's TeX source (templates/report/report.tex): every value
that reaches the TeX file goes through `tex` (analysis.tex.tex_escape, the one escaping of every
TeX draftboard writes), numbers through `num`."""

from __future__ import annotations

from typing import Any

from django import template

from analysis.report import fmt_num
from analysis.tex import tex_escape

register = template.Library()


@register.filter
def tex(value: Any) -> str:
    """`value` as LaTeX text: the ten special characters escaped, the Unicode the pages print
    (τ, ×, ★, ≠, dashes, ...) as LaTeX commands and any other non-ASCII character transliterated
    (pdflatex reads the file as plain ASCII). None -> "--"."""
    return tex_escape(value)


@register.filter
def path(value: Any) -> str:
    """`value` (a file path, a command or any text with long unbroken runs) as LaTeX text, as
    `tex`, with a line-break point after every '/' and ',' so that a long path cannot overrun
    the text width (an overfull box fails the report's log check)."""
    return tex_escape(value).replace("/", "/\\allowbreak{}").replace(",", ",\\allowbreak{}")


@register.filter
def num(value: Any, digits: int = 2) -> str:
    """A number with `digits` decimals ("--" for None); anything else as text."""
    return fmt_num(value, int(digits))


@register.filter
def ids(values: Any, sep: str = ", ") -> str:
    """A list (run ids, TP degrees, concurrency levels) as escaped text joined by `sep` (Django's
    `join` gives a list of numbers back unjoined when autoescape is off)."""
    return sep.join(tex_escape(v) for v in values or [])
