"""Scaled-down copies of catalog models that keep what the cost model cares about, as data (no torch).

`scale_model(spec, layers=4, hidden=64)` keeps the model's layer-kind pattern (full / sliding
window), its trailing KV-sharing layers (YOCO / Gemma 3n), MoE routing and GQA ratio, and shrinks
the widths. The result is built by writing a Hugging Face style config and reading it back with
`hardware.model.model_from_config`, so `spec_to_config(scaled)` is a config.json the simulator
loads into exactly the same `ModelSpec` (the validate loop relies on that).

What the executor does not run is dropped here, so the cost model prices what is executed:
Gemma 3n's AltUp / LAuReL / per-layer-input projections and tables. MLA models are not supported.
"""

from __future__ import annotations

from typing import Any

from servesim.hardware.errors import SpecError
from servesim.hardware.model import LayerSpec, ModelSpec, model_from_config

#: The keyword arguments `scale_model` accepts, as the CLI's `--scale k=v,...` spells them.
SCALE_KEYS = (
    "layers",
    "kv_shared",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate",
    "vocab",
    "experts",
    "window",
)


def parse_scale(text: str | None) -> dict[str, int]:
    """'layers=4,hidden=256' -> {'layers': 4, 'hidden': 256}; unknown keys name the allowed ones."""
    scale: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in SCALE_KEYS or not value.strip().isdigit():
            raise SpecError(f"--scale {item!r}: expected key=integer with key one of {', '.join(SCALE_KEYS)}")
        scale[key] = int(value)
    return scale


def _pick(items: list[LayerSpec], count: int) -> list[LayerSpec]:
    """The last `count` items (cycling from the start when more are asked for than exist)."""
    return [items[(len(items) - count + i) % len(items)] for i in range(count)] if count else []


def _layer_plan(spec: ModelSpec, layers: int | None, kv_shared: int | None) -> tuple[list[LayerSpec], int]:
    """(chosen original layers in order, number of trailing KV-sharing layers among them)."""
    own = [layer for layer in spec.layers if layer.owns_kv]
    shared = [layer for layer in spec.layers if not layer.owns_kv]
    total = layers or spec.num_layers
    if kv_shared is None:
        kv_shared = round(total * len(shared) / spec.num_layers) if shared else 0
        kv_shared = min(max(kv_shared, 1 if shared and total > 1 else 0), total - 1)
    if not 0 <= kv_shared < total:
        raise SpecError(f"kv_shared={kv_shared} must leave at least one KV-owning layer of {total}")
    if kv_shared and not shared:
        raise SpecError(f"{spec.name} has no KV-sharing layers to keep (kv_shared={kv_shared})")
    # Gemma 3n: the last owning layers hold both kinds; shared layers reuse the last owner of their kind
    return _pick(own, total - kv_shared) + _pick(shared, kv_shared), kv_shared


def _config(
    spec: ModelSpec,
    chosen: list[LayerSpec],
    kv_shared: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    widths: list[int],
    vocab: int,
    experts: int | None,
    window: int | None,
) -> dict[str, Any]:
    sliding = any(layer.attention == "sliding" for layer in chosen)
    raw: dict[str, Any] = {
        "model_type": "servesim_scaled",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "num_hidden_layers": len(chosen),
        "intermediate_size": widths,
        "layer_types": [
            "sliding_attention" if layer.attention == "sliding" else "full_attention" for layer in chosen
        ],
        "sliding_window": window if sliding else None,
        "num_kv_shared_layers": kv_shared,
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_embeddings,
        "hidden_act": "silu" if spec.gated_mlp else "gelu",
        "attention_bias": spec.qkv_bias,
    }
    if spec.moe is not None:
        raw["num_local_experts"] = experts
        raw["num_experts_per_tok"] = min(spec.moe.experts_per_token, experts)
    return raw


def scale_model(
    spec: ModelSpec,
    *,
    layers: int | None = None,
    kv_shared: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate: int | None = None,
    vocab: int | None = None,
    experts: int | None = None,
    window: int | None = None,
) -> ModelSpec:
    """A smaller `spec` with the same layer pattern. Unset widths keep the original's; `heads` defaults
    to the original head count, `kv_heads` to the original q/kv ratio, `head_dim` to hidden // heads when
    hidden or heads change. `kv_shared` defaults to the original share of KV-sharing layers."""
    if spec.mla is not None:
        raise SpecError(f"{spec.name}: MLA models are not supported by the calibration executor")
    if spec.moe is not None and spec.moe.num_shared_experts:
        raise SpecError(f"{spec.name}: shared experts are not supported by the calibration executor")
    chosen, n_shared = _layer_plan(spec, layers, kv_shared)
    hidden_size = hidden or spec.hidden_size
    num_heads = heads or spec.num_heads
    num_kv = kv_heads or max(1, num_heads * spec.num_kv_heads // spec.num_heads)
    if num_heads % num_kv:
        raise SpecError(f"heads={num_heads} must be a multiple of kv_heads={num_kv}")
    dim = head_dim or (hidden_size // num_heads if (hidden or heads) else spec.head_dim)
    if spec.moe is not None:
        widths = intermediate or spec.moe.expert_intermediate
    else:
        widths = [intermediate or layer.mlp_intermediate for layer in chosen]
    win = window or next((layer.window for layer in chosen if layer.window), None)
    raw = _config(
        spec,
        chosen,
        n_shared,
        hidden_size,
        num_heads,
        num_kv,
        dim,
        widths,
        vocab or spec.vocab_size,
        experts or (spec.moe.num_experts if spec.moe else None),
        win,
    )
    given = {
        k: v
        for k, v in dict(
            layers=layers,
            kv_shared=kv_shared,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=intermediate,
            vocab=vocab,
            experts=experts,
            window=window,
        ).items()
        if v is not None
    }
    name = f"{spec.name}@" + (",".join(f"{k}={v}" for k, v in given.items()) or "executor")
    return model_from_config(raw, name, f"scale_model({spec.name})")


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    """An HF-style config dict that `model_from_config` reads back into `spec` (checked; raises if not)."""
    if spec.mla is not None or spec.extra_linear_params or spec.lookup_params:
        raise SpecError(
            f"{spec.name}: only scale_model() outputs (no MLA, no Gemma 3n extras) can be written"
        )
    kv_shared = sum(not layer.owns_kv for layer in spec.layers)
    widths: Any = (
        spec.moe.expert_intermediate if spec.moe else [layer.mlp_intermediate for layer in spec.layers]
    )
    window = next((layer.window for layer in spec.layers if layer.window), None)
    raw = _config(
        spec,
        list(spec.layers),
        kv_shared,
        spec.hidden_size,
        spec.num_heads,
        spec.num_kv_heads,
        spec.head_dim,
        widths,
        spec.vocab_size,
        spec.moe.num_experts if spec.moe else None,
        window,
    )
    if spec.moe is not None:
        raw["num_experts_per_tok"] = spec.moe.experts_per_token
    if model_from_config(raw, spec.name) != spec:
        raise SpecError(f"{spec.name}: cannot be written as a config.json that reads back identically")
    return raw
