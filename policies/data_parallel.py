"""A DP-attention group as its engines run it: one scheduler and one KV pool per attention rank, stepping together.

vLLM runs data-parallel attention as one engine core per rank, SGLang as one scheduler per rank under its data
parallel controller. Either way a request is sent to one rank when it arrives and stays there for life: that
rank's token budget, batch slots, KV pool and prefix cache are the only ones it uses. The MoE layers' all-to-all
(or SGLang's gathered MLP) keeps the ranks in lock step, so a rank with nothing to run runs an empty (dummy) batch
beside the others, a request sent to it is first scheduled when the step in flight ends, and the step lasts as
long as its busiest rank's (the cost model prices each rank's requests: `StepBatch.rank`). A dense model's ranks
under vLLM have no such collective: outside P/D pools they run as engines of their own
(`simulator.world.engine.EngineGroup`).

Where a request goes (`pick`):
- vLLM (its DP load balancer, `DPLBAsyncMPClient`): the rank with the lowest 4 x waiting + running, the first
  of equals, from the counts its coordinator published last (every 100 ms) plus one waiting for each request it
  sent since (`VllmBalancer`).
- SGLang (`--load-balance-method round_robin`, its default): the next rank in turn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from itertools import chain, count

from servesim.policies.config import EngineConfig
from servesim.policies.families import family_of
from servesim.policies.step import Scheduler, SchedulerDefaults, StepPlan
from servesim.workloads.request import Phase, Request

WAITING_WEIGHT = 4  # vLLM's DP load balancer: score = waiting * 4 + running
STATS_PERIOD_S = 0.1  # vLLM's DP coordinator publishes the ranks' request counts every 100 ms


def data_parallel_share(engine: EngineConfig, ranks: int) -> EngineConfig:
    """One rank's engine settings: the group's token budget and batch slots (as a scenario states them, vLLM's
    defaults being tp times a rank's) split evenly: rounded up for vLLM, as its launch command sets each rank's;
    rounded down for SGLang, which divides the group's itself (server_args: chunked_prefill_size // dp_size).
    SGLang's default max_running_requests stays its default, so each rank derives it from its own pool."""
    if ranks == 1:
        return engine
    family = family_of(engine.scheduler)
    update = {"max_num_batched_tokens": family.rank_share(engine.max_num_batched_tokens, ranks)}
    if engine.max_num_seqs != family.default_slots:
        update["max_num_seqs"] = family.rank_share(engine.max_num_seqs, ranks)
    return engine.model_copy(update=update)


class RanksKV:
    """The ranks' KV pools read as one for the step log and routers: blocks summed, usage the fullest rank's (a
    rank preempts when its own pool runs dry, whatever the others hold); a request's blocks are its rank's."""

    supports_fast_forward = False  # the group steps one step at a time

    def __init__(self, ranks: list[Scheduler], home: dict[int, int]):
        self.pools, self.home = [rank.kv for rank in ranks], home

    @property
    def num_blocks(self) -> int:
        return sum(pool.num_blocks for pool in self.pools)

    @property
    def num_free_blocks(self) -> int:
        return sum(pool.num_free_blocks for pool in self.pools)

    @property
    def num_used_blocks(self) -> int:
        return sum(pool.num_used_blocks for pool in self.pools)

    def table(self, req: Request) -> list[int]:
        return self.pools[self.home.get(req.id, req.extra["dp_rank"])].table(req)  # done here: where it ran

    def check_invariants(self) -> None:
        for pool in self.pools:
            pool.check_invariants()

    @property
    def usage(self) -> float:
        return max(pool.usage for pool in self.pools)


class VllmBalancer:
    """vLLM's choice (one per API server): the lowest 4 x waiting + running, the first of equals, over the counts
    the coordinator published last, each request sent since counted as one more waiting on its rank. The counts
    are read as they stand at the first request of each 100 ms period (the coordinator's, a little earlier)."""

    def __init__(self) -> None:
        self._counts: list[list[int]] = []  # per rank: [waiting, running]
        self._fresh_until = -math.inf

    def __call__(self, ranks: list[Scheduler], turn: int, now: float) -> int:
        if now >= self._fresh_until:
            self._counts = [[rank.num_waiting, rank.num_running] for rank in ranks]
            self._fresh_until = (math.floor(now / STATS_PERIOD_S) + 1) * STATS_PERIOD_S
        scores = [WAITING_WEIGHT * waiting + running for waiting, running in self._counts]
        choice = scores.index(min(scores))
        self._counts[choice][0] += 1
        return choice


def shortest_queue(engines: list[Scheduler], turn: int, now: float) -> int:
    """A replica's pipeline micro-batch engines, which take requests from one waiting queue (SGLang's pipeline
    loop forms each micro-batch's next batch from it in turn): the engine with the fewest waiting, then running,
    requests, the first of equals, stands in for the one queue."""
    return min(range(len(engines)), key=lambda i: (engines[i].num_waiting, engines[i].num_running, i))


def round_robin(ranks: list[Scheduler], turn: int, now: float) -> int:
    """SGLang's default choice: the ranks in turn."""
    return turn % len(ranks)


class DataParallelRanks(SchedulerDefaults):
    """The schedulers of one DP-attention group's ranks behind the one-scheduler interface the engine drives: a
    step is every rank's plan at once (each request labelled with its rank), committed rank by rank. A request's
    rank is noted in its `extra["dp_rank"]` for the per-request table (under P/D, the decode pool's)."""

    def __init__(
        self,
        ranks: list[Scheduler],
        pick: Callable[[list[Scheduler], int, float], int],
        turns: Iterator[int] | None = None,
    ):
        """`turns`: requests sent so far, counted by a replica's engines together (SGLang's one controller)."""
        self.ranks, self.pick = ranks, pick
        self._turns = turns if turns is not None else count()
        self._home: dict[int, int] = {}  # request id -> its rank, until it is done here
        self.kv = RanksKV(ranks, self._home)
        self._parts: dict[int, list[StepPlan]] = {}  # id(merged plan) -> each rank's plan
        self._now = 0.0  # when the group last planned: a P/D hand-off's time

    @property
    def num_waiting(self) -> int:
        return sum(rank.num_waiting for rank in self.ranks)

    @property
    def num_running(self) -> int:
        return sum(rank.num_running for rank in self.ranks)

    def _send(self, req: Request, now: float) -> Scheduler:
        """The rank `req` lives on from now: chosen by `pick`."""
        index = self._home[req.id] = req.extra["dp_rank"] = self.pick(self.ranks, next(self._turns), now)
        return self.ranks[index]

    def _rank_of(self, req: Request) -> Scheduler:
        return self.ranks[self._home[req.id]]

    def add(self, req: Request, now: float) -> None:
        self._send(req, now).add(req, now)

    def offer(self, req: Request, on_reserved: Callable[[Request], None]) -> None:
        """P/D decode pool: a prefilled request goes to a rank, which reserves its blocks (the balancer's clock:
        the group's last planning, at most a step before)."""
        self._send(req, self._now).offer(req, on_reserved)

    def accept(self, req: Request, now: float) -> None:
        self._rank_of(req).accept(req, now)

    def grant_offers(self) -> None:
        """P/D decode pool, pushed KV: each rank reserves for its queued offers at once."""
        for rank in self.ranks:
            rank.grant_offers()

    def release(self, req: Request) -> None:
        """P/D prefill pool: the decode side holds the request's KV, its rank frees it."""
        self.ranks[self._home.pop(req.id)].release(req)

    def pipeline(self, depth: int) -> None:
        for rank in self.ranks:
            rank.pipeline(depth)

    @property
    def pipelined(self) -> bool:
        return all(rank.pipelined for rank in self.ranks)

    @property
    def blocks_to_run(self) -> Callable[[int, tuple[int | None, ...], int], int] | None:
        """The ranks' bound on a request's blocks (`TokenBudgetScheduler.blocks_to_run`), where they have one."""
        return self.ranks[0].blocks_to_run

    def schedule(self, now: float) -> StepPlan:
        self._now = now
        parts = [rank.schedule(now) for rank in self.ranks]
        plan = merge(parts)
        if not plan.is_empty:
            self._parts[id(plan)] = parts
        return plan

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        """Each rank commits its own plan (a rank that planned nothing ran an empty batch: nothing to commit).
        Requests done here are forgotten; a P/D prefill pool's handed-off ones hold their blocks until `release`."""
        parts = self._parts.pop(id(plan), None)
        if parts is None:  # a plan that only preempted: nothing ran
            return []
        done = list(
            chain.from_iterable(
                rank.commit(part, now) for rank, part in zip(self.ranks, parts) if not part.is_empty
            )
        )
        for req in done:
            if req.phase is Phase.FINISHED:
                self._home.pop(req.id, None)
        return done


def merge(parts: list[StepPlan]) -> StepPlan:
    """One step of every rank's plan: requests in rank order, each labelled with its rank. Draft guesses (and draft
    contexts) are kept where any rank drafts: a rank that does not draft this step has none (and -1, skipped)."""

    def joined(field: str, filler) -> tuple:
        if not any(getattr(part, field) for part in parts):
            return ()
        return tuple(
            chain.from_iterable(getattr(part, field) or (filler,) * len(part.requests) for part in parts)
        )

    return StepPlan(
        requests=tuple(chain.from_iterable(part.requests for part in parts)),
        num_new=tuple(chain.from_iterable(part.num_new for part in parts)),
        num_context=tuple(chain.from_iterable(part.num_context for part in parts)),
        samples=tuple(chain.from_iterable(part.samples for part in parts)),
        preempted=tuple(chain.from_iterable(part.preempted for part in parts)),
        swap_out_blocks=sum(part.swap_out_blocks for part in parts),
        swap_in_blocks=sum(part.swap_in_blocks for part in parts),
        rank_swap_blocks=max(part.swap_in_blocks + part.swap_out_blocks for part in parts) if parts else 0,
        num_draft=joined("num_draft", 0),
        fed_to_draft=joined("fed_to_draft", False),
        rank=tuple(chain.from_iterable((index,) * len(part.requests) for index, part in enumerate(parts))),
    )
