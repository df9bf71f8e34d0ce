"""What `cp-plan calibrate` measures on every rank, with all ranks running at once as a real ring would
([A-RingCost §11]: effective bandwidth and effective compute, measured on the target machine).

- Compute: the block kernel's forward and backward for a block of L queries against L keys, fully
  visible and with the causal diagonal, over a range of L, with 1, 2, 4 ... up to N ranks computing
  at the same time (on a CPU the ranks share cores; on GPUs the curves coincide).
- Point-to-point: one ring exchange (every rank sends to the next, receives from the previous) over a
  range of message sizes, through the kernel's own ``RingComm``.
- All-to-all: one exchange through the kernel's ``all_to_all`` (copies included) over a range of sizes.
- Layers: every kind of layer `cp-plan validate` runs (ring per layout and mask, Ulysses), whole, at a
  tiny shard, for each kind's fixed software cost.
- Overlap: a block's compute, its KV exchange, and both at once as a ring step runs them: how much
  of a transfer hides under compute (on GPUs nearly all; on a CPU whose cores the ranks fill, the
  transfer's copies compete with the compute and little or nothing hides).
Under torchrun across nodes, the links are measured twice: by the ranks of the first node (intra-node)
and by the first rank of every node (inter-node).

Rank 0 returns each figure (:func:`~costmodel.kernel.timing.typical` of its samples) and every
single-call sample behind it (the fits' spread is the spread of refits over resampled samples); fitting
and the profile are the model's job (:mod:`costmodel.calibration.fit`).
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from costmodel.kernel import TORCH_DTYPE
from costmodel.kernel.block import (
    NEG_INF,
    Grads,
    OutLse,
    accumulator_dtype,
    block_attention,
    block_backward,
    block_forward,
)
from costmodel.kernel.comm import RingComm, all_to_all
from costmodel.kernel.launch import ranks_per_node
from costmodel.kernel.masks import AttentionOptions, MaskRule, plan_block
from costmodel.kernel.timing import (
    QUANTILE,
    LayerShape,
    attention_runs,
    random_qkv,
    sample_times,
    summary,
    typical,
)

TOKENS = (32, 64, 128, 256, 512, 1024, 2048)
TOTAL_S = 0.5  # short calls get more single-call samples, until they add up to about this long
MESSAGE_BYTES = tuple(4096 * 4**k for k in range(7))  # 4 KiB .. 16 MiB
# (queries, keys) of the inference calls timed beside the square blocks: 4x and 16x as many keys
INFERENCE_CALLS = ((16, 64), (64, 256), (256, 1024), (16, 256), (64, 1024), (128, 2048))
# The cache one decode query reads to measure the memory bandwidth the kernel streams at: large enough
# (tens of MB) that no on-chip cache holds it, on a CPU as on a GPU's L2.
READ_TOKENS = 32768


@dataclass(frozen=True)
class CalibrationConfig:
    dtype: str = "bf16"  # the CLI's name; costmodel.kernel.TORCH_DTYPE maps it
    batch: int = 1
    heads: int = 8
    kv_heads: int = 8
    head_dim: int = 64
    tokens: tuple[int, ...] = TOKENS
    message_bytes: tuple[int, ...] = MESSAGE_BYTES
    overlap_tokens: tuple[int, ...] = (32, 64, 128, 256)  # small: the fixed costs show
    layer_tokens: int = 8  # whole layers this short are all fixed cost
    repeats: int = 7
    warmup: int = 1
    progress: bool = True
    concurrency: tuple[int, ...] = field(default=())  # empty: 1, 2, 4, ... up to N
    # How the model counts FLOP, given by the caller so the kernel needs nothing of the model:
    pair_flops: float = 0.0  # forward FLOP of one (query, key) pair over all heads; 0: 4·b·h·d
    backward_flop_factor: float = 2.5  # backward FLOP / forward FLOP

    def levels(self, world_size: int) -> tuple[int, ...]:
        if self.concurrency:
            return tuple(sorted({min(c, world_size) for c in self.concurrency}))
        levels, level = [], 1
        while level < world_size:
            levels.append(level)
            level *= 2
        return (*levels, world_size)


class _Progress:
    """A rich progress bar on rank 0 when its stderr is a terminal; silent elsewhere, and in a pipe or a CI
    log, which keep only the result."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self.task = self.bar.add_task("calibrating", total=total)
            self.bar.start()

    def step(self, what: str, advance: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=advance, description=f"calibrating: {what}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _groups(world_size: int) -> dict[str, list[int]]:
    """Ranks that measure each link scope: the first node's ranks, and the first rank of every node."""
    per_node = ranks_per_node(world_size)
    scopes = {"intra-node": list(range(min(per_node, world_size)))}
    if per_node < world_size:
        scopes["inter-node"] = list(range(0, world_size, per_node))
    return scopes


def _ring_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, plan: Any
) -> tuple[Any, Any]:
    """What one ring step computes, forward and backward: the block into accumulators that already exist
    (the ring allocates them once per layer, not per step)."""
    scale = q.shape[-1] ** -0.5
    out, lse = block_attention(q, k, v, plan)
    wide = accumulator_dtype(q.dtype)
    acc_out = torch.zeros(q.shape, dtype=wide, device=q.device)
    acc_lse = torch.full(q.shape[:-1], NEG_INF, dtype=wide, device=q.device)
    grads = Grads(*(torch.zeros(x.shape, dtype=wide, device=x.device) for x in (q, k, v)))
    forward = functools.partial(block_forward, q, k, v, plan, scale, acc_out, acc_lse)
    backward = functools.partial(block_backward, dout, q, k, v, OutLse(out, lse), plan, scale, grads)
    return forward, backward


