"""Tiny scaled models of four catalog layer patterns, and helpers to drive the executor step by step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from servesim.calibration.executor import Executor, StepInput
from servesim.calibration.scaled import scale_model
from servesim.hardware.model import get_model

TINY = dict(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
#: name -> (preset, scale): full attention, alternating sliding window, YOCO KV sharing, MoE
MODELS = {
    "llama": ("llama-3.1-8b", dict(layers=4, **TINY)),
    "gemma2": ("gemma-2-9b", dict(layers=4, window=8, **TINY)),
    "gemma3n": ("gemma-3n-e2b", dict(layers=6, kv_shared=2, window=8, **TINY)),
    "mixtral": ("mixtral-8x7b", dict(layers=4, experts=4, **TINY)),
}
BLOCK_SIZE = 4
NUM_BLOCKS = 96


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Timings and results do not depend on how busy the other core is."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_spec(name: str):
    preset, scale = MODELS[name]
    return scale_model(get_model(preset), **scale)


def tiny_executor(name: str, fast_prefill: bool = False, num_blocks: int = NUM_BLOCKS) -> Executor:
    return Executor(
        tiny_spec(name), num_blocks, BLOCK_SIZE, "cpu", seed=1, kv_sharing_fast_prefill=fast_prefill
    )


class Blocks:
    """Hands out block ids in a shuffled order, so a request's blocks are never contiguous."""

    def __init__(self, num_blocks: int = NUM_BLOCKS, seed: int = 0):
        self._free = list(np.random.default_rng(seed).permutation(num_blocks))

    def take(self, n: int) -> list[int]:
        taken, self._free = self._free[:n], self._free[n:]
        return [int(b) for b in taken]


class Seq:
    """One request's tokens and block table; `chunk(n)` / `decode(token)` describe its next step."""

    def __init__(self, tokens: list[int], blocks: Blocks, table: list[int] | None = None, computed: int = 0):
        self.tokens, self.blocks, self.table, self.computed = (
            list(tokens),
            blocks,
            list(table or []),
            computed,
        )

    def _grow(self, upto: int) -> None:
        need = -(-upto // BLOCK_SIZE) - len(self.table)
        self.table += self.blocks.take(max(need, 0))

    def part(self, n: int, logits: bool) -> tuple[tuple[int, ...], int, tuple[int, ...], bool]:
        """The next `n` tokens as one request of a step (advances `computed`)."""
        self._grow(self.computed + n)
        part = (
            tuple(self.tokens[self.computed : self.computed + n]),
            self.computed,
            tuple(self.table),
            logits,
        )
        self.computed += n
        return part


def step(ex: Executor, *parts) -> torch.Tensor:
    """One forward of the given request parts; returns logits of the parts that asked for them."""
    inp = StepInput(*(tuple(column) for column in zip(*parts)))
    with torch.inference_mode():
        return ex.forward(ex.prepare(inp))
