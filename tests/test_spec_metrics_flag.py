"""A build's `per_request_spec_metrics` (issue 20): a vLLM build that sets it starts speculative
servers with `--per-request-spec-decode-metrics LEVEL`; autoregressive ones and builds that do
not set it are left alone; a level the engine does not have is refused when the file is read."""

from __future__ import annotations

import pytest

from benchkit.engines.adapters import EngineConfigError, adapter_for
from benchkit.specs import ServerConfig

FLAGS = """
builds:
  vllm-new:
    engine: vllm
    per_request_spec_metrics: {level}
"""


def server(method: str, build: str) -> ServerConfig:
    extra = {"drafter": "/models/draft", "num_speculative_tokens": 3} if method != "auto" else {}
    return ServerConfig(engine="vllm", engine_build=build, model="/models/target", method=method, **extra)


@pytest.mark.parametrize("level", ["summary", "detailed"])
def test_build_asks_for_per_request_figures(tmp_path, level):
    f = tmp_path / "flags.yaml"
    f.write_text(FLAGS.format(level=level))
    a = adapter_for("vllm", flags_file=f)
    argv = a.build_argv(server("draft_model", "vllm-new"), 8000, python="python3")
    i = argv.index("--per-request-spec-decode-metrics")
    assert argv[i + 1] == level
    assert "--per-request-spec-decode-metrics" not in a.build_argv(server("auto", "vllm-new"), 8000, python="python3")
    assert "--per-request-spec-decode-metrics" not in a.build_argv(server("draft_model", ""), 8000, python="python3")


def test_unknown_level_is_refused(tmp_path):
    f = tmp_path / "flags.yaml"
    f.write_text(FLAGS.format(level="full"))
    with pytest.raises(EngineConfigError, match="per_request_spec_metrics"):
        adapter_for("vllm", flags_file=f)
