"""atomic_dir: a folder is replaced whole, and an interrupt at any point leaves the old one or the new one."""

from __future__ import annotations

import os
import signal

import pytest

import servesim.simulator.atomic as atomic
from servesim.simulator.atomic import MARKER, atomic_dir


def _write(path, text):
    with atomic_dir(path) as tmp:
        (tmp / "summary.json").write_text(text)


def test_a_rewrite_replaces_the_folder_and_leaves_nothing_beside_it(tmp_path):
    _write(tmp_path / "run", "old")
    _write(tmp_path / "run", "new")
    assert (tmp_path / "run" / "summary.json").read_text() == "new" and (tmp_path / "run" / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_interrupt_while_the_new_folder_moves_in_keeps_the_old(tmp_path, monkeypatch):
    _write(tmp_path / "run", "old")
    real_replace = atomic.os.replace

    def interrupted(src, dst):
        if str(src).endswith(".tmp") and not str(src).endswith(".old.tmp"):  # the new folder moving in
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path / "run", "new")
    assert (tmp_path / "run" / "summary.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_link_to_an_earlier_output_is_rewritten_where_it_points(tmp_path):
    _write(tmp_path / "run", "old")
    (tmp_path / "latest").symlink_to(tmp_path / "run")
    _write(tmp_path / "latest", "new")
    assert (tmp_path / "latest").is_symlink() and (tmp_path / "run" / "summary.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "run"]


class _Stopped(Exception):
    pass


def test_a_signal_while_the_folders_change_places_waits_until_they_have(tmp_path, monkeypatch):
    """SIGTERM arriving as the earlier folder is moved aside: handled once the new folder is in place, not between
    the renames (where its unwinding left neither folder as the output)."""
    _write(tmp_path / "run", "old")
    real_replace = atomic.os.replace

    def signalled(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(".old.tmp"):
            os.kill(os.getpid(), signal.SIGTERM)

    def stop(signum, frame):
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, stop)
    monkeypatch.setattr(atomic.os, "replace", signalled)
    try:
        with pytest.raises(_Stopped):
            _write(tmp_path / "run", "new")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "run" / "summary.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
