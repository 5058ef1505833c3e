"""Progress off a terminal: lines on stderr, one per coarse unit or per tenth of a long run; none when asked."""

from __future__ import annotations

import io

from rich.console import Console

from servesim.simulator.progress import progress_bar

PIPE = Console(file=io.StringIO())  # not a terminal, as in CI logs and pipes


def test_coarse_units_print_a_line_each_and_fine_ones_a_line_per_tenth(capsys):
    with progress_bar("sweep points", PIPE, every=1) as advance:
        advance.total(3)
        for done in (1, 2, 3):
            advance(done)
    assert capsys.readouterr().err.splitlines() == [
        "sweep points 1/3",
        "sweep points 2/3",
        "sweep points 3/3",
    ]
    with progress_bar("simulating", PIPE) as advance:
        advance.total(1000)
        for done in range(1, 1001):
            advance(done)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"simulating {n}/1000" for n in range(100, 1001, 100)]


def test_without_lines_nothing_is_printed_and_a_terminal_gets_no_lines(capsys):
    with progress_bar("simulating", PIPE, lines=False) as advance:
        advance.total(10)
        advance(10)
    terminal = Console(file=io.StringIO(), force_terminal=True)
    with progress_bar("simulating", terminal, every=1) as advance:
        advance.total(2)
        advance(1)
        advance(2)
    assert capsys.readouterr().err == ""
