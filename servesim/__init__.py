"""servesim's Python API: what the `servesim` command does, from Python. Load a scenario (with `--set`-style
overrides), simulate it, write its run folder and report, plan a deployment or find a deployment's capacity.

>>> from servesim import load_scenario, simulate
>>> scenario, folder = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=50"])
>>> result = simulate(scenario, folder)
>>> result.summary["completed"], round(result.summary["p90_ttft_ms"]) < 500
(50, True)
>>> sorted(result.requests.columns)[:3]
['arrival_s', 'cached_tokens', 'decode_hit_tokens']

The names here are the stable surface; the packages under them (hardware, workloads, policies, simulator,
calibration) are servesim's internals.
"""

from simulator.planning.capacity import max_sustainable_rate
from simulator.cli.app import version
from simulator.world.output import read_table, write_run
from simulator.planning.plan import plan
from simulator.report.run_report import write_report
from simulator.world.run import RunResult, simulate
from simulator.scenario import Scenario, load_scenario

__version__ = version()
__all__ = [
    "RunResult",
    "Scenario",
    "load_scenario",
    "max_sustainable_rate",
    "plan",
    "read_table",
    "simulate",
    "write_report",
    "write_run",
]
