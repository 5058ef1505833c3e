"""Engine knobs the schedulers read, with vLLM's names, meanings and defaults."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from hardware.errors import SpecError
from hardware.gpu import GpuSpec
from hardware.spec_model import SpecModel
from policies.spec_decode import EAGLE_METHODS, SpeculativeConfig


def vllm_batch_defaults(gpu: GpuSpec, offline: bool = False) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM picks (EngineArgs.get_batch_defaults): larger on devices
    reporting >= 70 GiB, except A100s, where a larger budget measured slower; the offline `LLM` class (bench
    latency, bench throughput) takes 16384/8192 tokens where `vllm serve` takes 8192/2048."""
    large = gpu.reported_memory_bytes >= 70 * (1 << 30) and "a100" not in gpu.name.lower()
    if offline:
        return (16384, 1024) if large else (8192, 256)
    return (8192, 1024) if large else (2048, 256)


# SGLang turns its hybrid SWA memory off for these (server_args: "Disable hybrid SWA memory for ... as it is not
# yet supported"): every layer keeps every token, as vLLM's --disable-hybrid-kv-cache-manager does
SGLANG_FULL_KV_ARCHITECTURES = frozenset(
    {
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForCausalLM",
        "Gemma3nForConditionalGeneration",
    }
)
SGLANG_DP_ATTENTION_CONSERVATIVENESS = (
    0.3  # SGLang scales --schedule-conservativeness by it under DP attention
)
SGLANG_MAX_RUNNING = 4096  # the cap of SGLang's request-slot pool (model_runner: max_num_reqs)
VLLM_GPU_MEMORY_UTILIZATION = 0.9
MAX_SEQS = 2**20  # batch slots: far past any engine's (SGLang caps its pool at 4096)
MAX_BUDGET = 2**40  # tokens a step: any context, and within int64 however it is summed
# KV blocks a run keeps a record of, all replicas together: ~130 bytes each (free list and reference count)
MAX_KV_BLOCKS = 2**25
FLASHMLA_MIN_CAPABILITY, FLASHMLA_BLOCK_SIZE = 9.0, 64  # vLLM's MLA models on Hopper and newer


# SGLang's server_args._handle_gpu_memory_settings (0.5.x), by device memory: (below GiB, chunked_prefill_size,
# cuda_graph_max_bs at tp < 4, at tp >= 4)
_SGLANG_GPU_TIERS = (
    (20, 2048, 8, 8),
    (35, 2048, 24, 80),
    (60, 4096, 32, 160),
    (160, 8192, 256, 512),
    (math.inf, 16384, 512, 512),
)


def _sglang_tier(gpu: GpuSpec) -> tuple[float, int, int, int]:
    """(device memory in MiB, chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4)."""
    mib = gpu.reported_memory_bytes / (1 << 20)
    return mib, *next(tier[1:] for tier in _SGLANG_GPU_TIERS if mib < tier[0] * 1024)


def sglang_mem_fraction_static(
    gpu: GpuSpec, prefill_tokens: int, tp: int = 1, pp: int = 1, dp_attention: bool = False
) -> float:
    """SGLang's default mem_fraction_static (server_args._handle_gpu_memory_settings, 0.5.x): the share of the
    device for weights and the KV pool, the rest (MiB) reserved for activations of a `prefill_tokens` batch
    (chunked_prefill_size, or max_prefill_tokens unchunked), CUDA graphs up to its cuda_graph_max_bs and large
    parallel sizes: 512 + 1.5 x max(prefill_tokens, 2048) + 2 x max_bs + tp x pp / 8 x 1024 (+ DP attention's
    padding), at least 10 GiB above 60 GiB."""
    mib, _, small, large = _sglang_tier(gpu)
    max_bs = small if tp < 4 else large
    reserved = 512 + 1.5 * max(prefill_tokens, 2048) + 2 * max_bs + tp * pp / 8 * 1024
    if dp_attention:
        reserved += max_bs * tp * 3 + (max_bs * tp * 1.5 if max_bs > 300 else 0)
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def sglang_batch_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """(chunked_prefill_size, max_running_requests cap) SGLang picks (server_args, 0.5.x): the chunk by the
    device's memory (< 35 GiB 2048, < 60 GiB 4096, < 160 GiB 8192, else 16384); running requests are further
    capped by the KV pool when the scheduler starts (policies/prefill_first.py)."""
    return _sglang_tier(gpu)[1], SGLANG_MAX_RUNNING


