"""Measured-kernel step times next to the raw tables' sums and the roofline defaults.

For Llama-3.1-8B and Llama-3.1-70B at TP 1, 2 and 4 on an H100 SXM and an H200 under vLLM: decode steps of 1, 64
and 256 requests over 1K and 8K cached tokens and one 4,096-token prefill, each as
- `measured`: the kernels of `hardware.profile: measured` (what it prices from the tables, with the elementwise
  kernels it adds; no fixed overheads),
- `tables`: the same kernels summed by hand from the raw parquet files (`table_sums.py`, an independent oracle),
- `defaults`: the roofline at the documented default efficiencies (its kernels, no fixed overheads).
- `--vs PROFILE` (repeatable): another profile's, e.g. the one `calibration/gpu_lease.sh` fits on a GPU, each beside
  the measured one (a fitted profile's fixed overheads are left out too, so the columns compare kernels).
Run: python benchmarks/kernel_tables_vs_roofline.py [--markdown] [--gpu h200] [--vs PATH/profile.yaml]
"""

from __future__ import annotations

import argparse

from servesim.hardware.cost import Parallelism, step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.profile import Profile, load_profile
from table_sums import TableSums, cases

OVERHEADS = ("overhead",)


def kernels_ms(cost) -> float:
    return 1e3 * sum(op.time_s for op in cost.operators if op.name not in OVERHEADS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--markdown", action="store_true", help="a Markdown table (as docs/measured-kernels.md shows)"
    )
    parser.add_argument("--gpu", action="append", choices=["h100-sxm", "h200"], help="only these GPUs")
    parser.add_argument(
        "--vs", action="append", default=[], help="another profile (name or YAML) to set beside"
    )
    args = parser.parse_args()
    measured, defaults, others = load_profile("measured"), Profile(), [load_profile(p) for p in args.vs]
    header = (
        "gpu",
        "model",
        "tp",
        "step",
        "measured ms",
        "tables ms",
        "diff",
        "defaults ms",
        "defaults/measured",
        *(f"{p.name} ms" for p in others),
    )
    print(
        ("| " + " | ".join(header) + " |\n|" + "---|" * len(header)) if args.markdown else "  ".join(header)
    )
    for gpu in args.gpu or ["h100-sxm", "h200"]:
        sums = TableSums(gpu)
        for model, tp, (batch, context, new), step in cases(gpu):
            costs = [
                step_cost(step, model, get_gpu(gpu), Parallelism(tp=tp), p)
                for p in (measured, defaults, *others)
            ]
            # the oracle sums the kernels the tables hold; the embedding and logits gathers and the elementwise
            # kernels are the roofline's
            extra = sum(
                op.time_s
                for op in costs[0].operators
                if op.name in ("embedding", "logits_gather", "elementwise")
            )
            table = 1e3 * (sums.step_s(model, tp, batch, context, new) + extra)
            mine, roof = kernels_ms(costs[0]), kernels_ms(costs[1])
            shape = f"prefill {new}" if new > 1 else f"decode {batch} x {context // 1024}K"
            row = (
                gpu,
                model.name,
                str(tp),
                shape,
                f"{mine:.3f}",
                f"{table:.3f}",
                f"{mine / table - 1:+.1%}",
                f"{roof:.3f}",
                f"{roof / mine:.2f}",
                *(f"{kernels_ms(cost):.3f}" for cost in costs[2:]),
            )
            print(("| " + " | ".join(row) + " |") if args.markdown else "  ".join(row))


if __name__ == "__main__":
    main()
