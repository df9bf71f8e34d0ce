"""Ring attention, forward and backward, one loop for every layout ([A-SPDeep]; [A-OnlineNorm] "Ring Attention").

Each rank keeps its query shard and passes K/V round the ring: at step j it holds the KV block of
rank (rank - j) mod N. The layout only decides which global positions each shard holds; the mask of
every (query shard, KV block) pair comes from those positions (:mod:`costmodel.kernel.masks`), so
contiguous, striped and zigzag run the same loop with different :class:`RingSchedule` s.

Forward, per step: post the transfer of the next KV block, attend to the current one (fully masked
blocks are skipped), merge into fp32 (O, LSE), wait, swap buffers. Backward, per step: post the next KV
block, recompute this block's gradients from the saved out/lse, add them to the dK/dV partial sums that
arrived with this KV block (fp32), and send those sums on; dQ stays local. After N steps every dK/dV sum
is back with its owner. K and V travel together as one (2, b, n_kv, L, d) tensor with n_kv heads: GQA
never sends repeated heads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from costmodel.kernel.block import NEG_INF, Grads, OutLse, accumulator_dtype, block_backward, block_forward
from costmodel.kernel.comm import RingComm
from costmodel.kernel.masks import FULL, MAX_FUSED_PIECES, AttentionOptions, BlockPlan, MaskRule, plan_block
from costmodel.schedule.layouts import positions

KV_TAG, DKV_TAG = 0, 1  # separate tags: KV and dK/dV transfers are in flight at the same time


@dataclass(frozen=True)
class RingSchedule:
    """What one rank computes at each ring step: ``plans[j]`` masks its queries against the KV block of
    rank (rank - j) mod N, the one it holds at step j."""

    rank: int
    plans: tuple[BlockPlan, ...]

    @property
    def world_size(self) -> int:
        return len(self.plans)


@functools.lru_cache(maxsize=256)
def ring_schedule(
    rule: MaskRule,
    layout: str,
    seq: int,
    world_size: int,
    rank: int,
    max_fused_pieces: int = MAX_FUSED_PIECES,
) -> RingSchedule:
    """The schedule of ``rank`` for a sequence of ``seq`` tokens laid out over ``world_size`` ranks."""
    held = positions(layout, seq, world_size)
    plans = tuple(
        plan_block(rule, held[rank], held[(rank - step) % world_size], max_fused_pieces)
        for step in range(world_size)
    )
    return RingSchedule(rank, plans)


def local_schedule(rule: MaskRule, seq: int, max_fused_pieces: int = MAX_FUSED_PIECES) -> RingSchedule:
    """A one-rank 'ring' over the whole sequence in order: plain blockwise attention, no communication."""
    return ring_schedule(rule, "contiguous", seq, 1, 0, max_fused_pieces)


def ring_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    schedule: RingSchedule,
    comm: RingComm | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's out (q's dtype) and lse (fp32) against the whole sequence."""
    wide = accumulator_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=wide, device=q.device)
    lse = torch.full(q.shape[:-1], NEG_INF, dtype=wide, device=q.device)
    kv = torch.stack((k, v))
    spare = torch.empty_like(kv) if schedule.world_size > 1 else None
    for step, plan in enumerate(schedule.plans):
        more = step + 1 < schedule.world_size
        if more:  # the next block's transfer runs under this block's compute ([A-SPDeep])
            incoming = comm.send_recv(kv, spare)
            comm.commit()
        block_forward(q, kv[0], kv[1], plan, scale, out, lse)
        if more:
            comm.wait()
            kv, spare = incoming, kv
    return out.to(q.dtype), lse


def ring_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    saved: OutLse,
    schedule: RingSchedule,
    group: dist.ProcessGroup | None,
    scale: float,
):
    """dq, dk, dv of this rank's shards; dK/dV partial sums travel with the KV blocks, in fp32, on a
    ring of their own beside the KV ring."""
    world_size = schedule.world_size
    kv_comm = RingComm(group, KV_TAG) if world_size > 1 else None
    dkv_comm = RingComm(group, DKV_TAG) if world_size > 1 else None
    wide = accumulator_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=wide, device=q.device)
    kv = torch.stack((k, v))
    spare = torch.empty_like(kv) if world_size > 1 else None
    dkv = torch.zeros(kv.shape, dtype=wide, device=kv.device)  # sums for the block now held
    dkv_incoming = dkv_spare = torch.empty_like(dkv)
    block_dkv = torch.empty_like(dkv)
    for step, plan in enumerate(schedule.plans):
        more = step + 1 < world_size
        if more:
            incoming = kv_comm.send_recv(kv, spare)
            kv_comm.commit()
        if not plan.skip:
            block_dkv.zero_()
            block_backward(dout, q, kv[0], kv[1], saved, plan, scale, Grads(dq, block_dkv[0], block_dkv[1]))
        if step > 0:  # this block's sums from the ranks before arrive while we computed
            dkv_comm.wait()
            dkv, dkv_spare = dkv_incoming, dkv
        if not plan.skip:
            dkv.add_(block_dkv)
        if world_size > 1:  # after the last step, the sums go home to the block's owner
            dkv_incoming = dkv_comm.send_recv(dkv, dkv_spare)
            dkv_comm.commit()
        if more:
            kv_comm.wait()
            kv, spare = incoming, kv
    if world_size > 1:
        dkv_comm.wait()
        dkv = dkv_incoming
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, schedule: RingSchedule, group, scale: float):
        comm = RingComm(group, KV_TAG) if schedule.world_size > 1 else None
        out, lse = ring_forward(q, k, v, schedule, comm, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.schedule, ctx.group, ctx.scale = schedule, group, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(
            dout.contiguous(), q, k, v, OutLse(out, lse), ctx.schedule, ctx.group, ctx.scale
        )
        return dq, dk, dv, None, None, None


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(
            f"expected q (b, h, L, d) and k, v (b, n_kv, L, d); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k/v {tuple(k.shape)} do not match (heads must be a multiple of kv_heads)"
        )


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: AttentionOptions = FULL,
    *,
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention of this rank's query shard to the whole sequence, passing K/V round the ring.

    ``q`` (b, h, L, d) and ``k``, ``v`` (b, n_kv, L, d) are this rank's shard: the tokens at
    ``positions(layout, L·N, N)[rank]``, in that order (:func:`~costmodel.kernel.sharding.shard`).
    ``options`` give the mask (causal, varlen ``cu_seqlens`` as global document boundaries of the packed
    sequence, ``window``, ``chunk``) and the scale. Returns ``out`` (like ``q``, differentiable) and
    ``lse`` (b, h, L) fp32. With no process group initialised it runs on this process alone.
    """
    check_shapes(q, k, v)
    world_size = dist.get_world_size(group) if dist.is_initialized() else 1
    rank = dist.get_rank(group) if dist.is_initialized() else 0
    seq = q.shape[2] * world_size
    schedule = ring_schedule(options.mask_rule(seq), layout, seq, world_size, rank, options.max_fused_pieces)
    scale = options.softmax_scale(q.shape[-1])
    return _RingAttention.apply(q, k.contiguous(), v.contiguous(), schedule, group, scale)


def local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: AttentionOptions = FULL
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same kernel on one process over a whole sequence in order (used by Ulysses after its all-to-all)."""
    check_shapes(q, k, v)
    seq = q.shape[2]
    schedule = local_schedule(options.mask_rule(seq), seq, options.max_fused_pieces)
    scale = options.softmax_scale(q.shape[-1])
    return _RingAttention.apply(q, k.contiguous(), v.contiguous(), schedule, None, scale)
