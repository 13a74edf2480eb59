"""The run configuration, declared once: every field of a run's server (`benchkit.specs.ServerConfig`)
and load (`benchkit.specs.WorkloadSpec`), each with its type, default, unit, group, whether it
defines the point, where a sweep file sets it and whether a Run row and an imported result file
carry it. A leaf module (standard library only), like the metric schema (benchkit.measure.metrics).

Derived from `RECORD`, never listed again:

- `benchkit.specs.ServerConfig` / `WorkloadSpec` (their fields, defaults and order) and
  `RunSpec.point_fields` / `point_key` (the fields with `point_key`);
- the sweep file's `server:` and `workload:` sections (`benchkit.sweeps.sweepfile.ServerSection`,
  `WorkloadSection`: type, bounds, choices, default);
- one point's sweep file (`benchkit.sweeps.fragment`: which key goes to which section);
- the format layer's workload keys (`benchkit.formats.common.WORKLOAD_KEYS`);
- the Run columns copied from a spec (`runs.services.sweeps.run_fields`) and from an imported file
  (`runs.services.imports`).

Checked against it by tests (tests/test_config_record.py), because their declarations carry more
than the record says: the Run model's columns (max lengths, help texts; a new column needs a
migration anyway), the sweep file's top level, grid and method entries (lists that expand), and
`benchkit.point.Point`'s configuration fields and groups.

Adding a configuration axis: one `ConfigField` here (and a migration when it is a Run column).

Groups (`GROUPS`): `engine` (engine and build, the server's options), `model` (target, drafter,
how it is loaded), `decoding` (the method and its parameters), `parallel` (parallelism and
placement), `workload` (the load sent). The names are `benchkit.point.Point`'s groups.

`point_key`: True, the field defines the measurement (in `RunSpec.point_fields`, so in the stored
`point_key`); `WHEN_SET`, only when it differs from its default (the keys of runs stored before the
field existed stay as they were); False, it says where, how long or under which name.

`section`: where the sweep file sets the field and where one point's sweep file writes it: `top`
(the file's top level), `server`, `workload`, `grid` (an axis of `grid:`), `grid.methods` (a method
entry), `twin` (the `twin:` section: planned, never written), `slo`. `also`: other sections that
set it too (a method entry overriding the sweep's drafter, a workload axis given once in
`workload:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: The workload's dataset kinds (the sweep file's `workload.dataset` choices).
DATASET_KINDS = ("random", "sharegpt", "jsonl", "speed_bench", "mt_bench", "spec_bench")
#: SPEED-Bench configs a workload may name (`dataset_split`; benchkit.measure.datasets.SPEED_BENCH_SPLITS).
SPEED_BENCH_SPLITS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k",
                      "throughput_32k")

GROUPS = {
    "engine": "engine and build, the server's options",
    "model": "model and drafter",
    "decoding": "method and its parameters",
    "parallel": "parallelism and placement",
    "workload": "the load sent",
}

#: `ConfigField.point_key`: in the point only when it differs from the default.
WHEN_SET = "when_set"

Part = Literal["server", "workload"]
Section = Literal["top", "server", "workload", "grid", "grid.methods", "twin", "slo"]


@dataclass(frozen=True)
class ConfigField:
    """One configuration field. `part`: ServerConfig (`server`) or WorkloadSpec (`workload`).
    `type`: its Python type; `default` (or `factory` for a list or dict); `unit` ("" for none);
    `group` (GROUPS); `point_key` (True, False or WHEN_SET); `section` / `also` (sweep file);
    `ge` / `gt`: the sweep file's lower bound; `choices`: the values a sweep file may give;
    `run_column`: a Run column of the same name holds it; `imported`: a result file's workload
    gives it (`ImportedRun.workload`, benchkit.formats.common). `doc`: what it is."""

    name: str
    part: Part
    type: Any
    group: str
    section: Section
    default: Any = None
    factory: Any = None
    unit: str = ""
    point_key: bool | str = True
    also: tuple[Section, ...] = ()
    ge: float | None = None
    gt: float | None = None
    choices: tuple[str, ...] = ()
    run_column: bool = False
    imported: bool = False
    doc: str = ""

    def default_value(self) -> Any:
        """The default (a new list or dict for a factory field)."""
        return self.factory() if self.factory is not None else self.default

    def sections(self) -> tuple[Section, ...]:
        """Every sweep-file section that sets it (`section` first)."""
        return (self.section, *self.also)

    def missing(self) -> Any:
        """What a Run column holds where an imported file does not say: "" for text (a text
        column is never NULL), None otherwise (missing is not zero)."""
        return "" if self.type is str else None


def _f(name: str, part: Part, type_: Any, group: str, section: Section, default: Any = None, **kw: Any) -> ConfigField:
    return ConfigField(name, part, type_, group, section, default, **kw)


S, W = "server", "workload"

#: The run configuration, in ServerConfig then WorkloadSpec field order.
RECORD: tuple[ConfigField, ...] = (
    # ServerConfig
    _f("engine", S, str, "engine", "top", "vllm", run_column=True, imported=True,
       doc="a name of the engine registry (benchkit.engines.registry)"),
    _f("model", S, str, "model", "top", "", run_column=True, imported=True,
       doc="the target model (a path or name, as the sweep gave it)"),
    _f("served_model_name", S, str, "model", "server", "", point_key=False,
       doc="the name the server serves the model under"),
    _f("drafter", S, str, "model", "grid.methods", "", also=("top",), run_column=True,
       doc="the draft model of a method that needs one"),
    _f("method", S, str, "decoding", "grid.methods", "auto", run_column=True,
       doc="a name of the method table (benchkit.methods)"),
    _f("num_speculative_tokens", S, int | None, "decoding", "grid.methods", unit="tokens", run_column=True,
       doc="k: the draft length per step"),
    _f("tree_budget", S, int | None, "decoding", "grid.methods", unit="nodes", run_column=True,
       doc="DDTree's node budget B (root not counted)"),
    _f("tp", S, int, "parallel", "grid", 1, unit="GPUs", run_column=True, doc="tensor-parallel degree"),
    _f("dtype", S, str, "model", "server", "", doc="the engine's --dtype (\"\": the engine's choice)"),
    _f("max_model_len", S, int | None, "model", "server", unit="tokens", ge=1, doc="the context length"),
    _f("load_format", S, str, "model", "server", "", doc="the engine's load format"),
    _f("prefix_caching", S, bool | None, "engine", "grid.methods", also=("server",),
       doc="prefix caching on/off (None: the engine's default; DDTree needs it off)"),
    _f("extra_args", S, list[str], "engine", "server", factory=list, also=("grid.methods",),
       doc="appended verbatim to the engine's argv"),
    _f("env", S, dict[str, str], "engine", "server", factory=dict, doc="the server's extra environment"),
    _f("endpoint_url", S, str, "engine", "server", "", doc="engine `external`: the server someone else started"),
    _f("engine_build", S, str, "engine", "top", "", also=("grid.methods",), run_column=True,
       doc="key into engine_flags.yaml `builds`, e.g. sglang-ddtree-pr"),
    _f("is_demo_model", S, bool, "model", "server", False, point_key=False, run_column=True,
       doc="the model's config.json carries `draftboard_demo: true`"),
    _f("acceptance_tau", S, float | None, "decoding", "twin", unit="tokens per verify pass", point_key=WHEN_SET,
       doc="a twin's pinned mean acceptance length, bonus token included (issue 21); None: a real run"),
    _f("engine_cpus", S, str, "parallel", "server", "", point_key=WHEN_SET,
       doc="a Linux CPU list for the engine's busy processes (benchkit.engines.cpus); \"\": the engine's own"),
    # WorkloadSpec
    _f("dataset", W, str, "workload", "workload", "random", choices=DATASET_KINDS, run_column=True, imported=True,
       doc="where the prompts come from (the Run column: `kind:path` but for random)"),
    _f("dataset_path", W, str, "workload", "workload", "", doc="the dataset's file (every kind but random)"),
    _f("dataset_split", W, str, "workload", "workload", "", point_key=WHEN_SET, choices=("", *SPEED_BENCH_SPLITS),
       doc="speed_bench: the SPEED-Bench config (\"\": qualitative)"),
    _f("dataset_categories", W, list[str], "workload", "workload", factory=list, point_key=WHEN_SET,
       doc="keep only the prompts of these categories (empty: every category)"),
    _f("prompts_per_category", W, int | None, "workload", "workload", unit="requests", ge=1, point_key=WHEN_SET,
       doc="a seeded sample of exactly this many prompts of each category (None: the file's order)"),
    _f("dataset_turns", W, str, "workload", "workload", "first", point_key=WHEN_SET, choices=("first", "all"),
       doc="multi-turn records: the first user turn, or every turn as a prompt of its own"),
    _f("input_len", W, int, "workload", "grid", 128, also=("workload",), unit="tokens", ge=1, run_column=True,
       imported=True, doc="prompt length"),
    _f("output_len", W, int, "workload", "grid", 128, also=("workload",), unit="tokens", ge=1, run_column=True,
       imported=True, doc="output length asked for"),
    _f("num_prompts", W, int, "workload", "workload", 16, unit="requests", ge=1, run_column=True, imported=True,
       doc="requests in the measured window"),
    _f("concurrency", W, int, "workload", "grid", 1, also=("workload",), unit="requests", ge=1, run_column=True,
       imported=True, doc="at most this many requests in flight"),
    _f("request_rate", W, float | None, "workload", "workload", unit="req/s", gt=0, run_column=True, imported=True,
       doc="open-loop arrival rate (None: closed loop)"),
    _f("burstiness", W, float, "workload", "workload", 1.0, gt=0, imported=True,
       doc="gamma shape of the arrivals (1.0 = Poisson)"),
    _f("ignore_eos", W, bool, "workload", "workload", True, doc="generate output_len tokens whatever the model says"),
    _f("temperature", W, float, "workload", "grid", 0.0, also=("workload",), ge=0, run_column=True,
       doc="sampling temperature (a grid axis; every request sends the workload's `seed`, plus j in round j "
           "of `samples_per_prompt`)"),
    _f("seed", W, int, "workload", "workload", 0, ge=0, run_column=True, doc="the prompts' and sampling seed"),
    _f("samples_per_prompt", W, int, "workload", "workload", 1, unit="requests", ge=1, point_key=WHEN_SET,
       doc="N: the measured requests are num_prompts / N distinct prompts, each sent N times in N rounds "
           "(round j sends every prompt once, with sampling seed `seed + j`; warmup: one request each, "
           "seed `seed`); num_prompts must be a multiple of N; N > 1 keeps every output's ids in full and "
           "lets the T > 0 lossless check judge the run (docs/LOSSLESS.md, \"Sampling (T > 0)\")"),
    _f("warmup_requests", W, int | None, "workload", "workload", unit="requests", ge=0, point_key=False,
       doc="requests before the window (None: max(concurrency, 1))"),
    _f("slo", W, dict[str, float], "workload", "slo", factory=dict, unit="ms", point_key=False,
       doc="goodput bounds: metric name (ttft_ms, tpot_ms, e2el_ms) -> upper bound"),
)


def of_part(part: Part, record: tuple[ConfigField, ...] | None = None) -> tuple[ConfigField, ...]:
    """The fields of ServerConfig (`server`) or WorkloadSpec (`workload`), in order."""
    return tuple(f for f in (RECORD if record is None else record) if f.part == part)


def in_section(section: Section, record: tuple[ConfigField, ...] | None = None, *, primary: bool = False
               ) -> tuple[ConfigField, ...]:
    """The fields a sweep file's `section` sets (`primary`: only those it is the first place of)."""
    return tuple(f for f in (RECORD if record is None else record)
                 if (f.section == section if primary else section in f.sections()))


def run_columns(record: tuple[ConfigField, ...] | None = None) -> tuple[ConfigField, ...]:
    """The fields a Run column of the same name holds."""
    return tuple(f for f in (RECORD if record is None else record) if f.run_column)


def imported_keys(record: tuple[ConfigField, ...] | None = None) -> tuple[str, ...]:
    """The fields an imported result file's workload gives (`ImportedRun.workload`)."""
    return tuple(f.name for f in (RECORD if record is None else record) if f.imported)


def field_named(name: str) -> ConfigField:
    """The field `name`; KeyError naming the known ones for another."""
    for f in RECORD:
        if f.name == name:
            return f
    raise KeyError(f"not a configuration field: {name!r} (known: {', '.join(f.name for f in RECORD)})")
