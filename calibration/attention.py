"""Paged attention over a KV pool [2, num_blocks, block_size, kv_heads, head_dim], from `attn_metadata` plans.

K/V are gathered block by block with one `index_select` per half (contiguous rows; advanced indexing
is several times slower on CPU) into [.., keys, kv_heads * head_dim], then:

- prefill buckets: `scaled_dot_product_attention`, causal from key 0 for whole prompts, else with a
  boolean mask; GQA through `enable_gqa`, except masked calls on CUDA (the memory-efficient kernel
  takes no `enable_gqa`), which expand K/V to the query heads.
- decode chunks: ragged, like a varlen decode kernel: every gathered block scores against its own
  request's query, the softmax runs per request across its blocks (max and sum reduced by request),
  and the weighted values are summed back per request. The work is exactly the blocks read, in a
  fixed number of tensor ops however uneven the contexts are. Queries are block-diagonal
  ([heads, kv_heads * head_dim], zero outside each head's own KV head) so the gathered K/V are read
  in place instead of transposed to heads-first; the extra FLOPs (x kv_heads) are small next to the
  bytes a decode reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from servesim.calibration.attn_metadata import DecodeChunk, Plan


def write_kv(kv_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store the new tokens' K/V [tokens, kv_heads, head_dim] at their slots (block * block_size + offset)."""
    kv_cache[0].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Blocks of one pool half [num_blocks, block_size, kv_heads, head_dim] -> [N, block_size, kv_heads * head_dim]."""
    return cache.view(cache.shape[0], -1).index_select(0, block_ids).view(len(block_ids), cache.shape[1], -1)


def _block_diagonal(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [R, H, d] -> [R, H, kv_heads * d], head h's vector in the slot of its KV head h // (H / kv_heads)."""
    r, heads, d = q.shape
    eye = torch.eye(kv_heads, device=q.device, dtype=q.dtype)
    return torch.einsum("rkgd,kj->rkgjd", q.view(r, kv_heads, heads // kv_heads, d), eye).reshape(
        r, heads, -1
    )


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, c: DecodeChunk, scale: float
) -> torch.Tensor:
    """One query per request, q [R, H, d] -> [R, H, d], over the chunk's ragged blocks."""
    r, heads, d = q.shape
    kv_heads = k_cache.shape[-2]
    k, v = _gather(k_cache, c.block_ids), _gather(v_cache, c.block_ids)  # [N, bs, KVH * d]
    q_blocks = _block_diagonal(q, kv_heads).index_select(0, c.block_req)  # [N, H, KVH * d]
    scores = torch.bmm(q_blocks, k.transpose(1, 2)).float().mul_(scale).masked_fill_(~c.mask, float("-inf"))
    req = c.block_req[:, None].expand(-1, heads)
    top = torch.full((r, heads), float("-inf"), device=q.device).scatter_reduce_(
        0, req, scores.amax(-1), "amax", include_self=False
    )
    # [N, H, bs]; masked slots -> 0
    weights = torch.exp(scores - top.index_select(0, c.block_req)[:, :, None])
    total = torch.zeros(r, heads, device=q.device).index_add_(0, c.block_req, weights.sum(-1))
    partial = torch.bmm(weights.to(v.dtype), v).float()  # [N, H, KVH * d]
    out = torch.zeros(r, heads, kv_heads * d, device=q.device).index_add_(0, c.block_req, partial)
    out = (out / total[:, :, None]).view(r, kv_heads, heads // kv_heads, kv_heads, d)
    return out.diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2).reshape(r, heads, d).to(q.dtype)


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, plan: Plan, scale: float) -> torch.Tensor:
    """Attention of packed queries q [tokens, heads, head_dim] over the paged cache `kv_cache`
    [2, num_blocks, block_size, kv_heads, head_dim]. Returns [tokens, heads, head_dim]."""
    out = torch.empty_like(q)
    kv_heads, d = kv_cache.shape[-2:]
    for c in plan.decode:
        out[c.q_index] = _decode(q[c.q_index], kv_cache[0], kv_cache[1], c, scale)
    for b in plan.prefill:
        n, q_len = b.q_index.shape
        k, v = (_gather(half, b.block_ids).view(n, -1, kv_heads, d).transpose(1, 2) for half in kv_cache)
        gqa = b.mask is None or not q.is_cuda
        if not gqa:
            group = q.shape[1] // kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(
            q[b.q_index].transpose(1, 2),
            k,
            v,
            attn_mask=b.mask,
            scale=scale,
            is_causal=b.mask is None,
            enable_gqa=gqa,
        )
        out[b.q_index.reshape(-1)] = o.transpose(1, 2).reshape(n * q_len, *q.shape[1:])
    return out
