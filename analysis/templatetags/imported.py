"""Template filters for imported runs' source keys (templates/analysis/_imported_source.html)."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()

#: Characters of a kept value shown on the run page (the whole value stays in the database and the admin).
PREVIEW_CHARS = 160


@register.filter
def json_preview(value: Any) -> str:
    """A kept source value as compact JSON, cut to PREVIEW_CHARS characters (with "…" when cut)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"
