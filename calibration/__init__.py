"""Calibration: a small real torch executor, step-time profiling, profile fitting and closed-loop validation.

The only package that imports torch (modules that need it import it at their top and are only
imported by the CLI commands; `scaled`, `fit`, `fit_terms` and `calibrate` are torch-free).

    scaled.py         scale_model / spec_to_config: small copies of catalog models (no torch)
    weights.py        seeded random weights, RMSNorm, RoPE, SwiGLU MLP, top-k MoE
    attn_metadata.py  packed-batch metadata, YOCO fast-prefill metadata, gather plans
    attention.py      paged attention over the KV pools (prefill SDPA, ragged decode)
    executor.py       Executor: one forward over a mixed prefill/decode batch, greedy sampling
    reference.py      plain full-attention forward, the executor's ground truth in tests
    serve.py          serve requests in wall-clock time with the simulator's scheduler and block manager
    device.py         honest timing, the CPU's measured peaks as a GPU-catalog entry
    profile_grid.py   the batch-shape grid and its timing -> DataFrame
    fit_terms.py      the cost model's per-step terms at efficiency 1 (no torch)
    fit.py            robust least-squares fit of a Profile (no torch)
    calibrate.py      rows -> fit report with default-vs-fitted MAPE -> profile YAML (no torch)
    fit_runs.py       fit a Profile to measured benchmark runs' figures by replaying them (no torch)
    validate.py       serve a trace, replay it in the simulator, compare per request
    pipeline.py       the jobs behind `servesim calibrate` and `servesim validate`
    gpu_lease.sh      one short GPU lease: calibrate + validate Llama-3.1-8B and Gemma-3n-E2B on CUDA
    lease_wheels.sh   fetch the wheels a lent GPU machine lacks (simpy, pydantic, plotly) into .whl/
"""
