"""The device the executor runs on: honest step timing, and the CPU's measured peaks as a GPU-catalog entry.

Timing: every measured call is bracketed by device synchronisation (CUDA) and read with
`time.perf_counter`, so a step's time is wall time from host preparation to the sampled tokens, as an
engine step costs. On CPU the executor's `.tolist()` already waits for the result.

Peaks (CPU): FLOP/s of a large square matmul per dtype and bytes/s of a large copy (read + write),
median of a few runs. The cost model prices GEMMs at the `bf16` peak, so when the executor computes in
float32 the entry lists, under `bf16`, the larger of the two measured rates; it never understates what
the executor can reach, which keeps fitted efficiencies <= 1. The true per-dtype numbers are in `notes`.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from servesim.simulator.atomic import write_text_atomic


def keep_freed_memory() -> None:
    """Ask glibc to keep freed buffers up to 32 MiB for reuse instead of returning them to the OS.

    Without it every step's large activations are fresh mmap pages, and first-touch page faults cost
    more than the kernels on small CPU models (vLLM's CPU backend recommends tcmalloc for the same
    reason). Process-wide and harmless elsewhere; a no-op where glibc's mallopt is missing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def synchronize(device: str) -> None:
    """Wait for queued work on `device` (no-op on CPU, no CUDA call there)."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_call_s(fn: Callable[[], object], device: str, warmup: int = 2, repeats: int = 5) -> np.ndarray:
    """Seconds of each of `repeats` calls of fn() after `warmup` untimed calls, synchronised around each."""
    for _ in range(warmup):
        fn()
    times = np.empty(repeats)
    for i in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times[i] = time.perf_counter() - start
    return times


def device_name(device: str) -> str:
    """'NVIDIA H200' / the CPU model string, for provenance."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def measure_cpu_peaks(size: int = 1024, copy_bytes: int = 256 << 20, repeats: int = 5) -> dict[str, float]:
    """{'fp32': FLOP/s, 'bf16': FLOP/s, 'bytes_per_s': copy bandwidth} of this CPU (medians)."""
    import torch

    peaks = {name: _matmul_flop_per_s(dtype, size, repeats) for name, dtype in CPU_MATMUL_DTYPES.items()}
    src = torch.empty(copy_bytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    peaks["bytes_per_s"] = (
        2 * copy_bytes / float(np.median(time_call_s(lambda: dst.copy_(src), "cpu", 1, repeats)))
    )
    return peaks


CPU_MATMUL_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}

#: A square matmul stops growing once one call takes this long: long enough to reach the CPU's peak.
PEAK_CALL_S = 0.02


def _matmul_flop_per_s(dtype: str, max_size: int, repeats: int) -> float:
    """FLOP/s of a square `dtype` matmul whose side doubles from 128 up to `max_size` until one call takes
    PEAK_CALL_S: a dtype the CPU emulates (bf16 without AVX512-BF16 or AMX runs at ~1 GFLOP/s, 3 s a call at
    1024) is timed on a size that takes milliseconds, one it runs natively on a size that reaches its peak."""
    import torch

    size = 128
    while True:
        a = torch.randn(size, size, dtype=getattr(torch, dtype))
        b = torch.randn(size, size, dtype=a.dtype)
        if size >= max_size or float(time_call_s(lambda: a @ b, "cpu", 1, 1)[0]) >= PEAK_CALL_S:
            return 2 * size**3 / float(np.median(time_call_s(lambda: a @ b, "cpu", 1, repeats)))
        size *= 2


def _total_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16e9


def cpu_gpu_entry(
    peaks: dict[str, float],
    compute_dtype: str = "fp32",
    name: str = "cpu-local",
    today: dt.date | None = None,
) -> dict:
    """A `hardware.gpu.GpuSpec`-shaped dict for this CPU from `measure_cpu_peaks` output."""
    today = today or dt.date.today()
    bf16 = max(peaks["bf16"], peaks[compute_dtype]) if compute_dtype in peaks else peaks["bf16"]
    return {
        "name": name,
        "vendor": "cpu",
        "memory_bytes": _total_memory_bytes(),
        "memory_bytes_per_s": float(peaks["bytes_per_s"]),
        "peak_flop_per_s": {"fp32": float(peaks["fp32"]), "bf16": float(bf16)},
        "intra_node_link": "pcie4",
        "pcie_gen": 4,
        "gpus_per_node": 1,
        "price_per_gpu_hour_usd": 0.05,
        "sources": [f"measured by servesim calibrate on {today.isoformat()}"],
        "notes": (
            f"{device_name('cpu')}: {peaks['fp32'] / 1e9:.1f} GFLOP/s fp32 and {peaks['bf16'] / 1e9:.1f} "
            f"GFLOP/s bf16 ({peaks.get('size', 1024)}^3 matmul), {peaks['bytes_per_s'] / 1e9:.1f} GB/s copy "
            f"(read + write). bf16 lists max(bf16, {compute_dtype}) because the executor computes in "
            f"{compute_dtype} and the cost model prices GEMMs at the bf16 peak. "
            "Not measured: the link (a single CPU has no peer) and the price (a nominal figure)."
        ),
    }


def write_gpu_yaml(entry: dict, path: Path) -> Path:
    """Write one entry as a GPU catalog file (`gpus:` list) that `hardware.gpu.gpu_catalog((path,))` loads."""
    write_text_atomic(
        path,
        "# A CPU measured as a servesim device (schema: hardware.gpu.GpuSpec).\n"
        + yaml.safe_dump({"gpus": [entry]}, sort_keys=False),
    )
    return Path(path)
