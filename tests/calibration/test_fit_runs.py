"""Fitting a profile to measured runs' figures: it recovers figures made by a known profile, holds runs out."""

import math

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from servesim.calibration.fit_runs import API_TERMS, ZERO_STARTS, fit_to_runs, split
from servesim.hardware.errors import SpecError
from servesim.hardware.profile import API_FIELDS, EfficiencyCurve, FitRecord, Profile, load_profile
from servesim.simulator.cli.main import app
from servesim.simulator.compare.measured import MeasuredRun, replay

TRUTH = Profile(
    gemm_compute=EfficiencyCurve.constant(0.45),
    gemm_memory=EfficiencyCurve.constant(0.6),
    step_overhead_s=6e-4,
    layer_overhead_s=3e-5,
)


def runs_measured_under(profile_path: str, gpu: str = "h100-sxm") -> list[MeasuredRun]:
    """Small runs of two models whose figures a known profile made: decode-bound latency runs, a prefill-bound
    burst, a closed loop. (Overheads and efficiencies trade off against each other on so few runs: only the
    figures, and the weight-streaming efficiency that decode-bound figures pin, are recoverable.)"""
    shapes = [
        {"model": "llama-3.2-1b", "benchmark": "latency", "batch_size": 1, "input_len": 32, "output_len": 64},
        {
            "model": "llama-3.1-8b",
            "benchmark": "latency",
            "batch_size": 4,
            "input_len": 128,
            "output_len": 32,
        },
        {
            "model": "llama-3.1-8b",
            "benchmark": "serve",
            "num_prompts": 16,
            "input_len": 2048,
            "output_len": 4,
        },
        {
            "model": "llama-3.2-1b",
            "benchmark": "serve",
            "num_prompts": 8,
            "max_concurrency": 2,
            "input_len": 512,
            "output_len": 32,
        },
    ]
    figures = {"latency": ["latency_s"], "serve": ["mean_ttft_ms", "mean_tpot_ms", "duration_s"]}
    runs = []
    for shape in shapes:
        template = MeasuredRun.model_validate(
            {
                "source": "synthetic",
                "gpu": gpu,
                **shape,
                "engine_args": {"max_model_len": 4096},
                "measured": {f: 1.0 for f in figures[shape["benchmark"]]},
            }
        )
        made = {e.metric: e.predicted for e in replay(template, profile_path)}
        runs.append(template.model_copy(update={"measured": made}))
    return runs


@pytest.fixture(scope="module")
def truth_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("truth") / "truth.yaml"
    path.write_text(yaml.safe_dump(TRUTH.model_dump(mode="json")))
    return str(path)


def test_the_fit_recovers_the_figures_a_known_profile_made(truth_path):
    runs = runs_measured_under(truth_path)
    before = [abs(e.error_pct) for run in runs for e in replay(run)]
    result = fit_to_runs(runs, [], max_evaluations=60, name="recovered")
    assert max(before) > 15  # the defaults are far from TRUTH: there is something to recover
    assert result.profile.fit_mape < 3.0 and result.profile.name == "recovered"
    assert result.profile.gemm_memory.at(1) == pytest.approx(0.6, rel=0.15)  # decode-bound figures pin it


def test_every_nth_run_is_held_out_and_measures_the_fit(truth_path, tmp_path):
    runs = runs_measured_under(truth_path)
    train, test = split(runs, 2)
    assert train == [runs[0], runs[2]] and test == [runs[1], runs[3]]
    assert split(runs, 0) == (runs, [])
    with pytest.raises(SpecError, match="give 0"):
        split(runs, 1)  # would hold out every run: not read as 0, which fits on all of them
    result = fit_to_runs(train, test, max_evaluations=20)
    assert result.evaluations <= 20  # the budget holds the Jacobian's replays too
    saved = tmp_path / "fitted.yaml"
    saved.write_text(yaml.safe_dump(result.profile.model_dump(mode="json")))
    replayed = [replay(run, str(saved)) for run in test]
    held_out = [abs(e.predicted / e.measured - 1) * 100 for run in replayed for e in run]
    assert result.profile.fit_mape == pytest.approx(sum(held_out) / len(held_out), rel=1e-6)
    assert result.split_errors("fitted")[1] == replayed  # the errors it reports are the saved profile's
    assert result.split_errors("base")[0] == [replay(run) for run in train]


