"""Engine families: each scheduler's family decides its engine's defaults and rules, nothing else compares engine
names, and a third family is one subclass plus a scheduler naming it."""

import ast
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from servesim.hardware.gpu import get_gpu
from servesim.policies.config import EngineConfig
from servesim.policies.families import GENERIC, SGLANG, TRTLLM, VLLM, EngineFamily, families, family_of
from servesim.policies.token_budget import TokenBudgetScheduler
from servesim.simulator.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
PACKAGES = ("hardware", "policies", "simulator", "workloads", "calibration")
#: Scheduler and engine names a comparison could test for.
NAMES = {"vllm", "sglang", "sarathi", "orca", "static", "seed_toy", "vllm_prefill", "vllm_decode", "trtllm"}
WHO = re.compile(r"\bscheduler\b|\.engine\b|^engine$")


def _constants(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*map(_constants, node.elts)) if node.elts else set()
    return set()


def engine_name_tests(source: str) -> list[str]:
    """The comparisons of a scheduler or engine with a scheduler or engine name in `source`, and `startswith` calls
    on a scheduler, as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(_constants(side) & NAMES for side in sides)
            if named and any(WHO.search(ast.unparse(side)) for side in sides if not _constants(side)):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "startswith" and WHO.search(ast.unparse(node.func.value)):
                found.append(ast.unparse(node))
    return found


def test_the_checker_finds_engine_name_tests_and_leaves_kv_manager_names_alone():
    assert engine_name_tests('x = e.scheduler == "sglang"') == ["e.scheduler == 'sglang'"]
    assert engine_name_tests('ok = scheduler in ("vllm", "sglang")')
    assert engine_name_tests('ok = run.engine != "vllm"')
    assert engine_name_tests('ok = e.scheduler.startswith("vllm")')
    assert not engine_name_tests('ok = e.prefix_caching == "vllm"')  # a KV manager's name
    assert not engine_name_tests('ok = engine == "dask"')  # a sweep executor's


def test_no_module_compares_engine_or_scheduler_names_outside_the_families():
    found = {
        str(path.relative_to(ROOT)): tests
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "families.py" and (tests := engine_name_tests(path.read_text()))
    }
    assert found == {}


def test_each_scheduler_names_its_family():
    assert [family_of(name) for name in ("vllm", "vllm_prefill", "vllm_decode")] == [VLLM] * 3
    assert family_of("sglang") is SGLANG
    assert family_of("trtllm") is TRTLLM
    assert [family_of(name) for name in ("sarathi", "orca", "static", "seed_toy")] == [GENERIC] * 4
    # the engines a user names (servesim memory --engine, run files)
    assert families.names() == ["sglang", "trtllm", "vllm"]


class ToyFamily(EngineFamily):
    """A third engine: small fixed batch limits, half the device, no null block, SGLang's kernels."""

    name = "toy"
    label = "Toy"
    kernel_tables = "sglang"

    def batch_defaults(self, gpu):
        return 512, 8

    def memory_share(self, gpu, prefill_tokens, tp, pp, dp_attention):
        return 0.5


TOY = ToyFamily()


class ToyScheduler(TokenBudgetScheduler):
    """vLLM's scheduling under the toy engine's defaults."""

    family = TOY
    schedules_ahead = False


TOY_SCHEDULER = f"{__name__}:ToyScheduler"


def test_a_third_family_is_a_subclass_and_a_scheduler_naming_it(tmp_path):
    assert family_of(TOY_SCHEDULER) is TOY
    engine = EngineConfig(scheduler=TOY_SCHEDULER).with_defaults(get_gpu("h100-sxm"), 8192)
    assert (engine.max_num_batched_tokens, engine.max_num_seqs, engine.gpu_memory_utilization) == (
        512,
        8,
        0.5,
    )
    assert engine.async_scheduling is False
    out = tmp_path / "toy"
    args = ["simulate", str(QUICKSTART), "--out", str(out), "--set", f"engine.scheduler={TOY_SCHEDULER}"]
    unset = [
        "--set",
        "engine.max_num_seqs=null",
        "--set",
        "engine.max_num_batched_tokens=null",
    ]  # the family's
    ran = CliRunner().invoke(app, [*args, *unset, "--set", "workload.num_requests=60"])
    assert ran.exit_code == 0, ran.output
    requests, steps = pd.read_csv(out / "requests.csv"), pd.read_csv(out / "steps.csv")
    assert len(requests) == 60 and requests["finish_s"].notna().all()
    assert steps["num_running"].max() <= 8  # the family's slots
    assert yaml.safe_load((out / "scenario.yaml").read_text())["engine"]["max_num_batched_tokens"] == 512
    with pytest.raises(ValueError, match="async_scheduling is modelled for"):
        EngineConfig(scheduler=TOY_SCHEDULER, async_scheduling=True)
