"""The scheduler interface is declared, not probed: every member the engine, fast-forward and the admission
check use is on the `Scheduler` protocol, and every scheduler has each of them."""

import ast
from pathlib import Path

import servesim.policies.catalog  # noqa: F401 (registers the schedulers)
from servesim.policies.registry import schedulers
from servesim.policies.step import Scheduler, SchedulerDefaults

ROOT = Path(__file__).resolve().parents[2]
CORE = {"kv", "add", "schedule", "commit", "num_waiting", "num_running"}  # each scheduler's own


def declared(protocol: type) -> set[str]:
    names = set(protocol.__annotations__) | {n for n in vars(protocol) if not n.startswith("_")}
    return names - {"__annotations__"}


def test_the_defaults_answer_every_optional_member_and_nothing_else():
    optional = declared(Scheduler) - CORE
    assert optional == {n for n in vars(SchedulerDefaults) if not n.startswith("_")}
    assert {"pipelined", "decode_stretch", "admission_waits_for_blocks", "blocks_to_run"} <= optional


def test_every_scheduler_has_every_member():
    for name in schedulers._items:  # the internal P/D pools' too
        cls = schedulers.get(name)
        assert issubclass(cls, SchedulerDefaults), name
        assert all(
            hasattr(cls, member) for member in declared(Scheduler) - {"kv", "num_waiting", "num_running"}
        )


def test_no_code_probes_a_scheduler_with_getattr_or_hasattr():
    for path in [*ROOT.glob("simulator/*.py"), *ROOT.glob("policies/*.py"), *ROOT.glob("calibration/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("getattr", "hasattr")
                and node.args
            ):
                probed = ast.unparse(node.args[0])
                assert "sched" not in probed and "rank" not in probed, f"{path.name}: getattr({probed}, ...)"
