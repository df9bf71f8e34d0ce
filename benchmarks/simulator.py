"""The causal tile simulator at scale, and its speed-up over the definition written as a Python loop.

    python benchmarks/simulator.py [--smoke]

The goal: S = 1M tokens, N = 64, tile 128 "well under a second". The baseline,
`costmodel.schedule.simulator.simulate_by_definition` (the tests' oracle), counts the same tile pairs one by one;
both run here on the same smaller case, so the ratio is measured side by side.
"""

from __future__ import annotations

import argparse

import numpy as np
from timing import median_seconds

from costmodel.schedule.layouts import LAYOUTS
from costmodel.schedule.simulator import simulate as cached_simulate
from costmodel.schedule.simulator import simulate_by_definition

simulate = cached_simulate.__wrapped__  # time the computation, not the cache


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, one timing: the suite runs it")
    smoke = parser.parse_args(argv).smoke
    big, repeats = (1 << 14, 1) if smoke else (1 << 20, 7)
    print(f"S = {big:,}, N = 64, tile 128 (4,096 rank-steps x 128 x 128 tile pairs each):")
    for layout in LAYOUTS:
        seconds = median_seconds(lambda layout=layout: simulate(layout, big, 64, 128), repeats)
        u = simulate(layout, big, 64, 128).utilization
        print(f"  {layout:11} {seconds * 1e3:7.1f} ms   utilisation {u:.4f}")
    seq, n, tile = (1 << 12, 8, 128) if smoke else (1 << 16, 16, 128)
    fast = median_seconds(lambda: simulate("zigzag", seq, n, tile), repeats)
    slow = median_seconds(lambda: simulate_by_definition("zigzag", seq, n, tile), 1 if smoke else 3)
    assert np.array_equal(
        simulate("zigzag", seq, n, tile).rank_step_pairs, simulate_by_definition("zigzag", seq, n, tile)
    )
    print(
        f"S = {seq:,}, N = {n}, tile {tile}: vectorised {fast * 1e3:.2f} ms, Python loop {slow * 1e3:.0f} ms, "
        f"speed-up {slow / fast:.0f}x (same counts)"
    )


if __name__ == "__main__":
    main()
