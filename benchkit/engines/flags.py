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
from benchkit.engines.registry import EngineConfigError, LaunchedEngineName
from benchkit.methods import MethodName

DEFAULT_FLAGS_FILE = Path(__file__).with_name("engine_flags.yaml")
PLACEHOLDERS = ("model", "drafter", "port", "tp", "k", "k_plus_1", "tree_budget")
#: Placeholders of a launcher's argv (benchkit.engines.environment fills them per server start):
#: `name` a container name the launch assigns, `image` the container image, `env_file` a file of
#: KEY=VALUE lines holding the server's environment, `gpu_uuids` / `gpu_indices` the run's GPUs
#: comma-separated, `model`, `drafter` (directories, e.g. to mount), `port` the server's port.
LAUNCHER_PLACEHOLDERS = ("name", "image", "env_file", "gpu_uuids", "gpu_indices", "model", "drafter", "port")
#: ... and inside a `per_gpu` group, repeated once per GPU of the run.
PER_GPU_PLACEHOLDERS = (*LAUNCHER_PLACEHOLDERS, "gpu_uuid", "gpu_index")
#: Container runtimes whose `image inspect`, `stop -t S NAME` and `container inspect` draftboard uses.
CONTAINER_RUNTIMES = ("docker", "podman")
PLACEHOLDER_RE = re.compile(r"\{([a-z_0-9]+)\}")
#: Keys older flags files carried per method; they are facts of the method (benchkit.methods).
_METHOD_TABLE_KEYS = ("needs_drafter", "needs_budget", "prefix_caching")


def _template(text: str, known: tuple[str, ...] = PLACEHOLDERS) -> str:
    for name in PLACEHOLDER_RE.findall(text):
        if name not in known:
            raise ValueError(f"unknown placeholder {{{name}}} (known: {', '.join(known)})")
    return text


def _launcher_arg(item: Any) -> Any:
    """A launcher argv element: a template, a list of templates (an optional group, left out when
    one of its placeholders has no value) or `{per_gpu: [templates]}` (repeated once per GPU)."""
    if isinstance(item, str):
        return _template(item, LAUNCHER_PLACEHOLDERS)
    if isinstance(item, list) and item and all(isinstance(t, str) for t in item):
        return [_template(t, LAUNCHER_PLACEHOLDERS) for t in item]
    if isinstance(item, dict) and list(item) == ["per_gpu"]:
        group = item["per_gpu"]
        if isinstance(group, list) and group and all(isinstance(t, str) for t in group):
            return {"per_gpu": [_template(t, PER_GPU_PLACEHOLDERS) for t in group]}
    raise ValueError("expected a string, a list of strings (an optional group) or {per_gpu: [strings]} "
                     f"(repeated once per GPU), got {plain(item)!r}")


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
LauncherArg = Annotated[Any, AfterValidator(_launcher_arg)]
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


class ContainerFlags(StrictModel):
    """`launcher.container`: the launcher starts a container of `image`. `runtime` (docker or
    podman, a name on PATH or a path to one) checks before a start that the image is present
    locally (`RUNTIME image inspect IMAGE`) and stops the container at teardown
    (`RUNTIME stop -t S NAME`, NAME being the `{name}` the launch assigned)."""

    runtime: str
    image: str

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, runtime: str) -> str:
        if Path(runtime).name not in CONTAINER_RUNTIMES:
            raise ValueError(f"expected one of {', '.join(CONTAINER_RUNTIMES)} (a name on PATH or a path), "
                             f"got {runtime!r}")
        return runtime

    @field_validator("image")
    @classmethod
    def _image(cls, image: str) -> str:
        if not image.strip():
            raise ValueError("empty (an image reference such as lmsysorg/sglang:v0.5.0)")
        return image


