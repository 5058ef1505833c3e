"""Measured kernel latencies: one operator on one GPU, as an engine's own kernels run it, from aiconfigurator-core.

NVIDIA's `aiconfigurator-core` package (Apache-2.0; `pip install -e ".[kernels]"`) ships, per GPU and engine build,
tables of measured latencies: GEMMs by (m, n, k, dtype), prefill ("context") attention by (batch, prompt length,
heads, KV heads, head dim, window, KV dtype), decode ("generation") attention by (batch, KV length, ...) and the
engine's custom all-reduce by (GPUs, message bytes), collected with the engines' kernels (its `collector/`). servesim
reads the tables, never the package's code. A shape is looked up by interpolating log latency linearly in the log of
each coordinate between the grid points around it, as the tables are spaced geometrically. Below a grid the time is
held at its smallest entry (launch-bound); past a GEMM's or all-reduce's largest size, or an attention table's
largest batch at a length, the work is split into pieces that fit (rows, columns, message bytes, requests add up);
anywhere else outside a grid, or for a dtype or layout the tables lack, a lookup returns None and the cost model
prices that operator with its roofline.
"""

from __future__ import annotations

import bisect
import functools
import importlib.metadata
import importlib.util
import itertools
import math
import re
from pathlib import Path

import numpy as np

from servesim.hardware.errors import SpecError

#: servesim's GPU catalog names -> aiconfigurator-core's system folders (GPUs it measured).
SYSTEMS = {
    "h100-sxm": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "a100-80gb": "a100_sxm",
    "l40s": "l40s",
}
#: Engines with tables of their own; `kernels: engine` takes those of the engine the scenario's scheduler imitates
#: (its family's `kernel_tables`; vLLM's for the schedulers that imitate none).
FRAMEWORKS = ("vllm", "sglang", "trtllm")
ENGINE = "engine"
#: servesim's dtype names -> the tables' (bf16 GEMMs; fp8 per-tensor scaled; NVFP4, measured on Blackwell; KV caches
#: in bf16 or fp8).
GEMM_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "bfloat16",
    "fp8": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
}
KV_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
#: ... and of routed experts' fused-MoE kernels (mxfp4 and int4 are weight-only there: W4A16).
MOE_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "bfloat16",
    "fp8": "fp8",
    "fp8_block": "fp8_block",
    "mxfp4": "w4a16_mxfp4",
    "int4": "int4_wo",
    "nvfp4": "nvfp4",
}
#: Engines that feed MXFP4 experts MXFP8 activations on data-center Blackwell (compute capability 10.x): TensorRT-LLM's
#: default MoE backends for gpt-oss there (TRTLLM; CUTLASS before 1.2) run W4A8_MXFP4_MXFP8, its gpt-oss deployment
#: guide's support matrix; vLLM and SGLang keep them in BF16 unless told otherwise.
MXFP8_MOE_ACTIVATIONS = {"trtllm"}
#: Engines whose per-tensor FP8 GEMM tables were measured with dynamic activation scales: aiconfigurator's TensorRT-LLM
#: collector gives its Linear no input scale, so each call computes one (an amax pass) before quantizing, where a
#: static-scale checkpoint (ModelOpt's) does not; vLLM's collector measures the static path. Its `computescale`
#: table holds that difference (dynamic less static), its `scale_matrix` table the static quantization alone.
DYNAMIC_FP8_GEMMS = frozenset({"trtllm"})
#: GEMM rows that do not time what the engine serves with, priced from the named engine's table of the same GPU (the
#: same kernels, timed as served). TensorRT-LLM's NVFP4 rows run its autotuner's fallback tactic: the server tunes
#: `nvfp4_gemm` among its backends at warmup, aiconfigurator's collector never does (21 us for a 4-row GEMM on the
#: B200, against 11 us for vLLM's tuned FlashInfer CuTe DSL kernel, one of those backends). vLLM's block-FP8 rows
#: carry 60-180 us of host work a call, flat in the shape (a 64 x 128 GEMM takes 85 us on the H200), which its CUDA
#: graphs remove when serving; SGLang's table times the same DeepGEMM kernel at 12-40 us. Where the named engine
#: has no such table (vLLM's Triton block-FP8 rows on the L40S: 300-350 us), the roofline prices them.
GEMM_STAND_INS = {"trtllm": {"nvfp4": "vllm"}, "vllm": {"fp8_block": "sglang"}}
#: The floor a `computescale` difference is held at (ms): TensorRT-LLM's collector stores it unclamped, so a few are
#: not positive, and the tables are read in log space.
LEAST_DIFFERENCE_MS = 1e-6
MS = 1e-3
INSTALL_HINT = 'pip install -e ".[kernels]"'

