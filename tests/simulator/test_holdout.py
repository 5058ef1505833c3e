"""Out-of-sample accuracy: a profile is judged only on runs whose source (or GPU) none of its fitted numbers saw."""

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from servesim.hardware.profile import FitRecord, Profile, load_profile
from servesim.simulator.cli.main import app
from servesim.simulator.compare.holdout import held_out, holdout_rows, source_group
from servesim.simulator.compare.measured import MeasuredRun, MetricError, load_measured_runs

runner = CliRunner()
PUBLISHED = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs.yaml"
SERVE = {
    "gpu": "h100-sxm",
    "model": "llama-3.1-8b",
    "benchmark": "serve",
    "input_len": 1024,
    "output_len": 64,
    "num_prompts": 6,
    "max_concurrency": 2,
    "measured": {"median_tpot_ms": 8.0},
}


def run_of(**fields) -> MeasuredRun:
    return MeasuredRun.model_validate(SERVE | fields)


def test_an_engine_sections_numbers_hold_out_only_that_engines_runs():
    """The measured profile's SGLang block-FP8 experts came from InferenceMAX's H200 SGLang runs: an SGLang DeepSeek
    run on the H200 is in their sample under the GPU split, a vLLM one, which they do not price, is not."""
    sglang_runs = load_measured_runs(PUBLISHED.with_name("sglang_runs.yaml"))
    vllm_deepseek = [run for run in load_measured_runs(PUBLISHED) if run.model == "deepseek-v3"]
    measured = load_measured_runs(PUBLISHED.with_name("inferencemax_dsr1_runs.yaml"))
    by_label = {run.label(): run for run in [*sglang_runs, *vllm_deepseek, *measured]}
    record = FitRecord(
        fields=("engines.sglang.moe_kernels.fp8.moe_layer_s",),
        runs=tuple(run.label() for run in measured if run.gpu == "h200"),
    )
    own = Profile(fits=(record,))
    assert not held_out(own, sglang_runs[0], by_label, "gpu")
    assert held_out(own, sglang_runs[0], by_label, "source")
    assert held_out(own, vllm_deepseek[0], by_label, "gpu") and vllm_deepseek[0].gpu == "h200"


def test_a_gpu_sections_numbers_hold_out_other_gpus_runs_of_the_same_source():
    """The measured profile's AMD numbers came from InferenceMAX's MI300X runs and price AMD GPUs only: the same
    lab's NVIDIA runs stay out of their sample even by source, its MI325X runs (which take the MI300X's numbers)
    are in it by source and out of it by GPU."""
    nvidia = load_measured_runs(PUBLISHED.with_name("inferencemax_runs.yaml"))
    amd = load_measured_runs(PUBLISHED.with_name("inferencemax_amd_runs.yaml"))
    by_label = {run.label(): run for run in [*nvidia, *amd]}
    measured = load_profile("measured")
    h200 = next(run for run in nvidia if run.gpu == "h200")
    mi300x, mi325x = (next(run for run in amd if run.gpu == gpu) for gpu in ("mi300x", "mi325x"))
    assert held_out(measured, h200, by_label, "source") and held_out(measured, h200, by_label, "gpu")
    assert not held_out(measured, mi325x, by_label, "source") and held_out(measured, mi325x, by_label, "gpu")
    assert not held_out(measured, mi300x, by_label, "gpu")
    # a record without its section's prefix would price every run, the NVIDIA ones too
    amd = next(r for r in measured.fits if r.fields[0].startswith("gpus.mi300x."))
    bare = Profile(fits=(amd.model_copy(update={"fields": ("gemm_memory",)}),))
    assert not held_out(bare, h200, by_label, "source")


def test_a_runs_source_is_its_publisher():
    assert (
        source_group("https://docs.gpustack.ai/latest/performance-lab/qwen3-8b/h100-latency (source file: x)")
        == "gpustack"
    )
    assert source_group("https://github.com/gpustack/gpustack/blob/a5c9/docs/x.md") == "gpustack"
    assert source_group("https://github.com/tgarg01/silybench-data/blob/93e4/results.csv") == "tgarg01"
    assert source_group("https://blogs.oracle.com/cloud-infrastructure/post/x") == "oracle"
    assert source_group("my lab notebook, 2026-11-02") == "my"
    groups = {source_group(run.source) for run in load_measured_runs(PUBLISHED)}
    assert groups == {"gpustack", "michaelvll", "rocm", "amd", "oracle", "tgarg01"}


