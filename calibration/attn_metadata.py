"""Attention metadata of a packed ragged batch, and the gather plans paged attention runs from.

A step packs every scheduled request's new tokens into one [tokens, ...] tensor:

    tokens:          | r0 prefill chunk (5) | r1 decode | r2 decode |
    query_start_loc: [0,                     5,          6,          7]
    seq_lens:        [context0 + 5,          context1+1, context2+1]

The queries of request r are the last `query_start_loc[r+1] - query_start_loc[r]` tokens of its
`seq_lens[r]` tokens (bottom-right causal alignment, as FlashAttention's varlen kernels), which is
what both chunked prefill and YOCO's reduced cross-decoder batch need. Only the blocks a request's
queries can see are gathered: from the first key inside the sliding window (if any) to the last token.

Plans (per window size, built once per step and shared by every layer with that window):
- prefill chunks with the same (query length, block count) form one padded-free `PrefillBucket`;
- all decodes form `DecodeChunk`s: their blocks concatenated exactly (no padding), each block tagged
  with its request, split between requests so one chunk gathers at most `max_gather_tokens` keys
  (on CPU that keeps the gathered K/V in cache for the matmuls that read them right after).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class PrefillBucket:
    """Requests attended in one SDPA call. Index tensors live on the device."""

    q_index: torch.Tensor  # [B, Q] packed token index of each query
    block_ids: torch.Tensor  # [B * NB] blocks to gather, request-major
    mask: torch.Tensor | None  # [B, 1, Q, NB * block_size] bool, True = attend; None: causal from key 0


@dataclass
class DecodeChunk:
    """Decode requests whose blocks are gathered back to back (one query each)."""

    q_index: torch.Tensor  # [R] packed token index of each request's query
    block_ids: torch.Tensor  # [N] blocks of all R requests, in request order
    block_req: torch.Tensor  # [N] which of the R requests each block belongs to
    mask: torch.Tensor  # [N, 1, block_size] bool: the slot holds a key the query may see


@dataclass
class Plan:
    prefill: list[PrefillBucket]
    decode: list[DecodeChunk]


@dataclass
class AttnMetadata:
    """Host-side (CPU tensor) metadata of one forward over the packed tokens, plus cached plans."""

    query_start_loc: torch.Tensor  # int64 [R + 1]
    seq_lens: torch.Tensor  # int64 [R]
    block_table: np.ndarray  # int64 [R, max_blocks], padded with block 0
    block_size: int
    device: torch.device
    max_gather_tokens: int | None = None
    plans: dict = field(default_factory=dict)  # window -> Plan, built on first use

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def max_query_len(self) -> int:
        return int((self.query_start_loc[1:] - self.query_start_loc[:-1]).max()) if self.num_reqs else 0

    def plan(self, window: int | None) -> Plan:
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
    return AttnMetadata(
        decode_query_start_loc,
        meta.seq_lens,
        meta.block_table,
        meta.block_size,
        meta.device,
        meta.max_gather_tokens,
    )


def _visible(meta: AttnMetadata, window: int | None) -> list[tuple[int, int, int, int]]:
    """(request, query length, first block, block count) of every request with queries."""
    qsl, seq, bs = meta.query_start_loc.numpy(), meta.seq_lens.numpy(), meta.block_size
    out = []
    for r in range(meta.num_reqs):
        q_len = int(qsl[r + 1] - qsl[r])
        if q_len:
            first_key = 0 if window is None else max(0, int(seq[r]) - q_len - window + 1)
            out.append((r, q_len, first_key // bs, (int(seq[r]) - 1) // bs - first_key // bs + 1))
    return out


def build_plan(meta: AttnMetadata, window: int | None) -> Plan:
    """Gather indices and masks for every request of the step, for one window size."""
    prefills: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    decodes, chunks, blocks = [], [], 0
    budget = max(1, (meta.max_gather_tokens or 1 << 62) // meta.block_size)
    for member in _visible(meta, window):
        if member[1] > 1:
            prefills.setdefault((member[1], member[3]), []).append(member)
            continue
        if decodes and blocks + member[3] > budget:
            chunks.append(_decode_chunk(meta, decodes, window))
            decodes, blocks = [], 0
        decodes.append(member)
        blocks += member[3]
    if decodes:
        chunks.append(_decode_chunk(meta, decodes, window))
    return Plan([_prefill_bucket(meta, members, window) for members in prefills.values()], chunks)


def _key_mask(key_pos: np.ndarray, q_pos: np.ndarray, seq_len: np.ndarray, window: int | None) -> np.ndarray:
    """Broadcast (key <= query) & (key < seq_len) & (inside the window), True = attend."""
    mask = (key_pos <= q_pos) & (key_pos < seq_len)
    return mask & (key_pos > q_pos - window) if window is not None else mask


def _prefill_bucket(
    meta: AttnMetadata, members: list[tuple[int, int, int, int]], window: int | None
) -> PrefillBucket:
    bs, qsl, seq = meta.block_size, meta.query_start_loc.numpy(), meta.seq_lens.numpy()
    q_len, n_blocks = members[0][1], members[0][3]
    rows = [r for r, _, _, _ in members]
    q_index = qsl[rows][:, None] + np.arange(q_len)[None, :]
    q_pos = (seq[rows] - q_len)[:, None] + np.arange(q_len)[None, :]  # [B, Q]
    block_ids = np.stack([meta.block_table[r, first : first + n_blocks] for r, _, first, _ in members])
    key_pos = (
        np.array([first * bs for _, _, first, _ in members])[:, None] + np.arange(n_blocks * bs)[None, :]
    )
    dev = meta.device
    # whole prompts without a window: SDPA's own causal mask skips the upper triangle's work
    fresh = (q_pos[:, 0] == 0).all() and (window is None or window >= q_len)
    mask = (
        None
        if fresh
        else torch.from_numpy(
            _key_mask(key_pos[:, None, :], q_pos[:, :, None], seq[rows][:, None, None], window)[:, None]
        ).to(dev)
    )
    return PrefillBucket(torch.from_numpy(q_index).to(dev), torch.from_numpy(block_ids.ravel()).to(dev), mask)


def _decode_chunk(
    meta: AttnMetadata, members: list[tuple[int, int, int, int]], window: int | None
) -> DecodeChunk:
    bs, qsl, seq = meta.block_size, meta.query_start_loc.numpy(), meta.seq_lens.numpy()
    rows = np.array([r for r, _, _, _ in members])
    counts = np.array([n for _, _, _, n in members])
    block_req = np.repeat(np.arange(len(members)), counts)
    block_ids = np.concatenate([meta.block_table[r, first : first + n] for r, _, first, n in members])
    first_pos = np.concatenate([(first + np.arange(n)) * bs for _, _, first, n in members])
    key_pos = first_pos[:, None] + np.arange(bs)[None, :]  # [N, bs]
    seq_len = seq[rows][block_req][:, None]
    mask = _key_mask(key_pos, seq_len - 1, seq_len, window)
    dev = meta.device
    return DecodeChunk(
        torch.from_numpy(qsl[rows]).to(dev),
        torch.from_numpy(block_ids).to(dev),
        torch.from_numpy(block_req).to(dev),
        torch.from_numpy(mask[:, None, :]).to(dev),
    )
