"""The `disaggregation:` section of a scenario: a prefill pool and a decode pool, and how KV moves between them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_interconnect
from servesim.hardware.spec_model import MAX_PARALLEL, MAX_REPLICAS, SpecModel


def known_link(name: str) -> str:
    """`name` if the catalog has such an interconnect; else a validation error listing those it has."""
    try:
        get_interconnect(name)
    except SpecError as err:
        raise ValueError(str(err)) from None
    return name


class PoolConfig(SpecModel):
    """One pool of identical replicas. Unset fields take the scenario's values."""

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Replicas in the pool")
    gpu: str | None = Field(None, description="GPU of this pool (default: hardware.gpu)")
    tp: int = Field(1, ge=1, le=MAX_PARALLEL, description="Tensor-parallel GPUs per replica")
    pp: int = Field(1, ge=1, le=MAX_PARALLEL, description="Pipeline stages per replica")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="Engine knobs overriding the scenario's engine"
    )
    router: str = Field("least_outstanding", description="How a request picks a replica of this pool")


class TransferConfig(SpecModel):
    """KV hand-off from a prefill replica to a decode replica.

    `direct`: over `link` (an interconnect catalog name, per GPU: every GPU of both replicas has its own),
    one transfer at a time per prefill replica (per attention rank under DP attention; later ones queue), once
    the prefill is done: vLLM's NixlConnector reads the blocks then ("does not do layerwise saving"). Each
    decode GPU pulls what it holds: its share of the KV heads, or MLA's whole latent, which every TP rank
    keeps; the transfer lasts as long as the busier end, one decode GPU's share or one prefill GPU's part of
    all the pulls. With
    `streaming` (layer-wise connectors, as Splitwise and the seed describe), each layer's KV is sent as soon
    as the layer is computed, so only what is left after the last layer delays the decode. `store`: through
    a shared KV store tier (Mooncake Store / LMCache style): the KV is written once, split over the prefill
    GPUs, as soon as it is prefilled (which frees the prefill's blocks), then each decode GPU reads its share
    once the decode side has reserved, at `store_bytes_per_s` per GPU, `store_channels` transfers at a time.
    """

    kind: Literal["direct", "store"] = "direct"
    link: str = Field(
        "ib-ndr-400", description="Interconnect name (`servesim hardware` lists links in the catalog)"
    )
    streaming: bool = Field(
        False,
        description=(
            "Layer-wise KV streaming overlapping the prefill (off: the whole KV moves after it, as vLLM's NixlConnector)"
        ),
    )
    store_bytes_per_s: float = Field(
        25e9, gt=0, description="store: write and read bandwidth per GPU, bytes/s"
    )
    store_latency_s: float = Field(50e-6, ge=0, description="store: per-transfer latency, s")
    store_channels: int = Field(8, ge=1, description="store: transfers it serves at once")

    @field_validator("link")
    @classmethod
    def _known_link(cls, value: str) -> str:
        return known_link(value)

    @model_validator(mode="after")
    def _streaming_is_direct(self) -> TransferConfig:
        if self.kind == "store" and self.streaming:
            raise ValueError(
                "streaming: layer-wise streaming is modelled for kind 'direct' only; the store tier "
                "moves the whole KV after the prefill: set streaming false or kind 'direct'"
            )
        return self


class DisaggregationConfig(SpecModel):
    """xPyD: `prefill.replicas` prefill replicas and `decode.replicas` decode replicas."""

    prefill: PoolConfig
    decode: PoolConfig
    transfer: TransferConfig = TransferConfig()
