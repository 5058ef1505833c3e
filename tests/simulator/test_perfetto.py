"""`servesim export RUN --perfetto`: every step a slice on its replica's track, never overlapping there, and every
request an async slice whose phases match its times in requests.csv; P/D pools and pipeline stages by name."""

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.simulator.cli.main import app
from servesim.simulator.world.output import read_table

ROOT = Path(__file__).resolve().parents[2]
US = 1e6


def _export(tmp_path: Path, scenario: str, *sets: str) -> tuple[Path, dict]:
    run, trace = tmp_path / "run", tmp_path / "trace.json"
    overrides = [arg for s in sets for arg in ("--set", s)]
    result = CliRunner().invoke(
        app, ["simulate", str(ROOT / "scenarios" / scenario), "--out", str(run), *overrides]
    )
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["export", str(run), "--perfetto", str(trace)])
    assert result.exit_code == 0, result.output
    return run, json.loads(trace.read_text())


def _names(events: list[dict]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}


def _slices(events: list[dict]) -> dict[tuple, list[tuple[float, float, int]]]:
    """(request id, phase) -> its (begin, end, pid) pairs."""
    opened, found = {}, defaultdict(list)
    for e in events:
        if e.get("cat") != "request" or e["ph"] not in "be":
            continue
        key = (e["id"], e["name"], e["pid"])
        if e["ph"] == "b":
            assert key not in opened
            opened[key] = e["ts"]
        else:
            found[key[:2]].append((opened.pop(key), e["ts"], e["pid"]))
    assert not opened  # every begin has its end
    return found


def test_a_runs_steps_and_requests_are_on_the_timeline(tmp_path):
    run, trace = _export(tmp_path, "quickstart.yaml", "workload.num_requests=60", "cluster.replicas=2")
    events, steps, requests = trace["traceEvents"], read_table(run, "steps"), read_table(run, "requests")
    assert set(_names(events).values()) == {"replica 0", "replica 1"}
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(steps)
    assert sum(e["dur"] for e in slices) == pytest.approx(steps["duration_s"].sum() * US)
    assert sum(e["args"]["prefill_tokens"] for e in slices) == steps["prefill_tokens"].sum()
    for (pid, tid), track in pd.DataFrame(slices).groupby(["pid", "tid"]):
        track = track.sort_values("ts")  # a track's slices never overlap
        assert (
            track["ts"].iloc[1:].to_numpy() >= (track["ts"] + track["dur"]).iloc[:-1].to_numpy() - 1e-3
        ).all()
    phases = _slices(events)
    finished = requests[requests["finish_s"].notna()]
    assert len(finished) == 60
    for req in finished.itertuples():
        ((begin, end, pid),) = phases[(req.request_id, f"request {req.request_id}")]
        assert (begin, end, pid) == pytest.approx((req.arrival_s * US, req.finish_s * US, req.replica + 1))
        ((first, last, _),) = phases[(req.request_id, "decode")]
        assert (first, last) == pytest.approx((req.first_token_s * US, req.finish_s * US))


def test_pd_pools_are_named_and_a_request_prefills_on_one_and_decodes_on_the_other(tmp_path):
    run, trace = _export(tmp_path, "pd_disaggregated_70b.yaml", "workload.num_requests=20")
    names, requests = _names(trace["traceEvents"]), read_table(run, "requests")
    assert {"prefill 0", "decode 0"} <= set(names.values())
    phases = _slices(trace["traceEvents"])
    req = requests[requests["finish_s"].notna() & (requests["output_tokens"] > 1)].iloc[0]
    ((_, _, prefill_pid),) = phases[(req.request_id, "prefill")]
    ((_, _, decode_pid),) = phases[(req.request_id, "decode")]
    assert names[prefill_pid].startswith("prefill") and names[decode_pid].startswith("decode")


def test_a_rejected_request_is_an_instant_with_its_reason(tmp_path):
    run, trace = _export(tmp_path, "quickstart.yaml", "workload.num_requests=30", "engine.max_model_len=1024")
    rejected = read_table(run, "requests")["reject_reason"].notna().sum()
    instants = [e for e in trace["traceEvents"] if e["name"] == "rejected"]
    assert rejected > 0 and len(instants) == rejected
    assert all("max_model_len" in e["args"]["reason"] for e in instants)


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--perfetto", str(tmp_path / "t.json")])
    assert result.exit_code == 2 and "not a run folder" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "t.json").exists()
