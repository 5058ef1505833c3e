"""servesim's Python API: what the `servesim` command does, from Python. Load a scenario (with `--set`-style
overrides), simulate it, write its run folder and report, plan a deployment or find a deployment's capacity.

>>> from servesim import load_scenario, simulate
>>> scenario, folder = load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=50"])
>>> result = simulate(scenario, folder)
>>> result.summary["completed"], round(result.summary["p90_ttft_ms"]) < 500
(50, True)
>>> sorted(result.requests.columns)[:3]
['arrival_s', 'cached_tokens', 'decode_hit_tokens']

The names here are the stable surface; the packages under them (servesim.hardware, .workloads, .policies,
.simulator, .calibration) are servesim's internals. Each name is imported on first use, so importing one
internal module does not load the whole simulator.
"""

from importlib import import_module, metadata
from pathlib import Path

try:
    __version__ = metadata.version("servesim")
except metadata.PackageNotFoundError:
    # a source checkout run as it is (a lent GPU machine): no install maps the source folders to
    # servesim.hardware, ... (pyproject's package-dir), so the package looks for them beside itself
    __version__ = "0+checkout"
    __path__.append(str(Path(__file__).resolve().parent.parent))

#: each public name and the module that defines it
_EXPORTS = {
    "RunResult": "servesim.simulator.world.run",
    "Scenario": "servesim.simulator.scenario",
    "load_scenario": "servesim.simulator.scenario",
    "max_sustainable_rate": "servesim.simulator.planning.capacity",
    "plan": "servesim.simulator.planning.plan",
    "read_table": "servesim.simulator.world.output",
    "simulate": "servesim.simulator.world.run",
    "write_report": "servesim.simulator.report.run_report",
    "write_run": "servesim.simulator.world.output",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:  # an AttributeError lets `from servesim import hardware` import the subpackage
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
