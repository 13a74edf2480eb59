"""Train the demo target and draft models with real weights, on local text, deterministically.

Used by benchkit.engines.demo_models: a tiny LlamaForCausalLM target is trained on Python
standard-library sources (the demo tokenizer's corpus) for a fixed number of steps, then the
draft model, one layer of the target's width, is distilled from it: it starts from the target's
embeddings, first layer, final norm and LM head and is trained to match the target's next-token
distribution (KL) on the same text. The two agree on many greedy tokens but not all, so a
speculative decoding run on them accepts part of the draft (tau below k+1, falling per position),
as real drafters do.

The model code here is a minimal re-implementation of Hugging Face's `LlamaForCausalLM` forward
pass (RMSNorm, rotary embeddings in the "rotate half" layout, SiLU-gated MLP, no biases, untied
LM head), and `state_dict_hf` names the tensors as that class does, so vLLM and transformers load
the saved `model.safetensors` unchanged (tests/test_demo_models.py compares the logits with
transformers' where it is installed).

Determinism: every random draw comes from one seeded `torch.Generator`; training runs on a fixed
number of CPU threads (`TrainSpec.threads`) with a fixed batch order, so the same spec on the same
machine gives bit-identical weights. torch is imported lazily (the worker-only venv has none).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TrainSpec:
    """Everything that decides the trained weights (part of the demo set's spec hash).

    `target_steps` / `draft_steps`: optimizer steps of the target's training and of the draft's
    distillation; `batch` sequences of `seq_len` tokens per step; `lr`: AdamW peak learning rate
    (linear warm-up over `warmup_steps`, cosine decay to a tenth); `seed`: the generator's seed;
    `threads`: torch CPU threads during training (fixed so that reductions are reproducible);
    `kd_temperature`: softmax temperature of the distillation targets; `draft_noise`: after the
    distillation every weight matrix of the draft gets seeded Gaussian noise of this many times
    its own standard deviation (0: none). A distilled one-layer draft of a briefly trained target
    agrees with it on most greedy tokens (such a target's greedy text repeats itself); the noise
    lowers that agreement to what the demo wants to show."""

    target_steps: int = 300
    draft_steps: int = 120
    batch: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0
    threads: int = 2
    kd_temperature: float = 1.0
    draft_noise: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The spec as plain data (for the spec hash and the build marker)."""
        return asdict(self)


@dataclass
class TrainReport:
    """What a training run did: final mean losses (nats/token) over the last 10 steps, the
    draft's greedy agreement with the target on held-out text (share of positions whose argmax
    is equal, 0..1), and wall seconds per phase."""

    target_loss: float
    draft_loss: float
    greedy_agreement: float
    target_seconds: float
    draft_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _model_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            var = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(var + self.eps))

    class Layer(nn.Module):
        def __init__(self, cfg: dict[str, Any]):
            super().__init__()
            h, inter = cfg["hidden_size"], cfg["intermediate_size"]
            self.n_heads, self.head_dim = cfg["num_attention_heads"], cfg["head_dim"]
            self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)
            self.gate_proj = nn.Linear(h, inter, bias=False)
            self.up_proj = nn.Linear(h, inter, bias=False)
            self.down_proj = nn.Linear(inter, h, bias=False)
            self.input_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
            self.post_attention_layernorm = RMSNorm(h, cfg["rms_norm_eps"])

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            n = self.input_layernorm(x)

            def heads(p):
                return p(n).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

            q, k, v = heads(self.q_proj), heads(self.k_proj), heads(self.v_proj)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
            n = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))

    def _rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Llama(nn.Module):
        """HF LlamaForCausalLM's forward pass for the config dicts of demo_models."""

        def __init__(self, cfg: dict[str, Any]):
            super().__init__()
            self.cfg = cfg
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
            self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
            self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
            d = cfg["head_dim"]
            self.register_buffer(
                "inv_freq", 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d)),
                persistent=False)

        def forward(self, ids):
            t = ids.shape[1]
            freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.lm_head(self.norm(x))

        def state_dict_hf(self) -> dict[str, Any]:
            """The weights under Hugging Face LlamaForCausalLM's tensor names (contiguous fp32)."""
            out = {"model.embed_tokens.weight": self.embed_tokens.weight,
                   "model.norm.weight": self.norm.weight, "lm_head.weight": self.lm_head.weight}
            for i, layer in enumerate(self.layers):
                pre = f"model.layers.{i}."
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    out[pre + f"self_attn.{name}.weight"] = getattr(layer, name).weight
                for name in ("gate_proj", "up_proj", "down_proj"):
                    out[pre + f"mlp.{name}.weight"] = getattr(layer, name).weight
                out[pre + "input_layernorm.weight"] = layer.input_layernorm.weight
                out[pre + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
            return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}

    return Llama


