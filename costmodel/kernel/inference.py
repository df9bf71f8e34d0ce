"""Inference attention under CP: the pass-KV and pass-Q ring prefills and the decode merge ([CP-Infer]).

Prefill with a cached prefix (pass-KV): every rank keeps its new queries and passes its KV shard (cached
and new tokens) round the ring, the training ring's loop (:func:`~costmodel.kernel.ring.ring_forward`)
with fewer queries than keys; each step's mask again comes from global positions.

Prefill with a cached prefix (pass-Q): every rank keeps its KV shard (cached and new tokens) and passes
its new queries round the ring; at step j it holds the queries of rank (rank - j) mod N and attends them
to its own keys, masked by global position ([A-OnlineNorm]'s rule, :mod:`costmodel.kernel.masks`). The
partial (O, LSE) of every query block stays where it was computed until two all-to-alls return each
block's N partials to its owner, who merges them by log-sum-exp ([OnlineSoftmax]). K and V never move,
which is the point when the cache is long and the new tokens few.

Decode: every rank holds a shard of the cache and the same new queries; each attends them to its shard,
the (O, LSE) pairs are all-gathered, and every rank merges the same N partials into the same output.

Partial outputs travel in the queries' dtype and LSE in fp32, as the cost model counts them
(``passq_return_bytes``, ``decode_merge_bytes``). Forward only: inference keeps nothing for a backward.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from costmodel.kernel.block import NEG_INF, accumulator_dtype, block_forward, merge_lse
from costmodel.kernel.comm import RingComm, all_to_all
from costmodel.kernel.masks import CAUSAL, AttentionOptions, plan_block
from costmodel.kernel.ring import KV_TAG, RingSchedule, ring_forward
from costmodel.kernel.timing import random_qkv
from costmodel.schedule.layouts import positions

Q_TAG = 2  # apart from the training ring's KV and dK/dV tags


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos=None, k_pos=None) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(
            f"expected q (b, h, Lq, d) and k, v (b, n_kv, Lk, d); got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k/v {tuple(k.shape)} do not match (heads: a multiple of kv_heads)"
        )
    if q_pos is not None and (len(q_pos) != q.shape[2] or len(k_pos) != k.shape[2]):
        raise ValueError("one global position per query and per key")


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _gather_positions(positions: np.ndarray, world_size: int, group) -> list[np.ndarray]:
    """Every rank's query or key positions (each rank holds as many; a small int64 all-gather)."""
    mine = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    if world_size == 1:
        return [mine.numpy()]
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine, group=group)
    return [p.numpy() for p in everyone]


def _merge(partials_out: torch.Tensor, partials_lse: torch.Tensor, dtype: torch.dtype):
    """Merge N partials (N, b, h, L, d) and (N, b, h, L) into (out, lse) in fp32, out cast to ``dtype``."""
    wide = accumulator_dtype(dtype)
    out = torch.zeros(partials_out.shape[1:], dtype=wide, device=partials_out.device)
    lse = torch.full(partials_lse.shape[1:], NEG_INF, dtype=wide, device=partials_lse.device)
    for block_out, block_lse in zip(partials_out.unbind(0), partials_lse.unbind(0), strict=True):
        merge_lse(out, lse, block_out.to(wide), block_lse.to(wide))
    return out.to(dtype), lse


def _attend(q, k, v, q_pos, k_pos, options: AttentionOptions):
    """One partial (O in fp32, LSE) of ``q`` against local keys, masked by global position."""
    wide = accumulator_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=wide, device=q.device)
    lse = torch.full(q.shape[:-1], NEG_INF, dtype=wide, device=q.device)
    plan = plan_block(options.mask_rule(), q_pos, k_pos, options.max_fused_pieces)
    block_forward(q, k, v, plan, options.softmax_scale(q.shape[-1]), out, lse)
    return out, lse


