"""Sweep files: a YAML grid of benchmark points, expanded into `RunSpec`s.

A sweep file names one engine and model and a grid over TP degree x decoding-method variant x
concurrency x output length x input length x repeat. Layout (every key but `name`, `engine`,
`model` and `grid.methods` is optional; unknown keys are errors)::

    name: users-grid                 # sweep name (unique in the database)
    description: free text
    engine: sglang                   # vllm | sglang | external
    engine_build: ""                 # default build (key into engine_flags.yaml `builds`)
    model: /models/Qwen3.5-27B       # target model dir or name; "{demo_target}" style placeholders
    drafter: /models/...-DFlash      # default drafter for methods that need one
    port: 30000                      # default: the engine's usual port
    server: {dtype, max_model_len, load_format, served_model_name, prefix_caching,
             extra_args, env, endpoint_url, is_demo_model}
    grid:
      tp: [1, 4, 8]
      methods:                       # method variants; lists inside a variant expand
        - auto
        - {method: linear}
        - {method: ddtree, tree_budget: [15, 16, 32, 64], engine_build: sglang-ddtree-pr}
        - {method: draft_model, num_speculative_tokens: [2, 4], drafter: /models/small}
      concurrency: [1, 8]
      output_len: [1024]
      input_len: [128]
    workload: {dataset, dataset_path, num_prompts, request_rate, burstiness, ignore_eos,
               temperature, seed, warmup_requests}   # plus input_len/output_len/concurrency
                                                      # when the grid does not list them
    limits: {ready_timeout_s, request_timeout_s, run_timeout_s, stop_timeout_s, max_error_rate}
    slo: {ttft_ms: 500, tpot_ms: 50}  # goodput bounds, ms
    repeats: 1
    extra: {}                        # free-form metadata, stored with the sweep

Errors (`SweepError`) name the file, the line and the field path, e.g.
``sweeps/x.yaml:12: grid.methods[3].tree_budget: method 'ddtree' needs a tree budget``.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from benchkit.engines.catalog import DEFAULT_PORTS, ENGINES
from benchkit.methods import METHOD_NAMES as METHODS
from benchkit.methods import METHODS as METHOD_TABLE
from benchkit.methods import MethodError, check_method, method_label
from benchkit.specs import GpuRef, Limits, RunSpec, ServerConfig, WorkloadSpec

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
GRID_AXES = ("concurrency", "output_len", "input_len")
_TOP_KEYS = {
    "gpus",
    "share_server",
    "name",
    "description",
    "engine",
    "engine_build",
    "model",
    "drafter",
    "port",
    "server",
    "grid",
    "workload",
    "limits",
    "slo",
    "repeats",
    "extra",
}
_SERVER_KEYS = {
    "dtype",
    "max_model_len",
    "load_format",
    "served_model_name",
    "prefix_caching",
    "extra_args",
    "env",
    "endpoint_url",
    "is_demo_model",
}
_VARIANT_KEYS = {
    "method",
    "num_speculative_tokens",
    "tree_budget",
    "drafter",
    "engine_build",
    "prefix_caching",
    "extra_args",
}
_WORKLOAD_KEYS = {f.name for f in fields(WorkloadSpec)} - {"slo"}
_LIMIT_KEYS = {f.name for f in fields(Limits)}
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class SweepError(ValueError):
    """A sweep file is invalid. `source`, `line` (1-based, or None) and `field` (a dotted path
    such as `grid.methods[2].tree_budget`) locate the problem; str() gives all of them."""

    def __init__(self, source: str, line: int | None, field_path: str, message: str):
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {field_path}: {message}" if field_path else f"{where}: {message}")
        self.source = source
        self.line = line
        self.field = field_path
        self.message = message


# --------------------------------------------------------------------------------------------
# YAML with line numbers


class _LineDict(dict):
    """dict that remembers the 1-based line of itself (`line`) and of each key (`lines`)."""

    line: int | None = None
    lines: dict[Any, int]


class _LineList(list):
    line: int | None = None
    lines: list[int]


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    loader.flatten_mapping(node)
    out = _LineDict()
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


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> _LineList:
    out = _LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _line_of(container: Any, key: Any = None) -> int | None:
    if key is not None:
        if isinstance(container, _LineDict):
            return container.lines.get(key, container.line)
        if isinstance(container, _LineList) and isinstance(key, int) and key < len(container.lines):
            return container.lines[key]
    return getattr(container, "line", None)


def _plain(obj: Any) -> Any:
    """Strip the line-tracking types (plain dicts and lists)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------
