"""Demo models: trained locally (deterministic, cached by spec hash), idempotent, loadable by
transformers with the logits of our own forward pass, and (marked `vllm`) served for real by
vLLM's CPU build with their weights through ManagedServer and the vLLM adapter."""

from __future__ import annotations

import importlib.util
import json
import os
import socket

import httpx
import pytest

from benchkit.engines.demo_models import (
    DRAFT_CONFIG,
    MARKER_NAME,
    QUICK_TRAIN_SPEC,
    TARGET_CONFIG,
    TRAIN_SPEC,
    VOCAB_SIZE,
    WEIGHTS_NAME,
    build_demo_models,
    default_train_spec,
    is_complete,
    is_demo_model,
    read_marker,
    spec_hash,
)
from benchkit.engines.demo_train import TrainSpec, train_pair

pytest.importorskip("torch")

#: Smaller than QUICK_TRAIN_SPEC still: the determinism test trains twice.
TINY = TrainSpec(target_steps=2, draft_steps=1, batch=2, seq_len=16, lr=1e-3, warmup_steps=1, seed=3, threads=1,
                 draft_noise=0.5)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return build_demo_models(tmp_path_factory.mktemp("demo"), train=QUICK_TRAIN_SPEC)


def test_layout_and_configs(demo):
    target = json.loads((demo.target / "config.json").read_text())
    draft = json.loads((demo.draft / "config.json").read_text())
    assert target["architectures"] == ["LlamaForCausalLM"] == draft["architectures"]
    assert (target["num_hidden_layers"], target["hidden_size"]) == (4, 256)
    assert (draft["num_hidden_layers"], draft["hidden_size"]) == (1, 256)  # distilled from the target
    assert target["vocab_size"] == draft["vocab_size"] == VOCAB_SIZE == 2048
    assert target["max_position_embeddings"] == 2048
    assert is_demo_model(demo.target) and is_demo_model(demo.draft)
    readme = (demo.target / "README.md").read_text()
    assert "dummy" not in readme and "trained for 3 steps of 2 x 32 tokens" in readme
    assert "distilled for 2 steps" in (demo.draft / "README.md").read_text()
    assert (demo.target / "tokenizer.json").read_bytes() == (demo.draft / "tokenizer.json").read_bytes()
    from safetensors import safe_open

    with safe_open(str(demo.target / WEIGHTS_NAME), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("lm_head.weight").shape == (VOCAB_SIZE, 256)
    assert len(names) == 3 + 9 * 4 and "model.layers.3.mlp.down_proj.weight" in names
    with safe_open(str(demo.draft / WEIGHTS_NAME), "pt") as f:
        assert len(set(f.keys())) == 3 + 9 and "model.layers.1.mlp.down_proj.weight" not in f.keys()
    marker = read_marker(demo.root)
    assert marker["train"] == QUICK_TRAIN_SPEC.as_dict()
    assert 0 <= marker["report"]["greedy_agreement"] <= 1
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


def test_transformers_loads_weights_with_our_logits(demo):
    """transformers' LlamaForCausalLM on the saved files computes the logits of demo_train's
    forward pass: the tensor names and the layout (rotary halves, norms) are what HF expects."""
    transformers = pytest.importorskip("transformers")
    import torch
    from safetensors.torch import load_file

    from benchkit.engines.demo_train import model_from_hf

    ids = torch.tensor([[5, 300, 17, 1999, 42, 7, 7, 100]])
    for path, cfg in ((demo.target, TARGET_CONFIG), (demo.draft, DRAFT_CONFIG)):
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        ours = model_from_hf(cfg, load_file(str(path / WEIGHTS_NAME)))
        with torch.no_grad():
            torch.testing.assert_close(hf(ids).logits, ours(ids), rtol=1e-4, atol=1e-4)


def test_training_is_deterministic_and_keyed_by_spec(tmp_path):
    """The same spec trains bit-identical weights (seeded generator, fixed threads); another seed
    gives other weights; the spec hash covers the training spec and the build is cached under it."""
    from benchkit.engines.demo_models import corpus_token_ids, train_tokenizer

    ids = corpus_token_ids(train_tokenizer())[:4000]
    a_target, a_draft, report = train_pair(ids, TARGET_CONFIG, DRAFT_CONFIG, TINY)
    b_target, b_draft, _ = train_pair(ids, TARGET_CONFIG, DRAFT_CONFIG, TINY)
    assert a_target.keys() == b_target.keys() and a_draft.keys() == b_draft.keys()
    assert all(a_target[k].equal(b_target[k]) for k in a_target)
    assert all(a_draft[k].equal(b_draft[k]) for k in a_draft)
    # the draft starts from the target's embeddings and LM head, then moves
    assert not a_draft["lm_head.weight"].equal(a_target["lm_head.weight"])
    c_target, _, _ = train_pair(ids, TARGET_CONFIG, DRAFT_CONFIG, TrainSpec(**{**TINY.as_dict(), "seed": 4}))
    assert not c_target["model.embed_tokens.weight"].equal(a_target["model.embed_tokens.weight"])
    # the draft's seeded noise: same target, another draft; norms (vectors) are left as they are
    d_target, d_draft, _ = train_pair(ids, TARGET_CONFIG, DRAFT_CONFIG, TrainSpec(**{**TINY.as_dict(),
                                                                                    "draft_noise": 0.0}))
    assert all(d_target[k].equal(a_target[k]) for k in a_target)
    assert not d_draft["model.layers.0.mlp.up_proj.weight"].equal(a_draft["model.layers.0.mlp.up_proj.weight"])
    assert d_draft["model.norm.weight"].equal(a_draft["model.norm.weight"])
    assert report.target_loss > 0 and 0 <= report.greedy_agreement <= 1

    assert len({spec_hash(TINY), spec_hash(QUICK_TRAIN_SPEC), spec_hash(TRAIN_SPEC)}) == 3
    assert default_train_spec() == QUICK_TRAIN_SPEC  # conftest sets DRAFTBOARD_DEMO_QUICK=1
    first = build_demo_models(tmp_path, train=TINY)
    assert is_complete(tmp_path, TINY) and not is_complete(tmp_path, QUICK_TRAIN_SPEC)
    weights = (first.target / WEIGHTS_NAME).read_bytes()
    assert read_marker(tmp_path)["weights_sha256"]["target"] == __import__("hashlib").sha256(weights).hexdigest()
    (first.target / WEIGHTS_NAME).unlink()
    build_demo_models(tmp_path, train=TINY)  # rebuilt: the same bytes
    assert (first.target / WEIGHTS_NAME).read_bytes() == weights


def test_train_pair_refuses_a_draft_of_another_width():
    with pytest.raises(ValueError, match="hidden_size"):
        train_pair(list(range(1000)), TARGET_CONFIG, {**DRAFT_CONFIG, "hidden_size": 128}, TINY)


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
    first = build_demo_models(tmp_path, train=TINY)
    marker = (tmp_path / MARKER_NAME).read_text()
    mtime = (first.target / "tokenizer.json").stat().st_mtime_ns
    again = build_demo_models(tmp_path, train=TINY)
    assert again == first
    assert (first.target / "tokenizer.json").stat().st_mtime_ns == mtime  # reused, not rewritten
    tokenizer = (first.target / "tokenizer.json").read_bytes()

    (first.draft / "config.json").unlink()
    assert not is_complete(tmp_path, TINY)
    build_demo_models(tmp_path, train=TINY)
    assert is_complete(tmp_path, TINY)
    assert (first.draft / "config.json").exists()
    again = json.loads((tmp_path / MARKER_NAME).read_text())
    again["report"].pop("target_seconds"), again["report"].pop("draft_seconds")
    expected = json.loads(marker)
    expected["report"].pop("target_seconds"), expected["report"].pop("draft_seconds")
    assert again == expected  # same hashes, weights and losses: deterministic training
    assert (first.target / "tokenizer.json").read_bytes() == tokenizer

    data = json.loads(marker)
    data["spec_hash"] = "0" * 64
    (tmp_path / MARKER_NAME).write_text(json.dumps(data))
    assert not is_complete(tmp_path, TINY)
    build_demo_models(tmp_path, force=False, train=TINY)
    assert is_complete(tmp_path, TINY)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_real_vllm_server_on_demo_models_with_draft_model(tmp_path, demo):
    """Start vLLM's CPU build on the demo target with the demo draft model (their saved weights,
    no dummy loading), wait for readiness, get a 16-token completion and see the spec-decode
    counters."""
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
