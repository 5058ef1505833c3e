"""Engine knobs the schedulers read, with vLLM's names, meanings and defaults."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.memory import EngineMemoryConfig
from servesim.hardware.spec_model import MAX_TOKENS, SpecModel
from servesim.policies.families import FLASHMLA_BLOCK_SIZE, family_of, known_family
from servesim.policies.spec_decode import EAGLE_METHODS, SpeculativeConfig


MAX_SEQS = 2**20  # batch slots: far past any engine's (SGLang caps its pool at 4096)
MAX_BUDGET = MAX_TOKENS  # tokens a step
# KV blocks a run keeps a record of, all replicas together: ~180 bytes each with a prefix cache (free queue, reference
# count, hash), so the most a run may hold (~3 GB) fits in 6 GiB beside the rest
MAX_KV_BLOCKS = 2**24


class EngineConfig(SpecModel):
    """One engine (replica): batching limits, KV paging and preemption. Units in the names."""

    scheduler: str = Field(
        "vllm",
        description=("Scheduler policy name: vllm, sglang, trtllm, sarathi, orca, static (or pkg.mod:attr)"),
    )
    queue_order: str = Field("fcfs", description="Waiting-queue order: fcfs, priority, sjf (or pkg.mod:attr)")
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=MAX_SEQS,
        description=(
            "Max requests running at once (batch slots); default: vLLM's for the GPU (1024 on GPUs of >= 70 GiB "
            "other than A100, else 256); sglang: its max_running_requests (default 4096, capped by the KV pool); "
            "trtllm: its max_batch_size (2048)"
        ),
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        le=MAX_BUDGET,
        description=(
            "Token budget of one step; default: vLLM's for the GPU (8192 on GPUs of >= 70 GiB other than A100, "
            "else 2048; with chunked prefill off, at least max_model_len); sglang: its chunked_prefill_size "
            "(default by GPU memory: 2048 below 35 GiB, 4096 below 60, 8192 below 160, else 16384); trtllm: its "
            "max_num_tokens (8192, not raised with chunked prefill off: a longer prompt is refused)"
        ),
    )
    enable_chunked_prefill: bool = Field(
        True,
        description="Split long prompts across steps within the budget; unset under trtllm: off, as TensorRT-LLM runs",
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
    block_size: int = Field(
        16, ge=1, description="Tokens per KV block; unset under trtllm: its tokens_per_block, 32"
    )
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
            "share for weights and KV only (activations and CUDA graphs live in the rest); default: SGLang's formula. "
            "trtllm: kv_cache_free_gpu_memory_fraction, the KV cache's share of the memory weights, activations and "
            "the runtime leave (default 0.9)"
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
            "unset under sglang: on for Gemma 2/3/3n, which SGLang runs so; under trtllm: on (one attention window "
            "for every layer, as trtllm-serve runs without kv_cache_config.max_attention_window)"
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
    cuda_graph_max_size: int | None = Field(
        None,
        ge=0,
        le=MAX_BUDGET,
        description=(
            "The largest step the engine replays as a CUDA graph, padded to the next captured size: tokens under "
            "vllm (max_cudagraph_capture_size; every step, decode or not), decode requests under sglang "
            "(cuda_graph_max_bs) and trtllm (cuda_graph_config.max_batch_size with enable_padding: true); None: the "
            "engine's default (trtllm pads nothing by default); 0: no graphs (--enforce-eager, --disable-cuda-graph)"
        ),
    )
    cuda_graph_sizes: list[Annotated[int, Field(ge=1, le=MAX_BUDGET)]] | None = Field(
        None,
        min_length=1,
        description=(
            "The sizes the engine captures CUDA graphs at, a step up to the largest padded to the next: vllm's "
            "cudagraph_capture_sizes (tokens), sglang's cuda_graph_bs and trtllm's cuda_graph_config.batch_sizes "
            "with enable_padding: true (decode requests), each trimmed to the batch limits as the engine trims "
            "them; None: the engine's default list; not with cuda_graph_max_size"
        ),
    )
    cuda_graph_mode: Literal["full_and_piecewise", "full_decode_only"] | None = Field(
        None,
        description=(
            "vllm's compilation_config.cudagraph_mode: full_and_piecewise (its default) replays every step up to "
            "the largest graph, full_decode_only only steps that decode alone, the others run eagerly; None: the "
            "default; vllm, sarathi, orca and static only"
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
    scheduler_recv_interval: int = Field(
        1,
        ge=1,
        le=MAX_SEQS,
        description=(
            "sglang only: new requests are read once the loop has run this many decode steps (a prefill step counts "
            "as 1000; SGLang's --scheduler-recv-interval, default 1: every step); not under DP attention or pipeline "
            "parallelism"
        ),
    )
    batch_wait_timeout_iters: int = Field(
        0,
        ge=0,
        le=MAX_SEQS,
        description=(
            "trtllm only: while requests decode, new prompts wait at most this many iterations for a fuller batch "
            "(TensorRT-LLM's batch_wait_timeout_iters; 0, the default, waits none); not under DP attention"
        ),
    )
    batch_wait_max_tokens_ratio: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description=(
            "trtllm only: the waiting ends once the step's tokens reach this share of max_num_batched_tokens "
            "(TensorRT-LLM's batch_wait_max_tokens_ratio)"
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

    def with_defaults(
        self,
        gpu: GpuSpec,
        max_model_len: int,
        tp: int = 1,
        pp: int = 1,
        dp_attention: bool = False,
        mla: bool = False,
        architecture: str = "",
    ) -> EngineConfig:
        """This config with unset batch limits and memory share filled as the scheduler's engine family fills
        them (policies/families.py): `vllm serve`'s (EngineArgs.get_batch_defaults; unset slots capped at the step's
        token budget), or under sglang SGLang's: max_num_batched_tokens its chunked_prefill_size, max_num_seqs its
        max_running_requests, gpu_memory_utilization its mem_fraction_static (for the replica's tp, pp). Under DP
        attention vLLM's are per data-parallel rank, so the group's are tp times them.
        Unset async_scheduling is the engine's default for the replica: on for a scheduler that schedules ahead
        (vllm, sglang) without pipeline parallelism (its steps in flight are committed one by one) and without
        draft-model or n-gram speculation, which vLLM runs synchronously (VllmConfig: "Async scheduling not supported
        with ...").
        An unset block_size is 16, or 64 for an `mla` model where the family runs FlashMLA (vLLM on compute
        capability 9.0 or newer: "Forcing kv cache block size to 64 for FlashMLA backend", vLLM 0.8 on; 0.10-0.11 on
        Blackwell picked CUTLASS MLA and 128); a set size that is not a multiple of 64 is an error under vLLM, which
        would not run it. Under sglang, a model of SGLANG_FULL_KV_ARCHITECTURES keeps every token in every layer, as
        SGLang runs it, unless disable_hybrid_kv_cache_manager is set (false: a what-if of SGLang sliding its
        windows); under DP attention an unset schedule_conservativeness is SGLang's 0.3 (its default 1.0 scaled by
        0.3)."""
        family, scheduler = family_of(self.scheduler), self.scheduler_class()
        tokens, seqs = family.batch_defaults(gpu)
        update = {}
        chunked = self.enable_chunked_prefill
        if "enable_chunked_prefill" not in self.model_fields_set and chunked != family.chunked_prefill:
            update["enable_chunked_prefill"] = chunked = family.chunked_prefill
        if "block_size" not in self.model_fields_set and self.block_size != family.block_size:
            update["block_size"] = family.block_size
        if not chunked and family.unchunked_budget_covers_prompts:
            tokens = max(tokens, max_model_len)
        if dp_attention and tp > 1 and family.defaults_per_rank:
            tokens, seqs = tokens * tp, seqs * tp  # else the family divides its own among its ranks
        update |= {
            k: v
            for k, v in (("max_num_batched_tokens", tokens), ("max_num_seqs", seqs))
            if getattr(self, k) is None
        }
        if "max_num_seqs" in update and family.caps_slots_at_budget:
            update["max_num_seqs"] = min(
                seqs, update.get("max_num_batched_tokens", self.max_num_batched_tokens)
            )
        conservativeness = family.dp_attention_conservativeness
        if (
            conservativeness is not None
            and dp_attention
            and tp > 1
            and "schedule_conservativeness" not in self.model_fields_set
        ):
            update["schedule_conservativeness"] = conservativeness  # what SGLang runs by default
        if (
            family.sliding_layers_whole or architecture in family.full_kv_architectures
        ) and "disable_hybrid_kv_cache_manager" not in self.model_fields_set:
            update["disable_hybrid_kv_cache_manager"] = True
        if mla and family.flashmla_block(gpu):
            if "block_size" not in self.model_fields_set:
                update["block_size"] = FLASHMLA_BLOCK_SIZE
            elif self.block_size % FLASHMLA_BLOCK_SIZE and family.vllm_rules:
                raise SpecError(
                    f"engine.block_size {self.block_size}: vLLM runs MLA models on {gpu.name} with FlashMLA, "
                    f"which needs a multiple of {FLASHMLA_BLOCK_SIZE} (it would run "
                    f"{FLASHMLA_BLOCK_SIZE}); set one or leave it unset"
                )
        # vLLM schedules ahead with EAGLE/MTP drafts only: a draft model's or n-gram's proposals need the step's output
        plain_drafts = self.speculative is not None and self.speculative.method not in EAGLE_METHODS
        if self.async_scheduling is None:
            update["async_scheduling"] = scheduler.schedules_ahead and pp == 1 and not plain_drafts
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
            prefill = chunk if chunked else self.max_prefill_tokens
            update["gpu_memory_utilization"] = family.memory_share(gpu, prefill, tp, pp, dp_attention)
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
                f"engine: with {family.label}'s default {filled} for this GPU: "
                + err.errors()[0]["msg"].removeprefix("Value error, ")
            ) from None

    def memory_config(self, pp: int = 1) -> EngineMemoryConfig:
        """The start-up memory plan's knobs of this (filled) engine; its family decides whether activations sit
        inside the memory share and whether sliding-window layers get a pool of their own."""
        family = family_of(self.scheduler)
        return EngineMemoryConfig(
            gpu_memory_utilization=self.gpu_memory_utilization,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            kv_dtype=self.kv_dtype,
            weight_dtype=self.weight_dtype,
            allow_long_max_model_len=self.allow_long_max_model_len,
            disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            activations_outside=not family.activations_in_share,
            share_of_free=family.share_of_free_memory,
            max_len_short_of_pool=family.max_len_short_of_pool,
            in_flight_batches=self.in_flight_batches(pp),
            swa_full_tokens_ratio=self.swa_full_tokens_ratio if family.swa_pools else None,
            chunked_prefill=self.enable_chunked_prefill,
        )

    def scheduler_class(self) -> type:
        """The registered (or importable) scheduler class `scheduler` names; SpecError for an unknown one."""
        from servesim.policies.catalog import schedulers  # the schedulers import this module

        return schedulers.get(self.scheduler)

    def in_flight_batches(self, pp: int = 1) -> int:
        """Steps scheduled whose tokens are not yet processed, as the scheduler's engine family counts them
        (EngineFamily.in_flight_batches): vLLM sizes and admits a sliding window's blocks by it."""
        return family_of(self.scheduler).in_flight_batches(bool(self.async_scheduling), pp)

    @property
    def batch_waiting(self) -> bool:
        """Whether TensorRT-LLM's batch waiting is on: PyExecutor's enable_batch_waiting (either knob above 0)."""
        return self.batch_wait_timeout_iters > 0 or self.batch_wait_max_tokens_ratio > 0

    def batch_limits(self) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) for a scheduler; an error while vLLM's defaults are unset."""
        if self.max_num_batched_tokens is None or self.max_num_seqs is None:
            raise ValueError(
                "engine batch limits unset: fill in vLLM's defaults for the GPU first "
                "(EngineConfig.with_defaults, Scenario.with_engine_defaults)"
            )
        return self.max_num_batched_tokens, self.max_num_seqs

    @field_validator("cuda_graph_sizes")
    @classmethod
    def _sizes_in_order(cls, sizes: list[int] | None) -> list[int] | None:
        """The engines sort and deduplicate a listed capture; so does the config, for what reads it."""
        return None if sizes is None else sorted(set(sizes))

    @model_validator(mode="after")
    def _engine_rules(self) -> EngineConfig:
        family = known_family(self.scheduler)
        if family is None:  # an unknown scheduler is reported where the scenario checks its policies
            return self
        scheduler = self.scheduler_class()
        # else checked once filled
        limits = self.max_num_batched_tokens is not None and self.max_num_seqs is not None
        if (
            limits
            and family.vllm_rules
            and self.enable_chunked_prefill
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) < max_num_seqs ({self.max_num_seqs}): "
                "each running request takes a token a step"
            )
        if (
            self.max_num_batched_tokens is not None
            and self.enable_chunked_prefill
            and scheduler.rounds_chunks_to_blocks
            and self.max_num_batched_tokens < self.block_size
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) < block_size ({self.block_size}): "
                f"{self.scheduler} chunks prompts in whole blocks, so none would ever run"
            )
        if self.long_prefill_token_threshold and not family.caps_long_prefills:
            raise ValueError(
                f"long_prefill_token_threshold is vLLM's --long-prefill-token-threshold; {self.scheduler!r} has "
                "none (its chunks take the budget left): leave it at 0"
            )
        if self.speculative is not None and not scheduler.speculates:
            raise ValueError(
                f"speculative decoding needs a token-budget scheduler (vllm, sarathi, orca), "
                f"not {self.scheduler!r}"
            )
        if self.scheduler_recv_interval > 1 and not scheduler.reads_at_intervals:
            raise ValueError(
                f"scheduler_recv_interval is SGLang's --scheduler-recv-interval; {self.scheduler!r} reads every "
                "request as it comes: leave it at 1 or use scheduler sglang"
            )
        if self.batch_waiting and not scheduler.waits_to_batch:
            raise ValueError(
                f"batch_wait_timeout_iters and batch_wait_max_tokens_ratio are TensorRT-LLM's; {self.scheduler!r} "
                "schedules a prompt as soon as it fits: leave them at 0 or use scheduler trtllm"
            )
        if self.batch_waiting and self.prefix_caching != "none":
            raise ValueError(
                "batch waiting is modelled without prefix caching (TensorRT-LLM's enable_block_reuse false): set "
                "prefix_caching none"
            )
        if self.async_scheduling and not scheduler.schedules_ahead:
            raise ValueError(
                f"async_scheduling is modelled for the vllm, sglang and trtllm schedulers of a colocated "
                f"replica; {self.scheduler!r} runs synchronously (prefill and decode pools too): set it "
                "false or leave it unset"
            )
        if self.cuda_graph_mode is not None and not family.vllm_graph_modes:
            raise ValueError(
                f"cuda_graph_mode is vLLM's compilation_config.cudagraph_mode; {self.scheduler!r} replays decode "
                "batches alone: leave it unset"
            )
        if self.cuda_graph_sizes is not None and self.cuda_graph_max_size is not None:
            raise ValueError(
                "cuda_graph_sizes and cuda_graph_max_size both set: the largest size is the largest graph; set one"
            )
        if self.preemption_mode == "swap" and not family.swaps:
            raise ValueError(
                "preemption_mode 'swap': SGLang retracts requests and recomputes them; the sglang "
                "scheduler takes preemption_mode 'recompute'"
            )
        return self