def _measure_compute(
    ctx: Any, config: CalibrationConfig, level: int, group: Any, progress: _Progress
) -> list[dict]:
    """Every block size, forward and backward, full and causal, timed in interleaved rounds."""
    runs, flops = {}, {}
    for causal in (False, True):
        for tokens in config.tokens:
            q, k, v, dout = _inputs(config, tokens, ctx)
            positions = np.arange(tokens)
            plan = plan_block(MaskRule(causal), positions, positions)
            forward_flops = plan.visible_pairs * _pair_flops(config)
            runs[(causal, tokens, "forward")], runs[(causal, tokens, "backward")] = _ring_step(
                q, k, v, dout, plan
            )
            flops[(causal, tokens, "forward")] = forward_flops
            flops[(causal, tokens, "backward")] = config.backward_flop_factor * forward_flops
    what = f"compute, {level} rank{'s' if level > 1 else ''} busy"
    samples = sample_times(
        runs,
        ctx.device,
        repeats=config.repeats,
        warmup=config.warmup,
        group=group,
        min_total_s=TOTAL_S,
        on_round=lambda: progress.step(what),
    )
    curves = []
    for causal in (False, True):
        curve = {"concurrency": level, "causal": causal, "forward": [], "backward": []}
        for tokens in config.tokens:
            for phase in ("forward", "backward"):
                seconds, spread = summary(samples[(causal, tokens, phase)])
                forward_flops = flops[(causal, tokens, "forward")]
                curve[phase].append(
                    {
                        "tokens": tokens,
                        "flops": forward_flops,
                        "spread": spread,
                        "flops_per_s": flops[(causal, tokens, phase)] / seconds,
                        "samples": samples[(causal, tokens, phase)],  # seconds, for the fits' spread
                    }
                )
        curves.append(curve)
    return curves


