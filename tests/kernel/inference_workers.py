"""What the inference kernel tests run on every rank (spawned processes import it by name), and the
problem they share: new tokens after a cached prefix, GQA, sharded as a CP prefill holds them."""

from __future__ import annotations

import numpy as np
import torch

from costmodel.kernel.inference import decode_attention, pass_kv_prefill, pass_q_prefill
from costmodel.schedule.layouts import positions


def problem(case: dict) -> tuple[torch.Tensor, ...]:
    """q of the new tokens (b, h, T, d), k, v of all K + T tokens (b, n_kv, K + T, d), decode queries."""
    generator = torch.Generator().manual_seed(case["seed"])
    dtype = getattr(torch, case["dtype"])
    b, h, n_kv, d, cached, new = (
        case[x] for x in ("batch", "heads", "kv_heads", "head_dim", "cached", "new")
    )
    total = cached + new
    q, k, v, q1 = (
        torch.randn(b, heads, length, d, generator=generator).to(dtype)
        for heads, length in ((h, new), (n_kv, total), (n_kv, total), (h, 1))
    )
    return q, k, v, q1


def held(case: dict, world_size: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(query positions, key positions) of a rank: its zigzag share of the new tokens, and a contiguous
    share of the cached prefix followed by the keys of its new tokens."""
    cached, new = case["cached"], case["new"]
    mine = cached + positions("zigzag", new, world_size)[rank]
    per = cached // world_size
    return mine, np.concatenate([np.arange(rank * per, (rank + 1) * per), mine])


def run(ctx, cases: list[dict]) -> list[tuple[torch.Tensor, ...]]:
    """This rank's (pass-Q out, pass-Q lse, decode out, pass-KV out, pass-KV lse) for every case."""
    results = []
    for case in cases:
        q, k, v, q1 = problem(case)
        q_pos, k_pos = held(case, ctx.world_size, ctx.rank)
        index = torch.from_numpy(k_pos)
        mine = (
            q[:, :, torch.from_numpy(q_pos - case["cached"])].contiguous(),
            k.index_select(2, index).contiguous(),
            v.index_select(2, index).contiguous(),
            q_pos,
            k_pos,
        )
        out, lse = pass_q_prefill(*mine)
        kv_out, kv_lse = pass_kv_prefill(*mine)
        share = np.array_split(np.arange(k.shape[2]), ctx.world_size)[ctx.rank]  # uneven shards
        cache = torch.from_numpy(share)
        dec, _ = decode_attention(q1, k.index_select(2, cache), v.index_select(2, cache))
        results.append((out, lse, dec, kv_out, kv_lse))
    return results
