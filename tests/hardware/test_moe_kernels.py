"""The fused-MoE kernel's fixed costs (per layer, per expert run) and routed-expert numbers per expert dtype."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import Parallelism, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import Profile, load_profile
from servesim.hardware.step_timer import StepTimer

H100 = get_gpu("h100-sxm")
GPT_OSS = get_model("gpt-oss-20b")  # 24 MoE layers, 32 experts, top-4, MXFP4 experts
QWEN_MOE = get_model("qwen3-30b-a3b")  # bf16 experts


def _touched(tokens: int, experts: int = 32, top_k: int = 4) -> float:
    return experts * (1 - (1 - top_k / experts) ** tokens)


@pytest.mark.parametrize("tp,ep", [(1, False), (2, False), (2, True)])
def test_the_fixed_costs_add_per_layer_and_per_expert_each_gpu_runs(tp, ep):
    """A decode of 3 tokens touches 32 (1 - (1 - 4/32)^3) = 10.45 experts: each layer's MoE takes 40 us more, plus
    0.5 us per expert run on a GPU: every one of them under TP (each GPU runs a slice of each), half of them per
    GPU under EP over 2."""
    batch = StepBatch.of(np.array([1, 1, 1]), np.array([300, 500, 700]))
    par = Parallelism(tp=tp, ep=ep)
    base = step_cost(batch, GPT_OSS, H100, par).by_name("moe")
    fixed = step_cost(batch, GPT_OSS, H100, par, Profile(moe_layer_s=4e-5, moe_expert_s=5e-7)).by_name("moe")
    per_gpu = _touched(3) / (tp if ep else 1)
    assert fixed.time_s - base.time_s == pytest.approx(24 * (4e-5 + per_gpu * 5e-7), rel=1e-9)
    assert fixed.bound == base.bound  # added to both sides of the roofline


def test_an_expert_dtype_entry_prices_those_experts_only():
    """moe_kernels.mxfp4 prices gpt-oss's MXFP4 experts as a flat profile with those numbers does; bf16 experts
    (Qwen3-30B-A3B) keep the profile's own."""
    entry = {"moe_memory": 0.8, "moe_layer_s": 6e-5}
    keyed = Profile(moe_kernels={"mxfp4": entry})
    flat = Profile(**entry)
    batch = StepBatch.of(np.array([1] * 8), np.array([1000] * 8))
    assert step_cost(batch, GPT_OSS, H100, Parallelism(), keyed).total_s == pytest.approx(
        step_cost(batch, GPT_OSS, H100, Parallelism(), flat).total_s, rel=1e-12
    )
    assert (
        step_cost(batch, GPT_OSS, H100).total_s
        != step_cost(batch, GPT_OSS, H100, Parallelism(), flat).total_s
    )
    assert (
        step_cost(batch, QWEN_MOE, H100, Parallelism(), keyed).total_s
        == step_cost(batch, QWEN_MOE, H100).total_s
    )
    timer = StepTimer(GPT_OSS, H100, Parallelism(), keyed)
    assert timer(batch) == step_cost(batch, GPT_OSS, H100, Parallelism(), flat).total_s


def test_for_experts_resolves_once_and_a_gpu_section_overrides_its_dtypes():
    profile = Profile(
        moe_kernels={"mxfp4": {"moe_memory": 0.8, "moe_layer_s": 6e-5}, "fp8": {"moe_compute": 0.3}},
        gpus={"b200": {"moe_kernels": {"mxfp4": {"moe_memory": 0.95}}}},
    )
    hopper = profile.for_gpu("h100-sxm").for_experts("mxfp4")
    assert hopper.moe_memory.at(1) == 0.8 and hopper.moe_layer_s == 6e-5 and hopper.moe_kernels == {}
    assert hopper.for_experts("mxfp4") is hopper  # resolving again is free
    blackwell = profile.for_gpu("b200")
    # the section's mxfp4 entry replaces the shared one; the shared fp8 entry stays
    assert blackwell.moe_kernels == {
        "mxfp4": {"moe_memory": {"points": [[1.0, 0.95]]}},
        "fp8": {"moe_compute": {"points": [[1.0, 0.3]]}},
    }
    on_b200 = blackwell.for_experts("mxfp4")
    assert on_b200.moe_memory.at(1) == 0.95 and on_b200.moe_layer_s == 0.0
    assert profile.for_experts("bf16").moe_memory == Profile().moe_memory  # no entry: the profile's own


@pytest.mark.parametrize(
    "kernels,message",
    [
        ({"fp6": {"moe_memory": 0.5}}, r"moe_kernels: .*fp6: not a weight dtype; allowed: .*mxfp4"),
        (
            {"mxfp4": {"gemm_memory": 0.5}},
            r"moe_kernels: .*mxfp4: gemm_memory cannot differ per expert dtype; allowed: moe_compute, moe_memory, "
            r"moe_layer_s, moe_expert_s",
        ),
        ({"mxfp4": {"moe_memory": 1.5}}, r"mxfp4\.moe_memory\.points: efficiencies must lie in \(0, 1\]"),
        ({"mxfp4": {"moe_layer_s": -1}}, r"mxfp4\.moe_layer_s: .*greater than or equal to 0"),
    ],
)
def test_a_bad_expert_dtype_entry_names_the_file_the_dtype_and_the_field(tmp_path, kernels, message):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "moe_kernels": kernels}))
    with pytest.raises(SpecError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_the_measured_profile_prices_mxfp4_experts_with_their_own_fit():
    """The bundled measured profile holds a fit of MXFP4 experts on Hopper and another on the B200, each recorded
    under the dtype's entry (the B200's under its section); other expert dtypes keep the shared numbers (fitted to
    GPUStack's runs, DeepSeek's block FP8 among them) and no fixed MoE cost."""
    measured = load_profile("measured")
    hopper, b200 = (measured.for_gpu(gpu).for_experts("mxfp4") for gpu in ("h200", "b200"))
    assert (
        hopper.moe_layer_s > 0 and hopper.moe_expert_s > 0 and hopper.moe_memory.at(1) < b200.moe_memory.at(1)
    )
    assert b200.moe_layer_s != hopper.moe_layer_s
    fp8 = measured.for_gpu("h200").for_experts("fp8")
    assert (fp8.moe_compute, fp8.moe_memory, fp8.moe_layer_s) == (
        Profile().moe_compute,
        Profile().moe_memory,
        0.0,
    )
    mxfp4_fits = [record for record in measured.fits if "moe_kernels.mxfp4." in record.fields[0]]
    assert [len(record.runs) for record in mxfp4_fits] == [27, 12]
    assert [record.fields[0].split("moe_kernels")[0] for record in mxfp4_fits] == ["", "gpus.b200."]
