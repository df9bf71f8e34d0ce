"""The communication the kernel needs, and nothing else: a ring exchange and an all-to-all.

:class:`RingComm` follows ring-flash-attention's: queue ``send_recv`` pairs, ``commit`` them as one
``batch_isend_irecv``, ``wait``. Every rank posts the same list (one send to the next rank, one receive
from the previous, per tensor), so NCCL sees matching grouped calls and cannot deadlock ([A-SPDeep],
"环形通信死锁防范"); gloo needs contiguous tensors, so everything sent is made contiguous.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class RingComm:
    """Point-to-point exchange with both ring neighbours: send to rank + 1, receive from rank - 1."""

    def __init__(self, group: dist.ProcessGroup | None = None, tag: int = 0) -> None:
        self.group = group
        self.tag = tag
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.send_to = self._global_rank((self.rank + 1) % self.world_size)
        self.recv_from = self._global_rank((self.rank - 1) % self.world_size)
        self._ops: list[dist.P2POp] = []
        self._requests: list = []
        self._in_flight: list[
            torch.Tensor
        ] = []  # alive until wait(): a contiguous copy may be all that holds one

    def _global_rank(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def send_recv(self, send: torch.Tensor, recv: torch.Tensor | None = None) -> torch.Tensor:
        """Queue sending ``send`` forward and receiving its peer's into ``recv`` (new if None); returns ``recv``."""
        send = send.contiguous()
        recv = torch.empty_like(send) if recv is None else recv
        self._ops.append(dist.P2POp(dist.isend, send, self.send_to, self.group, self.tag))
        self._ops.append(dist.P2POp(dist.irecv, recv, self.recv_from, self.group, self.tag))
        self._in_flight += [send, recv]
        return recv

    def commit(self) -> None:
        """Start every queued transfer; they run while the caller computes."""
        if self._requests:
            raise RuntimeError("commit() while a previous batch is in flight: wait() first")
        self._requests = dist.batch_isend_irecv(self._ops)
        self._ops = []

    def wait(self) -> None:
        """Block until the committed transfers finished: received buffers are filled, sent ones free."""
        for request in self._requests:
            request.wait()
        self._requests, self._in_flight = [], []


def all_to_all(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Split ``x`` into N chunks along ``scatter_dim``, send chunk j to rank j, and concatenate what
    arrives (in rank order) along ``gather_dim``. One ``all_to_all_single`` ([A-OnlineNorm], Ulysses)."""
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return x
    send = torch.stack(x.chunk(world_size, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """:func:`all_to_all` with its adjoint (the same exchange with the dimensions swapped) as backward."""

    @staticmethod
    def forward(ctx, x, scatter_dim: int, gather_dim: int, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all_autograd(
    x: torch.Tensor, scatter_dim: int, gather_dim: int, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Differentiable :func:`all_to_all`."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)
