"""YAML files checked by pydantic models, with errors that name the file, the line and the field.

Sweep files (benchkit.sweeps.sweepfile) and engine flags files (benchkit.engines.flags) are read
the same way:

1. `load_yaml(text)` parses YAML with PyYAML's safe loader, keeping the 1-based line of every
   mapping, sequence and key (`LineDict.lines`, `LineList.lines`); a duplicate key is a YAML error.
2. A pydantic v2 model (`StrictModel`: unknown keys forbidden, no type coercion: `"4"` is not
   an int and `1` is not `true`) validates the data. Validators that check several fields raise
   `FieldProblem(loc, reason)` to point at the field they blame.
3. `first_problem(error, data, model)` turns the first pydantic error into a `Problem(line,
   field, reason)`: `field` is the dotted path (`grid.methods[1].tree_budget`), `line` the line
   of that key in the file (of its closest enclosing mapping when the key is missing), `reason` a
   sentence in the file's own terms (`unknown key (allowed: ...)`, `expected an integer, got
   str 'two'`, `must be >= 1, got 0`).

Callers raise their own error class from the Problem as `file:line: field: reason`.

`load_yaml` is bounded (issue 31: a 524-byte alias bomb grew to a MemoryError; a 50 MB file took
400 s): text over MAX_YAML_BYTES is refused before parsing, and YAML anchors and aliases are
refused where they appear (`YamlRefused`, a yaml.YAMLError, so callers report it as they report a
syntax error, with its line).
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class LineDict(dict):
    """dict that remembers the 1-based line of itself (`line`) and of each key (`lines`)."""

    line: int | None = None
    lines: dict[Any, int]


class LineList(list):
    """list that remembers the 1-based line of itself (`line`) and of each item (`lines`)."""

    line: int | None = None
    lines: list[int]


#: Most bytes (UTF-8) of a YAML file `load_yaml` parses: sweep files, engine flags files, the GPU
#: specification file (the largest here is ~12 KB).
MAX_YAML_BYTES = 1024 * 1024


class YamlRefused(yaml.YAMLError):
    """YAML that `load_yaml` does not parse: `line` (1-based, or None) and `problem`."""

    def __init__(self, line: int | None, problem: str):
        super().__init__(problem)
        self.line = line
        self.problem = problem


class _LineLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        """Refuse an alias (a reference to an anchored node: a few lines of them expand to
        billions of values) and an anchor, at its line."""
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise YamlRefused(event.start_mark.line + 1, f"YAML alias *{event.anchor}: anchors and aliases are "
                                                         "not read (write the values out)")
        if getattr(event, "anchor", None) is not None:
            raise YamlRefused(event.start_mark.line + 1, f"YAML anchor &{event.anchor}: anchors and aliases are "
                                                         "not read (write the values out)")
        return super().compose_node(parent, index)


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {key!r}", key_node.start_mark
            ) from None
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(text: str) -> Any:
    """Parse YAML text (safe subset) into LineDict / LineList / scalars. Raises yaml.YAMLError
    (see `yaml_problem`): YamlRefused for text over MAX_YAML_BYTES (checked before parsing) and
    for an anchor or alias."""
    if len(text) > MAX_YAML_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_YAML_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
        raise YamlRefused(None, f"{size:,} bytes: larger than the {MAX_YAML_BYTES:,} bytes a YAML file may have "
                                "(split it)")
    return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_problem(exc: yaml.YAMLError) -> tuple[int | None, str]:
    """(1-based line or None, problem) of a YAML syntax error or a YamlRefused."""
    if isinstance(exc, YamlRefused):
        return exc.line, exc.problem
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return (mark.line + 1 if mark else None), problem


def plain(obj: Any) -> Any:
    """The data without the line-tracking types (plain dicts and lists), for storing."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


