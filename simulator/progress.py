"""A progress bar for long runs on a terminal; off one (CI logs, pipes), a few plain lines on stderr or none."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class _Advance:
    """Callable handed to the work: `advance(n_done)`; `total(n)` sets the goal. On a terminal it moves a bar;
    elsewhere, with `lines`, it prints `label done/total` on stderr per unit (every=1) or per tenth of the total."""

    def __init__(self, progress: Progress | None, every: int = 64, lines: tuple[Console, str] | None = None):
        self.progress, self.task, self.every, self.lines = progress, None, every, lines
        self.goal, self.shown = None, 0

    def total(self, n: int) -> None:
        self.goal = n
        if self.progress is not None:
            self.task = self.progress.add_task("requests", total=n)

    def __call__(self, done: int) -> None:
        if self.progress is not None and self.task is not None and done % self.every == 0:
            self.progress.update(self.task, completed=done)
        elif self.lines is not None and self._line_due(done):
            console, label = self.lines
            self.shown = done
            console.print(f"{label} {done}/{self.goal}" if self.goal else f"{label} {done}", markup=False)

    def _line_due(self, done: int) -> bool:
        if self.every == 1:
            return done > self.shown
        return bool(self.goal) and done * 10 // self.goal > self.shown * 10 // self.goal


@contextmanager
def progress_bar(label: str, console: Console, every: int = 64, lines: bool = True) -> Iterator[_Advance]:
    """Redraw every `every` completions (64 for requests; 1 for coarse units such as sweep points), with the count,
    elapsed time and ETA; off a terminal, lines on stderr instead (none with `lines=False`)."""
    if not console.is_terminal:
        yield _Advance(None, every, (Console(stderr=True, soft_wrap=True), label) if lines else None)
        return
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        yield _Advance(progress, every)


@contextmanager
def plan_progress(console: Console) -> Iterator[Callable[[str, int, int | None, str], None]]:
    """The planner's `on_progress`: on a terminal, a bar of candidates sized (done / total, elapsed, ETA) whose label
    then follows the verifications; elsewhere one line per verdict on stderr, so a piped plan shows it is alive."""
    if not console.is_terminal:
        err = Console(stderr=True, soft_wrap=True)

        def line(stage: str, done: int, total: int | None, text: str) -> None:
            err.print(
                f"{stage} {done}/{total}: {text}" if total else f"{stage} {done}: {text}",
                markup=False,
                highlight=False,
            )

        yield line
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = None

        def update(stage: str, done: int, total: int | None, text: str) -> None:
            nonlocal task
            if task is None:
                task = bar.add_task("sizing candidates", total=total)
            if stage == "sized":
                bar.update(task, completed=done, description=f"sizing candidates ({text})"[:100])
            else:
                bar.update(task, description=f"verifying deployment {done}: {text}"[:100])

        yield update
