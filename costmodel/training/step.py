"""The whole training step: time, tokens/s, model TFLOP/s per GPU, MFU and HFU, with a breakdown.

Every quantity is a formula of the "step" group in :mod:`costmodel.symbolic.formulas`; this module
chooses the inputs (model preset, profile links and kernel rates, parallel layout) and adds the terms.

One device's step is the pipeline's: m micro-batches through the heaviest (last) stage, each a forward,
a backward and any recompute of n_L/pp layers plus the output layer, the bubble (p-1)/(v·m) of that
[Megatron21 §2.2], then what the step cannot hide: stage-boundary sends of the fill and drain, the last
gradient bucket, ZeRO-3 gathers beyond prefetch, and the optimizer; with ``--offload``, the host link's
copies beyond the compute that hides them and the CPU's Adam step (:mod:`costmodel.training.offload`).
Ranks are placed TP innermost, then CP, DP and PP outermost (Megatron's order); a group stays on NVLink
while it fits in a node.

MFU counts model FLOP as 6·P per token plus attention 12·n_L·h·d·S per token ([PaLM] appendix B,
[Megatron21 §5.1]; the input embedding, a lookup, is left out of P). HFU counts what the devices run:
recompute included, the causal half skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal

import numpy
from pydantic import BaseModel, ConfigDict

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.machines.kernels import attention_kernels
from costmodel.machines.profiles import HardwareProfile
from costmodel.machines.topology import strides
from costmodel.plans.bind import Evaluation, Evaluator
from costmodel.plans.inputs import (
    MAX_HEADS,
    TRAINING_DEFAULTS,
    Count,
    Flag,
    MachineOverrides,
    Number,
    PlanInputs,
    TrainingSetup,
    build,
    flag,
    job_machine,
    shape_from_model,
)
from costmodel.plans.models import ModelPreset, load_model
from costmodel.plans.packing import compute_fraction
from costmodel.plans.stages import StageSplit
from costmodel.symbolic import numeric
from costmodel.training import moe, offload
from costmodel.training.recommend import fit_at, training_values, zero_fractions
from costmodel.training.report import FORMULAS as TERM_FORMULAS
from costmodel.training.report import (
    StepBreakdown,
    StepMemory,
    StepRates,
    StepReport,
    StepTimes,
)

Scheme = Literal["ring", "ulysses", "usp", "allgather"]

DDP_BUCKET_BYTES = 25e6  # PyTorch DistributedDataParallel's bucket_cap_mb default
ADAM_BYTES_PER_PARAM = 30.0  # read grad (4) + read/write master (8), m (8), v (8) + write bf16 weight (2)


class StepSetup(BaseModel):
    """The step's own knobs; the shape, the machine and the parallel layout come from
    :class:`~costmodel.plans.inputs.PlanInputs` (``n`` is the CP degree) and
    :class:`~costmodel.plans.inputs.TrainingSetup`. Overlaps are named here with their defaults, never buried."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    vpp: Count = flag(
        1, "Virtual pipeline stages per device (interleaved 1F1B).", unit="stages", ge=1, le=MAX_HEADS
    )
    micro_batch: Count = flag(1, "b, sequences per micro-batch.", unit="sequences", ge=1, le=MAX_HEADS)
    global_batch: Count = flag(
        ...,
        "Sequences per optimizer step: micro-batch x DP x micro-batches per pipeline.",
        unit="sequences",
        ge=1,
        le=2**30,
    )
    cp_scheme: Scheme = flag(
        "ring",
        "How CP exchanges K and V: ring, ulysses (all-to-all), usp (all-to-all inside "
        "a ring), allgather (K, V gathered, as Llama 3).",
    )
    tp_comm_overlap: Flag = flag(
        False,
        "TP collectives pipelined with their matrix multiplies in t chunks (Megatron's --tp-comm-overlap, "
        "Transformer Engine's userbuffers; torch's AsyncTP): all but one chunk's transfer can hide.",
    )
    cp_overlap: Number = flag(1.0, "Share of ring transfers hidden under attention, in [0, 1].", ge=0, le=1)
    dp_overlap: Number = flag(
        1.0,
        "Share of the gradient reduction overlapped with the backward, in [0, 1]: 1 bucketed (PyTorch DDP, "
        "FSDP, Megatron's --overlap-grad-reduce), 0 reduced after it (Megatron's default).",
        ge=0,
        le=1,
    )
    gemm_dtype: Literal["fp8", "mxfp8"] | None = flag(
        None,
        "Precision of the linear layers' multiplies when it differs from --dtype: fp8 (Transformer Engine, "
        "torchao Float8) or mxfp8 (block-scaled, Blackwell); attention and the output layer stay at --dtype.",
    )
    attention_kernel: str = flag(
        "flash",
        "The attention kernel: flash (fused, the profile's attention tables), unfused (Megatron's core "
        "attention: batched multiplies with the score matrix through HBM, softmax and dropout; no CP), or "
        "a kernel whose tables the profile holds (cp-plan hw show: e.g. sdpa-cudnn).",
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
    )
    pp_overlap: Number = flag(1.0, "Share of steady-state pipeline sends hidden, in [0, 1].", ge=0, le=1)
    bucket_bytes: Number = flag(
        DDP_BUCKET_BYTES, "Gradient bucket size (PyTorch DDP: 25 MB).", unit="bytes", ge=1, le=2**40
    )
    optimizer_bytes: Number = flag(
        ADAM_BYTES_PER_PARAM,
        "HBM bytes the optimizer step moves per parameter (Adam with fp32 master weights: 30).",
        unit="bytes",
        gt=0,
        le=1024,
    )
    grad_bytes: Count = flag(
        4, "Bytes per gradient element the DP group reduces (fp32: 4).", unit="bytes", ge=1, le=8
    )
    ep: Count = flag(
        1,
        "Expert-parallel degree of an MoE model: ranks its experts are split over, out of DP.",
        unit="devices",
        ge=1,
        le=MAX_HEADS,
    )
    capacity_factor: Number = flag(
        moe.CAPACITY_FACTOR,
        "MoE capacity factor: the most loaded expert rank computes this x the mean tokens (Switch: 1.25).",
        ge=1,
        le=16,
    )


