"""Build the SimPy world for a scenario, run it, and return per-request/per-step tables and the summary."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import simpy
from pydantic import ValidationError

from servesim.hardware.cost import CostOptions
from servesim.hardware.errors import ShardingError, SpecError
from servesim.hardware.gpu import get_gpu, get_interconnect
from servesim.hardware.hf_models import repo_of
from servesim.hardware.kv_groups import KVGroups
from servesim.hardware.memory import MemoryPlan, plan_memory
from servesim.hardware.model import get_model
from servesim.hardware.profile import load_profile
from servesim.hardware.step_timer import StepTimer
from servesim.policies.app_cache import AppCache
from servesim.policies.catalog import build_scheduler, routers, schedulers
from servesim.policies.config import MAX_KV_BLOCKS, EngineConfig
from servesim.policies.data_parallel import DataParallelRanks, data_parallel_share
from servesim.policies.families import family_of
from servesim.policies.hybrid_blocks import make_kv_manager, usable_pages
from servesim.policies.prefill_first import max_running_requests
from servesim.policies.spec_cost import draft_time, with_draft_memory
from servesim.policies.step import Scheduler, StepPlan, TokenLog
from servesim.simulator.world.disagg import Handoff
from servesim.simulator.disagg_config import PoolConfig
from servesim.simulator.world.engine import DataParallelGroup, FastForward, Replica, StepTime
from servesim.simulator.world.frontend import Frontend
from servesim.simulator.world.pipeline_stages import StagePipeline, StageTimes
from servesim.simulator.world.metrics import (
    StepLog,
    cache_and_load_summary,
    request_frame,
    summarize,
    transfer_summary,
)
from servesim.simulator.scenario import Scenario, first_error
from servesim.simulator.world.slo_watch import SloWatch
from servesim.simulator.world.traffic import Traffic
from servesim.workloads.generate import Workload, build_workload
from servesim.workloads.tokens import with_model_tokenizer
from servesim.workloads.request import Phase, Request

GIB = 1 << 30


@dataclass
class RunResult:
    scenario: Scenario
    memory: MemoryPlan
    num_blocks: int
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict


def _memory_plan(s: Scenario) -> MemoryPlan:
    e = s.with_engine_defaults().engine
    gpu = get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files))
    cfg = e.memory_config(s.parallelism.pp)
    par, model = s.parallelism.spec(e.scheduler), get_model(s.model)
    # speculative decoding hook (policies/spec_cost.py): the draft's weights and KV share the GPU
    return with_draft_memory(plan_memory(model, gpu, par, cfg), e.speculative, model, gpu, par, cfg)


def build_timer(s: Scenario) -> StepTimer:
    """The cost model for the scenario's model, GPU, parallelism, profile and dtypes."""
    spec = s.engine.speculative  # verify queries (1 + k tokens) take attention's decode path
    options = CostOptions(
        s.engine.weight_dtype,
        s.engine.kv_dtype,
        s.engine.kv_sharing_fast_prefill,
        1 + spec.k if spec is not None else 1,
    )
    gpu_files = tuple(s.hardware.gpu_files)
    return StepTimer(
        get_model(s.model),
        get_gpu(s.hardware.gpu, gpu_files),
        s.parallelism.spec(s.engine.scheduler),
        load_profile(s.hardware.profile, gpu_files).for_engine(family_of(s.engine.scheduler).kernel_tables),
        options,
    )


def build_step_time(s: Scenario, memory: MemoryPlan, timer: StepTimer) -> tuple[StepTime, StageTimes]:
    """The scenario's step-time function (the cost model's prediction plus PCIe time of swapped KV blocks and the
    draft model's passes) and the same time split over the pipeline stages. Under DP attention the ranks swap in
    parallel, each block whole on its rank's GPU (the memory plan's block bytes average a block over the group)."""
    block_bytes = memory.block_bytes
    ranks = timer.parallelism.attention_ranks
    pcie = get_interconnect(f"pcie{get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files)).pcie_gen}")
    drafting_s = draft_time(s.engine.speculative, timer)  # speculative decoding hook (policies/spec_cost.py)

    def plus_extras(time_s: float, plan: StepPlan) -> float:
        if drafting_s is not None:  # speculative decoding hook: the draft's passes in this step
            time_s += drafting_s(plan)
        swapped = plan.swap_in_blocks + plan.swap_out_blocks
        # a DP step: its busiest rank's swap, blocks whole
        if ranks > 1 and (plan.rank or plan.rank_swap_blocks):
            swapped = plan.rank_swap_blocks * ranks
        if swapped:
            time_s += swapped * block_bytes / pcie.bytes_per_s + pcie.latency_s
        return time_s

    def step_time(plan: StepPlan) -> float:
        return plus_extras(timer(plan.batch()), plan)

    def stage_times(plan: StepPlan) -> list[float]:
        return timer.stage_s(plan.batch(), plus_extras(0.0, plan))

    return step_time, stage_times


