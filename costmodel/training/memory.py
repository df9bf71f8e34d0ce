"""Memory per device of a training job: every byte its most loaded pipeline stage holds at the step's peak.

The one memory model of training: `step`, `recommend`, `check`, the layout search and the report read it.
Every quantity is a formula of the "fit" group (:mod:`costmodel.symbolic.formulas`); this module binds a
:class:`~costmodel.plans.job.Job` to them: the shapes, what the framework keeps (:func:`keeps`: the copies of
the weights and their bytes, ZeRO's shares, how ZeRO-3/FSDP gathers, what recompute keeps, how the loss holds
the logits), the pipeline's micro-batches in flight, the CP scheme's buffers, offload and the experts. The
same :func:`keeps` binds one job or a column of layouts (the search): numbers or numpy arrays alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from costmodel.core.errors import InputError
from costmodel.frameworks.profiles import LOGIT_BYTES, STATE_BYTES, FrameworkProfile
from costmodel.plans import cp as registry
from costmodel.plans.bind import Evaluator, call, counts, layer_shape, layout_degrees, plan_values
from costmodel.plans.inputs import LORA_TARGETS
from costmodel.plans.job import Job
from costmodel.plans.schema import Fit, MemoryCategories
from costmodel.training import moe, offload

RECOMPUTE = ("none", "selective", "full")  # the codes a layout table holds its recompute by


def zero_fractions(stage: int, group: Any) -> tuple[Any, Any, Any]:
    """Fractions of (weights, gradients, optimizer states) one device keeps under a ZeRO stage over ``group``
    ranks [ZeRO §5]; a number, or an array over many plans."""
    shard = 1 / group
    return (shard if stage >= 3 else 1.0, shard if stage >= 2 else 1.0, shard if stage >= 1 else 1.0)


def framework_values(framework: FrameworkProfile) -> dict[str, float]:
    """What a framework's profile sets in the memory formulas, the same for every layout of a job."""
    m = framework.memory
    return {
        "q_w": STATE_BYTES[m.weights],
        "q_c": STATE_BYTES[m.compute_weights],
        "q_m": STATE_BYTES[m.master_weights],
        "q_g": STATE_BYTES[m.gradients],
        "q_o": STATE_BYTES[m.optimizer_states],
        "g_p": int(m.gradients_persist),
        "c_gm": int(m.master_weights != "none" and m.master_weights != m.gradients),
        "f_fe": int(m.optimizer_kernel == "foreach"),
        "f_pf": m.fsdp_prefetch_layers,
        "k_l": LOGIT_BYTES["fused" if m.loss == "fused" else m.cross_entropy],
        # the loss peaks in its backward, beside the head's input and weight gradients: a fused linear
        # cross-entropy's, made in its forward, or flash-attn's, whose forward keeps no fp32 copy
        "l_f": int(m.loss == "fused" or m.cross_entropy == "flash"),
        "M_fw": m.overhead_bytes,
        "f_fr": m.fragmentation,
    }


def layout_columns(job: Job, n: int | None = None) -> dict[str, Any]:
    """The layout a job states, at CP degree ``n`` (default its own), as :func:`keeps` reads a layout table's
    columns: the degrees, the recompute code and the micro-batch (b sequences)."""
    n = job.cp if n is None else n
    return {
        "tp": job.tp,
        "pp": job.pp,
        "cp": n,
        "dp": job.setup.shard_group // n,
        "rc": RECOMPUTE.index(job.setup.recompute),
        "micro_batch": job.inputs.batch,
    }


