"""The mask simulator on a packed window: S = 1M tokens from 10,000 documents, N = 64, tile 128.

    python benchmarks/packed.py [--smoke]

Times `costmodel.schedule.packed.simulate_masked` (without its cache) for every packed layout, and its
speed-up over the definition (`executed_by_definition`, the tests' oracle) on a smaller case where both
run, with the counts asserted equal. Last, one training step planned packed against the same step unpacked
(`evaluate_step`, each in a fresh process so that no cache carries over, interleaved, medians).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
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
    report_packed_step(1 if smoke else 7)


# One step of Llama 3 8B at 128K on 8 H100s, planned in a fresh process (no cache carries over); prints the
# seconds evaluate_step takes. numpy's import (~0.1 s, which a packed plan adds to the command's start-up) is
# left out of both.
STEP = """
import time
import numpy  # imported before the clock starts in both: a plain plan never needs it, a packed one does
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step
job = Job.of(model="llama3-8b", seq=131072, hw="h100-nvlink", gpus=8, cp=8, global_batch=8, docs={docs!r})
start = time.perf_counter()
evaluate_step(job)
print(time.perf_counter() - start)
"""
DOCS = "lognormal:mean=4k,sigma=1,count=200,seed=0"  # 200 log-normal documents packed into the window
COMMAND = "-m costmodel step --model llama3-8b --seq 128k --hw h100-nvlink --gpus 8 --cp 8 --global-batch 8"
COMMAND = [*COMMAND.split(), "--format", "json"]


def _interleaved(runs: dict[str, list[str]], repeats: int, timed_inside: bool) -> dict[str, float]:
    """Median seconds of each command line (Python's arguments), run in turn ``repeats`` times, each in its own
    process: as the process prints it (``timed_inside``) or as its whole wall time."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, args in runs.items():
            start = time.perf_counter()
            out = subprocess.run([sys.executable, *args], capture_output=True, check=True)
            times[name].append(float(out.stdout) if timed_inside else time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def report_packed_step(repeats: int) -> None:
    """A packed plan against the same plan unpacked: the step's first evaluation, then the whole command."""
    inside = _interleaved(
        {"": ["-c", STEP.format(docs=None)], "packed": ["-c", STEP.format(docs=DOCS)]}, repeats, True
    )
    whole = _interleaved({"": COMMAND, "packed": [*COMMAND, "--docs", DOCS]}, repeats, False)
    for what, t in (
        ("first evaluation in a fresh process, numpy loaded", inside),
        ("the whole command", whole),
    ):
        print(
            f"one step, Llama 3 8B at 128K on 8 H100s, {what}: unpacked {t[''] * 1e3:.0f} ms, packed (200 "
            f"log-normal documents) {t['packed'] * 1e3:.0f} ms, ratio {t['packed'] / t['']:.2f}x (goal <= 1.5x)"
        )


if __name__ == "__main__":
    main()
