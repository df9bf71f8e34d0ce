"""GQA as the model code runs it: the attention kernel reads the n_kv shared K, V heads as they are, or the code
repeats them to the query heads first (repeat_kv: torchtitan until January 2026, transformers' eager attention),
so CP gathers and rotates h heads of K and V and attention's backward holds their gradients (attention_kv_heads,
x_rep)."""

from __future__ import annotations

import pytest

from costmodel.frameworks.profiles import builtin_frameworks, load_framework
from costmodel.plans.bind import call
from costmodel.plans.job import Job
from costmodel.plans.models import load_model
from costmodel.training import step
from costmodel.training.memory import training_values

CP_JOB = {
    "model": "llama3-8b",
    "seq": 131072,
    "hw": "h100-nvlink",
    "gpus": 8,
    "cp": 8,
    "global_batch": 1,
    "recompute": "none",
    "framework": "torchtitan",
}
LLAMA3_8B = load_model("llama3-8b")
REPEAT = LLAMA3_8B.heads / LLAMA3_8B.kv_heads  # 32 query heads share 8 KV heads: 4x


def _step_values(**knobs: object) -> dict[str, object]:
    return step.bind(Job.of(**{**CP_JOB, **knobs}))


def _memory_values(**knobs: object) -> dict[str, object]:
    return training_values(Job.of(**{**CP_JOB, **knobs}))


@pytest.mark.parametrize("formula", ["cp_allgather_bytes", "cp_ring_fwd_s"])
def test_cp_moves_the_heads_attention_receives(formula: str) -> None:
    native = call(formula, _step_values(gqa="native", cp_scheme="allgather"))
    repeated = call(formula, _step_values(gqa="repeat", cp_scheme="allgather"))
    assert repeated / native == pytest.approx(REPEAT, rel=1e-12)


def test_the_ring_backward_moves_repeated_blocks_and_their_fp32_gradients() -> None:
    native, repeated = (_step_values(gqa=g, cp_scheme="ring") for g in ("native", "repeat"))
    assert call("cp_ring_bwd_s", repeated) / call("cp_ring_bwd_s", native) == pytest.approx(REPEAT, rel=1e-12)


@pytest.mark.parametrize(
    ("formula", "extra_elements"),
    [
        # K and V saved for attention's backward without recompute: 2 tensors of 2 bytes, h - n_kv more heads
        ("layer_activation_bytes", 4 * (LLAMA3_8B.heads - LLAMA3_8B.kv_heads) * LLAMA3_8B.head_dim),
        # dK and dV in flight in attention's backward, p = 2 bytes each
        ("attention_gradient_bytes", 4 * (LLAMA3_8B.heads - LLAMA3_8B.kv_heads) * LLAMA3_8B.head_dim),
    ],
)
def test_the_backward_holds_repeated_k_and_v(formula: str, extra_elements: int) -> None:
    """Per token of the device's shard (S / N), TP 1: the bytes the repeat adds, counted by hand (the CP
    buffers, which grow too, held equal)."""
    native, repeated = _memory_values(gqa="native"), _memory_values(gqa="repeat")
    repeated["M_cpb"] = native["M_cpb"]
    tokens = CP_JOB["seq"] // CP_JOB["cp"]
    assert call(formula, repeated) - call(formula, native) == pytest.approx(
        tokens * extra_elements, rel=1e-12
    )


def test_the_gathered_buffer_holds_the_repeated_heads() -> None:
    native, repeated = (_memory_values(gqa=g, cp_scheme="allgather") for g in ("native", "repeat"))
    ratio = call("allgather_buffer_bytes", repeated) / call("allgather_buffer_bytes", native)
    assert ratio == pytest.approx(REPEAT, rel=1e-12)


def test_the_copy_itself_is_memory_bound_work() -> None:
    """repeat_kv reads n_kv heads and writes h of each of K and V: 2·(h + n_kv)·d elements a token forward."""
    job = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}
    native, repeated = (step.bind(Job.of(**job, gqa=g)) for g in ("native", "repeat"))
    added = call("layer_elementwise_bytes", repeated) - call("layer_elementwise_bytes", native)
    copy = 2 * (LLAMA3_8B.heads + LLAMA3_8B.kv_heads) * LLAMA3_8B.head_dim * 2  # elements x 2 bytes
    assert added == pytest.approx(8192 * copy, rel=1e-12)


def test_a_model_whose_heads_each_have_k_and_v_repeats_nothing() -> None:
    job = {"model": "llama2-7b", "seq": 32768, "hw": "h100-nvlink", "gpus": 8, "cp": 8, "global_batch": 1}
    native, repeated = (step.evaluate_step(Job.of(**job, gqa=g)) for g in ("native", "repeat"))
    assert repeated.step.time_s == native.step.time_s
    assert repeated.memory.bytes_per_device == native.memory.bytes_per_device


@pytest.mark.parametrize("framework", builtin_frameworks())
def test_every_built_in_framework_reads_gqa_natively_today(framework: str) -> None:
    """torchtitan since ff0829c1 (January 2026), Megatron-Core through Transformer Engine, transformers'
    flash and SDPA paths: the repeat is a knob for the runs and versions that still copy."""
    assert load_framework(framework).time.gqa == "native"


def test_the_flag_is_refused_outside_its_choices(cli) -> None:  # noqa: ANN001
    result = cli(
        "step", "--model", "llama3-8b", "--seq", "8k", "--n", "8", "--global-batch", "8", "--gqa", "shared"
    )
    assert result.code == 2 and "--gqa" in result.err and result.err.count("\n") == 1


def test_the_step_table_says_when_cp_moves_repeated_heads(cli) -> None:  # noqa: ANN001
    job = ("step", "--model", "llama3-8b", "--seq", "128k", "--n", "8", "--global-batch", "1")
    repeated = cli(*job, "--framework", "torchtitan", "--gqa", "repeat")
    native = cli(*job, "--framework", "torchtitan")
    assert repeated.code == native.code == 0
    assert "exposed CP comm (K, V repeated)" in repeated.out
    assert "exposed CP comm " in native.out and "(K, V repeated)" not in native.out
