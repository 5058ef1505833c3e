"""WorkloadConfig validation: bad values and inconsistent combinations fail with a pydantic
ValidationError whose message says what to change."""

import pytest
import yaml
from pydantic import ValidationError

from servesim.workloads.config import WorkloadConfig

AZURE = {"format": "azure", "path": "traces/azure.csv"}
SHAREGPT = {"format": "sharegpt", "path": "sharegpt.csv"}
LENGTHS = {"prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 10}}


def make(**fields) -> WorkloadConfig:
    return WorkloadConfig.model_validate(fields)


def test_yaml_round_trip_of_every_kind():
    cfg = WorkloadConfig.model_validate(
        yaml.safe_load("""
        trace: {format: servegen, path: servegen/reason/deepseek-r1, clients: [0, 19]}
        arrivals: {kind: trace, time_scale: 0.5}
        duration_s: 600
    """)
    )
    assert cfg.trace.clients == (0, 19) and cfg.arrivals.time_scale == 0.5
    cfg = WorkloadConfig.model_validate(
        yaml.safe_load("""
        lengths:
          prompt: {kind: normal, mean: 1000, std: 300, min: 1, max: 4000}
          output: {kind: empirical, trace: {format: sharegpt, path: s.csv}, column: output}
        arrivals: {kind: gamma, rate_per_s: 3, cv: 4}
        num_requests: 100
        closed_loop: {clients: 8, think_time_s: {kind: lognormal, median: 2, sigma: 0.5}}
    """)
    )
    assert cfg.closed_loop.clients == 8 and cfg.lengths.output.column == "output"


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"lengths": LENGTHS, "arrivals": {"kind": "poisson", "rate_per_s": -1}, "num_requests": 5},
            "greater than 0",
        ),
        ({"lengths": LENGTHS, "arrivals": {"kind": "bursty", "rate_per_s": 1}, "num_requests": 5}, "bursty"),
        ({"lengths": LENGTHS, "arrivals": {"kind": "trace"}}, "needs `workload.trace`"),
        ({"trace": SHAREGPT, "arrivals": {"kind": "trace"}}, "has no timestamps"),
        ({"trace": AZURE, "arrivals": {"kind": "trace", "rate_per_s": 2, "time_scale": 2}}, "at most one"),
        ({"arrivals": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 5}, "needs lengths"),
        (
            {"lengths": LENGTHS, "arrivals": {"kind": "poisson", "rate_per_s": 1}},
            "num_requests or duration_s",
        ),
        ({"lengths": LENGTHS, "arrivals": {"kind": "all_at_once"}, "duration_s": 10}, "needs num_requests"),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "gamma", "rate_per_s": 1, "cv": 2, "paced": True},
                "duration_s": 10,
            },
            "paced gamma process ends at num_requests / rate_per_s",
        ),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "poisson", "rate_per_s": 1, "paced": True},
                "num_requests": 5,
                "duration_s": 10,
            },
            "needs num_requests and no duration_s",
        ),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "all_at_once"},
                "duration_s": 10,
                "closed_loop": {"clients": 4},
            },
            "num_requests",
        ),
        (
            {
                "trace": AZURE,
                "lengths": LENGTHS,
                "arrivals": {"kind": "poisson", "rate_per_s": 1},
                "num_requests": 5,
            },
            "trace is unused",
        ),
        ({"trace": {"format": "servegen", "path": "x"}, "arrivals": {"kind": "trace"}}, "needs duration_s"),
        (
            {"lengths": LENGTHS, "arrivals": {"kind": "all_at_once"}, "num_requests": 5, "skip_requests": 3},
            "no trace",
        ),
        (
            {"lengths": LENGTHS, "arrivals": {"kind": "all_at_once"}, "num_requests": 5, "num_request": 5},
            "Extra inputs are not permitted",
        ),
        ({"trace": dict(AZURE, clients=[1]), "arrivals": {"kind": "trace"}}, "servegen option"),
        ({"trace": dict(AZURE, drop_failed=False), "arrivals": {"kind": "trace"}}, "burstgpt option"),
        ({"trace": dict(AZURE, format="csv"), "arrivals": {"kind": "trace"}}, "format"),
        # sizes past what a run takes are refused before anything is drawn (a 7 TiB array before)
        (
            {"lengths": LENGTHS, "arrivals": {"kind": "poisson", "rate_per_s": 1}, "num_requests": 10**12},
            "less than or equal to 100000000",
        ),
        (
            {"lengths": LENGTHS, "arrivals": {"kind": "constant", "rate_per_s": 3}, "duration_s": 1e12},
            r"~3e\+12 of them, more than the 100,000,000 requests a run takes",
        ),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "poisson", "rate_per_s": float("inf")},
                "duration_s": 10,
            },
            "finite number",
        ),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "gamma", "rate_per_s": 1, "cv": 1e300},
                "num_requests": 5,
            },
            "less than or equal to 100",
        ),  # an OverflowError traceback when drawn
        # popularity tables are allocated up front: a billion prefixes or clusters was a MemoryError traceback
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 5,
                "shared_prefix": {"num_prefixes": 10**9, "prefix_tokens": 10},
            },
            "less than or equal to 10000000",
        ),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 5,
                "semantic_clusters": {"num_clusters": 10**9},
            },
            "less than or equal to 10000000",
        ),
        (
            {
                "lengths": LENGTHS,
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 5,
                "semantic_clusters": {"num_clusters": 10, "zipf_s": 1e30},
            },
            "less than or equal to 100",
        ),
    ],
)
def test_invalid_workloads(fields, message):
    with pytest.raises(ValidationError, match=message):
        make(**fields)


