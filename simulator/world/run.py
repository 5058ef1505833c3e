"""Build the SimPy world for a scenario, run it, and return per-request/per-step tables and the summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import simpy
from pydantic import ValidationError

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu, get_interconnect
from servesim.hardware.hf_models import repo_of
from servesim.hardware.kv_groups import KVGroups
from servesim.hardware.memory import MemoryPlan
from servesim.hardware.model import get_model
from servesim.hardware.profile import load_profile
from servesim.policies.app_cache import AppCache
from servesim.policies.catalog import routers
from servesim.policies.config import EngineConfig
from servesim.policies.families import family_of
from servesim.policies.step import Scheduler, TokenLog
from servesim.simulator.world.compiled_run import run_compiled
from servesim.simulator.world.disagg import Handoff
from servesim.simulator.disagg_config import PoolConfig
from servesim.simulator.world.engine import Replica
from servesim.simulator.world.frontend import Frontend
from servesim.simulator.world.replicas import Pool, ReplicaSite, build_pool
from servesim.simulator.world.metrics import (
    cache_and_load_summary,
    request_frame,
    request_table,
    summarize,
    transfer_summary,
)
from servesim.simulator.world.spill import SPILL_VALUES, SpilledFloats
from servesim.simulator.world.step_table import StepLog, StepTable
from servesim.simulator.scenario import Scenario, first_error
from servesim.simulator.world.slo_watch import SloWatch
from servesim.simulator.world.traffic import Traffic
from servesim.workloads.generate import Workload, build_workload
from servesim.workloads.tokens import with_model_tokenizer
from servesim.workloads.request import Phase, Request, mark_private_prefixes


@dataclass
class RunResult:
    scenario: Scenario
    memory: MemoryPlan
    num_blocks: int
    requests: pd.DataFrame
    step_table: StepTable
    summary: dict

    @property
    def steps(self) -> pd.DataFrame:
        """The step table in memory; a long run's spilled one is read back whole (`step_table.blocks()` streams
        it)."""
        return self.step_table.frame()


def rejection(
    req: Request,
    engine: EngineConfig,
    max_model_len: float,
    num_blocks: int,
    block_size: int,
    windows: tuple[int | None, ...] = (None,),
    scheduler: Scheduler | None = None,
) -> str | None:
    """Why an engine would refuse this request at arrival (as vLLM's API server does), or None: too long, or
    needing more blocks than the pool holds at some step or at its admission, as `scheduler` admits and steps it
    (`blocks_to_run`: vLLM's gate, Orca's reservation), even after a preemption (a request that could never run
    would otherwise stall the queue behind it). A P/D prefill engine serves it with max_tokens=1."""
    output = 1 if engine.scheduler_class().hands_off_first_token else req.num_output_tokens
    if req.num_prompt_tokens + output > max_model_len:
        return f"prompt ({req.num_prompt_tokens}) + output ({output}) tokens exceed max_model_len ({max_model_len})"
    if not engine.enable_chunked_prefill and req.num_prompt_tokens > engine.max_num_batched_tokens:
        # vLLM's unchunked budget covers max_model_len; TensorRT-LLM's max_num_tokens stays and its LLM API refuses
        return (
            f"prompt ({req.num_prompt_tokens} tokens) exceeds max_num_batched_tokens "
            f"({engine.max_num_batched_tokens}) with chunked prefill off"
        )
    if req.prompt_logprobs and engine.kv_sharing_fast_prefill:
        return "prompt_logprobs is not supported with kv_sharing_fast_prefill"
    total = req.num_prompt_tokens + output - 1
    # one that knows how it admits and steps, else None
    blocks_to_run = scheduler.blocks_to_run if scheduler is not None else None
    need = (
        blocks_to_run(total, windows, block_size)
        if blocks_to_run is not None
        else KVGroups(windows, 0).most_blocks(total, block_size, engine.max_num_batched_tokens)
    )
    if need > num_blocks:
        return f"needs {need} KV blocks at full length; the pool has {num_blocks}"
    return None


def run_seeds(s: Scenario, count: int) -> list[np.random.SeedSequence]:
    """A run's independent random streams, from its seed: the first draws the workload (`workload_of`), the others
    route, release session turns and answer from caches."""
    return np.random.SeedSequence(s.seed).spawn(count)


def workload_of(s: Scenario, base_dir: Path) -> Workload:
    """The scenario's requests as its runs draw them: from the first child of its seed (a capacity search's rate,
    a plan's target and benchmark script see the run's requests). The workloads package reports bad traces as
    ValueError naming the file."""
    rng = np.random.default_rng(run_seeds(s, 1)[0])
    try:
        return build_workload(with_model_tokenizer(s.workload, repo_of(s.model)), rng, base_dir)
    except ValueError as err:
        raise SpecError(f"workload: {err}") from None


def _frontend(s: Scenario, env: simpy.Environment, pool: PoolConfig | None = None) -> Frontend:
    """The API server of each routed target, priced by the profile of the GPU and engine requests enter on (under
    P/D, `pool`'s: the prefill pool's, and the decode pool's for the request the proxy sends on); none for the
    offline LLM class."""
    if not s.engine.api_server:
        return Frontend(env, 0.0, 0.0)
    gpu = (pool.gpu if pool else None) or s.hardware.gpu
    gpu_files = tuple(s.hardware.gpu_files)
    scheduler = (pool.engine.get("scheduler") if pool else None) or s.engine.scheduler
    profile = (
        load_profile(s.hardware.profile, gpu_files)
        .for_engine(family_of(scheduler).kernel_tables)
        .for_gpu(get_gpu(gpu, gpu_files).name)
    )
    return Frontend(env, profile.api_request_s, profile.api_token_s, profile.api_latency_s)


def pool_settings(s: Scenario, pool: PoolConfig, scheduler: str, role: str) -> Scenario:
    try:
        engine = s.engine_with({**pool.engine, "scheduler": scheduler})
    except ValidationError as err:
        raise first_error(err, f"disaggregation {role} pool", EngineConfig) from None
    hardware = s.hardware.model_copy(update={"gpu": pool.gpu or s.hardware.gpu})
    parallelism = s.parallelism.model_copy(update={"tp": pool.tp, "pp": pool.pp})
    return s.model_copy(update={"engine": engine, "hardware": hardware, "parallelism": parallelism})


def _with_pool_limits(s: Scenario, prefill: EngineConfig, decode: EngineConfig) -> Scenario:
    """`s` with each pool's batch limits as it ran them written into its engine overrides (the resolved
    scenario.yaml of a disaggregated run re-runs the same even where the pools' GPUs differ)."""
    d = s.disaggregation
    pools = {}
    for name, pool, engine in (("prefill", d.prefill, prefill), ("decode", d.decode, decode)):
        limits = {
            "max_num_seqs": engine.max_num_seqs,
            "max_num_batched_tokens": engine.max_num_batched_tokens,
        }
        pools[name] = pool.model_copy(update={"engine": {**limits, **pool.engine}})
    return s.model_copy(update={"disaggregation": d.model_copy(update=pools)})


class World:
    """The simulated cluster: replicas behind a router (or a prefill and a decode pool), fed by the traffic."""

    def __init__(
        self,
        s: Scenario,
        base_dir: Path,
        on_progress: Callable[[int], None] | None = None,
        workload: Workload | None = None,
        stop_when_slo_lost: bool = False,
    ):
        if (
            s.stages
        ):  # multi-stage pipeline hook: those run in simulator/world/omni_run.py (simulate() dispatches)
            raise SpecError(
                "a scenario with stages runs as a pipeline: use simulate() or simulator.world.omni_run.Pipeline"
            )
        seeds = run_seeds(s, 5)
        if s.disaggregation is None:  # the pools of a disaggregated run fill in their own engine defaults
            s = s.with_engine_defaults()
        self.scenario = s
        self.workload = workload or workload_of(s, base_dir)
        mark_private_prefixes([*self.workload.requests, *self.workload.followups.values()])
        self.env = simpy.Environment()
        self.itl_spill = SpilledFloats("servesim-itl-")
        self.tokens = TokenLog(self.itl_spill.spill, SPILL_VALUES)
        self.steps = StepLog()
        self.completed = 0
        self.on_progress = on_progress
        # an SLO watch may stop the run at an arrival, where a fused step after it would have counted its tokens
        self._watching = stop_when_slo_lost
        self.handoff: Handoff | None = None
        d = s.disaggregation
        # before the pools: their fast-forward asks it for hand-overs
        self.frontend = _frontend(s, self.env, d.prefill if d else None)
        if d is None:
            self.pools = [self._pool(s, s.cluster.replicas, 0, lambda replica: self._finished, "parallelism")]
            self.router = routers.get(s.cluster.router)(
                self.pools[0].targets, np.random.default_rng(seeds[1])
            )
        else:
            pd_schedulers = family_of(s.engine.scheduler).pd_pools
            prefill = self._pool(
                pool_settings(s, d.prefill, pd_schedulers[0], "prefill"),
                d.prefill.replicas,
                0,
                lambda replica: lambda req: self._prefilled(req, replica),
                "disaggregation.prefill",
            )
            decode = self._pool(
                pool_settings(s, d.decode, pd_schedulers[1], "decode"),
                d.decode.replicas,
                len(prefill.replicas),
                lambda replica: self._finished,
                "disaggregation.decode",
            )
            self.pools = [prefill, decode]
            kv_dtypes = prefill.scenario.engine.kv_dtype, decode.scenario.engine.kv_dtype
            if kv_dtypes[0] != kv_dtypes[1]:
                raise SpecError(
                    f"disaggregation: the prefill pool's engine.kv_dtype ({kv_dtypes[0]}) and the decode "
                    f"pool's ({kv_dtypes[1]}) differ; the KV moves as it is stored (vLLM's NixlConnector "
                    "refuses such a pair): set one kv_dtype for both"
                )
            self.router = routers.get(d.prefill.router)(prefill.replicas, np.random.default_rng(seeds[1]))
            decode_router = routers.get(d.decode.router)(decode.replicas, np.random.default_rng(seeds[4]))
            link = get_interconnect(d.transfer.link)
            self.handoff = Handoff(
                self.env,
                get_model(s.model),
                prefill.scenario.engine,
                d.transfer,
                link.bytes_per_s,
                link.latency_s,
                prefill.replicas,
                decode.replicas,
                decode_router.route,
                prefill.scenario.parallelism,
                decode.scenario.parallelism,
                _frontend(s, self.env, d.decode),
            )
            self.scenario = _with_pool_limits(s, prefill.scenario.engine, decode.scenario.engine)
        self.traffic = Traffic(self.env, self.workload, self._arrive, np.random.default_rng(seeds[2]))
        self.app_cache = (
            AppCache(s.app_cache, np.random.default_rng(seeds[3])) if s.app_cache.kind != "none" else None
        )
        self.watch = _slo_watch(s, self.workload) if stop_when_slo_lost else None
        self.lost_at_s: float | None = None
        # an arrival reaches no engine before its API server hands it over; with one engine to route to, no SLO
        # watch and no cache answering, nothing it does sees an engine's state either, so fused steps may pass it
        self._refused: tuple[Request | None, str | None] = (None, None)
        alone = d is None and len(self.pools[0].targets) == 1
        self._unseen_arrivals = (
            self.frontend.active and alone and not stop_when_slo_lost and self.app_cache is None
        )

    @property
    def replicas(self) -> list[Replica]:
        return [r for pool in self.pools for r in pool.replicas]

    def _pool(self, s: Scenario, count: int, first_index: int, on_finish, section: str) -> Pool:
        """`count` replicas of `s`'s engine; `section` names where the scenario sets their parallelism."""
        open_loop = (
            s.workload.closed_loop is None and not self.workload.followups and s.disaggregation is None
        )
        # an arrival's routing must not see a fused step it came before (a router reading KV usage, with a choice)
        router = routers.get(s.cluster.router)
        blind = count == 1 or not getattr(router, "reads_kv_usage", True)
        past_arrivals = open_loop and blind and not self._watching
        site = ReplicaSite(self.env, self.steps, self.tokens, self._next_event_s, open_loop, past_arrivals)
        return build_pool(site, s, count, first_index, on_finish, section)

    def _next_event_s(self) -> float:
        """When something from outside may next reach a replica: the next arrival or API-server hand-over (closed
        loop: the next event of any kind, since another replica's finish may release a client)."""
        if self.traffic.reacts_to_finishes or self.handoff is not None:
            return self.env.peek()
        entry = self.traffic.next_entry() if self._unseen_arrivals else None
        # a request refused on arrival holds no API server: one after it may come sooner than its hand-over
        if entry is None or self._refusal(entry[0]) is not None:
            return min(self.traffic.next_arrival_s(), self.frontend.next_hand_over_s())
        req, enters_s = entry  # its hand-over, to the bit, is the first thing it can bring an engine
        return min(
            self.frontend.hand_over_s(req, self.pools[0].targets[0], enters_s),
            self.frontend.next_hand_over_s(),
        )

    def _refusal(self, req: Request) -> str | None:
        """Why `req` is refused on arrival, or None (its lengths against the pools' fixed limits: the same whenever
        asked, so kept for the request asked about last)."""
        if self._refused[0] is not req:
            self._refused = (req, self._rejection(req))
        return self._refused[1]

    def _arrive(self, req: Request) -> None:
        self._check_slo()
        if self.app_cache is not None and self.app_cache.lookup(req):
            self.env.process(self._answer_from_cache(req))
            return
        reason = self._refusal(req)
        if reason:
            req.phase, req.reject_reason = Phase.REJECTED, reason
            self._finished(req)
            return
        req.served_by = "engine"
        target = self.router.route(req)
        self.frontend.submit(req, target, target.submit)

    def _unsent(self) -> list[Request]:
        """The requests not sent by now: due later, or session turns not released."""
        now = self.env.now
        return [
            r
            for r in (*self.workload.requests, *self.workload.followups.values())
            if not r.arrival_s <= now  # NaN: a turn not released
        ]

    def _rejection(self, req: Request) -> str | None:
        """The first pool's reason to refuse `req`, or None."""
        return next(
            (
                why
                for pool in self.pools
                if (
                    why := rejection(
                        req,
                        pool.engine,
                        pool.memory.max_model_len,
                        pool.num_pages,
                        pool.page_size,
                        pool.memory.kv_windows,
                        pool.replicas[0].scheduler,
                    )
                )
            ),
            None,
        )

    def _answer_from_cache(self, req: Request):
        yield self.env.timeout(self.scenario.app_cache.lookup_latency_s)
        req.phase, req.served_by = Phase.FINISHED, f"{self.scenario.app_cache.kind}_cache"
        req.first_token_s = req.last_token_s = req.finish_s = self.env.now
        req.num_generated = req.num_output_tokens
        self._finished(req)

    def _prefilled(self, req: Request, replica: Replica) -> None:
        """A prefill replica computed the prompt: hand off, or finish if its one sampled token was all that was
        wanted (vLLM's proxy would send it to the decode side anyway: a shortcut, ~one transfer and step)."""
        if req.is_done:
            self._finished(req)
        else:
            self.handoff.on_prefilled(req, replica)

    def _finished(self, req: Request) -> None:
        if self.app_cache is not None and req.served_by == "engine" and req.finish_s is not None:
            self.app_cache.store(req)
        self.completed += 1
        if self.on_progress:
            self.on_progress(self.completed)
        self.traffic.on_done(req)
        if self.watch is not None:
            self.watch.finished(req)
            self._check_slo()

    def _check_slo(self) -> None:
        """Stop the run here once a watched SLO is certainly lost."""
        if self.watch is not None and self.lost_at_s is None and self.watch.lost(self.env.now):
            self.lost_at_s = self.env.now
            stop = self.env.event()
            stop.callbacks.append(simpy.core.StopSimulation.callback)
            stop.succeed()

    def run(self) -> RunResult:
        until = self.scenario.stop.max_sim_time_s
        columns = run_compiled(self, until)
        if columns is None:
            self.env.run(until=until)
        scenario = self.scenario
        if self.lost_at_s is not None:  # judged as a run stopped here (simulator/world/slo_watch.py)
            until = self.lost_at_s
            scenario = scenario.model_copy(
                update={"stop": scenario.stop.model_copy(update={"max_sim_time_s": until})}
            )
        requests = (
            request_frame(
                sorted([*self.workload.requests, *self.workload.followups.values()], key=lambda r: r.id)
            )
            if columns is None
            else request_table(columns)
        )
        steps = self.steps.table()
        gpus_of_replica = {
            r.index: pool.scenario.parallelism.tp for pool in self.pools for r in pool.replicas
        }
        figures = steps.figures(gpus_of_replica)
        summary = summarize(
            requests,
            figures,
            self.itl_spill.gathered(self.tokens.itl_s),
            self.scenario.slo.as_ms(),
            stop_s=until,
            start_s=0.0,  # the clients start sending at 0
        )
        finishing = [r.index for r in self.pools[-1].replicas]  # under P/D, the decode pool
        summary |= cache_and_load_summary(requests, figures, finishing)
        if self.handoff is not None:
            prefill, decode = ({r.index for r in pool.replicas} for pool in self.pools)
            summary |= transfer_summary(
                requests, steps.figures(replicas=prefill), steps.figures(replicas=decode)
            )
        if self.lost_at_s is not None:
            summary["slo_lost_at_s"] = self.lost_at_s
            # requests the stop kept from arriving that the engine would refuse at any load: no rate fixes them
            refused = [why for r in self._unsent() if (why := self._refusal(r))]
            summary["rejected_unsent"] = len(refused)
            if refused:
                summary["rejected_unsent_example"] = refused[0]
        main = self.pools[-1]
        return RunResult(scenario, main.memory, main.num_blocks, requests, steps, summary)


def _slo_watch(s: Scenario, workload: Workload) -> SloWatch | None:
    """A watch over the TTFT and TPOT SLOs where arrival times are fixed in advance (open loop, no sessions, no stop
    time)."""
    slo = s.slo
    if (
        (slo.ttft_ms is None and slo.tpot_ms is None)
        or s.stop.max_sim_time_s is not None
        or workload.closed_loop is not None
        or workload.followups
    ):
        return None
    return SloWatch(
        workload.requests,
        slo.ttft_ms / 1e3 if slo.ttft_ms is not None else None,
        slo.tpot_ms / 1e3 if slo.tpot_ms is not None else None,
        slo.percentile,
    )


def setting_notes(s: Scenario) -> list[str]:
    """Settings the scenario's model gives nothing to act on: accepted, as vLLM accepts them, but worth a word,
    since a user who set them expects them to change the run."""
    model, notes = get_model(s.model), []
    if s.parallelism.ep and model.moe is None:
        notes.append(
            f"parallelism.ep: {model.name} has no routed experts; expert parallelism changes nothing"
        )
    if s.engine.kv_sharing_fast_prefill and all(layer.owns_kv for layer in model.layers):
        notes.append(
            f"engine.kv_sharing_fast_prefill: no layer of {model.name} reads another's KV (YOCO / Gemma 3n "
            "KV sharing); fast prefill changes nothing"
        )
    return notes


def make_world(
    s: Scenario,
    base_dir: Path,
    on_progress: Callable[[int], None] | None = None,
    stop_when_slo_lost: bool = False,
):
    """The simulated system of a scenario: a World, or a multi-stage Pipeline (simulator/world/omni_run.py) when
    it chains `stages`. Both have `workload`, `on_progress` and `run() -> RunResult`."""
    if s.stages:
        from servesim.simulator.world.omni_run import Pipeline

        return Pipeline(s, base_dir, on_progress)
    return World(s, base_dir, on_progress, stop_when_slo_lost=stop_when_slo_lost)


def simulate(
    s: Scenario,
    base_dir: Path,
    on_progress: Callable[[int], None] | None = None,
    stop_when_slo_lost: bool = False,
) -> RunResult:
    """Run one scenario to completion (or its stop time). Deterministic in (scenario, seed).
    `stop_when_slo_lost`: stop as soon as the TTFT SLO is certainly missed (a verdict needs no more)."""
    return make_world(s, base_dir, on_progress, stop_when_slo_lost).run()
