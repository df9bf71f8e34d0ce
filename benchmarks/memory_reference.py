"""The training-memory reference on fake tensors: one device's peak, by category, over 8B-405B shapes.

    python benchmarks/memory_reference.py [--smoke] [--full]
    python benchmarks/memory_reference.py --cuda [--out FILE]    # on a CUDA machine (torch only)

Each row is one device of a Llama 3 job (or Mixtral 8x7B, experts not split over ranks): TP with
sequence parallelism, CP (ring, all-gather, Ulysses), PP (the first stage holds pp micro-batches under
1F1B, the last the output layer), ZeRO-1 or FSDP2 over DP x CP, and each recompute and loss. It prints the
peak (GiB), when it happens, its breakdown, and the seconds `measure` took on this machine; ``--full`` runs
every layer of every stage instead of extrapolating from four and five (the same numbers, slower).

``--cuda`` holds the fake-tensor figure to a real device: each case of :data:`CUDA_GRID` (four layers of a
Llama 2 7B-shaped model, whose query and KV heads are equal, as FlashAttention's CUDA op wants them; every
recompute and loss mode, CP by each scheme, TP with sequence parallelism, a pipeline's first stage) runs on
fake tensors and again on real CUDA tensors, and prints the tracker's peak on each beside the caching
allocator's own peaks (``max_memory_allocated``, ``max_memory_reserved``) and the reservation the fake run
replays (``costmodel.kernel.allocator``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace

from costmodel.kernel.memory import CATEGORIES, MemoryCase, measure

GIB = 2**30
SHORT = {
    "weights": "weights",
    "gradients": "grads",
    "optimizer": "optim",
    "activations": "acts",
    "loss": "loss",
    "cp_buffers": "cp",
    "fsdp_buffers": "fsdp",
    "temporaries": "temps",
}


@dataclass(frozen=True)
class Model:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    experts: int = 0
    experts_per_token: int = 0
    head_dim: int = 128


LLAMA3_8B = Model(32, 4096, 32, 8, 14336, 128256)
LLAMA3_70B = Model(80, 8192, 64, 8, 28672, 128256)
LLAMA3_405B = Model(126, 16384, 128, 8, 53248, 128256)
MIXTRAL_8X7B = Model(32, 4096, 32, 8, 14336, 32000, experts=8, experts_per_token=2)
LLAMA2_7B_4L = Model(4, 4096, 32, 32, 11008, 32000)  # four layers: a few GB on one GPU
MOE_4L = Model(4, 4096, 32, 32, 14336, 32000, experts=8, experts_per_token=2)  # Mixtral's MLP, heads equal


def device(
    model: Model, seq: int, *, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, last: bool = False, **knobs
) -> MemoryCase:
    """One device's share: the first pipeline stage (pp micro-batches in flight), or the last (``last``)."""
    first = not last
    return MemoryCase(
        tokens=seq // cp,
        micro_batch=1,
        layers=math.ceil(model.layers / pp),
        hidden=model.hidden,
        heads=model.heads // tp,
        kv_heads=max(model.kv_heads // tp, 1),
        head_dim=model.head_dim,
        ffn_hidden=0 if model.experts else model.ffn // tp,  # an MoE's: its shared expert (Mixtral has none)
        vocab=model.vocab // tp,
        tp=tp,
        sequence_parallel=tp > 1,
        input_embedding=first or pp == 1,
        output_layer=last or pp == 1,
        experts=model.experts,
        experts_per_token=model.experts_per_token,
        expert_ffn=model.ffn // tp if model.experts else 0,
        shard_group=dp * cp,
        cp=cp,
        in_flight=pp if first else 1,
        **knobs,
    )


GRID = {
    "8B 8k dp8 zero1 selective": device(LLAMA3_8B, 8192, dp=8),
    "8B 8k dp8 zero1 no recompute": device(LLAMA3_8B, 8192, dp=8, recompute="none"),
    "8B 8k dp8 zero1 full chunked": device(LLAMA3_8B, 8192, dp=8, recompute="full", loss="chunked"),
    "8B 8k fsdp8 full": device(LLAMA3_8B, 8192, dp=8, zero=3, fsdp=True, recompute="full"),
    "8B 128k tp2 cp8 ring full chunked": device(
        LLAMA3_8B, 131072, tp=2, cp=8, recompute="full", loss="chunked"
    ),
    "70B 8k tp8 pp4 dp8 first stage": device(LLAMA3_70B, 8192, tp=8, pp=4, dp=8),
    "70B 8k tp8 pp4 dp8 last stage": device(LLAMA3_70B, 8192, tp=8, pp=4, dp=8, last=True),
    "70B 32k tp8 cp4 all-gather dp2": device(LLAMA3_70B, 32768, tp=8, cp=4, dp=2, cp_scheme="allgather"),
    "405B 8k tp8 fsdp64 full": device(LLAMA3_405B, 8192, tp=8, dp=64, zero=3, fsdp=True, recompute="full"),
    "405B 16k tp8 cp2 pp16 dp8 first": device(LLAMA3_405B, 16384, tp=8, cp=2, pp=16, dp=8),
    "405B 128k tp8 cp16 Ulysses pp8 first": device(
        LLAMA3_405B, 131072, tp=8, cp=16, pp=8, cp_scheme="ulysses", recompute="full"
    ),
    "Mixtral 8x7B 8k tp2 dp8 zero1": device(MIXTRAL_8X7B, 8192, tp=2, dp=8),
}
CUDA_GRID = {
    "7B/4L 4k selective": device(LLAMA2_7B_4L, 4096),
    "7B/4L 4k mb2 selective": replace(device(LLAMA2_7B_4L, 4096), micro_batch=2),
    "7B/4L 16k no recompute": device(LLAMA2_7B_4L, 16384, recompute="none"),
    "7B/4L 16k full chunked": device(LLAMA2_7B_4L, 16384, recompute="full", loss="chunked"),
    "7B/4L 16k selective fused": device(LLAMA2_7B_4L, 16384, loss="fused"),
    "7B/4L 32k cp4 ring": device(LLAMA2_7B_4L, 32768, cp=4),
    "7B/4L 32k cp4 all-gather": device(LLAMA2_7B_4L, 32768, cp=4, cp_scheme="allgather"),
    "7B/4L 32k cp4 Ulysses": device(LLAMA2_7B_4L, 32768, cp=4, cp_scheme="ulysses"),
    "7B/4L 8k tp2 sp": device(LLAMA2_7B_4L, 8192, tp=2),
    "7B/4L 8k tp2 vocab-parallel CE": device(LLAMA2_7B_4L, 8192, tp=2, cross_entropy="megatron"),
    "7B/4L 8k pp2 first stage": device(LLAMA2_7B_4L, 8192, pp=2),
    "7B/4L 8k dp4 zero1": device(LLAMA2_7B_4L, 8192, dp=4),
    "MoE 8x/4L 4k tp2": device(MOE_4L, 4096, tp=2),
}
SMOKE = {
    "tiny dense zero1": MemoryCase(
        tokens=512,
        micro_batch=1,
        layers=6,
        hidden=256,
        heads=4,
        kv_heads=2,
        head_dim=64,
        ffn_hidden=512,
        vocab=1000,
    ),
    "tiny fsdp ring": MemoryCase(
        tokens=512,
        micro_batch=1,
        layers=2,
        hidden=256,
        heads=4,
        kv_heads=2,
        head_dim=64,
        ffn_hidden=512,
        vocab=1000,
        zero=3,
        fsdp=True,
        shard_group=4,
        cp=2,
    ),
}


def cuda_case(name: str) -> dict:
    """One case of :data:`CUDA_GRID` on fake tensors, then two iterations on the GPU (the peaks are the
    second's; the allocator's cover both), in a process of its own so that the allocator starts empty."""
    import torch

    case = CUDA_GRID[name]
    row = {"case": name, **{k: getattr(case, k) for k in ("tokens", "micro_batch", "layers", "tp", "cp")}}
    fake = measure(case, full=True, warmup=True)
    row.update(fake_bytes=fake.peak_bytes, fake_moment=fake.moment, fake_by_category=fake.by_category)
    row.update(replayed_reserved_bytes=fake.reserved_bytes)
    try:
        real = measure(case, device="cuda", warmup=True)
    except Exception as error:  # noqa: BLE001 - a lease is short: keep the other cases
        row["error"] = f"{type(error).__name__}: {error}"[:400]
        return row
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    return {
        **row,
        "cuda_bytes": real.peak_bytes,
        "cuda_moment": real.moment,
        "cuda_by_category": real.by_category,
        "allocated_bytes": torch.cuda.max_memory_allocated(),
        "reserved_bytes": torch.cuda.max_memory_reserved(),
        "allocations": stats.get("allocation.all.allocated", 0),
        "segments": stats.get("segment.all.allocated", 0),
    }


def on_cuda(out: str | None) -> None:
    """Each case of :data:`CUDA_GRID` on fake tensors and on the GPU, beside the caching allocator's peaks."""
    print(
        f"{'case':32} {'fake GiB':>9} {'cuda':>9} {'allocated':>10} {'reserved':>9} {'replayed':>9}  "
        "moment (fake / cuda)"
    )
    rows = []
    for name in CUDA_GRID:
        done = subprocess.run(
            [sys.executable, __file__, "--cuda-case", name], capture_output=True, text=True, check=False
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"case": name, "error": done.stderr.strip()[-400:]}
        rows.append(row)
        if "error" in row:
            print(f"{name:32} {row['error']}", flush=True)
            continue
        print(
            f"{name:32} {row['fake_bytes'] / GIB:9.3f} {row['cuda_bytes'] / GIB:9.3f} "
            f"{row['allocated_bytes'] / GIB:10.3f} {row['reserved_bytes'] / GIB:9.3f} "
            f"{row['replayed_reserved_bytes'] / GIB:9.3f}  {row['fake_moment']} / {row['cuda_moment']}",
            flush=True,
        )
    if out:
        import torch

        result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
        with open(out + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
        os.replace(out + ".tmp", out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two tiny cases: the suite runs it")
    parser.add_argument("--full", action="store_true", help="run every layer instead of extrapolating")
    parser.add_argument("--cuda", action="store_true", help="hold the fake-tensor peaks to a CUDA device's")
    parser.add_argument("--out", help="with --cuda: write the rows as JSON here")
    parser.add_argument("--cuda-case", help=argparse.SUPPRESS)  # one case, in its own process
    args = parser.parse_args(argv)
    if args.cuda_case:
        print(json.dumps(cuda_case(args.cuda_case)))
        return
    if args.cuda:
        on_cuda(args.out)
        return
    grid = SMOKE if args.smoke else GRID
    width = max(map(len, grid))
    print(
        f"{'case':{width}}  {'peak GiB':>8}  {'moment':8}  "
        + "  ".join(f"{SHORT[c]:>7}" for c in CATEGORIES)
        + "  seconds"
    )
    total = 0.0
    for name, case in grid.items():
        start = time.perf_counter()
        result = measure(case, full=args.full)
        seconds = time.perf_counter() - start
        total += seconds
        parts = "  ".join(f"{result.by_category[c] / GIB:7.2f}" for c in CATEGORIES)
        print(
            f"{name:{width}}  {result.peak_bytes / GIB:8.2f}  {result.moment:8}  {parts}  {seconds:7.2f}",
            flush=True,
        )
    print(f"{len(grid)} cases in {total:.1f} s, {total / len(grid):.2f} s a case (GiB = 2^30 bytes)")


if __name__ == "__main__":
    main()
