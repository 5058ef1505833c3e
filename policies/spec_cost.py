"""What speculative decoding adds to a step's time and to an engine's memory plan.

Step time: the target's verify pass is the step's own batch (a decoding request's 1 + k tokens are
priced as a small prefill over its context, reading the weights once). On top, in a step that
drafts, the draft runs `max(k)` forward passes (`draft_batches`):
- pass 0 brings the draft model's KV cache level with the target (the last sampled token; the whole
  chunk for a request in prefill) and proposes guess 1; a request that ran in a step without drafting
  speculates no more (`Speculator.stop`), so nothing is caught up wholesale;
- pass j (1 <= j < k) feeds guess j of every request guessing more than j, proposing guess j + 1.
A `draft` model's passes are priced by the cost model for that model (same GPU, parallelism, profile
and dtypes); an `eagle` / `mtp` head's pass costs `head_cost_fraction` of the target's over the same
tokens; `ngram` costs `ngram_lookup_s` of CPU time in a step that drafts.

Memory (`with_draft_memory`): the draft's weights are added to the weights (a head's as one target
layer), and its KV bytes per token to the target's, so one block holds both models' KV for its
tokens; that is a simplification (vLLM pages the draft's layers in the same pool, so it is exact
when both use the same block size). The draft's activations reuse the target's buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import Parallelism
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.memory import (
    EngineMemoryConfig,
    MemoryPlan,
    kv_bytes_per_gpu_token,
    layer_bytes_per_gpu,
    request_kv_bytes,
    swa_pools,
    weight_bytes_per_gpu,
)
from servesim.hardware.model import EXPERT_ONLY_DTYPES, ModelSpec, get_model
from servesim.hardware.step_timer import StepTimer
from servesim.policies.spec_decode import SpeculativeConfig
from servesim.policies.step import StepPlan


def draft_batches(plan: StepPlan) -> list[StepBatch]:
    """The draft model's forward passes in `plan` (none when no draft model runs in it), each request on its DP
    rank."""
    if not plan.draft_context:
        return []
    n = len(plan.requests)
    drafts = np.fromiter(plan.num_draft, np.int64, n)
    context = np.fromiter(plan.num_context, np.int64, n)
    target_new = np.fromiter(plan.num_new, np.int64, n) - drafts  # 1 for a guessing request
    draft_context = np.fromiter(plan.draft_context, np.int64, n)
    seen = draft_context >= 0  # requests that stopped speculating (-1) are not fed to the draft model
    if not seen.any():
        return []
    rank = np.fromiter(plan.rank, np.int64, n) if plan.rank else None  # DP attention: each request's rank
    batches = [
        StepBatch(
            (context + target_new - draft_context)[seen],
            draft_context[seen],
            (drafts > 0)[seen],
            None if rank is None else rank[seen],
        )
    ]
    for j in range(1, int(drafts.max(initial=0))):
        more = drafts > j
        batches.append(
            StepBatch(
                np.ones(int(more.sum()), np.int64),
                context[more] + j,
                np.ones(int(more.sum()), bool),
                None if rank is None else rank[more],
            )
        )
    return batches


def draft_time(spec: SpeculativeConfig | None, target: StepTimer) -> Callable[[StepPlan], float] | None:
    """Seconds a step spends drafting, beyond the target's verify pass; None when speculation is off."""
    if spec is None:
        return None
    if spec.method == "ngram":
        return lambda plan: spec.ngram_lookup_s if any(plan.num_draft) else 0.0
    if spec.method == "draft":
        gpu, par, profile, options = target.gpu, target.parallelism, target.profile, target.options
        draft = get_model(spec.draft_model)
        options = replace(options, weight_dtype=draft_weight_dtype(draft, options.weight_dtype))
        timer = StepTimer(draft, gpu, par, profile, options)
        return lambda plan: sum(timer(batch) for batch in draft_batches(plan))
    fraction = spec.head_cost_fraction
    return lambda plan: fraction * sum(target(batch) for batch in draft_batches(plan))


