"""Replicas of one engine configuration, built one way for every user: a run's colocated cluster or P/D pools,
a multi-stage pipeline's stages, and the calibration server's scheduler. The memory plan sizes the KV pool, the
cost model prices steps, and each replica gets its scheduler(s) over its own KV manager."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import simpy

from servesim.hardware.cost import CostOptions
from servesim.hardware.errors import ShardingError, SpecError
from servesim.hardware.gpu import get_gpu, get_interconnect
from servesim.hardware.memory import MemoryPlan, plan_memory
from servesim.hardware.model import get_model
from servesim.hardware.profile import load_profile
from servesim.hardware.step_timer import StepTimer
from servesim.policies.catalog import build_scheduler, schedulers
from servesim.policies.config import MAX_KV_BLOCKS, EngineConfig
from servesim.policies.data_parallel import DataParallelRanks, data_parallel_share, shortest_queue
from servesim.policies.families import family_of
from servesim.policies.hybrid_blocks import make_kv_manager, usable_pages
from servesim.policies.prefill_first import max_running_requests
from servesim.policies.spec_cost import draft_time, with_draft_memory
from servesim.policies.step import Scheduler, StepPlan, TokenLog
from servesim.simulator.scenario import Scenario
from servesim.simulator.world.engine import EngineGroup, FastForward, Replica, StepTime
from servesim.simulator.world.step_table import StepLog
from servesim.simulator.world.pipeline_stages import StagePipeline, StageTimes
from servesim.workloads.request import Request

GIB = 1 << 30


@dataclass(frozen=True)
class ReplicaSite:
    """What the world gives the replicas it builds: its clock, the step and token logs they write, when something
    from outside may next reach them (fast-forward stops there), and whether their arrivals are fixed in advance."""

    env: simpy.Environment
    steps: StepLog
    tokens: TokenLog
    next_event_s: Callable[[], float]
    open_loop: bool
    # FastForward's: an arrival's routing reads nothing a fused step changes early
    past_arrivals: bool = False


def memory_plan(s: Scenario) -> MemoryPlan:
    """The start-up memory plan of `s`'s engine on its GPU, the speculative draft's share included."""
    e = s.with_engine_defaults().engine
    gpu = get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files))
    cfg = e.memory_config(s.parallelism.pp)
    par, model = s.parallelism.spec(e.scheduler), get_model(s.model)
    # speculative decoding hook (policies/spec_cost.py): the draft's weights and KV share the GPU
    return with_draft_memory(plan_memory(model, gpu, par, cfg), e.speculative, model, gpu, par, cfg)


def build_timer(s: Scenario) -> StepTimer:
    """The cost model for the scenario's model, GPU, parallelism, profile and dtypes."""
    spec, engine = s.engine.speculative, s.with_engine_defaults().engine
    decode_query_len = 1 + spec.k if spec is not None else 1  # verify queries take attention's decode path
    gpu_files, family = tuple(s.hardware.gpu_files), family_of(s.engine.scheduler)
    gpu, par = get_gpu(s.hardware.gpu, gpu_files), s.parallelism.spec(s.engine.scheduler)
    options = CostOptions(
        s.engine.weight_dtype,
        s.engine.kv_dtype,
        s.engine.kv_sharing_fast_prefill,
        decode_query_len,
        **family.graph_options(gpu, engine, par.tp, par.ep, decode_query_len),
    )
    return StepTimer(
        get_model(s.model),
        gpu,
        par,
        load_profile(s.hardware.profile, gpu_files).for_engine(family.kernel_tables),
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
        if plan.num_draft or plan.rank:  # logit counts, rank labels: only the batch says them
            return plus_extras(timer(plan.batch()), plan)
        return plus_extras(timer.lists_s(plan.num_new, plan.num_context, plan.samples), plan)

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


def _waking(on_finish: Callable[[Request], None], replica: Replica) -> Callable[[Request], None]:
    """`on_finish`, then wake the engines sharing the finished request's KV pool."""

    def finish(req: Request) -> None:
        on_finish(req)
        replica.wake_pool()

    return finish


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
    # by replica: a dense model's vLLM DP ranks, or its pipeline micro-batch engines (EngineGroup)
    groups: list[EngineGroup] = field(default_factory=list)

    @property
    def targets(self) -> list[Replica] | list[EngineGroup]:
        """What the pool's router chooses among: its replicas, or the groups their engines form."""
        return self.groups or self.replicas


def new_scheduler(
    engine: EngineConfig,
    num_pages: int,
    page_size: int,
    windows: tuple,
    swa_pool=None,
    tokens: TokenLog | None = None,
    host_blocks: int = 0,
    seed: int = 0,
) -> Scheduler:
    """One engine's scheduler over a KV manager of its own (`policies.hybrid_blocks.make_kv_manager`)."""
    kv = make_kv_manager(engine, num_pages, page_size, windows, swa_pool)
    return build_scheduler(engine, kv, tokens if tokens is not None else TokenLog(), host_blocks, seed)


def _pages_per_rank(e: EngineConfig, count: int, num_blocks: int, page_size: int, ranks: int) -> int:
    """One rank's usable KV pages; SpecError where the run could not keep or use them."""
    # every block has its place in a free list and a reference count
    if count * num_blocks > MAX_KV_BLOCKS:
        raise SpecError(
            f"{count:,} replicas x {num_blocks:,} KV blocks = {count * num_blocks:,} blocks, more than the "
            f"{MAX_KV_BLOCKS:,} a run keeps a record of: fewer replicas, or a larger engine.block_size"
        )
    num_pages = usable_pages(e, num_blocks * e.block_size // page_size // ranks)
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
    return num_pages


def _check_whole_prompts_fit(
    e: EngineConfig, rank_engine: EngineConfig, max_model_len: int, ranks: int
) -> None:
    """vLLM refuses to start where chunked prefill is off and a whole prompt could not fit one step's budget."""
    if e.enable_chunked_prefill or rank_engine.max_num_batched_tokens >= max_model_len:
        return
    if not family_of(e.scheduler).vllm_rules:
        return
    share = (
        f" (its {ranks} DP-attention ranks' share: {rank_engine.max_num_batched_tokens} each)"
        if ranks > 1
        else ""
    )
    raise SpecError(
        f"engine.max_num_batched_tokens ({e.max_num_batched_tokens}){share} < max_model_len "
        f"({max_model_len}) with chunked prefill disabled: long prompts could never run; "
        "enable chunked prefill, raise the budget or lower max_model_len"
    )


def build_pool(site: ReplicaSite, s: Scenario, count: int, first_index: int, on_finish, section: str) -> Pool:
    """`count` replicas of `s`'s engine, numbered from `first_index`, in `site`; `on_finish(replica)` is what each
    calls with a finished request; `section` names where the scenario sets their parallelism (for messages)."""
    s = s.with_engine_defaults()
    try:
        memory = memory_plan(s)
    except ShardingError as err:
        raise ShardingError(f"{section}: {err}") from None
    e = s.engine.model_copy(update={"max_model_len": memory.max_model_len})
    num_blocks = e.num_gpu_blocks_override or memory.num_blocks
    page_size = e.radix_page_size if e.prefix_caching == "radix" else e.block_size
    family = family_of(e.scheduler)
    # DP attention: a scheduler and KV pool per rank
    ranks = s.parallelism.spec(e.scheduler).attention_ranks
    rank_engine = data_parallel_share(e, ranks)
    num_pages = _pages_per_rank(e, count, num_blocks, page_size, ranks)
    _check_whole_prompts_fit(e, rank_engine, memory.max_model_len, ranks)
    pp = s.parallelism.pp
    scheduler_class = schedulers.get(e.scheduler)
    batch_queue = pp > 1 and scheduler_class.batch_queue
    per_replica = 1 if batch_queue else pp  # engines per replica
    # a dense model's ranks under vLLM: engines of their own, each priced as one GPU (per stage) whose blocks
    # are whole on it (the plan's block is the group's per-GPU average)
    independent = per_replica == 1 and independent_ranks(s)
    rank_par = s.parallelism.model_copy(update={"tp": 1, "dp_attention": False})
    # each such rank an engine of its own: its share of the limits sizes its CUDA graphs
    timed = s.model_copy(update={"parallelism": rank_par, "engine": rank_engine}) if independent else s
    timer = build_timer(timed)
    step_time, stage_times = build_step_time(
        timed, replace(memory, block_bytes=memory.block_bytes * ranks) if independent else memory, timer
    )
    stop_s = s.stop.max_sim_time_s or math.inf
    fast = (
        FastForward(timer, site.tokens, site.next_event_s, stop_s, site.open_loop, site.past_arrivals)
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
            site.env, index - 1, scheduler, step_time, site.steps, None, fast if pp == 1 else None, stages
        )

    def pipeline() -> StagePipeline | None:
        """The stages of one replica's (or one independent rank's) GPUs."""
        return StagePipeline(site.env, pp, stage_times) if pp > 1 else None

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
        # a share of no seat builds no engine: max_num_seqs below the pipeline depth leaves stages idle
        slots = [n for v in range(per_replica) if (n := seqs // per_replica + (v < seqs % per_replica))]
        engines, stages = [], None if independent else pipeline()  # independent ranks: each its own
        for engine_seqs in slots:  # sum: max_num_seqs
            cfg = rank_engine.model_copy(update={"max_num_seqs": engine_seqs})
            group = []
            for kv in kvs:
                # the replica's swap space, shared; speculation's acceptance draws seeded by the run
                scheduler = build_scheduler(cfg, kv, site.tokens, host_blocks // per_replica // ranks, s.seed)
                if batch_queue:
                    scheduler.pipeline(pp)
                group.append(scheduler)
            if independent:
                engines += [engine(scheduler, pipeline()) for scheduler in group]
                pool.groups.append(EngineGroup(number, engines))
            else:
                pick = family.dp_balancer()  # one API server's
                engines.append(
                    engine(group[0] if ranks == 1 else DataParallelRanks(group, pick, turns), stages)
                )
        for replica in engines:
            replica.siblings = [] if independent else [r for r in engines if r is not replica]
            replica.scheduler.share_pool([sibling.scheduler for sibling in replica.siblings])
            replica.on_finish = (
                _waking(on_finish(replica), replica) if per_replica > 1 else on_finish(replica)
            )
        if per_replica > 1:  # one replica to the router and its API server, one queue to its micro-batches
            pool.groups.append(EngineGroup(number, engines, shortest_queue, labels_rank=False))
        pool.replicas.extend(engines)
    return pool
