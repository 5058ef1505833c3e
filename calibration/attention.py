"""Attention metadata of a packed ragged batch and paged attention that reads K/V through block tables.

A step packs every scheduled request's new tokens into one [tokens, ...] tensor:

    tokens:          | r0 prefill chunk (5) | r1 decode | r2 decode |
    query_start_loc: [0,                     5,          6,          7]
    seq_lens:        [context0 + 5,          context1+1, context2+1]

The queries of request r are the last `query_start_loc[r+1] - query_start_loc[r]` tokens of its
`seq_lens[r]` tokens (bottom-right causal alignment, as FlashAttention's varlen kernels), which is
what both chunked prefill and YOCO's reduced cross-decoder batch need.

Paged attention gathers each request's blocks (only those a sliding window can see) into a padded
[B, keys, kv_heads * head_dim] tensor with one `index_select` per K and V (contiguous rows, unlike
advanced indexing, which is several times slower on CPU), then:
- prefill chunks: `scaled_dot_product_attention` with a boolean mask (GQA by `enable_gqa`);
- decodes: two batched matmuls against a block-diagonal query ([B, heads, kv_heads * head_dim], zero
  outside each head's own KV head), which reads the gathered K/V in place instead of transposing it to
  heads-first; the extra FLOPs (x kv_heads) are small next to the bytes a decode reads.
Requests are grouped so padding stays small: prefill chunks of the same (query length, block count)
run together unpadded; decodes are bucketed by block count rounded up to a power of `bucket_ratio`,
and a bucket is split so one gather holds at most `max_gather_tokens` keys (on CPU that keeps the
gathered K/V in cache for the matmuls that read them right after; on CUDA there is no limit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class AttnMetadata:
    """Host-side (CPU tensor) metadata of one forward over the packed tokens, plus cached gather plans."""

    query_start_loc: torch.Tensor  # int64 [R + 1]
    seq_lens: torch.Tensor  # int64 [R]
    block_table: np.ndarray  # int64 [R, max_blocks], padded with block 0
    block_size: int
    device: torch.device
    bucket_ratio: float = 2.0
    max_gather_tokens: int | None = None
    plans: dict = field(default_factory=dict)  # window -> list[_Bucket], built on first use

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_query_len(self) -> int:
        return int((self.query_start_loc[1:] - self.query_start_loc[:-1]).max()) if self.num_reqs else 0

    def plan(self, window: int | None) -> list[_Bucket]:
        if window not in self.plans:
            self.plans[window] = build_plan(self, window)
        return self.plans[window]


def make_kv_sharing_fast_prefill_metadata(meta: AttnMetadata, logits_indices: torch.Tensor) -> AttnMetadata:
    """Metadata for the KV-sharing (cross-decoder) layers that see only the `logits_indices` tokens.

    The same steps as vLLM's `make_kv_sharing_fast_prefill_common_attn_metadata`: find each logits
    index's request, count them per request, rebuild query_start_loc from those counts; seq_lens and
    block tables stay (the queries are still the last tokens of each request's sequence). An all-decode
    batch (max query length 1) is returned unchanged. `logits_indices` is a host int64 tensor.
    """
    if meta.max_query_len == 1:
        return meta
    query_start_loc = meta.query_start_loc
    # e.g. logits_indices [14, 18, 19, 27], query_start_loc [0, 15, 20, 28] -> request_ids [0, 1, 1, 2]
    request_ids = torch.bucketize(logits_indices, query_start_loc[1:], right=True)
    num_decode_tokens = torch.bincount(request_ids, minlength=meta.num_reqs)  # [1, 2, 1]
    decode_query_start_loc = torch.empty(meta.num_reqs + 1, dtype=query_start_loc.dtype)
    decode_query_start_loc[0] = 0
    decode_query_start_loc[1:] = torch.cumsum(num_decode_tokens, dim=0)  # [0, 1, 3, 4]
    return AttnMetadata(decode_query_start_loc, meta.seq_lens, meta.block_table, meta.block_size, meta.device,
                        meta.bucket_ratio, meta.max_gather_tokens)


@dataclass
class _Bucket:
    """Requests attended in one SDPA call. Indices are device tensors."""

    q_index: torch.Tensor  # [B, Qp] packed token index of each query (padding repeats a valid one)
    q_valid: torch.Tensor  # [B, Qp] bool
    out_index: torch.Tensor  # [valid queries] packed token index, in q_valid order
    block_ids: torch.Tensor  # [B * NBp] blocks to gather, request-major (padding: block 0, masked)
    mask: torch.Tensor | None  # [B, 1, Qp, NBp * block_size] bool, True = attend; None: plain causal from key 0

    @property
    def is_decode(self) -> bool:
        return self.q_index.shape[1] == 1


def _bucket_key(q_len: int, num_blocks: int, ratio: float) -> tuple[int, int]:
    if q_len > 1:
        return q_len, num_blocks
    return 1, max(1, math.ceil(ratio ** math.ceil(math.log(num_blocks, ratio) - 1e-9))) if num_blocks > 1 else 1


def build_plan(meta: AttnMetadata, window: int | None) -> list[_Bucket]:
    """Group requests into buckets and precompute gather indices and masks for one window size."""
    qsl = meta.query_start_loc.numpy()
    seq = meta.seq_lens.numpy()
    bs = meta.block_size
    groups: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for r in range(meta.num_reqs):
        q_len = int(qsl[r + 1] - qsl[r])
        if q_len == 0:
            continue
        context = int(seq[r]) - q_len
        first_key = 0 if window is None else max(0, context - window + 1)
        first_block, last_block = first_key // bs, (int(seq[r]) - 1) // bs
        n_blocks = last_block - first_block + 1
        groups.setdefault(_bucket_key(q_len, n_blocks, meta.bucket_ratio), []).append((r, q_len, first_block, n_blocks))
    per_gather = max(1, (meta.max_gather_tokens or 1 << 62) // bs)  # blocks one gather may hold
    return [_make_bucket(meta, members[i:i + step], qp, nbp, window) for (qp, nbp), members in groups.items()
            for step in [max(1, per_gather // nbp)] for i in range(0, len(members), step)]


def _make_bucket(meta: AttnMetadata, members: list[tuple[int, int, int, int]], qp: int, nbp: int,
                 window: int | None) -> _Bucket:
    bs, qsl, seq = meta.block_size, meta.query_start_loc.numpy(), meta.seq_lens.numpy()
    b = len(members)
    q_index, q_valid = np.zeros((b, qp), np.int64), np.zeros((b, qp), bool)
    block_ids = np.zeros((b, nbp), np.int64)
    q_pos, key_start, seq_len = np.zeros((b, qp), np.int64), np.zeros(b, np.int64), np.zeros(b, np.int64)
    for i, (r, q_len, first_block, n_blocks) in enumerate(members):
        start = int(qsl[r])
        q_index[i, :q_len] = np.arange(start, start + q_len)
        q_index[i, q_len:] = start
        q_valid[i, :q_len] = True
        q_pos[i] = int(seq[r]) - q_len + np.minimum(np.arange(qp), q_len - 1)
        block_ids[i, :n_blocks] = meta.block_table[r, first_block:first_block + n_blocks]
        key_start[i], seq_len[i] = first_block * bs, int(seq[r])
    key_pos = key_start[:, None] + np.arange(nbp * bs)[None, :]  # [B, S]
    mask = (key_pos[:, None, :] <= q_pos[:, :, None]) & (key_pos[:, None, :] < seq_len[:, None, None])
    if window is not None:
        mask &= key_pos[:, None, :] > q_pos[:, :, None] - window
    dev = meta.device
    # whole prompts without a window: SDPA's own causal mask skips the upper triangle's work
    fresh = qp > 1 and q_valid.all() and (q_pos[:, 0] == 0).all() and (window is None or window >= qp)
    return _Bucket(torch.from_numpy(q_index).to(dev), torch.from_numpy(q_valid).to(dev),
                   torch.from_numpy(q_index[q_valid]).to(dev), torch.from_numpy(block_ids.ravel()).to(dev),
                   None if fresh else torch.from_numpy(mask[:, None]).to(dev))


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """Blocks of one pool half [num_blocks, block_size, kv_heads, head_dim] -> [B, keys, kv_heads * head_dim]."""
    return cache.view(cache.shape[0], -1).index_select(0, block_ids).view(batch, -1, cache.shape[-2] * cache.shape[-1])


def _decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, kv_heads: int,
            scale: float) -> torch.Tensor:
    """q [B, H, d], k/v [B, S, KVH * d], mask [B, 1, S] -> [B, H, d], one query per request."""
    b, heads, d = q.shape
    group = heads // kv_heads
    eye = torch.eye(kv_heads, device=q.device, dtype=q.dtype)
    q_bd = torch.einsum("bkgd,kj->bkgjd", q.view(b, kv_heads, group, d), eye).reshape(b, heads, kv_heads * d)
    scores = torch.bmm(q_bd, k.transpose(1, 2)).float().mul_(scale).masked_fill_(~mask, float("-inf"))
    out = torch.bmm(torch.softmax(scores, dim=-1).to(v.dtype), v)  # [B, H, KVH * d]: keep each head's own block
    return out.view(b, kv_heads, group, kv_heads, d).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2).reshape(b, heads, d)


def paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, buckets: list[_Bucket], scale: float) -> torch.Tensor:
    """Attention of packed queries q [tokens, heads, head_dim] over the paged cache
    kv_cache [2, num_blocks, block_size, kv_heads, head_dim]. Returns [tokens, heads, head_dim]."""
    out = torch.empty_like(q)
    kv_heads, d = kv_cache.shape[-2:]
    for b in buckets:
        n = b.q_index.shape[0]
        k, v = _gather(kv_cache[0], b.block_ids, n), _gather(kv_cache[1], b.block_ids, n)
        if b.is_decode:
            out[b.out_index] = _decode(q[b.q_index[:, 0]], k, v, b.mask[:, :, 0], kv_heads, scale)
            continue
        k, v = (x.view(n, -1, kv_heads, d).transpose(1, 2) for x in (k, v))
        o = F.scaled_dot_product_attention(q[b.q_index].transpose(1, 2), k, v, attn_mask=b.mask, scale=scale,
                                           is_causal=b.mask is None, enable_gqa=True)
        out[b.out_index] = o.transpose(1, 2)[b.q_valid]
    return out


def write_kv(kv_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store the new tokens' K/V [tokens, kv_heads, head_dim] at their slots (block * block_size + offset)."""
    kv_cache[0].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)
