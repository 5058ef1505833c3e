"""Golden outputs of the bundled scenarios: what each prints to summary.json and memory.json, and its tables' sizes
and totals, for the first STOP_S simulated seconds. A change that should not move numbers leaves them as they are
(tests/test_golden.py); one that should is followed by `python -m tests.golden.outputs`, which rewrites them, and
its commit says why they moved.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("outputs.json")
STOP_S = 20.0
#: Table columns whose totals stand for the whole table (every request's latencies, every step's work).
TOTALS = {
    "requests": ("prompt_tokens", "output_tokens", "cached_tokens", "ttft_s", "e2el_s"),
    "steps": ("duration_s", "prefill_tokens", "decode_tokens", "num_running", "kv_usage"),
}


def scenarios() -> list[Path]:
    """The bundled scenarios `servesim simulate` runs (a plan file is planned, not simulated)."""
    return sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if not p.stem.startswith("plan_"))


def outputs(path: Path) -> dict:
    """What one bundled scenario's run, stopped at STOP_S, writes: summary, memory plan, table sizes and totals."""
    from servesim.simulator.world.run import simulate
    from servesim.simulator.scenario import load_scenario

    s, base = load_scenario(path, [f"stop.max_sim_time_s={STOP_S}"])
    result = simulate(s, base)
    tables = {"requests": result.requests, "steps": result.steps}
    return {
        "summary": json.loads(json.dumps(result.summary, default=float)),
        "memory": json.loads(json.dumps(result.memory.as_dict(), default=float)),
        "tables": {
            name: {"rows": len(table)}
            | {c: float(table[c].fillna(0).sum()) for c in TOTALS[name] if c in table}
            for name, table in tables.items()
        },
    }


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({p.stem: outputs(p) for p in scenarios()}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
