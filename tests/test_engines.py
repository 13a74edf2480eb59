"""Engine adapters: exact argv for every method on both engines, flag overrides from a user
file, validation errors, environment, URLs and the version read."""

from __future__ import annotations

import json
import sys

import pytest

from benchkit.engines.adapters import adapter_for, read_block_size
from benchkit.engines.flags import EngineConfigError, load_flags
from benchkit.specs import GpuRef, ServerConfig

VLLM = [
    "py",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/m/target",
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
    "--tensor-parallel-size",
    "2",
]
SGL = [
    "py",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/m/target",
    "--host",
    "127.0.0.1",
    "--port",
    "30000",
    "--tp-size",
    "4",
    "--enable-metrics",
]


def vllm_server(**kw) -> ServerConfig:
    return ServerConfig(engine="vllm", model="/m/target", drafter="/m/draft", tp=2, **kw)


def sgl_server(**kw) -> ServerConfig:
    return ServerConfig(engine="sglang", model="/m/target", drafter="/m/draft", tp=4, **kw)


def spec_json(**d) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(
    ("kw", "tail"),
    [
        ({"method": "auto"}, []),
        (
            {"method": "ngram"},
            [
                "--speculative-config",
                spec_json(method="ngram", num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2),
            ],
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 6},
            [
                "--speculative-config",
                spec_json(method="ngram", num_speculative_tokens=6, prompt_lookup_max=4, prompt_lookup_min=2),
            ],
        ),
        (
            {"method": "draft_model", "num_speculative_tokens": 2},
            [
                "--speculative-config",
                spec_json(method="draft_model", model="/m/draft", num_speculative_tokens=2),
            ],
        ),
        (
            {"method": "eagle", "num_speculative_tokens": 3},
            ["--speculative-config", spec_json(method="eagle", model="/m/draft", num_speculative_tokens=3)],
        ),
        (
            {"method": "eagle3", "num_speculative_tokens": 5},
            ["--speculative-config", spec_json(method="eagle3", model="/m/draft", num_speculative_tokens=5)],
        ),
        ({"method": "eagle3"}, ["--speculative-config", spec_json(method="eagle3", model="/m/draft")]),
        (
            {"method": "mtp", "num_speculative_tokens": 1},
            ["--speculative-config", spec_json(method="mtp", num_speculative_tokens=1)],
        ),
        (
            {"method": "linear", "num_speculative_tokens": 15},
            ["--speculative-config", spec_json(method="dflash", model="/m/draft", num_speculative_tokens=15)],
        ),
    ],
)
def test_vllm_argv_per_method(kw, tail):
    argv = adapter_for("vllm").build_argv(vllm_server(**kw), 8000, python="py")
    assert argv == VLLM + tail


def test_vllm_options_prefix_caching_seed_and_extra_args():
    server = vllm_server(
        method="auto",
        dtype="float32",
        max_model_len=2048,
        load_format="dummy",
        served_model_name="demo",
        prefix_caching=False,
        extra_args=["--enforce-eager"],
    )
    argv = adapter_for("vllm").build_argv(server, 8000, python="py", seed=7)
    assert argv == VLLM + [
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--load-format",
        "dummy",
        "--served-model-name",
        "demo",
        "--seed",
        "7",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ]
    on = adapter_for("vllm").build_argv(vllm_server(prefix_caching=True), 8000, python="py")
    assert on == VLLM + ["--enable-prefix-caching"]


@pytest.mark.parametrize(
    ("kw", "tail"),
    [
        ({"method": "auto"}, []),
        ({"method": "ngram"}, ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]),
        (
            {"method": "draft_model", "num_speculative_tokens": 2},
            [
                "--speculative-algorithm",
                "STANDALONE",
                "--speculative-draft-model-path",
                "/m/draft",
                "--speculative-num-steps",
                "2",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "3",
            ],
        ),
        (
            {"method": "eagle"},
            [
                "--speculative-algorithm",
                "EAGLE",
                "--speculative-draft-model-path",
                "/m/draft",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
            ],
        ),
        (
            {"method": "eagle3", "num_speculative_tokens": 5},
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "/m/draft",
                "--speculative-num-steps",
                "5",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "6",
            ],
        ),
        (
            {"method": "mtp"},
            [
                "--speculative-algorithm",
                "NEXTN",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
            ],
        ),
        (
            {"method": "linear"},
            ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/m/draft"],
        ),
        (
            {"method": "linear", "num_speculative_tokens": 15},
            [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-draft-model-path",
                "/m/draft",
                "--speculative-dflash-block-size",
                "16",
            ],
        ),
    ],
)
def test_sglang_argv_per_method(kw, tail):
    argv = adapter_for("sglang").build_argv(sgl_server(**kw), 30000, python="py")
    assert argv == SGL + tail


