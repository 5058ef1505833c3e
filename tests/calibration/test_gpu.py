"""The executor on a CUDA device (skipped without one): same answers as the reference, timed rows, a served trace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from servesim.calibration.executor import Executor
from servesim.calibration.profile_grid import GridSpec, grid_shapes, profile_grid
from servesim.calibration.reference import reference_logits
from servesim.calibration.serve import serve
from servesim.policies.config import EngineConfig
from tests.calibration.conftest import Blocks, Seq, step, tiny_spec
from servesim.workloads.request import Request

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "name,fast", [("llama", False), ("gemma2", False), ("gemma3n", True), ("mixtral", False)]
)
@pytest.mark.parametrize("dtype,rel", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_cuda_mixed_batch_matches_reference(name, fast, dtype, rel):
    ex = Executor(tiny_spec(name), 96, 4, "cuda", dtype=dtype, seed=1, kv_sharing_fast_prefill=fast)
    blocks = Blocks()
    rng = np.random.default_rng(0)
    a, b = Seq(rng.integers(0, 256, 13).tolist(), blocks), Seq(rng.integers(0, 256, 22).tolist(), blocks)
    a.tokens.append(int(step(ex, a.part(13, True))[0].argmax()))
    step(ex, b.part(7, False))
    got = step(ex, a.part(1, True), b.part(15, True))
    want = torch.stack([reference_logits(ex, s.tokens)[-1] for s in (a, b)])
    assert got.device.type == "cuda"
    assert (got - want).abs().max().item() < rel * want.abs().max().item()  # bf16: a few % of the logit range


def test_cuda_profile_rows_and_a_served_trace():
    ex = Executor(tiny_spec("gemma3n"), 512, 4, "cuda", seed=1)
    shapes = grid_shapes(GridSpec.quick())[:4]
    rows = profile_grid(ex, shapes, "gemma-3n-e2b", {"layers": 6}, repeats=3)
    assert (
        (rows["device"] == "cuda").all()
        and (rows["dtype"] == "bfloat16").all()
        and (rows["time_s"] > 0).all()
    )
    reqs = [
        Request(id=i, arrival_s=0.01 * i, num_prompt_tokens=20 + i, num_output_tokens=5) for i in range(8)
    ]
    # one block table per request: the executor was built without kv_windows
    cfg = {
        "block_size": 4,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 32,
        "max_model_len": 64,
        "prefix_caching": "none",
        "disable_hybrid_kv_cache_manager": True,
    }
    result = serve(ex, reqs, EngineConfig(**cfg))
    assert result.summary["completed"] == 8
