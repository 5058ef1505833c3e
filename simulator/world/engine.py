"""One replica's engine as a SimPy process: schedule -> price the step -> spend its time -> apply it.

Every decision comes from the scheduler (a policy object) and every duration from the step-time
function; the process only moves simulated time. At equal timestamps SimPy runs events in the
order they were scheduled, so a request arriving exactly when a step ends is seen by the next
schedule if its arrival event was created first (open-loop arrivals always are: they are all
scheduled up front by the arrival process's single timeout chain).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

import simpy

from servesim.hardware.step_timer import StepTimer
from servesim.policies.data_parallel import VllmBalancer
from servesim.policies.step import Scheduler, StepPlan, TokenLog
from servesim.simulator.world.chunk_stretch import plan_chunk_stretch
from servesim.simulator.world.fast_forward import Stretch, apply_stretch, plan_stretch, wait_until
from servesim.simulator.world.step_table import StepLog
from servesim.simulator.world.pipeline_stages import StagePipeline
from servesim.workloads.request import Request

StepTime = Callable[[StepPlan], float]


class FastForward:
    """What a replica needs to fuse decode stretches: the timer, the token log, the time of the next
    outside event that could reach any replica, and the stop time. `open_loop`: nobody outside reacts to a finish,
    so finishes may happen inside stretches. `past_arrivals` (open loop only): what happens at an arrival reads
    nothing a fused step after it changes early (the router does not read KV usage; no SLO watch stops the run
    there with that step's tokens counted), so a stretch may run the steps planned before the arrival was seen
    (`Scheduler.arrival_lag_steps`)."""

    def __init__(
        self,
        timer: StepTimer,
        log: TokenLog,
        next_event_s: Callable[[], float],
        stop_s: float,
        open_loop: bool,
        past_arrivals: bool = False,
    ):
        self.timer, self.log, self.next_event_s, self.stop_s = timer, log, next_event_s, stop_s
        self.open_loop, self.past_arrivals = open_loop, past_arrivals


class Wakeup:
    """Lets an idle engine sleep until someone gives it work. SimPy runs one process at a time, so no race."""

    def __init__(self, env: simpy.Environment):
        self.env, self._event = env, env.event()

    def wait(self) -> simpy.Event:
        return self._event

    def notify(self) -> None:
        if not self._event.triggered:
            self._event.succeed()
            self._event = self.env.event()


class EngineGroup:
    """Engines the cluster's router sees as one replica, each with a scheduler of its own, and how the replica
    hands each request to one of them (`pick(schedulers, turn, now)` -> position):
    - vLLM's data-parallel ranks of a dense model (no MoE collective keeps them in step): its DP load balancer,
      the lowest 4 x waiting + running (`policies.data_parallel.VllmBalancer`), the rank noted as `dp_rank`;
    - a replica's pipeline micro-batch engines (SGLang, TensorRT-LLM), which share its KV pool and take requests
      from one waiting queue: the engine whose queue is shortest (`policies.data_parallel.shortest_queue`)."""

    def __init__(
        self, index: int, ranks: list[Replica], pick: Callable | None = None, labels_rank: bool = True
    ):
        self.index, self.ranks = index, ranks
        self.balance = pick or VllmBalancer()
        self.labels_rank = labels_rank
        self.entering = 0  # requests in its API server

    @property
    def num_outstanding(self) -> int:
        return sum(rank.num_outstanding for rank in self.ranks) + self.entering

    @property
    def kv_usage(self) -> float:
        """The fullest rank's, as a MoE model's ranks report it (`policies.data_parallel.RanksKV`); micro-batch
        engines share one pool."""
        return max(rank.kv_usage for rank in self.ranks)

    def submit(self, req: Request) -> None:
        # neither pick reads the turn (round_robin, which would, is a DP-attention group's)
        k = self.balance([rank.scheduler for rank in self.ranks], 0, self.ranks[0].env.now)
        if self.labels_rank:
            req.extra["dp_rank"] = k
        self.ranks[k].submit(req)


class Replica:
    """An engine replica: its scheduler (with KV manager), its step-time model and its step log."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        scheduler: Scheduler,
        step_time: StepTime,
        steps: StepLog,
        on_finish: Callable[[Request], None],
        fast_forward: FastForward | None = None,
        pipeline: StagePipeline | None = None,
    ):
        self.env, self.index, self.scheduler, self.step_time = env, index, scheduler, step_time
        self.steps, self.on_finish, self.fast_forward = steps, on_finish, fast_forward
        self.pipeline = (
            pipeline  # pipeline parallel: the stages its micro-batches (or its siblings') pass through
        )
        self.wake = Wakeup(env)
        self.entering = 0  # requests in its API server (a DP rank's are its group's)
        # engines sharing this one's KV pool: a replica's pipeline micro-batches
        self.siblings: list[Replica] = []
        pipelined = pipeline is not None and scheduler.pipelined
        self.process = env.process(self._run_pipelined() if pipelined else self._run())

    def wake_pool(self) -> None:
        """Blocks of the shared pool came back: wake this engine and its siblings, whose waiting requests
        they may admit."""
        for replica in (self, *self.siblings):
            replica.wake.notify()

    @property
    def num_outstanding(self) -> int:
        return self.scheduler.num_waiting + self.scheduler.num_running + self.entering

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv.usage

    def submit(self, req: Request) -> None:
        req.replica = self.index
        self.scheduler.add(req, self.env.now)
        self.wake.notify()

    def _run(self):
        while True:
            plan = self.scheduler.schedule(self.env.now)
            # the blocks it gave back may admit a sibling's waiting request
            if plan.preempted and self.siblings:
                self.wake_pool()
            if plan.is_empty:
                if plan.preempted:  # a step that only preempted is followed at once by one that admits
                    yield from self._only_preempted(plan)
                else:
                    yield self.wake.wait()
                continue
            plan.mark_scheduled(self.env.now)
            fused = self._stretch(plan)
            if fused is not None:
                # the last fused steps may span an arrival: each ends, and is logged, live, as a stepped run would
                for at, end in fused:
                    yield from wait_until(self.env, at)
                    end()
                continue
            decode_tokens = plan.num_decode_tokens  # before commit turns prefills into decodes
            if self.pipeline is None:
                duration = self.step_time(plan)
                yield self.env.timeout(duration)
            else:  # a pipeline stage busy with a sibling's micro-batch holds this one up
                duration = yield from self.pipeline.run(plan)
            self._commit(plan, duration, decode_tokens)

    def _run_pipelined(self):
        """vLLM V1's batch queue under pipeline parallelism: schedule while fewer than pp steps are in flight,
        else (or when nothing can be scheduled) wait for the oldest to leave the last stage and commit it. A
        request arriving meanwhile is seen at the next schedule, as vLLM's engine core blocks on that step."""
        in_flight: deque[tuple[StepPlan, simpy.Process, int]] = deque()
        while True:
            if len(in_flight) < len(self.pipeline.stages):
                plan = self.scheduler.schedule(self.env.now)
                if plan.preempted and plan.is_empty:
                    yield from self._only_preempted(plan)
                    continue
                if not plan.is_empty:
                    plan.mark_scheduled(self.env.now)
                    in_flight.append(
                        (plan, self.env.process(self.pipeline.run(plan)), plan.num_decode_tokens)
                    )
                    continue
            if not in_flight:
                yield self.wake.wait()
                continue
            plan, step, decode_tokens = in_flight.popleft()
            duration = yield step
            self._commit(plan, duration, decode_tokens)

    def _only_preempted(self, plan: StepPlan):
        """A schedule that ran nothing but preempted: its swap-out over PCIe (if any) takes its time, and the step
        log keeps the preemptions."""
        duration = self.step_time(plan)
        if duration:
            yield self.env.timeout(duration)
        self._record(duration, 0, 0, 0, len(plan.preempted))

    def _commit(self, plan: StepPlan, duration: float, decode_tokens: int) -> None:
        """Apply a step that has just ended, log it, and hand on the requests it finished."""
        finished = self.scheduler.commit(plan, self.env.now)
        self._record(
            duration, len(plan.requests), plan.num_tokens - decode_tokens, decode_tokens, len(plan.preempted)
        )
        self._hand_on(finished)

    def _stretch(self, plan: StepPlan) -> list[tuple[float, Callable[[], None]]] | None:
        """Fuse the steps from here to the next event, if this step starts a decode stretch or a chunked prefill
        beside decodes. Logs the fused steps that end before the next event; the caller ends the others when their
        time comes (logging them, and for the last its window frees and finishes): returns (when, what) for each."""
        planned = self._plan_stretch(plan)
        if planned is None:
            return None
        requests, stretch = planned
        scheduler, ff = self.scheduler, self.fast_forward
        kv, in_flight = scheduler.kv, scheduler.decode_tokens_in_flight
        finished: list[Request] = []

        def retire(req: Request, now: float) -> None:
            scheduler.retire(req, now)
            finished.append(req)

        late = scheduler.release_retired if scheduler.holds_finished else None
        active, used, usage, end_last = apply_stretch(
            requests,
            stretch,
            kv,
            ff.log,
            retire,
            late,  # late: async
            in_flight,
        )
        scheduler.fused_decode_steps(len(stretch.ends_s) - 1, float(stretch.ends_s[-2]))
        # logged now: the steps that end before the next event; those planned before it was seen end after it
        n, prefilling = len(active) - 1 - stretch.lagged, int(stretch.prefill is not None)
        prefill_tokens = list(stretch.chunks) or [0] * len(active)
        requests_in = active + prefilling  # the decodes and the prefill beside them, per step

        def log_steps(lo: int, hi: int) -> None:
            """Steps lo..hi-1's rows; the requests waiting are those waiting when this is called."""
            count = hi - lo
            self.steps.record_many(
                time_s=stretch.ends_s[lo:hi],
                duration_s=stretch.durations_s[lo:hi],
                replica=[self.index] * count,
                num_requests=requests_in[lo:hi],
                prefill_tokens=prefill_tokens[lo:hi],
                decode_tokens=active[lo:hi],
                num_running=requests_in[lo + 1 : hi + 1],
                num_waiting=[scheduler.num_waiting] * count,
                kv_blocks_used=used[lo:hi],
                kv_usage=usage[lo:hi],
                num_preempted=[0] * count,
            )

        log_steps(0, n)
        self._hand_on(finished)

        def end_last_step() -> None:
            end_last()
            self._hand_on(finished)
            last = int(active[-1])
            self._record(float(stretch.durations_s[-1]), last + prefilling, prefill_tokens[-1], last, 0)

        # a step that ends after the next event is logged as it ends: those waiting then include the arrival
        moments = [
            (float(stretch.ends_s[i]), partial(log_steps, i, i + 1)) for i in range(n, len(active) - 1)
        ]
        return moments + [(float(stretch.ends_s[-1]), end_last_step)]

    def _plan_stretch(self, plan: StepPlan) -> tuple[list[Request], Stretch] | None:
        """The decoding requests and the steps to fuse from `plan` on, if any."""
        ff, scheduler = self.fast_forward, self.scheduler
        if ff is None or not scheduler.kv.supports_fast_forward:
            return None
        finishes_allowed = ff.open_loop and scheduler.num_waiting == 0 and scheduler.finishes_fuse
        lag_steps = scheduler.arrival_lag_steps if ff.past_arrivals else 0
        requests = scheduler.decode_stretch(plan)
        if requests:
            requests = list(requests)
            stretch = plan_stretch(
                requests,
                scheduler.kv,
                ff.timer,
                self.env.now,
                ff.next_event_s(),
                ff.stop_s,
                finishes_allowed,
                waiting=scheduler.admission_waits_for_blocks,
                in_flight=scheduler.decode_tokens_in_flight,
                lag_steps=lag_steps,
            )
        else:
            mixed = scheduler.chunk_stretch(plan) if self.pipeline is None else None
            if mixed is None:
                return None
            requests, prefill, chunk_of = mixed
            stretch = plan_chunk_stretch(
                requests,
                prefill,
                plan.num_new[-1],
                scheduler.kv,
                chunk_of,
                ff.timer.lists_s,  # a mixed step has no draft or swap to add
                self.env.now,
                ff.next_event_s(),
                ff.stop_s,
                finishes_allowed,
                scheduler.num_waiting > 0,
                ff.timer.chunk_step_pricer,
            )
        return None if stretch is None else (requests, stretch)

    def _hand_on(self, finished: list[Request]) -> None:
        """Hand on the finished requests (and forget them)."""
        for req in finished:
            self.on_finish(req)
        finished.clear()

    def _record(
        self, duration: float, num_requests: int, prefill_tokens: int, decode_tokens: int, num_preempted: int
    ) -> None:
        kv = self.scheduler.kv
        self.steps.record(
            self.env.now,
            duration,
            self.index,
            num_requests,
            prefill_tokens,
            decode_tokens,
            self.scheduler.num_running,
            self.scheduler.num_waiting,
            kv.num_used_blocks,
            kv.usage,
            num_preempted,
        )
