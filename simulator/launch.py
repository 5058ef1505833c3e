"""Launch commands for a planned replica: `vllm serve` and SGLang's `launch_server` with the planned knobs."""

from __future__ import annotations

from hardware.model import get_model, resolve_weight_dtype
from simulator.scenario import Scenario

# Preset -> Hugging Face repo id, as recorded in hardware/model_configs/SOURCES.md.
HF_MODEL_IDS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "gemma-2-9b": "google/gemma-2-9b",
    "gemma-3n-e2b": "google/gemma-3n-E2B-it",
    "gemma-3n-e4b": "google/gemma-3n-E4B-it",
    "deepseek-v2": "deepseek-ai/DeepSeek-V2",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "gemma-3-4b": "google/gemma-3-4b-it",
    "gemma-3-12b": "google/gemma-3-12b-it",
    "gemma-3-27b": "google/gemma-3-27b-it",
}


def _quantized_away(s: Scenario) -> str | None:
    """The weight dtype the run serves when it differs from the checkpoint's (None when they agree)."""
    model = get_model(s.model)
    dtype = resolve_weight_dtype(model, s.engine.weight_dtype)
    return None if dtype == model.quantization else dtype


def _online_fp8(s: Scenario) -> bool:
    """FP8 weights from a bf16/fp16 checkpoint: the engines quantize them at load (`--quantization fp8`)."""
    return _quantized_away(s) == "fp8" and get_model(s.model).quantization in ("bf16", "fp16")


def hf_model_id(model: str) -> str:
    """The Hugging Face repo id of a preset; a config.json path is passed through (point it at the weights)."""
    return HF_MODEL_IDS.get(model, model)


def vllm_command(s: Scenario, max_model_len: int) -> str:
    """`vllm serve` for one replica of `s` (one command per replica; replicas sit behind a load balancer)."""
    e, par = s.with_engine_defaults().engine, s.parallelism
    parts = [f"vllm serve {hf_model_id(s.model)}", f"--tensor-parallel-size {par.tp}"]
    if par.pp > 1:
        parts.append(f"--pipeline-parallel-size {par.pp}")
    parts += [f"--max-num-seqs {e.max_num_seqs}", f"--max-num-batched-tokens {e.max_num_batched_tokens}",
              f"--gpu-memory-utilization {e.gpu_memory_utilization}", f"--max-model-len {max_model_len}",
              "--enable-chunked-prefill" if e.enable_chunked_prefill else "--no-enable-chunked-prefill"]
    if e.block_size != 16:
        parts.append(f"--block-size {e.block_size}")
    if e.long_prefill_token_threshold:
        parts.append(f"--long-prefill-token-threshold {e.long_prefill_token_threshold}")
    if e.kv_dtype == "fp8":
        parts.append("--kv-cache-dtype fp8")
    if _online_fp8(s):
        parts.append("--quantization fp8")
    if e.queue_order == "priority":
        parts.append("--scheduling-policy priority")
    if e.disable_hybrid_kv_cache_manager:
        parts.append("--disable-hybrid-kv-cache-manager")
    if not e.async_scheduling:  # simulated synchronously; vLLM schedules ahead by default since 0.14
        parts.append("--no-async-scheduling")
    return " ".join(parts)


def sglang_command(s: Scenario, max_model_len: int) -> str:
    """SGLang's `launch_server` with the equivalent knobs (chunked-prefill-size -1 = chunking off)."""
    e, par = s.with_engine_defaults().engine, s.parallelism
    parts = [f"python -m sglang.launch_server --model-path {hf_model_id(s.model)}", f"--tp {par.tp}"]
    if par.pp > 1:
        parts.append(f"--pp-size {par.pp}")
    parts += [f"--max-running-requests {e.max_num_seqs}",
              f"--chunked-prefill-size {e.max_num_batched_tokens if e.enable_chunked_prefill else -1}"]
    if e.scheduler == "sglang":  # a vLLM share of memory is not SGLang's (weights + KV only): SGLang picks its own
        parts.append(f"--mem-fraction-static {e.gpu_memory_utilization}")
    parts.append(f"--context-length {max_model_len}")
    if e.kv_dtype == "fp8":
        parts.append("--kv-cache-dtype fp8_e4m3")
    if _online_fp8(s):
        parts.append("--quantization fp8")
    if e.queue_order == "lpm":
        parts.append("--schedule-policy lpm")
    if e.scheduler == "sglang":  # knobs only SGLang's scheduler reads
        if e.max_prefill_tokens != 16384:
            parts.append(f"--max-prefill-tokens {e.max_prefill_tokens}")
        if e.schedule_conservativeness != 1.0:
            parts.append(f"--schedule-conservativeness {e.schedule_conservativeness}")
        if e.enable_mixed_chunk:
            parts.append("--enable-mixed-chunk")
    return " ".join(parts)


def launch_notes(s: Scenario) -> list[str]:
    """Where the commands only approximate the simulated engine."""
    d = s.disaggregation
    if d is not None:
        notes = [f"prefill/decode disaggregated: start {d.prefill.replicas} prefill and {d.decode.replicas} decode "
                 f"instances ({s.parallelism.tp * s.parallelism.pp} GPU(s) each) of this command, adding "
                 "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}' "
                 "(vLLM) or --disaggregation-mode prefill|decode (SGLang), behind a P/D-aware proxy"]
    else:
        gpus = s.parallelism.tp * s.parallelism.pp
        notes = [f"one replica of {gpus} GPU(s): no load balancer needed" if s.cluster.replicas == 1 else
                 f"one command per replica: start {s.cluster.replicas} of them ({gpus} GPU(s) each) behind a "
                 f"{s.cluster.router} load balancer"]
    if s.engine.scheduler == "sglang":
        notes.append("simulated with SGLang's scheduler (prefill first): the SGLang command runs it; vLLM mixes "
                     "prefill chunks into decode steps instead")
    elif s.engine.scheduler != "vllm":
        notes.append(f"simulated with scheduler {s.engine.scheduler!r}; "
                     "the commands run the engines' default scheduler")
    if (dtype := _quantized_away(s)) not in (None, "fp16") and not _online_fp8(s):
        notes.append(f"weights {dtype} (the checkpoint ships {get_model(s.model).quantization}): serve a checkpoint "
                     "converted to it (e.g. AWQ/GPTQ for int4/w8a16)")
    if s.model not in HF_MODEL_IDS:
        notes.append(f"model {s.model!r} is a config.json path: pass the folder or repo id that holds its weights")
    return notes
