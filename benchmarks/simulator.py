"""The causal tile simulator at scale, and its speed-up over the definition written as a Python loop.

    python benchmarks/simulator.py

Issue 2's goal: S = 1M tokens, N = 64, tile 128 "well under a second". The loop baseline counts the
same tile pairs one by one (tests/test_causal.py uses it as the oracle); both run here on the same
smaller case so the ratio is measured side by side.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from costmodel.causal import simulate
from costmodel.layouts import LAYOUTS, positions


def loop_pairs(layout: str, seq: int, n: int, tile: int) -> np.ndarray:
    """rank_step_pairs by the definition, with Python loops over ranks, steps and tile pairs."""
    pos = positions(layout, seq, n)
    length = seq // n
    bounds = [(start, min(start + tile, length)) for start in range(0, length, tile)]
    out = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            src = (i - j) % n
            for q0, q1 in bounds:
                qmax = pos[i, q1 - 1]
                for k0, k1 in bounds:
                    if pos[src, k0] <= qmax:
                        out[i, j] += (q1 - q0) * (k1 - k0)
    return out


def median_time(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print("S = 1,048,576, N = 64, tile 128 (4,096 rank-steps x 128 x 128 tile pairs each):")
    for layout in LAYOUTS:
        seconds = median_time(lambda layout=layout: simulate(layout, 1 << 20, 64, 128), 7)
        u = simulate(layout, 1 << 20, 64, 128).utilization
        print(f"  {layout:11} {seconds * 1e3:7.1f} ms   utilisation {u:.4f}")
    seq, n, tile = 1 << 16, 16, 128
    fast = median_time(lambda: simulate("zigzag", seq, n, tile), 7)
    slow = median_time(lambda: loop_pairs("zigzag", seq, n, tile), 3)
    assert np.array_equal(simulate("zigzag", seq, n, tile).rank_step_pairs, loop_pairs("zigzag", seq, n, tile))
    print(f"S = {seq:,}, N = {n}, tile {tile}: vectorised {fast * 1e3:.2f} ms, Python loop {slow * 1e3:.0f} ms, "
          f"speed-up {slow / fast:.0f}x (same counts)")


if __name__ == "__main__":
    main()
