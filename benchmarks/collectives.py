"""A ring collective's fixed latency per call, latency per step and bus bandwidth, fitted to measured tables.

    python benchmarks/collectives.py --data DIR     # DIR: vTrain's trace/a100 (AR_GPU{2..8}_1M_1024M_LUT)
    python benchmarks/collectives.py --public DIR   # DIR: public kernel tables (Vidur's and XLA's collectives)
    python benchmarks/collectives.py --smoke        # tables made from known figures: the fit must find them

vTrain's repository ([vTrain], MIT licence) publishes the all-reduce times of the A100 cluster its training
runs were measured on: nccl-tests over 2 to 8 GPUs of one node, 1 MB to 1 GB, one CSV per GPU count
(size in bytes, count, type, then time in ns and bus bandwidth in GB/s, out of place and in place). The fit
is :func:`costmodel.audit.nccl.fit_ring`, the one ``cp-plan hw from-nccl-tests`` applies to nccl-tests
output, over 1-64 MB: the sizes of a layer's TP and DP messages in those runs. Its result is the intra-node
link of tests/data/runs/a100-vtrain.yaml and of the built-in A100 and A800 profiles; NCCL's own model
[NCCL-Tuning] is printed beside it.

``--public`` checks the built-in profiles' ring collectives against tables measured elsewhere, none of which
set them, over 1-64 MB: Vidur's all-reduce over 2, 4 and 8 GPUs of one A100 and one H100 DGX node
(torch.distributed on NCCL, the device time of its kernels; [Vidur], MIT licence), XLA's collective table for
H100 and B200 (all-reduce, all-gather and reduce-scatter; the XLA executable's device time, its groups of 2
and 4 running four and two at once on the node; [XLA-CollectiveTable], Apache-2.0) and torch's all-reduce
over one 8-GPU B200 node ([ML-Eng-Network], CC BY-SA 4.0). Across nodes, the H100 profile's rings against
nccl-tests' all-reduce over 2-8 nodes of eight 400 Gb/s NICs each ([NCCL-Issue-309]), by message
size. With ``--data`` too, the vTrain fit is checked on Vidur's A100 node: a cluster and a caller it never saw.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from costmodel.audit.nccl import RING_STEPS, bus_factor, fit_ring
from costmodel.machines.binding import build_machine
from costmodel.machines.profiles import load_profile

MB = 2**20
# A public table's GPU -> the built-in profile whose intra-node link it measures.
PROFILE_OF = {"A100": "a100-nvlink", "H100": "h100-nvlink", "B200": "b200-nvlink"}
XLA_OPS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}
# (source, GPU, collective, ranks, bytes, seconds)
Measured = tuple[str, str, str, int, float, float]
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


def read_public(folder: Path) -> list[Measured]:
    """Vidur's one-node all-reduce, XLA's H100/B200 ring collectives and torch's B200 all-reduce, 1-64 MB."""
    rows: list[Measured] = []
    with (folder / "vidur_collectives_fp16.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["collective"] == "all_reduce" and r["devices_per_node"] == r["num_workers"]:
                gpu, n = r["network_device"].split("_")[0].upper(), int(r["num_workers"])
                rows.append(
                    ("Vidur", gpu, "all_reduce", n, float(r["size_bytes"]), float(r["median_ms"]) * 1e-3)
                )
    with (folder / "xla_collective_perf_table.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            gpu = r["device"].split(" ")[0]
            if r["op"] in XLA_OPS and gpu in ("H100", "B200"):
                n, size = int(r["devices_per_group"]), float(r["tensor_size_bytes"])
                rows.append(("XLA", gpu, XLA_OPS[r["op"]], n, size, float(r["median_time_us"]) * 1e-6))
    with (folder / "nccl_busbw_measured.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):  # torch's all-reduce over one 8-GPU B200 node: bus bandwidth only
            if r["gpu"] == "B200" and r["nodes"] == "1" and r["source"].startswith("all_reduce_bench"):
                size, n = float(r["size_bytes"]), int(r["gpus"])
                seconds = size * bus_factor("all_reduce", n) / (float(r["busbw_GBps"]) * 1e9)
                rows.append(("torch", "B200", "all_reduce", n, size, seconds))
    return [r for r in rows if MB <= r[4] <= 64 * MB]


def profile_s(collective: str, n: int, size: float, gpu: str) -> float:
    """A ring collective's time as the built-in profile prices it: the link the model binds for n ranks."""
    link = build_machine(load_profile(PROFILE_OF[gpu])).link(n, "ring")
    return model_s(collective, n, size, link.call_latency_s, link.latency_s, link.bandwidth)


def errors(rows: list[Measured], predict) -> str:
    e = np.array([predict(c, n, size) / seconds - 1 for _, _, c, n, size, seconds in rows])
    worst = e[np.argmax(np.abs(e))]
    return f"{len(e):>4} rows  MAPE {np.mean(np.abs(e)):6.1%}  signed median {np.median(e):+6.1%}  worst {worst:+6.1%}"


def check_public(rows: list[Measured], fit=None) -> None:
    """Each public table's error under the built-in profile, by source, GPU, collective and rank count."""
    groups: dict[tuple[str, str, str, int], list[Measured]] = {}
    for row in rows:
        groups.setdefault(row[:4], []).append(row)
    print("built-in profiles on public one-node tables, 1-64 MB (model / measured - 1):")
    for (source, gpu, collective, n), members in sorted(groups.items()):
        label = f"{source} {gpu} {collective} x{n} ({PROFILE_OF[gpu]})"
        print(f"  {label:<45} {errors(members, lambda c, k, size, g=gpu: profile_s(c, k, size, g))}")
    a100 = [r for r in rows if r[0] == "Vidur" and r[1] == "A100"]
    if a100:
        nccl = errors(
            a100,
            lambda c, n, size: model_s(
                c, n, size, NCCL_MODEL["call"], NCCL_MODEL["hop"], NCCL_MODEL["busbw"]
            ),
        )
        print(f"  {'Vidur A100, every rank count, NCCL model':<45} {nccl}")
    if a100 and fit is not None:
        ours = errors(
            a100,
            lambda c, n, size: model_s(c, n, size, fit.call_latency_s, fit.hop_latency_s, fit.bus_bandwidth),
        )
        print(f"  {'Vidur A100, every rank count, vTrain fit':<45} {ours}")


def read_multinode(folder: Path) -> dict[str, list[Measured]]:
    """nccl-tests' all-reduce over 2-8 H100 nodes with eight 400 Gb/s InfiniBand NICs each (the fabric of
    h100-nvlink's inter-node link), by cluster, node count and setting. GCP's A3 Mega table is left out: its
    fabric (GPUDirect-TCPX) is not the profile's."""
    tables: dict[str, list[Measured]] = {}
    with (folder / "nccl_busbw_measured.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["source"].startswith("nccl-tests") and r["gpu"].startswith("H100") and r["time_us"]:
                if "A3 Mega" in r["system"] or int(r["nodes"]) < 2:
                    continue
                name = f"{r['system'].split(',')[0][:28]}, {r['nodes']} nodes, {r['algo_or_setting'].split(' (')[0][:24]}"
                row = (
                    "nccl-tests",
                    "H100",
                    "all_reduce",
                    int(r["gpus"]),
                    float(r["size_bytes"]),
                    float(r["time_us"]) * 1e-6,
                )
                tables.setdefault(name, []).append(row)
    return tables


BANDS = (
    (MB, 64 * MB, "1-64 MB"),
    (64 * MB, 1024 * MB, "64 MB-1 GB"),
    (1024 * MB, float("inf"), "1 GB and up"),
)


def check_multinode(tables: dict[str, list[Measured]]) -> None:
    """The built-in H100 profile's ring all-reduce across nodes against nccl-tests, by message size."""
    print("h100-nvlink across nodes, nccl-tests all-reduce (model / measured - 1):")
    every: dict[str, list[Measured]] = {}
    for name, rows in sorted(tables.items()):
        for lo, hi, band in BANDS:
            picked = [r for r in rows if lo <= r[4] < hi]
            every.setdefault(band, []).extend(picked)
            if picked:
                print(
                    f"  {name + ', ' + band:<68} {errors(picked, lambda c, k, size: profile_s(c, k, size, 'H100'))}"
                )
    for band, rows in every.items():
        if rows:
            print(
                f"  {'every cluster, ' + band:<68} {errors(rows, lambda c, k, size: profile_s(c, k, size, 'H100'))}"
            )


def smoke_public() -> list[Measured]:
    """Tables the built-in profiles price exactly: the check must read 0 % on them."""
    return [
        ("made", gpu, "all_reduce", n, size, profile_s("all_reduce", n, size, gpu))
        for gpu in ("A100", "H100")
        for n in (2, 8)
        for size in (MB, 64 * MB)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder of vTrain's AR_GPU*_LUT tables (its trace/a100)")
    parser.add_argument(
        "--public", help="folder of the public kernel tables (vidur_collectives_fp16.csv, ...)"
    )
    parser.add_argument("--smoke", action="store_true", help="synthetic tables instead of the data")
    args = parser.parse_args()
    if args.smoke:
        samples = synthetic()
    elif args.data:
        samples = [s for path in sorted(Path(args.data).glob("AR_GPU*_LUT")) for s in read_lut(path)]
    elif args.public:
        check_public(read_public(Path(args.public)))
        check_multinode(read_multinode(Path(args.public)))
        return
    else:
        raise SystemExit("give --data DIR (vTrain's trace/a100), --public DIR or --smoke")
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
    if args.smoke:
        check_public(smoke_public())
        made = [
            ("made", "H100", "all_reduce", n, float(size), profile_s("all_reduce", n, size, "H100"))
            for n in (16, 64)
            for size in (MB, 2048 * MB)
        ]
        check_multinode({"made": made})
    elif args.public:
        check_public(read_public(Path(args.public)), fit)
        check_multinode(read_multinode(Path(args.public)))


if __name__ == "__main__":
    main()
