"""Training plans ([Korthikanti22]): activation memory against Korthikanti et al. 2022, model states, the
backward pass, and the recommendation window."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.machines.binding import Machine
from costmodel.machines.compose import ProfileChanges, override
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import TRAINING_DEFAULTS, MachineOverrides, PlanInputs, TrainingSetup
from costmodel.plans.job import make_job
from costmodel.plans.models import load_model
from costmodel.symbolic import formulas, numeric
from costmodel.training.memory import zero_fractions
from costmodel.training.recommend import recommend, schemes_at
from tests.support import formula, memory_values, plan

f = formulas.FORMULAS


def gpt_layer(
    s: int, h: int, a: int, t: int = 1, sp: bool = False, scores: bool = True, gathered: bool = False
) -> float:
    """layer_activation_bytes for the paper's setting: MHA, 4h GeLU MLP, dropout, fp16, b = 1, N = 1; the
    column-parallel linears keep their input's shard (Megatron's), or with ``gathered`` the whole input."""
    return numeric.layer_activation_bytes(
        S=s,
        N=1,
        b=1,
        H=h,
        h=a,
        n_kv=a,
        x_rep=0,
        x_ek=0,  # the fused kernels the paper's counts assume
        k_li=2,  # 16-bit linear inputs, as the paper counts them
        d=h // a,
        F_ffn=4 * h,
        g=0,
        delta=1,
        phi=int(scores),
        sigma=int(sp),
        s_ag=int(gathered),
        t=t,
    )


# Korthikanti et al. 2022 Table 3 models at s = 2048: (hidden h, heads a).
GPT3, MT_NLG = (12288, 96), (20480, 128)


def test_table_2_no_parallelism_is_sbh_34_plus_5as_over_h() -> None:
    h, a = GPT3
    assert gpt_layer(2048, h, a) == 2048 * h * (34 + 5 * a * 2048 / h)


def test_table_2_tensor_parallel_and_sequence_parallel() -> None:
    h, a, s, t = *GPT3, 2048, 8
    assert gpt_layer(s, h, a, t=t) == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert gpt_layer(s, h, a, t=t, sp=True) == pytest.approx(s * h / t * (34 + 5 * a * s / h))
    assert gpt_layer(s, h, a, t=t, sp=True, scores=False) == pytest.approx(34 * s * h / t)  # selective
    # DTensor's TP keeps the attention's and the MLP's gathered inputs (2sbh each) whole
    assert gpt_layer(s, h, a, t=t, sp=True, gathered=True) == pytest.approx(
        s * h * (30 / t + 4 + 5 * a * s / (h * t))
    )


def test_full_recompute_keeps_2sbh() -> None:
    h = GPT3[0]
    assert numeric.layer_input_bytes(S=2048, N=1, b=1, H=h, sigma=0, t=1) == 2 * 2048 * h


@pytest.mark.parametrize(("model", "term", "saved"), [(GPT3, 80, 0.70), (MT_NLG, 64, 0.65)])
def test_selective_recompute_saves_what_the_paper_says(
    model: tuple[int, int], term: float, saved: float
) -> None:
    """§4.2: "for GPT-3 5as/h = 80 ... selective recompute saves 70 %"; 65 % for MT-NLG."""
    h, a = model
    full, selective = gpt_layer(2048, h, a), gpt_layer(2048, h, a, scores=False)
    assert full / (2048 * h) - 34 == pytest.approx(term)
    assert 1 - selective / full == pytest.approx(saved, abs=0.005)


def test_sequence_parallel_plus_selective_is_5x_less_than_tp_alone() -> None:
    """The abstract's "reduces activation memory by 5x" for GPT-3 at t = 8: 23 sbh down to 4.25 sbh."""
    h, a = GPT3
    assert gpt_layer(2048, h, a, t=8) / gpt_layer(2048, h, a, t=8, sp=True, scores=False) == pytest.approx(
        5.41, 0.01
    )


