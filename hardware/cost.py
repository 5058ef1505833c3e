"""Roofline cost model: one engine step's batch -> predicted step time, with a per-operator breakdown.

Every operator (per layer group: QKV/O projections, attention, MLP or MoE experts, TP all-reduce;
per model: embedding and its all-reduce under TP, LM head and its logits gather, pipeline sends)
counts the FLOPs and HBM bytes one GPU of the replica moves, and takes
`max(flops / (peak * eff_c), bytes / (bandwidth * eff_m))` with the efficiencies of a calibration `Profile`.
The step adds fixed overheads. Pure functions only. A profile with measured kernel tables (`Profile.kernels`,
`hardware.kernel_tables`) prices the GEMMs, attention and all-reduces those tables hold from them instead (bound
"measured" in the breakdown; "measured (vllm)" where another engine's table stands in), and everything else with the
roofline.

Conventions (per GPU of a TP group): weights and query heads split by TP, KV heads split or
duplicated (see `kv_heads_per_rank`); MLA keeps its latent on every rank, expands K/V in prefill
and absorbs the up-projections in decode; embeddings and LM head stay bf16 when weights are quantized.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from servesim.hardware.batch import StepBatch
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import GpuSpec, get_interconnect
from servesim.hardware.kernel_tables import AttentionTable, KernelTables, kernel_tables
from servesim.hardware.model import (
    EXPERT_ONLY_DTYPES,
    KV_DTYPE_BYTES,
    WEIGHT_DTYPE_CHOICES,
    LayerSpec,
    ModelSpec,
    check_sharding,
    dtype_bytes,
    expert_padding,
    kv_heads_per_rank,
    resolve_weight_dtype,
    stage_layer_specs,
    weight_bytes,
)
from servesim.hardware.profile import Profile

ACT_BYTES = 2.0  # activations in bf16
LOGIT_BYTES = 4.0  # logits in fp32, as vLLM's sampler keeps them
# fp8 activations with an fp32 scale per 128-value group (DeepEP, DeepGEMM)
FP8_WITH_SCALE_BYTES = 1.0 + 4.0 / 128
#: The tensor-core dtype a weight dtype's GEMMs run in (weight-only w8a16, int4 and mxfp4 dequantize to bf16 in the
#: kernel; nvfp4 and mxfp8 run on FP4/FP8 tensor cores where the GPU has them, `GpuSpec.peak_for`).
GEMM_COMPUTE_DTYPE = {
    "bf16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "int8": "int8",
    "w8a16": "bf16",
    "int4": "bf16",
    "mxfp4": "bf16",
    "nvfp4": "fp4",
    "mxfp8": "fp8",
}


@dataclass(frozen=True, slots=True)
class Parallelism:
    """How one replica is sharded: tensor parallel ranks x pipeline stages.

    `ep`: MoE experts are spread whole over the TP group (expert parallel) instead of every expert being
    sliced across it; under DP attention tokens reach them by all-to-all. `dp_attention`: attention runs data
    parallel inside the group (each GPU attends for its own requests, with all heads and their KV, and the step
    lasts as long as the busiest GPU's: `rank_batches`; SGLang's DP attention for MLA models), hidden states are
    gathered for SGLang's sliced MLP. A TP group larger than a node talks over `inter_node_link` (per-GPU NIC
    rate). `dense_replicated` (with DP attention): the group is vLLM's data-parallel ranks at TP 1, so every weight
    but the routed experts (dense MLP layers, shared experts, embeddings, LM head) is whole on each GPU and runs on
    its own requests' tokens, with no collective outside the MoE layers; without it, SGLang's layout slices them
    over the group.
    """

    tp: int = 1
    pp: int = 1
    ep: bool = False
    dp_attention: bool = False
    inter_node_link: str = "ib-ndr-400"
    dense_replicated: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1:
            raise SpecError(f"tp and pp must be >= 1, got tp={self.tp} pp={self.pp}")
        if self.dense_replicated and not self.dp_attention:
            raise SpecError("dense_replicated describes vLLM's data-parallel ranks: it needs dp_attention")

    @property
    def dense_ranks(self) -> int:
        """GPUs a non-expert weight (dense MLP, shared experts, embeddings, LM head) is sliced over."""
        return 1 if self.dense_replicated else self.tp

    def dense_rows(self, rows: float, rank_rows: float) -> float:
        """Rows one GPU runs those weights on: every row of the step on its slice, or (vLLM's DP ranks) the busiest
        rank's own rows (`busiest_rank`) whole."""
        return rank_rows if self.dense_replicated else rows

    @property
    def attention_ranks(self) -> int:
        """GPUs attention is data parallel over, each with its own requests, their whole KV and every head: tp under
        DP attention, else 1 (every GPU attends for every request over its slice of the heads)."""
        return self.tp if self.dp_attention else 1

    def rank_batches(self, batch: StepBatch) -> list[StepBatch]:
        """The candidates for the requests whose attention-side work (attention, its projections, the per-step host
        work) one GPU does. Under DP attention each rank's engine (vLLM) or scheduler (SGLang) runs its own
        requests whole, in step with the others, so the step lasts as long as its busiest rank's: each labelled
        rank's requests (`StepBatch.rank`, as the simulator's ranks scheduled them; `busiest_rank` prices them
        and keeps the slowest), or for an unlabelled batch one rank of a deal (`StepBatch.busiest_rank`). Else
        every GPU works on every request."""
        if not self.dp_attention:
            return [batch]
        if batch.rank is not None:
            return batch.by_rank()
        return [batch.busiest_rank(self.attention_ranks)]

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True, slots=True)
class CostOptions:
    """Execution settings that change what a step moves or skips."""

    weight_dtype: str = "auto"  # the checkpoint's own (hardware.model.resolve_weight_dtype), or a dtype
    kv_dtype: str = "bf16"
    kv_sharing_fast_prefill: bool = False
    # Queries of up to this many tokens take attention's decode path (for MLA: absorbed, over the latent): vLLM's
    # reorder_batch_threshold, 1 + the draft tokens when speculating, so verify queries are decodes (FlashMLA).
    decode_query_len: int = 1
    # CUDA graphs the engine replays (`EngineFamily.graph_options`): a decode step of up to graph_sizes[-1] tokens
    # runs padded to the next size, and so does a step that prefills with `graph_prefills` (vLLM's piecewise
    # graphs); the padding rows pass every GEMM, norm and collective but no attention, and the routed experts
    # unless `graph_masks_experts` (SGLang masks their routing under expert parallel), and the LM head only with
    # `graph_pads_logits` (SGLang's decode graph computes their logits; vLLM's outside the graph does not).
    # Empty: run eagerly. The padded size depends only on the step's tokens and whether it prefills, which the step
    # timer's cache key holds.
    graph_sizes: tuple[int, ...] = ()
    graph_prefills: bool = False
    graph_masks_experts: bool = False
    graph_pads_logits: bool = False

    def __post_init__(self) -> None:
        if self.weight_dtype not in WEIGHT_DTYPE_CHOICES:
            raise SpecError(
                f"unknown weight dtype {self.weight_dtype!r}; allowed: {', '.join(WEIGHT_DTYPE_CHOICES)}"
            )
        dtype_bytes(KV_DTYPE_BYTES, self.kv_dtype, "KV")
        if self.decode_query_len < 1:
            raise SpecError(f"decode_query_len must be >= 1, got {self.decode_query_len}")
        if list(self.graph_sizes) != sorted(set(self.graph_sizes)) or min(self.graph_sizes, default=1) < 1:
            raise SpecError(f"graph_sizes must rise from >= 1, got {list(self.graph_sizes)}")

    def graphed(self, batch: StepBatch) -> bool:
        """Whether a step of `batch` replays a CUDA graph: one covers its tokens and, if it prefills, the engine
        graphs prefills."""
        return self.graphed_shape(batch.num_tokens, batch.max_query_len > self.decode_query_len)

    def graphed_shape(self, num_tokens: int, prefills: bool) -> bool:
        """`graphed` of a step of `num_tokens` tokens, one of whose queries is longer than a decode's if `prefills`."""
        sizes = self.graph_sizes
        return bool(sizes) and num_tokens <= sizes[-1] and (self.graph_prefills or not prefills)

    def graph_tokens(self, batch: StepBatch) -> int:
        """The rows `batch` runs its GEMMs on: its tokens, padded up to the CUDA graph it replays if one covers it."""
        if not self.graphed(batch):
            return batch.num_tokens
        return self.graph_sizes[bisect_left(self.graph_sizes, batch.num_tokens)]


#: Model-level operators of a pipeline's first stage (it embeds the tokens) and of its last (it computes the logits).
FIRST_STAGE_OPERATORS = frozenset({"embedding", "embedding_all_reduce", "model_extras"})
LAST_STAGE_OPERATORS = frozenset({"lm_head", "logits_gather"})


@dataclass(frozen=True, slots=True)
class OperatorCost:
    """One operator class summed over the layers it runs in. FLOPs and bytes are per GPU."""

    name: str
    kind: str  # gemm | moe (routed experts) | attention | elementwise | comm | overhead
    flops: float
    bytes: float
    time_s: float
    bound: str  # compute | memory | link | fixed
    layers: int

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte (0 when nothing moves)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "flops": self.flops,
            "bytes": self.bytes,
            "time_s": self.time_s,
            "bound": self.bound,
            "layers": self.layers,
            "intensity": self.intensity,
        }


