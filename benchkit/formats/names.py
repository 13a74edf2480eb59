"""File-name patterns of result folders: what a result file's name says about its runs.

The users keep one file per configuration (DOMAIN.md: `bench_results/tp1-auto.json`,
`tp1-b15.json`, `tp4-linear.json`, ...). A pattern names the parts with tokens in braces:

| token | matches | meaning |
| --- | --- | --- |
| `{tp}` | digits | TP degree |
| `{method}` | anything but `/` (shortest) | method token (benchkit.methods.parse_method_token) |
| `{concurrency}` | digits | concurrent requests |
| `{output_len}` | digits | output tokens per request |

Everything else in the pattern is literal (`*` matches any run of characters), and the whole
name must match: `tp{tp}-{method}.json` matches `tp4-b15.json` as {tp: "4", method: "b15"}.
"""

from __future__ import annotations

import re

#: token -> the regular expression of its value.
TOKENS: dict[str, str] = {"tp": r"\d+", "method": r"[^/]+?", "concurrency": r"\d+", "output_len": r"\d+"}
_TOKEN = re.compile(r"\{([^{}]*)\}")


class NamePatternError(ValueError):
    """A name pattern with an unknown or repeated token, or none at all."""


class NamePattern:
    """A compiled file-name pattern (see the module docstring). `tokens`: the tokens it has, in order."""

    def __init__(self, pattern: str):
        if len(pattern) > 300:
            raise NamePatternError("longer than 300 characters")
        parts, tokens, last = [], [], 0
        for m in _TOKEN.finditer(pattern):
            name = m.group(1)
            if name not in TOKENS:
                raise NamePatternError(f"unknown token {{{name}}} (known: {', '.join('{' + t + '}' for t in TOKENS)})")
            if name in tokens:
                raise NamePatternError(f"token {{{name}}} appears twice")
            parts.append(self._literal(pattern[last:m.start()]))
            parts.append(f"(?P<{name}>{TOKENS[name]})")
            tokens.append(name)
            last = m.end()
        parts.append(self._literal(pattern[last:]))
        if not tokens:
            raise NamePatternError(f"{pattern!r} has no token (known: {', '.join('{' + t + '}' for t in TOKENS)})")
        self.pattern = pattern
        self.tokens = tuple(tokens)
        self._regex = re.compile("".join(parts))

    @staticmethod
    def _literal(text: str) -> str:
        if "{" in text or "}" in text:
            raise NamePatternError(f"unbalanced brace in {text!r}")
        return ".*".join(re.escape(chunk) for chunk in text.split("*"))

    def match(self, name: str) -> dict[str, str] | None:
        """{token: text} when the whole `name` matches, else None."""
        m = self._regex.fullmatch(name)
        return m.groupdict() if m else None
