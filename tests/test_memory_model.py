"""The memory model of a training job: one model for every command, its categories summing to its total, and
the framework's knobs moving the bytes they name (the torch reference holds the bytes themselves:
tests/kernel/test_memory_model.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.plans.bind import Evaluator
from costmodel.plans.job import Job
from costmodel.plans.models import load_model
from costmodel.training.memory import memory, training_values
from costmodel.training.recommend import recommend
from costmodel.training.search import Constraints, plan_as_job, search
from costmodel.training.step import step_memory

GB = 1e9
# `pytest --hypothesis-profile=deep` (tests/conftest.py) runs the one-screen properties on 1,000 jobs each
DEEP = settings.default.max_examples >= 1000


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    flags = {
        "model": draw(st.sampled_from(["llama3-8b", "llama3-70b", "llama2-7b"])),
        "hw": draw(st.sampled_from(["h100-nvlink", "a100-nvlink", "h200-nvlink"])),
        "seq": draw(st.sampled_from([4096, 8192, 32768, 131072])),
        "tp": draw(st.sampled_from([1, 2, 8])),
        "cp": draw(st.sampled_from([1, 2, 4])),
        "pp": draw(st.sampled_from([1, 2, 4])),
        "framework": draw(
            st.sampled_from(["megatron", "torchtitan", "deepspeed", "hf-trainer", "internevo"])
        ),
        "zero": draw(st.sampled_from([0, 1, 3])),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "loss": draw(st.sampled_from(["materialized", "chunked", "fused"])),
        "micro_batch": draw(st.sampled_from([1, 2])),
    }
    flags["gpus"] = flags["tp"] * flags["cp"] * flags["pp"] * draw(st.sampled_from([1, 2, 4]))
    flags["global_batch"] = (
        flags["micro_batch"] * (flags["gpus"] // (flags["tp"] * flags["cp"] * flags["pp"])) * 4
    )
    try:
        return Job.of(**flags)
    except InputError:
        assume(False)
        raise


# A small MoE model whose first layers may be dense (DeepSeek's shape): its twins bind each stage's own parts.
SMALL_MOE = load_model("llama2-7b").model_copy(
    update={"name": "small-moe", "experts": 8, "experts_per_token": 2, "ffn_hidden": 2048, "layers": 8}
)


@st.composite
def moe_jobs(draw: st.DrawFn) -> Job:
    dense = draw(st.sampled_from([0, 1, 3]))
    model = SMALL_MOE.model_copy(update={"dense_layers": dense, "dense_ffn": 11008 if dense else None})
    flags = {
        "seq": draw(st.sampled_from([4096, 32768])),
        "hw": "h100-nvlink",
        "tp": draw(st.sampled_from([1, 2])),
        "cp": draw(st.sampled_from([1, 2])),
        "pp": draw(st.sampled_from([1, 2, 4])),
        "ep": draw(st.sampled_from([1, 2, 4])),
        "framework": draw(st.sampled_from(["megatron", "torchtitan", "deepspeed", "internevo"])),
        "zero": draw(st.sampled_from([0, 1, 3])),
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
    }
    flags["gpus"] = flags["tp"] * flags["cp"] * flags["pp"] * 4
    flags["global_batch"] = 16
    try:
        return Job.of(**flags, _model=model)
    except InputError:
        assume(False)
        raise


@settings(max_examples=1000 if DEEP else 100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(jobs(), moe_jobs()))
def test_the_categories_sum_to_the_formulas_total(job: Job) -> None:
    """Every byte at the peak is in one category: their sum is allocated_memory_bytes (each stage's own
    moment, the largest), the allocator's and the runtime's bring it to training_memory_bytes. An MoE model's
    stages bind their own dense part, experts and activations (the dense layers' at their width) in the
    categories and in the formula alike; no stage's states exceed the states reported."""
    ev = Evaluator(training_values(job))
    by = step_memory(job).by_category
    assert sum(by.tensors().values()) == pytest.approx(by.allocated_bytes, rel=1e-12)
    assert by.allocated_bytes == pytest.approx(float(memory(ev, "allocated_memory_bytes")), rel=1e-9)
    assert by.reserved_bytes == pytest.approx(by.allocated_bytes + by.allocator, rel=1e-12)
    assert step_memory(job).bytes_per_device == pytest.approx(by.reserved_bytes + by.runtime, rel=1e-9)
    assert all(v >= 0 for v in (*by.tensors().values(), by.allocator, by.runtime))
    assert by.weights + by.gradients + by.optimizer <= float(memory(ev, "model_state_bytes")) * (1 + 1e-12)


@settings(max_examples=1000 if DEEP else 25, deadline=None, suppress_health_check=list(HealthCheck))
@given(jobs())
def test_one_memory_model_for_step_recommend_and_the_search(job: Job) -> None:
    """The step's memory is the recommendation's at the job's CP degree and the search's for the same plan,
    and the three agree on whether it fits."""
    step = step_memory(job)
    window = recommend(job.training().replace(cp=1), suggest=False)
    row = next(r for r in window.candidates if r.n == job.cp)
    assert row.total_bytes == pytest.approx(step.bytes_per_device, rel=1e-9) and row.fits == step.fits
    fixed = Constraints(
        tp=job.tp,
        cp=job.cp,
        pp=job.pp,
        vpp=1,
        micro_batch=job.step.micro_batch,
        recompute=job.setup.recompute,
    )
    plans = [
        p
        for p in search(
            job.replace(cp=1, tp=1, pp=1, global_batch=None), job.step.global_batch, fixed, top=None
        ).plans
        if p["cp_scheme"] in ("none", job.step.cp_scheme) and p["gpus"] == job.gpus and p["ep"] == 1
    ]
    for plan in plans:  # every plan the search kept fits, at the step's own figure
        at = step_memory(plan_as_job(plan, job, job.step.global_batch))
        assert plan["memory_bytes"] == pytest.approx(at.bytes_per_device, rel=1e-9) and at.fits


def test_the_loss_chunk_and_the_optimizers_dtypes_move_what_they_name() -> None:
    """Llama 3 8B at 32K on 8 H100s under FSDP (torchtitan): a chunked loss holds 4,096 tokens' logits, not
    32,768's (12 bytes each of 128,256); bf16 moments halve the optimizer's 8 bytes a parameter. torchtitan's
    eager final RMSNorm keeps its fp32 upcast (4 bytes a hidden element) beside either."""
    flags = {"model": "llama3-8b", "seq": 32768, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}
    flags |= {"framework": "torchtitan", "zero": 3, "recompute": "full"}
    plain = step_memory(Job.of(**flags)).by_category
    upcast = 32768 * 4 * 4096
    assert plain.loss == pytest.approx(32768 * 128256 * 12 + upcast, rel=1e-12)
    assert plain.peak.startswith("the loss")
    chunked = Evaluator(training_values(Job.of(**flags, loss="chunked")))("loss_working_bytes")
    assert chunked == pytest.approx(4096 * 128256 * 12 + upcast, rel=1e-12)
    fused = Evaluator(training_values(Job.of(**flags, loss="chunked", elementwise="fused")))
    assert fused("loss_working_bytes") == pytest.approx(4096 * 128256 * 12, rel=1e-12)
    params = 8_030_261_248
    assert plain.optimizer == pytest.approx(params * 8 / 8, rel=1e-12)  # two fp32 moments, over 8 ranks
    half = step_memory(Job.of(**flags, optimizer_dtype="bf16")).by_category
    assert half.optimizer == pytest.approx(params * 4 / 8, rel=1e-12)
    assert plain.weights == pytest.approx(params * 4 / 8, rel=1e-12)  # FSDP2's fp32 shards are the master


def test_megatron_keeps_a_master_copy_and_its_gradients_between_steps() -> None:
    """ZeRO-1 over 8 ranks: bf16 weights and fp32 main gradients whole, fp32 master and moments a shard each;
    without the master copy (--master-weights none) the optimizer keeps the moments only."""
    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}
    params = 8_030_261_248
    by = step_memory(Job.of(**flags)).by_category
    assert (by.weights, by.gradients, by.optimizer) == pytest.approx(
        (params * 2, params * 4, params * 12 / 8), rel=1e-12
    )
    bare = step_memory(Job.of(**flags, master_weights="none")).by_category
    assert bare.optimizer == pytest.approx(params * 8 / 8, rel=1e-12)