@pytest.mark.parametrize(
    ("preset", "billions"),
    [("llama3-8b", 8.030), ("llama3-70b", 70.554), ("gpt3-175b", 174.6), ("qwen3-8b", 8.191)],
)
def test_parameter_counts(preset: str, billions: float) -> None:
    m = load_model(preset)
    params = formula(
        "params",
        n_L=m.layers,
        H=m.hidden,
        d=m.head_dim,
        h=m.heads,
        n_kv=m.kv_heads,
        g=int(m.gated_mlp),
        F_ffn=m.ffn_hidden,
        e_m=1 if m.tied_embeddings else 2,
        V=m.vocab,
    )
    assert params / 1e9 == pytest.approx(billions, abs=0.05)


@pytest.mark.parametrize(
    ("stage", "bytes_per_param"), [(0, 18), (1, 6 + 12 / 64), (2, 2 + 16 / 64), (3, 18 / 64)]
)
def test_zero_stages(stage: int, bytes_per_param: float) -> None:
    """bf16 weights (2), fp32 grads (4), fp32 master + Adam (12) bytes per parameter, sharded over 64."""
    z_w, z_g, z_o = zero_fractions(stage, 64)
    megatron = {"q_w": 2, "q_c": 2, "q_g": 4, "q_m": 4, "q_o": 4}  # frameworks/megatron.yaml's copies
    per_param = formula("model_state_bytes", n_L=1, H=1, d=1, h=1, n_kv=1, g=0, F_ffn=0, e_m=0, V=0, t=1, pp=1,
                                          n_first=1, n_mid=0, n_last=1, **megatron,
                                          z_w=z_w, z_g=z_g, z_o=z_o, o_opt=0, o_par=0) / 7  # fmt: skip  # 7 parameters
    assert per_param == pytest.approx(bytes_per_param)


def test_backward_costs_2_5x_flop_and_carries_fp32_dkv() -> None:
    report = plan()
    assert report.backward.step_flops == 2.5 * report.compute.step_flops
    assert report.backward.step_recv_bytes == 3 * report.ring.step_recv_bytes  # bf16 KV + fp32 dK/dV
    assert report.backward.comm_ratio_step == pytest.approx(6 / 5 * report.ring.comm_ratio_step)
    assert report.backward.recv_bytes_per_layer == 7 * 134_217_728 + 8 * 2 * 134_217_728


def test_fwd_bwd_verdict_takes_the_worse_pass() -> None:
    both = plan(pass_="fwd+bwd")
    assert both.verdict.comm_ratio_step == max(both.ring.comm_ratio_step, both.backward.comm_ratio_step)


@pytest.mark.parametrize("pp", [1, 4])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_n_min_memory_is_where_memory_just_fits(pp: int, recompute: str) -> None:
    """At N = N_min the most loaded stage's memory equals the usable HBM, to rounding. Under a pipeline the
    closed form counts the states of the stage holding the most parameters beside the activations of the
    stage keeping the most, so it errs by under 1e-6 on the side of fitting."""
    setup = TrainingSetup(gpus=64 * pp, pp=pp, recompute=recompute)
    million = PlanInputs(seq=1 << 20, n=1, causal=True, model="llama3-8b")
    values = memory_values(million, setup, 1, load_model("llama3-8b"))
    n_min = numeric.n_min_memory(**{a: values[a] for a in numeric.ARGS["n_min_memory"]})
    assert n_min > 2  # the ring's buffers exist from N = 2 on
    at = values | {"N": n_min}
    at["M_cpb"] = numeric.ring_buffer_bytes(**{a: at[a] for a in numeric.ARGS["ring_buffer_bytes"]})
    total = numeric.training_memory_bytes(**{a: at[a] for a in numeric.ARGS["training_memory_bytes"]})
    if pp == 1:
        assert total == pytest.approx(values["M_dev"], rel=1e-12)
    else:
        assert values["M_dev"] * (1 - 1e-6) <= total <= values["M_dev"] * (1 + 1e-12)


ARTICLE_QUESTION = PlanInputs(seq=131_072, n=1, model="llama3-8b", **TRAINING_DEFAULTS)


