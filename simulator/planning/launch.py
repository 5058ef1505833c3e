"""Launch commands for a planned replica: `vllm serve`, SGLang's `launch_server` and `trtllm-serve` with the planned
knobs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

from servesim.hardware.hf_models import repo_of
from servesim.hardware.model import get_model, resolve_weight_dtype
from servesim.hardware.gpu import get_gpu
from servesim.hardware.kv_groups import kv_groups
from servesim.policies.config import EngineConfig
from servesim.policies.families import (
    GENERIC,
    SGLANG,
    TRTLLM,
    TRTLLM_TOKENS_PER_BLOCK,
    VLLM,
    EngineFamily,
    family_of,
)
from servesim.policies.data_parallel import data_parallel_share
from servesim.policies.spec_decode import SpeculativeConfig
from servesim.simulator.scenario import Scenario


def _quantized_away(s: Scenario) -> str | None:
    """The weight dtype the run serves when it differs from the checkpoint's (None when they agree)."""
    model = get_model(s.model)
    dtype = resolve_weight_dtype(model, s.engine.weight_dtype)
    return None if dtype == model.quantization else dtype


def _online_fp8(s: Scenario) -> bool:
    """FP8 weights from a bf16/fp16 checkpoint: the engines quantize them at load (`--quantization fp8`)."""
    return _quantized_away(s) == "fp8" and get_model(s.model).quantization in ("bf16", "fp16")


def hf_model_id(model: str) -> str:
    """The Hugging Face repo id of a preset or a cached config.json; another config.json path is passed through
    (point it at the weights)."""
    return repo_of(model) or model


# engine.speculative.method -> vLLM's speculative_config method (vllm/config/speculative.py SpeculativeMethod)
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vllm/config/cache.py BlockSize
VLLM_SPEC_METHODS = {"draft": "draft_model", "eagle": "eagle", "mtp": "mtp", "ngram": "ngram"}
# -> SGLang's --speculative-algorithm; its NGRAM drafts a tree from generated tokens, not prompt lookup: none
SGLANG_SPEC_ALGORITHMS = {"draft": "STANDALONE", "eagle": "EAGLE", "mtp": "EAGLE"}


def _moe_ep(s: Scenario) -> bool:
    """Expert parallel only changes an MoE model over more than one GPU (the cost model ignores it elsewhere)."""
    return s.parallelism.ep and s.parallelism.tp > 1 and get_model(s.model).moe is not None


def _dp_attention(s: Scenario) -> bool:
    """DP attention over a group of more than one GPU (at tp 1 it is plain serving)."""
    return s.parallelism.dp_attention and s.parallelism.tp > 1


def _vllm_dp(s: Scenario) -> int:
    """vLLM's data-parallel ranks for the simulated DP attention: one per GPU of the group at TP 1, its MoE layers
    spanning them all (expert parallel with `ep`, else TP over DP x TP)."""
    return s.parallelism.tp if _dp_attention(s) else 1


def _vllm_speculative(spec: SpeculativeConfig) -> str:
    """`--speculative-config` as JSON, quoted for the shell; the draft model by its repo id."""
    cfg = {"method": VLLM_SPEC_METHODS[spec.method], "num_speculative_tokens": spec.k}
    if spec.draft_model is not None:
        cfg["model"] = hf_model_id(spec.draft_model)
    return f"--speculative-config {shlex.quote(json.dumps(cfg))}"


def _sglang_speculative(spec: SpeculativeConfig) -> list[str]:
    """SGLang's flags for k drafts in a chain (top-k 1: k steps, k + 1 tokens verified); none for ngram."""
    if spec.method not in SGLANG_SPEC_ALGORITHMS:
        return []
    parts = [f"--speculative-algorithm {SGLANG_SPEC_ALGORITHMS[spec.method]}"]
    if spec.draft_model is not None:
        parts.append(f"--speculative-draft-model-path {hf_model_id(spec.draft_model)}")
    return parts + [
        f"--speculative-num-steps {spec.k}",
        "--speculative-eagle-topk 1",
        f"--speculative-num-draft-tokens {spec.k + 1}",
    ]


