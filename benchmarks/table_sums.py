"""An independent oracle for the measured-kernel profile: a dense Llama step's kernels summed by hand from the raw
aiconfigurator-core tables (pandas and scipy only, none of servesim's lookup code), a point far slower than a larger
one read as that one's, as servesim's rule says. `tests/hardware/test_kernel_tables.py`
checks servesim's measured-kernel step times against it within 5%; `kernel_tables_vs_roofline.py` prints both.
"""

import math

import numpy as np
import pandas as pd
from scipy.interpolate import RegularGridInterpolator

from servesim.hardware.batch import StepBatch
from servesim.hardware.kernel_tables import SYSTEMS, data_root
from servesim.hardware.model import get_model

VLLM = {
    gpu: "0.24.0" for gpu in ("h100-sxm", "h200", "b300", "gb200", "gb300")
}  # the builds whose tables the oracle reads
MODELS = ("llama-3.1-8b", "llama-3.1-70b")
TPS = (1, 2, 4)
#: (batch, cached tokens, new tokens): decodes at 1, 64 and 256 requests over 1K and 8K, and one 4K-token prefill.
SHAPES = [
    (1, 1024, 1),
    (64, 1024, 1),
    (256, 1024, 1),
    (1, 8192, 1),
    (64, 8192, 1),
    (256, 8192, 1),
    (1, 0, 4096),
]


def cases(gpu: str):
    """(model, tp, (batch, cached, new), the step's batch) of every model, TP size and shape checked on `gpu`."""
    for name in MODELS:
        model = get_model(name)
        for tp in TPS:
            for shape in SHAPES:
                batch, context, new = shape
                yield model, tp, shape, StepBatch.of(np.full(batch, new), np.full(batch, context))


def vllm_table(gpu: str, family: str, name: str) -> pd.DataFrame:
    return pd.read_parquet(data_root() / SYSTEMS[gpu] / family / "vllm" / VLLM[gpu] / name)


def log_interpolator(frame: pd.DataFrame, axes: list[str]) -> RegularGridInterpolator:
    """An independent reference: scipy's multilinear interpolation of log latency over log axes."""
    values = [np.sort(frame[a].unique()) for a in axes]
    grid = np.full([len(v) for v in values], np.nan)
    grid[tuple(np.searchsorted(v, frame[a]) for v, a in zip(values, axes))] = np.log(frame.latency * 1e-3)
    return RegularGridInterpolator([np.log(v.astype(float)) for v in values], grid)


def without_dispatch_anomalies(frame: pd.DataFrame, shape: list[str], along: str, tolerance: float = 0.25):
    """`frame` with each latency more than `tolerance` above the least at or past it along `along` (same `shape`
    columns) lowered to that least: the module under test's rule (work of fewer rows or bytes can run padded)."""
    frame = frame.sort_values([*shape, along])
    least = frame.iloc[::-1].groupby(shape, sort=False)["latency"].cummin().iloc[::-1]
    return frame.assign(latency=frame.latency.where(frame.latency <= (1 + tolerance) * least, least))


class TableSums:
    """The tables' per-layer op latencies of a dense Llama step, summed by hand from the raw parquet files."""

    def __init__(self, gpu: str):
        gemm = vllm_table(gpu, "gemm", "gemm_perf.parquet")
        bf16 = without_dispatch_anomalies(gemm[gemm.gemm_dtype == "bfloat16"], ["n", "k"], "m")
        self.gemm = log_interpolator(bf16, ["m", "n", "k"])
        self.attention = {}
        for decode, name in (
            (True, "generation_attention_perf.parquet"),
            (False, "context_attention_perf.parquet"),
        ):
            frame = vllm_table(gpu, "attention", name)
            frame = frame[
                (frame.kv_cache_dtype == "bfloat16")
                & (frame.window_size == 0)
                & (frame.head_dim == 128)
                & (frame.kernel_source == frame.kernel_source.mode()[0])
            ]
            self.attention[decode] = {
                (heads, kv): rows.assign(length=rows.isl + rows.step).pivot(
                    index="batch_size", columns="length", values="latency"
                )
                * 1e-3
                for (heads, kv), rows in frame.groupby(["num_heads", "num_key_value_heads"])
            }
        comm = vllm_table(gpu, "comm", "custom_allreduce_perf.parquet")
        self.comm = {
            gpus: log_interpolator(
                without_dispatch_anomalies(rows, ["num_gpus"], "message_size"), ["message_size"]
            )
            for gpus, rows in comm[comm.backend == "vllm_graph"].groupby("num_gpus")
        }

    def gemm_s(self, m, n, k):
        pieces = math.ceil(n / 65536)
        return pieces * math.exp(self.gemm([math.log(m), math.log(n / pieces), math.log(k)])[0])

    def attention_s(self, decode, heads, kv, batch, length):
        """Along the measured row of `batch` requests (a batch the tables hold), log-log between the lengths around
        `length`; halving the batch where the row stops short of it, the rule of the module under test."""
        table = self.attention[decode][(heads, kv)]
        pieces = 1
        while True:
            row = table.loc[batch // pieces].dropna()
            if row.index[0] <= length <= row.index[-1]:
                return pieces * math.exp(
                    np.interp(math.log(length), np.log(row.index), np.log(row.to_numpy()))
                )
            pieces *= 2

    def step_s(self, model, tp, batch, context, new):
        """Kernel seconds of `batch` requests each adding `new` tokens to `context` cached ones (one logit each)."""
        h, heads, kv, hd = model.hidden_size, model.num_heads // tp, model.num_kv_heads // tp, model.head_dim
        rows, inter = batch * new, model.layers[0].mlp_intermediate // tp
        layer = (
            self.gemm_s(rows, (heads + 2 * kv) * hd, h)
            + self.gemm_s(rows, h, heads * hd)
            + self.gemm_s(rows, 2 * inter, h)
            + self.gemm_s(rows, h, inter)
        )
        if new == 1:
            layer += self.attention_s(True, heads, kv, batch, context + 1)
        else:
            assert context == 0
            layer += self.attention_s(False, heads, kv, batch, new)
        total = model.num_layers * layer + self.gemm_s(batch, model.vocab_size / tp, h)
        if tp > 1:
            message = math.log(rows * h)  # the table counts bf16 elements
            total += (2 * model.num_layers + 1) * math.exp(self.comm[tp]([message])[0])
        return total
