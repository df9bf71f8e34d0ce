"""Functions the multi-process tests run on every rank (spawned processes import them by name)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from costmodel.core.errors import InputError
from costmodel.kernel.masks import CAUSAL, AttentionOptions
from costmodel.kernel.ring import ring_attention
from costmodel.kernel.sharding import shard
from costmodel.kernel.ulysses import ulysses_attention


def full_inputs(case: dict) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout of a case, the same on every rank: (b, h, S, d), (b, n_kv, S, d) x2, (b, h, S, d)."""
    generator = torch.Generator().manual_seed(case["seed"])
    dtype = getattr(torch, case["dtype"])
    shapes = [case["heads"], case["kv_heads"], case["kv_heads"], case["heads"]]
    return tuple(
        torch.randn(case["batch"], h, case["seq"], case["head_dim"], generator=generator).to(dtype)
        for h in shapes
    )


def run_cases(ctx, cases: list[dict]) -> list[tuple[torch.Tensor, ...]]:
    """This rank's shard of (out, lse, dq, dk, dv) for every case."""
    results = []
    for case in cases:
        q, k, v, dout = full_inputs(case)
        mine = [shard(x, case["layout"], ctx.world_size, ctx.rank) for x in (q, k, v, dout)]
        leaves = [x.requires_grad_() for x in mine[:3]]
        attention = ring_attention if case["variant"] == "ring" else ulysses_attention
        options = AttentionOptions(causal=case["causal"], cu_seqlens=case["varlen"])
        out, lse = attention(*leaves, options, layout=case["layout"])
        grads = torch.autograd.grad(out, leaves, mine[3])
        results.append((out.detach(), lse, *grads))
    return results


def hang_on_rank_1(ctx, pid_dir: str) -> None:
    written = Path(pid_dir, f".rank{ctx.rank}")
    written.write_text(str(os.getpid()))
    written.rename(Path(pid_dir, f"rank{ctx.rank}"))  # whole or absent to a reader
    if ctx.rank == 1:
        time.sleep(3600)


def die_on_rank_1(ctx) -> None:
    if ctx.rank == 1:
        os.kill(os.getpid(), 9)
    time.sleep(3600)  # rank 0 would wait for its peer forever


def raise_on_rank_0(ctx, error: str) -> None:
    if ctx.rank == 0:
        if error == "input":
            raise InputError("--seq", "not on this rank")
        raise ValueError("boom")
    time.sleep(3600)


def rank_and_size(ctx) -> tuple[int, int]:
    return ctx.rank, ctx.world_size


def time_everything(ctx) -> dict:
    """Each calibration timing once, on tiny shapes."""
    from costmodel.kernel import timing

    once = timing.Repeats(repeats=1, warmup=0)
    shape = timing.LayerShape(tokens=16, heads=4, kv_heads=2, head_dim=8, dtype=torch.float32)
    overlap = timing.time_ring_overlap(shape, layout="zigzag", causal=True, backward=True, repeats=once)
    varlen = AttentionOptions(cu_seqlens=(0, 5, 32))
    return {
        "exchange_s": timing.time_ring_exchange(4096, repeats=1, warmup=0),
        "all_to_all_s": timing.time_all_to_all(4096, repeats=1, warmup=0),
        "ring": timing.time_attention("ring", shape, options=CAUSAL, layout="striped", repeats=once),
        "ulysses": timing.time_attention("ulysses", shape, options=varlen, repeats=once),
        "overlap": (overlap.compute_step_s, overlap.comm_step_s, overlap.exposed_s, overlap.efficiency),
    }
