"""A profile's `engines:` sections: what differs under one engine (its own kernels) prices that engine's steps only."""

from __future__ import annotations

import pytest
import yaml

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import Parallelism, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import Profile, load_profile
from tests.simulator.conftest import run, scenario

A100, H100 = get_gpu("a100-80gb"), get_gpu("h100-sxm")
SECTION = {"moe_kernels": {"mxfp4": {"moe_memory": 0.5, "moe_layer_s": 6e-5}}}


def test_an_engine_section_prices_that_engines_steps_as_a_flat_profile_would():
    """gpt-oss-20b's MXFP4 experts: under sglang the section's entry prices them exactly as a flat profile holding
    it; under vllm and trtllm the shared numbers do."""
    model, batch = get_model("gpt-oss-20b"), StepBatch.uniform(8, 512, 1)
    sectioned = Profile(engines={"sglang": SECTION})

    def cost(profile: Profile) -> float:
        return step_cost(batch, model, H100, Parallelism(), profile).total_s

    assert cost(sectioned.for_engine("sglang")) == cost(Profile(**SECTION))
    assert cost(sectioned.for_engine("vllm")) == cost(sectioned.for_engine("trtllm")) == cost(Profile())
    assert cost(Profile(**SECTION)) != cost(Profile())


def test_a_gpus_section_applies_over_the_engines_and_kernels_engine_resolves_beside_it():
    profile = Profile(
        kernels="engine",
        engines={"sglang": {"moe_compute": 0.3, "comm": 0.6}},
        gpus={"a100-80gb": {"moe_compute": 0.4}},
    )
    under_sglang = profile.for_engine("sglang")
    assert under_sglang.kernels == "sglang" and under_sglang.engines == {}
    assert under_sglang.for_gpu("a100-80gb").moe_compute.at(1) == 0.4  # the GPU's own, over the engine's
    assert under_sglang.for_gpu("h100-sxm").moe_compute.at(1) == 0.3
    assert under_sglang.for_gpu("a100-80gb").comm.at(1) == 0.6
    under_vllm = profile.for_engine("vllm")
    assert under_vllm.kernels == "vllm" and under_vllm.comm == Profile().comm
    assert under_vllm.for_engine("vllm") == under_vllm  # resolving again changes nothing


@pytest.mark.parametrize(
    "engines,message",
    [
        ({"tgi": {}}, r"engines: .*tgi: not an engine; allowed: vllm, sglang, trtllm"),
        ({"sglang": {"kernels": "vllm"}}, r"sglang: kernels cannot differ per engine; allowed: gemm_compute"),
        (
            {"sglang": {"gpus": {"mi300x": {"kernels": "vllm"}}}},
            r"sglang\.gpus\.mi300x: kernels cannot differ per GPU",
        ),
        ({"sglang": {"gpus": ["mi300x"]}}, r"sglang\.gpus: a GPU's name -> its section, not list"),
        ({"sglang": {"moe_memory": 1.5}}, r"sglang\.moe_memory\.points: efficiencies must lie in \(0, 1\]"),
    ],
)
def test_a_bad_engine_section_names_the_file_the_engine_and_the_field(tmp_path, engines, message):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "engines": engines}))
    with pytest.raises(SpecError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_a_scenario_reads_the_section_of_its_engine(tmp_path):
    """A gpt-oss-20b run under sglang gives the same per-request times with the sectioned profile as with a flat one
    holding the section; under vllm, the same as with no section."""
    sectioned, flat = tmp_path / "s.yaml", tmp_path / "f.yaml"
    sectioned.write_text(yaml.safe_dump({"name": "s", "engines": {"sglang": SECTION}}))
    flat.write_text(yaml.safe_dump({"name": "f", **SECTION}))
    common = {
        "model": "gpt-oss-20b",
        "workload": {**scenario().workload.model_dump(mode="json"), "num_requests": 30},
    }

    def ttfts(scheduler: str, profile=None) -> list[float]:
        hardware = {"gpu": "h100-sxm"} | ({"profile": str(profile)} if profile else {})
        caching = {"prefix_caching": "radix"} if scheduler == "sglang" else {}
        return (
            run(scenario(hardware=hardware, engine={"scheduler": scheduler, **caching}, **common))
            .requests["ttft_s"]
            .tolist()
        )

    assert ttfts("sglang", sectioned) == ttfts("sglang", flat) != ttfts("sglang")
    assert ttfts("vllm", sectioned) == ttfts("vllm")
