"""Sweep files: the shipped sweeps parse and expand to the right grid; bad files give errors
naming the file, the line and the field."""

from __future__ import annotations

import textwrap
from collections import Counter
from dataclasses import fields
from pathlib import Path

import pytest

from benchkit.engines.adapters import adapter_for
from benchkit.specs import GpuRef, Limits, RunSpec, ServerConfig, WorkloadSpec
from benchkit.sweeps.sweepfile import (
    LimitsSection,
    PointsRefused,
    ServerSection,
    SweepError,
    WorkloadSection,
    load_sweep_file,
    loads_sweep,
    parse_sweep,
    parse_variables,
)
from tests.test_allocation import h200_inventory, pcie8_inventory

SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
DEMO_VARS = {"demo_target": "/tmp/demo/target", "demo_draft": "/tmp/demo/draft",
             "demo_prompts": str(Path(__file__).parent / "fixtures" / "datasets" / "demo_categories.jsonl")}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_users_grid_expands_to_36_runs():
    spec = load_sweep_file(SWEEPS / "users-grid-sglang.yaml")
    runs = spec.expand()
    assert len(runs) == 36 == spec.n_runs()
    assert Counter(r.server.tp for r in runs) == {1: 12, 4: 12, 8: 12}
    labels = Counter((r.server.method, r.server.tree_budget) for r in runs)
    assert labels == {
        ("auto", None): 6,
        ("linear", None): 6,
        ("ddtree", 15): 6,
        ("ddtree", 16): 6,
        ("ddtree", 32): 6,
        ("ddtree", 64): 6,
    }
    assert Counter(r.workload.concurrency for r in runs) == {1: 18, 8: 18}
    assert {r.workload.output_len for r in runs} == {1024}
    for r in runs:
        assert r.server.engine == "sglang"
        # every method on the DDTree PR build, so each DDTree run has a matched auto baseline
        assert r.server.engine_build == "sglang-ddtree-pr"
        if r.server.method == "ddtree":
            assert r.server.prefix_caching is False
        assert r.server.drafter == ("" if r.server.method == "auto" else "/models/Qwen3.5-27B-DFlash")
    assert len({r.point_key() for r in runs}) == 36
    # every run turns into a command line
    sgl = adapter_for("sglang")
    for r in runs:
        assert sgl.build_argv(r.server, 30000, python="py")[:3] == ["py", "-m", "sglang.launch_server"]


def test_demo_sweep_substitutes_placeholders():
    raw = load_sweep_file(SWEEPS / "demo.yaml")
    assert raw.placeholders() == {"demo_target", "demo_draft", "demo_prompts"}
    spec = load_sweep_file(SWEEPS / "demo.yaml", variables=DEMO_VARS)
    assert spec.placeholders() == set()
    runs = spec.expand()
    # (auto + draft_model k=2, 4, 8 + ngram k=4) x concurrency 1 x 3 repeats
    assert len(runs) == 15 == spec.n_runs()
    assert [v.label for v in spec.methods] == ["auto", "draft_model k=2", "draft_model k=4", "draft_model k=8",
                                               "ngram k=4"]
    assert [r.repeat_index for r in runs[:3]] == [0, 1, 2] and runs[0].server == runs[2].server  # one start
    assert {r.server.model for r in runs} == {"/tmp/demo/target"}
    assert {r.server.drafter for r in runs if r.server.method == "draft_model"} == {"/tmp/demo/draft"}
    assert all(  # the trained weights are loaded: no dummy weights
        r.server.load_format != "dummy" and r.server.env == {"VLLM_CPU_KVCACHE_SPACE": "1"} for r in runs
    )
    assert all(
        r.workload.ignore_eos and r.workload.output_len == 128 and r.workload.num_prompts == 18
        and r.workload.temperature == 0.0 for r in runs
    )
    # real text in three categories, 6 prompts each (issue 33); the file is checked before any server
    assert {(r.workload.dataset, r.workload.prompts_per_category) for r in runs} == {("jsonl", 6)}
    assert spec.check_datasets() == 1
    assert {r.port for r in runs} == {None}  # no `port:` in the file: free ports are chosen at run time


