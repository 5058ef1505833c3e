"""Engine families: what a replica decides because of the engine it imitates, one object per engine.

A scheduler names its family (`Scheduler.family`); the rest of the project asks the family, never the engine's name.
A third engine is one more `EngineFamily` subclass registered in `families`, plus its schedulers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.model import ModelSpec
from servesim.policies.registry import Registry


def vllm_batch_defaults(gpu: GpuSpec, offline: bool = False) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM picks (EngineArgs.get_batch_defaults): larger on devices
    reporting >= 70 GiB, except A100s, where a larger budget measured slower; the offline `LLM` class (bench
    latency, bench throughput) takes 16384/8192 tokens where `vllm serve` takes 8192/2048."""
    large = gpu.reported_memory_bytes >= 70 * (1 << 30) and "a100" not in gpu.name.lower()
    if offline:
        return (16384, 1024) if large else (8192, 256)
    return (8192, 1024) if large else (2048, 256)


@dataclass(frozen=True)
class OfflineRun:
    """What an offline benchmark (bench throughput / latency, trtllm-bench) knows when it sizes the engine."""

    model: ModelSpec
    tp: int
    pp: int
    input_len: int
    output_len: int
    weight_dtype: str  # resolved: bf16, fp8, nvfp4, ...
    kv_dtype: str
    memory_share: float  # the engine's KV memory share (TensorRT-LLM: of the free memory)
    chunked_prefill: bool = False


# trtllm-bench's bytes per weight and KV element by quantization (tensorrt_llm/bench/build/tuning.py BYTES_PER_ELEM);
# it sizes only these checkpoints (build.py TUNED_QUANTS) and runs others (MXFP4, AWQ, ...) at its defaults
_TRTLLM_BENCH_BYTES = {"fp8": 1.0, "nvfp4": 0.5}
_TRTLLM_BENCH_TUNED = ("bf16", "fp16", "fp8", "nvfp4")


def trtllm_bench_limits(run: OfflineRun, device_gib: float) -> tuple[int, int]:
    """(max_num_tokens, max_batch_size) `trtllm-bench throughput` picks when neither is given
    (tensorrt_llm/bench/build/tuning.py, calc_engine_setting and finetune_setting, TensorRT-LLM 1.0-1.2): the
    requests of input + output tokens the KV share of what the weights leave could hold (all GPUs of the group, at
    least one KV head per GPU), capped at 4096 and rounded up (to 32s from 64, 128s, then 256s), and that count
    times 1 + input/output tokens, capped at 32768 and rounded up (256s from 2048, 512s, then 1024s); without
    chunked prefill the tokens are at least the longest prompt plus the batch (bench/benchmark/utils/general.py).
    Checkpoints it does not size (MXFP4, AWQ, ...) run at TensorRT-LLM's default limits."""
    if run.weight_dtype not in _TRTLLM_BENCH_TUNED:
        tokens, batch = TRTLLM_BATCH_DEFAULTS
        return (tokens if run.chunked_prefill else max(tokens, run.input_len + batch)), batch
    model = run.model
    kv_bytes = _TRTLLM_BENCH_BYTES.get(run.kv_dtype, 2.0)
    gib_per_token = (
        2 * model.num_kv_layers * max(run.tp, model.num_kv_heads) * model.head_dim * kv_bytes / 2**30
    )
    weights_gib = model.total_params() * _TRTLLM_BENCH_BYTES.get(run.weight_dtype, 2.0) / 2**30
    cache_gib = (device_gib * run.tp * run.pp - weights_gib) * run.memory_share
    requests = cache_gib / (gib_per_token * (run.input_len + run.output_len))
    raw_bs = min(requests, 4096) / run.pp
    raw_tokens = min(raw_bs * (1 + run.input_len / run.output_len), 32768)
    if raw_bs < 256:
        batch = max(64, 32 * math.ceil(raw_bs / 32))
    else:
        step = 128 if raw_bs < 1024 else 256
        batch = step * math.ceil(raw_bs / step)
    if raw_tokens < 4096:
        tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    else:
        step = 512 if raw_tokens < 8192 else 1024
        tokens = step * math.ceil(raw_tokens / step)
    if not run.chunked_prefill:
        tokens = max(tokens, run.input_len + batch)
    return tokens, batch


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
SGLANG_DP_ATTENTION_CONSERVATIVENESS = 0.3  # scales --schedule-conservativeness under DP attention
SGLANG_MAX_RUNNING = 4096  # the cap of SGLang's request-slot pool (model_runner: max_num_reqs)
VLLM_GPU_MEMORY_UTILIZATION = 0.9
# TensorRT-LLM's trtllm-serve (PyTorch backend, 1.x): --max_num_tokens and --max_batch_size default to BuildConfig's
# 8192 and 2048, --kv_cache_free_gpu_memory_fraction to 0.9 (of the memory free after weights and a profiling
# forward pass: tensorrt_llm/_torch/pyexecutor/_util.py KvCacheCreator), KvCacheConfig.tokens_per_block to 32
TRTLLM_BATCH_DEFAULTS = (8192, 2048)
TRTLLM_FREE_MEMORY_FRACTION = 0.9
TRTLLM_TOKENS_PER_BLOCK = 32
FLASHMLA_MIN_CAPABILITY, FLASHMLA_BLOCK_SIZE = 9.0, 64  # vLLM's MLA models on Hopper and newer
# vLLM's default max_cudagraph_capture_size is at most the first; on data-center Blackwell (compute capability 10.x)
# the second
VLLM_GRAPH_MAX_SIZE, VLLM_BLACKWELL_GRAPH_MAX_SIZE = 512, 1024


