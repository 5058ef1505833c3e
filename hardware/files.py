"""Reading the project's input files (YAML, JSON) with one kind of error: it names the file and says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hardware.errors import SpecError


def read_yaml(path: Path, what: str = "file") -> Any:
    """yaml.safe_load of `path` (never the unsafe loader: these files come from users)."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: {what} not found") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None


def read_json(path: Path, what: str = "file") -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: {what} not found") from None
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}: not valid JSON: {err}") from None
