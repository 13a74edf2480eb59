"""The point: one counted run's configuration and figures, the record every page, speedup, sweep
comparison, trend, regression check and export reads. Django-free; built from stored rows by
one selector (`runs.selectors.load_points`).

The configuration is a flat set of fields in named groups (the only list of them in draftboard):

| group | fields | what it says |
| --- | --- | --- |
| engine | engine, engine_version, engine_build, engine_commit | which engine build served it |
| model | model, drafter | the target and the draft model (paths as the sweep gave them) |
| parallel | tp | tensor-parallel degree |
| decoding | method, num_speculative_tokens, tree_budget | the decoding configuration (its `label`) |
| workload | concurrency, output_len, input_len, dataset, request_rate, temperature, seed | the load sent |
| placement | host_id, gpu_uuids, gpu_names | where it ran (GPUs by UUID, their NVML names) |
| environment | hardware_fingerprint | the host's hardware snapshot in force when it started |
| run | sweep_id, repeat_index, run_id | which stored run it is |
| lossless | lossless_verdict, _identical_share, _divergence_median, _sentence | its lossless verdict |
| validity | suspect_reasons | the run's suspect marks ("code: message"; benchkit.compare.verdicts reads the codes) |

Each field's metadata also says which keys it belongs to, and the keys are read off that:

- `identity_key` (IDENTITY): the same point in two sweeps (benchkit.compare.sweepdiff):
  engine name, model, drafter, decoding, TP, workload; not the build, GPUs or repeat.
- `match_key` (MATCH): what must be equal for a speedup to divide two points
  (MEASUREMENT.md "Comparing runs": same engine build, model, GPUs, TP and workload; the host
  too, so that hosts without GPUs never pair); `config_key` (CONFIG): what a speedup varies
  (decoding and drafter).
- `env_key` (ENV): what must also be equal for two sweeps' points to be compared (engine
  version, build and commit, hardware fingerprint).
- `grid_key` (AXIS, then the run id): the grid's order (TP, decoding, concurrency, output
  and input length), empty values last. AXIS fields are also a sweep's filter dimensions; the
  AXIS fields outside the decoding configuration (`SHAPE_FIELDS`) are where a missing baseline
  is looked for; FILTER fields are what the history pages filter runs by.
- Which fields of a RunSpec define a measurement (its stored `point_key`, with options the record
  does not carry: dtype, extra args, burstiness, ...) is the RunSpec's own metadata
  (`point_key` in `benchkit.config_record`); every IDENTITY field is one of them (tests/test_point.py). A server
  start's key (`RunSpec.server_key`) is every ServerConfig field plus the GPUs and a pinned
  port: it does not apply to a stored point.

The lossless group is what the run's stored lossless check says (computed when its sweep's last run
finished, runs.services.lossless; "" / None where none was computed, e.g. an `auto` run, which is
the baseline): the verdict code (benchkit.compare.lossless.VERDICTS), the share of requests whose
output equals AR's (0..1), the median first divergence (tokens, or characters for an engine that
returns text only) and the sentence the pages print. It belongs to no key and is not compared
(equality covers the configuration); `benchkit.compare.lossless.lossless_mark` reads it.

The figures are the run's `benchkit.measure.metrics.WindowMetrics` fields (names with units:
`output_throughput_tok_s`, `median_tpot_ms`, ...; None where unknown) plus the figures priced when
read (`PRICED_FIGURES`), each an attribute of the point, and only those the reader loaded: reading
one that was not loaded raises AttributeError naming it (never a silent None).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import FrozenInstanceError, InitVar, dataclass, field, fields
from functools import lru_cache
from operator import attrgetter
from typing import Any

from benchkit.measure.metrics import METRICS
from benchkit.methods import method_label

#: Keys a field may belong to (see the module docstring).
IDENTITY, MATCH, CONFIG, ENV, AXIS, FILTER = "identity", "match", "config", "env", "axis", "filter"

#: The figure that says how fast a point is, and the one an end-to-end speedup divides
#: (MEASUREMENT.md "Comparing runs"): output tok/s over the window.
SPEED_FIELD = "output_throughput_tok_s"
#: Figures priced when read (runs.selectors.cost_of at today's GPU-hour price), not stored.
PRICED_FIGURES = ("cost_usd_per_m_output_tokens", "price_usd_per_gpu_hour")
#: Every figure a point may carry: the metric schema's fields, then the priced ones.
FIGURE_NAMES: tuple[str, ...] = (*METRICS, *PRICED_FIGURES)


def _field(group: str, *keys: str, default: Any = None, header: str = "", compare: bool = True) -> Any:
    return field(default=default, compare=compare, metadata={"group": group, "keys": frozenset(keys),
                                                             "header": header})


class _Figures:
    """The figure slots of a Point (FIGURE_NAMES), set only for the figures that were loaded."""

    __slots__ = FIGURE_NAMES

    def __getattr__(self, name: str) -> Any:
        # called only when normal lookup failed: an unset figure slot or an unknown name
        if name in _FIGURE_SET:
            raise _NotLoaded(self, name)
        raise AttributeError(f"{type(self).__name__} has no field or figure {name!r}")

    def figures(self) -> dict[str, Any]:
        """{figure name: value} of the loaded figures, in FIGURE_NAMES order."""
        out = {}
        for name in FIGURE_NAMES:
            try:
                out[name] = object.__getattribute__(self, name)
            except AttributeError:
                pass
        return out


_FIGURE_SET = frozenset(FIGURE_NAMES)


class _NotLoaded(AttributeError):
    """A figure slot that was not loaded. The message (which lists the loaded figures) is built
    only when shown: `getattr(point, name, default)` on a sweep page's thousands of points
    catches this without reading it."""

    def __init__(self, point: _Figures, name: str) -> None:
        super().__init__(name)
        self.point, self.figure = point, name

    def __str__(self) -> str:
        return (f"figure {self.figure!r} was not loaded on this point (loaded: "
                f"{', '.join(self.point.figures()) or 'none'}); load it with the selector's figures")


@lru_cache(maxsize=1024)
def _label(method: str, k: int | None, budget: int | None) -> str:
    return method_label(method, k, budget)


@dataclass(frozen=True, slots=True)
class Point(_Figures):
    """One counted run: its configuration (the groups of the module docstring; every field has a
    default, so a test may name only what it needs) and the figures given in `figures_`
    ({FIGURE_NAMES entry: value}; KeyError for another name; `build_points` for stored rows). `label` is the decoding
    configuration's label (benchkit.methods.method_label: `auto`, `linear`, `b15`,
    `draft_model k=4`), computed from `method`, `num_speculative_tokens` and `tree_budget`.

    Frozen: figures are set once, here. Equality and hash cover the configuration (which names
    the run), not the figures. `dataclasses.replace` would drop the figures: use `replace`."""

    # engine
    engine: str = _field("engine", IDENTITY, MATCH, default="")
    engine_version: str = _field("engine", MATCH, ENV, default="")
    engine_build: str = _field("engine", MATCH, ENV, default="")
    engine_commit: str = _field("engine", ENV, default="")
    # model
    model: str = _field("model", IDENTITY, MATCH, default="")
    drafter: str = _field("model", IDENTITY, CONFIG, default="")
    # parallel
    tp: int = _field("parallel", IDENTITY, MATCH, AXIS, FILTER, default=1, header="TP")
    # decoding
    method: str = _field("decoding", IDENTITY, CONFIG, AXIS, FILTER, default="auto")
    num_speculative_tokens: int | None = _field("decoding", IDENTITY, CONFIG, AXIS, header="k")
    tree_budget: int | None = _field("decoding", IDENTITY, CONFIG, AXIS)
    # workload (None: not in an imported file)
    concurrency: int | None = _field("workload", IDENTITY, MATCH, AXIS, FILTER, default=1)
    output_len: int | None = _field("workload", IDENTITY, MATCH, AXIS, FILTER, default=128,
                                    header="output tokens")
    input_len: int | None = _field("workload", IDENTITY, MATCH, AXIS, FILTER, default=128,
                                   header="input tokens")
    dataset: str = _field("workload", IDENTITY, MATCH, default="random")
    request_rate: float | None = _field("workload", IDENTITY, MATCH)
    temperature: float = _field("workload", IDENTITY, MATCH, default=0.0)
    seed: int = _field("workload", IDENTITY, MATCH, default=0)
    # placement
    host_id: int | None = _field("placement", MATCH)
    gpu_uuids: tuple[str, ...] = _field("placement", MATCH, default=())
    gpu_names: tuple[str, ...] = _field("placement", default=())
    # environment ("" where not read)
    hardware_fingerprint: str = _field("environment", ENV, default="")
    # run
    sweep_id: int | None = _field("run")
    repeat_index: int = _field("run", default=0)
    run_id: int = _field("run", default=0, header="run")
    # lossless (the stored verdict; not part of the configuration: never compared)
    lossless_verdict: str = _field("lossless", default="", header="lossless", compare=False)
    lossless_identical_share: float | None = _field("lossless", header="identical share", compare=False)
    lossless_divergence_median: float | None = _field("lossless", header="first divergence (median)", compare=False)
    lossless_sentence: str = _field("lossless", default="", header="lossless verdict", compare=False)
    # validity (the run's suspect marks, `Run.suspect_reasons`: "code: message" each; not compared)
    suspect_reasons: tuple[str, ...] = _field("validity", default=(), header="suspect marks", compare=False)
    # derived
    label: str = field(init=False, repr=False, compare=False, default="")
    figures_: InitVar[Mapping[str, Any] | None] = None

    def __post_init__(self, figures_: Mapping[str, Any] | None) -> None:
        _set(self, "label", _label(self.method, self.num_speculative_tokens, self.tree_budget))
        for name, value in (figures_ or {}).items():
            if name not in _FIGURE_SET:
                raise KeyError(f"not a figure of a point: {name!r} (a WindowMetrics field or one of "
                               f"{', '.join(PRICED_FIGURES)})")
            _set(self, name, value)

    def replace(self, **changes: Any) -> Point:
        """A copy with `changes` applied: configuration fields and figures by name (figures added
        or replaced; the loaded ones kept)."""
        config = {f: changes.pop(f) if f in changes else getattr(self, f) for f in RECORD_FIELDS}
        return Point(**config, figures_={**self.figures(), **changes})

    def with_only(self, figures: Mapping[str, Any], **config: Any) -> Point:
        """A copy with `config` fields changed that carries only `figures` (the loaded ones
        dropped): cheaper than `replace` where a caller needs a few figures of many points
        (benchkit.compare.categories)."""
        base = {f: config.pop(f) if f in config else getattr(self, f) for f in RECORD_FIELDS}
        if config:
            raise KeyError(f"not configuration fields of a point: {', '.join(config)}")
        return Point(**base, figures_=figures)

    def identity_key(self) -> tuple:
        """IDENTITY fields, in declaration order: the same point across sweeps."""
        return _identity(self)

    def identity(self) -> dict[str, Any]:
        """{IDENTITY field: value}, in declaration order."""
        return dict(zip(IDENTITY_FIELDS, _identity(self), strict=True))

    def identity_hash(self) -> str:
        """`identity_key` as 32 hex digits of SHA-256 over canonical JSON of `identity()` (sorted
        keys, no spaces): stable across releases (stored as a regression flag's natural key)."""
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def match_key(self) -> tuple:
        """MATCH fields, in declaration order: what two points a speedup divides share."""
        return _match(self)

    def config_key(self) -> tuple:
        """CONFIG fields, in declaration order: the decoding configuration a speedup varies."""
        return _config(self)

    def env_key(self) -> tuple:
        """ENV fields, in declaration order ("" for an unknown value, as the record keeps it): what
        two sweeps' points must share to be compared."""
        return _env(self)

    def shape_key(self) -> tuple:
        """SHAPE_FIELDS: the grid cell but for the decoding configuration."""
        return _shape(self)

    def grid_key(self) -> tuple:
        """Sort key of the grid's order: the AXIS fields in declaration order, then the run id;
        an empty value (None) after every value, text by code point (as PostgreSQL orders
        ascending with a byte-order collation)."""
        out: tuple = ()
        for v in _grid(self):
            out += (True, 0) if v is None else (False, v)
        return out


def _frozen(self: Point, name: str, *value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to {name!r}: a point is frozen (Point.replace makes a changed copy)")


# the dataclass's own guard misreports figure slots under slots=True (a TypeError from super()):
# one guard for fields and figures alike
Point.__setattr__ = _frozen  # type: ignore[method-assign,assignment]
Point.__delattr__ = _frozen  # type: ignore[method-assign,assignment]
_set = object.__setattr__
_FIELDS = tuple(f for f in fields(Point) if f.init)
#: Every configuration field of the record, in declaration order.
RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in _FIELDS)
#: Field -> its group; group -> its fields (declaration order).
FIELD_GROUP: dict[str, str] = {f.name: f.metadata["group"] for f in _FIELDS}
#: Field -> its column header in tables and exports (`TP`, `output tokens`; else the name in words).
HEADERS: dict[str, str] = {f.name: f.metadata["header"] or f.name.replace("_", " ") for f in _FIELDS}
GROUPS: dict[str, tuple[str, ...]] = {}
for _f in _FIELDS:
    GROUPS[_f.metadata["group"]] = (*GROUPS.get(_f.metadata["group"], ()), _f.name)


def fields_with(key: str) -> tuple[str, ...]:
    """The record fields that belong to `key` (IDENTITY, MATCH, ...), in declaration order."""
    return tuple(f.name for f in _FIELDS if key in f.metadata["keys"])


IDENTITY_FIELDS = fields_with(IDENTITY)
MATCH_FIELDS = fields_with(MATCH)
CONFIG_FIELDS = fields_with(CONFIG)
ENV_FIELDS = fields_with(ENV)
AXIS_FIELDS = fields_with(AXIS)
FILTER_FIELDS = fields_with(FILTER)
#: The grid's order: its axes, then the run.
GRID_FIELDS = (*AXIS_FIELDS, "run_id")
#: The grid's axes outside the decoding configuration (TP and workload shape).
SHAPE_FIELDS = tuple(f for f in AXIS_FIELDS if f not in CONFIG_FIELDS)
#: What a configuration label is made of (the decoding group).
DECODING_FIELDS = GROUPS["decoding"]

_identity = attrgetter(*IDENTITY_FIELDS)
_match = attrgetter(*MATCH_FIELDS)
_config = attrgetter(*CONFIG_FIELDS)
_env = attrgetter(*ENV_FIELDS)
_shape = attrgetter(*SHAPE_FIELDS)
_grid = attrgetter(*GRID_FIELDS)


class _Builder(_Figures):
    """Same slots as Point, mutable: `build_points` fills one with plain attribute stores and then
    makes it a Point (`__class__` assignment between equal slot layouts), instead of the frozen
    dataclass's `object.__setattr__` call per field (a history page builds ten thousand points)."""

    __slots__ = Point.__slots__


@lru_cache(maxsize=64)
def _row_builder(config_fields: tuple[str, ...], figure_names: tuple[str, ...]) -> Callable[..., list[Point]]:
    """A function rows -> points for rows of `config_fields` then `figure_names`: the loop of
    `build_points` written out for these names (as dataclasses and namedtuple write their
    __init__), one unpacking assignment per row. The names are checked identifiers of the
    record and the schema."""
    names = (*config_fields, *figure_names)
    defaults = {f.name: f.default for f in _FIELDS if f.name not in config_fields}
    lines = ["def build(rows):", "    out = []", "    for row in rows:", "        p = new(Builder)",
             f"        ({', '.join(f'p.{n}' for n in names)},) = row"]
    lines += [f"        p.{n} = default_{n}" for n in defaults]
    lines += ["        p.label = label(p.method, p.num_speculative_tokens, p.tree_budget)",
              "        p.__class__ = Point", "        out.append(p)", "    return out"]
    scope: dict[str, Any] = {"new": _Builder.__new__, "Builder": _Builder, "Point": Point, "label": _label,
                             **{f"default_{n}": v for n, v in defaults.items()}}
    exec("\n".join(lines), scope)  # noqa: S102 (names are the record's fields and the schema's figures)
    return scope["build"]


def build_points(config_fields: Sequence[str], figure_names: Sequence[str], rows: Iterable[Sequence[Any]]
                 ) -> list[Point]:
    """Points from rows of values: each row holds `config_fields` (names of RECORD_FIELDS) then
    `figure_names` (FIGURE_NAMES), in that order; the record fields not named take their defaults.
    The one way points are made from stored data (runs.selectors.load_points calls it); equal to
    `Point(**config, figures_=figures)` per row. Raises KeyError naming an unknown name and
    ValueError for a row of another length."""
    for name in config_fields:
        if name not in FIELD_GROUP:
            raise KeyError(f"not a field of a point: {name!r}")
    for name in figure_names:
        if name not in _FIGURE_SET:
            raise KeyError(f"not a figure of a point: {name!r}")
    if not config_fields and not figure_names:
        return [Point() for _ in rows]
    return _row_builder(tuple(config_fields), tuple(figure_names))(rows)
