"""A small real serving executor: one forward pass over a packed ragged batch, paged KV, greedy sampling.

The input is what an engine step is: per scheduled request its new token ids, its context length
(tokens whose KV is already in the cache: earlier chunks, earlier outputs, or a reused prefix), its
block table and whether it needs logits (`StepInput`; `StepInput.from_batch` builds one from a
`hardware.batch.StepBatch` with random tokens for profiling). Prefill chunks and decodes share one
pass. Every KV-owning layer has a pool [2, num_blocks, block_size, kv_heads, head_dim]; KV-sharing
layers read their source layer's pool and write none.

With `kv_sharing_fast_prefill` (YOCO), the trailing KV-sharing layers run only on each request's last
scheduled token (vLLM's logits indices) with metadata rebuilt by
`make_kv_sharing_fast_prefill_metadata`, and their output is merged back before the LM head.
KV-sharing layers still compute the full fused QKV projection and drop K/V, as vLLM's Gemma 3n does
(and as `hardware.cost` prices it).

With `kv_windows` (a hybrid KV cache: hardware/kv_groups.py), each request brings one block table per
KV cache group (`StepInput.group_tables`; blocks a sliding group freed are 0, vLLM's null block, and
never read: attention gathers only from the first block its window can see); every layer writes and
reads its KV through its group's table, layers assigned to groups as vLLM does (strided by kind).

Defaults: float32 on CPU, bfloat16 on CUDA. The CPU path makes no CUDA calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from servesim.calibration.attention import paged_attention, write_kv
from servesim.calibration.attn_metadata import AttnMetadata, make_kv_sharing_fast_prefill_metadata
from servesim.calibration.device import keep_freed_memory
from servesim.calibration.weights import apply_rope, init_weights, mlp, moe, rms_norm, rope_cos_sin
from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import fast_prefill_layers
from servesim.hardware.kv_groups import KVGroups, group_of_layers
from servesim.hardware.model import ModelSpec

#: Largest K (or V) gather of one decode chunk. CPU: small enough to stay in L2/L3 for the matmuls that
#: read it next. CUDA: bounds the per-block intermediates (about heads / block_size x the gathered K).
CPU_GATHER_BYTES = 2 << 20
CUDA_GATHER_BYTES = 512 << 20


@dataclass(frozen=True)
class StepInput:
    """One step for the executor: per request its new token ids, context length, block table, logits flag."""

    token_ids: tuple[tuple[int, ...], ...]
    num_context: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]
    needs_logits: tuple[bool, ...]
    group_tables: tuple[tuple[tuple[int, ...], ...], ...] = ()  # hybrid KV: per request, per group

    @property
    def num_new(self) -> list[int]:
        return [len(t) for t in self.token_ids]

    @classmethod
    def from_batch(
        cls,
        batch: StepBatch,
        block_tables: list[list[int]],
        vocab: int,
        rng: np.random.Generator,
        num_groups: int = 0,
    ) -> StepInput:
        """Random token ids for `batch`'s shape (timing does not depend on the ids). `num_groups` > 0: a
        hybrid-KV executor's input, each request's table given to every one of its KV cache groups."""
        ids = tuple(tuple(rng.integers(0, vocab, int(n)).tolist()) for n in batch.num_new)
        tables = tuple(tuple(t) for t in block_tables)
        context, logits = tuple(int(c) for c in batch.num_context), tuple(bool(x) for x in batch.needs_logits)
        if num_groups:
            return cls(ids, context, (), logits, tuple((t,) * num_groups for t in tables))
        return cls(ids, context, tables, logits)

    def batch(self) -> StepBatch:
        return StepBatch.of(self.num_new, list(self.num_context), list(self.needs_logits))


@dataclass
class _Prepared:
    """Device tensors of one step."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mappings: list[torch.Tensor]  # per KV cache group: [T]
    metas: list[AttnMetadata]  # per KV cache group
    logits_indices: torch.Tensor  # [R] last scheduled token of every request (host)
    sample_indices: torch.Tensor  # [num_logits] packed token index of each request needing logits (device)


