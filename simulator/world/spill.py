"""Run logs that outgrow memory move to temporary files in chunks, so a run's memory does not grow with its length.

A million requests log ~27 M engine steps and ~200 M inter-token gaps (~4 GB held as arrays); spilled, a run keeps
one chunk of each in memory, and the gaps go to disk as tallies (each step's gap repeats once per request in it).
Figures over spilled values are exact: percentiles select the ranked values in a few passes over the chunks (radix
counts on the values' bits), as `np.percentile` would over all of them; sums are correctly rounded (`math.fsum`'s
result over every value, summed exactly: `ExactSum`), so they do not depend on the order values were logged in (a
fused run logs them in another order than a stepped one) and differ from numpy's over one array only in rounding.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from numba import njit

#: gaps held in memory before they move to disk (32 MiB)
SPILL_VALUES = 1 << 22
#: values read back at a time
READ_VALUES = 1 << 21
#: a radix bucket this small is read back whole and sorted
SORT_VALUES = 1 << 20


class SpillDir:
    """A temporary folder made on first use and removed with its owner (or at exit)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._path: Path | None = None

    def file(self, name: str) -> Path:
        if self._path is None:
            self._path = Path(tempfile.mkdtemp(prefix=self.prefix))
            weakref.finalize(self, shutil.rmtree, self._path, True)
        return self._path / name


class SpilledFloats:
    """Float64 values moved to a temporary file in chunks, each chunk as its distinct values and how often each
    came (an ITL log repeats each step's gap once per request in the step: ~50x fewer pairs than values); `spill`
    moves an array's values there (and empties it), `gathered` gives them back with what stayed in memory."""

    def __init__(self, prefix: str) -> None:
        self._dir = SpillDir(prefix)
        self.count = 0  # values spilled
        self._pairs = 0  # (value, count) pairs on disk

    def spill(self, values: array | np.ndarray) -> None:
        """Move `values` to disk: an array.array is emptied; a numpy array is left to its owner."""
        distinct, counts = tally(np.frombuffer(values, float) if isinstance(values, array) else values)
        for name, column in (("values.bin", distinct), ("counts.bin", counts)):
            with open(self._dir.file(name), "ab") as handle:
                handle.truncate(self._pairs * 8)  # what a failed write left after the pairs counted
                column.tofile(handle)
        self._pairs += len(distinct)
        self.count += len(values)
        if isinstance(values, array):
            del values[:]

    def gathered(self, rest: array) -> np.ndarray | Callable[[], Iterator[Tally]]:
        """The values spilled, then `rest`: an array if none were spilled, else a reader of their tallies."""
        if not self.count:
            return np.frombuffer(rest, float) if rest else np.array([])
        return lambda: self._chunks(rest)

    def _chunks(self, rest: array) -> Iterator[Tally]:
        values, counts = self._dir.file("values.bin"), self._dir.file("counts.bin")
        for offset in range(0, self._pairs, READ_VALUES):
            size = min(READ_VALUES, self._pairs - offset)
            yield (
                np.fromfile(values, float, size, offset=offset * 8),
                np.fromfile(counts, np.int64, size, offset=offset * 8),
            )
        if rest:
            yield tally(np.frombuffer(rest, float))


Tally = tuple[np.ndarray, np.ndarray]  # distinct float64 values (by their bits) and how often each came
#: values tallied at a time: the hash table stays ~16 MiB
TALLY_VALUES = 1 << 20
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: spreads near-equal keys over the table


@njit(cache=True)
def _tally_block(values):
    bits = values.view(np.uint64)
    shift = 1
    while (1 << shift) < 2 * len(values):
        shift += 1
    mask = (1 << shift) - 1
    slots = np.full(1 << shift, -1, np.int64)  # index of the distinct value a slot holds
    keys = np.empty(len(values), np.uint64)
    counts = np.empty(len(values), np.int64)
    found = 0
    for i in range(len(values)):
        key = bits[i]
        slot = np.int64((key * _FIBONACCI) >> np.uint64(64 - shift))
        while True:
            j = slots[slot]
            if j < 0:
                slots[slot], keys[found], counts[found] = found, key, 1
                found += 1
                break
            if keys[j] == key:
                counts[j] += 1
                break
            slot = (slot + 1) & mask
    return keys[:found].view(np.float64).copy(), counts[:found].copy()


def tally(values: np.ndarray) -> Tally:
    """`values`' distinct values (by bits: -0.0 and 0.0 apart, each NaN kept), in first-seen order within blocks
    of TALLY_VALUES, and how often each came."""
    parts = [_tally_block(values[i : i + TALLY_VALUES]) for i in range(0, len(values), TALLY_VALUES)]
    if len(parts) == 1:
        return parts[0]
    return (
        np.concatenate([p[0] for p in parts] or [np.array([])]),
        np.concatenate([p[1] for p in parts] or [np.array([], np.int64)]),
    )


#: weight summed at a time: each exponent's 18-bit thirds times their weights then sum below 2**62, exact in int64
_SUM_WEIGHT = 1 << 44
#: every finite float64 is an integer times 2**-_SCALE (its 53-bit significand times 2**(exponent - 53))
_SCALE = 1074 + 53


