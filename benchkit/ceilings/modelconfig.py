"""What one decode step must read and multiply, from a Hugging Face `config.json`
(docs/CEILINGS.md "Model footprint").

`read_model_config(source) -> ModelFootprint` counts the language model's parameters from its
architecture (the formulas follow the Hugging Face transformers modelling code of each supported
architecture, checked against it in tests/test_ceilings.py), splits them into what a decode step
streams from memory and what it multiplies, gives the bytes per parameter from `torch_dtype` /
`dtype` and `quantization_config`, the KV-cache bytes per token of the full-attention layers and
the recurrent-state bytes per sequence of the linear-attention layers.
`read_drafter_config(source, target) -> DrafterFootprint` does the same for a drafter.

Supported architectures (`architectures[0]`; hybrid = Gated DeltaNet linear-attention layers
interleaved with gated full-attention layers):

| family | architectures |
| --- | --- |
| dense decoder | LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM |
| MoE decoder | Qwen3MoeForCausalLM |
| hybrid, dense MLP | Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM |
| hybrid, MoE with a shared expert | Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM |
| drafter | DFlashDraftModel (read_drafter_config; a plain decoder above is a draft model) |

Counted: the language model (input embedding, decoder layers, final norm, output head). Not
counted: a vision encoder (not read when decoding text) and MTP layers shipped in the checkpoint
(not loaded unless the MTP method runs); the footprint's `notes` say so where the config has them.

Errors (`ModelConfigError`) name the source and the key: `config.json: text_config.hidden_size:
missing (needed to count Qwen3_5ForConditionalGeneration's parameters)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: torch dtype names -> (short name, bytes per element).
DTYPE_BYTES: dict[str, tuple[str, int]] = {
    "bfloat16": ("bf16", 2), "float16": ("fp16", 2), "half": ("fp16", 2), "float32": ("fp32", 4),
    "float": ("fp32", 4),
}
DENSE_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MOE_ARCHS = ("Qwen3MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM",
             "Qwen3NextForCausalLM")
HYBRID_ARCHS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                "Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM")
DRAFTER_ARCHS = ("DFlashDraftModel",)
SUPPORTED_ARCHS = tuple(dict.fromkeys((*DENSE_ARCHS, *MOE_ARCHS, *HYBRID_ARCHS)))
#: quantization_config.quant_method values understood (weights-only or weights + activations).
QUANT_METHODS = ("fp8", "gptq", "awq", "compressed-tensors")


class ModelConfigError(ValueError):
    """A config.json cannot be read, or lacks or mistypes a key its architecture needs; the
    message names the source and the key (`file: text_config.hidden_size: missing ...`)."""


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by what a decode step does with them (all counts, not bytes).

    - `embedding`: the input embedding table (vocab x hidden); a step reads only its rows.
    - `lm_head`: the output head (vocab x hidden); read in full every step. Tied to the input
      table when `tied` (then the same tensor, counted once in `total`).
    - `dense_matrices`: weight matrices every token multiplies (attention and linear-attention
      projections, dense MLPs, shared experts): the ones a checkpoint quantises.
    - `expert_matrices`: routed experts of MoE layers, all of them.
    - `small`: norms, biases, convolution kernels, decay parameters, routers: kept in the
      activation dtype.
    """

    embedding: int
    lm_head: int
    dense_matrices: int
    expert_matrices: int
    small: int
    tied: bool

    @property
    def total(self) -> int:
        """Every parameter of the language model, each tensor once."""
        return (self.embedding + (0 if self.tied else self.lm_head) + self.dense_matrices + self.expert_matrices
                + self.small)


