"""TensorRT-LLM's in-flight batching (`trtllm-serve`, PyTorch backend), its default GUARANTEED_NO_EVICT policy.

Each iteration (tensorrt_llm/_torch/pyexecutor: the capacity scheduler, then the micro-batch scheduler):
1. every request in generation keeps its place and takes a token, counted against max_num_tokens;
2. then waiting requests in arrival order, each only if the blocks its whole sequence needs (prompt + max
   new tokens) fit in the free blocks less what the running requests will still take of theirs; the first
   that does not fit, or whose prompt does not fit the token budget left, stops admission (head of line);
3. nobody is ever paused or evicted: blocks are reserved by that count, not allocated, so a decode always
   finds its block, and the pool's usage shows what is held.
Prompts run whole (chunked prefill is off by default; a prompt over max_num_tokens is refused at arrival; with it
on, a chunk the budget cuts is rounded down to a block's tokens); a prompt counts against the budget whole, its
prefix hit too (1.0-1.2 find hits once its KV is allocated, after the budget is spent); the overlap scheduler (on
by default) plans each step while the one before runs, as vLLM's async scheduling.
Requests reserve their prompt plus output length (max_tokens equal to it, as a fixed-length benchmark sends; one
token more than the KV they write: getRemainingBlocksToCompletion), and the count ignores prefix hits
(enable_block_reuse on by default: hits save compute, not reservation; cached blocks sitting free count as free).
A prompt's blocks become reusable only after the step that computes them (KVCacheManager.store_context_blocks), and a
new prompt that would reuse blocks a prompt admitted in the same step is computing sits the step out, letting later
ones in (GUARANTEED_NO_EVICT's beneficialToSkip): it hits them in the next.
With batch waiting (`batch_wait_timeout_iters`, `batch_wait_max_tokens_ratio`), while requests decode the prompts the
step would take are held back until its tokens (those prompts' and one per decode) reach the ratio of max_num_tokens
or the iterations held reach the timeout (PyExecutor._waiting_requests).
"""

from __future__ import annotations

from servesim.policies.families import TRTLLM
from servesim.policies.kv_blocks import blocks_for
from servesim.policies.registry import schedulers
from servesim.policies.step import ChunkStretch, PlanBuilder, StepPlan
from servesim.policies.token_ids import block_hashes
from servesim.policies.token_budget import TokenBudgetScheduler
from servesim.workloads.request import Request