@pytest.mark.parametrize("name", ["vllm-eagle3-example", "nightly-example"])
def test_other_shipped_sweeps_parse(name):
    spec = load_sweep_file(SWEEPS / f"{name}.yaml")
    runs = spec.expand()
    assert len(runs) == spec.n_runs() > 0
    assert len({r.point_key() for r in runs}) == len(runs)
    adapter = adapter_for(spec.engine)
    for r in runs:
        adapter.build_argv(r.server, r.port or adapter.default_port, python="py")


def test_expansion_order_repeats_gpus_and_roundtrip(tmp_path):
    path = write(
        tmp_path,
        """
        name: t
        engine: vllm
        model: /m
        drafter: /d
        grid:
          tp: [1, 2]
          methods: [auto, {method: draft_model, num_speculative_tokens: [2, 4]}]
          concurrency: [1, 8]
          output_len: [64, 128]
        repeats: 2
        slo: {ttft_ms: 500}
        """,
    )
    spec = load_sweep_file(path)
    calls = []

    def assign(tp):
        calls.append(tp)
        return [GpuRef(index=i, uuid=f"GPU-{i}") for i in range(tp)]

    runs = spec.expand(assign_gpus=assign)
    assert len(runs) == 2 * 3 * 2 * 2 * 2
    assert [len(r.gpus) for r in runs] == [r.server.tp for r in runs]
    assert calls == [r.server.tp for r in runs]
    first = runs[:8]  # tp=1, auto: concurrency x output_len x repeat
    assert [(r.workload.concurrency, r.workload.output_len, r.repeat_index) for r in first] == [
        (1, 64, 0),
        (1, 64, 1),
        (1, 128, 0),
        (1, 128, 1),
        (8, 64, 0),
        (8, 64, 1),
        (8, 128, 0),
        (8, 128, 1),
    ]
    assert runs[8].server.num_speculative_tokens == 2
    assert runs[0].workload.slo == {"ttft_ms": 500.0}
    again = RunSpec.from_dict(runs[5].to_dict())
    assert again.point_key() == runs[5].point_key()


def test_point_key_ignores_gpus_port_limits_but_not_repeat():
    spec = parse_sweep(
        {"name": "t", "engine": "vllm", "model": "/m", "grid": {"methods": ["auto"]}, "repeats": 2}
    )
    a, b = spec.expand()
    assert a.point_key() != b.point_key()
    c = RunSpec.from_dict(a.to_dict())
    c.gpus = [GpuRef(7, "GPU-7")]
    c.port = 9999
    c.limits.ready_timeout_s = 1.0
    assert c.point_key() == a.point_key()
    c.workload.concurrency = 2
    assert c.point_key() != a.point_key()


BASE = """
name: t
engine: sglang
model: /m
drafter: /d
"""