class EngineConfig(SpecModel):
    """One engine (replica): batching limits, KV paging and preemption. Units in the names."""

    scheduler: str = Field(
        "vllm", description=("Scheduler policy name: vllm, sglang, sarathi, orca, static (or pkg.mod:attr)")
    )
    queue_order: str = Field("fcfs", description="Waiting-queue order: fcfs, priority, sjf (or pkg.mod:attr)")
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=MAX_SEQS,
        description=(
            "Max requests running at once (batch slots); default: vLLM's for the GPU (1024 on GPUs of >= 70 GiB "
            "other than A100, else 256); sglang: its max_running_requests (default 4096, capped by the KV pool)"
        ),
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_BUDGET,
        description=(
            "Token budget of one step; default: vLLM's for the GPU (8192 on GPUs of >= 70 GiB other than A100, "
            "else 2048; with chunked prefill off, at least max_model_len); sglang: its chunked_prefill_size "
            "(default by GPU memory: 2048 below 35 GiB, 4096 below 60, 8192 below 160, else 16384)"
        ),
    )
    enable_chunked_prefill: bool = Field(
        True, description="Split long prompts across steps within the budget"
    )
    chunk_size: int = Field(512, ge=1, description="sarathi only: the fixed token budget of each step")
    long_prefill_token_threshold: int = Field(
        0,
        ge=0,
        description=(
            "vllm and sarathi, chunked prefill: a prefill takes at most this many tokens a step (vLLM's "
            "--long-prefill-token-threshold; 0: no cap)"
        ),
    )
    block_size: int = Field(16, ge=1, description="Tokens per KV block")
    prefix_caching: Literal["none", "vllm", "radix"] = Field(
        "vllm", description="none; vllm (hash-chained full blocks, on by default in vLLM v1); radix (SGLang)"
    )
    radix_page_size: int = Field(1, ge=1, description="radix only: tokens per KV page (SGLang's page_size)")
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "Fraction of GPU memory the engine may use; default: vLLM's 0.9. sglang: SGLang's mem_fraction_static, the "
            "share for weights and KV only (activations and CUDA graphs live in the rest); default: SGLang's formula"
        ),
    )
    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt+output; default: the model's limit"
    )
    allow_long_max_model_len: bool = Field(
        False,
        description=(
            "Allow max_model_len beyond the model's max_position_embeddings (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN)"
        ),
    )
    num_gpu_blocks_override: int | None = Field(
        None,
        ge=1,
        le=MAX_KV_BLOCKS,
        description=(
            "Force the KV pool size (as vLLM's flag); under DP attention the group's, split evenly over its ranks. "
            "It may exceed the GPU's memory (an unbounded cache), up to the blocks the simulator can keep a record of"
        ),
    )
    disable_hybrid_kv_cache_manager: bool = Field(
        False,
        description=(
            "vLLM's flag: keep sliding-window layers' whole KV in one group instead of freeing out-of-window blocks; "
            "unset under sglang: on for Gemma 2/3/3n, which SGLang runs so"
        ),
    )
    watermark: float = Field(0.0, ge=0, lt=1, description="Fraction of blocks kept free when admitting")
    scheduler_reserve_full_isl: bool = Field(
        True,
        description=(
            "Admit a waiting request only if the free pool holds its whole prompt (and outputs so far, less prefix "
            "hits; a sliding window's share capped at window + the tokens of the steps in flight), not just its first "
            "chunk: vLLM's "
            "default since 0.19 (off before); vllm and sarathi schedulers (chunked prefill)"
        ),
    )
    async_scheduling: bool | None = Field(
        None,
        description=(
            "Plan each step while the one before runs, as vLLM does by default since 0.14 (--async-scheduling) and "
            "SGLang since 0.4 (its overlap scheduler): an arrival joins the step after next, and a finished request's "
            "slot and blocks free a step later (under sglang, after one more, wasted, decode); None: on for a "
            "colocated vllm or sglang replica without pipeline parallelism or draft-model/n-gram speculation, off "
            "otherwise"
        ),
    )
    api_server: bool = Field(
        True,
        description=(
            "Requests come through the engine's API server (vllm serve, SGLang's tokenizer manager), which the "
            "profile's api_request_s / api_token_s price; false: the offline LLM class, given token ids"
        ),
    )
    preemption_mode: Literal["recompute", "swap"] = Field(
        "recompute",
        description=(
            "What happens to a preempted request: recompute (vLLM v1's only mode) or swap (vLLM v0's, a what-if today)"
        ),
    )
    swap_space_gib: float = Field(4.0, ge=0, description="Host memory per GPU for swapped-out KV blocks, GiB")
    kv_dtype: Literal["bf16", "fp16", "fp8"] = Field("bf16", description="KV cache dtype")
    weight_dtype: Literal[
        "auto", "bf16", "fp16", "fp8", "int8", "w8a16", "int4", "mxfp4", "nvfp4", "mxfp8"
    ] = Field(
        "auto",
        description=(
            "Weight dtype; auto: the checkpoint's (its quantization_config: DeepSeek-V3 fp8, gpt-oss mxfp4, ModelOpt "
            "fp8/nvfp4, AWQ/GPTQ w8a16 or int4, else bf16); int8 is W8A8, w8a16 and int4 are weight-only; mxfp4 "
            "quantizes MoE experts only; nvfp4 and mxfp8 run on FP4/FP8 tensor cores where the GPU has them"
        ),
    )
    max_prefill_tokens: int = Field(
        16384,
        ge=1,
        description=(
            "sglang only: prompt tokens one prefill batch takes (SGLang's --max-prefill-tokens; its first request is "
            "exempt)"
        ),
    )
    schedule_conservativeness: float = Field(
        1.0,
        gt=0,
        description=(
            "sglang only: scales the share of running requests' remaining output tokens held back when admitting "
            "(the value SGLang runs: its --schedule-conservativeness, times 0.3 under DP attention, where unset is 0.3)"
        ),
    )
    enable_mixed_chunk: bool = Field(
        False,
        description=(
            "sglang only: running requests decode in prefill steps (SGLang's --enable-mixed-chunk); off, a prefill "
            "step stalls every decode"
        ),
    )
    swa_full_tokens_ratio: float = Field(
        0.8,
        gt=0,
        le=1,
        description=(
            "sglang only: a model mixing sliding-window and full-attention layers (gpt-oss) keeps them in two pools, "
            "the sliding one holding this share of the full one's tokens (SGLang's --swa-full-tokens-ratio; off with "
            "disable_hybrid_kv_cache_manager, SGLang's --disable-hybrid-swa-memory)"
        ),
    )
    kv_sharing_fast_prefill: bool = Field(
        False, description="YOCO: KV-sharing layers run on logits tokens only"
    )
    speculative: SpeculativeConfig | None = Field(None, description="Speculative decoding (None: off)")

    def with_vllm_defaults(
        self,
        gpu: GpuSpec,
        max_model_len: int,
        tp: int = 1,
        pp: int = 1,
        dp_attention: bool = False,
        mla: bool = False,
        architecture: str = "",
    ) -> EngineConfig:
        """This config with unset batch limits and memory share filled as `vllm serve` fills them
        (EngineArgs.get_batch_defaults); unset slots are capped at the step's token budget. The sglang scheduler
        takes SGLang's defaults instead: max_num_batched_tokens is its chunked_prefill_size, max_num_seqs its
        max_running_requests, gpu_memory_utilization its mem_fraction_static (for the replica's tp, pp). Under DP
        attention vLLM's are per data-parallel rank, so the group's are tp times them.
        Unset async_scheduling is the engine's default for the replica: on for the vllm and sglang schedulers
        without pipeline parallelism (its steps in flight are committed one by one) and without draft-model or
        n-gram speculation, which vLLM runs synchronously (VllmConfig: "Async scheduling not supported with ...").
        An unset block_size is 16, or 64 for an `mla` model under vLLM on a GPU FlashMLA runs on (compute capability 9.0 or newer), which vLLM
        forces ("Forcing kv cache block size to 64 for FlashMLA backend", vLLM 0.8 on; 0.10-0.11 on Blackwell
        picked CUTLASS MLA and 128); a set size that is not a multiple of 64 is an error there, since vLLM would
        not run it. Under sglang, a model of SGLANG_FULL_KV_ARCHITECTURES keeps every token in every layer, as SGLang
        runs it, unless disable_hybrid_kv_cache_manager is set (false: a what-if of SGLang sliding its windows); under DP
        attention an unset schedule_conservativeness is SGLang's 0.3 (its default 1.0 scaled by 0.3)."""
        sglang = self.scheduler == "sglang"
        tokens, seqs = sglang_batch_defaults(gpu) if sglang else vllm_batch_defaults(gpu)
        if not self.enable_chunked_prefill:
            tokens = max(tokens, max_model_len)
        # vLLM runs DP attention as tp engines, each with its defaults;
        if dp_attention and tp > 1 and not sglang:
            tokens, seqs = tokens * tp, seqs * tp  # SGLang divides its own among its ranks
        update = {
            k: v
            for k, v in (("max_num_batched_tokens", tokens), ("max_num_seqs", seqs))
            if getattr(self, k) is None
        }
        # never more slots than tokens in a step (vLLM caps it so)
        if "max_num_seqs" in update and not sglang:
            update["max_num_seqs"] = min(
                seqs, update.get("max_num_batched_tokens", self.max_num_batched_tokens)
            )
        if sglang and dp_attention and tp > 1 and "schedule_conservativeness" not in self.model_fields_set:
            update["schedule_conservativeness"] = (
                SGLANG_DP_ATTENTION_CONSERVATIVENESS  # what SGLang runs by default
            )
        if (
            sglang
            and architecture in SGLANG_FULL_KV_ARCHITECTURES
            and "disable_hybrid_kv_cache_manager" not in self.model_fields_set
        ):
            update["disable_hybrid_kv_cache_manager"] = True
        if mla and not sglang and (gpu.compute_capability or 0) >= FLASHMLA_MIN_CAPABILITY:
            if "block_size" not in self.model_fields_set:
                update["block_size"] = FLASHMLA_BLOCK_SIZE
            elif self.block_size % FLASHMLA_BLOCK_SIZE and self.scheduler.startswith("vllm"):
                raise SpecError(
                    f"engine.block_size {self.block_size}: vLLM runs MLA models on {gpu.name} with FlashMLA, "
                    f"which needs a multiple of {FLASHMLA_BLOCK_SIZE} (it would run "
                    f"{FLASHMLA_BLOCK_SIZE}); set one or leave it unset"
                )
        # vLLM schedules ahead with EAGLE/MTP drafts only: a draft model's or n-gram's proposals need the step's output
        plain_drafts = self.speculative is not None and self.speculative.method not in EAGLE_METHODS
        if self.async_scheduling is None:
            update["async_scheduling"] = self.scheduler in ("vllm", "sglang") and pp == 1 and not plain_drafts
        elif self.async_scheduling and pp > 1:
            raise SpecError(
                "engine.async_scheduling with pipeline parallelism (pp > 1) is not modelled: the "
                "pipelined steps are committed one by one; set it false or leave it unset"
            )
        elif self.async_scheduling and plain_drafts:
            raise SpecError(
                f"engine.async_scheduling with speculative method {self.speculative.method!r}: vLLM "
                f"schedules ahead only with {' or '.join(EAGLE_METHODS)} drafts; set it false "
                "or leave it unset"
            )
        if self.gpu_memory_utilization is None:
            chunk = update.get("max_num_batched_tokens", self.max_num_batched_tokens)
            prefill = chunk if self.enable_chunked_prefill else self.max_prefill_tokens
            update["gpu_memory_utilization"] = (
                sglang_mem_fraction_static(gpu, prefill, tp, pp, dp_attention)
                if sglang
                else VLLM_GPU_MEMORY_UTILIZATION
            )
        if not update:
            return self
        try:
            return EngineConfig.model_validate({**self.model_dump(), **update})
        except ValidationError as err:
            filled = ", ".join(
                f"{k}={v}"
                for k, v in update.items()
                if k not in ("gpu_memory_utilization", "async_scheduling")
            )
            raise SpecError(
                f"engine: with vLLM's default {filled} for this GPU: "
                + err.errors()[0]["msg"].removeprefix("Value error, ")
            ) from None

    def in_flight_batches(self, pp: int = 1) -> int:
        """vLLM's max_concurrent_batches: steps scheduled whose tokens are not yet processed, 2 under async
        scheduling, pp with a pipeline's batch queue. A sliding window keeps its blocks for all of their tokens
        (VllmConfig.max_in_flight_tokens = this x max_num_batched_tokens), so vLLM sizes and admits by it. SGLang
        sizes its pools otherwise: 1."""
        if self.scheduler == "sglang":
            return 1
        return 2 if self.async_scheduling else pp

    def batch_limits(self) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) for a scheduler; an error while vLLM's defaults are unset."""
        if self.max_num_batched_tokens is None or self.max_num_seqs is None:
            raise ValueError(
                "engine batch limits unset: fill in vLLM's defaults for the GPU first "
                "(EngineConfig.with_vllm_defaults, Scenario.with_engine_defaults)"
            )
        return self.max_num_batched_tokens, self.max_num_seqs

    @model_validator(mode="after")
    def _budget_covers_batch(self) -> EngineConfig:
        # else checked once filled
        limits = self.max_num_batched_tokens is not None and self.max_num_seqs is not None
        if (
            limits
            and self.scheduler == "vllm"
            and self.enable_chunked_prefill
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) < max_num_seqs ({self.max_num_seqs}): "
                "each running request takes a token a step"
            )
        if self.speculative is not None and self.scheduler in ("static", "seed_toy", "sglang"):
            raise ValueError(
                f"speculative decoding needs a token-budget scheduler (vllm, sarathi, orca), "
                f"not {self.scheduler!r}"
            )
        if self.async_scheduling and self.scheduler not in ("vllm", "sglang"):
            raise ValueError(
                f"async_scheduling is modelled for the vllm and sglang schedulers of a colocated "
                f"replica; {self.scheduler!r} runs synchronously (prefill and decode pools too): set it "
                "false or leave it unset"
            )
        if self.scheduler == "sglang" and self.preemption_mode == "swap":
            raise ValueError(
                "preemption_mode 'swap': SGLang retracts requests and recomputes them; the sglang "
                "scheduler takes preemption_mode 'recompute'"
            )
        return self