# What `cp-plan step` and :func:`build_step` default to and leave out: a causal fwd+bwd training layer, no CP
# unless asked; the step reads no tile size, and the model preset sets the heads.
STEP_DEFAULTS: dict[str, Any] = TRAINING_DEFAULTS | {"n": 1, "block": 1}
STEP_EXCLUDE = frozenset(
    {
        "batch",
        "heads",
        "kv_heads",
        "head_dim",
        "block",
        "causal",
        "pass_",
        "flash_attention",
        "memory_headroom",
    }
)
_DECLARED: tuple[type[BaseModel], ...] = (PlanInputs, TrainingSetup, StepSetup, MachineOverrides)


def step_machine(
    inputs: PlanInputs, overrides: MachineOverrides | None = None, profile: HardwareProfile | None = None
) -> Machine:
    """The step's machine: every rank placed by the job's layout (:func:`~costmodel.plans.inputs.job_machine`,
    the placement recommend, check and report use too)."""
    return job_machine(inputs, overrides, profile)


def build_step(
    profile: HardwareProfile | None = None, **values: Any
) -> tuple[PlanInputs, TrainingSetup, StepSetup, Machine]:
    """The step's inputs from flat keyword values named as the command's flags (``model``, ``seq``, ``hw``,
    ``gpus``, ``tp``, ``cp`` or ``n``, ``pp``, ``vpp``, ``micro_batch``, ``global_batch``, ``recompute``,
    ``cp_scheme``, ``layout``, ``zero``, ``efficiency``, ...), with the command's defaults, each model
    validated once (:func:`~costmodel.plans.inputs.build`): for tests and notebooks. ``profile``, already
    loaded, stands in for reading ``hw`` again (many runs on one machine)."""
    given = dict(values)
    if "cp" in given:
        given["n"] = given.pop("cp")
    parts: dict[type[BaseModel], dict[str, Any]] = {model: {} for model in _DECLARED}
    for name, value in given.items():
        owner = next((m for m in _DECLARED if name in m.model_fields and name not in STEP_EXCLUDE), None)
        if owner is None:
            raise InputError(name, "not an input of the step")
        parts[owner][name] = value
    defaults = {k: v for k, v in STEP_DEFAULTS.items() if k in PlanInputs.model_fields}
    inputs = build(PlanInputs, **shape_from_model(defaults | parts[PlanInputs]))
    overrides = build(MachineOverrides, **parts[MachineOverrides])
    return (
        inputs,
        build(TrainingSetup, **parts[TrainingSetup]),
        build(StepSetup, **parts[StepSetup]),
        step_machine(inputs, overrides, profile),
    )


