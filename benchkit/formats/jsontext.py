"""A result file's JSON text, read safely: bounded, valid Unicode, and able to say on which line a
key stands.

`read_json_objects(path)` reads one JSON object (vLLM's `--save-result`, also pretty-printed) or
JSON lines (SGLang's output, vLLM's `--append-result`) and refuses, with `ResultFileError`
naming the file and line, what Python's `json` module would turn into a traceback or what a
database would refuse later:

- a file over `MAX_FILE_BYTES`, not UTF-8, or empty;
- nesting deeper than `MAX_DEPTH` brackets (`json.loads` of 100 000 nested brackets raises
  RecursionError: the decoder's RecursionError is turned into this refusal, and every parsed
  object's depth is bounded while its strings are checked);
- invalid JSON, a number too long for Python's int conversion (over 4300 digits, a ValueError
  from `json.loads`), a duplicate key in one object (`json` would keep the last silently), a
  top level that is not an object;
- a NUL character or a lone UTF-16 surrogate (`"\\ud800"`, legal JSON escape, not valid
  Unicode) in any key or string, except under the key paths a format never stores
  (`UNSTORED_PATHS`, plus the `skip_text` paths its reader passes: GuideLLM's per-request
  texts). PostgreSQL refuses NUL in text and jsonb; a lone surrogate cannot be encoded as UTF-8.

`read_yaml_object(path)` reads a YAML document (GuideLLM's `benchmarks.yaml`) the same way:
parsed with libyaml when PyYAML has it, JSON data only (text keys; dates become ISO text), no
anchors or aliases (a few lines of aliases expand to billions of values), no duplicate keys;
its `JsonObject` finds a key's line in the document's node tree, composed again only when an
error needs it.

Each object comes back as a `JsonObject`, which locates a key path on its line
(`JsonObject.line_of`): JSON lines objects stand on one line each, and in a pretty-printed
object the line of a nested key is found from the text's bracket structure (strings blanked
out, depth counted with numpy; built only when an error needs a line), so errors read
`file:line: field: reason` for both layouts.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchkit.configfile import yaml_problem
from benchkit.formats.errors import ResultFileError

#: Largest result file read (bytes). A `vllm bench serve --save-detailed` file of 10 000
#: requests with 1024-token generated texts is about 80 MB.
MAX_FILE_BYTES = 256 * 1024 * 1024
#: Deepest bracket nesting accepted. Real files nest at most 4 levels (SGLang's server_info).
MAX_DEPTH = 32
#: Key paths whose values are dropped on import (not measurements, large) and so not checked for
#: storable text: a path is a tuple of keys, "*" matching any key or list index.
UNSTORED_PATHS: tuple[tuple[str, ...], ...] = (("generated_texts",),)

# A JSON string token: quote, then non-quote non-backslash characters or escapes, then quote. A
# raw newline ends it (invalid JSON anyway), so a broken string cannot swallow later lines.
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_COLON = re.compile(r"\s*:")


class _Structure:
    """The bracket structure of a JSON text: `blanked` is the text with every string's content
    replaced by spaces (same length, so offsets agree), `pos` the offsets of the brackets outside
    strings and `depth` the nesting depth after each of them."""

    def __init__(self, text: str):
        self.blanked = _STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', text)
        # outside strings JSON is ASCII; anything else becomes '?' (one byte per character)
        raw = np.frombuffer(self.blanked.encode("ascii", "replace"), dtype=np.uint8)
        opens = (raw == ord("[")) | (raw == ord("{"))
        self.pos = np.flatnonzero(opens | (raw == ord("]")) | (raw == ord("}")))
        self.depth = np.cumsum(np.where(opens[self.pos], 1, -1), dtype=np.int64)

    def first_deeper_than(self, limit: int) -> int | None:
        """Offset of the first bracket that opens level `limit + 1`, None when none does."""
        over = np.flatnonzero(self.depth > limit)
        return int(self.pos[over[0]]) if over.size else None

    def depth_at(self, offset: int) -> int:
        """Nesting depth at `offset` (brackets before it)."""
        k = int(np.searchsorted(self.pos, offset))
        return int(self.depth[k - 1]) if k else 0

    def end_of_level(self, offset: int, level: int) -> int | None:
        """Offset just past the first bracket after `offset` that closes back to `level`."""
        k = int(np.searchsorted(self.pos, offset))
        hits = np.flatnonzero(self.depth[k:] == level)
        return int(self.pos[k + hits[0]]) + 1 if hits.size else None


def line_at(text: str, offset: int) -> int:
    """1-based line of `offset` in `text`."""
    return text.count("\n", 0, offset) + 1


@dataclass
class JsonObject:
    """One JSON object of a result file. `data`: the parsed object; `path`: the file; `line`:
    1-based line where the object starts; `one_line`: the object stands on that one line (JSON
    lines), so every key is on `line`."""

    data: dict[str, Any]
    path: str
    line: int
    one_line: bool
    _text: str = field(default="", repr=False)
    _structure: _Structure | None = field(default=None, repr=False)

    def line_of(self, loc: tuple[Any, ...]) -> int:
        """Line of the key path `loc` (keys and list indices, as pydantic reports them): the line
        of the deepest key found (list indices and missing keys stop the search)."""
        if self.one_line or not self._text or not loc:
            return self.line
        if self._structure is None:
            self._structure = _Structure(self._text)
        text, st = self._text, self._structure
        start, stop, line = 0, len(text), self.line
        for level, part in enumerate(loc, start=1):
            if not isinstance(part, str):
                break
            needle = json.dumps(part)
            i = text.find(needle, start, stop)
            while i != -1 and not (st.blanked[i] == '"' and st.depth_at(i) == level
                                   and _COLON.match(st.blanked, i + len(needle))):
                i = text.find(needle, i + 1, stop)
            if i == -1:
                break
            line = self.line + line_at(text, i) - 1
            start, stop = i + len(needle), st.end_of_level(i, level) or stop
        return line

    def error(self, loc: tuple[Any, ...] | str | None, reason: str) -> ResultFileError:
        """A ResultFileError for the field at `loc` (a key path, one key, or None for the object)."""
        if loc is None:
            return ResultFileError(self.path, reason, self.line)
        loc = (loc,) if isinstance(loc, str) else loc
        return ResultFileError(self.path, reason, self.line_of(loc), _dotted(loc))


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored (NUL character, lone surrogate), or None."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which a database cannot store"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"contains a lone surrogate ({value[exc.start]!a}), not valid Unicode"
    return None


_NUMBERS = frozenset({int, float})
TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels of brackets (result files nest at most a few)"


def _skipped(loc: tuple[Any, ...], skip: tuple[tuple[str, ...], ...]) -> bool:
    return any(len(p) == len(loc) and all(a == "*" or a == b for a, b in zip(p, loc, strict=True)) for p in skip)


def find_bad_text(data: Any, skip_text: tuple[tuple[str, ...], ...] = ()) -> tuple[tuple[Any, ...], str] | None:
    """(key path, reason) of the first container nested deeper than MAX_DEPTH, or key or string
    in `data` that `text_problem` refuses; None when all are fine. Values at UNSTORED_PATHS and
    `skip_text` (key paths, "*" any key or index) are skipped: never stored, so never checked.
    Iterative (no recursion), linear in the size of `data`."""
    skip = UNSTORED_PATHS + tuple(skip_text)
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value)
            if problem:
                return loc, problem
        elif isinstance(value, (dict, list)) and len(loc) >= MAX_DEPTH:
            return loc, TOO_DEEP
        elif isinstance(value, dict):
            for key, item in value.items():
                problem = text_problem(key)
                if problem:
                    return loc + (key,), f"key {problem}"
                if not _skipped(loc + (key,), skip):
                    stack.append((loc + (key,), item))
        elif isinstance(value, list):
            if set(map(type, value)) <= _NUMBERS:  # per-request lists: millions of numbers
                continue
            stack.extend((loc + (i,), item) for i, item in enumerate(value) if not _skipped(loc + (i,), skip))
    return None


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _loads(text: str, path: Path, first_line: int) -> Any:
    """json.loads with every failure as a ResultFileError at its line (offset by `first_line`)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise _decode_error(text, path, exc, first_line) from None
    except _DuplicateKey as exc:
        raise ResultFileError(path, "duplicate key in one object (which value counts is not defined)",
                              first_line, exc.key) from None
    except ValueError:  # Python's int conversion limit (sys.get_int_max_str_digits)
        raise _too_long_number(text, path, first_line) from None
    except RecursionError:
        raise _too_deep(text, path, first_line) from None


