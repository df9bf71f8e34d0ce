"""The whole training step: time, tokens/s, model TFLOP/s per GPU, MFU and HFU, with a breakdown.

Every quantity is a formula of the "step" group in :mod:`costmodel.symbolic.formulas`; this module
chooses the inputs (model preset, profile links and kernel rates, parallel layout) and adds the terms.

One device's step is the pipeline's: m micro-batches through the heaviest (last) stage, each a forward,
a backward and any recompute of n_L/pp layers plus the output layer, the bubble (p-1)/(v·m) of that
[Megatron21 §2.2], then what the step cannot hide: stage-boundary sends of the fill and drain, the last
gradient bucket, ZeRO-3 gathers beyond prefetch, and the optimizer. Ranks are placed TP innermost, then
CP, DP and PP outermost (Megatron's order); a group stays on NVLink while it fits in a node.

MFU counts model FLOP as 6·P per token plus attention 12·n_L·h·d·S per token ([PaLM] appendix B,
[Megatron21 §5.1]; the input embedding, a lookup, is left out of P). HFU counts what the devices run:
recompute included, the causal half skipped.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.plans.inputs import (
    MAX_HEADS,
    TRAINING_DEFAULTS,
    Count,
    MachineOverrides,
    Number,
    PlanInputs,
    TrainingSetup,
    build,
    flag,
    machine_for,
    shape_from_model,
)
from costmodel.plans.models import ModelPreset, load_model
from costmodel.plans.packing import compute_fraction
from costmodel.symbolic import numeric

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
    tp_overlap: Number = flag(
        0.0, "Share of TP collectives hidden under the matrix multiplies (async TP), in [0, 1].", ge=0, le=1
    )
    cp_overlap: Number = flag(1.0, "Share of ring transfers hidden under attention, in [0, 1].", ge=0, le=1)
    pp_overlap: Number = flag(1.0, "Share of steady-state pipeline sends hidden, in [0, 1].", ge=0, le=1)
    bucket_bytes: Number = flag(
        DDP_BUCKET_BYTES, "Gradient bucket size (PyTorch DDP: 25 MB).", unit="bytes", gt=0, le=2**40
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
        "sequence_parallel",
        "flash_attention",
        "memory_headroom",
    }
)
_DECLARED: tuple[type[BaseModel], ...] = (PlanInputs, TrainingSetup, StepSetup, MachineOverrides)


def step_machine(inputs: PlanInputs, overrides: MachineOverrides | None = None) -> Machine:
    """The step's machine: the profile as the command line changes it, with every rank placed by the step.

    A profile's ``cp_ranks_per_node`` stands in for the TP a single-layer plan does not know (the -ib
    profiles put one CP rank per node: TP fills it); the step states TP, so a node holds devices_per_node
    consecutive ranks unless ``--cp-ranks-per-node`` says otherwise."""
    machine = machine_for(inputs, overrides)
    stated = overrides.cp_ranks_per_node if overrides is not None else None
    profile = machine.profile.model_copy(update={"cp_ranks_per_node": stated})
    return Machine(profile, machine.dtype, machine.efficiency)


def build_step(**values: Any) -> tuple[PlanInputs, TrainingSetup, StepSetup, Machine]:
    """The step's inputs from flat keyword values named as the command's flags (``model``, ``seq``, ``hw``,
    ``gpus``, ``tp``, ``cp`` or ``n``, ``pp``, ``vpp``, ``micro_batch``, ``global_batch``, ``recompute``,
    ``cp_scheme``, ``layout``, ``zero``, ``efficiency``, ...), with the command's defaults, each model
    validated once (:func:`~costmodel.plans.inputs.build`): for tests and notebooks."""
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
        step_machine(inputs, overrides),
    )


def _call(name: str, values: dict[str, Any]) -> float:
    return float(getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]}))


def _check(inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, model: ModelPreset) -> tuple[int, int]:
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
    if setup.pp > 1 and micro < setup.pp:
        raise InputError(
            "--global-batch", f"{micro} micro-batches per pipeline is fewer than --pp {setup.pp} stages"
        )
    if step.vpp > 1 and setup.pp == 1:
        raise InputError("--vpp", "interleaving needs --pp > 1")
    if step.cp_scheme == "ulysses" and (model.heads // setup.tp) % inputs.n:
        raise InputError(
            "--cp-scheme",
            f"ulysses needs --cp {inputs.n} dividing the {model.heads // setup.tp} heads a TP rank holds",
        )
    return dp, micro


def _bandwidth(machine: Machine, stride: int, size: int, collective: str = "p2p") -> float:
    """B of the link a group of ``size`` ranks ``stride`` apart waits on (TP innermost, then CP, DP, PP)."""
    return machine.placed(stride).link(size, collective).bandwidth  # type: ignore[arg-type]


def _usp_split(inputs: PlanInputs, setup: TrainingSetup, model: ModelPreset) -> tuple[int, int]:
    """USP: the largest all-to-all degree dividing the CP degree and the TP rank's KV heads."""
    heads = max(model.kv_heads // setup.tp, 1)
    n_u = max(u for u in range(1, inputs.n + 1) if inputs.n % u == 0 and heads % u == 0)
    return n_u, inputs.n // n_u


def _rates(
    inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, model: ModelPreset, machine: Machine, n_r: int
) -> dict[str, float]:
    """F_gemm, F_attn, F_attn_bwd: the machine's rates (published kernel tables, or --efficiency) at this
    layer's shapes."""
    t, hidden, d = setup.tp, model.hidden, model.head_dim
    rows = step.micro_batch * inputs.seq // inputs.n  # sequence parallel gathers the CP rank's tokens
    mlp_in = (2 if model.gated_mlp else 1) * model.ffn_hidden
    shapes = [  # (n, k) of the forward multiplies, TP-split
        ((model.heads + 2 * model.kv_heads) * d // t, hidden),
        (hidden, model.heads * d // t),
        (mlp_in // t, hidden),
        (hidden, model.ffn_hidden // t),
    ]
    work = [n * k for n, k in shapes]
    seconds = sum(w / machine.gemm_rate(rows, n, k) for w, (n, k) in zip(work, shapes, strict=True))
    f_gemm = sum(work) / seconds
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

    def rate(backward: bool) -> float:
        total = sum(w for *_, w in calls)
        spent = sum(
            w / machine.rate(pair * q * k * (0.5 if causal else 1.0), causal, backward, n, q, k, d)
            for q, k, causal, w in calls
        )
        return total / spent

    return {"F_gemm": f_gemm, "F_attn": rate(False), "F_attn_bwd": rate(True)}


def bind(
    inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, model: ModelPreset, machine: Machine
) -> dict[str, Any]:
    """Every base symbol the step formulas need, from the inputs, the preset and the machine."""
    dp, micro = _check(inputs, setup, step, model)
    n_u, n_r = _usp_split(inputs, setup, model)
    t, n, scheme = setup.tp, inputs.n, step.cp_scheme
    kernels, device = machine.profile.kernels, machine.profile.device
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
        # Megatron's rank order: TP innermost, then CP, DP, PP; each group on the link its span needs.
        "B_tp": _bandwidth(machine, 1, t),
        "B_cp": _bandwidth(machine, t, n, "alltoall" if scheme == "ulysses" else "p2p"),
        "B_dp": _bandwidth(machine, t * n, dp),
        "B_pp": _bandwidth(machine, t * n * dp, setup.pp),
        "rc_sel": int(setup.recompute == "selective"),
        "rc_full": int(setup.recompute == "full"),
        "o_tp": step.tp_overlap,
        "o_cp": step.cp_overlap,
        "o_pp": step.pp_overlap,
        "z3": int(setup.zero == 3),
        "p_g": step.grad_bytes,
        "k_opt": step.optimizer_bytes,
        "N_u": n_u,
        "N_r": n_r,
    }
    values["n_bkt"] = max(1, math.ceil(_call("device_params", values) * step.grad_bytes / step.bucket_bytes))
    values.update(_rates(inputs, setup, step, model, machine, n_r))
    return values


def _cp_exposed(scheme: str, values: dict[str, Any]) -> tuple[float, float, float]:
    """(forward, backward) CP communication left on the critical path, and the ring's per-pass overheads."""
    if values["N"] == 1:
        return 0.0, 0.0, 0.0
    if scheme == "ring":
        return (
            _call("cp_ring_fwd_exposed_s", values),
            _call("cp_ring_bwd_exposed_s", values),
            _call("ring_overhead_s", values),
        )
    if scheme == "allgather":  # all-gather K, V forward; again and reduce-scatter dK, dV backward
        gather = _call("cp_allgather_s", values)
        return gather, 2 * gather, 0.0
    if scheme == "ulysses":
        a2a = _call("cp_ulysses_s", values)
        return a2a, a2a, 0.0
    a2a = _call("cp_usp_a2a_s", values) if values["N_u"] > 1 else 0.0
    ring = {**values, "N": values["N_r"], "S": values["S"] * values["N_r"] // values["N"], "t": values["t"]}
    if values["N_r"] == 1:
        return a2a, a2a, 0.0
    return (
        a2a + _call("cp_ring_fwd_exposed_s", ring),
        a2a + _call("cp_ring_bwd_exposed_s", ring),
        _call("ring_overhead_s", ring),
    )


def evaluate_step(
    inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, machine: Machine
) -> dict[str, Any]:
    """The step's time, throughput, MFU/HFU and breakdown (seconds per component, summing to the step)."""
    if inputs.model is None:
        raise InputError(
            "--model",
            "the step needs a model preset (its layers, hidden and vocabulary sizes); e.g. --model llama3-8b",
        )
    model = load_model(inputs.model)
    v = bind(inputs, setup, step, model, machine)
    m, stage_layers, full = v["m_mb"], model.layers / setup.pp, v["rc_full"]
    gemm = 3 * _call("layer_gemm_flops", v) / v["F_gemm"]
    attention = _call("layer_attn_fwd_s", v) + _call("layer_attn_bwd_s", v)
    elementwise = 3 * _call("layer_elementwise_bytes", v) / v["B_hbm"]
    recompute = _call("layer_recompute_s", v)
    tp = (2 + full) * _call("tp_exposed_s", v)
    cp_fwd, cp_bwd, ring_x = _cp_exposed(step.cp_scheme, v)
    cp = cp_fwd + cp_bwd + full * cp_fwd
    ring = (2 + full) * ring_x
    head = _call("head_s", v)
    layer = gemm + attention + elementwise + recompute + tp + cp + ring
    micro_batch_s = stage_layers * layer + head
    backward_s = stage_layers * (_call("layer_compute_bwd_s", v) + _call("tp_exposed_s", v) + cp_bwd)
    dp = _call("dp_exposed_s", v) + max(0.0, _call("dp_overflow_s", v) - backward_s)
    gather = _call("zero3_gather_s", v)
    zero3 = m * (max(0.0, gather - micro_batch_s) + gather / stage_layers) if setup.zero == 3 else 0.0
    per = m * stage_layers
    breakdown = {
        "matrix multiplies": per * gemm,
        "attention": per * attention,
        "elementwise (memory-bound)": per * elementwise,
        "recompute": per * recompute,
        "output layer and loss": m * head,
        "exposed TP comm": per * tp,
        "exposed CP comm": per * cp,
        "CP ring overheads (merge, copies, launches)": per * ring,
        "pipeline bubble": (setup.pp - 1) / step.vpp * micro_batch_s,
        "exposed PP sends": _call("pp_exposed_s", v) if setup.pp > 1 else 0.0,
        "exposed DP comm": dp,
        "exposed ZeRO-3 gathers": zero3,
        "optimizer step": _call("optimizer_s", v),
    }
    time_s = sum(breakdown.values())
    tokens = _call("step_tokens", v)
    peak = machine.peak_flops * setup.gpus
    model_flops = _call("model_flops_per_token", v) * tokens
    hardware_flops = _call("hardware_flops_per_token", v) * tokens
    stated = {
        "model": inputs.model,
        "seq": inputs.seq,
        "hw": inputs.hw,
        "dtype": inputs.dtype,
        "efficiency": inputs.efficiency,
        "layout": inputs.layout,
        "cp": inputs.n,
        **setup.model_dump(include={"gpus", "tp", "pp", "zero", "recompute"}),
        **step.model_dump(),
    }
    return {
        "inputs": {**stated, "dp": v["D"], "micro_batches": m, "usp_ulysses_degree": v["N_u"]},
        "rates": {
            "gemm_flops_per_s": v["F_gemm"],
            "attention_fwd_flops_per_s": v["F_attn"],
            "attention_bwd_flops_per_s": v["F_attn_bwd"],
        },
        "step": {
            "time_s": time_s,
            "tokens_per_s": tokens / time_s,
            "tokens_per_s_per_gpu": tokens / time_s / setup.gpus,
            "model_tflops_per_gpu": model_flops / time_s / setup.gpus / 1e12,
            "mfu": model_flops / (time_s * peak),
            "mfu_causal_attention": _call("model_flops_per_token_causal", v) * tokens / (time_s * peak),
            "hfu": hardware_flops / (time_s * peak),
            "bubble_fraction": _call("pipeline_bubble_fraction", v),
            "breakdown": breakdown,
        },
    }