def keeps(job: Job, columns: Mapping[str, Any]) -> dict[str, Any]:
    """What a device keeps, for one layout (:func:`layout_columns`) or a table of them (numpy columns): the
    activations a layer keeps (sequence parallel, dropout, stored scores, full or op-level recompute), the
    ZeRO shares of each copy over DP x CP, whether ZeRO-3/FSDP or autocast gathers compute copies and keeps
    them for the step, and how many tokens' logits a chunked loss holds at once."""
    setup, m = job.setup, job.framework.memory
    tp, pp, rc = (np.asarray(columns[k]) for k in ("tp", "pp", "rc"))
    weights = np.asarray(columns["dp"] * columns["cp"], dtype=float)
    z_w, z_g, z_o = zero_fractions(setup.zero, setup.zero_group(weights))
    autocast = setup.zero < 3 and m.compute_weights != m.weights  # a cast copy of each weight, cached
    reshard = {"always": False, "never": True, "unless-pp": pp > 1}[m.reshard_after_forward]
    sp = tp > 1 if setup.sequence_parallel is None else (tp > 1) & setup.sequence_parallel
    return {
        **trained(job),
        "sigma": sp.astype(float)[()],
        "s_ag": int(m.tp_inputs == "gathered"),
        "delta": int(job.model.dropout),
        # Scores are kept for backward only by an attention that materialises them and is not recomputed.
        "phi": ((rc == 0) & (setup.attention_kernel == "unfused")).astype(float)[()],
        "phi_u": float(setup.attention_kernel == "unfused"),
        "rho": (rc == 2).astype(float)[()],
        "w_op": ((rc == 1) & (m.selective_recompute == "ops")).astype(float)[()],
        "x_ek": float(eager_intermediates(job)),
        "k_li": 1.0 if job.step.gemm_dtype is not None and m.fp8_linear_inputs == "fp8" else 2.0,
        # repeat_kv copies nothing where every query head has its own K, V
        "x_rep": float(job.step.gqa == "repeat" and job.model.kv_heads < job.model.heads),
        "z_w": z_w,
        "z_g": z_g,
        "z_o": z_o,
        "u_w": int(setup.zero == 3 or autocast),
        "u_g": int(setup.zero == 3),
        "r_k": np.asarray(reshard if setup.zero == 3 else autocast, dtype=float)[()],
        "T_c": float("inf") if m.loss == "materialized" else float(m.loss_chunk_tokens),
    }


def eager_intermediates(job: Job) -> bool:
    """Whether the job's layers keep eager torch ops' intermediates for the backward (an unfused RMSNorm's fp32
    upcast, silu(gate) beside up): a dense model under a framework whose norms and activation run unfused.
    An MoE layer's are modelled, here and in the torch reference, as Megatron-Core's fused kernels."""
    return job.step.elementwise == "eager" and not job.model.experts


# The symbol that says whether LoRA adapts each matrix (costmodel.symbolic.symbols a_q ... a_d).
TARGET_SYMBOLS = {"q": "a_q", "k": "a_k", "v": "a_v", "o": "a_o", "gate": "a_g", "up": "a_u", "down": "a_d"}
# The matrices a framework that fuses them adapts together [NeMo-LoRA]: Q/K/V, and a gated MLP's gate/up.
FUSED_TARGETS = {name: LORA_TARGETS[name] for name in ("qkv", "fc1")}


def trained(job: Job) -> dict[str, float]:
    """f_b, f_tr, x_lf and a_q ... a_d: whether the base weights train, the parameters that do per base
    parameter (the adapters' share under LoRA), whether the framework's adapters sit on its fused projections,
    and which matrices they adapt."""
    rank, targets = job.setup.lora_rank, job.setup.lora_targets
    if rank and job.model.experts:
        raise InputError("--finetune", f"LoRA on a mixture of experts ({job.model.name}) is not modelled")
    fused = job.framework.time.lora_adapters == "fused"
    for name, together in FUSED_TARGETS.items():
        if not job.model.gated_mlp:
            together = tuple(m for m in together if m != "gate")
        if fused and 0 < len(targets & set(together)) < len(together):
            raise InputError(
                "--finetune",
                f"{job.framework.name} puts one adapter on its fused {name} projection: target "
                f"{', '.join(together)} together (or {name})",
            )
    adapted = {symbol: int(m in targets) for m, symbol in TARGET_SYMBOLS.items()}
    values = {
        **layer_shape(job.model),
        "f_b": 0 if rank else 1,
        "r_lo": rank,
        "x_lf": float(fused),
        **adapted,
    }
    return {
        "f_b": values["f_b"],
        "f_tr": float(call("trainable_share", values)),
        "x_lf": float(fused),
        **adapted,
    }


def kept(job: Job) -> dict[str, Any]:
    """:func:`keeps` for one job."""
    return keeps(job, layout_columns(job))


