"""Sweep files: a YAML grid of benchmark points, expanded into `RunSpec`s.

A sweep file names one engine and model and a grid over TP degree x decoding-method variant x
concurrency x output length x input length x repeat. Layout (every key but `name`, `engine`,
`model` and `grid.methods` is optional; unknown keys are errors)::

    name: users-grid                 # sweep name
    description: free text
    engine: sglang                   # vllm | sglang | external (benchkit.engines.registry)
    engine_build: ""                 # default build (key into engine_flags.yaml `builds`)
    model: /models/Qwen3.5-27B       # target model dir or name; "{demo_target}" style placeholders
    drafter: /models/...-DFlash      # default drafter of the methods that need one
    port: 30000                      # pin the server's port (else a free one is chosen at run time)
    server: {dtype, max_model_len, load_format, served_model_name, prefix_caching,
             extra_args, env, endpoint_url, is_demo_model, engine_cpus}
                                     # engine_cpus: "0" binds vLLM CPU's EngineCore and worker
                                     # to CPU 0, its API server to the other CPUs
                                     # (benchkit.engines.cpus: why 2-CPU hosts need it)
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
      temperature: [0.0, 0.7]        # sampling temperature; every request sends workload.seed
    workload: {dataset, dataset_path, num_prompts, request_rate, burstiness, ignore_eos,
               seed, samples_per_prompt, warmup_requests, # plus input_len/output_len/concurrency/
               dataset_split, dataset_categories,   # temperature when the grid does not list them
               prompts_per_category, dataset_turns} # (categorized datasets: benchkit.measure.datasets)
    limits: {ready_timeout_s, request_timeout_s, run_timeout_s, stop_timeout_s, max_error_rate,
             telemetry_hz (GPU readings per second, 0.1..50, default 10)}
    slo: {ttft_ms: 500, tpot_ms: 50} # goodput bounds, ms
    repeats: 1
    gpus: {4: [4, 5, 6, 7]}          # NVML indices pinned per TP degree; others are planned
    cross_numa: false                # refuse a TP group that would span NUMA nodes (default true:
                                     # allowed when unavoidable, and recorded on the run)
    hosts: [gpu-a, gpu-b]            # run the grid on each of these hosts (one queue each; GPUs
                                     # planned on each host's own inventory); default: the
                                     # host the command or form names
    share_server: true               # runs differing only in workload share a server start
    twin: {acceptance: pinned, tau: 3.2, nights: 7}  # an acceptance-controlled twin of every
                                     # speculative point (or per `grid.methods` entry): a second
                                     # run with the engine's synthetic acceptance pinned to `tau`
                                     # (default: the point's median tau of the last `nights`
                                     # nights); benchkit.sweeps.twins, docs/CHANGEPOINTS.md
    extra: {}                        # free-form metadata, stored with the sweep

The layout is the pydantic model `SweepFile` (unknown keys forbidden, no type coercion). What a
decoding method needs (a tree budget for DDTree, a drafter, no k for `auto`, prefix caching off
for DDTree) is checked by benchkit.methods.check_method, the same rule the engine adapters and the
result importer apply; every method must also be defined for its engine build in the engine flags
file. Errors (`SweepError`) name the file, the line and the field path, e.g.
``sweeps/x.yaml:12: grid.methods[3].tree_budget: method 'ddtree' needs a tree budget``.

A valid file can still ask for more than a host has. `SweepSpec.fit_on(inventory, host)` plans the
GPUs on that host (benchkit.hosts.allocation.fit_sweep_gpus) and returns the runs the host can
hold together with a `Refusal` per TP degree it cannot, located at the line of the TP value
(`grid.tp[2]`) or of the `gpus:` entry that pins it (`gpus.4`)::

    sweeps/x.yaml:6: grid.tp[2]: host gpu-a: TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]

`SweepSpec.expand_on` is all or nothing: it raises `PointsRefused` listing every refusal.
"""

from __future__ import annotations

import copy
import itertools
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, get_args

import yaml
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from benchkit import config_record
from benchkit.config_record import ConfigField
from benchkit.configfile import (
    MAX_YAML_BYTES,
    FieldProblem,
    StrictModel,
    first_problem,
    format_field,
    load_yaml,
    locate,
    plain,
    yaml_problem,
)
from benchkit.engines.adapters import EngineConfigError, adapter_for
from benchkit.engines.cpus import parse_cpus
from benchkit.engines.demo_models import is_demo_model
from benchkit.engines.registry import EngineName, is_launched
from benchkit.hosts import HOST_NAME_RE, telemetry
from benchkit.hosts.allocation import Allocation, fit_sweep_gpus
from benchkit.hosts.inventory import HostInventory
from benchkit.measure import datasets
from benchkit.methods import METHODS, MethodError, MethodName, check_method, method_label
from benchkit.specs import GpuRef, Limits, RunSpec, ServerConfig, WorkloadSpec
from benchkit.sweeps.twins import DEFAULT_NIGHTS, TwinRequest