@njit(cache=True)
def _exponent_sums(values, weights):
    """Per exponent (frexp's, -1073 to 1024, offset by 1074), the values' 53-bit significands times their weights
    (1 each where `weights` is None) summed as their three 18-bit thirds: exact in int64 while the weights sum
    below _SUM_WEIGHT (each third is below 2**18 in size)."""
    thirds = np.zeros((3, 2100), np.int64)
    for i in range(len(values)):
        significand, exponent = math.frexp(values[i])
        whole = np.int64(significand * 2.0**53)  # exact: a float64 has 53 significant bits
        weight = 1 if weights is None else weights[i]
        thirds[0, exponent + 1074] += (whole >> 36) * weight  # whole = high * 2**36 + middle * 2**18 + low
        thirds[1, exponent + 1074] += ((whole >> 18) & ((1 << 18) - 1)) * weight
        thirds[2, exponent + 1074] += (whole & ((1 << 18) - 1)) * weight
    return thirds


class ExactSum:
    """A running sum of float arrays (each value counted once, or as often as its weight says) kept exact, as an
    integer times 2**-_SCALE, so it takes chunks in any order and gives `math.fsum`'s correctly rounded result over
    every value, without a Python float per value: significands are split into thirds and summed per exponent."""

    def __init__(self) -> None:
        self._scaled = 0
        self._numpy = (
            0  # numpy's sum, chunk by chunk: the result where fsum would fail (infinities, NaN, overflow)
        )
        self._finite, self._negative_zeros = True, None

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        values = np.asarray(values, float).ravel()
        self._numpy += np.sum(values) if weights is None else np.sum(values * weights)
        if not len(values):
            return
        if self._finite and not np.isfinite(values).all():
            self._finite = False
        if not self._finite:
            return
        zeros = bool(
            np.signbit(values).all() and not values.any()
        )  # fsum keeps -0.0 only if every value is one
        self._negative_zeros = zeros if self._negative_zeros is None else self._negative_zeros and zeros
        for start, stop in _weight_slices(len(values), weights):
            thirds = _exponent_sums(values[start:stop], None if weights is None else weights[start:stop])
            for i in np.flatnonzero(thirds.any(axis=0)).tolist():
                part = (int(thirds[0, i]) << 36) + (int(thirds[1, i]) << 18) + int(thirds[2, i])
                self._scaled += part << (i - 1074 - 53 + _SCALE)

    def value(self) -> float:
        if self._finite:
            if self._negative_zeros:
                return -0.0
            try:
                return self._scaled / (1 << _SCALE)  # an integer quotient, correctly rounded
            except OverflowError:
                pass
        return float(self._numpy)


def _weight_slices(count: int, weights: np.ndarray | None) -> Iterator[tuple[int, int]]:
    """Slices of `count` values whose weights each sum below _SUM_WEIGHT."""
    if weights is None:
        yield from (
            (start, min(start + _SUM_WEIGHT - 1, count)) for start in range(0, count, _SUM_WEIGHT - 1)
        )
        return
    if len(weights) and (weights.min() < 0 or weights.max() >= _SUM_WEIGHT):
        raise ValueError(f"weights must lie in 0..2**44: got {weights.min()}..{weights.max()}")
    before = np.concatenate([[0], np.cumsum(weights)])  # weight before each value
    start = 0
    while start < count:
        stop = int(np.searchsorted(before, before[start] + _SUM_WEIGHT, "left")) - 1
        yield start, max(stop, start + 1)
        start = max(stop, start + 1)


def exact_sum(chunks: Callable[[], Iterable[np.ndarray]]) -> float:
    """The sum of every value `chunks()` yields, correctly rounded (`math.fsum`'s): the same in any order or chunking;
    numpy's where fsum cannot (infinities, overflow), whose result is then inf or nan in any order too."""
    total = ExactSum()
    for chunk in chunks():
        total.add(chunk)
    return total.value()


_SIGN = np.uint64(1 << 63)


@njit(cache=True)
def _sort_key(raw):
    """An unsigned key in the order of the floats (no NaN) from a float's bits: a negative's flipped, a positive's
    sign bit set."""
    return ~raw if raw & _SIGN else raw | _SIGN


@njit(cache=True)
def _in_bucket(key, prefix, bits):
    """Whether `key`'s top `bits` bits are `prefix` (every key is in the bucket of no bits)."""
    return bits == 0 or key >> (np.uint64(64) - bits) == prefix


@njit(cache=True)
def _count_digits(values, counts, prefix, bits, digits):
    """Add to `digits[d]` the counts of the values in bucket (`prefix`, `bits`) whose keys' next 16 bits are d."""
    shift = np.uint64(48) - bits
    raws = values.view(np.uint64)
    for i in range(len(raws)):
        key = _sort_key(raws[i])
        if _in_bucket(key, prefix, bits):
            digits[(key >> shift) & np.uint64(0xFFFF)] += counts[i]


