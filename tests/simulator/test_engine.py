"""The engine loop: what a step that runs nothing but preempts costs and logs."""

import pytest
import simpy

from servesim.policies.kv_blocks import BlockManager
from servesim.policies.step import SchedulerDefaults, StepPlan
from servesim.simulator.world.engine import Replica
from servesim.simulator.world.step_table import StepLog
from servesim.workloads.request import Request


class _PreemptsOnce(SchedulerDefaults):
    """A scheduler whose first plan swaps one request out and runs nothing, then has nothing to do."""

    def __init__(self, swap_out_blocks: int):
        self.kv, self.num_running, self.num_waiting = BlockManager(100, 16), 0, 1
        self.plans = [
            StepPlan((), (), (), (), preempted=(Request(0, 0.0, 10, 1),), swap_out_blocks=swap_out_blocks)
        ]

    def schedule(self, now: float) -> StepPlan:
        return self.plans.pop() if self.plans else StepPlan((), (), (), ())


@pytest.mark.parametrize("swapped, seconds", [(8, 8 * 1e-3), (0, 0.0)])
def test_a_step_that_only_preempts_takes_its_swap_out_time_and_is_logged(swapped, seconds):
    """8 blocks swapped out at 1 ms each (the step time model's PCIe price here) hold the engine 8 ms; the step
    log keeps the preemption either way."""
    env, steps = simpy.Environment(), StepLog()
    Replica(env, 0, _PreemptsOnce(swapped), lambda plan: plan.swap_out_blocks * 1e-3, steps, lambda req: None)
    env.run(until=1.0)
    frame = steps.table().frame()
    assert frame[["time_s", "duration_s", "num_requests", "num_preempted"]].values.tolist() == [
        [seconds, seconds, 0, 1]
    ]