class Executor:
    """Model, KV pools and the forward pass. Not thread-safe; one step at a time."""

    def __init__(
        self,
        spec: ModelSpec,
        num_blocks: int,
        block_size: int = 16,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        seed: int = 0,
        kv_sharing_fast_prefill: bool = False,
        rope_theta: float = 10000.0,
        max_gather_bytes: int | None = None,
        kv_windows: tuple[int | None, ...] | None = None,
    ):
        self.spec, self.num_blocks, self.block_size = spec, num_blocks, block_size
        self.hybrid = kv_windows is not None
        # block tables per request (0: one, not grouped)
        self.num_kv_groups = len(kv_windows) if self.hybrid else 0
        self.group_of = group_of_layers(spec, KVGroups(kv_windows or (None,), 0))
        self.device = torch.device(device)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.fast_prefill, self.rope_theta = kv_sharing_fast_prefill, rope_theta
        self.weights = init_weights(spec, self.device, self.dtype, seed)
        self.kv = {
            layer.index: torch.zeros(
                2,
                num_blocks,
                block_size,
                spec.num_kv_heads,
                spec.head_dim,
                device=self.device,
                dtype=self.dtype,
            )
            for layer in spec.layers
            if layer.owns_kv
        }
        self.num_self_layers = spec.num_layers - fast_prefill_layers(spec)
        self.scale = spec.head_dim**-0.5
        if max_gather_bytes is None:
            max_gather_bytes = CPU_GATHER_BYTES if self.device.type == "cpu" else CUDA_GATHER_BYTES
        token_bytes = spec.num_kv_heads * spec.head_dim * torch.empty((), dtype=self.dtype).element_size()
        self.max_gather_tokens = max(1, max_gather_bytes // token_bytes)

    # ---- host-side preparation -----------------------------------------------------------------
    def prepare(self, inp: StepInput) -> _Prepared:
        """Build the step's tensors: positions, slot mapping, query starts, block table, logits rows."""
        num_new = np.array(inp.num_new, np.int64)
        context = np.array(inp.num_context, np.int64)
        qsl = np.concatenate(([0], np.cumsum(num_new)))
        req_of_token = np.repeat(np.arange(len(num_new)), num_new)
        positions = np.arange(qsl[-1]) - qsl[:-1][req_of_token] + context[req_of_token]
        if self.hybrid != bool(inp.group_tables):
            raise ValueError("a hybrid-KV executor takes group_tables, any other block_tables")
        per_group = zip(*inp.group_tables) if inp.group_tables else [inp.block_tables]
        dev, metas, slot_mappings = self.device, [], []
        for tables in per_group:
            width = max(max((len(t) for t in tables), default=1), 1)
            table = np.zeros((len(num_new), width), np.int64)
            for r, blocks in enumerate(tables):
                table[r, : len(blocks)] = blocks
            slots = (
                table[req_of_token, positions // self.block_size] * self.block_size
                + positions % self.block_size
            )
            slot_mappings.append(torch.from_numpy(slots).to(dev))
            metas.append(
                AttnMetadata(
                    torch.from_numpy(qsl),
                    torch.from_numpy(context + num_new),
                    table,
                    self.block_size,
                    dev,
                    self.max_gather_tokens,
                )
            )
        sample = (qsl[1:] - 1)[np.array(inp.needs_logits, bool)]
        ids = torch.tensor([t for chunk in inp.token_ids for t in chunk], dtype=torch.int64)
        return _Prepared(
            ids.to(dev),
            torch.from_numpy(positions).to(dev),
            slot_mappings,
            metas,
            torch.from_numpy(qsl[1:] - 1),
            torch.from_numpy(sample).to(dev),
        )

    # ---- forward -------------------------------------------------------------------------------
    def _layer(
        self,
        i: int,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        metas: list[AttnMetadata],
        slot_mappings: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        spec, layer, w = self.spec, self.spec.layers[i], self.weights.layers[i]
        group = self.group_of[layer.kv_source]
        meta, slots = metas[group], slot_mappings[group] if slot_mappings else None
        q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        h = rms_norm(x, w.norm_attn)
        qkv = h @ w.qkv if w.qkv_bias is None else torch.addmm(w.qkv_bias, h, w.qkv)
        q = apply_rope(qkv[:, :q_dim].view(-1, spec.num_heads, spec.head_dim), cos, sin)
        if layer.owns_kv:
            k = apply_rope(
                qkv[:, q_dim : q_dim + kv_dim].view(-1, spec.num_kv_heads, spec.head_dim), cos, sin
            )
            write_kv(
                self.kv[i], slots, k, qkv[:, q_dim + kv_dim :].view(-1, spec.num_kv_heads, spec.head_dim)
            )
        window = layer.window if layer.attention == "sliding" else None
        attn = paged_attention(q, self.kv[layer.kv_source], meta.plan(window), self.scale)
        x = x + attn.view(-1, q_dim) @ w.o
        h = rms_norm(x, w.norm_mlp)
        if layer.is_moe:
            return x + moe(h, w, spec.moe.experts_per_token, spec.gated_mlp)
        return x + mlp(h, w.up, w.down, spec.gated_mlp)

    def forward(self, prep: _Prepared) -> torch.Tensor:
        """Logits [requests needing logits, vocab] (float32) of one step; writes the step's KV."""
        x = self.weights.embed[prep.input_ids]
        cos, sin = rope_cos_sin(prep.positions, self.spec.head_dim, self.rope_theta, self.dtype)
        prefill = prep.metas[0].max_query_len > 1
        split = self.num_self_layers if self.fast_prefill and prefill else self.spec.num_layers
        for i in range(split):
            x = self._layer(i, x, cos, sin, prep.metas, prep.slot_mappings)
        if split < self.spec.num_layers:  # YOCO: cross-decoder layers on the logits tokens only
            metas = [make_kv_sharing_fast_prefill_metadata(m, prep.logits_indices) for m in prep.metas]
            rows = prep.logits_indices.to(self.device)
            y = x[rows]
            for i in range(split, self.spec.num_layers):
                y = self._layer(i, y, cos[rows], sin[rows], metas, None)
            x = x.index_copy(0, rows, y)
        h = rms_norm(x[prep.sample_indices], self.weights.norm_final)
        return (h @ self.weights.lm_head).float()

    def execute(self, inp: StepInput) -> list[int]:
        """Run one step and return the greedy token of each request that needs logits, in batch order."""
        with torch.inference_mode():
            logits = self.forward(self.prepare(inp))
            return logits.argmax(dim=-1).tolist()  # .tolist() waits for the device