#: Most runs one sweep file may expand to (SweepFile._check_size, checked before expansion).
MAX_SWEEP_RUNS = 10_000
#: Workload fields a grid may list as axes (else one value, from `workload:` or the default).
GRID_AXES = ("concurrency", "output_len", "input_len", "temperature")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def located(source: str, line: int | None, field_path: str, message: str) -> str:
    """`source:line: field: message` (line and field left out where unknown)."""
    where = f"{source}:{line}" if line else source
    return f"{where}: {field_path}: {message}" if field_path else f"{where}: {message}"


class SweepError(ValueError):
    """A sweep file is invalid. `source`, `line` (1-based, or None) and `field` (a dotted path
    such as `grid.methods[2].tree_budget`) locate the problem; str() gives all of them."""

    def __init__(self, source: str, line: int | None, field_path: str, message: str):
        super().__init__(located(source, line, field_path, message))
        self.source = source
        self.line = line
        self.field = field_path
        self.message = message


@dataclass
class Refusal:
    """The runs of one TP degree that a host cannot hold, located in the sweep file: `line` and
    `field` of the TP value (`grid.tp[2]`) or of the pinning `gpus:` entry (`gpus.4`), `reason`
    (`host NAME: ` + benchkit.hosts.allocation.HostFitError's message), `host` ("" unnamed),
    `tp`, `cause` (HostFitError.cause), `runs` (the RunSpecs refused, GPUs not planned).
    str() is `file:line: field: reason`."""

    source: str
    line: int | None
    field: str
    reason: str
    host: str
    tp: int
    cause: str
    runs: list[RunSpec] = field(default_factory=list, repr=False)

    def __str__(self) -> str:
        return located(self.source, self.line, self.field, self.reason)


class PointsRefused(SweepError):
    """Points of a valid sweep that a host cannot hold (`refusals`, one per TP degree and host);
    str() gives one `file:line: field: reason` line each. Raised by SweepSpec.expand_on and
    runs.services.sweeps.create_sweep, which then store nothing."""

    def __init__(self, refusals: list[Refusal]):
        first = refusals[0]
        super().__init__(first.source, first.line, first.field, first.reason)
        self.refusals = list(refusals)
        self.args = ("\n".join(str(r) for r in self.refusals),)

    def __str__(self) -> str:
        return self.args[0]

    @property
    def n_runs(self) -> int:
        """How many runs are refused (over every host)."""
        return sum(len(r.runs) for r in self.refusals)


# --------------------------------------------------------------------------------------------
# the file's layout


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _distinct(values: list[int]) -> list[int]:
    if len(set(values)) != len(values):
        raise ValueError(f"duplicate values in {values}")
    return values


#: One value or a list of distinct integers >= 1 (a grid axis, k values, tree budgets).
Positives = Annotated[list[Annotated[int, Field(ge=1)]], BeforeValidator(_as_list), Field(min_length=1),
                      AfterValidator(_distinct)]
#: One value or a list of distinct temperatures >= 0 (the `grid.temperature` axis).
Temperatures = Annotated[list[Annotated[float, Field(ge=0)]], BeforeValidator(_as_list), Field(min_length=1),
                         AfterValidator(_distinct)]
#: One or more distinct NVML GPU indices.
GpuIndices = Annotated[list[Annotated[int, Field(ge=0)]], BeforeValidator(_as_list), Field(min_length=1),
                       AfterValidator(_distinct)]
PositiveInt = Annotated[int, Field(ge=1)]


def _host_name(name: str) -> str:
    if not HOST_NAME_RE.match(name):
        raise ValueError(f"{name[:100]!r} is not a host name (1-100 letters, digits, '.', '_', '-', starting with a "
                         "letter or digit)")
    return name


