"""A deployment's GPUs and hourly price: replicas, prefill/decode pools (each on its own GPU), pipeline stages."""

from __future__ import annotations

import math

import pytest
import yaml

from servesim.hardware.gpu import get_gpu
from servesim.simulator.planning.pricing import cost_per_hour_usd, gpu_counts
from servesim.simulator.report.run_report import point_cost_per_hour
from servesim.simulator.scenario import load_scenario, with_absolute_paths, with_overrides
from tests.simulator.study_helpers import SCENARIOS, chat

H100, H200 = get_gpu("h100-sxm").price_per_gpu_hour_usd, get_gpu("h200").price_per_gpu_hour_usd


def test_replicas_times_tensor_and_pipeline_parallel_gpus():
    s = with_overrides(chat(), {"cluster.replicas": 3, "parallelism.tp": 2, "parallelism.pp": 2})
    assert gpu_counts(s) == {"h100-sxm": 12}
    assert cost_per_hour_usd(s) == pytest.approx(12 * H100)


def test_prefill_and_decode_pools_are_priced_each_on_its_gpu():
    s, _ = load_scenario(SCENARIOS / "pd_disaggregated_70b.yaml")  # 1 x TP4 prefill + 1 x TP4 decode
    assert gpu_counts(s) == {"h100-sxm": 8} and cost_per_hour_usd(s) == pytest.approx(8 * H100)
    s, _ = load_scenario(
        SCENARIOS / "pd_disaggregated_70b.yaml",
        [
            "disaggregation.prefill={replicas: 2, tp: 2, pp: 2}",
            "disaggregation.decode={replicas: 3, tp: 4, gpu: h200}",
        ],
    )
    assert gpu_counts(s) == {"h100-sxm": 8, "h200": 12}
    assert cost_per_hour_usd(s) == pytest.approx(8 * H100 + 12 * H200)


def test_pipeline_stages_count_their_own_replicas_and_tp():
    s, _ = load_scenario(
        SCENARIOS / "omni_thinker_talker.yaml",
        [
            "stages=[{name: thinker, model: qwen2.5-7b, tp: 2, replicas: 2}, "
            "{name: talker, gpu: h200, replicas: 3}]"
        ],
    )
    assert gpu_counts(s) == {"h100-sxm": 4, "h200": 3}
    assert cost_per_hour_usd(s) == pytest.approx(4 * H100 + 3 * H200)


def test_a_sweep_reports_cost_counts_a_disaggregated_points_pools(tmp_path):
    """The sweep report's cost Pareto prices each point from its resolved scenario.yaml, pools and all (it used to
    price cluster.replicas x parallelism.tp: one H100 for eight)."""
    s, base = load_scenario(SCENARIOS / "pd_disaggregated_70b.yaml", ["disaggregation.decode.gpu=h200"])
    (tmp_path / "scenario.yaml").write_text(
        yaml.safe_dump(with_absolute_paths(s, base).model_dump(mode="json"))
    )
    assert point_cost_per_hour(tmp_path) == pytest.approx(4 * H100 + 4 * H200)
    (tmp_path / "scenario.yaml").write_text("model: [")
    assert math.isnan(point_cost_per_hour(tmp_path))
