"""KV cache groups as vLLM v1's hybrid KV cache manager forms them, and the blocks a request holds in them.

A model whose KV-owning layers mix full attention and sliding windows (Gemma 2/3, gpt-oss) gets one
group per `layers_per_group` layers of one kind: layers are bucketed by window; the group size is the
smallest bucket, or the largest when that is under 1.5x the smallest (fewer padded groups); a bucket
of n layers makes cdiv(n, size) groups. A block holds `block_size` tokens of every layer of one group
(`layers_per_group` KV tensors, shared by the groups), so one block's bytes are
`block_size x layers_per_group x` one layer's KV per token. All groups draw blocks from one pool.

A full-attention group holds cdiv(tokens, block_size) blocks. A sliding group frees, before each
allocation, the blocks wholly before `computed - window + 1` (the first token the next chunk's
queries can see). With `disable_hybrid_kv_cache_manager` (vLLM's flag) every layer is treated as
full attention in one group: nothing is freed early.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from servesim.hardware.model import LayerSpec, ModelSpec


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class KVGroups:
    """`windows`: one entry per group, None for full attention (full groups first). `layers_per_group`:
    the KV-owning layers one block spans (the number of KV tensors)."""

    windows: tuple[int | None, ...]
    layers_per_group: int

    @property
    def sliding(self) -> bool:
        """Whether any group frees out-of-window blocks (a pool the simple block formulas do not describe)."""
        return any(w is not None for w in self.windows)

    def blocks_held(self, computed: int, total: int, block_size: int) -> int:
        """Blocks a request holds across all groups once it has KV for `total` tokens, after the blocks
        before `computed - window + 1` were freed (computed = tokens done before the step)."""
        full = cdiv(total, block_size)
        return sum(
            full if w is None else full - skipped_blocks(computed, w, block_size) for w in self.windows
        )

    def peak_blocks(self, total: int, block_size: int, max_chunk: int) -> int:
        """The most blocks a request of `total` tokens can hold at once when steps add at most `max_chunk`
        tokens (vLLM's max_memory_usage_bytes per group: a sliding one holds its window plus a chunk, +1)."""
        return sum(admission_blocks(w, total, block_size, max_chunk) for w in self.windows)

    def most_blocks(self, total: int, block_size: int, max_chunk: int, in_flight: int = 0) -> int:
        """The most blocks a request of `total` tokens can need at once, whatever its chunks (each at most
        `max_chunk` tokens, with up to `in_flight` tokens of earlier steps in flight when one is planned): a
        sliding group at a step from c tokens holds cdiv(min(c + chunk, total)) - skipped(c - in flight) blocks,
        maximised over every c. Tighter than `peak_blocks` (vLLM's start-up bound); a request needing more than
        the pool could stall, so engines reject it."""
        full = cdiv(total, block_size)
        if all(w is None for w in self.windows):  # full attention holds every block at the end
            return full * len(self.windows)
        c = np.arange(max(total, 1))
        reach = -(-np.minimum(c + max_chunk, total) // block_size)
        return sum(
            full if w is None else int((reach - np.maximum(0, c - in_flight - w + 1) // block_size).max())
            for w in self.windows
        )


def admission_blocks(window: int | None, num_tokens: int, block_size: int, in_flight_tokens: int) -> int:
    """Blocks vLLM's admission gate (`scheduler_reserve_full_isl`) wants free in one group for a request of
    `num_tokens` tokens: all of them for full attention; a sliding window's and the steps in flight's, +1, at
    most (get_num_blocks_to_allocate with apply_admission_cap)."""
    blocks = cdiv(num_tokens, block_size)
    return blocks if window is None else min(blocks, cdiv(window - 1 + in_flight_tokens, block_size) + 1)


def skipped_blocks(computed: int, window: int, block_size: int) -> int:
    """Leading blocks of a sliding group no query of the next step can see (vLLM's get_num_skipped_tokens)."""
    return max(0, computed - window + 1) // block_size


def _kind(layer: LayerSpec) -> int | None:
    """The bucket a KV-owning layer goes in: its sliding window, None for full attention."""
    return layer.window if layer.attention == "sliding" else None


def kv_groups(model: ModelSpec, disable_hybrid: bool = False) -> KVGroups:
    """The model's KV cache groups (see the module docstring)."""
    owning = [layer for layer in model.layers if layer.owns_kv]
    kinds = Counter(_kind(layer) for layer in owning)
    # one kind of layer: vLLM's flag has nothing to unify (every layer may slide its window)
    if len(kinds) == 1:
        return KVGroups(tuple(kinds), len(owning))
    if disable_hybrid:
        return KVGroups((None,), len(owning))
    smallest, largest = min(kinds.values()), max(kinds.values())
    size = largest if largest < 1.5 * smallest else smallest
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))  # full attention first, then by window
    return KVGroups(tuple(w for w in order for _ in range(cdiv(kinds[w], size))), size)


def group_of_layers(model: ModelSpec, groups: KVGroups) -> dict[int, int]:
    """KV-owning layer index -> its group in `groups`: the layers of one kind go round-robin over that
    kind's groups (vLLM's strided assignment, group i = layers[i::count])."""
    owning = [layer for layer in model.layers if layer.owns_kv]
    if len(groups.windows) == 1:
        return {layer.index: 0 for layer in owning}
    out = {}
    for window in dict.fromkeys(groups.windows):
        first, count = groups.windows.index(window), groups.windows.count(window)
        for k, layer in enumerate(layer for layer in owning if _kind(layer) == window):
            out[layer.index] = first + k % count
    return out


def live_kv_bytes(
    model: ModelSpec, groups: KVGroups, computed: int, block_size: int, kv_dtype: str, held: int = 0
) -> float:
    """KV bytes (all TP shards) a request holds once `computed` tokens are done, past the first `held` (a
    receiver's own prefix hit): every token in full-attention groups, in a sliding group the tokens from its
    first block still in the window. What a P/D transfer moves: vLLM's NixlConnector with the hybrid manager
    sends only the blocks each group holds and the receiver has not cached."""
    per_layer = model.kv_bytes_per_token(kv_dtype) / model.num_kv_layers
    layers = Counter(groups.windows[g] for g in group_of_layers(model, groups).values())
    kept = {
        w: computed - max(held, 0 if w is None else skipped_blocks(computed, w, block_size) * block_size)
        for w in layers
    }
    return per_layer * sum(count * kept[w] for w, count in layers.items())
