"""A pipeline-parallel replica's stages as SimPy resources, shared by its micro-batches in flight (one engine's
batch queue, or the micro-batch engines of a scheduler without one: simulator/world/run.py).

vLLM runs pp micro-batches in flight on a replica of pp stages: each stage's GPUs run one micro-batch at a
time, and a micro-batch goes through the stages in order, waiting wherever the stage ahead is busy with
another. So equal micro-batches overlap fully (pp in flight, each a whole pass long), while a long one (a big
prefill chunk) holds each stage it reaches and the short ones behind it wait: the busiest stage, not the sum
of the micro-batches, limits the replica.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import simpy

from servesim.policies.step import StepPlan

StageTimes = Callable[[StepPlan], list[float]]


class StagePipeline:
    """The stages of one replica: `run(plan)` moves one micro-batch through them."""

    def __init__(self, env: simpy.Environment, num_stages: int, stage_times: StageTimes):
        self.env, self.stage_times = env, stage_times
        self.stages = [simpy.Resource(env, capacity=1) for _ in range(num_stages)]

    def run(self, plan: StepPlan) -> Generator[simpy.Event, object, float]:
        """Pass `plan`'s micro-batch through every stage, first come first served at each; returns its busy
        seconds (the sum of its stage times; the wall time adds the waits)."""
        times = self.stage_times(plan)
        for stage, time_s in zip(self.stages, times, strict=True):
            with stage.request() as turn:  # released when this stage is done: it takes the next micro-batch
                yield turn
                yield self.env.timeout(time_s)
        return sum(times)