def advise(hw: str, **setup: object):  # noqa: ANN201
    """[A-RingCost]'s closing question (an 8-way CP for a 128K training run?): its window on ``hw``, its CP
    ranks placed as the profile's single-layer plans place them (the -ib profiles: one a node, TP the rest)."""
    placed = MachineOverrides(cp_ranks_per_node=load_profile(hw).ranks_per_node)
    inputs = ARTICLE_QUESTION.model_copy(update={"hw": hw})
    return recommend(make_job(inputs, TrainingSetup(gpus=64, **setup), overrides=placed))


def test_the_articles_question_on_a100_nvlink_with_full_recompute() -> None:
    """'An 8-way CP for a 128K training run?' On one A100 NVLink node: yes, N = 8 green."""
    rec = advise("a100-nvlink", recompute="full").recommendation
    assert (rec.n_min_memory, rec.n_recommended, rec.scheme, rec.layout, rec.dp) == (
        8,
        8,
        "ring",
        "zigzag",
        8,
    )
    # window ends at 16: USP 8x2 is amber there (12.4 %), while at 32 every scheme has a ring across
    # HDR 200 Gb/s [DGX-A100] and turns red (92 %)
    assert rec.n_max_comm == 16 and "smallest CP degree whose memory fits" in rec.reason


def test_the_articles_question_on_h100_ib_says_which_side_fails_and_what_fixes_it() -> None:
    """Each CP rank on its own node, as the article's inter-node example places them. At N = 2 the loss's
    logits of 64K tokens (6 bytes each of 128K vocabulary entries: 50 GB) outgrow the device whatever ZeRO
    shards; TP 2 splits the vocabulary and opens the window."""
    rec = advise("h100-ib", recompute="full").recommendation
    assert rec.n_recommended is None and rec.n_min_memory == 8 and rec.n_max_comm == 2
    assert rec.reason.startswith("Communication fails: memory needs N >= 8")
    assert any(fix.startswith("TP 2 (--tp 2 --pp 1): N = 2 then works") for fix in rec.fixes)
    assert not any(fix.startswith("ZeRO-3") for fix in rec.fixes)
    assert advise("h100-ib", recompute="full", tp=2).recommendation.n_recommended == 2


def test_a_chunked_loss_is_a_fix_where_the_logits_tip_memory() -> None:
    """On H100 NVLink with 15 % headroom the ring allows N <= 8 and memory needs N = 16 (8.1 by the formula):
    at N = 8 Megatron's vocab-parallel loss holds 16K tokens x 128K vocabulary x 6 bytes (12.6 GB), at N = 4
    twice that; over chunks it holds a fraction of it, and N = 4 fits."""
    rec = advise("h100-nvlink", recompute="full", memory_headroom=0.15).recommendation
    assert (rec.n_min_memory, rec.n_max_comm, rec.n_recommended) == (16, 8, None)
    assert rec.n_min_memory_real == pytest.approx(8.11, abs=0.01)
    assert "a chunked loss (--loss chunked --tp 1 --pp 1): N = 4 then works, at no cost in time" in rec.fixes


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_a_fix_states_its_price_in_time(recompute: str) -> None:
    """Full recompute runs each layer's forward once more: at most a third more work on a forward and a
    backward of twice its cost, so at most a quarter fewer tokens a second; more than nothing, and less from
    selective recompute, which already recomputes part of it."""
    fix = next(
        f for f in advise("h100-nvlink", recompute=recompute).recommendation.fixes if "--recompute full" in f
    )
    price = re.fullmatch(
        r".*: N = 8 then works, (\d+)% fewer tokens a second per GPU than N = 8 without it", fix
    )
    assert price is not None, fix
    assert 0 < int(price.group(1)) <= 25
    if recompute == "selective":
        none = next(
            f for f in advise("h100-nvlink", recompute="none").recommendation.fixes if "--recompute full" in f
        )
        assert int(price.group(1)) < int(re.search(r"(\d+)% fewer", none).group(1))