def test_fit_cli_writes_a_loadable_profile_and_every_figure(tmp_path, truth_path):
    runs_file = tmp_path / "runs.yaml"
    runs_file.write_text(
        yaml.safe_dump(
            [run.model_dump(mode="json", exclude_none=True) for run in runs_measured_under(truth_path)]
        )
    )
    out = tmp_path / "fit"
    result = CliRunner().invoke(
        app,
        [
            "fit",
            str(runs_file),
            "--out",
            str(out),
            "--holdout-every",
            "2",
            "--max-evaluations",
            "10",
            "--workers",
            "1",
            "--name",
            "mine",
        ],
    )
    assert result.exit_code == 0, result.output
    profile = load_profile(out / "profile.yaml")
    assert profile.name == "mine" and math.isfinite(profile.fit_mape)
    figures = pd.read_csv(out / "figures.csv")
    assert sorted(figures["split"].unique()) == ["test", "train"] and len(figures) == 8
    assert {"measured", "predicted_base", "predicted_fitted"} <= set(figures.columns)
    assert "held-out MAPE" in result.output and "over 2 runs" in result.output
    # off a terminal, a line per replay of the train runs, out of the budget
    replays = [line for line in result.stderr.splitlines() if line.startswith("fitting to 2 runs: replays ")]
    assert replays and replays[0] == "fitting to 2 runs: replays 1/10" and len(replays) <= 10
    too_few = CliRunner().invoke(app, ["fit", str(runs_file), "--match", "latency 32/64"])
    assert too_few.exit_code == 2 and "a fit needs at least 2" in too_few.output
    every = CliRunner().invoke(
        app, ["fit", str(runs_file), "--out", str(tmp_path / "one"), "--holdout-every", "1"]
    )
    assert every.exit_code == 2 and "n >= 2" in every.output and not (tmp_path / "one").exists()
    none = CliRunner().invoke(
        app,
        [
            "fit",
            str(runs_file),
            "--out",
            str(tmp_path / "none"),
            "--holdout-every",
            "0",
            "--max-evaluations",
            "2",
            "--workers",
            "1",
        ],
    )
    assert none.exit_code == 0, none.output
    # a training error is not held out
    assert "training MAPE" in none.output and "held-out" not in none.output


def test_a_prior_holds_the_fit_near_the_defaults(truth_path):
    """With a strong pull toward the defaults, the weight-streaming efficiency that the runs would move to 0.6
    stays near the default 0.85; the figures then cannot all be matched."""
    runs = runs_measured_under(truth_path)
    held = fit_to_runs(runs, [], max_evaluations=40, prior=5.0)
    assert held.profile.gemm_memory.at(1) == pytest.approx(0.85, rel=0.05)
    assert held.profile.fit_mape > 3.0


def test_only_the_named_parameters_move(tmp_path):
    """Runs made by the defaults but for a weight-streaming efficiency of 0.6: fitting just that parameter finds
    it and leaves every other at its default; a name the fit does not know is refused with the allowed ones."""
    slow_streaming = tmp_path / "slow.yaml"
    slow_streaming.write_text(
        yaml.safe_dump(Profile(gemm_memory=EfficiencyCurve.constant(0.6)).model_dump(mode="json"))
    )
    runs = runs_measured_under(str(slow_streaming))
    result = fit_to_runs(runs[:2], [], max_evaluations=12, only=["gemm_memory"])
    assert result.profile.gemm_memory.at(1) == pytest.approx(0.6, rel=0.02)
    default = Profile()
    assert result.profile.model_dump(exclude={"gemm_memory", "fit_mape", "fits"}) == default.model_dump(
        exclude={"gemm_memory", "fit_mape", "fits"}
    )
    # the fit is recorded beside the defaults' own, so compare --split holds its runs' sources out
    assert result.profile.fits == (
        *default.fits,
        FitRecord(fields=("gemm_memory",), runs=tuple(run.label() for run in runs[:2])),
    )
    with pytest.raises(SpecError, match="--only moe: not a parameter; choose from gemm_compute"):
        fit_to_runs(runs[:2], [], only=["moe"])
    with pytest.raises(SpecError, match="cannot tell moe_compute apart"):
        fit_to_runs(runs[:2], [], only=["moe_compute"])  # dense runs say nothing of routed experts


