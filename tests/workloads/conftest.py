from pathlib import Path

import pytest

from tests.workloads.paths import SHARED_TRACES_DIR


@pytest.fixture
def traces_dir() -> Path:
    """The shared public traces; tests that need them skip when the folder is absent."""
    if not SHARED_TRACES_DIR.is_dir():
        pytest.skip(
            f"shared traces not found at {SHARED_TRACES_DIR} (a sibling of the repo: shared/data/traces)"
        )
    return SHARED_TRACES_DIR
