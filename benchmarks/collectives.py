"""A ring collective's fixed latency per call, latency per step and bus bandwidth, fitted to measured tables.

    python benchmarks/collectives.py --data DIR   # DIR: vTrain's trace/a100 (AR_GPU{2..8}_1M_1024M_LUT)
    python benchmarks/collectives.py --smoke      # tables made from known figures: the fit must find them

vTrain's repository ([vTrain], MIT licence) publishes the all-reduce times of the A100 cluster its training
runs were measured on: nccl-tests over 2 to 8 GPUs of one node, 1 MB to 1 GB, one CSV per GPU count
(size in bytes, count, type, then time in ns and bus bandwidth in GB/s, out of place and in place). The fit
is :func:`costmodel.audit.nccl.fit_ring`, the one ``cp-plan hw from-nccl-tests`` applies to nccl-tests
output, over 1-64 MB: the sizes of a layer's TP and DP messages in those runs. Its result is the intra-node
link of tests/data/runs/a100-vtrain.yaml; NCCL's own model [NCCL-Tuning] is printed beside it.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from costmodel.audit.nccl import RING_STEPS, bus_factor, fit_ring

MB = 2**20
NCCL_MODEL = {"call": 14.0e-6, "hop": 1.9e-6, "busbw": 235e9}  # Ring LL128 on an A100's NVLink [NCCL-Tuning]


def read_lut(path: Path) -> list[tuple[str, int, float, float]]:
    """One vTrain all-reduce table as (collective, ranks, bytes, seconds), the faster of its two times."""
    ranks = int(path.name.split("_GPU")[1].split("_")[0])
    with path.open(encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))[1:]
    return [("all_reduce", ranks, float(r[0]), min(float(r[3]), float(r[5])) * 1e-9) for r in rows]


def synthetic() -> list[tuple[str, int, float, float]]:
    """All-reduce times of known figures (40 us a call, 1.5 us a step, 200 GB/s) with 2 % noise."""
    rng = np.random.default_rng(0)
    return [
        ("all_reduce", n, size, model_s("all_reduce", n, size, 40e-6, 1.5e-6, 200e9) * (1 + 0.02 * noise))
        for n in range(2, 9)
        for size, noise in zip([2**k * MB for k in range(7)], rng.standard_normal(7), strict=True)
    ]


def model_s(collective: str, n: int, size: float, call: float, hop: float, busbw: float) -> float:
    return call + RING_STEPS[collective] * (n - 1) * hop + size * bus_factor(collective, n) / busbw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder of vTrain's AR_GPU*_LUT tables (its trace/a100)")
    parser.add_argument("--smoke", action="store_true", help="synthetic tables instead of the data")
    args = parser.parse_args()
    if args.smoke:
        samples = synthetic()
    elif args.data:
        samples = [s for path in sorted(Path(args.data).glob("AR_GPU*_LUT")) for s in read_lut(path)]
    else:
        raise SystemExit("give --data DIR (vTrain's trace/a100) or --smoke")
    window = [s for s in samples if MB <= s[2] <= 64 * MB]
    if not window:
        raise SystemExit(f"no all-reduce table of 1-64 MB under {args.data}")
    fit = fit_ring(window)
    print(
        f"fit over {fit.samples} samples of 1-64 MB: {fit.call_latency_s * 1e6:.1f} us a call, "
        f"{fit.hop_latency_s * 1e6:.2f} us a step, bus bandwidth {fit.bus_bandwidth / 1e9:.0f} GB/s, "
        f"mean |error| {fit.mean_error:.1%}"
    )
    print(f"{'ranks':>5} {'size':>6} {'measured':>10} {'fit':>10} {'NCCL model':>11}")
    for c, n, size, seconds in window:
        if n in (2, 4, 8) and size in (MB, 4 * MB, 16 * MB, 64 * MB):
            ours = model_s(c, n, size, fit.call_latency_s, fit.hop_latency_s, fit.bus_bandwidth)
            nccl = model_s(c, n, size, NCCL_MODEL["call"], NCCL_MODEL["hop"], NCCL_MODEL["busbw"])
            print(
                f"{n:>5} {size / MB:>4.0f}MB {seconds * 1e6:>8.1f}us {ours * 1e6:>8.1f}us {nccl * 1e6:>9.1f}us"
            )


if __name__ == "__main__":
    main()
