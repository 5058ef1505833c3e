"""What a scenario's deployment costs: the GPUs of its replicas, prefill/decode pools or pipeline stages, at each
GPU's catalog price."""

from __future__ import annotations

from pathlib import Path

from servesim.hardware.gpu import get_gpu
from servesim.simulator.scenario import Scenario


def gpu_counts(s: Scenario) -> dict[str, int]:
    """GPUs the scenario deploys, by catalog name."""
    counts: dict[str, int] = {}

    def add(gpu: str | None, n: int) -> None:
        name = gpu or s.hardware.gpu
        counts[name] = counts.get(name, 0) + n

    if s.stages:
        for stage in s.stages:
            add(stage.gpu, stage.replicas * stage.tp)
    elif s.disaggregation is not None:
        for pool in (s.disaggregation.prefill, s.disaggregation.decode):
            add(pool.gpu, pool.replicas * pool.tp * pool.pp)
    else:
        add(None, s.cluster.replicas * s.parallelism.tp * s.parallelism.pp)
    return counts


def cost_per_hour_usd(s: Scenario) -> float:
    """The deployment's GPUs times their prices (USD/h)."""
    files = tuple(Path(f) for f in s.hardware.gpu_files)
    return sum(n * get_gpu(name, files).price_per_gpu_hour_usd for name, n in gpu_counts(s).items())
