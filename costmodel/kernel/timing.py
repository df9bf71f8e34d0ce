"""Timings the calibration (and ``benchmarks/kernel.py``) build on: the block kernel on one process, one
ring exchange, one all-to-all, and whole ring / Ulysses layers.

Every distributed function here is collective: call it on all ranks of ``group`` with the same
arguments. Each returns the :data:`QUANTILE` over ``repeats`` (after ``warmup`` untimed runs) of the
slowest rank's time, since a synchronous step lasts as long as its slowest rank; ranks line up on a
barrier before each timed run. Times are seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from costmodel.kernel.block import (
    Grads,
    OutLse,
    accumulator_dtype,
    block_attention,
    block_attention_backward,
    block_backward,
    block_forward,
)
from costmodel.kernel.comm import RingComm
from costmodel.kernel.masks import FULL, AttentionOptions, MaskRule, plan_block
from costmodel.kernel.ring import KV_TAG, ring_attention, ring_backward, ring_forward, ring_schedule
from costmodel.kernel.ulysses import ulysses_attention

# Each figure is the lower quartile of its single-call samples, not their median. On a shared machine
# noise only adds time, and a call's lower quartile is the steadier figure: the same layers timed by
# calibrate and again by validate minutes later disagreed by up to 21 % at the lower quartile, 40 % at
# the median (docs/calibration.md, "Fourth round: which figure of the samples").
QUANTILE = 0.25


def typical(samples: list[float], quantile: float = QUANTILE) -> float:
    """The figure a timing reports: the ``quantile`` of its single-call samples."""
    return float(np.quantile(samples, quantile))


def summary(samples: list[float], quantile: float = QUANTILE) -> tuple[float, float]:
    """(figure, spread): :func:`typical`, and the interquartile range over the median (how much the
    samples moved)."""
    q1, median, q3 = np.quantile(samples, [0.25, 0.5, 0.75])
    return typical(samples, quantile), float((q3 - q1) / median)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(seconds: float, group: dist.ProcessGroup | None) -> float:
    if not dist.is_initialized():
        return seconds
    value = torch.tensor([seconds], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value.item())


def time_once(
    run: Callable[[], object], device: torch.device, group: dist.ProcessGroup | None = None
) -> float:
    """Wall time of one ``run()``, ranks lined up on a barrier first; the slowest rank's when distributed."""
    if dist.is_initialized():
        dist.barrier(group=group)
    _synchronize(device)
    start = time.perf_counter()
    run()
    _synchronize(device)
    return _slowest(time.perf_counter() - start, group)


def typical_time(
    run: Callable[[], object],
    device: torch.device,
    *,
    repeats: int = 5,
    warmup: int = 1,
    group: dist.ProcessGroup | None = None,
) -> float:
    """:func:`typical` wall time of ``run()`` over ``repeats``; collective when a process group is
    initialised."""
    return typical_times({"run": run}, device, repeats=repeats, warmup=warmup, group=group)["run"]


