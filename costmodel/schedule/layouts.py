"""Sequence layouts as data: which global token positions each CP rank holds ([A-RingCost §6]).

A layout is nothing but this map. The causal simulator (:mod:`costmodel.schedule.simulator`) and the torch
reference kernel both take it as input, so the mask rule and the ring loop are written once.

- ``contiguous``: rank i holds [i·L, (i+1)·L).
- ``striped`` (Striped Attention): rank i holds i, i+N, i+2N, ...
- ``zigzag``: the sequence is cut into 2N chunks; rank i holds chunks i and 2N-1-i, pairing an early
  chunk with a late one so causal work is equal on every rank.

Within a rank the positions are increasing, so a rank's local order is a sorted view of its tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, get_args

from costmodel.core.errors import InputError

if TYPE_CHECKING:
    import numpy as np

Layout = Literal["contiguous", "striped", "zigzag"]
LAYOUTS: tuple[str, ...] = get_args(Layout)


def chunks_per_rank(layout: str) -> int:
    """How many equal chunks of the sequence each rank holds: S must divide by N times this."""
    return 2 if layout == "zigzag" else 1


def check_divisible(layout: str, seq: int, n: int, field: str = "seq") -> None:
    """Raise :class:`InputError` unless ``seq`` splits evenly over ``n`` ranks in ``layout``."""
    if layout not in LAYOUTS:
        raise InputError("layout", f"unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    parts = n * chunks_per_rank(layout) if n > 1 else 1  # one rank holds the sequence whole, in any layout
    if seq % parts:
        what = f"2N = {parts}" if layout == "zigzag" else f"N = {n}"
        raise InputError(field, f"{seq} tokens do not split evenly over {what} ({layout} layout)")


def position_at(layout: str, seq: int, n: int, rank: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The global position of local token ``index`` of ``rank`` (broadcasting), without building them all;
    for a Python int ``index`` an int, without numpy."""
    if layout == "contiguous":
        return rank * (seq // n) + index
    if layout == "striped":
        return index * n + rank
    chunk = seq // (2 * n)  # zigzag: chunk `rank`, then chunk 2N-1-rank
    if isinstance(index, int):
        return rank * chunk + index if index < chunk else (2 * n - 1 - rank) * chunk + index - chunk
    import numpy as np

    return np.where(index < chunk, rank * chunk + index, (2 * n - 1 - rank) * chunk + index - chunk)


def positions(layout: str, seq: int, n: int) -> np.ndarray:
    """Global positions held by each rank, shape (n, seq // n), increasing along each row."""
    import numpy as np

    check_divisible(layout, seq, n)
    tokens = np.arange(seq, dtype=np.int64)
    if layout == "contiguous" or n == 1:
        return tokens.reshape(n, seq // n)
    if layout == "striped":
        return np.ascontiguousarray(tokens.reshape(seq // n, n).T)
    chunks = tokens.reshape(2 * n, seq // (2 * n))
    return np.concatenate([chunks[:n], chunks[::-1][:n]], axis=1)


def ulysses_feasibility(heads: int, kv_heads: int, degree: int) -> tuple[bool, str]:
    """Heads split over an all-to-all of ``degree`` ranks: h mod N = 0, and n_kv mod N = 0 or N mod n_kv = 0 (then KV heads are replicated)."""
    if heads % degree:
        return (
            False,
            f"h = {heads} query heads do not split over {degree} devices (h mod N = {heads % degree})",
        )
    if kv_heads % degree and degree % kv_heads:
        return (
            False,
            f"n_kv = {kv_heads} KV heads neither split over nor replicate evenly to {degree} devices",
        )
    if degree > kv_heads:
        return True, f"KV heads replicated {degree // kv_heads}x to {degree}; traffic counts the replicas"
    return True, "heads split evenly"


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending, in O(sqrt n) steps."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]
