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

from collections.abc import Mapping
from typing import Any

import numpy

from costmodel.core.errors import InputError
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.machines.binding import Machine
from costmodel.plans import cp as registry
from costmodel.plans.bind import (
    Evaluation,
    Evaluator,
    attention_shape,
    call,
    layer_shape,
    layout_degrees,
    overlaps,
)
from costmodel.plans.job import Job, StepSetup
from costmodel.plans.models import ModelPreset
from costmodel.plans.packing import compute_fraction
from costmodel.plans.rates import layer_rates, linear_machine
from costmodel.plans.stages import StageSplit
from costmodel.plans.uncertainty import memory_interval, time_interval
from costmodel.symbolic import numeric
from costmodel.training import moe, offload
from costmodel.training.memory import fit_at, kept, trained, training_values
from costmodel.training.report import FORMULAS as TERM_FORMULAS
from costmodel.training.report import (
    StepBreakdown,
    StepMemory,
    StepRates,
    StepReport,
    StepTimes,
)

# Kernels one layer launches on a device, (forward, backward), counted from Megatron-LM's GPT layer
# [Megatron21 §3]: two norms, four multiplies (each twice in backward: input and weight gradient), the
# attention (fused: one kernel and two layout copies; unfused: batched QK^T, the fused scale-mask softmax,
# dropout, the batched product with V and a copy), bias-GeLU, two bias-dropout-adds, two TP collectives, and
# in backward the bias gradients and each elementwise kernel's own backward.
LAYER_KERNELS: dict[str, tuple[int, int]] = {"flash": (14, 28), "unfused": (17, 31)}


def fused_softmax(seq: int, batches: int) -> bool:
    """Whether Megatron's fused scale-mask softmax runs for ``batches`` = b·h/t score matrices of ``seq`` x
    ``seq``: its kernel gives each row a warp and each block 4 rows (8 up to 128 keys), so it needs
    16 < S <= 4,096 (2,048 in Megatron-DeepSpeed of 2022), S a multiple of 4 and whole blocks of matrices
    ([Megatron-LM] ``FusedScaleMaskSoftmax.is_kernel_available``)."""
    per_block = 8 if seq <= 128 else 4
    return 16 < seq <= 4096 and seq % 4 == 0 and batches % per_block == 0