@njit(cache=True)
def _bucket_keys(values, counts, prefix, bits):
    """The keys of the values in bucket (`prefix`, `bits`), and their counts."""
    raws = values.view(np.uint64)
    found = 0
    for raw in raws:
        found += _in_bucket(_sort_key(raw), prefix, bits)
    keys, kept, found = np.empty(found, np.uint64), np.empty(found, np.int64), 0
    for i in range(len(raws)):
        key = _sort_key(raws[i])
        if _in_bucket(key, prefix, bits):
            keys[found], kept[found] = key, counts[i]
            found += 1
    return keys, kept


def _from_key(key: int) -> float:
    bits = key & ~(1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array([bits], np.uint64).view(float)[0])


def ranked_values(chunks: Callable[[], Iterator[Tally]], total: int, ranks: list[int]) -> dict[int, float]:
    """The values at `ranks` (0 = smallest) of the `total` NaN-free values whose tallies `chunks()` yields, in passes
    over them: each pass counts the next 16 bits of the keys in the ranks' buckets, until a bucket is small enough
    to sort."""
    # rank -> (bucket prefix, bits of it, rank within the bucket, bucket size)
    state = {rank: (0, 0, rank, total) for rank in set(ranks)}
    found: dict[int, float] = {}
    while len(found) < len(state):
        buckets: dict[tuple[int, int], list[int]] = {}
        for rank, (prefix, bits, _, _) in state.items():
            if rank not in found:
                buckets.setdefault((prefix, bits), []).append(rank)
        digits = {b: np.zeros(1 << 16, np.int64) for b in buckets if state[buckets[b][0]][3] > SORT_VALUES}
        kept: dict[tuple[int, int], list[Tally]] = {b: [] for b in buckets if b not in digits}
        for chunk, counts in chunks():
            values = np.ascontiguousarray(chunk, float)
            for prefix, bits in buckets:
                if (prefix, bits) in digits:
                    _count_digits(values, counts, np.uint64(prefix), np.uint64(bits), digits[prefix, bits])
                else:
                    kept[prefix, bits].append(
                        _bucket_keys(values, counts, np.uint64(prefix), np.uint64(bits))
                    )
        for (prefix, bits), members in buckets.items():
            if (prefix, bits) in kept:
                keys = np.concatenate([k for k, _ in kept[prefix, bits]])
                order = np.argsort(keys, kind="stable")
                below = np.cumsum(np.concatenate([c for _, c in kept[prefix, bits]])[order])
                for rank in members:
                    found[rank] = _from_key(int(keys[order[np.searchsorted(below, state[rank][2], "right")]]))
                continue
            below = np.cumsum(digits[prefix, bits])
            for rank in members:
                within = state[rank][2]
                digit = int(np.searchsorted(below, within, side="right"))
                start = int(below[digit - 1]) if digit else 0
                key = (prefix << 16) | digit
                if bits + 16 == 64:  # every value in the bucket is this one
                    found[rank] = _from_key(key)
                else:
                    state[rank] = (key, bits + 16, within - start, int(below[digit]) - start)
    return {rank: found[rank] for rank in ranks}


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's linear interpolation between neighbours (its `_lerp`, which turns about at t = 0.5)."""
    a, b, t = np.float64(a), np.float64(b), np.float64(t)
    diff = b - a
    return float(b - diff * (1 - t) if t >= 0.5 else a + diff * t)


def spilled_stats(prefix: str, chunks: Callable[[], Iterator[Tally]]) -> dict[str, float]:
    """`metrics._stats` over values too many to hold, given as tallies: milliseconds' mean, median, std, p90 and
    p99. The percentiles are `np.percentile`'s (linear) and `np.median`'s exactly; mean and std differ in rounding
    only."""

    def finite_ms() -> Iterator[Tally]:
        for values, counts in chunks():
            finite = ~np.isnan(values)
            yield values[finite] * 1e3, counts[finite]

    n = sum(int(counts.sum()) for _, counts in finite_ms())
    if not n:
        return {f"{k}_{prefix}_ms": float("nan") for k in ("mean", "median", "std", "p90", "p99")}
    total = ExactSum()
    for values, counts in finite_ms():
        total.add(values, counts)
    mean = total.value() / n
    squares = ExactSum()
    for values, counts in finite_ms():
        squares.add(np.square(values - mean), counts)
    std = math.sqrt(squares.value() / n)
    places = {q: (n - 1) * np.true_divide(q, 100) for q in (90, 99)}
    ranks = [n // 2, (n - 1) // 2] + [r for v in places.values() for r in (int(v), min(int(v) + 1, n - 1))]
    value = ranked_values(finite_ms, n, ranks)
    median = value[n // 2] if n % 2 else float((np.float64(value[n // 2 - 1]) + value[n // 2]) / 2)
    percentile = {
        q: _lerp(value[int(v)], value[min(int(v) + 1, n - 1)], v - int(v)) for q, v in places.items()
    }
    return {
        f"mean_{prefix}_ms": mean,
        f"median_{prefix}_ms": median,
        f"std_{prefix}_ms": std,
        f"p90_{prefix}_ms": percentile[90],
        f"p99_{prefix}_ms": percentile[99],
    }
