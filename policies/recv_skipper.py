"""SGLang's `--scheduler-recv-interval` (scheduler_recv_skipper.py, 0.5.x): the scheduler reads its socket of new
requests only once its loop has run batches weighing `interval`, to save the receive's host time while decoding.

Each pass of SGLang's loop adds the weight of the batch the pass before ran (a decode, a verify pass or none: 1;
anything else, a prefill or mixed batch: 1000) and receives when the sum reaches the interval, then starts again
from 0. So while decoding, a new request waits up to `interval` decode steps; after a prefill it is taken at once.
An idle loop passes in microseconds, so an idle engine takes a request as it comes. SGLang 0.5 refuses it under
DP attention.
"""

from __future__ import annotations

from collections.abc import Callable

from servesim.workloads.request import Request

DECODE_WEIGHT = 1  # SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DECODE, _TARGET_VERIFY and _NONE (no last batch)
DEFAULT_WEIGHT = 1000  # SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT: any other last batch


class RecvSkipper:
    """The requests sent to the scheduler but not yet read (`socket`), and the weight counted since the last read."""

    def __init__(self, interval: int):
        self.interval, self.counter = interval, 0
        self.socket: list[Request] = []

    def pass_after(self, prefilled: bool, receive: Callable[[Request], None]) -> None:
        """One pass of the loop after a batch that `prefilled` or not: read the socket into `receive` if due."""
        self.counter += DEFAULT_WEIGHT if prefilled else DECODE_WEIGHT
        if self.counter >= self.interval:
            self.read(receive)

    def read(self, receive: Callable[[Request], None]) -> None:
        """Read everything sent so far (as the idle loop soon does)."""
        self.counter = 0
        for req in self.socket:
            receive(req)
        self.socket = []

    def decoded(self, num_steps: int) -> None:
        """`num_steps` passes after decodes with nothing sent: the counter goes round as they read nothing."""
        self.counter = (self.counter + num_steps) % self.interval