BF16_BYTES = 2  # an all-reduce table row's element: the bf16 activations the engines reduce


def split_kernels(kernels: str) -> tuple[str, str | None]:
    """A `kernels` setting's (tables, pinned build): `vllm@0.24.0` -> ("vllm", "0.24.0"), `engine` -> ("engine", None)."""
    name, _, version = kernels.partition("@")
    return name, version or None


def framework_for(kernels: str, engine_tables: str = FRAMEWORKS[0]) -> str:
    """The engine whose tables `kernels` names: itself, or under `engine` `engine_tables` (the scenario's engine
    family's)."""
    name = split_kernels(kernels)[0]
    if name == ENGINE:
        return engine_tables
    if name not in FRAMEWORKS:
        raise SpecError(
            f"{kernels!r} names no engine's kernel tables; allowed: {', '.join((ENGINE, *FRAMEWORKS))}, "
            "each optionally @version"
        )
    return name


@functools.cache
def tables_release() -> str | None:
    """The installed aiconfigurator-core's version, None without it: which measurements a step priced from its
    tables rests on (a saved result is keyed by it)."""
    try:
        return importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        return None


def data_root() -> Path:
    """aiconfigurator-core's table folder, found without importing the package (it loads a compiled engine)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(f"measured kernel tables need the aiconfigurator-core package: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def _version_key(version: str) -> tuple:
    """Release order of an engine build's folder name: 0.5.6 < 0.5.6.post2, 1.3.0rc20 < 1.3.0, 0.1.dev19262 < 0.1."""
    match = re.fullmatch(r"(\d+(?:\.\d+)*)(?:(rc|\.dev|\.post)(\d+))?", version)
    if match is None:
        return (), 0, 0
    stage = {"rc": -1, ".dev": -2, ".post": 1}.get(match.group(2), 0)
    return tuple(int(part) for part in match.group(1).split(".")), stage, int(match.group(3) or 0)


def _builds_in(*folders: Path) -> list[str]:
    """The engine builds (subfolders) of `folders`, oldest first."""
    names = {p.name for folder in folders if folder.is_dir() for p in folder.iterdir() if p.is_dir()}
    return sorted(names, key=_version_key)


def builds(system: str, framework: str) -> list[str]:
    """The engine builds the package holds GEMM, attention or all-reduce tables of for a system, oldest first."""
    return _builds_in(
        *(data_root() / system / family / framework for family in ("gemm", "attention", "comm"))
    )


def _table_paths(system: str, family: str, framework: str, version: str | None, filename: str) -> list[Path]:
    """The tables `filename` of `framework`'s builds that have it, newest first (or of `version` alone)."""
    folder = data_root() / system / family / framework
    paths = (folder / name / filename for name in reversed([version] if version else _builds_in(folder)))
    return [path for path in paths if path.is_file()]


def _table_path(system: str, family: str, framework: str, version: str | None, filename: str) -> Path | None:
    """The table `filename` of the newest build of `framework` that has it (or of `version`)."""
    return next(iter(_table_paths(system, family, framework, version, filename)), None)


def _read(path: Path | None, columns: list[str], missing: dict | None = None):
    """`columns` of a table; older builds' tables lack some, which take their `missing` value (no sliding window
    measured, no graph/eager split)."""
    if path is None:
        return None
    import pyarrow.parquet as pq  # heavy; only when a table is read

    names = set(pq.read_schema(path).names)
    frame = pq.read_table(path, columns=[c for c in columns if c in names]).to_pandas()
    return frame.assign(**{c: value for c, value in (missing or {}).items() if c not in names})