def test_fitted_numbers_hold_out_only_runs_of_sources_and_gpus_they_never_saw():
    runs = load_measured_runs(PUBLISHED)
    by_label = {run.label(): run for run in runs}
    dense_gpustack = by_label["qwen3-8b h100-sxm serve 233/221 c=4 x100"]
    moe_gpustack = by_label["gpt-oss-20b h100-sxm mxfp4 serve 2000/100 all at once x500"]
    mi300x = by_label["llama-3.1-70b mi300x TP8 fp8 latency 128/2048 batch 8"]
    default, fit, measured = Profile(), load_profile("published-fit"), load_profile("measured")
    # the defaults' routed-expert numbers came from gpustack's (and others') MoE runs: those are in sample, by source
    # and by GPU; its dense numbers were fitted to nothing
    assert held_out(default, dense_gpustack, by_label, "source") and held_out(
        default, dense_gpustack, by_label, "gpu"
    )
    # the measured profile's API server came from another source's H100 serve runs
    assert held_out(measured, dense_gpustack, by_label, "source")
    assert not held_out(measured, dense_gpustack, by_label, "gpu")
    assert not held_out(default, moe_gpustack, by_label, "source")
    assert not held_out(measured, moe_gpustack, by_label, "gpu")
    # published-fit drew every number from runs of every source and GPU here
    assert not any(held_out(fit, run, by_label, split) for run in runs for split in ("source", "gpu"))
    own = Profile(fits=(FitRecord(fields=("layer_overhead_s",), runs=(mi300x.label(),)),))
    assert not held_out(
        own, by_label["llama-3.1-405b mi300x TP8 fp8 latency 128/128 batch 8"], by_label, "gpu"
    )
    assert held_out(own, dense_gpustack, by_label, "source") and held_out(
        own, moe_gpustack, by_label, "source"
    )
    # API-server numbers price only runs through an API server: bench latency runs of their source stay held out
    api = Profile(fits=(FitRecord(fields=("api_latency_s", "api_token_s"), runs=(mi300x.label(),)),))
    rocm_latency = by_label["llama-3.1-70b mi300x TP8 fp8 latency 128/2048 batch 1 (vllm 0.10.0, github.com)"]
    assert held_out(api, rocm_latency, by_label, "source")
    assert not held_out(own, rocm_latency, by_label, "source")  # another ROCm run of that source


def test_an_expert_dtypes_numbers_hold_in_only_runs_of_those_experts():
    """A fit of MXFP4 experts (gpt-oss on an H100) prices no dense run, and no block-FP8 DeepSeek run: by GPU those
    stay held out while the H100's other gpt-oss runs do not; the fixed MoE costs, fitted shared, price every MoE
    run and no dense one."""
    runs = load_measured_runs(PUBLISHED)
    by_label = {run.label(): run for run in runs}
    fitted = by_label["gpt-oss-120b h100-sxm mxfp4 serve 229/217 c=4 x100"]
    other_gpt_oss = by_label["gpt-oss-20b h100-sxm mxfp4 serve 2000/100 all at once x500"]
    dense = by_label["qwen3-8b h100-sxm serve 233/221 c=4 x100"]
    deepseek = by_label["deepseek-v3 h200 TP8 fp8 serve 2000/100 all at once x500"]
    on_h200 = run_of(gpu="h200", model="gpt-oss-120b", source="https://example.com/x")
    by_label[on_h200.label()] = on_h200
    fields = ("moe_kernels.mxfp4.moe_memory", "moe_kernels.mxfp4.moe_layer_s")
    mxfp4 = Profile(fits=(FitRecord(fields=fields, runs=(fitted.label(), on_h200.label())),))
    assert not held_out(mxfp4, other_gpt_oss, by_label, "gpu")
    assert held_out(mxfp4, dense, by_label, "gpu") and held_out(mxfp4, deepseek, by_label, "gpu")
    shared = Profile(fits=(FitRecord(fields=("moe_layer_s",), runs=(on_h200.label(),)),))
    assert not held_out(shared, deepseek, by_label, "gpu")
    assert held_out(shared, run_of(gpu="h200", source="https://example.com/y"), by_label, "gpu")


def test_a_fitted_run_of_another_file_is_placed_by_the_gpu_its_label_names():
    """The measured profile's API server was fitted to silybench's H100 runs (published_runs.yaml): judged on
    another file's H100 serve run it is in sample by GPU, by source it cannot be placed and the run stays held out;
    an id is placed by the one catalog GPU it names, and one naming none or two places nothing."""
    h100, h200 = run_of(source="https://c.org/z"), run_of(source="https://c.org/z", gpu="h200")
    by_label = {run.label(): run for run in (h100, h200)}
    measured = load_profile("measured")
    assert not held_out(measured, h100, by_label, "gpu") and held_out(measured, h200, by_label, "gpu")
    assert held_out(measured, h100, by_label, "source")

    def fitted_on(label: str) -> Profile:
        return Profile(fits=(FitRecord(fields=("api_latency_s",), runs=(label,)),))

    assert not held_out(fitted_on("GPT-OSS 120B h100-sxm TP1"), h100, by_label, "gpu")
    assert held_out(fitted_on("GPT-OSS 120B TP1"), h100, by_label, "gpu")
    assert held_out(fitted_on("h100-sxm vs h200 TP1"), h100, by_label, "gpu")


