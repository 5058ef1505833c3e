"""A run folder, written atomically: it appears complete or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from simulator.atomic import atomic_dir
from simulator.run import RunResult


def write_run(result: RunResult, out: Path) -> Path:
    """requests.csv, steps.csv, summary.json, memory.json and the resolved scenario.yaml under `out`."""
    with atomic_dir(out) as tmp:
        result.requests.to_csv(tmp / "requests.csv", index=False)
        result.steps.to_csv(tmp / "steps.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(result.summary, indent=2, sort_keys=True) + "\n")
        memory = result.memory.as_dict() | {"num_blocks_used_by_engine": result.num_blocks}
        (tmp / "memory.json").write_text(json.dumps(memory, indent=2) + "\n")
        (tmp / "scenario.yaml").write_text(yaml.safe_dump(result.scenario.model_dump(mode="json"), sort_keys=False))
    return Path(out)
