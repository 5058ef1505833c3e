"""Seeded random weights for a `ModelSpec` and the per-token building blocks every forward shares.

Layout: matrices are stored [in_features, out_features] so a projection is `x @ w`. Init is
N(0, 1/fan_in) (activations keep unit scale through the residual stream), embeddings N(0, 1),
norm weights 1. Weights are drawn on the target device with a seeded generator, so a full-size
8B model on a GPU needs no host copy; the same seed gives the same weights on the same device type.
Blocks: RMSNorm, rotary embedding (NeoX half rotation), gated (SwiGLU) or plain GELU MLP, and
top-k MoE (softmax over the top-k router logits, as Mixtral).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servesim.hardware.model import ModelSpec

RMS_EPS = 1e-6


@dataclass
class LayerWeights:
    norm_attn: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [hidden, (heads + 2 kv_heads) * head_dim]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [heads * head_dim, hidden]
    norm_mlp: torch.Tensor  # [hidden]
    up: torch.Tensor | None  # dense: [hidden, 2 * inter] (gate | up) or [hidden, inter] when not gated
    down: torch.Tensor | None  # dense: [inter, hidden]
    router: torch.Tensor | None = None  # MoE: [hidden, experts]
    expert_up: torch.Tensor | None = None  # MoE: [experts, hidden, 2 * inter]
    expert_down: torch.Tensor | None = None  # MoE: [experts, inter, hidden]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm_final: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [hidden, vocab]; a transposed view of `embed` when tied


def init_weights(spec: ModelSpec, device: torch.device, dtype: torch.dtype, seed: int = 0) -> ModelWeights:
    """Random weights for `spec` on `device`; deterministic in (spec, seed, device type)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def mat(*shape: int) -> torch.Tensor:
        w = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
        return w.mul_(shape[-2] ** -0.5)

    h, q_dim, kv_dim = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    ones = lambda: torch.ones(h, device=device, dtype=dtype)  # noqa: E731
    gate = 2 if spec.gated_mlp else 1
    layers = []
    for layer in spec.layers:
        w = LayerWeights(
            ones(),
            mat(h, q_dim + 2 * kv_dim),
            mat(1, q_dim + 2 * kv_dim)[0] if spec.qkv_bias else None,
            mat(q_dim, h),
            ones(),
            None,
            None,
        )
        if layer.is_moe:
            moe = spec.moe
            w.router = mat(h, moe.num_experts)
            w.expert_up = mat(moe.num_experts, h, gate * moe.expert_intermediate)
            w.expert_down = mat(moe.num_experts, moe.expert_intermediate, h)
        else:
            w.up, w.down = mat(h, gate * layer.mlp_intermediate), mat(layer.mlp_intermediate, h)
        layers.append(w)
    embed = torch.randn(spec.vocab_size, h, generator=gen, device=device, dtype=dtype)
    lm_head = embed.t() if spec.tie_embeddings else mat(h, spec.vocab_size)
    return ModelWeights(embed, layers, ones(), lm_head)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm computed in float32 (bf16 squares lose too much), returned in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(x.dtype) * weight


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """cos and sin of shape [tokens, 1, head_dim // 2] for absolute token positions."""
    inv_freq = theta ** (
        -torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos()[:, None, :].to(dtype), angles.sin()[:, None, :].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [tokens, heads, head_dim] by its positions (NeoX style: first half with second half)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def mlp(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor, gated: bool) -> torch.Tensor:
    """SwiGLU (silu(x W_gate) * x W_up) W_down, or GELU(x W_up) W_down when not gated."""
    if not gated:
        return F.gelu(x @ up) @ down
    gate, value = (x @ up).chunk(2, dim=-1)
    return (F.silu(gate) * value) @ down


def moe(x: torch.Tensor, w: LayerWeights, top_k: int, gated: bool) -> torch.Tensor:
    """Top-k routed experts: each token goes to its k highest-scoring experts, weighted by the softmax of
    those k router logits. Experts run one after another on the tokens routed to them."""
    top_logits, top_experts = (x @ w.router).topk(top_k, dim=-1)
    gates = torch.softmax(top_logits.float(), dim=-1).to(x.dtype)
    out = torch.zeros_like(x)
    for expert in range(w.router.shape[1]):
        rows, slot = (top_experts == expert).nonzero(as_tuple=True)
        if rows.numel():
            y = mlp(x[rows], w.expert_up[expert], w.expert_down[expert], gated)
            out.index_add_(0, rows, y * gates[rows, slot, None])
    return out