@dataclass(frozen=True, slots=True)
class StepCost:
    """Predicted duration of one step and where it goes. Seconds."""

    operators: tuple[OperatorCost, ...]
    memory_bytes_per_s: float
    peak_flop_per_s: float
    # outside CUDA graphs the step lasts at least the host's launches (`Profile.eager_layer_s` x layers)
    eager_floor_s: float = 0.0

    @property
    def attention_s(self) -> float:
        return sum(op.time_s for op in self.operators if op.kind == "attention")

    @property
    def fixed_s(self) -> float:
        """Everything but attention: for a given token/request/logit count it does not depend on context."""
        return sum(op.time_s for op in self.operators if op.kind != "attention")

    @property
    def total_s(self) -> float:
        """`fixed_s + attention_s`, summed in this order everywhere so cached and stepped times agree exactly, or the
        eager floor if longer."""
        return max(self.fixed_s + self.attention_s, self.eager_floor_s)

    @property
    def hbm_bytes(self) -> float:
        return sum(
            op.bytes for op in self.operators if op.kind in ("gemm", "moe", "attention", "elementwise")
        )

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.operators)

    @property
    def floor_s(self) -> float:
        """Physics floor: HBM bytes moved / peak bandwidth (no step can be faster when memory-bound)."""
        return self.hbm_bytes / self.memory_bytes_per_s

    @property
    def bound(self) -> str:
        """'compute' if the step's FLOPs at peak take longer than its bytes at peak bandwidth, else 'memory'."""
        return "compute" if self.flops / self.peak_flop_per_s > self.floor_s else "memory"

    def by_name(self, name: str) -> OperatorCost:
        return next(op for op in self.operators if op.name == name)

    def as_dict(self) -> dict:
        return {
            "step_time_s": self.total_s,
            "floor_s": self.floor_s,
            "eager_floor_s": self.eager_floor_s,
            "bound": self.bound,
            "flops": self.flops,
            "hbm_bytes": self.hbm_bytes,
            "operators": [op.as_dict() for op in self.operators],
        }


# ---- batch statistics ---------------------------------------------------------------------------


def causal_keys(num_new: np.ndarray, num_context: np.ndarray, window: int | None) -> np.ndarray:
    """Keys attended, summed over each request's new tokens (causal; a sliding window caps each at `window`).

    Integer arithmetic, so sums are exact and the same however the batch is split.
    """
    n, c = num_new.astype(np.int64), num_context.astype(np.int64)
    if window is None:
        return n * c + n * (n + 1) // 2
    first = c + 1  # keys seen by the first new token
    uncapped = np.clip(np.minimum(c + n, window) - first + 1, 0, None)  # new tokens that see < window keys
    return uncapped * (2 * first + uncapped - 1) // 2 + (n - uncapped) * window


def kv_read_tokens(num_new: np.ndarray, num_context: np.ndarray, window: int | None) -> np.ndarray:
    """Distinct cached+new tokens whose K/V one request's attention reads."""
    total = (num_context + num_new).astype(np.int64)
    return total if window is None else np.minimum(total, window + num_new - 1)


SMALL_BATCH = 64  # requests up to which a step's sums are faster in plain Python than in numpy


@dataclass(frozen=True, slots=True)
class _AttnStats:
    tokens: int
    requests: int
    keys: int  # summed causal keys
    kv_read: int  # summed distinct KV tokens read
    expand_tokens: int  # MLA prefill: latents expanded to K/V (context + new of prefill requests)


def _attn_stats(batch: StepBatch, window: int | None, decode_query_len: int) -> tuple[_AttnStats, _AttnStats]:
    """Sums over the requests whose queries take the decode path (up to `decode_query_len` tokens), then over the
    others."""
    if batch.num_requests <= SMALL_BATCH:  # plain Python beats numpy here; integer sums are identical
        decode, prefill = _paired_stats(
            batch.num_new.tolist(), batch.num_context.tolist(), window, decode_query_len
        )
        return _AttnStats(*decode), _AttnStats(*prefill)
    paths = []
    for mask in (batch.num_new <= decode_query_len, batch.num_new > decode_query_len):
        n, c = batch.num_new[mask], batch.num_context[mask]
        paths.append(
            _AttnStats(
                int(n.sum()),
                int(mask.sum()),
                int(causal_keys(n, c, window).sum()),
                int(kv_read_tokens(n, c, window).sum()),
                int((n + c).sum()),
            )
        )
    return paths[0], paths[1]