def test_all_to_all_opens_the_window_when_the_plain_ring_turns_red() -> None:
    """At N = 32 the plain ring is red and an all-to-all scheme amber: N = 32 is usable. The pick is still the
    scheme that exposes the least (the ring, overlapped), and the reason says it relies on that overlap.
    With 400 Gb/s NICs as [A-RingCost] assumes; on a DGX A100's HDR 200 Gb/s even USP is red at N = 32."""
    machine = Machine(override(load_profile("a100-nvlink"), ProfileChanges(inter_bandwidth="400Gb")))
    overrides = MachineOverrides(inter_node_bandwidth="400Gb")
    two = ARTICLE_QUESTION.model_copy(update={"batch": 2})  # two sequences a device: memory needs N = 32
    report = recommend(make_job(two, TrainingSetup(gpus=64, zero=2), overrides=overrides))
    rec = report.recommendation
    row = next(r for r in report.candidates if r.n == 32)
    assert rec.n_min_memory == rec.n_recommended == 32 and row.lowest_ratio_scheme in {"Ulysses", "USP 8x4"}
    assert row.ring_comm_ratio_step > 0.15 >= row.lowest_ratio
    assert row.exposed_comm_s <= min(s.exposed_s for s in schemes_at(two, machine, 32) if s.feasible)
    assert "relies on overlapping" in rec.reason


def test_memory_failure_names_memory() -> None:
    rec = advise("a100-nvlink", memory_headroom=0.9).recommendation
    assert rec.n_min_memory is None and rec.reason.startswith("Memory fails")


def test_tensor_parallel_moves_the_cp_ring_across_nodes() -> None:
    setup = TrainingSetup(gpus=256, tp=8, recompute="full")
    attention = setup.attention(PlanInputs(seq=131_072, n=2, heads=64, kv_heads=8))
    assert (attention.heads, attention.kv_heads) == (8, 1)


@settings(max_examples=25, deadline=None)
@given(
    seq_k=st.sampled_from([32, 64, 128, 256]),
    gpus=st.sampled_from([8, 16, 64]),
    hw=st.sampled_from(["a100-nvlink", "h100-ib", "h200-nvlink"]),
    zero=st.integers(0, 3),
    recompute=st.sampled_from(["selective", "full"]),
)
def test_window_properties(seq_k: int, gpus: int, hw: str, zero: int, recompute: str) -> None:
    """Memory falls and the plain ring's ratio rises with N; the pick lies in the window and fits."""
    inputs = PlanInputs(seq=seq_k * 1024, n=1, causal=True, model="llama3-8b")
    report = recommend(
        make_job(
            inputs.model_copy(update={"hw": hw}), TrainingSetup(gpus=gpus, zero=zero, recompute=recompute)
        )
    )
    rows = report.candidates
    assert all(a.total_bytes > b.total_bytes for a, b in zip(rows, rows[1:]))
    assert all(a.ring_comm_ratio_step <= b.ring_comm_ratio_step for a, b in zip(rows, rows[1:]))
    rec = report.recommendation
    if rec.n_recommended is not None:
        assert rec.n_min_memory <= rec.n_recommended <= rec.n_max_comm
        assert report.fit.fits and rec.dp * rec.n_recommended == gpus


def test_training_values_cover_every_fit_formula() -> None:
    values = memory_values(ARTICLE_QUESTION, TrainingSetup(gpus=64), 8, load_model("llama3-8b"))
    for name in ("model_state_bytes", "activation_bytes", "ring_buffer_bytes", "n_min_memory"):
        assert set(numeric.ARGS[name]) <= set(values), name


def test_memory_fit_reads_the_models_layer_shape_as_the_step_does() -> None:
    """Given heads and head size do not mix with the preset's: llama3-8b's 32 heads of 128 either way."""
    given = PlanInputs(seq=131_072, n=8, heads=64, kv_heads=8, head_dim=64)
    values = memory_values(given, TrainingSetup(gpus=64), 8, load_model("llama3-8b"))
    assert (values["h"], values["n_kv"], values["d"]) == (32, 8, 128)


