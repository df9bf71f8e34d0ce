"""The costs real runs pay beyond the FLOP, each checked from first principles: multiplies at their shapes,
the host's launch time, NCCL's rings over a node's NICs, unfused and named attention kernels, and a
gradient reduction that does not overlap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.machines.kernels import attention_rate, gemm_rate, tile_utilisation
from costmodel.machines.profiles import load_profile
from costmodel.plans.job import Job
from costmodel.plans.models import load_model
from costmodel.symbolic import numeric
from costmodel.training.step import bind, evaluate_step, fused_softmax


def test_wave_quantization_by_hand() -> None:
    # 4096 x 4096 output in 128 x 256 tiles: 512 tiles over 108 SMs run in 5 waves (540 slots)
    assert tile_utilisation(4096, 4096, 108) == pytest.approx(512 / 540, rel=1e-12)
    # a 128 x 256 output runs best as two 128 x 128 tiles: 2 of 108 SMs busy in its one wave
    assert tile_utilisation(128, 256, 108) == pytest.approx(2 / 108, rel=1e-12)


def test_a_decode_rows_multiply_is_a_split_k_kernel_its_reads_then_its_math() -> None:
    """One token's QKV projection of Llama 3 8B cuts into 24 tiles of 128 x 256 for 132 SMs: a split-K kernel,
    its bytes at the 2.68 TB/s memory-bound kernels reach on an H100, then its FLOP at the table's rate for
    its volume (edge 293, under the first knot, 512: read flat at its 16.5 TFLOP/s)."""
    profile = load_profile("h100-nvlink")
    m, n, k = 1, 6144, 4096
    reads = 2 * (m * k + k * n + m * n) / 2.68e12
    assert 2 * m * n * k / gemm_rate(profile, "bf16", m, n, k) == pytest.approx(
        reads + 2 * m * n * k / 16.5e12, rel=1e-9
    )
    # a full wave of tiles is a tiled kernel: the 4,096 square's 512 tiles read the table's knot as it is
    assert gemm_rate(profile, "bf16", 4096, 4096, 4096) == pytest.approx(671.3e12, rel=1e-9)


def test_a_skinny_tp_shard_runs_slower_than_the_square_of_as_many_multiply_adds() -> None:
    profile = load_profile("a100-nvlink")
    m, n, k = 8192, 385, 3072  # a QKV shard of a 3.6B model at TP 8, one column past a tile
    edge = round((m * n * k) ** (1 / 3))
    assert gemm_rate(profile, "bf16", m, n, k) < 0.8 * gemm_rate(profile, "bf16", edge, edge, edge)


@pytest.mark.xfail(
    strict=True,
    reason="known miss: a multiply is read at the square of as many multiply-adds and scaled by its wave fill "
    "against that square's, whose own waves step as the square grows; so one row more can halve the time "
    "(over Vidur's 69 H100 (n, k) shapes at m = 1-8,192, 76,960 of 565,179 one-row steps fall, 733 by over 5 %, "
    "worst 0.50x; on the A100's 78, worst 0.50x). A table "
    "by depth k of full waves removes every fall but, fitted the same way, read published steps worse "
    "(median 11.4 -> 12.6 %) and ranked vTrain's layouts worse (fastest found 81 -> 57 %)",
)
@pytest.mark.parametrize(
    ("profile", "m", "n", "k"), [("h100-nvlink", 111, 8192, 3072), ("a100-nvlink", 93, 8192, 2752)]
)
def test_a_larger_multiply_never_runs_faster(profile: str, m: int, n: int, k: int) -> None:
    table = load_profile(profile)

    def seconds(rows: int) -> float:
        return 2.0 * rows * n * k / gemm_rate(table, "bf16", rows, n, k)

    assert seconds(m + 1) >= seconds(m)


def test_a_ring_collective_across_nodes_pools_the_nics_its_members_hold() -> None:
    """TP 16 over two 8-GPU nodes: NCCL lays a ring per NIC, so the 8 members on a node drive 8 NICs; DP
    with TP 8 inside the node has one member per node and one NIC; a CP ring's send is one NIC."""
    machine = Machine(load_profile("a100-ib"), ranks_per_node=8)
    nic = machine.profile.links.inter_node.bandwidth_per_direction
    assert machine.link(16, "ring").bandwidth == pytest.approx(8 * nic, rel=1e-12)
    assert machine.placed(8).link(4, "ring").bandwidth == pytest.approx(nic, rel=1e-12)
    assert machine.link(16, "p2p").bandwidth == pytest.approx(nic, rel=1e-12)