def _paired_stats(
    num_new: Sequence[int], num_context: Sequence[int], window: int | None, decode_query_len: int
) -> tuple[list[int], list[int]]:
    """`_AttnStats`' fields (tokens, requests, keys, KV read, expanded tokens) of the decode path and of the
    prefill path, in one pass in plain Python (for a few requests it beats numpy; integer sums are identical)."""
    sums = [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    for n, c in zip(num_new, num_context):
        path = sums[0 if n <= decode_query_len else 1]
        path[0] += n
        path[1] += 1
        path[4] += n + c
        if window is None:
            path[2] += n * c + n * (n + 1) // 2
            path[3] += c + n
        else:
            uncapped = max(min(c + n, window) - c, 0)
            path[2] += uncapped * (2 * c + 1 + uncapped) // 2 + (n - uncapped) * window
            path[3] += min(c + n, window + n - 1)
    return sums[0], sums[1]


# ---- layer groups -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Group:
    """Layers that cost the same: same attention window, KV ownership, token reduction and MLP."""

    window: int | None
    owns_kv: bool
    last_token_only: bool
    is_moe: bool
    mlp_intermediate: int
    extra_linear_params: int


_GROUPS: dict[tuple[int, bool], tuple[ModelSpec, tuple[_Group, ...], tuple[tuple[_Group, int], ...]]] = {}


def _groups_of(
    model: ModelSpec, fast_prefill: bool
) -> tuple[tuple[_Group, ...], tuple[tuple[_Group, int], ...]]:
    """Each layer's group, and each group with its number of layers. Memoized by object identity: hashing a
    ModelSpec walks every layer, too slow for every step."""
    hit = _GROUPS.get((id(model), fast_prefill))
    if hit is not None and hit[0] is model:
        return hit[1], hit[2]

    def key(layer: LayerSpec) -> _Group:
        return _Group(
            layer.window if layer.attention == "sliding" else None,
            layer.owns_kv,
            fast_prefill and not layer.owns_kv and _trailing_shared(model, layer.index),
            layer.is_moe,
            layer.mlp_intermediate,
            layer.extra_linear_params,
        )

    by_layer = tuple(key(layer) for layer in model.layers)
    groups = tuple(Counter(by_layer).items())
    _GROUPS[(id(model), fast_prefill)] = (model, by_layer, groups)
    return by_layer, groups


def _layer_groups(model: ModelSpec, fast_prefill: bool) -> tuple[tuple[_Group, int], ...]:
    return _groups_of(model, fast_prefill)[1]


def _trailing_shared(model: ModelSpec, index: int) -> bool:
    """YOCO fast prefill applies only to KV-sharing layers after the last KV-owning layer."""
    return all(not layer.owns_kv for layer in model.layers[index:])


def fast_prefill_layers(model: ModelSpec) -> int:
    """Layers that run on one token per request under `kv_sharing_fast_prefill`."""
    return sum(_trailing_shared(model, layer.index) for layer in model.layers if not layer.owns_kv)


def mixed_attention_layers(batch: StepBatch, model: ModelSpec, options: CostOptions = CostOptions()) -> int:
    """Layers whose attention runs decodes beside prefill chunks in this step (so both attention paths):
    every layer of a mixed batch, but YOCO's fast-prefill layers, which see one query per request. Queries are
    told apart by length (`options.decode_query_len`), as vLLM's reorder_batch_threshold does."""
    if not batch.is_mixed(options.decode_query_len):
        return 0
    return sum(
        layers
        for group, layers in _layer_groups(model, options.kv_sharing_fast_prefill)
        if not group.last_token_only
    )


def cross_decoder_layers(batch: StepBatch, model: ModelSpec, options: CostOptions = CostOptions()) -> int:
    """Layers that run YOCO's cross-decoder path in this step: the fast-prefill layers when a query is longer than
    a decode's (an all-decode step runs them as every other layer), on their own attention metadata."""
    if not options.kv_sharing_fast_prefill or batch.max_query_len <= options.decode_query_len:
        return 0
    return fast_prefill_layers(model)


# ---- pricing ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ctx:
    model: ModelSpec
    gpu: GpuSpec
    par: Parallelism
    opts: CostOptions
    profile: Profile
    tokens: (
        float  # token rows the operators priced with this context process: the efficiency curves' argument
    )
    weight_dtype: str  # resolved (never "auto")
    wbytes: float  # bytes per weight of attention, dense MLP and extras
    expert_wbytes: float  # bytes per routed-expert weight (differs under expert-only dtypes: mxfp4)
    rank: StepBatch  # the requests one GPU attends for (`busiest_rank`): the step's, or its busiest rank's
    peak: tuple[int, int]  # the most tokens and requests one rank exchanges (`rank_peaks`)
    # measured kernel latencies for this GPU and engine, if the profile names them
    kernels: KernelTables | None

    def with_tokens(self, tokens: float) -> _Ctx:
        tokens = float(max(tokens, 1))
        if tokens == self.tokens:
            return self
        # `dataclasses.replace(self, tokens=tokens)` spelled out: this runs per operator priced, and replace reads
        # the fields each time
        return _Ctx(
            model=self.model,
            gpu=self.gpu,
            par=self.par,
            opts=self.opts,
            profile=self.profile,
            tokens=tokens,
            weight_dtype=self.weight_dtype,
            wbytes=self.wbytes,
            expert_wbytes=self.expert_wbytes,
            rank=self.rank,
            peak=self.peak,
            kernels=self.kernels,
        )

    @property
    def kvbytes(self) -> float:
        return KV_DTYPE_BYTES[self.opts.kv_dtype]

    def gemm_s(
        self, flops: float, nbytes: float, dtype: str | None = None, kind: str = "gemm"
    ) -> tuple[float, float]:
        """(compute seconds, memory seconds) of a GEMM (or, kind "moe", routed experts) at the profile's
        efficiencies."""
        peak = self.gpu.peak_for(dtype or GEMM_COMPUTE_DTYPE[self.weight_dtype])
        compute, memory = self.profile.curves(kind)
        return (
            flops / (peak * compute.at(self.tokens)),
            nbytes / (self.gpu.memory_bytes_per_s * memory.at(self.tokens)),
        )

    @property
    def table_dtype(self) -> str:
        """The dense weights' dtype as the kernel tables tell kernels apart: a block-quantized checkpoint's fp8 is
        `fp8_block`; an expert-only dtype (mxfp4) leaves the dense layers in bf16."""
        m = self.model
        if self.weight_dtype in EXPERT_ONLY_DTYPES:
            return "bf16"
        return (
            "fp8_block"
            if self.weight_dtype == "fp8" == m.quantization and m.block_quantized
            else self.weight_dtype
        )

    @property
    def expert_table_dtype(self) -> str:
        """The routed experts' dtype as the MoE tables tell kernels apart."""
        return self.weight_dtype if self.weight_dtype in EXPERT_ONLY_DTYPES else self.table_dtype

    def measured_gemms(
        self,
        rows: float,
        shapes: tuple[tuple[float, float], ...],
        dtype: str | None = None,
        quantized_inputs: tuple[bool, ...] = (),
    ) -> float | None:
        """Seconds of the measured GEMMs of `rows` rows, one per (out, in) shape, run one after another; None
        unless the tables hold every one. `quantized_inputs` marks the shapes whose input the kernel before can emit
        in the weights' low precision (attention's output, the gated activation's), as engines fusing the
        quantization there run them."""
        if self.kernels is None or "gemm" not in self.profile.kernel_ops:
            return None
        dtype = dtype or self.table_dtype
        total = 0.0
        for i, (n, k) in enumerate(shapes):
            quantized = i < len(quantized_inputs) and quantized_inputs[i]
            time_s = self.kernels.gemm_s(dtype, rows, n, k, quantized, self._gemm_floor_s(dtype, rows, n, k))
            if time_s is None:
                return None
            total += time_s
        return total

    def gemm_source(self, dtype: str | None = None) -> str:
        """What the breakdown calls a measured GEMM's source: "measured", naming the engine whose table stands in
        where it is not the scenario's own."""
        if self.kernels is None:
            return "measured"
        engine = self.kernels.gemm_engine(dtype or self.table_dtype)
        return "measured" if engine == self.kernels.framework else f"measured ({engine})"

    def _gemm_floor_s(self, dtype: str, rows: float, n: float, k: float) -> float:
        """A GEMM's roofline at peak compute and bandwidth: what a table lookup less measured parts stays above."""
        if dtype not in GEMM_COMPUTE_DTYPE:
            return 0.0
        flops_s = 2 * rows * n * k / self.gpu.peak_for(GEMM_COMPUTE_DTYPE[dtype])
        return max(flops_s, (n * k * self.wbytes + rows * (n + k) * ACT_BYTES) / self.gpu.memory_bytes_per_s)


@dataclass(frozen=True, slots=True)
class OperatorTerm:
    """One operator of one layer group (or of the model level), for ONE layer: FLOPs and bytes per GPU,
    seconds bound by compute and by memory at the profile's efficiencies (0 for communication), the
    priced time (`max` of the two, or the link time for `comm`), which bound won, how many layers
    run it, and the token rows at which the profile's efficiencies were read (the step's tokens; the
    logits rows for the LM head; one per request in YOCO fast-prefill layers). `step_cost` sums
    `time_s * layers` of these per operator name."""

    name: str
    kind: str  # gemm | moe (routed experts) | attention | elementwise | comm
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    time_s: float
    bound: str  # compute | memory | link | measured[ (engine)] (a kernel table's latency, not the roofline's)
    layers: int
    tokens: float


class _Terms:
    """Collects the OperatorTerms of one step in pricing order."""

    def __init__(self) -> None:
        self.terms: list[OperatorTerm] = []

    def add(
        self,
        ctx: _Ctx,
        name: str,
        kind: str,
        flops: float,
        nbytes: float,
        roof: tuple[float, float],
        layers: int,
        measured: float | None = None,
        source: str = "measured",
    ) -> None:
        """`measured`: the kernel tables' seconds, which price the term when given (the roofline's stay beside),
        `source` its bound in the breakdown."""
        compute_s, memory_s = roof
        if measured is not None:
            time_s, bound = measured, source
        else:
            time_s, bound = (compute_s, "compute") if compute_s > memory_s else (memory_s, "memory")
        self.terms.append(
            OperatorTerm(name, kind, flops, nbytes, compute_s, memory_s, time_s, bound, layers, ctx.tokens)
        )

    def add_link(
        self, ctx: _Ctx, name: str, nbytes: float, time_s: float, layers: int, measured: float | None = None
    ) -> None:
        bound = "link" if measured is None else "measured"
        time_s = time_s if measured is None else measured
        self.terms.append(
            OperatorTerm(name, "comm", 0.0, nbytes, 0.0, 0.0, time_s, bound, layers, ctx.tokens)
        )


class _Acc:
    """Sums operator FLOPs/bytes/time over layer groups, keeping one entry per operator name."""

    def __init__(self) -> None:
        self.ops: dict[str, list] = {}

    def add(
        self, name: str, kind: str, flops: float, nbytes: float, timed: tuple[float, str], layers: int
    ) -> None:
        time_s, bound = timed
        entry = self.ops.setdefault(name, [kind, 0.0, 0.0, 0.0, Counter(), 0])
        entry[1] += flops * layers
        entry[2] += nbytes * layers
        entry[3] += time_s * layers
        entry[4][bound] += time_s * layers
        entry[5] += layers

    def result(self) -> tuple[OperatorCost, ...]:
        return tuple(
            OperatorCost(
                name, kind, flops, nbytes, time_s, bounds.most_common(1)[0][0] if bounds else "fixed", layers
            )
            for name, (kind, flops, nbytes, time_s, bounds, layers) in self.ops.items()
        )


def _qkv_o_params(ctx: _Ctx) -> tuple[float, float, float]:
    """(QKV projection params, O projection params, MLA K/V up-projection params) per TP rank (all of them
    under DP attention, where each GPU runs the whole attention for its share of the requests)."""
    m, tp = ctx.model, 1 if ctx.par.dp_attention else ctx.par.tp
    h = m.hidden_size
    if m.mla:
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = (
            h * m.num_heads * qk / tp
            if a.q_lora_rank is None
            else h * a.q_lora_rank + a.q_lora_rank * m.num_heads * qk / tp
        )
        kv_a = h * (a.kv_lora_rank + a.qk_rope_head_dim)  # replicated on every rank
        return q + kv_a, m.num_heads * a.v_head_dim * h / tp, m.mla_up_params() / tp
    q_dim = m.num_heads * m.head_dim / tp
    kv_dim = kv_heads_per_rank(m.num_kv_heads, tp) * m.head_dim
    return h * (q_dim + 2 * kv_dim), q_dim * h, 0.0


def _attention_dims(model: ModelSpec, decode: bool) -> tuple[int, int]:
    """(query-key dim, value dim) per head: MLA absorbs in decode (every head attends over the shared
    latent, "MQA with a wide head") and expands K/V from the latent in prefill."""
    if model.mla and decode:
        return model.mla.kv_lora_rank + model.mla.qk_rope_head_dim, model.mla.kv_lora_rank
    if model.mla:
        return model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim, model.mla.v_head_dim
    return model.head_dim, model.head_dim


def attention_terms(ctx: _Ctx, owns_kv: bool, decode: bool, keys, kv_read, tokens, efficiency=None):
    """(FLOPs, bytes, compute seconds, memory seconds) of one layer's attention over summed batch stats.

    Works elementwise on numpy arrays too (one entry per step of a decode stretch) with the very same
    operations, so a fast-forwarded step costs bit-for-bit what a stepped one does. `efficiency`: the (compute,
    memory) efficiencies, per step where steps differ in size; None: the profile's at `ctx.tokens`.
    """
    m = ctx.model
    qk_dim, v_dim = _attention_dims(m, decode)
    # all heads over the busiest rank's requests (the stats given) and their whole KV
    if ctx.par.dp_attention:
        heads, kv_values = m.num_heads, m.kv_values_per_token_per_layer(1)
    else:
        heads, kv_values = m.num_heads / ctx.par.tp, m.kv_values_per_token_per_layer(ctx.par.tp)
    flops = 2 * heads * (qk_dim + v_dim) * keys
    written = tokens * kv_values * ctx.kvbytes if owns_kv else 0.0
    nbytes = kv_read * kv_values * ctx.kvbytes + written + tokens * heads * (qk_dim + v_dim) * ACT_BYTES
    if m.mla and not decode:  # each key's K and V, expanded from its latent by mla_kv_up, read back
        nbytes = nbytes + kv_read * heads * (qk_dim + v_dim) * ACT_BYTES
    if efficiency is None:
        efficiency = ctx.profile.attn_compute.at(ctx.tokens), ctx.profile.attn_memory.at(ctx.tokens)
    compute_s = flops / (ctx.gpu.peak_for("bf16") * efficiency[0])
    memory_s = nbytes / (ctx.gpu.memory_bytes_per_s * efficiency[1])
    return flops, nbytes, compute_s, memory_s


def _attention_table(ctx: _Ctx, window: int | None, decode: bool) -> AttentionTable | None:
    """The kernel tables' attention of this model's layers on one GPU, or None (MLA's latent attention is left to
    the roofline)."""
    m = ctx.model
    if ctx.kernels is None or m.mla is not None or "attention" not in ctx.profile.kernel_ops:
        return None
    if ctx.par.dp_attention:
        heads, kv_heads = m.num_heads, m.num_kv_heads
    else:
        heads, kv_heads = m.num_heads / ctx.par.tp, kv_heads_per_rank(m.num_kv_heads, ctx.par.tp)
    return ctx.kernels.attention(decode, ctx.opts.kv_dtype, heads, kv_heads, m.head_dim, window)


def _table_length(window: int | None, decode: bool, requests: int, kv_read: int, keys: int) -> float:
    """The tables time `requests` alike requests, so a step's are taken as that many of their mean: decodes over the
    mean KV tokens read, prefills of the causal length whose keys (as `causal_keys` counts them, window-capped) are
    the mean, which keeps a chunk's attention over its cached context.

    That fresh prefill's time keeps the chunk's FLOPs, not its reads: a short chunk over a long cached context reads
    all of it, so a prefill priced from the tables takes at least its bytes at the full HBM bandwidth
    (`measured_attention`)."""
    if decode:
        return kv_read / requests
    mean = keys / requests
    if window is None or mean <= window * (window + 1) / 2:
        return (math.sqrt(1 + 8 * mean) - 1) / 2
    return window + (mean - window * (window + 1) / 2) / window


def measured_attention(
    ctx: _Ctx, window: int | None, decode: bool, requests: int, kv_read: int, keys: int, nbytes: float
) -> float | None:
    """One layer's attention from the kernel tables, or None; a prefill's at least its `nbytes` (`attention_terms`)
    at the full HBM bandwidth (`_table_length` says why)."""
    table = _attention_table(ctx, window, decode)
    if table is None:
        return None
    seconds = table.seconds(requests, _table_length(window, decode, requests, kv_read, keys))
    if seconds is None or decode:
        return seconds
    return max(seconds, nbytes / ctx.gpu.memory_bytes_per_s)


def _attention(
    ctx: _Ctx, acc: _Terms, batch: StepBatch, group: _Group, layers: int, attention: bool = True
) -> None:
    """`batch`: the requests one GPU attends for (`busiest_rank`), as the layer group sees them. Without
    `attention`, only MLA's K/V up-projection (a GEMM)."""
    m, ctx = ctx.model, ctx.with_tokens(batch.num_tokens)
    if not attention and not m.mla:
        return
    for decode, s in zip((True, False), _attn_stats(batch, group.window, ctx.opts.decode_query_len)):
        if not s.requests:
            continue
        if attention:
            flops, nbytes, compute_s, memory_s = attention_terms(
                ctx, group.owns_kv, decode, s.keys, s.kv_read, s.tokens
            )
            measured = measured_attention(ctx, group.window, decode, s.requests, s.kv_read, s.keys, nbytes)
            acc.add(
                ctx,
                "attention_decode" if decode else "attention_prefill",
                "attention",
                flops,
                nbytes,
                (compute_s, memory_s),
                layers,
                measured,
            )
        if m.mla:  # K/V up-projection: on the queries/outputs when absorbed, on every latent when expanded
            _, _, up = _qkv_o_params(ctx)
            rows = s.tokens if decode else s.expand_tokens
            # absorbed, it runs as bf16 batched GEMMs on bf16 copies of the weights (memory.absorbed_copy_bytes)
            wbytes, compute = (ACT_BYTES, "bf16") if decode else (ctx.wbytes, None)
            flops, nbytes = 2 * rows * up, up * wbytes + rows * up / m.mla.kv_lora_rank * ACT_BYTES
            acc.add(ctx, "mla_kv_up", "gemm", flops, nbytes, ctx.gemm_s(flops, nbytes, compute), layers)


def _expected_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Distinct experts touched by `tokens` tokens under uniform routing: E * (1 - (1 - k/E)^T)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def _mlp(
    ctx: _Ctx, acc: _Terms, tokens: float, rank_tokens: float, group: _Group, layers: int, routed: float
) -> None:
    """`tokens`: the step's; `rank_tokens`: the busiest DP-attention rank's (`busiest_rank`); `routed`: those the
    routed experts take (padding rows masked or not)."""
    m, tp, h = ctx.model, ctx.par.tp, ctx.model.hidden_size
    if group.is_moe:
        moe = m.moe
        expert = m.expert_params() / tp
        # routed experts: the fused-MoE kernel, priced with the moe curves (the GEMM ones unless a profile sets them)
        touched = _expected_experts(moe.num_experts, moe.experts_per_token, routed)
        flops = 2 * routed * moe.experts_per_token * expert * expert_padding(m, ctx.weight_dtype)
        nbytes = touched * expert * ctx.expert_wbytes + 2 * routed * h * ACT_BYTES
        measured = None
        routing = ctx.with_tokens(routed)
        # every token: sliced over TP or on EP ranks
        if ctx.kernels is not None and ("moe" in ctx.profile.kernel_ops or ctx.profile.moe_tables):
            moe_tp, moe_ep = (1, tp) if ctx.par.ep else (tp, 1)
            measured = ctx.kernels.moe_s(
                ctx.expert_table_dtype,
                routed,
                h,
                moe.expert_intermediate,
                moe.experts_per_token,
                moe.num_experts,
                moe_tp,
                moe_ep,
                ctx.gpu.datacenter_blackwell,
            )
        compute_s, memory_s = routing.gemm_s(flops, nbytes, kind="moe")
        # the kernel's fixed costs: per layer, and per expert it runs on this GPU (whole under EP, a slice under TP)
        fixed = ctx.profile.moe_layer_s + (touched / tp if ctx.par.ep else touched) * ctx.profile.moe_expert_s
        moe_s = (compute_s + fixed, memory_s + fixed)
        acc.add(routing, "moe", "moe", flops, nbytes, moe_s, layers, measured)
        # the router's logits and any shared experts are dense GEMMs beside it; under DeepEP (expert parallel over
        # DP attention) and on vLLM's DP ranks every GPU holds the shared experts whole and runs them on its own
        # rank's tokens
        whole = ctx.par.dp_attention and (ctx.par.ep or ctx.par.dense_replicated)
        shared = moe.num_shared_experts * m.expert_params() / (1 if whole else tp)
        shared_rows = rank_tokens if whole else tokens
        flops = 2 * shared_rows * shared + 2 * ctx.par.dense_rows(tokens, rank_tokens) * h * moe.num_experts
        nbytes = shared * ctx.expert_wbytes + h * moe.num_experts * ACT_BYTES
        gemm = ctx.with_tokens(shared_rows)
        acc.add(gemm, "moe_router_shared", "gemm", flops, nbytes, gemm.gemm_s(flops, nbytes), layers)
    # dense weights run on every row, or on vLLM's DP ranks whole on each GPU's own rows: the curves read there
    ranks, rows = ctx.par.dense_ranks, ctx.par.dense_rows(tokens, rank_tokens)
    dense = ctx.with_tokens(rows)
    if not group.is_moe:
        params = m.dense_mlp_params(group.mlp_intermediate) / ranks
        flops = 2 * rows * params
        nbytes = params * ctx.wbytes + rows * (2 * h + 3 * group.mlp_intermediate / ranks) * ACT_BYTES
        width = group.mlp_intermediate / ranks  # up (with its gate, fused) then down
        measured = dense.measured_gemms(
            rows, (((2 if m.gated_mlp else 1) * width, h), (h, width)), quantized_inputs=(False, True)
        )
        roof, source = dense.gemm_s(flops, nbytes), dense.gemm_source()
        acc.add(dense, "mlp", "gemm", flops, nbytes, roof, layers, measured, source)
    if group.extra_linear_params:
        params = group.extra_linear_params / ranks
        acc.add(
            dense,
            "layer_extras",
            "gemm",
            2 * rows * params,
            params * ctx.wbytes,
            dense.gemm_s(2 * rows * params, params * ctx.wbytes),
            layers,
        )


def _group_link(ctx: _Ctx, gpus: int):
    """The link a group of `gpus` GPUs talks over: NVLink/xGMI inside a node (PCIe for more cards than a bridge
    joins: a ring over 4 bridged PCIe cards crosses PCIe between the pairs), the node's NICs across nodes."""
    if gpus > ctx.gpu.gpus_per_node:
        return get_interconnect(ctx.par.inter_node_link)
    link = get_interconnect(ctx.gpu.intra_node_link)
    if link.max_gpus is not None and gpus > link.max_gpus:
        return get_interconnect(f"pcie{ctx.gpu.pcie_gen}")
    return link


#: Collectives below ~64 MB do not reach a link's rate: launch, synchronisation and few active channels
#: dominate. Measured on 8x H100 (vLLM's custom all-reduce; sgl-project/sglang PR #2904): 4-7 us
#: + (bus bytes) / ~60 GB/s from 32 KB to 1 MB messages (up to ~2 MB of bus bytes) at TP 2, 4 and 8,
#: i.e. ~13% of NVLink4's 450 GB/s, while NCCL reaches ~70-80% on large messages. The size factor
#: scales `profile.comm` (the large-message efficiency) between these, linearly in log(bytes).
SMALL_COLLECTIVE = (2e6, 0.19)  # (bus bytes, factor): 0.19 x 0.70 = 13% of the link rate
LARGE_COLLECTIVE = 64e6


def collective_size_factor(bus_bytes: float) -> float:
    """How much of `profile.comm` a collective moving `bus_bytes` per GPU reaches (1 for large messages)."""
    small, floor = SMALL_COLLECTIVE
    if bus_bytes <= small:
        return floor
    if bus_bytes >= LARGE_COLLECTIVE:
        return 1.0
    return floor + (1.0 - floor) * math.log(bus_bytes / small) / math.log(LARGE_COLLECTIVE / small)


def _collective_s(ctx: _Ctx, bus_bytes: float, ring_steps: int) -> float:
    """A collective over the TP group's link. Inside a node (NVLink/xGMI/PCIe switch) a small collective is
    one kernel: the link's latency (the catalog's small-collective latency) once. Across nodes it is a
    ring: one network latency per step."""
    link = _group_link(ctx, ctx.par.tp)
    steps = 1 if ctx.par.tp <= ctx.gpu.gpus_per_node else ring_steps
    rate = link.bytes_per_s * ctx.profile.comm.at(ctx.tokens) * collective_size_factor(bus_bytes)
    return bus_bytes / rate + steps * link.latency_s


def _all_reduce_s(ctx: _Ctx, nbytes: float) -> float:
    """All-reduce of `nbytes` per GPU: 2(TP-1)/TP of the message crosses each GPU's link (ring bus bytes)."""
    tp = ctx.par.tp
    return _collective_s(ctx, 2 * (tp - 1) / tp * nbytes, 2 * (tp - 1))


def _measured_all_reduce(ctx: _Ctx, nbytes: float) -> float | None:
    """The engine's own all-reduce of `nbytes` over the TP group, as the kernel tables measured it inside a node."""
    if (
        ctx.kernels is None
        or ctx.par.tp > ctx.gpu.gpus_per_node
        or "all_reduce" not in ctx.profile.kernel_ops
    ):
        return None
    return ctx.kernels.all_reduce_s(ctx.par.tp, nbytes)


def _all_to_all_s(ctx: _Ctx, nbytes: float) -> float:
    """All-to-all of `nbytes` per GPU: (TP-1)/TP of it leaves each GPU (the bus bytes of a ring all-gather or
    reduce-scatter of `nbytes` too)."""
    tp = ctx.par.tp
    return _collective_s(ctx, (tp - 1) / tp * nbytes, tp - 1)


def _layer_group(
    ctx: _Ctx, acc: _Terms, batch: StepBatch, group: _Group, layers: int, attention: bool = True
) -> None:
    seen, rank = _group_batch(batch, group), _group_batch(ctx.rank, group)
    # the fullest rank's rows: one a request if reduced
    peak = ctx.peak[1] if seen is not batch else ctx.peak[0]
    # a reduced (YOCO) group's rows are padded to a graph of their own only within a graphed step
    pad = _graph_padding(ctx, seen) if seen is batch or ctx.opts.graphed(batch) else 0
    batch = seen
    ctx = ctx.with_tokens(batch.num_tokens + pad)
    tokens, rows, h = float(batch.num_tokens + pad), float(rank.num_tokens + pad), ctx.model.hidden_size
    qkv, o, _ = _qkv_o_params(ctx)
    out_dim = qkv / h  # under DP attention the busiest rank's rows with whole weights
    local = ctx.with_tokens(rows)  # the projections' rows on this GPU: the curves read there
    # MLA's projections are low-rank pairs the GEMM tables are not looked up for
    plain = ctx.model.mla is None
    acc.add(
        local,
        "qkv_proj",
        "gemm",
        2 * rows * qkv,
        qkv * ctx.wbytes + rows * (h + out_dim) * ACT_BYTES,
        local.gemm_s(2 * rows * qkv, qkv * ctx.wbytes + rows * (h + out_dim) * ACT_BYTES),
        layers,
        local.measured_gemms(rows, ((out_dim, h),)) if plain else None,
        local.gemm_source(),
    )
    _attention(ctx, acc, rank, group, layers, attention)
    acc.add(
        local,
        "o_proj",
        "gemm",
        2 * rows * o,
        o * ctx.wbytes + 2 * rows * h * ACT_BYTES,
        local.gemm_s(2 * rows * o, o * ctx.wbytes + 2 * rows * h * ACT_BYTES),
        layers,
        local.measured_gemms(rows, ((h, o / h),), quantized_inputs=(True,)) if plain else None,
        local.gemm_source(),
    )
    routed = tokens - pad if ctx.opts.graph_masks_experts else tokens
    _mlp(ctx, acc, tokens, rows, group, layers, routed)
    if ctx.profile.elementwise_kernels:
        _elementwise(local, acc, rows, out_dim, group, layers)
    if ctx.par.tp > 1:
        _layer_comm(ctx, acc, tokens, peak, group, layers, batch.max_query_len > ctx.opts.decode_query_len)


def _elementwise(ctx: _Ctx, acc: _Terms, rows: float, qkv_dim: float, group: _Group, layers: int) -> None:
    """A layer's memory-bound elementwise kernels on this GPU's rows (`Profile.elementwise_kernels`): two residual
    adds fused with RMSNorm (each reads the hidden state and residual and writes both), the rotary embedding over
    the projected heads (in and out) and, in dense layers, the gated activation (2 x width in, width out; a MoE
    layer's is inside its fused kernel)."""
    h, profile = ctx.model.hidden_size, ctx.profile
    width = 0.0 if group.is_moe else group.mlp_intermediate / ctx.par.dense_ranks
    nbytes = rows * ACT_BYTES * (2 * 4 * h + 2 * qkv_dim + 3 * width)
    memory_s = (
        nbytes / (ctx.gpu.memory_bytes_per_s * profile.gemm_memory.at(ctx.tokens))
        + profile.elementwise_kernels * profile.elementwise_latency_s
    )
    acc.add(ctx, "elementwise", "elementwise", 0.0, nbytes, (0.0, memory_s), layers)


def _layer_comm(
    ctx: _Ctx, acc: _Terms, tokens: float, peak_tokens: float, group: _Group, layers: int, extend: bool
) -> None:
    """Per layer over the TP group: an all-reduce after attention (an all-gather of the hidden states under DP
    attention, the same bytes as SGLang sends it) and one after the MLP. On vLLM's data-parallel ranks only the
    MoE layers talk: without expert parallel they all-gather the group's hidden states and router logits and
    reduce-scatter the experts' outputs (vLLM's default allgather_reducescatter backend; ring collectives, each
    (tp-1)/tp of its bytes over each GPU's link). Expert parallel without DP attention
    changes nothing here: every GPU holds every token, runs its own whole experts on those routed to them,
    and the all-reduce sums their outputs (vLLM's EP at DP size 1). Under DP attention an expert-parallel MoE
    layer keeps each GPU's own tokens there and sends them to their experts and back instead (the fullest rank's
    `peak_tokens` bound the exchange, whichever rank attends longest):
    DeepEP's dispatch and combine as SGLang's `auto` mode picks them (vLLM's DP ranks too: its launch command
    is told to pick a DeepEP all2all backend). A step that extends (prefill chunks) runs
    the normal kernels, which send a token once to each rank holding any of its experts
    (`MoeSpec.ranks_per_token`), in fp8 when the experts are fp8 (DeepGEMM, Hopper and newer); a decode step runs
    the low-latency ones, which send it to each of its k experts, in fp8. So does a speculative verify step (SGLang
    picks the mode from the scheduler's batch, a decode batch while the worker verifies). Combine returns bf16
    the same way. fp8 carries a 4-byte scale per 128 values."""
    msg = tokens * ctx.model.hidden_size * ACT_BYTES
    if group.is_moe and ctx.par.ep and ctx.par.dp_attention:
        moe, local = ctx.model.moe, peak_tokens * ctx.model.hidden_size
        copies = moe.ranks_per_token(ctx.par.tp) if extend else moe.experts_per_token
        dispatch_bytes = FP8_WITH_SCALE_BYTES if ctx.weight_dtype == "fp8" or not extend else ACT_BYTES
        dispatch, combine = local * copies * dispatch_bytes, local * copies * ACT_BYTES
        acc.add_link(
            ctx,
            "all_to_all",
            dispatch + combine,
            _all_to_all_s(ctx, dispatch) + _all_to_all_s(ctx, combine),
            layers,
        )
        return
    if ctx.par.dense_replicated:
        # the group's hidden states and router logits gathered, the experts' outputs scattered
        if group.is_moe:
            gathered = tokens * (ctx.model.hidden_size + ctx.model.moe.num_experts) * ACT_BYTES
            acc.add_link(
                ctx,
                "all_gather_reduce_scatter",
                gathered + msg,
                _all_to_all_s(ctx, gathered) + _all_to_all_s(ctx, msg),
                layers,
            )
        return
    for _ in range(2):
        acc.add_link(ctx, "all_reduce", msg, _all_reduce_s(ctx, msg), layers, _measured_all_reduce(ctx, msg))


def _model_level(ctx: _Ctx, acc: _Terms, batch: StepBatch) -> None:
    pad = _graph_padding(ctx, batch)
    m, ranks, tokens = ctx.model, ctx.par.dense_ranks, float(batch.num_tokens + pad)
    rows = ctx.par.dense_rows(tokens, ctx.rank.num_tokens + pad)
    local = ctx.with_tokens(rows)
    looked_up = rows * m.hidden_size * ACT_BYTES * 2  # read from the table, written out
    acc.add(local, "embedding", "gemm", 0.0, looked_up, local.gemm_s(0.0, looked_up), 1)
    if ranks > 1:  # each rank looks up its slice of the vocabulary; the partial embeddings are summed
        msg = tokens * m.hidden_size * ACT_BYTES
        acc.add_link(
            ctx, "embedding_all_reduce", msg, _all_reduce_s(ctx, msg), 1, _measured_all_reduce(ctx, msg)
        )
    if m.extra_linear_params:
        params = m.extra_linear_params / ranks
        acc.add(
            local,
            "model_extras",
            "gemm",
            2 * rows * params,
            params * ctx.wbytes,
            local.gemm_s(2 * rows * params, params * ctx.wbytes),
            1,
        )
    logits = float(batch.num_logits + (pad if ctx.opts.graph_pads_logits else 0))
    if logits:
        # on vLLM's DP ranks the rank with most logits rows: at least an even share (the busiest rank's
        # requests are the longest, often prompt chunks short of their last token)
        most = max(ctx.rank.num_logits, -(-batch.num_logits // ctx.par.tp))
        params, rows = m.lm_head_params / ranks, ctx.par.dense_rows(logits, most)
        flops, nbytes = 2 * rows * params, params * ACT_BYTES + rows * m.vocab_size / ranks * LOGIT_BYTES
        head = ctx.with_tokens(rows)  # a GEMM of the logits rows only: a prefill's LM head is a GEMV
        acc.add(
            head,
            "lm_head",
            "gemm",
            flops,
            nbytes,
            head.gemm_s(flops, nbytes, "bf16"),
            1,
            head.measured_gemms(rows, ((m.vocab_size / ranks, m.hidden_size),), "bf16"),
            head.gemm_source("bf16"),
        )
        if ranks > 1:  # vocab-parallel logits gathered to the sampling rank (bf16)
            bus = (ranks - 1) / ranks * logits * m.vocab_size * ACT_BYTES
            acc.add_link(head, "logits_gather", bus, _collective_s(head, bus, ranks - 1), 1)
    # vLLM sends hidden states and residual, each TP rank 1/tp of them, all-gathered on arrival
    if ctx.par.pp > 1:
        link, sent = _group_link(ctx, ctx.par.num_gpus), 2 * tokens * m.hidden_size * ACT_BYTES
        # vLLM's DP ranks each send their own tokens' whole states, gathering nothing: the fullest rank's bound it
        share = 2 * ctx.peak[0] * m.hidden_size * ACT_BYTES if ctx.par.dense_replicated else sent / ctx.par.tp
        boundary_s = share / (link.bytes_per_s * ctx.profile.comm.at(tokens)) + link.latency_s
        if ranks > 1:
            boundary_s += _collective_s(ctx, (ranks - 1) / ranks * sent, ranks - 1)
        acc.add_link(ctx, "pp_send", (ctx.par.pp - 1) * share, (ctx.par.pp - 1) * boundary_s, 1)


def rank_peaks(batch: StepBatch) -> tuple[int, int] | None:
    """The most tokens and the most requests one labelled DP-attention rank holds: the MoE layers' all-to-all (and a
    pipeline boundary between vLLM's ranks) waits for the fullest sender, whichever rank is slowest at attention.
    None for an unlabelled batch, whose dealt busiest rank holds the most of both."""
    if batch.rank is None or not batch.num_requests:
        return None
    return int(np.bincount(batch.rank, weights=batch.num_new).max()), int(np.bincount(batch.rank).max())


def busiest_rank(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
) -> StepBatch:
    """The requests one GPU attends for in the step that lasts longest (`Parallelism.rank_batches`): of several
    labelled DP-attention ranks, the one whose step `step_cost` prices longest (the first of equals)."""
    candidates = parallelism.rank_batches(batch)
    if len(candidates) == 1:
        return candidates[0]
    totals = [
        step_cost(batch, model, gpu, parallelism, profile, options, rank).total_s for rank in candidates
    ]
    return candidates[totals.index(max(totals))]


def _context(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism,
    profile: Profile,
    options: CostOptions,
    rank: StepBatch | None = None,
) -> _Ctx:
    """`rank`: the requests one GPU attends for; None: `busiest_rank`."""
    check_sharding(model, parallelism.tp, parallelism.pp, parallelism.dp_attention, parallelism.ep)
    dtype = resolve_weight_dtype(model, options.weight_dtype)
    if rank is None:
        rank = busiest_rank(batch, model, gpu, parallelism, profile, options)
    profile = profile.for_gpu(gpu.name).for_experts(dtype)
    kernels = kernel_tables(profile.kernels, gpu.name) if profile.kernels else None
    return _Ctx(
        model,
        gpu,
        parallelism,
        options,
        profile,
        float(max(batch.num_tokens, 1)),
        dtype,
        *weight_bytes(model, dtype),
        rank,
        rank_peaks(batch) or (rank.num_tokens, rank.num_requests),
        kernels,
    )


def _graph_padding(ctx: _Ctx, batch: StepBatch) -> int:
    """Rows a CUDA graph adds to `batch` (`CostOptions.graph_tokens`); none under DP attention, whose ranks pad
    to one another's batches, which is not modelled."""
    return 0 if ctx.par.dp_attention else ctx.opts.graph_tokens(batch) - batch.num_tokens


def _group_batch(batch: StepBatch, group: _Group) -> StepBatch:
    """The tokens a layer group sees: all of them, or one per request under YOCO fast prefill."""
    return batch.last_token_only() if group.last_token_only and batch.max_query_len > 1 else batch


def _attention_per_layer(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism,
    profile: Profile,
    options: CostOptions,
    rank: StepBatch | None,
):
    """Yield (group, its layers, decode?, seconds per layer) of every layer group's attention: the terms `step_cost`
    prices, without the other operators. One reduced batch for all fast-prefill groups, so their stats are shared."""
    ctx, memo, reduced = _context(batch, model, gpu, parallelism, profile, options, rank), {}, None
    batch = ctx.rank  # attention runs on the requests one GPU attends for
    for group, layers in _layer_groups(model, options.kv_sharing_fast_prefill):
        seen = _group_batch(batch, group)
        if seen is not batch:
            reduced = reduced or seen
            seen = reduced
        key = (id(seen), group.window)
        paths = memo.get(key)
        if paths is None:
            paths = memo[key] = _attn_stats(seen, group.window, options.decode_query_len)
        for decode, stats in zip((True, False), paths):
            if stats.requests:
                yield group, layers, decode, _layer_attention_s(ctx, seen.num_tokens, group, decode, stats)


def _layer_attention_s(ctx: _Ctx, tokens: int, group: _Group, decode: bool, stats: _AttnStats) -> float:
    """One layer's attention over the requests `stats` sums: the kernel tables' time if they have it, else the
    roofline's with `tokens` rows (the efficiency curves' argument)."""
    _, nbytes, compute_s, memory_s = attention_terms(
        ctx.with_tokens(tokens), group.owns_kv, decode, stats.keys, stats.kv_read, stats.tokens
    )
    measured = measured_attention(
        ctx, group.window, decode, stats.requests, stats.kv_read, stats.keys, nbytes
    )
    if measured is not None:
        return measured
    return compute_s if compute_s > memory_s else memory_s


def small_attention_pricer(
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
) -> PathAttention | None:
    """`attention_seconds` of a batch given as its requests' new and context tokens, without building it: the
    simulator prices most steps, each of a few requests, so numpy's per-call cost would dominate. The same terms in
    the same order. None where pricing needs the batch itself: DP attention (ranks), MLA (its shape key) and YOCO
    fast prefill (reduced batches)."""
    groups = _layer_groups(model, options.kv_sharing_fast_prefill)
    if parallelism.dp_attention or model.mla is not None or any(g.last_token_only for g, _ in groups):
        return None
    return PathAttention(_context(StepBatch.of([1], [0]), model, gpu, parallelism, profile, options), groups)


class PathAttention:
    """`small_attention_pricer`'s pricer: each layer group's decode and prefill paths priced from their sums, by the
    kernel tables where they hold the path (`measured_attention`), else by the roofline (`attention_terms` with its
    constant factors taken once and its efficiency denominators once per step size), each product still formed in
    the same order, so every step costs what `step_cost` says to the last bit. `from_sums` prices a step given its
    paths' sums instead of its requests (no sliding window: `windowless`)."""

    def __init__(self, ctx: _Ctx, groups: tuple[tuple[_Group, int], ...]):
        m, self.decode_query_len = ctx.model, ctx.opts.decode_query_len
        self.heads = m.num_heads / ctx.par.tp
        self.kv_values, self.kvbytes = m.kv_values_per_token_per_layer(ctx.par.tp), ctx.kvbytes
        self.peak, self.bandwidth = ctx.gpu.peak_for("bf16"), ctx.gpu.memory_bytes_per_s
        self.compute, self.memory = ctx.profile.attn_compute, ctx.profile.attn_memory
        self.paths = []  # per group and path (decode, then prefill): the factors of `attention_terms`
        for group, layers in groups:
            for decode in (True, False):
                qk_dim, v_dim = _attention_dims(m, decode)
                self.paths.append(
                    (
                        group.window,
                        decode,
                        group.owns_kv,
                        layers,
                        2 * self.heads * (qk_dim + v_dim),
                        qk_dim + v_dim,
                    )
                )
        # each path's kernel table (None: the roofline prices it)
        self.tables = [_attention_table(ctx, window, decode) for window, decode, *_ in self.paths]
        self.windows = tuple(dict.fromkeys(group.window for group, _ in groups))
        self.windowless = self.windows == (None,)
        self.denominators: dict[int, tuple[float, float]] = {}

    def __call__(self, num_new: Sequence[int], num_context: Sequence[int]) -> float:
        dql = self.decode_query_len
        return self._priced(
            sum(num_new), {w: _paired_stats(num_new, num_context, w, dql) for w in self.windows}
        )

    def from_sums(self, decodes: int, decode_keys: int, chunk: int, fed: int) -> float:
        """A step of `decodes` one-token decodes whose contexts plus one sum to `decode_keys`, beside `chunk` prompt
        tokens after `fed` (a chunk of at most decode_query_len tokens takes the decode path, as `_paired_stats`
        sends it); `windowless` models only."""
        keys = chunk * fed + chunk * (chunk + 1) // 2
        if chunk <= self.decode_query_len:
            paths = (
                [decodes + chunk, decodes + 1, decode_keys + keys, decode_keys + fed + chunk, 0],
                [0, 0, 0, 0, 0],
            )
        else:
            paths = ([decodes, decodes, decode_keys, decode_keys, 0], [chunk, 1, keys, fed + chunk, 0])
        return self._priced(decodes + chunk, {None: paths})

    def denominators_at(self, tokens: int) -> tuple[float, float]:
        """The compute and memory seconds' denominators of a step of `tokens` tokens: peak and bandwidth at the
        efficiencies of that many rows."""
        rows = float(max(tokens, 1))  # `_Ctx.with_tokens`
        return self.peak * self.compute.at(rows), self.bandwidth * self.memory.at(rows)

    def _priced(self, tokens: int, stats: dict[int | None, tuple[list[int], list[int]]]) -> float:
        """The attention seconds of a step of `tokens` tokens from its paths' sums per window (`_paired_stats`)."""
        hit = self.denominators.get(tokens)
        if hit is None:
            if len(self.denominators) >= 1 << 12:
                self.denominators.clear()
            hit = self.denominators[tokens] = self.denominators_at(tokens)
        compute_d, memory_d = hit
        kv_values, kvbytes, heads = self.kv_values, self.kvbytes, self.heads
        # per path, across groups, as `_summed_attention` sums each name; its sum over the two names comes out the
        # same in either order (one addition of two floats)
        totals = [0.0, 0.0]  # decode, prefill
        for (window, decode, owns_kv, layers, flop_factor, head_dims), table in zip(self.paths, self.tables):
            new_tokens, requests, keys, kv_read, _ = stats[window][0 if decode else 1]
            if not requests:
                continue
            layer_s = None
            written = new_tokens * kv_values * kvbytes if owns_kv else 0.0
            nbytes = kv_read * kv_values * kvbytes + written + new_tokens * heads * head_dims * ACT_BYTES
            if table is not None:
                layer_s = table.seconds(requests, _table_length(window, decode, requests, kv_read, keys))
                if layer_s is not None and not decode:  # `measured_attention`'s floor
                    layer_s = max(layer_s, nbytes / self.bandwidth)
            if layer_s is None:
                compute_s, memory_s = flop_factor * keys / compute_d, nbytes / memory_d
                layer_s = compute_s if compute_s > memory_s else memory_s
            totals[0 if decode else 1] += layer_s * layers
        return totals[0] + totals[1]


def _context_by_tokens(
    model: ModelSpec, gpu: GpuSpec, parallelism: Parallelism, profile: Profile, options: CostOptions
) -> Callable[[int], _Ctx]:
    """The context of a step of so many tokens, for pricers that need no batch (every GPU attends for every
    request), remembered per step size: copying the dataclass costs more than pricing a small step."""
    ctx = _context(StepBatch.of([1], [0]), model, gpu, parallelism, profile, options)
    by_tokens: dict[int, _Ctx] = {}

    def at(tokens: int) -> _Ctx:
        hit = by_tokens.get(tokens)
        if hit is None:
            if len(by_tokens) >= 1 << 12:
                by_tokens.clear()
            hit = by_tokens[tokens] = ctx.with_tokens(tokens)
        return hit

    return at


def _summed_attention(parts: Iterable[tuple[int, bool, float]]) -> float:
    """Attention seconds from (layers, decode?, seconds per layer) parts, summed as `step_cost` sums them: per
    operator name across groups, then over names in first-seen order."""
    totals: dict[str, float] = {}
    for layers, decode, time_s in parts:
        name = "attention_decode" if decode else "attention_prefill"
        totals[name] = totals.get(name, 0.0) + time_s * layers
    return sum(totals.values())


def attention_seconds(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> float:
    """`step_cost(...).attention_s` for the simulator's hot path: the same terms, summed in the same order
    (per operator name across groups, then over names in first-seen order), without the other operators.
    `rank`: as `step_cost`'s."""
    parts = _attention_per_layer(batch, model, gpu, parallelism, profile, options, rank)
    return _summed_attention((layers, decode, time_s) for _, layers, decode, time_s in parts)


def decode_stretch_attention_s(
    num_context: np.ndarray,
    num_steps: int,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
) -> np.ndarray:
    """`attention_seconds` of each of `num_steps` consecutive decode steps of the same requests, whose
    contexts start at `num_context` and grow by one token per step: the same terms in the same order,
    elementwise over the steps, so a fast-forwarded stretch costs bit-for-bit what stepping it does."""
    batch = StepBatch.of(np.ones(len(num_context), np.int64), num_context)
    ctx = _context(batch, model, gpu, parallelism, profile, options)
    # unlabelled: its contexts all grow by one a step, so the dealt busiest rank keeps its requests
    return _stretch_attention_s(ctx, ctx.rank.num_context, num_steps)


def decode_stretch_pricer(
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
) -> Callable[[np.ndarray, int], np.ndarray] | None:
    """`decode_stretch_attention_s` without building a batch and a context per call: every GPU attends for every
    request, so one context serves all stretches. None under DP attention (a stretch's busiest rank)."""
    if parallelism.dp_attention:
        return None
    at = _context_by_tokens(model, gpu, parallelism, profile, options)
    return lambda num_context, num_steps: _stretch_attention_s(at(len(num_context)), num_context, num_steps)


def shrinking_stretch_pricer(
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
) -> Callable[[np.ndarray, np.ndarray, int], np.ndarray] | None:
    """`decode_stretch_pricer` for a stretch in which request j decodes up to step `finish[j]` (the batch shrinks
    after each finishing step), every step in one pass: `(num_context, finish, num_steps) -> attention seconds`.
    None where a kernel table prices decode attention (looked up per batch size) or under DP attention."""
    if parallelism.dp_attention:
        return None
    at = _context_by_tokens(model, gpu, parallelism, profile, options)
    groups = _layer_groups(model, options.kv_sharing_fast_prefill)
    if any(_attention_table(at(1), group.window, True) is not None for group, _ in groups):
        return None
    profile = at(1).profile
    by_size: dict[int, tuple[float, float]] = {}  # the (compute, memory) efficiencies of a step of n decodes

    def efficiencies(n: int) -> tuple[float, float]:
        hit = by_size.get(n)
        if hit is None:
            hit = by_size[n] = profile.attn_compute.at(float(n)), profile.attn_memory.at(float(n))
        return hit

    return lambda num_context, finish, num_steps: _shrinking_stretch_attention_s(
        at, efficiencies, num_context, finish, num_steps
    )


def _shrinking_stretch_attention_s(
    at: Callable[[int], _Ctx],
    efficiencies: Callable[[int], tuple[float, float]],
    num_context: np.ndarray,
    finish: np.ndarray,
    num_steps: int,
) -> np.ndarray:
    """`_stretch_attention_s` of each stretch of steps with the same requests, in one pass: step i holds the
    requests whose finish is >= i, at the efficiencies of its size. Every entry is formed by the same operations
    as the stretch of its size would form it."""
    steps = np.arange(num_steps, dtype=np.int64)
    alive = finish[None, :] >= steps[:, None]
    requests = alive.sum(axis=1)
    sizes = requests.tolist()
    by_size = {n: efficiencies(n) for n in set(sizes)}
    efficiency = np.array([by_size[n][0] for n in sizes]), np.array([by_size[n][1] for n in sizes])
    ctx = at(sizes[0])  # what else the terms read is the same at every size
    attention = np.zeros(num_steps)
    for group, layers in _layer_groups(ctx.model, ctx.opts.kv_sharing_fast_prefill):
        keys = _decode_keys(num_context, steps, group.window, alive)
        _, _, compute_s, memory_s = attention_terms(
            ctx, group.owns_kv, True, keys, keys, requests, efficiency
        )
        attention += np.maximum(compute_s, memory_s) * layers
    return attention


def _stretch_attention_s(ctx: _Ctx, num_context: np.ndarray, num_steps: int) -> np.ndarray:
    """Each step's attention for the decodes one GPU attends for (`num_context`: theirs), one token each."""
    requests = len(num_context)
    ctx = ctx.with_tokens(requests)
    steps = np.arange(num_steps, dtype=np.int64)
    attention = np.zeros(num_steps)
    for group, layers in _layer_groups(ctx.model, ctx.opts.kv_sharing_fast_prefill):
        keys = _decode_keys(num_context, steps, group.window)
        _, _, compute_s, memory_s = attention_terms(ctx, group.owns_kv, True, keys, keys, requests)
        per_layer = np.maximum(compute_s, memory_s)
        table = _attention_table(ctx, group.window, True)
        if table is not None:  # a stepped step's very numbers
            lengths = [_table_length(group.window, True, requests, read, read) for read in keys.tolist()]
            for step, measured in enumerate(table.seconds_along(requests, lengths)):
                if measured is not None:
                    per_layer[step] = measured
        attention += per_layer * layers
    return attention


def _decode_keys(
    num_context: np.ndarray, steps: np.ndarray, window: int | None, alive: np.ndarray | None = None
) -> np.ndarray:
    """Per step: keys all requests attend over when each decodes at context + step (capped by a window); with
    `alive` (steps x requests), only the requests still decoding in each step.

    For a decode, the keys attended and the distinct KV tokens read are both min(context + 1, window).
    """
    c = num_context.astype(np.int64, copy=False)
    if alive is not None:
        keys = c[None, :] + 1 + steps[:, None]
        return np.where(alive, keys if window is None else np.minimum(keys, window), 0).sum(axis=1)
    if window is None:
        return int(c.sum()) + len(c) * (steps + 1)
    return np.minimum(c[None, :] + 1 + steps[:, None], window).sum(axis=1)


def operator_terms(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> list[OperatorTerm]:
    """Every operator of every layer group, then the model-level ones, one `OperatorTerm` each, in the
    order `step_cost` sums them (it is built on this; the profile's fixed overheads are not included).
    A calibration fit reads `compute_s`/`memory_s` from here, so fit and predictor cannot drift."""
    return _operator_terms(_context(batch, model, gpu, parallelism, profile, options, rank), batch)


def _operator_terms(ctx: _Ctx, batch: StepBatch, attention: bool = True) -> list[OperatorTerm]:
    terms = _Terms()
    if batch.num_requests:
        for group, layers in _layer_groups(ctx.model, ctx.opts.kv_sharing_fast_prefill):
            _layer_group(ctx, terms, batch, group, layers, attention)
        _model_level(ctx, terms, batch)
    return terms.terms


def step_cost(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> StepCost:
    """Predicted time of one engine step of `batch` on one replica, split by operator. `rank`: the requests one GPU
    attends for (one of `Parallelism.rank_batches`); None: the busiest (`busiest_rank`).

    Pipeline stages run the batch one after another, so layer costs add up across stages and `pp_send` adds
    the activations crossing each stage boundary, the fixed overheads counted once (the simulator runs pp
    micro-batches in flight, each stage busy with one at a time, and prices them per stage: `stage_seconds`).
    """
    acc, ctx = _Acc(), _context(batch, model, gpu, parallelism, profile, options, rank)
    for term in _operator_terms(ctx, batch):
        acc.add(term.name, term.kind, term.flops, term.bytes, (term.time_s, term.bound), term.layers)
    if batch.num_requests:
        acc.add("overhead", "overhead", 0.0, 0.0, (_overhead_s(ctx), "fixed"), 1)
    prefills = batch.max_query_len > options.decode_query_len
    return StepCost(
        acc.result(),
        gpu.memory_bytes_per_s,
        gpu.peak_for(GEMM_COMPUTE_DTYPE[ctx.weight_dtype]),
        eager_floor_s(model, ctx.profile, options, batch.num_tokens, prefills),
    )


def eager_floor_s(
    model: ModelSpec, profile: Profile, options: CostOptions, num_tokens: int, prefills: bool
) -> float:
    """The least a step of `num_tokens` tokens (a query longer than a decode's if `prefills`) lasts: the host's
    launches (`profile.eager_layer_s` x layers) if it runs outside CUDA graphs, else 0."""
    if not num_tokens or options.graphed_shape(num_tokens, prefills):
        return 0.0
    return profile.eager_layer_s * model.num_layers


def _overhead_s(ctx: _Ctx) -> float:
    """The profile's fixed costs of a step: per step, layer, request and token, mixed layers and host work (each
    DP-attention rank's own)."""
    profile, model, requests = ctx.profile, ctx.model, ctx.rank.num_requests  # profile resolved for the GPU
    return (
        profile.step_overhead_s
        + profile.layer_overhead_s * model.num_layers
        + profile.request_overhead_s * requests
        + profile.token_overhead_s * ctx.rank.num_tokens
        + profile.mixed_layer_overhead_s * mixed_attention_layers(ctx.rank, model, ctx.opts)
        + profile.fast_prefill_layer_s * cross_decoder_layers(ctx.rank, model, ctx.opts)
        + profile.kv_write_token_s * ctx.rank.num_tokens * model.num_kv_layers
        + profile.host_step_s
        + profile.host_request_s * requests
    )


def fixed_seconds(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> float:
    """`step_cost(...).fixed_s` without the per-operator records: each operator's `time_s * layers` summed per name,
    then over names in first-seen order and the overhead last, as `StepCost.fixed_s` sums them."""
    ctx = _context(batch, model, gpu, parallelism, profile, options, rank)
    totals: dict[str, float] = {}
    for term in _operator_terms(ctx, batch, attention=False):  # no attention operator, so none to leave out
        totals[term.name] = totals.get(term.name, 0.0) + term.time_s * term.layers
    if batch.num_requests:
        totals["overhead"] = _overhead_s(ctx)
    return sum(totals.values())


class FixedParts:
    """`fixed_seconds` of one model, GPU, parallelism, profile and options, from parts each cached by what it reads.

    `fixed_seconds` sums its per-name totals left to right: first the layers' operators and the model-level ones
    on the step's rows, which read only its tokens and whether it prefills (its CUDA-graph padding and
    collectives); then the LM head and the logits gather, which read its logits rows; then the overhead. So the
    sum up to the logits operators is cached per (tokens, prefills), their values per logits rows, and the
    overhead computed per step: the same additions in the same order, bit for bit. A simulation meets thousands
    of step shapes (tokens x requests x logits) but far fewer (tokens, prefills). Only where every GPU attends for
    every request, in one pipeline stage, with no MLA or fast-prefill layers (`applies`)."""

    def __init__(
        self, model: ModelSpec, gpu: GpuSpec, parallelism: Parallelism, profile: Profile, options: CostOptions
    ):
        self.args = (model, gpu, parallelism, profile, options)
        self._rows: dict[tuple[int, bool], float] = {}
        self._logits: dict[tuple[int, int], tuple[float, ...]] = {}
        self._ctx: _Ctx | None = None

    @staticmethod
    def applies(model: ModelSpec, parallelism: Parallelism, options: CostOptions) -> bool:
        return (
            not parallelism.dp_attention
            and parallelism.pp == 1
            and model.mla is None
            and not any(g.last_token_only for g, _ in _layer_groups(model, options.kv_sharing_fast_prefill))
        )

    def __call__(self, batch: StepBatch) -> float:
        """`fixed_seconds(batch, *args)` (`rank`: the batch, which every GPU attends for)."""
        options = self.args[4]
        prefills = batch.max_query_len > options.decode_query_len
        rows_key = (batch.num_tokens, prefills)
        pad = options.graph_tokens(batch) - batch.num_tokens if options.graph_pads_logits else 0
        logits_key = (batch.num_logits, pad)
        head, logits = self._rows.get(rows_key), self._logits.get(logits_key)
        if head is None or logits is None:
            ctx = _context(batch, *self.args, batch)
            totals: dict[str, float] = {}
            for term in _operator_terms(ctx, batch, attention=False):
                totals[term.name] = totals.get(term.name, 0.0) + term.time_s * term.layers
            names = list(totals)
            tail = [name for name in names if name in LAST_STAGE_OPERATORS]
            if names[len(names) - len(tail) :] != tail:
                raise AssertionError(f"the logits operators are not summed last: {names}")
            head = self._rows[rows_key] = sum(totals[name] for name in names[: len(names) - len(tail)])
            logits = self._logits[logits_key] = tuple(totals[name] for name in tail)
        fixed = head
        for value in logits:
            fixed += value
        if batch.num_requests:
            fixed += _overhead_s(self._context_of(batch))
        return fixed

    def _context_of(self, batch: StepBatch) -> _Ctx:
        """The context `_overhead_s` reads for `batch`: the profile, model and options, and the batch as the rank."""
        if self._ctx is None:
            self._ctx = _context(batch, *self.args, batch)
        c = self._ctx
        return _Ctx(
            c.model,
            c.gpu,
            c.par,
            c.opts,
            c.profile,
            c.tokens,
            c.weight_dtype,
            c.wbytes,
            c.expert_wbytes,
            batch,
            c.peak,
            c.kernels,
        )


_STAGE_GROUPS: dict[tuple[int, int, bool], tuple[ModelSpec, tuple[tuple[tuple[_Group, int], ...], ...]]] = {}


def _stage_groups(
    model: ModelSpec, pp: int, fast_prefill: bool
) -> tuple[tuple[tuple[_Group, int], ...], ...]:
    """Each pipeline stage's layer groups with their layer counts there (vLLM's get_pp_indices split).
    Memoized by object identity, as `_groups_of` is."""
    hit = _STAGE_GROUPS.get((id(model), pp, fast_prefill))
    if hit is not None and hit[0] is model:
        return hit[1]
    by_layer = _groups_of(model, fast_prefill)[0]
    stages = tuple(
        tuple(Counter(by_layer[layer.index] for layer in stage).items())
        for stage in stage_layer_specs(model, pp)
    )
    _STAGE_GROUPS[(id(model), pp, fast_prefill)] = (model, stages)
    return stages


def stage_fixed_seconds(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> list[float]:
    """`stage_seconds` less attention: what depends only on the step's shape, which `StepTimer` caches."""
    pp = parallelism.pp
    if not batch.num_requests:
        return [0.0] * pp
    ctx = _context(batch, model, gpu, parallelism, profile, options, rank)
    profile = ctx.profile  # resolved for the GPU
    per_layer = {}
    for group, _ in _layer_groups(model, options.kv_sharing_fast_prefill):
        terms = _Terms()
        _layer_group(ctx, terms, batch, group, 1, attention=False)
        per_layer[group] = sum(term.time_s for term in terms.terms)
    edges = _Terms()
    _model_level(ctx, edges, batch)
    first, last, send = (
        sum(term.time_s for term in edges.terms if term.name in names)
        for names in (FIRST_STAGE_OPERATORS, LAST_STAGE_OPERATORS, {"pp_send"})
    )
    mixed = ctx.rank.is_mixed(options.decode_query_len)  # on the GPU attending for its rank
    cross = cross_decoder_layers(ctx.rank, model, options) > 0
    requests, tokens = ctx.rank.num_requests, ctx.rank.num_tokens
    every_stage = (
        profile.step_overhead_s + profile.request_overhead_s * requests + profile.token_overhead_s * tokens
    )
    stages = []
    for groups in _stage_groups(model, pp, options.kv_sharing_fast_prefill):
        time_s = every_stage + sum(
            (per_layer[group] + profile.layer_overhead_s) * count for group, count in groups
        )
        if mixed:
            time_s += profile.mixed_layer_overhead_s * sum(
                count for group, count in groups if not group.last_token_only
            )
        if cross:
            time_s += profile.fast_prefill_layer_s * sum(
                count for group, count in groups if group.last_token_only
            )
        time_s += profile.kv_write_token_s * tokens * sum(count for group, count in groups if group.owns_kv)
        stages.append(time_s)
    for boundary in range(pp - 1):
        stages[boundary] += send / (pp - 1)
    stages[0] += first + profile.host_step_s + profile.host_request_s * requests
    stages[-1] += last
    return stages


def stage_attention_seconds(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> list[float]:
    """Each pipeline stage's attention seconds: the part of `stage_seconds` that depends on every context."""
    if not batch.num_requests:
        return [0.0] * parallelism.pp
    per_layer: dict[_Group, float] = {}
    for group, _, _, time_s in _attention_per_layer(batch, model, gpu, parallelism, profile, options, rank):
        per_layer[group] = per_layer.get(group, 0.0) + time_s
    return [
        sum(per_layer.get(group, 0.0) * count for group, count in groups)
        for groups in _stage_groups(model, parallelism.pp, options.kv_sharing_fast_prefill)
    ]


def stage_seconds(
    batch: StepBatch,
    model: ModelSpec,
    gpu: GpuSpec,
    parallelism: Parallelism = Parallelism(),
    profile: Profile = Profile(),
    options: CostOptions = CostOptions(),
    rank: StepBatch | None = None,
) -> list[float]:
    """One step's seconds on each pipeline stage, whose GPUs run only their layers (vLLM's get_pp_indices):
    each layer group's operators times its layers there (DeepSeek's dense layers and Gemma 3n's fast-prefill
    layers sit in the first and last stages), the embedding on the first stage, the LM head and its logits
    gather on the last, each boundary's send on the stage before it. Every stage's workers prepare their own
    inputs and launch their own kernels, so the per-step, per-request and per-token overheads repeat on each;
    the engine core's host time comes once, before the first stage. `rank`: as `step_cost`'s; None: under DP
    attention each stage lasts as long as its slowest rank there (`Parallelism.rank_batches`)."""
    ranks = [rank] if rank is not None else parallelism.rank_batches(batch)
    times = [
        [
            fixed + attention
            for fixed, attention in zip(stage_fixed_seconds(*args), stage_attention_seconds(*args))
        ]
        for args in ((batch, model, gpu, parallelism, profile, options, r) for r in ranks)
    ]
    return [max(stage) for stage in zip(*times)]
