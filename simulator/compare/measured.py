"""Measured benchmark runs as scenarios, and the simulator's error against them.

A planner is worth what its predictions are. A `vllm bench serve` / `bench latency` / `bench throughput` run
(or SGLang's `bench_serving`) on fixed-length random prompts names its setup (GPU, model, TP, engine flags)
and its load (prompt count, concurrency or rate) exactly enough to be run again in simulation. A
`MeasuredRun` records one such run with its source; `scenario_for` rebuilds it, `compare` sets the
simulated summary against the measured figures (named as in the simulator's summary.json, which follows vLLM's
result keys except `duration_s` and `latency_s`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from servesim.hardware.errors import SpecError
from servesim.hardware.files import read_json, read_text, read_yaml
from servesim.hardware.gpu import GpuSpec, get_gpu
from servesim.hardware.model import get_model, resolve_weight_dtype
from servesim.hardware.spec_model import MAX_REPLICAS, SpecModel
from servesim.policies.families import SGLANG, EngineFamily, OfflineRun, families
from servesim.simulator.compare.guidellm import guidellm_results
from servesim.simulator.scenario import Scenario, apply_overrides, first_error

LATENCY = "latency_s"
# measured figure -> the simulator summary's key
SUMMARY_KEY = {
    "duration_s": "duration_s",
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "total_token_throughput": "total_token_throughput",
    **{
        f"{stat}_{metric}_ms": f"{stat}_{metric}_ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "p90", "p99")
    },
    LATENCY: "duration_s",  # bench latency: one batch from submission to its last token
}
MetricName = Literal[tuple(SUMMARY_KEY)]  # type: ignore[valid-type]
LOAD_FIELDS = {
    "latency": {"batch_size"},
    "throughput": {"num_prompts"},  # what each benchmark's flags set
    "serve": {"num_prompts", "max_concurrency", "request_rate"},
}


class EngineArgs(SpecModel):
    """The `vllm serve` flags a run states; unset ones take vLLM's defaults, as in the run."""

    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    scheduler_reserve_full_isl: bool | None = None
    async_scheduling: bool | None = None
    cuda_graph_sizes: list[int] | None = Field(
        None,
        min_length=1,
        description="The CUDA-graph sizes the run's engine captured (EngineConfig's field)",
    )
    cuda_graph_mode: Literal["full_and_piecewise", "full_decode_only"] | None = None
    cuda_graph_max_size: int | None = Field(
        None, ge=0, description="The largest CUDA graph (EngineConfig's field)"
    )
    scheduler_recv_interval: int | None = Field(
        None, ge=1, description="SGLang's --scheduler-recv-interval (EngineConfig's field)"
    )
    batch_wait_timeout_iters: int | None = Field(
        None, ge=0, description="TensorRT-LLM's batch_wait_timeout_iters (EngineConfig's field)"
    )
    batch_wait_max_tokens_ratio: float | None = Field(
        None, ge=0, le=1, description="TensorRT-LLM's batch_wait_max_tokens_ratio (EngineConfig's field)"
    )


