"""Engine knobs the schedulers read, with vLLM's names, meanings and defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.spec_decode import SpeculativeConfig


class EngineConfig(BaseModel):
    """One engine (replica): batching limits, KV paging and preemption. Units in the names."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    scheduler: str = Field("vllm", description="Scheduler policy name: vllm, sarathi, orca, static (or pkg.mod:attr)")
    queue_order: str = Field("fcfs", description="Waiting-queue order: fcfs, priority, sjf (or pkg.mod:attr)")
    max_num_seqs: int = Field(256, ge=1, description="Max requests running at once (batch slots)")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Token budget of one step")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts across steps within the budget")
    chunk_size: int = Field(512, ge=1, description="sarathi only: the fixed token budget of each step")
    block_size: int = Field(16, ge=1, description="Tokens per KV block")
    prefix_caching: Literal["none", "vllm", "radix"] = Field(
        "vllm", description="none; vllm (hash-chained full blocks, on by default in vLLM v1); radix (SGLang)")
    radix_page_size: int = Field(1, ge=1, description="radix only: tokens per KV page (SGLang's page_size)")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use")
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt+output; default: the model's limit")
    allow_long_max_model_len: bool = Field(False, description=(
        "Allow max_model_len beyond the model's max_position_embeddings (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN)"))
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="Force the KV pool size (as vLLM's flag)")
    disable_hybrid_kv_cache_manager: bool = Field(False, description=(
        "vLLM's flag: keep sliding-window layers' whole KV in one group instead of freeing out-of-window blocks"))
    watermark: float = Field(0.0, ge=0, lt=1, description="Fraction of blocks kept free when admitting")
    preemption_mode: Literal["recompute", "swap"] = Field("recompute", description="What happens to a preempted request")
    swap_space_gib: float = Field(4.0, ge=0, description="Host memory per GPU for swapped-out KV blocks, GiB")
    kv_dtype: Literal["bf16", "fp16", "fp8"] = Field("bf16", description="KV cache dtype")
    weight_dtype: Literal["auto", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4"] = Field("auto", description=(
        "Weight dtype; auto: the checkpoint's (its quantization_config: DeepSeek-V3 fp8, gpt-oss mxfp4, else bf16); "
        "mxfp4 quantizes MoE experts only"))
    kv_sharing_fast_prefill: bool = Field(False, description="YOCO: KV-sharing layers run on logits tokens only")
    speculative: SpeculativeConfig | None = Field(None, description="Speculative decoding (None: off)")

    @model_validator(mode="after")
    def _budget_covers_batch(self) -> EngineConfig:
        if self.scheduler == "vllm" and self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) < max_num_seqs ({self.max_num_seqs}): every "
                "running request needs a token each step; raise the budget or lower max_num_seqs")
        if self.speculative is not None and self.scheduler in ("static", "seed_toy"):
            raise ValueError(f"speculative decoding needs a token-budget scheduler (vllm, sarathi, orca), "
                             f"not {self.scheduler!r}")
        return self
