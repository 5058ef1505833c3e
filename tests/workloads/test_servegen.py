"""ServeGen per-client models turned into requests: rates, PMF support, client selection, safety."""

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.workloads.servegen import servegen_requests


def expected_count(folder: Path, t0_s: float, t1_s: float) -> float:
    """Sum over clients with a dataset file of rate * 600 s over the windows in [t0_s, t1_s)."""
    total = 0.0
    for dataset in folder.glob("chunk-*-dataset.json"):
        trace = pd.read_csv(str(dataset).replace("dataset.json", "trace.csv"), header=None)
        inside = (trace[0] >= t0_s) & (trace[0] < t1_s)
        total += (trace.loc[inside, 1] * 600).sum()
    return total


def test_deepseek_r1_hour_matches_the_fitted_rates(traces_dir):
    folder = traces_dir / "servegen/reason/deepseek-r1"
    df = servegen_requests(folder, np.random.default_rng(0), duration_s=3600)
    assert len(df) == pytest.approx(expected_count(folder, 0, 3600), rel=0.03)
    assert df["arrival_s"].iloc[0] == 0 and df["arrival_s"].is_monotonic_increasing
    assert df["arrival_s"].iloc[-1] < 3600
    assert df["client_id"].nunique() > 10


def test_start_s_selects_a_later_part_of_the_day(traces_dir):
    folder = traces_dir / "servegen/reason/deepseek-r1"
    df = servegen_requests(folder, np.random.default_rng(0), duration_s=1800, start_s=43_200)
    assert len(df) == pytest.approx(expected_count(folder, 43_200, 45_000), rel=0.05)


def test_lengths_come_from_the_window_pmf(traces_dir):
    folder = traces_dir / "servegen/reason/deepseek-r1"
    df = servegen_requests(folder, np.random.default_rng(1), duration_s=3600, clients=[19])
    assert set(df["client_id"]) == {19}
    window = json.loads((folder / "chunk-19-dataset.json").read_text())["0"]
    assert set(df["num_prompt_tokens"]) <= set(ast.literal_eval(window["input_tokens"]))
    assert set(df["num_output_tokens"]) <= set(ast.literal_eval(window["output_tokens"]))


def test_listing_a_client_without_a_dataset_file_is_an_error(traces_dir):
    folder = traces_dir / "servegen/language/m-small"
    assert (folder / "chunk-1-trace.csv").is_file() and not (folder / "chunk-1-dataset.json").exists()
    with pytest.raises(ValueError, match=r"clients \[1\] lack"):
        servegen_requests(folder, np.random.default_rng(0), duration_s=600, clients=[1, 2])
    assert set(
        servegen_requests(folder, np.random.default_rng(0), duration_s=600, clients=[2])["client_id"]
    ) == {2}


def test_clients_left_out_for_want_of_lengths_are_named_with_their_share(tmp_path):
    """Client 4 promises 100/s over the first window (60,000 requests) against client 3's 2/s (1,200): 98% of the
    window's traffic cannot be generated, and the note says so."""
    folder = write_model(tmp_path / "model")
    df = servegen_requests(folder, np.random.default_rng(0), duration_s=600)
    assert set(df["client_id"]) == {3}
    assert df.attrs["notes"] == (
        f"{folder}: clients [4] have no chunk-<client>-dataset.json (their lengths) and are "
        "left out: 98% of the requests their trace files give this window",
    )
    with pytest.raises(ValueError, match=r"clients \[4\] lack"):
        servegen_requests(folder, np.random.default_rng(0), duration_s=600, clients=[3, 4])


def write_model(folder: Path, input_pmf: str = "{10: 0.5, 20: 0.5}") -> Path:
    """Two 600-s windows of one client (Gamma, then Weibull), and a client without a dataset file."""
    folder.mkdir()
    (folder / "chunk-3-trace.csv").write_text(
        "0,2.0,1.0,Gamma,1.0,0.5\n600,4.0,2.0,Weibull,0.5,1.0\n1200,0,0,,0,0\n"
    )
    (folder / "chunk-3-dataset.json").write_text(
        json.dumps({"0": {"input_tokens": input_pmf, "output_tokens": "{0: 0.25, 5: 0.75}"}})
    )
    (folder / "chunk-4-trace.csv").write_text("0,100.0,1.0,Gamma,1.0,0.01\n")
    return folder


def test_written_model_rates_lengths_and_zero_length_drops(tmp_path):
    folder = write_model(tmp_path / "model")
    counts = [
        len(servegen_requests(folder, np.random.default_rng(seed), duration_s=1800)) for seed in range(3)
    ]
    df = servegen_requests(folder, np.random.default_rng(0), duration_s=1800)
    kept, dropped = len(df), df.attrs["dropped"]
    # 2/s for 600 s + 4/s for 600 s = 3600 expected; a quarter sample 0 output tokens and are dropped
    assert kept + dropped == pytest.approx(3600, rel=0.1)
    assert dropped / (kept + dropped) == pytest.approx(0.25, abs=0.03)
    assert set(df["num_prompt_tokens"]) == {10, 20} and set(df["num_output_tokens"]) == {5}
    assert set(df["client_id"]) == {3}
    assert len(set(counts)) > 1  # different seeds, different draws


