"""Ulysses attention: all-to-all from sequence shards to head shards, attend, and back ([A-OnlineNorm], "Ulysses").

Each rank starts with its sequence shard of every head, (b, h, L, d). The first all-to-all gives it the
whole sequence for h/N heads, (b, h/N, S, d); it attends locally with the same block kernel and mask rule
as the ring; the second all-to-all returns the output to (b, h, L, d). Gradients take the same two
exchanges in reverse (autograd).

GQA ([Ulysses §3]): feasible only if h mod N = 0 and (n_kv mod N = 0 or N mod n_kv = 0). When N > n_kv the
KV heads are replicated to N before the exchange, so each rank receives the one KV head its query heads
use; the replicas are on the wire, as the cost model counts them, and their gradients are summed back.

Shards may be in any layout: after the exchange a rank's tokens arrive shard by shard, and are put in
global order (a local index_select) so the whole-sequence mask is plain causal / varlen.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from costmodel.core.errors import InputError
from costmodel.kernel.comm import all_to_all_autograd
from costmodel.kernel.masks import FULL, AttentionOptions
from costmodel.kernel.ring import check_shapes, local_attention
from costmodel.schedule.layouts import positions, ulysses_feasibility


def check_ulysses(heads: int, kv_heads: int, world_size: int, field: str = "heads") -> None:
    """Raise :class:`InputError` when [Ulysses §3] rules this head split out."""
    feasible, reason = ulysses_feasibility(heads, kv_heads, world_size)
    if not feasible:
        raise InputError(field, f"Ulysses infeasible: {reason}")


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: AttentionOptions = FULL,
    *,
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
    return_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact attention of this rank's sequence shard, by two all-to-alls over heads.

    Same arguments and results as :func:`~costmodel.kernel.ring.ring_attention`. ``lse`` costs a third
    (small) all-to-all; pass ``return_lse=False`` to time the kernel without it (then lse is None).
    """
    check_shapes(q, k, v)
    world_size = dist.get_world_size(group)
    heads, kv_heads = q.shape[1], k.shape[1]
    check_ulysses(heads, kv_heads, world_size)
    if world_size > kv_heads:
        k = k.repeat_interleave(world_size // kv_heads, dim=1)
        v = v.repeat_interleave(world_size // kv_heads, dim=1)
    seq = q.shape[2] * world_size
    arrival = torch.from_numpy(positions(layout, seq, world_size).reshape(-1)).to(q.device)
    in_order = None if layout == "contiguous" else torch.argsort(arrival)

    def to_heads(x: torch.Tensor) -> torch.Tensor:  # (b, H, L, d) -> (b, H/N, S, d), global order
        x = all_to_all_autograd(x, scatter_dim=1, gather_dim=2, group=group)
        return x if in_order is None else x.index_select(2, in_order)

    def to_sequence(x: torch.Tensor) -> torch.Tensor:  # the inverse
        x = x if in_order is None else x.index_select(2, arrival)
        return all_to_all_autograd(x, scatter_dim=2, gather_dim=1, group=group)

    out, lse = local_attention(to_heads(q), to_heads(k), to_heads(v), options)
    out = to_sequence(out)
    if not return_lse:
        return out, None
    return out, to_sequence(lse.unsqueeze(-1)).squeeze(-1)
