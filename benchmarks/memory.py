"""Memory per device: the model against the torch reference on a grid, and against published peaks.

    python benchmarks/memory.py            # the grid (8B to 405B, dense and Mixtral; minutes) and the tables
    python benchmarks/memory.py --smoke    # three small grid cases and the tables

(a) Each job of the grid is planned by the model (``costmodel.training.memory``) and run by the torch
reference (``costmodel.kernel.memory``: its stages as real model code on fake tensors, PyTorch's MemTracker
counting every tensor): allocated bytes at the step's peak, total and by group of categories (what
persists and what comes and goes: ``costmodel.training.memory.against_reference``); and, without ZeRO-3,
what PyTorch's caching allocator reserves for the stages, replayed (``costmodel.kernel.allocator``), against
the model's reserve.
(b) Published peaks per GPU (validation/memory_peaks.yaml; validation/SOURCES.md): each row's figure of its
kind (reserved, allocated, or the device's whole use) against the model's, the fitting part and the
held-out part apart.
(c) Of those, the reserved and whole-device peaks the replay can run (no ZeRO-3, no offload): the model's
figure beside the reference's replayed reservation (with the model's runtime for a whole-device one).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from costmodel.kernel.memory import stages_peak
from costmodel.plans.job import Job
from costmodel.training.memory import against_reference, reference_cases
from costmodel.training.memory_validation import GOAL, NotExpressible, job_of, predicted_bytes, rows
from costmodel.training.step import step_memory

GIB = 2**30
H100 = {"hw": "h100-nvlink"}
MIXTRAL = str(
    Path(__file__).parents[1] / "tests" / "data" / "hf" / "mixtral-8x7b.json"
)  # Mixtral 8x7B's config.json
QWEN_MOE = str(
    Path(__file__).parents[1] / "tests" / "data" / "hf" / "qwen1.5-moe-a2.7b.json"
)  # a shared expert
GRID: list[dict] = [
    {"model": "llama3-8b", "seq": 8192, "gpus": 8, "global_batch": 16},
    {"model": "llama3-8b", "seq": 8192, "gpus": 8, "global_batch": 16, "recompute": "full"},
    {"model": "llama3-8b", "seq": 8192, "gpus": 8, "global_batch": 16, "recompute": "none", "tp": 2},
    {"model": "llama3-8b", "seq": 8192, "gpus": 8, "global_batch": 16, "loss": "chunked"},
    {"model": "llama3-8b", "seq": 32768, "gpus": 8, "global_batch": 8, "recompute": "full", "framework": "torchtitan", "zero": 3},
    {"model": "llama3-8b", "seq": 32768, "gpus": 8, "global_batch": 8, "recompute": "none", "framework": "torchtitan", "zero": 3, "loss": "chunked"},
    {"model": "llama3-8b", "seq": 16384, "gpus": 8, "global_batch": 8, "recompute": "full", "framework": "hf-trainer", "zero": 3, "loss": "fused"},
    {"model": "llama3-8b", "seq": 131072, "gpus": 16, "global_batch": 8, "tp": 2, "cp": 8, "recompute": "full"},
    {"model": "llama3-8b", "seq": 131072, "gpus": 32, "global_batch": 8, "cp": 8, "recompute": "full", "framework": "torchtitan", "zero": 3},
    {"model": "llama3-8b", "seq": 65536, "gpus": 8, "global_batch": 8, "cp": 4, "cp_scheme": "ulysses", "recompute": "full"},
    {"model": "llama3-8b", "seq": 65536, "gpus": 8, "global_batch": 8, "cp": 4, "cp_scheme": "allgather", "recompute": "none"},
    {"model": "llama3-8b", "seq": 65536, "gpus": 8, "global_batch": 8, "cp": 8, "cp_scheme": "ring", "recompute": "selective"},
    {"model": "llama3-70b", "seq": 8192, "gpus": 32, "global_batch": 32, "tp": 8, "pp": 4, "recompute": "full"},
    {"model": "llama3-70b", "seq": 8192, "gpus": 32, "global_batch": 32, "tp": 8, "pp": 4, "recompute": "selective"},
    {"model": "llama3-70b", "seq": 32768, "gpus": 64, "global_batch": 16, "tp": 8, "cp": 4, "recompute": "selective"},
    {"model": "llama3-70b", "seq": 8192, "gpus": 64, "global_batch": 64, "tp": 8, "recompute": "full", "framework": "torchtitan", "zero": 3},
    {"model": "llama3-70b", "seq": 65536, "gpus": 64, "global_batch": 8, "tp": 8, "cp": 8, "recompute": "full", "framework": "torchtitan", "zero": 3, "cp_scheme": "allgather"},
    {"model": "llama3-405b", "seq": 8192, "gpus": 512, "global_batch": 64, "tp": 8, "pp": 8, "recompute": "full", "framework": "torchtitan", "zero": 3},
    {"model": "llama3-405b", "seq": 131072, "gpus": 512, "global_batch": 16, "tp": 8, "cp": 8, "pp": 8, "recompute": "full"},
    {"model": "llama3-405b", "seq": 32768, "gpus": 1024, "global_batch": 32, "tp": 8, "cp": 2, "pp": 16, "recompute": "full", "zero": 1},
    {"model": MIXTRAL, "seq": 32768, "gpus": 32, "global_batch": 8, "tp": 2, "cp": 2, "ep": 4, "recompute": "full"},
    {"model": MIXTRAL, "seq": 65536, "gpus": 64, "global_batch": 8, "tp": 2, "cp": 4, "ep": 2, "recompute": "selective"},
    {"model": MIXTRAL, "seq": 16384, "gpus": 64, "global_batch": 16, "tp": 4, "pp": 4, "ep": 2, "recompute": "full"},
    {"model": MIXTRAL, "seq": 65536, "gpus": 64, "global_batch": 8, "tp": 2, "cp": 4, "ep": 2, "recompute": "full", "framework": "torchtitan", "zero": 3},
    {"model": MIXTRAL, "seq": 32768, "gpus": 64, "global_batch": 8, "tp": 2, "cp": 4, "ep": 4, "recompute": "none", "framework": "torchtitan", "zero": 3},
    {"model": QWEN_MOE, "seq": 32768, "gpus": 16, "global_batch": 8, "tp": 2, "pp": 2, "ep": 4, "recompute": "full"},
    {"model": QWEN_MOE, "seq": 65536, "gpus": 32, "global_batch": 8, "cp": 4, "ep": 4, "recompute": "selective"},
    {"model": QWEN_MOE, "seq": 16384, "gpus": 16, "global_batch": 16, "ep": 4, "recompute": "none", "framework": "torchtitan", "zero": 3},
    {"model": "llama2-7b", "seq": 16384, "gpus": 8, "global_batch": 8, "recompute": "selective", "framework": "deepspeed", "zero": 1},
    {"model": "llama3-70b", "seq": 16384, "gpus": 64, "global_batch": 32, "tp": 8, "cp": 2, "pp": 4, "recompute": "full", "zero": 1},
    {"model": "qwen2.5-72b", "seq": 32768, "gpus": 64, "global_batch": 16, "tp": 8, "cp": 4, "recompute": "selective"},
    # InternEvo's memory tests: the hybrid ZeRO's step (bf16 gradients cast to the fp32 master, foreach AdamW)
    {"model": "llama2-7b", "seq": 2048, "hw": "a800-nvlink", "gpus": 3, "global_batch": 4, "pp": 3, "recompute": "full", "framework": "internevo", "zero": 1},
    {"model": "llama2-13b", "seq": 2048, "hw": "a800-nvlink", "gpus": 4, "global_batch": 4, "tp": 4, "recompute": "full", "framework": "internevo", "zero": 1},
]  # fmt: skip
SMOKE = GRID[:2] + [GRID[8]]


def grid(cases: list[dict]) -> None:
    print(
        "(a) the model against the torch reference: allocated bytes at the step's peak, and what the caching "
        "allocator reserves (replayed; not under ZeRO-3)"
    )
    errors, worst_group, reserve_errors = [], 0.0, []
    for flags in cases:
        job = Job.of(**H100 | flags)
        start = time.process_time()
        where, measured = stages_peak(reference_cases(job), reserved=True)
        seconds = time.process_time() - start
        peak, by = measured.peak_bytes, measured.by_category
        model = step_memory(job).by_category
        error = model.allocated_bytes / peak - 1
        errors.append(abs(error))
        errors_by_group = against_reference(model.model_dump(), {k: float(v) for k, v in by.items()}, peak)
        group_error = max(map(abs, errors_by_group.values()))
        worst_group = max(worst_group, group_error)
        reserve = ""
        if measured.reserved_bytes is not None:
            reserve_errors.append(model.reserved_bytes / measured.reserved_bytes - 1)
            reserve = (
                f"\n        reserved: replayed {measured.reserved_bytes / GIB:7.2f} GiB, model "
                f"{model.reserved_bytes / GIB:7.2f} GiB {reserve_errors[-1]:+.1%}"
            )
        name = " ".join(f"{k}={v}" for k, v in flags.items())
        print(
            f"    {name}\n        reference {peak / GIB:7.2f} GiB ({where}, {measured.moment}, {seconds:.1f} s)"
            f"   model {model.allocated_bytes / GIB:7.2f} GiB ({model.peak}) {error:+.1%}; worst group "
            f"{group_error:.1%}{reserve}"
        )
    print(
        f"    {len(errors)} jobs: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}; "
        f"worst group of categories {worst_group:.1%}"
    )
    if reserve_errors:
        print(
            f"    reserved, {len(reserve_errors)} jobs without ZeRO-3: median |error| "
            f"{statistics.median(map(abs, reserve_errors)):.1%}, signed median "
            f"{statistics.median(reserve_errors):+.1%}, worst {max(reserve_errors, key=abs):+.1%}"
        )


def published() -> None:
    print("(b) published peaks per GPU, the model's figure of each row's kind")
    for part in ("fitting", "holdout"):
        errors, missed, skipped = [], [], []
        for row in rows(part):
            try:
                error = predicted_bytes(row) / row.measured_bytes - 1
            except NotExpressible as exc:
                skipped.append(f"{row.id} ({exc})")
                continue
            errors.append(abs(error))
            if abs(error) > GOAL:
                missed.append(f"{row.id} {error:+.0%}")
        print(
            f"    {part}: {len(errors)} rows, median |error| {statistics.median(errors):.1%}, worst "
            f"{max(errors):.1%}, {sum(e <= GOAL for e in errors)} within {GOAL:.0%}"
        )
        for line in missed:
            print(f"        beyond {GOAL:.0%}: {line}")
        for line in skipped:
            print(f"        not planned: {line}")


def replayed() -> None:
    """The published reserved and whole-device peaks the replay can run (no ZeRO-3, no offload): the model's
    figure and the reference's replayed reservation (plus the model's runtime for a whole-device figure)."""
    print("(c) published peaks the allocator replay runs (no ZeRO-3, no offload): the model, then the replay")
    for part in ("fitting", "holdout"):
        errors: list[tuple[float, float]] = []
        for row in rows(part):
            try:
                job = job_of(row)
                figure = predicted_bytes(row)
            except NotExpressible:
                continue
            if row.kind == "allocated" or job.setup.zero == 3 or job.setup.offload != "none":
                continue
            reserved = stages_peak(reference_cases(job), reserved=True)[1].reserved_bytes
            runtime = figure - step_memory(job).by_category.reserved_bytes if row.kind != "reserved" else 0.0
            errors.append((figure / row.measured_bytes - 1, (reserved + runtime) / row.measured_bytes - 1))
            print(f"        {row.id} ({row.kind}): model {errors[-1][0]:+.1%}, replay {errors[-1][1]:+.1%}")
        model, replay = (statistics.median(abs(e[i]) for e in errors) for i in (0, 1))
        closer = sum(abs(b) < abs(a) for a, b in errors)
        print(
            f"    {part}: {len(errors)} rows, median |error| model {model:.1%}, replay {replay:.1%}; the replay "
            f"closer in {closer}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="three small grid cases, no replayed rows")
    args = parser.parse_args()
    grid(SMOKE if args.smoke else GRID)
    published()
    if not args.smoke:
        replayed()


if __name__ == "__main__":
    main()
