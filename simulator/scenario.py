"""Scenario files: one YAML file describes the hardware, model, engine, policies, workload, SLOs and seed.

Loading never evaluates anything (yaml.safe_load only); every error names the file, the field path
and, for choices, the allowed values. `--set a.b=c` overrides are applied before validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hardware.errors import SpecError
from hardware.gpu import get_gpu
from hardware.model import preset_names
from policies.config import EngineConfig
from policies.catalog import orderings, routers, schedulers
from workloads.config import WorkloadConfig


class HardwareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str = Field(description="GPU name from the catalog (`servesim hardware list`) or a --gpu-file entry")
    gpu_files: list[Path] = Field(default_factory=list, description="Extra GPU catalog YAML files")
    profile: str | None = Field(None, description="Calibration profile name or YAML path; default: documented defaults")

    @model_validator(mode="after")
    def _known_gpu(self) -> HardwareConfig:
        if not self.gpu_files:  # with user files the lookup waits until paths are resolved
            get_gpu(self.gpu)
        return self


class ParallelismConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tp: int = Field(1, ge=1, description="Tensor-parallel GPUs per replica")
    pp: int = Field(1, ge=1, description="Pipeline stages per replica")


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    replicas: int = Field(1, ge=1, description="Identical engine replicas (data parallel)")
    router: str = Field("round_robin", description="Routing policy across replicas")


class SloConfig(BaseModel):
    """Latency targets in milliseconds; a completed request meeting all of them counts toward goodput."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)

    def as_ms(self) -> dict[str, float]:
        return {k.removesuffix("_ms"): v for k, v in self.model_dump().items() if v is not None}


class StopConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_sim_time_s: float | None = Field(None, gt=0, description="Stop the simulation at this simulated time")


class SimulationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    fast_forward: bool = Field(True, description="Fuse decode-only stretches (results identical to stepping)")


class Scenario(BaseModel):
    """A whole run. `model` is a preset name or a path to a Hugging Face config.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "scenario"
    seed: int = Field(0, ge=0, description="Seeds every random choice of the run")
    model: str
    hardware: HardwareConfig
    parallelism: ParallelismConfig = ParallelismConfig()
    cluster: ClusterConfig = ClusterConfig()
    engine: EngineConfig = EngineConfig()
    workload: WorkloadConfig
    slo: SloConfig = SloConfig()
    stop: StopConfig = StopConfig()
    simulation: SimulationConfig = SimulationConfig()

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in preset_names() and not value.endswith(".json"):
            raise ValueError(f"unknown model {value!r}; presets: {', '.join(preset_names())} (or a config.json path)")
        return value

    @field_validator("engine")
    @classmethod
    def _known_policies(cls, engine: EngineConfig) -> EngineConfig:
        schedulers.get(engine.scheduler)
        orderings.get(engine.queue_order)
        return engine

    @field_validator("cluster")
    @classmethod
    def _known_router(cls, cluster: ClusterConfig) -> ClusterConfig:
        routers.get(cluster.router)
        return cluster


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides; values are parsed as YAML scalars (numbers, booleans, lists)."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {item!r}: expected dotted.key=value")
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SpecError(f"--set {item!r}: {part!r} is not a section")
        node[leaf] = yaml.safe_load(text)
    return raw


def _first_error(err: ValidationError, source: str) -> SpecError:
    first = err.errors()[0]
    path = ".".join(str(p) for p in first["loc"]) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] == "literal_error":
        message = f"{message} (got {first['input']!r})"
    return SpecError(f"{source}: {path}: {message}")


def load_scenario(path: Path, overrides: list[str] = (), seed: int | None = None) -> tuple[Scenario, Path]:
    """Read, override and validate a scenario file. Returns it with the folder relative paths resolve against."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: scenario file not found") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a scenario is a mapping of sections (model, hardware, engine, workload, ...)")
    raw = apply_overrides(raw, list(overrides))
    if seed is not None:
        raw["seed"] = seed
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise _first_error(err, str(path)) from None
    hardware = scenario.hardware
    if hardware.gpu_files:  # user GPU files are relative to the scenario file, like traces
        files = [f if f.is_absolute() else path.parent / f for f in hardware.gpu_files]
        scenario = scenario.model_copy(update={"hardware": hardware.model_copy(update={"gpu_files": files})})
    return scenario, path.parent