def _attention_kernel_values(job: Job, c: float) -> dict[str, Any]:
    """x_att, k_sf, k_sb, n_kf, n_kb of the chosen attention kernel. Unfused, the score matrix is computed
    whole (x_att = 1/c) and passes through HBM. With the fused softmax: it reads and writes the scores (2p),
    dropout writes its result and a one-byte mask (2p + 1); backward, dropout's gradient (2p + 1) and
    softmax's (3p), p = 2. Where the fused kernel does not fit (``fused_softmax``) the softmax runs as five
    eager fp32 kernels each way: a cast up, the scale, the mask, the softmax and a cast down (2p + 32 bytes),
    and their gradients (2p + 36). The batched multiplies' own reads and writes are in their rates."""
    unfused = job.setup.attention_kernel == "unfused"
    launches = LAYER_KERNELS["unfused" if unfused else "flash"]
    if not unfused:
        return {"x_att": 1.0, "k_sf": 0.0, "k_sb": 0.0, "n_kf": launches[0], "n_kb": launches[1]}
    p, dropout = 2, int(job.model.dropout)
    fused = fused_softmax(job.inputs.seq, job.step.micro_batch * job.model.heads // job.tp)
    extra = 0 if fused else 4  # kernels beyond the fused one, each way
    return {
        "x_att": 1.0 / c,
        "k_sf": (2 * p if fused else 2 * p + 32) + dropout * (2 * p + 1),
        "k_sb": (3 * p if fused else 2 * p + 36) + dropout * (2 * p + 1),
        "n_kf": launches[0] + extra,
        "n_kb": launches[1] + extra,
    }


def compute_values(job: Job, gemms: dict[tuple, dict[str, float]] | None = None) -> dict[str, Any]:
    """The symbols one layer's multiplies and attention read (shapes, kernel rates, the mask's executed
    share): all a search's lower bound on a step needs (:func:`costmodel.training.search.fastest`), and the
    part of :func:`bind` that a shape's links and memory do not change. ``gemms`` carries the multiplies'
    rates between calls on one machine and model (see :func:`~costmodel.plans.rates.layer_rates`)."""
    inputs, step, model = job.inputs, job.step, job.model
    n, scheme = job.cp, registry.get(step.cp_scheme)
    # a causal mask split in contiguous shards loads the last rank most, where each rank keeps its own queries
    causal_ring = inputs.layout == "contiguous" and not scheme.whole_sequence and n > 1
    values: dict[str, Any] = {
        **attention_shape(inputs, n, step.micro_batch),
        **layer_shape(model),
        "t": job.tp,
        # packed or windowed: the share of the causal window the branch's kernel executes ([A-RingCost §5])
        "c": compute_fraction(inputs) if inputs.masked else 0.5,
        "u_cp": float(numeric.utilization_fine(N=n)) if causal_ring else 1.0,
        "B_hbm": job.machine.profile.device.streaming_bandwidth or 2e12,
        **trained(job),
        # the dense formulas read the width a token computes through; moe.counted reads one expert's
        "F_ffn": moe.active_ffn(model),
    }
    # Rates do not depend on the links: a search under another link reuses them whole.
    whole = (
        job.tp,
        inputs.seq,
        n,
        inputs.layout,
        step.micro_batch,
        step.gemm_dtype,
        job.setup.attention_kernel,
        scheme.name,
        job.usp_split[1],
    )
    rates = gemms.get(whole) if gemms is not None else None
    if rates is None:
        rates = layer_rates(job, gemms)
        if gemms is not None:
            gemms[whole] = rates
    values.update(rates)
    values.update(_attention_kernel_values(job, values["c"]))
    return values


def bind(
    job: Job, gemms: dict[tuple, dict[str, float]] | None = None, computed: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every base symbol the step formulas need, from the job: :func:`compute_values` (``computed``, where
    they are bound already) with the layout, the links, the knobs and what a device keeps."""
    setup, step, model, machine = job.setup, job.step, job.model, job.machine
    n_u, n_r = job.usp_split
    t, n, scheme = job.tp, job.cp, registry.get(step.cp_scheme)
    kernels = machine.profile.kernels
    values: dict[str, Any] = {
        **(computed if computed is not None else compute_values(job, gemms)),
        **layout_degrees(t, job.pp, job.stages.values()),
        "D": job.dp,
        "Z_s": job.zero_group,
        "m_mb": job.micro_batches,
        "F_peak": machine.peak_flops,
        "F_peak_g": linear_machine(job).peak_flops,
        "v_pp": step.vpp,
        "k_copy": 1.0 if job.inputs.layout == "zigzag" and scheme.ring else 0.0,
        "k_merge": step.ring_merge_bytes,
        "x_eager": 1.0 if step.elementwise == "eager" else 0.0,
        "k_agm": 1.0 if job.framework.time.allgather_merges else 0.0,
        "t_launch": kernels.ring_step_launch_s if kernels else 0.0,
        "t_k": host_per_kernel_s(job),
        "t_fw": machine.step_s,
        **_link_values(job.links, t, n, job.dp, scheme.latency_per_step),
        **overlaps(machine, t, step.tp_comm_overlap, step.cp_overlap),
        **_knobs(job),
        "N_u": n_u,
        "N_r": n_r,
        **kept(job),
        **offload.values(setup, machine, model),
        **moe.values(model, step.ep, step.capacity_factor),
    }
    values["n_bkt"] = int(buckets(values, step, model))
    return values


def host_per_kernel_s(job: Job) -> float:
    """Host time per counted kernel (t_k): the framework's (frameworks/*.yaml ``time.host_s_per_kernel``),
    else the hardware's eager-PyTorch floor (``kernels.launch_s``). A profile measured on a cluster keeps its
    own: it was fitted to runs of the framework they ran. None under a datasheet question."""
    machine, stated = job.machine, job.framework.time.host_s_per_kernel
    if stated is None or machine.datasheet or machine.profile.source.kind == "measured":
        return machine.launch_s
    return stated


def _link_values(links: dict[str, Any], t: int, n: int, dp: int, cp_step_latency: bool) -> dict[str, Any]:
    """Every group's bandwidth and the latencies the step charges: per message on TP and (where the scheme
    waits on each step) CP, per collective call on TP and DP; none on a group of one rank. The rank order
    (Megatron's by default: TP innermost, then CP, DP, PP) places every group; EP, where there is none,
    reads DP's link."""
    bandwidths = {f"B_{dim}": link.bandwidth for dim, link in links.items()}
    return {
        **bandwidths,
        "B_ep": bandwidths.get("B_ep", bandwidths["B_dp"]),
        "alpha_tp": links["tp"].latency_s if t > 1 else 0.0,
        "a_tp": links["tp"].call_latency_s if t > 1 else 0.0,
        "a_dp": links["dp"].call_latency_s if dp * n > 1 else 0.0,
        "alpha_cp": links["cp"].latency_s if n > 1 and cp_step_latency else 0.0,
    }


def _knobs(job: Job) -> dict[str, Any]:
    """The step's own settings: recompute, the PP and DP overlaps, the fp8 multiplies and their scales, ZeRO-3,
    and the bytes of a gradient and of an optimizer's state per parameter."""
    setup, step = job.setup, job.step
    return {
        "rc_sel": int(setup.recompute == "selective"),
        "rc_full": int(setup.recompute == "full"),
        "o_pp": step.pp_overlap,
        "o_dp": step.dp_overlap,
        "f8": int(step.gemm_dtype is not None),
        "p_s": 1 / 32 if step.gemm_dtype == "mxfp8" else 0.0,
        "a_f8": int(step.gemm_dtype == "fp8" and step.fp8_scaling == "current"),
        "z3": int(setup.zero == 3),
        "p_g": step.grad_bytes,
        "k_opt": step.optimizer_bytes,
    }


def buckets(values: Mapping[str, Any], step: StepSetup, model: ModelPreset) -> Any:
    """n_bkt: the gradient buckets of the parameters a device holds (every expert it holds), at least one."""
    held = moe.counted("device_params", values, model)
    return numpy.maximum(1, numpy.ceil(held * step.grad_bytes / step.bucket_bytes))


def term_values(values: Mapping[str, Any], scheme: str, model: ModelPreset) -> dict[str, Any]:
    """The bound symbols with what the step's terms read beyond them: the CP scheme's exposure (none where
    N = 1) and what counts every expert a device holds (:mod:`costmodel.training.moe`); numbers, or arrays
    over many plans of one scheme."""
    split = numpy.asarray(values["N"]) > 1
    exposure = registry.get(scheme).exposure(values)  # every training scheme gives one
    fwd, bwd, ring = (numpy.where(split, part, 0.0)[()] for part in exposure)
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


def utilisation(v: Mapping[str, Any], time_s: Any, gpus: Any, machine: Machine) -> tuple[Any, Any]:
    """MFU and HFU: the seconds the step's model FLOP and its executed FLOP take at the device's peak, each
    part at the peak of the precision it runs in (``model_peak_s_per_token``, ``hardware_peak_s_per_token``),
    over the step's time. An FP8 multiply is held to the FP8 peak, not the --dtype one, so neither passes 1
    while no kernel outruns its peak; HFU above 1 is an error naming the rate that does (:func:`check_physical`).
    Numbers, or arrays over many plans (the layout search)."""
    share = call("step_tokens", v) / (time_s * gpus)
    hfu = call("hardware_peak_s_per_token", v) * share
    check_physical(hfu, v)
    return call("model_peak_s_per_token", v) * share, hfu


def check_physical(hfu: Any, v: Mapping[str, Any]) -> None:
    """An error, not a number, where the step would run faster than the device's peak: HFU counts what runs,
    so above 1 a kernel rate of the profile (or the model's FLOP count) cannot be right."""
    worst = float(numpy.max(hfu))
    if worst <= 1 + 1e-9:
        return
    limits = {"F_gemm": "F_peak_g", "F_gemm_b": "F_peak_g", "F_head": "F_peak", "F_attn": "F_peak"}
    limits["F_attn_bwd"] = "F_peak"
    fast = {
        rate: float(numpy.max(numpy.asarray(v[rate]) / v[peak]))
        for rate, peak in limits.items()
        if numpy.any(numpy.asarray(v[rate]) > numpy.asarray(v[peak]) * (1 + 1e-9))
    }
    if fast:
        name = max(fast, key=fast.__getitem__)
        raise InputError(
            "--hw",
            f"the profile's {name} rate is {fast[name]:.4g} x its peak FLOP/s: HFU would be {worst:.1%}",
        )
    raise InputError(
        "--model",
        f"the step would execute {worst:.1%} of the device's peak FLOP/s: its FLOP count is not physical",
    )


def step_memory(job: Job, level: float = DEFAULT_LEVEL) -> StepMemory:
    """Memory per device on the most loaded stage [Korthikanti22 §4], the fit ``recommend`` and the layout
    search size plans with, at this micro-batch and CP degree, whether it fits the usable HBM, and how sure
    that is (an interval at ``level``)."""
    fit = fit_at(Evaluator(training_values(job)))
    band, fits = memory_interval(job, fit.total_bytes, fit.device_memory_bytes, level)
    return StepMemory(
        bytes_per_device=fit.total_bytes,
        model_state_bytes=fit.model_state_bytes,
        activation_bytes=fit.activation_bytes,
        buffer_bytes=fit.buffer_bytes,
        device_memory_bytes=fit.device_memory_bytes,
        fits=fit.fits,
        bytes_per_device_interval=band,
        fits_probability=fits,
        by_category=fit.by_category,
    )


def evaluate_step(
    job: Job, trace: list[Evaluation] | None = None, level: float = DEFAULT_LEVEL
) -> StepReport:
    """The step's time, throughput, MFU/HFU and breakdown (seconds per term, summing to the step), with
    prediction intervals at ``level``; ``trace`` records every formula evaluated."""
    if job.micro_batches is None:
        raise InputError("--global-batch", "the step needs the sequences per optimizer step")
    inputs, setup, step, model, machine = job.inputs, job.setup, job.step, job.model, job.machine
    v = bind(job)
    parts, total = step_terms(v, step.cp_scheme, model, trace)
    breakdown = StepBreakdown(**{name: float(value) for name, value in parts.items()})
    time_s = float(total)
    tokens = call("step_tokens", v)
    # Model FLOP follow the trained mask (attention over c of the S x S square); the full square only as
    # a labelled second figure, the convention of published MFUs ([PaLM] appendix B, [Megatron21 §5.1]).
    model_flops = call("model_flops_per_token_causal", v) * tokens
    square_flops = call("model_flops_per_token", v) * tokens
    mfu, hfu = utilisation(v, time_s, setup.gpus, machine)
    stated = {
        "model": inputs.model,
        "seq": inputs.seq,
        "hw": inputs.hw,
        "dtype": inputs.dtype,
        "efficiency": inputs.efficiency,
        "layout": inputs.layout,
        "cp": inputs.cp,
        "framework": job.framework.name,
        **setup.model_dump(
            include={"gpus", "tp", "pp", "zero", "recompute", "offload", "finetune", "rank_order"}
        ),
        "attention_kernel": setup.attention_kernel,
        **step.model_dump(),
        **job.overrides.model_dump(exclude_none=True),  # what the command line changed in the profile
    }
    memory = step_memory(job, level)
    return StepReport(
        fits=memory.fits,
        memory=memory,
        inputs={
            **stated,
            **_stage_inputs(job.stages),
            "dp": job.dp,
            "micro_batches": job.micro_batches,
            "usp_ulysses_degree": v["N_u"],
        },
        changed=machine.profile.changed,
        topology={**machine.describe_groups(*job.groups, job.collectives), "zero": job.zero_placement},
        moe=moe.summary(model, v, machine, *job.groups),
        rates=StepRates(
            gemm_flops_per_s=v["F_gemm"],
            attention_fwd_flops_per_s=v["F_attn"],
            attention_bwd_flops_per_s=v["F_attn_bwd"],
            source=machine.rate_source,
        ),
        step=StepTimes(
            time_s=time_s,
            time_s_interval=time_interval(job, time_s, level, breakdown.model_dump()),
            tokens_per_s=tokens / time_s,
            tokens_per_s_per_gpu=tokens / time_s / setup.gpus,
            model_tflops_per_gpu=model_flops / time_s / setup.gpus / 1e12,
            mfu=float(mfu),
            mfu_convention=mfu_convention(float(v["c"])),
            attention_fraction=float(v["c"]),
            model_tflops_per_gpu_full_square=square_flops / time_s / setup.gpus / 1e12,
            mfu_full_square=full_square_mfu(v, time_s, setup.gpus, inputs.masked),
            hfu=float(hfu),
            bubble_fraction=float(bubble_fraction(v, step.cp_scheme, model)),
            breakdown=breakdown,
        ),
    )


def full_square_mfu(v: Mapping[str, Any], time_s: float, gpus: int, masked: bool) -> float | None:
    """MFU with attention over the full S x S square, the convention of published MFUs for a full or causal
    mask; None for packed documents, windows and chunks, whose attention is no share of that square (it
    would count up to S / W times the pairs a window-W model computes)."""
    if masked:
        return None
    return float(call("model_square_peak_s_per_token", v) * call("step_tokens", v) / (time_s * gpus))


def bubble_fraction(values: Mapping[str, Any], scheme: str, model: ModelPreset) -> Any:
    """The pipeline bubble over the slowest stage's busy time (``pipeline_bubble_fraction`` at the layer time)."""
    return Evaluator(term_values(values, scheme, model))("pipeline_bubble_fraction")
