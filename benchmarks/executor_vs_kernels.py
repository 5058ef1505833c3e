"""The torch executor's step times on a GPU next to what vLLM's kernels take for the same steps.

For each model folder a lease wrote (`calibration/gpu_lease.sh`: grid.csv, steps_measured.csv), every grid
shape at full depth as
- `executor`: the bundled torch executor's measured step (median of its repeats),
- `floor`: the roofline at the device's peaks, no overheads (no step can beat it),
- `kernels`: `hardware.profile: measured`, the kernel latencies aiconfigurator-core measured for vLLM on this
  GPU, plus the roofline for what the tables lack, with no fixed overheads (vLLM replays decode as CUDA graphs),
then a fit of the served decode-only steps, time = a + b x requests: `a` is the executor's fixed cost per step.
Run: python benchmarks/executor_vs_kernels.py [DIR] [--markdown] [--rows]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibration.calibrate import row_batch, row_model
from servesim.hardware.cost import step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.profile import load_profile

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "calibration" / "measurements" / "h200-2026-12-04"


def kernels_s(cost) -> float:
    return sum(op.time_s for op in cost.operators if op.name != "overhead")


def shape_table(folder: Path, gpu: str) -> pd.DataFrame:
    """One row per full-depth grid shape: executor, floor and measured-kernel seconds."""
    grid = pd.read_csv(folder / "grid.csv", keep_default_na=False, na_values=[""])
    grid = grid[(grid["split"] != "served") & (grid["scale"] == "{}") & ~grid["fast_prefill"].astype(bool)]
    kernels = load_profile("measured").for_engine("vllm")
    spec = get_gpu(gpu)
    rows = []
    for row in grid.itertuples(index=False):
        cost = step_cost(row_batch(row), row_model(row.model, row.scale), spec, profile=kernels)
        rows.append(
            {
                "shape": row.shape,
                "kind": row.kind,
                "requests": row.num_requests,
                "executor_ms": 1e3 * row.time_s,
                "floor_ms": 1e3 * row.roofline_s,
                "kernels_ms": 1e3 * kernels_s(cost),
            }
        )
    out = pd.DataFrame(rows)
    return out.assign(ratio=out["executor_ms"] / out["kernels_ms"])


def decode_fit(folder: Path) -> tuple[float, float, int]:
    """(a, b) in seconds of time = a + b x requests over the served decode-only steps, and how many there were."""
    steps = pd.read_csv(folder / "steps_measured.csv")
    decode = steps[steps["prefill_tokens"] == 0]
    (a, b), *_ = np.linalg.lstsq(
        np.c_[np.ones(len(decode)), decode["num_requests"]], decode["execute_s"], rcond=None
    )
    return float(a), float(b), len(decode)


def markdown(table: pd.DataFrame) -> str:
    cells = [
        [f"{v:.2f}" if isinstance(v, float) else str(v) for v in row] for row in table.itertuples(index=False)
    ]
    lines = [list(table.columns), ["---"] * len(table.columns), *cells]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_DIR, help="a lease's results")
    parser.add_argument("--markdown", action="store_true", help="Markdown tables")
    parser.add_argument("--rows", action="store_true", help="every shape, not only the medians per kind")
    args = parser.parse_args()
    for model_dir in sorted(p for p in args.folder.iterdir() if (p / "grid.csv").exists()):
        gpu = json.loads((model_dir / "calibration.json").read_text())["gpu"]
        table = shape_table(model_dir, gpu)
        a, b, n = decode_fit(model_dir)
        print(
            f"\n{model_dir.name} on {gpu}: served decode-only steps ({n}) = {1e3 * a:.1f} ms "
            f"+ {1e3 * b:.3f} ms x requests"
        )
        shown = table if args.rows else table.groupby("kind", as_index=False).median(numeric_only=True)
        columns = ["shape", "kind"] if args.rows else ["kind"]
        shown = shown[[*columns, "requests", "executor_ms", "floor_ms", "kernels_ms", "ratio"]]
        print(
            markdown(shown)
            if args.markdown
            else shown.to_string(index=False, float_format=lambda v: f"{v:.2f}")
        )


if __name__ == "__main__":
    main()