def _main_source(frame):
    """Rows of the kernel the engine runs by default: the one its collector measured over most of the grid (others
    are fallbacks for layouts it lacks, such as FA4 for 512-wide heads)."""
    counts = frame["kernel_source"].value_counts()
    return frame[frame["kernel_source"] == counts.index[0]]


def _bracket(log_axis: list[float], x: float) -> tuple[int, int, float] | None:
    """(low index, high index, weight of high) of `x` on a log axis; held at the first point below it, None above."""
    lx = math.log(x) if x > 0 else -math.inf
    if lx <= log_axis[0]:
        return 0, 0, 0.0
    if lx > log_axis[-1]:
        return None
    hi = bisect.bisect_left(log_axis, lx)
    if log_axis[hi] == lx:
        return hi, hi, 0.0
    return hi - 1, hi, (lx - log_axis[hi - 1]) / (log_axis[hi] - log_axis[hi - 1])


#: How much slower than a larger-m measurement of the same GEMM a point may be before `Grid.rising` calls it an anomaly
#: (neighbouring points of the vLLM tables disagree by a few percent; B200's FP8 GEMMs of 1-7 rows take 2x eight's).
RISING_TOLERANCE = 0.25


#: Lengths from which `Grid.at2_along` looks them up with numpy.
NUMPY_ALONG_FROM = 48