def test_internevos_peak_is_its_optimizer_step() -> None:
    """InternEvo's 7B memory tests at 2K tokens (the states most of the peak): under FSDP over 4 ranks the step
    holds bf16 weights and gradients, the fp32 master and moments (16 bytes a parameter, a shard each) and the
    gradients cast to fp32 and foreach AdamW's square root (8 more); its hybrid ZeRO on one rank has dropped
    the bf16 gradients once cast (22 bytes). Megatron's fused step allocates nothing: its peak stays in the
    backward."""
    flags = {"model": "llama2-7b", "seq": 2048, "hw": "a800-nvlink", "recompute": "full"}
    params = 6_738_415_616
    fsdp = step_memory(Job.of(**flags, gpus=4, global_batch=4, framework="internevo", zero=3)).by_category
    assert fsdp.peak == "the optimizer step, one stage"
    assert (fsdp.weights, fsdp.gradients, fsdp.optimizer, fsdp.working) == pytest.approx(
        (params * 2 / 4, params * 2 / 4, params * 12 / 4, params * 8 / 4), rel=1e-12
    )
    assert fsdp.activations == fsdp.loss == fsdp.fsdp_buffers == 0
    hybrid = step_memory(Job.of(**flags, gpus=1, global_batch=1, framework="internevo", zero=1)).by_category
    assert hybrid.peak == "the optimizer step, one stage"
    assert hybrid.allocated_bytes == pytest.approx(params * 22, rel=1e-12) and hybrid.gradients == 0
    fused = step_memory(Job.of(**flags, gpus=1, global_batch=1, zero=1)).by_category
    assert not fused.peak.startswith("the optimizer step")


