"""Pipeline stages shared by a replica's micro-batch engines: each stage runs one micro-batch at a time."""

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.simulator.world.pipeline_stages import StagePipeline


def _run(num_stages: int, steps: list[list[tuple[float, ...]]]) -> list[list[tuple[float, float]]]:
    """Engines stepping back to back (each step's stage times given), all from t=0 in engine order:
    per engine, each step's (end time, busy seconds)."""
    env = simpy.Environment()
    pipeline = StagePipeline(env, num_stages, lambda plan: list(plan))
    ends: list[list[tuple[float, float]]] = [[] for _ in steps]

    def engine(i: int):
        for times in steps[i]:
            busy = yield from pipeline.run(times)
            ends[i].append((env.now, busy))

    for i in range(len(steps)):
        env.process(engine(i))
    env.run()
    return ends


def test_a_short_micro_batch_waits_behind_a_long_one_at_every_stage():
    """A: 3 s on each of 2 stages, B: 1 s each, both planned at t=0. A holds stage 0 until 3, stage 1 until 6;
    B takes stage 0 at 3 and stage 1 only when A leaves it: B ends at 7, not at 2."""
    assert _run(2, [[(3.0, 3.0)], [(1.0, 1.0)]]) == [[(6.0, 6.0)], [(7.0, 2.0)]]


def test_equal_micro_batches_overlap_so_each_engine_steps_once_per_pass():
    """Two engines of 2 s per stage: after B's first step waits 2 s for stage 0, both step every 4 s, a whole
    pass, so the replica does two steps per pass where one engine alone would do one."""
    ends = _run(2, [[(2.0, 2.0)] * 5, [(2.0, 2.0)] * 5])
    assert [end for end, _ in ends[0]] == [4.0, 8.0, 12.0, 16.0, 20.0]
    assert [end for end, _ in ends[1]] == [6.0, 10.0, 14.0, 18.0, 22.0]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 4).flatmap(
        lambda pp: st.lists(st.tuples(*[st.integers(1, 9).map(float)] * pp), min_size=1, max_size=6)
    )
)
def test_micro_batches_planned_together_finish_as_a_permutation_flow_shop(jobs):
    """Micro-batches all planned at t=0 (each engine's only step) pass the stages in that order, none overtaking:
    job j leaves stage s at D[s][j] = max(D[s-1][j], D[s][j-1]) + t[s][j], the flow-shop recursion."""
    num_stages = len(jobs[0])
    done = [[0.0] * (len(jobs) + 1) for _ in range(num_stages + 1)]
    for s in range(1, num_stages + 1):
        for j in range(1, len(jobs) + 1):
            done[s][j] = max(done[s - 1][j], done[s][j - 1]) + jobs[j - 1][s - 1]
    ends = _run(num_stages, [[job] for job in jobs])
    assert [engine[0] for engine in ends] == [
        (done[num_stages][j], sum(jobs[j - 1])) for j in range(1, len(jobs) + 1)
    ]