@torch.no_grad()
def pass_kv_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: np.ndarray,
    k_positions: np.ndarray,
    options: AttentionOptions = CAUSAL,
    *,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of this rank's new queries to every rank's keys, passing K and V round the ring.

    Arguments as :func:`pass_q_prefill`, except that every rank must hold as many keys (the blocks travel).
    Returns ``out`` (like ``q``) and ``lse`` (b, h, Lq) fp32.
    """
    _check(q, k, v, q_positions, k_positions)
    world_size, rank = _world(group)
    rule, keys = options.mask_rule(), _gather_positions(k_positions, world_size, group)
    plans = tuple(
        plan_block(rule, q_positions, keys[(rank - step) % world_size], options.max_fused_pieces)
        for step in range(world_size)
    )
    comm = RingComm(group, KV_TAG) if world_size > 1 else None
    scale = options.softmax_scale(q.shape[-1])
    return ring_forward(
        q.contiguous(), k.contiguous(), v.contiguous(), RingSchedule(rank, plans), comm, scale
    )


@torch.no_grad()
def pass_q_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: np.ndarray,
    k_positions: np.ndarray,
    options: AttentionOptions = CAUSAL,
    *,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of this rank's new queries to every rank's keys, passing the queries round the ring.

    ``q`` (b, h, Lq, d) are this rank's new tokens at global ``q_positions`` (Lq the same on every rank);
    ``k``, ``v`` (b, n_kv, Lk, d) its share of the cache and of the new tokens at increasing global
    ``k_positions`` (Lk may differ between ranks); ``options``: the mask by global position (causal by
    default; varlen ``cu_seqlens`` as global document boundaries) and the scale. Returns ``out`` (like
    ``q``) and ``lse`` (b, h, Lq) fp32.
    """
    _check(q, k, v, q_positions, k_positions)
    world_size, rank = _world(group)
    origins = _gather_positions(q_positions, world_size, group)
    k, v = k.contiguous(), v.contiguous()
    comm = RingComm(group, Q_TAG) if world_size > 1 else None
    # The ring receives into its two buffers in turn; a copy of q keeps the caller's q intact (N > 2).
    current, spare = (q.clone(), torch.empty_like(q)) if world_size > 1 else (q.contiguous(), None)
    partial_out = torch.empty((world_size, *q.shape), dtype=q.dtype, device=q.device)
    partial_lse = torch.empty((world_size, *q.shape[:-1]), dtype=accumulator_dtype(q.dtype), device=q.device)
    for step in range(world_size):
        more = step + 1 < world_size
        if more:  # the next query block travels while this one is attended ([CP-Infer])
            incoming = comm.send_recv(current, spare)
            comm.commit()
        origin = (rank - step) % world_size
        out, lse = _attend(current, k, v, origins[origin], k_positions, options)
        partial_out[origin], partial_lse[origin] = out.to(q.dtype), lse
        if more:
            comm.wait()
            current, spare = incoming, current
    if world_size > 1:  # partial j goes to rank j; what arrives are this rank's queries' N partials
        partial_out = all_to_all(partial_out, 0, 0, group)
        partial_lse = all_to_all(partial_lse, 0, 0, group)
    return _merge(partial_out, partial_lse, q.dtype)


@torch.no_grad()
def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the new queries ``q`` (b, h, Lq, d), the same on every rank, to the whole cache of
    which this rank holds ``k``, ``v`` (b, n_kv, Lk, d); every cached key is visible. Each rank's partial
    (O, LSE) is all-gathered and merged, so every rank returns the same ``out`` (like ``q``) and ``lse``."""
    _check(q, k, v)
    world_size, _ = _world(group)
    q_pos, k_pos = np.zeros(q.shape[2], np.int64), np.arange(k.shape[2], dtype=np.int64)
    out, lse = _attend(q, k.contiguous(), v.contiguous(), q_pos, k_pos, AttentionOptions(scale=scale))
    out = out.to(q.dtype).contiguous()
    if world_size == 1:
        return _merge(out.unsqueeze(0), lse.unsqueeze(0), q.dtype)
    outs = [torch.empty_like(out) for _ in range(world_size)]
    lses = [torch.empty_like(lse) for _ in range(world_size)]
    dist.all_gather(outs, out, group=group)
    dist.all_gather(lses, lse.contiguous(), group=group)
    return _merge(torch.stack(outs), torch.stack(lses), q.dtype)


SCHEMES = ("pass-kv", "pass-q", "decode")


def inference_run(
    scheme: str,
    new_per_rank: int,
    cached_per_rank: int,
    shape: dict,
    world_size: int,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
):
    """A closure running one inference layer on this rank (collective), on fixed random inputs: what
    `cp-plan calibrate` times at a tiny shard for each scheme's fixed cost and `cp-plan validate` times at
    its held-out shapes. pass-kv, pass-q: a causal prefill of ``new_per_rank`` new tokens on each rank (the
    zigzag share) after a prefix of which each rank caches ``cached_per_rank`` (contiguous shares);
    decode: ``new_per_rank`` tokens per sequence, the same on every rank, against ``cached_per_rank``
    cached tokens on each rank."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    n, new, cached = world_size, new_per_rank, cached_per_rank
    q, k, v, _ = random_qkv(
        shape["batch"],
        shape["heads"],
        shape["kv_heads"],
        cached + new,
        shape["head_dim"],
        dtype,
        device,
        rank,
    )
    q = q[:, :, :new].contiguous()
    if scheme == "decode":
        k, v = k[:, :, :cached].contiguous(), v[:, :, :cached].contiguous()
        return lambda: decode_attention(q, k, v)
    q_pos = n * cached + positions("zigzag", n * new, n)[rank]
    k_pos = np.concatenate([np.arange(rank * cached, (rank + 1) * cached), q_pos])
    prefill = pass_kv_prefill if scheme == "pass-kv" else pass_q_prefill
    return lambda: prefill(q, k, v, q_pos, k_pos)
