"""How every page and text export writes a figure: the number with its unit, or one marker for
"unknown" (issue 19: never `None`, `nan`, `inf` or a unit without its number).

A figure is unknown when it is None (not measured, or not stated by an imported file), not a
finite number (NaN, ±inf), or an empty string. Two markers, one per kind of value:

- a measured figure (tok/s, ms, W, J, a speedup...): UNKNOWN, "—", in HTML inside
  `<span class="unknown" title="why">` (the template tags of analysis/templatetags/fig.py);
- a workload or configuration value an imported file did not state (concurrency, input or
  output length, prompts): NOT_IN_FILE, "not in the file".

Numbers are written by Django's `floatformat` (the same text the templates wrote before), so
`figure_text(182.0, "tok/s", 1)` is "182.0 tok/s". Pure functions, no queries: the template
tags, the figure builders (hover text) and the exports call them.
"""

from __future__ import annotations

import math
from numbers import Number
from typing import Any

from django.template.defaultfilters import floatformat

#: The marker of an unknown measured figure.
UNKNOWN = "—"
#: The marker of a workload or configuration value a result file did not state.
NOT_IN_FILE = "not in the file"
#: Why a figure is unknown, when the page cannot say more (the marker's title).
WHY_UNKNOWN = "unknown: not measured for this run, or not stated by its imported result file"
#: Why, on the page of a run draftboard measured.
WHY_NOT_MEASURED = "unknown: this run did not measure it"
#: Why, on the page of an imported run.
WHY_NOT_IN_FILE = "not in the result file: the tool that wrote it did not state this figure"
#: Why, for a workload value.
WHY_WORKLOAD = "the result file did not state this value (unknown, never counted as 0)"


def is_known(value: Any) -> bool:
    """False for None, "", NaN and ±inf (and a non-numeric string that floatformat cannot
    read is still known: it is written as is); True otherwise."""
    if value is None or value == "":
        return False
    if isinstance(value, Number) and not isinstance(value, bool):
        try:
            return math.isfinite(value)
        except (TypeError, ValueError):  # a Decimal NaN, a complex
            return False
    return True


def number_text(value: Any, digits: int | str | None = None) -> str:
    """A known `value` as text: `floatformat(value, digits)` for a number (digits None: an int
    as is, a float with up to 3 decimals and no trailing zeros), anything else `str(value)`."""
    if isinstance(value, Number) and not isinstance(value, bool):
        if digits is None:  # up to 3 decimals, no trailing zeros: 3.5, 0.125, 1200
            return str(value) if isinstance(value, int) else _trimmed(float(value))
        return floatformat(value, digits)
    return str(value)


def _trimmed(x: float) -> str:
    text = f"{x:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def figure_text(value: Any, unit: str = "", digits: int | str | None = None, unknown: str = UNKNOWN) -> str:
    """Plain text of a figure: "182.0 tok/s" (number, a space, the unit), or `unknown` alone
    (never the unit without its number). A unit starting with "×" or "x" joins the number
    ("6.50×")."""
    if not is_known(value):
        return unknown
    text = number_text(value, digits)
    if not unit:
        return text
    return text + unit if unit[0] in "×x" else f"{text} {unit}"


def workload_text(value: Any, unit: str = "") -> str:
    """Plain text of a workload value: "128 tokens", or NOT_IN_FILE."""
    return figure_text(value, unit, unknown=NOT_IN_FILE)


def stated_text(value: Any, unit: str, what: str) -> str:
    """A workload value in a sentence: "128 output tokens", or "output length not in the file"
    (`what` names the value, since no number carries the unit)."""
    return figure_text(value, unit, unknown=f"{what} {NOT_IN_FILE}")


def lengths_text(input_len: Any, output_len: Any) -> str:
    """ "in/out" of a point ("128/256"), an unknown side written "?" (the page's legend: "?" =
    not in the file); both unknown: NOT_IN_FILE."""
    if not is_known(input_len) and not is_known(output_len):
        return NOT_IN_FILE
    return "/".join(number_text(v) if is_known(v) else "?" for v in (input_len, output_len))


def parse_spec(spec: str) -> tuple[str | None, str]:
    """(digits, unit) of a filter spec "DIGITS UNIT": "1 tok/s" -> ("1", "tok/s"), "2" -> ("2",
    ""), "ms" -> (None, "ms"), "" -> (None, ""). DIGITS is what floatformat takes ("2", "-3")."""
    head, _, rest = (spec or "").strip().partition(" ")
    if head.lstrip("-").isdigit():
        return head, rest.strip()
    return None, (spec or "").strip()