def typical_times(
    runs: dict[str, Callable[[], object]],
    device: torch.device,
    *,
    repeats: int = 5,
    warmup: int = 1,
    group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """:func:`typical` time of each run, measured in interleaved rounds (each run once per round), so that
    a slow spell of a shared machine hits every figure alike and their ratios stay meaningful."""
    samples = sample_times(runs, device, repeats=repeats, warmup=warmup, group=group)
    return {name: typical(values) for name, values in samples.items()}


def sample_times(
    runs: dict[str, Callable[[], object]],
    device: torch.device,
    *,
    repeats: int = 5,
    warmup: int = 1,
    group: dist.ProcessGroup | None = None,
    min_total_s: float = 0.0,
    max_repeats: int = 200,
    on_round: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Timed calls of each run (interleaved rounds, slowest rank, one call per sample), for their
    :func:`summary`.

    A run shorter than ``min_total_s / repeats`` gets more samples, up to ``max_repeats``: on a shared
    machine short calls have a long tail of scheduling hiccups, and many single calls pin down the
    quantile that says what a call typically costs. The counts come from the slowest rank's warm-up
    time, so every rank makes the same calls. ``on_round`` is called after each of the first
    ``repeats`` rounds.
    """
    for _ in range(warmup):
        for run in runs.values():
            run()
    count = {name: repeats for name in runs}
    if min_total_s > 0:
        for name, run in runs.items():
            typical = max(time_once(run, device, group), 1e-9)
            count[name] = int(min(max_repeats, max(repeats, math.ceil(min_total_s / typical))))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for round_index in range(max(count.values())):
        for name, run in runs.items():
            if round_index < count[name]:
                samples[name].append(time_once(run, device, group))
        if on_round is not None and round_index < repeats:
            on_round()
    return samples


@dataclass(frozen=True)
class BlockTiming:
    forward_s: float
    backward_s: float  # the backward alone (recompute from out/lse), not forward + backward
    forward_flops: float  # 4·b·h·(visible pairs)·d: two matmuls of 2 FLOP per multiply-add


def random_qkv(
    batch: int,
    heads: int,
    kv_heads: int,
    tokens: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout drawn from one seed: (b, h, L, d) and (b, n_kv, L, d)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads), (batch, kv_heads), (batch, kv_heads), (batch, heads)]
    return tuple(
        torch.randn(*shape, tokens, head_dim, generator=generator).to(device, dtype) for shape in shapes
    )


@dataclass(frozen=True)
class LayerShape:
    """One rank's attention inputs: q (batch, heads, tokens, head_dim), k and v with ``kv_heads`` heads."""

    tokens: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    batch: int = 1

    def random_qkv(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, ...]:
        """q, k, v, dout of this shape: :func:`random_qkv`."""
        return random_qkv(
            self.batch, self.heads, self.kv_heads, self.tokens, self.head_dim, self.dtype, device, seed
        )


@dataclass(frozen=True)
class Repeats:
    """How a timing samples: ``warmup`` untimed runs, then ``repeats`` timed ones."""

    repeats: int = 5
    warmup: int = 1


DEFAULT_REPEATS = Repeats()


def time_block(
    shape: LayerShape,
    *,
    causal: bool = False,
    device: torch.device | str = "cpu",
    repeats: Repeats = DEFAULT_REPEATS,
) -> BlockTiming:
    """One ring step's compute on this process: a block of ``shape.tokens`` queries against as many keys,
    fully visible or with the causal diagonal (the ring's own-block step)."""
    device = torch.device(device)
    q, k, v, dout = shape.random_qkv(device)
    token = np.arange(shape.tokens)
    plan = plan_block(MaskRule(causal), token, token)
    out, lse = block_attention(q, k, v, plan)
    times = {
        "forward": lambda: block_attention(q, k, v, plan),
        "backward": lambda: block_attention_backward(dout, q, k, v, out, lse, plan),
    }
    forward_s, backward_s = (
        typical_time(run, device, repeats=repeats.repeats, warmup=repeats.warmup) for run in times.values()
    )
    flops = 4.0 * shape.batch * shape.heads * plan.visible_pairs * shape.head_dim
    return BlockTiming(forward_s, backward_s, flops)


def time_ring_exchange(
    nbytes: int,
    group: dist.ProcessGroup | None = None,
    *,
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
) -> float:
    """One ring step's communication: every rank sends ``nbytes`` to the next and receives as many from the
    previous, through :class:`~costmodel.kernel.comm.RingComm` as the ring does."""
    device = torch.device(device)
    comm = RingComm(group)
    send = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)

    def exchange() -> None:
        comm.send_recv(send, recv)
        comm.commit()
        comm.wait()

    return typical_time(exchange, device, repeats=repeats, warmup=warmup, group=group)


def time_all_to_all(
    nbytes: int,
    group: dist.ProcessGroup | None = None,
    *,
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
) -> float:
    """One ``all_to_all_single`` in which every rank holds ``nbytes`` (rounded down to a multiple of N) and
    keeps 1/N of it: the exchange Ulysses makes for each of q, k, v and out."""
    device = torch.device(device)
    world_size = dist.get_world_size(group)
    send = torch.zeros(world_size * max(1, nbytes // world_size), dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)
    return typical_time(
        lambda: dist.all_to_all_single(recv, send, group=group),
        device,
        repeats=repeats,
        warmup=warmup,
        group=group,
    )


@dataclass(frozen=True)
class AttentionTiming:
    forward_s: float
    forward_backward_s: float


def attention_runs(
    variant: str,
    shape: LayerShape,
    group: dist.ProcessGroup | None = None,
    *,
    options: AttentionOptions = FULL,
    layout: str = "contiguous",
    device: torch.device | str = "cpu",
) -> dict[str, Callable[[], None]]:
    """Closures running one attention layer over the group, ``variant`` "ring" or "ulysses": its
    "forward" (no autograd) and its "forward_backward", on fixed random inputs. Collective."""
    device = torch.device(device)
    attention = {"ring": ring_attention, "ulysses": ulysses_attention}[variant]
    q, k, v, dout = shape.random_qkv(device, seed=dist.get_rank(group) if dist.is_initialized() else 0)
    kwargs = {"group": group, "layout": layout}
    if variant == "ulysses":
        kwargs["return_lse"] = False
    leaves = [x.requires_grad_() for x in (q, k, v)]

    def forward() -> None:
        with torch.no_grad():
            attention(*leaves, options, **kwargs)

    def forward_backward() -> None:
        out, _ = attention(*leaves, options, **kwargs)
        torch.autograd.grad(out, leaves, dout)

    return {"forward": forward, "forward_backward": forward_backward}


def time_attention(
    variant: str,
    shape: LayerShape,
    group: dist.ProcessGroup | None = None,
    *,
    options: AttentionOptions = FULL,
    layout: str = "contiguous",
    device: torch.device | str = "cpu",
    repeats: Repeats = DEFAULT_REPEATS,
) -> AttentionTiming:
    """Typical forward and forward+backward times of :func:`attention_runs`, in interleaved rounds."""
    runs = attention_runs(variant, shape, group, options=options, layout=layout, device=device)
    times = typical_times(
        runs, torch.device(device), repeats=repeats.repeats, warmup=repeats.warmup, group=group
    )
    return AttentionTiming(times["forward"], times["forward_backward"])


@dataclass(frozen=True)
class RingOverlap:
    """A measured ring layer against its no-overlap-loss bound Σ_steps max(compute_step, comm_step),
    where each step's compute and communication are timed on their own (slowest rank each)."""

    measured_s: float
    compute_step_s: tuple[float, ...]
    comm_step_s: tuple[float, ...]
    exposed_s: float = 0.0  # communication nothing can hide (backward: the last dK/dV hop home)

    @property
    def bound_s(self) -> float:
        return sum(map(max, self.compute_step_s, self.comm_step_s)) + self.exposed_s

    @property
    def efficiency(self) -> float:
        """bound / measured: 1.0 when the ring hides its communication as well as the steps allow."""
        return self.bound_s / self.measured_s


def time_ring_overlap(
    shape: LayerShape,
    group: dist.ProcessGroup | None = None,
    *,
    layout: str = "contiguous",
    causal: bool = False,
    backward: bool = False,
    device: torch.device | str = "cpu",
    repeats: Repeats = DEFAULT_REPEATS,
) -> RingOverlap:
    """Ring forward (or backward alone, ``backward=True``) measured, and its steps' compute and
    communication timed separately with the same block plans and message sizes; ``shape.tokens`` per rank."""

    device = torch.device(device)
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if world_size < 2:
        raise ValueError("a ring needs at least 2 ranks")
    schedule = ring_schedule(MaskRule(causal), layout, shape.tokens * world_size, world_size, rank)
    q, k, v, dout = shape.random_qkv(device, seed=rank)
    dtype, scale = shape.dtype, shape.head_dim**-0.5
    kv_comm = RingComm(group, KV_TAG)
    saved = OutLse(*ring_forward(q, k, v, schedule, kv_comm, scale))
    kv = torch.stack((k, v))
    dkv = torch.zeros(kv.shape, dtype=accumulator_dtype(dtype), device=device)
    sample = {"repeats": repeats.repeats, "warmup": repeats.warmup, "group": group}

    def exchange(*tensors: torch.Tensor) -> Callable[[], None]:
        receive = [torch.empty_like(t) for t in tensors]

        def run() -> None:
            for send, recv in zip(tensors, receive, strict=True):
                kv_comm.send_recv(send, recv)
            kv_comm.commit()
            kv_comm.wait()

        return run

    wide = accumulator_dtype(dtype)
    if not backward:
        accumulators = (
            torch.zeros(q.shape, dtype=wide, device=device),
            torch.full(q.shape[:-1], float("-inf"), dtype=wide, device=device),
        )
        runs = {"measured": lambda: ring_forward(q, k, v, schedule, kv_comm, scale), "kv": exchange(kv)}
        runs |= {
            f"compute {j}": (lambda plan=plan: block_forward(q, k, v, plan, scale, *accumulators))
            for j, plan in enumerate(schedule.plans)
        }
        t = typical_times(runs, device, **sample)
        compute = tuple(t[f"compute {j}"] for j in range(world_size))
        return RingOverlap(t["measured"], compute, (t["kv"],) * (world_size - 1) + (0.0,))

    grads = Grads(torch.zeros(q.shape, dtype=wide, device=device), dkv[0], dkv[1])
    runs = {
        "measured": lambda: ring_backward(dout, q, k, v, saved, schedule, group, scale),
        "kv": exchange(kv),
        "kv+dkv": exchange(kv, dkv),
        "dkv": exchange(dkv),
    }
    runs |= {
        f"compute {j}": (lambda plan=plan: block_backward(dout, q, k, v, saved, plan, scale, grads))
        for j, plan in enumerate(schedule.plans)
    }
    t = typical_times(runs, device, **sample)
    compute = tuple(t[f"compute {j}"] for j in range(world_size))
    # Under step j's compute fly the next KV block (j < N-1) and the previous step's dK/dV sums (j > 0);
    # the last sums go home after the last step with nothing left to hide them.
    comm = tuple(
        t["kv+dkv"] if 0 < j < world_size - 1 else t["kv"] if j == 0 else t["dkv"] for j in range(world_size)
    )
    return RingOverlap(t["measured"], compute, comm, exposed_s=t["dkv"])