def test_a_framework_without_context_parallelism_refuses_it() -> None:
    """InternEvo's profiled release runs no CP: a job and a search asking for it get one line naming --cp."""
    flags = {"model": "llama2-7b", "seq": 8192, "hw": "a800-nvlink", "gpus": 8, "global_batch": 8}
    with pytest.raises(InputError, match="--cp: 2: InternEvo .* runs no context parallelism; accepted: 1"):
        Job.of(**flags, cp=2, framework="internevo")
    job = Job.of(**flags, framework="internevo")
    with pytest.raises(InputError, match="--cp: 2: InternEvo .* runs no context parallelism; accepted: 1"):
        search(job, 8, Constraints(cp=2))
    assert {plan["cp"] for plan in search(job, 8, Constraints()).plans} == {1}


def test_flash_attns_cross_entropy_holds_the_bf16_logits_and_the_heads_gradients() -> None:
    """Llama 3 8B, 8K tokens on one device of TP 1: flash-attn's cross-entropy keeps no fp32 copy; its
    backward writes the logits' gradient into their 2 bytes, beside the head's input gradient (2 bytes of
    4,096 a token) and its bf16 weight gradient (128,256 x 4,096 x 2): Megatron-Core's keeps 6 a logit."""
    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}
    tokens, vocab, hidden = 8192, 128_256, 4096
    flash = Evaluator(training_values(Job.of(**flags, cross_entropy="flash")))("loss_working_bytes")
    assert flash == pytest.approx(tokens * vocab * 2 + tokens * 2 * hidden + vocab * hidden * 2, rel=1e-12)
    megatron = Evaluator(training_values(Job.of(**flags)))("loss_working_bytes")
    assert megatron == pytest.approx(tokens * vocab * 6, rel=1e-12)


