"""Tile-granular simulator of the synchronous ring under a causal mask ([Striped §3]).

The whole-block count (N+1)/2N of [A-RingCost §6] is coarse. A real kernel skips a (query tile, key tile) pair only
when every pair of positions in it is masked, so the tile size matters: at tile 1 zigzag balances
perfectly, at tile = L every layout falls to 1/2 (Striped Attention's "tile too large" point).

Model: rank i holds the positions of its layout; at step j it attends to the KV of rank
(i - j) mod N; a tile pair costs s_q·s_k when any key in it is at or before any query in it; a step
lasts as long as its slowest rank. Utilisation = useful pairs / (N × Σ_steps slowest rank's pairs).

What a kernel table's rate is counted over is the pairs a call's queries see, whatever tile its kernel runs
(the table's measured rate pays for its own tiles): :func:`visible_pairs` counts them per rank and step in
closed form, the simulator at tile 1, and the layer's time is priced on them.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costmodel.core.scalars import total
from costmodel.schedule.layouts import check_divisible, position_at, positions

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Schedule:
    """Pairs of (query, key) positions each rank computes at each ring step."""

    rank_step_pairs: np.ndarray  # (N ranks, N steps), float64 (exact below 2^53 pairs)
    useful_pairs: int  # S(S+1)/2 causal, S² otherwise

    @property
    def step_pairs(self) -> np.ndarray:
        """The slowest rank's pairs per step: what sets each step's duration."""
        return self.rank_step_pairs.max(axis=0)

    @property
    def utilization(self) -> float:
        n = self.rank_step_pairs.shape[0]
        return self.useful_pairs / (n * float(self.step_pairs.sum()))


SIMULATION_BUDGET = 1 << 23  # rank x rank x tile entries of one simulation: ~64 MB per work array
# Entries :func:`schedule_rows` simulates in plain Python (a few milliseconds): a plan's ring of a few ranks
# needs no numpy, whose import alone costs ~50 ms.
ROWS_BUDGET = 1 << 14


def simulation_tile(seq: int, n: int, tile: int) -> int:
    """The tile the simulator can afford: ``tile``, or its smallest power-of-two multiple for which the
    N x N x (L / tile) work arrays stay within :data:`SIMULATION_BUDGET`. A coarser tile skips fewer
    masked pairs, so the utilisation it gives is a lower bound on the one at ``tile``."""
    length = seq // n
    tile = max(1, min(tile, length))
    while tile < length and n * n * -(-length // tile) > SIMULATION_BUDGET:
        tile = min(2 * tile, length)
    return tile


def _tile_bounds(layout: str, seq: int, n: int, tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank and tile: smallest position, largest position, tile size. A rank's positions increase
    along its local order, so a tile's bounds are the positions of its first and last token: no array of
    all S positions is built."""
    import numpy as np

    length = seq // n
    starts = np.arange(0, length, tile, dtype=np.int64)
    ends = np.minimum(starts + tile, length)
    ranks = np.arange(n, dtype=np.int64)[:, None]
    first = position_at(layout, seq, n, ranks, starts[None, :])
    last = position_at(layout, seq, n, ranks, ends[None, :] - 1)
    return first, last, ends - starts