def _advice(model: str, hw: str, gpus: int, **setup: object):  # noqa: ANN202
    inputs = PlanInputs(seq=131_072, n=1, model=model, **TRAINING_DEFAULTS)
    return recommend(make_job(inputs.model_copy(update={"hw": hw}), TrainingSetup(gpus=gpus, **setup)))


def test_one_device_is_no_context_parallelism_not_a_none_ring(cli) -> None:
    rec = _advice("llama3-70b", "h100-nvlink", 64, tp=8, zero=3, recompute="full").recommendation
    assert (rec.n_recommended, rec.scheme, rec.layout, rec.n_ulysses) == (1, "none", None, None)
    assert rec.reason.startswith("N = 1: no CP is needed") and "None" not in rec.reason
    # The searched plan at CP 1 follows the window's words: no scheme, no layout, no all-to-all degree.
    args = ["recommend", "--seq", "128k", "--model", "llama3-70b", "--gpus", "64", "--hw", "h100-nvlink"]
    args += ["--tp", "8", "--zero", "3", "--recompute", "full", "--cp", "1"]
    out = cli(*args).out
    assert "CP 1: memory fits without context parallelism" in " ".join(out.split()) and "None" not in out
    searched = cli(*args, "-f", "json").json()["recommendation"]
    assert (searched["n_recommended"], searched["scheme"], searched["layout"], searched["n_ulysses"]) == (
        1,
        "none",
        None,
        None,
    )


def test_memory_failure_says_what_would_fit_and_checks_it() -> None:
    report = _advice("llama3-70b", "h100-ib", 64)
    rec = report.recommendation
    assert rec.n_min_memory is None and rec.n_min_memory_real is None  # never a negative N
    assert "the model states alone need" in rec.reason
    combined = next(fix for fix in rec.fixes if "together" in fix)
    assert "then works" in combined
    # a hint names only what changes, and the window's TP and PP it holds (llama3-70b on 64 H100s: TP 1)
    flags = re.search(r"\((--[^)]*)\)", combined).group(1).split()
    assert dict(zip(flags[::2], flags[1::2])) == {
        "--recompute": "full",
        "--zero": "3",
        "--tp": "8",
        "--pp": "1",
    }
    given = _advice("llama3-70b", "h100-ib", 64, recompute="full").recommendation.fixes
    assert all("--recompute" not in fix for fix in given)
    # the fix is real: that setup does recommend a CP degree
    assert _advice("llama3-70b", "h100-ib", 64, recompute="full", zero=3, tp=8).recommendation.n_recommended


def test_memory_beyond_the_largest_usable_n_gets_its_sentence(cli) -> None:
    out = cli("recommend", "--seq", "1M", "--model", "llama3-8b", "--gpus", "8", "--hw", "a100-nvlink").out
    assert "beyond the largest usable N = 8" in out and "memory fits from N = " in out


def test_ring_buffers_exist_only_with_a_ring() -> None:
    report = _advice("llama3-8b", "a100-nvlink", 64, recompute="full")
    buffers = {row.n: row for row in report.candidates}
    values = memory_values(ARTICLE_QUESTION, TrainingSetup(gpus=64), 1, load_model("llama3-8b"))
    assert numeric.ring_buffer_bytes(**{a: values[a] for a in numeric.ARGS["ring_buffer_bytes"]}) == 0
    two = values | {"N": 2.0}
    assert numeric.ring_buffer_bytes(**{a: two[a] for a in numeric.ARGS["ring_buffer_bytes"]}) > 0
    assert buffers[1].total_bytes > buffers[2].total_bytes