class Grid:
    """Log latency (seconds) on a grid whose axes are spaced geometrically; NaN where nothing was measured."""

    def __init__(self, axes: list[np.ndarray], log_t: np.ndarray):
        self.axes = [np.asarray(axis, dtype=float) for axis in axes]
        self.log_axes = [[math.log(x) for x in axis] for axis in self.axes]
        self.log_t = log_t
        self._rows = log_t.tolist()  # nested lists: indexing them is much faster than numpy's scalar access

    @classmethod
    def of(cls, frame, axes: list[str]) -> Grid:
        """The grid of `frame`'s `latency` (ms) over the `axes` columns (duplicates averaged)."""
        values = [np.sort(frame[a].unique()) for a in axes]
        index = tuple(np.searchsorted(v, frame[a].to_numpy()) for v, a in zip(values, axes))
        sums, counts = np.zeros([len(v) for v in values]), np.zeros([len(v) for v in values])
        np.add.at(sums, index, np.log(frame["latency"].to_numpy() * MS))
        np.add.at(counts, index, 1)
        with np.errstate(invalid="ignore"):
            return cls(values, sums / counts)

    def rising(self, tolerance: float = RISING_TOLERANCE) -> Grid:
        """The grid with each measured value more than `tolerance` above the least measured past it on the last axis
        lowered to that least: a kernel of fewer rows (a GEMM's m) can run padded as one of more, so a point far
        slower than a larger one is a dispatch the engine need not make, not its cost. Smaller rises are noise
        between neighbouring measurements, kept as measured."""
        least = np.fmin.accumulate(self.log_t[..., ::-1], axis=-1)[..., ::-1]
        anomalous = self.log_t - least > math.log1p(tolerance)
        return Grid(self.axes, np.where(anomalous, least, self.log_t))

    def at(self, *point: float) -> float | None:
        """Seconds at `point`: multilinear in log space over the cell around it, held flat below the grid; None
        above it or where a corner the point depends on was not measured."""
        if len(point) == 2:
            return self._at2(*point)
        cell = []
        for x, log_axis in zip(point, self.log_axes):
            bracket = _bracket(log_axis, x)
            if bracket is None:
                return None
            lo, hi, w = bracket
            cell.append(((lo, 1.0 - w), (hi, w)) if w else ((lo, 1.0),))
        total = 0.0
        for corner in itertools.product(*cell):
            weight, value = 1.0, self._rows
            for i, w in corner:
                weight *= w
                value = value[i]
            if weight == 0.0:
                continue
            if value != value:  # NaN: not measured
                return None
            total += weight * value
        return math.exp(total)

    def _at2(self, x: float, y: float) -> float | None:
        """`at` unrolled for two axes: the simulator's per-step attention lookup."""
        first, second = _bracket(self.log_axes[0], x), _bracket(self.log_axes[1], y)
        if first is None or second is None:
            return None
        total = 0.0
        for i, wi in ((first[0], 1.0 - first[2]), (first[1], first[2])):
            if wi == 0.0:
                continue
            row = self._rows[i]
            for j, wj in ((second[0], 1.0 - second[2]), (second[1], second[2])):
                if wj == 0.0:
                    continue
                value = row[j]
                if value != value:  # NaN: not measured
                    return None
                total += wi * wj * value
        return math.exp(total)

    def at2_along(self, x: float, ys: list[float]) -> list[float | None]:
        """`at(x, y)` for each of `ys`, bit for bit, the bracket on the first axis found once: a decode stretch's
        steps share their batch and differ in length. Long stretches look their lengths up together with numpy
        (~120 us a call, repaid past ~50 lengths at ~3 us each in Python)."""
        first = _bracket(self.log_axes[0], x)
        if first is None or not ys:
            return [None] * len(ys)
        return (self._along_numpy if len(ys) >= NUMPY_ALONG_FROM else self._along_python)(first, ys)

    def _along_python(self, first: tuple[int, int, float], ys: list[float]) -> list[float | None]:
        rows = [
            (self._rows[i], wi) for i, wi in ((first[0], 1.0 - first[2]), (first[1], first[2])) if wi != 0.0
        ]
        log_axis, out = self.log_axes[1], []
        for y in ys:
            second = _bracket(log_axis, y)
            if second is None:
                out.append(None)
                continue
            corners = [
                (j, wj) for j, wj in ((second[0], 1.0 - second[2]), (second[1], second[2])) if wj != 0.0
            ]
            total, measured = 0.0, True
            for row, wi in rows:
                for j, wj in corners:
                    value = row[j]
                    if value != value:  # NaN: not measured
                        measured = False
                        break
                    total += wi * wj * value
                if not measured:
                    break
            out.append(math.exp(total) if measured else None)
        return out

    def _along_numpy(self, first: tuple[int, int, float], ys: list[float]) -> list[float | None]:
        """`_along_python` with numpy: the same products summed in the same order, and Python's own log and exp
        (numpy's may differ in the last bit)."""
        axis = np.asarray(self.log_axes[1])
        log_y = np.array([math.log(y) if y > 0 else -math.inf for y in ys])
        above = log_y > axis[-1]
        if len(axis) == 1:  # every y is held at the point or above it
            low = high = np.zeros(len(ys), dtype=np.int64)
            weight = np.zeros(len(ys))
        else:
            high = np.clip(np.searchsorted(axis, log_y, side="left"), 1, len(axis) - 1)
            low = high - 1
            with np.errstate(invalid="ignore"):  # -inf below the grid: held there below
                weight = (log_y - axis[low]) / (axis[high] - axis[low])
            on_point = axis[high] == log_y
            held = log_y <= axis[0]
            low = np.where(held, 0, np.where(on_point, high, low))
            high = np.where(held, 0, high)
            weight = np.where(held | on_point, 0.0, weight)
        low_weight = 1.0 - weight
        total, unmeasured = np.zeros(len(ys)), above.copy()
        for i, wi in ((first[0], 1.0 - first[2]), (first[1], first[2])):
            if wi == 0.0:
                continue
            row = self.log_t[i]
            for j, wj in ((low, low_weight), (high, weight)):
                used, value = wj != 0.0, row[j]
                total = total + np.where(used, wi * wj * value, 0.0)
                unmeasured |= used & np.isnan(value)
        return [None if bad else math.exp(t) for t, bad in zip(total.tolist(), unmeasured.tolist())]

    def split_at(self, *point: float) -> float | None:
        """`at`, a coordinate past the grid's largest value split into equal pieces run one after another (rows,
        columns, tokens, message bytes add up)."""
        pieces = [max(1, math.ceil(x / axis[-1])) for x, axis in zip(point, self.axes)]
        time_s = self.at(*(x / p for x, p in zip(point, pieces)))
        return None if time_s is None else time_s * math.prod(pieces)

    def sliced(self, x: float) -> Grid | None:
        """The grid of the other axes at `x` on the first (log-linear between the values around it), None outside."""
        bracket = _bracket(self.log_axes[0], x)
        if bracket is None or math.log(x) < self.log_axes[0][0]:
            return None
        lo, hi, w = bracket
        return Grid(
            self.axes[1:], self.log_t[lo] if not w else (1.0 - w) * self.log_t[lo] + w * self.log_t[hi]
        )


