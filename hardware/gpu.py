"""GPU and interconnect specs as data: the bundled catalog plus user YAML files.

Every number in `catalog/gpus.yaml` and `catalog/interconnects.yaml` carries the
datasheet it came from. FLOP/s figures are *dense* (no 2:4 sparsity), bytes are
decimal (1 GB = 1e9 bytes) as vendors print them, and link bandwidths are per
direction.
"""

from __future__ import annotations

import difflib

from functools import cache
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, model_validator

from servesim.hardware.errors import SpecError, choices
from servesim.hardware.files import read_yaml
from servesim.hardware.spec_model import SpecModel

CATALOG_DIR = Path(__file__).parent / "catalog"

#: Compute dtypes a GPU may list peaks for; fp16 shares bf16's tensor-core rate on every GPU here.
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")


class InterconnectSpec(SpecModel):
    """A link between GPUs or nodes. Bandwidth per direction, latency per message."""

    name: str
    kind: str = Field(description="nvlink, xgmi, pcie, infiniband or roce")
    bytes_per_s: float = Field(gt=0, description="Usable bandwidth per direction per GPU, bytes/s")
    latency_s: float = Field(ge=0, description="Per-message latency, seconds")
    max_gpus: int | None = Field(
        None,
        ge=2,
        description=(
            "Most GPUs the link joins (a 2-card NVLink bridge: 2); a larger group in the node talks over PCIe"
        ),
    )
    source: str = Field(min_length=1, description="Where the numbers come from")


class GpuSpec(SpecModel):
    """One accelerator model. Units are in the field names."""

    name: str
    vendor: str
    memory_bytes: float = Field(gt=0, description="HBM/GDDR capacity as the datasheet prints it")
    device_memory_bytes: float | None = Field(
        None,
        gt=0,
        description=(
            "Total memory the driver reports (torch.cuda.mem_get_info), which vLLM multiplies by "
            "gpu_memory_utilization; default: memory_bytes"
        ),
    )
    memory_bytes_per_s: float = Field(gt=0, description="Peak memory bandwidth")
    peak_flop_per_s: dict[str, float] = Field(description="Dense peak per compute dtype")
    intra_node_link: str = Field(description="Name in the interconnect catalog used between GPUs of a node")
    pcie_gen: int = Field(ge=3, le=6)
    gpus_per_node: int = Field(ge=1)
    price_per_gpu_hour_usd: float = Field(gt=0, description="Default on-demand price; override per scenario")
    sources: list[str] = Field(min_length=1, description="Datasheets the numbers come from")
    compute_capability: float | None = Field(
        None,
        description=(
            "NVIDIA compute capability (8.0 Ampere, 8.9 Ada, 9.0 Hopper, 10.0 Blackwell): which kernels an engine "
            "picks, e.g. vLLM's FlashMLA needs 9.0 or newer"
        ),
    )
    notes: str = ""

    @model_validator(mode="after")
    def _known_dtypes(self) -> GpuSpec:
        unknown = set(self.peak_flop_per_s) - set(COMPUTE_DTYPES)
        if unknown:
            raise ValueError(
                f"peak_flop_per_s has unknown dtypes {sorted(unknown)}; allowed: {list(COMPUTE_DTYPES)}"
            )
        for need in ("fp32", "bf16"):
            if need not in self.peak_flop_per_s:
                raise ValueError(f"peak_flop_per_s must list {need!r}")
        return self

    @property
    def datacenter_blackwell(self) -> bool:
        """Compute capability 10.x (B200, B300, GB200, GB300), whose kernels engines pick apart from other GPUs'."""
        return 10 <= (self.compute_capability or 0) < 11

    @property
    def reported_memory_bytes(self) -> float:
        """What a serving engine sees as the device's total: datasheets print binary sizes as decimal GB
        (an H100's "80 GB" is 80 GiB of HBM3, of which the driver exposes 79.2 GiB = 85.0e9 bytes)."""
        return self.device_memory_bytes or self.memory_bytes

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for a compute dtype; fp16 falls back to bf16, missing low precisions to bf16 (a GPU
        without FP4 tensor cores runs FP4 weights dequantized, as vLLM's Marlin W4A16 kernels do on Hopper)."""
        fallbacks = {"fp16": "bf16", "fp4": "bf16", "fp8": "bf16", "int8": "bf16", "tf32": "fp32"}
        while dtype not in self.peak_flop_per_s:
            if dtype not in fallbacks:
                raise SpecError(
                    f"GPU {self.name!r} has no peak for dtype {dtype!r}; allowed: {list(COMPUTE_DTYPES)}"
                )
            dtype = fallbacks[dtype]
        return self.peak_flop_per_s[dtype]

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
        return self.peak_for(dtype) / self.memory_bytes_per_s


def _load_yaml_list(path: Path, key: str) -> list[dict]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise SpecError(f"{path}: expected a top-level '{key}:' list")
    return data[key]


def _parse(path: Path, key: str, cls: type[BaseModel]) -> dict[str, BaseModel]:
    specs = {}
    for i, raw in enumerate(_load_yaml_list(path, key)):
        try:
            spec = cls.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            field = "".join(f".{p}" for p in first["loc"])  # none for a check of the whole entry
            name = raw.get("name", f"#{i}") if isinstance(raw, dict) else f"#{i}"
            raise SpecError(
                f"{path}: {key}[{name}]{field}: {first['msg'].removeprefix('Value error, ')}"
            ) from None
        if spec.name in specs:
            raise SpecError(f"{path}: {key} {spec.name!r} is defined twice")
        specs[spec.name] = spec
    return specs


@cache
def interconnects() -> dict[str, InterconnectSpec]:
    """The bundled interconnect catalog, by name."""
    return _parse(CATALOG_DIR / "interconnects.yaml", "interconnects", InterconnectSpec)


@cache
def _bundled_gpus() -> dict[str, GpuSpec]:
    return _parse(CATALOG_DIR / "gpus.yaml", "gpus", GpuSpec)


def gpu_catalog(extra_files: tuple[Path, ...] = ()) -> dict[str, GpuSpec]:
    """Bundled GPUs plus those in user YAML files (same schema, `gpus:` list); user entries may not shadow."""
    specs = dict(_bundled_gpus())
    for path in extra_files:
        for name, spec in _parse(Path(path), "gpus", GpuSpec).items():
            if name in specs:
                raise SpecError(f"{path}: GPU {name!r} already exists in the catalog; pick another name")
            specs[name] = spec
    for spec in specs.values():
        if spec.intra_node_link not in interconnects():
            raise SpecError(
                f"GPU {spec.name!r}: intra_node_link {spec.intra_node_link!r} is unknown; "
                f"known: {sorted(interconnects())}"
            )
    return specs


def get_gpu(name: str, extra_files: tuple[Path, ...] = ()) -> GpuSpec:
    """Look a GPU up by exact name; the error lists the known names."""
    catalog = gpu_catalog(extra_files)
    try:
        return catalog[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(catalog), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = choices(sorted(catalog), name, "servesim hardware list")
        raise SpecError(f"unknown GPU {name!r}{hint} (known: {known})") from None


def get_interconnect(name: str) -> InterconnectSpec:
    """Look a link up by exact name; the error lists the known names."""
    try:
        return interconnects()[name]
    except KeyError:
        raise SpecError(
            f"unknown interconnect {name!r}; known: {choices(sorted(interconnects()), name)}"
        ) from None
