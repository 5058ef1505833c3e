"""Every bundled scenario still writes the outputs recorded in tests/golden/outputs.json (refactors keep numbers;
`python -m tests.golden.outputs` records new ones when a change moves them on purpose)."""

import json
import math

import pytest

from tests.golden.outputs import GOLDEN, outputs, scenarios

RECORDED = json.loads(GOLDEN.read_text())


def _same(a, b) -> bool:
    """Equal, floats to 1e-9 relative (a result on another machine's numpy may round its last digit otherwise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    return a == b


def test_every_bundled_scenario_has_recorded_outputs():
    assert sorted(RECORDED) == [p.stem for p in scenarios()]


@pytest.mark.parametrize("path", scenarios(), ids=lambda p: p.stem)
def test_a_bundled_scenario_writes_its_recorded_outputs(path):
    found, recorded = outputs(path), RECORDED[path.stem]
    for part in recorded:
        assert _same(found[part], recorded[part]), (path.stem, part, found[part], recorded[part])
