"""The step log: one row per engine step, kept in columnar arrays and, past SPILL_ROWS rows, in sorted chunk files
merged as they are read, so a long run's memory holds one chunk of it."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.simulator.world.spill import ExactSum, SpillDir

STEP_COLUMNS = (
    "time_s",
    "duration_s",
    "replica",
    "num_requests",
    "prefill_tokens",
    "decode_tokens",
    "num_running",
    "num_waiting",
    "kv_blocks_used",
    "kv_usage",
    "num_preempted",
)
_FLOAT_COLUMNS = ("time_s", "duration_s", "kv_usage")
ROW = np.dtype([(name, "f8" if name in _FLOAT_COLUMNS else "i8") for name in STEP_COLUMNS])
#: rows held in memory before they move to disk as a sorted chunk (~44 MiB)
SPILL_ROWS = 1 << 19
#: rows read from each chunk at a time while merging
MERGE_ROWS = 1 << 14
#: the integer types a chunk file may keep a count column in, narrowest first
_NARROW = tuple(np.dtype(t) for t in ("i1", "i2", "i4", "i8"))

Columns = dict[str, np.ndarray]  # step-table columns by name, of equal length


def _in_order(columns: Columns) -> np.ndarray | slice:
    """Row order by end time, then replica; stable: ties keep the order they were logged in. Rows logged in that
    order already (one replica's steps, as it ends them) keep it without a sort."""
    time_s, replica = columns["time_s"], columns["replica"]
    later = np.diff(time_s)
    if bool(((later > 0) | ((later == 0) & (np.diff(replica) >= 0))).all()):
        return slice(None)
    return np.lexsort((replica, time_s))


class StepLog:
    """One row per engine step (the time is the step's end; the duration is its busy time: a pipeline-parallel
    micro-batch's stage times, without its waits for stages busy with others). Rows logged one at a time go to
    columnar arrays, rows logged many at a time to blocks of columns, both in logged order; every SPILL_ROWS rows
    go to a chunk file, sorted."""

    def __init__(self) -> None:
        self.columns: dict[str, array] = {
            name: array("d" if name in _FLOAT_COLUMNS else "q") for name in STEP_COLUMNS
        }
        self._blocks: list[Columns] = []  # rows logged before those in `columns`
        self._held = 0  # rows in `_blocks`
        self._spill_dir = SpillDir("servesim-steps-")
        self._chunks: list[ChunkFile] = []

    def record(
        self,
        time_s: float,
        duration_s: float,
        replica: int,
        num_requests: int,
        prefill_tokens: int,
        decode_tokens: int,
        num_running: int,
        num_waiting: int,
        kv_blocks_used: int,
        kv_usage: float,
        num_preempted: int,
    ) -> None:
        c = self.columns
        c["time_s"].append(time_s)
        c["duration_s"].append(duration_s)
        c["replica"].append(replica)
        c["num_requests"].append(num_requests)
        c["prefill_tokens"].append(prefill_tokens)
        c["decode_tokens"].append(decode_tokens)
        c["num_running"].append(num_running)
        c["num_waiting"].append(num_waiting)
        c["kv_blocks_used"].append(kv_blocks_used)
        c["kv_usage"].append(kv_usage)
        c["num_preempted"].append(num_preempted)
        if self._held + len(c["time_s"]) >= SPILL_ROWS:
            self._spill()

    def record_many(self, **columns: list | np.ndarray) -> None:
        """Append several rows at once; every column of STEP_COLUMNS must be given, as equal-length lists or numpy
        arrays (copied once)."""
        self._seal()
        self._blocks.append({name: np.array(columns[name], ROW[name]) for name in STEP_COLUMNS})
        self._held += len(columns["time_s"])
        if self._held >= SPILL_ROWS:
            self._spill()

    def _seal(self) -> None:
        """Move the rows logged one at a time into a block, behind those logged before them."""
        count = len(self.columns["time_s"])
        if not count:
            return
        self._blocks.append(
            {name: np.frombuffer(col, col.typecode).copy() for name, col in self.columns.items()}
        )
        for col in self.columns.values():
            del col[:]  # no view of them is left: the block copied them
        self._held += count

    def _taken_blocks(self) -> list[Columns]:
        """Every row held, in logged order; the log holds none after."""
        self._seal()
        blocks, self._blocks, self._held = self._blocks, [], 0
        return blocks

    def _spill(self) -> None:
        blocks = self._taken_blocks()
        order = _in_order({name: _joined_column(blocks, name) for name in ("time_s", "replica")})
        if not isinstance(order, slice):  # sorted, as one block; else written block by block
            blocks = [_taken(_joined(blocks), order)]
        path = self._spill_dir.file(f"chunk{len(self._chunks)}.bin")
        self._chunks.append(ChunkFile.write(path, blocks))

    def table(self) -> StepTable:
        """The rows logged: in memory if none spilled, else the chunk files and the rest as a last chunk."""
        if not self._chunks:
            rows = _joined(self._taken_blocks())
            return StepTable(pd.DataFrame(_taken(rows, _in_order(rows)), copy=False), ())
        if self._held or len(self.columns["time_s"]):
            self._spill()
        return StepTable(None, tuple(self._chunks), self._spill_dir)


def _taken(columns: Columns, rows: np.ndarray | slice) -> Columns:
    return {name: values[rows] for name, values in columns.items()}


def _joined_column(blocks: list[Columns], name: str) -> np.ndarray:
    if len(blocks) == 1:
        return blocks[0][name]
    return np.concatenate([b[name] for b in blocks]) if blocks else np.array([], ROW[name])


def _joined(blocks: list[Columns]) -> Columns:
    return {name: _joined_column(blocks, name) for name in STEP_COLUMNS}


@dataclass(frozen=True)
class ChunkFile:
    """Sorted rows on disk, column after column, each count column in the narrowest integer type that holds it
    (writing is the cost of a long run's log: ~40 bytes a step, not 88)."""

    path: Path
    rows: int
    dtypes: tuple[np.dtype, ...]  # per column of STEP_COLUMNS

    @classmethod
    def write(cls, path: Path, blocks: list[Columns]) -> ChunkFile:
        """`blocks`' rows, in order, as one chunk."""
        dtypes = tuple(_narrowest([b[name] for b in blocks]) for name in STEP_COLUMNS)
        with open(path, "wb") as handle:
            for name, dtype in zip(STEP_COLUMNS, dtypes):
                for block in blocks:
                    block[name].astype(dtype, copy=False).tofile(handle)
        return cls(path, sum(len(b["time_s"]) for b in blocks), dtypes)

    def read(self, start: int = 0, stop: int | None = None) -> Columns:
        """Rows start..stop-1 (to the end without `stop`), counts as int64."""
        stop = self.rows if stop is None else stop
        columns, offset = {}, 0
        with open(self.path, "rb") as handle:
            for name, dtype in zip(STEP_COLUMNS, self.dtypes):
                handle.seek(offset + start * dtype.itemsize)
                values = np.fromfile(handle, dtype, stop - start)
                columns[name] = values.astype(ROW[name], copy=False)
                offset += self.rows * dtype.itemsize
        return columns


def _narrowest(parts: list[np.ndarray]) -> np.dtype:
    """The narrowest of _NARROW holding every integer of `parts` (floats keep their type)."""
    parts = [p for p in parts if len(p)]
    if not parts or parts[0].dtype.kind == "f":
        return parts[0].dtype if parts else np.dtype(float)
    low, high = min(p.min() for p in parts), max(p.max() for p in parts)
    return next(t for t in _NARROW if np.iinfo(t).min <= low and high <= np.iinfo(t).max)


@dataclass(frozen=True)
class StepFigures:
    """What the summary needs of the step table: its length, KV usage (duration-weighted mean, maximum), prefill
    tokens and GPU-seconds (each step's duration times its replica's GPUs)."""

    num_steps: int
    kv_cache_usage_mean: float
    kv_cache_usage_max: float
    prefill_tokens: int
    gpu_s: float

    @classmethod
    def of(cls, frame: pd.DataFrame, gpus_of_replica: dict[int, int] | None = None) -> StepFigures:
        """Over a table in memory: numpy's sums over its whole columns. Without `gpus_of_replica`, gpu_s is NaN."""
        w, usage = frame["duration_s"].to_numpy(), frame["kv_usage"].to_numpy()
        total = w.sum()
        return cls(
            len(frame),
            float(np.multiply(usage, w).sum() / total) if total > 0 else 0.0,
            float(usage.max()) if len(usage) else 0.0,
            int(frame["prefill_tokens"].sum()),
            float((frame["duration_s"] * frame["replica"].map(gpus_of_replica)).sum())
            if gpus_of_replica is not None
            else float("nan"),
        )

    @classmethod
    def over(
        cls, chunks: Iterable[np.ndarray | pd.DataFrame], gpus_of_replica: dict[int, int] | None = None
    ) -> StepFigures:
        """Over a table in chunks (its columns by name), in one pass: each sum correctly rounded over every row
        (`ExactSum`), so it does not depend on which rows the chunks hold (a fused run logs them in another order
        than a stepped one)."""
        n, prefill, peaks = 0, 0, []
        total, weighted, gpu_s = ExactSum(), ExactSum(), ExactSum()
        for chunk in chunks:
            duration = np.asarray(chunk["duration_s"], float)
            n += len(duration)
            prefill += int(np.asarray(chunk["prefill_tokens"]).sum())
            usage = np.asarray(chunk["kv_usage"], float)
            if len(duration):
                peaks.append(usage.max())
            total.add(duration)
            weighted.add(np.multiply(usage, duration))
            if gpus_of_replica is not None:
                gpu_s.add(duration * _gpus(np.asarray(chunk["replica"]), gpus_of_replica))
        total_s = total.value()
        return cls(
            n,
            weighted.value() / total_s if total_s > 0 else 0.0,
            float(np.max(peaks)) if peaks else 0.0,
            prefill,
            gpu_s.value() if gpus_of_replica is not None else float("nan"),
        )


def _gpus(replicas: np.ndarray, gpus_of_replica: dict[int, int]) -> np.ndarray:
    """Each row's replica's GPUs (NaN for a replica the map lacks), as `Series.map` gives them."""
    size = max(max(gpus_of_replica, default=0), int(replicas.max(initial=0))) + 1
    table = np.full(size, np.nan)
    table[list(gpus_of_replica)] = list(gpus_of_replica.values())
    return table[replicas]


class StepTable:
    """The run's steps by end time, then replica (the order does not depend on how the run was stepped): a frame,
    or sorted chunk files merged on reading."""

    def __init__(
        self, frame: pd.DataFrame | None, chunks: tuple[ChunkFile, ...], spill_dir: SpillDir | None = None
    ):
        self._frame, self._chunks = frame, chunks
        self._spill_dir = spill_dir  # the chunks' folder lives as long as the table

    @property
    def spilled(self) -> bool:
        return self._frame is None

    def __len__(self) -> int:
        if self._frame is not None:
            return len(self._frame)
        return sum(chunk.rows for chunk in self._chunks)

    def frame(self) -> pd.DataFrame:
        """The whole table in memory: for a spilled one, read back (as large as the run's log)."""
        if self._frame is not None:
            return self._frame
        blocks = list(self.blocks())
        return pd.concat(blocks, ignore_index=True) if blocks else _empty()

    def figures(self, gpus_of_replica: dict[int, int] | None = None, replicas: set[int] | None = None):
        """StepFigures of the table, or of `replicas`' rows."""

        if self._frame is not None:
            frame = self._frame
            return StepFigures.of(
                frame if replicas is None else frame[frame["replica"].isin(replicas)], gpus_of_replica
            )
        chunks = (chunk.read() for chunk in self._chunks)  # each sorted, not merged: figures need no order
        if replicas is not None:
            chunks = (_taken(rows, np.isin(rows["replica"], list(replicas))) for rows in chunks)
        return StepFigures.over(chunks, gpus_of_replica)

    def blocks(self) -> Iterator[pd.DataFrame]:
        """The table in order, a block of rows at a time."""
        if self._frame is not None:
            yield self._frame
            return
        for rows in _merged(self._chunks):
            yield pd.DataFrame(rows, copy=False)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({name: np.array([], ROW[name]) for name in STEP_COLUMNS})


class _Chunk:
    """A sorted chunk file read MERGE_ROWS rows at a time; `rows` holds what is read and not yet merged."""

    def __init__(self, file: ChunkFile) -> None:
        self.file, self.offset = file, 0
        self.rows: Columns = {name: np.array([], ROW[name]) for name in STEP_COLUMNS}
        self.read()

    @property
    def exhausted(self) -> bool:
        return self.offset >= self.file.rows

    @property
    def held(self) -> int:
        return len(self.rows["time_s"])

    def read(self) -> None:
        stop = min(self.offset + MERGE_ROWS, self.file.rows)
        block = self.file.read(self.offset, stop)
        self.offset = stop
        self.rows = _joined([self.rows, block]) if self.held else block

    def last_key(self) -> tuple[float, int]:
        return float(self.rows["time_s"][-1]), int(self.rows["replica"][-1])

    def take_below(self, key: tuple[float, int] | None) -> Columns:
        """Remove and return the rows before `key` (all, with no key)."""
        if key is None:
            count = self.held
        else:
            times = self.rows["time_s"]
            lo, hi = np.searchsorted(times, key[0], "left"), np.searchsorted(times, key[0], "right")
            count = int(lo + np.searchsorted(self.rows["replica"][lo:hi], key[1], "left"))
        taken, self.rows = _taken(self.rows, slice(None, count)), _taken(self.rows, slice(count, None))
        return taken


def _merged(files: tuple[ChunkFile, ...]) -> Iterator[Columns]:
    """The chunks' rows in one order, as a stable sort of all the rows logged would give: a row before every
    row still unread (each chunk's next row is no earlier than the last it read) is final; ties go by chunk,
    which is the order they were logged in. Yields blocks of at least MERGE_ROWS rows (the last may be fewer)."""
    chunks = [_Chunk(file) for file in files]
    pending: list[Columns] = []
    held = 0
    while any(c.held for c in chunks):
        unread = [c for c in chunks if not c.exhausted]
        bound = min((c.last_key() for c in unread), default=None)
        rows = _joined([c.take_below(bound) for c in chunks])
        if len(rows["time_s"]):
            rows = _taken(rows, np.lexsort((rows["replica"], rows["time_s"])))  # stable: chunk order in ties
            pending.append(rows)
            held += len(rows["time_s"])
        for c in unread:
            if not c.held or c.last_key() == bound:
                c.read()
        if held >= MERGE_ROWS:
            yield _joined(pending)
            pending, held = [], 0
    if pending:
        yield _joined(pending)
