"""Memory planning as vLLM does it at start-up: what is left after weights and activations becomes KV blocks.

    usable      = gpu_memory_utilization * capacity                 (per GPU; capacity as the driver reports it)
    kv_cache    = usable - weights - activation peak - runtime reserve
                  (TensorRT-LLM: gpu_memory_utilization * (capacity - weights - activation peak - runtime reserve))
    num_blocks  = kv_cache // (block_size * KV bytes per token of the layers one block spans)

A block spans every KV-owning layer, or for models mixing sliding-window and full-attention layers
one KV cache group of them (hardware/kv_groups.py, vLLM's hybrid KV cache manager); the fit check
then counts each group's blocks at `max_model_len` as vLLM does (a sliding group: its window plus one
chunk).

The activation peak is estimated for a forward pass of `max_num_batched_tokens` tokens (the
MLP's gate/up outputs dominate; in a fused MoE, its per-expert buffers, whose down output is not split by TP)
plus the sampler's fp32 logits for `max_num_seqs` sequences.
The runtime reserve covers what vLLM counts besides weights and activations: non-torch allocations (cuBLAS and
NCCL workspaces; 0.07 GiB on one H100, 0.21 GiB per GPU of a TP/EP MoE, in vLLM 0.10.2's start-up logs) and
the CUDA-graph pool estimate that recent vLLM (0.19 logs it: 0.84 GiB for Llama-3.1-8B, 0.58 GiB for a small
model) deducts before sizing the KV cache: about 1 GiB. vLLM up to ~0.11 captured graphs after sizing it, out of
the 1 - gpu_memory_utilization headroom, so its KV cache was ~0.8 GiB larger; graphs of large MoE models can
take several GiB.
Planning fails fast, like vLLM refusing to start, when the weights do not fit or one
`max_model_len` request cannot fit in the KV cache.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

from servesim.hardware.cost import ACT_BYTES, LOGIT_BYTES, Parallelism
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.kv_groups import KVGroups, group_of_layers, kv_groups
from servesim.hardware.model import (
    LayerSpec,
    ModelSpec,
    check_sharding,
    kv_heads_per_rank,
    resolve_weight_dtype,
    stage_layer_specs,
    weight_bytes,
)

GIB = 1 << 30
DEFAULT_RUNTIME_RESERVE_BYTES = 1 * GIB


@dataclass(frozen=True, slots=True)
class EngineMemoryConfig:
    """The engine knobs that decide the KV budget (vLLM's names and defaults)."""

    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_batched_tokens: int = (
        8192  # for direct callers; scenarios and `servesim memory` pass vLLM's per-GPU
    )
    max_num_seqs: int = 256  # defaults (policies.config.EngineConfig.with_defaults)
    kv_dtype: str = "bf16"
    weight_dtype: str = "auto"  # the checkpoint's own (hardware.model.resolve_weight_dtype)
    runtime_reserve_bytes: float = DEFAULT_RUNTIME_RESERVE_BYTES
    allow_long_max_model_len: bool = False  # vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN
    disable_hybrid_kv_cache_manager: bool = False  # vLLM's flag: one group, sliding layers kept whole
    # SGLang: gpu_memory_utilization is mem_fraction_static, weights + KV only; activations live in the rest
    activations_outside: bool = False
    # TensorRT-LLM: gpu_memory_utilization is free_gpu_memory_fraction, the KV pool's share of what weights,
    # activations and the reserve leave free
    share_of_free: bool = False
    # a max_model_len longer than the pool holds: None, refused (vLLM); else the engine starts with the longest the
    # pool holds less this many tokens (EngineFamily.max_len_short_of_pool)
    max_len_short_of_pool: int | None = None
    # steps in flight, each up to max_num_batched_tokens, whose tokens a sliding window keeps (EngineConfig.in_flight_batches)
    in_flight_batches: int = 1
    # SGLang's hybrid SWA memory (its swa_full_tokens_ratio): a model mixing sliding and full layers gets two pools,
    # the sliding layers' holding this share of the full layers' tokens; None: vLLM's one pool of KV cache groups
    swa_full_tokens_ratio: float | None = None
    chunked_prefill: bool = True  # off, a prompt is prefilled whole (SGLang's chunked_prefill_size -1)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-GPU memory budget of one replica and the KV capacity it leaves. Bytes unless named otherwise."""

    model: str
    gpu: str
    tp: int
    pp: int
    capacity_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    reserve_bytes: float
    kv_cache_bytes: float
    kv_bytes_per_token: float  # per GPU, all KV-owning layers of its stage
    block_size: int
    num_blocks: int
    kv_cache_tokens: int  # tokens of full-length requests the pool holds (blocks per group x block_size)
    max_model_len: int
    request_bytes_at_max_len: float  # one max_model_len request on one GPU, sliding groups capped
    max_concurrency: float  # max_model_len requests that fit at once
    block_bytes: float = 0.0  # one block on one GPU: block_size tokens of the layers it spans
    kv_windows: tuple[int | None, ...] = (None,)  # per KV cache group: its sliding window, None = full
    weight_dtype: str = "bf16"  # the weights as served (`auto` resolved to the checkpoint's dtype)
    # SGLang's hybrid SWA memory: the blocks above are the full-attention layers' pool (`kv_windows` one full group);
    # the sliding layers' pool holds `swa_tokens` tokens of `swa_token_bytes` each (per GPU), `swa_ratio` of the
    # full pool's; a None window: no such pool
    swa_window: int | None = None
    swa_tokens: int = 0
    swa_token_bytes: float = 0.0
    swa_ratio: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def swa_pool(
        self, page_size: int, ranks: int = 1, num_blocks: int | None = None
    ) -> tuple[int, int] | None:
        """(window, pages of `page_size` tokens on each of `ranks` DP-attention ranks) of SGLang's sliding-window
        pool, or None without one; for a full pool of `num_blocks` (an override), `swa_ratio` of its tokens."""
        if self.swa_window is None:
            return None
        tokens = (
            self.swa_tokens
            if num_blocks in (None, self.num_blocks)
            else int(num_blocks * self.block_size * self.swa_ratio) // self.block_size * self.block_size
        )
        return self.swa_window, tokens // page_size // ranks


def _stored_weight_bytes(model: ModelSpec, weight_dtype: str) -> tuple[float, float]:
    """(bytes per dense weight, bytes of memory per routed-expert weight, padding included) as served."""
    return weight_bytes(model, resolve_weight_dtype(model, weight_dtype))


def layer_weight_bytes(model: ModelSpec, layer: LayerSpec, weight_dtype: str) -> float:
    """One whole layer's weights; under an expert-only dtype (mxfp4) only its experts are quantized (and padded)."""
    return _layer_bytes(model, layer, *_stored_weight_bytes(model, weight_dtype))


def _layer_bytes(model: ModelSpec, layer: LayerSpec, wbytes: float, expert_wbytes: float) -> float:
    experts = model.layer_expert_params(layer)
    return (
        (model.layer_params(layer) - experts) * wbytes
        + experts * expert_wbytes
        + absorbed_copy_bytes(model, wbytes)
    )


def absorbed_copy_bytes(model: ModelSpec, wbytes: float) -> float:
    """One MLA layer's decode up-projections (vLLM's W_UK_T and W_UV, SGLang's w_kc and w_vc): views of kv_b_proj
    in a bf16 checkpoint, but dequantized bf16 copies beside it in a quantized one, which prefill keeps using."""
    if model.mla is None or wbytes == ACT_BYTES:
        return 0.0
    return model.mla_up_params() * ACT_BYTES


def weight_bytes_per_gpu(model: ModelSpec, par: Parallelism, weight_dtype: str) -> float:
    """Weights on the fullest GPU: each stage's layers split over its TP ranks but for what every rank keeps
    whole (`_replicated_bytes`); embeddings, LM head and a vision tower stay bf16 (the embedding and the tower on
    the first stage, the LM head on the last), sliced too but on vLLM's DP ranks (`Parallelism.dense_ranks`).
    Stages differ where layers do (DeepSeek's first dense layers) and where they do not split evenly
    (`pipeline_stages`).
    `auto`: the checkpoint's dtype."""
    wbytes, expert_wbytes = _stored_weight_bytes(model, weight_dtype)
    stages = [
        sum(_layer_bytes_per_gpu(model, layer, par, wbytes, expert_wbytes) for layer in stage)
        for stage in stage_layer_specs(model, par.pp)
    ]
    stages[0] += (
        (model.embedding_params + model.lookup_params + model.vision_params) * ACT_BYTES
        + model.extra_linear_params * wbytes
    ) / par.dense_ranks
    if not model.tie_embeddings:
        stages[-1] += model.lm_head_params * ACT_BYTES / par.dense_ranks
    return max(stages)


def layer_bytes_per_gpu(model: ModelSpec, layer: LayerSpec, par: Parallelism, weight_dtype: str) -> float:
    """One layer's weights on each GPU of its stage (an MTP / EAGLE head is sized as one)."""
    return _layer_bytes_per_gpu(model, layer, par, *_stored_weight_bytes(model, weight_dtype))


def _layer_bytes_per_gpu(
    model: ModelSpec, layer: LayerSpec, par: Parallelism, wbytes: float, expert_wbytes: float
) -> float:
    whole = _layer_bytes(model, layer, wbytes, expert_wbytes)
    kept = _replicated_bytes(model, layer, par, wbytes, expert_wbytes)
    return (whole - kept) / par.tp + kept + _duplicated_kv_bytes(model, par, wbytes)


def _replicated_bytes(
    model: ModelSpec, layer: LayerSpec, par: Parallelism, wbytes: float, expert_wbytes: float
) -> float:
    """Bytes of `layer` every TP rank holds whole: on vLLM's DP ranks all but its routed experts; under DP
    attention all its attention, and under DeepEP (expert parallel over DP attention) its shared experts (SGLang
    builds them at tp_size 1 there); else MLA's down-projections to the latents (vLLM's ReplicatedLinear q_a_proj
    / kv_a_proj_with_mqa, as the cost model reads them). The MoE router is replicated too, but small and stored at
    the layer's dtype here."""
    h = model.hidden_size
    if par.dense_replicated:
        whole = _layer_bytes(model, layer, wbytes, expert_wbytes)
        if not layer.is_moe:
            return whole
        matrices = model.dense_mlp_params(model.moe.expert_intermediate)  # at the experts' dtype, biases not
        routed = matrices * expert_wbytes + (model.expert_params() - matrices) * wbytes
        return whole - model.moe.num_experts * routed
    if par.dp_attention:
        shared = model.moe.num_shared_experts * model.expert_params() if layer.is_moe and par.ep else 0
        return model.attention_params() * wbytes + absorbed_copy_bytes(model, wbytes) + shared * expert_wbytes
    if model.mla is None:
        return 0.0
    q_a = h * model.mla.q_lora_rank if model.mla.q_lora_rank is not None else 0
    return (q_a + h * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim)) * wbytes


