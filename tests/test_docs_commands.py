"""The commands README.md and docs/ show are commands servesim has: every `servesim ...` they name is a command
with the options it names, and each one written out in full runs, made small where it would take minutes (fewer
requests, one measured run, two fit steps)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from servesim.simulator.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CLI = typer.main.get_command(app)
# a name for the user's own file or value (SCENARIO.yaml, M, RUN), a synopsis ([--x], a|b, ...) or an ellipsis:
# a command shown as a pattern, not one to run as written
PATTERN = re.compile(r"\[|\]|\.\.\.|\\\||(?<![\w.-])[A-Z][A-Z_]*(?:\.\w+)?(?![\w.-])")
SMALL = ["--set", "workload.num_requests=40"]
# long commands, run small: appended options that keep what the shown command exercises
MADE_SMALL = {
    "simulate": SMALL,
    "sweep": SMALL,
    "capacity": SMALL,
    "plan": [*SMALL, "--workers", "1"],
    "compare": ["--match", "qwen3-8b h100-sxm serve 1024/128 c=1 x50"],
    "compare silybench_sweep_runs": ["--match", "qwen3-8b h100-sxm fp8 serve 128/128 c=4 x50"],
    "compare trtllm_runs": ["--match", "llama-3.1-8b h100-sxm TP1 fp8 trtllm-bench throughput 2048/128"],
    "compare trtllm_moe_runs": [
        "--match",
        "Qwen3-30B-A3B b200 TP1 EP1 nvfp4 trtllm-bench throughput 20000/2000",
    ],
    "compare inferencemax_runs": ["--match", "llama-3.1-70b h200 TP8 fp8 serve 819-1024/819-1024 c=4 x40"],
    "compare inferencemax_moe_runs": ["--match", "gpt-oss-120b h200 TP8 serve 819-1024/819-1024 c=4 x40"],
    "compare sglang_runs": ["--match", "deepseek-v3 h200 TP8 sglang fp8 serve 1000/2000 10 req/s x50"],
    # two of the five runs, one search step
    "fit inferencemax_dsr1_runs": [
        "--match",
        "h200 TP8 sglang fp8 serve 819-1024/819-1024 c=(4|8) ",
        "--max-evaluations",
        "1",
        "--workers",
        "1",
    ],
    "compare inferencemax_dsr1_trtllm_runs": [
        "--match",
        "deepseek-v3 h200 TP8 EP trtllm fp8 serve 819-1024/819-1024 c=4 x40",
    ],
    "fit inferencemax_dsr1_amd_runs": [
        "--match",
        "mi300x TP8 sglang fp8 serve 819-1024/819-1024 c=(4|8) ",
        "--max-evaluations",
        "1",
        "--workers",
        "1",
    ],
    "compare inferencemax_trtllm_runs": [
        "--match",
        "llama-3.1-70b h200 TP8 trtllm fp8 serve 819-1024/819-1024 c=4 x40",
    ],
    # two of the fifteen TP 8 runs, one search step
    "fit inferencemax_trtllm_runs": [
        "--match",
        "h200 TP8 trtllm fp8 serve 819-1024/819-1024 c=(4|8) ",
        "--max-evaluations",
        "1",
        "--workers",
        "1",
    ],
    "compare inferencemax_dsr1_amd_runs": [
        "--match",
        "deepseek-v3 mi325x TP8 sglang fp8 serve 819-1024/819-1024 c=4 x40",
    ],
    "compare inferencemax_amd_runs": [
        "--match",
        "llama-3.1-70b mi325x TP8 fp8 serve 819-1024/819-1024 c=4 x40",
    ],
    # two of the twelve runs, one search step
    "fit inferencemax_amd_runs": [
        "--match",
        "mi300x TP8 fp8 serve 819-1024/819-1024 c=(4|16) ",
        "--max-evaluations",
        "1",
        "--workers",
        "1",
    ],
    "compare inferencemax_dsr1_runs": [
        "--match",
        "deepseek-v3 h200 TP8 sglang fp8 serve 819-1024/819-1024 c=4 x40",
    ],
    # three MoE runs of short answers (--only moe_* needs routed experts), two replays, no hold-out
    "fit": [
        "--match",
        "128/4 all at once x1000",
        "--max-evaluations",
        "2",
        "--holdout-every",
        "0",
        "--workers",
        "1",
    ],
}
# ~1 minute of torch timing even made small: run end to end by their own tests
RUN_ELSEWHERE = {"calibrate": "tests/calibration/test_cli_calibrate.py"}


def shown() -> list[tuple[str, str]]:
    """(page, command) for every `servesim ...` in an inline code span or a line of a code block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        spans = re.findall(r"`(servesim [^`]+)`", text)
        lines = [
            line.strip()
            for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
            for line in block.splitlines()
            if line.strip().startswith("servesim ")
        ]
        found += [(page.name, " ".join(command.split())) for command in spans + lines]
    return found


