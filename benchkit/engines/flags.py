"""The engine flags file: how (engine, engine build, method, k, tree budget) becomes command-line
flags, kept as data in `benchkit/engines/engine_flags.yaml` (its header documents the layout and
the source of every flag). A user flags file with the same layout is merged on top, so a new
fork or pull-request build needs no code change. `load_flags` reads, validates and merges."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from benchkit.engines.catalog import LAUNCHED_ENGINES
from benchkit.methods import METHODS

DEFAULT_FLAGS_FILE = Path(__file__).with_name("engine_flags.yaml")
PLACEHOLDERS = ("model", "drafter", "port", "tp", "k", "k_plus_1", "tree_budget")
PLACEHOLDER_RE = re.compile(r"\{([a-z_0-9]+)\}")
_METHOD_KEYS = {
    "args",
    "speculative_config",
    "default_k",
    "k_from_block_size",
}
#: Keys older flags files carried per method; they are facts of the method (benchkit.methods).
_METHOD_TABLE_KEYS = {"needs_drafter", "needs_budget", "prefix_caching"}
_ENGINE_KEYS = {"launch", "options", "prefix_caching_on", "prefix_caching_off", "methods"}
_BUILD_KEYS = _ENGINE_KEYS | {"engine"}
_OPTION_FIELDS = {"dtype", "max_model_len", "load_format", "served_model_name", "seed"}


class EngineConfigError(ValueError):
    """A flags file is malformed, or a ServerConfig cannot be turned into a command line for its
    engine (unknown engine or build, method the build does not define, drafter or tree budget
    missing, ...). The message names the file and key, or the ServerConfig field."""


# --------------------------------------------------------------------------------------------
# flags file loading and validation


def _check_str_list(value: Any, where: str, allow_groups: bool = False) -> None:
    if not isinstance(value, list):
        raise EngineConfigError(f"{where}: expected a list of strings, got {type(value).__name__}")
    for i, item in enumerate(value):
        if allow_groups and isinstance(item, list):
            _check_str_list(item, f"{where}[{i}]")
        elif not isinstance(item, str):
            raise EngineConfigError(f"{where}[{i}]: expected a string, got {type(item).__name__} {item!r}")
        else:
            for name in PLACEHOLDER_RE.findall(item):
                if name not in PLACEHOLDERS:
                    raise EngineConfigError(
                        f"{where}[{i}]: unknown placeholder {{{name}}} (known: {', '.join(PLACEHOLDERS)})"
                    )


def _check_method(entry: Any, where: str) -> None:
    if entry is None:
        return
    if not isinstance(entry, dict):
        raise EngineConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    for key in sorted(_METHOD_TABLE_KEYS & set(entry)):
        raise EngineConfigError(f"{where}.{key}: a property of the decoding method, kept in the method table "
                                "(benchkit/methods.py), not of an engine build: remove it")
    unknown = set(entry) - _METHOD_KEYS
    if unknown:
        raise EngineConfigError(
            f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_METHOD_KEYS)})"
        )
    if "args" in entry:
        _check_str_list(entry["args"], f"{where}.args", allow_groups=True)
    if "speculative_config" in entry:
        sc = entry["speculative_config"]
        if not isinstance(sc, dict):
            raise EngineConfigError(f"{where}.speculative_config: expected a mapping")
        for key, val in sc.items():
            if isinstance(val, str):
                for name in PLACEHOLDER_RE.findall(val):
                    if name not in PLACEHOLDERS:
                        raise EngineConfigError(
                            f"{where}.speculative_config.{key}: unknown placeholder {{{name}}}"
                        )
    for key in ("k_from_block_size",):
        if key in entry and not isinstance(entry[key], bool):
            raise EngineConfigError(f"{where}.{key}: expected true/false, got {entry[key]!r}")
    if "default_k" in entry and (
        not isinstance(entry["default_k"], int)
        or isinstance(entry["default_k"], bool)
        or entry["default_k"] < 1
    ):
        raise EngineConfigError(f"{where}.default_k: expected a positive integer, got {entry['default_k']!r}")


def _check_engine_block(block: Any, where: str, allowed: set[str]) -> None:
    if not isinstance(block, dict):
        raise EngineConfigError(f"{where}: expected a mapping, got {type(block).__name__}")
    unknown = set(block) - allowed
    if unknown:
        raise EngineConfigError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(allowed)})")
    for key in ("launch", "prefix_caching_on", "prefix_caching_off"):
        if key in block:
            _check_str_list(block[key], f"{where}.{key}")
    if "options" in block:
        opts = block["options"]
        if not isinstance(opts, dict):
            raise EngineConfigError(f"{where}.options: expected a mapping")
        for key, flag in opts.items():
            if key not in _OPTION_FIELDS:
                raise EngineConfigError(
                    f"{where}.options.{key}: unknown field (allowed: {sorted(_OPTION_FIELDS)})"
                )
            if not isinstance(flag, str) or not flag.startswith("-"):
                raise EngineConfigError(f"{where}.options.{key}: expected a flag such as '--x', got {flag!r}")
    if "methods" in block:
        methods = block["methods"]
        if not isinstance(methods, dict):
            raise EngineConfigError(f"{where}.methods: expected a mapping")
        for name, entry in methods.items():
            if name not in METHODS:
                raise EngineConfigError(
                    f"{where}.methods.{name}: unknown method (known: {', '.join(METHODS)})"
                )
            _check_method(entry, f"{where}.methods.{name}")


def validate_flags(data: Any, source: str) -> dict[str, Any]:
    """Check a parsed flags document (see engine_flags.yaml) and return it with `engines` and
    `builds` present. Raises EngineConfigError naming `source` and the offending key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise EngineConfigError(f"{source}: top level must be a mapping with 'engines' and/or 'builds'")
    unknown = set(data) - {"engines", "builds"}
    if unknown:
        raise EngineConfigError(
            f"{source}: unknown top-level key(s) {sorted(unknown)} (allowed: engines, builds)"
        )
    engines = data.get("engines") or {}
    builds = data.get("builds") or {}
    if not isinstance(engines, dict) or not isinstance(builds, dict):
        raise EngineConfigError(f"{source}: 'engines' and 'builds' must be mappings")
    for name, block in engines.items():
        if name not in LAUNCHED_ENGINES:
            raise EngineConfigError(f"{source}: engines.{name}: unknown engine (known: {', '.join(LAUNCHED_ENGINES)})")
        _check_engine_block(block, f"{source}: engines.{name}", _ENGINE_KEYS)
    for name, block in builds.items():
        _check_engine_block(block, f"{source}: builds.{name}", _BUILD_KEYS)
        if block.get("engine") not in LAUNCHED_ENGINES:
            raise EngineConfigError(
                f"{source}: builds.{name}.engine: must be vllm or sglang, got {block.get('engine')!r}"
            )
    return {"engines": engines, "builds": builds}


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineConfigError(f"{path}: cannot read flags file: {exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise EngineConfigError(f"{path}: invalid YAML: {exc}") from exc


def merge_block(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, val in over.items():
        if key == "methods":
            methods = out.setdefault("methods", {})
            for mname, mentry in (val or {}).items():
                methods[mname] = copy.deepcopy(mentry)
        elif key == "options":
            out.setdefault("options", {}).update(val)
        else:
            out[key] = copy.deepcopy(val)
    return out


def load_flags(flags_file: str | Path | None = None) -> dict[str, Any]:
    """The shipped engine_flags.yaml, with `flags_file` (same layout) merged on top.

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
        for name, block in flags["builds"].items():  # re-check merged builds
            if block.get("engine") not in LAUNCHED_ENGINES:
                raise EngineConfigError(f"{path}: builds.{name}.engine: must be vllm or sglang")
    return flags
