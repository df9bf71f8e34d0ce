"""A ring-attention layer against the single-GPU blocks it replaces, predicted beside the published figures of
ring-flash-attention ([ring-flash-attn] README: 8 GPUs, Llama-3.1-8B's attention, 32 query and 8 KV heads of
128, 8K tokens a GPU, causal; "theoretic" = the single-GPU flash_attn call of 8K tokens, whose time x 8 is the
ring's work without its costs).

    python benchmarks/ring_efficiency.py                                   # the profiles' own tables
    python benchmarks/ring_efficiency.py --data ../shared/data/kernels     # also FlashAttention-2's H100 tables

It also reads the ring's compute alone, measured on one H200 (benchmarks/results/h200-linears-2026-12-04.json,
`benchmarks/gpu_kernels.py measure --parts split`): every (rank, step) block of cp-plan's reference kernel,
32 query and 32 KV heads of 128, 8K tokens a rank, no transfer made; a ring step lasts as long as its slowest
rank. Beside it, the model on the H200 profile with the same heads, whose NVLink ring hides every transfer
of that size, so that its figure is its compute too.

Efficiency = 8 x the single call's time / the ring layer's. Each is a kernel benchmark of seconds, so the
profiles' tables are read as measured, at the boost clock (`HardwareProfile.at_boost`), not at the sustained
clock of a training run. It is printed for the merge the step model
charges by default (12 bytes an element: two fp32 partials read, one written) and for the merge
ring-flash-attention runs (its update_out_and_lse: the step output cast to fp32, then three elementwise
passes, 34 bytes an element unfused). The runs used FlashAttention-2 (flash_attn); the H800 profile's tables
are FlashAttention-3's, so with --data the H800 rows are also read on FlashAttention-2's H100 forward tables,
fitted from the FlashAttention-3 paper's baselines by `cp-plan hw fit-kernels` (no causal backward is
published for it, so only the forward is compared there).
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

from costmodel.machines.binding import Machine, build_machine
from costmodel.machines.kernel_fit import fit_kernels
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs, build
from costmodel.plans.timing import predict

SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "causal": True}
SPLIT = Path(__file__).parent / "results" / "h200-linears-2026-12-04.json"
GPUS, LOCAL = 8, 8192
# cp-plan's reference kernel's merge_lse, op by op: out *= w (fp32 read and write, 8), w_B x O_B into an fp32
# temporary (bf16 read, fp32 write, 6), out += it (two fp32 reads, one write, 12): 26 bytes an element
REFERENCE_MERGE_BYTES = 26.0
UNFUSED_MERGE_BYTES = 34.0  # ring-flash-attn's update_out_and_lse, op by op (see the module docstring)
# [ring-flash-attn] README, batch api: (GPU, pass, layout) -> efficiency as published
PUBLISHED = {
    ("8xH800", "fwd", "contiguous"): 0.521,
    ("8xH800", "fwd", "zigzag"): 0.852,
    ("8xH800", "fwd", "striped"): 0.744,
    ("8xH800", "fwd+bwd", "contiguous"): 0.539,
    ("8xH800", "fwd+bwd", "zigzag"): 0.902,
    ("8xH800", "fwd+bwd", "striped"): 0.829,
    ("8xA100", "fwd", "contiguous"): 0.514,
    ("8xA100", "fwd", "zigzag"): 0.817,
    ("8xA100", "fwd", "striped"): 0.696,
    ("8xA100", "fwd+bwd", "contiguous"): 0.525,
    ("8xA100", "fwd+bwd", "zigzag"): 0.898,
    ("8xA100", "fwd+bwd", "striped"): 0.826,
}
PROFILES = {"8xH800": "h800-nvlink", "8xA100": "a100-nvlink"}


def efficiency(
    machine: Machine,
    hw: str,
    layout: str,
    pass_: str,
    merge_bytes: float,
    gpus: int = GPUS,
    shape: dict = SHAPE,
) -> float:
    ring = build(PlanInputs, seq=gpus * LOCAL, cp=gpus, hw=hw, layout=layout, **shape)
    single = build(PlanInputs, seq=LOCAL, cp=1, hw=hw, **shape)
    backward = pass_ == "fwd+bwd"
    layer = predict(ring, machine, "ring", backward, merge_bytes=merge_bytes).for_pass(pass_)[0]
    alone = predict(single, machine, "ring", backward).for_pass(pass_)[0]
    return gpus * alone / layer


def measured_split(rows: list[dict], layout: str, gpus: int, pass_: str) -> float:
    """N single calls over the ring's compute: per step its slowest rank's block, forward or both passes."""
    passes = ("fwd",) if pass_ == "fwd" else ("fwd", "bwd")
    single = next(r for r in rows if r["layout"] == "single")
    ring = [r for r in rows if r["layout"] == layout and r["world"] == gpus]
    steps = sum(
        max(sum(r.get(f"{p}_ms", 0.0) for p in passes) for r in ring if r["step"] == step)
        for step in range(gpus)
    )
    return gpus * sum(single[f"{p}_ms"] for p in passes) / steps


def split_table() -> None:
    data = json.loads(SPLIT.read_text())
    machine = build_machine(load_profile("h200-nvlink").at_boost())
    shape = {**SHAPE, "kv_heads": SHAPE["heads"]}
    print(
        f"\nOne {data['device']}, the ring's compute alone (torch {data['torch']}; cp-plan's reference kernel):"
    )
    print(f"{'N':>3} {'pass':<8} {'layout':<11} {'measured':>9} {'fused merge':>12} {'its merge':>10}")
    misses = []
    for gpus in (2, 4, 8):
        for pass_ in ("fwd", "fwd+bwd"):
            for layout in ("contiguous", "zigzag"):
                measured = measured_split(data["split"], layout, gpus, pass_)
                fused = efficiency(machine, "h200-nvlink", layout, pass_, 12.0, gpus, shape)
                own = efficiency(machine, "h200-nvlink", layout, pass_, REFERENCE_MERGE_BYTES, gpus, shape)
                misses.append((abs(fused - measured), abs(own - measured)))
                print(
                    f"{gpus:3} {pass_:<8} {layout:<11} {measured:9.1%} {fused:12.1%} {own:10.1%}"
                    f"  ({(fused - measured) * 100:+.1f}, {(own - measured) * 100:+.1f} points)"
                )
    print(
        f"worst: fused merge {max(m[0] for m in misses) * 100:.1f} points, its merge "
        f"{max(m[1] for m in misses) * 100:.1f}; within 6: {sum(m[0] <= 0.06 for m in misses)} and "
        f"{sum(m[1] <= 0.06 for m in misses)} of {len(misses)}"
    )


def fa2_machine(data: Path, hw: str) -> Machine:
    """The profile with FlashAttention-2's H100 forward curves (the FA3 paper's FA2 bars) in place of its own."""
    rows = [
        r
        for r in csv.DictReader((data / "fa3_paper_and_fa2_readme_h100_attention.csv").open(encoding="utf-8"))
        if r["kernel"] == "FlashAttention-2" and r["pass"] == "fwd" and r["dtype"].startswith("bf16")
    ]
    path = Path(tempfile.mkdtemp()) / "fa2.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["head_dim", "causal", "pass", "seq", "batch", "heads", "tflops"])
        for r in rows:
            writer.writerow(
                [r["head_dim"], r["causal"].lower(), "fwd", r["seq"], r["batch"], r["heads"], r["tflops"]]
            )
    profile, _ = fit_kernels(load_profile(hw).at_boost(), None, str(path), f"{hw}-fa2")
    return build_machine(profile)


def published_rows(data: Path | None = None) -> list[tuple[str, str, str, str, float, float, float]]:
    """Each published row against the model: (GPUs, tables, pass, layout, published, fused merge, unfused
    merge). The profiles' own tables, and with ``data`` the H800 forward rows on FlashAttention-2's tables."""
    readings = [
        (gpu, PROFILES[gpu], build_machine(load_profile(PROFILES[gpu]).at_boost()), "profile")
        for gpu in PROFILES
    ]
    if data is not None:
        readings.append(("8xH800", "h800-nvlink", fa2_machine(data, "h800-nvlink"), "FA2 fwd"))
    return [
        (
            gpu,
            tables,
            pass_,
            layout,
            published,
            efficiency(machine, hw, layout, pass_, 12.0),
            efficiency(machine, hw, layout, pass_, UNFUSED_MERGE_BYTES),
        )
        for gpu, hw, machine, tables in readings
        for (g, pass_, layout), published in PUBLISHED.items()
        if g == gpu and (tables != "FA2 fwd" or pass_ == "fwd")
    ]


def summary(rows: list[tuple[str, str, str, str, float, float, float]]) -> str:
    misses = [abs(unfused - published) for *_, published, _, unfused in rows]
    return f"unfused merge: worst {max(misses) * 100:.1f} points, {sum(m <= 0.06 for m in misses)} of {len(misses)} within 6"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", help="the folder of public kernel tables (for FlashAttention-2's H100 tables)"
    )
    args = parser.parse_args()
    print(
        f"{'GPUs':<7} {'tables':<8} {'pass':<8} {'layout':<11} {'published':>9} {'fused merge':>12} {'unfused':>9}"
    )
    rows = published_rows(Path(args.data) if args.data else None)
    for gpu, tables, pass_, layout, published, fused, unfused in rows:
        print(
            f"{gpu:<7} {tables:<8} {pass_:<8} {layout:<11} {published:9.1%} {fused:12.1%} {unfused:9.1%}"
            f"  ({(unfused - published) * 100:+.1f} points)"
        )
    print(summary(rows))
    split_table()


if __name__ == "__main__":
    main()
