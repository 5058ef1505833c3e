"""Sweeps: grid order, hash-named point folders, resuming after an interruption, serial = parallel = Dask."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import servesim.simulator.planning.sweep as sweep_module
from servesim.hardware.errors import SpecError
from servesim.simulator.cli.main import app
from servesim.simulator.planning.executors import WorkerDied
from servesim.simulator.scenario import load_scenario, trace_sources
from servesim.simulator.planning.sweep import (
    code_fingerprint,
    expand,
    input_files,
    parse_grid,
    run_sweep,
    scenario_hash,
)
from tests.simulator.study_helpers import SCENARIOS, chat

GRID = {"workload.arrivals.rate_per_s": [5, 20], "engine.max_num_seqs": [32, 256]}


def test_grid_points_come_in_grid_order_with_stable_hashes():
    points = expand(chat(), GRID)
    assert [p.overrides for p in points] == [
        {"workload.arrivals.rate_per_s": 5, "engine.max_num_seqs": 32},
        {"workload.arrivals.rate_per_s": 5, "engine.max_num_seqs": 256},
        {"workload.arrivals.rate_per_s": 20, "engine.max_num_seqs": 32},
        {"workload.arrivals.rate_per_s": 20, "engine.max_num_seqs": 256},
    ]
    assert (
        points[1].scenario.engine.max_num_seqs == 256
        and points[2].scenario.workload.arrivals.rate_per_s == 20
    )
    assert len({p.hash for p in points}) == 4
    assert [p.hash for p in expand(chat(), GRID)] == [p.hash for p in points]  # same scenario, same folder
    assert points[0].hash == scenario_hash(points[0].scenario)


def test_parse_grid_reads_yaml_scalars():
    assert parse_grid(["a.b=1,2.5,true", "c=h100-sxm,h200"]) == {
        "a.b": [1, 2.5, True],
        "c": ["h100-sxm", "h200"],
    }
    with pytest.raises(SpecError, match="expected dotted.key=value1,value2"):
        parse_grid(["engine.max_num_seqs"])


def test_interrupted_sweep_restarts_without_rerunning_finished_points(tmp_path, monkeypatch):
    calls = []
    real_simulate = sweep_module.simulate

    def interrupted_on_third(s, base_dir):
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the third point runs
        calls.append(s)
        return real_simulate(s, base_dir)

    monkeypatch.setattr(sweep_module, "simulate", interrupted_on_third)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(chat(), SCENARIOS, GRID, tmp_path, workers=1)
    points = tmp_path / "points"
    finished = {p.name: (p / "summary.json").stat().st_mtime_ns for p in points.iterdir()}
    assert len(finished) == 2
    cut_off = pd.read_csv(tmp_path / "results.csv")  # the table tells what was done when the sweep stopped
    assert cut_off["status"].tolist() == ["done", "done", "pending", "pending"]
    assert cut_off["completed"].tolist()[:2] == [200, 200] and cut_off["completed"][2:].isna().all()
    assert not [p for p in points.iterdir() if p.name.startswith(".")]  # no half-written point folder

    calls.clear()
    monkeypatch.setattr(
        sweep_module, "simulate", lambda s, base_dir: calls.append(s) or real_simulate(s, base_dir)
    )
    result = run_sweep(chat(), SCENARIOS, GRID, tmp_path, workers=1)
    assert (result.num_run, result.num_reused, len(calls)) == (2, 2, 2)
    assert {
        p.name: (p / "summary.json").stat().st_mtime_ns for p in points.iterdir() if p.name in finished
    } == finished
    assert result.table["completed"].tolist() == [200] * 4

    calls.clear()
    again = run_sweep(chat(), SCENARIOS, GRID, tmp_path, workers=1)
    assert calls == [] and again.num_reused == 4
    pd.testing.assert_frame_equal(again.table, result.table)


def test_widening_a_grid_reuses_the_points_already_run(tmp_path):
    first = run_sweep(chat(), SCENARIOS, {"workload.arrivals.rate_per_s": [5, 20]}, tmp_path, workers=1)
    wider = run_sweep(
        chat(), SCENARIOS, {"workload.arrivals.rate_per_s": [5, 10, 20, 30]}, tmp_path, workers=1
    )
    assert (first.num_run, wider.num_run, wider.num_reused) == (2, 2, 2)
    assert wider.table["workload.arrivals.rate_per_s"].tolist() == [5, 10, 20, 30]


def test_parallel_and_serial_sweeps_write_identical_tables(tmp_path):
    serial = run_sweep(chat(), SCENARIOS, GRID, tmp_path / "serial", workers=1)
    parallel = run_sweep(chat(), SCENARIOS, GRID, tmp_path / "parallel", workers=2)
    assert parallel.num_run == 4
    assert (tmp_path / "serial" / "results.csv").read_bytes() == (
        tmp_path / "parallel" / "results.csv"
    ).read_bytes()
    table = serial.table
    summary = json.loads((tmp_path / "serial" / "points" / table["point"][0] / "summary.json").read_text())
    assert list(table.columns) == [*GRID, "point", "status", "error", *summary]
    # more load, longer waits: the rows are the points
    assert table["p90_ttft_ms"][2] > table["p90_ttft_ms"][0]


def test_dask_engine_gives_the_same_table(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    grid = {"workload.arrivals.rate_per_s": [5, 20]}
    run_sweep(chat(), SCENARIOS, grid, tmp_path / "local", workers=1)
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    )
    with cluster:
        remote = run_sweep(
            chat(), SCENARIOS, grid, tmp_path / "dask", engine="dask", dask_address=cluster.scheduler_address
        )
    assert remote.num_run == 2
    assert (tmp_path / "local" / "results.csv").read_bytes() == (
        tmp_path / "dask" / "results.csv"
    ).read_bytes()


def test_a_point_that_cannot_start_is_reported_in_the_table(tmp_path):
    result = run_sweep(chat(), SCENARIOS, {"model": ["llama-3.1-8b", "llama-3.1-70b"]}, tmp_path, workers=1)
    assert pd.isna(result.table["error"][0]) and result.table["completed"][0] == 200
    assert "does not fit on h100-sxm" in result.table["error"][1] and pd.isna(result.table["completed"][1])
    header, first = (tmp_path / "results.csv").read_text().splitlines()[:2]
    assert first.split(",")[header.split(",").index("completed")] == "200"  # a count, not 200.0


def test_a_point_that_crashes_is_recorded_and_the_others_run(tmp_path, monkeypatch):
    real_simulate = sweep_module.simulate

    def crash_at_rate_20(s, base_dir):
        if s.workload.arrivals.rate_per_s == 20:
            raise ZeroDivisionError("boom")
        return real_simulate(s, base_dir)

    monkeypatch.setattr(sweep_module, "simulate", crash_at_rate_20)
    result = run_sweep(chat(), SCENARIOS, GRID, tmp_path, workers=1)
    assert result.table["status"].tolist() == ["done", "done", "failed", "failed"]
    error = result.table["error"][2]
    assert error.startswith("internal error") and "ZeroDivisionError: boom" in error
    assert "test_sweep.py" in error and "crash_at_rate_20" in error  # where it was raised
    tracebacks = sorted((tmp_path / "points").glob("*.traceback.txt"))
    assert len(tracebacks) == 2 and "ZeroDivisionError: boom" in tracebacks[0].read_text()
    assert str(tracebacks[0]) in " ".join(result.table["error"][2:])
    monkeypatch.setattr(sweep_module, "simulate", real_simulate)
    # a crashed point is not done: it runs again
    again = run_sweep(chat(), SCENARIOS, GRID, tmp_path, workers=1)
    assert (again.num_run, again.num_reused) == (2, 2) and again.table["status"].tolist() == ["done"] * 4
    assert not list((tmp_path / "points").glob("*.traceback.txt"))  # gone with the crash


def test_a_full_disk_ends_the_sweep_rather_than_passing_for_a_bug(tmp_path, monkeypatch):
    def disk_full(s, base_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep_module, "simulate", disk_full)
    with pytest.raises(OSError, match="No space left"):
        run_sweep(chat(), SCENARIOS, GRID, tmp_path, workers=1)
    assert pd.read_csv(tmp_path / "results.csv")["status"].tolist() == ["pending"] * 4


def test_a_point_whose_folder_was_damaged_since_is_run_again(tmp_path):
    """A truncated summary (a crash before the disk had it) or a lost table is no finished point: the next resume
    runs it again instead of failing on it, or reusing half a folder."""
    grid = {"workload.arrivals.rate_per_s": [5, 6]}
    first = run_sweep(chat(), SCENARIOS, grid, tmp_path, workers=1)
    damaged, lost = (tmp_path / "points" / name for name in first.table["point"])
    (damaged / "summary.json").write_text("")
    (lost / "requests.csv").unlink()
    again = run_sweep(chat(), SCENARIOS, grid, tmp_path, workers=1)
    assert (again.num_run, again.num_reused) == (2, 0)
    assert json.loads((damaged / "summary.json").read_text())["completed"] == 200
    assert (lost / "requests.csv").is_file()


def test_the_kernel_tables_release_and_the_tokenizer_key_a_point(tmp_path, monkeypatch):
    """A point priced from another aiconfigurator-core release, or whose ShareGPT tokens another tokenizer.json
    counted, is another point."""
    key = scenario_hash(chat(), SCENARIOS)
    monkeypatch.setattr(sweep_module, "tables_release", lambda: "0.99.0")
    assert scenario_hash(chat(), SCENARIOS) != key
    (tmp_path / "tokenizer.json").write_text("{}")
    trace = {"format": "sharegpt_json", "path": "conv.json", "tokenizer": str(tmp_path)}
    s = chat(workload={"trace": trace, "arrivals": {"kind": "poisson", "rate_per_s": 5}})
    assert tmp_path / "tokenizer.json" in input_files(s, tmp_path)


def test_a_point_run_by_other_code_is_run_again(tmp_path, monkeypatch):
    grid = {"workload.arrivals.rate_per_s": [5]}
    assert run_sweep(chat(), SCENARIOS, grid, tmp_path, workers=1).num_run == 1
    assert run_sweep(chat(), SCENARIOS, grid, tmp_path, workers=1).num_reused == 1
    monkeypatch.setattr(sweep_module, "code_fingerprint", lambda: b"an upgraded servesim")
    assert run_sweep(chat(), SCENARIOS, grid, tmp_path, workers=1).num_run == 1


def test_the_code_fingerprint_covers_source_and_bundled_data(tmp_path):
    (tmp_path / "hardware" / "catalog").mkdir(parents=True)
    (tmp_path / "simulator").mkdir()
    source, catalog = tmp_path / "simulator" / "run.py", tmp_path / "hardware" / "catalog" / "gpus.yaml"

    def fingerprint_after(path, text: str) -> bytes:
        path.write_text(text)
        code_fingerprint.cache_clear()
        return code_fingerprint(tmp_path)

    catalog.write_text("gpus: []\n")
    prints = [fingerprint_after(source, 'def f():\n    """Why."""\n    return 1\n')]
    prints.append(fingerprint_after(source, "def f():\n    return 2\n"))
    prints.append(fingerprint_after(catalog, "gpus: [a]\n"))
    prints.append(fingerprint_after(tmp_path / "simulator" / "notes.txt", "neither code nor data: ignored"))
    # what only rewords or reformats: a docstring, a comment, layout, YAML style
    prints.append(
        fingerprint_after(source, '"""A module."""\ndef f():  # two\n\n    """Why not."""\n    return (2)\n')
    )
    prints.append(fingerprint_after(catalog, "# the catalog\ngpus:\n  - a\n"))
    # unparsable: its bytes
    prints.append(fingerprint_after(tmp_path / "simulator" / "broken.py", "def (:\n"))
    prints.append(fingerprint_after(tmp_path / "simulator" / "broken.py", "def (:  \n"))
    code_fingerprint.cache_clear()
    assert len(set(prints[:3])) == 3 and prints[2] == prints[3] == prints[4] == prints[5]
    assert len({prints[5], prints[6], prints[7]}) == 3


runner = CliRunner()


def _scenario_file(tmp_path, **extra) -> str:
    raw = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text()) | extra
    raw["workload"]["trace"]["path"] = str(SCENARIOS / "traces" / "azure_conv_1h_first2000.csv")
    raw["workload"]["num_requests"] = 150
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize(
    "args,extra,expected",
    [
        (
            ["--grid", "engine.max_num_seq=64,128"],
            {},
            "sweep grid key 'engine.max_num_seq' is not a scenario field "
            "(engine.max_num_seq: unknown field; did you mean 'max_num_seqs'?)",
        ),
        (
            ["--grid", "workload.arrivals.rate_per_s=-1"],
            {},
            "workload.arrivals.rate_per_s=-1: workload.arrivals.rate_per_s: Input should be greater than 0",
        ),
        (["--grid", "workload.arrivals.cv=2"], {}, "'workload.arrivals.cv' is not a scenario field"),
        (["--grid", "engine.max_num_seqs.x=2"], {}, "'engine.max_num_seqs.x' is not a scenario field"),
        (
            [],
            {"sweep": {"grid": {"engine.max_num_seq": [64]}}},
            "s.yaml: sweep grid key 'engine.max_num_seq' is not",
        ),
        (["--grid", "engine.max_num_seqs=0"], {}, "sweep point engine.max_num_seqs=0: engine.max_num_seqs"),
        ([], {}, "nothing to sweep"),
    ],
)
def test_bad_grids_give_one_clear_error_line(tmp_path, args, extra, expected):
    result = runner.invoke(
        app, ["sweep", _scenario_file(tmp_path, **extra), "--out", str(tmp_path / "out"), *args]
    )
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "out" / "points").exists()


def test_sweep_command_uses_the_scenario_grid_and_the_option(tmp_path):
    path = _scenario_file(tmp_path, sweep={"grid": {"engine.max_num_seqs": [64, 256]}})
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["sweep", path, "--grid", "workload.arrivals.rate_per_s=8,16", "--out", str(out), "--workers", "1"],
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert list(table.columns[:3]) == ["engine.max_num_seqs", "workload.arrivals.rate_per_s", "point"]
    assert len(table) == 4 and "4 point(s) run, 0 reused" in result.stdout
    assert load_scenario(path)[0].sweep.grid == {"engine.max_num_seqs": [64, 256]}
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0  # its report.html in the folder...
    # ...does not stop the sweep from going on
    wider = runner.invoke(
        app,
        [
            "sweep",
            path,
            "--grid",
            "workload.arrivals.rate_per_s=8,16,24",
            "--out",
            str(out),
            "--workers",
            "1",
        ],
    )
    assert wider.exit_code == 0 and "2 point(s) run, 4 reused" in wider.stdout, wider.output


def test_a_point_whose_trace_was_edited_is_run_again(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n")
    s = chat(
        workload={
            "trace": {"format": "servesim", "path": str(trace)},
            "arrivals": {"kind": "trace"},
            "num_requests": None,
            "lengths": None,
        }
    )
    grid = {"engine.max_num_seqs": [8]}
    first = run_sweep(s, SCENARIOS, grid, tmp_path / "sweep", workers=1)
    assert (first.num_run, first.table["completed"].tolist()) == (1, [1])
    assert run_sweep(s, SCENARIOS, grid, tmp_path / "sweep", workers=1).num_reused == 1  # unchanged: reused
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5,200,20\n")
    again = run_sweep(s, SCENARIOS, grid, tmp_path / "sweep", workers=1)
    assert (again.num_run, again.table["completed"].tolist()) == (1, [2])


def test_a_point_whose_length_distribution_file_was_edited_is_run_again(tmp_path):
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n100,10\n")
    empirical = {"kind": "empirical", "trace": {"format": "arxiv", "path": str(lengths)}, "column": "prompt"}
    s = chat(
        workload={
            "trace": None,
            "arrivals": {"kind": "poisson", "rate_per_s": 5},
            "num_requests": 5,
            "lengths": {"prompt": empirical, "output": {"kind": "fixed", "value": 10}},
        }
    )
    grid = {"engine.max_num_seqs": [8]}
    first = run_sweep(s, SCENARIOS, grid, tmp_path / "sweep", workers=1)
    assert (first.num_run, first.table["total_input_tokens"].tolist()) == (1, [500])
    assert run_sweep(s, SCENARIOS, grid, tmp_path / "sweep", workers=1).num_reused == 1
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n200,10\n")
    again = run_sweep(s, SCENARIOS, grid, tmp_path / "sweep", workers=1)
    assert (again.num_run, again.table["total_input_tokens"].tolist()) == (1, [1000])


def test_a_servegen_folder_counts_every_file_in_it(tmp_path):
    folder = tmp_path / "servegen"
    (folder / "sub").mkdir(parents=True)
    for name in ("chunk-0-trace.csv", "chunk-0-dataset.json", "sub/chunk-1-trace.csv"):
        (folder / name).write_text("x")
    s = chat(
        workload={
            "trace": {"format": "servegen", "path": "servegen"},
            "arrivals": {"kind": "trace"},
            "duration_s": 10,
            "num_requests": None,
            "lengths": None,
        }
    )
    assert input_files(s, tmp_path) == sorted(folder.rglob("*.*"))


def test_the_sweep_command_exits_1_when_a_point_crashed(tmp_path, monkeypatch):
    real_simulate = sweep_module.simulate

    def crash_at_64(s, base_dir):
        if s.engine.max_num_seqs == 64:
            raise KeyError("boom")
        return real_simulate(s, base_dir)

    monkeypatch.setattr(sweep_module, "simulate", crash_at_64)
    result = runner.invoke(
        app,
        [
            "sweep",
            _scenario_file(tmp_path),
            "--grid",
            "engine.max_num_seqs=64,128",
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "1 point(s) hit a servesim bug (the others ran)" in result.stdout and "KeyError" in result.stdout
    assert pd.read_csv(tmp_path / "out" / "results.csv")["status"].tolist() == ["failed", "done"]


def _second_point_killed(fn, jobs, engine, workers, dask_address, on_died):
    """run_jobs as it goes when the out-of-memory killer takes the worker running the second point."""
    for index, job in enumerate(jobs):
        yield index, on_died(WorkerDied(index, -signal.SIGKILL)) if index == 1 else fn(*job)


def test_a_point_whose_worker_dies_fails_the_command_and_runs_again_when_resumed(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_module, "run_jobs", _second_point_killed)
    out, path = tmp_path / "out", _scenario_file(tmp_path)
    args = ["sweep", path, "--grid", "engine.max_num_seqs=64,128,256", "--out", str(out), "--workers", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "1 point(s) lost their worker process (the others ran)" in result.stdout
    table = pd.read_csv(out / "results.csv")
    assert table["status"].tolist() == ["done", "failed", "done"]
    assert table["error"][1] == (
        "worker process died: it was killed by SIGKILL (most often the out-of-memory "
        "killer: try fewer --workers); running the sweep again retries it"
    )
    monkeypatch.undo()
    # the killed worker's
    abandoned, writing = (
        out / "points" / ".f00d.x1.tmp",
        out / "points" / ".beef.x2.tmp",
    )
    for folder in (abandoned, writing):  # write, another's
        folder.mkdir()
    os.utime(abandoned, (time.time() - 3600, time.time() - 3600))
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "1 point(s) run, 2 reused" in again.stdout, again.output
    assert not abandoned.exists() and writing.exists()  # an hour old is nobody's; a fresh one may be in use


def test_a_dask_address_with_no_scheduler_gives_one_line(tmp_path, monkeypatch):
    pytest.importorskip("dask.distributed")
    monkeypatch.setattr("servesim.simulator.planning.executors.DASK_CONNECT_TIMEOUT_S", 1)
    result = runner.invoke(
        app,
        [
            "sweep",
            _scenario_file(tmp_path),
            "--grid",
            "engine.max_num_seqs=64",
            "--out",
            str(tmp_path / "out"),
            "--engine",
            "dask",
            "--dask-address",
            "tcp://127.0.0.1:9",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "--dask-address tcp://127.0.0.1:9: no Dask scheduler answered" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_a_sweep_on_dask_names_its_points_as_a_local_one_does(tmp_path):
    """A scenario reading a trace beside it: the Dask engine hands its workers absolute paths, but the points'
    keys are the scenario's own, so a sweep moved between engines reuses its points."""
    distributed = pytest.importorskip("dask.distributed")
    shutil.copy(SCENARIOS / "traces" / "azure_conv_1h_first2000.csv", tmp_path / "trace.csv")
    raw = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    raw["workload"] |= {"trace": {"format": "azure", "path": "trace.csv"}, "num_requests": 30}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    sweep = ["sweep", str(tmp_path / "s.yaml"), "--grid", "engine.max_num_seqs=64"]
    assert runner.invoke(app, [*sweep, "--out", str(tmp_path / "local")]).exit_code == 0
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    )
    with cluster:
        dask = [*sweep, "--out", str(tmp_path / "dask"), "--engine", "dask", "--dask-address"]
        result = runner.invoke(app, [*dask, cluster.scheduler_address])
    assert result.exit_code == 0, result.output
    names = [sorted(p.name for p in (tmp_path / out / "points").iterdir()) for out in ("local", "dask")]
    assert names[0] == names[1] and len(names[0]) == 1


