"""The mask simulator on a packed window: S = 1M tokens from 10,000 documents, N = 64, tile 128.

    python benchmarks/packed.py [--smoke]

Times `costmodel.schedule.packed.simulate_masked` (without its cache) for every packed layout, and its
speed-up over the definition (`executed_by_definition`, the tests' oracle) on a smaller case where both
run, with the counts asserted equal.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from timing import median_seconds

from costmodel.schedule.masks import MaskRule
from costmodel.schedule.packed import PACKED_LAYOUTS, executed_by_definition
from costmodel.schedule.packed import simulate_masked as cached

simulate = cached.__wrapped__  # time the computation, not the cache


def documents(seq: int, count: int, seed: int = 0) -> tuple[int, ...]:
    """``count`` log-normal lengths (sigma 1) scaled to fill ``seq`` exactly, as document boundaries."""
    draws = np.random.default_rng(seed).lognormal(0.0, 1.0, count)
    lengths = np.maximum(1, (draws / draws.sum() * seq).astype(np.int64))
    lengths[-1] += seq - lengths.sum()
    return tuple(int(x) for x in np.r_[0, np.cumsum(lengths)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, one timing: the suite runs it")
    smoke = parser.parse_args(argv).smoke
    seq, n, tile, count = (1 << 14, 8, 128, 200) if smoke else (1 << 20, 64, 128, 10_000)
    rule = MaskRule(True, documents(seq, count))
    print(f"S = {seq:,} from {count:,} documents (causal, varlen), N = {n}, tile {tile}:")
    for layout in PACKED_LAYOUTS:
        seconds = median_seconds(
            lambda layout=layout: simulate(layout, seq, n, tile, rule), 1 if smoke else 3
        )
        cpu = time.process_time()
        u = simulate(layout, seq, n, tile, rule).utilization
        cpu = time.process_time() - cpu  # a shared machine's wall time varies; this process's CPU less
        print(f"  {layout:11} {seconds * 1e3:8.1f} ms wall, {cpu * 1e3:8.1f} ms CPU   utilisation {u:.4f}")
    seq, n, tile = 4096, 8, 32
    small = MaskRule(True, documents(seq, 40), window=700)
    fast = median_seconds(lambda: simulate("doc-zigzag", seq, n, tile, small), 1 if smoke else 5)
    slow = median_seconds(lambda: executed_by_definition("doc-zigzag", seq, n, tile, small), 1)
    assert np.array_equal(
        simulate("doc-zigzag", seq, n, tile, small).rank_step_pairs,
        executed_by_definition("doc-zigzag", seq, n, tile, small),
    )
    print(
        f"S = {seq:,} (40 documents, window 700), N = {n}, tile {tile}, doc-zigzag: vectorised "
        f"{fast * 1e3:.2f} ms, by definition {slow * 1e3:.0f} ms, speed-up {slow / fast:.0f}x (same counts)"
    )


if __name__ == "__main__":
    main()
