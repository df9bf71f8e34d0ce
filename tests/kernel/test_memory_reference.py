"""The training-memory reference (costmodel/kernel/memory.py) against numbers counted by hand.

One small shape throughout, b = 1 sequence of T = 512 tokens, H = 256, h = 4 query and n_kv = 2 KV heads of
d = 64, F = 512, V = 1000, so that each case runs in well under a second. Where a category is a formula of
the shape it must match to the byte; where it also holds per-row scalars (1/rms per token, cross-entropy's
per-row values) the test allows 8 bytes per token for them and says so.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from functools import cache

import pytest

pytest.importorskip("torch")

from costmodel.core.errors import InputError
from costmodel.kernel.memory import CATEGORIES, MemoryCase, MemoryMeasurement, measure
from tests.support import REPO

pytestmark = pytest.mark.kernel

T, H, HEADS, KV, D, F, V = 512, 256, 4, 2, 64, 512, 1000
BASE = MemoryCase(
    tokens=T, micro_batch=1, layers=2, hidden=H, heads=HEADS, kv_heads=KV, head_dim=D, ffn_hidden=F, vocab=V
)
MIDDLE = dict(input_embedding=False, output_layer=False)  # a pipeline stage of layers only
LAYER_PARAMS = H * D * (HEADS + 2 * KV) + HEADS * D * H + 3 * F * H + 2 * H  # QKV, O, gated MLP, two norms
STAGE_PARAMS = 2 * LAYER_PARAMS + 2 * V * H + H  # two layers, embedding, output layer, final norm


@cache
def run(**changes) -> MemoryMeasurement:
    return measure(replace(BASE, **changes))


def peak(result: MemoryMeasurement) -> MemoryMeasurement:
    """The peak alone: what a run on a real device or an extrapolated one reports (no replayed reservation)."""
    return replace(result, reserved_bytes=None)


def test_every_category_is_reported_and_they_add_up() -> None:
    result = run()
    assert list(result.by_category) == list(CATEGORIES)
    assert sum(result.by_category.values()) == result.peak_bytes
    assert result.moment in ("forward", "backward", "optimizer")


def test_weights_are_the_hand_counted_parameters_in_bf16() -> None:
    assert LAYER_PARAMS == 590_336 and STAGE_PARAMS == 1_692_928
    assert run().by_category["weights"] == 2 * STAGE_PARAMS


def test_an_moe_layer_holds_its_router_and_experts() -> None:
    experts, expert_ffn = 4, 128
    moe = H * experts + 3 * experts * expert_ffn * H + H  # router, gated experts, the norm
    dense = 3 * F * H + H
    got = run(experts=experts, experts_per_token=2, expert_ffn=expert_ffn, ffn_hidden=0).by_category[
        "weights"
    ]
    assert got == 2 * (STAGE_PARAMS + 2 * (moe - dense))
    # a shared expert of width F beside them: a gated MLP's weights, without a norm of its own
    shared = run(experts=experts, experts_per_token=2, expert_ffn=expert_ffn).by_category["weights"]
    assert shared == got + 2 * 2 * 3 * F * H


def test_adamw_keeps_two_moments_per_sharded_parameter() -> None:
    """fp32 master (4 B) and two fp32 moments (8 B) per parameter, of 1/G of them from ZeRO-1, plus AdamW's
    fp32 step count; the fp32 gradient buffer is sharded from ZeRO-2."""
    shard = math.ceil(STAGE_PARAMS / 8)
    assert run(zero=0).by_category["optimizer"] == 12 * STAGE_PARAMS + 4
    zero1 = run(zero=1, shard_group=8).by_category
    assert (zero1["optimizer"], zero1["gradients"]) == (12 * shard + 4, 4 * STAGE_PARAMS)
    zero2 = run(zero=2, shard_group=8).by_category
    assert (zero2["optimizer"], zero2["gradients"]) == (12 * shard + 4, 4 * shard)
    assert (
        run(zero=1, shard_group=8, optimizer_dtype="bf16").by_category["optimizer"] == (4 + 2 + 2) * shard + 4
    )


def test_fsdp_keeps_fp32_shards_and_no_bf16_copy() -> None:
    """FSDP2 with a bf16 MixedPrecisionPolicy: the fp32 sharded parameters are the master copy; each of the
    15 parameters has its own step count. Every first dimension here divides by 8, so no padding."""
    got = run(zero=3, fsdp=True, shard_group=8).by_category
    assert got["weights"] == 0
    assert got["optimizer"] == 12 * STAGE_PARAMS // 8 + 15 * 4
    assert got["fsdp_buffers"] >= 2 * LAYER_PARAMS  # a layer's gathered bf16 parameters at least


def test_full_recompute_keeps_layer_inputs_and_one_layers_working_set() -> None:
    """Three layers under full recompute hold, at their peak, two layers' inputs (b·T·H bf16) and all that
    one layer holds without recompute (its input among it); sequence parallelism splits the input over TP."""
    one_layer = run(layers=1, recompute="none", **MIDDLE).by_category["activations"]
    assert run(layers=3, recompute="full", **MIDDLE).by_category["activations"] == 2 * T * H * 2 + one_layer
    split = [run(layers=n, recompute="full", tp=2, sequence_parallel=True, **MIDDLE) for n in (2, 3)]
    assert split[1].by_category["activations"] - split[0].by_category["activations"] == T // 2 * H * 2


def test_selective_recompute_drops_only_the_logsumexp() -> None:
    """With flash attention the core keeps out and an fp32 lse (b·h·T); recomputing it drops the lse."""
    none, selective = run(recompute="none"), run(recompute="selective")
    assert none.by_category["activations"] - selective.by_category["activations"] == 2 * HEADS * T * 4


def test_doubling_tokens_doubles_activations_no_quadratic_term() -> None:
    short, long = run(recompute="none"), run(recompute="none", tokens=2 * T)
    assert long.moment == short.moment
    assert long.by_category["activations"] == 2 * short.by_category["activations"]


def test_in_flight_micro_batches_add_one_micro_batchs_activations_each() -> None:
    held = [run(in_flight=n, **MIDDLE).by_category["activations"] for n in (1, 2, 3)]
    assert held[2] - held[1] == held[1] - held[0] > 0


LOSS_T, LOSS_V, CHUNK = 2048, 32_000, 128


def _loss(kind: str) -> int:
    return run(layers=0, tokens=LOSS_T, vocab=LOSS_V, loss=kind, loss_chunk_tokens=CHUNK).by_category["loss"]


def test_a_materialized_loss_keeps_the_logits_three_ways() -> None:
    """bf16 logits, their fp32 copy and the fp32 log-softmax (10 B a logit) in forward; at the backward peak
    the log-softmax, its gradient and the logits' gradient, 12 B, beside the normed hidden state."""
    got = _loss("materialized")
    assert got >= LOSS_T * LOSS_V * (2 + 4 + 4)
    assert 0 <= got - (12 * LOSS_T * LOSS_V + 2 * LOSS_T * H) <= 8 * LOSS_T