@dataclass(frozen=True)
class ModelFootprint:
    """One model as a decode step sees it (units in the names; per sequence where said).

    - `total_params`: the stated `num_parameters` where the config has it, else `params.total`
      (`params_source` says which).
    - `quantised_bytes_per_param` applies to dense and expert matrices; `activation_bytes` (of
      `activation_dtype`) to everything else and to activations. `weight_dtype` names the
      weight format in words; `compute_dtype` selects the peak FLOP/s that applies (bf16, fp16,
      fp8 or fp32).
    - `kv_bytes_per_token`: K and V of every full-attention layer, one token of one sequence;
      `state_bytes_per_sequence`: the linear-attention layers' recurrent and convolution state
      of one sequence.
    - MoE: `num_experts` routed experts per MoE layer, `experts_per_token` of them per token
      (0 / 0 for a dense model).
    """

    source: str
    architecture: str
    params: ParamCounts
    total_params: int
    params_source: str
    weight_dtype: str
    quantised_bytes_per_param: float
    activation_dtype: str
    activation_bytes: int
    compute_dtype: str
    hidden_size: int
    vocab_size: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    full_attention_layers: int
    linear_attention_layers: int
    num_experts: int = 0
    experts_per_token: int = 0
    notes: tuple[str, ...] = field(default=())

    def experts_touched_share(self, tokens_per_step: float) -> float:
        """Expected share of the routed experts a step with `tokens_per_step` tokens reads, if each
        token picks `experts_per_token` of `num_experts` uniformly and independently:
        1 - (1 - k/E)^tokens. 1 for a dense model (no experts: the share is unused)."""
        if not self.num_experts:
            return 1.0
        return 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** max(tokens_per_step, 0.0)

    def read_params(self, tokens_per_step: float) -> float:
        """Parameters a decode step streams from memory: the output head, every dense matrix and
        small parameter, and the routed experts the step's tokens touch (expected value; all of
        them for a dense model). The input embedding table is not read in full (rows only)."""
        p = self.params
        return p.lm_head + p.dense_matrices + p.small + p.expert_matrices * self.experts_touched_share(tokens_per_step)

    def weight_bytes(self, tokens_per_step: float) -> float:
        """Bytes a decode step reads for weights (`read_params`, each part at its own width)."""
        p = self.params
        quantised = p.dense_matrices + p.expert_matrices * self.experts_touched_share(tokens_per_step)
        return quantised * self.quantised_bytes_per_param + (p.lm_head + p.small) * self.activation_bytes

    @property
    def active_params_per_token(self) -> float:
        """Parameters one token multiplies (2 FLOPs each): all but the input table, and of the
        routed experts only experts_per_token / num_experts."""
        p = self.params
        share = self.experts_per_token / self.num_experts if self.num_experts else 1.0
        return p.lm_head + p.dense_matrices + p.small + p.expert_matrices * share

    @property
    def bytes_per_param(self) -> float:
        """Mean bytes per parameter read in a step of one token (weights only)."""
        return self.weight_bytes(1) / self.read_params(1)


@dataclass(frozen=True)
class DrafterFootprint:
    """A drafter as a decode step sees it.

    `kind` "dflash": one pass per step over `block_size` positions per sequence (DFlash; DDTree
    uses the same pass and builds its tree from it); "draft_model": one pass of one token per
    sequence per drafted token (k passes per step). `read_params_per_pass` /
    `weight_bytes_per_pass` include the target's output head where the drafter shares it
    (DFlash). `kv_bytes_per_token`: the drafter's own KV cache per context token.
    """

    source: str
    architecture: str
    kind: str
    own_params: int
    read_params_per_pass: int
    active_params_per_token: int
    weight_bytes_per_pass: float
    kv_bytes_per_token: int
    block_size: int | None = None
    notes: tuple[str, ...] = field(default=())

    def passes_per_step(self, draft_tokens: int) -> int:
        """Drafter passes in one decode step drafting `draft_tokens` (k) per sequence."""
        return 1 if self.kind == "dflash" else draft_tokens

    def tokens_per_pass(self, draft_tokens: int) -> int:
        """Positions one pass processes per sequence."""
        return (self.block_size or 1) if self.kind == "dflash" else 1