def test_the_polish_moves_where_stepped_figures_stall_least_squares():
    """A replayed figure moves in steps (a request crossing a step boundary): here a residual flat over 10% of the
    parameter. The least-squares Jacobian's finite step sees no slope and stops at its start; the Nelder-Mead
    polish, whose simplex compares points ~10% apart, walks to the parameter that zeroes it."""
    import numpy as np
    from scipy.optimize import least_squares

    from servesim.calibration.fit_runs import _bounds, _polish, soft_l1

    target, best = math.log(0.3), [math.inf, None]

    def residuals(x):
        r = np.array([np.round((x[0] - target) / 0.1) * 0.1])
        if soft_l1(r) < best[0]:
            best[:] = [soft_l1(r), np.array(x)]
        return r

    start, names = np.array([math.log(0.9)]), ["gemm_memory"]
    stalled = least_squares(
        residuals, start, bounds=_bounds(names), loss="soft_l1", f_scale=0.1, diff_step=0.05
    )
    assert math.exp(stalled.x[0]) == pytest.approx(0.9)
    _polish(residuals, best[1], names, budget=60)
    assert best[0] == 0 and math.exp(best[1][0]) == pytest.approx(0.3, rel=0.11)


def test_a_gpu_fit_writes_that_gpus_section_and_leaves_the_shared_values(tmp_path):
    """Runs on an A100 made by the defaults but for a weight-streaming efficiency of 0.6 there: `fit --gpu` from
    the defaults finds 0.6 in the A100's section; the shared 0.85, and so every H100 prediction, stay."""
    slow_a100 = tmp_path / "slow.yaml"
    slow_a100.write_text(
        yaml.safe_dump(Profile(gpus={"a100-80gb": {"gemm_memory": 0.6}}).model_dump(mode="json"))
    )
    runs = runs_measured_under(str(slow_a100), gpu="a100-80gb")[:2]
    result = fit_to_runs(runs, [], max_evaluations=12, only=["gemm_memory"], gpu="a100-80gb")
    assert result.profile.for_gpu("a100-80gb").gemm_memory.at(1) == pytest.approx(0.6, rel=0.02)
    assert set(result.profile.gpus["a100-80gb"]) == {"gemm_memory"}
    assert result.profile.model_dump(exclude={"gpus", "fits"}) == Profile().model_dump(
        exclude={"gpus", "fits"}
    )
    assert result.profile.fits[-1].runs == tuple(run.label() for run in runs)
    assert result.mape < 1.0 and result.profile.fit_mape is None  # the section's error is not the profile's
    with pytest.raises(ValueError, match="a fit for h100-sxm was given runs on a100-80gb"):
        fit_to_runs(runs, [], gpu="h100-sxm")


