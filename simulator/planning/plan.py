"""The planner: the cheapest deployment that sustains a target load within the scenario's SLOs.

1. Candidates: every GPU type x TP size x pipeline depth x MoE/MLA layout (expert parallel, DP attention)
   x combination of engine knobs (one replica configuration each).
2. Prune without simulating what cannot start: the engines would refuse its sharding ("cannot shard": TP that
   does not divide the heads, DeepEP over ranks the experts do not divide over), plan_memory refuses it ("does
   not fit"), TP larger than a node (pipeline stages may span nodes), or knobs that contradict each other
   ("invalid").
3. Size: the per-replica maximum sustainable rate (simulator/planning/capacity.py, one replica simulated)
   gives replicas = ceil(target / rate_per_replica), within max_replicas. Candidates are sized cheapest replica
   first, and each wave's sized deployments verified (step 4) before the next: a candidate whose one replica
   costs more than a deployment verified to pass is not sized ("costlier"), as it could not be chosen.
4. Verify: each sized deployment is simulated whole at the target rate (round-robin router). One that
   fails is retried with one more replica.
5. The recommendation is the cheapest verified deployment. It is simulated with one replica fewer, and the
   next-cheaper deployment of any candidate too: one that passes after all becomes the recommendation, so the
   answer is always a deployment that passes next to cheaper ones that fail, shown with their verdicts.

Costs are GPUs x the catalog's price per GPU-hour. Candidates come from CANDIDATE_BUILDERS: colocated
replicas and, for each of the scenario's `plan.pd_ratios`, prefill/decode-disaggregated xPyD units that
are sized, priced and verified as wholes; another deployment kind is one more builder there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servesim.hardware.errors import ShardingError, SpecError, choices
from servesim.hardware.gpu import get_gpu
from servesim.hardware.profile import best_validated_profile
from servesim.hardware.model import get_model
from servesim.policies.config import EngineConfig
from servesim.simulator.planning.capacity import (
    CapacityResult,
    Verdict,
    at_rate,
    judge,
    max_sustainable_rate,
    offered_rate,
)
from servesim.simulator.planning.executors import WorkerDied, run_jobs
from servesim.simulator.planning.launch import COMMANDS, launch_notes
from servesim.simulator.world.replicas import memory_plan
from servesim.simulator.world.run import simulate
from servesim.simulator.planning.pricing import cost_per_hour_usd, gpu_counts
from servesim.simulator.scenario import LAYOUT_FIELDS, Scenario, first_error, with_overrides

MAX_EXTRA_REPLICAS = 2  # verification retries with one more replica, this many times at most
MAX_DOWNGRADES = 8  # next-cheaper checks that may replace the recommendation
MAX_CANDIDATES = 10_000  # GPU x TP x PP x knob combinations; each is screened, most are simulated


@dataclass(frozen=True)
class Candidate:
    """One replica configuration: "colocated" (prefill and decode on each replica), or "pd": a unit of
    `ratio[0]` prefill and `ratio[1]` decode replicas (xPyD) that scales as a whole."""

    gpu: str
    tp: int
    knobs: tuple[tuple[str, Any], ...] = ()  # engine field -> value
    kind: str = "colocated"
    ratio: tuple[int, int] = (1, 1)
    pp: int = 1
    # parallelism.ep / dp_attention -> on or off, where the plan varies it
    layout: tuple[tuple[str, bool], ...] = ()

    @property
    def label(self) -> str:
        knobs = "".join(f" {k}={v}" for k, v in self.knobs)
        pd = f" {self.ratio[0]}P{self.ratio[1]}D" if self.kind == "pd" else ""
        pp = f" pp={self.pp}" if self.pp > 1 else ""
        layout = "".join(f" {name}" for name, on in self.layout if on)
        return f"{self.gpu} tp={self.tp}{pp}{layout}{pd}{knobs}"

    def scenario(self, base: Scenario, replicas: int = 1) -> Scenario:
        """`base` deployed as `replicas` of this candidate (round-robin, or P/D pools with the scenario's transfer,
        routers and pool engine knobs: least-outstanding and the defaults when it has none)."""
        overrides = (
            {"hardware.gpu": self.gpu, "parallelism.tp": self.tp, "parallelism.pp": self.pp}
            | {f"engine.{k}": v for k, v in self.knobs}
            | {f"parallelism.{name}": on for name, on in self.layout}
        )
        # the scenario's transfer and pools' engine knobs and routers kept, its GPU now ours
        if self.kind == "pd":
            d = base.disaggregation.model_dump() if base.disaggregation is not None else {}
            for pool, count in zip(("prefill", "decode"), self.ratio):
                d[pool] = d.get(pool, {}) | {
                    "replicas": count * replicas,
                    "gpu": None,
                    "tp": self.tp,
                    "pp": self.pp,
                    # the knobs planned over win over the pool's own, which would override them
                    "engine": (d.get(pool, {}).get("engine") or {}) | dict(self.knobs),
                }
            overrides |= {"cluster.replicas": 1, "disaggregation": d}
        else:  # colocated: a scenario's P/D pools are not this candidate's
            overrides |= {
                "cluster.replicas": replicas,
                "cluster.router": "round_robin",
                "disaggregation": None,
            }
        return with_overrides(base.run_settings(), overrides)


@dataclass
class Evaluation:
    """What the planner learned about one candidate: why it was rejected, or its size and price."""

    candidate: Candidate
    gpus_per_replica: int = 0
    price_per_replica_hour_usd: float = 0.0
    max_model_len: int = 0
    rejection: str | None = (
        None  # a reason code: cannot shard, does not fit, invalid, TTFT SLO, ..., too many
    )
    # replicas, costlier
    detail: str = ""
    capacity: CapacityResult | None = None
    replicas: int | None = None

    @property
    def can_start(self) -> bool:
        """It fits in memory with valid knobs (it may still miss the SLOs)."""
        return self.rejection not in ("cannot shard", "does not fit", "invalid")

    @property
    def rate_per_replica(self) -> float:
        return self.capacity.rate_per_s if self.capacity else 0.0

    @property
    def summary(self) -> str:
        """One line: what sizing made of the candidate."""
        if self.rejection is not None:
            return f"{self.candidate.label}: {self.rejection}"
        unit = self.capacity.unit if self.capacity else "req/s"
        return (
            f"{self.candidate.label}: {self.rate_per_replica:.3g} {unit} per replica, {self.replicas} replica(s) "
            f"({self.capacity.num_simulations if self.capacity else 0} simulations)"
        )

    def as_dict(self) -> dict:
        return {
            "candidate": self.candidate.label,
            "kind": self.candidate.kind,
            "gpu": self.candidate.gpu,
            "tp": self.candidate.tp,
            "pp": self.candidate.pp,
            "knobs": dict(self.candidate.knobs),
            **dict(self.candidate.layout),
            "gpus_per_replica": self.gpus_per_replica,
            "price_per_replica_hour_usd": self.price_per_replica_hour_usd,
            "rejected": self.rejection,
            "detail": self.detail,
            "rate_per_replica": self.rate_per_replica,
            "replicas": self.replicas,
            "capacity": self.capacity.as_dict() if self.capacity else None,
        }


@dataclass(frozen=True)
class Deployment:
    """A candidate times a replica count, simulated whole at the target rate."""

    evaluation: Evaluation
    replicas: int
    verdict: Verdict

    @property
    def cost_per_hour_usd(self) -> float:
        return self.replicas * self.evaluation.price_per_replica_hour_usd

    @property
    def cost_per_million_output_tokens_usd(self) -> float:
        """At the target rate in steady state: rate x output tokens per arrival (a request, a prompt of n
        samples, a session), not the finite run's throughput, whose drain tail after the last arrival would
        overstate the cost."""
        tokens_per_hour = self.verdict.rate_per_s * self.verdict.metrics["output_tokens_per_arrival"] * 3600
        return self.cost_per_hour_usd / tokens_per_hour * 1e6 if tokens_per_hour > 0 else math.inf

    @property
    def thin_margin(self) -> str | None:
        """For a passing deployment whose replicas each carry at least a rate at which one replica alone failed
        in sizing: why its whole run may pass anyway, and that one more replica is safer. None otherwise."""
        limit = self.evaluation.capacity.limit if self.evaluation.capacity else None
        per_replica = self.verdict.rate_per_s / self.replicas if self.verdict.rate_per_s else 0.0
        if not self.verdict.ok or limit is None or per_replica < limit.rate_per_s:
            return None
        unit = self.evaluation.capacity.unit
        return (
            f"each replica carries {per_replica:.3g} {unit}, where one replica alone failed in sizing "
            f"({', '.join(limit.reasons)} at {limit.rate_per_s:.3g} {unit}); the whole run passes, since "
            f"round-robin smooths each replica's arrivals and each sees 1/{self.replicas} of the requests, "
            "but with little margin: one more replica is safer"
        )

    @property
    def label(self) -> str:
        return f"{self.replicas} x {self.evaluation.candidate.label}"

    @property
    def summary(self) -> str:
        """One line: the verdict of the whole deployment and its price."""
        verdict = "ok" if self.verdict.ok else ", ".join(self.verdict.reasons)
        return f"{self.label} (${self.cost_per_hour_usd:.2f}/h): {verdict}"

    def as_dict(self) -> dict:
        return {
            "deployment": self.label,
            "candidate": self.evaluation.candidate.label,
            "replicas": self.replicas,
            **dict(self.evaluation.candidate.layout),
            "gpus": self.replicas * self.evaluation.gpus_per_replica,
            "cost_per_hour_usd": self.cost_per_hour_usd,
            "cost_per_million_output_tokens_usd": self.cost_per_million_output_tokens_usd,
            "thin_margin": self.thin_margin,
            "verdict": self.verdict.as_dict(),
        }


@dataclass
class ProfileCheck:
    """The recommendation and the next-cheaper deployment simulated again, at the target rate, under `profile`."""

    profile: str
    recommendation: Verdict
    next_cheaper: Verdict | None

    @property
    def num_simulations(self) -> int:
        return 1 + (self.next_cheaper is not None)

    @property
    def agrees(self) -> bool:
        """Whether the other profile picks the same deployment: the recommendation passes and the next cheaper
        still fails."""
        return self.recommendation.ok and not (self.next_cheaper is not None and self.next_cheaper.ok)

    def as_dict(self) -> dict:
        return {
            "profile": self.profile,
            "agrees": self.agrees,
            "recommendation": self.recommendation.as_dict(),
            "next_cheaper": self.next_cheaper.as_dict() if self.next_cheaper else None,
        }


@dataclass
class PlanResult:
    target_rate_per_s: float
    evaluations: list[Evaluation]
    deployments: list[Deployment]  # every whole-deployment simulation, in the order run
    recommendation: Deployment | None
    next_cheaper: Deployment | None
    commands: dict[str, Any] = field(default_factory=dict)
    num_simulations: int = 0
    pct: str = "p90"  # the SLO percentile's prefix in metric names: median, p90 or p99
    unit: str = "req/s"  # what the rates count (WorkloadConfig.rate_unit)
    slo: dict[str, Any] = field(default_factory=dict)  # the limits planned against
    profile: str = "default"  # the cost model's profile the plan priced steps with
    # the recommendation (and next cheaper) simulated again under another profile: how much the answer hangs on it
    profile_check: ProfileCheck | None = None

    def pareto(self, metric: str) -> list[Deployment]:
        """Passing deployments no other passing one beats on both cost/hour and `metric` (e.g. "p90_ttft_ms"),
        cheapest first."""
        ranked = sorted(
            (d for d in self.deployments if d.verdict.ok),
            key=lambda d: (d.cost_per_hour_usd, d.verdict.metrics[metric]),
        )
        frontier, best = [], math.inf
        for d in ranked:
            if d.verdict.metrics[metric] < best:
                frontier.append(d)
                best = d.verdict.metrics[metric]
        return frontier

    def as_dict(self) -> dict:
        pct = self.pct
        return {
            "target_rate_per_s": self.target_rate_per_s,
            "rate_unit": self.unit,
            "slo": self.slo,
            "profile": self.profile,
            "profile_check": self.profile_check.as_dict() if self.profile_check else None,
            "num_simulations": self.num_simulations,
            "recommendation": self.recommendation.as_dict() if self.recommendation else None,
            "next_cheaper": self.next_cheaper.as_dict() if self.next_cheaper else None,
            "commands": self.commands,
            "pareto_ttft": [d.as_dict() for d in self.pareto(f"{pct}_ttft_ms")],
            "pareto_tpot": [d.as_dict() for d in self.pareto(f"{pct}_tpot_ms")],
            "deployments": [d.as_dict() for d in self.deployments],
            "candidates": [e.as_dict() for e in self.evaluations],
        }


def colocated_candidates(
    s: Scenario, gpus: list[str], shapes: list[tuple[int, int, tuple]], knobs: dict[str, list]
) -> Iterator[Candidate]:
    """GPU x (TP, PP, layout) x every combination of engine knob values, in the order given."""
    for gpu, (tp, pp, layout), values in itertools.product(gpus, shapes, itertools.product(*knobs.values())):
        yield Candidate(gpu, tp, tuple(zip(knobs, values)), pp=pp, layout=layout)


def pd_candidates(
    s: Scenario, gpus: list[str], shapes: list[tuple[int, int, tuple]], knobs: dict[str, list]
) -> Iterator[Candidate]:
    """Prefill/decode disaggregated units, GPU x (TP, PP, layout) x xPyD ratio (the `plan.pd_ratios`) x knobs."""
    ratios = s.plan.pd_ratios if s.plan else []
    for gpu, (tp, pp, layout), ratio, values in itertools.product(
        gpus, shapes, ratios, itertools.product(*knobs.values())
    ):
        yield Candidate(
            gpu,
            tp,
            tuple(zip(knobs, values)),
            kind="pd",
            ratio=(int(ratio[0]), int(ratio[1])),
            pp=pp,
            layout=layout,
        )


def shapes_of(
    base: Scenario, tps: list[int], pps: list[int], layouts: dict[str, list[bool]]
) -> list[tuple[int, int, tuple[tuple[str, bool], ...]]]:
    """(TP, PP, layout) of every candidate, in the order given, each once: a layout that changes nothing at a
    size (DP attention or expert parallel on one GPU, expert parallel on a dense model) is the plain one."""
    moe = get_model(base.model).moe is not None
    shapes = []
    for tp, pp, values in itertools.product(tps, pps, itertools.product(*layouts.values())):
        layout = tuple((name, on and tp > 1 and (moe or name != "ep")) for name, on in zip(layouts, values))
        if (tp, pp, layout) not in shapes:
            shapes.append((tp, pp, layout))
    return shapes


# Each builder yields the candidates of one deployment kind.
CANDIDATE_BUILDERS: tuple[Callable[..., Iterator[Candidate]], ...] = (colocated_candidates, pd_candidates)


def evaluate(
    base: Scenario,
    base_dir: Path,
    candidate: Candidate,
    target_rate: float,
    max_replicas: int,
    rel_tol: float,
) -> Evaluation:
    """Prune, then size one candidate by its per-replica maximum sustainable rate."""
    ev = screen(base, candidate)
    return size(base, base_dir, ev, target_rate, max_replicas, rel_tol) if ev.rejection is None else ev


def screen(base: Scenario, candidate: Candidate) -> Evaluation:
    """Price one candidate and prune it if it cannot start (sharding, memory, knobs), without simulating."""
    ev = Evaluation(candidate)
    try:
        s = candidate.scenario(base)
        gpu = get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files))
        ev.gpus_per_replica = sum(gpu_counts(s).values())
        ev.price_per_replica_hour_usd = cost_per_hour_usd(s)
        if s.parallelism.tp > gpu.gpus_per_node:
            return _reject(
                ev, "does not fit", f"tp={s.parallelism.tp} > {gpu.gpus_per_node} GPUs per {gpu.name} node"
            )
        ev.max_model_len = memory_plan(s).max_model_len
    except ShardingError as err:
        return _reject(ev, "cannot shard", str(err))
    except SpecError as err:
        return _reject(ev, "does not fit", str(err))
    except ValidationError as err:
        return _reject(ev, "invalid", err.errors()[0]["msg"].removeprefix("Value error, "))
    return ev


def size(
    base: Scenario,
    base_dir: Path,
    ev: Evaluation,
    target_rate: float,
    max_replicas: int,
    rel_tol: float,
    settle: bool = True,
    bound_usd_per_hour: float = math.inf,
) -> Evaluation:
    """Size a screened candidate by its per-replica maximum sustainable rate. `settle`: bisect the replica count, not
    the rate (each rate tried is the target's share of a count between those the bracket leaves open) and stop once
    it is settled; the rate found is then the highest count's share that passed, a lower bound of the capacity.
    `bound_usd_per_hour`: what a deployment verified to pass costs; counts that cost more are not searched, and a
    candidate that needs one is rejected as "costlier"."""
    s = ev.candidate.scenario(base)
    price = ev.price_per_replica_hour_usd
    useful = max_replicas if math.isinf(bound_usd_per_hour) else whole_at_most(bound_usd_per_hour / price)
    useful = min(useful, max_replicas)

    def undecided(passing: float, failing: float) -> range:
        """Replica counts the bracket leaves open: more than those whose share of the target is known to fail,
        fewer than the passing rate's count."""
        return range(whole_at_most(target_rate / failing) + 1, replicas_for(target_rate, passing))

    def settled(passing: float, failing: float) -> bool:
        return not undecided(passing, failing)

    def middle_count(passing: float, failing: float) -> float:  # the rate of the middle open count
        counts = undecided(passing, failing)
        return target_rate / counts[len(counts) // 2]

    try:  # a replica slower than target / max_replicas is of no use: search no lower (nor higher x that)
        ev.capacity = max_sustainable_rate(
            s,
            base_dir,
            target_rate,
            rel_tol,
            max_factor=max_replicas,
            decided=settled if settle else None,
            split=middle_count if settle else None,
            min_factor=max(useful, 1),
        )
    except SpecError as err:
        return _reject(ev, "invalid", str(err))
    rate = ev.capacity.rate_per_s
    refused = rate == 0.0 and "rejected" in ev.capacity.limit.reasons
    if useful < max_replicas and not refused and (rate == 0.0 or replicas_for(target_rate, rate) > useful):
        more = useful + 1
        return _reject(
            ev,
            "costlier",
            f"needs more than {useful} replica(s): {more} cost ${more * price:.2f}/h, more than a deployment "
            f"that passes (${bound_usd_per_hour:.2f}/h)",
        )
    if rate == 0.0:
        limit = ev.capacity.limit
        # the root
        code = next((c for c in ("rejected", "unstable queue") if c in limit.reasons), limit.reasons[0])
        lowest = (
            " (target / max_replicas)" if math.isclose(limit.rate_per_s, target_rate / max_replicas) else ""
        )
        return _reject(
            ev,
            code,
            f"fails even at {limit.rate_per_s:.3g} {ev.capacity.unit} per replica{lowest}: "
            f"{'; '.join(limit.details)}",
        )
    ev.replicas = replicas_for(target_rate, ev.capacity.rate_per_s)
    if ev.replicas > max_replicas:
        return _reject(
            ev,
            "too many replicas",
            f"needs {ev.replicas} replicas at {ev.capacity.rate_per_s:.3g} "
            f"{ev.capacity.unit} each > max_replicas {max_replicas}",
        )
    return ev


def replicas_for(target_rate: float, rate_per_replica: float) -> int:
    """Replicas that carry `target_rate` at `rate_per_replica` each (non-increasing in the rate)."""
    return whole_at_least(target_rate / rate_per_replica)


def whole_at_least(ratio: float) -> int:
    """The fewest whole units covering `ratio`, a quotient of rates or prices: one a hair above a whole number
    (rounding) is that number."""
    return math.ceil(ratio - 1e-9)


def whole_at_most(ratio: float) -> int:
    """The most whole units within `ratio`: one a hair below a whole number (rounding) is that number."""
    return math.floor(ratio + 1e-9)


def _reject(ev: Evaluation, reason: str, detail: str) -> Evaluation:
    ev.rejection, ev.detail = reason, detail
    return ev


def verify(base: Scenario, base_dir: Path, ev: Evaluation, replicas: int, target_rate: float) -> Deployment:
    """Simulate the whole deployment at the target rate and judge it against the SLOs."""
    s = at_rate(ev.candidate.scenario(base, replicas), target_rate)
    return Deployment(
        ev, replicas, judge(simulate(s, base_dir, stop_when_slo_lost=True), base.slo, target_rate)
    )


def plan(
    base: Scenario,
    base_dir: Path,
    gpus: list[str] | None = None,
    tps: list[int] | None = None,
    knobs: dict[str, list] | None = None,
    max_replicas: int | None = None,
    target_rate: float | None = None,
    rel_tol: float = 0.05,
    workers: int = 1,
    pps: list[int] | None = None,
    layouts: dict[str, list[bool]] | None = None,
    on_progress: Callable[[str, int, int | None, str], None] | None = None,
    exhaustive: bool = False,
    check_profile: bool = True,
) -> PlanResult:
    """Find the cheapest deployment of `base`'s model and workload that meets its SLOs at the target rate.

    Unset arguments come from the scenario's `plan:` section, then from defaults (the scenario's GPU,
    TP 1/2/4/8, the scenario's pipeline depth and layout, 16 replicas, the workload's own rate). `layouts`:
    parallelism.ep and/or dp_attention -> the values to try. Candidate sizing and verification run on `workers`
    processes. `on_progress(stage, done, total, line)` hears of each candidate sized ("sized", of `total`) and each
    deployment verified ("verified", total None), with a line saying what came of it. `exhaustive` sizes even the
    candidates too costly to be chosen, each bisected to `rel_tol` though its replica count is settled sooner (the
    same recommendation, more simulations: for checking the shortcuts). `check_profile` simulates the
    recommendation and the next cheaper once more under another profile (`other_profile`): two runs that say
    whether the answer hangs on the cost model's numbers.
    """
    cfg = base.plan
    gpus = gpus or (cfg.gpus if cfg and cfg.gpus else [base.hardware.gpu])
    tps = tps or (cfg.tp if cfg else [1, 2, 4, 8])
    pps = pps or (cfg.pp if cfg and cfg.pp else [base.parallelism.pp])
    knobs = knobs if knobs is not None else (cfg.engine if cfg else {})
    chosen = (cfg.layouts() if cfg else {}) | (layouts or {})  # an option replaces only its own field
    layouts = {name: chosen[name] for name in LAYOUT_FIELDS if name in chosen}
    max_replicas = max_replicas or (cfg.max_replicas if cfg else 16)
    target = target_rate or (cfg.target_rate_per_s if cfg else None) or offered_rate(base, base_dir)
    _check_choices(base, gpus, tps, pps, knobs)
    shapes = shapes_of(base, tps, pps, layouts)
    candidates = [c for build in CANDIDATE_BUILDERS for c in build(base, gpus, shapes, knobs)]
    pct = "median" if base.slo.percentile == 50 else f"p{base.slo.percentile}"
    result = PlanResult(
        target,
        [screen(base, c) for c in candidates],
        [],
        None,
        None,
        pct=pct,
        unit=base.workload.rate_unit,
        slo=base.slo.model_dump(exclude_none=True),
        profile=str(base.hardware.profile or "default"),
    )
    ready = _size_cheapest_first(
        result, base, base_dir, max_replicas, rel_tol, workers, on_progress, exhaustive
    )
    invalid = {e.detail for e in result.evaluations if e.rejection == "invalid"}
    if len(invalid) == 1 and all(e.rejection == "invalid" for e in result.evaluations):
        raise SpecError(invalid.pop())  # the input's error, not the candidates': said once, nothing written
    _choose(result, base, base_dir, max_replicas, ready, on_progress)
    result.num_simulations = len(result.deployments) + sum(
        e.capacity.num_simulations for e in result.evaluations if e.capacity
    )
    if result.recommendation:
        s = result.recommendation.evaluation.candidate.scenario(base, result.recommendation.replicas)
        max_len = result.recommendation.evaluation.max_model_len
        result.commands = {
            **{family.name: command(s, max_len) for family, command in COMMANDS.items()},
            "replicas": result.recommendation.replicas,
            "notes": launch_notes(s),
        }
        if check_profile:
            result.profile_check = check_under_profile(result, base, base_dir, other_profile(result.profile))
            result.num_simulations += result.profile_check.num_simulations
    return result


def other_profile(profile: str) -> str:
    """The profile a plan is checked against: the best-validated bundled one, or the defaults when it is that."""
    best = best_validated_profile()
    return best if profile != best else "default"


def check_under_profile(result: PlanResult, base: Scenario, base_dir: Path, profile: str) -> ProfileCheck:
    """Simulate the recommendation and the next-cheaper deployment again under `profile` (two runs): whether the
    answer would change with the cost model's numbers."""
    other = with_overrides(base, {"hardware.profile": profile})
    again = [
        verify(other, base_dir, d.evaluation, d.replicas, result.target_rate_per_s).verdict if d else None
        for d in (result.recommendation, result.next_cheaper)
    ]
    return ProfileCheck(profile, *again)


def _check_choices(
    base: Scenario, gpus: list[str], tps: list[int], pps: list[int], knobs: dict[str, list]
) -> None:
    """Typos in GPU names, TP or PP sizes, knob fields or values stop the plan with one line instead of rejecting
    every candidate, as does a scenario a plan cannot scale."""
    if base.stages:
        raise SpecError(
            "stages: a plan scales replicas of one engine, not a multi-stage pipeline (its replicas are set per "
            "stage); size the pipeline with servesim capacity, or plan each stage's model as a scenario of its own"
        )
    for gpu in gpus:
        try:
            get_gpu(gpu, tuple(base.hardware.gpu_files))
        except SpecError as err:
            raise SpecError(f"plan GPUs (--gpus or plan.gpus): {err}") from None
    unknown = sorted(set(knobs) - set(EngineConfig.model_fields))
    if unknown:
        raise SpecError(
            f"unknown engine knob {unknown[0]!r}; knobs: "
            f"{choices(list(EngineConfig.model_fields), unknown[0], 'servesim schema')}"
        )
    sizes = [len(gpus), len(tps), len(pps), *(len(values) for values in knobs.values())]
    if math.prod(sizes) > MAX_CANDIDATES:  # each combination of knobs is checked, each candidate screened
        raise SpecError(
            f"plan: {' x '.join(map(str, sizes))} = {math.prod(sizes):,} GPU x TP x PP x knob "
            f"choices, more than the {MAX_CANDIDATES:,} a plan takes; try fewer values"
        )
    names, combos = list(knobs), list(itertools.product(*knobs.values()))
    # a value no combination can run stops the plan, instead of every candidate
    for i, knob in enumerate(names):
        for value in knobs[knob]:  # with it dropping out unseen (a combination that cannot run is pruned)
            problem = None
            for combo in (c for c in combos if c[i] == value):
                problem = _knob_problem(base, dict(zip(names, combo)), knob, value)
                if problem is None:
                    break
            if problem is not None:
                raise problem
    for name, sizes in (("TP", tps), ("PP", pps)):
        bad = [size for size in sizes if size < 1]
        if bad:
            raise SpecError(
                f"plan {name} sizes (--{name.lower()} or plan.{name.lower()}): {bad[0]} is not a GPU "
                "count (1 or more)"
            )


def _knob_problem(base: Scenario, knobs: dict[str, Any], knob: str, value: Any) -> SpecError | None:
    """Why `base` cannot run with the engine `knobs` (one line naming `knob`=`value`), or None."""
    try:
        with_overrides(base.run_settings(), {f"engine.{k}": v for k, v in knobs.items()})
    except ValidationError as err:
        return first_error(err, f"knob {knob}={value!r}", Scenario)
    except (SpecError, ValueError) as err:
        return SpecError(f"knob {knob}={value!r}: {err}")
    return None


def _size_cheapest_first(
    result: PlanResult,
    base: Scenario,
    base_dir: Path,
    max_replicas: int,
    rel_tol: float,
    workers: int,
    on_progress: Callable[[str, int, int | None, str], None] | None,
    exhaustive: bool = False,
) -> dict[tuple[int, int], Deployment]:
    """Size the candidates that can start, cheapest replica first, `workers` at a time, verifying each wave's sized
    deployments as it goes; a candidate whose single replica costs more than a deployment already verified to pass
    cannot be (or undercut) the recommendation, so it is not sized ("costlier"). Returns the verifications made,
    by (candidate index, replicas), for `_choose`, which makes the same choice an exhaustive search makes."""
    evaluations, ready = result.evaluations, {}
    order = sorted(
        (i for i, ev in enumerate(evaluations) if ev.rejection is None),
        key=lambda i: evaluations[i].price_per_replica_hour_usd,
    )
    total, done, bound = len(evaluations), sum(ev.rejection is not None for ev in evaluations), math.inf
    shown = 0  # verifications reported
    while order:
        wave = []
        while order and len(wave) < workers:
            i = order.pop(0)
            ev = evaluations[i]
            if ev.price_per_replica_hour_usd > bound and not exhaustive:
                _reject(
                    ev,
                    "costlier",
                    f"one replica costs ${ev.price_per_replica_hour_usd:.2f}/h, more than a "
                    f"deployment that passes (${bound:.2f}/h)",
                )
                done += 1
                if on_progress:
                    on_progress("sized", done, total, ev.summary)
            else:
                wave.append(i)
        jobs = [
            (
                base,
                base_dir,
                evaluations[i],
                result.target_rate_per_s,
                max_replicas,
                rel_tol,
                not exhaustive,
                math.inf if exhaustive else bound,
            )
            for i in wave
        ]

        def died(err: WorkerDied) -> None:
            raise SpecError(
                f"plan: the worker process sizing {evaluations[wave[err.index]].candidate.label} {err.how}"
            )

        for k, ev in run_jobs(size, jobs, "local", workers, on_died=died):
            evaluations[wave[k]] = ev
            done += 1
            if on_progress:
                on_progress("sized", done, total, ev.summary)
        verified = _verify_all(
            result,
            base,
            base_dir,
            max_replicas,
            workers,
            [i for i in wave if evaluations[i].rejection is None],
        )
        for deployment in verified.values() if on_progress else ():
            shown += 1
            on_progress("verified", shown, None, deployment.summary)
        ready |= verified
        bound = min([bound, *(d.cost_per_hour_usd for d in verified.values() if d.verdict.ok)])
    return ready


def _choose(
    result: PlanResult,
    base: Scenario,
    base_dir: Path,
    max_replicas: int,
    ready: dict[tuple[int, int], Deployment] | None = None,
    on_progress: Callable[[str, int, int | None, str], None] | None = None,
) -> None:
    """Verify every sized candidate (taking the verifications `ready`), pick the cheapest that passes, then confirm
    the next cheaper fails."""
    tried: dict[tuple[int, int], Deployment] = {}
    ready = dict(ready or {})
    shown = len(ready)  # verifications reported as they were made

    def check(i: int, replicas: int) -> Deployment:
        nonlocal shown
        if (i, replicas) not in tried:
            done = ready.pop((i, replicas), None)
            if done is None:
                done = verify(base, base_dir, result.evaluations[i], replicas, result.target_rate_per_s)
                shown += 1
                if on_progress:
                    on_progress("verified", shown, None, done.summary)
            tried[(i, replicas)] = done
            result.deployments.append(done)
        return tried[(i, replicas)]

    for i, ev in enumerate(result.evaluations):
        if ev.rejection is None:  # sized: verify, and if it fails try a replica or two more
            for n in range(ev.replicas, _most_tried(ev, max_replicas) + 1):
                if check(i, n).verdict.ok:
                    break
    passing = [d for d in tried.values() if d.verdict.ok]
    rec = min(passing, key=lambda d: _rank(d, result.pct)) if passing else None
    fits = [i for i, ev in enumerate(result.evaluations) if ev.can_start]
    for _ in range(MAX_DOWNGRADES if rec else 0):
        # the recommendation with one replica fewer (sizing one replica alone can overstate the count), then the
        # most expensive deployment of any candidate under its cost: the first that passes is the new one
        # by identity: verifications made on worker processes hold copies of their candidates
        own = next(i for (i, _), d in tried.items() if d is rec), rec.replicas - 1
        closest = _next_cheaper(result.evaluations, fits, rec.cost_per_hour_usd, max_replicas)
        nxt = None
        for cheaper in dict.fromkeys([own if own[1] >= 1 else None, closest]):
            if cheaper is not None:
                nxt = check(*cheaper)
                if nxt.verdict.ok:
                    break
        if nxt is None:
            break
        result.next_cheaper = nxt  # where both fail, the closer in cost to the recommendation
        if not nxt.verdict.ok:
            break
        rec, result.next_cheaper = nxt, None
    result.recommendation = rec


def _verify_all(
    result: PlanResult, base: Scenario, base_dir: Path, max_replicas: int, workers: int, indices: list[int]
) -> dict[tuple[int, int], Deployment]:
    """The verifications `_choose` starts with for the sized candidates `indices`, run on `workers` processes in
    rounds (each at its size, then one more replica for those that failed), by (candidate index, replicas);
    `_choose` takes them in its own order, so the plan is the same as one verified in a single process."""
    done: dict[tuple[int, int], Deployment] = {}
    pending = [(i, result.evaluations[i].replicas) for i in indices]
    for _ in range(MAX_EXTRA_REPLICAS + 1):
        jobs = [(base, base_dir, result.evaluations[i], n, result.target_rate_per_s) for i, n in pending]
        for k, deployment in run_jobs(verify, jobs, "local", max(workers, 1)):
            done[pending[k]] = deployment
        pending = [
            (i, n + 1)
            for i, n in pending
            if not done[(i, n)].verdict.ok and n + 1 <= _most_tried(result.evaluations[i], max_replicas)
        ]
    return done


def _most_tried(ev: Evaluation, max_replicas: int) -> int:
    """The most replicas a sized candidate is verified with: its size, then one more while it fails, twice at most."""
    return min(max_replicas, ev.replicas + MAX_EXTRA_REPLICAS)


def _rank(d: Deployment, pct: str) -> tuple:
    """Cheapest first; among equal costs the lower TTFT, then fewer GPUs per replica (simpler to run)."""
    ev = d.evaluation
    return d.cost_per_hour_usd, d.verdict.metrics[f"{pct}_ttft_ms"], ev.gpus_per_replica, ev.candidate.label


def _next_cheaper(
    evaluations: list[Evaluation], fits: list[int], cost: float, max_replicas: int
) -> tuple[int, int] | None:
    """(candidate index, replicas) of the most expensive deployment within max_replicas that costs less than `cost`."""
    best, best_cost = None, -1.0
    for i in fits:
        price = evaluations[i].price_per_replica_hour_usd
        n = min(whole_at_least(cost / price) - 1, max_replicas)  # the most replicas strictly under `cost`
        if n >= 1 and n * price > best_cost + 1e-9:
            best, best_cost = (i, n), n * price
    return best
