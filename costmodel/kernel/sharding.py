"""Cut a full sequence into a layout's shards and put it back together (layouts are data:
:func:`costmodel.schedule.layouts.positions`)."""

from __future__ import annotations

import torch

from costmodel.schedule.layouts import positions


def shard(x: torch.Tensor, layout: str, world_size: int, rank: int, dim: int = 2) -> torch.Tensor:
    """The tokens of ``x`` (sequence along ``dim``) that ``rank`` holds, in its local (increasing) order."""
    held = positions(layout, x.shape[dim], world_size)[rank]
    return x.index_select(dim, torch.from_numpy(held).to(x.device)).contiguous()


def unshard(shards: list[torch.Tensor] | tuple[torch.Tensor, ...], layout: str, dim: int = 2) -> torch.Tensor:
    """Inverse of :func:`shard`: the full sequence from every rank's shard, in global order."""
    world_size = len(shards)
    seq = shards[0].shape[dim] * world_size
    order = torch.from_numpy(positions(layout, seq, world_size).reshape(-1)).to(shards[0].device)
    gathered = torch.cat(list(shards), dim=dim)
    return gathered.index_select(dim, torch.argsort(order))
