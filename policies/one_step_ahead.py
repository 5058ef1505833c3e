"""Planning one step ahead of the GPU: vLLM's async scheduling (its default since v0.14) and SGLang's
overlap scheduler (its default since 0.4).

vLLM schedules step N+1 as step N starts on the GPU, before N's outputs are known: N+1 reads the tokens N
samples on the GPU. The simulated engine plans N+1 when N ends, so it must forget what vLLM could not yet have
seen then:
- a request that arrived while N ran came after N+1 was planned: it is first scheduled in N+2;
- a request that finished in N still holds its batch slot and KV blocks while N+1 is planned. vLLM frees
  them as it processes N's outputs, in time for N+2; short of blocks, N+1's preemption pops it first if it
  sits last in vLLM's running list (`TokenBudgetScheduler._pop_finished`).
If N+1 turns out empty, vLLM's engine waits for N's outputs and plans again with everything. Then the
freed slots and blocks and the new arrivals are all there, as they would be without async scheduling.

What stays as it is synchronously:
- the first decode follows the last prefill chunk at once (the sampled token stays on the GPU);
- chunks of a prompt follow one another at once;
- no step is wasted on a finished request. Requests stop at their oracle length, as max_tokens does, and
  vLLM sees that coming. An EOS stop would cost one more decode; it is not modelled. (SGLang does not look
  ahead: there a finished request decodes once more, policies/prefill_first.py.)
"""

from __future__ import annotations

from collections.abc import Callable

from servesim.policies.step import StepPlan
from servesim.workloads.request import Phase, Request


class OneStepAhead:
    """What a scheduler planning one step ahead has not seen yet: arrivals during the step in flight, and
    finishes whose slots and blocks are still held."""

    #: steps planned before an arrival is seen: the step after the one it arrives in was planned without it
    arrival_lag_steps = 1

    def __init__(self) -> None:
        self.inbox: list[tuple[float, Request]] = []  # (arrival at the engine, request), in arrival order
        self.retiring: list[Request] = []  # finished in the step that just ended, blocks and slot still held
        self.in_flight_since: float | None = None  # when the step now ending was scheduled; None: no step ran
        self.unchanged = True  # nothing was freed after the last plan was made

    def settled(self, waiting: bool) -> bool:
        """Whether the next plan sees what the last one saw: no arrival is waiting to be seen, and, if a request
        `waiting` could be admitted, no slot or block was freed after the last plan was made."""
        return not self.inbox and (self.unchanged or not waiting)

    @property
    def pending(self) -> bool:
        """Whether an empty plan now would be made again, with arrivals or freed slots it did not see."""
        return bool(self.inbox or self.retiring)

    def fused_until(self, last_start_s: float) -> None:
        """Fast-forward ran steps up to one planned at `last_start_s`: the next plan sees the arrivals that came
        before it, as stepping would."""
        if self.in_flight_since is not None:
            self.in_flight_since = last_start_s

    def arrive(self, req: Request, now: float) -> None:
        self.inbox.append((now, req))

    def hold(self, req: Request, now: float) -> None:
        """`req` finished at `now`; its slot and blocks stay taken until the next plan is made."""
        req.phase, req.finish_s = Phase.FINISHED, now
        self.retiring.append(req)

    def seen(self) -> list[Request]:
        """Take the arrivals that the step ending now's planning already saw (all of them if no step ran)."""
        cutoff = self.in_flight_since
        seen = [req for t, req in self.inbox if cutoff is None or t <= cutoff]
        self.inbox = [(t, req) for t, req in self.inbox if cutoff is not None and t > cutoff]
        return seen

    def take_all(self) -> list[Request]:
        """Every arrival: the engine waited for the step's outputs, so nothing is ahead of it any more."""
        arrived = [req for _, req in self.inbox]
        self.inbox = []
        return arrived

    def release(self) -> list[Request]:
        """The finished requests whose slots and blocks free now."""
        done, self.retiring = self.retiring, []
        return done

    def schedule(
        self,
        now: float,
        plan: Callable[[], StepPlan],
        queue: Callable[[Request], None],
        free: Callable[[list[Request]], None],
    ) -> StepPlan:
        """The step planned at `now` by a scheduler one step ahead: `plan` sees the arrivals the step in flight's
        planning saw (`queue` puts them in the waiting queue), and requests that finished in it still hold their
        slots and blocks (`free` frees them once the plan is made)."""
        for req in self.seen():
            queue(req)
        result = plan()
        if result.is_empty and not result.preempted and self.pending:
            # nothing to run: the engine waits for the outputs in flight, then plans again
            free(self.release())
            for req in self.take_all():
                queue(req)
            self.in_flight_since = None  # nothing in flight now: the new plan is made as it is
            result = plan()
        done = self.release()
        free(done)
        self.unchanged = not done
        self.in_flight_since = None if result.is_empty else now
        return result
