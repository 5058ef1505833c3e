"""`servesim simulate` end to end on the bundled quickstart, and one clear line for each kind of bad scenario."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from servesim.simulator.cli.main import app

runner = CliRunner()
QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def simulate(*args: str):
    return runner.invoke(app, ["simulate", *args])


def test_quickstart_writes_a_complete_run_folder(tmp_path):
    out = tmp_path / "run"
    result = simulate(str(QUICKSTART), "--out", str(out), "--set", "workload.num_requests=200")
    assert result.exit_code == 0, result.output
    # the marker: servesim wrote it
    assert {p.name for p in out.iterdir()} == {
        "requests.csv",
        "steps.csv",
        "summary.json",
        "memory.json",
        "scenario.yaml",
        ".servesim",
    }
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "p90_ttft_ms",
        "mean_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "p99_e2el_ms",
        "request_goodput",
        "rejected",
        "preemptions",
        "kv_cache_usage_mean",
        "kv_cache_usage_max",
        "duration_s",
    ):
        assert key in summary, key
    assert summary["completed"] == 200
    resolved = yaml.safe_load((out / "scenario.yaml").read_text())
    assert resolved["workload"]["num_requests"] == 200 and resolved["engine"]["max_num_seqs"] == 256
    assert "mean_ttft_ms" in result.stdout


def _as_read(df: pd.DataFrame) -> pd.DataFrame:
    """Values as read back, whatever the format typed them: missing ones as None."""
    return df.astype(object).where(df.notna(), None)


def test_tables_as_parquet_hold_what_the_csv_tables_hold_and_report(tmp_path, monkeypatch):
    from servesim.simulator.world import output
    from servesim.simulator.world.output import read_table

    runs = {}
    for tables in ("csv", "parquet"):
        runs[tables] = tmp_path / tables
        result = simulate(
            str(QUICKSTART),
            "--out",
            str(runs[tables]),
            "--set",
            "workload.num_requests=200",
            "--tables",
            tables,
        )
        assert result.exit_code == 0, result.output
    assert {p.name for p in runs["parquet"].iterdir()} >= {
        "requests.parquet",
        "steps.parquet",
        "summary.json",
    }
    assert not (runs["parquet"] / "requests.csv").exists()
    for name in ("requests", "steps"):
        pd.testing.assert_frame_equal(
            _as_read(read_table(runs["parquet"], name)),
            _as_read(read_table(runs["csv"], name)),
            check_dtype=False,
        )
    assert runner.invoke(app, ["report", str(runs["parquet"])]).exit_code == 0
    # auto: a table longer than the threshold goes to Parquet, a shorter one stays CSV
    monkeypatch.setattr(output, "PARQUET_ABOVE_ROWS", 500)
    auto = tmp_path / "auto"
    assert simulate(str(QUICKSTART), "--out", str(auto), "--set", "workload.num_requests=200").exit_code == 0
    assert (auto / "requests.csv").exists() and (auto / "steps.parquet").exists()
    assert (
        "--tables 'xml': choose one of auto, csv, parquet"
        in simulate(str(QUICKSTART), "--out", str(tmp_path / "x"), "--tables", "xml").output
    )


def test_the_resolved_scenario_of_a_run_reruns_to_the_same_summary(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert simulate(str(QUICKSTART), "--out", str(first), "--set", "workload.num_requests=50").exit_code == 0
    resolved = yaml.safe_load((first / "scenario.yaml").read_text())
    assert Path(resolved["workload"]["trace"]["path"]).is_absolute()  # so it reruns from the run folder
    result = simulate(str(first / "scenario.yaml"), "--out", str(second))
    assert result.exit_code == 0, result.output
    assert (first / "summary.json").read_text() == (second / "summary.json").read_text()
    assert (first / "summary.json").stat().st_mode & 0o044  # readable by others, not only the owner


def test_an_output_folder_is_replaced_only_when_servesim_wrote_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "data.txt").write_text("mine")
    result = simulate(str(QUICKSTART), "--out", str(out), "--set", "workload.num_requests=20")
    assert result.exit_code == 2 and "holds files servesim did not write" in result.output
    assert (out / "sub" / "data.txt").read_text() == "mine" and not (out / "summary.json").exists()
    # the user's scenario alone is no earlier output, though a run writes that name
    own = tmp_path / "experiment"
    own.mkdir()
    (own / "scenario.yaml").write_text(QUICKSTART.read_text())
    result = simulate(str(own / "scenario.yaml"), "--out", str(own), "--set", "workload.num_requests=20")
    assert result.exit_code == 2 and "holds files servesim did not write (scenario.yaml)" in result.output
    assert (own / "scenario.yaml").read_text() == QUICKSTART.read_text()
    again = tmp_path / "again"
    for _ in range(2):  # an earlier run's folder is replaced whole
        assert (
            simulate(str(QUICKSTART), "--out", str(again), "--set", "workload.num_requests=20").exit_code == 0
        )
    (again / ".servesim").unlink()  # a run folder from before the marker: replaced as well
    assert simulate(str(QUICKSTART), "--out", str(again), "--set", "workload.num_requests=20").exit_code == 0
    monkeypatch.chdir(again)
    result = simulate(str(QUICKSTART), "--out", ".", "--set", "workload.num_requests=20")
    assert result.exit_code == 2 and "the current folder or one above it" in result.output
    assert (again / "summary.json").exists()
    result = simulate(str(QUICKSTART), "--out", str(again / "summary.json"))
    assert result.exit_code == 2 and "is a file" in result.output
    assert not list(tmp_path.glob(".*.tmp"))  # no temp folder left behind


def test_a_run_with_no_answer_writes_strict_json_and_says_so(tmp_path):
    """Every request longer than max_model_len: rates are 0, latencies null (not NaN, which JSON lacks)."""
    out = tmp_path / "run"
    result = simulate(
        str(QUICKSTART),
        "--out",
        str(out),
        "--set",
        "workload.num_requests=20",
        "--set",
        "engine.max_model_len=16",
    )
    assert result.exit_code == 0, result.output
    assert "warning: every request was rejected" in result.output
    text = (out / "summary.json").read_text()
    assert "NaN" not in text
    summary = json.loads(text)
    assert summary["completed"] == 0 and summary["rejected"] == 20 and summary["request_throughput"] == 0.0
    assert summary["mean_ttft_ms"] is None


def test_a_run_cut_off_by_its_stop_time_counts_the_unfinished(tmp_path):
    out = tmp_path / "run"
    result = simulate(
        str(QUICKSTART),
        "--out",
        str(out),
        "--set",
        "workload.num_requests=200",
        "--set",
        "stop.max_sim_time_s=6.5",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    open_ = req["finish_s"].isna() & req["reject_reason"].isna()
    assert summary["unfinished"] == (open_ & (req["arrival_s"] < 6.5)).sum() > 0  # the backlog at the stop
    assert summary["not_arrived"] == (req["arrival_s"] >= 6.5).sum() > 0  # due after it: never seen
    assert summary["completed"] + summary["rejected"] + summary["unfinished"] + summary["not_arrived"] == 200
    assert "unfinished" in result.stdout and "not_arrived" in result.stdout


def test_slo_attainment_of_an_overloaded_run_counts_the_requests_its_stop_left_already_late(tmp_path):
    """50 requests/s overload one H100: at the 6 s stop most requests are still queued, many far past the
    quickstart's 500 ms TTFT. Counting only the few finished would call the run mostly fine."""
    out = tmp_path / "run"
    result = simulate(
        str(QUICKSTART),
        "--out",
        str(out),
        "--set",
        "workload.num_requests=300",
        "--set",
        "workload.arrivals={kind: poisson, rate_per_s: 50}",
        "--set",
        "stop.max_sim_time_s=6",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    arrived = req["arrival_s"] < 6.0  # the rest were never sent: neither met nor missed
    done, cut = (
        req[req["finish_s"].notna()],
        req[req["finish_s"].isna() & req["reject_reason"].isna() & arrived],
    )
    met = int(((done["ttft_s"] <= 0.5) & ~(done["tpot_s"] > 0.05)).sum())
    no_first = cut["first_token_s"].isna()
    late = (
        (no_first & (6.0 - cut["arrival_s"] > 0.5))
        | (~no_first & (cut["ttft_s"] > 0.5))
        | ((6.0 - cut["first_token_s"]) / (cut["requested_output_tokens"] - 1).clip(lower=1) > 0.05)
    )
    assert 0 < late.sum() < len(cut) and 0 < met < len(done)  # some judged late, some still open
    assert summary["slo_met"] == met and summary["slo_undecided"] == len(cut) - late.sum()
    assert summary["slo_attainment"] == pytest.approx(met / (len(done) + summary["rejected"] + late.sum()))
    # ITL pools completed requests' gaps only, as vLLM's benchmark: they sum to E2E - TTFT, one per later token
    gaps = done["e2el_s"] - done["ttft_s"]
    assert summary["mean_itl_ms"] == pytest.approx(gaps.sum() / (done["output_tokens"] - 1).sum() * 1e3)


def test_same_seed_same_summary_and_seed_flag(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert (
            simulate(
                str(QUICKSTART), "--out", str(out), "--set", "workload.num_requests=100", "--seed", "7"
            ).exit_code
            == 0
        )
    assert (a / "summary.json").read_text() == (b / "summary.json").read_text()
    assert yaml.safe_load((a / "scenario.yaml").read_text())["seed"] == 7


def test_schema_is_json_schema_of_scenarios():
    result = runner.invoke(app, ["schema"])
    schema = json.loads(result.stdout)
    assert schema["title"] == "Scenario" and "workload" in schema["properties"]


def _bad(tmp_path: Path, edit) -> tuple[object, Path]:
    raw = yaml.safe_load(QUICKSTART.read_text())
    edit(raw)
    shutil.copytree(QUICKSTART.parent / "traces", tmp_path / "traces")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    return simulate(str(path), "--out", str(out)), out


@pytest.mark.parametrize(
    "edit,expected",
    [
        (
            lambda r: r["engine"].update(scheduler="fifo"),  # P/D pools' own schedulers are not offered
            "engine: unknown scheduler 'fifo'; choose from orca, sarathi, seed_toy, sglang, static, trtllm, vllm\n",
        ),
        (
            lambda r: r["engine"].update(queue_order="random"),
            "unknown queue order 'random'; choose from fcfs",
        ),
        (
            lambda r: r.update(
                workload={
                    "lengths": {
                        "prompt": {"kind": "fixed", "value": 10},
                        "output": {"kind": "fixed", "value": 10},
                    },
                    "arrivals": {"kind": "poisson", "rate_per_s": -3},
                    "num_requests": 5,
                }
            ),
            "bad.yaml: workload.arrivals.rate_per_s: Input should be greater than 0",
        ),  # no union tag in the path
        (lambda r: r["workload"]["trace"].update(path="traces/nope.csv"), "nope.csv"),
        (lambda r: r["engine"].update(max_num_seqs="many"), "engine.max_num_seqs"),
        (lambda r: r["engine"].update(preemption_mode="drop"), "engine.preemption_mode"),
        (lambda r: r.update(gpu_count=3), "gpu_count: unknown field"),
        (
            lambda r: r["engine"].update(max_num_seq=8),
            "engine.max_num_seq: unknown field; did you mean 'max_num_seqs'? (35 fields here: servesim schema)",
        ),
        (
            lambda r: r.update(workloads=r.pop("workload")),  # not only "workload: Field required"
            "workloads: unknown field; did you mean 'workload'?",
        ),
        (lambda r: r["hardware"].update(gpu="h300"), "hardware.gpu: unknown GPU 'h300'"),
        (
            lambda r: r.update(
                parallelism={"inter_node_link": "bogus"}
            ),  # checked even where no replica spans nodes
            "parallelism.inter_node_link: unknown interconnect 'bogus'; known: ib-hdr-200",
        ),
        (lambda r: r["hardware"].update(gpu="h100sxm"), "unknown GPU 'h100sxm'; did you mean 'h100-sxm'?"),
        (
            lambda r: r.update(
                engine={**r["engine"], "scheduler": "sglang"},
                disaggregation={
                    "prefill": {"replicas": 1},
                    "decode": {"replicas": 1},
                    "transfer": {"link": "ib-ndr-400"},
                },
            ),
            "engine.scheduler 'sglang': prefill and decode pools run vLLM's P/D schedulers (allowed with "
            "disaggregation: vllm)",
        ),
        # found by the fuzzer: a MemoryError traceback, and a line of 3,000 characters echoing the name given
        (
            lambda r: r.update(cluster={"replicas": 10**6}),
            "cluster.replicas: Input should be less than or equal to 4096",
        ),
        (
            lambda r: r["workload"].update(arrivals={"kind": "x" * 3000}),
            "workload.arrivals: unknown kind 'xxxxxxxxxxxxxxxxxxxx...' (3,000 characters); choose from poisson, "
            "gamma, constant, all_at_once, trace",
        ),
        (
            lambda r: r["workload"]["trace"].update(
                path="x" * 3000
            ),  # an OSError traceback (file name too long)
            "trace file cannot be looked up (File name too long)",
        ),
        (
            lambda r: r.update(name="x" * 3000),
            "name: 'xxxxxxxxxxxxxxxxxxxx...' (3,000 characters) names the output folder",
        ),
    ],
)
def test_bad_scenarios_give_one_clear_line_and_no_run_folder(tmp_path, edit, expected):
    result, out = _bad(tmp_path, edit)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert result.stderr.count("\n") == 1 and "bad.yaml" in result.stderr or "nope.csv" in result.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.*"))  # no half-written temp folder either


def test_trace_rows_dropped_in_cleaning_are_told_with_their_reason(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,300,20\n0.5,250,\n1.0,200,0\n1.5,100,5\n")
    scenario = yaml.safe_load(QUICKSTART.read_text())
    scenario["workload"] = {
        "trace": {"format": "servesim", "path": str(trace)},
        "arrivals": {"kind": "trace"},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    result = simulate(str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed"] == 2
    assert (
        f"note: {trace}: 2 dropped: a length missing, not a number or below 1 (2) (of its 4 rows)\n"
        in result.stderr
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: a\nmodel: llama-3.1-8b\nmodel: qwen3-8b\n", "line 3, column 1: key 'model' is given twice"),
        ("name: a\nmodel: [llama\n  hardware: x\n", "line 3, column 11: expected ',' or ']', but got ':'"),
        (
            "name: a\nworkload: " + "[" * 5000 + "]" * 5000 + "\n",
            "line 2, column 74: nested deeper than 64 levels",
        ),
        ("name: a\n1: b\n", "line 2, column 1: key 1 is not text (quote it if it is a name)"),
    ],
)
def test_a_file_that_is_not_a_clean_yaml_mapping_is_one_line_with_its_place(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    result = simulate(str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr == f"error: {path}: not valid YAML: {expected}\n"


def test_missing_scenario_file_and_bad_override(tmp_path):
    assert "scenario file not found" in simulate(str(tmp_path / "none.yaml")).stderr
    result = simulate(str(QUICKSTART), "--set", "engine.max_num_seqs")
    assert result.exit_code == 2 and "expected dotted.key=value" in result.stderr
    result = simulate(str(QUICKSTART), "--set", "engine.max_num_seqs=8", "--set", "engine.max_num_seqs=16")
    assert result.exit_code == 2
    assert result.stderr == "error: --set 'engine.max_num_seqs=16': engine.max_num_seqs is set twice\n"
    result = simulate(str(QUICKSTART), "--set", "engine.max_num_seqs=[8")
    assert result.exit_code == 2 and result.stderr.startswith(
        "error: --set 'engine.max_num_seqs=[8': the value is not"
    )
    result = simulate(str(QUICKSTART), "--set", "hardware.gpux=h100")  # the file is fine: the override is not
    assert result.exit_code == 2
    assert (
        "quickstart.yaml (from --set): hardware.gpux: unknown field; did you mean 'gpu'? (fields here: gpu,"
        in result.stderr
    )
    bad_file = tmp_path / "bad.yaml"
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["engine"]["max_num_seqs_x"] = 1
    bad_file.write_text(yaml.safe_dump(raw))
    # the file's mistake, not the override's
    result = simulate(str(bad_file), "--set", "engine.max_num_seqs=8")
    assert "bad.yaml: engine.max_num_seqs_x: unknown field" in result.stderr


def test_the_run_line_names_what_serves_it():
    """Replicas x GPUs; the P/D pools; or each stage of a pipeline, whose latencies are its last stage's."""
    from servesim.simulator.cli.main import deployment_label
    from servesim.simulator.scenario import load_scenario

    scenarios = QUICKSTART.parent
    label = lambda name: deployment_label(load_scenario(scenarios / f"{name}.yaml")[0])  # noqa: E731
    assert label("quickstart") == "llama-3.1-8b, 1 replica(s) of 1 x h100-sxm"
    assert label("pd_disaggregated_70b").startswith("llama-3.1-70b, prefill ")
    assert ", decode " in label("pd_disaggregated_70b")
    omni = label("omni_thinker_talker")
    assert omni.startswith("stages thinker (qwen2.5-7b, 1 x 1 h100-sxm) -> talker (llama-3.2-1b,")
    assert omni.endswith("latencies are the last stage's tokens")


def test_a_scenarios_relative_model_profile_and_gpu_files_sit_beside_it(tmp_path, monkeypatch):
    """Like its traces, a scenario's own config.json, profile and GPU file paths are relative to its folder, run
    from anywhere; a --set path stays relative to the working folder."""
    root = Path(__file__).resolve().parents[2]
    folder = tmp_path / "exp"
    folder.mkdir()
    shutil.copy(root / "hardware" / "model_configs" / "llama-3.1-8b.json", folder / "mymodel.json")
    shutil.copy(root / "calibration" / "profiles" / "vllm-published.yaml", folder / "myprof.yaml")
    (folder / "mygpu.yaml").write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        **yaml.safe_load((root / "hardware" / "catalog" / "gpus.yaml").read_text())["gpus"][
                            0
                        ],
                        "name": "my-gpu",
                    }
                ]
            }
        )
    )
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["workload"]["trace"]["path"] = str(root / "scenarios" / raw["workload"]["trace"]["path"])
    raw |= {
        "model": "mymodel.json",
        "hardware": {"gpu": "my-gpu", "gpu_files": ["mygpu.yaml"], "profile": "myprof.yaml"},
    }
    (folder / "s.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    result = simulate("exp/s.yaml", "--out", "run", "--set", "workload.num_requests=20")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load((tmp_path / "run" / "scenario.yaml").read_text())
    assert resolved["model"] == str(folder / "mymodel.json")
    assert resolved["hardware"]["profile"] == str(folder / "myprof.yaml")
    assert resolved["hardware"]["gpu_files"] == [str(folder / "mygpu.yaml")]
    shutil.copy(folder / "myprof.yaml", tmp_path / "here.yaml")
    result = simulate(
        "exp/s.yaml",
        "--out",
        "run2",
        "--set",
        "workload.num_requests=20",
        "--set",
        "hardware.profile=here.yaml",
    )
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/abs", "x" * 129])
def test_a_name_that_is_no_folder_name_is_refused(tmp_path, name):
    """`name` makes runs/<name>: an empty one, `.`, a path or an absolute one would write elsewhere (or into runs/
    itself, whose later runs a rerun would replace)."""
    raw = yaml.safe_load(QUICKSTART.read_text()) | {"name": name}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    result = simulate(str(tmp_path / "s.yaml"))
    assert result.exit_code == 2 and "names the output folder runs/<name>" in result.output


@pytest.mark.parametrize(
    "model,settings,notes",
    [
        (
            "llama-3.1-8b",
            ["parallelism.ep=true", "engine.kv_sharing_fast_prefill=true"],
            [
                "parallelism.ep: llama-3.1-8b has no routed experts",
                "engine.kv_sharing_fast_prefill: no layer of llama-3.1-8b reads another's KV",
            ],
        ),
        ("gpt-oss-20b", ["parallelism.ep=true"], []),  # experts to spread: nothing to say
        ("gemma-3n-e2b", ["engine.kv_sharing_fast_prefill=true"], []),  # KV-sharing layers: fast prefill acts
    ],
)
def test_settings_the_model_gives_nothing_to_act_on_are_noted(tmp_path, model, settings, notes):
    args = [
        str(QUICKSTART),
        "--out",
        str(tmp_path / "run"),
        "--set",
        f"model={model}",
        "--set",
        "workload.num_requests=20",
        "--set",
        "engine.max_model_len=4096",
    ]
    for setting in settings:
        args += ["--set", setting]
    result = simulate(*args)
    assert result.exit_code == 0, result.output
    shown = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(shown) == len(notes) and all(note in line for note, line in zip(notes, shown)), shown


@pytest.mark.parametrize(
    "setting,expected",
    [
        ("engine.max_num_seqs=true", "engine.max_num_seqs"),  # pydantic alone: 1 sequence
        ("workload.arrivals.rate_per_s=no", "workload.arrivals.rate_per_s"),
        ("parallelism.tp=yes", "parallelism.tp"),
        ("engine.max_model_len=false", "engine.max_model_len"),  # an optional number
        (
            "engine.speculative={method: ngram, k: 2, acceptance: true}",
            "engine.speculative.acceptance",
        ),  # float | model
        ("plan.tp=[2, true]", "plan.tp"),  # an item of a list of numbers
    ],
)
def test_a_true_or_false_where_a_number_belongs_is_refused(tmp_path, setting, expected):
    result = simulate(str(QUICKSTART), "--out", str(tmp_path / "out"), "--set", setting)
    assert result.exit_code == 2, result.output
    assert (
        result.stderr
        == f"error: {QUICKSTART} (from --set): {expected}: expected a number, not a true/false\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_true_or_false_stays_valid_where_the_field_takes_one(tmp_path):
    result = simulate(
        str(QUICKSTART),
        "--out",
        str(tmp_path / "out"),
        "--set",
        "workload.num_requests=20",
        "--set",
        "engine.enable_chunked_prefill=true",
        "--set",
        "engine.async_scheduling=false",
    )
    assert result.exit_code == 0, result.output


def test_a_measured_kernel_profile_prices_each_engine_from_its_own_tables(tmp_path):
    """`hardware.profile: measured` end to end: the run's steps come from the kernel tables (not the defaults'
    roofline), vLLM's and SGLang's from their own, and the same scenario reruns to the same numbers."""

    def run(name: str, *sets: str) -> dict:
        result = simulate(
            str(QUICKSTART),
            "--out",
            str(tmp_path / name),
            "--set",
            "workload.num_requests=150",
            *(arg for value in sets for arg in ("--set", value)),
        )
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / name / "summary.json").read_text())

    default = run("default")
    measured = run("measured", "hardware.profile=measured")
    again = run("again", "hardware.profile=measured")
    sglang = run(
        "sglang", "hardware.profile=measured", "engine.scheduler=sglang", "engine.prefix_caching=radix"
    )
    sglang_default = run("sglang_default", "engine.scheduler=sglang", "engine.prefix_caching=radix")
    assert measured == again
    assert measured["completed"] == default["completed"] == 150
    assert measured["mean_tpot_ms"] != default["mean_tpot_ms"]
    # SGLang's kernels price its steps: the change from the defaults is not vLLM's
    assert (
        sglang["mean_tpot_ms"] / sglang_default["mean_tpot_ms"]
        != measured["mean_tpot_ms"] / default["mean_tpot_ms"]
    )


def test_a_path_the_terminal_cannot_encode_is_escaped_not_a_crash(tmp_path):
    out = tmp_path / "r\u00e9sultats"
    env = os.environ | {"PYTHONIOENCODING": "ascii"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "servesim",
            "simulate",
            str(QUICKSTART),
            "--out",
            str(out),
            "--set",
            "workload.num_requests=10",
        ],
        cwd=QUICKSTART.parents[1],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"r\\xe9sultats" in done.stdout and (out / "summary.json").exists()


def test_an_out_path_through_dot_dot_makes_no_folders_on_the_way(tmp_path):
    result = simulate(
        str(QUICKSTART),
        "--out",
        str(tmp_path / "a" / "b" / ".." / ".." / "x"),
        "--set",
        "workload.num_requests=10",
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "summary.json").exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "override",
    [
        "slo.ttft_ms=.inf",
        "slo.tpot_ms=.nan",
        "engine.gpu_memory_utilization=.nan",
        "workload.arrivals={kind: poisson, rate_per_s: .inf}",
    ],
)
def test_a_non_finite_number_is_refused_by_name(tmp_path, override):
    """An infinite SLO or rate was accepted and used: no NaN or inf gets past the scenario's models."""
    result = simulate(str(QUICKSTART), "--out", str(tmp_path / "out"), "--set", override)
    field = override.split("=")[0] + (".rate_per_s" if "rate_per_s" in override else "")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert (
        result.stderr.endswith(f"{field}: Input should be a finite number\n")
        and result.stderr.count("\n") == 1
    )


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "engine.num_gpu_blocks_override=100000000000000000000",
            "Input should be less than or equal to 16777216",
        ),
        ("workload.num_requests=1000000000000", "Input should be less than or equal to 100000000"),
    ],
)
def test_an_absurd_size_is_refused_before_anything_is_allocated(tmp_path, override, expected):
    """A 10^20-block pool crashed in deque (SystemError) or hung; 10^12 requests asked numpy for 7 TiB."""
    result = simulate(str(QUICKSTART), "--out", str(tmp_path / "out"), "--set", override)
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr.endswith(f"{override.split('=')[0]}: {expected}\n")