def _duplicated_kv_bytes(model: ModelSpec, par: Parallelism, wbytes: float) -> float:
    """Per layer, the K/V projection bytes a TP rank holds beyond its 1/tp share when TP exceeds the KV heads: each
    rank keeps whole the head it attends with (vLLM's QKVParallelLinear replicates KV heads), as the cost model
    streams them."""
    if par.dp_attention or model.mla is not None:
        return 0.0
    heads = model.num_kv_heads
    return (
        2 * model.hidden_size * model.head_dim * (kv_heads_per_rank(heads, par.tp) - heads / par.tp) * wbytes
    )


def kv_bytes_per_replica_token(model: ModelSpec, kv_dtype: str, par: Parallelism) -> float:
    """KV bytes one token of the replica costs one GPU: the KV-owning layers of the stage with the most of them
    (KV-sharing layers store none), its share of the heads (or, under DP attention, the whole KV of 1/tp of the
    tokens, so no head or latent is stored twice)."""
    owning = max(sum(layer.owns_kv for layer in stage) for stage in stage_layer_specs(model, par.pp))
    return kv_bytes_per_gpu_token(model, kv_dtype, par) * owning / model.num_kv_layers


def stage_group_layers(model: ModelSpec, groups: KVGroups, pp: int) -> int:
    """The most KV-owning layers one KV cache group has on one pipeline stage: vLLM forms the groups over the whole
    model and sizes each stage's block by its largest group there (all stages then take the fewest blocks)."""
    group_of = group_of_layers(model, groups)
    return max(
        max(Counter(group_of[layer.index] for layer in stage if layer.owns_kv).values(), default=0)
        for stage in stage_layer_specs(model, pp)
    )


