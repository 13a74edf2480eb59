"""The engine registry: every inference engine draftboard knows, one line each.

`ENGINES` maps an engine's name to the class that declares its facts (`module:Class`, a subclass
of benchkit.engines.adapters.EngineAdapter, one module per engine under benchkit/engines/kinds/),
healthchecks' TRANSPORTS style: every choice list (the sweep file's `engine`, the flags file's
engines, the admin's engine filter, `import_results --engine`, the counter readers) is derived
from it, and an unknown name is refused with the known ones listed. The classes are imported
only when a fact is asked for, so this module imports nothing of draftboard and every other
module may import it.

Adding an engine (e.g. TensorRT-LLM): one module under benchkit/engines/kinds/ declaring its facts,
one line here, its flags under `engines:` in benchkit/engines/engine_flags.yaml.

An engine that lives outside this repository (a plug-in, or a test's stand-in) is registered
without editing this file: name it in the environment variable `DRAFTBOARD_ENGINES` as
`name=module:Class` entries separated by commas (read on every look-up, so a worker process
started with it sees it), or call `register(name, "module:Class")` in the process that needs it.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Annotated, Any

from pydantic import AfterValidator

#: name -> "module:Class" of the class declaring the engine's facts. Order matters where engines
#: are tried in turn (the counter readers: vLLM's names win when a page has both).
ENGINES: dict[str, str] = {
    "vllm": "benchkit.engines.kinds.vllm:Vllm",
    "sglang": "benchkit.engines.kinds.sglang:SGLang",
    "external": "benchkit.engines.kinds.external:External",
}
#: Environment variable naming plug-in engines: `name=module:Class[,name=module:Class...]`.
PLUGINS_ENV = "DRAFTBOARD_ENGINES"
#: An engine name: what `Run.engine` (20 characters) and a flags file's `engines:` key can hold.
NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,19}")
_PATH_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_registered: dict[str, str] = {}


class EngineConfigError(ValueError):
    """A flags file is malformed, or a ServerConfig cannot be turned into a command line for its
    engine (unknown engine or build, method the build does not define, drafter or tree budget
    missing, ...), or an engine is unknown or badly registered. The message names the file, line
    and key, the ServerConfig field, or the engine and the known ones."""


def register(name: str, path: str) -> None:
    """Register engine `name` as the class at `path` (`module:Class`) in this process, beside
    ENGINES and DRAFTBOARD_ENGINES (a later registration of a name replaces the earlier one; a
    built-in name cannot be replaced). Raises EngineConfigError for a bad name or path."""
    _check_entry(name, path, "register()")
    _registered[name] = path


def unregister(name: str) -> None:
    """Forget a name given to `register` (tests clean up with it); unknown names are ignored."""
    _registered.pop(name, None)


def _check_entry(name: str, path: str, where: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise EngineConfigError(f"{where}: engine name {name!r} must match {NAME_RE.pattern} "
                                "(lower case, at most 20 characters: Run.engine holds it)")
    if name in ENGINES:
        raise EngineConfigError(f"{where}: engine {name!r} is built in (benchkit/engines/registry.py); "
                                "give a plug-in another name")
    if not _PATH_RE.fullmatch(path):
        raise EngineConfigError(f"{where}: {path!r} for engine {name!r} is not `module:Class`")


def _plugins() -> dict[str, str]:
    """The entries of DRAFTBOARD_ENGINES. Raises EngineConfigError naming a malformed entry."""
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in os.environ.get(PLUGINS_ENV, "").split(","))):
        name, sep, path = entry.partition("=")
        if not sep:
            raise EngineConfigError(f"{PLUGINS_ENV}: entry {entry!r} is not `name=module:Class`")
        _check_entry(name.strip(), path.strip(), PLUGINS_ENV)
        out[name.strip()] = path.strip()
    return out


def table() -> dict[str, str]:
    """Every known engine, name -> `module:Class`: ENGINES, then DRAFTBOARD_ENGINES, then
    `register()`ed ones."""
    return {**ENGINES, **_plugins(), **_registered}


def engine_names() -> tuple[str, ...]:
    """Names of every known engine, in registry order."""
    return tuple(table())


def unknown(name: object) -> EngineConfigError:
    """The error for an engine name that is not registered (it lists the known ones)."""
    return EngineConfigError(f"unknown engine {name!r} (known: {', '.join(engine_names())})")


def engine_class(name: str) -> Any:
    """The class declaring engine `name`'s facts (a benchkit.engines.adapters.EngineAdapter
    subclass; this module imports none of them, so that every module may import it). Raises
    EngineConfigError for an unknown name, or a registered path that cannot be imported or
    is not a class whose `name` is `name`."""
    path = table().get(name) if isinstance(name, str) else None
    if path is None:
        raise unknown(name)
    module_name, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise EngineConfigError(f"engine {name!r}: cannot load {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(cls, type) or getattr(cls, "name", None) != name or not hasattr(cls, "launched"):
        raise EngineConfigError(f"engine {name!r}: {path} is not an EngineAdapter subclass whose name is {name!r}")
    return cls


def launched_engines() -> tuple[str, ...]:
    """Names of the engines draftboard starts itself (flags in engine_flags.yaml), registry order."""
    return tuple(n for n in engine_names() if engine_class(n).launched)


def is_launched(name: str) -> bool:
    """True when draftboard starts servers of engine `name`. Raises EngineConfigError when unknown."""
    return engine_class(name).launched


def engine_for_tool(source_tool: str) -> str | None:
    """The engine whose runs a result file written by `source_tool` (e.g. `sglang.bench_serving`,
    benchkit.formats) holds, by each engine's `result_tools`; None when no engine names it."""
    return next((n for n in engine_names() if source_tool in engine_class(n).result_tools), None)


def check_engine(name: str) -> str:
    """`name` when it is a registered engine, else ValueError listing the known ones (a pydantic
    validator: benchkit.configfile turns it into `file:line: field: unknown engine ...`)."""
    if name not in engine_names():
        raise ValueError(str(unknown(name)))
    return name


def check_launched_engine(name: str) -> str:
    """`name` when it is a registered engine draftboard launches, else ValueError naming why."""
    check_engine(name)
    if not is_launched(name):
        raise ValueError(f"engine {name!r} is not started by draftboard, so it has no flags "
                         f"(engines with flags: {', '.join(launched_engines())})")
    return name


#: Field types of pydantic models at the boundary (sweep files, flags files, result files).
EngineName = Annotated[str, AfterValidator(check_engine)]
LaunchedEngineName = Annotated[str, AfterValidator(check_launched_engine)]
