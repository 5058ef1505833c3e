"""The installed distribution holds one top-level package, `servesim`; the source folders are its subpackages."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hardware", "workloads", "policies", "simulator", "calibration")


def test_every_package_folder_is_listed_for_installation():
    """A subpackage missing from pyproject's list would be left out of a wheel (editable installs hide that)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {"servesim"} | {
        "servesim." + ".".join(init.parent.relative_to(ROOT).parts)
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == on_disk
    assert setuptools["package-dir"] == {f"servesim.{folder}": folder for folder in FOLDERS}


def test_only_servesim_is_importable_outside_the_checkout(tmp_path):
    """From another folder, servesim's internals import under its name and the bare folder names do not exist,
    so another distribution's `hardware` or `simulator` package cannot clash with them."""
    probe = (
        "import importlib.util, servesim, servesim.hardware.model, servesim.simulator.world.run\n"
        f"print([importlib.util.find_spec(name) for name in {FOLDERS!r}], servesim.__version__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out.strip() == f"[None, None, None, None, None] {version}"


def test_importing_an_internal_module_does_not_load_the_simulator(tmp_path):
    """The API's names load on first use: a worker that needs the cost model does not import plotly or pandas."""
    probe = (
        "import sys, servesim.hardware.cost\n"
        "print(sorted(m for m in ('plotly', 'servesim.simulator.world.run', 'typer') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