# An A100 node's ring collectives as vTrain's all-reduce tables measure them (benchmarks/collectives.py).
A100_BUSBW, A100_HOP_S, A100_CALL_S = 0.69 * 300e9, 1.24e-6, 43.3e-6


def test_a100_ring_collectives_run_at_the_measured_bus_bandwidth_with_its_hop_and_call_latency() -> None:
    machine = Machine(load_profile("a100-nvlink"))
    link = machine.link(8, "ring")
    assert link.bandwidth == pytest.approx(A100_BUSBW, rel=1e-12)
    assert link.latency_s == pytest.approx(A100_HOP_S, rel=1e-12)
    assert link.call_latency_s == pytest.approx(A100_CALL_S, rel=1e-12)
    assert machine.link(8, "p2p").call_latency_s == 0.0  # a ring attention send is no collective call
    assert Machine(load_profile("a100-nvlink"), datasheet=True).link(8, "ring").call_latency_s == 0.0


def test_a_ring_across_nodes_pays_the_network_hop_only_where_it_crosses_the_network() -> None:
    """NCCL's ring over n ranks on k nodes: k - 1 of its n - 1 hops cross the network (9.6 us, Simple), the
    rest stay in a node at no less than NCCL's 3 us network overhead [NCCL-Tuning]; one rank a node crosses
    every hop."""
    machine = Machine(load_profile("h100-nvlink"))
    two_nodes = machine.link(16, "ring")
    assert two_nodes.scope == "inter-node"
    assert two_nodes.latency_s == pytest.approx((14 * 3.0e-6 + 1 * 9.6e-6) / 15, rel=1e-12)
    eight_nodes = machine.link(64, "ring")
    assert eight_nodes.latency_s == pytest.approx((56 * 3.0e-6 + 7 * 9.6e-6) / 63, rel=1e-12)
    one_a_node = machine.placed(8).link(16, "ring")
    assert one_a_node.latency_s == pytest.approx(9.6e-6, rel=1e-12)


def test_tp_collectives_by_hand_with_and_without_sequence_parallelism() -> None:
    """TP 8, one layer's pass: 4 x 7/8 of the micro-batch's activations over the bus, 4 x 7 ring steps, and
    a fixed latency per call: two all-reduces without sequence parallelism, two all-gathers and two
    reduce-scatters with it."""
    flags = dict(model="llama3-8b", seq=4096, hw="a100-nvlink", gpus=8, tp=8, global_batch=8)
    for sp, calls in ((False, 2), (True, 4)):
        v = _bound(**flags, sequence_parallel=sp)
        by_hand = 4 * 7 / 8 * 4096 * 4096 * 2 / A100_BUSBW + 4 * 7 * A100_HOP_S + calls * A100_CALL_S
        assert float(numeric.tp_comm_s(**{a: v[a] for a in numeric.ARGS["tp_comm_s"]})) == pytest.approx(
            by_hand, rel=1e-12
        )


def test_norms_and_residuals_split_over_tp_only_with_sequence_parallelism() -> None:
    flags = dict(model="llama3-8b", seq=4096, hw="a100-nvlink", gpus=8, tp=8, global_batch=8)
    m = load_model("llama3-8b")
    replicated = 4096 * 2 * 10 * m.hidden  # two norms and two residual adds, 2-byte elements, read + write

    def bytes_(sp: bool) -> float:
        v = _bound(**flags, sequence_parallel=sp)
        return float(
            numeric.layer_elementwise_bytes(**{a: v[a] for a in numeric.ARGS["layer_elementwise_bytes"]})
        )

    assert bytes_(False) - bytes_(True) == pytest.approx(replicated * (1 - 1 / 8), rel=1e-12)


