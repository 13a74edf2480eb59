"""The engine flags file: how (engine, engine build, method, k, tree budget) becomes command-line
flags, kept as data in `benchkit/engines/engine_flags.yaml` (its header documents the layout and
the source of every flag). A user flags file with the same layout is merged on top, so a new
fork or pull-request build needs no code change. `load_flags` reads, validates and merges.

The layout is the pydantic model `FlagsFile` (unknown keys are errors; errors read
`file:line: field: reason`, benchkit.configfile). What a method needs (a drafter, a tree budget,
prefix caching off) is not here: it is a fact of the method, in benchkit.methods, the same for
every build; a flags file that still sets `needs_drafter`, `needs_budget` or `prefix_caching` on a
method is refused with that explanation.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from benchkit.configfile import FieldProblem, StrictModel, first_problem, load_yaml, plain, yaml_problem
from benchkit.engines.catalog import LaunchedEngineName
from benchkit.methods import MethodName

DEFAULT_FLAGS_FILE = Path(__file__).with_name("engine_flags.yaml")
PLACEHOLDERS = ("model", "drafter", "port", "tp", "k", "k_plus_1", "tree_budget")
PLACEHOLDER_RE = re.compile(r"\{([a-z_0-9]+)\}")
#: Keys older flags files carried per method; they are facts of the method (benchkit.methods).
_METHOD_TABLE_KEYS = ("needs_drafter", "needs_budget", "prefix_caching")


class EngineConfigError(ValueError):
    """A flags file is malformed, or a ServerConfig cannot be turned into a command line for its
    engine (unknown engine or build, method the build does not define, drafter or tree budget
    missing, ...). The message names the file, line and key, or the ServerConfig field."""


def _template(text: str) -> str:
    for name in PLACEHOLDER_RE.findall(text):
        if name not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{name}}} (known: {', '.join(PLACEHOLDERS)})")
    return text


def _arg(item: Any) -> Any:
    """A method argv element: a template, or a list of templates (an optional group)."""
    if isinstance(item, str):
        return _template(item)
    if isinstance(item, list) and all(isinstance(t, str) for t in item):
        return [_template(t) for t in item]
    raise ValueError(f"expected a string or a list of strings (an optional group), got {item!r}")


def _flag(text: str) -> str:
    if not text.startswith("-"):
        raise ValueError(f"expected a flag such as '--x', got {text!r}")
    return text


Template = Annotated[str, AfterValidator(_template)]
Arg = Annotated[Any, AfterValidator(_arg)]
Flag = Annotated[str, AfterValidator(_flag)]
#: ServerConfig fields (and the run's seed) an engine maps to a flag under `options`.
OptionField = Literal["dtype", "max_model_len", "load_format", "served_model_name", "seed"]


class MethodFlags(StrictModel):
    """How one method is spelled on one engine build (a `methods.NAME` entry).

    `args` argv templates (a nested list is an optional group, left out when one of its
    placeholders has no value); `speculative_config` JSON-encoded into `--speculative-config`
    (vLLM); `default_k` the k used when the run gives none; `k_from_block_size` k defaults to the
    drafter config.json `block_size` - 1 (DFlash)."""

    args: list[Arg] = Field(default_factory=list)
    speculative_config: dict[str, Any] | None = None
    default_k: Annotated[int, Field(ge=1)] | None = None
    k_from_block_size: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_method_facts(cls, data: Any) -> Any:
        for key in _METHOD_TABLE_KEYS:
            if isinstance(data, dict) and key in data:
                raise FieldProblem(key, "a property of the decoding method, kept in the method table "
                                        "(benchkit/methods.py), not of an engine build: remove it")
        return data

    @field_validator("speculative_config")
    @classmethod
    def _config_templates(cls, config: dict[str, Any] | None) -> dict[str, Any] | None:
        for key, val in (config or {}).items():
            if isinstance(val, str):
                try:
                    _template(val)
                except ValueError as exc:
                    raise FieldProblem(key, str(exc)) from None
        return config


class EngineFlags(StrictModel):
    """One engine's flags (`engines.vllm`, `engines.sglang`): `launch` argv templates after the
    python executable, `options` ServerConfig field -> flag, `prefix_caching_on` / `_off` literal
    flags, `methods` method name -> MethodFlags (None: defined, no flags)."""

    launch: list[Template] | None = None
    options: dict[OptionField, Flag] | None = None
    prefix_caching_on: list[str] | None = None
    prefix_caching_off: list[str] | None = None
    methods: dict[MethodName, MethodFlags | None] | None = None


class BuildFlags(EngineFlags):
    """An engine build (`builds.NAME`): the keys of EngineFlags, which override its engine's, plus
    the `engine` it is a build of."""

    engine: LaunchedEngineName


class FlagsFile(StrictModel):
    """A whole flags file: `engines` and `builds`."""

    engines: dict[LaunchedEngineName, EngineFlags] = Field(default_factory=dict)
    builds: dict[str, BuildFlags] = Field(default_factory=dict)


def validate_flags(data: Any, source: str) -> dict[str, Any]:
    """Check a parsed flags document (FlagsFile) and return it as plain dicts holding only the
    keys it sets (what merging needs), with `engines` and `builds` present. Raises
    EngineConfigError as `source:line: field: reason`."""
    try:
        FlagsFile.model_validate({} if data is None else data)
    except ValidationError as exc:
        p = first_problem(exc, data, FlagsFile)
        where = f"{source}:{p.line}" if p.line else source
        raise EngineConfigError(f"{where}: {p.field}: {p.reason}" if p.field else f"{where}: {p.reason}") from None
    doc = plain(data) or {}
    return {"engines": dict(doc.get("engines") or {}), "builds": dict(doc.get("builds") or {})}


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineConfigError(f"{path}: cannot read flags file: {exc}") from exc
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise EngineConfigError(f"{path}:{line}: invalid YAML: {problem}" if line else
                                f"{path}: invalid YAML: {problem}") from None


def merge_block(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` (an engine or build block) merged over `base`: its keys replace ours, except that
    `options` and `methods` entries replace ours one by one (a method entry wholesale)."""
    out = copy.deepcopy(base)
    for key, val in over.items():
        if key in ("methods", "options"):
            out.setdefault(key, {}).update(copy.deepcopy(val or {}))
        else:
            out[key] = copy.deepcopy(val)
    return out


def load_flags(flags_file: str | Path | None = None) -> dict[str, Any]:
    """The shipped engine_flags.yaml, with `flags_file` (same layout) merged on top, as plain
    dicts: {"engines": {name: block}, "builds": {name: block}}.

    Merge rule: per engine or build, keys replace ours; `options` entries and `methods`
    entries replace ours one by one (a method entry wholesale). Raises EngineConfigError.
    """
    flags = validate_flags(_read_yaml(DEFAULT_FLAGS_FILE), str(DEFAULT_FLAGS_FILE))
    if flags_file is not None:
        path = Path(flags_file)
        user = validate_flags(_read_yaml(path), str(path))
        for section in ("engines", "builds"):
            for name, block in user[section].items():
                flags[section][name] = merge_block(flags[section].get(name, {}), block)
    return flags