def test_a_chunked_loss_holds_one_chunk_of_it() -> None:
    """One chunk's 12 B a logit, the output weight's bf16 gradient being summed over chunks, and two b·T·H
    bf16 tensors (the normed hidden state and its gradient): chunk / tokens of the materialized loss's logits."""
    got = _loss("chunked")
    assert 0 <= got - (12 * CHUNK * LOSS_V + 2 * LOSS_V * H + 2 * 2 * LOSS_T * H) <= 8 * LOSS_T
    logits_share = (got - 2 * LOSS_V * H - 2 * 2 * LOSS_T * H) / (_loss("materialized") - 2 * LOSS_T * H)
    assert logits_share == pytest.approx(CHUNK / LOSS_T, rel=0.01)


def test_a_fused_loss_keeps_gradients_not_logits() -> None:
    """Liger's fused linear cross-entropy: the bf16 gradients of the output weight and of the hidden state,
    kept from forward, and one chunk's bf16 logits; no T x V term."""
    got = _loss("fused")
    assert 0 <= got - (2 * LOSS_V * H + 2 * 2 * LOSS_T * H + 2 * CHUNK * LOSS_V) <= 8 * LOSS_T


def test_ring_buffers_are_the_hand_counted_blocks() -> None:
    """Ring attention over 4 ranks, one layer, its backward the stage's peak: the fp32 lse kept from forward,
    fp32 dQ, three fp32 dK/dV pairs (the one being sent, the one received and the next one arriving: as
    ring-flash-attention rebinds them) and two bf16 K/V blocks (the current and the next)."""
    result = run(layers=1, cp=4, recompute="none", ffn_hidden=64, **MIDDLE)
    block = T * KV * D  # elements of one K or V block
    lse, dq = HEADS * T * 4, T * HEADS * D * 4
    assert result.moment == "backward"
    assert result.by_category["cp_buffers"] == lse + dq + 3 * 2 * block * 4 + 2 * 2 * block * 2