@pytest.mark.parametrize(
    "dist, message",
    [
        ({"kind": "uniform", "low": 10, "high": 5}, "swap"),
        ({"kind": "normal", "mean": 0, "std": 1, "min": 10, "max": 20}, "mass"),
        ({"kind": "normal", "mean": 0, "std": 1, "min": 2, "max": 1}, "must be < max"),
        ({"kind": "normal", "mean": 0, "std": 0}, "greater than 0"),
        ({"kind": "lognormal", "median": 0, "sigma": 1}, "greater than 0"),
        ({"kind": "fixed", "value": 0.2}, "below 1 token"),
        (
            {"kind": "empirical", "trace": {"format": "servegen", "path": "x"}, "column": "prompt"},
            "workload model",
        ),
        ({"kind": "empirical", "trace": SHAREGPT, "column": "input"}, "column"),
        # past 2^40 a length wrapped around int64 (a fixed 1e20 became -2^63 tokens) or numpy refused it
        ({"kind": "fixed", "value": 1e20}, "less than or equal to 1099511627776"),
        ({"kind": "uniform", "low": 1, "high": 1e30}, "less than or equal to 1099511627776"),
        ({"kind": "lognormal", "median": 1e300, "sigma": 1}, "less than or equal to 1099511627776"),
        ({"kind": "lognormal", "median": 100, "sigma": 11}, "less than or equal to 10"),
        ({"kind": "fixed", "value": float("inf")}, "finite number"),
    ],
)
def test_invalid_length_distributions(dist, message):
    with pytest.raises(ValidationError, match=message):
        make(
            lengths={"prompt": dist, "output": LENGTHS["output"]},
            arrivals={"kind": "all_at_once"},
            num_requests=1,
        )


@pytest.mark.parametrize(
    "think, message",
    [
        ({"kind": "normal", "mean": 1, "std": 1}, "min >= 0"),
        ({"kind": "empirical", "trace": SHAREGPT, "column": "output"}, "not seconds"),
    ],
)
def test_invalid_think_times(think, message):
    with pytest.raises(ValidationError, match=message):
        make(
            lengths=LENGTHS,
            arrivals={"kind": "all_at_once"},
            num_requests=4,
            closed_loop={"clients": 2, "think_time_s": think},
        )


def test_config_is_frozen():
    cfg = make(lengths=LENGTHS, arrivals={"kind": "all_at_once"}, num_requests=4)
    with pytest.raises(ValidationError):
        cfg.num_requests = 5


def test_every_field_documents_itself():
    from servesim.workloads import config

    models = [
        m
        for m in vars(config).values()
        if isinstance(m, type) and issubclass(m, config.SpecModel) and m is not config.SpecModel
    ]
    for model in models:
        for name, field in model.model_fields.items():
            assert name == "kind" or field.description, f"{model.__name__}.{name} has no description"