def _decode_error(text: str, path: Path, exc: json.JSONDecodeError, first_line: int) -> ResultFileError:
    """The refusal of invalid JSON at its line; a text that ends before its value does (the
    decoder ran off the end, or a string is never closed) is called truncated, with what it
    ends inside (a string, an object, a list)."""
    end = len(text.rstrip())
    unclosed = exc.msg.startswith("Unterminated string") and "\n" not in text[exc.pos:end]
    if exc.pos >= end or unclosed:
        inside = "a string" if unclosed else _innermost_open(text[:end])
        where = f" (ends inside {inside})" if inside else ""
        return ResultFileError(path, f"truncated{where}: the text stops before its JSON value is "
                                     "complete (copied or written only in part?)", first_line + line_at(text, end) - 1)
    return ResultFileError(path, f"not valid JSON: {exc.msg} (column {exc.colno})", first_line + exc.lineno - 1)


def _innermost_open(text: str) -> str | None:
    """'an object' or 'a list': the innermost bracket `text` leaves open (strings ignored); None
    when none is open."""
    stack: list[str] = []
    for ch in _STRING.sub('""', text):
        if ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return ({"{": "an object", "[": "a list"}[stack[-1]]) if stack else None


def _too_long_number(text: str, path: Path, first_line: int) -> ResultFileError:
    """The refusal of an integer longer than Python converts (sys.get_int_max_str_digits()
    digits, 4300 by default; the ValueError json raises), at the line of the first such number."""
    limit = sys.get_int_max_str_digits()
    m = re.search(rf"\d{{{limit + 1},}}", _Structure(text).blanked) if limit else None
    line = first_line + line_at(text, m.start()) - 1 if m else first_line
    digits = f"{len(m.group())} digits" if m else f"over {limit} digits"
    return ResultFileError(path, f"a number too long to read: an integer of {digits} (at most {limit} are read; "
                                 "no measured figure is that long)", line)


