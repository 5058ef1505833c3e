"""Every bundled scenario validates and runs (shortened); the library table in docs/scenarios.md lists each one."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from servesim.simulator.cli.main import app
from servesim.simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def test_the_library_has_the_documented_scenarios():
    names = {p.stem for p in SCENARIOS}
    assert names >= {
        "quickstart",
        "chat_llama8b_h100",
        "chat_llama70b_h100x4",
        "code_completion",
        "agent_prefix_sharing",
        "long_context_rag",
        "grpo_rollouts",
        "pd_colocated_70b",
        "pd_disaggregated_70b",
        "gemma3n_fast_prefill",
        "deepseek_v3_8xh200",
        "plan_chat_h100_h200_b200",
    }
    library = (ROOT / "docs" / "scenarios.md").read_text()
    assert all(f"scenarios/{p.name}" in library for p in SCENARIOS)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_each_scenario_runs(path, tmp_path):
    load_scenario(path)  # validates, including sweep / plan sections
    result = CliRunner().invoke(
        app, ["simulate", str(path), "--out", str(tmp_path / "run"), "--set", "workload.num_requests=64"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "summary.json").exists()
