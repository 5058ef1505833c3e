"""`servesim calibrate` / `validate` end to end on a tiny model, and the GPU lease script in dry-run mode."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from servesim.calibration import pipeline
from servesim.calibration.pipeline import IN_PROGRESS, Setup, run_calibration
from servesim.calibration.scaled import parse_scale
from servesim.hardware.gpu import gpu_catalog
from servesim.hardware.profile import load_profile
from servesim.simulator.cli.main import app

TINY = "layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256"
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_calibrate_then_validate(tmp_path):
    result = runner.invoke(
        app, ["calibrate", "--scale", TINY, "--quick", "--threads", "1", "--out", str(tmp_path / "tiny.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "step-time MAPE" in result.output and "gemm_compute" in result.output
    # the scale is text, not rich markup
    assert "[layers=2," in result.output and "vocab=256]" in result.output
    assert not list(tmp_path.glob(f"{IN_PROGRESS}*"))
    profile = load_profile(tmp_path / "tiny.yaml")
    assert profile.fit_mape is not None and "torch" in profile.provenance
    assert "cpu-local" in gpu_catalog((tmp_path / "device.yaml",))
    grid = pd.read_csv(tmp_path / "grid.csv")
    assert {"time_s", "default_s", "fitted_s", "split", "torch_version"} <= set(grid.columns)
    result = runner.invoke(
        app,
        [
            "validate",
            str(tmp_path),
            "--requests",
            "20",
            "--prompt-median",
            "40",
            "--output-max",
            "12",
            "--max-num-batched-tokens",
            "64",
            "--num-prefixes",
            "2",
            "--prefix-tokens",
            "32",
            "--out",
            str(tmp_path / "v"),
        ],
    )
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "v" / "validation.csv")
    assert table["metric"].tolist() == ["ttft", "tpot", "e2el", "output_throughput", "step_time"]
    measured = pd.read_csv(tmp_path / "v" / "requests_measured.csv")
    assert len(measured) == 20 and measured["cached_tokens"].sum() > 0  # the shared prefixes were hit
    assert "plotly" in (tmp_path / "v" / "validation.html").read_text().lower()


def test_an_interrupted_calibration_leaves_no_finished_looking_file(tmp_path, monkeypatch):
    """Until the last phase ends, the grid-only profile and the device's peaks wait in calibrate-in-progress-*/; a run
    stopped in the last phase leaves the folder's earlier calibration as it was. Each phase shows a progress bar."""
    earlier = {
        name: f"earlier {name}" for name in ("profile.yaml", "device.yaml", "grid.csv", "calibration.json")
    }
    for name, text in earlier.items():
        (tmp_path / name).write_text(text)
    seen = {}

    def interrupted(served):
        seen["folder"] = sorted(p.name for p in tmp_path.iterdir())
        (work,) = tmp_path.glob(f"{IN_PROGRESS}-*")  # the run's own
        seen["work"], seen["work_name"] = sorted(p.name for p in work.iterdir()), work.name
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "host_overhead", interrupted)
    terminal = Console(file=io.StringIO(), force_terminal=True, width=120)
    setup = Setup("llama-3.1-8b", parse_scale(TINY), "cpu", "", (), threads=1)
    with pytest.raises(KeyboardInterrupt):
        run_calibration(setup, tmp_path, quick=True, console=terminal)
    assert seen["folder"] == sorted([*earlier, seen["work_name"]])
    assert {"grid-only-profile.yaml", "device.yaml"} <= set(seen["work"])
    # untouched; the work folder is gone
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == earlier
    shown = terminal.file.getvalue()
    for phase in (
        "measuring the device",
        "timing the grid (20 shapes), rounds",
        "fitting the grid",
        "serving the calibration trace",
        "refitting with the served steps",
        "fitting the host overhead",
    ):
        assert phase in shown, phase