def independent_ranks(s: Scenario) -> bool:
    """Whether the scenario's DP-attention ranks are vLLM's data-parallel engines of a dense model, which run
    independently (nothing, no MoE all-to-all, keeps them in step), in a colocated pool (P/D pools step them
    together)."""
    return (
        s.parallelism.spec(s.engine.scheduler).dense_replicated
        and get_model(s.model).moe is None
        and s.disaggregation is None
    )


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
    if req.prompt_logprobs and engine.kv_sharing_fast_prefill:
        return "prompt_logprobs is not supported with kv_sharing_fast_prefill"
    total = req.num_prompt_tokens + output - 1
    blocks_to_run = scheduler.blocks_to_run  # one that knows how it admits and steps, else None
    need = (
        blocks_to_run(total, windows, block_size)
        if blocks_to_run is not None
        else KVGroups(windows, 0).most_blocks(total, block_size, engine.max_num_batched_tokens)
    )
    if need > num_blocks:
        return f"needs {need} KV blocks at full length; the pool has {num_blocks}"
    return None


def _waking(on_finish: Callable[[Request], None], replica: Replica) -> Callable[[Request], None]:
    """`on_finish`, then wake the engines sharing the finished request's KV pool."""

    def finish(req: Request) -> None:
        on_finish(req)
        replica.wake_pool()

    return finish


def _workload(s: Scenario, rng: np.random.Generator, base_dir: Path) -> Workload:
    """Build the requests; the workloads package reports bad traces as ValueError naming the file."""
    try:
        return build_workload(with_model_tokenizer(s.workload, repo_of(s.model)), rng, base_dir)
    except ValueError as err:
        raise SpecError(f"workload: {err}") from None


@dataclass
class Pool:
    """Replicas that share one configuration: the whole cluster when colocated, or a prefill / decode pool."""

    scenario: Scenario  # the scenario as this pool sees it (its GPU, parallelism and engine)
    memory: MemoryPlan
    num_blocks: int
    page_size: int  # tokens per KV page: block_size, or radix_page_size for the radix cache
    num_pages: int  # one scheduler's (under DP attention, one rank's)
    engine: EngineConfig  # one scheduler's settings (under DP attention, one rank's share of the group's)
    timer: StepTimer
    replicas: list[Replica]
    groups: list[DataParallelGroup] = field(default_factory=list)  # a dense model's vLLM DP ranks, by replica

    @property
    def targets(self) -> list[Replica] | list[DataParallelGroup]:
        """What the pool's router chooses among: its replicas, or the DP groups their ranks form."""
        return self.groups or self.replicas


