"""What `cp-plan validate` runs: the reference kernel over a grid of configurations, timed on every rank.

The grid spans shard lengths on both sides of the critical shard length L* of the profile being
validated (comm-bound below, compute-bound above), causal and not, every layout, Ulysses, forward and
forward+backward: shapes calibrate never ran (held out). Beside them, every layer kind at the tiny shard
whose time calibrate fitted the kinds' fixed costs on (``fitted``), to tell in-sample from held-out error. The predictions it is compared with come from :mod:`costmodel.plans.timing`.

Beside the training layers, a few inference runs (:class:`InferenceCase`, forward only, held out): a
pass-KV and a pass-Q prefill after a cached prefix and a decode step against a sharded cache, predicted by
`cp-plan infer`'s formulas (:mod:`costmodel.inference.kernel_runs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from costmodel.kernel import TORCH_DTYPE
from costmodel.kernel.calibrate import LAYER_KINDS, TOTAL_S, CalibrationConfig, measure_sentinel
from costmodel.kernel.masks import AttentionOptions
from costmodel.kernel.timing import QUANTILE, LayerShape, attention_runs, sample_times, summary


@dataclass(frozen=True)
class Case:
    """One timed kernel run; both its forward and its forward+backward are compared."""

    variant: str  # ring | ulysses
    layout: str
    causal: bool
    tokens_per_rank: int
    passes: tuple[str, ...]  # which of "fwd", "fwd+bwd" enter the comparison
    fitted: bool = False  # a shape calibrate fitted on (else held out: never seen by calibrate)
    documents: int = 1  # equal documents packed in the window, run varlen ([A-RingCost §5])

    def cu_seqlens(self, world_size: int) -> tuple[int, ...] | None:
        """Boundaries of the packed documents over the whole window; None for one document."""
        if self.documents == 1:
            return None
        seq = self.tokens_per_rank * world_size
        return tuple(range(0, seq + 1, seq // self.documents))


@dataclass(frozen=True)
class InferenceCase:
    """One timed inference run, forward only. pass-kv, pass-q: a causal prefill of ``new_per_rank`` new
    tokens on each rank (the zigzag share of the new tokens) after a prefix of which each rank caches
    ``cached_per_rank`` (contiguous shares); decode: ``new_per_rank`` tokens per sequence, the same on
    every rank, against a cache of ``cached_per_rank`` tokens on each rank."""

    scheme: str  # pass-kv | pass-q | decode
    new_per_rank: int
    cached_per_rank: int
    passes: tuple[str, ...] = ("fwd",)


def inference_grid(critical_tokens: float, low: int = 32, high: int = 2048) -> list[InferenceCase]:
    """Six held-out inference runs about the training grid's shards: pass-KV prefills of L* new tokens
    per rank after 4 L* cached and of L*/4 after L*, pass-Q prefills of a short follow-up (L*/4) and of
    L* after 4 L* cached, and the decode of one token against 4 L* and against L* cached tokens."""
    small = _pow2_near(critical_tokens / 4, low, high)
    mid = _pow2_near(critical_tokens, low, high)
    large = _pow2_near(critical_tokens * 4, low, high)
    return [
        InferenceCase("pass-kv", mid, large),
        InferenceCase("pass-q", small, large),
        InferenceCase("decode", 1, large),
        InferenceCase("pass-kv", small, mid),
        InferenceCase("pass-q", mid, large),
        InferenceCase("decode", 1, mid),
    ]


def _inference_run(case: InferenceCase, ctx: Any, shape: dict[str, Any], dtype: torch.dtype):
    """A closure running ``case`` once on this rank (collective), on fixed random inputs."""
    from costmodel.kernel.inference import inference_run

    return inference_run(
        case.scheme,
        case.new_per_rank,
        case.cached_per_rank,
        shape,
        ctx.world_size,
        ctx.rank,
        dtype,
        ctx.device,
    )


def _pow2_near(x: float, low: int, high: int) -> int:
    return int(min(max(2 ** round(math.log2(max(x, 1.0))), low), high))


def grid(
    critical_tokens: float, low: int = 32, high: int = 2048, fitted_tokens: int | None = None
) -> list[Case]:
    """At least 12 held-out comparisons, shards from about L*/4 to 4 L* (powers of two within [low, high]),
    and, given the profile's ``fitted_tokens``, every layer kind at that shard (fitted, below ``low``)."""
    small = _pow2_near(critical_tokens / 4, low, high)
    mid = _pow2_near(critical_tokens, low, high)
    large = _pow2_near(critical_tokens * 4, low, high)
    both, fwd = ("fwd", "fwd+bwd"), ("fwd",)
    fitted = [
        Case(variant, layout, causal, fitted_tokens, both, fitted=True)
        for variant, layout, causal in LAYER_KINDS
        if fitted_tokens is not None
    ]
    return [
        Case("ring", "contiguous", False, small, both),
        Case("ring", "contiguous", False, mid, fwd),
        Case("ring", "contiguous", False, large, both),
        Case("ring", "contiguous", True, mid, fwd),
        Case("ring", "striped", True, mid, fwd),
        Case("ring", "striped", True, large, both),
        Case("ring", "zigzag", True, small, fwd),
        Case("ring", "zigzag", True, mid, both),
        Case("ulysses", "contiguous", False, mid, fwd),
        Case("ulysses", "contiguous", True, mid, both),
        # Packed: 4N equal documents, so every rank holds whole ones and the varlen kernel skips the rest.
        Case("ring", "zigzag", True, mid, fwd, documents=8),
        Case("ring", "contiguous", True, large, fwd, documents=8),
        *fitted,
    ]