def model_from_hf(cfg: dict[str, Any], tensors: dict[str, Any]) -> Any:
    """This module's Llama for config dict `cfg` with weights `tensors` named as Hugging Face's
    LlamaForCausalLM names them (the inverse of `state_dict_hf`), in eval mode. Raises
    RuntimeError when a tensor is missing or extra."""
    sd = {}
    for name, t in tensors.items():
        key = name.removeprefix("model.").replace("self_attn.", "").replace("mlp.", "")
        sd[key] = t
    model = _model_classes()(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def perturb(tensors: dict[str, Any], scale: float, seed: int) -> dict[str, Any]:
    """`tensors` (HF names) with seeded Gaussian noise added to every matrix (2-D tensor), of
    `scale` times that matrix's own standard deviation; vectors (norms) unchanged. The noise is
    drawn from `torch.Generator().manual_seed(seed)` over the names in sorted order, so it can be
    reproduced from the saved weights alone. `scale` 0 returns the tensors unchanged."""
    import torch

    if not scale:
        return tensors
    gen = torch.Generator().manual_seed(seed)
    out = dict(tensors)
    for name in sorted(tensors):
        t = tensors[name]
        if t.dim() == 2:
            out[name] = (t + torch.randn(t.shape, generator=gen) * (t.std() * scale)).contiguous()
    return out


def new_model(cfg: dict[str, Any], generator) -> Any:
    """A Llama (this module's) for config dict `cfg`, initialised from `generator`: linear and
    embedding weights normal(0, initializer_range), norms 1."""
    import torch

    model = _model_classes()(cfg)
    std = cfg["initializer_range"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
    return model


def _lr(step: int, spec: TrainSpec, total: int) -> float:
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    frac = (step - spec.warmup_steps) / max(1, total - spec.warmup_steps)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _batches(tokens, spec: TrainSpec, steps: int, generator):
    """`steps` batches of `spec.batch` windows of `seq_len + 1` tokens at seeded offsets."""
    import torch

    hi = tokens.numel() - spec.seq_len - 1
    for _ in range(steps):
        starts = torch.randint(0, hi, (spec.batch,), generator=generator)
        yield torch.stack([tokens[s:s + spec.seq_len + 1] for s in starts.tolist()])


def train_pair(token_ids: list[int], target_cfg: dict[str, Any], draft_cfg: dict[str, Any],
               spec: TrainSpec) -> tuple[dict[str, Any], dict[str, Any], TrainReport]:
    """Train the target on `token_ids` (the corpus as one token stream; the last tenth is held
    out), then distil the draft from it. Returns (target tensors, draft tensors, report), the
    tensors named as Hugging Face's LlamaForCausalLM names them (fp32, CPU).

    The draft must have the target's hidden size, heads and vocab (it starts from the target's
    embeddings, first layer, norm and head). Raises ValueError when the corpus is shorter than
    a few windows or the shapes differ. torch's thread count is restored afterwards."""
    import torch
    import torch.nn.functional as F

    for key in ("hidden_size", "num_attention_heads", "head_dim", "vocab_size", "intermediate_size"):
        if target_cfg[key] != draft_cfg[key]:
            raise ValueError(f"draft {key} {draft_cfg[key]} differs from the target's {target_cfg[key]}")
    data = torch.tensor(token_ids, dtype=torch.long)
    split = int(data.numel() * 0.9)
    train, held = data[:split], data[split:]
    if held.numel() < spec.seq_len + 2 or train.numel() < 4 * (spec.seq_len + 1):
        raise ValueError(f"corpus of {data.numel()} tokens is too short for windows of {spec.seq_len}")
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        gen = torch.Generator().manual_seed(spec.seed)
        t0 = time.monotonic()
        target = new_model(target_cfg, gen)
        opt = torch.optim.AdamW(target.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.01)
        losses = []
        for step, batch in enumerate(_batches(train, spec, spec.target_steps, gen)):
            for g in opt.param_groups:
                g["lr"] = _lr(step, spec, spec.target_steps)
            logits = target(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        target.eval()
        t1 = time.monotonic()

        draft = _model_classes()(draft_cfg)
        sd = target.state_dict()
        draft.load_state_dict({k: v for k, v in sd.items() if not k.startswith("layers.")
                               or k.startswith("layers.0.")})
        opt = torch.optim.AdamW(draft.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.01)
        d_losses = []
        temp = spec.kd_temperature
        for step, batch in enumerate(_batches(train, spec, spec.draft_steps, gen)):
            for g in opt.param_groups:
                g["lr"] = _lr(step, spec, spec.draft_steps)
            with torch.no_grad():
                teacher = F.log_softmax(target(batch[:, :-1]) / temp, dim=-1)
            student = F.log_softmax(draft(batch[:, :-1]) / temp, dim=-1)
            loss = F.kl_div(student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1]),
                            log_target=True, reduction="batchmean")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            d_losses.append(loss.item())
        draft_w = perturb(draft.state_dict_hf(), spec.draft_noise, spec.seed + 1)
        draft = model_from_hf(draft_cfg, draft_w)
        t2 = time.monotonic()
        with torch.no_grad():
            n = (held.numel() - 1) // spec.seq_len * spec.seq_len
            ids = held[:n].view(-1, spec.seq_len)
            agree = (target(ids).argmax(-1) == draft(ids).argmax(-1)).float().mean().item()
        report = TrainReport(
            target_loss=sum(losses[-10:]) / len(losses[-10:]) if losses else float("nan"),
            draft_loss=sum(d_losses[-10:]) / len(d_losses[-10:]) if d_losses else float("nan"),
            greedy_agreement=agree, target_seconds=t1 - t0, draft_seconds=t2 - t1)
        return target.state_dict_hf(), draft_w, report
    finally:
        torch.set_num_threads(threads)