def resolve(words: list[str]) -> tuple:
    """The command `words` names (descending through groups) and the words after it."""
    command, rest = CLI, words[1:]
    while (
        hasattr(command, "commands") and rest and rest[0] in command.commands
    ):  # typer may carry its own click
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def unknown_options(command, words: list[str]) -> list[str]:
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    if command is CLI:
        known |= {"--version"}
    flags = [w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--")]
    return [flag for flag in flags if flag not in known]


COMMANDS = shown()


def test_the_pages_show_commands():
    assert len(COMMANDS) > 50 and {page for page, _ in COMMANDS} >= {
        "README.md",
        "commands.md",
        "planning.md",
    }


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_each_shown_command_exists_with_the_options_it_names(page, command):
    words = command.replace("\\|", "|").split()
    cli_command, rest = resolve(words)
    named = [w for w in rest if re.fullmatch(r"[a-z][a-z-]+", w) and hasattr(cli_command, "commands")]
    assert not named, f"{page}: `{command}`: no command {named[0]!r}"
    assert not unknown_options(cli_command, rest), (
        f"{page}: `{command}`: unknown {unknown_options(cli_command, rest)}"
    )


def runnable(command: str) -> bool:
    """Written out in full: no pattern, its arguments all given, the files it names in the repository (a run
    folder is made by the test)."""
    if command == "servesim --version":
        return True
    words = shlex.split(command)
    cli_command, rest = resolve(words)
    if PATTERN.search(command) or cli_command is CLI:
        return False
    try:
        cli_command.make_context(cli_command.name, list(rest))
    except Exception:  # noqa: BLE001 (click's usage errors: a required argument missing)
        return False
    paths = [w for w in rest if not w.startswith("-") and (w.endswith((".yaml", ".json")) or "/" in w)]
    return all((ROOT / w).exists() or w.startswith("runs/") for w in paths)


RUNNABLE = sorted({command for _, command in COMMANDS if runnable(command)})


@pytest.mark.parametrize("command", RUNNABLE)
def test_each_complete_command_runs(command, tmp_path, monkeypatch):
    """Relative paths are the repository's; outputs go to a scratch folder (`runs/...` there)."""
    words = shlex.split(command)
    name = resolve(words)[0].name
    if name in RUN_ELSEWHERE:
        pytest.skip(f"run end to end by {RUN_ELSEWHERE[name]}; its options are checked above")
    monkeypatch.chdir(tmp_path)
    for folder in ("scenarios", "benchmarks"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    if name == "report":  # the run it reports on, as the tour makes it
        assert CliRunner().invoke(app, ["simulate", "scenarios/quickstart.yaml", *SMALL]).exit_code == 0
        sweep = ["sweep", "scenarios/quickstart.yaml", "--grid", "seed=1,2", *SMALL]
        assert CliRunner().invoke(app, sweep).exit_code == 0
    runs_file = next((w for w in words if w.endswith("_runs.yaml")), "")
    small = MADE_SMALL.get(f"{name} {Path(runs_file).stem}", MADE_SMALL.get(name, []))  # a run the file holds
    result = CliRunner().invoke(app, [*words[1:], *small])
    assert result.exit_code == 0, f"`{command}`: {result.output[-800:]}"
