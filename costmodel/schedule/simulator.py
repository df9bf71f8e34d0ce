"""Tile-granular simulator of the synchronous ring under a causal mask ([Striped §3]).

The whole-block count (N+1)/2N of [A-RingCost §6] is coarse. A real kernel skips a (query tile, key tile) pair only
when every pair of positions in it is masked, so the tile size matters: at tile 1 zigzag balances
perfectly, at tile = L every layout falls to 1/2 (Striped Attention's "tile too large" point).

Model: rank i holds the positions of its layout; at step j it attends to the KV of rank
(i - j) mod N; a tile pair costs s_q·s_k when any key in it is at or before any query in it; a step
lasts as long as its slowest rank. Utilisation = useful pairs / (N × Σ_steps slowest rank's pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.schedule.layouts import positions


@dataclass(frozen=True)
class Schedule:
    """Pairs of (query, key) positions each rank computes at each ring step."""

    rank_step_pairs: np.ndarray  # (N ranks, N steps), int64
    useful_pairs: int  # S(S+1)/2 causal, S² otherwise

    @property
    def step_pairs(self) -> np.ndarray:
        """The slowest rank's pairs per step: what sets each step's duration."""
        return self.rank_step_pairs.max(axis=0)

    @property
    def utilization(self) -> float:
        n = self.rank_step_pairs.shape[0]
        return self.useful_pairs / (n * int(self.step_pairs.sum()))


def _tile_bounds(pos: np.ndarray, tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank and tile: smallest position, largest position, tile size."""
    length = pos.shape[1]
    starts = np.arange(0, length, tile)
    sizes = np.diff(np.append(starts, length))
    return np.minimum.reduceat(pos, starts, axis=1), np.maximum.reduceat(pos, starts, axis=1), sizes


def simulate(layout: str, seq: int, n: int, tile: int, causal: bool = True) -> Schedule:
    """Simulate one layer's ring schedule; vectorised over all rank pairs and tiles."""
    if tile < 1:
        raise ValueError("tile must be >= 1")
    pos = positions(layout, seq, n)
    length = pos.shape[1]
    if not causal:
        return Schedule(np.full((n, n), length * length, dtype=np.int64), seq * seq)

    kmin, qmax, sizes = _tile_bounds(pos, tile)
    tiles = sizes.size
    # Key tiles of every rank sorted by their first position, with running key counts, laid out
    # one rank after another on a number line (rank k offset by k·(seq+1)) so a single
    # searchsorted answers "how many keys of rank k start at or before this query's last position".
    order = np.argsort(kmin, axis=1, kind="stable")
    kmin_sorted = np.take_along_axis(kmin, order, axis=1)
    ksize_sorted = sizes[order]
    offset = np.arange(n, dtype=np.int64)[:, None] * (seq + 1)
    line = (kmin_sorted + offset).ravel()
    running = np.concatenate([[0], np.cumsum(ksize_sorted.ravel())])
    # queries[i, k, t]: query tile t of rank i placed in the band of key rank k.
    queries = qmax[:, None, :] + offset[None, :, :]
    hit = np.searchsorted(line, queries, side="right")
    keys_seen = running[hit] - running[np.arange(n)[None, :, None] * tiles]
    pairs = (keys_seen * sizes[None, None, :]).sum(axis=2)  # pairs[i, k]: rank i against rank k's KV
    ranks = np.arange(n)
    src = (ranks[:, None] - ranks[None, :]) % n  # src[i, j]: whose KV rank i holds at step j
    return Schedule(pairs[ranks[:, None], src], seq * (seq + 1) // 2)


def simulate_by_definition(layout: str, seq: int, n: int, tile: int) -> np.ndarray:
    """``rank_step_pairs`` of :func:`simulate` (causal), by the definition, one tile pair at a time.

    Slow on purpose: the oracle the tests check :func:`simulate` against, and the baseline of
    ``benchmarks/simulator.py``.
    """
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

