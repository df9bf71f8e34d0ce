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

from pydantic import BaseModel, ConfigDict, Field

from costmodel.core.errors import InputError
from costmodel.machines.kernels import attention_rate, gemm_rate
from costmodel.machines.profiles import BYTES_PER_ELEMENT, Dtype, HardwareProfile, Link, load_profile
from costmodel.plans.models import ModelPreset, load_model
from costmodel.symbolic import numeric

Recompute = Literal["none", "selective", "full"]
Scheme = Literal["ring", "ulysses", "usp", "allgather"]
Layout = Literal["contiguous", "striped", "zigzag"]

DDP_BUCKET_BYTES = 25e6  # PyTorch DistributedDataParallel's bucket_cap_mb default
ADAM_BYTES_PER_PARAM = 30.0  # read grad (4) + read/write master (8), m (8), v (8) + write bf16 weight (2)


class StepSetup(BaseModel):
    """The knobs of one training step. Overlaps are named here with their defaults, never buried."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="preset name or YAML path")
    seq: int = Field(ge=1, description="sequence length, tokens")
    hw: str = Field(description="hardware profile name or YAML path")
    gpus: int = Field(ge=1)
    tp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1, description="virtual stages per device (interleaved 1F1B)")
    micro_batch: int = Field(1, ge=1, description="sequences per micro-batch")
    global_batch: int = Field(ge=1, description="sequences per optimizer step")
    recompute: Recompute = "selective"
    cp_scheme: Scheme = "ring"
    layout: Layout = "zigzag"
    dtype: Dtype = "bf16"
    efficiency: float | None = Field(
        None, gt=0, le=1, description="override: every kernel at this share of peak"
    )
    zero3: bool = Field(False, description="ZeRO-3 / FSDP: parameters sharded over DP and gathered per layer")
    grad_bytes: int = Field(4, ge=1, description="bytes per gradient element the DP group reduces (fp32)")
    tp_overlap: float = Field(0.0, ge=0, le=1, description="share of TP collectives hidden (async TP)")
    cp_overlap: float = Field(1.0, ge=0, le=1, description="share of ring transfers hidden under attention")
    pp_overlap: float = Field(1.0, ge=0, le=1, description="share of steady-state stage sends hidden")
    bucket_bytes: float = Field(DDP_BUCKET_BYTES, gt=0, description="gradient bucket size, bytes")
    optimizer_bytes: float = Field(
        ADAM_BYTES_PER_PARAM, gt=0, description="HBM bytes per parameter, optimizer"
    )


def _call(name: str, values: dict[str, Any]) -> float:
    return float(getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]}))


def _check(setup: StepSetup, model: ModelPreset) -> tuple[int, int]:
    """DP degree and micro-batches per step; one line naming the flag for any impossible combination."""
    if model.heads % setup.tp:
        raise InputError("--tp", f"{setup.tp} must divide the model's {model.heads} heads")
    group = setup.tp * setup.cp * setup.pp
    if setup.gpus % group:
        raise InputError("--gpus", f"{setup.gpus} is not divisible by tp x cp x pp = {group}")
    dp = setup.gpus // group
    if setup.global_batch % (setup.micro_batch * dp):
        raise InputError("--global-batch", f"{setup.global_batch} is not divisible by micro-batch x DP = "
                         f"{setup.micro_batch} x {dp}")  # fmt: skip
    micro = setup.global_batch // (setup.micro_batch * dp)
    if setup.pp > 1 and micro < setup.pp:
        raise InputError(
            "--global-batch", f"{micro} micro-batches per pipeline is fewer than --pp {setup.pp} stages"
        )
    if setup.vpp > 1 and setup.pp == 1:
        raise InputError("--vpp", "interleaving needs --pp > 1")
    if setup.seq % setup.cp or (setup.layout == "zigzag" and setup.seq % (2 * setup.cp)):
        raise InputError(
            "--seq", f"{setup.seq} must split evenly over --cp {setup.cp} (zigzag: 2 x cp chunks)"
        )
    if setup.cp_scheme == "ulysses" and (model.heads // setup.tp) % setup.cp:
        raise InputError("--cp-scheme", f"ulysses needs --cp {setup.cp} dividing the {model.heads // setup.tp} "
                         "heads a TP rank holds")  # fmt: skip
    return dp, micro


def _link(profile: HardwareProfile, span: int) -> Link:
    """The link a group of ``span`` consecutive ranks waits on: NVLink while it fits in a node."""
    if span <= profile.devices_per_node:
        return profile.links.intra_node
    if profile.links.inter_node is None:
        raise InputError(
            "--hw", f"profile {profile.name!r} has no inter_node link but a group spans {span} GPUs"
        )
    return profile.links.inter_node


def _usp_split(setup: StepSetup, model: ModelPreset) -> tuple[int, int]:
    """USP: the largest all-to-all degree dividing the CP degree and the TP rank's KV heads."""
    heads = max(model.kv_heads // setup.tp, 1)
    n_u = max(u for u in range(1, setup.cp + 1) if setup.cp % u == 0 and heads % u == 0)
    return n_u, setup.cp // n_u


def _rates(setup: StepSetup, model: ModelPreset, profile: HardwareProfile, n_r: int) -> dict[str, float]:
    """F_gemm, F_attn, F_attn_bwd: the published kernel tables at this layer's shapes (or --efficiency)."""
    if setup.efficiency is not None:
        rate = profile.device.peak_flops[setup.dtype] * setup.efficiency
        return {"F_gemm": rate, "F_attn": rate, "F_attn_bwd": rate}
    t, hidden, d = setup.tp, model.hidden, model.head_dim
    rows = setup.micro_batch * setup.seq // setup.cp  # sequence parallel gathers the CP rank's tokens
    mlp_in = (2 if model.gated_mlp else 1) * model.ffn_hidden
    shapes = [  # (n, k) of the forward multiplies, TP-split
        ((model.heads + 2 * model.kv_heads) * d // t, hidden),
        (hidden, model.heads * d // t),
        (mlp_in // t, hidden),
        (hidden, model.ffn_hidden // t),
    ]
    work = [n * k for n, k in shapes]
    seconds = sum(
        w / gemm_rate(profile, setup.dtype, rows, n, k) for w, (n, k) in zip(work, shapes, strict=True)
    )
    f_gemm = sum(work) / seconds
    seq, n = setup.seq, setup.cp
    if n == 1 or setup.cp_scheme == "ulysses":
        calls = [(seq, seq, True, 1.0)]
    elif setup.cp_scheme == "allgather":  # local queries against the gathered keys, causal
        calls = [(seq // n, seq, True, 1.0)]
    else:  # ring (USP: over its n_r ranks): one causal diagonal step, the rest full blocks
        block = seq // (n_r if setup.cp_scheme == "usp" else n)
        other = block // 2 if setup.layout == "zigzag" else block
        steps = (n_r if setup.cp_scheme == "usp" else n) - 1
        calls = [(block, block, True, 0.5), (block, other, False, steps * other / block)]

    def rate(backward: bool) -> float:
        total = sum(w for *_, w in calls)
        spent = sum(
            w / attention_rate(profile, setup.dtype, q, k, d, causal, backward) for q, k, causal, w in calls
        )
        return total / spent

    return {"F_gemm": f_gemm, "F_attn": rate(False), "F_attn_bwd": rate(True)}


def bind(setup: StepSetup, model: ModelPreset, profile: HardwareProfile) -> dict[str, Any]:
    """Every base symbol the step formulas need, from the setup, the preset and the profile."""
    dp, micro = _check(setup, model)
    n_u, n_r = _usp_split(setup, model)
    t, n = setup.tp, setup.cp
    kernels = profile.kernels
    causal_ring = setup.layout == "contiguous" and setup.cp_scheme in ("ring", "usp", "allgather") and n > 1
    values: dict[str, Any] = {
        "S": setup.seq, "b": setup.micro_batch, "N": n, "h": model.heads, "n_kv": model.kv_heads,
        "d": model.head_dim, "H": model.hidden, "F_ffn": model.ffn_hidden, "V": model.vocab, "n_L": model.layers,
        "g": int(model.gated_mlp), "e_m": 1 if model.tied_embeddings else 2, "t": t, "pp": setup.pp, "D": dp,
        "m_mb": micro, "v_pp": setup.vpp, "p": BYTES_PER_ELEMENT[setup.dtype], "p_acc": 4, "c": 0.5,
        "u_cp": float(numeric.utilization_fine(N=n)) if causal_ring else 1.0,
        "k_copy": 1.0 if setup.layout == "zigzag" and setup.cp_scheme in ("ring", "usp") else 0.0,
        "t_launch": kernels.ring_step_launch_s if kernels else 0.0,
        "s_comm": kernels.comm_sm_slowdown if kernels else 0.0,
        "B_hbm": profile.device.hbm_bandwidth or 2e12,
        "B_tp": _link(profile, t).bandwidth_per_direction,
        "B_cp": _link(profile, t * n).bandwidth_per_direction,
        "B_dp": _link(profile, t * n * dp).bandwidth_per_direction,
        "B_pp": _link(profile, setup.gpus if setup.pp > 1 else 1).bandwidth_per_direction,
        "rc_sel": int(setup.recompute == "selective"), "rc_full": int(setup.recompute == "full"),
        "o_tp": setup.tp_overlap, "o_cp": setup.cp_overlap, "o_pp": setup.pp_overlap,
        "z3": int(setup.zero3), "p_g": setup.grad_bytes, "k_opt": setup.optimizer_bytes,
        "N_u": n_u, "N_r": n_r,
    }  # fmt: skip
    values["n_bkt"] = max(
        1, math.ceil(_call("device_params", values) * setup.grad_bytes / setup.bucket_bytes)
    )
    values.update(_rates(setup, model, profile, n_r))
    return values


def _cp_exposed(scheme: str, values: dict[str, Any]) -> tuple[float, float, float]:
    """(forward, backward) CP communication left on the critical path, and the ring's per-pass overheads."""
    if values["N"] == 1:
        return 0.0, 0.0, 0.0
    if scheme == "ring":
        return (_call("cp_ring_fwd_exposed_s", values), _call("cp_ring_bwd_exposed_s", values),
                _call("ring_overhead_s", values))  # fmt: skip
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
    return (a2a + _call("cp_ring_fwd_exposed_s", ring), a2a + _call("cp_ring_bwd_exposed_s", ring),
            _call("ring_overhead_s", ring))  # fmt: skip


def evaluate_step(setup: StepSetup) -> dict[str, Any]:
    """The step's time, throughput, MFU/HFU and breakdown (seconds per component, summing to the step)."""
    model = load_model(setup.model)
    profile = load_profile(setup.hw)
    if setup.dtype not in profile.device.peak_flops:
        raise InputError("--dtype", f"profile {profile.name!r} has no {setup.dtype} FLOP/s")
    v = bind(setup, model, profile)
    m, stage_layers, full = v["m_mb"], model.layers / setup.pp, v["rc_full"]
    gemm = 3 * _call("layer_gemm_flops", v) / v["F_gemm"]
    attention = _call("layer_attn_fwd_s", v) + _call("layer_attn_bwd_s", v)
    elementwise = 3 * _call("layer_elementwise_bytes", v) / v["B_hbm"]
    recompute = _call("layer_recompute_s", v)
    tp = (2 + full) * _call("tp_exposed_s", v)
    cp_fwd, cp_bwd, ring_x = _cp_exposed(setup.cp_scheme, v)
    cp = cp_fwd + cp_bwd + full * cp_fwd
    ring = (2 + full) * ring_x
    head = _call("head_s", v)
    layer = gemm + attention + elementwise + recompute + tp + cp + ring
    micro_batch_s = stage_layers * layer + head
    backward_s = stage_layers * (_call("layer_compute_bwd_s", v) + _call("tp_exposed_s", v) + cp_bwd)
    dp = _call("dp_exposed_s", v) + max(0.0, _call("dp_overflow_s", v) - backward_s)
    gather = _call("zero3_gather_s", v)
    zero3 = m * (max(0.0, gather - micro_batch_s) + gather / stage_layers) if setup.zero3 else 0.0
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
        "pipeline bubble": (setup.pp - 1) / setup.vpp * micro_batch_s,
        "exposed PP sends": _call("pp_exposed_s", v) if setup.pp > 1 else 0.0,
        "exposed DP comm": dp,
        "exposed ZeRO-3 gathers": zero3,
        "optimizer step": _call("optimizer_s", v),
    }
    time_s = sum(breakdown.values())
    tokens = _call("step_tokens", v)
    peak = profile.device.peak_flops[setup.dtype] * setup.gpus
    model_flops = _call("model_flops_per_token", v) * tokens
    hardware_flops = _call("hardware_flops_per_token", v) * tokens
    return {
        "inputs": {**setup.model_dump(), "dp": v["D"], "micro_batches": m, "usp_ulysses_degree": v["N_u"]},
        "rates": {
            "gemm_flops_per_s": v["F_gemm"],
            "attention_fwd_flops_per_s": v["F_attn"],
            "attention_bwd_flops_per_s": v["F_attn_bwd"],
        },  # fmt: skip
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