def measure_cases(
    ctx: Any,
    cases: list[Case | InferenceCase],
    shape: dict[str, Any],
    repeats: int,
    warmup: int,
    quantile: float = QUANTILE,
    sentinel_tokens: int | None = None,
) -> dict[str, Any] | None:
    """Run on every rank (collective); rank 0 returns {"cases": one {fwd, fwd+bwd} timing per case, each
    the ``quantile`` of its samples (the one the profile's figures are: compare like with like),
    "sentinel": calibrate's sentinel timed again before and after them (given its block size), or None}.

    All cases are timed in interleaved rounds, so a slow spell of a shared machine hits them alike.
    """

    sentinel, config = None, None
    if sentinel_tokens:
        config = CalibrationConfig(
            **{k: shape[k] for k in ("dtype", "batch", "heads", "kv_heads", "head_dim")},
            overlap_tokens=(sentinel_tokens,),
            repeats=repeats,
            warmup=warmup,
            progress=False,
        )
        sentinel = {"start": measure_sentinel(ctx, config)}

    dtype = getattr(torch, TORCH_DTYPE[shape["dtype"]])
    runs = {}
    for index, case in enumerate(cases):
        if isinstance(case, InferenceCase):
            runs[(index, "fwd")] = _inference_run(case, ctx, shape, dtype)
            continue
        layer = attention_runs(
            case.variant,
            LayerShape(
                case.tokens_per_rank,
                shape["heads"],
                shape["kv_heads"],
                shape["head_dim"],
                dtype,
                shape["batch"],
            ),
            options=AttentionOptions(causal=case.causal, cu_seqlens=case.cu_seqlens(ctx.world_size)),
            layout=case.layout,
            device=ctx.device,
        )
        runs[(index, "fwd")] = layer["forward"]
        if "fwd+bwd" in case.passes:
            runs[(index, "fwd+bwd")] = layer["forward_backward"]
    samples = sample_times(runs, ctx.device, repeats=repeats, warmup=warmup, min_total_s=TOTAL_S)
    if sentinel is not None:
        sentinel["end"] = measure_sentinel(ctx, config)
    if ctx.rank != 0:
        return None
    out: list[dict] = [{} for _ in cases]
    for (index, pass_), values in samples.items():
        # the spread: how much validate's own timing moved
        out[index][pass_], out[index][f"{pass_} spread"] = summary(values, quantile)
    return {"cases": out, "sentinel": sentinel}
