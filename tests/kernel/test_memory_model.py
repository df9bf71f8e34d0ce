"""The memory model held to the torch reference: each job's stages run as real model code on fake tensors
(costmodel/kernel/memory.py) against the model's bytes at the step's peak, on small shapes in seconds (the
grid from 8B to 405B is benchmarks/memory.py).

One small model throughout (8 layers of H = 512, 8 query and 4 KV heads of 64, F = 1,024, V = 4,000) at 4,096
tokens on 8 devices, over every framework profile, ZeRO-1 and FSDP, each recompute mode and loss, TP, PP and
CP by ring, all-gather and all-to-all, hybrid sharding, and with the states most of the peak on one or two devices, where it
falls in the optimizer step (fused or foreach AdamW, gradients cast to the master copy); and its MoE twin (8 experts of that width, 2 a token) over EP 2 and 4,
ZeRO-1, FSDP and PP, with its first two layers dense (DeepSeek's shape), PP placing them on the first stage,
and with a shared expert (Qwen's). The total within 5 %; what persists
(the states) and what comes and goes (the rest) each within 10 % of itself.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from costmodel.core.errors import InputError
from costmodel.kernel.memory import MemoryCase, measure
from costmodel.plans.job import Job
from costmodel.plans.models import ModelPreset
from costmodel.training.memory import against_reference, reference_cases
from costmodel.training.step import step_memory

pytestmark = pytest.mark.kernel

TINY = ModelPreset(
    name="tiny",
    source="tests",
    heads=8,
    kv_heads=4,
    head_dim=64,
    layers=8,
    hidden=512,
    ffn_hidden=1024,
    vocab=4000,
)
TINY_MOE = TINY.model_copy(update={"name": "tiny-moe", "experts": 8, "experts_per_token": 2})
# DeepSeek's shape in small: the first two layers' MLPs dense (2,048 wide), the other six MoE
TINY_DENSE_FIRST = TINY_MOE.model_copy(
    update={"name": "tiny-dense-first", "dense_layers": 2, "dense_ffn": 2048}
)
BASE = {"seq": 4096, "hw": "h100-nvlink", "gpus": 8, "global_batch": 16}
FRAMEWORKS = [
    ("megatron", 1),
    ("megatron", 0),
    ("torchtitan", 3),
    ("hf-trainer", 3),
    ("deepspeed", 1),
]
# torchtitan's op-level selective recompute is not in the reference (its selective is the core attention's)
GRID = [
    {"framework": framework, "zero": zero, "recompute": recompute}
    for framework, zero in FRAMEWORKS
    for recompute in ("none", "selective", "full")
    if (framework, recompute) != ("torchtitan", "selective")
] + [
    {"tp": 2},
    {"cp": 2},
    {"cp": 4, "cp_scheme": "allgather"},
    {"cp": 4, "cp_scheme": "ulysses"},
    {"cp": 2, "cp_scheme": "allgather", "framework": "torchtitan", "zero": 3, "recompute": "full"},
    {"pp": 2, "global_batch": 8},
    {"pp": 2, "global_batch": 8, "framework": "torchtitan", "zero": 3, "recompute": "full"},
    {"loss": "chunked"},
    {"loss": "chunked", "framework": "torchtitan", "zero": 3, "recompute": "none"},
    {"loss": "fused", "framework": "hf-trainer", "zero": 3, "recompute": "full"},
    {"micro_batch": 2, "gpus": 4, "global_batch": 8},
    {"tp": 2, "cp": 2, "pp": 2, "global_batch": 8, "recompute": "full"},
    {"tp": 2, "pp": 4, "global_batch": 8, "recompute": "none"},
    # hybrid sharding: ZeRO's states over groups of the DP x CP ranks, replicated across them
    {"zero_shard": 4},
    {"cp": 2, "zero_shard": 2, "recompute": "full"},
    {"framework": "torchtitan", "zero": 3, "recompute": "full", "zero_shard": 2},
    # InternEvo's hybrid ZeRO on one data-parallel rank: its peak in the backward, or (the states most of it)
    # in the optimizer step, the bf16 gradients cast to the fp32 master's and foreach AdamW's square root
    {"framework": "internevo", "zero": 1, "recompute": "none", "gpus": 1, "global_batch": 2},
    {"framework": "internevo", "zero": 1, "recompute": "full", "gpus": 1, "global_batch": 2, "seq": 1024},
    {
        "framework": "internevo",
        "zero": 1,
        "recompute": "full",
        "pp": 2,
        "gpus": 2,
        "global_batch": 4,
        "seq": 1024,
    },
    # flash-attn's cross-entropy: the bf16 logits' gradient written in place, beside the head's own gradients
    {"cross_entropy": "flash", "recompute": "full"},
    {"cross_entropy": "flash", "recompute": "none", "tp": 2},
    # foreach AdamW's square root at the step, over FSDP2's fp32 shards and beside a bf16 main_grad cast to fp32
    {
        "framework": "torchtitan",
        "zero": 3,
        "recompute": "full",
        "optimizer_kernel": "foreach",
        "gpus": 2,
        "global_batch": 2,
        "seq": 512,
    },  # fmt: skip
    {
        "zero": 1,
        "recompute": "full",
        "grad_dtype": "bf16",
        "optimizer_kernel": "foreach",
        "gpus": 2,
        "global_batch": 2,
        "seq": 512,
    },  # fmt: skip
]


# the experts' states shard over the ranks holding the same experts: DP x CP / EP
MOE_GRID = [
    {"ep": 2, "recompute": "none"},
    {"ep": 4, "recompute": "full"},
    {"ep": 2, "cp": 2, "recompute": "selective"},
    {"ep": 2, "tp": 2, "recompute": "full", "loss": "chunked"},
    pytest.param(
        {"ep": 2, "framework": "torchtitan", "zero": 3, "recompute": "full"},
        marks=pytest.mark.xfail(
            strict=True,
            reason="the total holds (+0.1 %) at another moment: the model's peak is the loss at the forward's "
            "end (411.9 MiB), the reference's the first layer's backward (411.5 MiB), 0.1 % apart; the "
            "sharded gradients made by then put the states 22 % apart, and what comes and goes as much the "
            "other way",
        ),
    ),
    {"ep": 4, "framework": "torchtitan", "zero": 3, "recompute": "none"},
    pytest.param(
        {"ep": 2, "pp": 2, "global_batch": 8, "framework": "torchtitan", "zero": 3, "recompute": "full"},
        marks=pytest.mark.xfail(
            strict=True,
            reason="the model's peak is the last stage's backward's end (states 222 MB, the experts' sharded "
            "fp32 gradients among them), the reference's the first stage's backward (states 167 MB, no "
            "gradient yet): the states read 33 % high, the total 2.7 %",
        ),
    ),
]


def _named(grid: list) -> list[str]:
    flags = [g if isinstance(g, dict) else g.values[0] for g in grid]  # a dict, or a pytest.param of one
    return [" ".join(f"{k}={v}" for k, v in g.items()) for g in flags]


@pytest.mark.parametrize("flags", GRID, ids=_named(GRID))
def test_the_model_is_the_reference(flags: dict) -> None:
    _holds(Job.of(**BASE | flags, _model=TINY))


def test_an_op_level_selective_recompute_is_refused_not_measured_as_another() -> None:
    flags = BASE | {"framework": "torchtitan", "zero": 3, "recompute": "selective"}
    with pytest.raises(InputError, match="op-level") as refused:
        reference_cases(Job.of(**flags, _model=TINY))
    assert refused.value.field == "--memory-reference"
    _holds(Job.of(**flags, selective_recompute="attention", _model=TINY))  # the core attention's is measured


@pytest.mark.parametrize("flags", MOE_GRID, ids=_named(MOE_GRID))
def test_the_moe_model_is_the_reference(flags: dict) -> None:
    _holds(Job.of(**BASE | flags, _model=TINY_MOE))


DENSE_FIRST_GRID = [
    {"ep": 2, "recompute": "none"},
    {"ep": 2, "recompute": "full"},
    {"ep": 2, "tp": 2, "recompute": "full"},
    {"ep": 2, "pp": 2, "global_batch": 8, "recompute": "selective"},
    {"ep": 2, "pp": 4, "global_batch": 8, "recompute": "none"},  # the first stage all dense
]


@pytest.mark.parametrize("flags", DENSE_FIRST_GRID, ids=_named(DENSE_FIRST_GRID))
def test_dense_layers_before_the_moe_ones_are_the_reference(flags: dict) -> None:
    _holds(Job.of(**BASE | flags, _model=TINY_DENSE_FIRST))


# Qwen's shape in small: a shared expert of 1,024 beside the routed ones
TINY_SHARED = TINY_MOE.model_copy(update={"name": "tiny-shared", "shared_expert_ffn": 1024})
SHARED_GRID = [
    {"ep": 2, "recompute": "selective"},
    {"ep": 2, "tp": 2, "pp": 2, "global_batch": 8, "recompute": "full"},
    {"ep": 4, "framework": "torchtitan", "zero": 3, "recompute": "none"},
]


@pytest.mark.parametrize("flags", SHARED_GRID, ids=_named(SHARED_GRID))
def test_a_shared_expert_is_the_reference(flags: dict) -> None:
    _holds(Job.of(**BASE | flags, _model=TINY_SHARED))


def _holds(job: Job) -> None:
    measured = [measure(MemoryCase(**fields)) for fields in reference_cases(job).values()]
    peak = max(measured, key=lambda m: m.peak_bytes)
    model = step_memory(job).by_category
    assert model.allocated_bytes == pytest.approx(peak.peak_bytes, rel=0.05)
    by = {k: float(v) for k, v in peak.by_category.items()}
    errors = against_reference(model.model_dump(), by, peak.peak_bytes)
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


def test_what_eager_elementwise_ops_keep_is_the_reference() -> None:
    """transformers' eager RMSNorm keeps an fp32 copy of its input and act_fn(gate) * up keeps silu(gate): without
    recompute the peak grows by what the reference's eager modules add over its fused kernels (8H + 2F bytes a
    token a layer), within 5 % of that growth. Under full recompute the grid above holds the totals: there the
    model adds 8H a token (the recomputed layer's norms' fp32 copies) where the reference adds 10H (a norm's
    bf16 output besides), and reads the fused case 4 % high."""
    flags = BASE | {"framework": "hf-trainer", "zero": 3, "recompute": "none", "loss": "fused"}
    model, reference = {}, {}
    for elementwise in ("eager", "fused"):
        job = Job.of(**flags, elementwise=elementwise, _model=TINY)
        model[elementwise] = step_memory(job).by_category.allocated_bytes
        cases = reference_cases(job).values()
        reference[elementwise] = max(measure(MemoryCase(**fields)).peak_bytes for fields in cases)
    grown = reference["eager"] - reference["fused"]
    assert grown > 0.05 * reference["fused"]  # a difference worth holding the model to
    assert model["eager"] - model["fused"] == pytest.approx(grown, rel=0.05)