def test_every_memory_knob_of_a_profile_has_a_flag() -> None:
    """A job changes any knob of its framework's memory policy with a flag (what it logs aside, whether it
    keeps its gradients as it reduces them and what its FP8 linears keep of their inputs: facts about its
    figures and its code, not a job's choices), each to a value none of the built-in profiles has. The ZeRO
    stage is the job's own flag (--zero), which the profile only fills in where the job names none."""
    from costmodel.frameworks.profiles import MemoryPolicy
    from costmodel.plans.job import MEMORY_KNOBS

    facts = {"reports", "gradients_reduced_as_kept", "fp8_linear_inputs"}
    assert set(MEMORY_KNOBS.values()) == set(MemoryPolicy.model_fields) - facts - {"zero"}
    changed = {
        "loss": "chunked",
        "master_weights": "bf16",
        "grad_dtype": "bf16",
        "optimizer_dtype": "bf16",
        "optimizer_kernel": "foreach",
        "weights_dtype": "fp32",
        "compute_dtype": "fp32",
        "gradients_persist": False,
        "cross_entropy": "flash",
        "loss_chunk_tokens": 1024,
        "selective_recompute": "ops",
        "tp_inputs": "gathered",
        "fsdp_prefetch": 3,
        "reshard_after_forward": "never",
        "runtime_bytes": 1.5e9,
        "allocator_reserve": 0.4,
    }
    assert set(changed) == set(MEMORY_KNOBS)
    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}
    kept = Job.of(**flags, zero=3, **changed).framework.memory  # ZeRO-3 reads the FSDP knobs
    assert {key: getattr(kept, key) for name, key in MEMORY_KNOBS.items()} == {
        MEMORY_KNOBS[name]: value for name, value in changed.items()
    }
    with pytest.raises(InputError, match="--fsdp-prefetch"):
        Job.of(**flags, fsdp_prefetch=65)


def test_dtensor_tp_keeps_the_gathered_inputs() -> None:
    """Under sequence parallel, torch's DTensor TP keeps the all-gathered input of the attention's and the
    MLP's column-parallel linears (2H bytes a token each, whole), where Megatron-Core keeps their shard: a
    layer's activations differ by 4·H·(1 - 1/t) bytes a token of the micro-batch, to 1e-12."""
    from costmodel.plans.bind import Evaluator
    from costmodel.training.memory import training_values

    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "tp": 4, "global_batch": 8}
    layer = {
        kind: float(Evaluator(training_values(Job.of(**flags, tp_inputs=kind)))("layer_activation_bytes"))
        for kind in ("sharded", "gathered")
    }
    tokens, hidden = 8192, 4096
    assert layer["gathered"] - layer["sharded"] == pytest.approx(4 * hidden * (1 - 1 / 4) * tokens, rel=1e-12)
    assert Job.of(**flags, framework="torchtitan").framework.memory.tp_inputs == "gathered"
    assert Job.of(**flags).framework.memory.tp_inputs == "sharded"


def test_a_framework_profile_from_a_file(tmp_path) -> None:
    """A user's profile is a YAML file like the built-in ones; a bad one is one line naming the field."""
    from costmodel.core.resources import data_dir

    text = (data_dir("frameworks") / "megatron.yaml").read_text(encoding="utf-8")
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        text.replace("name: megatron", "name: mine").replace(
            "cross_entropy: megatron", "cross_entropy: torch"
        )
    )
    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}
    theirs = step_memory(Job.of(**flags)).by_category.loss
    assert step_memory(Job.of(**flags, framework=str(mine))).by_category.loss == pytest.approx(2 * theirs)
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("fragmentation: 0.22", "fragmentation: lots"))
    with pytest.raises(InputError, match=r"--framework.*fragmentation"):
        Job.of(**flags, framework=str(broken))


def test_a_scheme_the_framework_does_not_run_is_refused() -> None:
    flags = {"model": "llama3-8b", "seq": 32768, "hw": "h100-nvlink", "gpus": 8, "cp": 4, "global_batch": 8}
    with pytest.raises(InputError, match="--cp-scheme: ulysses: torchtitan"):
        Job.of(**flags, framework="torchtitan", cp_scheme="ulysses")


