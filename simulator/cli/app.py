"""The `servesim` application object and what every command module shares: the console, one-line errors, tables.

Command modules (simulator/cli/main.py and its cli_* siblings) register on `app`; only simulator/cli/main.py imports them,
so none imports another.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from servesim import __version__

from servesim.hardware.errors import SpecError

app = typer.Typer(
    help="Simulate and plan LLM serving deployments.", no_args_is_help=True, pretty_exceptions_enable=False
)
hardware_app = typer.Typer(help="The GPU catalog.", no_args_is_help=True)
models_app = typer.Typer(help="The model presets.", no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
console = Console()
if not console.is_terminal:  # piped or captured: never truncate names to fit 80 columns
    console = Console(width=200)


def _print_version(asked: bool) -> None:
    if asked:
        print(f"servesim {__version__}")
        raise typer.Exit()


@app.callback()
def _output_any_terminal_can_show(
    _version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print servesim's version and exit."
    ),
) -> None:
    # Paths and names come from users: a character the terminal's encoding lacks is escaped, not a crash.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


GpuFiles = typer.Option([], "--gpu-file", help="Extra GPU catalog YAML (a `gpus:` list); repeatable.")


def clean_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a SpecError into one clear line on stderr and exit status 2, instead of a traceback."""

    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except SpecError as err:
            print(f"error: {short_values(str(err))}", file=sys.stderr)
            raise typer.Exit(2) from None

    return run


LONG_QUOTE = re.compile(r"""(?<![^\s(=:\[,])(['"])([^'"\n]{60,})\1(?![^\s),;:\]])""")  # a quoted value, whole
LONG_WORD = re.compile(r"[^\s'\"]{121,}")  # a path, mostly


def short_values(message: str) -> str:
    """`message` with each quoted value of 60 or more characters cut to its first 20, and any other word (a path)
    past 120 to its ends: errors echo what the user gave, and a 3,000-character name would make such a line."""
    message = LONG_QUOTE.sub(lambda m: f"{m[1]}{m[2][:20]}...{m[1]} ({len(m[2]):,} characters)", message)
    return LONG_WORD.sub(lambda m: f"{m[0][:40]}...{m[0][-40:]}", message)


def print_json(data: Any) -> None:
    from servesim.simulator.world.output import json_text

    sys.stdout.write(json_text(data, indent=2))


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console.print(table)