def _call(name: str, values: Mapping[str, Any]) -> Any:
    """A step formula at ``values``: a number, or an array when any value is one."""
    return getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]})


def _check(
    inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, model: ModelPreset, machine: Machine
) -> tuple[int, int]:
    """DP degree and micro-batches per step; one line naming the flag for any impossible combination."""
    if model.heads % setup.tp:
        raise InputError("--tp", f"{setup.tp} must divide the model's {model.heads} heads")
    group = setup.tp * inputs.n * setup.pp
    if setup.gpus % group:
        raise InputError("--gpus", f"{setup.gpus} is not divisible by tp x cp x pp = {group}")
    dp = setup.gpus // group
    if step.global_batch % (step.micro_batch * dp):
        raise InputError(
            "--global-batch",
            f"{step.global_batch} is not divisible by micro-batch x DP = {step.micro_batch} x {dp}",
        )
    micro = step.global_batch // (step.micro_batch * dp)
    setup.stages(model.layers, step.vpp)
    if step.vpp > 1 and micro < setup.pp:  # the interleaved schedule fills every stage before it steadies
        raise InputError(
            "--vpp",
            f"interleaving needs at least --pp {setup.pp} micro-batches per pipeline; the step has {micro} "
            "(--global-batch / (--micro-batch x DP))",
        )
    named = attention_kernels(machine.profile)
    if step.attention_kernel not in ("flash", "unfused", *named):
        accepted = ", ".join(["flash", "unfused", *named])
        raise InputError(
            "--attention-kernel",
            f"{step.attention_kernel!r}: profile {machine.name!r} has tables for {accepted}",
        )
    if step.gemm_dtype is not None:
        device = machine.profile.device
        if "fp8" not in device.peak_flops:
            raise InputError("--gemm-dtype", f"profile {machine.name!r} states no fp8 FLOP/s")
        if step.gemm_dtype == "mxfp8" and device.generation != "Blackwell":
            raise InputError(
                "--gemm-dtype", f"mxfp8 runs on Blackwell tensor cores; {device.name} is {device.generation}"
            )
    if step.attention_kernel == "unfused" and inputs.n > 1:
        raise InputError("--attention-kernel", "unfused attention has no (O, LSE) to merge: CP needs flash")
    moe.check(model, step.ep, dp)
    if step.cp_scheme == "ulysses" and (model.heads // setup.tp) % inputs.n:
        raise InputError(
            "--cp-scheme",
            f"ulysses needs --cp {inputs.n} dividing the {model.heads // setup.tp} heads a TP rank holds",
        )
    return dp, micro


def _groups(setup: TrainingSetup, step: StepSetup, n: int, dp: int) -> tuple[str, dict[str, int]]:
    """The rank order and every group's size (EP split out of DP for an MoE model)."""
    sizes = {"tp": setup.tp, "cp": n, "dp": dp, "pp": setup.pp}
    return moe.order_and_sizes(setup.rank_order, sizes, step.ep)


def _collectives(step: StepSetup) -> dict[str, Any]:
    """The collective CP waits on (all-to-all for Ulysses, all-gather for Llama 3's scheme, else ring sends),
    and EP's all-to-all."""
    return {
        "tp": "ring",
        "cp": {"ulysses": "alltoall", "allgather": "allgather"}.get(step.cp_scheme, "p2p"),
        "ep": "alltoall",
        "dp": "ring",
    }


def _group_links(setup: TrainingSetup, step: StepSetup, machine: Machine, n: int, dp: int) -> dict[str, Any]:
    """The link of every group, its members placed by ``--rank-order`` (:meth:`Machine.group_links`); the
    dense gradients of an MoE model reduce over EP x DP, from EP's stride."""
    order, sizes = _groups(setup, step, n, dp)
    links = machine.group_links(order, sizes, _collectives(step))
    if "ep" in sizes:
        placed = strides(order, sizes)
        links["dp"] = machine.placed(min(placed["ep"], placed["dp"])).link(dp, "ring")
    return links


def _usp_split(inputs: PlanInputs, setup: TrainingSetup, model: ModelPreset) -> tuple[int, int]:
    """USP: the largest all-to-all degree dividing the CP degree and the TP rank's KV heads."""
    heads = max(model.kv_heads // setup.tp, 1)
    n_u = max(u for u in range(1, inputs.n + 1) if inputs.n % u == 0 and heads % u == 0)
    return n_u, inputs.n // n_u


# Kernels one layer launches on a device, (forward, backward), counted from Megatron-LM's GPT layer
# [Megatron21 §3]: two norms, four multiplies (each twice in backward: input and weight gradient), the
# attention (fused: one kernel and two layout copies; unfused: batched QK^T, the fused scale-mask softmax,
# dropout, the batched product with V and a copy), bias-GeLU, two bias-dropout-adds, two TP collectives, and
# in backward the bias gradients and each elementwise kernel's own backward.
LAYER_KERNELS: dict[str, tuple[int, int]] = {"flash": (14, 28), "unfused": (17, 31)}


def _layer_shapes(model: ModelPreset, tp: int) -> list[tuple[int, int]]:
    """(n, k) of a layer's four forward multiplies on one TP shard: QKV, output projection, MLP in, out."""
    hidden, d = model.hidden, model.head_dim
    mlp_in = (2 if model.gated_mlp else 1) * model.ffn_hidden
    return [
        ((model.heads + 2 * model.kv_heads) * d // tp, hidden),
        (hidden, model.heads * d // tp),
        (mlp_in // tp, hidden),
        (hidden, model.ffn_hidden // tp),
    ]


def gemm_calls_rate(machine: Machine, calls: list[tuple[int, int, int]], batch: int = 1) -> float:
    """The FLOP-weighted rate of (m, n, k) multiplies run one after another, each at its own shape."""
    work = [2.0 * m * n * k for m, n, k in calls]
    seconds = sum(w / machine.gemm_rate(m, n, k, batch) for w, (m, n, k) in zip(work, calls, strict=True))
    return sum(work) / seconds


def layer_gemm_rate(
    model: ModelPreset, machine: Machine, tp: int, rows: int, backward: bool = False
) -> float:
    """F_gemm (or F_gemm_b): the rate of a layer's forward multiplies, TP-split, on ``rows`` tokens; backward,
    of their input gradients (rows x k from rows x n) and weight gradients (k x n over the rows)."""
    rows = max(rows, 1)
    shapes = _layer_shapes(model, tp)
    if backward:
        calls = [call for n, k in shapes for call in ((rows, k, n), (k, n, rows))]
    else:
        calls = [(rows, n, k) for n, k in shapes]
    return gemm_calls_rate(machine, calls)


def _unfused_rates(seq: int, heads: int, d: int, machine: Machine) -> tuple[float, float]:
    """(F_attn, F_attn_bwd) of Megatron's unfused attention: batched multiplies over the whole S x S square,
    one per head of the micro-batch (the score matrix's HBM passes are the formulas' k_sf, k_sb). The
    backward's rate is over 2.5x the forward FLOP, as the attention formulas count it."""
    forward = [(seq, seq, d), (seq, d, seq)]  # scores QK^T, then probabilities x V
    backward = [(seq, d, seq), (seq, d, seq), (seq, seq, d), (seq, d, seq)]  # dQ, dK, dP, dV
    f_fwd = gemm_calls_rate(machine, forward, heads)
    flops_fwd = sum(2.0 * m * n * k for m, n, k in forward)
    flops_bwd = sum(2.0 * m * n * k for m, n, k in backward)
    f_bwd = gemm_calls_rate(machine, backward, heads)
    return f_fwd, 2.5 * flops_fwd / (flops_bwd / f_bwd)


def _rates(
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    model: ModelPreset,
    machine: Machine,
    n_r: int,
    gemms: dict[tuple, dict[str, float]] | None = None,
) -> dict[str, float]:
    """F_gemm, F_gemm_b, F_head, F_attn, F_attn_bwd: the machine's rates (published kernel tables, or
    --efficiency) at this layer's shapes; ``gemms`` keeps the multiplies' rates by shape across calls (the
    layout search binds the same multiplies under many CP schemes)."""
    t, d = setup.tp, model.head_dim
    rows = step.micro_batch * inputs.seq // inputs.n  # sequence parallel gathers the CP rank's tokens
    key = (t, rows, step.gemm_dtype)
    if gemms is None or key not in gemms:
        linear = machine if step.gemm_dtype is None else replace(machine, dtype="fp8")
        found = {
            "F_gemm": layer_gemm_rate(model, linear, t, rows),
            "F_gemm_b": layer_gemm_rate(model, linear, t, rows, backward=True),
            "F_head": gemm_calls_rate(machine, [(rows, max(model.vocab // t, 1), model.hidden)]),
        }
        if gemms is None:
            gemms = {}
        gemms[key] = found
    rates = dict(gemms[key])
    if step.attention_kernel == "unfused":
        f_attn, f_attn_bwd = _unfused_rates(inputs.seq, step.micro_batch * model.heads // t, d, machine)
        return rates | {"F_attn": f_attn, "F_attn_bwd": f_attn_bwd}
    seq, n, scheme = inputs.seq, inputs.n, step.cp_scheme
    if n == 1 or scheme == "ulysses":
        calls = [(seq, seq, True, 1.0)]
    elif scheme == "allgather":  # local queries against the gathered keys, causal
        calls = [(seq // n, seq, True, 1.0)]
    else:  # ring (USP: over its n_r ranks): one causal diagonal step, the rest full blocks
        ring = n_r if scheme == "usp" else n
        block = seq // ring
        other = block // 2 if inputs.layout == "zigzag" else block
        calls = [(block, block, True, 0.5), (block, other, False, (ring - 1) * other / block)]
    pair = numeric.pair_flops(b=step.micro_batch, h=model.heads / t, d=d)
    kernel = None if step.attention_kernel == "flash" else step.attention_kernel

    def rate(backward: bool) -> float:
        total = sum(w for *_, w in calls)
        spent = sum(
            w / machine.rate(pair * q * k * (0.5 if causal else 1.0), causal, backward, n, q, k, d, kernel)
            for q, k, causal, w in calls
        )
        return total / spent

    return rates | {"F_attn": rate(False), "F_attn_bwd": rate(True)}


def _attention_kernel_values(step: StepSetup, model: ModelPreset, c: float) -> dict[str, Any]:
    """x_att, k_sf, k_sb, n_kf, n_kb of the chosen attention kernel. Unfused, the score matrix is computed
    whole (x_att = 1/c) and passes through HBM: the softmax reads and writes it (2p), dropout writes its
    result and a one-byte mask (2p + 1); backward, dropout's gradient (2p + 1) and softmax's (3p), p = 2. The
    batched multiplies' own reads and writes are in their rates."""
    launches = LAYER_KERNELS["unfused" if step.attention_kernel == "unfused" else "flash"]
    if step.attention_kernel != "unfused":
        return {"x_att": 1.0, "k_sf": 0.0, "k_sb": 0.0, "n_kf": launches[0], "n_kb": launches[1]}
    p, dropout = 2, int(model.dropout)
    return {
        "x_att": 1.0 / c,
        "k_sf": 2 * p + dropout * (2 * p + 1),
        "k_sb": 3 * p + dropout * (2 * p + 1),
        "n_kf": launches[0],
        "n_kb": launches[1],
    }


def bind(
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    model: ModelPreset,
    machine: Machine,
    gemms: dict[tuple, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Every base symbol the step formulas need, from the inputs, the preset and the machine; ``gemms``
    carries the multiplies' rates between calls on one machine and model (see :func:`_rates`)."""
    dp, micro = _check(inputs, setup, step, model, machine)
    n_u, n_r = _usp_split(inputs, setup, model)
    t, n, scheme = setup.tp, inputs.n, step.cp_scheme
    kernels, device = machine.profile.kernels, machine.profile.device
    links = _group_links(setup, step, machine, n, dp)
    causal_ring = inputs.layout == "contiguous" and scheme in ("ring", "usp", "allgather") and n > 1
    values: dict[str, Any] = {
        "S": inputs.seq,
        "b": step.micro_batch,
        "N": n,
        "h": model.heads,
        "n_kv": model.kv_heads,
        "d": model.head_dim,
        "H": model.hidden,
        "F_ffn": model.ffn_hidden,
        "V": model.vocab,
        "n_L": model.layers,
        "g": int(model.gated_mlp),
        "e_m": 1 if model.tied_embeddings else 2,
        "t": t,
        "pp": setup.pp,
        **setup.stages(model.layers, step.vpp).values(),
        "D": dp,
        "m_mb": micro,
        "v_pp": step.vpp,
        "p": inputs.bytes_per_element,
        "p_acc": 4,
        # packed or windowed: the share of the causal window the branch's kernel executes ([A-RingCost §5])
        "c": compute_fraction(inputs) if inputs.masked else 0.5,
        "u_cp": float(numeric.utilization_fine(N=n)) if causal_ring else 1.0,
        "k_copy": 1.0 if inputs.layout == "zigzag" and scheme in ("ring", "usp") else 0.0,
        "t_launch": kernels.ring_step_launch_s if kernels else 0.0,
        "s_comm": kernels.comm_sm_slowdown if kernels else 0.0,
        "B_hbm": device.hbm_bandwidth or 2e12,
        "t_k": machine.launch_s,
        "t_fw": machine.step_s,
        # The rank order (Megatron's by default: TP innermost, then CP, DP, PP) places every group.
        **{f"B_{dim}": link.bandwidth for dim, link in links.items()},
        "alpha_tp": links["tp"].latency_s if t > 1 else 0.0,
        "a_tp": links["tp"].call_latency_s if t > 1 else 0.0,
        "a_dp": links["dp"].call_latency_s if dp > 1 else 0.0,
        "alpha_cp": links["cp"].latency_s if n > 1 and scheme == "allgather" else 0.0,
        "rc_sel": int(setup.recompute == "selective"),
        "rc_full": int(setup.recompute == "full"),
        "o_tp": float(numeric.tp_overlap_share(k_tp=t if step.tp_comm_overlap else 1)),
        "o_cp": step.cp_overlap,
        "o_pp": step.pp_overlap,
        "o_dp": step.dp_overlap,
        "f8": int(step.gemm_dtype is not None),
        "p_s": 1 / 32 if step.gemm_dtype == "mxfp8" else 0.0,
        "z3": int(setup.zero == 3),
        "p_g": step.grad_bytes,
        "k_opt": step.optimizer_bytes,
        "N_u": n_u,
        "N_r": n_r,
        **offload_kept(setup, model),
        **offload.values(setup, machine, model),
    }
    values.setdefault("B_ep", values["B_dp"])
    values.update(moe.values(model, step.ep, step.capacity_factor))
    values["F_ffn"] = moe.active_ffn(model)
    values["n_bkt"] = int(buckets(values, step, model))
    # Rates do not depend on the links: a search under another link reuses them whole.
    whole = (
        t,
        inputs.seq,
        n,
        inputs.layout,
        step.micro_batch,
        step.gemm_dtype,
        step.attention_kernel,
        scheme,
        n_r,
    )
    rates = gemms.get(whole) if gemms is not None else None
    if rates is None:
        rates = _rates(inputs, setup, step, model, machine, n_r, gemms)
        if gemms is not None:
            gemms[whole] = rates
    values.update(rates)
    values.update(_attention_kernel_values(step, model, values["c"]))
    return values


def offload_kept(setup: TrainingSetup, model: ModelPreset) -> dict[str, Any]:
    """What the offload copies size themselves by, as the memory fit reads it: the activations a layer keeps
    (sequence parallel, dropout, stored scores, full recompute) and the ZeRO shares of weights and states."""

    z_w, _, z_o = zero_fractions(setup.zero, setup.shard_group)
    return {
        "sigma": int(setup.sp),
        "delta": int(model.dropout),
        "phi": int(not setup.flash_attention and setup.recompute == "none"),
        "rho": int(setup.recompute == "full"),
        "z_w": z_w,
        "z_o": z_o,
    }


def buckets(values: Mapping[str, Any], step: StepSetup, model: ModelPreset) -> Any:
    """n_bkt: the gradient buckets of the parameters a device holds (every expert it holds), at least one."""
    held = moe.counted("device_params", values, model)
    return numpy.maximum(1, numpy.ceil(held * step.grad_bytes / step.bucket_bytes))


def _ring(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return (
        _call("cp_ring_fwd_exposed_s", values),
        _call("cp_ring_bwd_exposed_s", values),
        _call("ring_overhead_s", values),
    )


def _allgather(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    gather = _call(
        "cp_allgather_s", values
    )  # K, V gathered forward; again, and dK, dV reduce-scattered backward
    return gather, 2 * gather, 0.0


def _ulysses(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    a2a = _call("cp_ulysses_s", values)
    return a2a, a2a, 0.0


def _usp(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """All-to-alls over N_u ranks, then a ring over N_r at the N_r ranks' share of the sequence."""
    a2a = numpy.where(numpy.asarray(values["N_u"]) > 1, _call("cp_usp_a2a_s", values), 0.0)
    n_r = numpy.asarray(values["N_r"])
    fwd, bwd, ring = _ring({**values, "N": n_r, "S": values["S"] * n_r // values["N"]})
    across = n_r > 1
    return (
        a2a + numpy.where(across, fwd, 0.0),
        a2a + numpy.where(across, bwd, 0.0),
        numpy.where(across, ring, 0.0),
    )


# (forward, backward, ring overheads) of one layer and pass that a CP scheme leaves exposed, from its formulas:
# the step's x_CP_f, x_CP_b, x_CP_r.
CP_EXPOSURE: dict[str, Callable[[Mapping[str, Any]], tuple[Any, Any, Any]]] = {
    "ring": _ring,
    "allgather": _allgather,
    "ulysses": _ulysses,
    "usp": _usp,
}


def term_values(values: Mapping[str, Any], scheme: str, model: ModelPreset) -> dict[str, Any]:
    """The bound symbols with what the step's terms read beyond them: the CP scheme's exposure (none where
    N = 1) and what counts every expert a device holds (:mod:`costmodel.training.moe`); numbers, or arrays
    over many plans of one scheme."""
    cp = numpy.asarray(values["N"]) > 1
    fwd, bwd, ring = (numpy.where(cp, part, 0.0)[()] for part in CP_EXPOSURE[scheme](values))
    return {
        **values,
        "x_CP_f": fwd,
        "x_CP_b": bwd,
        "x_CP_r": ring,
        "F_e": model.ffn_hidden,
        # Gradients, ZeRO-3 gathers and the optimizer move every weight a device holds: all its experts.
        "x_DP_all": moe.counted("dp_exposed_s", values, model),
        "x_DPo_all": moe.counted("dp_overflow_s", values, model),
        "tau_Z3_all": moe.counted("zero3_gather_s", values, model),
        "t_opt_all": moe.optimizer_s(values, model),
    }


def step_terms(
    values: Mapping[str, Any], scheme: str, model: ModelPreset, trace: list[Evaluation] | None = None
) -> tuple[dict[str, Any], Any]:
    """The step's breakdown (seconds per field of :class:`~costmodel.training.report.StepBreakdown`, each its
    formula's value) and ``step_time_s`` (their sum), from the bound symbols (:func:`bind`): numbers, or numpy
    arrays over many plans of one CP scheme at once (the layout search). Every caller evaluates the step here;
    ``trace`` records each formula evaluated (``--explain``)."""
    ev = Evaluator(term_values(values, scheme, model), trace)
    return {name: ev(formula) for name, formula in TERM_FORMULAS.items()}, ev("step_time_s")


def _stage_inputs(split: StageSplit) -> dict[str, int]:
    """The pipeline's split as the step resolved it (the balanced one unless the first or last was given)."""
    return {
        "first_stage_layers": split.first,
        "middle_stage_layers": split.middle,
        "last_stage_layers": split.last,
    }


def mfu_convention(fraction: float) -> str:
    """How the model FLOP of MFU count attention: the share of the S x S square the trained mask keeps."""
    mask = {1.0: "full mask", 0.5: "causal"}.get(fraction, "packed documents or window")
    return f"6·P + 12·n_L·h·d·S·c per token, attention over the pairs the mask keeps (c = {fraction:.4g}, {mask})"


def check_physical(hfu: Any, v: Mapping[str, Any], machine: Machine) -> None:
    """An error, not a number, where the step would run faster than the device's peak: HFU counts what runs,
    so above 1 a kernel rate of the profile (or the model's FLOP count) cannot be right. HFU is over the
    --dtype peak; linear layers in FP8 may run up to the FP8 peak, so such a step is held to that ratio."""
    peak = machine.peak_flops
    fp8_peak = machine.profile.device.peak_flops.get("fp8", peak)
    fp8 = numpy.asarray(v.get("f8", 0)) > 0
    worst = float(numpy.max(numpy.asarray(hfu) / numpy.where(fp8, max(fp8_peak / peak, 1.0), 1.0)))
    if worst <= 1 + 1e-9:
        return
    limits = {"F_gemm": numpy.where(fp8, max(fp8_peak, peak), peak), "F_attn": peak, "F_attn_bwd": peak}
    fast = {k: float(numpy.max(v[k])) for k, limit in limits.items() if numpy.any(v[k] > limit)}
    if fast:
        name, rate = max(fast.items(), key=lambda item: item[1])
        limit = float(numpy.max(limits[name]))
        raise InputError(
            "--hw",
            f"the profile's {name} rate {rate / 1e12:.4g} TFLOP/s exceeds its {limit / 1e12:.4g} TFLOP/s peak: "
            f"HFU would be {worst:.1%}",
        )
    raise InputError(
        "--model",
        f"the step would execute {worst:.1%} of the device's peak FLOP/s: its FLOP count is not physical",
    )


def step_memory(
    inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, model: ModelPreset, machine: Machine
) -> StepMemory:
    """Memory per device on the most loaded stage [Korthikanti22 §4], the fit ``recommend`` and the layout
    search size plans with, at this micro-batch and CP degree, and whether it fits the usable HBM."""

    attention = inputs.model_copy(update={"batch": step.micro_batch})
    dp = setup.gpus // (setup.tp * inputs.n * setup.pp)
    micro = step.global_batch // (step.micro_batch * dp)
    values = training_values(attention, model, setup, machine, inputs.n, micro, step.vpp, step.ep)
    fit = fit_at(Evaluator(values))
    return StepMemory(
        bytes_per_device=fit.total_bytes,
        model_state_bytes=fit.model_state_bytes,
        activation_bytes=fit.activation_bytes,
        buffer_bytes=fit.buffer_bytes,
        device_memory_bytes=fit.device_memory_bytes,
        fits=fit.fits,
    )


def evaluate_step(
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    machine: Machine,
    model: ModelPreset | None = None,
    trace: list[Evaluation] | None = None,
) -> StepReport:
    """The step's time, throughput, MFU/HFU and breakdown (seconds per term, summing to the step);
    ``model``, already built, stands in for ``inputs.model``; ``trace`` records every formula evaluated."""
    if model is None:
        if inputs.model is None:
            raise InputError(
                "--model",
                "the step needs a model preset (its layers, hidden and vocabulary sizes); e.g. --model "
                "llama3-8b",
            )
        model = load_model(inputs.model)
    v = bind(inputs, setup, step, model, machine)
    m = v["m_mb"]
    parts, total = step_terms(v, step.cp_scheme, model, trace)
    breakdown = StepBreakdown(**{name: float(value) for name, value in parts.items()})
    time_s = float(total)
    tokens = _call("step_tokens", v)
    peak = machine.peak_flops * setup.gpus
    # Model FLOP follow the trained mask (attention over c of the S x S square); the full square only as
    # a labelled second figure, the convention of published MFUs ([PaLM] appendix B, [Megatron21 §5.1]).
    model_flops = _call("model_flops_per_token_causal", v) * tokens
    square_flops = _call("model_flops_per_token", v) * tokens
    hardware_flops = _call("hardware_flops_per_token", v) * tokens
    check_physical(hardware_flops / (time_s * peak), v, machine)
    stated = {
        "model": inputs.model,
        "seq": inputs.seq,
        "hw": inputs.hw,
        "dtype": inputs.dtype,
        "efficiency": inputs.efficiency,
        "layout": inputs.layout,
        "cp": inputs.n,
        **setup.model_dump(include={"gpus", "tp", "pp", "zero", "recompute", "offload", "rank_order"}),
        **step.model_dump(),
    }
    memory = step_memory(inputs, setup, step, model, machine)
    groups = _groups(setup, step, inputs.n, v["D"])
    return StepReport(
        fits=memory.fits,
        memory=memory,
        inputs={
            **stated,
            **_stage_inputs(setup.stages(model.layers, step.vpp)),
            "dp": v["D"],
            "micro_batches": m,
            "usp_ulysses_degree": v["N_u"],
        },
        topology=machine.describe_groups(*groups, _collectives(step)),
        moe=moe.summary(model, v, machine, *groups),
        rates=StepRates(
            gemm_flops_per_s=v["F_gemm"],
            attention_fwd_flops_per_s=v["F_attn"],
            attention_bwd_flops_per_s=v["F_attn_bwd"],
            source=machine.rate_source,
        ),
        step=StepTimes(
            time_s=time_s,
            tokens_per_s=tokens / time_s,
            tokens_per_s_per_gpu=tokens / time_s / setup.gpus,
            model_tflops_per_gpu=model_flops / time_s / setup.gpus / 1e12,
            mfu=model_flops / (time_s * peak),
            mfu_convention=mfu_convention(float(v["c"])),
            attention_fraction=float(v["c"]),
            model_tflops_per_gpu_full_square=square_flops / time_s / setup.gpus / 1e12,
            mfu_full_square=square_flops / (time_s * peak),
            hfu=hardware_flops / (time_s * peak),
            bubble_fraction=float(bubble_fraction(v, step.cp_scheme, model)),
            breakdown=breakdown,
        ),
    )


def bubble_fraction(values: Mapping[str, Any], scheme: str, model: ModelPreset) -> Any:
    """The pipeline bubble over the slowest stage's busy time (``pipeline_bubble_fraction`` at the layer time)."""
    return Evaluator(term_values(values, scheme, model))("pipeline_bubble_fraction")
