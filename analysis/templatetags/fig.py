"""Template filters and tag that write every figure of the pages (analysis.display): the number
with its unit, or the unknown marker with a title saying why; never `None`, `nan` or a unit
without its number (issue 19).

    {% load fig %}
    {{ m.output_throughput_tok_s|fig:"1 tok/s" }}     182.0 tok/s  or  <span class="unknown" title="why">—</span>
    {{ run.output_len|stated:"tokens" }}              128 tokens   or  "not in the file" (titled)
    {{ h.output_len|stated:"tokens|output length" }}  128 tokens   or  "output length not in the file"
    {% figure m.duration_s "s" 2 %}                   like |fig, the title from the page's context
    {{ p.input_len|inout:p.output_len }}              128/256      or  ?/256 (an unknown side)

`figure` reads `unknown_why` from the context (the run page sets it: "not in the result file"
for an imported run, "not measured" for one draftboard measured); `why=` overrides it.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from analysis import display

register = template.Library()


def marker(text: str, why: str) -> SafeString:
    """The unknown marker: `<span class="unknown" title="why">text</span>`."""
    return format_html('<span class="unknown" title="{}">{}</span>', why, text)


def render_figure(value: Any, unit: str = "", digits: int | str | None = None, why: str = display.WHY_UNKNOWN,
                  unknown: str = display.UNKNOWN) -> SafeString:
    """HTML of a figure: its text (analysis.display.figure_text), escaped, or the marker."""
    if not display.is_known(value):
        return marker(unknown, why)
    return format_html("{}", display.figure_text(value, unit, digits))


@register.filter
def fig(value: Any, spec: str = "") -> SafeString:
    """`value` with its unit, or "—" titled why it is unknown. `spec`: "DIGITS UNIT" ("1 tok/s",
    "2 ms", "2", "J"; DIGITS as floatformat takes them)."""
    digits, unit = display.parse_spec(spec)
    return render_figure(value, unit, digits)


@register.filter
def stated(value: Any, spec: str = "") -> SafeString:
    """A workload or configuration value (concurrency, lengths, prompts) with its unit, or "not
    in the file" titled why. `spec`: "UNIT" or "UNIT|WHAT": "output tokens|output length" writes
    "128 output tokens" or "output length not in the file"."""
    unit, _, what = spec.partition("|")
    unknown = f"{what.strip()} {display.NOT_IN_FILE}" if what.strip() else display.NOT_IN_FILE
    return render_figure(value, unit.strip(), why=display.WHY_WORKLOAD, unknown=unknown)


@register.filter
def inout(input_len: Any, output_len: Any) -> SafeString:
    """ "in/out" lengths of a point (analysis.display.lengths_text), titled when a side is unknown."""
    text = display.lengths_text(input_len, output_len)
    if display.is_known(input_len) and display.is_known(output_len):
        return format_html("{}", text)
    return marker(text, "? = " + display.WHY_WORKLOAD)


@register.simple_tag(takes_context=True)
def figure(context, value: Any, unit: str = "", digits: int | str | None = None, why: str | None = None,
           unknown: str = display.UNKNOWN) -> SafeString:
    """`{% figure value "unit" digits %}`: like `fig`, with the marker's title from `why`, else
    the context's `unknown_why`, else analysis.display.WHY_UNKNOWN."""
    return render_figure(value, unit, digits, why or context.get("unknown_why") or display.WHY_UNKNOWN, unknown)