def test_each_gradient_bucket_is_one_call_of_the_dp_ring() -> None:
    """DP 8 inside a node: every bucket pays a collective call's latency beside its bytes."""
    v = _bound(model="llama3-8b", seq=4096, hw="a100-nvlink", gpus=8, global_batch=8)
    assert v["D"] == 8 and v["n_bkt"] > 1
    params = float(numeric.device_params(**{a: v[a] for a in numeric.ARGS["device_params"]}))
    bytes_s = 2 * 7 / 8 * params * v["p_g"] / A100_BUSBW
    latency = v["n_bkt"] * A100_CALL_S
    assert float(numeric.dp_comm_s(**{a: v[a] for a in numeric.ARGS["dp_comm_s"]})) == pytest.approx(
        bytes_s + latency, rel=1e-12
    )


def test_cp_ranks_reduce_their_gradients_as_dp_ranks_do() -> None:
    """A CP rank runs the whole layer on other tokens: 8 ranks holding the same weights reduce the same
    gradients over the same NVLink ring, whether they split the batch or the sequence."""
    over_dp = _bound(model="llama3-8b", seq=8192, hw="a100-nvlink", gpus=8, global_batch=8)
    over_cp = _bound(model="llama3-8b", seq=8192, hw="a100-nvlink", gpus=8, cp=8, global_batch=1)
    assert (over_dp["D"], over_dp["N"], over_cp["D"], over_cp["N"]) == (8, 1, 1, 8)
    reduction = [
        float(numeric.dp_comm_s(**{a: v[a] for a in numeric.ARGS["dp_comm_s"]})) for v in (over_dp, over_cp)
    ]
    assert reduction[1] == pytest.approx(reduction[0], rel=1e-12)
    assert reduction[1] > 0.1  # 8 B parameters' fp32 gradients: a tenth of a second and more on NVLink


@pytest.mark.parametrize("zero, share", [(0, 1.0), (1, 1 / 8)])
def test_the_optimizer_steps_the_states_zero_leaves_a_device(zero: int, share: float) -> None:
    """Adam runs over the states a device keeps: all of them without ZeRO, whatever the DP degree; its
    1/(DP x CP) share under ZeRO-1, CP ranks included."""

    def step_s(**layout: int) -> float:
        v = _bound(model="llama3-8b", seq=8192, hw="a100-nvlink", zero=zero, **layout)
        return float(numeric.optimizer_s(**{a: v[a] for a in numeric.ARGS["optimizer_s"]}))

    alone = step_s(gpus=1, global_batch=1)
    assert step_s(gpus=8, global_batch=8) == pytest.approx(share * alone, rel=1e-12)
    assert step_s(gpus=8, cp=8, global_batch=1) == pytest.approx(share * alone, rel=1e-12)


