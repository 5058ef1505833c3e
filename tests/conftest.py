"""The suite never reaches the Hugging Face Hub: a repo id not in the cache fails at once, as offline."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_sessionstart(session):
    """Compile the replica loop (simulator/world/compiled_engine.py) once before pytest-xdist starts its workers
    (its hook runs last), so they load it from numba's disk cache instead of each compiling it for ~40 s."""
    if hasattr(session.config, "workerinput"):
        return
    from servesim.simulator.world.compiled_run import warm_up

    warm_up()
