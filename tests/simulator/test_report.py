"""HTML reports: self-contained, and drawn without script errors in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from servesim.hardware.errors import SpecError
from servesim.simulator.cli.main import app
from servesim.simulator.world.output import write_run
from servesim.simulator.report.run_report import (
    POOLS,
    _rate_unit,
    page,
    pool_of_steps,
    rooflines,
    write_report,
)
from servesim.simulator.report.charts import latency_cdfs
from servesim.simulator.world.run import simulate
from servesim.simulator.scenario import load_scenario
from servesim.simulator.planning.sweep import run_sweep
from tests.simulator.study_helpers import SCENARIOS, chat

ROOT = Path(__file__).resolve().parents[2]

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it with apt-get install chromium)"
)


def render(html: Path, tmp_path: Path) -> tuple[str, str, Path]:
    """Load `html` in headless chromium: (title after the scripts ran, the dumped DOM, a 1400x3000 screenshot)."""
    png = tmp_path / f"{html.stem}.png"
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            f"--screenshot={png}",
            "--window-size=1400,3000",
            "--virtual-time-budget=10000",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            html.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    console_errors = [
        line for line in done.stderr.splitlines() if "Uncaught" in line or "ERROR:CONSOLE" in line
    ]
    assert not console_errors, console_errors
    title = re.search(r"<title>(.*?)</title>", done.stdout).group(1)
    return title, done.stdout, png


def charts_with_svg(dom: str) -> int:
    """Chart containers whose markup holds a plotly SVG (each chart's div comes before the next one)."""
    parts = re.split(r'<div class="chart[^"]*" id="chart-\d+"', dom)[1:]
    return sum('class="main-svg"' in part.split('<div class="chart', 1)[0] for part in parts)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run") / "chat"
    return write_run(simulate(chat(workload={"num_requests": 150}), SCENARIOS), folder, SCENARIOS)


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep")
    grid = {"hardware.gpu": ["h100-sxm", "h200"], "workload.arrivals.rate_per_s": [5, 15, 30]}
    run_sweep(chat(workload={"num_requests": 150}), SCENARIOS, grid, folder, workers=1)
    return folder


def test_run_report_is_one_self_contained_file(run_folder, tmp_path):
    out = write_report(run_folder, tmp_path / "r.html")
    html = out.read_text()
    # plotly.js inline
    assert "<script src" not in html and "Plotly.newPlot" in html and len(html) > 3_000_000
    assert html.count('<div class="chart"') == 4 and "Configuration" in html and "llama-3.1-8b" in html
    assert not list(tmp_path.glob(".r.html.*"))  # written atomically: no temp file left


@needs_chromium
def test_run_report_draws_every_chart_in_a_browser(run_folder, tmp_path):
    out = write_report(run_folder, tmp_path / "run.html")
    title, dom, png = render(out, tmp_path)
    assert title == "servesim report: 4 charts drawn"
    assert charts_with_svg(dom) == 4
    assert png.stat().st_size > 20_000


@needs_chromium
def test_sweep_report_draws_load_curves_frontier_and_cost_pareto(sweep_folder, tmp_path):
    result = CliRunner().invoke(app, ["report", str(sweep_folder), "--out", str(tmp_path / "sweep.html")])
    assert result.exit_code == 0, result.output
    title, dom, png = render(tmp_path / "sweep.html", tmp_path)
    assert title == "servesim report: 3 charts drawn"  # latency vs load, throughput-latency, cost Pareto
    assert charts_with_svg(dom) == 3 and "Pareto frontier" in dom
    assert png.stat().st_size > 20_000


@needs_chromium
def test_a_script_error_shows_in_the_title(tmp_path):
    broken = page("broken", [], []).replace("</body>", "<script>notAFunction();</script></body>")
    (tmp_path / "broken.html").write_text(broken)
    with pytest.raises(AssertionError, match="Uncaught"):  # the console check catches it...
        render(tmp_path / "broken.html", tmp_path)
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'p'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            (tmp_path / "broken.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "servesim report: error: " in done.stdout  # ...and so does the title


def test_report_of_a_folder_without_results_is_one_clear_error(tmp_path):
    with pytest.raises(SpecError, match="not a run folder"):
        write_report(tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not a run folder" in result.stderr
    a_file = tmp_path / "notes.txt"  # a file given as the folder: said so, not taken for the output's place
    a_file.write_text("x")
    result = CliRunner().invoke(app, ["report", str(a_file)])
    assert result.exit_code == 2 and f"{a_file}: not a run folder" in result.stderr


def test_a_sweep_of_sessions_plots_its_load_in_sessions_per_second(sweep_folder, tmp_path):
    meta = yaml.safe_load((sweep_folder / "sweep.yaml").read_text())
    assert _rate_unit(meta) == "req/s"
    meta["scenario"]["workload"]["sessions"] = {
        "turns": {"kind": "fixed", "value": 2},
        "think_time_s": {"kind": "fixed", "value": 1.0},
        "new_message_tokens": {"kind": "fixed", "value": 20},
    }
    assert _rate_unit(meta) == "sessions/s"
    assert "offered rate (req\\u002fs)" in write_report(sweep_folder, tmp_path / "s.html").read_text()  # JSON


def test_a_damaged_folder_or_a_folder_as_the_output_gives_one_line(tmp_path):
    from typer.testing import CliRunner

    from servesim.simulator.cli.main import app

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "summary.json").write_text("{")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "half")])
    assert result.exit_code == 2 and "an incomplete or damaged output folder" in result.output
    s, base = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["workload.num_requests=20"])
    run = write_run(simulate(s, base), tmp_path / "cut", base, table_format="parquet")
    (run / "requests.parquet").write_bytes((run / "requests.parquet").read_bytes()[:100])  # a copy cut short
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "an incomplete or damaged output folder (ArrowInvalid" in result.output
    result = CliRunner().invoke(app, ["report", str(tmp_path / "half"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder; give a file name" in result.output


def test_latency_cdfs_are_over_completed_requests_as_the_summary_percentiles():
    """A request cut off by the stop after its first token has a TTFT, but the summary's TTFT percentiles leave it
    out: so does the chart."""
    requests = pd.DataFrame(
        {
            "ttft_s": [0.1, 0.2, 5.0],
            "tpot_s": [0.01, 0.02, np.nan],
            "e2el_s": [1.0, 2.0, np.nan],
            "finish_s": [1.0, 2.1, np.nan],
        }
    )
    ttft, tpot, e2el = latency_cdfs(requests).data
    assert list(ttft.x) == [100.0, 200.0] and list(ttft.y) == [0.5, 1.0]
    assert list(tpot.x) == [10.0, 20.0] and list(e2el.x) == [1000.0, 2000.0]


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml") if not p.stem.startswith("plan_"))
)
def test_no_executed_step_is_below_its_pools_roofline(name):
    """The report's roofline is a floor under every step of its pool: the lightest step's bytes (a MoE's routed
    experts only) at peak bandwidth, and the cheapest token's FLOPs at peak (fast prefill's), on the pool's own
    GPU, TP and PP (a P/D run's prefill and decode pools each their own)."""
    s, base = load_scenario(ROOT / "scenarios" / f"{name}.yaml", ["stop.max_sim_time_s=20"])
    result = simulate(s, base)
    scenario = result.scenario.model_dump(mode="json")
    lines, steps = rooflines(scenario), result.steps[result.steps["num_requests"] > 0]
    if s.stages:
        assert lines == {}  # a multi-stage run's stages serve models of their own
        return
    pools = pool_of_steps(scenario, steps)
    assert set(lines) == (set(POOLS) if s.disaggregation else {""}) and set(pools) <= set(lines)
    for pool, (floor_s, s_per_token) in lines.items():
        mine = steps[pools == pool]
        tokens = mine["prefill_tokens"] + mine["decode_tokens"]
        assert (mine["duration_s"] >= np.maximum(floor_s, s_per_token * tokens) * (1 - 1e-9)).all(), (
            name,
            pool,
        )


def _figures(html: str) -> list[dict]:
    data = re.search(r'<script type="application/json" id="figures">(.*?)</script>', html, re.S).group(1)
    return json.loads(data.replace("<\\/", "</"))


def _values(array) -> np.ndarray:
    """A trace's array as plotly writes it: a list, or typed binary ({"dtype", "bdata"} in base64)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
    return np.asarray(array)


def _titles(figures: list[dict]) -> list[str]:
    return [f["layout"]["title"]["text"] for f in figures]


def test_a_pd_runs_report_shows_each_pool_its_hand_offs_slo_limits_and_memory_plan(tmp_path):
    sets = ["workload.num_requests=40", "slo.ttft_ms=800", "slo.tpot_ms=60"]
    s, base = load_scenario(ROOT / "scenarios" / "pd_disaggregated_70b.yaml", sets)
    run = write_run(simulate(s, base), tmp_path / "run", base)
    html = write_report(run, tmp_path / "r.html").read_text()
    figures = _figures(html)
    names = {trace.get("name") for figure in figures for trace in figure["data"]}
    assert {"TTFT SLO", "TPOT SLO", "prefill pool roofline", "decode pool roofline"} <= names
    assert "E2E latency SLO" not in names  # no limit set
    slo = next(t for f in figures for t in f["data"] if t.get("name") == "TTFT SLO")
    assert _values(slo["x"]).tolist() == [800, 800]
    assert "Prefill-to-decode KV hand-offs" in _titles(figures)
    assert "Memory plan (per GPU)" in html and "weight_bytes" in html


def test_a_report_may_fetch_plotly_from_its_cdn_instead_of_inlining_it(run_folder, tmp_path):
    from plotly.offline import get_plotlyjs_version

    html = write_report(run_folder, tmp_path / "cdn.html", plotly="cdn").read_text()
    assert f'<script src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"' in html
    assert len(html) < 1_000_000 and "Plotly.newPlot" in html  # the drawing script, not the library
    result = CliRunner().invoke(
        app, ["report", str(run_folder), "--out", str(tmp_path / "x.html"), "--plotly", "web"]
    )
    assert result.exit_code == 2 and "--plotly 'web': choose from inline, cdn" in result.output


def test_prefix_cache_hits_are_drawn_over_time_when_there_are_any(tmp_path):
    s, base = load_scenario(ROOT / "scenarios" / "agent_prefix_sharing.yaml", ["workload.num_requests=300"])
    run = write_run(simulate(s, base), tmp_path / "run", base)
    figures = _figures(write_report(run, tmp_path / "r.html").read_text())
    hits = next(f for f in figures if f["layout"]["title"]["text"].startswith("Prefix-cache hits over time"))
    shares = _values(hits["data"][0]["y"])
    assert len(shares) and ((0 <= shares) & (shares <= 1)).all() and shares.max() > 0