def test_the_holdout_table_counts_only_held_out_figures():
    a, b = run_of(source="https://a.org/x"), run_of(source="https://b.org/y", input_len=2048)
    errors = lambda *pct: [MetricError("median_tpot_ms", 10.0, 10.0 * (1 + p / 100)) for p in pct]  # noqa: E731
    fitted_a = Profile(fits=(FitRecord(fields=("gemm_compute",), runs=(a.label(),)),))
    results = {"plain": [(a, errors(10)), (b, errors(-30))], "fitted": [(a, errors(1)), (b, errors(40))]}
    rows = holdout_rows(results, {"plain": Profile(), "fitted": fitted_a}, "source")
    # fitted's 1% on the run it saw does not count
    assert rows == [["tpot", "20% (28%) n=2", "40% (40%) n=1"]]
    assert holdout_rows(results, {"plain": Profile(), "fitted": fitted_a}, "gpu") == [
        ["tpot", "20% (28%) n=2", "-"]
    ]
    # like for like: only b is held out from both, so plain's 10% on a drops out of its column
    assert holdout_rows(results, {"plain": Profile(), "fitted": fitted_a}, "source", shared=True) == [
        ["tpot", "30% (30%) n=1", "40% (40%) n=1"]
    ]
    assert holdout_rows(results, {"plain": Profile(), "fitted": fitted_a}, "gpu", shared=True) == []


def test_compare_cli_sets_profiles_side_by_side_with_their_held_out_errors(tmp_path):
    path = tmp_path / "runs.yaml"
    path.write_text(
        yaml.safe_dump(
            [
                SERVE | {"source": "https://a.org/x"},
                SERVE | {"source": "https://b.org/y", "gpu": "h200", "input_len": 512},
            ]
        )
    )
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text(
        yaml.safe_dump(
            {
                "name": "fitted",
                "layer_overhead_s": 3e-5,
                "fits": [
                    {"fields": ["layer_overhead_s"], "runs": ["llama-3.1-8b h100-sxm serve 1024/64 c=2 x6"]}
                ],
            }
        )
    )
    result = runner.invoke(
        app,
        [
            "compare",
            str(path),
            "--profile",
            "default",
            "--profile",
            "measured",
            "--profile",
            str(fitted),
            "--split",
            "source",
            "--split",
            "gpu",
        ],
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "error per family (default profile)" in out and "error per family (measured)" in out
    assert "held out by source" in out and "held out by gpu" in out
    # the fitted profile saw the a.org H100 run: one figure of its own is held out, each of the others two, but by GPU
    # the measured profile's, whose API server was fitted to H100 serve runs of another file, only the H200 one
    _, by_source, by_source_shared, by_gpu, by_gpu_shared = re.split(
        r"held out by (?:source|gpu) \(|held out by (?:source|gpu) from every profile", out
    )
    own, shared = by_source + by_gpu, by_source_shared + by_gpu_shared
    assert own.count("n=2") == 3 and own.count("n=1") == 3
    # like for like: the b.org H200 run alone, in every column, under either split
    assert shared.count("n=1") == 6 and "n=2" not in shared
    bad = runner.invoke(app, ["compare", str(path), "--split", "vendor"])
    assert bad.exit_code == 2 and "--split 'vendor': choose from source, gpu" in bad.output


def test_an_engines_gpu_section_prices_that_engines_runs_on_that_gpu_only():
    fitted = run_of(gpu="mi300x", engine="sglang", source="https://example.com/a")
    same_engine_elsewhere = run_of(gpu="mi325x", engine="sglang", source="https://example.com/b")
    same_gpu_other_engine = run_of(gpu="mi300x", engine="vllm", source="https://example.com/c")
    runs = [fitted, same_engine_elsewhere, same_gpu_other_engine]
    by_label = {run.label(): run for run in runs}
    record = FitRecord(fields=("engines.sglang.gpus.mi300x.layer_overhead_s",), runs=(fitted.label(),))
    own = Profile(fits=(record,))
    assert not held_out(own, fitted, by_label, "gpu")
    assert held_out(own, same_engine_elsewhere, by_label, "gpu")
    # the same source would put it in sample, but the number does not price a vLLM run
    same_source = same_gpu_other_engine.model_copy(update={"source": fitted.source})
    assert held_out(own, same_source, by_label | {same_source.label(): same_source}, "source")