def _too_deep(text: str, path: Path, first_line: int) -> ResultFileError:
    """The refusal of a text the JSON decoder could not descend (RecursionError), at the line of
    its first bracket deeper than MAX_DEPTH."""
    offset = _Structure(text).first_deeper_than(MAX_DEPTH)
    line = first_line + line_at(text, offset) - 1 if offset is not None else first_line
    return ResultFileError(path, TOO_DEEP, line)


def _object(data: Any, path: Path, line: int, one_line: bool, text: str = "",
            skip_text: tuple[tuple[str, ...], ...] = (), kind: type[JsonObject] = JsonObject) -> JsonObject:
    if not isinstance(data, dict):
        raise ResultFileError(path, f"expected a JSON object per run, got a {type(data).__name__}", line)
    obj = kind(data, str(path), line, one_line, text)
    bad = find_bad_text(data, skip_text)
    if bad:
        loc, reason = bad
        raise obj.error((loc[:1] or None) if reason == TOO_DEEP else loc, reason)  # the key holding the depth
    return obj


def read_file_bytes(path: Path) -> bytes:
    """The bytes of the result file at `path`; ResultFileError when it cannot be read or is over
    MAX_FILE_BYTES."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ResultFileError(path, f"{size} bytes: larger than the {MAX_FILE_BYTES} bytes a result file may have")
        return path.read_bytes()
    except OSError as exc:
        raise ResultFileError(path, f"cannot read: {exc.strerror or exc}") from None


@dataclass
class JsonFile:
    """A result file read: its objects, and the sha256 (hex) and size of its bytes."""

    path: Path
    sha256: str
    size_bytes: int
    objects: list[JsonObject]


def _text_of(path: Path) -> tuple[bytes, str]:
    raw = read_file_bytes(path)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ResultFileError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise ResultFileError(path, "the file is empty")
    return raw, text


def read_json_objects(path: str | Path, skip_text: tuple[tuple[str, ...], ...] = ()) -> JsonFile:
    """Read the JSON object(s) of a result file (see the module docstring for what is refused;
    `skip_text`: key paths whose text is never stored, so not checked).

    A whole-file object (one line or pretty-printed) comes back alone; otherwise every non-empty
    line must be one object (JSON lines). Raises ResultFileError naming the file and line;
    never returns part of a file.
    """
    path = Path(path)
    raw, text = _text_of(path)
    sha256 = hashlib.sha256(raw).hexdigest()
    start = len(text) - len(text.lstrip())
    first_line = line_at(text, start)
    try:
        first, end = json.JSONDecoder(object_pairs_hook=_no_duplicates).raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _decode_error(text, path, exc, 1) from None
    except _DuplicateKey as exc:
        raise ResultFileError(path, "duplicate key in one object (which value counts is not defined)",
                              first_line, exc.key) from None
    except ValueError:  # Python's int conversion limit (sys.get_int_max_str_digits)
        raise _too_long_number(text, path, first_line) from None
    except RecursionError:
        raise _too_deep(text, path, 1) from None
    if not text[end:].strip():  # one object, on one line or pretty-printed
        one_line = "\n" not in text[start:end].strip()
        return JsonFile(path, sha256, len(raw), [_object(first, path, first_line, one_line, text, skip_text)])
    objects = []  # JSON lines: one object per non-empty line
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            objects.append(_object(_loads(line, path, number), path, number, True, skip_text=skip_text))
    return JsonFile(path, sha256, len(raw), objects)


# ---------------------------------------------------------------------------------------------
# YAML documents

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: Most YAML nodes one document may hold (bounded work; GuideLLM's 0.5 MB report has ~60 000).
MAX_YAML_NODES = 5_000_000


@dataclass
class YamlObject(JsonObject):
    """A JsonObject read from YAML: a key's line comes from the document's node tree (composed
    again by libyaml, with each node's position), only when an error needs it."""

    def line_of(self, loc: tuple[Any, ...]) -> int:
        if not self._text or not loc:
            return self.line
        try:
            node = yaml.compose(self._text, Loader=_YamlLoader)
        except yaml.YAMLError:
            return self.line
        line = self.line
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                pair = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
                if pair is None:
                    break
                line, node = pair[0].start_mark.line + 1, pair[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line


def _check_nodes(path: Path, root: yaml.Node) -> None:
    """Refuse aliases (a node reached twice), duplicate keys and more than MAX_YAML_NODES nodes."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            raise ResultFileError(path, "YAML anchors and aliases are not read (a result file has none)",
                                  node.start_mark.line + 1)
        seen.add(id(node))
        if len(seen) > MAX_YAML_NODES:
            raise ResultFileError(path, f"more than {MAX_YAML_NODES} YAML nodes: larger than a result file")
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        raise ResultFileError(path, "duplicate key in one mapping (which value counts is not "
                                                    "defined)", key.start_mark.line + 1, key.value)
                    keys.add(key.value)
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _json_data(path: Path, data: Any) -> Any:
    """`data` (YAML-constructed) as JSON data: text keys only, dates as ISO text; anything else
    (binary, sets, ordered pairs) refused."""
    out = {"": data}
    stack: list[tuple[Any, Any, tuple[Any, ...]]] = [(out, "", ())]
    while stack:
        parent, key, loc = stack.pop()
        value = parent[key]
        if isinstance(value, dict):
            for k in list(value):
                if not isinstance(k, str):
                    raise ResultFileError(path, f"a YAML mapping key that is not text ({type(k).__name__} {k!r:.40})",
                                          None, _dotted(loc) or None)
                stack.append((value, k, loc + (k,)))
        elif isinstance(value, list):
            stack.extend((value, i, loc + (i,)) for i in range(len(value)))
        elif isinstance(value, (datetime.date, datetime.datetime)):
            parent[key] = value.isoformat()
        elif value is not None and not isinstance(value, (str, int, float, bool)):
            raise ResultFileError(path, f"a YAML value that is not JSON data ({type(value).__name__})", None,
                                  _dotted(loc) or None)
    return out[""]


def read_yaml_object(path: str | Path, skip_text: tuple[tuple[str, ...], ...] = ()) -> JsonFile:
    """Read a YAML result document (one mapping) as a JsonFile of one object, refusing what
    `read_json_objects` refuses plus YAML's own hazards (module docstring). Raises
    ResultFileError naming the file and line."""
    path = Path(path)
    raw, text = _text_of(path)
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ResultFileError(path, "the file is empty")
        _check_nodes(path, node)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise ResultFileError(path, f"not valid YAML: {problem}", line) from None
    except RecursionError:
        raise ResultFileError(path, TOO_DEEP) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ResultFileError(path, f"expected a YAML mapping, got a {type(data).__name__}", 1)
    data = _json_data(path, data)
    obj = _object(data, path, 1, False, text, skip_text, kind=YamlObject)
    return JsonFile(path, hashlib.sha256(raw).hexdigest(), len(raw), [obj])