@pytest.mark.parametrize("budget", [15, 16, 32, 64])
def test_sglang_ddtree_build_argv(budget):
    server = sgl_server(method="ddtree", tree_budget=budget, engine_build="sglang-ddtree-pr")
    argv = adapter_for("sglang").build_argv(server, 30000, python="py")
    assert argv == SGL + [
        "--disable-radix-cache",
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        "/m/draft",
        "--speculative-ddtree-budget",
        str(budget),
    ]


def test_dflash_k_defaults_to_block_size_minus_one(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "block_size": 16})
    )
    assert read_block_size(tmp_path) == 16
    server = ServerConfig(engine="vllm", model="/m/target", drafter=str(tmp_path), method="linear")
    argv = adapter_for("vllm").build_argv(server, 8000, python="py")
    assert json.loads(argv[-1]) == {"method": "dflash", "model": str(tmp_path), "num_speculative_tokens": 15}
    sgl = ServerConfig(engine="sglang", model="/m/target", drafter=str(tmp_path), method="linear")
    assert adapter_for("sglang").build_argv(sgl, 30000, python="py")[-2:] == [
        "--speculative-dflash-block-size",
        "16",
    ]


def test_default_python_is_current_interpreter():
    assert adapter_for("vllm").build_argv(vllm_server(), 8000)[0] == sys.executable


@pytest.mark.parametrize(
    ("engine", "kw", "field"),
    [
        ("vllm", {"method": "ddtree", "tree_budget": 15}, "method 'ddtree' is not defined"),
        ("sglang", {"method": "ddtree", "engine_build": "sglang-ddtree-pr"}, "ServerConfig.tree_budget"),
        (
            "sglang",
            {
                "method": "ddtree",
                "tree_budget": 15,
                "engine_build": "sglang-ddtree-pr",
                "prefix_caching": True,
            },
            "ServerConfig.prefix_caching",
        ),
        ("sglang", {"method": "auto", "engine_build": "no-such-build"}, "unknown build"),
        ("vllm", {"method": "auto", "engine_build": "sglang-ddtree-pr"}, "is a build of 'sglang'"),
        ("vllm", {"method": "eagle3", "drafter": ""}, "ServerConfig.drafter"),
        ("vllm", {"method": "beam"}, "ServerConfig.method"),
        ("vllm", {"method": "auto", "tp": 0}, "ServerConfig.tp"),
        ("vllm", {"method": "ngram", "num_speculative_tokens": 0}, "ServerConfig.num_speculative_tokens"),
    ],
)
def test_build_argv_errors_name_the_field(engine, kw, field):
    base = {"engine": engine, "model": "/m/target", "drafter": "/m/draft"}
    base.update(kw)
    with pytest.raises(EngineConfigError, match=field.replace("(", r"\(")):
        adapter_for(engine).build_argv(ServerConfig(**base), 8000, python="py")