# A report asks for the same schedule several times (passes, schemes, layouts); recommend's window asks for
# ~32 (each CP degree up to MAX_CP at its tiles) and again per fix it tries. An entry is N x N float64:
# 8 MB at N = 1,024, about 14 MB for the window's whole set.
@functools.lru_cache(maxsize=64)
def simulate(layout: str, seq: int, n: int, tile: int, causal: bool = True) -> Schedule:
    """Simulate one layer's ring schedule; vectorised over all rank pairs and tiles. The result is shared
    between callers, so its array is read-only."""
    import numpy as np

    if tile < 1:
        raise ValueError("tile must be >= 1")
    if n * n * -(-(seq // n) // tile) > SIMULATION_BUDGET:
        raise ValueError(
            f"N = {n} with {seq // n // tile} tiles per rank is over the simulator's budget; "
            "use simulation_tile()"
        )
    check_divisible(layout, seq, n)
    length = seq // n
    if not causal:
        full = np.full((n, n), float(length) * length)
        full.flags.writeable = False
        return Schedule(full, seq * seq)

    kmin, qmax, sizes = _tile_bounds(layout, seq, n, tile)
    tiles = sizes.size
    # Key tiles of every rank sorted by their first position, with running key counts, laid out
    # one rank after another on a number line (rank k offset by k·(seq+1)) so a single
    # searchsorted answers "how many keys of rank k start at or before this query's last position".
    order = np.argsort(kmin, axis=1, kind="stable")
    kmin_sorted = np.take_along_axis(kmin, order, axis=1)
    ksize_sorted = sizes[order]
    offset = np.arange(n, dtype=np.int64)[:, None] * (seq + 1)
    line = (kmin_sorted + offset).ravel()
    running = np.concatenate([[0], np.cumsum(ksize_sorted.ravel())])  # int64: at most S keys
    # queries[i, k, t]: query tile t of rank i placed in the band of key rank k.
    queries = qmax[:, None, :] + offset[None, :, :]
    hit = np.searchsorted(line, queries, side="right")
    keys_seen = running[hit] - running[np.arange(n)[None, :, None] * tiles]
    # pairs[i, k]: rank i against rank k's KV; float64, since L² passes 2^63 for long shards
    pairs = (keys_seen.astype(float) * sizes[None, None, :]).sum(axis=2)
    ranks = np.arange(n)
    src = (ranks[:, None] - ranks[None, :]) % n  # src[i, j]: whose KV rank i holds at step j
    schedule = pairs[ranks[:, None], src]
    schedule.flags.writeable = False
    return Schedule(schedule, seq * (seq + 1) // 2)


Rows = tuple[tuple[float, ...], ...]


@functools.lru_cache(maxsize=64)
def schedule_rows(layout: str, seq: int, n: int, tile: int, causal: bool = True) -> Rows | None:
    """:func:`simulate`'s ``rank_step_pairs`` as rows of Python floats, equal entry for entry, simulated
    without numpy where that is cheap: N x N x (L / tile) within :data:`ROWS_BUDGET`, and every count and
    sum an exact integer in a float (S·L < 2^53), so the order numpy adds in cannot matter. None beyond:
    ask :func:`simulate`."""
    length = seq // n
    if tile < 1 or n * n * -(-length // tile) > ROWS_BUDGET or seq * length >= 1 << 53:
        return None
    check_divisible(layout, seq, n)
    if not causal:
        return ((float(length) * length,) * n,) * n
    starts = range(0, length, tile)
    sizes = [min(start + tile, length) - start for start in starts]
    # per key rank: its tiles' first positions in increasing order, and the running count of their keys
    firsts, running = [], []
    for k in range(n):
        tiles = sorted(
            ((position_at(layout, seq, n, k, start), size) for start, size in zip(starts, sizes)),
            key=lambda t: t[0],
        )
        firsts.append([first for first, _ in tiles])
        running.append([0, *itertools.accumulate(size for _, size in tiles)])
    pairs = []  # pairs[i][k]: rank i's queries against rank k's keys
    for i in range(n):
        lasts = [position_at(layout, seq, n, i, start + size - 1) for start, size in zip(starts, sizes)]
        pairs.append(
            [
                float(sum(run[bisect.bisect_right(first, q)] * size for q, size in zip(lasts, sizes)))
                for first, run in zip(firsts, running)
            ]
        )
    return tuple(tuple(pairs[i][(i - j) % n] for j in range(n)) for i in range(n))


def _runs(layout: str, seq: int, n: int, rank: Any) -> tuple[list[tuple[Any, int]], int]:
    """The positions ``rank`` holds as runs (first position, count) of one stride, and that stride: one run
    of consecutive positions (contiguous), two (zigzag's chunks), or one of stride N (striped)."""
    length = seq // n
    if layout == "contiguous" or n == 1:
        return [(rank * length, length)], 1
    if layout == "striped":
        return [(rank, length)], n
    chunk = length // 2
    return [(rank * chunk, chunk), ((2 * n - 1 - rank) * chunk, chunk)], 1


def _run_pairs(queries: tuple[Any, int], keys: tuple[Any, int], stride: int, ops: tuple[Any, Any]) -> Any:
    """(query, key) pairs with the key at or before the query, between the queries a + stride·u (u < A)
    and the keys b + stride·v (v < B), ``queries`` = (a, A), ``keys`` = (b, B): the sum over u of
    clamp(u + δ + 1, 0, B), δ = floor((a - b) / stride), in closed form. ``ops``: (min, max), builtin or
    numpy's, so that the count runs on ints or on arrays of them."""
    (a, count_q), (b, count_k) = queries, keys
    low, high = ops

    def up_to(m: Any) -> Any:  # sum of clamp(w, 0, B) for w = 1..m
        m = high(m, 0)
        t = low(m, count_k)
        return t * (t + 1) / 2 + (m - t) * count_k

    delta = (a - b) // stride
    return up_to(count_q + delta) - up_to(delta)


def visible_pairs(layout: str, seq: int, n: int, causal: bool = True, rows: bool = True) -> Rows | np.ndarray:
    """The (query, key) pairs each rank's queries can see at each ring step, counted token by token in
    closed form: ``rank_step_pairs`` of :func:`simulate` at tile 1, at any length. What the attention
    tables' rates are counted over (a causal L x L call is L(L+1)/2 pairs, whatever tile its kernel runs),
    so what a call's time is priced on. ``rows``: rows of Python floats (a few ranks, without numpy), else a
    numpy array."""
    check_divisible(layout, seq, n)
    length = seq // n
    if not causal:
        if rows:
            return ((float(length) * length,) * n,) * n
        import numpy as np

        return np.full((n, n), float(length) * length)
    if rows:
        held = [_runs(layout, seq, n, rank) for rank in range(n)]
        stride = held[0][1]
        by_rank = [
            [
                float(sum(_run_pairs(q, k, stride, (min, max)) for q in queries for k in keys))
                for keys, _ in held
            ]
            for queries, _ in held
        ]
        return tuple(tuple(by_rank[i][(i - j) % n] for j in range(n)) for i in range(n))
    import numpy as np

    ranks = np.arange(n, dtype=float)
    queries, stride = _runs(layout, seq, n, ranks[:, None])
    keys, _ = _runs(layout, seq, n, ranks[None, :])
    pairs = sum(_run_pairs(q, k, stride, (np.minimum, np.maximum)) for q in queries for k in keys)
    step = (np.arange(n)[:, None] - np.arange(n)[None, :]) % n  # whose KV rank i holds at step j
    return pairs[np.arange(n)[:, None], step]


def utilization(layout: str, seq: int, n: int, tile: int) -> float:
    """:attr:`Schedule.utilization` of the causal schedule, from :func:`schedule_rows` where it is small. One
    rank holds the sequence whole in any layout: query tile j sees the key tiles 0..j, so its tiles run
    t²·T(T-1)/2 + r·S pairs (T tiles, the last of r tokens), in closed form at any length."""
    if n == 1:
        tiles = -(-seq // tile)
        last = seq - (tiles - 1) * tile
        return seq * (seq + 1) // 2 / (tile * tile * tiles * (tiles - 1) // 2 + last * seq)
    rows = schedule_rows(layout, seq, n, tile)
    if rows is None:
        return simulate(layout, seq, n, tile).utilization
    slowest = [max(column) for column in zip(*rows)]
    return seq * (seq + 1) // 2 / (n * total(slowest))


def simulate_by_definition(layout: str, seq: int, n: int, tile: int) -> np.ndarray:
    """``rank_step_pairs`` of :func:`simulate` (causal), by the definition, one tile pair at a time.

    Slow on purpose: the oracle the tests check :func:`simulate` against, and the baseline of
    ``benchmarks/simulator.py``.
    """
    import numpy as np

    pos = positions(layout, seq, n)
    length = seq // n
    tiles = [(start, min(start + tile, length)) for start in range(0, length, tile)]
    out = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            src = (i - j) % n
            for q0, q1 in tiles:
                for k0, k1 in tiles:
                    if pos[src, k0:k1].min() <= pos[i, q0:q1].max():
                        out[i, j] += (q1 - q0) * (k1 - k0)
    return out
