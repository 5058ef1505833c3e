"""Sweeps: run a scenario over a grid of field values, in parallel, resumably, into one results table.

Layout of a sweep folder:

    OUT/results.csv          one row per grid point, in grid order: the grid keys, `point`, `status` (done,
                             failed, pending), `error`, then every summary key (written atomically as points
                             finish, so an interrupted sweep leaves a table of what it had done)
    OUT/sweep.yaml           the base scenario and the grid
    OUT/points/<hash>/       each point's run folder (write_run), named by the hash of its resolved
                             scenario, the files it reads and servesim's own code and bundled data, so a point
                             that already has summary.json is not run again unless something it depends on changed

Run folders are written atomically, so an interrupted sweep leaves whole points or none; running
it again finishes only what is missing. Adding values to a grid reuses every point already run.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import ValidationError

from servesim.hardware.errors import SpecError
from servesim.hardware.hf_models import repo_of
from servesim.hardware.kernel_tables import tables_release
from servesim.hardware.model import is_config_path
from servesim.simulator.atomic import MARKER, remove_abandoned_writes, write_text_atomic
from servesim.simulator.crash import ROOT, report_bug
from servesim.simulator.planning.executors import Engine, WorkerDied, check_engine, run_jobs
from servesim.simulator.world.output import write_run
from servesim.simulator.world.run import simulate
from servesim.simulator.scenario import (
    Scenario,
    check_grid_keys,
    first_error,
    trace_sources,
    with_absolute_paths,
    with_overrides,
)
from servesim.workloads.tokens import counting_tokenizer
from servesim.workloads.traces import resolve_path

PACKAGES = ("hardware", "workloads", "policies", "simulator", "calibration")  # what a run's code comes from
POINTS = "points"
MAX_POINTS = 100_000
RESULTS = "results.csv"
REPORT = "report.html"  # `servesim report` writes it into the folder by default
SWEEP_FILES = frozenset({POINTS, RESULTS, "sweep.yaml", REPORT})  # all a sweep folder holds


@dataclass(frozen=True)
class Point:
    """One grid point: its overrides (dotted key -> value), resolved scenario and folder name."""

    overrides: dict[str, Any]
    scenario: Scenario
    hash: str


@dataclass(frozen=True)
class SweepResult:
    table: pd.DataFrame
    num_run: int  # points simulated by this call
    num_reused: int  # points whose run folder was already complete


def parse_grid(items: list[str], option: str = "--grid") -> dict[str, list[Any]]:
    """`--grid key=v1,v2,...` options (or plan's `--knob`) to a grid; values are YAML scalars (`a=1,2` -> [1, 2])."""
    grid = {}
    for item in items:
        key, sep, text = item.partition("=")
        try:
            values = yaml.safe_load(f"[{text}]") if sep and key and text else None
        except yaml.YAMLError:
            values = None
        if not values:
            raise SpecError(f"{option} {item!r}: expected dotted.key=value1,value2,... (YAML values)")
        if key in grid:
            raise SpecError(f"{option} {key}: given twice; list all its values in one option")
        if len({json.dumps(v, sort_keys=True) for v in values}) < len(values):
            raise SpecError(f"{option} {item!r}: a value is given twice")
        grid[key] = values
    return grid


def scenario_hash(s: Scenario, base_dir: Path | None = None) -> str:
    """First 16 hex digits of the sha256 of servesim's code fingerprint, the scenario's JSON form (sorted keys),
    the installed aiconfigurator-core's release (its measured tables) and, given the folder its relative traces
    sit in, of the contents of the files it reads (traces, GPU files, a profile YAML, config.json files, a
    tokenizer): a point whose trace was edited, or that an upgraded servesim would simulate differently, is run
    again, not reused."""
    digest = hashlib.sha256(code_fingerprint())
    digest.update(json.dumps(s.model_dump(mode="json"), sort_keys=True).encode())
    digest.update(f"kernel tables {tables_release()}".encode())
    if base_dir is not None:
        for path in input_files(s, base_dir):
            stat = path.stat()
            digest.update(_file_digest(path.resolve(), stat.st_mtime_ns, stat.st_size))
    return digest.hexdigest()[:16]


def input_files(s: Scenario, base_dir: Path) -> list[Path]:
    """The files a run of `s` reads, besides the bundled catalogs and presets: a ServeGen trace folder's every
    file, the tokenizer that counts a ShareGPT trace's tokens."""
    files = []
    for source in trace_sources(s):
        path = resolve_path(source.path, base_dir)
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    files += list(s.hardware.gpu_files)
    if s.hardware.profile is not None and Path(s.hardware.profile).suffix:
        files.append(Path(s.hardware.profile))
    spec = s.engine.speculative
    models = [
        s.model,
        spec.draft_model if spec is not None else None,
        *(stage.model for stage in s.stages or ()),
    ]
    files += [Path(m) for m in models if isinstance(m, str) and is_config_path(m)]
    tokenizer = counting_tokenizer(s.workload, repo_of(s.model))
    files += [tokenizer] if tokenizer is not None else []
    return [path for path in files if path.is_file()]


@functools.cache
def code_fingerprint(root: Path = ROOT) -> bytes:
    """sha256 of what servesim's source and bundled data (catalogs, model presets, profiles) under `root` mean:
    results depend on them as much as on the scenario. Comments, docstrings, layout and YAML/JSON formatting are
    left out, so an upgrade that only rewords them keeps a sweep's points. Read once per process."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if (
                path.suffix in (".py", ".yaml", ".json")
                and "__pycache__" not in path.parts
                and path.is_file()
            ):
                digest.update(path.relative_to(root).as_posix().encode() + b"\0" + _meaning(path) + b"\0")
    return digest.digest()


def _meaning(path: Path) -> bytes:
    """A source file's syntax tree without docstrings, or a data file's values in canonical JSON; the bytes
    themselves where the file does not parse or its keys do not sort (it still counts, and any edit to it too).
    Syntax trees print differently across Python versions: a sweep resumed under another one runs again."""
    text = path.read_bytes()
    try:
        if path.suffix == ".py":
            return ast.dump(_without_docstrings(ast.parse(text))).encode()
        data = yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
        return json.dumps(data, sort_keys=True, default=str).encode()
    except (SyntaxError, ValueError, TypeError, yaml.YAMLError):
        return text


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


@functools.cache
def _file_digest(path: Path, mtime_ns: int, size: int) -> bytes:
    """The file's sha256, read once per version of it (its modification time and size are part of the key)."""
    return hashlib.sha256(path.read_bytes()).digest()


def expand(base: Scenario, grid: dict[str, list[Any]], base_dir: Path | None = None) -> list[Point]:
    """Every combination of the grid's values, the last key varying fastest; study sections dropped. With
    `base_dir`, point hashes cover the contents of the files each point reads (`scenario_hash`)."""
    try:
        check_grid_keys(base, grid)
    except ValueError as err:
        raise SpecError(str(err)) from None
    size = math.prod(len(values) for values in grid.values())
    if size > MAX_POINTS:  # each point is validated and hashed before the first runs
        raise SpecError(
            f"sweep grid: {' x '.join(str(len(v)) for v in grid.values())} = {size:,} points, more "
            f"than the {MAX_POINTS:,} a sweep takes; split it into sweeps over fewer values"
        )
    base = base.run_settings()
    points = []
    for values in itertools.product(*grid.values()):
        overrides = dict(zip(grid, values))
        try:
            s = with_overrides(base, overrides)
        except ValidationError as err:
            label = ", ".join(f"{k}={v}" for k, v in overrides.items())
            raise first_error(err, f"sweep point {label}", Scenario) from None
        points.append(Point(overrides, s, scenario_hash(s, base_dir)))
    return points


def is_done(folder: Path) -> bool:
    """A point's whole run folder: one `atomic_dir` wrote (its marker) with a summary that parses. A folder
    damaged since (a truncated file, a lost table) runs again rather than breaking every resume."""
    summary = folder / "summary.json"
    try:
        stat = summary.stat()
        _summary(summary, stat.st_mtime_ns, stat.st_size)  # parsed once per version of the file
    except (OSError, ValueError):
        return False
    tables = (folder / "requests.csv", folder / "requests.parquet")
    return (folder / MARKER).is_file() and any(table.is_file() for table in tables)


WORKER_DIED = "worker process died"
TRACEBACK_SUFFIX = ".traceback.txt"  # beside a crashed point's folder name in OUT/points/


def run_point(s: Scenario, base_dir: Path, folder: Path) -> str | None:
    """Simulate one point into `folder`; returns the reason when the scenario cannot run (e.g. does not fit), or,
    for a servesim bug, the exception and where in servesim it was raised, its traceback written beside the
    folder, so that one point's crash does not end the sweep. OSError (a full disk, a permission) ends it."""
    trace_file = folder.parent / f"{folder.name}{TRACEBACK_SUFFIX}"
    trace_file.unlink(missing_ok=True)
    try:
        write_run(simulate(s, base_dir), folder, base_dir)
    except SpecError as err:
        return str(err)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 (recorded in results.csv; the other points go on)
        return report_bug(err, trace_file)
    return None


def run_sweep(
    base: Scenario,
    base_dir: Path,
    grid: dict[str, list[Any]],
    out: Path,
    engine: Engine = "local",
    workers: int | None = None,
    dask_address: str | None = None,
    on_point: Callable[[int], None] | None = None,
) -> SweepResult:
    """Run every grid point not already in `out`, keeping `out/results.csv` current as they finish (rewritten at
    most every `RESULTS_EVERY_S` seconds, and when the sweep ends or is interrupted). `on_point(n_done)` after
    each."""
    check_engine(engine)
    out = Path(out)
    points = expand(base, grid, base_dir)
    folders = [out / POINTS / p.hash for p in points]
    first_of = {folder: i for i, folder in reversed(list(enumerate(folders)))}  # equal scenarios run once
    todo = [i for i in sorted(first_of.values()) if not is_done(folders[i])]
    remove_abandoned_writes(out / POINTS)  # a killed worker's half-written point
    write_text_atomic(
        out / "sweep.yaml",
        yaml.safe_dump(
            {"grid": grid, "scenario": base.run_settings().model_dump(mode="json")}, sort_keys=False
        ),
    )
    outcomes: dict[Path, str | None] = {}  # finished folder -> its error (None: it ran)
    if engine == "dask":  # a cluster's workers run in folders of their own: nothing relative may reach them
        jobs = [
            (with_absolute_paths(points[i].scenario, base_dir), base_dir.absolute(), folders[i].absolute())
            for i in todo
        ]
    else:
        jobs = [(points[i].scenario, base_dir, folders[i]) for i in todo]
    done = len(points) - len(todo)
    write_results(out, results_table(points, folders, outcomes))
    last_written = time.monotonic()
    try:
        for job_index, error in run_jobs(
            run_point, jobs, engine, workers, dask_address, on_died=_worker_died
        ):
            outcomes[folders[todo[job_index]]] = error
            done += 1
            if time.monotonic() - last_written >= RESULTS_EVERY_S:
                write_results(out, results_table(points, folders, outcomes))
                last_written = time.monotonic()
            if on_point:
                on_point(done)
    # interrupted or broken off: the table shows every point's state, if it can be written
    except BaseException:
        with contextlib.suppress(Exception):
            write_results(out, results_table(points, folders, outcomes))
        raise
    table = results_table(points, folders, outcomes)
    write_results(out, table)
    return SweepResult(table, len(todo), len(points) - len(todo))


def _worker_died(err: WorkerDied) -> str:
    """A point whose process died is failed, not done: the sweep goes on, and runs it again when resumed."""
    return f"{WORKER_DIED}: it {err.how}; running the sweep again retries it"


RESULTS_EVERY_S = 2.0  # a long sweep's table stays current without being rewritten after every short point


def write_results(out: Path, table: pd.DataFrame) -> None:
    write_text_atomic(out / RESULTS, table.to_csv(index=False))


@functools.cache
def _summary(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    """A point's summary.json, parsed once per version of it (a table is rebuilt as points finish)."""
    return json.loads(path.read_text())


def results_table(points: list[Point], folders: list[Path], outcomes: dict[Path, str | None]) -> pd.DataFrame:
    """One row per point in grid order, read back from the run folders (so every row has the same origin). A
    point not run by this call and without a run folder is pending (still to run, or cut off)."""
    rows = []
    for point, folder in zip(points, folders):
        error = outcomes.get(folder)
        stat = (folder / "summary.json").stat() if is_done(folder) else None
        summary = _summary(folder / "summary.json", stat.st_mtime_ns, stat.st_size) if stat else {}
        # ran, yet no folder here: a worker elsewhere
        if not summary and folder in outcomes and error is None:
            error = f"its run folder {folder} is missing (a Dask worker writing to another filesystem?)"
        status = "done" if summary else "failed" if error else "pending"
        rows.append({**point.overrides, "point": point.hash, "status": status, "error": error, **summary})
    table = pd.DataFrame(rows)
    for column in table.columns:  # a count stays a whole number where a failed point left it empty
        given = [row[column] for row in rows if row.get(column) is not None]
        if given and len(given) < len(rows) and all(type(v) is int for v in given):
            table[column] = table[column].astype("Int64")
    return table