def draft_weight_dtype(draft: ModelSpec, target_dtype: str) -> str:
    """The draft model's weights: the target's dtype, except an expert-only one (mxfp4) on a dense draft, which
    keeps its own checkpoint's (vLLM quantizes a draft by its own config)."""
    return "auto" if target_dtype in EXPERT_ONLY_DTYPES and draft.moe is None else target_dtype


def _head_weight_bytes(model: ModelSpec, par: Parallelism, weight_dtype: str) -> float:
    """An EAGLE / MTP head: about one decoder layer of the target (it shares the embedding and LM head), laid out
    over the GPUs as the target's layers are."""
    return layer_bytes_per_gpu(model, model.layers[-1], par, weight_dtype)


def with_draft_memory(
    plan: MemoryPlan,
    spec: SpeculativeConfig | None,
    model: ModelSpec,
    gpu: GpuSpec,
    par: Parallelism,
    cfg: EngineMemoryConfig,
) -> MemoryPlan:
    """`plan` with the draft's weights and KV bytes per token added (unchanged without a draft or a head)."""
    if spec is not None and par.pp > 1:
        raise SpecError(
            "speculative decoding with pipeline parallelism is not modelled; set parallelism.pp: 1"
        )
    if spec is None or spec.method == "ngram":
        return plan
    ranks = par.attention_ranks
    if spec.method == "draft":
        draft = get_model(spec.draft_model)
        extra_weights = weight_bytes_per_gpu(draft, par, draft_weight_dtype(draft, cfg.weight_dtype))
        extra_kv = kv_bytes_per_gpu_token(draft, cfg.kv_dtype, par)
        extra_request = request_kv_bytes(
            draft, plan.max_model_len, cfg.kv_dtype, par.tp // ranks, plan.block_size
        )
        name = draft.name
    else:
        extra_weights = _head_weight_bytes(model, par, cfg.weight_dtype)
        extra_kv = kv_bytes_per_gpu_token(model, cfg.kv_dtype, par) / model.num_kv_layers  # one layer's KV
        extra_request = -(-plan.max_model_len // plan.block_size) * plan.block_size * extra_kv * ranks
        name = f"{spec.method} head"
    kv_cache = plan.kv_cache_bytes - extra_weights
    per_token = plan.kv_bytes_per_token + extra_kv
    groups = len(plan.kv_windows)  # the draft's KV of a block's tokens, spread over the target's groups
    block_bytes = plan.block_bytes + plan.block_size * extra_kv / groups
    num_blocks = int(kv_cache // block_bytes) if kv_cache > 0 else 0
    swa = {}
    # SGLang's two pools: the draft's KV sits with the full layers'
    if plan.swa_window is not None and kv_cache > 0:
        num_blocks, swa_tokens = swa_pools(
            kv_cache,
            block_bytes / plan.block_size,
            plan.swa_token_bytes,
            plan.swa_window,
            par,
            cfg,
            plan.max_model_len,
        )
        swa = {"swa_tokens": swa_tokens}
    per_request = plan.request_bytes_at_max_len + extra_request
    if per_request > num_blocks * block_bytes:
        raise SpecError(
            f"with the {name} ({extra_weights / 1e9:.2f} GB, {extra_kv:.0f} KV B/token/GPU) a request of "
            f"max_model_len={plan.max_model_len} no longer fits {gpu.name}'s KV cache; raise gpu_memory_utilization "
            "or tp, or lower max_model_len"
        )
    return replace(
        plan,
        weight_bytes=plan.weight_bytes + extra_weights,
        kv_cache_bytes=kv_cache,
        kv_bytes_per_token=per_token,
        num_blocks=num_blocks,
        kv_cache_tokens=num_blocks // groups * plan.block_size,
        request_bytes_at_max_len=per_request,
        max_concurrency=num_blocks * block_bytes / per_request * ranks,
        block_bytes=block_bytes,
        **swa,
    )