def test_user_flags_file_overrides_per_engine_and_build(tmp_path):
    user = tmp_path / "flags.yaml"
    user.write_text(
        """
engines:
  vllm:
    methods:
      ngram:
        speculative_config: {method: ngram, num_speculative_tokens: "{k}", prompt_lookup_max: 8}
        default_k: 3
builds:
  sglang-ddtree-pr:
    engine: sglang
    methods:
      ddtree:
        args: ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
               "--ddtree-node-budget", "{tree_budget}"]
  vllm-ddtree-fork:
    engine: vllm
    launch: ["-m", "vllm_ddtree.serve", "--model", "{model}", "--port", "{port}"]
    methods:
      ddtree:
        speculative_config: {method: ddtree, model: "{drafter}", budget: "{tree_budget}"}
"""
    )
    vllm = adapter_for("vllm", flags_file=user)
    assert vllm.build_argv(vllm_server(method="ngram"), 8000, python="py") == VLLM + [
        "--speculative-config",
        spec_json(method="ngram", num_speculative_tokens=3, prompt_lookup_max=8),
    ]
    # untouched methods keep the shipped entries
    assert vllm.build_argv(vllm_server(method="mtp"), 8000, python="py") == VLLM + [
        "--speculative-config",
        spec_json(method="mtp"),
    ]
    fork = vllm.build_argv(
        vllm_server(method="ddtree", tree_budget=32, engine_build="vllm-ddtree-fork"), 8001, python="py"
    )
    assert fork == [
        "py",
        "-m",
        "vllm_ddtree.serve",
        "--model",
        "/m/target",
        "--port",
        "8001",
        "--no-enable-prefix-caching",  # DDTree: prefix caching off on every build (method table)
        "--speculative-config",
        spec_json(method="ddtree", model="/m/draft", budget=32),
    ]
    sgl = adapter_for("sglang", flags_file=user)
    argv = sgl.build_argv(
        sgl_server(method="ddtree", tree_budget=15, engine_build="sglang-ddtree-pr"), 30000, python="py"
    )
    assert argv[-2:] == ["--ddtree-node-budget", "15"]
    # the shipped file is not modified by the override
    assert (
        load_flags()["builds"]["sglang-ddtree-pr"]["methods"]["ddtree"]["args"][-2]
        == "--speculative-ddtree-budget"
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("engines:\n  vllm:\n    methods:\n      beam: {}\n", ":4: engines.vllm.methods.beam: unknown method"),
        ("engines:\n  vllm:\n    methods:\n      ngram: {default_k: zero}\n",
         ":4: engines.vllm.methods.ngram.default_k"),
        ("engines:\n  vllm:\n    methods:\n      ngram: {argz: []}\n",
         ":4: engines.vllm.methods.ngram.argz: unknown key"),
        ("engines:\n  vllm:\n    launch: ['--model', '{modle}']\n",
         ":3: engines.vllm.launch[1]: unknown placeholder {modle}"),
        ("engines:\n  tgi: {}\n", ":2: engines.tgi: unknown engine"),
        ("builds:\n  x: {methods: {}}\n", ":2: builds.x.engine: missing"),
        ("engines: [\n", ":2: invalid YAML"),
        ("engines:\n  vllm: {}\n  vllm: {}\n", ":3: invalid YAML: duplicate key 'vllm'"),
        ("flags: {}\n", ":1: flags: unknown key (allowed: builds, engines)"),
        # what a method needs is in the method table (benchkit/methods.py), not per build
        ("engines:\n  vllm:\n    methods:\n      ngram: {needs_drafter: true}\n",
         ":4: engines.vllm.methods.ngram.needs_drafter: a property of the decoding method"),
        ("engines:\n  vllm:\n    options: {dtype: x}\n", ":3: engines.vllm.options.dtype: expected a flag"),
        ("engines:\n  vllm:\n    methods:\n      ngram:\n        speculative_config: {x: '{nope}'}\n",
         ":5: engines.vllm.methods.ngram.speculative_config.x: unknown placeholder {nope}"),
    ],
)
def test_bad_flags_file_errors(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(EngineConfigError) as err:
        adapter_for("vllm", flags_file=path)
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_env_urls_ports():
    gpus = [GpuRef(index=0, uuid="GPU-aaa"), GpuRef(index=3, uuid="")]
    vllm, sgl = adapter_for("vllm"), adapter_for("sglang")
    assert vllm.env(gpus) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "GPU-aaa,3",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    assert sgl.env([]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert vllm.env([], base={"PATH": "/bin"})["PATH"] == "/bin"
    assert vllm.ready_urls("http://h:8000/") == ["http://h:8000/health", "http://h:8000/v1/models"]
    assert sgl.ready_urls("http://h:30000") == ["http://h:30000/health_generate"]
    assert vllm.metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert vllm.reset_cache_url("http://h:8000") == "http://h:8000/reset_prefix_cache"
    assert sgl.reset_cache_url("http://h:30000") == "http://h:30000/flush_cache"
    assert vllm.port_span(8000) == [8000]
    assert sgl.port_span(30000)[:2] == [30000, 30233]
    assert vllm.default_port == 8000 and sgl.default_port == 30000


def test_external_adapter():
    ext = adapter_for("external")
    server = ServerConfig(engine="external", endpoint_url="http://10.0.0.5:8000/v1")
    assert ext.build_argv(server, 0) == []
    assert ext.env([GpuRef(0, "GPU-x")]) == {}
    assert ext.base_url(server) == "http://10.0.0.5:8000"
    assert ext.ready_urls("http://10.0.0.5:8000") == ["http://10.0.0.5:8000/v1/models"]
    with pytest.raises(EngineConfigError, match="endpoint_url"):
        ext.build_argv(ServerConfig(engine="external"), 0)
    with pytest.raises(EngineConfigError, match="unknown engine"):
        adapter_for("tensorrt")


def test_env_merges_server_env_and_allocation_wins():
    server = vllm_server(env={"VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": "5"})
    env = adapter_for("vllm").env([GpuRef(index=2, uuid="GPU-b")], server=server)
    assert env == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "CUDA_VISIBLE_DEVICES": "GPU-b",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "VLLM_SERVER_DEV_MODE": "1",
    }
