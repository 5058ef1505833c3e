"""Run one fuzz case through `servesim simulate` in a forked child (time and memory bounded) and judge it: a clean
one-line refusal that wrote nothing, or a run whose outputs keep the invariants. Anything else is a finding."""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tests.fuzz.bases import SCENARIO_FILE

MAX_LINE_CHARS = 200
MEMORY_LIMIT_BYTES = 6 << 30
OUT = "out"

OK_VERDICTS = ("refused", "ran")


@dataclass
class Verdict:
    kind: str  # refused, ran, crash, hang, long_message, wrote_output, misled
    detail: str
    seconds: float


def start(folder: Path, argv: list[str] | None = None) -> int:
    """Fork a child that runs servesim in `folder` (stdout and stderr to files there); returns its pid."""
    argv = argv or ["simulate", SCENARIO_FILE, "--out", OUT]
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns
        os.chdir(folder)
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
        for fd, name in ((1, "stdout"), (2, "stderr")):
            target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
        # new streams on the files: pytest's capture had replaced the Python-level ones
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (lives until _exit)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.argv = ["servesim", *argv]
        from servesim.simulator.cli.main import main

        code = 0
        try:
            main()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 (whatever escapes servesim is the finding)
        import traceback

        traceback.print_exc()
        code = 99
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait(pid: int, timeout_s: float) -> tuple[int | None, float]:
    """The child's exit status (None when it ran past `timeout_s` and was killed; -N for signal N) and its time."""
    began = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        elapsed = time.monotonic() - began
        if done:
            return (os.waitstatus_to_exitcode(status), elapsed)
        if elapsed > timeout_s:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, elapsed
        time.sleep(0.01)


def judge(
    folder: Path,
    code: int | None,
    seconds: float,
    non_finite: bool = False,
    trace_non_finite: bool = False,
    writes_run: bool = True,
) -> Verdict:
    """What the run did, by its exit status, its stderr and (`writes_run`: a simulate) its output folder."""
    err = (folder / "stderr").read_text(errors="replace") if (folder / "stderr").exists() else ""
    if code is None:
        return Verdict("hang", f"still running after {seconds:.0f} s", seconds)
    if "Traceback" in err or code not in (0, 2):
        return Verdict("crash", f"exit {code}: {_last_line(err)}", seconds)
    if code == 2:
        lines = err.strip().splitlines()
        if (folder / OUT).exists():
            return Verdict("wrote_output", f"refused but made {OUT}/: {_last_line(err)}", seconds)
        if len(lines) > 2 or not lines or any(len(line) > MAX_LINE_CHARS for line in lines):
            return Verdict(
                "long_message",
                f"{len(lines)} lines, {max(map(len, lines), default=0)} chars: {err.strip()[:300]!r}",
                seconds,
            )
        return Verdict("refused", lines[0], seconds)
    broken = output_problems(folder / OUT) if writes_run else ""
    if broken:
        return Verdict("misled", broken, seconds)
    if non_finite:
        return Verdict("misled", "ran with a non-finite number in its input", seconds)
    if trace_non_finite and "dropped" not in err:
        return Verdict("misled", "ran with a non-finite number in a trace, no row dropped", seconds)
    return Verdict("ran", "", seconds)


def output_problems(out: Path) -> str:
    """The first broken invariant of a finished run's outputs, or ''."""
    try:
        json.loads((out / "summary.json").read_text(), parse_constant=_refuse_constant)
    except (OSError, ValueError) as err:
        return f"summary.json: {err}"
    requests = _table(out, "requests")
    if requests is None:
        return "no requests table"
    rejected = requests["reject_reason"].notna() & (requests["reject_reason"].astype(str) != "")
    finished = requests["finish_s"].notna()
    if (rejected & finished).any():
        return "a request both rejected and finished"
    if (requests["output_tokens"] > requests["requested_output_tokens"]).any():
        return "a request emitted more tokens than it asked for"
    done = requests[finished]
    if (done["ttft_s"] > done["e2el_s"] + 1e-9).any():
        return "TTFT above E2E latency"
    if (done[["ttft_s", "e2el_s"]] < 0).any().any() or not done[["ttft_s", "e2el_s"]].map(
        math.isfinite
    ).all().all():
        return "a negative or non-finite latency"
    steps = _table(out, "steps")
    if steps is not None and "kv_usage" in steps and len(steps):
        usage = steps["kv_usage"].dropna()
        if ((usage < 0) | (usage > 1 + 1e-9)).any():
            return f"KV usage {usage.min():.3g}..{usage.max():.3g}, outside [0, 1]"
    return ""


def _table(out: Path, name: str) -> pd.DataFrame | None:
    if (out / f"{name}.parquet").exists():
        return pd.read_parquet(out / f"{name}.parquet")
    if (out / f"{name}.csv").exists():
        return pd.read_csv(out / f"{name}.csv")
    return None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"holds {name}")


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "(no output)"