class GraphLimits(Protocol):
    """What of an engine config bounds its CUDA graphs (policies.config.EngineConfig, defaults filled in)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    cuda_graph_max_size: int | None
    cuda_graph_sizes: list[int] | None
    cuda_graph_mode: str | None


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


class EngineFamily:
    """vLLM's defaults without vLLM's own rules: the family of the schedulers that imitate no engine of their own
    (Sarathi, Orca, static batching, out-of-tree ones). Each attribute is one decision an engine makes."""

    name = "generic"
    scheduler = "vllm"  # the scheduler that runs the engine as it runs by default
    label = "vLLM"  # whose defaults fill the unset knobs, as messages say
    kernel_tables = "vllm"  # whose measured kernels price its steps (`kernels: engine`)
    prefix_caching = "vllm"  # the KV manager the engine runs by default
    activations_in_share = True  # the memory share covers activations (SGLang's covers weights and KV only)
    swa_pools = False  # sliding-window models keep two pools sized by swa_full_tokens_ratio (SGLang)
    # models whose every layer keeps every token by default
    full_kv_architectures: frozenset[str] = frozenset()
    # every model's sliding layers keep every token by default (TensorRT-LLM without kv_cache_config's
    # max_attention_window), as for `full_kv_architectures`
    sliding_layers_whole = False
    null_block = False  # the KV pool keeps one block as its null block (vLLM's BlockPool)
    # vLLM's own checks: slots within the budget, FlashMLA's block size, an unchunked budget fitting a prompt
    vllm_rules = False
    swaps = True  # preemption may swap KV to the host (SGLang only retracts and recomputes)
    caps_long_prefills = True  # vLLM's --long-prefill-token-threshold (SGLang and TensorRT-LLM have none)
    # the offline benchmark turns CUDA-graph padding on up to its batch limit (trtllm-bench's cuda_graph_config)
    offline_pads_graphs = False
    vllm_graph_modes = True  # vLLM's cudagraph_mode chooses which steps replay a graph
    block_size = 16  # tokens per KV block when unset
    chunked_prefill = True  # prompts split across steps when enable_chunked_prefill is unset
    # with chunking off, an unset token budget grows to max_model_len, so any prompt fits one step (vLLM); else
    # it stays, and a longer prompt is refused at arrival (TensorRT-LLM's max_num_tokens check)
    unchunked_budget_covers_prompts = True
    # the memory share is of the memory left after weights, activations and the runtime's reserve (TensorRT-LLM's
    # free_gpu_memory_fraction), not of the whole device
    share_of_free_memory = False
    # a max_model_len whose request the KV pool cannot hold: None, refused at start (vLLM); else it starts with the
    # longest the pool holds less this many tokens (SGLang's max_req_len 1; TensorRT-LLM cuts its attention window
    # and max_seq_len to the pool: 0)
    max_len_short_of_pool: int | None = None
    # DP attention: each rank takes the engine's defaults (vLLM), so the group's are tp times them; else the group
    # takes them and divides them among its ranks (SGLang)
    defaults_per_rank = True
    # unset batch slots at most the step's tokens (vLLM: a request takes a token a step)
    caps_slots_at_budget = True
    dp_attention_slices_dense = False  # under DP attention, dense layers sliced over the group (SGLang)
    dp_attention_conservativeness: float | None = None  # schedule_conservativeness unset under DP attention
    default_slots: int | None = None  # a max_num_seqs the scheduler resolves from its KV pool (SGLang's cap)
    pd_pools: tuple[str, str] | None = None  # the prefill and decode schedulers of its P/D disaggregation
    # Release defaults, for replaying a published run of a given release (simulator/compare/measured.py):
    schedules_ahead_since = (0, 14, 0)  # planning a step while the one before runs
    full_prompt_gate_since: tuple[int, int, int] | None = None  # admitting a prompt only if all of it fits
    paced_client_since: tuple[int, int, int] | None = None  # its benchmark client pacing arrivals to the rate

    def batch_defaults(self, gpu: GpuSpec) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) the engine picks for `gpu`."""
        return vllm_batch_defaults(gpu)

    def graph_options(
        self, gpu: GpuSpec, engine: GraphLimits, tp: int, ep: bool, decode_query_len: int
    ) -> dict[str, Any]:
        """The `CostOptions` of the CUDA graphs the engine replays (vLLM V1's default FULL_AND_PIECEWISE mode; the
        schedulers of no engine of their own, sarathi, orca and static, run in it too): every step of up to
        max_cudagraph_capture_size tokens, decode or not, runs padded to the next of its cudagraph_capture_sizes
        (1, 2, 4, 8s below 256, then 16s, and the token budget if it is the largest), whose largest is by default
        min(2 x max_num_seqs x `decode_query_len`, 512; 1024 on data-center Blackwell), never past the token
        budget; when speculating, each rounded up to a multiple of the `decode_query_len` tokens a verifying
        request holds (adjust_cudagraph_sizes_for_spec_decode). Padding rows are routed to experts as real ones
        and get no logits (vLLM computes them outside the graph). Sizes the user lists (cudagraph_capture_sizes)
        replace the default list, those past the token budget dropped; under FULL_DECODE_ONLY a step that prefills
        runs eagerly."""
        budget = engine.max_num_batched_tokens
        if engine.cuda_graph_sizes is not None:
            sizes = {size for size in engine.cuda_graph_sizes if size <= budget}
            top = max(sizes, default=0)
        else:
            top = engine.cuda_graph_max_size
            if top is None:
                limit = VLLM_BLACKWELL_GRAPH_MAX_SIZE if gpu.datacenter_blackwell else VLLM_GRAPH_MAX_SIZE
                top = min(2 * engine.max_num_seqs * decode_query_len, limit)
            top = min(top, budget)
            sizes = {1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16), budget}
        if decode_query_len > 1 and top:
            rounded = {-(-size // decode_query_len) * decode_query_len for size in sizes}
            sizes = {size for size in rounded if size <= top}
            if not sizes:  # vLLM falls back to one verifying request's graph
                top = decode_query_len
                sizes = {top}
        return {
            "graph_sizes": tuple(sorted(size for size in sizes if size <= top)),
            "graph_prefills": engine.cuda_graph_mode != "full_decode_only",
        }

    def memory_share(self, gpu: GpuSpec, prefill_tokens: int, tp: int, pp: int, dp_attention: bool) -> float:
        """The default gpu_memory_utilization."""
        return VLLM_GPU_MEMORY_UTILIZATION

    def flashmla_block(self, gpu: GpuSpec) -> bool:
        """Whether an MLA model's KV blocks take FlashMLA's size on `gpu` (vLLM on Hopper and newer)."""
        return (gpu.compute_capability or 0) >= FLASHMLA_MIN_CAPABILITY

    def in_flight_batches(self, async_scheduling: bool, pp: int) -> int:
        """vLLM's max_concurrent_batches: steps scheduled whose tokens are not yet processed, 2 under async
        scheduling, pp with a pipeline's batch queue; vLLM sizes and admits sliding windows by it."""
        return 2 if async_scheduling else pp

    def offline_batch_defaults(self, gpu: GpuSpec, run: OfflineRun) -> tuple[int, int] | None:
        """(max_num_batched_tokens, max_num_seqs) of the engine's offline benchmark (bench latency and throughput)
        for `run`, if it picks its own."""
        return None

    def rank_share(self, value: int, ranks: int) -> int:
        """One DP-attention rank's share of the group's budget or slots: rounded up, as vLLM's launch command
        sets each rank's."""
        return -(-value // ranks)

    def dp_balancer(self):
        """How the engine's one API server picks a DP-attention rank per request: vLLM's, by the ranks' load."""
        from servesim.policies.data_parallel import VllmBalancer  # data_parallel imports this module

        return VllmBalancer()


class VllmFamily(EngineFamily):
    """vLLM (V1): its defaults and its own rules."""

    name = "vllm"
    null_block = True
    vllm_rules = True
    pd_pools = ("vllm_prefill", "vllm_decode")
    schedules_ahead_since = (0, 14, 0)  # async scheduling on by default (PR #27614)
    # scheduler_reserve_full_isl on by default (PR #37307, March 2026), the first release seen with it (0.10-0.11
    # admit on the first chunk's blocks)
    full_prompt_gate_since = (0, 19, 0)
    paced_client_since = (0, 10, 1)  # vllm bench serve paces its arrivals from this release on (PR #21108)

    def offline_batch_defaults(self, gpu: GpuSpec, run: OfflineRun) -> tuple[int, int] | None:
        """The `LLM` class's: 16384/8192 tokens where `vllm serve` takes 8192/2048."""
        return vllm_batch_defaults(gpu, offline=True)


class SglangFamily(EngineFamily):
    """SGLang: its server_args defaults, its memory split and its DP attention."""

    name = "sglang"
    scheduler = "sglang"
    label = "SGLang"
    kernel_tables = "sglang"
    prefix_caching = "radix"
    activations_in_share = False
    swa_pools = True
    full_kv_architectures = SGLANG_FULL_KV_ARCHITECTURES
    swaps = False
    caps_long_prefills = False
    vllm_graph_modes = False
    defaults_per_rank = False
    caps_slots_at_budget = False
    dp_attention_slices_dense = True
    dp_attention_conservativeness = SGLANG_DP_ATTENTION_CONSERVATIVENESS
    default_slots = SGLANG_MAX_RUNNING
    max_len_short_of_pool = 1
    schedules_ahead_since = (0, 4, 0)  # the overlap scheduler forms the next batch while one runs (PR #2067)

    def batch_defaults(self, gpu: GpuSpec) -> tuple[int, int]:
        return sglang_batch_defaults(gpu)

    def memory_share(self, gpu: GpuSpec, prefill_tokens: int, tp: int, pp: int, dp_attention: bool) -> float:
        return sglang_mem_fraction_static(gpu, prefill_tokens, tp, pp, dp_attention)

    def flashmla_block(self, gpu: GpuSpec) -> bool:
        return False

    def graph_options(
        self, gpu: GpuSpec, engine: GraphLimits, tp: int, ep: bool, decode_query_len: int
    ) -> dict[str, Any]:
        """SGLang's decode CUDA graphs (server_args._generate_cuda_graph_batch_sizes, 0.5.x, without speculation,
        which the sglang scheduler does not run): batch sizes 1, 2, 4, 8, 12, then 8s to 256, 16s to 512 and 32s
        on, up to cuda_graph_max_bs (by the GPU's memory and TP) and max_running_requests (captured itself); a
        decode batch is padded to the next, its logits too (trimmed after the replay). Steps that prefill run
        eagerly (piecewise graphs are off by default); under expert parallel the padding rows' routing is masked
        (num_token_non_padded). A list the user gives (cuda_graph_bs) replaces the default one."""
        if engine.cuda_graph_sizes is not None:
            sizes = sorted(set(engine.cuda_graph_sizes))
        else:
            _, _, small, large = _sglang_tier(gpu)
            top = engine.cuda_graph_max_size
            top = (small if tp < 4 else large) if top is None else top
            # past the slots plus one step of the list, the sizes give way to the slots: built no further
            top = min(top, engine.max_num_seqs + 32)
            sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, top + 1, 32)]
            sizes = [size for size in sizes if size <= top]
        if sizes and sizes[-1] > engine.max_num_seqs:
            sizes = [size for size in sizes if size < engine.max_num_seqs] + [engine.max_num_seqs]
        return {
            "graph_sizes": tuple(sizes),
            "graph_prefills": False,
            "graph_masks_experts": ep,
            "graph_pads_logits": True,
        }

    def in_flight_batches(self, async_scheduling: bool, pp: int) -> int:
        """SGLang sizes its pools by one batch, overlapped or not."""
        return 1

    def rank_share(self, value: int, ranks: int) -> int:
        """SGLang divides the group's itself (server_args: chunked_prefill_size // dp_size)."""
        return max(value // ranks, 1)

    def dp_balancer(self):
        """SGLang's data-parallel controller sends requests to the ranks in turn."""
        from servesim.policies.data_parallel import round_robin  # data_parallel imports this module

        return round_robin


class TrtllmFamily(EngineFamily):
    """TensorRT-LLM (`trtllm-serve`, PyTorch backend): in-flight batching under max_num_tokens, whole prompts by
    default, KV reserved for each request's whole sequence (GUARANTEED_NO_EVICT), and its KV pool a share of the
    memory left after the weights."""

    name = "trtllm"
    scheduler = "trtllm"
    label = "TensorRT-LLM"
    kernel_tables = "trtllm"
    swaps = False
    caps_long_prefills = False
    vllm_graph_modes = False
    offline_pads_graphs = True  # bench/benchmark/utils/general.py: enable_padding, max_batch_size its own
    block_size = TRTLLM_TOKENS_PER_BLOCK
    chunked_prefill = False  # TorchLlmArgs.enable_chunked_prefill
    unchunked_budget_covers_prompts = False
    share_of_free_memory = True
    # KVCacheManager._validate_and_adjust_attention_windows warns and cuts max_seq_len to the pool
    max_len_short_of_pool = 0
    caps_slots_at_budget = False  # max_batch_size stands as set (2048 by default)
    # one attention window for every layer unless max_attention_window lists them: gpt-oss-120b's startup log,
    # "kv size is 73728" (36 layers x 2 x 8 heads x 64 x 2 B) and "Adjusted max_attention_window_vec to [86720]"
    sliding_layers_whole = True
    schedules_ahead_since = (1, 0, 0)  # the PyTorch backend's overlap scheduler, on by default in 1.x

    def batch_defaults(self, gpu: GpuSpec) -> tuple[int, int]:
        return TRTLLM_BATCH_DEFAULTS

    def graph_options(
        self, gpu: GpuSpec, engine: GraphLimits, tp: int, ep: bool, decode_query_len: int
    ) -> dict[str, Any]:
        """Nothing padded by default: CudaGraphConfig.enable_padding is off, so a batch size not captured runs
        eagerly as it is. With padding (`cuda_graph_sizes`: its batch_sizes; `cuda_graph_max_size`: its
        max_batch_size, whence TensorRT-LLM 1.0-1.2 capture 1, 2, 4, 8s to 128, then powers of two and the largest),
        a generation-only batch runs padded with dummy requests to the next size, their logits and routing as real
        ones; the sizes past min(max_batch_size, max_num_tokens) give way to it (_filter_cuda_graph_batch_sizes).
        Batches with a context request run eagerly."""
        listed, top = engine.cuda_graph_sizes, engine.cuda_graph_max_size
        if listed is None:
            if not top:
                return {}
            listed = [1, 2, 4, *range(8, 129, 8), *(2**i for i in range(8, (top - 1).bit_length()))]
            listed = [size for size in listed if size < top] + [top]
        cap = min(engine.max_num_seqs, engine.max_num_batched_tokens)
        listed = sorted(set(listed))
        sizes = [size for size in listed if size <= cap]
        if len(sizes) < len(listed) and (not sizes or sizes[-1] != cap):
            sizes.append(cap)
        return {"graph_sizes": tuple(sizes), "graph_prefills": False, "graph_pads_logits": True}

    def memory_share(self, gpu: GpuSpec, prefill_tokens: int, tp: int, pp: int, dp_attention: bool) -> float:
        return TRTLLM_FREE_MEMORY_FRACTION

    def flashmla_block(self, gpu: GpuSpec) -> bool:
        return False

    def offline_batch_defaults(self, gpu: GpuSpec, run: OfflineRun) -> tuple[int, int] | None:
        """trtllm-bench's own sizing for the run's lengths (`trtllm_bench_limits`)."""
        return trtllm_bench_limits(run, gpu.reported_memory_bytes / 2**30)


#: The engines a replica can imitate, by the name run files and `servesim memory --engine` use.
families: Registry[EngineFamily] = Registry("engine")
GENERIC, VLLM, SGLANG, TRTLLM = EngineFamily(), VllmFamily(), SglangFamily(), TrtllmFamily()
families.register(VLLM.name)(VLLM)
families.register(SGLANG.name)(SGLANG)
families.register(TRTLLM.name)(TRTLLM)


def family_of(scheduler: str) -> EngineFamily:
    """The family of the scheduler registered (or importable) as `scheduler`; SpecError for an unknown one."""
    from servesim.policies.catalog import schedulers  # the schedulers import this module

    return schedulers.get(scheduler).family


def known_family(scheduler: str) -> EngineFamily | None:
    """`family_of`, or None for a name no scheduler answers to (reported where the scenario checks its policies)."""
    try:
        return family_of(scheduler)
    except SpecError:
        return None
