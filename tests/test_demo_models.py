"""Demo models: built locally, idempotent, loadable by transformers, and (marked `vllm`) served
for real by vLLM's CPU build through ManagedServer and the vLLM adapter."""

from __future__ import annotations

import importlib.util
import json
import os
import socket

import httpx
import pytest

from benchkit.engines.demo_models import (
    MARKER_NAME,
    VOCAB_SIZE,
    build_demo_models,
    is_complete,
    is_demo_model,
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return build_demo_models(tmp_path_factory.mktemp("demo"))


def test_layout_and_configs(demo):
    target = json.loads((demo.target / "config.json").read_text())
    draft = json.loads((demo.draft / "config.json").read_text())
    assert target["architectures"] == ["LlamaForCausalLM"] == draft["architectures"]
    assert (target["num_hidden_layers"], target["hidden_size"]) == (4, 256)
    assert (draft["num_hidden_layers"], draft["hidden_size"]) == (1, 256)  # the target's first layer
    assert target["vocab_size"] == draft["vocab_size"] == VOCAB_SIZE == 2048
    assert target["max_position_embeddings"] == 2048
    assert is_demo_model(demo.target) and is_demo_model(demo.draft)
    assert "--load-format dummy" in (demo.target / "README.md").read_text()
    assert (demo.target / "tokenizer.json").read_bytes() == (demo.draft / "tokenizer.json").read_bytes()
    assert not list(demo.target.glob("*.safetensors"))
    prompts = demo.prompts.read_text().splitlines()
    assert len(prompts) >= 16 and all(p.strip() for p in prompts)
    assert is_complete(demo.root)


def test_tokenizer_round_trip_and_special_tokens(demo):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(demo.target / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB_SIZE
    text = "def add(a, b):\n    return a + b  # sum"
    assert tok.decode(tok.encode(text).ids) == text
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>")] == [0, 1, 2]


def test_transformers_loads_config_and_tokenizer(demo):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(demo.target)
    assert cfg.model_type == "llama" and cfg.vocab_size == VOCAB_SIZE
    tok = transformers.AutoTokenizer.from_pretrained(demo.target)
    assert tok.eos_token == "</s>"
    ids = tok("import os")["input_ids"]
    assert tok.decode(ids) == "import os"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<s>assistant\n")


def test_idempotent_and_rebuilds_when_incomplete(tmp_path):
    first = build_demo_models(tmp_path)
    marker = (tmp_path / MARKER_NAME).read_text()
    mtime = (first.target / "tokenizer.json").stat().st_mtime_ns
    again = build_demo_models(tmp_path)
    assert again == first
    assert (first.target / "tokenizer.json").stat().st_mtime_ns == mtime  # reused, not rewritten
    tokenizer = (first.target / "tokenizer.json").read_bytes()

    (first.draft / "config.json").unlink()
    assert not is_complete(tmp_path)
    build_demo_models(tmp_path)
    assert is_complete(tmp_path)
    assert (first.draft / "config.json").exists()
    assert (tmp_path / MARKER_NAME).read_text() == marker
    assert (first.target / "tokenizer.json").read_bytes() == tokenizer  # deterministic training

    data = json.loads(marker)
    data["spec_hash"] = "0" * 64
    (tmp_path / MARKER_NAME).write_text(json.dumps(data))
    assert not is_complete(tmp_path)
    build_demo_models(tmp_path, force=False)
    assert is_complete(tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_real_vllm_server_on_demo_models_with_draft_model(tmp_path, demo):
    """Start vLLM's CPU build on the demo target with the demo draft model (dummy weights for
    both), wait for readiness, get a 16-token completion and see the spec-decode counters."""
    from benchkit.engines.adapters import adapter_for
    from benchkit.engines.server import ManagedServer
    from benchkit.specs import ServerConfig

    adapter = adapter_for("vllm")
    server = ServerConfig(
        engine="vllm",
        model=str(demo.target),
        drafter=str(demo.draft),
        method="draft_model",
        num_speculative_tokens=2,
        served_model_name="demo",
        dtype="float32",
        max_model_len=2048,
        load_format="dummy",
    )
    port = _free_port()
    argv = adapter.build_argv(server, port, seed=0)
    env = adapter.env([], base=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"))
    base = f"http://127.0.0.1:{port}"
    with ManagedServer(argv, env, tmp_path / "vllm.log") as srv:
        try:
            srv.wait_ready(adapter.ready_urls(base), timeout_s=600, poll_s=1.0)
        except Exception:
            print(srv.log_tail(80))
            raise
        models = httpx.get(f"{base}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["demo"]
        resp = httpx.post(
            f"{base}/v1/completions",
            json={
                "model": "demo",
                "prompt": "def main():",
                "max_tokens": 16,
                "ignore_eos": True,
                "temperature": 0,
            },
            timeout=300,
        )
        assert resp.status_code == 200
        assert resp.json()["usage"]["completion_tokens"] == 16
        metrics = httpx.get(adapter.metrics_url(base), timeout=30).text
        assert "vllm:spec_decode_num_drafts_total" in metrics
        assert httpx.post(adapter.reset_cache_url(base), timeout=30).status_code == 200
    assert srv.teardown is not None and srv.teardown.clean
