"""A profile's `gpus:` sections: one GPU's efficiencies and overheads differ, every other GPU keeps the shared ones."""

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
from tests.hardware.test_gpu_catalog import NEW_GPU_YAML
from tests.simulator.conftest import run, scenario

A100, H100 = get_gpu("a100-80gb"), get_gpu("h100-sxm")
SECTION = {"moe_compute": 0.36, "layer_overhead_s": 2e-5}


def _write(tmp_path, profile: dict, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(profile))
    return path


def test_a_gpus_section_prices_its_gpu_and_leaves_the_others_shared():
    """A gpt-oss-20b prefill is MoE-bound: on the A100 the section's 0.36 for routed experts (twice the shared 0.18)
    and its 20 us per layer price the step exactly as a flat profile with those values does; the H100 is priced
    as the shared profile prices it."""
    model, batch = get_model("gpt-oss-20b"), StepBatch.uniform(1, 0, 4096)
    sectioned = Profile(gpus={"a100-80gb": SECTION})
    on_a100 = step_cost(batch, model, A100, Parallelism(), sectioned)
    assert on_a100.total_s == step_cost(batch, model, A100, Parallelism(), Profile(**SECTION)).total_s
    assert on_a100.by_name("moe").time_s == pytest.approx(
        step_cost(batch, model, A100).by_name("moe").time_s / 2, rel=1e-9
    )
    assert (
        step_cost(batch, model, H100, Parallelism(), sectioned).total_s
        == step_cost(batch, model, H100).total_s
    )


def test_the_step_timer_resolves_the_section_as_step_cost_does():
    model = get_model("gpt-oss-20b")
    timer = StepTimer(model, A100, Parallelism(), Profile(gpus={"a100-80gb": SECTION}))
    batch = StepBatch.of(np.array([1, 1, 300]), np.array([500, 900, 0]))
    assert timer(batch) == step_cost(batch, model, A100, Parallelism(), Profile(**SECTION)).total_s


def test_for_gpu_overlays_the_section_and_leaves_no_sections():
    profile = Profile(gpus={"a100-80gb": SECTION})
    resolved = profile.for_gpu("a100-80gb")
    assert resolved.moe_compute.at(1) == 0.36 and resolved.layer_overhead_s == 2e-5
    assert resolved.moe_memory == profile.moe_memory and resolved.gpus == {}
    assert resolved.for_gpu("a100-80gb") is resolved  # resolving again is free
    assert profile.for_gpu("h100-sxm") == profile.model_copy(update={"gpus": {}})
    widened = profile.with_section("gpus", "a100-80gb", {"moe_memory": 0.5}).for_gpu("a100-80gb")
    assert widened.moe_memory.at(1) == 0.5 and widened.moe_compute.at(1) == 0.36


def test_a_section_is_kept_as_its_fields_dump_so_equal_sections_compare_equal():
    """0.5 and its one-point curve are the same efficiency: the sections compare equal, as the shared fields do."""
    as_number = Profile(gpus={"a100-80gb": {"comm": 0.5}})
    assert as_number == Profile(gpus={"a100-80gb": {"comm": {"points": [[1.0, 0.5]]}}})
    assert as_number.gpus == {"a100-80gb": {"comm": {"points": [[1.0, 0.5]]}}}


def test_a_scenario_on_the_sectioned_gpu_runs_as_with_the_flat_profile(tmp_path):
    """The whole simulator reads the section: a gpt-oss-20b run on an A100 gives the same per-request times with
    the sectioned profile as with a flat one holding the section's values, and different ones from the shared."""
    sectioned = _write(tmp_path, {"name": "s", "gpus": {"a100-80gb": SECTION}})
    flat = _write(tmp_path, {"name": "f", **SECTION}, "flat.yaml")
    common = {
        "model": "gpt-oss-20b",
        "workload": {**scenario().workload.model_dump(mode="json"), "num_requests": 40},
    }
    runs = [
        run(scenario(hardware={"gpu": "a100-80gb", "profile": str(path)}, **common)).requests
        for path in (sectioned, flat)
    ]
    shared = run(scenario(hardware={"gpu": "a100-80gb"}, **common)).requests
    assert runs[0]["ttft_s"].tolist() == runs[1]["ttft_s"].tolist()
    assert runs[0]["ttft_s"].tolist() != shared["ttft_s"].tolist()


def test_a_profile_with_sections_round_trips_through_yaml(tmp_path):
    profile = Profile(name="p", gpus={"a100-80gb": SECTION, "mi300x": {"comm": 0.4}})
    path = _write(tmp_path, profile.model_dump(mode="json"))
    assert load_profile(path) == profile


