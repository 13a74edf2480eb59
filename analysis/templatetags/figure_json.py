"""`figure_script`: Django's `json_script` filter, with its escaping done by three str.replace
calls instead of str.translate (which walks a figure of 200 KB character by character: about
10 ms per trend page). Same output (tests/test_history_pages.py checks it against json_script)."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.filter
def figure_script(value: Any, element_id: str) -> SafeString:
    """`<script id="element_id" type="application/json">JSON</script>` with <, > and & in the
    JSON written as \\u003C, \\u003E and \\u0026 (django.utils.html.json_script)."""
    text = (json.dumps(value, cls=DjangoJSONEncoder).replace("&", "\\u0026").replace("<", "\\u003C")
            .replace(">", "\\u003E"))
    return format_html('<script id="{}" type="application/json">{}</script>', element_id, mark_safe(text))