def _vllm_engine(s: Scenario) -> EngineConfig:
    """The engine `vllm serve` should run. A scenario simulated with another engine's scheduler (SGLang's,
    TensorRT-LLM's) keeps the limits it sets (its slots at most the step's tokens, as vLLM requires), but that
    engine's defaults (SGLang's slot cap and mem_fraction_static; TensorRT-LLM's 2048 slots, whole prompts, 32-token
    blocks and free-memory fraction) are not vLLM's: vLLM's defaults stand for them."""
    e = s.engine
    if family_of(e.scheduler) in (VLLM, GENERIC):
        return s.with_engine_defaults().engine
    vllm = {"scheduler": VLLM.scheduler, "gpu_memory_utilization": None}
    if e.max_num_seqs is not None:
        gpu = get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files))
        tokens = e.max_num_batched_tokens or VLLM.batch_defaults(gpu)[0]
        vllm["max_num_seqs"] = min(e.max_num_seqs, tokens)
    return s.model_copy(update={"engine": e.model_copy(update=vllm)}).with_engine_defaults().engine


def _long_context(s: Scenario, max_model_len: int) -> bool:
    """Whether the context runs past the model's own, which both engines refuse without an environment variable."""
    return max_model_len > get_model(s.model).max_position_embeddings


def vllm_command(s: Scenario, max_model_len: int) -> str:
    """`vllm serve` for one replica of `s` (one command per replica; replicas sit behind a load balancer)."""
    e, par, dp = _vllm_engine(s), s.parallelism, _vllm_dp(s)
    parts = [f"vllm serve {hf_model_id(s.model)}", f"--tensor-parallel-size {par.tp // dp}"]
    if _long_context(s, max_model_len):
        parts.insert(0, "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    if dp > 1:
        parts.append(f"--data-parallel-size {dp}")
    if par.pp > 1:
        parts.append(f"--pipeline-parallel-size {par.pp}")
    if _moe_ep(s):
        parts.append("--enable-expert-parallel")
    # vLLM's limits are per data-parallel rank, as the simulated ranks ran them
    rank = data_parallel_share(e, dp)
    tokens = rank.max_num_batched_tokens
    if not e.enable_chunked_prefill:  # a whole prompt still fits one rank's step
        tokens = max(tokens, max_model_len)
    parts += [
        f"--max-num-seqs {rank.max_num_seqs}",
        f"--max-num-batched-tokens {tokens}",
        f"--gpu-memory-utilization {e.gpu_memory_utilization}",
        f"--max-model-len {max_model_len}",
        "--enable-chunked-prefill" if e.enable_chunked_prefill else "--no-enable-chunked-prefill",
    ]
    if e.prefix_caching == "none":  # vLLM V1 caches prefixes by default
        parts.append("--no-enable-prefix-caching")
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
    if not e.async_scheduling or s.disaggregation is not None:  # simulated synchronously (P/D pools always);
        parts.append("--no-async-scheduling")  # vLLM schedules ahead by default since 0.14
    if e.speculative is not None:
        parts.append(_vllm_speculative(e.speculative))
    if family_of(s.engine.scheduler) in (VLLM, GENERIC):  # another engine's graph sizes count other things
        parts += _vllm_graph_flags(e)
    return " ".join(parts)


def _vllm_graph_flags(e: EngineConfig) -> list[str]:
    """The CUDA graphs the replica was simulated with, as vLLM's compilation config (or eager)."""
    if e.cuda_graph_max_size == 0:
        return ["--enforce-eager"]
    config: dict[str, object] = {}
    if e.cuda_graph_mode == "full_decode_only":
        config["cudagraph_mode"] = "FULL_DECODE_ONLY"
    if e.cuda_graph_sizes is not None:
        config["cudagraph_capture_sizes"] = e.cuda_graph_sizes
    if e.cuda_graph_max_size is not None:
        config["max_cudagraph_capture_size"] = e.cuda_graph_max_size
    return [f"--compilation-config {shlex.quote(json.dumps(config))}"] if config else []


def sglang_command(s: Scenario, max_model_len: int) -> str:
    """SGLang's `launch_server` with the equivalent knobs (chunked-prefill-size -1 = chunking off). TensorRT-LLM's
    defaults (2048 slots, whole prompts, its memory fraction) are not SGLang's: for a plan simulated under it, only
    the knobs the scenario sets carry over."""
    if family_of(s.engine.scheduler) is TRTLLM:
        unfilled = s.engine.model_copy(update={"scheduler": SGLANG.scheduler, "gpu_memory_utilization": None})
        s = s.model_copy(update={"engine": unfilled})
    e, par = s.with_engine_defaults().engine, s.parallelism
    simulated_sglang = family_of(e.scheduler) is SGLANG
    parts = [f"python -m sglang.launch_server --model-path {hf_model_id(s.model)}", f"--tp {par.tp}"]
    if _long_context(s, max_model_len):
        parts.insert(0, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    if par.pp > 1:
        parts.append(f"--pp-size {par.pp}")
    if _dp_attention(s):
        parts.append(f"--enable-dp-attention --dp {par.tp}")
    if _moe_ep(s):  # all-reduce of the experts' outputs by default; under DP attention DeepEP's all-to-all
        parts.append(f"--ep-size {par.tp}" + (" --moe-a2a-backend deepep" if _dp_attention(s) else ""))
    # totals over the group: SGLang divides them among DP attention ranks itself
    # else SGLang's own cap, simulated as such
    if not simulated_sglang or s.engine.max_num_seqs is not None:
        parts.append(f"--max-running-requests {e.max_num_seqs}")
    parts.append(f"--chunked-prefill-size {e.max_num_batched_tokens if e.enable_chunked_prefill else -1}")
    # a vLLM share of memory is not SGLang's (weights + KV only): SGLang picks its own
    if simulated_sglang:
        parts.append(f"--mem-fraction-static {e.gpu_memory_utilization}")
    parts.append(f"--context-length {max_model_len}")
    if e.kv_dtype == "fp8":
        parts.append("--kv-cache-dtype fp8_e4m3")
    if _online_fp8(s):
        parts.append("--quantization fp8")
    if e.prefix_caching == "none":  # SGLang's radix cache is on by default
        parts.append("--disable-radix-cache")
    elif e.prefix_caching == "radix" and e.radix_page_size != 1:  # SGLang's default page holds one token
        parts.append(f"--page-size {e.radix_page_size}")
    if e.queue_order == "lpm":
        parts.append("--schedule-policy lpm")
    elif e.queue_order == "priority":  # vLLM's order, lower values first; no preempting for a waiting request
        parts.append(
            "--enable-priority-scheduling --schedule-low-priority-values-first --disable-priority-preemption"
        )
    parts += _sglang_swa_memory(s, e)
    if simulated_sglang:  # knobs only SGLang's scheduler reads
        if e.max_prefill_tokens != 16384:
            parts.append(f"--max-prefill-tokens {e.max_prefill_tokens}")
        scale = SGLANG.dp_attention_conservativeness if _dp_attention(s) else 1.0
        if e.schedule_conservativeness != scale:  # SGLang runs the flag's value (default 1.0) times `scale`
            parts.append(f"--schedule-conservativeness {round(e.schedule_conservativeness / scale, 3)}")
        if e.enable_mixed_chunk:
            parts.append("--enable-mixed-chunk")
        if e.scheduler_recv_interval > 1:
            parts.append(f"--scheduler-recv-interval {e.scheduler_recv_interval}")
        if not e.async_scheduling:  # simulated one batch at a time; SGLang overlaps by default
            parts.append("--disable-overlap-schedule")
        if e.cuda_graph_max_size == 0:
            parts.append("--disable-cuda-graph")
        elif e.cuda_graph_sizes is not None:
            parts.append("--cuda-graph-bs " + " ".join(map(str, e.cuda_graph_sizes)))
        elif e.cuda_graph_max_size is not None:
            parts.append(f"--cuda-graph-max-bs {e.cuda_graph_max_size}")
    if e.speculative is not None:
        parts += _sglang_speculative(e.speculative)
    return " ".join(parts)


def trtllm_command(s: Scenario, max_model_len: int) -> str:
    """`trtllm-serve` (PyTorch backend) with the equivalent knobs; what it takes only from an LLM API options file
    (KV block reuse, tokens per block, KV dtype, the overlap scheduler, attention DP, CUDA-graph padding, batch
    waiting) goes in one, inline."""
    e, par = s.with_engine_defaults().engine, s.parallelism
    simulated_trtllm = family_of(e.scheduler) is TRTLLM
    parts = [f"trtllm-serve {hf_model_id(s.model)}", "--backend pytorch", f"--tp_size {par.tp}"]
    if par.pp > 1:
        parts.append(f"--pp_size {par.pp}")
    if _moe_ep(s):
        parts.append(f"--ep_size {par.tp}")
    parts += [
        f"--max_batch_size {e.max_num_seqs}",
        f"--max_num_tokens {e.max_num_batched_tokens}",
        f"--max_seq_len {max_model_len}",
    ]
    # a vLLM or SGLang share of the device is not TensorRT-LLM's share of the memory left: it keeps its own
    if simulated_trtllm:
        parts.append(f"--kv_cache_free_gpu_memory_fraction {e.gpu_memory_utilization}")
    if e.enable_chunked_prefill:
        parts.append("--enable_chunked_prefill")
    kv_cache: dict[str, object] = {}
    if e.prefix_caching == "none":  # block reuse is on by default
        kv_cache["enable_block_reuse"] = False
    if e.block_size != TRTLLM_TOKENS_PER_BLOCK:
        kv_cache["tokens_per_block"] = e.block_size
    if e.kv_dtype == "fp8":
        kv_cache["dtype"] = "fp8"
    if kv_cache and simulated_trtllm:  # the file's kv_cache_config replaces the one the flag built, whole
        kv_cache["free_gpu_memory_fraction"] = e.gpu_memory_utilization
    options: dict[str, object] = {"kv_cache_config": kv_cache} if kv_cache else {}
    if not e.async_scheduling:  # simulated one step at a time; the overlap scheduler is on by default
        options["disable_overlap_scheduler"] = True
    if _dp_attention(s):
        options["enable_attention_dp"] = True
    if simulated_trtllm and e.cuda_graph_max_size == 0:
        options["cuda_graph_config"] = None
    elif simulated_trtllm and e.cuda_graph_sizes is not None:
        options["cuda_graph_config"] = {"enable_padding": True, "batch_sizes": e.cuda_graph_sizes}
    elif simulated_trtllm and e.cuda_graph_max_size is not None:
        options["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": e.cuda_graph_max_size}
    if e.batch_wait_timeout_iters:
        options["batch_wait_timeout_iters"] = e.batch_wait_timeout_iters
    if e.batch_wait_max_tokens_ratio:
        options["batch_wait_max_tokens_ratio"] = e.batch_wait_max_tokens_ratio
    if options:  # YAML reads JSON; bash hands the file over as /dev/fd/N
        parts.append(f"--extra_llm_api_options <(echo {shlex.quote(json.dumps(options))})")
    return " ".join(parts)


def _sglang_swa_memory(s: Scenario, e: EngineConfig) -> list[str]:
    """SGLang's flags for a model mixing sliding-window and full layers: its two pools off (kept on but for the
    models SGLang itself runs whole), or their ratio when not SGLang's default."""
    model = get_model(s.model)
    windows = kv_groups(model).windows
    if None not in windows or len(windows) == 1:
        return []
    if e.disable_hybrid_kv_cache_manager:
        return [] if model.architecture in SGLANG.full_kv_architectures else ["--disable-hybrid-swa-memory"]
    if e.swa_full_tokens_ratio != EngineConfig.model_fields["swa_full_tokens_ratio"].default:
        return [f"--swa-full-tokens-ratio {e.swa_full_tokens_ratio}"]
    return []


def launch_notes(s: Scenario) -> list[str]:
    """Where the commands only approximate the simulated engine."""
    d = s.disaggregation
    if d is not None:
        notes = [
            f"prefill/decode disaggregated: start {d.prefill.replicas} prefill and {d.decode.replicas} decode "
            f"instances ({s.parallelism.tp * s.parallelism.pp} GPU(s) each) of this command, adding "
            '--kv-transfer-config \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\' '
            "(vLLM) or --disaggregation-mode prefill|decode (SGLang), behind a P/D-aware proxy"
        ]
    else:
        gpus = s.parallelism.tp * s.parallelism.pp
        notes = [
            f"one replica of {gpus} GPU(s): no load balancer needed"
            if s.cluster.replicas == 1
            else f"one command per replica: start {s.cluster.replicas} of them ({gpus} GPU(s) each) behind a "
            f"{s.cluster.router} load balancer"
        ]
    simulated = family_of(s.engine.scheduler)
    if simulated is SGLANG:
        notes.append(
            "simulated with SGLang's scheduler (prefill first): the SGLang command runs it; vLLM mixes "
            "prefill chunks into decode steps instead, and takes its own default max_num_seqs and memory "
            "share"
        )
    elif simulated is TRTLLM:
        notes.append(
            "simulated with TensorRT-LLM's scheduler (whole prompts, whole sequences reserved): the TensorRT-LLM "
            "command runs it; vLLM and SGLang batch differently and take their own default limits and memory share"
        )
    elif simulated is not VLLM:
        notes.append(
            f"simulated with scheduler {s.engine.scheduler!r}; "
            "the commands run the engines' default scheduler"
        )
    if (dtype := _quantized_away(s)) not in (None, "fp16") and not _online_fp8(s):
        notes.append(
            f"weights {dtype} (the checkpoint ships {get_model(s.model).quantization}): serve a checkpoint "
            "converted to it (e.g. AWQ/GPTQ for int4/w8a16)"
        )
    if s.engine.block_size not in VLLM_BLOCK_SIZES:
        notes.append(
            f"block_size {s.engine.block_size}: vLLM accepts {', '.join(map(str, VLLM_BLOCK_SIZES))} "
            "and refuses the vLLM command as printed"
        )
    if repo_of(s.model) is None:
        notes.append(
            f"model {s.model!r} is a config.json path: pass the folder or repo id that holds its weights"
        )
    notes += _parallel_notes(s)
    if s.engine.speculative is not None:
        notes += _speculative_notes(s, s.engine.speculative)
    return notes


def _parallel_notes(s: Scenario) -> list[str]:
    """Where an engine cannot lay out DP attention and expert parallelism as simulated."""
    if not _dp_attention(s):
        return []
    tp, model = s.parallelism.tp, get_model(s.model)
    dense = "" if all(layer.is_moe for layer in model.layers) else " and dense MLP layers"
    shared = (
        " shared experts,"
        if model.moe is not None and model.moe.num_shared_experts and not _moe_ep(s)
        else ""
    )
    layout = (
        f"its embeddings,{shared} LM head{dense} stay whole on every rank (simulated sliced over the group, "
        "as SGLang runs them)"
        if family_of(s.engine.scheduler).dp_attention_slices_dense
        else f"SGLang slices the embeddings,{shared} LM head{dense} over the group (simulated whole on every rank, "
        "as vLLM keeps them)"
    )
    notes = [
        f"vLLM runs DP attention as {tp} data-parallel ranks of TP 1, each with its own scheduler, "
        f"--max-num-seqs and --max-num-batched-tokens (the simulated group's divided by {tp}); {layout}"
    ]
    if model.moe is None and s.disaggregation is not None and family_of(s.engine.scheduler) is not SGLANG:
        notes.append(
            "vLLM's data-parallel ranks of a dense model are independent engines: in a P/D pool simulated "
            "stepping together, as a MoE model's ranks do (pessimistic)"
        )
    if _moe_ep(s):
        notes.append(
            "the MoE all-to-all is priced as DeepEP's dispatch/combine: give vLLM a DeepEP "
            "--all2all-backend (deepep_low_latency or deepep_high_throughput)"
        )
    return notes


def _speculative_notes(s: Scenario, spec: SpeculativeConfig) -> list[str]:
    """What the speculative-decoding flags leave to the operator."""
    notes = []
    if spec.method == "eagle":
        notes.append(
            'speculative method eagle: add the EAGLE head\'s repo ("model" in --speculative-config, '
            "--speculative-draft-model-path for SGLang); an EAGLE-3 head takes method eagle3 / EAGLE3"
        )
    elif spec.method == "ngram":
        notes.append(
            "speculative method ngram: SGLang's NGRAM drafts a tree from its cache of generated tokens, "
            "not vLLM's prompt lookup: the SGLang command runs without speculation"
        )
    if spec.draft_model is not None and repo_of(spec.draft_model) is None:
        notes.append(
            f"draft model {spec.draft_model!r} is a config.json path: pass the folder or repo id that "
            "holds its weights"
        )
    if spec.method == "draft" and _dp_attention(s):
        notes.append("SGLang's STANDALONE (draft model) speculation does not run with --enable-dp-attention")
    if spec.disable_above_batch is not None or spec.disable_above_tokens is not None:
        notes.append(
            "speculation simulated off under load (disable_above_batch / disable_above_tokens): neither "
            "command has a flag for it, so both speculate at every batch size"
        )
    return notes


#: Each engine family's launch command for one replica of a scenario (and its context length).
COMMANDS: dict[EngineFamily, Callable[[Scenario, int], str]] = {
    VLLM: vllm_command,
    SGLANG: sglang_command,
    TRTLLM: trtllm_command,
}
