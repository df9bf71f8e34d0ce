"""MoE memory and gradient traffic count every expert: the fit, the search and the step's DP reduction.

Mixtral 8x7B by hand: a dense part of 1,604,587,520 weights (attention, norms, embeddings; no shared
expert) and 32 layers of 8 experts of 3 x 4096 x 14336 plus a 4096 x 8 router: 46.7B in all, of which a
token runs 12.9B. Dense models keep every number they had before MoE memory was modelled (pinned below).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.bind import Evaluator
from costmodel.plans.inputs import TRAINING_DEFAULTS, PlanInputs, TrainingSetup
from costmodel.plans.job import Job, make_job
from costmodel.plans.models import load_model
from costmodel.symbolic import numeric
from costmodel.training import moe
from costmodel.training.memory import fit_at, memory, training_values
from costmodel.training.recommend import recommend
from costmodel.training.search import Constraints, search, search_loop
from costmodel.training.step import bind, evaluate_step, step_memory
from tests.support import REPO, every_scheme, formula, memory_values, searched

MIXTRAL = str(REPO / "tests" / "data" / "hf" / "mixtral-8x7b.json")
H, F, LAYERS, EXPERTS = 4096, 14336, 32, 8
DENSE = LAYERS * (H * 128 * (2 * 32 + 2 * 8) + 2 * H) + 2 * 32000 * H + H  # attention, norms, embeddings
EXPERT = 3 * H * F  # one gated expert
ROUTER = H * EXPERTS
NORMS = (2 * LAYERS + 1) * H  # whole on every TP rank


def dense_on(t: int) -> float:
    """The dense part a TP rank holds: 1/t of it, and the norms whole."""
    return (DENSE - NORMS) / t + NORMS


def test_dense_part_and_total_by_hand() -> None:
    assert DENSE == 1_604_587_520
    total = DENSE + LAYERS * (EXPERTS * EXPERT + ROUTER)
    assert total == pytest.approx(46.7e9, abs=0.05e9)  # as Mistral AI publishes it
    v = {**memory_values(_inputs(1), TrainingSetup(gpus=8), 1, load_model(MIXTRAL))}
    assert memory(Evaluator(v), "params") == pytest.approx(total, rel=1e-12)


def test_shared_expert_joins_the_dense_part() -> None:
    """Qwen1.5-MoE-A2.7B: 60 experts of 1408 and a shared one of 5632 on 24 layers are 14.3B weights, as the
    Qwen team publishes them (to 0.05B; the attention biases and the shared expert's gate are left out)."""
    path = str(REPO / "tests" / "data" / "hf" / "qwen1.5-moe-a2.7b.json")
    inputs = PlanInputs(seq=4096, n=1, model=path, hw="h100-ib", **TRAINING_DEFAULTS)
    values = memory_values(inputs, TrainingSetup(gpus=8), 1, load_model(path))
    assert memory(Evaluator(values), "params") == pytest.approx(14.3e9, abs=0.05e9)


def _inputs(n: int, seq: int = 32768) -> PlanInputs:
    return PlanInputs(seq=seq, n=n, model=MIXTRAL, hw="h100-ib", **TRAINING_DEFAULTS)


def _h100() -> Machine:
    return Machine(load_profile("h100-ib"))


def test_mixtral_memory_per_device_by_hand() -> None:
    """S = 32k over CP 8, TP 8 (sequence parallel), 64 GPUs (DP 1), ZeRO-1, selective recompute, flash attention,
    Megatron-Core's copies and cross-entropy.

    States: the dense part / 8 (its norms whole) and every expert / 8 (each TP-split; routers whole) at 2 + 4 + 12/8 bytes.
    Activations per layer, per token of the L = 4096 a device holds: the dense layer's (8H + 4hd + 4 n_kv d)/t
    and, for each of 2 routed copies times the 1.25 capacity factor, the dispatched hidden state (2H bytes,
    whole on each TP rank) and the expert's gated intermediates 2 x 3F / t; then the final hidden state, 2H.
    The peak is the larger of the loss (6 bytes per logit of the L x V/t) and the backward's working set: the
    MLP's gradients, (3 F_mem / t + H / t) x 2 bytes a token, outweigh the attention's Q, K and V gradients
    with the ring's buffers, which are then not held beside them. The allocator reserves
    22 % more of those, the runtime holds 2 GB. To 1e-9 relative (float arithmetic)."""
    setup = TrainingSetup(gpus=64, tp=8)
    ev = Evaluator(memory_values(_inputs(8), setup, 8, load_model(MIXTRAL)))
    fit = fit_at(ev)
    held = dense_on(8) + LAYERS * (EXPERTS * EXPERT / 8 + ROUTER)
    assert held == 5_838_999_552
    states = held * (2 + 4 + 12 / 8)
    tokens, t, V = 4096, 8, 32000
    f_mem = 1.25 * 2 * (F + t * H / 3)  # every routed copy as a width of the dense layer's MLP
    per_token = (8 * H + 4 * 32 * 128 + 4 * 8 * 128) / t + 2 * 3 * f_mem / t
    assert per_token == pytest.approx(
        (8 * H + 4 * 32 * 128 + 4 * 8 * 128) / t + 1.25 * 2 * (2 * H + 6 * F / t)
    )
    kept = LAYERS * tokens * per_token + tokens * 2 * H
    loss = tokens * V / t * 6
    backward = tokens * (3 * f_mem / t + H / t) * 2
    attention = tokens * (32 + 2 * 8) * 128 / t * 2 + ev("ring_buffer_bytes")
    assert attention < backward
    by = fit.by_category
    assert by.weights + by.gradients + by.optimizer == pytest.approx(states, rel=1e-9)
    assert by.activations == pytest.approx(kept, rel=1e-9)
    assert (by.loss, by.working, by.cp_buffers) == pytest.approx(
        (0, backward, 0), rel=1e-9
    )  # the backward wins
    assert backward > loss and by.peak == "the backward, one stage"
    allocated = states + kept + max(loss, backward)
    assert by.allocated_bytes == pytest.approx(allocated, rel=1e-9)
    reserved = allocated + 0.22 * (kept + max(loss, backward))  # 22 % more of what comes and goes
    assert fit.total_bytes == pytest.approx(reserved + 2e9, rel=1e-9)
    assert fit.total_bytes == pytest.approx(54.71e9, abs=0.05e9) and fit.fits  # of 80.7 GB usable
    # One expert of width F, as the fit counted before, left 6.45x fewer weights.
    assert held / (dense_on(8) + LAYERS * EXPERT / 8) == pytest.approx(6.45, abs=0.01)


def test_capacity_factor_pads_the_routed_activations() -> None:
    """At C_f = 1 the routed copies keep 2 x (2H + 6F/t) bytes per token of each layer; 1.25 a quarter more."""
    base = memory_values(_inputs(8), TrainingSetup(gpus=64, tp=8), 8, load_model(MIXTRAL))

    def kept(capacity: float) -> float:
        at = base | {"C_f": capacity}
        return _at("layer_kept_bytes", at | {"F_ffn": _at("moe_activation_ffn", at)})

    routed = 4096 * 2 * (2 * H + 2 * 3 * F / 8)
    assert kept(1.25) - kept(1.0) == pytest.approx(0.25 * routed, rel=1e-9)


def test_expert_states_shard_over_the_ranks_holding_the_same_experts() -> None:
    """ZeRO-1 over D x N = 8 ranks; with EP 4 the 2 ranks holding the same experts share the experts' fp32
    states: each keeps 2 of 8 experts (a quarter) at 2 + 4 + 12/2 bytes."""
    values = memory_values(_inputs(8), TrainingSetup(gpus=64, tp=8), 8, load_model(MIXTRAL))
    at_ep4 = {**values, "E_p": 4}
    states = numeric.moe_model_state_bytes(**{a: at_ep4[a] for a in numeric.ARGS["moe_model_state_bytes"]})
    experts = LAYERS * (2 * EXPERT / 8 + ROUTER)
    assert states == pytest.approx(dense_on(8) * (6 + 12 / 8) + experts * (6 + 12 / 2), rel=1e-9)


def test_step_reduces_every_expert_gradient() -> None:
    """Mixtral, TP 2, 32 GPUs (DP 16), EP 1: a device holds 23.35e9 weights, all 8 experts, in 3,737 buckets
    of 25 MB fp32 gradients; the last bucket's share of 2 x 15/16 of them over the DP link stays exposed.
    EP 4: the experts' gradients reduce over the 4 ranks holding the same ones, 12/16 of the bytes."""
    for ep, expert_share in ((1, 15 / 16), (4, 12 / 16)):
        built = Job.of(model=MIXTRAL, seq=32768, hw="h100-nvlink", gpus=32, tp=2, global_batch=16, ep=ep)
        model = load_model(MIXTRAL)
        v = bind(built)
        experts = LAYERS * (EXPERTS // ep * EXPERT / 2 + ROUTER)
        held = dense_on(2) + experts
        assert v["n_bkt"] == math.ceil(held * 4 / 25e6)
        assert v["a_dp"] == 8.4e-6  # DP 16 with TP 2 leaves the node: NCCL's base latency per bucket, Simple
        tau = 2 * (15 / 16 * dense_on(2) + expert_share * experts) * 4 / v["B_dp"] + v["n_bkt"] * v["a_dp"]
        assert moe.counted("dp_exposed_s", v, model) == pytest.approx(tau / v["n_bkt"], rel=1e-9)
        exposed = evaluate_step(built).model_dump(by_alias=True)["step"]["breakdown"]["exposed_dp_s"]
        assert tau / v["n_bkt"] * (1 - 1e-9) <= exposed <= tau * (1 + 1e-9)
    assert v["n_bkt"] == 1031 and (ep, EXPERTS // ep) == (4, 2)


def test_step_reports_total_and_held_parameters() -> None:
    result = evaluate_step(
        Job.of(model=MIXTRAL, seq=32768, hw="h100-nvlink", gpus=32, tp=2, global_batch=16)
    ).model_dump(by_alias=True)
    assert result["moe"]["params"] == pytest.approx(DENSE + LAYERS * (EXPERTS * EXPERT + ROUTER), rel=1e-12)
    assert result["moe"]["params_per_device"] == pytest.approx(
        dense_on(2) + LAYERS * (EXPERTS * EXPERT / 2 + ROUTER), rel=1e-12
    )


@settings(max_examples=40, deadline=None)
@given(
    experts=st.sampled_from([4, 8, 16, 64]),
    shared=st.sampled_from([0, 1408, 5632]),
    ep=st.sampled_from([1, 2, 4]),
    t=st.sampled_from([1, 2, 8]),
    pp=st.sampled_from([1, 2, 4]),
    dense=st.sampled_from([0, 1, 3]),
)
def test_one_device_of_one_rank_holds_the_whole_model(
    experts: int, shared: int, ep: int, t: int, pp: int, dense: int
) -> None:
    """Without TP, PP or EP a device holds every parameter, and 18 bytes of unsharded state each; splitting
    by EP never adds memory, and the devices of an EP group hold every expert once (whatever the dense
    layers before the MoE ones)."""
    shape = {"H": 2048, "V": 50000, "d": 128, "e_m": 2, "g": 1, "h": 16, "n_L": 8, "n_kv": 4, "F_ffn": 1408}
    shape |= {"n_E": experts, "F_sh": shared, "n_dn": dense, "F_dn": 5632 if dense else 0}
    total = formula("moe_params", **shape)
    one = shape | {"t": 1, "pp": 1, "E_p": 1, "n_first": 8, "n_mid": 0, "n_last": 8}
    assert formula("moe_device_params", **one) == pytest.approx(total, rel=1e-12)
    megatron = {"q_w": 2, "q_c": 2, "q_g": 4, "q_m": 4, "q_o": 4}  # frameworks/megatron.yaml's copies
    assert formula(
        "moe_model_state_bytes", **one, **megatron, z_w=1, z_g=1, z_o=1, o_opt=0, o_par=0
    ) == pytest.approx(18 * total, rel=1e-12)
    even = shape["n_L"] // pp  # every stage holds as many layers
    split = shape | {"t": t, "pp": pp, "n_first": even, "n_mid": even if pp > 2 else 0, "n_last": even}
    ep_values = [e for e in (1, ep) if experts % e == 0]
    held = [_at("moe_device_expert_params", split | {"E_p": e}) for e in ep_values]
    assert held == sorted(held, reverse=True)
    full = _at("moe_device_expert_params", split | {"E_p": 1})
    routers = (shape["n_L"] - dense if pp == 1 else even) * shape["H"] * experts  # the most MoE layers
    assert (held[-1] - routers) * ep_values[-1] == pytest.approx(full - routers, rel=1e-12)


def _at(name: str, values: dict) -> float:
    return formula(name, **values)


def test_deepseek_v3_is_671_b_with_its_three_dense_layers() -> None:
    """DeepSeek-V3 by hand [DeepSeek-V3 §4.2]: embeddings, 61 layers of latent attention and norms, 3 dense
    MLPs of 18,432, then 58 MoE layers of 256 routed and 1 shared expert of 2,048 and a router: 671.03 B,
    the 671 B DeepSeek publishes. On a device of the first of two pipeline stages (31 layers), 28 MoE
    layers' experts; the last stage's 30 are the most a stage holds."""
    H = 7168
    expert = 3 * H * 2048
    attention = 187_105_280 + 2 * H + 1536 + 512  # projections, layer norms, latent norms
    by_hand = 2 * 129280 * H + 61 * attention + 3 * 3 * H * 18432 + 58 * (257 * expert + H * 256) + H
    assert by_hand == 671_026_404_352
    job = Job.of(model="deepseek-v3", seq=4096, hw="h100-ib", gpus=256, pp=2, ep=8, global_batch=128)
    v = training_values(job)
    assert memory(Evaluator(v), "params") == pytest.approx(by_hand, rel=1e-12)
    assert (v["n_first"], v["n_last"]) == (31, 30)
    held = _at("moe_device_expert_params", v | {"F_ffn": 2048})
    assert held == pytest.approx(30 * (256 / 8 * expert + H * 256), rel=1e-12)
    first_only = _at("moe_device_expert_params", v | {"F_ffn": 2048, "n_last": 1})
    assert first_only == pytest.approx(28 * (256 / 8 * expert + H * 256), rel=1e-12)


def test_each_stage_of_deepseek_v3_holds_its_own_dense_part_and_experts() -> None:
    """Two stages of DeepSeek-V3 (TP 1, EP 8): the first holds the input embedding, 31 layers' attention and
    shared experts, the 3 dense MLPs beyond them and 28 MoE layers' experts; the last the output layer, the
    final norm, 30 layers' attention and shared experts and 30 MoE layers' experts. Each stage's states are
    its own: the step's are the larger, less than the most dense part (the first's) beside the most
    experts (the last's)."""
    H, V = 7168, 129280
    attention = 187_105_280 + 2 * H + 1536 + 512
    shared, expert = 3 * H * 2048, 3 * H * 2048
    experts = 256 / 8 * expert + H * 256
    hand = {
        "first": (V * H + 31 * (attention + shared) + 3 * 3 * H * (18432 - 2048), 28 * experts),
        "last": (V * H + H + 30 * (attention + shared), 30 * experts),
    }
    job = Job.of(model="deepseek-v3", seq=4096, hw="h100-ib", gpus=256, pp=2, ep=8, global_batch=128)
    ev = Evaluator(training_values(job))
    for stage, (dense, held) in hand.items():
        assert float(ev(f"moe_{stage}_stage_dense_params", F_ffn=2048)) == pytest.approx(dense, rel=1e-12)
        assert float(ev(f"moe_{stage}_stage_expert_params", F_ffn=2048)) == pytest.approx(held, rel=1e-12)

    def states(dense: float, held: float) -> float:
        return sum(float(memory(ev, name, P_r=dense, P_x=held)) for name in STATE_FORMULAS)

    first, last = (states(*hand[stage]) for stage in ("first", "last"))
    assert float(memory(ev, "model_state_bytes")) == pytest.approx(max(first, last), rel=1e-12)
    mixed = states(hand["first"][0], hand["last"][1])
    assert mixed > max(first, last) * 1.01


STATE_FORMULAS = ("weight_bytes", "gradient_bytes", "optimizer_state_bytes")


PINNED_FIT = (8030261248.0, 49687241472.0, 21439184896.0, 77843047045.12)
PINNED_N_MIN = 28.811780353811926


# Dense models: what the fit, the step and the search give, pinned so that an unintended change shows (the
# step times re-pinned when the Hopper tables took their sustained clock, 0.874 of boost, and when TP left
# the norms whole on every rank, +1.3e-4 of a 70B rank's parameters, and when memory-bound terms took the
# bandwidth memory-bound kernels reach, 0.80 of the datasheet's; the fit when the allocator's share of
# what comes and goes became 0.22 and the gradients made each step joined it, and when the A100's usable memory
# became what a process can allocate, 79.15 GiB, not the datasheet's 80e9 bytes (N = 32 fits: half the N, twice
# the activations); each term is held to a hand count or the torch reference elsewhere).
def test_dense_fit_is_unchanged() -> None:
    inputs = PlanInputs(seq=131_072, n=1, model="llama3-8b", **TRAINING_DEFAULTS)
    report = recommend(make_job(inputs, TrainingSetup(gpus=64)))
    fit = report.fit
    assert (fit.params, fit.model_state_bytes, fit.activation_bytes, fit.total_bytes) == pytest.approx(
        PINNED_FIT, rel=1e-12
    )
    assert report.recommendation.n_min_memory_real == pytest.approx(PINNED_N_MIN, rel=1e-12)


def test_dense_step_is_unchanged() -> None:
    built = Job.of(model="llama3-70b", seq=32768, hw="h100-ib", gpus=64, tp=8, pp=2, zero=3, global_batch=32)
    step = evaluate_step(built).model_dump(by_alias=True)["step"]
    parts = step["breakdown"]
    assert (
        step["time_s"],
        parts["exposed_dp_s"],
        parts["zero3_gather_s"],
        parts["optimizer_s"],
    ) == pytest.approx(
        (24.526204107310498, 0.00038320314560906515, 0.05292220416, 0.012341931940298508), rel=1e-12
    )


def test_dense_search_is_unchanged() -> None:
    found = search(
        *every_scheme(seq=32768, model="llama3-8b", hw="h100-ib", gpus=16, global_batch=32),
        Constraints(tp_comm_overlap=False),  # the dimension searched since
        top=3,
    )
    assert [(p["tp"], p["cp"], p["pp"], p["dp"], p["cp_scheme"]) for p in found.plans] == [
        (2, 4, 1, 2, "ring"),
        (2, 4, 1, 2, "ulysses"),
        (1, 8, 2, 1, "ulysses"),
    ]
    assert [p["step_time_s"] for p in found.plans] == pytest.approx(
        [10.004018502110641, 10.037447660855479, 10.061222044448696], rel=1e-12
    )
    assert [p["memory_bytes"] for p in found.plans] == pytest.approx(
        [58311220060.16, 58311220060.16, 56877462773.76], rel=1e-12
    )
    assert found.notes == []


def test_recommend_mixtral_plans_with_every_expert(cli) -> None:
    """`cp-plan recommend` on 64 H100s at 32k: the fit counts 46.7B weights; the searched plan's memory holds at
    least its experts' bf16 weights and fp32 gradients (6 bytes each), n_E/EP of them, and the search says it
    searches EP."""
    result = cli(
        "recommend", "--model", MIXTRAL, "--seq", "32k", "--hw", "h100-ib", "--gpus", "64", "--format", "json"
    )
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["fit"]["params"] == pytest.approx(46.7e9, abs=0.05e9)
    pick = data["search"]["plans"][0]
    layers = max(pick["first_stage_layers"], pick["middle_stage_layers"], pick["last_stage_layers"])
    experts_held = layers * (EXPERTS / pick["ep"] * EXPERT / pick["tp"] + ROUTER)
    assert pick["memory_bytes"] > 6 * experts_held
    assert pick["memory_bytes"] <= pick["device_memory_bytes"]
    assert "EP searched" in data["search"]["notes"][0]


def test_vectorised_search_counts_experts_as_the_plain_loop() -> None:
    """Qwen1.5-MoE (60 experts and a shared one) on 8 GPUs: the array search and one evaluate_step plus one
    fit per plan keep the same plans in the same order, time and memory equal to 1e-12."""
    qwen = str(REPO / "tests" / "data" / "hf" / "qwen1.5-moe-a2.7b.json")
    built = searched(model=qwen, seq=8192, hw="h100-nvlink", gpus=8, global_batch=8)
    fast = search(*built, Constraints(recompute="selective"), top=None).plans
    slow = search_loop(*built, Constraints(recompute="selective"))
    assert len(fast) == len(slow) > 100
    keys = ("tp", "cp", "pp", "vpp", "dp", "ep", "micro_batch")
    assert [tuple(p[k] for k in keys) for p in fast] == [tuple(p[k] for k in keys) for p in slow]
    assert {p["ep"] for p in fast} == {1, 2, 4}  # EP divides DP and the 60 experts
    for a, b in zip(fast, slow, strict=True):
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12)
        assert a["memory_bytes"] == pytest.approx(b["memory_bytes"], rel=1e-12)


@pytest.mark.parametrize(("pp", "recompute"), [(1, "selective"), (4, "selective"), (1, "full")])
def test_moe_n_min_memory_is_where_memory_just_fits(pp: int, recompute: str) -> None:
    """Mixtral at 1M tokens, TP 8 (PP 4 with full recompute fits without CP): at N = N_min the most loaded
    stage's memory, every expert counted, equals the usable HBM, to rounding."""
    setup = TrainingSetup(gpus=64 * pp, tp=8, pp=pp, recompute=recompute)
    values = memory_values(_inputs(1, seq=1 << 20), setup, 1, load_model(MIXTRAL))
    n_min = _at(moe.twin("n_min_memory", values), values)
    assert n_min > 2  # the ring's buffers exist from N = 2 on
    at = values | {"N": n_min}
    at["M_cpb"] = _at("ring_buffer_bytes", at)
    total = _at("moe_training_memory_bytes", at)
    # Under PP, N_min takes the states of the stage holding the most of each part (here the last's dense part,
    # the final norm more than the first's) beside the most loaded stage's activations: it is the CP degree
    # where memory fits, 30 KB (4,096 norm weights at 7.5 bytes) early.
    assert total <= values["M_dev"]
    assert total == pytest.approx(values["M_dev"], rel=1e-12 if pp == 1 else 1e-6)


def test_fsdp_holds_the_first_layers_experts_gathered_at_the_backwards_end() -> None:
    """Mixtral under torchtitan's FSDP (TP 2, CP 4, EP 2, 64K tokens, full recompute): at the backward's end
    the embedding is gathered with its unsharded fp32 gradient (65,536,000 parameters a TP rank, 2 + 4 bytes)
    and the first layer's 4 experts and router gathered in bf16 beside the MLP's working set; their
    unsharded gradients wait only beside the attention's, which is smaller by more than they hold. The torch
    reference's peak is 16.57 GiB (benchmarks/memory.py), the model's 1.4 % under it."""
    job = Job.of(
        model=MIXTRAL, seq=65536, hw="h100-nvlink", gpus=64, global_batch=8, tp=2, cp=4, ep=2,
        recompute="full", framework="torchtitan", zero=3,
    )  # fmt: skip
    embedding = 32000 * H // 2
    experts = 4 * EXPERT // 2 + ROUTER  # TP-split experts, the router whole
    by = step_memory(job).by_category
    assert by.peak == "the backward's end, one stage"
    assert by.fsdp_buffers == pytest.approx(embedding * (2 + 4) + experts * 2, rel=1e-12)
    assert by.allocated_bytes == pytest.approx(16.57 * 2**30, rel=0.02)  # the reference's, measured
