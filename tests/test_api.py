"""The Python API: its names resolve, and its docstring's example runs as shown."""

import doctest
import os
from pathlib import Path

import servesim

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_examples_run_as_written(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example names scenarios/quickstart.yaml from the checkout
    failures, tried = doctest.testmod(servesim, verbose=False)
    assert tried >= 4 and failures == 0


def test_every_exported_name_exists_and_the_version_is_the_distributions():
    assert all(hasattr(servesim, name) for name in servesim.__all__)
    assert servesim.__version__ == os.popen("servesim --version").read().split()[-1]
