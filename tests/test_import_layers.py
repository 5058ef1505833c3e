"""The packages stack in layers (DESIGN.md's layout) and no module imports another that imports it back.

Imports at module level only: an import inside a function runs when called (the CLI's calibrate command reaches
into `calibration` that way), so it cannot make a cycle at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: each package and what it may import at module level
LAYERS = {
    "hardware": set(),
    "workloads": {"hardware"},
    "policies": {"hardware", "workloads"},
    "simulator": {"hardware", "workloads", "policies"},
    "calibration": {"hardware", "workloads", "policies", "simulator"},
}


def module_imports() -> dict[str, set[str]]:
    """Module name -> the project modules it imports at module level."""
    files = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            files[name] = path
    graph = {}
    for name, path in files.items():
        imported = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = {m for m in imported if m in files and m != name}
    return graph


def cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from `start` back to itself, if there is one (depth first)."""
    path, seen = [start], set()

    def walk(node: str) -> bool:
        for nxt in sorted(graph[node]):
            if nxt == start:
                path.append(nxt)
                return True
            if nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                if walk(nxt):
                    return True
                path.pop()
        return False

    return path if walk(start) else None


def test_no_module_imports_one_that_imports_it_back():
    graph = module_imports()
    assert len(graph) > 100  # every package was read
    cycles = [cycle for name in sorted(graph) if (cycle := cycle_from(name, graph))]
    assert not cycles, " -> ".join(cycles[0])


def test_each_package_imports_only_the_layers_below_it():
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in module_imports().items()
        for dep in deps
        if dep.split(".")[0] != name.split(".")[0] and dep.split(".")[0] not in LAYERS[name.split(".")[0]]
    )
    assert not wrong, wrong


def test_a_cycle_is_found_and_shown():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle_from("a", graph) == ["a", "b", "c", "a"]
    assert cycle_from("d", graph) is None
