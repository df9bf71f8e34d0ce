"""Sweep throughput: the vectorised grid against a plain Python loop over the same generated formulas.

    python benchmarks/sweep.py [--smoke]

The goal: >= 1e6 grid points per second. Both paths evaluate the fwd+bwd step comm ratio with
the link each N implies; the loop calls the same numeric functions one point at a time on a slice
of the grid, and the two results are compared before the ratio is printed.
"""

from __future__ import annotations

import argparse

import numpy as np
from timing import median_seconds

from costmodel.machines.binding import build_machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs
from costmodel.symbolic import numeric
from costmodel.training.sweep import sweep

SHAPE = PlanInputs(seq=1, n=1, causal=True, pass_="fwd+bwd", block=1)


def loop(seqs: np.ndarray, ns: np.ndarray, profile) -> np.ndarray:  # noqa: ANN001
    out = np.empty((len(seqs), len(ns)))
    peak = profile.device.peak_flops["bf16"]
    for i, s in enumerate(seqs.tolist()):
        for j, n in enumerate(ns.tolist()):
            link = profile.links.intra_node if n <= profile.ranks_per_node else profile.links.inter_node
            common = {
                "S": s,
                "N": n,
                "b": 1,
                "c": 0.5,
                "d": 128,
                "h": 32,
                "n_kv": 8,
                "p": 2,
                "F": peak,
                "B": link.bandwidth_per_direction,
                "alpha": link.latency_s,
            }
            fwd = numeric.comm_ratio_step(**common)
            bwd = numeric.bwd_comm_ratio_step(**common, p_acc=4)
            out[i, j] = 0.0 if n == 1 else max(fwd, bwd)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a small grid, one timing: the suite runs it")
    smoke = parser.parse_args(argv).smoke
    profile = load_profile("a100-nvlink")
    machine = build_machine(profile)  # the sweep binds a profile to a dtype and an efficiency first
    seqs = np.arange(1, 21 if smoke else 1001) * 1024 * 8  # 1,000 sequence lengths
    ns = np.arange(1, 65 if smoke else 1025)  # 1,024 CP degrees: 1,024,000 points
    vectorised = median_seconds(lambda: sweep(SHAPE, seqs, ns, machine), 1 if smoke else 5)
    grid = sweep(SHAPE, seqs, ns, machine)
    part_s, part_n = seqs[: 4 if smoke else 40], ns[: 16 if smoke else 256]  # 10,240 points for the loop
    looped = median_seconds(lambda: loop(part_s, part_n, profile), 1 if smoke else 3)
    ours = grid.ratio[: part_s.size, : part_n.size]
    valid = ~np.isnan(ours)
    assert valid.any() and np.allclose(ours[valid], loop(part_s, part_n, profile)[valid], rtol=1e-12)
    fast = seqs.size * ns.size / vectorised
    slow = part_s.size * part_n.size / looped
    print(
        f"vectorised sweep: {seqs.size * ns.size:,} points in {vectorised * 1e3:.0f} ms = {fast:,.0f} points/s"
    )
    print(
        f"Python loop:      {part_s.size * part_n.size:,} points in {looped * 1e3:.0f} ms = {slow:,.0f} points/s"
    )
    print(f"ratio {fast / slow:,.0f}x; goal >= 1e6 points/s: {'met' if fast >= 1e6 else 'missed'}")


if __name__ == "__main__":
    main()