def test_fit_cli_fits_one_gpus_section_of_a_base_profile(tmp_path):
    """`servesim fit --base P --gpu a100-80gb` fits only the A100 runs of a file that also holds H100 runs, into
    P's section for the A100; P's name, shared values and provenance stay, the section's fit is appended."""
    slow_a100 = tmp_path / "slow.yaml"
    slow_a100.write_text(
        yaml.safe_dump(Profile(gpus={"a100-80gb": {"gemm_memory": 0.6}}).model_dump(mode="json"))
    )
    runs = runs_measured_under(str(slow_a100), gpu="a100-80gb")[:2] + runs_measured_under(str(slow_a100))[:1]
    runs_file = tmp_path / "runs.yaml"
    runs_file.write_text(yaml.safe_dump([run.model_dump(mode="json", exclude_none=True) for run in runs]))
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump(Profile(name="mine", provenance="hand-made", comm=0.5).model_dump(mode="json"))
    )
    out = tmp_path / "fit"
    result = CliRunner().invoke(
        app,
        [
            "fit",
            str(runs_file),
            "--base",
            str(base),
            "--gpu",
            "a100-80gb",
            "--out",
            str(out),
            "--only",
            "gemm_memory",
            "--holdout-every",
            "0",
            "--max-evaluations",
            "12",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    fitted = load_profile(out / "profile.yaml")
    assert set(fitted.gpus) == {"a100-80gb"}
    assert fitted.for_gpu("a100-80gb").gemm_memory.at(1) == pytest.approx(0.6, rel=0.02)
    assert fitted.comm.at(1) == 0.5 and fitted.gemm_memory.at(1) == 0.85 and fitted.name == "mine"
    assert fitted.fits[-1].fields == ("gpus.a100-80gb.gemm_memory",)  # it prices that GPU's runs only
    assert fitted.provenance.startswith(
        f"hand-made; then gpus.a100-80gb fitted from it by servesim fit --base {base}: "
        "2 runs of runs.yaml on a100-80gb, 0 held out (training MAPE"
    )
    figures = pd.read_csv(out / "figures.csv")
    # A100 runs only
    assert len(figures) == 2 and {"predicted_base", "predicted_fitted"} <= set(figures.columns)
    assert "base (mine) profile" in result.output and "fitted profile on a100-80gb" in result.output
    bad = CliRunner().invoke(app, ["fit", str(runs_file), "--gpu", "a100", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "a100-80gb" in bad.output and not (tmp_path / "bad").exists()
    none = CliRunner().invoke(app, ["fit", str(runs_file), "--gpu", "h200", "--out", str(tmp_path / "none")])
    assert none.exit_code == 2 and "0 run(s) match on h200; a fit needs at least 2" in none.output


def test_a_shared_fit_from_a_base_whose_sections_hide_the_runs_gpus_is_refused(tmp_path):
    """A base with an h100-sxm section prices H100 runs by it: a shared fit would move nothing those runs see, so
    it is refused and pointed at --gpu. A base without provenance of its own is named by its path in the fit's."""
    runs_file = tmp_path / "runs.yaml"
    runs = runs_measured_under(str(_write_profile(tmp_path, Profile(), "truth.yaml")))[:2]
    runs_file.write_text(yaml.safe_dump([run.model_dump(mode="json", exclude_none=True) for run in runs]))
    sectioned = _write_profile(tmp_path, Profile(gpus={"h100-sxm": {"gemm_memory": 0.5}}), "sectioned.yaml")
    refused = CliRunner().invoke(
        app, ["fit", str(runs_file), "--base", str(sectioned), "--out", str(tmp_path / "x")]
    )
    assert refused.exit_code == 2 and "sections for h100-sxm override the shared values" in refused.output
    assert "--gpu NAME" in refused.output and not (tmp_path / "x").exists()
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\ncomm: 0.5\n")
    out = tmp_path / "fit"
    fitted = CliRunner().invoke(
        app,
        [
            "fit",
            str(runs_file),
            "--base",
            str(bare),
            "--out",
            str(out),
            "--only",
            "gemm_memory",
            "--holdout-every",
            "0",
            "--max-evaluations",
            "4",
            "--workers",
            "1",
        ],
    )
    assert fitted.exit_code == 0, fitted.output
    profile = load_profile(out / "profile.yaml")
    assert profile.name == "bare" and profile.provenance.startswith(f"profile {bare}; then fitted from it")


def _write_profile(folder, profile: Profile, name: str):
    path = folder / name
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    return path


def test_the_fit_knows_every_api_server_term_the_profile_has():
    """The profile's API-server fields and the terms the fit can free are one list: a field added to the profile
    without bounds here could never be fitted, and holdout would price runs by a term the fit ignores."""
    assert set(API_TERMS) == API_FIELDS
    assert API_FIELDS <= set(ZERO_STARTS)  # each defaults to 0, where a bounded fit could not move it
    for name, (low, high) in API_TERMS.items():
        assert 0 < low < high <= Profile.model_fields[name].metadata[-1].le, name


def _moe_runs(profile_path: str, engine: str = "vllm") -> list[MeasuredRun]:
    """gpt-oss-20b (MXFP4 experts) decode-bound latency runs on `engine` whose figures `profile_path` made."""
    runs = []
    for batch_size in (1, 8):
        template = MeasuredRun.model_validate(
            {
                "source": "synthetic",
                "engine": engine,
                "gpu": "h100-sxm",
                "model": "gpt-oss-20b",
                "benchmark": "latency",
                "batch_size": batch_size,
                "input_len": 128,
                "output_len": 32,
                "engine_args": {"max_model_len": 4096},
                "measured": {"latency_s": 1.0},
            }
        )
        made = {e.metric: e.predicted for e in replay(template, profile_path)}
        runs.append(template.model_copy(update={"measured": made}))
    return runs


def test_an_experts_fit_writes_that_dtypes_entry_and_leaves_the_shared_values(tmp_path):
    """Runs made by the defaults but for 60 us per MoE layer on MXFP4 experts: `fit --experts mxfp4 --only
    moe_layer_s` finds it in moe_kernels.mxfp4; the shared moe_layer_s stays 0. Runs of another expert dtype, or a
    fit with no routed-expert number, are refused."""
    made_by = tmp_path / "made.yaml"
    made_by.write_text(
        yaml.safe_dump(Profile(moe_kernels={"mxfp4": {"moe_layer_s": 6e-5}}).model_dump(mode="json"))
    )
    runs = _moe_runs(str(made_by))
    result = fit_to_runs(runs, [], max_evaluations=24, only=["moe_layer_s"], experts="mxfp4")
    entry = result.profile.moe_kernels["mxfp4"]
    assert set(entry) == {"moe_layer_s"} and entry["moe_layer_s"] == pytest.approx(6e-5, rel=0.03)
    assert result.profile.moe_layer_s == 0.0
    assert result.profile.model_dump(exclude={"moe_kernels", "fit_mape", "fits"}) == Profile().model_dump(
        exclude={"moe_kernels", "fit_mape", "fits"}
    )
    with pytest.raises(SpecError, match="--experts fp8: these runs' routed experts are not fp8: gpt-oss-20b"):
        fit_to_runs(runs, [], only=["moe_layer_s"], experts="fp8")
    with pytest.raises(SpecError, match="--experts mxfp4: no routed-expert number to fit"):
        fit_to_runs(runs, [], only=["step_overhead_s"], experts="mxfp4")


def test_an_experts_fit_of_a_gpu_section_starts_from_the_shared_entry(tmp_path):
    """A section's MXFP4 entry replaces the shared one whole, so a fit of its moe_layer_s keeps the shared entry's
    moe_memory beside it; a fit outside --experts that the entries would hide, and an unknown dtype, are refused."""
    shared = {"moe_memory": 0.8, "moe_layer_s": 6e-5}
    made_by = tmp_path / "made.yaml"
    own = {"moe_kernels": {"mxfp4": {"moe_memory": 0.8, "moe_layer_s": 9e-5}}}
    made_by.write_text(
        yaml.safe_dump(Profile(moe_kernels={"mxfp4": shared}, gpus={"h100-sxm": own}).model_dump(mode="json"))
    )
    runs, base = _moe_runs(str(made_by)), Profile(moe_kernels={"mxfp4": shared})
    result = fit_to_runs(
        runs, [], base, max_evaluations=24, only=["moe_layer_s"], gpu="h100-sxm", experts="mxfp4"
    )
    entry = result.profile.gpus["h100-sxm"]["moe_kernels"]["mxfp4"]
    assert entry["moe_memory"] == {"points": [[1.0, 0.8]]}
    assert entry["moe_layer_s"] == pytest.approx(9e-5, rel=0.03)
    assert result.profile.moe_kernels == base.moe_kernels
    with pytest.raises(
        SpecError, match="its moe_kernels entries for mxfp4 price .* fit with --experts mxfp4"
    ):
        fit_to_runs(runs, [], base, only=["moe_layer_s"])
    with pytest.raises(SpecError, match="--experts MXFP4: not a weight dtype; allowed: .*mxfp4"):
        fit_to_runs(runs, [], base, only=["moe_layer_s"], experts="MXFP4")


def test_an_engine_fit_writes_that_engines_section_and_prices_its_runs_only(tmp_path):
    """SGLang runs made with 90 us per MoE layer in SGLang's section (MXFP4 entry): `fit --engine sglang --experts
    mxfp4` finds it there, keeping the shared entry's moe_memory beside it and the shared entry itself; its record
    names the section's fields, and a vLLM run replays as under the base. Runs of another engine are refused."""
    shared = {"moe_memory": 0.8, "moe_layer_s": 6e-5}
    own = {"moe_kernels": {"mxfp4": {"moe_memory": 0.8, "moe_layer_s": 9e-5}}}
    made_by = tmp_path / "made.yaml"
    made_by.write_text(
        yaml.safe_dump(
            Profile(moe_kernels={"mxfp4": shared}, engines={"sglang": own}).model_dump(mode="json")
        )
    )
    runs, base = _moe_runs(str(made_by), engine="sglang"), Profile(moe_kernels={"mxfp4": shared})
    result = fit_to_runs(
        runs, [], base, max_evaluations=24, only=["moe_layer_s"], engine="sglang", experts="mxfp4"
    )
    entry = result.profile.engines["sglang"]["moe_kernels"]["mxfp4"]
    assert entry["moe_memory"] == {"points": [[1.0, 0.8]]}
    assert entry["moe_layer_s"] == pytest.approx(9e-5, rel=0.03)
    assert result.profile.moe_kernels == base.moe_kernels and result.profile.gpus == {}
    assert result.profile.fits[-1].fields == ("engines.sglang.moe_kernels.mxfp4.moe_layer_s",)
    vllm_run, paths = _moe_runs(str(made_by))[0], []
    for name, profile in (("fitted", result.profile), ("base", base)):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    replays = [[e.predicted for e in replay(vllm_run, str(path))] for path in paths]
    assert replays[0] == replays[1]
    with pytest.raises(ValueError, match="a fit for sglang was given runs of vllm"):
        fit_to_runs([vllm_run], [], base, only=["moe_layer_s"], engine="sglang", experts="mxfp4")
    # a section holding the entry fitted hides the fit from its runs: the engine's a shared fit, a GPU's an engine's
    with pytest.raises(SpecError, match="its sections for engine sglang override the shared values"):
        fit_to_runs(runs, [], result.profile, only=["moe_layer_s"], experts="mxfp4")
    on_h100 = base.with_section("gpus", "h100-sxm", own)
    with pytest.raises(SpecError, match="its sections for h100-sxm override the shared values"):
        fit_to_runs(runs, [], on_h100, only=["moe_layer_s"], engine="sglang", experts="mxfp4")
    other_dtype = base.with_section("gpus", "h100-sxm", {"moe_kernels": {"fp8": {"moe_layer_s": 1e-4}}})
    assert fit_to_runs(
        runs, [], other_dtype, max_evaluations=1, only=["moe_layer_s"], engine="sglang", experts="mxfp4"
    )


def test_an_engine_and_gpu_fit_writes_the_engines_section_for_that_gpu(tmp_path):
    """SGLang runs on an H100 made with 90 us per MoE layer in SGLang's own section for the H100: `fit --engine sglang
    --gpu h100-sxm` finds it there (engines.sglang.gpus.h100-sxm), over a GPU section that holds 60 us for every
    engine, and names its record so; an SGLang run elsewhere and a vLLM run on the H100 replay as under the base.
    That section then hides an engine-wide fit from these runs."""
    own = {"moe_kernels": {"mxfp4": {"moe_layer_s": 9e-5}}}
    made_by = tmp_path / "made.yaml"
    made_by.write_text(
        yaml.safe_dump(Profile(engines={"sglang": {"gpus": {"h100-sxm": own}}}).model_dump(mode="json"))
    )
    runs = _moe_runs(str(made_by), engine="sglang")
    base = Profile(gpus={"h100-sxm": {"moe_kernels": {"mxfp4": {"moe_layer_s": 6e-5}}}})
    result = fit_to_runs(
        runs,
        [],
        base,
        max_evaluations=24,
        only=["moe_layer_s"],
        engine="sglang",
        gpu="h100-sxm",
        experts="mxfp4",
    )
    nested = result.profile.engines["sglang"]["gpus"]["h100-sxm"]["moe_kernels"]["mxfp4"]
    assert nested["moe_layer_s"] == pytest.approx(9e-5, rel=0.03)
    assert result.profile.gpus == base.gpus
    assert result.profile.fits[-1].fields == ("engines.sglang.gpus.h100-sxm.moe_kernels.mxfp4.moe_layer_s",)
    paths = []
    for name, profile in (("fitted", result.profile), ("base", base)):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    elsewhere = runs[0].model_copy(update={"gpu": "h200"})
    for run in (_moe_runs(str(made_by))[0], elsewhere):
        assert [e.predicted for e in replay(run, str(paths[0]))] == [
            e.predicted for e in replay(run, str(paths[1]))
        ]
    with pytest.raises(SpecError, match="h100-sxm, engine sglang on h100-sxm override"):
        fit_to_runs(runs, [], result.profile, only=["moe_layer_s"], engine="sglang", experts="mxfp4")


def test_fit_cli_takes_several_runs_files_and_a_regular_expression(tmp_path):
    """Two runs files, a --match pattern picking one run of each, and --experts: the entry lands in the profile."""
    made_by = tmp_path / "made.yaml"
    made_by.write_text(
        yaml.safe_dump(Profile(moe_kernels={"mxfp4": {"moe_layer_s": 6e-5}}).model_dump(mode="json"))
    )
    files = []
    for i, run in enumerate(_moe_runs(str(made_by))):  # each beside a run the pattern leaves out
        files.append(tmp_path / f"runs{i}.yaml")
        other = run.model_copy(update={"input_len": 256})
        files[-1].write_text(
            yaml.safe_dump([r.model_dump(mode="json", exclude_none=True) for r in (run, other)])
        )
    out = tmp_path / "fit"
    args = [
        "fit",
        *map(str, files),
        "--match",
        "latency 128/32 batch (1|8)$",
        "--experts",
        "mxfp4",
        "--only",
        "moe_layer_s",
    ]
    result = CliRunner().invoke(
        app, [*args, "--out", str(out), "--holdout-every", "0", "--max-evaluations", "24", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    fitted = load_profile(out / "profile.yaml")
    assert fitted.moe_kernels["mxfp4"]["moe_layer_s"] == pytest.approx(6e-5, rel=0.03)
    assert "2 runs of runs0.yaml + runs1.yaml matching 'latency 128/32 batch (1|8)$'" in fitted.provenance
    assert "fitted profile for mxfp4 experts" in result.output
    bad = CliRunner().invoke(app, ["fit", str(files[0]), "--match", "(", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--match '(': not a regular expression" in bad.output