# the spec


@dataclass
class MethodVariant:
    """One entry of `grid.methods` after list expansion: a single (method, k, budget, ...)."""

    method: str
    num_speculative_tokens: int | None = None
    tree_budget: int | None = None
    drafter: str | None = None  # None: the sweep's drafter
    engine_build: str | None = None  # None: the sweep's engine_build
    prefix_caching: bool | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Short display label (benchkit.methods.method_label): `auto`, `b15`, `draft_model k=4`."""
        return method_label(self.method, self.num_speculative_tokens, self.tree_budget)


@dataclass
class SweepSpec:
    """A parsed sweep file. `grid` holds `tp` (list[int]), `methods` (list[MethodVariant]) and
    the workload axes `concurrency`, `output_len`, `input_len` (list[int]). `server`,
    `workload`, `limits` hold defaults for the matching `benchkit.specs` dataclasses; `slo`
    maps `ttft_ms` / `tpot_ms` / `e2el_ms` to bounds in ms. `source` is the file it came from."""

    name: str
    engine: str
    model: str
    grid: dict[str, Any]
    description: str = ""
    drafter: str = ""
    engine_build: str = ""
    port: int | None = None
    server: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, float] = field(default_factory=dict)
    repeats: int = 1
    #: GPUs pinned per TP degree (NVML indices), from the file's `gpus:`; others are planned
    #: from the host topology (benchkit.hosts.allocation.plan_sweep_gpus).
    pinned_gpus: dict[int, list[int]] = field(default_factory=dict)
    #: Runs that differ only in workload share one server start (MEASUREMENT.md, "Reusing a
    #: server between points"); false gives every run a server of its own.
    share_server: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "<dict>"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def methods(self) -> list[MethodVariant]:
        """The expanded method variants, in file order."""
        return self.grid["methods"]

    def placeholders(self) -> set[str]:
        """Names of `{name}` placeholders still unresolved in any string of the spec."""
        found: set[str] = set()

        def walk(obj: Any) -> None:
            if isinstance(obj, str):
                found.update(_PLACEHOLDER_RE.findall(obj))
            elif isinstance(obj, dict):
                for v in obj.values():
                    walk(v)
            elif isinstance(obj, list):
                for v in obj:
                    walk(v)

        walk(self.raw)
        return found

    def require_resolved(self) -> None:
        """Raise SweepError naming every `{name}` placeholder left unresolved (a sweep with
        placeholders cannot run: give their values as `variables` / `--set KEY=VALUE`)."""
        left = self.placeholders()
        if left:
            raise SweepError(self.source, None, "", "unresolved placeholders "
                             + ", ".join("{" + p + "}" for p in sorted(left))
                             + ": give their values (--set KEY=VALUE on the command line)")

    def n_runs(self) -> int:
        """Number of runs `expand()` returns (product of the grid axes x repeats)."""
        g = self.grid
        return (
            len(g["tp"])
            * len(g["methods"])
            * len(g["concurrency"])
            * len(g["output_len"])
            * len(g["input_len"])
            * self.repeats
        )

    def expand(self, assign_gpus: Callable[[int], list[GpuRef]] | None = None) -> list[RunSpec]:
        """All runs of the grid, in the order tp x method variant x concurrency x output_len x
        input_len x repeat (runs that can share a server start are adjacent).

        `assign_gpus(tp)` returns the GPUs for a run of that TP degree; without it `gpus` is []
        (the runner allocates at run time). DDTree variants get prefix caching off.
        `is_demo_model` is set when the model's config.json carries `draftboard_demo: true`.
        """
        from benchkit.engines.demo_models import is_demo_model

        runs: list[RunSpec] = []
        g = self.grid
        demo = bool(self.server.get("is_demo_model")) or is_demo_model(self.model)
        port = self.port if self.port is not None else DEFAULT_PORTS[self.engine]
        for tp, variant in itertools.product(g["tp"], g["methods"]):
            prefix = variant.prefix_caching
            if prefix is None:
                prefix = self.server.get("prefix_caching")
            if METHOD_TABLE[variant.method].prefix_caching_off and prefix is None:
                prefix = False
            server_kwargs = {
                k: v for k, v in self.server.items() if k not in ("prefix_caching", "extra_args", "env")
            }
            server = ServerConfig(
                engine=self.engine,
                model=self.model,
                drafter=(variant.drafter if variant.drafter is not None else self.drafter)
                if _needs_drafter(variant)
                else "",
                method=variant.method,
                num_speculative_tokens=variant.num_speculative_tokens,
                tree_budget=variant.tree_budget,
                tp=tp,
                prefix_caching=prefix,
                extra_args=list(self.server.get("extra_args", [])) + list(variant.extra_args),
                env=dict(self.server.get("env", {})),
                engine_build=variant.engine_build if variant.engine_build is not None else self.engine_build,
                **server_kwargs,
            )
            server.is_demo_model = demo
            for conc, out_len, in_len in itertools.product(g["concurrency"], g["output_len"], g["input_len"]):
                for rep in range(self.repeats):
                    workload = WorkloadSpec(
                        **self.workload,
                        concurrency=conc,
                        output_len=out_len,
                        input_len=in_len,
                        slo=dict(self.slo),
                    )
                    runs.append(
                        RunSpec(
                            server=copy.deepcopy(server),
                            workload=workload,
                            gpus=list(assign_gpus(tp)) if assign_gpus else [],
                            port=port,
                            repeat_index=rep,
                            limits=Limits(**self.limits),
                        )
                    )
        return runs

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain JSON-ready data (the parsed file, placeholders substituted)."""
        return copy.deepcopy(self.raw)


