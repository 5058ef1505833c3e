"""Atomic file and folder writes: readers see the old content or the new, never half of it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from servesim.hardware.errors import SpecError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _collapsed(path: Path) -> Path:
    """`path` with its folder resolved: `a/b/../../x` must not make `a/b` on the way to `x`. Parts that exist keep
    the OS's meaning (symlinks followed); the rest cannot be links, so collapsing them is what the OS would do."""
    path = Path(path)
    return path.resolve() if path.name in ("", ".", "..") else path.parent.resolve() / path.name


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file beside `path`, fsync it, then rename it over `path`."""
    path = _collapsed(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise SpecError(f"{path}: cannot write there ({err.strerror})") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MARKER = ".servesim"  # in every folder atomic_dir writes: only such a folder (or an empty one) is replaced
# what run and fit folders held before the marker existed: a folder of only these, with a table only servesim
# writes among them (a scenario or a profile alone may well be the user's own), is an earlier output too
EARLIER_OUTPUTS = frozenset(
    {
        "requests.csv",
        "steps.csv",
        "requests.parquet",
        "steps.parquet",
        "summary.json",
        "memory.json",
        "scenario.yaml",
        "profile.yaml",
        "figures.csv",
    }
)
OUTPUT_TABLES = frozenset({"summary.json", "figures.csv"})


def _check_folder_of_its_own(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise SpecError(f"{path}: is a file; the output is a folder (give a new or empty folder's path)")
    here, target = Path.cwd().resolve(), path.resolve()
    if target == here or target in here.parents:
        raise SpecError(f"{path}: is the current folder or one above it; give the output a folder of its own")


def _check_can_write_in(folder: Path, label: str) -> None:
    """Refuse, before any work, an output whose folder (or the nearest one above it that exists) is a file or
    cannot be written: found only after the work, its results would be lost."""
    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise SpecError(f"{label}: {existing} is a file, not a folder")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as err:
        raise SpecError(f"{label}: cannot write in {existing} ({err.strerror})") from None


def check_replaceable(path: Path) -> None:
    """Refuse, before any work, an output folder whose replacement would delete what servesim did not write: a
    file, the current folder or one above it, or a folder holding anything but an earlier servesim output; or one
    that cannot be written."""
    path = Path(path)
    _check_folder_of_its_own(path)
    _check_can_write_in(path.parent, str(path))
    if path.is_dir() and not (path / MARKER).exists():
        names = {p.name for p in path.iterdir()}
        foreign = sorted(names - EARLIER_OUTPUTS) if names & OUTPUT_TABLES else sorted(names)
        if foreign:
            raise SpecError(
                f"{path}: holds files servesim did not write ({', '.join(foreign[:3])}), which replacing "
                "it would delete; give a new or empty folder"
            )


def check_output_file(path: Path, option: str) -> None:
    """Refuse, before any work, an output file path (`--html`, `--out`) that names a folder, sits in a file or
    cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{option} {path}: is a folder; give a file name (e.g. {path / 'report.html'})")
    _check_can_write_in(path.parent, f"{option} {path}")


def check_output_folder(path: Path, own: frozenset[str]) -> None:
    """Refuse, before any work, an output folder servesim adds files to (a sweep's, a plan's) that is a file, the
    current folder or one above it, holds anything but the names in `own`, or cannot be written."""
    path = Path(path)
    _check_folder_of_its_own(path)
    _check_can_write_in(path, str(path))
    foreign = (
        sorted(p.name for p in path.iterdir() if p.name not in own and not _temporary(p.name))
        if path.is_dir()
        else []
    )
    if foreign:
        raise SpecError(
            f"{path}: holds files servesim did not write ({', '.join(foreign[:3])}); give a new or "
            "empty folder"
        )


def _temporary(name: str) -> bool:
    """A temp file or folder of an interrupted atomic write (`.NAME.*.tmp`)."""
    return name.startswith(".") and name.endswith(".tmp")


def remove_abandoned_writes(folder: Path, older_than_s: float = 600.0) -> None:
    """Remove from `folder` the temp files and folders of atomic writes whose process died mid-write (a killed
    sweep worker's); a write lasts seconds, so one older than `older_than_s` is nobody's."""
    if not folder.is_dir():
        return
    cutoff = time.time() - older_than_s
    for entry in folder.iterdir():
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove: left as it is
            if _temporary(entry.name) and entry.lstat().st_mtime < cutoff:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temp folder beside `path`; on success it replaces `path`, on error it is removed. `path` must be
    absent, empty or an earlier output (`check_replaceable`); a link to one is written where it points."""
    path = _collapsed(path)
    if path.is_symlink():
        path = path.resolve()
    check_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    except OSError as err:
        raise SpecError(f"{path}: cannot write there ({err.strerror})") from None
    try:
        yield tmp
        (tmp / MARKER).write_text(
            "written by servesim: the whole folder is replaced when its run is written again\n"
        )
        os.chmod(tmp, 0o777 & ~_umask())
        _sync_tree(tmp)  # on disk before the rename makes it the output: a crash leaves no empty files
        _swap_in(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then the folders themselves (where the file system can: some refuse a
    folder's fsync, as PostgreSQL's durable_rename allows)."""
    for entry in sorted(folder.rglob("*"), reverse=True):  # files before the folders holding them
        if entry.is_dir():
            _fsync_folder(entry)
        else:
            _fsync(entry)
    _fsync_folder(folder)


def _fsync_folder(path: Path) -> None:
    with contextlib.suppress(OSError):
        _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_in(tmp: Path, path: Path) -> None:
    """Rename `tmp` to `path`; an earlier `path` is moved aside first and deleted only once `tmp` is in its place
    (a folder cannot be renamed over a full one). Ctrl-C and SIGTERM wait until it is done: between the renames
    neither folder is where it belongs."""
    with _interrupts_held():
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old.tmp"))
            try:
                os.replace(path, old)  # onto the empty folder just made
            except BaseException:
                old.rmdir()
                raise
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:
                os.replace(old, path)
            raise
        _fsync_folder(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block is done, then raised as they would have been. Their handlers
    run in the main thread only (whichever thread the OS hands a signal to), so elsewhere nothing needs holding."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])
