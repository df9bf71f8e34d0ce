"""A layer's norms, rotary embedding and MLP activation as the framework runs them: fused kernels (Transformer
Engine, Liger, torch.compile) or eager torch ops, whose fp32 upcasts and one-kernel-an-op passes move about
three times the bytes (layer_elementwise_bytes, x_eager)."""

from __future__ import annotations

import pytest

from costmodel.frameworks.profiles import load_framework
from costmodel.plans.job import Job
from costmodel.plans.models import load_model
from costmodel.training.step import evaluate_step
from costmodel.training.validation import ROWS, predict

JOB = {
    "model": "llama3-8b",
    "seq": 8192,
    "hw": "h100-nvlink",
    "gpus": 8,
    "global_batch": 16,
    "micro_batch": 2,
}


def _elementwise_s(**knobs: object) -> float:
    report = evaluate_step(Job.of(**JOB, **knobs)).model_dump(by_alias=True)
    return report["step"]["breakdown"]["elementwise_s"]


def _elements(eager: int) -> int:
    """Elements of p bytes one token of one layer moves forward, TP 1, counted op by op: two norms (fused:
    read, write; eager RMSNorm: upcast 3, square 4, mean 2, scale 4, cast back 3, weight 2) and two residual
    adds (3 each), rotary on Q and K (fused 2; eager: upcast 3, complex product 4, cast back 3), SwiGLU
    (fused: two read, one written; eager: silu 2, product 3)."""
    m = load_model("llama3-8b")
    norms = 2 * (18 if eager else 2) * m.hidden
    rotary = (10 if eager else 2) * (m.heads + m.kv_heads) * m.head_dim
    swiglu = (5 if eager else 3) * m.ffn_hidden
    return norms + 2 * 3 * m.hidden + rotary + swiglu


def test_eager_ops_move_what_each_op_reads_and_writes() -> None:
    fused = _elementwise_s(framework="megatron")
    eager = _elementwise_s(framework="megatron", elementwise="eager")
    assert eager / fused == pytest.approx(_elements(1) / _elements(0), rel=1e-9)
    assert eager / fused == pytest.approx(3.13, abs=0.01)  # Llama 3 8B: 3.1x the bytes


@pytest.mark.parametrize(
    ("framework", "runs"),
    [("megatron", "fused"), ("torchtitan", "eager"), ("hf-trainer", "eager"), ("deepspeed", "eager")],
)
def test_each_framework_states_how_its_model_code_runs(framework: str, runs: str) -> None:
    assert load_framework(framework).time.elementwise == runs
    other = "fused" if runs == "eager" else "eager"
    default, chosen = (
        _elementwise_s(framework=framework),
        _elementwise_s(framework=framework, elementwise=other),
    )
    assert (chosen > default) == (other == "eager")


def test_the_flag_is_refused_outside_its_choices(cli) -> None:  # noqa: ANN001
    result = cli(
        "step",
        "--model",
        "llama3-8b",
        "--seq",
        "8k",
        "--n",
        "8",
        "--global-batch",
        "8",
        "--elementwise",
        "jit",
    )
    assert result.code == 2 and "--elementwise" in result.err and result.err.count("\n") == 1


@pytest.mark.parametrize(
    ("eager", "compiled"),
    [("titan-h100-8b-8", "titan-h100-8b-8-compile"), ("titan-h100-8b-128", "titan-h100-8b-128-compile")],
)
def test_torch_compile_gains_what_torchtitan_measured(eager: str, compiled: str) -> None:
    """torchtitan's published pairs with and without torch.compile (same job, late-2024 H100s of 96 GB at
    2.4 TB/s and the clock the rows state): the compiled run is 15.7 % and 16.2 % faster. Fusing the norms,
    rotary and activation alone predicts 14.8 % and 14.9 %, nothing fitted: the fused elementwise passes account
    for all but 0.9 and 1.3 points of the measured gain. The model gives compile nothing else (its fewer
    launches are not modelled), so it reads the gain at most as measured, and within 1.5 points of it."""
    rows = {row.key: row for row in ROWS}
    measured = rows[compiled].published / rows[eager].published
    predicted = predict(rows[compiled]) / predict(rows[eager])
    assert measured - 0.015 <= predicted <= measured


def test_the_step_table_says_when_the_elementwise_ops_run_eagerly(cli) -> None:  # noqa: ANN001
    job = ("step", "--model", "llama3-8b", "--seq", "8k", "--n", "8", "--global-batch", "8")
    eager = cli(*job, "--framework", "torchtitan")
    fused = cli(*job, "--framework", "torchtitan", "--elementwise", "fused")
    assert eager.code == fused.code == 0
    assert "elementwise (eager torch ops)" in eager.out and "elementwise (memory-bound)" in fused.out
