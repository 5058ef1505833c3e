"""A progress bar for long runs on a terminal; silent when output is not a TTY (CI logs, pipes)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class _Advance:
    """Callable handed to the simulation: `advance(n_done)`; `total(n)` sets the goal."""

    def __init__(self, progress: Progress | None, every: int = 64):
        self.progress, self.task, self.every = progress, None, every

    def total(self, n: int) -> None:
        if self.progress is not None:
            self.task = self.progress.add_task("requests", total=n)

    def __call__(self, done: int) -> None:
        if self.progress is not None and self.task is not None and done % self.every == 0:
            self.progress.update(self.task, completed=done)


@contextmanager
def progress_bar(label: str, console: Console, every: int = 64) -> Iterator[_Advance]:
    """Redraw every `every` completions (64 for requests; 1 for coarse units such as sweep points)."""
    if not console.is_terminal:
        yield _Advance(None)
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        yield _Advance(progress, every)
