"""A ring-attention layer against the single-GPU blocks it replaces, predicted beside the published figures of
ring-flash-attention ([ring-flash-attn] README: 8 GPUs, Llama-3.1-8B's attention, 32 query and 8 KV heads of
128, 8K tokens a GPU, causal; "theoretic" = the single-GPU flash_attn call of 8K tokens, whose time x 8 is the
ring's work without its costs).

    python benchmarks/ring_efficiency.py

The runs used FlashAttention-2 (flash_attn): the A100 rows read the A100 profile's tables (FlashAttention-2's
shape), the H800 rows the H800 profile's `fa2` tables, and, to show what the wrong kernel's tables do, its
default ones (FlashAttention-3's). Each row prints the efficiency (8 x the single call's time / the ring
layer's) published and predicted, for the merge the step model charges by default (12 bytes an element: two
fp32 partials read, one written) and for the merge ring-flash-attention runs (its update_out_and_lse: the step
output cast to fp32, then three elementwise passes, 38 bytes an element unfused, as torch's context_parallel
merger: `EAGER_MERGE_BYTES`), and the layer's and the
single call's predicted time over the measured. Each is a kernel benchmark of seconds, so the profiles' tables
are read as measured, at the boost clock (`HardwareProfile.at_boost`), not at the sustained clock of a
training run.

It also reads the ring's compute alone, measured on one H200 (benchmarks/results/h200-linears-2026-12-04.json,
`benchmarks/gpu_kernels.py measure --parts split`): every (rank, step) block of cp-plan's reference kernel,
32 query and 32 KV heads of 128, 8K tokens a rank, no transfer made; a ring step lasts as long as its slowest
rank. Beside it, the model on the H200 profile's tables of the kernel that ran (SDPA flash), whose NVLink ring
hides every transfer of that size, so that its figure is its compute too.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from costmodel.frameworks.profiles import EAGER_MERGE_BYTES
from costmodel.machines.binding import Machine, build_machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs, build
from costmodel.plans.timing import predict, ring_overhead_s

SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "causal": True}
SPLIT = Path(__file__).parent / "results" / "h200-linears-2026-12-04.json"
GPUS, LOCAL = 8, 8192
# cp-plan's reference kernel's merge_lse, op by op: out *= w (fp32 read and write, 8), w_B x O_B into an fp32
# temporary (bf16 read, fp32 write, 6), out += it (two fp32 reads, one write, 12): 26 bytes an element
REFERENCE_MERGE_BYTES = 26.0
# ring-flash-attn's striped forward (stripe_flash_attn.py @8996282): a step past a rank's own attends queries and
# keys shifted by one token and merges into the output's slice [:, 1:] (update_out_and_lse with slice_), then
# copies the merged slice back (`out[slice_] = slice_out`: an fp32 read and write). Every step after the first
# has ranks on that path (those below it), and a step lasts as long as its slowest rank. Zigzag's sliced path
# merges half the output, so its full-path ranks set the step; the backward adds the slices in place.
STRIPED_COPY_BACK_BYTES = 8.0
# [ring-flash-attn] README, batch api: iterations a second of the single 8K call and of each ring layer; the
# README's efficiency is (single / 8) / ring, to its rounding
ITERATIONS = {
    ("8xH800", "fwd"): {"single": 591.5, "contiguous": 38.5, "zigzag": 63.0, "striped": 55.0},
    ("8xH800", "fwd+bwd"): {"single": 154.7, "contiguous": 10.4, "zigzag": 17.4, "striped": 16.0},
    ("8xA100", "fwd"): {"single": 373.4, "contiguous": 24.0, "zigzag": 38.2, "striped": 32.5},
    ("8xA100", "fwd+bwd"): {"single": 94.7, "contiguous": 6.2, "zigzag": 10.6, "striped": 9.75},
}
PROFILES = {"8xH800": "h800-nvlink", "8xA100": "a100-nvlink"}


@dataclass(frozen=True)
class Layer:
    """One attention layer of the comparison: the profile it names, its layout and pass, the merge charged
    per element (and what the forward's merge copies beside it), the ring's size (1: the single call of LOCAL
    tokens) and the heads."""

    hw: str
    layout: str
    pass_: str
    merge_bytes: float
    gpus: int = GPUS
    shape: tuple = tuple(SHAPE.items())
    forward_copy_bytes: float = 0.0

    def seconds(self, machine: Machine) -> float:
        plan = build(
            PlanInputs,
            seq=self.gpus * LOCAL,
            cp=self.gpus,
            hw=self.hw,
            layout=self.layout,
            **dict(self.shape),
        )
        backward = self.pass_ == "fwd+bwd"
        layer = predict(plan, machine, "ring", backward, merge_bytes=self.merge_bytes).for_pass(self.pass_)[0]
        # the merge's cost is linear in its bytes: the copy is the difference of two merges
        copy = ring_overhead_s(plan, machine, self.merge_bytes + self.forward_copy_bytes) - ring_overhead_s(
            plan, machine, self.merge_bytes
        )
        return layer + copy

    def efficiency(self, machine: Machine) -> float:
        """N single calls' time over the ring layer's."""
        alone = replace(self, layout="contiguous", gpus=1).seconds(machine)
        return self.gpus * alone / self.seconds(machine)


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


def split_machine() -> Machine:
    """The H200 profile as the split measurement ran: at a kernel benchmark's clock, on the tables of the
    kernel it called (torch's SDPA flash backend, which the profile holds by name)."""
    return replace(build_machine(load_profile("h200-nvlink").at_boost()), attention_kernel="sdpa-flash")


def split_table() -> None:
    data = json.loads(SPLIT.read_text())
    machine = split_machine()
    shape = tuple({**SHAPE, "kv_heads": SHAPE["heads"]}.items())
    print(
        f"\nOne {data['device']}, the ring's compute alone (torch {data['torch']}; cp-plan's reference kernel):"
    )
    print(f"{'N':>3} {'pass':<8} {'layout':<11} {'measured':>9} {'fused merge':>12} {'its merge':>10}")
    misses = []
    for gpus in (2, 4, 8):
        for pass_ in ("fwd", "fwd+bwd"):
            for layout in ("contiguous", "zigzag"):
                measured = measured_split(data["split"], layout, gpus, pass_)
                layer = Layer("h200-nvlink", layout, pass_, 12.0, gpus, shape)
                fused = layer.efficiency(machine)
                own = replace(layer, merge_bytes=REFERENCE_MERGE_BYTES).efficiency(machine)
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


@dataclass(frozen=True)
class Row:
    """One published ring layer against the model: efficiencies, and the layer's and the single call's
    predicted time over the measured (the model's merge: ring-flash-attention's own)."""

    gpus: str
    tables: str
    pass_: str
    layout: str
    published: float
    fused: float
    unfused: float
    layer_ratio: float
    single_ratio: float


def published_rows() -> list[Row]:
    """Each published row against the model: the A100's on its profile's tables, the H800's on the profile's
    `fa2` tables (the kernel that ran) and on its default FlashAttention-3 ones."""
    a100 = build_machine(load_profile("a100-nvlink").at_boost())
    h800 = build_machine(load_profile("h800-nvlink").at_boost())
    readings = [
        ("8xA100", "a100-nvlink", a100, "profile"),
        ("8xH800", "h800-nvlink", replace(h800, attention_kernel="fa2"), "fa2"),
        ("8xH800", "h800-nvlink", h800, "FA3"),
    ]
    rows = []
    for gpu, hw, machine, tables in readings:
        for (g, pass_), measured in ITERATIONS.items():
            if g != gpu:
                continue
            single = Layer(hw, "contiguous", pass_, EAGER_MERGE_BYTES, 1).seconds(machine)
            for layout in ("contiguous", "zigzag", "striped"):
                copy = STRIPED_COPY_BACK_BYTES if layout == "striped" else 0.0
                ring = Layer(hw, layout, pass_, EAGER_MERGE_BYTES, forward_copy_bytes=copy).seconds(machine)
                rows.append(
                    Row(
                        gpu,
                        tables,
                        pass_,
                        layout,
                        measured[layout] * GPUS / measured["single"],
                        Layer(hw, layout, pass_, 12.0).efficiency(machine),
                        GPUS * single / ring,
                        ring * measured[layout],
                        single * measured["single"],
                    )
                )
    return rows


def summary(rows: list[Row]) -> str:
    """The rows read on the kernel the runs used (FlashAttention-2: the A100 profile's tables, the H800's
    `fa2` ones; not the H800's FlashAttention-3 defaults): efficiency and layer-time misses."""
    own = [r for r in rows if r.tables != "FA3"]
    misses = [abs(r.unfused - r.published) for r in own]
    times = [abs(r.layer_ratio - 1) for r in own]
    return (
        f"on FlashAttention-2's tables, its merge: worst {max(misses) * 100:.1f} points, "
        f"{sum(m <= 0.06 for m in misses)} of {len(misses)} within 6; layer times worst {max(times):.1%} off, "
        f"{sum(t <= 0.1 for t in times)} of {len(times)} within 10 %"
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(
        f"{'GPUs':<7} {'tables':<8} {'pass':<8} {'layout':<11} {'published':>9} {'fused merge':>12} "
        f"{'its merge':>10}   time model/measured: layer, single call"
    )
    rows = published_rows()
    for r in rows:
        print(
            f"{r.gpus:<7} {r.tables:<8} {r.pass_:<8} {r.layout:<11} {r.published:9.1%} {r.fused:12.1%} "
            f"{r.unfused:10.1%}  ({(r.unfused - r.published) * 100:+.1f} points)  {r.layer_ratio:.3f}, "
            f"{r.single_ratio:.3f}"
        )
    print(summary(rows))
    split_table()


if __name__ == "__main__":
    main()