@pytest.mark.parametrize(
    ("body", "line", "field", "needle"),
    [
        ("grid:\n  methods: [auto]\n  tpp: [1]\n", 8, "grid.tpp", "unknown key"),
        (
            "grid:\n  methods:\n    - auto\n    - {method: ddtree, engine_build: sglang-ddtree-pr}\n",
            9,
            "grid.methods[1].tree_budget",
            "needs a tree budget",
        ),
        (
            "grid:\n  methods:\n    - {method: linear, tree_budget: 15}\n",
            8,
            "grid.methods[0].tree_budget",
            "only method 'ddtree'",
        ),
        ("grid:\n  methods:\n    - beam\n", 8, "grid.methods[0].method", "unknown method 'beam'"),
        ("grid:\n  methods: [auto]\n  tp: [1, two]\n", 8, "grid.tp[1]", "expected an integer"),
        ("grid:\n  methods: [auto]\n  concurrency: [0]\n", 8, "grid.concurrency[0]", "must be >= 1"),
        ("grid:\n  methods: [auto]\nworkload:\n  num_promts: 3\n", 9, "workload.num_promts", "unknown key"),
        ("grid:\n  methods: [auto]\nslo:\n  itl: 3\n", 9, "slo.itl", "unknown key"),
        ("grid:\n  methods: [auto]\nslo:\n  ttft_ms: -1\n", 9, "slo.ttft_ms", "positive"),
        ("grid:\n  methods: [auto]\nrepeats: 0\n", 8, "repeats", "must be >= 1"),
        (
            "grid:\n  methods:\n    - {method: ddtree, tree_budget: 15}\n",
            8,
            "grid.methods[0]",
            "not defined for engine 'sglang'",
        ),
        (
            "grid:\n  methods:\n    - {method: ddtree, tree_budget: 8, engine_build: sglang-ddtree-pr,"
            " prefix_caching: true}\n",
            8,
            "grid.methods[0].prefix_caching",
            "prefix caching off",
        ),
        ("grid:\n  methods: [auto]\nlimits:\n  max_error_rate: 5\n", 9, "limits.max_error_rate", "fraction"),
        ("grid:\n  methods: [auto]\nlimits:\n  telemetry_hz: 200\n", 9, "limits.telemetry_hz",
         "GPU readings per second within 0.1..50"),
        (
            "grid:\n  methods: [auto]\n  concurrency: [1]\nworkload:\n  concurrency: 2\n",
            10,
            "workload.concurrency",
            "also given as grid.concurrency",
        ),
        ("grid:\n  methods: [auto]\nserver:\n  env: {X: 1}\n", 9, "server.env", "strings"),
        ("grid:\n  methods: [auto]\nsurprise: 1\n", 8, "surprise", "unknown key"),
        # block-style entry: a missing key is reported at the line where its entry starts
        (
            "grid:\n  methods:\n    - auto\n    - method: ddtree\n      engine_build: sglang-ddtree-pr\n",
            9,
            "grid.methods[1].tree_budget",
            "needs a tree budget",
        ),
        (
            "grid:\n  methods:\n    - {method: ddtree, tree_budget: 15, num_speculative_tokens: 4,"
            " engine_build: sglang-ddtree-pr}\n",
            8,
            "grid.methods[0].num_speculative_tokens",
            "takes a tree budget, not num_speculative_tokens",
        ),
        # a sweep-wide prefix_caching: true would force it on for DDTree too
        (
            "grid:\n  methods:\n    - {method: ddtree, tree_budget: 15, engine_build: sglang-ddtree-pr}\n"
            "server:\n  prefix_caching: true\n",
            10,
            "server.prefix_caching",
            "prefix caching off",
        ),
        ("grid:\n  methods: [auto, auto]\n", 7, "grid.methods[1]", "duplicate method entry 'auto'"),
        ("grid:\n  methods: [auto]\n  tp: [1, 2]\ngpus:\n  2: [0, 0]\n", 10, "gpus.2", "duplicate values in [0, 0]"),
        ("grid:\n  methods: [auto]\n  tp: [1, 2]\ngpus:\n  4: [0, 1, 2, 3]\n", 10, "gpus.4", "not a TP degree"),
        ("grid:\n  methods: [auto]\nworkload:\n  dataset: jsonl\n", 9, "workload.dataset_path", "needs a path"),
        ("grid:\n  methods: [auto]\nengine: vllm\n", 8, "", "duplicate key 'engine'"),
        ("grid:\n  methods: [auto]\ncross_numa: no_thanks\n", 8, "cross_numa", "expected true/false"),
    ],
)
def test_bad_sweep_errors_name_file_line_field(tmp_path, body, line, field, needle):
    path = write(tmp_path, BASE + body)
    with pytest.raises(SweepError) as err:
        load_sweep_file(path)
    e = err.value
    assert e.source == str(path)
    assert e.field == field
    assert needle in e.message
    assert e.line == line
    assert str(e).startswith(f"{path}:{line}: {field}: " if field else f"{path}:{line}: ")


def test_missing_fields_and_drafter(tmp_path):
    with pytest.raises(SweepError, match="model: missing"):
        parse_sweep({"name": "t", "engine": "vllm", "grid": {"methods": ["auto"]}}, "x.yaml")
    with pytest.raises(SweepError, match=r"grid.methods\[0\].drafter: method 'linear' needs a drafter"):
        parse_sweep({"name": "t", "engine": "vllm", "model": "/m", "grid": {"methods": ["linear"]}}, "x.yaml")
    with pytest.raises(SweepError, match="engine: unknown engine 'tgi'"):
        parse_sweep({"name": "t", "engine": "tgi", "model": "/m", "grid": {"methods": ["auto"]}}, "x.yaml")
    with pytest.raises(SweepError, match="server.endpoint_url"):
        parse_sweep(
            {"name": "t", "engine": "external", "model": "m", "grid": {"methods": ["auto"]}}, "x.yaml"
        )
    with pytest.raises(SweepError, match=r"unknown placeholder \{nope\}"):
        parse_sweep(
            {"name": "t", "engine": "vllm", "model": "{nope}", "grid": {"methods": ["auto"]}},
            "x.yaml",
            variables=DEMO_VARS,
        )


