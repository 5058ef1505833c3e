"""Model architecture specs, read from Hugging Face `config.json` files (local only, never the network).

A `ModelSpec` is what the cost model and the memory planner need: per-layer attention kind
(full, sliding window, KV shared with an earlier layer), GQA/MQA/MLA shapes, dense or MoE MLP,
and parameter counts derived from the shapes (checked in the tests against published totals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from math import comb
from pathlib import Path
from typing import Any

from servesim.hardware.errors import ShardingError, SpecError, choices
from servesim.hardware.hf_models import is_repo_id, repo_of, resolve_repo, snapshot_config
from servesim.hardware.files import read_json

PRESET_DIR = Path(__file__).parent / "model_configs"

#: Bytes per stored value for KV-cache and weight dtypes. int8 is W8A8 (int8 GEMMs); w8a16 and int4 are
#: weight-only (AWQ/GPTQ: bf16 GEMMs) with one fp16 scale per 128 weights;
#: mxfp4 and mxfp8 (OCP microscaling) are 4-bit E2M1 / 8-bit E4M3 values with one 8-bit E8M0 scale per 32 values;
#: nvfp4 (NVIDIA) is E2M1 with one FP8 E4M3 scale per 16 values (and one FP32 scale per tensor, negligible).
KV_DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
WEIGHT_DTYPE_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "w8a16": 1.0 + 2.0 / 128,
    "int4": 0.5 + 2.0 / 128,
    "mxfp4": 0.5 + 1.0 / 32,
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp8": 1.0 + 1.0 / 32,
}
#: Weight dtypes that quantize only the routed experts (the rest of the model stays bf16), as gpt-oss ships.
EXPERT_ONLY_DTYPES = ("mxfp4",)
#: `weight_dtype: auto` takes the checkpoint's own quantization, as vLLM serves it.
WEIGHT_DTYPE_CHOICES = ("auto", *WEIGHT_DTYPE_BYTES)


def dtype_bytes(table: dict[str, float], dtype: str, what: str) -> float:
    """Bytes per value of `dtype`, with an error that lists the allowed dtypes."""
    try:
        return table[dtype]
    except KeyError:
        raise SpecError(f"unknown {what} dtype {dtype!r}; allowed: {', '.join(table)}") from None


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One decoder layer. `kv_source` is the layer whose KV cache it attends over (itself unless shared)."""

    index: int
    attention: str  # "full" or "sliding"
    window: int | None  # tokens attended back, sliding layers only
    kv_source: int
    is_moe: bool
    mlp_intermediate: int  # dense MLP width of this layer (0 for MoE layers)
    extra_linear_params: int = (
        0  # small per-layer projections the kinds above don't cover (Gemma 3n AltUp/LAuReL)
    )

    @property
    def owns_kv(self) -> bool:
        return self.kv_source == self.index