class AttentionTable:
    """One layer layout's attention over (batch, length): decode queries over `length` KV tokens each, or causal
    prefills of `length` tokens each."""

    def __init__(self, grid: Grid):
        self.grid = grid

    def seconds(self, batch: float, length: float) -> float | None:
        """The tables stop where batch x length grows large; past that the batch is priced as halves (quarters, ...)
        run one after another, which is how a bandwidth- or compute-bound kernel scales there."""
        pieces = 1
        while pieces <= batch:
            time_s = self.grid.at(batch / pieces, length)
            if time_s is not None:
                return time_s * pieces
            pieces *= 2
        return None

    def seconds_along(self, batch: float, lengths: list[float]) -> list[float | None]:
        """`seconds(batch, length)` for each of `lengths`, bit for bit: those the grid holds whole looked up
        together."""
        whole = self.grid.at2_along(batch, lengths) if len(self.grid.axes) == 2 else [None] * len(lengths)
        return [t if t is not None else self.seconds(batch, n) for t, n in zip(whole, lengths)]


@functools.lru_cache(maxsize=None)
def _own_gemm_frames(system: str, framework: str, version: str | None) -> dict:
    """An engine build's GEMM table as measured, per dtype: read once, whether for its own lookups or another
    engine's stand-in rows."""
    frame = _read(
        _table_path(system, "gemm", framework, version, "gemm_perf.parquet"),
        ["kernel_source", "gemm_dtype", "m", "n", "k", "latency"],
    )
    return {} if frame is None else {dtype: _main_source(rows) for dtype, rows in frame.groupby("gemm_dtype")}