def test_tensor_parallelism_leaves_the_norms_whole_on_every_rank() -> None:
    """Llama 3 8B at TP 8 under Megatron's ZeRO-1: a rank keeps 1/8 of the projections, the MLP and the
    vocab-parallel embeddings, and the 65 norms (two a layer and the final one, 4,096 each) whole."""
    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "tp": 8, "global_batch": 8}
    params, norms = 8_030_261_248, (32 * 2 + 1) * 4096
    by = step_memory(Job.of(**flags)).by_category
    assert by.weights == pytest.approx(((params - norms) / 8 + norms) * 2, rel=1e-12)
    assert by.gradients == pytest.approx(((params - norms) / 8 + norms) * 4, rel=1e-12)


def test_fsdp2_holds_the_last_reduce_scatters_input_through_the_next_backward() -> None:
    """Llama 3 8B under FSDP (8 ranks, fused loss, full recompute): the peak is in the backward of the last
    layer, where FSDP holds that layer gathered (bf16), the next one prefetched and the output layer's
    unsharded fp32 gradients as the input of its reduce-scatter, kept until the next one is issued; at the
    loss it holds the output layer gathered, and no gradient yet. The torch reference holds the same, 2,836
    MiB."""
    job = Job.of(
        model="llama3-8b", seq=16384, hw="h100-nvlink", gpus=8, global_batch=8,
        recompute="full", framework="hf-trainer", zero=3, loss="fused",
    )  # fmt: skip
    head = 128256 * 4096
    layer = 4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    by = step_memory(job).by_category
    assert by.peak == "the backward, one stage"
    assert by.fsdp_buffers == pytest.approx(2 * layer * 2 + head * 4, rel=1e-12)
    assert (by.fsdp_buffers / 2**20) == pytest.approx(2836, rel=0.01)
    ev = Evaluator(training_values(job))
    assert float(memory(ev, "fsdp_reduce_scatter_bytes")) == head * 4
    megatron = Evaluator(training_values(Job.of(model="llama3-8b", seq=16384, hw="h100-nvlink", gpus=8)))
    assert float(memory(megatron, "fsdp_backward_extra_bytes")) == 0  # ZeRO-1 reduces into its buffer


def test_megatron_keeps_its_gradients_in_the_dtype_it_reduces_them() -> None:
    """Megatron-Core's grad buffer is fp32 where grad_reduce_in_fp32, else bf16: --grad-bytes 2 and --grad-dtype
    bf16 are one setting, each halving the gradients' 4 bytes a parameter; stated apart they must agree.
    torchtitan reduces as it is told and keeps its fp32 shards."""
    flags = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 8, "global_batch": 8}

    def gradients(**knobs: object) -> tuple[float, int]:
        job = Job.of(**flags, **knobs)
        return step_memory(job).by_category.gradients, job.step.grad_bytes

    fp32, reduced = gradients()
    assert reduced == 4
    params = fp32 / 4
    assert (
        gradients(grad_bytes=2) == gradients(grad_dtype="bf16") == (pytest.approx(params * 2, rel=1e-12), 2)
    )
    assert gradients(grad_bytes=4, grad_dtype="fp32") == (fp32, 4)
    with pytest.raises(InputError, match="--grad-dtype: fp32 with --grad-bytes 2"):
        Job.of(**flags, grad_bytes=2, grad_dtype="fp32")
    with pytest.raises(InputError, match="--grad-bytes: 1: .* accepted: 4 \\(fp32\\) or 2 \\(bf16\\)"):
        Job.of(**flags, grad_bytes=1)
    titan = {"framework": "torchtitan", "zero": 3}
    assert gradients(**titan, grad_bytes=2)[0] == gradients(**titan)[0]


def test_a_profile_that_ties_its_gradients_to_the_reduction_states_them_alike(tmp_path) -> None:
    from tests.support import REPO

    text = (
        (REPO / "frameworks" / "megatron.yaml")
        .read_text()
        .replace("  gradients: fp32\n", "  gradients: bf16\n")
    )
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(
        InputError, match="memory.gradients bf16 .2 bytes. and time.grad_reduce_bytes 4 differ"
    ):
        Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=8, framework=str(path))