@dataclass(frozen=True, slots=True)
class MlaSpec:
    """DeepSeek multi-head latent attention: the cache holds one `kv_lora_rank + qk_rope_head_dim` vector per token."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """Routed experts (each a gated MLP of `expert_intermediate`) plus always-on shared experts."""

    num_experts: int
    experts_per_token: int
    expert_intermediate: int
    num_shared_experts: int = 0
    biased: bool = False  # gpt-oss: a router bias and gate/up and down biases in every expert
    # group-limited routing (DeepSeek's n_group, topk_group): a token's experts come from its best
    # `groups_per_token` of `num_groups` equal groups of consecutive experts
    num_groups: int = 1
    groups_per_token: int = 1

    def ranks_per_token(self, ranks: int) -> float:
        """Expected number of expert-parallel ranks one token's experts live on, each rank holding
        num_experts / ranks consecutive experts (vLLM's and SGLang's placement): what DeepEP's normal dispatch
        sends a token to, once per rank. The router is taken as balanced: experts drawn uniformly, and under
        group-limited routing uniformly from the chosen groups with each of them given at least one (a group
        is chosen for its best experts' scores). DeepSeek-V3 on 8 ranks: a rank is a group, so exactly the 4
        chosen ranks; 8 experts over 8 ranks without groups would reach 5.28."""
        e, k, g, chosen = self.num_experts, self.experts_per_token, self.num_groups, self.groups_per_token
        if e % ranks:
            raise ShardingError(
                f"{e} experts do not divide over {ranks} expert-parallel ranks (see check_sharding)"
            )
        per_rank = e // ranks
        if g == 1 or k < chosen or (ranks % g and g % ranks):
            return ranks * (1 - comb(e - per_rank, k) / comb(e, k))
        if ranks <= g:  # a rank holds whole groups and is reached when one of them is chosen
            return ranks * (1 - comb(g - g // ranks, chosen) / comb(g, chosen))
        # a group spans several ranks: one is missed when the draws give every chosen group one of its experts
        # but none of that rank's (inclusion-exclusion over the groups left empty)
        per_group = e // g
        every_group = sum(
            (-1) ** j * comb(chosen, j) * comb((chosen - j) * per_group, k) for j in range(chosen + 1)
        )
        missing = sum(
            (-1) ** j
            * comb(chosen - 1, j)
            * (
                comb((chosen - 1 - j) * per_group + per_group - per_rank, k)
                - comb((chosen - 1 - j) * per_group, k)
            )
            for j in range(chosen)
        )
        return ranks * chosen / g * (1 - missing / every_group)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    layers: tuple[LayerSpec, ...]
    max_position_embeddings: int
    gated_mlp: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    lookup_params: int = 0  # tables read by lookup only (Gemma 3n per-layer embeddings): stored, not streamed
    extra_linear_params: int = (
        0  # model-level per-token projections (Gemma 3n AltUp, per-layer input projection)
    )
    vector_params_per_layer: int = 0  # QK norms, attention sinks: stored, not GEMMs
    vision_params: int = (
        0  # an image encoder and its projector (Gemma 3's SigLIP): stored; images are not modelled
    )
    quantization: str = (
        "bf16"  # the checkpoint's weight dtype (what `weight_dtype: auto` serves), see checkpoint_dtype
    )
    # the checkpoint's weights carry a scale per 128x128 block (DeepSeek-V3's fp8): block-scaled kernels (DeepGEMM) run
    # them, where weights quantized at load (`--quantization fp8`) take per-tensor scaled ones
    block_quantized: bool = False
    architecture: str = (
        ""  # the checkpoint's class (config.json `architectures`), for engines' per-class settings
    )
    # layers that own their KV: counted once, as every step's pricing reads it
    num_kv_layers: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_kv_layers", sum(layer.owns_kv for layer in self.layers))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    # ---- KV cache -------------------------------------------------------------------------------
    def kv_values_per_token_per_layer(self, tp: int = 1) -> int:
        """Values one token stores in one KV-owning layer on one GPU of a TP group.

        GQA splits KV heads across TP ranks and duplicates them when TP exceeds the head count;
        MLA's latent has no heads, so every rank keeps the whole latent.
        """
        if self.mla:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * kv_heads_per_rank(self.num_kv_heads, tp) * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", tp: int = 1) -> float:
        """KV bytes one token adds on one GPU, summed over KV-owning layers (sliding layers included)."""
        per_value = dtype_bytes(KV_DTYPE_BYTES, kv_dtype, "KV")
        return self.num_kv_layers * self.kv_values_per_token_per_layer(tp) * per_value

    # ---- parameters -----------------------------------------------------------------------------
    def mla_up_params(self) -> int:
        """MLA's K/V up-projection from the latent (kv_b_proj): the part decode absorbs into the queries/outputs."""
        assert self.mla is not None
        return self.mla.kv_lora_rank * self.num_heads * (self.mla.qk_nope_head_dim + self.mla.v_head_dim)

    def attention_params(self) -> int:
        h = self.hidden_size
        if self.mla:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (
                h * self.num_heads * qk
                if m.q_lora_rank is None
                else (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.num_heads * qk)
            )
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank + self.mla_up_params()
            return q + kv + self.num_heads * m.v_head_dim * h
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = (q_dim + 2 * kv_dim if self.qkv_bias else 0) + (h if self.o_bias else 0)
        return h * (q_dim + 2 * kv_dim) + q_dim * h + bias

    def dense_mlp_params(self, intermediate: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * intermediate

    def expert_params(self) -> int:
        """Parameters of one routed expert (with its biases, if it has them)."""
        assert self.moe is not None
        width = self.moe.expert_intermediate
        bias = ((2 if self.gated_mlp else 1) * width + self.hidden_size) if self.moe.biased else 0
        return self.dense_mlp_params(width) + bias

    def layer_expert_params(self, layer: LayerSpec) -> int:
        """The expert weight matrices (routed and shared, biases not) of one layer: what an expert-only
        dtype (mxfp4) quantizes."""
        if not layer.is_moe:
            return 0
        return (self.moe.num_experts + self.moe.num_shared_experts) * self.dense_mlp_params(
            self.moe.expert_intermediate
        )

    def layer_params(self, layer: LayerSpec, active: bool = False) -> int:
        """Parameters of one layer; `active` counts only the experts one token uses."""
        params = (
            self.attention_params()
            + 2 * self.hidden_size
            + layer.extra_linear_params
            + self.vector_params_per_layer
        )
        if layer.is_moe:
            assert self.moe is not None
            experts = self.moe.experts_per_token if active else self.moe.num_experts
            params += (experts + self.moe.num_shared_experts) * self.expert_params()
            params += (self.hidden_size + self.moe.biased) * self.moe.num_experts  # router
        else:
            params += self.dense_mlp_params(layer.mlp_intermediate)
        return params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The LM head's own parameters; zero extra storage when tied, but it is still read every step."""
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        return self._params(active=False) + self.vision_params

    def active_params(self) -> int:
        """Parameters used per token (MoE: routed top-k + shared experts); embeddings and lookups included."""
        return self._params(active=True)

    def _params(self, active: bool) -> int:
        layers = sum(self.layer_params(layer, active) for layer in self.layers)
        head = 0 if self.tie_embeddings else self.lm_head_params
        final_norm = self.hidden_size
        return (
            layers + self.embedding_params + head + final_norm + self.lookup_params + self.extra_linear_params
        )


def pipeline_stages(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them: equal shares, the remainder one each to
    the stages before the last (DeepSeek-V3's 61 layers at PP4: 15, 15, 16, 15)."""
    stages = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        stages[-i] += 1
    return tuple(stages)


def stage_layer_specs(model: ModelSpec, pp: int) -> list[tuple[LayerSpec, ...]]:
    """Each pipeline stage's layers, split as `pipeline_stages` splits them."""
    stages, first = [], 0
    for count in pipeline_stages(model.num_layers, pp):
        stages.append(model.layers[first : first + count])
        first += count
    return stages


def check_sharding(model: ModelSpec, tp: int, pp: int, dp_attention: bool = False, ep: bool = False) -> None:
    """Refuse what the engines refuse at start-up: more pipeline stages than layers, a TP size that does not
    divide the attention heads (unless attention runs data parallel, unsplit), or DeepEP's expert parallel
    (under DP attention) over ranks the experts do not divide over."""
    if pp > model.num_layers:
        raise ShardingError(f"pipeline parallel size {pp} exceeds the {model.num_layers} layers")
    if not dp_attention and model.num_heads % tp:
        raise ShardingError(
            f"tensor parallel size {tp} must divide {model.name}'s {model.num_heads} attention heads"
        )
    if ep and dp_attention and model.moe is not None and model.moe.num_experts % tp:
        raise ShardingError(
            f"expert parallel over DP attention (DeepEP) needs {model.name}'s {model.moe.num_experts} "
            f"experts to divide over the {tp} ranks"
        )


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads each TP rank stores: split evenly, or one duplicated head per rank when TP > KV heads."""
    if tp <= num_kv_heads:
        if num_kv_heads % tp:
            raise ShardingError(f"tensor parallel size {tp} must divide the {num_kv_heads} KV heads")
        return num_kv_heads // tp
    if tp % num_kv_heads:
        raise ShardingError(f"tensor parallel size {tp} must be a multiple of the {num_kv_heads} KV heads")
    return 1


def resolve_weight_dtype(model: ModelSpec, weight_dtype: str) -> str:
    """The weight dtype a run uses: `auto` is the checkpoint's own; expert-only dtypes need experts."""
    dtype = model.quantization if weight_dtype == "auto" else weight_dtype
    if dtype not in WEIGHT_DTYPE_BYTES:
        raise SpecError(
            f"model {model.name!r}: its checkpoint is quantized as {dtype!r}, which servesim does not "
            f"model; set engine.weight_dtype (allowed: {', '.join(WEIGHT_DTYPE_BYTES)})"
        )
    if dtype in EXPERT_ONLY_DTYPES and model.moe is None:
        raise SpecError(
            f"weight dtype {dtype!r} quantizes MoE experts only and model {model.name!r} has none; "
            f"allowed for it: {', '.join(d for d in WEIGHT_DTYPE_BYTES if d not in EXPERT_ONLY_DTYPES)}"
        )
    return dtype


#: vLLM's mxfp4 fused-MoE kernels store the experts padded: Marlin and TRT-LLM round hidden_size up to a multiple
#: of 256 (gpt-oss's 2880 becomes 3072, +6.7%), and the Hopper triton path's swizzled layout lands on the same
#: total. vLLM logs 64.4 GiB of weights for gpt-oss-120b (issue #33155, triton kernels; 66.0 GiB with Marlin,
#: which also pads the intermediate size, #23278), against 60.8 unpadded. The per-TP intermediate padding
#: (720 -> 768 at TP4) is not modelled.
MXFP4_HIDDEN_ALIGN = 256


def expert_padding(model: ModelSpec, weight_dtype: str) -> float:
    """How much larger routed experts are as a resolved `weight_dtype`'s kernels store and run them than their
    checkpoint shapes (mxfp4: hidden size padded to MXFP4_HIDDEN_ALIGN); 1 for every other dtype."""
    if weight_dtype != "mxfp4":
        return 1.0
    h = model.hidden_size
    return -(-h // MXFP4_HIDDEN_ALIGN) * MXFP4_HIDDEN_ALIGN / h


def weight_bytes(model: ModelSpec, weight_dtype: str) -> tuple[float, float]:
    """(bytes per dense-layer weight, bytes per routed-expert weight, padding included) for a resolved weight
    dtype: memory holds, and a step streams, the padded experts."""
    per_value = dtype_bytes(WEIGHT_DTYPE_BYTES, weight_dtype, "weight")
    if weight_dtype in EXPERT_ONLY_DTYPES:
        return WEIGHT_DTYPE_BYTES["bf16"], per_value * expert_padding(model, weight_dtype)
    return per_value, per_value


# ---- reading config.json ------------------------------------------------------------------------


class _Fields:
    """Typed access to a config dict; a missing or mistyped key names the file and the key."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw, self.source = raw, source

    def get(self, key: str, kind: type = int, default: Any = ...) -> Any:
        if key not in self.raw or self.raw[key] is None:
            if default is ...:
                raise SpecError(f"{self.source}: missing required field {key!r}")
            return default
        value = self.raw[key]
        if (
            kind is int
            and isinstance(value, bool)
            or not isinstance(value, kind if kind is not float else (int, float))
        ):
            raise SpecError(f"{self.source}: field {key!r} must be {kind.__name__}, got {value!r}")
        return value


def _layer_kinds(f: _Fields, num_layers: int) -> list[tuple[str, int | None]]:
    """Per layer ('full'|'sliding', window). Follows HF conventions: `layer_types`, Gemma 2 alternation, Mistral."""
    window = f.get("sliding_window", int, None)
    if "layer_types" in f.raw and f.raw["layer_types"] is not None:
        types = f.get("layer_types", list)
        if len(types) != num_layers:
            raise SpecError(f"{f.source}: layer_types has {len(types)} entries for {num_layers} layers")
        kinds = []
        for t in types:
            if t not in ("full_attention", "sliding_attention"):
                raise SpecError(
                    f"{f.source}: layer_types entry {t!r}; allowed: full_attention, sliding_attention"
                )
            kinds.append(("sliding", window) if t == "sliding_attention" else ("full", None))
        return kinds
    model_type = f.raw.get("model_type", "")
    if model_type == "gemma2" and window:
        return [("sliding", window) if i % 2 == 0 else ("full", None) for i in range(num_layers)]
    pattern = f.get("sliding_window_pattern", int, 0)
    # older Gemma 3 configs: every pattern-th layer full
    if model_type.startswith("gemma3") and window and pattern:
        return [("full", None) if (i + 1) % pattern == 0 else ("sliding", window) for i in range(num_layers)]
    uses_window = f.raw.get("use_sliding_window", model_type in ("mistral",))
    if window and uses_window and window < f.get("max_position_embeddings", int, 1 << 30):
        return [("sliding", window)] * num_layers
    return [("full", None)] * num_layers


def _kv_sources(kinds: list[tuple[str, int | None]], num_shared: int) -> list[int]:
    """Gemma 3n / YOCO: the last `num_shared` layers reuse the KV of the last earlier layer of the same kind."""
    n = len(kinds)
    first_shared = n - num_shared
    sources = list(range(n))
    for i in range(first_shared, n):
        same = [j for j in range(first_shared) if kinds[j][0] == kinds[i][0]]
        if not same:
            raise ValueError(f"layer {i} shares KV but no earlier layer has attention kind {kinds[i][0]!r}")
        sources[i] = same[-1]
    return sources


def _intermediates(f: _Fields, num_layers: int) -> list[int]:
    value = f.raw.get("intermediate_size")
    if isinstance(value, list):
        if len(value) != num_layers:
            raise SpecError(
                f"{f.source}: intermediate_size lists {len(value)} widths for {num_layers} layers"
            )
        return [int(v) for v in value]
    return [f.get("intermediate_size")] * num_layers


#: DeepSeek's routers that pick experts only from a token's best `topk_group` of `n_group` groups (V2, V3); V2-Lite's
#: "greedy" takes the top experts overall.
GROUP_LIMITED_TOPK = ("group_limited_greedy", "noaux_tc")


def _moe(f: _Fields) -> MoeSpec | None:
    if f.raw.get("n_routed_experts"):  # DeepSeek
        experts, k = f.get("n_routed_experts"), f.get("num_experts_per_tok")
        groups, chosen = (
            (f.get("n_group", int, 1), f.get("topk_group", int, 1))
            if f.raw.get("topk_method") in GROUP_LIMITED_TOPK
            else (1, 1)
        )
        if experts % groups or not 1 <= chosen <= groups or chosen * (experts // groups) < k:
            raise SpecError(
                f"{f.source}: n_group {groups} / topk_group {chosen} must split the {experts} experts "
                f"evenly and choose groups holding at least num_experts_per_tok ({k}) of them"
            )
        return MoeSpec(
            experts,
            k,
            f.get("moe_intermediate_size"),
            f.get("n_shared_experts", int, 0),
            num_groups=groups,
            groups_per_token=chosen,
        )
    if f.raw.get("num_local_experts"):  # Mixtral, gpt-oss: experts as wide as intermediate_size
        return MoeSpec(
            f.get("num_local_experts"),
            f.get("num_experts_per_tok"),
            f.get("intermediate_size"),
            biased=f.raw.get("model_type") == "gpt_oss",
        )
    if f.raw.get("num_experts"):  # Qwen MoE
        return MoeSpec(f.get("num_experts"), f.get("num_experts_per_tok"), f.get("moe_intermediate_size"))
    return None


def _moe_layers(f: _Fields, num_layers: int) -> list[bool]:
    """Which layers route to experts: DeepSeek's first_k_dense_replace, Qwen's decoder_sparse_step and
    mlp_only_layers; every layer otherwise."""
    first_dense = f.get("first_k_dense_replace", int, 0)
    step = f.get("decoder_sparse_step", int, 1)
    dense = set(f.get("mlp_only_layers", list, []))
    return [i >= first_dense and (i + 1) % step == 0 and i not in dense for i in range(num_layers)]


def checkpoint_dtype(raw: dict[str, Any]) -> str:
    """The weight dtype a checkpoint ships, from its `quantization_config`: fp8, mxfp4 (gpt-oss: experts only),
    NVIDIA ModelOpt's FP8 and NVFP4 and llm-compressor's NVFP4, AWQ/GPTQ at 4 or 8 bits; "bf16" without one. Other
    methods are kept by name (refused if served as `auto`)."""
    q = raw.get("quantization_config")
    if not isinstance(q, dict):
        return "bf16"
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "mxfp4"):
        return method
    algo = str(q.get("quant_algo", "")).lower()
    if method == "modelopt" and algo in ("fp8", "nvfp4"):
        return algo
    if method == "compressed-tensors" and q.get("format") == "nvfp4-pack-quantized":
        return "nvfp4"
    if method in ("awq", "gptq") and q.get("bits") in (4, 8):  # weight-only: activations stay bf16
        return "int4" if q["bits"] == 4 else "w8a16"
    return method or "unnamed quantization"


def _vector_params(f: _Fields) -> int:
    """Per-layer parameters outside the GEMMs: QK RMSNorms (Qwen3's, Gemma 3's, and any with `use_qk_norm`: per head,
    or over all heads at once as MiniMax-M2's), Gemma 2/3's extra feedforward norms, gpt-oss's attention sinks (one
    logit per head; in its weights, not its config)."""
    model_type = f.raw.get("model_type", "")
    head_dim = f.get("head_dim", int, f.get("hidden_size") // f.get("num_attention_heads"))
    qk_norms = (
        model_type in ("qwen3", "qwen3_moe") or model_type.startswith("gemma3") or f.raw.get("use_qk_norm")
    )
    if not qk_norms:
        params = 0
    elif (
        f.raw.get("qk_norm_type") == "per_layer"
    ):  # MiniMax-M2: one norm over all query heads, one over all KV
        heads = f.get("num_attention_heads")
        params = (heads + f.get("num_key_value_heads", int, heads)) * head_dim
    else:
        params = 2 * head_dim
    # pre- and post-feedforward norms besides the usual two
    if model_type in (
        "gemma2",
        "gemma3",
        "gemma3_text",
    ):
        params += 2 * f.get("hidden_size")
    return params + (f.get("num_attention_heads") if model_type == "gpt_oss" else 0)


def _mla(f: _Fields) -> MlaSpec | None:
    if not f.raw.get("kv_lora_rank"):
        return None
    return MlaSpec(
        f.get("kv_lora_rank"),
        f.get("q_lora_rank", int, None),
        f.get("qk_nope_head_dim"),
        f.get("qk_rope_head_dim"),
        f.get("v_head_dim"),
    )


def _gemma3n_extras(f: _Fields, num_layers: int) -> tuple[int, int, int]:
    """Gemma 3n's (per-layer linear, lookup-only, model-level linear) params: AltUp, LAuReL, per-layer inputs."""
    if "hidden_size_per_layer_input" not in f.raw:
        return 0, 0, 0
    h, p = f.get("hidden_size"), f.get("hidden_size_per_layer_input")
    per_layer = 2 * h * p + 2 * h * f.get("laurel_rank", int, 0)  # per-layer input gate + projection, LAuReL
    lookup = f.get("vocab_size_per_layer_input") * num_layers * p
    model_linear = 2 * (f.get("altup_num_inputs", int, 1) - 1) * h * h + h * num_layers * p
    return per_layer, lookup, model_linear


def _tied(raw: dict[str, Any]) -> bool:
    """HF's default for a missing `tie_word_embeddings` is the model class's: True for Gemma, False for most others."""
    if raw.get("tie_word_embeddings") is not None:
        return bool(raw["tie_word_embeddings"])
    return str(raw.get("model_type", "")).startswith("gemma")


#: Fields a config may leave to its transformers class (HF writes only what differs from the defaults).
#: Gemma3TextConfig: Google's Gemma 3 files omit these; every 6th layer is full attention.
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
        "head_dim": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "sliding_window_pattern": 6,
    },
}


def _vision_params(raw: dict[str, Any]) -> int:
    """Gemma 3's SigLIP vision tower (patch and position embeddings, pre-norm encoder layers with biases, a final
    norm) plus its projector (a vision x text matrix and an RMSNorm); 0 for other models."""
    vision, text = raw.get("vision_config"), raw.get("text_config")
    if raw.get("model_type") != "gemma3" or not isinstance(vision, dict) or not isinstance(text, dict):
        return 0
    f = _Fields(vision, "vision_config")
    h, inner, patch = f.get("hidden_size"), f.get("intermediate_size"), f.get("patch_size")
    positions = (f.get("image_size") // patch) ** 2
    embeddings = f.get("num_channels", int, 3) * patch * patch * h + h + positions * h
    layer = 4 * (h * h + h) + 2 * 2 * h + 2 * h * inner + inner + h
    return embeddings + f.get("num_hidden_layers") * layer + 2 * h + h * text.get("hidden_size", 0) + h


#: Architectures whose MLP is up -> activation -> down whatever their activation (transformers' modeling files),
#: and those gated whatever it is (Gemma 1: GeGLU under hidden_act "gelu"). Others: gated unless plain GeLU/ReLU.
PLAIN_MLP_TYPES = frozenset(
    {"gpt2", "gpt_bigcode", "starcoder2", "gpt_neox", "gptj", "phi", "falcon", "opt", "bloom", "mpt"}
)
GATED_MLP_TYPES = frozenset({"gemma"})


def _gated_mlp(raw: dict[str, Any]) -> bool:
    model_type = str(raw.get("model_type", ""))
    if model_type in GATED_MLP_TYPES:
        return True
    if model_type in PLAIN_MLP_TYPES:
        return False
    return raw.get("hidden_act", raw.get("hidden_activation", "silu")) not in ("gelu", "relu", "gelu_new")


#: Architectures whose `attention_bias` biases the q/k/v projections only (transformers' modeling files); for the
#: others it biases o_proj too (Llama's, gpt-oss's). Qwen2's q/k/v biases come without the key.
QKV_ONLY_BIAS_TYPES = frozenset({"glm4_moe"})


def _require_positive(source: str, key: str, value: int) -> None:
    if not value > 0:  # a zero width or count divides by zero, or prices a model with nothing in it
        raise SpecError(f"{source}: {key} must be a positive integer, not {value}")


#: config.json keys that mark a layer kind servesim does not model: read as if absent, the model would be priced
#: and sized wrongly (Nemotron-H's Mamba layers as attention, Llama 4's dense layers as MoE), so it is refused.
UNMODELLED_KEYS = {
    "hybrid_override_pattern": "Mamba (state-space) layers",
    "hybrid_layer_pattern": "layers of two attention shapes",
    "attention_chunk_size": "chunked local attention",
    "interleave_moe_layer_step": "MoE on every n-th layer with dense layers of another width",
    "index_topk": "sparse attention over indexer-chosen keys",
    "global_head_dim": "full-attention layers with heads of another size",
    "sparse_attention_config": "sparse attention over indexer-chosen keys",
    "dense_intermediate_size": "dense layers of another width",
    "shared_expert_intermediate_size": "a shared expert of its own width",
    "share_expert_dim": "a shared expert of its own width",
    "shared_intermediate_size": "a shared expert of its own width",
    "moe_shared_expert_intermediate_size": "a shared expert of its own width",
}


def _refuse_unmodelled(raw: dict[str, Any], source: str) -> None:
    """A config that sets an UNMODELLED_KEYS key (to anything but null, 0 or false; a MoE step of 1) is refused."""
    for key, what in UNMODELLED_KEYS.items():
        value = raw.get(key)
        if value in (None, 0, False) or (key == "interleave_moe_layer_step" and value == 1):
            continue
        raise SpecError(f"{source}: {key} ({what}) is not modelled; servesim would misprice this model")


def model_from_config(raw: dict[str, Any], name: str, source: str = "config.json") -> ModelSpec:
    """Build a ModelSpec from a parsed HF config dict (multimodal configs: their `text_config`, plus the vision
    tower's stored weights), missing fields taken from the transformers class's defaults in CLASS_DEFAULTS."""
    vision = _vision_params(raw)
    architecture = str((raw.get("architectures") or [""])[0])
    # the checkpoint's quantization is the whole model's, at the top
    if isinstance(raw.get("text_config"), dict):
        top = {"quantization_config": raw["quantization_config"]} if "quantization_config" in raw else {}
        raw = {
            **raw["text_config"],
            "model_type": raw["text_config"].get("model_type", raw.get("model_type", "")),
            **top,
        }
    model_type = raw.get("model_type", "")
    if not isinstance(model_type, str):
        raise SpecError(f"{source}: model_type: {model_type!r} is not a name (a string such as 'llama')")
    raw = {**CLASS_DEFAULTS.get(model_type, {}), **raw}
    _refuse_unmodelled(raw, source)
    f = _Fields(raw, source)
    hidden, num_heads = f.get("hidden_size"), f.get("num_attention_heads")
    num_layers = f.get("num_hidden_layers")
    for key, value in (
        ("hidden_size", hidden),
        ("num_attention_heads", num_heads),
        ("num_hidden_layers", num_layers),
    ):
        _require_positive(source, key, value)
    kv_heads = f.get("num_key_value_heads", int, num_heads)
    _require_positive(source, "num_key_value_heads", kv_heads)
    if kv_heads > num_heads or num_heads % kv_heads:
        raise SpecError(
            f"{source}: num_key_value_heads ({kv_heads}) must divide num_attention_heads ({num_heads})"
        )
    head_dim, vocab, max_len = (
        f.get("head_dim", int, hidden // num_heads),
        f.get("vocab_size"),
        f.get("max_position_embeddings"),
    )
    for key, value in (("head_dim", head_dim), ("vocab_size", vocab), ("max_position_embeddings", max_len)):
        _require_positive(source, key, value)
    kinds = _layer_kinds(f, num_layers)
    try:
        sources = _kv_sources(kinds, f.get("num_kv_shared_layers", int, 0))
    except ValueError as err:
        raise SpecError(f"{source}: {err}") from None
    moe = _moe(f)
    routed = _moe_layers(f, num_layers) if moe is not None else [False] * num_layers
    widths = _intermediates(f, num_layers)
    for width, is_routed in zip(widths, routed):
        if not is_routed:
            _require_positive(source, "intermediate_size", width)
    extra_linear, lookup, model_linear = _gemma3n_extras(f, num_layers)
    layers = tuple(
        LayerSpec(
            index=i,
            attention=kind,
            window=window,
            kv_source=sources[i],
            is_moe=routed[i],
            mlp_intermediate=0 if routed[i] else widths[i],
            extra_linear_params=extra_linear,
        )
        for i, (kind, window) in enumerate(kinds)
    )
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_embeddings=_tied(raw),
        layers=layers,
        max_position_embeddings=max_len,
        gated_mlp=_gated_mlp(raw),
        qkv_bias=bool(raw.get("attention_bias", raw.get("model_type") == "qwen2")),
        o_bias=bool(raw.get("attention_bias")) and raw.get("model_type") not in QKV_ONLY_BIAS_TYPES,
        mla=_mla(f),
        moe=moe,
        lookup_params=lookup,
        extra_linear_params=model_linear,
        vector_params_per_layer=_vector_params(f),
        vision_params=vision,
        quantization=checkpoint_dtype(raw),
        block_quantized=bool((raw.get("quantization_config") or {}).get("weight_block_size")),
        architecture=architecture,
    )


def load_model_file(path: Path, name: str | None = None) -> ModelSpec:
    """Read a local HF config.json; errors name the file and the field. Unnamed, the model takes its repo's id when
    the file is in the Hugging Face cache, its folder's name when it is a config.json, else the file's."""
    path = Path(path)
    if name is None and path.name == "config.json":
        name = repo_of(str(path)) or path.parent.name
    raw = read_json(path, "model config", finite=True)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return model_from_config(raw, name or path.stem, str(path))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def is_config_path(value: str) -> bool:
    """Whether a scenario's model (or draft model) names a config.json on disk rather than a bundled preset."""
    return value not in preset_names() and value.endswith(".json")


def resolve_model_name(value: str, what: str = "model") -> str:
    """What servesim reads for a model: a preset's name, or a config.json path. `value` may be either, a model
    folder holding a config.json, or a Hugging Face repo id (its preset, else its cached or fetched config.json);
    anything else is a SpecError listing the presets."""
    if value in preset_names() or is_config_path(value):
        return value
    if (config := snapshot_config(Path(value))) is not None:
        return str(config)
    if is_repo_id(value):
        return resolve_repo(value)
    raise SpecError(
        f"unknown {what} {value!r}; presets: {choices(preset_names(), value, 'servesim models list')} "
        "(or a config.json, folder or HF id)"
    )


def check_model_name(value: str, what: str = "model") -> str:
    """`resolve_model_name` for validators (its SpecError is a ValueError)."""
    return resolve_model_name(value, what)


@cache
def get_model(name_or_path: str) -> ModelSpec:
    """A bundled preset by name, a path to a config.json, a model folder or a Hugging Face repo id."""
    name = resolve_model_name(name_or_path)
    path = PRESET_DIR / f"{name}.json"
    if path.exists():
        return load_model_file(path, name)
    return load_model_file(Path(name))
