"""The training-memory reference on fake tensors: one device's peak, by category, over 8B-405B shapes.

    python benchmarks/memory_reference.py [--smoke] [--full]

Each row is one device of a Llama 3 job (or Mixtral 8x7B, experts not split over ranks): TP with
sequence parallelism, CP (ring, all-gather, Ulysses), PP (the first stage holds pp micro-batches under
1F1B, the last the output layer), ZeRO-1 or FSDP2 over DP x CP, and each recompute and loss. It prints the
peak (GiB), when it happens, its breakdown, and the seconds `measure` took on this machine; ``--full`` runs
every layer of every stage instead of extrapolating from four and five (the same numbers, slower).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

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
        ffn_hidden=model.ffn // tp,
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two tiny cases: the suite runs it")
    parser.add_argument("--full", action="store_true", help="run every layer instead of extrapolating")
    args = parser.parse_args(argv)
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
