"""Reading the project's input files (YAML, JSON) with one kind of error: it names the file and says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hardware.errors import SpecError


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping (plain YAML keeps the last one in silence)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` brings keys that the mapping may override
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                given = key in seen
            except TypeError:  # unhashable: the base constructor says so, with its place
                break
            if given:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_text(path: Path, what: str = "file") -> str:
    """`path`'s text (UTF-8), or one line saying why it cannot be read: missing, a folder, unreadable, not text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a folder; give the {what} itself") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: {what} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise SpecError(f"{path}: cannot read the {what} ({err.strerror})") from None


def read_yaml(path: Path, what: str = "file") -> Any:
    """The safe loader's reading of `path` (never the unsafe one: these files come from users), with a key given
    twice refused; an error is one line with the line and column."""
    text = read_text(path, what)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(f"{path}: not valid YAML: {where}{err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None


def read_json(path: Path, what: str = "file") -> Any:
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}: not valid JSON: {err}") from None
