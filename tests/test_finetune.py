"""Fine-tuning with LoRA: a frozen base keeps no gradients or optimizer states and runs no weight-gradient
multiplies; the adapters' own are counted by hand here ([LoRA §4]: a pair of in x r and r x out matrices
beside every linear layer)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.plans.bind import call, layer_shape
from costmodel.plans.inputs import LORA_MATRICES
from costmodel.plans.job import Job
from costmodel.plans.models import builtin_models, load_model
from costmodel.training.memory import TARGET_SYMBOLS
from costmodel.training.step import bind, evaluate_step

JOB = {"model": "llama3-8b", "seq": 32768, "cp": 2, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}


def adapters_by_hand(
    name: str, rank: int, fused: bool = False, targets: frozenset[str] = frozenset(LORA_MATRICES)
) -> int:
    """Q (H -> h·d), K and V (H -> n_kv·d), O (h·d -> H), and the MLP's gate (if gated), up and down matrices,
    those of ``targets``; fused, one adapter on Q/K/V together and one on gate/up together (Megatron Core's
    performant LoRA)."""
    m = load_model(name)
    qkv = [(m.hidden, m.heads * m.head_dim, "q")]
    qkv += [(m.hidden, m.kv_heads * m.head_dim, "k"), (m.hidden, m.kv_heads * m.head_dim, "v")]
    up = [(m.hidden, m.ffn_hidden, "up")] + ([(m.hidden, m.ffn_hidden, "gate")] if m.gated_mlp else [])
    if fused:
        qkv = [(m.hidden, sum(out for _, out, t in qkv if t in targets), "q")] if targets & {"q"} else []
        up = [(m.hidden, sum(out for _, out, t in up if t in targets), "up")] if targets & {"up"} else []
    linears = qkv + [(m.heads * m.head_dim, m.hidden, "o")] + up + [(m.ffn_hidden, m.hidden, "down")]
    return m.layers * sum(rank * (inner + outer) for inner, outer, t in linears if t in targets)


def _targets(fused: bool) -> st.SearchStrategy[frozenset[str]]:
    """Target sets a framework can run: any matrices one by one; fused, Q/K/V and gate/up whole."""
    if not fused:
        return st.frozensets(st.sampled_from(LORA_MATRICES), min_size=1)
    groups = [("q", "k", "v"), ("o",), ("gate", "up"), ("down",)]
    return st.sets(st.sampled_from(groups), min_size=1).map(
        lambda g: frozenset(m for group in g for m in group)
    )


def _adapted(targets: frozenset[str]) -> dict[str, int]:
    return {symbol: int(m in targets) for m, symbol in TARGET_SYMBOLS.items()}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([m for m in builtin_models() if not load_model(m).experts]),
    st.integers(1, 9999),
    st.booleans().flatmap(lambda fused: st.tuples(st.just(fused), _targets(fused))),
)
def test_adapter_parameters_are_the_pairs_beside_every_adapted_matrix(
    name: str, rank: int, layout: tuple[bool, frozenset[str]]
) -> None:
    fused, targets = layout
    values = {
        **layer_shape(load_model(name)),
        "r_lo": rank,
        "f_b": 0,
        "x_lf": float(fused),
        **_adapted(targets),
    }
    assert call("adapter_params", values) == adapters_by_hand(name, rank, fused, targets)
    assert call("trainable_share", values) == pytest.approx(
        adapters_by_hand(name, rank, fused, targets) / call("params", values)
    )


def test_named_targets_adapt_only_those_matrices(cli) -> None:
    """PEFT's default for Llama adapts q_proj and v_proj: each adapter reads the layer's input once, two reads
    instead of five, and writes 4,096 and 1,024 wide. Megatron Core adapting linear_qkv alone: Llama 3 8B at
    rank 16 has 16 x (4,096 + 6,144) x 32 layers = 5,242,880 adapter parameters."""
    job = {**JOB, "framework": "hf-trainer", "recompute": "none"}
    every, qv = (bind(Job.of(**job, finetune=f)) for f in ("lora:16", "lora:16:q_proj,v_proj"))
    tokens = JOB["seq"] // JOB["cp"]
    assert call("layer_lora_fwd_bytes", qv) == pytest.approx(2 * tokens * (2 * 4096 + 6 * (4096 + 1024)))
    assert call("layer_lora_fwd_bytes", qv) < call("layer_lora_fwd_bytes", every)
    assert Job.of(**job, finetune="lora:q,v").setup.lora_targets == {"q", "v"}  # the rank may be left out
    assert Job.of(**job, finetune="lora:q,v").setup.lora_rank == 16
    qkv = frozenset({"q", "k", "v"})
    assert adapters_by_hand("llama3-8b", 16, fused=True, targets=qkv) == 5_242_880
    step = ["step", "--model", "llama3-8b", "--global-batch", "8", "--format", "json"]
    result = cli(*step, "--finetune", "lora:16:linear_qkv")
    assert result.code == 0, result.err
    full = json.loads(cli(*step).out)["memory"]["by_category"]["gradients"]
    adapted = json.loads(result.out)["memory"]["by_category"]["gradients"]
    assert adapted == pytest.approx(full * 5_242_880 / 8_030_261_248, rel=1e-6)


def _step(**changes: object):  # noqa: ANN202
    return evaluate_step(Job.of(**JOB | changes))


def test_lora_keeps_gradients_and_optimizer_states_of_the_adapters_only() -> None:
    """Llama 3 8B at rank 16 under Megatron Core's fused adapters: 35,651,584 adapter parameters, 0.44 % of
    the model (41,943,040 with PEFT's one per matrix)."""
    full, lora = _step(), _step(finetune="lora")
    assert adapters_by_hand("llama3-8b", 16, fused=True) == 35_651_584
    assert adapters_by_hand("llama3-8b", 16) == 41_943_040
    share = 35_651_584 / 8_030_261_248  # Llama 3 8B's parameters
    by_full, by_lora = full.memory.by_category, lora.memory.by_category
    assert by_lora.gradients == pytest.approx(by_full.gradients * share, rel=1e-6)
    assert by_lora.optimizer == pytest.approx(by_full.optimizer * share, rel=1e-6)
    assert by_lora.weights == pytest.approx(by_full.weights * (1 + share), rel=1e-6)  # the adapters' own
    assert by_lora.activations == by_full.activations  # every layer's input gradient still flows
    drop = full.memory.bytes_per_device - lora.memory.bytes_per_device
    assert drop > (by_full.gradients + by_full.optimizer) * 0.99


def test_a_frozen_base_skips_the_weight_gradient_multiplies() -> None:
    """Without recompute the multiplies are forward 1, backward 2 (input and weight gradient): LoRA's are
    forward 1, backward 1, so two thirds of the time; attention, which has no weights, is unchanged."""
    jobs = {f: Job.of(**JOB | {"recompute": "none", "finetune": f}) for f in ("full", "lora")}
    v = {f: bind(job) for f, job in jobs.items()}
    fwd, bwd = (call(name, v["full"]) for name in ("layer_gemm_fwd_s", "layer_gemm_bwd_s"))
    assert call("layer_gemm_fwd_s", v["lora"]) == pytest.approx(fwd, rel=1e-12)
    assert call("layer_gemm_bwd_s", v["lora"]) == pytest.approx(bwd / 2, rel=1e-12)  # dX only
    full, lora = (dict(evaluate_step(job).step.breakdown) for job in jobs.values())
    assert lora["matmul_s"] == pytest.approx(full["matmul_s"] * (fwd + bwd / 2) / (fwd + bwd), rel=1e-9)
    assert lora["attention_s"] == pytest.approx(full["attention_s"], rel=1e-12)
    assert lora["optimizer_s"] == pytest.approx(full["optimizer_s"] * 35_651_584 / 8_030_261_248, rel=1e-6)


@pytest.mark.parametrize(
    ("framework", "inputs"),
    [("hf-trainer", 38_912), ("megatron", 26_624)],  # PEFT's adapter per matrix; Megatron Core's fused ones
)
def test_lora_adapters_move_their_bytes_beside_each_projection(framework: str, inputs: int) -> None:
    """Llama 3 8B at TP 1: with PEFT, Q, K, V, gate and up read the layer's input (4,096 wide) and O and down
    their own (4,096 and 14,336): 38,912 input elements a token; Megatron Core's one adapter on the fused
    Q/K/V and one on the fused gate/up read it twice, not five times: 26,624. The outputs are 4,096, 1,024,
    1,024, 4,096, 14,336, 14,336 and 4,096 wide, 43,008, either way. The adapters move, in bf16, (in + 6·out)
    elements a token forward and (5·in + 4·out) backward; full training moves none. The step's memory-bound
    work grows by exactly that, the forward's once more under full recompute."""
    tokens = JOB["seq"] // JOB["cp"]  # one micro-batch of one sequence, its CP rank's share
    forward, backward = 2 * (inputs + 6 * 43_008) * tokens, 2 * (5 * inputs + 4 * 43_008) * tokens
    for recompute, passes in (("none", 1), ("full", 2)):
        jobs = {
            f: Job.of(**JOB | {"recompute": recompute, "finetune": f, "framework": framework})
            for f in ("full", "lora")
        }
        v = {f: bind(job) for f, job in jobs.items()}
        assert call("layer_lora_fwd_bytes", v["lora"]) == pytest.approx(forward, rel=1e-12)
        assert call("layer_lora_bwd_bytes", v["lora"]) == pytest.approx(backward, rel=1e-12)
        assert call("layer_lora_fwd_bytes", v["full"]) == call("layer_lora_bwd_bytes", v["full"]) == 0
        hbm = v["lora"]["B_hbm"]
        added = call("layer_elementwise_s", v["lora"]) + call("layer_recompute_s", v["lora"])
        base = call("layer_elementwise_s", v["full"]) + call("layer_recompute_s", v["full"])
        assert added - base == pytest.approx((passes * forward + backward) / hbm, rel=1e-9)


def test_mfu_counts_four_flop_per_frozen_weight(cli) -> None:
    """Model FLOP per token: 6 per trained weight, 4 per frozen one (no weight gradient); MFU stays below 1."""
    args = ["step", *(f"--{k.replace('_', '-')}={v}" for k, v in JOB.items())]
    full = json.loads(cli(*args, "--format", "json").out)["step"]
    lora = json.loads(cli(*args, "--finetune", "lora", "--format", "json").out)["step"]
    tokens = JOB["global_batch"] * JOB["seq"]
    per_token_full = full["model_tflops_per_gpu"] * 1e12 * full["time_s"] * 8 / tokens
    per_token_lora = lora["model_tflops_per_gpu"] * 1e12 * lora["time_s"] * 8 / tokens
    m = load_model("llama3-8b")
    linear = 8_030_261_248 - m.vocab * m.hidden  # the input embedding is a lookup
    assert per_token_full - per_token_lora == pytest.approx(2 * linear, rel=1e-6)
    assert lora["time_s"] < full["time_s"] and 0 < lora["mfu"] < 1


def test_lora_opens_a_plan_full_training_cannot_fit(cli) -> None:
    args = [
        "recommend",
        "--model",
        "llama3-8b",
        "--seq",
        "32k",
        "--hw",
        "a100-nvlink",
        "--gpus",
        "1",
        "--format",
        "json",
    ]
    assert json.loads(cli(*args).out)["search"]["pick"] is None
    pick = json.loads(cli(*args, "--finetune", "lora").out)["search"]["pick"]
    assert pick is not None and pick["gpus"] == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["step", "--model", "llama3-8b", "--global-batch", "8", "--finetune", "lora:0"],
            "--finetune: accepted",
        ),
        (
            ["step", "--model", "llama3-8b", "--global-batch", "8", "--finetune", "qlora"],
            "--finetune: accepted",
        ),
        (
            ["step", "--model", "llama3-8b", "--global-batch", "8", "--finetune", "lora:16:wq"],
            "--finetune: accepted",
        ),
        (
            ["step", "--model", "llama3-8b", "--global-batch", "8", "--finetune", "lora:16:q,v"],
            "--finetune: megatron puts one adapter on its fused qkv projection: target q, k, v together",
        ),
        (
            [
                "step",
                "--model",
                "tests/data/hf/mixtral-8x7b.json",
                "--global-batch",
                "8",
                "--tp",
                "2",
                "--finetune",
                "lora",
            ],
            "--finetune: LoRA on a mixture of experts",
        ),
        (
            [
                "recommend",
                "--model",
                "llama3-8b",
                "--seq",
                "8k",
                "--gpus",
                "8",
                "--finetune",
                "lora",
                "--format",
                "megatron",
            ],
            "--finetune: Megatron-LM core_v0.17.1's pretrain_gpt.py and torchtitan v0.2.2 train every weight",
        ),
    ],
)
def test_what_lora_cannot_do_is_one_line(cli, args: list[str], said: str) -> None:
    result = cli(*args)
    assert result.code == 2 and result.err.startswith(f"cp-plan: error: {said}"), result.err
    assert result.err.count("\n") == 1


def test_the_search_prices_a_lora_plan_as_step_does() -> None:
    """The search's columns and the step's scalars bind the same trainable share."""
    from costmodel.training.search import Constraints, plan_as_job, search

    job = Job.of(model="llama3-8b", seq=65536, hw="h100-ib", gpus=16, finetune="lora:64")
    plans = search(job, 16, Constraints(), top=3).plans
    assert plans
    for plan in plans:
        step = evaluate_step(plan_as_job(plan, job, 16))
        assert step.step.time_s == pytest.approx(plan["step_time_s"], rel=1e-9)
        assert step.memory.bytes_per_device == pytest.approx(plan["memory_bytes"], rel=1e-9)
