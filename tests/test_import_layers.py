"""The packages stack in layers (DESIGN.md's layout) and no module imports another that imports it back.

Imports at module level only: an import inside a function runs when called (the CLI's calibrate command reaches
into `calibration` that way), so it cannot make a cycle at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "servesim."  # the folders below install as servesim.hardware, servesim.simulator, ...
#: each package and what it may import at module level
LAYERS = {
    "hardware": set(),
    "workloads": {"hardware"},
    "policies": {"hardware", "workloads"},
    "simulator": {"hardware", "workloads", "policies"},
    "calibration": {"hardware", "workloads", "policies", "simulator"},
}
#: simulator's subpackages, each importing only those before it (and simulator's shared top-level modules:
#: the scenario schema, run folders, atomic writes); calibration sits beside planning, so only the CLI reaches it
SIMULATOR_LAYERS = ("world", "planning", "report", "compare", "cli")


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
        graph[name] = {m.removeprefix(NAMESPACE) for m in imported if m.removeprefix(NAMESPACE) in files} - {
            name
        }
    return graph


def bare_imports() -> list[str]:
    """Imports of a package by its folder name instead of under `servesim.`: installed, no such module exists."""
    found = []
    for package in (*LAYERS, "servesim", "tests", "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                    else []
                )
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in LAYERS]
    return found


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


def simulator_layer(module: str) -> int:
    """Index of a simulator module's subpackage in SIMULATOR_LAYERS; -1 for the shared top-level modules."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in SIMULATOR_LAYERS:
        return SIMULATOR_LAYERS.index(parts[1])
    return -1


def test_every_import_goes_through_the_servesim_namespace():
    assert not bare_imports(), bare_imports()[:5]


def test_simulator_subpackages_import_only_those_below_them():
    graph = module_imports()
    wrong = sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if name.startswith("simulator.") and name != "simulator.__main__"
        for dep in deps
        if dep.startswith("simulator.") and simulator_layer(dep) > simulator_layer(name)
    )
    assert not wrong, wrong
    assert simulator_layer("simulator.world.run") == 0 and simulator_layer("simulator.scenario") == -1


def test_nothing_but_the_entry_points_imports_the_cli():
    importers = sorted(
        name
        for name, deps in module_imports().items()
        if any(d.startswith("simulator.cli") for d in deps)
        and not name.startswith("simulator.cli")
        and name != "simulator.__main__"
    )
    assert not importers, importers


def test_a_cycle_is_found_and_shown():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle_from("a", graph) == ["a", "b", "c", "a"]
    assert cycle_from("d", graph) is None
