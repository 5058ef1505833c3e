"""Reading the project's input files (YAML, JSON) with one kind of error: it names the file and says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from servesim.hardware.errors import SpecError


#: Bounds on a document, so that no input file can exhaust the stack, the memory or the time of a run: nesting
#: depth, aliases used, and nodes once every alias is expanded (a "billion laughs" expands exponentially).
MAX_DEPTH = 64
MAX_ALIASES = 200
MAX_EXPANDED_NODES = 1_000_000


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping (plain YAML keeps the last one in silence), keys
    that are not text (`1:` or `on:` would reach no field), and documents past the bounds above."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = self._aliases = 0

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(None, None, f"more than {MAX_ALIASES} aliases", mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            # `<<: *base` brings keys that the mapping may override
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (
                self.construct_object(key_node, deep=deep) if isinstance(key_node, yaml.ScalarNode) else None
            )
            if not isinstance(key, str):
                shown = (
                    repr(key)
                    if key is not None
                    else (
                        "a list"
                        if isinstance(key_node, yaml.SequenceNode)
                        else "a mapping"
                        if isinstance(key_node, yaml.MappingNode)
                        else "null"
                    )
                )
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown} is not text (quote it if it is a name)", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose aliases expand past MAX_EXPANDED_NODES, or that contains itself. Sizes are
    memoized per node, so the check costs the composed nodes, not their expansion."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        children = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if children_done:
            open_nodes.discard(id(node))
            size[id(node)] = 1 + sum(size[id(child)] for child in children)
            if size[id(node)] > MAX_EXPANDED_NODES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"expands to more than {MAX_EXPANDED_NODES:,} values through its aliases",
                    node.start_mark,
                )
            continue
        if id(node) in open_nodes:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to a node that contains it", node.start_mark
            )
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in size)


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
    except ValueError:  # the only one open() raises: a NUL character, which no path may hold
        raise SpecError(f"{str(path)!r}: a {what} path cannot hold a NUL character") from None


def read_yaml(path: Path, what: str = "file") -> Any:
    """The safe loader's reading of `path` (never the unsafe one: these files come from users), bounded as
    `_BoundedLoader` says; an error is one line with the line and column."""
    return parse_yaml(read_text(path, what), path)


def parse_yaml(text: str, path: Path) -> Any:
    """`read_yaml` of `path`'s `text`, read already."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError(f"{path}: not valid YAML: {where}{err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None


def read_json(path: Path, what: str = "file", finite: bool = False) -> Any:
    """`path`'s JSON. `finite`: NaN and Infinity, which Python's json reads though JSON has no such values, are
    refused (a model config; a benchmark's result file may hold a NaN statistic that servesim does not read)."""
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_no_constant if finite else None)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}: not valid JSON: {err}") from None
    except ValueError as err:
        raise SpecError(f"{path}: {err}") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is no JSON number; give a finite one")