def test_allgather_gathers_the_whole_sequences_keys_and_values() -> None:
    """All-gather attention's backward: the whole sequence's K and V gathered again (cp x T) and its
    whole-sequence dK and dV, all bf16."""
    result = run(layers=1, cp=4, cp_scheme="allgather", recompute="none", ffn_hidden=64, **MIDDLE)
    assert result.by_category["cp_buffers"] == 4 * (4 * T * KV * D * 2)


def test_ulysses_holds_the_exchanged_heads() -> None:
    """Ulysses over 4 ranks (KV heads replicated from 2 to 4): q, k and v of one head over 4 x T tokens,
    bf16, kept for the attention's backward (here the layer's peak is in its backward, before them)."""
    result = run(layers=1, cp=4, cp_scheme="ulysses", recompute="none", ffn_hidden=64, **MIDDLE)
    assert result.by_category["cp_buffers"] == 3 * (4 * T * D * 2)


@pytest.mark.parametrize(
    "changes",
    [
        dict(in_flight=4, **MIDDLE),
        dict(fsdp=True, zero=3, shard_group=4, recompute="full", loss="chunked"),
        dict(
            fsdp=True, zero=3, shard_group=4, reshard_after_forward=False, in_flight=4, input_embedding=False
        ),
        dict(experts=4, experts_per_token=2, expert_ffn=128, cp=2, zero=2, shard_group=2),
    ],
    ids=["pipeline", "fsdp", "fsdp-no-reshard-pipeline", "moe-ring-zero2"],
)
def test_a_deep_stage_is_extrapolated_exactly(changes: dict) -> None:
    """Six layers from runs of four and five (four micro-batches in flight from two and three) equal the run
    of all six, to the byte."""
    case = replace(BASE, layers=6, **changes)
    assert measure(case) == peak(measure(case, full=True))


@pytest.mark.parametrize("changes", [{}, dict(fsdp=True, zero=3, shard_group=4)], ids=["megatron", "fsdp"])
def test_a_warm_up_iteration_changes_nothing(changes: dict) -> None:
    case = replace(BASE, **changes)
    assert measure(case) == measure(case, warmup=True)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(recompute="none", micro_batch=2),
        dict(cp=2, cp_scheme="ring"),
        dict(tp=2, sequence_parallel=True),
    ],
    ids=["selective", "no-recompute-mb2", "ring", "tp-sp"],
)
def test_fake_tensors_hold_what_real_ones_do(changes: dict) -> None:
    """The same iteration on real CPU tensors (the path a CUDA device takes) peaks at the same bytes, at the
    same moment, category by category: fake tensors change nothing the tracker sees."""
    case = replace(BASE, **changes)
    assert measure(case, device="cpu:0") == peak(measure(case, full=True))


def test_a_cuda_device_refuses_what_it_cannot_run() -> None:
    with pytest.raises(InputError, match="kv_heads"):
        measure(BASE, device="cuda")
    with pytest.raises(InputError, match="fake tensors only"):
        measure(replace(BASE, fsdp=True, zero=3, shard_group=4), device="cuda")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(zero=3), "fsdp"),
        (dict(fsdp=True), "fsdp"),
        (dict(kv_heads=3), "kv_heads"),
        (dict(cp=8, cp_scheme="ulysses"), "heads"),
        (dict(tp=3, sequence_parallel=True), "tokens"),
        (dict(fsdp=True, zero=3, grad_dtype="bf16"), "grad_dtype"),
        (dict(master_dtype=None, grad_dtype="bf16", shard_group=8), "master_dtype"),
        (dict(recompute="some"), "recompute"),
    ],
)
def test_cases_the_reference_cannot_measure_name_their_field(changes: dict, field: str) -> None:
    with pytest.raises(InputError) as error:
        replace(BASE, **changes)
    assert error.value.field == field


def test_the_benchmark_runs_its_smoke_grid() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "memory_reference.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GiB" in done.stdout