def test_a_data_file_whose_keys_do_not_sort_counts_by_its_bytes(tmp_path):
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "mixed.yaml").write_text("1: a\nb: 2\n")  # canonical JSON cannot sort 1 and 'b'
    assert code_fingerprint(tmp_path)
    code_fingerprint.cache_clear()


def test_a_dask_address_without_the_dask_engine_is_refused_not_ignored(tmp_path):
    result = runner.invoke(
        app,
        [
            "sweep",
            _scenario_file(tmp_path),
            "--grid",
            "engine.max_num_seqs=64",
            "--dask-address",
            "tcp://127.0.0.1:9",
        ],
    )
    assert result.exit_code == 2 and "--dask-address needs --engine dask" in result.stderr
    assert result.stderr.count("\n") == 1


def test_dask_points_get_absolute_paths_only(tmp_path, monkeypatch):
    """A cluster's workers run in their own folders: a relative trace, scenario folder or output folder would be
    resolved there (every point failing, or its results lost)."""
    seen = {}

    def record(fn, jobs, *args, **kwargs):
        ((spec, base_dir, out),) = jobs
        seen.update(spec=spec, base_dir=base_dir, out=out)
        raise SpecError("stop here")

    monkeypatch.setattr("servesim.simulator.planning.sweep.run_jobs", record)
    monkeypatch.chdir(tmp_path)
    scenario = Path(_scenario_file(tmp_path)).relative_to(tmp_path)
    raw = yaml.safe_load(scenario.read_text())
    raw["workload"]["trace"]["path"] = "traces/azure_conv_1h_first2000.csv"  # beside the scenario
    scenario.write_text(yaml.safe_dump(raw))
    (tmp_path / "traces").symlink_to(SCENARIOS / "traces")
    result = runner.invoke(
        app, ["sweep", str(scenario), "--grid", "engine.max_num_seqs=64", "--out", "rel", "--engine", "dask"]
    )
    assert result.exit_code == 2 and "stop here" in result.stderr
    assert seen["base_dir"].is_absolute() and seen["out"].parent.parent == tmp_path / "rel"
    assert all(source.path.is_absolute() for source in trace_sources(seen["spec"]))