def test_hybrid_sharding_gathers_inside_the_node_and_all_reduces_its_shards_across() -> None:
    """FSDP over 16 H100s of two nodes, a 100 Gb/s NIC a GPU, gathers every layer over the network; sharded over
    each node's 8 (HSDP) it gathers over NVLink, the two nodes all-reducing their 1/8 of the gradients, and
    keeps twice the states. (Eight 400 Gb/s NICs a node pool to NVLink's ring: there that memory buys nothing.)"""
    job = dict(
        model="llama3-8b",
        seq=8192,
        hw="h100-ib",
        inter_node_bandwidth="12.5GB/s",
        gpus=16,
        zero=3,
        global_batch=16,
    )
    flat, hybrid = _bound(**job), _bound(**job, zero_shard=8)
    node = _bound(**{**job, "gpus": 8, "global_batch": 8})  # FSDP over one node's 8: the same NVLink ring
    assert (flat["Z_s"], hybrid["Z_s"]) == (16, 8)
    assert hybrid["B_dp"] == node["B_dp"] > flat["B_dp"]
    assert hybrid["z_o"] == pytest.approx(2 * flat["z_o"], rel=1e-12)  # a shard of 8 ranks, not 16

    def call(v: dict, name: str) -> float:
        return float(getattr(numeric, name)(**{a: v[a] for a in numeric.ARGS[name]}))

    params = call(hybrid, "device_params")
    assert call(hybrid, "zero3_gather_s") == pytest.approx(2 * 7 / 8 * params * 2 / hybrid["B_dp"], rel=1e-12)
    assert call(hybrid, "zero3_gather_s") < call(flat, "zero3_gather_s") / 2
    scatter = 7 / 8 * params * hybrid["p_g"] / hybrid["B_dp"]
    across = 2 * (1 / 2) * params / 8 * hybrid["p_g"] / hybrid["B_dpr"]
    assert call(hybrid, "dp_comm_s") == pytest.approx(
        scatter + across + hybrid["n_bkt"] * hybrid["a_dp"], rel=1e-12
    )
    said = evaluate_step(Job.of(**job, zero_shard=8)).topology["zero"]  # what the report says of it
    assert said == {
        "size": 8,
        "scope": "intra-node",
        "bandwidth": hybrid["B_dp"],
        "replicas": 2,
        "replica_scope": "inter-node",
        "replica_bandwidth": hybrid["B_dpr"],
    }