def test_same_seed_same_requests(tmp_path):
    folder = write_model(tmp_path / "model")
    a = servegen_requests(folder, np.random.default_rng(5), duration_s=1200)
    b = servegen_requests(folder, np.random.default_rng(5), duration_s=1200)
    pd.testing.assert_frame_equal(a, b)


def test_pmf_strings_are_literals_never_code(tmp_path):
    folder = write_model(tmp_path / "model", input_pmf="__import__('os').system('false')")
    with pytest.raises(ValueError, match="literal"):
        servegen_requests(folder, np.random.default_rng(0), duration_s=60)


@pytest.mark.parametrize(
    "trace,problem",
    [
        ("0,2.0,1.0,Gamma,0,0.5\n", "servegen window at 0 s: shape p1=0 must be > 0"),
        ("0,2.0,1.0,Lognorm,1.0,0.5\n", "servegen window at 0 s: unknown distribution 'Lognorm'"),
        ("", "not a servegen trace CSV"),
    ],
)
def test_a_bad_window_or_trace_file_is_named_in_the_error(tmp_path, trace, problem):
    folder = write_model(tmp_path / "model")
    (folder / "chunk-3-trace.csv").write_text(trace)
    with pytest.raises(ValueError, match=rf"chunk-3-trace\.csv: {problem}"):
        servegen_requests(folder, np.random.default_rng(0), duration_s=60, clients=[3])


def test_a_run_past_the_models_windows_or_before_its_first_traffic_says_so(tmp_path):
    folder = write_model(tmp_path / "model")  # client 3's windows end at 1800 s
    long = servegen_requests(folder, np.random.default_rng(0), duration_s=3600, clients=[3])
    assert any(
        "windows end at 1800 s, before start_s + duration_s = 3600 s" in n for n in long.attrs["notes"]
    )
    (folder / "chunk-3-trace.csv").write_text("0,0,0,,0,0\n600,0,0,,0,0\n1200,2.0,1.0,Gamma,1.0,0.5\n")
    late = servegen_requests(folder, np.random.default_rng(0), duration_s=1800, clients=[3])
    (note,) = late.attrs["notes"]
    assert "no client sends before 120" in note and "the run starts at that first arrival" in note
    assert late["arrival_s"].min() == 0.0
    quiet = servegen_requests(folder, np.random.default_rng(0), duration_s=600, start_s=1200, clients=[3])
    assert "notes" not in quiet.attrs


def test_missing_folder_and_unknown_client(tmp_path):
    with pytest.raises(ValueError, match="servegen folder not found"):
        servegen_requests(tmp_path / "none", np.random.default_rng(0), duration_s=60)
    folder = write_model(tmp_path / "model")
    with pytest.raises(ValueError, match=r"clients \[9\]"):
        servegen_requests(folder, np.random.default_rng(0), duration_s=60, clients=[9])


@pytest.mark.parametrize("kind,shape", [("Gamma", 0.05), ("Gamma", 4.0), ("Weibull", 0.4)])
def test_a_window_holds_its_fitted_rate_however_bursty(kind, shape):
    """Each 600-s window starts its renewal process in its steady state (the first arrival a uniform share of a
    length-biased gap in), so a window holds rate x 600 arrivals on average: starting one whole gap in, a
    Gamma window of shape 0.05 (cv 4.5) at 0.1/s held ~70 instead of 60."""
    from types import SimpleNamespace

    from servesim.workloads.servegen import WINDOW_S, _Gaps, _window_arrivals

    row = SimpleNamespace(p1=shape, rate_req_per_s=0.1, dist_name=kind, timestamp_s=0.0)
    rng = np.random.default_rng(7)
    counts = [len(_window_arrivals(0.0, _Gaps(row, rng, Path("t.csv")), 0.1)) for _ in range(3000)]
    assert np.mean(counts) == pytest.approx(0.1 * WINDOW_S, rel=0.05)


def test_clients_silent_in_the_window_are_named_as_such(traces_dir):
    from servesim.workloads.config import WorkloadConfig
    from servesim.workloads.generate import build_workload

    cfg = WorkloadConfig.model_validate(
        {
            "trace": {"path": "servegen/reason/deepseek-r1", "format": "servegen", "clients": [0]},
            "arrivals": {"kind": "trace"},
            "duration_s": 600,
        }
    )
    with pytest.raises(ValueError, match=r"no usable rows: its clients \(trace.clients\) send nothing"):
        build_workload(cfg, np.random.default_rng(0), traces_dir)
