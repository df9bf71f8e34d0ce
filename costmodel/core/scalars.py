"""numpy's answers on short lists of Python floats, without importing numpy (~50 ms of a plan's start-up).

The plan command's ring is a few ranks and steps: its sums, maxima and table lookups run here, giving the
value numpy gives on the same float64 numbers, bit for bit (tests/test_timing.py checks them against
numpy): :func:`total` adds in numpy's pairwise order, :func:`largest` lets NaN win as numpy's max does,
:func:`interp` is ``numpy.interp`` at one point.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

_BLOCK = 128  # numpy's PW_BLOCKSIZE: below it, eight running sums


def total(values: Sequence[float]) -> float:
    """``float(numpy.sum(values))`` of a 1-d float64 array: its identity 0.0 plus the pairwise sum."""
    return 0.0 + _pairwise([float(v) for v in values])


def _pairwise(a: list[float]) -> float:
    n = len(a)
    if n < 8:
        out = -0.0  # numpy's start: a sum of -0.0 alone stays -0.0
        for value in a:
            out += value
        return out
    if n <= _BLOCK:
        r = a[:8]
        i = 8
        while i < n - n % 8:
            for k in range(8):
                r[k] += a[i + k]
            i += 8
        out = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for value in a[i:]:
            out += value
        return out
    half = n // 2
    half -= half % 8
    return _pairwise(a[:half]) + _pairwise(a[half:])


def largest(values: Sequence[float]) -> float:
    """``numpy.max``: NaN wherever one is NaN (Python's max keeps whichever it met first)."""
    if any(v != v for v in values):
        return float("nan")
    return max(values)


def interp(x: float, xp: Sequence[float], fp: Sequence[float]) -> float:
    """``numpy.interp(x, xp, fp)`` at one point ``x`` for increasing ``xp``: flat beyond the ends, a table
    point's own value at it, the same slope and, where it gives NaN (an infinite slope), the other end's."""
    x, xp, fp = float(x), [float(v) for v in xp], [float(v) for v in fp]  # numpy reads float64
    last = len(xp) - 1
    if last == 0:  # one point: its value everywhere, at NaN too
        return fp[0]
    if x != x:
        return x
    if x > xp[last]:
        return fp[last]
    if x < xp[0]:
        return fp[0]
    j = bisect.bisect_right(xp, x) - 1  # the largest j with xp[j] <= x, as numpy's search finds
    if j == last or xp[j] == x:
        return fp[j]
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    out = slope * (x - xp[j]) + fp[j]
    if out != out:
        out = slope * (x - xp[j + 1]) + fp[j + 1]
        if out != out and fp[j] == fp[j + 1]:
            out = fp[j]
    return out