@settings(max_examples=12, deadline=None)
@given(
    gpus=st.sampled_from([8, 16, 32]),
    tp=st.sampled_from([1, 2]),
    cp=st.sampled_from([1, 2, 4]),
    zero=st.sampled_from([1, 2, 3]),
)
def test_hybrid_groups_of_every_rank_are_plain_sharding_and_smaller_ones_keep_more(
    gpus, tp, cp, zero
) -> None:
    """K = DP x CP is ZeRO over all of them, to the last bit; a group of 2 keeps at least as much a device."""
    job = dict(model="llama3-8b", seq=8192, hw="h100-ib", gpus=gpus, tp=tp, cp=cp, zero=zero)
    job["global_batch"] = gpus // (tp * cp)
    plain = evaluate_step(Job.of(**job))
    whole = evaluate_step(Job.of(**job, zero_shard=gpus // tp))
    pair = evaluate_step(Job.of(**job, zero_shard=2))
    assert whole.step.time_s == plain.step.time_s
    assert whole.memory.bytes_per_device == plain.memory.bytes_per_device
    assert pair.memory.bytes_per_device >= plain.memory.bytes_per_device


def test_megatrons_default_reduces_every_gradient_after_the_backward() -> None:
    v = _bound(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=8)

    def call(name: str, **changed: float) -> float:
        return float(getattr(numeric, name)(**{a: {**v, **changed}[a] for a in numeric.ARGS[name]}))

    reduction = call("dp_comm_s")
    assert call("dp_exposed_s", o_dp=0.0) == pytest.approx(reduction, rel=1e-12)
    assert call("dp_exposed_s", o_dp=1.0) == pytest.approx(reduction / v["n_bkt"], rel=1e-12)
    assert call("dp_overflow_s", o_dp=0.0) == 0.0


def _bound(**values):
    return bind(Job.of(**values))


def test_a_host_bound_layer_grows_by_its_kernel_count_times_the_launch_cost() -> None:
    """Once the host is slower than the device, one more microsecond per launch costs every kernel of every
    layer pass on the critical path: (n_kf (1 + full) + n_kb) x layers x (m + pp - 1) slots."""
    flags = dict(
        model="llama3-8b", seq=1024, hw="a100-nvlink", gpus=8, tp=8, global_batch=2, recompute="full"
    )
    times = []
    for launch in (2e-4, 3e-4):
        profile = load_profile("a100-nvlink")
        profile = profile.model_copy(
            update={"kernels": profile.kernels.model_copy(update={"launch_s": launch})}
        )
        times.append(
            evaluate_step(Job.of(_profile=profile, **flags)).model_dump(by_alias=True)["step"]["time_s"]
        )
    v = _bound(**flags)
    kernels = v["n_kf"] * 2 + v["n_kb"]
    assert times[1] - times[0] == pytest.approx(kernels * 32 * 2 * 1e-4, rel=1e-9)


def test_unfused_attention_by_hand() -> None:
    """Megatron's core attention computes the whole S x S square and passes the scores through HBM:
    softmax reads and writes them (2p), dropout writes its result and a byte mask (2p + 1)."""
    flags = dict(model="gpt3-175b", seq=2048, hw="a100-nvlink", gpus=8, tp=8, global_batch=8)
    v = _bound(**flags, attention_kernel="unfused")
    square = 2048 * 2048 * 1 * 96 / 8  # score elements of one micro-batch per device
    flop = 4 * 2048 * 2048 * 128 * 96 / 8  # QK^T and PV over the whole square
    expected = flop / v["F_attn"] + (2 * 2 + 2 * 2 + 1) * square / v["B_hbm"]
    assert float(numeric.layer_attn_fwd_s(**{a: v[a] for a in numeric.ARGS["layer_attn_fwd_s"]})) == (
        pytest.approx(expected, rel=1e-12)
    )
    with pytest.raises(InputError, match="CP needs flash"):
        Job.of(**{**flags, "cp": 2, "gpus": 16}, attention_kernel="unfused")


@pytest.mark.parametrize(
    ("seq", "batches", "fused"),
    [
        (1024, 4, True),  # 16 heads at TP 4, micro-batch 1
        (1024, 2, False),  # 16 heads at TP 8, micro-batch 1: half a block of rows
        (1024, 6, False),  # 48 heads at TP 8, micro-batch 1: a block and a half
        (1024, 12, True),  # the same at micro-batch 2
        (128, 4, False),  # up to 128 keys a block holds 8 matrices
        (128, 8, True),
        (16, 8, False),  # 16 keys or fewer: no kernel
        (4096, 4, True),
        (4100, 4, False),  # past the kernel's longest row
        (1026, 4, False),  # S not a multiple of 4
    ],
)
def test_megatrons_fused_softmax_runs_only_where_its_kernel_fits(seq: int, batches: int, fused: bool) -> None:
    assert fused_softmax(seq, batches) is fused


def test_an_unfused_softmax_that_misses_the_fused_kernel_runs_as_five_fp32_kernels_each_way() -> None:
    """48 heads at TP 8 and micro-batch 1 leave 6 score matrices per rank, not whole blocks of 4: the softmax
    falls back to a cast up, scale, mask, softmax and cast down (and their five gradients), each one kernel
    and one pass over the scores in fp32. At micro-batch 2 the fused kernel runs."""
    flags = dict(model="gpt3-20b", seq=1024, hw="a100-nvlink", gpus=8, tp=8, recompute="full")
    fused = _bound(**flags, global_batch=2, micro_batch=2, attention_kernel="unfused")
    eager = _bound(**flags, global_batch=1, micro_batch=1, attention_kernel="unfused")
    assert (eager["n_kf"] - fused["n_kf"], eager["n_kb"] - fused["n_kb"]) == (4, 4)
    p, dropout = 2, 2 * 2 + 1  # fp16 scores; dropout's result and its byte mask
    assert (fused["k_sf"], fused["k_sb"]) == (2 * p + dropout, 3 * p + dropout)
    # forward: 2+4 (cast up), 4+4 (scale), 4+4 (mask in place), 4+4 (softmax), 4+2 (cast down)
    assert eager["k_sf"] == 6 + 8 + 8 + 8 + 6 + dropout
    # backward: 2+4 (cast down's gradient), 4+4+4 (softmax's), 4+4 (mask's), 4+4 (scale's), 4+2 (cast up's)
    assert eager["k_sb"] == 6 + 12 + 8 + 8 + 6 + dropout


def test_a_named_attention_kernel_reads_its_own_tables() -> None:
    """h200-nvlink holds torch SDPA's flash and cuDNN backends as measured on one H200: the step's
    attention rate is that table's, read as the default one is."""
    flags = dict(model="llama3-8b", seq=8192, hw="h200-nvlink", gpus=8, global_batch=8)
    profile = load_profile("h200-nvlink")
    for kernel in ("sdpa-flash", "sdpa-cudnn"):
        v = _bound(**flags, attention_kernel=kernel)
        assert v["F_attn"] == pytest.approx(
            profile.kernels.sustained_clock
            * attention_rate(profile, "bf16", 8192, 8192, 128, True, False, kernel),
            rel=1e-12,
        )
    slow, default = _bound(**flags, attention_kernel="sdpa-flash"), _bound(**flags)
    assert 0.4 < slow["F_attn"] / default["F_attn"] < 0.75  # FA2's path against the FA3 tables
    with pytest.raises(InputError, match="has tables for flash, unfused, fa2, sdpa-cudnn, sdpa-flash"):
        evaluate_step(Job.of(**flags, attention_kernel="fa9")).model_dump(by_alias=True)


def _llama3_8b_tp2_cast_elements() -> tuple[float, float, float]:
    """Llama 3 8B at TP 2, counted by hand: the four multiplies' input and output widths per token on one TP
    shard, and their weight elements."""
    model, t = load_model("llama3-8b"), 2
    d = model.head_dim
    inputs = 2 * model.hidden + model.heads * d / t + model.ffn_hidden / t
    outputs = (model.heads + 2 * model.kv_heads) * d / t + 2 * model.hidden + 2 * model.ffn_hidden / t
    shapes = [
        ((model.heads + 2 * model.kv_heads) * d / t, model.hidden),
        (model.hidden, model.heads * d / t),
        (2 * model.ffn_hidden / t, model.hidden),
        (model.hidden, model.ffn_hidden / t),
    ]
    return inputs, outputs, sum(n * k for n, k in shapes)


def test_fp8_linear_layers_run_at_the_fp8_rate_and_pay_their_casts() -> None:
    """--gemm-dtype fp8: the multiplies read the profile's fp8 table (on H100 the bf16 one x 1402.6 / 794.5,
    the measured fp8/bf16 maximum achievable matmul ratio [MAMF]), attention and the output layer stay bf16,
    and each layer moves its casts through HBM: inputs and output gradients from 2 bytes to 1, the weights
    once a micro-batch, transposed copies for the backward."""
    flags = dict(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, tp=2, global_batch=8)
    bf16, fp8 = _bound(**flags), _bound(**flags, gemm_dtype="fp8")
    # the table's ratio, a little more where HBM held a bf16 multiply back (fp8 moves half the bytes)
    assert 1402.6 / 794.5 - 1e-3 <= fp8["F_gemm"] / bf16["F_gemm"] < 1.78
    assert (fp8["F_attn"], fp8["F_head"]) == (bf16["F_attn"], bf16["F_head"])
    rows, (inputs, outputs, weights) = 8192, _llama3_8b_tp2_cast_elements()
    by_hand = rows * inputs * 3 + weights * 3 + rows * outputs * 3 + 2 * rows * inputs + 2 * weights
    casts = float(numeric.layer_fp8_cast_bytes(**{a: fp8[a] for a in numeric.ARGS["layer_fp8_cast_bytes"]}))
    assert casts == pytest.approx(by_hand, rel=1e-12)
    assert (
        float(numeric.layer_fp8_cast_bytes(**{a: bf16[a] for a in numeric.ARGS["layer_fp8_cast_bytes"]})) == 0
    )
    with pytest.raises(InputError, match="mxfp8 runs on Blackwell"):
        evaluate_step(Job.of(**flags, gemm_dtype="mxfp8")).model_dump(by_alias=True)


@pytest.mark.parametrize(
    ("knobs", "amax_reads"),
    [
        ({}, 0),  # Megatron: Transformer Engine's delayed scaling takes the amax in the cast
        ({"framework": "torchtitan"}, 1),  # torchao's tensorwise recipe: an amax pass first
        ({"fp8_scaling": "current"}, 1),
        ({"framework": "torchtitan", "fp8_scaling": "delayed"}, 0),
    ],
    ids=["megatron", "torchtitan", "flag-current", "flag-delayed"],
)
def test_current_scaling_reads_each_cast_tensor_once_more_for_its_amax(knobs: dict, amax_reads: int) -> None:
    """Under current scaling every cast reads its bf16 tensor once more (p bytes an element) before the cast;
    measured on an H200, torchao's compiled cast costs what 6.0 bytes an element would at a copy's rate,
    against the 2 + 1 of the cast and 2 of the amax (docs/validation.md, "FP8 casts, measured")."""
    flags = dict(
        model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, tp=2, global_batch=8, gemm_dtype="fp8"
    )
    values = _bound(**flags, **knobs)
    assert values["a_f8"] == amax_reads
    delayed = {**values, "a_f8": 0}
    args = numeric.ARGS["layer_fp8_cast_bytes"]
    casts = float(numeric.layer_fp8_cast_bytes(**{a: values[a] for a in args}))
    plain = float(numeric.layer_fp8_cast_bytes(**{a: delayed[a] for a in args}))
    rows, (inputs, outputs, weights) = 8192, _llama3_8b_tp2_cast_elements()
    assert casts - plain == pytest.approx(
        amax_reads * 2 * (rows * inputs + weights + rows * outputs), rel=1e-12
    )


def test_fp8_multiplies_without_an_fp8_table_scale_the_bf16_one_by_the_peaks() -> None:
    """A profile with no ``kernels.gemm_fp8`` runs fp8 multiplies at the bf16 table x fp8/bf16 peak (2 on H100)."""
    profile = load_profile("h100-nvlink")
    bare = profile.model_copy(update={"kernels": profile.kernels.model_copy(update={"gemm_fp8": None})})
    shape = (8192, 8192, 8192)
    assert gemm_rate(bare, "fp8", *shape, element_bytes=1) == pytest.approx(
        2 * gemm_rate(bare, "bf16", *shape), rel=1e-3
    )
    assert gemm_rate(profile, "fp8", *shape, element_bytes=1) == pytest.approx(1227.5e12, rel=1e-3)


USP_JOB = dict(model="llama3-8b", seq=131072, hw="h100-ib", gpus=16, cp=16, global_batch=1, cp_scheme="usp")


@pytest.mark.parametrize(("degree", "split"), [(None, (8, 2)), (4, (4, 4)), (2, (2, 8)), (16, (16, 1))])
def test_ulysses_degree_sets_usps_all_to_all_and_its_ring(degree: int | None, split: tuple[int, int]) -> None:
    """--ulysses-degree N_u: all-to-alls over N_u ranks, a ring over cp / N_u; by default the largest N_u that
    divides the CP degree and the eight KV heads (Llama 3 8B at TP 1), and 16 replicates the KV heads twice."""
    job = Job.of(**USP_JOB, **({"ulysses_degree": degree} if degree else {}))
    assert job.usp_split == split
    values = _bound(**USP_JOB, **({"ulysses_degree": degree} if degree else {}))
    assert (values["N_u"], values["N_r"]) == split
    report = evaluate_step(job).model_dump(by_alias=True)
    assert report["inputs"]["usp_ulysses_degree"] == split[0]


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"ulysses_degree": 3}, "3 does not divide --cp 16"),
        ({"ulysses_degree": 2, "cp_scheme": "ring"}, "needs --cp-scheme usp, not ring"),
        ({"ulysses_degree": 64, "cp": 64, "gpus": 64}, "query heads do not split over 64"),
    ],
)
def test_a_ulysses_degree_usp_cannot_run_is_refused_naming_the_flag(knobs: dict, message: str) -> None:
    with pytest.raises(InputError, match=message) as error:
        Job.of(**{**USP_JOB, **knobs})
    assert error.value.field == "--ulysses-degree"