@schedulers.register("trtllm")
class TrtllmScheduler(TokenBudgetScheduler):
    family = TRTLLM
    speculates = False
    batch_queue = False
    waits_to_batch = True
    _held_iters = 0  # iterations that held prompts back for a fuller batch (batch_wait_iters_count)
    # blocks the running requests have still to take, counted once a plan and grown by each admission: only
    # admissions change it within a plan, and recounting per admission made a burst's plan quadratic
    _to_take: int | None = None
    # hashes of the blocks the prompts admitted this plan compute: not reusable before the step ends
    _contributed: set[int] | frozenset[int] = frozenset()

    # MicroBatchScheduler finds prefix hits only when the KV is allocated, after it has counted the prompt whole
    # (TensorRT-LLM 1.0-1.2; 1.3 credits reusable tokens)
    budget_counts_hits = True
    # setCtxRequestsChunkSize (first come first served) rounds a cut chunk down to the chunk unit, tokens_per_block
    rounds_chunks_to_blocks = True

    def _whole_blocks(self, total_tokens: int) -> int:
        """Blocks a sequence of `total_tokens` holds at its longest, in every KV cache group."""
        return len(self.kv.windows) * blocks_for(total_tokens, self.kv.block_size)

    def _reserved(self, req: Request) -> int:
        """The blocks `req` reserves: its prompt and every new token it may make, in every KV cache group."""
        return self._whole_blocks(req.num_prompt_tokens + req.num_output_tokens)

    def _still_to_take(self) -> int:
        """Blocks the running requests have reserved but not yet taken (kvCacheManager's remaining blocks to
        completion)."""
        groups = len(self.kv.windows)
        return sum(max(self._reserved(r) - groups * self.kv.decode_table_len(r), 0) for r in self.running)

    def _plan(self) -> StepPlan:
        self._to_take, self._contributed = None, set()
        return super()._plan()

    def _defers(self, req: Request, hit: int) -> bool:
        """`req`'s prefix hit reaches a block a prompt admitted this step computes: the first block it would
        compute is being computed, so it waits a step to reuse it (full blocks; the hit ends before any that is
        not cached)."""
        if not self._contributed or not hit:
            return False
        hashes = block_hashes(req, hit, self.kv.block_size)
        return any(h in self._contributed for h in hashes[: hit // self.kv.block_size])

    def _room_for(self, req: Request, n: int) -> list[int] | None:
        if self._to_take is None:
            self._to_take = self._still_to_take()
        need = self._reserved(req)
        if need + self._to_take > self.kv.num_free_blocks:
            return None
        room = self.kv.allocate(req, n, admitting=True, watermark=False)
        if room is not None:  # what `_still_to_take` would now count for it
            self._to_take += need - len(self.kv.windows) * self.kv.decode_table_len(req)
            if self.cfg.prefix_caching != "none":
                size, done = self.kv.block_size, req.num_computed_tokens
                self._contributed.update(block_hashes(req, done + n, size)[done // size : (done + n) // size])
        return room

    def _admit_waiting(self, step: PlanBuilder) -> None:
        """Admit as TensorRT-LLM does, unless batch waiting holds this step's prompts back (only while requests
        decode in it)."""
        if not self.cfg.batch_waiting or not step.tokens:
            super()._admit_waiting(step)
            return
        prompts = self._prompt_tokens_admissible(step)
        if not prompts:
            return
        if (
            self._held_iters >= self.cfg.batch_wait_timeout_iters
            or prompts + len(step.tokens) >= self.cfg.batch_wait_max_tokens_ratio * self.budget
        ):
            self._held_iters = 0
            super()._admit_waiting(step)
        else:
            self._held_iters += 1

    def _prompt_tokens_admissible(self, step: PlanBuilder) -> int:
        """The prompt tokens `_admit_waiting` would schedule now, found without admitting anyone (no prefix hits:
        batch waiting is refused with prefix caching). Each admission takes its blocks from the free ones and adds
        its reservation less them to what the running take, so the test reduces to the whole sequences' blocks."""
        budget, seats, tokens = step.budget, self._seats_taken, 0
        room = self.kv.num_free_blocks - self._still_to_take()
        for req in self._waiting.in_order():
            if budget <= 0 or seats >= self.max_num_seqs:
                break
            n = self._capped(req.num_tokens)
            if n > budget and not self.chunked:
                break
            n = self._within(n, budget)
            if not n:
                break
            room -= self._reserved(req)
            if room < 0:
                break
            budget, seats, tokens = budget - n, seats + 1, tokens + n
        return tokens

    @property
    def _may_hold_prompts(self) -> bool:
        """Batch waiting may hold prompts back in the coming steps, each of which counts toward its timeout: no
        stretch of them is fused."""
        return self.cfg.batch_waiting and self.num_waiting > 0

    def decode_stretch(self, plan: StepPlan) -> list[Request] | None:
        return None if self._may_hold_prompts else super().decode_stretch(plan)

    def chunk_stretch(self, plan: StepPlan) -> ChunkStretch | None:
        return None if self._may_hold_prompts else super().chunk_stretch(plan)

    @property
    def admission_window_tokens(self) -> int | None:
        """The whole-sequence reservation stands in for vLLM's admission gate."""
        return None

    def blocks_to_run(self, total: int, windows: tuple[int | None, ...], block_size: int) -> int:
        """A request is admitted only with its whole reservation free: `total` KV tokens and the last token's."""
        return len(windows) * blocks_for(total + 1, block_size)