@pytest.mark.parametrize(
    "section,message",
    [
        (
            {"name": "x"},
            r"gpus: .*a100-80gb: name cannot differ per GPU; allowed: gemm_compute, .*host_request_s",
        ),
        ({"gpus": {}}, r"gpus: .*a100-80gb: gpus cannot differ per GPU"),
        ({"moe_compute": 1.5}, r"gpus: a100-80gb\.moe_compute\.points: efficiencies must lie in \(0, 1\]"),
        (
            {"step_overhead_s": True},
            r"gpus: .*a100-80gb: step_overhead_s: expected a number, not a true/false",
        ),
        ({"layer_overhead_s": -1}, r"gpus: .*a100-80gb\.layer_overhead_s: .*greater than or equal to 0"),
    ],
)
def test_a_bad_section_names_the_file_the_gpu_and_the_field(tmp_path, section, message):
    path = _write(tmp_path, {"name": "p", "gpus": {"a100-80gb": section}})
    with pytest.raises(SpecError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_a_section_for_a_gpu_outside_the_catalog_is_refused_unless_a_gpu_file_adds_it(tmp_path):
    """A misspelt GPU name would price nothing; a GPU of the user's own file is a GPU."""
    path = _write(tmp_path, {"name": "p", "gpus": {"a100": {"comm": 0.5}}})
    with pytest.raises(
        SpecError, match=r"p.yaml: gpus: a100 is not a GPU of the catalog; allowed: .*a100-80gb"
    ):
        load_profile(path)
    gpu_file = tmp_path / "mine.yaml"
    gpu_file.write_text(NEW_GPU_YAML)
    own = _write(tmp_path, {"name": "p", "gpus": {"test-accel": {"comm": 0.5}}}, "own.yaml")
    with pytest.raises(SpecError, match="test-accel is not a GPU"):
        load_profile(own)
    assert load_profile(own, (gpu_file,)).for_gpu("test-accel").comm.at(1) == 0.5


def test_an_engines_section_for_a_gpu_applies_over_both_under_that_engine_only(tmp_path):
    """`engines: {sglang: {gpus: {mi300x: ...}}}` is what differs with both: over the MI300X's own section and
    SGLang's, field by field and by expert dtype, for SGLang on the MI300X alone; a round trip keeps it, and a GPU
    outside the catalog is refused there too."""
    profile = Profile(
        moe_layer_s=1e-5,
        gpus={
            "mi300x": {"comm": 0.4, "moe_kernels": {"fp8": {"moe_memory": 0.5}, "mxfp4": {"moe_memory": 0.6}}}
        },
        engines={
            "sglang": {
                "moe_layer_s": 1e-4,
                "gpus": {"mi300x": {"layer_overhead_s": 9e-5, "moe_kernels": {"fp8": {"moe_memory": 0.7}}}},
            }
        },
    )
    both = profile.for_engine("sglang").for_gpu("mi300x")
    assert (both.layer_overhead_s, both.comm.at(1), both.moe_layer_s) == (9e-5, 0.4, 1e-4)
    assert (both.for_experts("fp8").moe_memory.at(1), both.for_experts("mxfp4").moe_memory.at(1)) == (
        0.7,
        0.6,
    )
    vllm = profile.for_engine("vllm").for_gpu("mi300x")
    assert (vllm.layer_overhead_s, vllm.moe_layer_s, vllm.for_experts("fp8").moe_memory.at(1)) == (
        0.0,
        1e-5,
        0.5,
    )
    elsewhere = profile.for_engine("sglang").for_gpu("h200")
    assert (elsewhere.layer_overhead_s, elsewhere.moe_layer_s) == (0.0, 1e-4)
    path = _write(tmp_path, profile.model_dump(mode="json"))
    assert load_profile(path) == profile
    misspelt = _write(
        tmp_path, {"name": "p", "engines": {"sglang": {"gpus": {"mi301x": {"comm": 0.5}}}}}, "bad.yaml"
    )
    with pytest.raises(SpecError, match="gpus: mi301x is not a GPU of the catalog"):
        load_profile(misspelt)
    bad = _write(
        tmp_path, {"name": "p", "engines": {"sglang": {"gpus": {"mi300x": {"name": "x"}}}}}, "bad2.yaml"
    )
    with pytest.raises(SpecError, match=r"sglang\.gpus\.mi300x: name cannot differ per GPU"):
        load_profile(bad)


def test_a_profile_file_is_read_anew_once_it_changes(tmp_path):
    """Loads of an unchanged file share one reading; a rewrite in place, the same size and within the clock's
    tick, is seen at once, and so is a file that stops being valid."""
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ngemm_compute: 0.51\n")
    first = load_profile(path)
    assert load_profile(path) is first and first.gemm_compute.at(1) == 0.51
    path.write_text("name: p\ngemm_compute: 0.52\n")
    assert load_profile(path).gemm_compute.at(1) == 0.52
    path.write_text("name: p\ngemm_compute: 1.52\n")
    with pytest.raises(SpecError, match=r"p\.yaml: gemm_compute"):
        load_profile(path)