class LauncherFlags(StrictModel):
    """`launcher`: argv templates put before the interpreter (`python`), e.g. a container
    runtime's `run` command, `numactl ...` or `conda run -n ENV`; elements as `_launcher_arg`
    says, placeholders LAUNCHER_PLACEHOLDERS. With `container`, the argv must pass the container
    its name (`{name}`), its image (`{image}`), the server's environment (`{env_file}`: a container
    does not inherit it), `--rm`, and the run's GPUs (`{gpu_uuids}`, `{gpu_indices}` or a `per_gpu` group),
    so that teardown can stop it and the GPUs chosen for the run reach the server."""

    argv: Annotated[list[LauncherArg], Field(min_length=1)]
    container: ContainerFlags | None = None

    @model_validator(mode="after")
    def _container_needs(self) -> LauncherFlags:
        if self.container is None:
            return self
        text = repr(self.argv)
        if "--rm" not in self.argv:
            raise FieldProblem("argv", "a container launcher must use --rm (else every stopped server and "
                                       "version probe leaves a container behind)")
        hints = {"name": "--name {name}: teardown stops the container by that name",
                 "image": "where the runtime expects the image",
                 "env_file": "--env-file {env_file}: a container does not inherit the server's environment"}
        for name, hint in hints.items():
            if "{" + name + "}" not in text:
                raise FieldProblem("argv", f"a container launcher must use {{{name}}} ({hint})")
        if not any("{" + g + "}" in text for g in ("gpu_uuids", "gpu_indices", "gpu_uuid", "gpu_index")):
            raise FieldProblem("argv", "a container launcher must pass the run's GPUs: e.g. the optional group "
                                       """["--gpus", '"device={gpu_uuids}"'] (docker) or """
                                       """{per_gpu: ["--device", "nvidia.com/gpu={gpu_uuid}"]} (CDI, podman)""")
        return self


class EngineFlags(StrictModel):
    """One engine's flags (`engines.vllm`, `engines.sglang`): `launch` argv templates after the
    python executable, `options` ServerConfig field -> flag, `prefix_caching_on` / `_off` literal
    flags, `methods` method name -> MethodFlags (None: defined, no flags).

    Where the server runs: `python` the interpreter that runs `launch` (an absolute path, e.g. a
    build's own virtualenv `/opt/sglang-ddtree/bin/python`; with a `launcher`, the interpreter
    the launcher runs, e.g. `python3` inside a container image; default: the interpreter
    draftboard runs under) and `launcher` (LauncherFlags) what runs it.

    `per_request_spec_metrics` ("summary" / "detailed"): start a speculative run's server with the
    engine's per-request spec-decode flags (benchkit.engines.capabilities.RequestSpecMetrics; vLLM
    >= 0.28 `--per-request-spec-decode-metrics LEVEL`), so each response carries its acceptance
    (issue 20). Per build: an older build refuses the flag. Unset: not asked."""

    launch: list[Template] | None = None
    options: dict[OptionField, Flag] | None = None
    prefix_caching_on: list[str] | None = None
    prefix_caching_off: list[str] | None = None
    methods: dict[MethodName, MethodFlags | None] | None = None
    python: str | None = None
    launcher: LauncherFlags | None = None
    per_request_spec_metrics: Literal["summary", "detailed"] | None = None

    @model_validator(mode="after")
    def _python_path(self) -> EngineFlags:
        if self.python is not None and not self.python.strip():
            raise FieldProblem("python", "empty (an interpreter path such as /opt/sglang/bin/python)")
        if self.python and self.launcher is None and not Path(self.python).is_absolute():
            raise FieldProblem("python", f"{self.python!r}: give an absolute interpreter path such as "
                                         "/opt/sglang/bin/python (only inside a launcher may it be a bare name)")
        return self


class BuildFlags(EngineFlags):
    """An engine build (`builds.NAME`): the keys of EngineFlags, which override its engine's, plus
    the `engine` it is a build of."""

    engine: LaunchedEngineName


class FlagsFile(StrictModel):
    """A whole flags file: `engines` and `builds`. Engine names are those of the registry that
    draftboard launches (benchkit.engines.registry), checked when the file is read."""

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