def _measure_links(ctx: Any, config: CalibrationConfig, group: Any, scope: str, progress: _Progress) -> dict:
    """Ring exchanges and all-to-alls of every size, in interleaved rounds."""
    comm = RingComm(group)
    size = dist.get_world_size(group)
    torch_dtype = getattr(torch, _torch_name(config.dtype))
    runs, held_bytes = {}, {}
    for nbytes in config.message_bytes:
        send = torch.zeros(nbytes, dtype=torch.uint8, device=ctx.device)
        recv = torch.empty_like(send)
        # A Ulysses exchange as the kernel makes it: a (b, heads, tokens, d) tensor of the calibrated shape
        # split over heads and gathered over tokens by the kernel's own all_to_all, copies included.
        per_token = config.batch * config.heads * config.head_dim * torch_dtype.itemsize
        held = torch.zeros(
            config.batch,
            config.heads,
            max(1, nbytes // per_token),
            config.head_dim,
            dtype=torch_dtype,
            device=ctx.device,
        )
        held_bytes[nbytes] = held.numel() * torch_dtype.itemsize

        def exchange(send: torch.Tensor = send, recv: torch.Tensor = recv) -> None:
            comm.send_recv(send, recv)
            comm.commit()
            comm.wait()

        runs[("p2p", nbytes)] = exchange
        runs[("a2a", nbytes)] = functools.partial(all_to_all, held, 1, 2, group)
    samples = sample_times(
        runs,
        ctx.device,
        repeats=config.repeats,
        warmup=config.warmup,
        group=group,
        min_total_s=TOTAL_S,
        on_round=lambda: progress.step(f"{scope} links"),
    )
    out: dict[str, Any] = {"p2p": [], "alltoall": [], "ranks": size}
    for (kind, nbytes), values in samples.items():
        seconds, spread = summary(values)
        key = "p2p" if kind == "p2p" else "alltoall"
        out[key].append(
            {
                "bytes": nbytes if kind == "p2p" else held_bytes[nbytes],
                "seconds": seconds,
                "spread": spread,
                "samples": values,
            }
        )
    return out


def _inputs(config: CalibrationConfig, tokens: int, ctx: Any) -> tuple[torch.Tensor, ...]:
    """Random q, k, v and an output gradient of the calibrated shape, seeded by the rank."""
    dtype = getattr(torch, _torch_name(config.dtype))
    return random_qkv(
        config.batch, config.heads, config.kv_heads, tokens, config.head_dim, dtype, ctx.device, seed=ctx.rank
    )


def _measure_overlap(ctx: Any, config: CalibrationConfig, progress: _Progress) -> list[dict]:
    """How much of a ring transfer hides under block compute: each block size timed computing alone,
    exchanging its KV alone, and both at once as a ring step does (post, compute, wait). And what a
    collective costs right after compute, as Ulysses runs one (compute, then all-to-all) against both
    alone: the wait for the slower rank and for communication threads to wake."""
    comm = RingComm(None)
    runs = {}
    for tokens in config.overlap_tokens:
        q, k, v, _ = _inputs(config, tokens, ctx)
        plan = plan_block(MaskRule(False), np.arange(tokens), np.arange(tokens))
        kv = torch.stack((k, v))
        recv = torch.empty_like(kv)
        compute = _ring_step(q, k, v, _, plan)[0]

        def step(
            compute: Any = compute, kv: torch.Tensor = kv, recv: torch.Tensor = recv, busy: bool = True
        ) -> None:
            comm.send_recv(kv, recv)
            comm.commit()
            if busy:
                compute()
            comm.wait()

        exchange = functools.partial(all_to_all, q, 1, 2)

        def compute_then_exchange(compute: Any = compute, exchange: Any = exchange) -> None:
            compute()
            exchange()

        runs[(tokens, "compute")] = compute
        runs[(tokens, "comm")] = functools.partial(step, busy=False)
        runs[(tokens, "both")] = step
        runs[(tokens, "a2a")] = exchange
        runs[(tokens, "compute_then_a2a")] = compute_then_exchange
    samples = sample_times(
        runs,
        ctx.device,
        repeats=2 * config.repeats,
        warmup=config.warmup,
        min_total_s=TOTAL_S,
        on_round=lambda: progress.step("overlap"),
    )
    whats = ("compute", "comm", "both", "a2a", "compute_then_a2a")
    return [
        {
            "tokens": tokens,
            **{what: summary(samples[(tokens, what)])[0] for what in whats},
            "samples": {what: samples[(tokens, what)] for what in whats},
        }
        for tokens in config.overlap_tokens
    ]


# The layer kinds `cp-plan validate` runs, each timed whole at a tiny shard for its own fixed cost.
LAYER_KINDS = (
    ("ring", "contiguous", False),
    ("ring", "contiguous", True),
    ("ring", "striped", True),
    ("ring", "zigzag", True),
    ("ulysses", "contiguous", False),
    ("ulysses", "contiguous", True),
)


def _measure_layers(ctx: Any, config: CalibrationConfig, progress: _Progress) -> dict:
    """Whole layers of every kind at a tiny shard, where compute and transfer are next to nothing:
    what remains is each kind's fixed software cost (dispatch, allocation, per-step waits, mask pieces)."""
    torch_dtype = getattr(torch, _torch_name(config.dtype))
    runs = {}
    for variant, layout, causal in LAYER_KINDS:
        shape = LayerShape(
            config.layer_tokens, config.heads, config.kv_heads, config.head_dim, torch_dtype, config.batch
        )
        layer = attention_runs(
            variant, shape, options=AttentionOptions(causal=causal), layout=layout, device=ctx.device
        )
        runs[(variant, layout, causal, "fwd")] = layer["forward"]
        runs[(variant, layout, causal, "fwd+bwd")] = layer["forward_backward"]
    samples = sample_times(
        runs,
        ctx.device,
        repeats=config.repeats,
        warmup=config.warmup,
        min_total_s=TOTAL_S,
        on_round=lambda: progress.step("layer overheads"),
    )
    return {
        "tokens": config.layer_tokens,
        "kinds": [
            {
                "variant": variant,
                "layout": layout,
                "causal": causal,
                "pass": pass_,
                "seconds": summary(values)[0],
                "samples": values,
            }
            for (variant, layout, causal, pass_), values in samples.items()
        ],
    }


def _measure_inference(ctx: Any, config: CalibrationConfig, progress: _Progress) -> dict:
    """Every inference layer `cp-plan validate` runs (a pass-KV and a pass-Q prefill after a cached
    prefix, a decode step), whole, at a tiny shard (``layer_tokens`` new and cached tokens per rank; one
    decode token): what remains is each scheme's fixed cost (launches, host work, the position and
    partial-output collectives' fixed part, the merges' dispatch). Beside them, one query against a long
    cache: the memory bandwidth a decode streams the cache at, which the profile states as the device's."""
    from costmodel.kernel.inference import SCHEMES, inference_run

    torch_dtype = getattr(torch, _torch_name(config.dtype))
    shape = {k: getattr(config, k) for k in ("batch", "heads", "kv_heads", "head_dim")}
    tokens = config.layer_tokens
    world_size = dist.get_world_size()
    runs: dict[Any, Any] = {
        scheme: inference_run(
            scheme,
            1 if scheme == "decode" else tokens,
            tokens,
            shape,
            world_size,
            ctx.rank,
            torch_dtype,
            ctx.device,
        )
        for scheme in SCHEMES
    }
    flops = {}
    for queries, keys in INFERENCE_CALLS:  # a block of new queries against a longer cache, every rank busy
        q, k, v, _ = _inputs(config, keys, ctx)
        plan = plan_block(MaskRule(False), np.arange(queries), np.arange(keys))
        runs[(queries, keys)] = _ring_step(q[:, :, :queries].contiguous(), k, v, None, plan)[0]
        flops[(queries, keys)] = plan.visible_pairs * _pair_flops(config)
    samples = sample_times(
        runs,
        ctx.device,
        repeats=config.repeats,
        warmup=config.warmup,
        min_total_s=TOTAL_S,
        on_round=lambda: progress.step("inference overheads"),
    )
    # One decode query against a long cache, every rank busy: the bytes/s a memory-bound call reads at.
    # Timed in rounds of its own: streaming tens of MB evicts every cache, and the tiny layers timed
    # beside it would pay for that in their fixed costs.
    q, k, v, _ = _inputs(config, READ_TOKENS, ctx)
    read_plan = plan_block(MaskRule(False), np.arange(1), np.arange(READ_TOKENS))
    read_run = {"read": _ring_step(q[:, :, :1].contiguous(), k, v, None, read_plan)[0]}
    read_bytes = k.numel() * k.element_size() + v.numel() * v.element_size()
    read_samples = sample_times(
        read_run, ctx.device, repeats=config.repeats, warmup=config.warmup, min_total_s=TOTAL_S
    )
    del q, k, v, read_run
    read_s, read_spread = summary(read_samples["read"])
    read = {
        "tokens": READ_TOKENS,
        "bytes": read_bytes,
        "bytes_per_s": read_bytes / read_s,
        "spread": read_spread,
    }
    calls = []
    for (queries, keys), work in flops.items():
        seconds, spread = summary(samples.pop((queries, keys)))
        calls.append(
            {"queries": queries, "keys": keys, "flops": work, "flops_per_s": work / seconds, "spread": spread}
        )
    return {
        "calls": calls,
        "read": read,
        "tokens": tokens,
        "kinds": [
            {
                "scheme": scheme,
                "new_per_rank": 1 if scheme == "decode" else tokens,
                "cached_per_rank": tokens,
                "seconds": summary(values)[0],
                "samples": values,
            }
            for scheme, values in samples.items()
        ],
    }


def measure_sentinel(ctx: Any, config: CalibrationConfig) -> dict[str, float]:
    """A block's compute and a ring exchange (at the largest overlap size), timed alike at the start and
    at the end of a calibration, and again by validate: a machine that changed speed in between (a job
    started or ended) shows as their ratio. Collective over the default group."""
    tokens = config.overlap_tokens[-1]
    q, k, v, dout = _inputs(config, tokens, ctx)
    plan = plan_block(MaskRule(False), np.arange(tokens), np.arange(tokens))
    comm = RingComm(None)
    kv = torch.stack((k, v))
    recv = torch.empty_like(kv)

    def exchange() -> None:
        comm.send_recv(kv, recv)
        comm.commit()
        comm.wait()

    runs = {"compute": _ring_step(q, k, v, dout, plan)[0], "exchange": exchange}
    samples = sample_times(
        runs, ctx.device, repeats=config.repeats, warmup=config.warmup, min_total_s=TOTAL_S / 2
    )
    return {name: typical(values) for name, values in samples.items()}


def measure(ctx: Any, config: CalibrationConfig) -> dict | None:
    """Run on every rank (collective). Rank 0 returns the raw measurements; the others return None."""
    world_size = dist.get_world_size()
    levels = config.levels(world_size)
    scopes = {scope: ranks for scope, ranks in _groups(world_size).items() if len(ranks) > 1}
    total = (
        len(levels) + len(scopes) + 4
    ) * config.repeats  # rounds: compute per level, links per scope, the rest
    progress = _Progress(config.progress and ctx.rank == 0, total)
    raw: dict[str, Any] = {"compute": [], "links": {}}
    try:
        sentinel = {"tokens": config.overlap_tokens[-1], "start": measure_sentinel(ctx, config)}
        for level in levels:
            group = dist.new_group(list(range(level)))  # every rank takes part in creating it
            if ctx.rank < level:
                raw["compute"] += _measure_compute(ctx, config, level, group, progress)
            dist.barrier()
        for scope, ranks in scopes.items():
            group = dist.new_group(ranks)
            if ctx.rank in ranks:
                raw["links"][scope] = _measure_links(ctx, config, group, scope, progress)
            dist.barrier()
        raw["overlap"] = _measure_overlap(ctx, config, progress)
        raw["layers"] = _measure_layers(ctx, config, progress)
        raw["inference"] = _measure_inference(ctx, config, progress)
        raw["sentinel"] = sentinel | {"end": measure_sentinel(ctx, config)}
    finally:
        progress.close()
    if ctx.rank != 0:
        return None
    raw["meta"] = {
        "host": platform.node(),
        "torch_version": torch.__version__,
        "backend": ctx.backend,
        "nproc": world_size,
        "device_name": _device_name(ctx.device),
        "memory_bytes": _memory_bytes(ctx.device),
        "ranks_per_node": ranks_per_node(world_size),
        "quantile": QUANTILE,
    }
    return raw


def _pair_flops(config: CalibrationConfig) -> float:
    return config.pair_flops or 4 * config.batch * config.heads * config.head_dim


def _torch_name(dtype: str) -> str:

    return TORCH_DTYPE[dtype]


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            model = next(
                (line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model
            )
    except OSError:
        pass
    return f"CPU {model}"


def _memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 1.0