def test_yaml_syntax_error_has_line(tmp_path):
    path = write(tmp_path, "name: t\nengine: vllm\ngrid: [\n")
    with pytest.raises(SweepError) as err:
        load_sweep_file(path)
    assert "invalid YAML" in err.value.message
    assert err.value.line is not None
    with pytest.raises(SweepError, match="cannot read"):
        load_sweep_file(tmp_path / "absent.yaml")


def test_file_sections_follow_the_spec_dataclasses():
    """The sweep file's `workload`, `limits` and `server` sections are the specs dataclasses'
    fields (slo is top level; the server fields the grid and top level set are left out), with
    the same defaults."""
    assert set(WorkloadSection.model_fields) == {f.name for f in fields(WorkloadSpec)} - {"slo"}
    assert set(LimitsSection.model_fields) == {f.name for f in fields(Limits)}
    set_elsewhere = {"engine", "model", "drafter", "method", "num_speculative_tokens", "tree_budget", "tp",
                     "engine_build", "acceptance_tau"}  # acceptance_tau: a twin's, from `twin:` (issue 21)
    assert set(ServerSection.model_fields) == {f.name for f in fields(ServerConfig)} - set_elsewhere
    for section, cls in ((WorkloadSection, WorkloadSpec), (LimitsSection, Limits), (ServerSection, ServerConfig)):
        default = cls()
        for name, info in section.model_fields.items():
            assert info.get_default(call_default_factory=True) == getattr(default, name), (section, name)


def test_placeholders_variables_and_admin_text():
    text = "name: t\nengine: vllm\nmodel: '{target}'\ngrid:\n  methods: [auto]\n  tp: [1]\n"
    spec = loads_sweep(text, "admin YAML")
    assert spec.placeholders() == {"target"}
    with pytest.raises(SweepError, match="unresolved placeholders {target}"):
        spec.require_resolved()
    spec = loads_sweep(text, "admin YAML", variables=parse_variables(["target=/models/x"]))
    assert [r.server.model for r in spec.expand()] == ["/models/x"]
    with pytest.raises(SweepError) as err:
        loads_sweep(text, "admin YAML", variables={"other": "1"})
    assert (err.value.line, err.value.field) == (3, "model")


def test_a_method_on_a_build_without_auto_is_refused_with_its_line(tmp_path):
    """Speedups divide runs of one engine build: DDTree alone on the PR build would never get a
    number, so the file is refused at the DDTree entry (this was the users' grid file's trap)."""
    text = (SWEEPS / "users-grid-sglang.yaml").read_text()
    text = text.replace("engine_build: sglang-ddtree-pr\n", "", 1).replace(
        "{method: ddtree, tree_budget: [15, 16, 32, 64], prefix_caching: false}",
        "{method: ddtree, tree_budget: [15, 16, 32, 64], prefix_caching: false, engine_build: sglang-ddtree-pr}")
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    with pytest.raises(SweepError, match=r"grid\.yaml:\d+: grid\.methods\[2\]\.engine_build: b15 runs on build "
                                         r"'sglang-ddtree-pr' but auto runs only on 'sglang'"):
        load_sweep_file(path)
    # without auto in the grid nothing is compared against it: allowed
    path.write_text(text.replace("    - auto\n", ""))
    assert load_sweep_file(path).n_runs() == 30


