"""Run logs that outgrow memory move to temporary files in chunks, so a run's memory does not grow with its length.

A million requests log ~27 M engine steps and ~200 M inter-token gaps (~4 GB held as arrays); spilled, a run keeps
one chunk of each in memory. Figures over spilled values are exact: percentiles select the ranked values in a few
passes over the chunks (radix counts on the values' bits), as `np.percentile` would over all of them; sums are
correctly rounded (`math.fsum`'s result over every value, summed exactly with numpy: `ExactSum`), so they do not depend on the order values were logged in (a
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
    """Float64 values appended in chunks to a temporary file: `spill` moves an array's values there (and empties
    it), `gathered` gives them back with what stayed in memory."""

    def __init__(self, prefix: str) -> None:
        self._dir = SpillDir(prefix)
        self.count = 0

    def spill(self, values: array) -> None:
        with open(self._dir.file("values.bin"), "ab") as handle:
            handle.truncate(self.count * 8)  # what a failed write left after the values counted
            values.tofile(handle)
        self.count += len(values)
        del values[:]

    def gathered(self, rest: array) -> np.ndarray | Callable[[], Iterator[np.ndarray]]:
        """The values spilled, then `rest`: an array if none were spilled, else a reader of their chunks."""
        if not self.count:
            return np.frombuffer(rest, float) if rest else np.array([])
        return lambda: self._chunks(rest)

    def _chunks(self, rest: array) -> Iterator[np.ndarray]:
        path = self._dir.file("values.bin")
        for offset in range(0, self.count, READ_VALUES):
            yield np.fromfile(path, float, min(READ_VALUES, self.count - offset), offset=offset * 8)
        if rest:
            yield np.frombuffer(rest, float)


#: values summed at a time: each exponent's 27-bit halves then sum below 2**53, exactly in float64
_SUM_SLICE = 1 << 24
#: every finite float64 is an integer times 2**-_SCALE (its 53-bit significand times 2**(exponent - 53))
_SCALE = 1074 + 53


@njit(cache=True)
def _exponent_sums(values):
    """Per exponent (frexp's, -1073 to 1024, offset by 1074), the values' 53-bit significands summed as their high
    and low 26-bit halves: exact in int64 for up to _SUM_SLICE values (each half below 2**27)."""
    highs, lows = np.zeros(2100, np.int64), np.zeros(2100, np.int64)
    for value in values:
        significand, exponent = math.frexp(value)
        whole = np.int64(significand * 2.0**53)  # exact: a float64 has 53 significant bits
        highs[exponent + 1074] += whole >> 26  # whole = high * 2**26 + low
        lows[exponent + 1074] += whole & ((1 << 26) - 1)
    return highs, lows


class ExactSum:
    """A running sum of float arrays kept exact, as an integer times 2**-_SCALE, so it takes chunks in any order and
    gives `math.fsum`'s correctly rounded result over every value, without a Python float per value: each slice's
    significands are split into halves and summed per exponent with numpy (`np.bincount`, exact below 2**53)."""

    def __init__(self) -> None:
        self._scaled = 0
        self._numpy = (
            0  # numpy's sum, chunk by chunk: the result where fsum would fail (infinities, NaN, overflow)
        )
        self._finite, self._negative_zeros = True, None

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, float).ravel()
        self._numpy += np.sum(values)
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
        for start in range(0, len(values), _SUM_SLICE):
            highs, lows = _exponent_sums(values[start : start + _SUM_SLICE])
            for i in np.flatnonzero(highs | lows).tolist():
                part = (int(highs[i]) << 26) + int(lows[i])
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
def _count_digits(values, prefix, bits, counts):
    """Add to `counts[d]` the values in bucket (`prefix`, `bits`) whose keys' next 16 bits are d."""
    shift = np.uint64(48) - bits
    for raw in values.view(np.uint64):
        key = _sort_key(raw)
        if _in_bucket(key, prefix, bits):
            counts[(key >> shift) & np.uint64(0xFFFF)] += 1


@njit(cache=True)
def _bucket_keys(values, prefix, bits):
    """The keys of the values in bucket (`prefix`, `bits`)."""
    raws = values.view(np.uint64)
    count = 0
    for raw in raws:
        count += _in_bucket(_sort_key(raw), prefix, bits)
    keys, count = np.empty(count, np.uint64), 0
    for raw in raws:
        key = _sort_key(raw)
        if _in_bucket(key, prefix, bits):
            keys[count] = key
            count += 1
    return keys


def _from_key(key: int) -> float:
    bits = key & ~(1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return float(np.array([bits], np.uint64).view(float)[0])


def ranked_values(
    chunks: Callable[[], Iterator[np.ndarray]], total: int, ranks: list[int]
) -> dict[int, float]:
    """The values at `ranks` (0 = smallest) of the `total` NaN-free values `chunks()` yields, in passes over them:
    each pass counts the next 16 bits of the keys in the ranks' buckets, until a bucket is small enough to sort."""
    # rank -> (bucket prefix, bits of it, rank within the bucket, bucket size)
    state = {rank: (0, 0, rank, total) for rank in set(ranks)}
    found: dict[int, float] = {}
    while len(found) < len(state):
        buckets: dict[tuple[int, int], list[int]] = {}
        for rank, (prefix, bits, _, _) in state.items():
            if rank not in found:
                buckets.setdefault((prefix, bits), []).append(rank)
        counts = {b: np.zeros(1 << 16, np.int64) for b in buckets if state[buckets[b][0]][3] > SORT_VALUES}
        kept: dict[tuple[int, int], list[np.ndarray]] = {b: [] for b in buckets if b not in counts}
        for chunk in chunks():
            values = np.ascontiguousarray(chunk, float)
            for prefix, bits in buckets:
                if (prefix, bits) in counts:
                    _count_digits(values, np.uint64(prefix), np.uint64(bits), counts[prefix, bits])
                else:
                    kept[prefix, bits].append(_bucket_keys(values, np.uint64(prefix), np.uint64(bits)))
        for (prefix, bits), members in buckets.items():
            if (prefix, bits) in kept:
                keys = np.sort(np.concatenate(kept[prefix, bits]))
                for rank in members:
                    found[rank] = _from_key(int(keys[state[rank][2]]))
                continue
            below = np.cumsum(counts[prefix, bits])
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


def spilled_stats(prefix: str, chunks: Callable[[], Iterator[np.ndarray]]) -> dict[str, float]:
    """`metrics._stats` over values too many to hold: milliseconds' mean, median, std, p90 and p99. The
    percentiles are `np.percentile`'s (linear) and `np.median`'s exactly; mean and std differ in rounding only."""

    def finite_ms() -> Iterator[np.ndarray]:
        for chunk in chunks():
            yield chunk[~np.isnan(chunk)] * 1e3

    n = sum(len(chunk) for chunk in finite_ms())
    if not n:
        return {f"{k}_{prefix}_ms": float("nan") for k in ("mean", "median", "std", "p90", "p99")}
    mean = exact_sum(finite_ms) / n
    std = math.sqrt(exact_sum(lambda: (np.square(chunk - mean) for chunk in finite_ms())) / n)
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