def test_bad_arguments_are_one_line_errors(tmp_path):
    bad = runner.invoke(app, ["calibrate", "--device", "tpu", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "choose cpu or cuda" in bad.stderr
    bad = runner.invoke(app, ["calibrate", "--scale", "depth=3", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "key one of" in bad.stderr
    bad = runner.invoke(app, ["validate", str(tmp_path)])
    assert bad.exit_code == 2 and "calibration.json" in bad.stderr and bad.stderr.count("\n") == 1


LEASE_SCRIPT = str(ROOT / "calibration" / "gpu_lease.sh")
LEASE_RESULTS = ("profile.yaml", "grid.csv", "validation.csv", "validation.html", "requests_measured.csv")


# A lent GPU machine runs the script from a copy of the checkout with nothing installed: this sitecustomize hides
# the development install's finder and metadata, so servesim imports from its folders as it does there.
UNINSTALLED = """import importlib.metadata as metadata, sys
sys.meta_path[:] = [f for f in sys.meta_path if "servesim" not in getattr(f, "__module__", "")]
_version = metadata.version
def version(name):
    if name == "servesim":
        raise metadata.PackageNotFoundError(name)
    return _version(name)
metadata.version = version
"""


def _uninstalled(folder: Path) -> dict[str, str]:
    """Environment variables under which Python sees servesim as a lent machine's bare checkout does."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(UNINSTALLED)
    return {"PYTHONPATH": str(folder)}


def test_a_bare_checkout_imports_servesim_from_its_folders(tmp_path):
    env = os.environ | _uninstalled(tmp_path / "site")
    code = "import servesim, servesim.simulator.cli.main as m; print(servesim.__version__, m.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    version, main = out.stdout.split()
    assert version == "0+checkout" and Path(main) == ROOT / "simulator" / "cli" / "main.py"


def _lease(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", LEASE_SCRIPT, *args],
        env=os.environ | {"OUT": str(out), "PYTHON": sys.executable, **env},
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _assert_lease_results(folder: Path, model: str) -> None:
    assert (folder / "environment.txt").read_text().count("torch") == 1
    assert "needs a CUDA device" in (folder / "gpu_tests.txt").read_text()  # skipped here
    for name in LEASE_RESULTS:
        assert (folder / model / name).exists(), folder / model / name
    assert (folder / f"{model}.validate.txt").read_text().count("ttft") == 1


def test_gpu_lease_script_dry_run_writes_one_models_results_into_out(tmp_path):
    """A lease command runs at most 10 minutes: the script's phases run as separate calls, each naming its model.
    Run as on a lent machine, from the checkout with servesim not installed."""
    bad = _lease(tmp_path, "--dry-run", "mistral")
    assert bad.returncode == 2 and "llama|gemma" in bad.stderr
    done = _lease(tmp_path, "--dry-run", "llama", **_uninstalled(tmp_path.parent / f"{tmp_path.name}-site"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "lease done (llama)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "environment.txt",
        "gpu_tests.txt",
        "llama-3.1-8b.calibrate.txt",
        "llama-3.1-8b.validate.txt",
    ]
    _assert_lease_results(tmp_path, "llama-3.1-8b")
    environment = (tmp_path / "environment.txt").read_text()
    assert (
        "servesim 0+checkout" in environment and environment.count("step ") == 3
    )  # gpu tests, calibrate, validate


def test_gpu_lease_script_dry_run_packs_every_result_into_one_archive(tmp_path):
    """With --pack (a lent machine sends back at most 8 files) a call leaves one archive holding every result."""
    done = _lease(tmp_path, "--dry-run", "--pack", "gemma")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "lease done (gemma)" in done.stdout
    archive = tmp_path / "lease-gemma.tar.gz"
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]
    packed = tmp_path / "packed"
    with tarfile.open(archive) as tar:
        tar.extractall(packed, filter="data")
    _assert_lease_results(packed, "gemma-3n-e2b")
    gemma = pd.read_csv(packed / "gemma-3n-e2b" / "grid.csv")
    assert set(gemma["fast_prefill"]) == {True, False}  # YOCO on and off were both timed
    assert yaml.safe_load((packed / "gemma-3n-e2b" / "profile.yaml").read_text())["fit_mape"] is not None


def test_gpu_lease_script_archives_what_finished_when_a_step_fails(tmp_path):
    """A failing step keeps its exit status, and --pack still sends back what ran (here: the environment)."""
    failed = _lease(tmp_path, "--pack", "llama", GPU="no-such-gpu")
    assert failed.returncode != 0 and "lease done" not in failed.stdout
    with tarfile.open(tmp_path / "lease-llama.tar.gz") as tar:
        names = tar.getnames()
    assert "./environment.txt" in names


def test_a_killed_runs_work_folder_is_removed_by_the_next_run(tmp_path):
    """A run killed outright never reaches its `finally`; the next run into the folder removes that run's work
    folder when its process is gone, and leaves a live run's and another host's alone."""
    import os
    import socket
    import subprocess
    import sys

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = socket.gethostname()
    dead = gone.stdout.strip()
    # host "gpu-12" seen from host "gpu"
    names = {
        "killed": f"{IN_PROGRESS}-{host}-{dead}-abcd_123",
        "live": f"{IN_PROGRESS}-{host}-{os.getpid()}-x1234567",
        "elsewhere": f"{IN_PROGRESS}-not-{host}-{dead}-y1234567",
        "longer host": f"{IN_PROGRESS}-{host}-12-{dead}-z1234567",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "device.yaml").write_text("half written")
    pipeline.remove_abandoned_work(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for k, n in names.items() if k != "killed")
