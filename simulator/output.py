"""A run folder, written atomically: it appears complete or not at all."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from simulator.atomic import atomic_dir
from simulator.run import RunResult
from simulator.scenario import with_absolute_paths


def json_text(data: Any, **kwargs: Any) -> str:
    """Strict JSON: a figure that is not a number (no request finished, no second token) is null, not NaN."""
    return json.dumps(_finite(data), allow_nan=False, **kwargs) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_run(result: RunResult, out: Path, base_dir: Path) -> Path:
    """requests.csv, steps.csv, summary.json, memory.json and the resolved scenario.yaml under `out`; `base_dir`
    (the scenario file's folder) makes the scenario's relative paths absolute, so it reruns from `out`."""
    with atomic_dir(out) as tmp:
        result.requests.to_csv(tmp / "requests.csv", index=False)
        result.steps.to_csv(tmp / "steps.csv", index=False)
        (tmp / "summary.json").write_text(json_text(result.summary, indent=2, sort_keys=True))
        memory = result.memory.as_dict() | {"num_blocks_used_by_engine": result.num_blocks}
        (tmp / "memory.json").write_text(json_text(memory, indent=2))
        scenario = with_absolute_paths(result.scenario, base_dir)
        (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    return Path(out)
