"""`servesim calibrate` / `validate` end to end on a tiny model, and the GPU lease script in dry-run mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml
from typer.testing import CliRunner

from hardware.gpu import gpu_catalog
from hardware.profile import load_profile
from simulator.cli import app

TINY = "layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256"
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_calibrate_then_validate(tmp_path):
    result = runner.invoke(app, ["calibrate", "--scale", TINY, "--quick", "--threads", "1",
                                 "--out", str(tmp_path / "tiny.yaml")])
    assert result.exit_code == 0, result.output
    assert "step-time MAPE" in result.output and "gemm_compute" in result.output
    profile = load_profile(tmp_path / "tiny.yaml")
    assert profile.fit_mape is not None and "torch" in profile.provenance
    assert "cpu-local" in gpu_catalog((tmp_path / "device.yaml",))
    grid = pd.read_csv(tmp_path / "grid.csv")
    assert {"time_s", "default_s", "fitted_s", "split", "torch_version"} <= set(grid.columns)
    result = runner.invoke(app, ["validate", str(tmp_path), "--requests", "20", "--prompt-median", "40",
                                 "--output-max", "12", "--max-num-batched-tokens", "64", "--num-prefixes", "2",
                                 "--prefix-tokens", "32", "--out", str(tmp_path / "v")])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert table["metric"].tolist() == ["ttft", "tpot", "e2el", "output_throughput", "step_time"]
    measured = pd.read_csv(tmp_path / "v" / "requests_measured.csv")
    assert len(measured) == 20 and measured["cached_tokens"].sum() > 0  # the shared prefixes were hit
    assert "plotly" in (tmp_path / "v" / "validation.html").read_text().lower()


def test_bad_arguments_are_one_line_errors(tmp_path):
    bad = runner.invoke(app, ["calibrate", "--device", "tpu", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "choose cpu or cuda" in bad.stderr
    bad = runner.invoke(app, ["calibrate", "--scale", "depth=3", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "key one of" in bad.stderr
    bad = runner.invoke(app, ["validate", str(tmp_path)])
    assert bad.exit_code == 2 and "calibration.json" in bad.stderr and bad.stderr.count("\n") == 1


def test_gpu_lease_script_dry_run_writes_everything_in_two_calls(tmp_path):
    """A lease command runs at most 10 minutes: the script's two phases fill one folder from two calls."""
    # the script runs `python` from PATH: make it this interpreter
    env = os.environ | {"OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = str(ROOT / "calibration" / "gpu_lease.sh")
    bad = subprocess.run(["bash", script, "--dry-run", "mistral"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and "llama|gemma" in bad.stderr
    for phase in ("llama", "gemma"):
        done = subprocess.run(["bash", script, "--dry-run", phase], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"lease done ({phase})" in done.stdout
    assert (tmp_path / "environment.txt").read_text().count("torch") == 2
    for model in ("llama-3.1-8b", "gemma-3n-e2b"):
        folder = tmp_path / model
        for name in ("profile.yaml", "grid.csv", "validation.csv", "validation.html", "requests_measured.csv"):
            assert (folder / name).exists(), folder / name
        assert (tmp_path / f"{model}.validate.txt").read_text().count("ttft") == 1
    gemma = pd.read_csv(tmp_path / "gemma-3n-e2b" / "grid.csv")
    assert set(gemma["fast_prefill"]) == {True, False}  # YOCO on and off were both timed
    assert yaml.safe_load((tmp_path / "gemma-3n-e2b" / "profile.yaml").read_text())["fit_mape"] is not None
