"""A servesim bug reported as one line: what was raised, where in servesim, and the file that keeps its traceback,
so a crash is told apart from bad input and can be reported without rerunning."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

from servesim.simulator.atomic import write_text_atomic

INTERNAL_ERROR = "internal error"
ROOT = Path(__file__).resolve().parent.parent  # the folder holding servesim's packages


def report_bug(err: BaseException, trace_file: Path | None = None) -> str:
    """Write `err`'s traceback to `trace_file` (default: a new file in the temporary folder) and return one line
    naming the exception, the innermost servesim frame and that file."""
    if trace_file is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        trace_file = Path(tempfile.gettempdir()) / f"servesim-{stamp}-{os.getpid()}.traceback.txt"
    write_text_atomic(trace_file, "".join(traceback.format_exception(err)))
    frames = traceback.extract_tb(err.__traceback__)
    frame = ([f for f in frames if Path(f.filename).resolve().is_relative_to(ROOT)] or frames or [None])[-1]
    where = f" at {Path(frame.filename).name}:{frame.lineno} in {frame.name}" if frame else ""
    what = str(err).splitlines()[0][:120] if str(err) else ""
    return (
        f"{INTERNAL_ERROR} (a servesim bug; traceback in {trace_file}): {type(err).__name__}: {what}{where}"
    )