class KernelTables:
    """The measured tables of one GPU and one engine build, loaded lazily per operator family."""

    def __init__(self, system: str, framework: str, version: str | None = None):
        self.system, self.framework, self.version = system, framework, version

    def _path(self, family: str, filename: str) -> Path | None:
        return _table_path(self.system, family, self.framework, self.version, filename)

    # ---- GEMMs ----------------------------------------------------------------------------------

    @functools.cached_property
    def _gemm_frames(self) -> dict:
        """The engine's GEMM rows per dtype, those `GEMM_STAND_INS` names taken from the stand-in engine's own."""
        frames = dict(_own_gemm_frames(self.system, self.framework, self.version))
        for dtype, engine in GEMM_STAND_INS.get(self.framework, {}).items():
            if dtype in frames:
                stand_in = _own_gemm_frames(self.system, engine, None).get(dtype)
                if stand_in is None:
                    del frames[dtype]
                else:
                    frames[dtype] = stand_in
        return frames

    def gemm_engine(self, dtype: str) -> str:
        """The engine whose table prices this build's `dtype` GEMMs: its own, or the one `GEMM_STAND_INS` names."""
        return GEMM_STAND_INS.get(self.framework, {}).get(GEMM_DTYPES.get(dtype, dtype), self.framework)

    @functools.lru_cache(maxsize=None)
    def _gemm_grid(self, dtype: str) -> Grid | None:
        rows = self._gemm_frames.get(dtype)
        return None if rows is None else Grid.of(rows, ["n", "k", "m"]).rising()

    def gemm_s(
        self, dtype: str, m: float, n: float, k: float, quantized_input: bool = False, floor_s: float = 0.0
    ) -> float | None:
        """One GEMM of `m` rows x `k` in -> `n` out on this GPU in servesim's weight `dtype`. Columns or inputs past
        the grid are split into equal pieces (split-K's reduction not counted), rows past it too. A per-tensor FP8
        GEMM of a table measured with dynamic scales (`DYNAMIC_FP8_GEMMS`) runs as a static-scale checkpoint runs it:
        without the scale's computation and, with `quantized_input` (the kernel before emits FP8), without the
        quantization too, as aiconfigurator prices fp8_static; never below `floor_s` (its roofline at peak), as the
        differences come from tables interpolated apart."""
        grid = self._gemm_grid(GEMM_DTYPES[dtype]) if dtype in GEMM_DTYPES else None
        time_s = None if grid is None or m < 1 else grid.split_at(n, k, m)
        if time_s is None or dtype != "fp8" or self.framework not in DYNAMIC_FP8_GEMMS:
            return time_s
        passes = ("computescale_perf.parquet", "scale_matrix_perf.parquet")[: 1 + quantized_input]
        for table in passes:
            quantize = self._quantize_grid(table)
            part = None if quantize is None else quantize.split_at(k, m)
            if part is None:  # no table, or past it in a way the split cannot reach: that part stays in
                break
            time_s -= part
        return max(time_s, floor_s)

    @functools.lru_cache(maxsize=None)
    def _quantize_grid(self, filename: str) -> Grid | None:
        """A per-tensor FP8 activation quantization table over (k, m)."""
        frame = _read(self._path("quantize", filename), ["kernel_source", "quant_dtype", "m", "k", "latency"])
        if frame is None:
            return None
        rows = frame[frame["quant_dtype"] == "fp8"]
        rows = rows.assign(latency=rows["latency"].clip(lower=LEAST_DIFFERENCE_MS))
        return None if rows.empty else Grid.of(_main_source(rows), ["k", "m"])

    # ---- attention ------------------------------------------------------------------------------

    @functools.lru_cache(maxsize=4)
    def _attention_frame(self, decode: bool):
        name = "generation_attention_perf.parquet" if decode else "context_attention_perf.parquet"
        return _read(
            self._path("attention", name),
            [
                "kernel_source",
                "batch_size",
                "isl",
                "step",
                "num_heads",
                "num_key_value_heads",
                "head_dim",
                "kv_cache_dtype",
                "window_size",
                "latency",
            ],
            {"window_size": 0},
        )

    @functools.lru_cache(maxsize=None)
    def _attention_table(
        self, decode: bool, kv_dtype: str, heads: float, kv_heads: int, head_dim: int, window: int
    ) -> AttentionTable | None:
        """(batch, length) grid at `heads` query heads: decode's length is the KV length (the table's prompt +
        steps), prefill's the prompt length."""
        frame = self._attention_frame(decode)
        if frame is None:
            return None
        rows = frame[
            (frame["kv_cache_dtype"] == kv_dtype)
            & (frame["num_key_value_heads"] == kv_heads)
            & (frame["head_dim"] == head_dim)
            & (frame["window_size"] == window)
        ]
        if rows.empty:
            return None
        rows = _main_source(rows).assign(length=lambda f: f["isl"] + f["step"])
        grid = Grid.of(rows, ["num_heads", "batch_size", "length"]).sliced(heads)
        return None if grid is None else AttentionTable(grid)

    def attention(
        self, decode: bool, kv_dtype: str, heads: float, kv_heads: float, head_dim: int, window: int | None
    ) -> AttentionTable | None:
        """One layer's decode or prefill attention with `heads`/`kv_heads` on this GPU, `window` None for full
        layers; None where the tables lack that layout."""
        if kv_dtype not in KV_DTYPES or kv_heads != int(kv_heads) or heads != int(heads):
            return None
        return self._attention_table(decode, KV_DTYPES[kv_dtype], heads, int(kv_heads), head_dim, window or 0)

    def attention_s(
        self,
        decode: bool,
        kv_dtype: str,
        heads: float,
        kv_heads: float,
        head_dim: int,
        window: int | None,
        batch: float,
        length: float,
    ) -> float | None:
        """`attention(...)` for `batch` requests of `length` tokens (`AttentionTable.seconds`)."""
        table = self.attention(decode, kv_dtype, heads, kv_heads, head_dim, window)
        return None if table is None else table.seconds(batch, length)

    # ---- routed experts -------------------------------------------------------------------------

    @functools.lru_cache(maxsize=None)
    def _moe_frame(self, path: Path):
        frame = _read(
            path,
            [
                "kernel_source",
                "moe_dtype",
                "num_tokens",
                "hidden_size",
                "inter_size",
                "topk",
                "num_experts",
                "moe_tp_size",
                "moe_ep_size",
                "distribution",
                "latency",
            ],
            {"distribution": "balanced"},
        )
        return frame[frame["distribution"] == "balanced"]

    @functools.lru_cache(maxsize=None)
    def _moe_grid(
        self, dtype: str, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int
    ) -> Grid | None:
        """From the newest build that measured these experts: a build collects the models of its day, so the newest
        table may lack an older model's shapes (TensorRT-LLM 1.3.0rc23's holds none of gpt-oss)."""
        for path in _table_paths(self.system, "moe", self.framework, self.version, "moe_perf.parquet"):
            frame = self._moe_frame(path)
            rows = frame[
                (frame["moe_dtype"] == dtype)
                & (frame["hidden_size"] == hidden)
                & (frame["inter_size"] == inter)
                & (frame["topk"] == topk)
                & (frame["num_experts"] == experts)
                & (frame["moe_tp_size"] == tp)
                & (frame["moe_ep_size"] == ep)
            ]
            if not rows.empty:
                return Grid.of(_main_source(rows), ["num_tokens"])
        return None

    def moe_s(
        self,
        dtype: str,
        tokens: float,
        hidden: int,
        inter: int,
        topk: int,
        experts: int,
        tp: int,
        ep: int,
        blackwell: bool = False,
    ) -> float | None:
        """One MoE layer's routed experts (the fused kernel: routing, both GEMMs, activation) on one GPU for `tokens`
        tokens routed evenly over `experts` experts of width `inter`, sliced over `tp` GPUs or spread whole over `ep`
        (each GPU computing its own experts' share of every token); only the model shapes the tables were collected
        for (exact), more tokens than measured run as equal chunks. MXFP4 experts take the activations the engine
        feeds them, on data-center Blackwell if `blackwell` (`MXFP8_MOE_ACTIVATIONS`)."""
        table_dtype = MOE_DTYPES.get(dtype)
        if dtype == "mxfp4" and self.framework in MXFP8_MOE_ACTIVATIONS and blackwell:
            table_dtype = "w4a8_mxfp4_mxfp8"
        grid = (
            None if table_dtype is None else self._moe_grid(table_dtype, hidden, inter, topk, experts, tp, ep)
        )
        return None if grid is None or tokens < 1 else grid.split_at(tokens)

    # ---- all-reduce -----------------------------------------------------------------------------

    @functools.lru_cache(maxsize=None)
    def _all_reduce_grid(self, gpus: int) -> Grid | None:
        frame = _read(
            self._path("comm", "custom_allreduce_perf.parquet"),
            ["kernel_source", "backend", "num_gpus", "message_size", "latency"],
            {"backend": "graph"},
        )
        if frame is None:
            return None
        # CUDA-graph captured, as the engines run their forward passes
        rows = frame[(frame["num_gpus"] == gpus) & frame["backend"].str.endswith("graph")]
        return None if rows.empty else Grid.of(_main_source(rows), ["message_size"]).rising()

    def all_reduce_s(self, gpus: int, nbytes: float) -> float | None:
        """The engine's all-reduce of an `nbytes` bf16 message over `gpus` GPUs of one node. The tables count a
        message in elements (aiconfigurator's collect_all_reduce.py allreduces `message_size` bf16 values)."""
        grid = self._all_reduce_grid(gpus)
        return None if grid is None else grid.split_at(nbytes / BF16_BYTES)


@functools.lru_cache(maxsize=None)
def kernel_tables(kernels: str, gpu: str) -> KernelTables | None:
    """The tables `kernels` (`engine`, `vllm`, `sglang` or `trtllm`, optionally `@version`) names for catalog GPU
    `gpu`; None for a GPU the package did not measure (its operators keep the roofline)."""
    framework, version = framework_for(kernels), split_kernels(kernels)[1]
    system = SYSTEMS.get(gpu)
    if system is None or not (data_root() / system).is_dir():
        return None
    if version is not None and version not in builds(system, framework):
        raise SpecError(
            f"kernels {kernels!r}: no {framework} {version} tables for {gpu}; builds there: "
            f"{', '.join(builds(system, framework)) or 'none'}"
        )
    return KernelTables(system, framework, version)
