"""The CLI end to end: JSON keys, HTML output, and one clear error line for bad names."""

import json
from pathlib import Path

import pytest

from typer.testing import CliRunner

from servesim.simulator.cli.main import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_memory_json_has_the_documented_keys():
    result = run("memory", "llama-3.1-8b", "--gpu", "h200", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kv_bytes_per_token"] == 131072
    for key in ("weight_bytes", "kv_cache_bytes", "kv_cache_tokens", "max_concurrency"):
        assert key in data


def test_memory_tp_and_fp8_options():
    data = json.loads(
        run(
            "memory",
            "llama-3.1-70b",
            "--gpu",
            "h100-sxm",
            "--tp",
            "4",
            "--kv-dtype",
            "fp8",
            "--max-model-len",
            "8192",
            "--json",
        ).stdout
    )
    assert data["kv_bytes_per_token"] == 2 * 80 * 2 * 128 * 1  # 8 KV heads / 4 ranks, fp8


def test_memory_plans_sglangs_split_on_request():
    """--engine sglang: 0.834 of an H100 (SGLang's mem_fraction_static at TP1) for weights and KV, no activation
    profile inside it; the same pool the simulator gives a scenario run with scheduler sglang (25,644 blocks)."""
    data = json.loads(
        run("memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "sglang", "--json").stdout
    )
    assert data["activation_bytes"] == 0 and data["num_blocks"] == 25644
    assert data["usable_bytes"] == 0.834 * data["capacity_bytes"]
    result = run("memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "tgi")
    assert result.exit_code == 2 and "unknown engine 'tgi'; choose from sglang, trtllm, vllm" in result.output


def test_memory_plans_trtllms_free_memory_fraction_on_request():
    """--engine trtllm: the KV cache is 0.9 of what weights, activations and the reserve leave of the device."""
    args = ("memory", "deepseek-v3", "--gpu", "b200", "--tp", "4", "--engine", "trtllm", "--json")
    data = json.loads(run(*args).stdout)
    left = data["capacity_bytes"] - data["weight_bytes"] - data["activation_bytes"] - data["reserve_bytes"]
    assert data["usable_bytes"] == data["capacity_bytes"] and data["block_size"] == 32
    assert data["kv_cache_bytes"] == pytest.approx(0.9 * left)


def test_roofline_json_and_html(tmp_path):
    html = tmp_path / "roof.html"
    result = run(
        "roofline",
        "llama-3.1-8b",
        "--gpu",
        "h200",
        "--batch",
        "256",
        "--context",
        "1024",
        "--json",
        "--html",
        str(html),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"step_time_s", "floor_s", "bound", "operators"} <= set(data)
    assert 13e-3 <= data["step_time_s"] <= 20e-3
    assert {op["name"] for op in data["operators"]} >= {"qkv_proj", "attention_decode", "mlp", "lm_head"}
    text = html.read_text()
    assert "plotly" in text.lower() and "attention_decode" in text


def test_roofline_prices_a_step_as_an_engine_pads_it():
    """9 decodes as vLLM runs them on an H100 (CUDA graphs up to 512 tokens): the GEMMs of 16 rows, the attention
    of the 9; eagerly, 9 rows throughout."""

    def operators(*extra: str) -> dict[str, float]:
        args = ("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", "1000", "--json", *extra)
        result = run(*args)
        assert result.exit_code == 0, result.output
        return {op["name"]: op["time_s"] for op in json.loads(result.stdout)["operators"]}

    padded, nine, sixteen = (
        operators("--batch", "9", "--engine", "vllm"),
        operators("--batch", "9"),
        operators("--batch", "16"),
    )
    assert padded["mlp"] == sixteen["mlp"] != nine["mlp"] and padded["qkv_proj"] == sixteen["qkv_proj"]
    assert padded["attention_decode"] == nine["attention_decode"] and padded["lm_head"] == nine["lm_head"]
    wrong = run("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "tgi")
    assert wrong.exit_code == 2 and "choose from sglang, trtllm, vllm" in wrong.stderr


def test_roofline_table_output():
    result = run("roofline", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--batch", "8", "--prefill", "512")
    assert result.exit_code == 0, result.output
    assert "attention_prefill" in result.stdout and "moe" in result.stdout


def test_unknown_gpu_lists_known_ones():
    result = run("memory", "llama-3.1-8b", "--gpu", "h300")
    assert result.exit_code == 2
    assert "unknown GPU 'h300'" in result.stderr and "h200" in result.stderr


def test_models_and_hardware_listing():
    assert "gemma-3n-e2b" in run("models", "list").stdout
    shown = json.loads(run("models", "show", "gemma-3n-e2b", "--json").stdout)
    assert shown["num_kv_layers"] == 20 and shown["layers"][25]["kv_bytes_per_token_bf16"] == 0
    assert json.loads(run("hardware", "show", "h200", "--json").stdout)["memory_bytes_per_s"] == 4.8e12
    assert "mi300x" in run("hardware", "list").stdout


def test_model_does_not_fit_is_one_line():
    result = run("memory", "llama-3.1-405b", "--gpu", "h100-sxm")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "does not fit" in result.stderr


def test_the_cli_runs_as_a_module_with_every_command():
    """`python -m servesim` works where the console script is not on PATH."""
    import subprocess
    import sys

    for module in ("servesim",):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True,
            text=True,
            check=True,
            env={"COLUMNS": "120", "PATH": ""},
        ).stdout
        assert all(command in out for command in ("simulate", "plan", "compare", "calibrate"))


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["memory", "llama-3.1-8b", "--gpu", "h200", "--tp", "0"],
            "error: Invalid value for '--tp': Input should be greater than or equal to 1",
        ),
        (["roofline", "llama-3.1-8b", "--nope"], "error: No such option: --nope"),
        (["nope"], "error: No such command 'nope'."),
    ],
)
def test_a_usage_error_is_one_line_and_a_hint_not_a_box(args, line):
    """Typer draws click's usage errors as a box of many lines; the console script (and python -m servesim) print
    one line, as for every other error, and a second naming the help to read."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "servesim", *args],
        capture_output=True,
        text=True,
        env={"COLUMNS": "120", "PATH": ""},
    )
    first, hint = done.stderr.splitlines()
    assert done.returncode == 2 and first.startswith(line) and hint.startswith("(see python -m servesim")
    assert done.stderr.count("\n") == 2


def test_bad_paths_and_options_give_one_line_each_and_write_nothing(tmp_path, monkeypatch):
    """Each of these used to end in a traceback (or a silently dropped value); now one line names what is wrong."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    quickstart, pd = (
        str(root / "scenarios" / name) for name in ("quickstart.yaml", "pd_disaggregated_70b.yaml")
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe")
    config = json.loads((root / "hardware" / "model_configs" / "llama-3.1-8b.json").read_text())
    (tmp_path / "heads.json").write_text(json.dumps({**config, "num_key_value_heads": 5}))
    cases = [
        (
            ("sweep", quickstart, "--grid", "engine.max_num_seqs=[64"),
            "--grid 'engine.max_num_seqs=[64': expected",
        ),
        (
            ("sweep", quickstart, "--grid", "engine.max_num_seqs=64", "--grid", "engine.max_num_seqs=128"),
            "--grid engine.max_num_seqs: given twice",
        ),
        (("sweep", quickstart, "--grid", "engine.max_num_seqs=64,64"), "a value is given twice"),
        (("plan", quickstart, "--knob", "max_num_seqs=[64"), "--knob 'max_num_seqs=[64': expected"),
        (("sweep", quickstart, "--grid", "engine.max_num_seqs=64", "--out", "afile"), "afile: is a file"),
        (("plan", quickstart, "--out", "afile"), "afile: is a file"),
        (
            ("plan", quickstart, "--tp", "99999999999999999999"),
            "--tp '99999999999999999999': GPU counts from 1 to 1,024",
        ),  # every candidate was tried and pruned
        (("plan", quickstart, "--pp", "0"), "--pp '0': GPU counts from 1 to 1,024"),
        # each combination was checked one by one before anything ran: minutes of silence, then a hang
        (
            (
                "plan",
                quickstart,
                "--knob",
                f"max_num_seqs={','.join(map(str, range(1, 201)))}",
                "--knob",
                f"block_size={','.join(str(16 * i) for i in range(1, 101))}",
            ),
            "plan: 1 x 4 x 1 x 200 x 100 = 80,000 GPU x TP x PP x knob choices, more than the 10,000 a plan takes",
        ),
        (
            (
                "sweep",
                quickstart,
                "--grid",
                f"seed={','.join(map(str, range(1000)))}",
                "--grid",
                f"engine.max_num_seqs={','.join(map(str, range(1, 1001)))}",
            ),
            "sweep grid: 1000 x 1000 = 1,000,000 points, more than the 100,000 a sweep takes",
        ),
        (("sweep", quickstart, "--grid", "engine.max_num_seqs=64", "--out", "."), "is the current folder"),
        (("simulate", str(root / "scenarios")), "is a folder; give the scenario file itself"),
        (("simulate", "binary.yaml"), "binary.yaml: scenario file is not UTF-8 text"),
        (
            ("memory", "heads.json", "--gpu", "h100-sxm"),
            "num_key_value_heads (5) must divide num_attention_heads",
        ),
        (("calibrate", "--model", "llama-9", "--out", "cal"), "unknown model 'llama-9'"),
        (
            ("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--html", "."),
            "--html .: is a folder; give a file name",
        ),
        (
            ("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--html", "afile/r.html"),
            "afile is a file, not a folder",
        ),
        (
            ("compare", str(root / "benchmarks" / "published_runs.yaml"), "--html", "."),
            "--html .: is a folder",
        ),
        # outputs that could not be written are refused before the work, not found after it
        (("simulate", quickstart, "--out", "afile/run"), "afile is a file, not a folder"),
        (("plan", quickstart, "--out", "afile/plan"), "afile is a file, not a folder"),
        (
            ("sweep", quickstart, "--grid", "engine.max_num_seqs=64", "--out", "afile/sweep"),
            "afile is a file, not",
        ),
        (("plan", quickstart, "--out", "/proc/plan"), "/proc/plan: cannot write in /proc"),
        (("simulate", quickstart, "--out", "/proc/run"), "/proc/run: cannot write in /proc"),
        (
            ("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--html", "/proc/r.html"),
            "cannot write in /proc",
        ),
        # what is wrong names the field it is in
        (
            ("simulate", quickstart, "--set", "parallelism.tp=3"),
            "parallelism: tensor parallel size 3 must divide",
        ),
        (
            ("simulate", pd, "--set", "disaggregation.decode.tp=3"),
            "disaggregation.decode: tensor parallel size 3 must divide",
        ),
        (
            ("simulate", pd, "--set", "disaggregation.decode.gpu=h1000"),
            "disaggregation.decode.gpu: unknown GPU 'h1000'",
        ),
        (
            ("simulate", pd, "--set", "disaggregation.prefill.router=fastest"),
            "disaggregation.prefill.router: unknown router 'fastest'",
        ),
        (
            ("simulate", pd, "--set", "disaggregation.transfer.link=foo"),
            "disaggregation.transfer.link: unknown interconnect 'foo'",
        ),
        (
            ("simulate", pd, "--set", "disaggregation.prefill.engine.scheduler=sglang"),
            "disaggregation.prefill.engine.scheduler 'sglang': prefill and decode pools run vLLM's",
        ),
    ]
    for args, message in cases:
        result = run(*args)
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, (
            args,
            result.output,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "binary.yaml", "heads.json"]


def test_a_hugging_face_model_folder_is_read_by_its_config_json(tmp_path):
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "hardware" / "model_configs" / "llama-3.1-8b.json"
    (tmp_path / "Llama-3.1-8B").mkdir()
    (tmp_path / "Llama-3.1-8B" / "config.json").write_text(config.read_text())
    data = json.loads(run("memory", str(tmp_path / "Llama-3.1-8B"), "--gpu", "h200", "--json").stdout)
    assert data["kv_bytes_per_token"] == 131072


def test_a_sweep_whose_every_point_fails_exits_with_an_error(tmp_path):
    from pathlib import Path

    quickstart = str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml")
    result = run(
        "sweep",
        quickstart,
        "--grid",
        "model=llama-3.1-405b",
        "--set",
        "workload.num_requests=10",
        "--out",
        str(tmp_path / "sweep"),
        "--workers",
        "1",
    )
    assert (
        result.exit_code == 2
        and "every point failed, e.g." in result.output
        and "does not fit" in result.output
    )
    assert (tmp_path / "sweep" / "results.csv").exists()  # the table still tells each point's reason


@pytest.mark.parametrize(
    "raised, code, line",
    [
        (
            ZeroDivisionError("float division by zero"),
            70,
            "error: internal error (a servesim bug; traceback in ",
        ),
        (KeyboardInterrupt(), 130, "aborted: nothing is left half-written"),
        (OSError(28, "No space left on device"), 1, "error: [Errno 28] No space left on device"),
    ],
)
def test_a_bug_ctrl_c_or_a_full_disk_is_one_line_not_a_traceback(
    monkeypatch, tmp_path, capsys, raised, code, line
):
    """A servesim bug says so in one line and names the file keeping its traceback; Ctrl-C says nothing is half
    written (results are written atomically); the machine's own errors are one line."""
    import servesim.simulator.cli.main as cli

    def fail(**_):
        raise raised

    monkeypatch.setattr(cli, "app", fail)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    with pytest.raises(SystemExit) as stop:
        cli.main()
    err = capsys.readouterr().err
    assert stop.value.code == code and err.startswith(line) and len(err.strip().splitlines()) == 1
    if code == 70:
        assert "ZeroDivisionError: float division by zero at test_cli.py:" in err
        (saved,) = tmp_path.glob("servesim-*.traceback.txt")
        assert str(saved) in err and "raise raised" in saved.read_text()


def test_long_quoted_values_are_cut_and_only_whole_quoted_values():
    from servesim.simulator.cli.app import short_values

    assert (
        short_values(f"name: '{'x' * 3000}' names the folder")
        == "name: 'xxxxxxxxxxxxxxxxxxxx...' (3,000 characters) names the folder"
    )
    between_two_values = (
        "grid key 'engine.max_num_seq' is not a scenario field (engine.max_num_seq: unknown field; "
        "did you mean 'max_num_seqs'?)"
    )
    assert short_values(between_two_values) == between_two_values
    assert (
        short_values("gpt-oss-120b's 131072 positions: set 'x'") == "gpt-oss-120b's 131072 positions: set 'x'"
    )
    path = "/data/" + "d" * 200 + "/trace.csv"
    assert short_values(f"{path}: not found") == f"/data/{'d' * 34}...{'d' * 29}/trace.csv: not found"


def test_version_is_the_projects():
    import tomllib
    from pathlib import Path

    expected = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"][
        "version"
    ]
    result = run("--version")
    assert result.exit_code == 0 and result.stdout == f"servesim {expected}\n"
    assert (
        f"## {expected.removesuffix('.dev0')}" in (Path(__file__).parent.parent / "CHANGELOG.md").read_text()
    )