class MeasuredRun(SpecModel):
    """One measured benchmark point: its setup, its load and the figures it reported, with their source."""

    source: str = Field(min_length=1, description="Where the figures were published (URL, repo@commit:path)")
    id: str | None = Field(None, description="A name that tells the run apart when its label alone would not")
    quote: str | None = Field(None, description="A line of the source holding some of the figures")
    notes: str | None = None
    engine: Literal["vllm", "sglang", "trtllm"] = Field(
        "vllm",
        description=(
            "sglang replays with SGLang's scheduler (prefill first, admission by estimated memory) and radix cache; "
            "trtllm with TensorRT-LLM's (whole prompts, whole sequences reserved) and its memory split"
        ),
    )
    engine_version: str | None = Field(
        None,
        description=(
            "The engine's release (0.11.0, 0.6.7.dev121 ...); None: a recent one. It decides how a rate's arrivals "
            "are paced"
        ),
    )
    gpu: str
    gpu_files: list[Path] = Field(
        default_factory=list,
        description=(
            "GPU catalog YAML files (`gpus:` lists) that define `gpu` when the bundled catalog does not; relative "
            "paths resolve against the runs file's folder"
        ),
    )
    tp: int = Field(1, ge=1)
    ep: bool = Field(False, description="MoE experts spread whole over the TP group (expert parallel)")
    dp_attention: bool = Field(
        False,
        description="Attention data parallel over the TP group (vLLM's DP ranks, SGLang's and TensorRT-LLM's DP)",
    )
    replicas: int = Field(
        1, ge=1, le=MAX_REPLICAS, description="Replicas of the engine behind a round-robin balancer"
    )
    model: str
    weight_dtype: str = "auto"
    kv_dtype: Literal["auto", "bf16", "fp16", "fp8"] = "auto"
    engine_args: EngineArgs = EngineArgs()
    benchmark: Literal["serve", "throughput", "latency"]
    dataset: Literal["random", "sharegpt"] = Field(
        "random",
        description=(
            "random: fixed lengths, replayed exactly; sharegpt: replayed at the run's mean lengths (its token totals "
            "over its prompts), so only its per-token figures (TPOT, ITL) are worth comparing"
        ),
    )
    input_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    prefix_len: int = Field(
        0,
        ge=0,
        description=(
            "vllm bench serve --random-prefix-len: tokens every prompt starts with, the same for all (it shares them "
            "through the prefix cache); input_len and input_lens count the rest"
        ),
    )
    input_lens: list[int] | None = Field(
        None,
        description=(
            "Each request's prompt tokens in the order the client sent them (`vllm bench serve --save-detailed`); "
            "given, the run replays them instead of input_len (then their mean)"
        ),
    )
    output_lens: list[int] | None = Field(None, description="Each request's output tokens, as input_lens")
    range_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description=(
            "The random dataset's --random-range-ratio as benchmark_serving.py drew it before vLLM 0.10 (and SGLang's "
            "bench_serving draws it): each prompt's and output's length uniform over the integers from "
            "max(int(len x ratio), 1) to len; 1: fixed lengths"
        ),
    )
    num_prompts: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)
    request_rate: float = Field(
        math.inf,
        gt=0,
        allow_inf_nan=True,
        description=(
            "Requests/s; inf: all at once. vLLM since 0.10.1 paces the arrivals so the last request leaves at "
            "num_prompts / rate; SGLang and older vLLM send a renewal process from t = 0"
        ),
    )
    burstiness: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=True,
        description=(
            "vLLM's --burstiness: gamma-distributed gaps of shape b, CV 1/sqrt(b); 1 is Poisson, inf evenly spaced"
        ),
    )
    client: Literal["engine", "guidellm"] = Field(
        "engine",
        description=(
            "The benchmark client: the engine's own (vllm bench serve, SGLang's bench_serving) or GuideLLM, whose "
            "rates are never paced"
        ),
    )
    batch_size: int | None = Field(None, ge=1, description="bench latency: prompts in the one batch")
    measured: dict[MetricName, float] = Field(min_length=1)  # type: ignore[valid-type]

    @field_validator("request_rate", mode="before")
    @classmethod
    def _inf(cls, value: Any) -> Any:
        return math.inf if isinstance(value, str) and value.strip().lower() == "inf" else value

    @field_validator("measured")
    @classmethod
    def _positive_figures(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [k for k, v in value.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"figures must be finite and positive: {', '.join(bad)}")
        return value

    @model_validator(mode="after")
    def _load_is_defined(self) -> MeasuredRun:
        if self.benchmark == "latency":
            if self.batch_size is None:
                raise ValueError("a latency benchmark needs batch_size")
        elif self.num_prompts is None:
            raise ValueError(f"a {self.benchmark} benchmark needs num_prompts")
        if self.max_concurrency is not None and math.isfinite(self.request_rate):
            raise ValueError(
                "a finite request_rate together with max_concurrency is not modelled "
                "(closed-loop clients send as soon as they are free)"
            )
        if (LATENCY in self.measured) != (self.benchmark == "latency"):
            raise ValueError("latency_s is the figure of latency benchmarks, and theirs only")
        given = {
            k
            for k, v in (
                ("num_prompts", self.num_prompts),
                ("batch_size", self.batch_size),
                ("max_concurrency", self.max_concurrency),
                ("request_rate", self.request_rate if math.isfinite(self.request_rate) else None),
            )
            if v is not None
        }
        foreign = sorted(given - LOAD_FIELDS[self.benchmark])
        if foreign:
            raise ValueError(f"a {self.benchmark} benchmark has no {', '.join(foreign)}")
        if self.output_len == 1 and any("tpot" in k or "itl" in k for k in self.measured):
            raise ValueError("one output token has no TPOT or ITL")
        per_request = (self.input_lens is None, self.output_lens is None)
        if per_request == (False, False):
            if not len(self.input_lens) == len(self.output_lens) == self.num_requests:
                raise ValueError(
                    f"input_lens and output_lens list one length per request ({self.num_requests}), not "
                    f"{len(self.input_lens)} and {len(self.output_lens)}"
                )
            if min(self.input_lens) < 1 or min(self.output_lens) < 1:
                raise ValueError("input_lens and output_lens are token counts of at least 1")
        elif per_request != (True, True):
            raise ValueError("input_lens and output_lens go together")
        if self.range_ratio < 1 and (self.input_lens is not None or self.dataset != "random"):
            raise ValueError("range_ratio draws the random dataset's lengths; per-request lengths need none")
        return self

    def shortest(self, length: int) -> int:
        """The shortest of the random dataset's lengths drawn up to `length` (SGLang draws an output of 0 tokens
        at ratio 0, which ends at once: taken as 1)."""
        return max(int(length * self.range_ratio), 1)

    @property
    def is_moe(self) -> bool:
        return get_model(self.model).moe is not None

    @property
    def expert_dtype(self) -> str | None:
        """The dtype its routed experts run in (None: a dense model)."""
        model = get_model(self.model)
        return resolve_weight_dtype(model, self.weight_dtype) if model.moe is not None else None

    @property
    def paced_arrivals(self) -> bool:
        """Whether the client scaled its gaps to end at num_prompts / rate: vLLM's bench serve since v0.10.1."""
        since = self.family.paced_client_since
        return self.client == "engine" and since is not None and self._since(since)

    @property
    def schedules_ahead(self) -> bool:
        """Whether the engine planned ahead (vLLM's async scheduling, SGLang's overlap scheduler): stated, else the
        default of its release."""
        stated = self.engine_args.async_scheduling
        if stated is not None:
            return stated
        return self._since(self.family.schedules_ahead_since)

    @property
    def gates_whole_prompt(self) -> bool:
        """Whether vLLM admitted a prompt only if all of it fit: stated, else the default of its release (SGLang's
        scheduler checks the whole prompt and its expected output anyway)."""
        stated = self.engine_args.scheduler_reserve_full_isl
        if stated is not None:
            return stated
        since = self.family.full_prompt_gate_since
        return since is not None and self._since(since)

    @property
    def family(self) -> EngineFamily:
        return families.get(self.engine)

    def _since(self, release: tuple[int, int, int]) -> bool:
        """Whether the run's release is `release` or later (no release stated: a recent one)."""
        version = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", self.engine_version or "")  # also "v0.11.0"
        return version is None or tuple(int(part or 0) for part in version.groups()) >= release

    @property
    def num_requests(self) -> int:
        return self.batch_size if self.benchmark == "latency" else self.num_prompts

    def label(self) -> str:
        """Model, GPU, TP, engine (when not vLLM), weight dtype (when set), benchmark, lengths and load; the id
        when given."""
        if self.id:
            return self.id
        load = (
            f"batch {self.batch_size}"
            if self.benchmark == "latency"
            else f"c={self.max_concurrency}"
            if self.max_concurrency
            else f"{self.request_rate:g} req/s"
            if math.isfinite(self.request_rate)
            else "all at once"
        )
        extras = [f"TP{self.tp}"] * (self.tp > 1) + ["EP"] * self.ep + ["DP-attention"] * self.dp_attention
        extras += [f"{self.replicas} replicas"] * (self.replicas > 1)
        extras += [self.engine] * (self.engine != MeasuredRun.model_fields["engine"].default)
        extras += [self.weight_dtype] * (self.weight_dtype not in ("auto", "bf16"))
        count = f" x{self.num_prompts}" if self.benchmark != "latency" else ""
        mean = "~" if self.input_lens is not None else ""  # per-request lengths: their means
        lengths = f"{mean}{self.input_len}/{mean}{self.output_len}"
        if self.range_ratio < 1:
            low_in, low_out = (self.shortest(n) for n in (self.input_len, self.output_len))
            lengths = f"{low_in}-{self.input_len}/{low_out}-{self.output_len}"
        if self.prefix_len:
            lengths = f"{self.prefix_len}+{lengths}"
        return " ".join([self.model, self.gpu, *extras, self.benchmark, lengths, load]) + count


def scenario_for(run: MeasuredRun, profile: str | None = None, seed: int = 0) -> Scenario:
    """The simulated twin of `run`: same model, GPU, TP, stated flags and load, vLLM's defaults otherwise;
    `profile` is a calibration profile's name or path (default: the cost model's documented defaults)."""
    args = run.engine_args
    engine: dict[str, Any] = {
        k: v
        for k, v in (
            ("max_num_seqs", args.max_num_seqs),
            ("max_num_batched_tokens", args.max_num_batched_tokens),
            ("max_model_len", args.max_model_len),
            ("gpu_memory_utilization", args.gpu_memory_utilization),
            ("enable_chunked_prefill", args.enable_chunked_prefill),
            ("cuda_graph_sizes", args.cuda_graph_sizes),
            ("cuda_graph_mode", args.cuda_graph_mode),
            ("cuda_graph_max_size", args.cuda_graph_max_size),
            ("scheduler_recv_interval", args.scheduler_recv_interval),
            ("batch_wait_timeout_iters", args.batch_wait_timeout_iters),
            ("batch_wait_max_tokens_ratio", args.batch_wait_max_tokens_ratio),
        )
        if v is not None
    }
    engine["weight_dtype"] = run.weight_dtype
    family = run.family
    if run.dp_attention and run.tp > 1 and family.defaults_per_rank:
        # `vllm serve --data-parallel-size N --max-num-seqs S` gives every rank S; a scenario states the group's
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            if key in engine:
                engine[key] *= run.tp
    engine["scheduler"] = family.scheduler
    if family.full_prompt_gate_since is not None:  # SGLang checks the whole prompt and its output anyway
        engine["scheduler_reserve_full_isl"] = run.gates_whole_prompt
    engine["async_scheduling"] = run.schedules_ahead
    if run.kv_dtype != "auto":
        engine["kv_dtype"] = run.kv_dtype
    engine["api_server"] = run.benchmark == "serve"  # bench latency / throughput hand the LLM class token ids
    try:
        gpu = get_gpu(run.gpu, tuple(run.gpu_files))
    except SpecError as err:
        raise SpecError(
            f"{run.source} ({run.label()}): {err}; a GPU of your own: the run's gpu_files or --gpu-file"
        ) from None
    # the offline benchmark's own limits (vLLM's LLM class: a larger budget; trtllm-bench: sized to the run), unless
    # stated
    offline = family.offline_batch_defaults(gpu, _offline_run(run, gpu)) if run.benchmark != "serve" else None
    if offline is not None:
        tokens, seqs = offline
        engine.setdefault("max_num_batched_tokens", tokens)
        cap = engine["max_num_batched_tokens"] if family.caps_slots_at_budget else seqs
        engine.setdefault("max_num_seqs", min(seqs, cap))
        if family.offline_pads_graphs and not {"cuda_graph_sizes", "cuda_graph_max_size"} & engine.keys():
            # trtllm-bench sizes its graphs by the batch it takes: the one stated only with the token budget too
            both = args.max_num_seqs is not None and args.max_num_batched_tokens is not None
            engine["cuda_graph_max_size"] = engine["max_num_seqs"] if both else seqs
    caching = family.prefix_caching
    caching_on = (
        args.enable_prefix_caching if args.enable_prefix_caching is not None else run.benchmark != "latency"
    )
    engine["prefix_caching"] = caching if caching_on else "none"  # bench latency turns it off by default
    lengths = (
        {
            "prompt": {"kind": "sequence", "values": run.input_lens},
            "output": {"kind": "sequence", "values": run.output_lens},
        }
        if run.input_lens is not None
        else {
            part: {"kind": "fixed", "value": length}
            if run.range_ratio == 1
            else {"kind": "uniform", "low": run.shortest(length), "high": length}
            for part, length in (("prompt", run.input_len), ("output", run.output_len))
        }
    )
    workload: dict[str, Any] = {"lengths": lengths, "num_requests": run.num_requests}
    if run.prefix_len:
        workload["shared_prefix"] = {"num_prefixes": 1, "prefix_tokens": run.prefix_len}
    if run.max_concurrency is not None:
        workload |= {"closed_loop": {"clients": run.max_concurrency}, "arrivals": {"kind": "all_at_once"}}
    elif math.isfinite(run.request_rate):
        process = (
            {"kind": "constant"}
            if math.isinf(run.burstiness)
            else {"kind": "poisson"}
            if run.burstiness == 1.0
            else {"kind": "gamma", "cv": run.burstiness**-0.5}
        )
        workload["arrivals"] = process | {"rate_per_s": run.request_rate, "paced": run.paced_arrivals}
    else:
        workload["arrivals"] = {"kind": "all_at_once"}
    hardware = {"gpu": run.gpu, "gpu_files": [str(f) for f in run.gpu_files]}
    if profile:
        hardware["profile"] = profile
    raw = {
        "name": "measured",
        "seed": seed,
        "model": run.model,
        "hardware": hardware,
        "parallelism": {"tp": run.tp, "ep": run.ep, "dp_attention": run.dp_attention},
        "cluster": {"replicas": run.replicas, "router": "round_robin"},
        "engine": engine,
        "workload": workload,
    }
    try:
        return Scenario.model_validate(raw)
    except ValidationError as err:
        raise first_error(err, f"{run.source} ({run.label()})", Scenario) from None


def _offline_run(run: MeasuredRun, gpu: GpuSpec) -> OfflineRun:
    """What the run's offline benchmark knew when it sized the engine."""
    model = get_model(run.model)
    stated = run.engine_args.gpu_memory_utilization
    return OfflineRun(
        model=model,
        tp=run.tp,
        pp=1,
        input_len=run.input_len,
        output_len=run.output_len,
        weight_dtype=resolve_weight_dtype(model, run.weight_dtype),
        kv_dtype=run.kv_dtype,
        memory_share=stated if stated is not None else run.family.memory_share(gpu, 0, run.tp, 1, False),
        chunked_prefill=bool(run.engine_args.enable_chunked_prefill),
    )


@dataclass(frozen=True)
class MetricError:
    metric: str
    measured: float
    predicted: float

    @property
    def error_pct(self) -> float:
        """Signed: positive when the simulator predicts more (slower latencies, higher throughputs)."""
        return (self.predicted - self.measured) / self.measured * 100  # measured figures are positive


def compare(run: MeasuredRun, summary: dict[str, float]) -> list[MetricError]:
    return [
        MetricError(metric, value, float(summary[SUMMARY_KEY[metric]]))
        for metric, value in run.measured.items()
    ]


@dataclass(frozen=True)
class Replayed:
    errors: list[MetricError]
    preemptions: int  # the simulated twin's: a measured run that preempted less may have had more KV


def replay_run(run: MeasuredRun, profile: str | None = None) -> Replayed:
    """Simulate `run`'s twin and compare it with what was measured. A twin that does not finish every request
    (the engine refuses one, e.g. too long for max_model_len) or has no value for a figure is an error: its
    figures would not describe the measured run."""
    from servesim.simulator.world.run import simulate  # the engine world is only needed here

    result = simulate(scenario_for(run, profile), Path.cwd())
    if result.summary["completed"] != run.num_requests:
        reasons = result.requests["reject_reason"].dropna().unique().tolist()
        raise SpecError(
            f"{run.source} ({run.label()}): the simulated engine finished "
            f"{result.summary['completed']} of {run.num_requests} requests"
            + (f"; it rejected some: {reasons[0]}" if reasons else "")
        )
    errors = compare(run, result.summary)
    missing = [e.metric for e in errors if not (math.isfinite(e.predicted) and e.predicted > 0)]
    if missing:
        raise SpecError(
            f"{run.source} ({run.label()}): the simulation gives no value for {', '.join(missing)}"
        )
    return Replayed(errors, int(result.summary["preemptions"]))


def replay(run: MeasuredRun, profile: str | None = None) -> list[MetricError]:
    return replay_run(run, profile).errors


# `vllm bench serve --save-result` JSON key -> MeasuredRun figure (the others keep their names)
VLLM_RESULT_FIGURES = {
    "duration": "duration_s",
    "request_throughput": "request_throughput",
    "output_throughput": "output_throughput",
    "total_token_throughput": "total_token_throughput",
    **{k: k for k in SUMMARY_KEY if k.endswith("_ms")},
}
# SGLang bench_serving's JSONL key -> MeasuredRun figure (its e2e latencies, and total_throughput since 0.4)
SGLANG_RESULT_FIGURES = {
    **VLLM_RESULT_FIGURES,
    "total_throughput": "total_token_throughput",
    **{f"{stat}_e2e_latency_ms": f"{stat}_e2el_ms" for stat in ("mean", "median", "p99")},
}
# a random-dataset prompt re-tokenizes a few tokens off its nominal length
LENGTH_SPREAD, LENGTH_SLACK = (
    0.05,
    4,
)


def _lengths(lengths: Any, given: int | None, what: str, source: str) -> tuple[int, list[int] | None]:
    """The run's `what` length and, when the requests' differ, each one's: the length given, else the per-request
    lengths' mean, alone if they agree within 5% (or 4 tokens: a random-dataset prompt re-tokenizes a few off)."""
    if given is not None:
        return given, None
    if not lengths:
        raise SpecError(
            f"{source}: no per-request {what} lengths (run vllm bench serve with --save-detailed), "
            f"so give it: --set {what}_len=N"
        )
    if not isinstance(lengths, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in lengths
    ):
        raise SpecError(f"{source}: {what}_lens must be a list of token counts")
    mean = sum(lengths) / len(lengths)
    varied = max(lengths) - min(lengths) > max(LENGTH_SPREAD * mean, LENGTH_SLACK)
    return max(round(mean), 1), lengths if varied else None


def run_from_vllm_result(path: Path, setup: dict[str, Any]) -> MeasuredRun:
    """A `vllm bench serve --save-result` JSON as a measured run. The JSON records the load and the figures;
    `setup` adds what it does not: model (a preset), gpu, tp, dtypes, engine_args, and input_len/output_len
    when it holds no per-request lengths."""
    data = read_json(path, "vllm bench result")
    if not isinstance(data, dict) or "num_prompts" not in data:
        raise SpecError(f"{path}: not a vllm bench serve result (no num_prompts)")
    if data.get("ramp_up_strategy"):
        raise SpecError(f"{path}: a --ramp-up-strategy run's rate changes over time; only fixed rates replay")
    _refuse_failures(data, str(path), data["num_prompts"])
    load = {"num_prompts": data["num_prompts"], "burstiness": data.get("burstiness") or 1.0}
    return _served_run(data, str(path), VLLM_RESULT_FIGURES, load, setup)


def _refuse_failures(data: dict[str, Any], source: str, sent: Any) -> None:
    """A run some of whose requests failed is not replayed: its figures cover the others, its duration all. Older
    `vllm bench serve` files and SGLang's have no `failed` count: fewer completed than sent, or an error message
    in the detailed `errors` list, tell."""
    errors, completed = data.get("errors"), data.get("completed")
    failed = data.get("failed") or 0
    if not failed and isinstance(errors, list):
        failed = sum(1 for e in errors if isinstance(e, str) and e.strip())
    counted = "failed" in data  # a file that counts its failures may send fewer than num_prompts (ShareGPT)
    if (
        not counted
        and not failed
        and isinstance(sent, int)
        and isinstance(completed, int)
        and completed < sent
    ):
        failed = sent - completed
    if failed:
        raise SpecError(f"{source}: {failed} request(s) failed, and the figures cover only the others")


def runs_from_sglang_results(path: Path, setup: dict[str, Any]) -> list[MeasuredRun]:
    """Each line of an SGLang `bench_serving --output-file` JSONL (one run per line, against an SGLang server) as
    a measured run; `setup` as for run_from_vllm_result. Its client sends a Poisson process from t = 0."""
    lines = [line for line in read_text(path, "sglang bench_serving output").splitlines() if line.strip()]
    runs = []
    for number, line in enumerate(lines, 1):
        source = f"{path}:{number}"
        try:
            data = json.loads(line)
        except ValueError as err:
            raise SpecError(f"{source}: not a JSON line ({str(err)[:60]})") from None
        if not isinstance(data, dict) or "completed" not in data:
            raise SpecError(f"{source}: not an sglang bench_serving result (no completed)")
        backend = str(data.get("backend", SGLANG.name))  # sglang, sglang-oai, ...: its client's backends
        if not backend.startswith(SGLANG.name):
            raise SpecError(
                f"{source}: a run against backend {backend!r}; only SGLang servers' runs replay from this file"
            )
        accept = data.get("accept_length")
        if isinstance(accept, (int, float)) and not isinstance(accept, bool):
            raise SpecError(
                f"{source}: the server ran speculative decoding (accept_length {accept:g}), which servesim does "
                "not model under SGLang; a replay without it would not be this run"
            )
        _refuse_failures(data, source, None)
        load, ratio = (
            {"num_prompts": data["completed"], "engine": SGLANG.name},
            data.get("random_range_ratio"),
        )
        drawn = (data.get("random_input_len"), data.get("random_output_len"))
        line_setup = setup
        if data.get("dataset_name") == "random" and "input_lens" not in data and all(drawn):
            if ratio == 1:
                data |= {"input_lens": [drawn[0]], "output_lens": [drawn[1]]}
            elif (
                isinstance(ratio, (int, float)) and 0 <= ratio < 1
            ):  # lengths drawn, not saved: draw them alike
                load["range_ratio"] = ratio
                line_setup = {"input_len": drawn[0], "output_len": drawn[1], **setup}
        runs.append(_served_run(data, source, SGLANG_RESULT_FIGURES, load, line_setup))
    if not runs:
        raise SpecError(f"{path}: no results in it")
    return runs


def runs_from_guidellm_report(path: Path, setup: dict[str, Any]) -> list[MeasuredRun]:
    """Each benchmark of a GuideLLM report as a measured run (simulator/compare/guidellm.py reads it); `setup`
    as for run_from_vllm_result."""
    figures = {name: name for name in SUMMARY_KEY if name != LATENCY}
    return [
        _served_run(result, source, figures, load, setup) for source, result, load in guidellm_results(path)
    ]


RESULT_SUFFIXES = (".json", ".jsonl")


def runs_from_file(
    path: Path, model: str | None, gpu: str | None, tp: int, overrides: list[str]
) -> list[MeasuredRun]:
    """A runs YAML, or a benchmark client's result file served by `model` on `gpu` at `tp` (plus `overrides`, the
    MeasuredRun fields it does not record: field=value)."""
    if path.suffix not in RESULT_SUFFIXES:
        return load_measured_runs(path)
    if model is None or gpu is None:
        raise SpecError(f"{path}: a benchmark result does not say what served it: give --model and --gpu")
    return runs_from_result_file(path, apply_overrides({"model": model, "gpu": gpu, "tp": tp}, overrides))


def runs_from_result_file(path: Path, setup: dict[str, Any]) -> list[MeasuredRun]:
    """A benchmark client's result file as measured runs: SGLang bench_serving JSONL, a GuideLLM report (JSON with
    a benchmarks list) or a `vllm bench serve` result JSON."""
    if path.suffix == ".jsonl":
        return runs_from_sglang_results(path, setup)
    data = read_json(path, "benchmark result")
    if isinstance(data, dict) and "benchmarks" in data:
        return runs_from_guidellm_report(path, setup)
    return [run_from_vllm_result(path, setup)]


def _served_run(
    data: dict[str, Any], source: str, figures: dict[str, str], load: dict[str, Any], setup: dict[str, Any]
) -> MeasuredRun:
    """A serving benchmark's result as a measured run: its load, lengths (per request when they vary) and
    figures (`figures`: its key -> MeasuredRun's), with `setup` adding what it does not record."""
    setup = dict(setup)
    lengths, per_request = {}, {}
    prefix = setup.get("prefix_len", 0)  # a wrong one is refused by MeasuredRun's check
    saved = {"input": data.get("input_lens"), "output": data.get("output_lens")}
    given = isinstance(prefix, int) and not isinstance(prefix, bool) and prefix > 0
    # the client saves whole prompts: the shared prefix is apart
    if given and isinstance(saved["input"], list):
        if any(isinstance(n, int) and n <= prefix for n in saved["input"]):
            raise SpecError(
                f"{source}: prefix_len {prefix} is not shorter than every saved prompt (input_lens)"
            )
        saved["input"] = [n - prefix if isinstance(n, int) else n for n in saved["input"]]
    for what in ("input", "output"):
        lengths[what], per_request[what] = _lengths(saved[what], setup.pop(f"{what}_len", None), what, source)
    varied = [lens for lens in per_request.values() if lens is not None]
    if len(varied) == 1:  # the other is fixed: each request gets it
        per_request = {what: lens or [lengths[what]] * len(varied[0]) for what, lens in per_request.items()}
    measured = {
        figure: float(data[key])
        for key, figure in figures.items()
        if isinstance(data.get(key), (int, float)) and math.isfinite(data[key]) and data[key] > 0
    }
    if lengths["output"] == 1 and per_request["output"] is None:  # 0 for one-token answers' TPOT, ITL
        measured = {k: v for k, v in measured.items() if "tpot" not in k and "itl" not in k}
    fields = {
        "source": source,
        "benchmark": "serve",
        "max_concurrency": data.get("max_concurrency"),
        "request_rate": data.get("request_rate", "inf"),
        "input_len": lengths["input"],
        "output_len": lengths["output"],
        "input_lens": per_request["input"],
        "output_lens": per_request["output"],
        "measured": measured,
        **load,
        **setup,
    }
    try:
        return MeasuredRun.model_validate(fields)
    except ValidationError as err:
        raise first_error(err, source, MeasuredRun) from None


def load_measured_runs(path: Path) -> list[MeasuredRun]:
    """A YAML list of measured runs (see benchmarks/published_runs.yaml); errors name the file, entry and field."""
    raw = read_yaml(path, "measured-runs file")
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{path}: a measured-runs file is a non-empty YAML list of runs")
    runs, seen = [], {}
    for i, entry in enumerate(raw):
        try:
            run = MeasuredRun.model_validate(entry)
        except ValidationError as err:
            raise first_error(err, f"{path}: entry {i}", MeasuredRun) from None
        # beside the file
        run = run.model_copy(update={"gpu_files": [path.parent / f for f in run.gpu_files]})
        if run.label() in seen:
            raise SpecError(
                f"{path}: entries {seen[run.label()]} and {i} are both {run.label()!r}; give one an id"
            )
        seen[run.label()] = i
        runs.append(run)
    return runs


def distinct_files(paths: list[Path]) -> list[Path]:
    """`paths` without repeats of one file however it is named: a GPU file read twice clashes with itself."""
    return list({Path(f).resolve(): f for f in paths}.values())


def with_gpu_files(runs: list[MeasuredRun], gpu_files: list[Path]) -> list[MeasuredRun]:
    """`runs`, each also reading `gpu_files` (a CLI's --gpu-file) for its GPU, every file once."""
    if not gpu_files:
        return runs
    return [
        run.model_copy(update={"gpu_files": distinct_files([*gpu_files, *run.gpu_files])}) for run in runs
    ]


def select(runs: list[MeasuredRun], match: str | None) -> list[MeasuredRun]:
    """The runs whose label `match` finds, as a regular expression (all of them for None): plain text finds the
    labels that contain it."""
    if match is None:
        return runs
    try:
        pattern = re.compile(match)
    except re.error as err:
        raise SpecError(f"--match {match!r}: not a regular expression ({err})") from None
    return [run for run in runs if pattern.search(run.label())]