def test_replicas_whose_blocks_together_are_too_many_are_refused_before_any_pool_is_made(tmp_path):
    """Found by the fuzzer: 2,000 replicas of 27,794 blocks each were a MemoryError traceback (~130 bytes a block)."""
    result = simulate(str(QUICKSTART), "--out", str(tmp_path / "out"), "--set", "cluster.replicas=2000")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert "2,000 replicas x 27,794 KV blocks = 55,588,000 blocks, more than the 16,777,216" in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_run_prints_units_its_slo_verdict_and_a_warning_with_the_cause_when_overloaded(tmp_path):
    calm = simulate(str(QUICKSTART), "--out", str(tmp_path / "calm"), "--set", "workload.num_requests=200")
    assert calm.exit_code == 0, calm.output
    assert "│ request_throughput" in calm.stdout and "requests/s" in calm.stdout and "tokens/s" in calm.stdout
    assert "SLO, p90: TTFT <= 500 ms, TPOT <= 50 ms: met" in calm.stdout and "warning" not in calm.stderr
    rushed = simulate(
        str(QUICKSTART),
        "--out",
        str(tmp_path / "rushed"),
        "--set",
        "workload.num_requests=600",
        "--set",
        "workload.arrivals.time_scale=0.02",  # the trace 50x faster: ~230 requests/s at one H100
    )
    assert rushed.exit_code == 0, rushed.output
    assert "SLO, p90: TTFT <= 500 ms, TPOT <= 50 ms: missed: p90 TTFT" in rushed.stdout
    (warning,) = [line for line in rushed.stderr.splitlines() if line.startswith("warning: overloaded")]
    assert "mean queue wait grows from" in warning and f"servesim capacity {QUICKSTART}" in warning
    batch = simulate(
        str(QUICKSTART),
        "--out",
        str(tmp_path / "batch"),
        "--set",
        "workload.num_requests=600",
        "--set",
        "workload.arrivals={kind: all_at_once}",
        "--set",
        "note=a batch, queued by design",
    )
    assert batch.exit_code == 0, batch.output
    assert "warning: overloaded" not in batch.stderr and "note: a batch, queued by design" in batch.stderr
    refused = simulate(
        str(QUICKSTART),
        "--out",
        str(tmp_path / "refused"),
        "--set",
        "workload.num_requests=20",
        "--set",
        "engine.max_model_len=64",  # every prompt longer
    )
    assert refused.exit_code == 0, refused.output
    assert "TPOT <= 50 ms: not measured: no request completed" in refused.stdout
    assert "warning: every request was rejected" in refused.stderr