@pytest.mark.parametrize(
    "args",
    [
        ("roofline", "llama-3.1-70b", "--gpu", "b200", "--batch", "99999999999999999999"),  # an OverflowError
        ("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--context", str(2**41)),
        ("roofline", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "4096"),
        ("memory", "llama-3.1-8b", "--gpu", "h100-sxm", "--pp", "99999999999999999999"),
        (
            "memory",
            "qwen3-30b-a3b",
            "--gpu",
            "h100-sxm",
            "--max-num-seqs",
            "99999999999999999999",
        ),  # 244 chars
    ],
)
def test_sizes_past_what_a_step_can_hold_are_usage_errors(args):
    """Found by the fuzzer: a batch of 10^20 reached numpy (OverflowError traceback)."""
    result = run(*args)
    assert result.exit_code == 2 and "Input should be less than or equal to" in result.output


def test_sigterm_unwinds_as_ctrl_c_does(tmp_path):
    """A job scheduler's SIGTERM mid-sweep: the sweep's table is rewritten and the command says so in one line
    (exit 143), rather than dying with the table stale."""
    import subprocess
    import sys

    code = (
        "import os, signal, servesim.simulator.cli.main as cli, servesim.simulator.planning.sweep as sweep\n"
        "real = sweep.simulate\n"
        "def stop(s, b):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(s, b)\n"
        "sweep.simulate = stop\n"
        "cli.main()\n"
    )
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
    args = ["sweep", str(scenario), "--grid", "engine.max_num_seqs=64,128", "--out", str(tmp_path / "s")]
    args += ["--workers", "1", "--set", "workload.num_requests=20"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "terminated: nothing is left half-written"
    assert (tmp_path / "s" / "results.csv").read_text().count("pending") == 2
