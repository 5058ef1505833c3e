"""Reference numbers about prompt sharing, for checking the simulator's prefix caches against."""

from __future__ import annotations

from collections.abc import Iterable

from servesim.workloads.request import Request, output_segment_id


def ideal_prefix_hit_tokens(requests: Iterable[Request], include_outputs: bool = True) -> int:
    """Prompt tokens an infinite cache of whole runs hits when `requests` are served one at a time, in
    the order given (arrival order; each follow-up after its previous turn).

    A request hits its leading runs up to the first run whose chain (that run and every run before it)
    no earlier request had. Runs match on (segment id, tokens): a run that only partly overlaps an
    earlier one is a miss. After a request its prompt chain is cached and, with `include_outputs`, its
    answer run (output_segment_id(id), num_output_tokens) too, as vLLM and SGLang cache generated tokens.
    """
    children: dict[tuple[int, tuple[int, int]], int] = {}  # (parent node, run) -> node; the root is 0
    hit_tokens = 0
    for req in requests:
        node, matching = 0, True
        for run in req.segments():
            child = children.get((node, run))
            if child is None:
                matching, child = False, len(children) + 1
                children[(node, run)] = child
            elif matching:
                hit_tokens += run[1]
            node = child
        if include_outputs:
            children.setdefault((node, (output_segment_id(req.id), req.num_output_tokens)), len(children) + 1)
    return hit_tokens
