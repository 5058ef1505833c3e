"""Exact token identity of a request without token ids: its prompt runs, then the tokens it generated.

Token k of run (segment, length) is identified by (segment, k). A request's tokens are its prompt
runs (`Request.segments()`) followed by its generated tokens, the run
(`output_segment_id(request.id)`, num_generated). Two requests share exactly the tokens of their
common leading runs, which is what vLLM's block hashes and SGLang's radix tree match on.
"""

from __future__ import annotations

from servesim.workloads.request import Request, output_segment_id

Piece = tuple[int, int, int]  # (segment id, offset in the segment, tokens)


def request_runs(req: Request) -> list[tuple[int, int]]:
    """(segment id, tokens) runs of everything the request has: prompt, then generated tokens."""
    runs = list(req.segments())
    if req.num_generated:
        runs.append((output_segment_id(req.id), req.num_generated))
    return runs


def pieces(runs: list[tuple[int, int]], start: int, end: int) -> tuple[Piece, ...]:
    """The tokens [start, end) of a run list, as (segment, offset, length) pieces."""
    out, position = [], 0
    for segment, length in runs:
        lo, hi = max(start, position), min(end, position + length)
        if lo < hi:
            out.append((segment, lo - position, hi - lo))
        position += length
        if position >= end:
            break
    return tuple(out)


def _code(segment: int) -> int:
    """A non-negative code per segment id. CPython hashes -1 and -2 alike (hash(-1) == -2), which would make
    the unique runs of requests 0 and 1 hash alike; zig-zag coding keeps ids distinct and non-negative."""
    return 2 * segment if segment >= 0 else -2 * segment - 1


def block_hashes(req: Request, num_tokens: int, block_size: int) -> list[int]:
    """Chained hashes of (at least) the full blocks among the request's first `num_tokens` tokens (vLLM's
    scheme: each block hashes its parent's hash with its own tokens). The memo on the request, one per block size
    (the prefill and decode pools of a P/D run may differ), is returned itself, not copied: read only its first
    `num_tokens // block_size` entries."""
    cached = req.extra.setdefault(("block_hashes", block_size), [])
    full = num_tokens // block_size
    if len(cached) < full:
        _extend_hashes(cached, request_runs(req), full, block_size)
    return cached


def forget_block_hashes(req: Request) -> None:
    """Drop `req`'s hash memos (a finished request's blocks keep theirs in the pool); recomputed alike if needed."""
    for key in [k for k in req.extra if isinstance(k, tuple) and k[0] == "block_hashes"]:
        del req.extra[key]


def _extend_hashes(cached: list[int], runs: list[tuple[int, int]], full: int, block_size: int) -> None:
    """Append hashes until `full` blocks are hashed, walking the runs once. A block inside one run (the common
    case) hashes the flat tuple (parent, segment code, offset, size); a block spanning runs hashes
    (parent, pieces), which can never equal a flat tuple."""
    parent = cached[-1] if cached else None
    start, position, partial, missing = len(cached) * block_size, 0, [], block_size
    for segment, length in runs:
        if position + length <= start:
            position += length
            continue
        code, offset = _code(segment), max(0, start - position)
        while offset < length and len(cached) < full:
            if not partial and length - offset >= block_size:
                parent = hash((parent, code, offset, block_size))
                cached.append(parent)
                offset += block_size
                continue
            take = min(length - offset, missing)
            partial.append((code, offset, take))
            offset, missing = offset + take, missing - take
            if not missing:
                parent = hash((parent, *partial[0])) if len(partial) == 1 else hash((parent, tuple(partial)))
                cached.append(parent)
                partial, missing = [], block_size
        position += length
        if len(cached) >= full:
            return