def test_pipeline_memory_is_the_most_loaded_stage() -> None:
    """At pp = 4 the first stage holds 4 micro-batches of 8 layers (32 layers' activations); the last stage
    holds the output layer's states; the fit takes the larger of the two, not the average."""
    model = load_model("llama3-8b")
    one = memory_values(ARTICLE_QUESTION, TrainingSetup(gpus=64, pp=1, recompute="full"), 8, model)
    four = memory_values(ARTICLE_QUESTION, TrainingSetup(gpus=256, pp=4, recompute="full"), 8, model)

    def get(name: str, values: dict) -> float:
        return float(getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]}))

    layer = 4096 * (128 * (2 * 32 + 2 * 8) + 3 * 14336) + 2 * 4096
    assert get("stage_device_params", four) == 32 / 4 * layer + 128256 * 4096 + 4096
    assert get("stage_device_params", one) == get("params", one)  # at TP 1
    # Full recompute keeps each layer's input. The first stage holds 4 micro-batches of 8 layers (32 inputs)
    # and, in the backward, a recomputed layer and its widest gradients; the last holds 8 inputs, the final
    # hidden state and the loss's logits (6 bytes each), which at 16K tokens per rank are the larger.
    tokens = 131_072 / 8
    per_layer_input = tokens * 2 * 4096
    working = get("layer_backward_working_bytes", four)
    assert working == pytest.approx(
        get("layer_activation_bytes", four) + tokens * (3 * 14336 + 4096) * 2, rel=1e-12
    )
    loss = tokens * 128_256 * 6
    last = 8 * per_layer_input + tokens * 2 * 4096 + loss
    assert get("activation_bytes", four) == pytest.approx(
        max(32 * per_layer_input + working, last), rel=1e-12
    )
    assert get("activation_bytes", four) == pytest.approx(last, rel=1e-12)
    assert get("activation_bytes", one) == pytest.approx(32 * per_layer_input + tokens * 2 * 4096 + loss)


def test_recompute_none_keeps_scores_only_without_flash_attention() -> None:
    """Korthikanti's no-SP, no-recompute case: sbh(10 + 24/t + 5as/(ht)) with t = 8, MHA GPT-3 [Korthikanti22 §4]."""
    model = load_model("gpt3-175b")
    shape = PlanInputs(
        seq=2048,
        n=1,
        model="gpt3-175b",
        heads=model.heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        block=1,
    )

    def layer(**setup: object) -> float:
        values = memory_values(shape, TrainingSetup(gpus=8, tp=8, **setup), 1, model)
        return float(
            numeric.layer_activation_bytes(**{a: values[a] for a in numeric.ARGS["layer_activation_bytes"]})
        )

    s, b, h, a, t = 2048, 1, model.hidden, model.heads, 8
    korthikanti = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert layer(recompute="none", attention_kernel="unfused", sequence_parallel=False) == pytest.approx(
        korthikanti, rel=1e-12
    )
    assert layer(recompute="selective", attention_kernel="unfused", sequence_parallel=False) == pytest.approx(
        s * b * h * (10 + 24 / t), rel=1e-12
    )
    assert layer(recompute="none") == layer(recompute="selective")  # flash attention keeps no scores
    assert layer(recompute="none", sequence_parallel=True) == pytest.approx(s * b * h * 34 / t, rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_unfused_attention_holds_its_scores_in_the_backward_whether_kept_or_made_again(
    recompute: str,
) -> None:
    """Megatron's unfused core attention makes 5 b h L^2 / t bytes of scores, softmax and dropout mask
    [Korthikanti22 §4.1]: kept for the backward without recompute, made again by it with recompute. Either way
    the layer's backward holds them, so a 1M-token sequence on one device is no plan: 220 TB, not 45 GB."""
    model = load_model("llama3-8b")

    def get(name: str, values: dict) -> float:
        return float(getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]}))

    held = {}
    for kernel in ("flash", "unfused"):
        values = memory_values(
            ARTICLE_QUESTION, TrainingSetup(gpus=8, recompute=recompute, attention_kernel=kernel), 8, model
        )
        held[kernel] = (
            get("layer_backward_working_bytes", values)
            + get("layer_activation_bytes", values) * values["phi"]
        )
    tokens = 131_072 / 8
    scores = 5 * 32 * tokens**2
    if recompute == "none":  # kept in the layer's activations, beside the rest unfused attention keeps
        assert held["unfused"] - held["flash"] >= scores
    else:  # made again in the backward: exactly the scores more
        assert held["unfused"] - held["flash"] == pytest.approx(scores, rel=1e-9)
