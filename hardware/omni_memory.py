"""Host memory of vLLM-Omni's stage-output prefix cache, and the memory report of a multi-stage pipeline.

vLLM-Omni caches the tensors a stage hands to the next one (hidden states, codec codes, other
multimodal outputs whose first dimension is the token count) in pinned CPU memory laid out like the
stage's KV cache, so the KV block table indexes them too: one buffer of
`num_blocks x block_size x D` elements per cached tensor, allocated on the first request that saves
it. Its size is therefore `num_blocks x block_size x D x dtype_bytes` per tensor. The seed's Qwen3-Omni
numbers: thinker hidden states [15092, 16, 2048] bf16 = 0.92 GiB; talker codes [16180, 16, 16] int64 =
33.1 MB (the seed writes "33 MiB"; it is 31.6 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.hardware.memory import MemoryPlan

TENSOR_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "int64": 8}


def tensor_dtype_bytes(dtype: str) -> int:
    try:
        return TENSOR_DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(
            f"unknown tensor dtype {dtype!r}; choose from {', '.join(TENSOR_DTYPE_BYTES)}"
        ) from None


def stage_output_cache_bytes(num_blocks: int, block_size: int, dims: int, dtype: str) -> int:
    """Pinned host bytes of one cached stage-output tensor: num_blocks x block_size x dims x dtype bytes."""
    return num_blocks * block_size * dims * tensor_dtype_bytes(dtype)


@dataclass(frozen=True, slots=True)
class StageTensor:
    """A per-token tensor a stage hands to the next: `dims` values of `dtype` for each token."""

    name: str
    dims: int
    dtype: str

    def bytes_for(self, num_tokens: int) -> int:
        return num_tokens * self.dims * tensor_dtype_bytes(self.dtype)


@dataclass(frozen=True, slots=True)
class StageMemory:
    """One stage's GPU memory plan, plus the pinned host memory of its stage-output cache (when enabled)."""

    stage: str
    plan: MemoryPlan
    num_blocks: int  # the KV blocks the engine runs with (the plan's, or the override)
    cached: tuple[StageTensor, ...]
    replicas: int = 1  # each engine of the stage pins its own buffers

    @property
    def host_cache_bytes(self) -> int:
        """Pinned host bytes of the stage's output caches, over all its replicas."""
        return self.replicas * sum(
            stage_output_cache_bytes(self.num_blocks, self.plan.block_size, t.dims, t.dtype)
            for t in self.cached
        )

    def as_dict(self) -> dict:
        cache = [
            {
                "name": t.name,
                "shape": [self.num_blocks, self.plan.block_size, t.dims],
                "dtype": t.dtype,
                "bytes": stage_output_cache_bytes(self.num_blocks, self.plan.block_size, t.dims, t.dtype),
            }
            for t in self.cached
        ]
        return {
            "stage": self.stage,
            **self.plan.as_dict(),
            "stage_output_cache": cache,
            "stage_output_cache_host_bytes": self.host_cache_bytes,
        }


@dataclass(frozen=True, slots=True)
class PipelineMemory:
    """The memory report of a multi-stage run: one entry per stage, in pipeline order."""

    stages: tuple[StageMemory, ...]

    @property
    def host_cache_bytes(self) -> int:
        return sum(s.host_cache_bytes for s in self.stages)

    def as_dict(self) -> dict:
        return {
            "stages": [s.as_dict() for s in self.stages],
            "stage_output_cache_host_bytes": self.host_cache_bytes,
        }