def _needs_drafter(variant: MethodVariant) -> bool:
    return METHOD_TABLE[variant.method].needs_drafter or bool(variant.drafter)


class _Ctx:
    def __init__(self, source: str):
        self.source = source

    def fail(self, container: Any, key: Any, path: str, message: str) -> SweepError:
        return SweepError(self.source, _line_of(container, key), path, message)


def _check_keys(
    ctx: _Ctx, data: Any, allowed: set[str], path: str, parent: Any = None, pkey: Any = None
) -> None:
    if not isinstance(data, dict):
        raise ctx.fail(parent, pkey, path, f"expected a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            sub = f"{path}.{key}" if path else str(key)
            raise ctx.fail(data, key, sub, f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _int(ctx: _Ctx, val: Any, container: Any, key: Any, path: str, minimum: int = 1) -> int:
    if not isinstance(val, int) or isinstance(val, bool):
        raise ctx.fail(container, key, path, f"expected an integer, got {type(val).__name__} {val!r}")
    if val < minimum:
        raise ctx.fail(container, key, path, f"must be >= {minimum}, got {val}")
    return val


def _int_list(ctx: _Ctx, val: Any, container: Any, key: Any, path: str, minimum: int = 1) -> list[int]:
    items = val if isinstance(val, list) else [val]
    if not items:
        raise ctx.fail(container, key, path, "empty list")
    out = [
        _int(
            ctx,
            v,
            items if isinstance(val, list) else container,
            i if isinstance(val, list) else key,
            f"{path}[{i}]" if isinstance(val, list) else path,
            minimum,
        )
        for i, v in enumerate(items)
    ]
    if len(set(out)) != len(out):
        raise ctx.fail(container, key, path, f"duplicate values in {out}")
    return out


def _str(ctx: _Ctx, val: Any, container: Any, key: Any, path: str) -> str:
    if not isinstance(val, str):
        raise ctx.fail(container, key, path, f"expected a string, got {type(val).__name__} {val!r}")
    return val


def _str_list(ctx: _Ctx, val: Any, container: Any, key: Any, path: str) -> list[str]:
    if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
        raise ctx.fail(container, key, path, f"expected a list of strings, got {val!r}")
    return list(val)


def _substitute(
    obj: Any, variables: dict[str, str], ctx: _Ctx, path: str = "", container: Any = None, key: Any = None
):
    if isinstance(obj, str):

        def sub(m: re.Match) -> str:
            if m.group(1) not in variables:
                raise ctx.fail(
                    container,
                    key,
                    path,
                    f"unknown placeholder {{{m.group(1)}}} (known: {', '.join(sorted(variables)) or 'none'})",
                )
            return str(variables[m.group(1)])

        return _PLACEHOLDER_RE.sub(sub, obj)
    if isinstance(obj, _LineDict):
        out = _LineDict()
        out.line, out.lines = obj.line, obj.lines
        for k, v in obj.items():
            out[k] = _substitute(v, variables, ctx, f"{path}.{k}" if path else str(k), obj, k)
        return out
    if isinstance(obj, dict):
        return {
            k: _substitute(v, variables, ctx, f"{path}.{k}" if path else str(k), obj, k)
            for k, v in obj.items()
        }
    if isinstance(obj, _LineList):
        out_l = _LineList(_substitute(v, variables, ctx, f"{path}[{i}]", obj, i) for i, v in enumerate(obj))
        out_l.line, out_l.lines = obj.line, obj.lines
        return out_l
    if isinstance(obj, list):
        return [_substitute(v, variables, ctx, f"{path}[{i}]", obj, i) for i, v in enumerate(obj)]
    return obj


def _parse_variants(ctx: _Ctx, methods: Any, grid: Any, sweep: dict[str, Any]) -> list[MethodVariant]:
    if not isinstance(methods, list) or not methods:
        raise ctx.fail(grid, "methods", "grid.methods", "expected a non-empty list of methods")
    variants: list[MethodVariant] = []
    for i, entry in enumerate(methods):
        path = f"grid.methods[{i}]"
        if isinstance(entry, str):
            entry_d: dict[str, Any] = {"method": entry}
            container: Any = methods
            ckey: Any = i
        else:
            _check_keys(ctx, entry, _VARIANT_KEYS, path, methods, i)
            entry_d, container, ckey = entry, entry, "method"
        if "method" not in entry_d:
            raise ctx.fail(methods, i, f"{path}.method", "missing")
        method = entry_d["method"]
        if method not in METHODS:
            raise ctx.fail(
                container, ckey, f"{path}.method", f"unknown method {method!r} (known: {', '.join(METHODS)})"
            )
        ks: list[int | None] = [None]
        budgets: list[int | None] = [None]
        for key in ("num_speculative_tokens", "tree_budget"):
            if key in entry_d:
                values = _int_list(ctx, entry_d[key], entry_d, key, f"{path}.{key}")
                if key == "tree_budget":
                    budgets = list(values)
                else:
                    ks = list(values)
        drafter = None
        if "drafter" in entry_d:
            drafter = _str(ctx, entry_d["drafter"], entry_d, "drafter", f"{path}.drafter")
        build = None
        if "engine_build" in entry_d:
            build = _str(ctx, entry_d["engine_build"], entry_d, "engine_build", f"{path}.engine_build")
        prefix = entry_d.get("prefix_caching")
        if prefix is not None and not isinstance(prefix, bool):
            raise ctx.fail(
                entry_d, "prefix_caching", f"{path}.prefix_caching", f"expected true/false, got {prefix!r}"
            )
        for k, b in itertools.product(ks, budgets):
            try:
                check_method(method, k, b, drafter if drafter is not None else sweep.get("drafter", ""), prefix)
            except MethodError as exc:
                reason = exc.reason + (" (set it here or at the top level)" if exc.field == "drafter" else "")
                field_container = entry_d if exc.field in entry_d else container
                raise ctx.fail(field_container, exc.field if exc.field in entry_d else ckey,
                               f"{path}.{exc.field}", reason) from None
        extra = (
            _str_list(ctx, entry_d["extra_args"], entry_d, "extra_args", f"{path}.extra_args")
            if "extra_args" in entry_d
            else []
        )
        for k, b in itertools.product(ks, budgets):
            variant = MethodVariant(method, k, b, drafter, build, prefix, list(extra))
            if variant in variants:
                raise ctx.fail(container, ckey, path, f"duplicate method entry {variant.label!r} (each point runs once;"
                               " use `repeats` for repeated measurements)")
            variants.append(variant)
    return variants


def parse_sweep(data: Any, source: str = "<dict>", variables: dict[str, str] | None = None) -> SweepSpec:
    """Validate a parsed sweep document and build a SweepSpec.

    `variables` substitutes `{name}` placeholders in every string (e.g. `demo_target`,
    `demo_draft`); an unknown placeholder is then an error. Without `variables`,
    placeholders stay as written (`SweepSpec.placeholders()` lists them).

    Checks: unknown keys at every level, types, engine in vllm/sglang/external, methods known
    (and defined for the engine build in engine_flags.yaml), tree budget given for and only for
    ddtree, drafter present for methods that need one, positive integers on the grid axes,
    SLO keys. Raises SweepError naming `source`, the line and the field.
    """
    ctx = _Ctx(source)
    if variables is not None:
        data = _substitute(data, variables, ctx)
    if not isinstance(data, dict):
        raise SweepError(source, _line_of(data), "", "a sweep file must be a mapping at the top level")
    _check_keys(ctx, data, _TOP_KEYS, "")
    for req in ("name", "engine", "model", "grid"):
        if req not in data:
            raise ctx.fail(data, None, req, "missing (required)")
    name = _str(ctx, data["name"], data, "name", "name")
    if not name.strip():
        raise ctx.fail(data, "name", "name", "empty")
    engine = data["engine"]
    if engine not in ENGINES:
        raise ctx.fail(data, "engine", "engine", f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    model = _str(ctx, data["model"], data, "model", "model")
    drafter = _str(ctx, data["drafter"], data, "drafter", "drafter") if "drafter" in data else ""
    engine_build = (
        _str(ctx, data["engine_build"], data, "engine_build", "engine_build")
        if "engine_build" in data
        else ""
    )
    description = (
        _str(ctx, data["description"], data, "description", "description") if "description" in data else ""
    )
    port = _int(ctx, data["port"], data, "port", "port", 1) if data.get("port") is not None else None

    server: dict[str, Any] = {}
    if "server" in data:
        sd = data["server"]
        _check_keys(ctx, sd, _SERVER_KEYS, "server", data, "server")
        for key, val in sd.items():
            p = f"server.{key}"
            if key in ("dtype", "load_format", "served_model_name", "endpoint_url"):
                server[key] = _str(ctx, val, sd, key, p)
            elif key == "max_model_len":
                server[key] = _int(ctx, val, sd, key, p)
            elif key in ("prefix_caching", "is_demo_model"):
                if not isinstance(val, bool):
                    raise ctx.fail(sd, key, p, f"expected true/false, got {val!r}")
                server[key] = val
            elif key == "extra_args":
                server[key] = _str_list(ctx, val, sd, key, p)
            elif key == "env":
                if not isinstance(val, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in val.items()
                ):
                    raise ctx.fail(sd, key, p, "expected a mapping of strings to strings (quote numbers)")
                server[key] = dict(val)
    if engine == "external" and not server.get("endpoint_url"):
        raise ctx.fail(
            data, "server", "server.endpoint_url", "engine 'external' needs the URL of a running server"
        )

    grid_d = data["grid"]
    _check_keys(ctx, grid_d, {"tp", "methods", *GRID_AXES}, "grid", data, "grid")
    if "methods" not in grid_d:
        raise ctx.fail(grid_d, None, "grid.methods", "missing (required)")
    grid: dict[str, Any] = {
        "tp": _int_list(ctx, grid_d["tp"], grid_d, "tp", "grid.tp") if "tp" in grid_d else [1],
        "methods": _parse_variants(ctx, grid_d["methods"], grid_d, data),
    }

    workload: dict[str, Any] = {}
    wd = data.get("workload", {})
    if "workload" in data:
        _check_keys(ctx, wd, _WORKLOAD_KEYS, "workload", data, "workload")
        defaults = WorkloadSpec()
        for key, val in wd.items():
            p = f"workload.{key}"
            want = type(getattr(defaults, key))
            if key in ("request_rate", "warmup_requests") and val is None:
                workload[key] = None
                continue
            if key in ("request_rate", "burstiness", "temperature"):
                if not isinstance(val, (int, float)) or isinstance(val, bool) or val < 0:
                    raise ctx.fail(wd, key, p, f"expected a non-negative number, got {val!r}")
                if key in ("request_rate", "burstiness") and val == 0:
                    raise ctx.fail(wd, key, p, "must be > 0")
                workload[key] = float(val)
            elif key == "warmup_requests":
                workload[key] = _int(ctx, val, wd, key, p, minimum=0)
            elif want is bool:
                if not isinstance(val, bool):
                    raise ctx.fail(wd, key, p, f"expected true/false, got {val!r}")
                workload[key] = val
            elif want is int:
                workload[key] = _int(ctx, val, wd, key, p, minimum=0 if key == "seed" else 1)
            else:
                workload[key] = _str(ctx, val, wd, key, p)
        if workload.get("dataset", "random") not in ("random", "sharegpt", "jsonl"):
            raise ctx.fail(
                wd,
                "dataset",
                "workload.dataset",
                f"unknown dataset {workload['dataset']!r} (known: random, sharegpt, jsonl)",
            )
        if workload.get("dataset") in ("sharegpt", "jsonl") and not workload.get("dataset_path"):
            raise ctx.fail(
                wd, "dataset", "workload.dataset_path", f"dataset {workload['dataset']!r} needs a path"
            )
    for axis in GRID_AXES:
        if axis in grid_d and axis in workload:
            raise ctx.fail(wd, axis, f"workload.{axis}", f"also given as grid.{axis}; give it in one place")
        if axis in grid_d:
            grid[axis] = _int_list(ctx, grid_d[axis], grid_d, axis, f"grid.{axis}")
        else:
            grid[axis] = [workload.pop(axis, getattr(WorkloadSpec(), axis))]

    limits: dict[str, Any] = {}
    if "limits" in data:
        ld = data["limits"]
        _check_keys(ctx, ld, _LIMIT_KEYS, "limits", data, "limits")
        for key, val in ld.items():
            if not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0:
                raise ctx.fail(ld, key, f"limits.{key}", f"expected a positive number, got {val!r}")
            if key == "max_error_rate" and val > 1:
                raise ctx.fail(ld, key, f"limits.{key}", f"is a fraction in (0, 1], got {val}")
            limits[key] = float(val)

    slo: dict[str, float] = {}
    if "slo" in data:
        sl = data["slo"]
        _check_keys(ctx, sl, set(SLO_KEYS), "slo", data, "slo")
        for key, val in sl.items():
            if not isinstance(val, (int, float)) or isinstance(val, bool) or val <= 0:
                raise ctx.fail(sl, key, f"slo.{key}", f"expected a positive number of ms, got {val!r}")
            slo[key] = float(val)

    repeats = _int(ctx, data["repeats"], data, "repeats", "repeats") if "repeats" in data else 1
    share_server = data.get("share_server", True)
    if not isinstance(share_server, bool):
        raise ctx.fail(data, "share_server", "share_server", f"expected true/false, got {share_server!r}")
    pinned: dict[int, list[int]] = {}
    if "gpus" in data:
        gd = data["gpus"]
        if not isinstance(gd, dict):
            raise ctx.fail(data, "gpus", "gpus",
                           "expected a mapping of TP degree to GPU indices, e.g. {4: [4, 5, 6, 7]}")
        for tp_key, indices in gd.items():
            p = f"gpus.{tp_key}"
            if not isinstance(tp_key, int) or tp_key not in grid["tp"]:
                raise ctx.fail(gd, tp_key, p, f"{tp_key!r} is not a TP degree of grid.tp {grid['tp']}")
            idx = _int_list(ctx, indices, gd, tp_key, p, minimum=0)
            if len(idx) != tp_key or len(set(idx)) != len(idx):
                raise ctx.fail(gd, tp_key, p, f"TP {tp_key} needs {tp_key} distinct GPU indices, got {idx}")
            pinned[tp_key] = idx
    extra = data.get("extra", {}) or {}
    if not isinstance(extra, dict):
        raise ctx.fail(data, "extra", "extra", "expected a mapping")

    spec = SweepSpec(
        name=name,
        engine=engine,
        model=model,
        grid=grid,
        description=description,
        drafter=drafter,
        engine_build=engine_build,
        port=port,
        server=server,
        workload=workload,
        limits=limits,
        slo=slo,
        repeats=repeats,
        pinned_gpus=pinned,
        share_server=share_server,
        extra=_plain(extra),
        source=source,
        raw=_plain(data),
    )
    _check_against_flags(ctx, spec, grid_d)
    return spec


def _check_against_flags(ctx: _Ctx, spec: SweepSpec, grid_d: Any) -> None:
    """Every (method, build) must be defined in engine_flags.yaml for the engine."""
    if spec.engine == "external":
        return
    from benchkit.engines.adapters import EngineConfigError, adapter_for

    adapter = adapter_for(spec.engine)
    methods_node = grid_d.get("methods")
    for variant in spec.methods:
        build = variant.engine_build if variant.engine_build is not None else spec.engine_build
        try:
            adapter.method_entry(variant.method, build)
        except EngineConfigError as exc:
            idx = next(
                (
                    i
                    for i, m in enumerate(methods_node)
                    if (m == variant.method) or (isinstance(m, dict) and m.get("method") == variant.method)
                ),
                None,
            )
            raise ctx.fail(methods_node, idx, f"grid.methods[{idx}]", str(exc)) from None


def load_sweep_file(path: str | Path, variables: dict[str, str] | None = None) -> SweepSpec:
    """Read and validate a sweep YAML file (see module docstring). Raises SweepError naming the
    file, line and field; a YAML syntax error is reported with its line too."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SweepError(str(path), None, "", f"not UTF-8 text (byte {exc.start}): is this a sweep file?") from None
    except OSError as exc:
        raise SweepError(str(path), None, "", f"cannot read sweep file: {exc}") from exc
    return loads_sweep(text, str(path), variables)


def loads_sweep(text: str, source: str = "<text>", variables: dict[str, str] | None = None) -> SweepSpec:
    """Parse and validate sweep YAML given as text (the admin's form); errors name `source`,
    the line and the field, as for a file."""
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise SweepError(source, mark.line + 1 if mark else None, "", f"invalid YAML: {problem}") from None
    return parse_sweep(data, source, variables)


def parse_variables(items: list[str]) -> dict[str, str]:
    """`--set KEY=VALUE` command-line options as the `variables` that fill a sweep file's `{KEY}`
    placeholders. Raises ValueError naming an item without '='."""
    variables = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        variables[key] = value
    return variables