def kv_bytes_per_gpu_token(model: ModelSpec, kv_dtype: str, par: Parallelism) -> float:
    """KV bytes of one token over all of the model's KV-owning layers on one GPU, as the memory plan averages it:
    the rank's share of the heads (or latent) under TP; under DP attention a token's whole KV sits on one rank,
    1/tp of it per GPU on average."""
    if par.dp_attention:
        return model.kv_bytes_per_token(kv_dtype, 1) / par.tp
    return model.kv_bytes_per_token(kv_dtype, par.tp)


def activation_bytes(model: ModelSpec, par: Parallelism, cfg: EngineMemoryConfig) -> float:
    """Peak activations of a `max_num_batched_tokens` forward pass plus the sampler's logits, per GPU; under DP
    attention each rank profiles its share of the group's limits."""
    h, tp = model.hidden_size, par.tp
    ranks = par.attention_ranks
    widest = max(layer.mlp_intermediate for layer in model.layers)
    mlp = 3 * widest / par.dense_ranks  # gate/up output + activation output
    # fused MoE, per token and expert: gate/up output then (same buffer) down output, and activation
    if model.moe:
        inner = model.moe.expert_intermediate / tp
        mlp = max(mlp, model.moe.experts_per_token * (max(2 * inner, h) + inner))
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    # residual + normed input, the widest intermediate
    per_token = (2 * h + max(qkv * ranks / tp, mlp)) * ACT_BYTES
    # logits and probabilities in fp32
    sampler = 2 * cfg.max_num_seqs / ranks * model.vocab_size * LOGIT_BYTES
    return cfg.max_num_batched_tokens / ranks * per_token + sampler