#: One or more distinct host names (benchkit.hosts.HOST_NAME_RE).
HostNames = Annotated[list[Annotated[str, AfterValidator(_host_name)]], BeforeValidator(_as_list),
                      Field(min_length=1), AfterValidator(_distinct)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
_WORKLOAD = WorkloadSpec()  # the defaults the workload section starts from
_LIMITS = Limits()


def _env(value: Any) -> Any:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError("expected a mapping of strings to strings (quote numbers)")
    return value


def _cpu_list(value: str) -> str:
    if value:
        parse_cpus(value, allowed=set(range(1 << 16)))  # syntax here; the host's CPUs at launch
    return value


#: What a section field needs checked beyond its type, bounds and choices (by record field name).
_SECTION_CHECKS: dict[str, Any] = {"env": BeforeValidator(_env), "engine_cpus": AfterValidator(_cpu_list)}


def _section_field(f: ConfigField) -> tuple[Any, Any]:
    """(annotation, pydantic Field) of a record field in a sweep-file section: its type (None
    allowed where the type allows it), the record's choices and bounds, its check, its default."""
    base, optional = f.type, False
    if isinstance(base, types.UnionType) and type(None) in get_args(base):
        optional, base = True, next(a for a in get_args(base) if a is not type(None))
    if f.choices:
        base = Literal[f.choices]
    bounds = {k: v for k, v in (("ge", f.ge), ("gt", f.gt)) if v is not None}
    if bounds:
        base = Annotated[base, Field(**bounds)]
    if f.name in _SECTION_CHECKS:
        base = Annotated[base, _SECTION_CHECKS[f.name]]
    default = Field(default_factory=f.factory) if f.factory is not None else Field(default=f.default)
    return Optional[base] if optional else base, default  # noqa: UP045 (a runtime annotation)


def section_model(name: str, section: str, base: type[StrictModel], doc: str,
                  record: tuple[ConfigField, ...] | None = None) -> type[StrictModel]:
    """The pydantic model of a sweep-file section: every record field (benchkit.config_record)
    that `section` sets, in the record's order."""
    return create_model(name, __base__=base, __doc__=doc, __module__=__name__,
                        **{f.name: _section_field(f) for f in config_record.in_section(section, record)})


class TwinSection(StrictModel):
    """`twin:` (top level, or on a `grid.methods` entry): an acceptance-controlled twin of each
    speculative point (benchkit.sweeps.twins). `acceptance: pinned` is the only kind; `tau` a
    golden tau (tokens per verify pass, bonus token included, >= 1); without it the twin is
    pinned to the point's median tau over the last `nights` nights of its series."""

    acceptance: Literal["pinned"]
    tau: Annotated[float, Field(ge=1.0, allow_inf_nan=False)] | None = None
    nights: PositiveInt = DEFAULT_NIGHTS

    def request(self) -> TwinRequest:
        """The benchkit.sweeps.twins.TwinRequest this section asks for."""
        return TwinRequest(self.acceptance, self.tau, self.nights)


def _engine_can_twin(engine: str) -> bool:
    """Whether `engine` (registered) has a way to force acceptance (EngineAdapter.acceptance_twin)."""
    try:
        return adapter_for(engine).acceptance_twin(1.0, None) is not None
    except EngineConfigError:
        return False


class MethodEntry(StrictModel):
    """One `grid.methods` entry: a method name alone, or a mapping whose list values expand
    (k values x tree budgets). `drafter` / `engine_build` None: the sweep's."""

    method: MethodName
    num_speculative_tokens: Positives | None = None
    tree_budget: Positives | None = None
    drafter: str | None = None
    engine_build: str | None = None
    prefix_caching: bool | None = None
    extra_args: list[str] = Field(default_factory=list)
    twin: TwinSection | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_alone(cls, data: Any) -> Any:
        return {"method": data} if isinstance(data, str) else data


class Grid(StrictModel):
    """`grid:`: TP degrees, method entries and the workload axes GRID_AXES (None: not an axis)."""

    tp: Positives = Field(default_factory=lambda: [1])
    methods: Annotated[list[MethodEntry], Field(min_length=1)]
    concurrency: Positives | None = None
    output_len: Positives | None = None
    input_len: Positives | None = None
    temperature: Temperatures | None = None


class _WorkloadChecks(StrictModel):
    """What `workload:` checks across its fields: a dataset other than random names its file."""

    @model_validator(mode="after")
    def _dataset_path(self) -> Any:
        kind = self.dataset  # type: ignore[attr-defined]
        if kind != "random" and not self.dataset_path:  # type: ignore[attr-defined]
            raise FieldProblem("dataset_path", f"dataset {kind!r} needs a path")
        for name in ("dataset_categories", "prompts_per_category", "dataset_turns"):
            if name in self.model_fields_set and kind in ("random", "sharegpt"):
                raise FieldProblem(name, f"dataset {kind!r} has no categories or turns (a categorized kind: jsonl, "
                                         "speed_bench, mt_bench, spec_bench)")
        if self.dataset_split and kind != "speed_bench":  # type: ignore[attr-defined]
            raise FieldProblem("dataset_split", f"only dataset speed_bench has splits (dataset is {kind!r})")
        if any(not c for c in self.dataset_categories):  # type: ignore[attr-defined]
            raise FieldProblem("dataset_categories", "a category name must not be empty")
        n, spp = self.num_prompts, self.samples_per_prompt  # type: ignore[attr-defined]
        if spp and n % spp:
            raise FieldProblem("samples_per_prompt", f"num_prompts {n} must be a multiple of samples_per_prompt "
                                                     f"{spp} (num_prompts / samples_per_prompt distinct prompts)")
        return self


#: `server:` defaults for every run's ServerConfig: the record's fields with section `server`.
ServerSection = section_model("ServerSection", "server", StrictModel,
                              "`server:` defaults for every run's ServerConfig (benchkit.specs; the record's "
                              "`server` section, benchkit.config_record).")
#: `workload:` defaults for every run's WorkloadSpec (`slo` is top level; the grid axes may be given here once).
WorkloadSection = section_model("WorkloadSection", "workload", _WorkloadChecks,
                                "`workload:` defaults for every run's WorkloadSpec (benchkit.specs; `slo` is top "
                                "level; the record's `workload` section, benchkit.config_record).")


class LimitsSection(StrictModel):
    """`limits:` for every run (benchkit.specs.Limits): timeouts in s, the error-rate threshold."""

    ready_timeout_s: PositiveFloat = _LIMITS.ready_timeout_s
    request_timeout_s: PositiveFloat = _LIMITS.request_timeout_s
    run_timeout_s: PositiveFloat = _LIMITS.run_timeout_s
    stop_timeout_s: PositiveFloat = _LIMITS.stop_timeout_s
    max_error_rate: PositiveFloat = _LIMITS.max_error_rate
    telemetry_hz: PositiveFloat = _LIMITS.telemetry_hz

    @field_validator("max_error_rate")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if value > 1:
            raise ValueError(f"is a fraction in (0, 1], got {value:g}")
        return value

    @field_validator("telemetry_hz")
    @classmethod
    def _rate(cls, value: float) -> float:
        if not telemetry.MIN_HZ <= value <= telemetry.MAX_HZ:
            raise ValueError(f"is GPU readings per second within {telemetry.MIN_HZ:g}..{telemetry.MAX_HZ:g}, "
                             f"got {value:g}")
        return value


class SloSection(StrictModel):
    """`slo:` goodput bounds in ms (benchkit.measure.metrics)."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2el_ms: PositiveFloat | None = None


class SweepFile(StrictModel):
    """A whole sweep file (see the module docstring). Besides the field types, it checks: a
    non-empty name; engine `external` names its server; a workload axis in one place only;
    every method variant against the method table (check_method) and no variant twice; pinned
    GPUs only for listed TP degrees, as many distinct indices as the degree."""

    name: str
    description: str = ""
    engine: EngineName
    engine_build: str = ""
    model: str
    drafter: str = ""
    port: PositiveInt | None = None
    server: ServerSection = Field(default_factory=ServerSection)
    grid: Grid
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    slo: SloSection = Field(default_factory=SloSection)
    repeats: PositiveInt = 1
    gpus: dict[int, GpuIndices] = Field(default_factory=dict)
    cross_numa: bool = True
    hosts: HostNames | None = None
    share_server: bool = True
    twin: TwinSection | None = None
    extra: dict[Any, Any] | None = None

    @field_validator("name")
    @classmethod
    def _named(cls, name: str) -> str:
        if not name.strip():
            raise ValueError("empty")
        return name

    @model_validator(mode="after")
    def _consistent(self) -> SweepFile:
        self._check_size()
        if not is_launched(self.engine) and not self.server.endpoint_url:
            raise FieldProblem(("server", "endpoint_url"), f"engine {self.engine!r} needs the URL of a running server")
        for axis in GRID_AXES:
            if getattr(self.grid, axis) is not None and axis in self.workload.model_fields_set:
                raise FieldProblem(("workload", axis), f"also given as grid.{axis}; give it in one place")
        seen: list[MethodVariant] = []
        for i, variant in self.variants():
            self._check_variant(i, variant)
            if variant in seen:
                raise FieldProblem(("grid", "methods", i), f"duplicate method entry {variant.label!r} (each point "
                                                           "runs once; use `repeats` for repeated measurements)")
            seen.append(variant)
        twins = [("twin",)] if self.twin is not None else []
        twins += [("grid", "methods", i, "twin") for i, e in enumerate(self.grid.methods) if e.twin is not None]
        for i, e in enumerate(self.grid.methods):
            if e.twin is not None and e.method == "auto":
                raise FieldProblem(("grid", "methods", i, "twin"), "method 'auto' does not speculate: a twin pins "
                                                                   "a speculative point's acceptance")
        if twins and not _engine_can_twin(self.engine):
            raise FieldProblem(twins[0], f"engine {self.engine!r} has no way to force acceptance: no twin "
                                         "(benchkit.engines.registry: vLLM, SGLang have one)")
        if self.server.engine_cpus and adapter_for(self.engine).cpu_placement is None:
            raise FieldProblem(("server", "engine_cpus"), f"engine {self.engine!r} has no known way to bind its "
                                                          "processes to CPUs (vLLM's CPU build has one)")
        for tp, indices in self.gpus.items():
            if tp not in self.grid.tp:
                raise FieldProblem(("gpus", tp), f"{tp} is not a TP degree of grid.tp {self.grid.tp}")
            if len(indices) != tp:
                raise FieldProblem(("gpus", tp), f"TP {tp} needs {tp} distinct GPU indices, got {indices}")
        return self

    def _check_size(self) -> None:
        """Refuse a grid of more than MAX_SWEEP_RUNS runs before anything is expanded: the
        product of the axis lengths, the method variants (k values x tree budgets per entry),
        `repeats` and the hosts (10^7 points reached 12.9 GB in `start_sweep --dry-run`)."""
        g = self.grid
        variants = sum(len(e.num_speculative_tokens or [None]) * len(e.tree_budget or [None]) for e in g.methods)
        factors = {"tp": len(g.tp), "method variants": variants,
                   **{axis: len(getattr(g, axis) or [None]) for axis in GRID_AXES},
                   "repeats": self.repeats, "hosts": len(self.hosts or [None])}
        n = 1
        for f in factors.values():
            n *= f
        if n > MAX_SWEEP_RUNS:
            shown = " x ".join(f"{k} {v:,}" for k, v in factors.items() if v != 1)
            raise FieldProblem("grid", f"grid expands to {n:,} runs ({shown}); the limit is {MAX_SWEEP_RUNS:,} "
                                       "(split the sweep)")

    def _check_variant(self, i: int, v: MethodVariant) -> None:
        """The method table's rule for variant `v` of entry `i` (a sweep-wide prefix_caching
        counts where the entry sets none)."""
        prefix_from_server = v.prefix_caching is None and self.server.prefix_caching is not None
        prefix = self.server.prefix_caching if prefix_from_server else v.prefix_caching
        try:
            check_method(v.method, v.num_speculative_tokens, v.tree_budget,
                         v.drafter if v.drafter is not None else self.drafter, prefix)
        except MethodError as exc:
            if exc.field == "prefix_caching" and prefix_from_server:
                raise FieldProblem(("server", "prefix_caching"), f"{exc.reason}: set prefix_caching on the "
                                                                 "other method entries instead") from None
            hint = " (set it here or at the top level)" if exc.field == "drafter" else ""
            raise FieldProblem(("grid", "methods", i, exc.field), exc.reason + hint) from None

    def variants(self) -> list[tuple[int, MethodVariant]]:
        """(entry index, variant) for every method variant, in file order: each entry's k values
        x tree budgets."""
        out = []
        for i, e in enumerate(self.grid.methods):
            for k, b in itertools.product(e.num_speculative_tokens or [None], e.tree_budget or [None]):
                twin = e.twin or (self.twin if e.method != "auto" else None)
                out.append((i, MethodVariant(e.method, k, b, e.drafter, e.engine_build, e.prefix_caching,
                                             list(e.extra_args), twin.request() if twin else None)))
        return out


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
    #: The acceptance-controlled twin asked for this variant (the entry's `twin:`, else the
    #: file's for a speculative method); None: no twin. Not part of the variant's identity.
    twin: TwinRequest | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        """Short display label (benchkit.methods.method_label): `auto`, `b15`, `draft_model k=4`."""
        return method_label(self.method, self.num_speculative_tokens, self.tree_budget)


@dataclass
class SweepSpec:
    """A parsed sweep file. `grid` holds `tp` (list[int]), `methods` (list[MethodVariant]) and
    the workload axes `concurrency`, `output_len`, `input_len` (list[int]). `server`,
    `workload`, `limits` hold the keys the file sets for the matching `benchkit.specs`
    dataclasses; `slo` maps `ttft_ms` / `tpot_ms` / `e2el_ms` to bounds in ms. `source` is the
    file it came from; `raw` the file's data (placeholders substituted), stored with the sweep."""

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
    #: False: a TP group may not span NUMA nodes (the file's `cross_numa: false`); a TP degree
    #: that cannot stay inside one is refused on that host (fit_on).
    cross_numa: bool = True
    #: Runs that differ only in workload share one server start (MEASUREMENT.md, "Reusing a
    #: server between points"); false gives every run a server of its own.
    share_server: bool = True
    #: The hosts the file names (`hosts:`), each running the whole grid; [] = the caller's host.
    hosts: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "<dict>"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The parsed document with its line numbers (benchkit.configfile.LineDict; a plain dict
    #: when parsed from data), to locate problems found after parsing (`Refusal`).
    doc: Any = field(default=None, repr=False, compare=False)

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
        n = len(g["tp"]) * len(g["methods"]) * self.repeats
        for axis in GRID_AXES:
            n *= len(g[axis])
        return n

    def expand(self, assign_gpus: Callable[[int], list[GpuRef]] | None = None) -> list[RunSpec]:
        """All runs of the grid, in the order tp x method variant x concurrency x output_len x
        input_len x temperature x repeat (runs that can share a server start are adjacent).

        `assign_gpus(tp)` returns the GPUs for a run of that TP degree; without it `gpus` is []
        (the runner allocates at run time). DDTree variants get prefix caching off.
        `is_demo_model` is set when the model's config.json carries `draftboard_demo: true`.
        """
        runs: list[RunSpec] = []
        g = self.grid
        demo = bool(self.server.get("is_demo_model")) or is_demo_model(self.model)
        for tp, variant in itertools.product(g["tp"], g["methods"]):
            prefix = variant.prefix_caching
            if prefix is None:
                prefix = self.server.get("prefix_caching")
            info = METHODS[variant.method]
            if info.prefix_caching_off and prefix is None:
                prefix = False
            server_kwargs = {
                k: v for k, v in self.server.items() if k not in ("prefix_caching", "extra_args", "env")
            }
            server = ServerConfig(
                engine=self.engine,
                model=self.model,
                drafter=(variant.drafter if variant.drafter is not None else self.drafter)
                if info.needs_drafter or variant.drafter
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
            for values in itertools.product(*(g[axis] for axis in GRID_AXES)):
                for rep in range(self.repeats):
                    workload = WorkloadSpec(**self.workload, **dict(zip(GRID_AXES, values, strict=True)),
                                            slo=dict(self.slo))
                    runs.append(
                        RunSpec(
                            server=copy.deepcopy(server),
                            workload=workload,
                            gpus=list(assign_gpus(tp)) if assign_gpus else [],
                            port=self.port,
                            repeat_index=rep,
                            limits=Limits(**self.limits),
                        )
                    )
        return runs

    def fit_on(self, inventory: HostInventory | None, host: str = "") -> HostFit:
        """The sweep planned on a host's inventory (benchkit.hosts.allocation.fit_sweep_gpus,
        with the file's pinned GPUs and `cross_numa`): every run of a TP degree the host holds, on
        that degree's GPUs, and a located Refusal for each TP degree it cannot hold. `host` names
        the host in the reasons. Without an inventory no GPUs are planned and nothing is refused
        ({} and runs with `gpus` [])."""
        if inventory is None:
            return HostFit(host, {}, self.expand(), [])
        plan, refused = fit_sweep_gpus(inventory, self.grid["tp"], self.pinned_gpus, cross_numa=self.cross_numa)
        runs = self.expand(assign_gpus=lambda tp: plan[tp].gpu_refs() if tp in plan else [])
        refusals = []
        for tp, exc in refused.items():
            loc = ("gpus", tp) if exc.pinned else ("grid", "tp", self.grid["tp"].index(tp))
            line, shown = locate(self.doc if self.doc is not None else self.raw, loc)
            refusals.append(Refusal(self.source, line, format_field(shown), f"host {host}: {exc}" if host else str(exc),
                                    host, tp, exc.cause, [r for r in runs if r.server.tp == tp]))
        refusals.sort(key=lambda r: (r.line or 0, r.tp))  # file order
        return HostFit(host, plan, [r for r in runs if r.server.tp not in refused], refusals)

    def expand_on(self, inventory: HostInventory | None,
                  host: str = "") -> tuple[dict[int, Allocation], list[RunSpec]]:
        """The runs with their GPUs planned from a host's inventory, all or nothing: (TP degree
        -> Allocation, `expand()` with every run of one TP degree on that degree's GPUs), as
        `fit_on`. Raises PointsRefused (a SweepError) listing every TP degree the host cannot
        hold."""
        fit = self.fit_on(inventory, host)
        if fit.refused:
            raise PointsRefused(fit.refused)
        return fit.gpu_plan, fit.runs

    def check_datasets(self, runs: list[RunSpec] | None = None, *, missing_ok: bool = False) -> int:
        """Read and validate every distinct dataset selection of `runs` (default `expand()`)
        without a server (benchkit.measure.datasets.check_dataset: the records, the split, the
        categories, the per-category sample and enough prompts for warmup + num_prompts). Returns
        how many selections were checked. `missing_ok`: a dataset file that does not exist on
        this machine is left to the GPU host's preflight (a sweep entered on the web for another
        host). Raises SweepError at `workload.dataset_path` whose message is the dataset's own
        `file:line: field: reason`."""
        seen: set[tuple] = set()
        checked = 0
        for r in self.expand() if runs is None else runs:
            w = r.workload
            key = (w.dataset, w.dataset_path, w.dataset_split, tuple(w.dataset_categories), w.prompts_per_category,
                   w.dataset_turns, w.seed, w.n_warmup + w.num_prompts)
            if w.dataset not in datasets.CATEGORIZED_KINDS or key in seen:
                continue
            seen.add(key)
            if missing_ok and not Path(w.dataset_path).exists():
                continue
            checked += 1
            try:
                datasets.check_dataset(w)
            except (datasets.DatasetError, ValueError) as exc:
                line, shown = locate(self.doc if self.doc is not None else self.raw, ("workload", "dataset_path"))
                raise SweepError(self.source, line, format_field(shown), str(exc)) from None
        return checked

    def twin_for(self, spec: RunSpec) -> TwinRequest | None:
        """The twin asked for the real run `spec` (one of `expand`'s): its method variant's
        `twin` (matched on method, k, tree budget, engine build); None for a twin itself, or
        when none was asked."""
        s = spec.server
        if s.acceptance_tau is not None:
            return None
        for v in self.methods:
            build = v.engine_build if v.engine_build is not None else self.engine_build
            if (v.method, v.num_speculative_tokens, v.tree_budget, build) == (
                    s.method, s.num_speculative_tokens, s.tree_budget, s.engine_build) and v.twin is not None:
                return v.twin
        return None

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain JSON-ready data (the parsed file, placeholders substituted)."""
        return copy.deepcopy(self.raw)


@dataclass
class HostFit:
    """A sweep planned on one host (SweepSpec.fit_on): `host` (its name, "" unnamed),
    `gpu_plan` TP degree -> Allocation for the degrees it holds, `runs` their RunSpecs in
    expansion order, `refused` a Refusal per TP degree it cannot hold (ascending TP)."""

    host: str
    gpu_plan: dict[int, Allocation]
    runs: list[RunSpec]
    refused: list[Refusal]


def _substitute(obj: Any, variables: dict[str, str], source: str, root: Any, loc: tuple = ()) -> Any:
    """`obj` with `{name}` placeholders in every string replaced from `variables` (line tracking
    kept). Raises SweepError at the string that names an unknown placeholder."""
    if isinstance(obj, str):

        def sub(m: re.Match) -> str:
            if m.group(1) not in variables:
                line, shown = locate(root, loc)
                raise SweepError(source, line, format_field(shown), f"unknown placeholder {{{m.group(1)}}} "
                                 f"(known: {', '.join(sorted(variables)) or 'none'})")
            return str(variables[m.group(1)])

        return _PLACEHOLDER_RE.sub(sub, obj)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # a LineDict keeps its lines
        for k, v in obj.items():
            out[k] = _substitute(v, variables, source, root, (*loc, k))
        return out
    if isinstance(obj, list):
        out_l = copy.copy(obj)
        for i, v in enumerate(obj):
            out_l[i] = _substitute(v, variables, source, root, (*loc, i))
        return out_l
    return obj


def parse_sweep(data: Any, source: str = "<dict>", variables: dict[str, str] | None = None) -> SweepSpec:
    """Validate a parsed sweep document (SweepFile) and build a SweepSpec.

    `variables` substitutes `{name}` placeholders in every string (e.g. `demo_target`,
    `demo_draft`); an unknown placeholder is then an error. Without `variables`,
    placeholders stay as written (`SweepSpec.placeholders()` lists them). After the layout, every
    (method, engine build) must be defined in the engine flags file (engine_flags.yaml plus
    DRAFTBOARD_ENGINE_FLAGS). Raises SweepError naming `source`, the line (when `data` came from
    `loads_sweep`) and the field.
    """
    if variables is not None:
        data = _substitute(data, variables, source, data)
    if not isinstance(data, dict):
        raise SweepError(source, getattr(data, "line", None), "", "a sweep file must be a mapping at the top level")
    try:
        sf = SweepFile.model_validate(data)
    except ValidationError as exc:
        p = first_problem(exc, data, SweepFile)
        raise SweepError(source, p.line, p.field, p.reason) from None
    variants = sf.variants()
    _check_against_flags(sf, variants, data, source)
    _check_baseline_builds(sf, variants, data, source)
    workload = sf.workload.model_dump(exclude_unset=True)
    grid: dict[str, Any] = {"tp": list(sf.grid.tp), "methods": [v for _, v in variants]}
    for axis in GRID_AXES:
        listed = getattr(sf.grid, axis)
        grid[axis] = list(listed) if listed is not None else [workload.pop(axis, getattr(_WORKLOAD, axis))]
    return SweepSpec(
        name=sf.name,
        engine=sf.engine,
        model=sf.model,
        grid=grid,
        description=sf.description,
        drafter=sf.drafter,
        engine_build=sf.engine_build,
        port=sf.port,
        server=sf.server.model_dump(exclude_unset=True),
        workload=workload,
        limits=sf.limits.model_dump(exclude_unset=True),
        slo=sf.slo.model_dump(exclude_none=True),
        repeats=sf.repeats,
        pinned_gpus={tp: list(ix) for tp, ix in sf.gpus.items()},
        cross_numa=sf.cross_numa,
        share_server=sf.share_server,
        hosts=list(sf.hosts or []),
        extra=plain(sf.extra) or {},
        source=source,
        raw=plain(data),
        doc=data,
    )


def _check_against_flags(sf: SweepFile, variants: list[tuple[int, MethodVariant]], data: Any, source: str) -> None:
    """Every (method, build) must be defined in the engine flags file for the engine, and the
    build's environment (`python`, `launcher`) must be well formed."""
    if not is_launched(sf.engine):
        return
    try:
        adapter = adapter_for(sf.engine)
    except EngineConfigError as exc:
        raise SweepError(source, None, "engine", str(exc)) from None
    for i, variant in variants:
        try:
            build = variant.engine_build if variant.engine_build is not None else sf.engine_build
            adapter.method_entry(variant.method, build)
            adapter.build_env(build)
        except EngineConfigError as exc:
            line, shown = locate(data, ("grid", "methods", i))
            raise SweepError(source, line, format_field(shown), str(exc)) from None


def _check_baseline_builds(sf: SweepFile, variants: list[tuple[int, MethodVariant]], data: Any, source: str) -> None:
    """A sweep that measures `auto` must measure it on every engine build its other methods use:
    a speedup divides two runs of the same build (MEASUREMENT.md "Comparing runs"), so a method
    on a build without an `auto` run would never get a number. Raises SweepError at that method."""
    def build(v: MethodVariant) -> str:
        return v.engine_build if v.engine_build is not None else sf.engine_build

    baselines = {build(v) for _, v in variants if v.method == "auto"}
    if not baselines:
        return
    for i, v in variants:
        if build(v) not in baselines:
            line, shown = locate(data, ("grid", "methods", i))
            raise SweepError(source, line, format_field(shown) + ".engine_build",
                             f"{v.label} runs on build {build(v) or sf.engine!r} but auto runs only on "
                             f"{', '.join(repr(b or sf.engine) for b in sorted(baselines))}: its speedups would have "
                             "no baseline; set engine_build at the top level so every method runs on one build, or "
                             "add an auto entry with the same engine_build")


def load_sweep_file(path: str | Path, variables: dict[str, str] | None = None) -> SweepSpec:
    """Read and validate a sweep YAML file (see module docstring). Raises SweepError naming the
    file, line and field; a YAML syntax error is reported with its line too."""
    path = Path(path)
    try:
        if (size := path.stat().st_size) > MAX_YAML_BYTES:  # refused before reading (a 50 MB file took 400 s)
            raise SweepError(str(path), None, "", f"{size:,} bytes: larger than the {MAX_YAML_BYTES:,} bytes a "
                                                  "sweep file may have (split the sweep)")
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
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise SweepError(source, line, "", f"invalid YAML: {problem}") from None
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
