"""Plain full-attention forward of one whole sequence, the ground truth the paged executor is tested against.

No pool, no block tables, no packing, no fast prefill: every layer sees every token, K/V are dense
tensors, attention is an explicit masked softmax (causal, and a window of `window` keys counting the
query itself on sliding layers), KV-sharing layers use their source layer's K/V, and MoE layers run
every expert on every token and keep the top-k weighted ones.
"""

from __future__ import annotations

import torch

from servesim.calibration.executor import Executor
from servesim.calibration.weights import LayerWeights, apply_rope, mlp, rms_norm, rope_cos_sin


def _dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, scale: float
) -> torch.Tensor:
    """q [L, H, d], k/v [L, KVH, d] -> [L, H, d] with causal (and sliding window) masking, in float32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    pos = torch.arange(q.shape[0], device=q.device)
    allowed = pos[None, :] <= pos[:, None]
    if window is not None:
        allowed &= pos[None, :] > pos[:, None] - window
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


def _dense_moe(x: torch.Tensor, w: LayerWeights, top_k: int, gated: bool) -> torch.Tensor:
    logits = x @ w.router
    top_logits, top_experts = logits.topk(top_k, dim=-1)
    gates = torch.zeros_like(logits).scatter(1, top_experts, torch.softmax(top_logits, dim=-1))
    every = torch.stack(
        [mlp(x, w.expert_up[e], w.expert_down[e], gated) for e in range(logits.shape[1])], dim=1
    )
    return (every * gates[:, :, None]).sum(dim=1)


def reference_logits(ex: Executor, token_ids: list[int]) -> torch.Tensor:
    """Logits [len(token_ids), vocab] (float32) at every position of one sequence, with ex's weights."""
    spec, weights = ex.spec, ex.weights
    q_dim, kv_dim, d = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.head_dim
    with torch.inference_mode():
        ids = torch.tensor(token_ids, device=ex.device)
        cos, sin = rope_cos_sin(torch.arange(len(token_ids), device=ex.device), d, ex.rope_theta, ex.dtype)
        x = weights.embed[ids]
        keys: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer, w in zip(spec.layers, weights.layers):
            h = rms_norm(x, w.norm_attn)
            qkv = h @ w.qkv + (0 if w.qkv_bias is None else w.qkv_bias)
            q = apply_rope(qkv[:, :q_dim].view(-1, spec.num_heads, d), cos, sin)
            if layer.owns_kv:
                k = apply_rope(qkv[:, q_dim : q_dim + kv_dim].view(-1, spec.num_kv_heads, d), cos, sin)
                keys[layer.index] = (k, qkv[:, q_dim + kv_dim :].view(-1, spec.num_kv_heads, d))
            k, v = keys[layer.kv_source]
            window = layer.window if layer.attention == "sliding" else None
            x = x + _dense_attention(q, k, v, window, ex.scale).reshape(-1, q_dim) @ w.o
            h = rms_norm(x, w.norm_mlp)
            x = x + (
                _dense_moe(h, w, spec.moe.experts_per_token, spec.gated_mlp)
                if layer.is_moe
                else mlp(h, w.up, w.down, spec.gated_mlp)
            )
        return (rms_norm(x, weights.norm_final) @ weights.lm_head).float()