def training_values(job: Job, n: int | None = None) -> dict[str, Any]:
    """Every symbol the memory formulas need, at CP degree ``n`` (default the job's): the whole model's
    heads (the formulas divide by t themselves), the framework's copies, the scheme's buffers. The pipeline's
    micro-batches default to its stages when the job states no global batch (1F1B's steady state: the first
    stage keeps pp in flight)."""
    setup, model, machine = job.setup, job.model, job.machine
    at = job if n is None or n == job.cp else None
    values = {
        **plan_values(job.inputs, machine, n),
        **counts(layer_shape(model)),
        **counts(layout_degrees(setup.tp, setup.pp, {})),
        **job.stages.values(),
        "m_mb": _micro_batches(job, n),
        "v_pp": job.step.vpp,
        **framework_values(job.framework),
        **keeps(job, layout_columns(job, n)),
        "M_dev": job.device_memory_bytes,
        **moe.values(model, job.step.ep, job.step.capacity_factor),
        **offload.values(setup, machine, model),
    }
    n = job.cp if n is None else n
    scheme = registry.get(job.step.cp_scheme)
    n_u = (at.usp_split[0] if at else scheme.a2a_degree(max(model.kv_heads // setup.tp, 1), n)) or 1
    values |= {"N_u": n_u, "N_r": n // n_u}
    values["M_cpb"] = cp_buffers(scheme.name, values)
    return values


def _micro_batches(job: Job, n: int | None) -> float:
    """Micro-batches per step at CP degree ``n``: the global batch over the micro-batch and the DP that CP
    leaves; the pipeline's stages (1F1B's steady state) where the job states no global batch."""
    if job.micro_batches is None:
        return job.pp
    if n is None or n == job.cp:
        return job.micro_batches
    return job.step.global_batch / (job.step.micro_batch * job.setup.shard_group / n)


def cp_buffers(scheme: str, values: dict[str, Any]) -> Any:
    """The CP scheme's buffers at the bound values (numbers or arrays); none where N = 1."""
    found = registry.get(scheme).buffers
    if found is None:
        return 0.0
    return np.where(np.asarray(values["N"]) > 1, found(values), 0.0)[()]


def memory(ev: Evaluator, name: str, **overrides: Any) -> Any:
    """A fit formula at the evaluator's values (``overrides`` changing some); for an MoE model its twin,
    counting every expert."""
    return ev(moe.twin(name, ev.values), **overrides)


def categories(values: dict[str, Any]) -> MemoryCategories:
    """Every byte at the peak by what holds it, summing to ``allocated_memory_bytes`` (then the allocator's and
    the runtime's), and the moment: each stage's forward and backward (the loss at the forward's end on the
    last stage, or the backward), each stage's backward's end and each stage's optimizer step (its
    temporaries the working set), the largest of them all."""
    ev = Evaluator(values)
    # An MoE layer keeps the dense layer's activations at the width F_mem; its states count every expert.
    moe_layer = {"F_ffn": float(call("moe_activation_ffn", values))} if values.get("n_E", 1) > 1 else {}
    activations = Evaluator(values | moe_layer)
    candidates = {}
    for where, (params, kept, last) in _stages(ev, activations).items():
        states = {key: float(memory(ev, f"{name}_bytes", **params)) for key, name in STATES.items()}
        running = _running(activations, states, kept, last)
        running["fsdp_buffers"] += float(memory(ev, "fsdp_buffer_bytes", **params))
        candidates[f"the {running.pop('moment')}, {where}"] = running
        ended = dict.fromkeys(running, 0.0) | states | _backward(activations)
        candidates[f"the backward's end, {where}"] = ended | {
            "activations": float(activations("layer_kept_bytes")),
            "fsdp_buffers": memory(ev, "fsdp_backward_end_bytes", **params),
        }
        held = states["gradients"] * float(ev("optimizer_step_gradient_share"))
        candidates[f"the optimizer step, {where}"] = (
            dict.fromkeys(running, 0.0)
            | states
            | {"gradients": held, "working": float(memory(ev, "optimizer_step_bytes", **params))}
        )
    moment, parts = max(candidates.items(), key=lambda item: sum(float(v) for v in item[1].values()))
    parts = {k: float(v) for k, v in parts.items()}
    allocated = sum(parts.values())
    reserved = float(memory(ev, "reserved_memory_bytes"))
    return MemoryCategories(
        **parts,
        allocator=reserved - allocated,
        runtime=values["M_fw"],
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        peak=moment,
    )


STATES = {"weights": "weight", "gradients": "gradient", "optimizer": "optimizer_state"}


def _running(ev: Evaluator, states: dict[str, float], kept: float, last: bool) -> dict[str, Any]:
    """A stage's forward and backward at their peak: its states (gradients where they persist), its layers'
    kept activations (``kept`` bytes), and the loss's working set at the forward's end or the backward's
    (with the CP scheme's buffers), whichever is larger."""
    values = ev.values
    backward = _backward(ev)
    loss = float(ev("loss_working_bytes")) if last else 0.0
    at_loss = loss > sum(backward.values())
    return {
        **states,
        "gradients": states["gradients"] * values["g_p"],
        "activations": kept + (float(ev("output_activation_bytes")) if last else 0.0),
        "loss": loss if at_loss else 0.0,
        **(dict.fromkeys(backward, 0.0) if at_loss else backward),
        "moment": "loss at the forward's end" if at_loss else "backward",
    }


def _backward(ev: Evaluator) -> dict[str, float]:
    """A layer's backward's working set, the CP scheme's buffers apart: they live in the attention, and
    count where its gradients outweigh the MLP's; and what FSDP holds there beyond its buffers at the loss (the
    last reduce-scatter's input, a layer gathered in place of the largest unit: of an MoE model's dense part)."""
    backward = float(ev("layer_backward_working_bytes"))
    in_attention = float(ev("attention_gradient_bytes")) > float(ev("mlp_gradient_bytes"))
    buffers = float(ev.values["M_cpb"]) if in_attention else 0.0
    dense_part = {"F_ffn": ev.values["F_sh"]} if ev.values.get("n_E", 1) > 1 else {}
    fsdp = float(ev("fsdp_backward_extra_bytes", **dense_part))
    return {"working": backward - buffers, "cp_buffers": buffers, "fsdp_buffers": fsdp}


def _stages(ev: Evaluator, activations: Evaluator) -> dict[str, tuple[dict[str, Any], float, bool]]:
    """Each stage's parameters (:func:`_held`), the activations its layers keep at the peak (micro-batches in
    flight x its layers; an MoE model's dense layers, on the first stage, at their own width) and whether it
    runs the loss; one stage without a pipeline, two layers' in flight under activation offload (on the stage
    holding the most parameters)."""
    v = ev.values
    first, middle, last, largest = _held(ev)
    layer = float(activations("layer_kept_bytes"))
    dense_layers = v["n_dn"] if v.get("n_E", 1) > 1 else 0
    dense = dense_layers * float(activations("layer_kept_bytes", F_ffn=v["F_dn"])) if dense_layers else 0.0
    if v["o_act"]:
        return {"activation offload": (largest, 2 * layer, True)}
    if v["pp"] == 1:
        return {"one stage": (first, (v["n_L"] - dense_layers) * layer + dense, True)}
    return {
        "first stage": (
            first,
            float(ev("first_stage_in_flight")) * ((v["n_first"] - dense_layers) * layer + dense),
            False,
        ),
        "second stage": (middle, float(ev("second_stage_in_flight")) * v["n_mid"] * layer, False),
        "last stage": (last, float(ev("last_stage_in_flight")) * v["n_last"] * layer, True),
    }


def _held(ev: Evaluator) -> tuple[dict[str, Any], ...]:
    """The values binding what the first, a middle and the last stage's states are counted for, and the most
    of each (under activation offload): P_r, the parameters a device of the stage holds; for an MoE model
    P_r its dense part and P_x its experts."""
    stages = ("first", "middle", "last")
    if ev.values.get("n_E", 1) == 1:
        held = [{"P_r": ev(f"{stage}_stage_device_params")} for stage in stages]
        return (*held, {"P_r": ev("stage_device_params")})
    held = [
        {"P_r": ev(f"moe_{stage}_stage_dense_params"), "P_x": ev(f"moe_{stage}_stage_expert_params")}
        for stage in stages
    ]
    return (*held, {"P_r": ev("moe_stage_dense_params"), "P_x": ev("moe_device_expert_params")})


def fit_at(ev: Evaluator) -> Fit:
    """The memory of the bound job: model states, activations and buffers by category, and whether they fit."""
    values = ev.values
    by = categories(values)
    total = float(memory(ev, "training_memory_bytes"))
    return Fit(
        n=int(values["N"]),
        params=memory(ev, "params"),
        model_state_bytes=memory(ev, "model_state_bytes"),
        activation_bytes=memory(ev, "activation_bytes"),
        buffer_bytes=values["M_cpb"],
        total_bytes=total,
        device_memory_bytes=values["M_dev"],
        fits=bool(total <= values["M_dev"]),
        by_category=by,
    )


def against_reference(
    ours: Mapping[str, float], theirs: Mapping[str, float], peak: float
) -> dict[str, float]:
    """The model's bytes at the peak by group (``ours``, by category) against the torch reference's
    (``theirs``): each group's difference over the larger of the reference's bytes and a fifth of the peak, so
    that a group of a few hundred MB is not held to a tenth of itself. Two groups: what persists (the states)
    and what comes and goes within the step (FSDP's buffers, activations, the loss, the backward's working
    set, the CP scheme's buffers); inside the second the two attribute alike bytes differently (a recomputed
    layer is the model's working set and the reference's activations, FSDP's accumulated unsharded
    gradients the model's FSDP buffers and the reference's temporaries), and where two moments are within a
    few per cent the two may each pick another."""

    def grouped(by: Mapping[str, float]) -> dict[str, float]:
        transient = ("fsdp_buffers", "activations", "loss", "working", "temporaries", "cp_buffers")
        states = by["weights"] + by["gradients"] + by["optimizer"]
        return {"states": states, "transient": sum(by.get(k, 0.0) for k in transient)}

    model, reference = grouped(ours), grouped(theirs)
    return {k: (model[k] - reference[k]) / max(reference[k], 0.2 * peak) for k in model}


def reference_cases(job: Job) -> dict[str, dict[str, Any]]:
    """The job's stages as the torch memory reference measures them (``costmodel.kernel.memory.MemoryCase``'s
    fields, plain values: this module never loads torch): one stage without a pipeline; the first (the most
    micro-batches in flight) and the last (the loss) with one. The reference runs ZeRO-3 as FSDP2, whose
    sharded weights are the fp32 master copy, and the attention core's selective recompute: an op-level one
    (torchtitan's) is refused, not measured as another."""
    model, setup, framework = job.model, job.setup, job.framework.memory
    if setup.recompute == "selective" and framework.selective_recompute == "ops":
        raise InputError(
            "--memory-reference",
            f"the torch reference's selective recompute is the core attention's, not {job.framework.name}'s "
            "op-level one: give --selective-recompute attention, or --recompute full or none",
        )
    t, n = setup.tp, job.cp
    experts = (model.experts or 0) // job.step.ep
    fsdp = setup.zero == 3
    stored_master = framework.weights if framework.weights != framework.compute_weights else None
    master = stored_master or (None if framework.master_weights == "none" else framework.master_weights)
    pp_keeps = {"always": True, "never": False, "unless-pp": job.pp == 1}[framework.reshard_after_forward]
    common = {
        "tokens": job.inputs.seq // n,
        "micro_batch": job.inputs.batch,
        "hidden": model.hidden,
        "heads": model.heads // t,
        "kv_heads": max(model.kv_heads // t, 1),
        "head_dim": model.head_dim,
        "ffn_hidden": (model.shared_expert_ffn or 0) // t if model.experts else model.ffn_hidden // t,
        "vocab": model.vocab // t,
        "tp": t,
        "sequence_parallel": setup.sp,
        "gated_mlp": model.gated_mlp,
        "experts": experts,
        "experts_per_token": model.experts_per_token or 0,
        "expert_ffn": model.ffn_hidden // t if experts else 0,
        "capacity_factor": job.step.capacity_factor if experts else 1.0,
        "dense_ffn": (model.dense_ffn or 0) // t,
        "param_dtype": framework.compute_weights,
        "master_dtype": master,
        "grad_dtype": (master or framework.compute_weights) if fsdp else framework.gradients,
        "optimizer_dtype": framework.optimizer_states,
        "optimizer_kernel": framework.optimizer_kernel,
        "grad_buffer": framework.gradients_persist or fsdp or master is None,
        "zero": setup.zero,
        "shard_group": job.zero_group,
        "expert_shard_group": job.zero_group // job.step.ep if experts else 0,
        "fsdp": fsdp,
        "reshard_after_forward": pp_keeps,
        "recompute": setup.recompute,
        "elementwise": "eager" if eager_intermediates(job) else "fused",
        "loss": framework.loss,
        "loss_chunk_tokens": framework.loss_chunk_tokens,
        "cross_entropy": framework.cross_entropy,
        "cp": n,
        "cp_scheme": job.step.cp_scheme,
    }
    # A pipeline's steady state: its micro-batches run round after round, and FSDP without resharding
    # accumulates the stage's unsharded gradients from the first on.
    rounds = 2 if fsdp and not pp_keeps and (job.micro_batches or 1) > 1 else 1
    common["rounds"] = rounds
    stages = job.stages
    dense = model.dense_layers  # on the first stage
    if job.pp == 1:
        return {"one stage": common | {"layers": model.layers, "in_flight": 1, "dense_layers": dense}}
    first = min(job.micro_batches or job.pp, job.pp)
    cases = {
        "first stage": common
        | {
            "layers": stages.first,
            "in_flight": first,
            "output_layer": False,
            "dense_layers": min(dense, stages.first),
        },
        "last stage": common | {"layers": stages.last, "in_flight": 1, "input_embedding": False},
    }
    if stages.middle:
        middle = {"layers": stages.middle, "in_flight": max(first - 1, 1), "input_embedding": False}
        cases["second stage"] = common | middle | {"output_layer": False}
    return cases