def request_kv_bytes(model: ModelSpec, num_tokens: int, kv_dtype: str, tp: int, block_size: int) -> float:
    """KV bytes of one request of `num_tokens` on one GPU: full layers keep all tokens, sliding ones their window."""
    per_layer = model.kv_bytes_per_token(kv_dtype, tp) / model.num_kv_layers
    blocks = 0
    for layer in model.layers:
        if layer.owns_kv:
            kept = num_tokens if layer.window is None else min(num_tokens, layer.window + block_size)
            blocks += math.ceil(kept / block_size)
    return blocks * block_size * per_layer


def swa_pools(
    kv_cache: float,
    full_token_bytes: float,
    swa_token_bytes: float,
    window: int,
    par: Parallelism,
    cfg: EngineMemoryConfig,
    max_len: int,
) -> tuple[int, int]:
    """SGLang's split of the KV memory between its full-attention and sliding-window pools (its hybrid SWA
    memory): every token takes a slot in both, and the sliding pool holds swa_full_tokens_ratio of the full pool's
    tokens, so full = memory / (full bytes + ratio x sliding bytes) per token, both whole blocks. Returns (full
    pool blocks, sliding pool tokens), refusing a sliding pool in which a lone request could stall
    (`_check_swa_pool`)."""
    ratio, block = cfg.swa_full_tokens_ratio, cfg.block_size
    full = int(kv_cache // (full_token_bytes + ratio * swa_token_bytes)) // block * block
    swa = int(full * ratio) // block * block
    _check_swa_pool(swa, full, window, par, cfg, max_len)
    return full // block, swa


def _swa_layers(model: ModelSpec, par: Parallelism, cfg: EngineMemoryConfig) -> tuple[int, int, int] | None:
    """(full-attention layers, sliding layers, window) of the KV-owning layers on the fullest stage when SGLang
    keeps them in two pools (hybrid SWA memory on, both kinds present), else None."""
    if cfg.swa_full_tokens_ratio is None or cfg.disable_hybrid_kv_cache_manager:
        return None
    stages = [[layer for layer in stage if layer.owns_kv] for stage in stage_layer_specs(model, par.pp)]
    windows = {layer.window for stage in stages for layer in stage if layer.attention == "sliding"}
    if not windows or all(layer.attention == "sliding" for stage in stages for layer in stage):
        return None
    ratio = cfg.swa_full_tokens_ratio
    kinds = [
        (
            sum(layer.attention != "sliding" for layer in stage),
            sum(layer.attention == "sliding" for layer in stage),
        )
        for stage in stages
    ]
    n_full, n_swa = max(kinds, key=lambda k: k[0] + ratio * k[1])  # the stage whose token costs the most
    return n_full, n_swa, max(windows)


def _check_swa_pool(
    swa_tokens: int, full_tokens: int, window: int, par: Parallelism, cfg: EngineMemoryConfig, max_len: int
) -> None:
    """Refuse a sliding-window pool in which a lone request could stall: a request holds the sliding slots of the
    tree nodes its window reaches (a hit's or its own last chunk, or whole unchunked prompt, and a window above a
    shorter one), of the chunk it adds, and of its own decode tokens (up to two windows)."""
    chunk = -(-cfg.max_num_batched_tokens // par.attention_ranks) if cfg.chunked_prefill else max_len
    per_rank = swa_tokens // par.attention_ranks
    # SGLang's longest request: the pool less one
    newest = min(chunk, max_len, full_tokens // par.attention_ranks - 1)
    if per_rank < 2 * newest + 3 * window + 2 * cfg.block_size:
        raise SpecError(
            f"SGLang's sliding-window pool ({per_rank} tokens a rank) is under 2 chunks of {newest} + 3 windows of "
            f"{window} + 2 pages, so it can stall: lower max_num_batched_tokens or raise swa_full_tokens_ratio"
        )


def plan_memory(
    model: ModelSpec,
    gpu: GpuSpec,
    par: Parallelism = Parallelism(),
    cfg: EngineMemoryConfig = EngineMemoryConfig(),
) -> MemoryPlan:
    """The KV budget of one replica, or a SpecError saying why the model cannot be served."""
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise SpecError(f"gpu_memory_utilization must be in (0, 1], got {cfg.gpu_memory_utilization}")
    check_sharding(model, par.tp, par.pp, par.dp_attention, par.ep)
    max_len = cfg.max_model_len or model.max_position_embeddings
    if max_len > model.max_position_embeddings and not cfg.allow_long_max_model_len:
        raise SpecError(
            f"max_model_len={max_len} exceeds {model.name}'s {model.max_position_embeddings} positions: lower it or "
            "set engine.allow_long_max_model_len (vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    share = cfg.gpu_memory_utilization
    usable = (1.0 if cfg.share_of_free else share) * gpu.reported_memory_bytes
    weight_dtype = resolve_weight_dtype(model, cfg.weight_dtype)
    weights = weight_bytes_per_gpu(model, par, weight_dtype)
    act = 0.0 if cfg.activations_outside else activation_bytes(model, par, cfg)
    kv_cache = usable - weights - act - cfg.runtime_reserve_bytes
    if cfg.share_of_free:
        kv_cache *= share
    if kv_cache <= 0:
        raise SpecError(
            f"{model.name} does not fit on {gpu.name} at tp={par.tp}{f' pp={par.pp}' if par.pp > 1 else ''}: weights "
            f"{weights / 1e9:.1f} + activations {act / 1e9:.1f} + reserve {cfg.runtime_reserve_bytes / 1e9:.1f} > "
            f"{usable / 1e9:.1f} GB usable; "
            + (
                "data-parallel ranks each hold the dense weights: drop dp_attention"
                if par.dense_replicated
                else "raise tp/pp, quantize or take a larger GPU"
            )
        )
    per_token = kv_bytes_per_replica_token(model, cfg.kv_dtype, par)
    swa, swa_fields = _swa_layers(model, par, cfg), {}
    if swa is None:
        groups = kv_groups(model, cfg.disable_hybrid_kv_cache_manager)
        block_bytes = cfg.block_size * per_token
        if groups.layers_per_group != model.num_kv_layers and par.pp > 1:
            # each stage's block spans the most layers one group has there (vLLM)
            layer_bytes = kv_bytes_per_gpu_token(model, cfg.kv_dtype, par) / model.num_kv_layers
            block_bytes = cfg.block_size * layer_bytes * stage_group_layers(model, groups, par.pp)
        elif groups.layers_per_group != model.num_kv_layers:
            block_bytes *= groups.layers_per_group / model.num_kv_layers
        num_blocks = int(kv_cache // block_bytes)
    else:  # SGLang's two pools: the blocks are the full layers' pool, one group of all of them
        n_full, n_swa, window = swa
        layer_bytes = kv_bytes_per_gpu_token(model, cfg.kv_dtype, par) / model.num_kv_layers
        groups, block_bytes = KVGroups((None,), n_full), cfg.block_size * n_full * layer_bytes
        num_blocks, swa_tokens = swa_pools(
            kv_cache, n_full * layer_bytes, n_swa * layer_bytes, window, par, cfg, max_len
        )
        swa_fields = {
            "swa_window": window,
            "swa_tokens": swa_tokens,
            "swa_token_bytes": n_swa * layer_bytes,
            "swa_ratio": cfg.swa_full_tokens_ratio,
        }
    ranks = par.attention_ranks
    in_flight = -(-cfg.max_num_batched_tokens // ranks) * cfg.in_flight_batches  # a rank's chunks

    def request_bytes(length: int) -> float:
        return groups.peak_blocks(length, cfg.block_size, in_flight) * block_bytes * ranks

    per_request = request_bytes(max_len)
    short = cfg.max_len_short_of_pool
    if (
        per_request > num_blocks * block_bytes
        and short is not None
        and request_bytes(short + 1) <= num_blocks * block_bytes
    ):
        # SGLang and TensorRT-LLM start anyway, their longest request what the pool holds (less one: SGLang)
        fits, over = 1, max_len
        while over - fits > 1:
            mid = (fits + over) // 2
            fits, over = (mid, over) if request_bytes(mid) <= num_blocks * block_bytes else (fits, mid)
        max_len = fits - short
        per_request = request_bytes(max_len)
    if per_request > num_blocks * block_bytes:
        raise SpecError(
            f"a request of max_model_len={max_len} needs {per_request / GIB:.2f} GiB of KV cache per GPU, more than "
            f"{gpu.name}'s {kv_cache / GIB:.2f} GiB; raise gpu_memory_utilization or tp, or lower max_model_len "
            f"(to ~{int(num_blocks * block_bytes / per_request * max_len)} at most)"
        )
    return MemoryPlan(
        model=model.name,
        gpu=gpu.name,
        tp=par.tp,
        pp=par.pp,
        capacity_bytes=gpu.reported_memory_bytes,
        usable_bytes=usable,
        weight_bytes=weights,
        activation_bytes=act,
        reserve_bytes=cfg.runtime_reserve_bytes,
        kv_cache_bytes=kv_cache,
        kv_bytes_per_token=per_token,
        block_size=cfg.block_size,
        num_blocks=num_blocks,
        kv_cache_tokens=num_blocks // len(groups.windows) * cfg.block_size,
        max_model_len=max_len,
        request_bytes_at_max_len=per_request,
        max_concurrency=num_blocks * block_bytes / per_request * ranks,
        block_bytes=block_bytes,
        kv_windows=groups.windows,
        weight_dtype=weight_dtype,
        **swa_fields,
    )
