"""Keep a campaign's finding as a regression test: `python -m tests.fuzz.keep CASE_FOLDER NAME [ran|refused]` copies
the case (its scenario and files, not what the run wrote) to tests/fuzz/found/NAME, expecting the outcome given
(default: refused) once fixed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

FOUND = Path(__file__).parent / "found"
RUN_FILES = ("stdout", "stderr", "out")


def keep(case_folder: Path, name: str, expect: str = "refused") -> Path:
    target = FOUND / name
    shutil.copytree(case_folder, target, ignore=shutil.ignore_patterns(*RUN_FILES))
    meta = json.loads((target / "case.json").read_text())
    meta["found"] = f"{meta.pop('verdict')}: {meta.pop('detail')[:300]}"
    meta["expect"] = expect
    (target / "case.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    return target


if __name__ == "__main__":
    print(keep(Path(sys.argv[1]), sys.argv[2], *sys.argv[3:4]))