class StrictModel(BaseModel):
    """Base of the file models: unknown keys are errors, values are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class FieldProblem(ValueError):
    """Raised by a model validator to blame a field below the model: `loc` (a key, or a tuple
    of keys and list indices, relative to the model) and `reason`."""

    def __init__(self, loc: str | int | tuple[str | int, ...], reason: str):
        super().__init__(reason)
        self.loc = loc if isinstance(loc, tuple) else (loc,)
        self.reason = reason


@dataclass(frozen=True)
class Problem:
    """One located validation error: 1-based `line` (None when the data has no lines), the
    dotted `field` path, the `reason`, and `loc`, the path as a tuple of keys and list indices
    (for callers that locate lines themselves, e.g. JSON result files)."""

    line: int | None
    field: str
    reason: str
    loc: tuple[Any, ...] = ()


def format_field(loc: tuple[Any, ...]) -> str:
    """`("grid", "methods", 1, "tree_budget")` -> `grid.methods[1].tree_budget`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def locate(data: Any, loc: tuple[Any, ...]) -> tuple[int | None, tuple[Any, ...]]:
    """The line of `loc` in `data` and the loc to report. A missing key gets the line where its
    mapping starts; a list index into a scalar (a value that a validator wrapped into a
    one-item list) is dropped; an integer mapping key is reported as a name (`gpus.4`)."""
    line = getattr(data, "line", None)
    missing = object()
    node: Any = data
    shown: list[Any] = []
    for part in loc:
        if isinstance(node, dict) and part in node:
            line, node = getattr(node, "lines", {}).get(part, line), node[part]
            part = str(part)  # an integer mapping key reads `gpus.4`, not `gpus[4]`
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            line, node = (node.lines[part] if isinstance(node, LineList) else line), node[part]
        elif node is not missing and not isinstance(node, dict | list) and isinstance(part, int):
            continue  # a scalar that a validator wrapped into a one-item list
        else:  # a missing key: the line where its mapping starts
            line = getattr(node, "line", None) or line
            node = missing
        shown.append(part)
    return line, tuple(shown)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional; for a union, its first model member (else first member)."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), args[0])
        else:
            return tp


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the value at `loc` (None when it is not a model)."""
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) in (list, dict):
            tp = typing.get_args(tp)[-1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _known(expected: str) -> str:
    return ", ".join(re.findall(r"'([^']*)'", expected)) or expected


def _reason(err: dict[str, Any], loc: tuple[Any, ...], model: type[BaseModel]) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    kind_of = "mapping" if isinstance(value, dict) else "list" if isinstance(value, list) else type(value).__name__
    got = f"{kind_of} {plain(value)!r:.80}"
    if kind == "missing":
        return "missing (required)"
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        allowed = f" (allowed: {', '.join(sorted(parent.model_fields))})" if parent else ""
        return f"unknown key{allowed}"
    if kind == "literal_error":
        noun = str(loc[-3]).rstrip("s") if loc[-1] == "[key]" else str(loc[-1])  # a dict key: "engines" -> engine
        return f"unknown {noun} {value!r} (known: {_known(ctx.get('expected', ''))})"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected an integer, got {got}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {got}"
    if kind == "finite_number":
        return f"must be a finite number, got {value!r}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true/false, got {value!r}"
    if kind == "string_type":
        return f"expected a string, got {got}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {kind_of}"
    if kind == "list_type":
        return f"expected a list, got {got}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}, got {value!r}"
    if kind == "greater_than":
        return f"must be positive, got {value!r}" if ctx["gt"] == 0 else f"must be > {ctx['gt']}, got {value!r}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}, got {value!r}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"longer than {ctx['max_length']} characters (got {len(value)})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return err["msg"]


def first_problem(exc: ValidationError, data: Any, model: type[BaseModel]) -> Problem:
    """The first error of `exc` (raised validating `data` with `model`) as a located Problem."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    problem = (err.get("ctx") or {}).get("error")
    if err["type"] == "value_error" and isinstance(problem, FieldProblem):
        loc += problem.loc
    reason = _reason(err, loc, model)
    line, shown = locate(data, tuple(p for p in loc if p != "[key]"))
    return Problem(line, format_field(shown), reason, shown)