@pytest.mark.parametrize(
    ("inventory", "body", "line", "field", "reason"),
    [
        (h200_inventory, "grid:\n  methods: [auto]\n  tp: [1, 2, 3]\n", 8, "grid.tp[2]",
         "TP3 needs 3 GPUs; the host has 2 GPUs [0, 1]"),
        (h200_inventory, "grid:\n  methods: [auto]\n  tp:\n    - 1\n    - 4\n", 10, "grid.tp[1]",
         "TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]"),
        (h200_inventory, "grid:\n  methods: [auto]\n  tp: 4\n", 8, "grid.tp",
         "TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]"),
        (h200_inventory, "grid:\n  methods: [auto]\n  tp: [1, 2]\ngpus:\n  2: [4, 5]\n", 10, "gpus.2",
         "pinned GPUs [4, 5] are not on the host: the host has 2 GPUs [0, 1]"),
        (pcie8_inventory, "grid:\n  methods: [auto]\n  tp: [4, 8]\ncross_numa: false\n", 8, "grid.tp[1]",
         "TP8 cannot stay inside one NUMA node and the sweep forbids crossing NUMA nodes (cross_numa: false): "
         "the host has 8 GPUs [0, 1, 2, 3, 4, 5, 6, 7], at most 4 on one NUMA node "
         "(node 0: [0, 1, 2, 3]; node 1: [4, 5, 6, 7])"),
        (pcie8_inventory, "grid:\n  methods: [auto]\n  tp: [4]\ngpus: {4: [2, 3, 4, 5]}\ncross_numa: false\n", 9,
         "gpus.4", "pinned GPUs [2, 3, 4, 5] span NUMA nodes [0, 1] and the sweep forbids crossing NUMA nodes "
                   "(cross_numa: false); the host's GPUs by NUMA node: node 0: [0, 1, 2, 3]; node 1: [4, 5, 6, 7]"),
    ],
)
def test_a_point_the_host_cannot_hold_is_refused_at_its_line(tmp_path, inventory, body, line, field, reason):
    """Issue 19: errors about the host read `file:line: field: reason` like every other sweep-file
    error, at the TP value or the `gpus:` entry (real inventories: the 2 x H200 device, pcie8)."""
    path = write(tmp_path, BASE.replace("sglang", "vllm") + body)
    spec = load_sweep_file(path)
    fit = spec.fit_on(inventory(), "gpu-x")
    assert len(fit.refused) == 1
    refusal = fit.refused[0]
    assert (refusal.line, refusal.field, refusal.reason) == (line, field, f"host gpu-x: {reason}")
    assert str(refusal) == f"{path}:{line}: {field}: host gpu-x: {reason}"
    assert refusal.runs and {r.server.tp for r in refusal.runs} == {refusal.tp}
    assert refusal.tp not in fit.gpu_plan and all(r.server.tp != refusal.tp for r in fit.runs)
    assert all(len(r.gpus) == r.server.tp for r in fit.runs)  # the others are planned
    with pytest.raises(PointsRefused) as err:
        spec.expand_on(inventory(), "gpu-x")
    assert str(err.value) == str(refusal) and isinstance(err.value, SweepError)


def test_every_refusal_is_listed_in_file_order_and_data_without_lines_still_names_the_field():
    text = BASE.replace("sglang", "vllm") + "grid:\n  methods: [auto]\n  tp: [1, 2, 4]\ngpus:\n  2: [0, 7]\n"
    spec = loads_sweep(text, "admin YAML")
    fit = spec.fit_on(h200_inventory())  # no host name: the reason is the allocator's alone
    assert [str(r) for r in fit.refused] == [
        "admin YAML:8: grid.tp[2]: TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]",
        "admin YAML:10: gpus.2: pinned GPUs [7] are not on the host: the host has 2 GPUs [0, 1]",
    ]
    assert [len(r.runs) for r in fit.refused] == [1, 1] and [r.server.tp for r in fit.runs] == [1]
    with pytest.raises(PointsRefused) as err:
        spec.expand_on(h200_inventory())
    assert err.value.n_runs == 2 and len(str(err.value).splitlines()) == 2
    data = {"name": "t", "engine": "vllm", "model": "/m", "grid": {"methods": ["auto"], "tp": [1, 4]}}
    refusal = parse_sweep(data, "x.yaml").fit_on(h200_inventory(), "h").refused[0]
    assert str(refusal) == "x.yaml: grid.tp[1]: host h: TP4 needs 4 GPUs; the host has 2 GPUs [0, 1]"
    assert spec.fit_on(None).refused == []  # no inventory: nothing planned, nothing refused