class _Config:
    """A config mapping with errors that name the source and the key (with its prefix)."""

    def __init__(self, data: Mapping[str, Any], source: str, arch: str, prefix: str = ""):
        self.data, self.source, self.arch, self.prefix = data, source, arch, prefix

    def error(self, key: str, reason: str) -> ModelConfigError:
        return ModelConfigError(f"{self.source}: {self.prefix}{key}: {reason}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            raise self.error(key, f"missing (needed to count {self.arch}'s parameters)")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true/false, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(key, f"expected a list of integers, got {value!r}")
        return value


def _load(source: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(source, Mapping):
        return dict(source), "config"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data, str(path)


def _architecture(data: Mapping[str, Any], source: str) -> str:
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ModelConfigError(f"{source}: architectures: missing (a list naming the model class, "
                               f"e.g. [\"LlamaForCausalLM\"])")
    return archs[0]


def _dtype(top: Mapping[str, Any], text: Mapping[str, Any], source: str, prefix: str) -> tuple[str, int]:
    """(short name, bytes) of the checkpoint's dtype: `dtype` or `torch_dtype`, text config first."""
    for where, cfg in ((prefix, text), ("", top)):
        for key in ("dtype", "torch_dtype"):
            value = cfg.get(key)
            if value is None:
                continue
            if value not in DTYPE_BYTES:
                raise ModelConfigError(f"{source}: {where}{key}: unknown dtype {value!r} "
                                       f"(known: {', '.join(DTYPE_BYTES)})")
            return DTYPE_BYTES[value]
    raise ModelConfigError(f"{source}: torch_dtype: missing (the weights' dtype, e.g. \"bfloat16\"; newer "
                           f"configs spell it dtype)")


def _quantisation(qc: Any, act_name: str, act_bytes: int, source: str) -> tuple[str, float, str]:
    """(weight format in words, bytes per quantised parameter, compute dtype) from a
    `quantization_config` (None: unquantised). Scale overheads: one fp32 scale per block (fp8
    block quantisation), one 16-bit scale (+ a zero point for GPTQ/AWQ) per group."""
    if qc is None:
        return act_name, float(act_bytes), act_name
    if not isinstance(qc, Mapping):
        raise ModelConfigError(f"{source}: quantization_config: expected an object, got {qc!r}")
    method = qc.get("quant_method")
    if method not in QUANT_METHODS:
        raise ModelConfigError(f"{source}: quantization_config.quant_method: unknown {method!r} "
                               f"(known: {', '.join(QUANT_METHODS)})")
    if method == "fp8":
        block = qc.get("weight_block_size")
        overhead = 4.0 / (block[0] * block[1]) if isinstance(block, list) and len(block) == 2 else 0.0
        return "fp8" + (f" (blocks {block[0]}x{block[1]})" if overhead else ""), 1.0 + overhead, "fp8"
    if method in ("gptq", "awq"):
        bits = qc.get("bits", qc.get("w_bit"))
        group = qc.get("group_size", qc.get("q_group_size", 128))
        if not isinstance(bits, int) or bits not in (2, 3, 4, 8):
            raise ModelConfigError(f"{source}: quantization_config.bits: expected 2, 3, 4 or 8, got {bits!r}")
        per_group = (2 + bits / 8) / group if isinstance(group, int) and group > 0 else 0.0
        return f"int{bits} ({method}, group {group})", bits / 8 + per_group, act_name
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ModelConfigError(f"{source}: quantization_config.config_groups: missing (compressed-tensors "
                               f"names its weight scheme there)")
    name, group_cfg = next(iter(groups.items()))
    weights = group_cfg.get("weights") if isinstance(group_cfg, Mapping) else None
    if not isinstance(weights, Mapping) or not isinstance(weights.get("num_bits"), int):
        raise ModelConfigError(f"{source}: quantization_config.config_groups.{name}.weights.num_bits: missing")
    bits, kind = weights["num_bits"], weights.get("type", "int")
    group = weights.get("group_size")
    scale_bytes = 1 if bits == 4 and kind == "float" else 2  # nvfp4: an fp8 scale per 16
    per_group = scale_bytes / group if weights.get("strategy") in ("group", "tensor_group") and group else 0.0
    acts = group_cfg.get("input_activations") or {}
    compute = "fp8" if acts.get("num_bits") == 8 and acts.get("type") == "float" else act_name
    return f"{kind}{bits} (compressed-tensors)", bits / 8 + per_group, compute


def _layer_types(cfg: _Config, n_layers: int, hybrid: bool) -> list[str]:
    if not hybrid:
        return ["full_attention"] * n_layers
    types = cfg.get("layer_types")
    if types is None:
        interval = cfg.int("full_attention_interval", default=4)
        return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        raise cfg.error("layer_types", f"expected a list of num_hidden_layers ({n_layers}) entries, got {types!r:.80}")
    for i, t in enumerate(types):
        if t not in ("full_attention", "linear_attention"):
            raise cfg.error(f"layer_types[{i}]", f"unknown layer type {t!r} (known: full_attention, linear_attention)")
    return types


def _count(cfg: _Config, arch: str) -> tuple[ParamCounts, dict[str, int]]:
    """Parameter counts of a supported architecture, and the shape figures the caller needs."""
    h, n_layers = cfg.int("hidden_size"), cfg.int("num_hidden_layers")
    vocab, heads = cfg.int("vocab_size"), cfg.int("num_attention_heads")
    kv_heads = cfg.int("num_key_value_heads", default=heads)
    head_dim = cfg.int("head_dim", default=h // heads)
    tied = cfg.bool("tie_word_embeddings", False)
    hybrid, moe = arch in HYBRID_ARCHS, arch in MOE_ARCHS
    types = _layer_types(cfg, n_layers, hybrid)

    q_out = heads * head_dim * (2 if hybrid else 1)  # hybrid: gated attention, the gate rides on q_proj
    attn = h * q_out + 2 * h * kv_heads * head_dim + heads * head_dim * h
    if arch == "Qwen2ForCausalLM":
        attn_bias = q_out + 2 * kv_heads * head_dim  # q, k, v biases; none on o
    elif arch == "MistralForCausalLM":
        attn_bias = 0
    else:
        attn_bias = (q_out + 2 * kv_heads * head_dim + h) if cfg.bool("attention_bias", False) else 0
    qk_norm = 2 * head_dim if (arch.startswith("Qwen3") or hybrid) else 0

    dense_m = expert_m = small = 0
    shape = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "layers": n_layers,
             "full": types.count("full_attention"), "linear": types.count("linear_attention"), "experts": 0,
             "top_k": 0, "conv_dim": 0, "lin_v_heads": 0, "lin_k_dim": 0, "lin_v_dim": 0, "kernel": 0}
    if shape["linear"]:
        nk, nv = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
        dk, dv = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
        kernel = cfg.int("linear_conv_kernel_dim")
        key_dim, value_dim = nk * dk, nv * dv
        conv_dim = 2 * key_dim + value_dim
        if arch == "Qwen3NextForCausalLM":  # in_proj_qkvz + in_proj_ba
            lin = h * (2 * key_dim + 2 * value_dim) + h * 2 * nv
        else:  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
            lin = h * conv_dim + h * value_dim + 2 * h * nv
        lin += value_dim * h  # out_proj
        lin_small = conv_dim * kernel + 2 * nv + dv  # conv1d, dt_bias + A_log, gated norm
        dense_m += shape["linear"] * lin
        small += shape["linear"] * lin_small
        shape.update(conv_dim=conv_dim, lin_v_heads=nv, lin_k_dim=dk, lin_v_dim=dv, kernel=kernel)
    dense_m += shape["full"] * attn
    small += shape["full"] * (attn_bias + qk_norm)

    mlp_bias = cfg.bool("mlp_bias", False) if arch in ("LlamaForCausalLM",) else False
    inter = cfg.int("intermediate_size", default=0 if moe else None, minimum=0)
    dense_mlp = 3 * h * inter
    if moe:
        experts, top_k = cfg.int("num_experts"), cfg.int("num_experts_per_tok")
        moe_inter = cfg.int("moe_intermediate_size")
        shared_inter = cfg.int("shared_expert_intermediate_size", default=0, minimum=0)
        sparse_step = cfg.int("decoder_sparse_step", default=1)
        mlp_only = set(cfg.int_list("mlp_only_layers"))
        moe_layers = [i for i in range(n_layers) if i not in mlp_only and (i + 1) % sparse_step == 0]
        n_moe = len(moe_layers)
        if n_layers - n_moe and not inter:
            raise cfg.error("intermediate_size", "missing (needed for the dense MLP layers of "
                                                 f"{arch}: mlp_only_layers / decoder_sparse_step)")
        expert_m += n_moe * experts * 3 * h * moe_inter
        dense_m += n_moe * 3 * h * shared_inter + (n_layers - n_moe) * dense_mlp
        small += n_moe * (experts * h + (h if shared_inter else 0))  # router, shared-expert gate
        shape.update(experts=experts, top_k=top_k)
    else:
        if not inter:
            raise cfg.error("intermediate_size", f"missing (needed to count {arch}'s parameters)")
        dense_m += n_layers * dense_mlp
        small += n_layers * (2 * inter + h if mlp_bias else 0)
    small += n_layers * 2 * h + h  # two norms per layer, the final norm
    counts = ParamCounts(embedding=vocab * h, lm_head=vocab * h, dense_matrices=dense_m, expert_matrices=expert_m,
                         small=small, tied=tied)
    return counts, shape


def read_model_config(source: str | Path | Mapping[str, Any], *, kv_cache_dtype: str = "auto") -> ModelFootprint:
    """A target model's footprint from its config.json (a file, a directory holding one, or the
    parsed mapping).

    `kv_cache_dtype` is the engine's KV-cache dtype: "auto" (the activation dtype), "fp8"
    (1 byte), or a torch dtype name. Raises ModelConfigError naming the source and the key.
    """
    data, name = _load(source)
    arch = _architecture(data, name)
    if arch in DRAFTER_ARCHS:
        raise ModelConfigError(f"{name}: architectures: {arch} is a drafter: read it with read_drafter_config")
    if arch not in SUPPORTED_ARCHS:
        raise ModelConfigError(f"{name}: architectures: {arch} is not supported (supported: "
                               f"{', '.join(SUPPORTED_ARCHS)})")
    text, prefix = data, ""
    if arch.endswith("ForConditionalGeneration"):
        if not isinstance(data.get("text_config"), Mapping):
            raise ModelConfigError(f"{name}: text_config: missing (the language model's dimensions of {arch})")
        text, prefix = data["text_config"], "text_config."
    cfg = _Config(text, name, arch, prefix)
    counts, shape = _count(cfg, arch)
    act_name, act_bytes = _dtype(data, text, name, prefix)
    qc = text.get("quantization_config") or data.get("quantization_config")
    weight_dtype, q_bytes, compute = _quantisation(qc, act_name, act_bytes, name)
    kv_bytes = _kv_element_bytes(kv_cache_dtype, act_bytes, name)
    ssm_name = text.get("mamba_ssm_dtype")
    if ssm_name is not None and ssm_name not in DTYPE_BYTES:
        raise cfg.error("mamba_ssm_dtype", f"unknown dtype {ssm_name!r} (known: {', '.join(DTYPE_BYTES)})")
    ssm_bytes = DTYPE_BYTES[ssm_name][1] if ssm_name else act_bytes
    state = shape["linear"] * (shape["conv_dim"] * (shape["kernel"] - 1) * act_bytes
                               + shape["lin_v_heads"] * shape["lin_k_dim"] * shape["lin_v_dim"] * ssm_bytes)
    notes = []
    stated = data.get("num_parameters")
    if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
        total, params_source = stated, "config num_parameters"
        if abs(stated - counts.total) > 0.02 * stated:
            notes.append(f"num_parameters ({stated:,}) differs from the count from the architecture "
                         f"({counts.total:,}) by more than 2 %; bytes per step use the architecture's parts")
    else:
        total, params_source = counts.total, "computed from the architecture"
    if isinstance(data.get("vision_config"), Mapping):
        notes.append("vision encoder not counted (not read when decoding text)")
    if text.get("mtp_num_hidden_layers"):
        notes.append(f"{text['mtp_num_hidden_layers']} MTP layer(s) in the checkpoint not counted (read only by "
                     "the MTP method)")
    if text.get("sliding_window") and text.get("use_sliding_window", True) and not shape["linear"]:
        notes.append("sliding-window attention not modelled: KV counted over the whole context")
    if counts.expert_matrices:
        notes.append("routed experts read per step: expected share touched by the step's tokens under uniform "
                     "routing")
    if qc is not None:
        notes.append("quantised: every dense and expert matrix at the checkpoint's width; output head, "
                     "embedding and small parameters at the activation dtype (ignore lists not read)")
    return ModelFootprint(
        source=name, architecture=arch, params=counts, total_params=total, params_source=params_source,
        weight_dtype=weight_dtype, quantised_bytes_per_param=q_bytes, activation_dtype=act_name,
        activation_bytes=act_bytes,
        compute_dtype=compute, hidden_size=cfg.int("hidden_size"), vocab_size=cfg.int("vocab_size"),
        kv_bytes_per_token=shape["full"] * 2 * shape["kv_heads"] * shape["head_dim"] * kv_bytes,
        state_bytes_per_sequence=state, full_attention_layers=shape["full"],
        linear_attention_layers=shape["linear"], num_experts=shape["experts"], experts_per_token=shape["top_k"],
        notes=tuple(notes))


def _kv_element_bytes(kv_cache_dtype: str, act_bytes: int, source: str) -> int:
    if kv_cache_dtype == "auto":
        return act_bytes
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype in DTYPE_BYTES:
        return DTYPE_BYTES[kv_cache_dtype][1]
    raise ModelConfigError(f"{source}: kv_cache_dtype: unknown {kv_cache_dtype!r} (auto, fp8, or a torch dtype)")


def read_drafter_config(source: str | Path | Mapping[str, Any], target: ModelFootprint, *,
                        kv_cache_dtype: str = "auto") -> DrafterFootprint:
    """A drafter's footprint: a DFlash drafter (`DFlashDraftModel`: Qwen3 decoder layers, an `fc`
    projection of the target's tapped hidden states, the target's embedding and output head
    unless `has_own_lm_head`; `block_size` from the config or its `dflash_config`), or any model
    `read_model_config` reads, as a draft model (one pass per drafted token).

    Raises ModelConfigError naming the source and the key."""
    data, name = _load(source)
    arch = _architecture(data, name)
    if arch not in DRAFTER_ARCHS:
        model = read_model_config(data if isinstance(source, Mapping) else source, kv_cache_dtype=kv_cache_dtype)
        read = int(model.read_params(1))
        return DrafterFootprint(
            source=model.source, architecture=arch, kind="draft_model", own_params=model.total_params,
            read_params_per_pass=read, active_params_per_token=int(model.active_params_per_token),
            weight_bytes_per_pass=model.weight_bytes(1), kv_bytes_per_token=model.kv_bytes_per_token,
            notes=model.notes)
    cfg = _Config(data, name, arch)
    dflash = data.get("dflash_config") if isinstance(data.get("dflash_config"), Mapping) else {}
    block = dflash.get("block_size", data.get("block_size"))
    if not isinstance(block, int) or isinstance(block, bool) or block < 2:
        raise ModelConfigError(f"{name}: block_size: missing (DFlash's block, top level or in dflash_config; "
                               f"got {block!r})")
    h, n_layers = cfg.int("hidden_size"), cfg.int("num_hidden_layers")
    heads = cfg.int("num_attention_heads")
    kv_heads, head_dim = cfg.int("num_key_value_heads", default=heads), cfg.int("head_dim", default=h // heads)
    inter = cfg.int("intermediate_size")
    taps = dflash.get("target_layer_ids")
    n_taps = len(taps) if isinstance(taps, list) and taps else n_layers
    attn = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + (2 * head_dim)  # q, o; k, v; q/k norms
    layer = attn + 3 * h * inter + 2 * h
    fc = n_taps * target.hidden_size * h
    own = n_layers * layer + fc + 2 * h  # + hidden_norm, norm
    act_name, act_bytes = _dtype(data, data, name, "")
    own_head = bool(data.get("has_own_lm_head"))
    head = cfg.int("vocab_size", default=target.vocab_size) * h
    notes = [] if own_head else ["output head shared with the target: read again by every drafter pass"]
    kv_bytes = _kv_element_bytes(kv_cache_dtype, act_bytes, name)
    return DrafterFootprint(
        source=name, architecture=arch, kind="dflash", own_params=own + (head if own_head else 0),
        read_params_per_pass=own + head, active_params_per_token=own + head,
        weight_bytes_per_pass=(own + head) * act_bytes,
        kv_bytes_per_token=n_layers * 2 * kv_heads * head_dim * kv_bytes, block_size=block, notes=tuple(notes))
