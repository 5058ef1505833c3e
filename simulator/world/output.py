"""A run folder, written atomically: it appears complete or not at all."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from servesim.hardware.errors import SpecError
from servesim.simulator.atomic import atomic_dir
from servesim.simulator.world.run import RunResult
from servesim.simulator.scenario import with_absolute_paths


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


TABLE_FORMATS = ("auto", "csv", "parquet")
# auto: a table longer than this is written as Parquet (columnar, compressed, typed: ~10x smaller and faster to
# write and read than CSV at a million steps); shorter ones stay CSV, which anything opens
PARQUET_ABOVE_ROWS = 100_000
# rows per Parquet row group of a table written in blocks: readers pay per group, writers hold one in memory
ROW_GROUP_ROWS = 1 << 18


def table_path(folder: Path, name: str) -> Path:
    """Where a run folder keeps table `name` (requests, steps): its .parquet if written so, else its .csv."""
    parquet = Path(folder) / f"{name}.parquet"
    return parquet if parquet.is_file() else Path(folder) / f"{name}.csv"


def read_table(folder: Path, name: str) -> pd.DataFrame:
    """A run folder's table `name`, whichever format it was written in."""
    path = table_path(folder, name)
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def replica_labels(scenario: dict[str, Any]) -> list[str]:
    """Names of a run's replicas in the order of the steps' `replica` numbers: the P/D pools' (prefill first),
    the pipeline stages' or the cluster's."""
    pools = scenario.get("disaggregation")
    if pools:
        return [f"prefill {i}" for i in range(pools["prefill"]["replicas"])] + [
            f"decode {i}" for i in range(pools["decode"]["replicas"])
        ]
    stages = scenario.get("stages")
    if stages:
        return [f"{stage['name']} {i}" for stage in stages for i in range(stage.get("replicas", 1))]
    return [f"replica {i}" for i in range((scenario.get("cluster") or {}).get("replicas", 1))]


def _write_table(
    blocks: Iterable[pd.DataFrame], rows: int, folder: Path, name: str, table_format: str
) -> None:
    """Table `name` from its `blocks` (its rows in order, `rows` of them), written block by block: a spilled step
    table never has to be in memory whole."""
    if table_format not in TABLE_FORMATS:
        raise SpecError(f"table format {table_format!r}: choose one of {', '.join(TABLE_FORMATS)}")
    if table_format == "parquet" or (table_format == "auto" and rows > PARQUET_ABOVE_ROWS):
        with contextlib.ExitStack() as stack:
            writer = None
            for group in _row_groups(blocks):
                table = pa.Table.from_pandas(group, preserve_index=False)
                if writer is None:
                    writer = stack.enter_context(pq.ParquetWriter(folder / f"{name}.parquet", table.schema))
                writer.write_table(table)
    else:
        with open(folder / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
            for i, block in enumerate(blocks):
                block.to_csv(handle, index=False, header=i == 0)


def _row_groups(blocks: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """`blocks` gathered into frames of at least ROW_GROUP_ROWS rows (the last may hold fewer): Parquet readers
    pay per row group."""
    held: list[pd.DataFrame] = []
    rows = 0
    for block in blocks:
        held.append(block)
        rows += len(block)
        if rows >= ROW_GROUP_ROWS:
            yield pd.concat(held, ignore_index=True) if len(held) > 1 else held[0]
            held, rows = [], 0
    if held:
        yield pd.concat(held, ignore_index=True) if len(held) > 1 else held[0]


def write_run(result: RunResult, out: Path, base_dir: Path, table_format: str = "auto") -> Path:
    """The requests and steps tables (CSV, or Parquet: `table_format`, auto = Parquet above PARQUET_ABOVE_ROWS
    rows), summary.json, memory.json and the resolved scenario.yaml under `out`; `base_dir` (the scenario file's
    folder) makes the scenario's relative paths absolute, so it reruns from `out`."""
    with atomic_dir(out) as tmp:
        _write_table([result.requests], len(result.requests), tmp, "requests", table_format)
        steps = result.step_table
        _write_table(steps.blocks(), len(steps), tmp, "steps", table_format)
        (tmp / "summary.json").write_text(json_text(result.summary, indent=2, sort_keys=True))
        memory = result.memory.as_dict() | {"num_blocks_used_by_engine": result.num_blocks}
        (tmp / "memory.json").write_text(json_text(memory, indent=2))
        scenario = with_absolute_paths(result.scenario, base_dir)
        (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    return Path(out)
