"""What speculative decoding adds to a step's time and to an engine's memory plan.

Step time: the target's verify pass is the step's own batch (a decoding request's 1 + k tokens are
priced as a small prefill over its context, reading the weights once). On top, in a step that
drafts, the drafter runs k forward passes (`draft_batches`), as vLLM's proposer does
(v1/spec_decode/eagle.py `propose`, which its draft-model proposer shares):
- pass 0 over every token the target computed this step for the requests that speculate (a verifying
  decode's 1 + k, a prompt's chunk), so the drafter's KV always keeps level with the target's;
- passes 1 .. k - 1 over one token per such request, proposing guesses 2 .. k (a request mid-prefill is
  fed too; its guesses are dropped). A request that ran in a step without drafting speculates no more
  (`Speculator.stop`).
A `draft` model's passes are priced by the cost model for that model (same GPU, parallelism, profile
and dtypes); an `eagle` / `mtp` head's as one decoder layer of the target (the last one's kind) with
its input projection (EAGLE's fc, MTP's eh_proj: 2h x h) and the target's embedding and LM head, or at
`head_cost_fraction` of the target's pass where the scenario sets it; `ngram` costs `ngram_lookup_s` of
CPU time in a step that drafts. The host's per-step and per-request time (scheduling, sampling) counts
once, in the target's step, not per draft pass.

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
from servesim.hardware.model import EXPERT_ONLY_DTYPES, WEIGHT_DTYPE_BYTES, ModelSpec, get_model
from servesim.hardware.step_timer import StepTimer
from servesim.policies.spec_decode import SpeculativeConfig
from servesim.policies.step import StepPlan


def draft_batches(plan: StepPlan, k: int) -> list[StepBatch]:
    """The drafter's `k` forward passes in `plan` (none when no drafter runs in it), each request on its DP rank."""
    if not plan.fed_to_draft:
        return []
    n = len(plan.requests)
    fed = np.fromiter(plan.fed_to_draft, bool, n)  # requests that stopped speculating are not fed
    if not fed.any():
        return []
    new = np.fromiter(plan.num_new, np.int64, n)[fed]
    context = np.fromiter(plan.num_context, np.int64, n)[fed]
    rank = np.fromiter(plan.rank, np.int64, n)[fed] if plan.rank else None  # DP attention: each one's rank
    logits = np.ones(len(new), bool)  # one proposal per request a pass
    batches = [StepBatch(new, context, logits, rank)]
    ones = np.ones(len(new), np.int64)
    batches += [StepBatch(ones, context + new + j - 1, logits, rank) for j in range(1, k)]
    return batches


def draft_time(spec: SpeculativeConfig | None, target: StepTimer) -> Callable[[StepPlan], float] | None:
    """Seconds a step spends drafting, beyond the target's verify pass; None when speculation is off."""
    if spec is None:
        return None
    if spec.method == "ngram":  # the lookup runs in every step that drafts, found a match or not
        return lambda plan: spec.ngram_lookup_s if plan.num_draft else 0.0
    gpu, par, options, k = target.gpu, target.parallelism, target.options, spec.k
    profile = target.profile.model_copy(update={"host_step_s": 0.0, "host_request_s": 0.0})
    if spec.method == "draft":
        draft = get_model(spec.draft_model)
        options = replace(options, weight_dtype=draft_weight_dtype(draft, options.weight_dtype))
    elif spec.head_cost_fraction is not None:
        fraction, whole = spec.head_cost_fraction, StepTimer(target.model, gpu, par, profile, options)
        return lambda plan: fraction * sum(whole(batch) for batch in draft_batches(plan, k))
    else:
        draft = head_model(target.model)
    timer = StepTimer(draft, gpu, par, profile, options)
    return lambda plan: sum(timer(batch) for batch in draft_batches(plan, k))


def head_model(model: ModelSpec) -> ModelSpec:
    """An EAGLE / MTP head as the cost model prices it: one decoder layer of the target (its last one's kind: an MoE
    layer for an MoE target, as DeepSeek's MTP module is; EAGLE-3 heads of MoE models are dense, so this prices them
    high) and an input projection of [embedding; hidden state] (2h x h), sharing the target's embedding and LM
    head."""
    layer = replace(model.layers[-1], index=0, kv_source=0)
    return replace(
        model, name=f"{model.name} head", layers=(layer,), extra_linear_params=_head_projection(model)
    )


def _head_projection(model: ModelSpec) -> int:
    """Parameters of a head's input projection, [embedding; hidden state] -> hidden (EAGLE's fc, MTP's eh_proj)."""
    return 2 * model.hidden_size * model.hidden_size


def draft_weight_dtype(draft: ModelSpec, target_dtype: str) -> str:
    """The draft model's weights: the target's dtype, except an expert-only one (mxfp4) on a dense draft, which
    keeps its own checkpoint's (vLLM quantizes a draft by its own config)."""
    return "auto" if target_dtype in EXPERT_ONLY_DTYPES and draft.moe is None else target_dtype


def _head_weight_bytes(model: ModelSpec, par: Parallelism, weight_dtype: str) -> float:
    """An EAGLE / MTP head: one decoder layer of the target, laid out over the GPUs as the target's layers are, and
    its input projection, a plain bf16 linear on every GPU (vLLM's EAGLE fc, DeepSeek MTP's eh_proj); it shares the
    embedding and LM head."""
    projection = _head_projection(model) * WEIGHT_DTYPE_BYTES["bf16"]
    return layer_bytes_per_gpu(model, model.layers[-1], par, weight_dtype) + projection


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
