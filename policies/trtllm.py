"""TensorRT-LLM's in-flight batching (`trtllm-serve`, PyTorch backend), its default GUARANTEED_NO_EVICT policy.

Each iteration (tensorrt_llm/_torch/pyexecutor: the capacity scheduler, then the micro-batch scheduler):
1. every request in generation keeps its place and takes a token, counted against max_num_tokens;
2. then waiting requests in arrival order, each only if the blocks its whole sequence needs (prompt + max
   new tokens) fit in the free blocks less what the running requests will still take of theirs; the first
   that does not fit, or whose prompt does not fit the token budget left, stops admission (head of line);
3. nobody is ever paused or evicted: blocks are reserved by that count, not allocated, so a decode always
   finds its block, and the pool's usage shows what is held.
Prompts run whole (chunked prefill is off by default; a prompt over max_num_tokens is refused at arrival);
the overlap scheduler (on by default) plans each step while the one before runs, as vLLM's async scheduling.
Requests reserve their output length (max_tokens equal to it, as a fixed-length benchmark sends), and the
count ignores prefix hits (enable_block_reuse on by default: hits save compute, not reservation).
"""

from __future__ import annotations

from servesim.policies.families import TRTLLM
from servesim.policies.kv_blocks import blocks_for
from servesim.policies.registry import schedulers
from servesim.policies.step import StepPlan
from servesim.policies.token_budget import TokenBudgetScheduler
from servesim.workloads.request import Request


@schedulers.register("trtllm")
class TrtllmScheduler(TokenBudgetScheduler):
    family = TRTLLM
    speculates = False
    batch_queue = False
    # blocks the running requests have still to take, counted once a plan and grown by each admission: only
    # admissions change it within a plan, and recounting per admission made a burst's plan quadratic
    _to_take: int | None = None

    def _whole_blocks(self, total_tokens: int) -> int:
        """Blocks a sequence of `total_tokens` holds at its longest, in every KV cache group."""
        return len(self.kv.windows) * blocks_for(total_tokens, self.kv.block_size)

    def _still_to_take(self) -> int:
        """Blocks the running requests have reserved but not yet taken (kvCacheManager's remaining blocks to
        completion)."""
        groups = len(self.kv.windows)
        return sum(
            max(
                self._whole_blocks(r.num_prompt_tokens + r.num_output_tokens - 1)
                - groups * self.kv.decode_table_len(r),
                0,
            )
            for r in self.running
        )

    def _plan(self) -> StepPlan:
        self._to_take = None
        return super()._plan()

    def _room_for(self, req: Request, n: int) -> list[int] | None:
        if self._to_take is None:
            self._to_take = self._still_to_take()
        need = self._whole_blocks(req.num_prompt_tokens + req.num_output_tokens - 1)
        if need + self._to_take + self.kv.evictable_hit(req) > self.kv.num_free_blocks:
            return None
        room = self.kv.allocate(req, n, admitting=True, watermark=False)
        if room is not None:  # what `_still_to_take` would now count for it
            self._to_take += need - len(self.kv.windows) * self.kv.decode_table_len(req)
        return room

    @property
    def admission_window_tokens(self) -> int | None:
        """The whole-sequence reservation stands in for vLLM's admission gate."""
        return None

    def blocks_to_run(self, total: int, windows: tuple[int | None, ...], block_size: int) -> int:
        """A request is admitted only with its whole sequence's blocks free."""
        return len(windows) * blocks_for(total, block_size)