def _frontend(s: Scenario, env: simpy.Environment) -> Frontend:
    """The API server of each routed target, priced by the profile of the GPU requests enter on (under P/D, the
    prefill pool's); none for the offline LLM class."""
    if not s.engine.api_server:
        return Frontend(env, 0.0, 0.0)
    gpu = (s.disaggregation.prefill.gpu if s.disaggregation else None) or s.hardware.gpu
    gpu_files = tuple(s.hardware.gpu_files)
    profile = load_profile(s.hardware.profile, gpu_files).for_gpu(get_gpu(gpu, gpu_files).name)
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
        seeds = np.random.SeedSequence(s.seed).spawn(5)
        if s.disaggregation is None:  # the pools of a disaggregated run fill in their own engine defaults
            s = s.with_engine_defaults()
        self.scenario = s
        self.workload = workload or _workload(s, np.random.default_rng(seeds[0]), base_dir)
        self.env = simpy.Environment()
        self.tokens = TokenLog()
        self.steps = StepLog()
        self.completed = 0
        self.on_progress = on_progress
        self.handoff: Handoff | None = None
        self.frontend = _frontend(s, self.env)  # before the pools: their fast-forward asks it for hand-overs
        d = s.disaggregation
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
            )
            self.scenario = _with_pool_limits(s, prefill.scenario.engine, decode.scenario.engine)
        self.traffic = Traffic(self.env, self.workload, self._arrive, np.random.default_rng(seeds[2]))
        self.app_cache = (
            AppCache(s.app_cache, np.random.default_rng(seeds[3])) if s.app_cache.kind != "none" else None
        )
        self.watch = _slo_watch(s, self.workload) if stop_when_slo_lost else None
        self.lost_at_s: float | None = None

    @property
    def replicas(self) -> list[Replica]:
        return [r for pool in self.pools for r in pool.replicas]

    def _pool(self, s: Scenario, count: int, first_index: int, on_finish, section: str) -> Pool:
        """`count` replicas of `s`'s engine; `section` names where the scenario sets their parallelism."""
        s = s.with_engine_defaults()
        try:
            memory = _memory_plan(s)
        except ShardingError as err:
            raise ShardingError(f"{section}: {err}") from None
        e = s.engine.model_copy(update={"max_model_len": memory.max_model_len})
        num_blocks = e.num_gpu_blocks_override or memory.num_blocks
        # every block has its place in a free list and a reference count
        if count * num_blocks > MAX_KV_BLOCKS:
            raise SpecError(
                f"{count:,} replicas x {num_blocks:,} KV blocks = {count * num_blocks:,} blocks, more than the "
                f"{MAX_KV_BLOCKS:,} a run keeps a record of: fewer replicas, or a larger engine.block_size"
            )
        page_size = e.radix_page_size if e.prefix_caching == "radix" else e.block_size
        family = family_of(e.scheduler)
        # DP attention: a scheduler and KV pool per rank
        ranks = s.parallelism.spec(e.scheduler).attention_ranks
        rank_engine = data_parallel_share(e, ranks)
        num_pages = usable_pages(e, num_blocks * e.block_size // page_size // ranks)  # one rank's
        # only an override is this small: the memory plan refuses a pool too small for one request
        if num_pages < 1:
            least = next(
                n for n in itertools.count(1) if usable_pages(e, n * e.block_size // page_size // ranks) >= 1
            )
            ranks_note = f" over {ranks} DP-attention ranks" if ranks > 1 else ""
            null_note = " (vLLM keeps one as its null block)" if usable_pages(e, 1) < 1 else ""
            raise SpecError(
                f"engine.num_gpu_blocks_override ({num_blocks}) leaves no usable KV block{ranks_note}"
                f"{null_note}; give at least {least}"
            )
        if (
            not e.enable_chunked_prefill
            and rank_engine.max_num_batched_tokens < memory.max_model_len
            and family.vllm_rules
        ):
            share = (
                f" (its {ranks} DP-attention ranks' share: {rank_engine.max_num_batched_tokens} each)"
                if ranks > 1
                else ""
            )
            raise SpecError(
                f"engine.max_num_batched_tokens ({e.max_num_batched_tokens}){share} < max_model_len "
                f"({memory.max_model_len}) with chunked prefill disabled: long prompts could never run; "
                "enable chunked prefill, raise the budget or lower max_model_len"
            )
        pp = s.parallelism.pp
        scheduler_class = schedulers.get(e.scheduler)
        batch_queue = pp > 1 and scheduler_class.batch_queue
        per_replica = 1 if batch_queue else pp  # engines per replica
        # a dense model's ranks under vLLM: engines of their own, each priced as one GPU (per stage) whose blocks
        # are whole on it (the plan's block is the group's per-GPU average)
        independent = per_replica == 1 and independent_ranks(s)
        rank_par = s.parallelism.model_copy(update={"tp": 1, "dp_attention": False})
        timed = s.model_copy(update={"parallelism": rank_par}) if independent else s
        timer = build_timer(timed)
        step_time, stage_times = build_step_time(
            timed, replace(memory, block_bytes=memory.block_bytes * ranks) if independent else memory, timer
        )
        stop_s = self.scenario.stop.max_sim_time_s or math.inf
        open_loop = (
            s.workload.closed_loop is None and not self.workload.followups and s.disaggregation is None
        )
        fast = (
            FastForward(timer, self.tokens, self._next_event_s, stop_s, open_loop)
            if s.simulation.fast_forward
            else None
        )
        host_blocks = int(e.swap_space_gib * GIB // memory.block_bytes)
        # pipeline parallel: pp micro-batches in flight through the replica's stages, which run one at a time
        # (simulator/world/pipeline_stages.py). vLLM's schedulers run as vLLM V1 does, one scheduler with a batch queue
        # of pp steps (TokenBudgetScheduler.pipeline). Other schedulers run as pp engines, one step in flight
        # each, sharing the replica's whole KV pool and prefix cache and splitting max_num_seqs; a finish in one
        # wakes the others (the blocks it freed may admit their waiting requests), but each preempts and blocks
        # its queue's head on its own requests only. Shared blocks change under a fused stretch: pp > 1 steps
        # one by one.
        pool = Pool(s, memory, num_blocks, page_size, num_pages, rank_engine, timer, [])
        index = first_index

        def engine(scheduler: Scheduler, stages: StagePipeline | None) -> Replica:
            nonlocal index
            index += 1
            return Replica(
                self.env, index - 1, scheduler, step_time, self.steps, None, fast if pp == 1 else None, stages
            )

        def pipeline() -> StagePipeline | None:
            """The stages of one replica's (or one independent rank's) GPUs."""
            return StagePipeline(self.env, pp, stage_times) if pp > 1 else None

        for number in range(count):
            kvs = [
                make_kv_manager(
                    rank_engine,
                    num_pages,
                    page_size,
                    memory.kv_windows,
                    memory.swa_pool(page_size, ranks, num_blocks),
                )
                for _ in range(ranks)
            ]
            turns = itertools.count()  # the replica's requests sent to its ranks, whichever engine takes them
            # SGLang's default max_running_requests depends on the pool: resolved before it is split
            seqs = (
                max_running_requests(rank_engine, kvs[0])
                if family.default_slots is not None
                else rank_engine.max_num_seqs
            )
            slots = [max(1, seqs // per_replica + (v < seqs % per_replica)) for v in range(per_replica)]
            engines, stages = [], None if independent else pipeline()  # independent ranks: each its own
            for engine_seqs in slots:  # sum: max_num_seqs
                cfg = rank_engine.model_copy(update={"max_num_seqs": engine_seqs})
                group = []
                for kv in kvs:
                    # the replica's swap space, shared; speculation's acceptance draws seeded by the run
                    scheduler = build_scheduler(
                        cfg, kv, self.tokens, host_blocks // per_replica // ranks, s.seed
                    )
                    if batch_queue:
                        scheduler.pipeline(pp)
                    group.append(scheduler)
                if independent:
                    engines += [engine(scheduler, pipeline()) for scheduler in group]
                    pool.groups.append(DataParallelGroup(number, engines))
                else:
                    pick = family.dp_balancer()  # one API server's
                    engines.append(
                        engine(group[0] if ranks == 1 else DataParallelRanks(group, pick, turns), stages)
                    )
            for replica in engines:
                replica.siblings = [] if independent else [r for r in engines if r is not replica]
                replica.on_finish = (
                    _waking(on_finish(replica), replica) if per_replica > 1 else on_finish(replica)
                )
            pool.replicas.extend(engines)
        return pool

    def _next_event_s(self) -> float:
        """When something from outside may next reach a replica: the next arrival or API-server hand-over (closed
        loop: the next event of any kind, since another replica's finish may release a client)."""
        if self.traffic.reacts_to_finishes or self.handoff is not None:
            return self.env.peek()
        return min(self.traffic.next_arrival_s(), self.frontend.next_hand_over_s())

    def _arrive(self, req: Request) -> None:
        self._check_slo()
        if self.app_cache is not None and self.app_cache.lookup(req):
            self.env.process(self._answer_from_cache(req))
            return
        reason = next(
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
        if reason:
            req.phase, req.reject_reason = Phase.REJECTED, reason
            self._finished(req)
            return
        req.served_by = "engine"
        target = self.router.route(req)
        if self.frontend.active:
            self.frontend.submit(req, id(target), target.submit)
        else:
            target.submit(req)

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
        self.env.run(until=until)
        scenario = self.scenario
        if self.lost_at_s is not None:  # judged as a run stopped here (simulator/world/slo_watch.py)
            until = self.lost_at_s
            scenario = scenario.model_copy(
                update={"stop": scenario.stop.model_copy(update={"max_sim_time_s": until})}
            )
        requests = request_frame(
            sorted([*self.workload.requests, *self.workload.followups.values()], key=lambda r: r.id)
        )
        steps = self.steps.frame()
        summary = summarize(
            requests,
            steps,
            np.frombuffer(self.tokens.itl_s, dtype=float) if self.tokens.itl_s else np.array([]),
            self.scenario.slo.as_ms(),
            stop_s=until,
        )
        # per engine
        gpus = {r.index: pool.scenario.parallelism.tp for pool in self.pools for r in pool.replicas}
        finishing = [r.index for r in self.pools[-1].replicas]  # under P/D, the decode pool
        summary |= cache_and_load_summary(requests, steps, finishing, gpus)
        if self.handoff is not None:
            summary |= transfer_summary(requests)
        if self.lost_at_s is not None:
            summary["slo_lost_at_s"] = self.lost_at_s
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
