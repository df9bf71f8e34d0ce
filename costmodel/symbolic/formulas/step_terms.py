"""Formulas of the group 'step': The step, term by term ([Megatron21 §2.2], [Korthikanti22])."""

from __future__ import annotations

from typing import Any

import sympy

from costmodel.symbolic.formulas.offload import t_bwd_c, t_rc
from costmodel.symbolic.formulas.registry import FORMULAS, definer
from costmodel.symbolic.formulas.step import (
    E_lay,
    E_lo_b,
    E_lo_f,
    T_stage,
    h_crit,
    n_crit,
    t_att_b,
    t_att_f,
    t_head,
    t_mm_b,
    t_mm_f,
)
from costmodel.symbolic.symbols import (
    B_hbm,
    F_e,
    F_ffn,
    m_mb,
    pp,
    rc_full,
    t_dev,
    t_fw,
    t_lay,
    t_opt_all,
    tau_Z3_all,
    x_CP_b,
    x_CP_f,
    x_CP_r,
    x_DP_all,
    x_DPo_all,
)

GROUP = "step"
define = definer(GROUP)

# Every component of the step's breakdown is one formula below and step_time_s is their sum. One layer's
# passes for one micro-batch come first, by component: they add to t_dev, the device's time, and with the wait
# on the host to t_lay, the layer time the pipeline formulas read (each bound to its symbol, so the stage
# formulas stay small). The slowest stage runs every micro-batch: m·n_c times each layer component, m·h_c
# times the output layer; the other stages' share is the bubble. What the CP scheme leaves exposed (x_CP_*)
# and what counts every expert a device holds (x_DP_all, x_DPo_all, tau_Z3_all, t_opt_all) are bound inputs.
_symbol = {name: formula.symbol for name, formula in FORMULAS.items()}
_passes = 2 + rc_full  # forward, backward, and the forward again under full recompute
_layer = (
    define(
        "layer_gemm_s",
        "t_mm",
        t_mm_f + t_mm_b,
        "matrix multiplies of one layer for one micro-batch, forward and backward",
        "s",
        "[Megatron21 §5.1]",
    ),
    define(
        "layer_attn_s",
        "t_att",
        t_att_f + t_att_b,
        "attention of one layer for one micro-batch, forward and backward, the slowest CP rank",
        "s",
        "[FA2 §4]",
    ),
    define(
        "layer_elementwise_s",
        "t_el",
        (3 * E_lay + _symbol["layer_fp8_cast_bytes"] + E_lo_f + E_lo_b) / B_hbm,
        "memory-bound work of one layer for one micro-batch: the elementwise bytes forward (once) and backward "
        "(twice), any FP8 casts, and LoRA's adapters",
        "s",
        "[Korthikanti22 §4], [FP8-Formats], [LoRA §4.1]",
    ),
    t_rc,
    define(
        "layer_tp_exposed_s",
        "x_TP_lay",
        _passes * _symbol["tp_exposed_s"],
        "TP collectives of one layer for one micro-batch left on the critical path: forward, backward and any "
        "full recompute",
        "s",
        "[Korthikanti22 §4.2.2]",
    ),
    define(
        "layer_cp_exposed_s",
        "x_CP_lay",
        (1 + rc_full) * x_CP_f + x_CP_b,
        "CP communication of one layer for one micro-batch left on the critical path: forward, backward and any "
        "full recompute's forward",
        "s",
        "[RingAttn §3], [Ulysses §3], [USP §3], [Llama3 §3.3]",
    ),
    define(
        "layer_cp_overhead_s",
        "t_CP_ovh",
        _passes * x_CP_r,
        "the ring's merges, copies and launches of one layer for one micro-batch, every pass",
        "s",
        "[ring-flash-attn]",
    ),
    define(
        "layer_ep_exposed_s",
        "x_EP_lay",
        _passes * _symbol["moe_alltoall_s"],
        "EP all-to-alls of one MoE layer for one micro-batch, every pass (none without EP)",
        "s",
        "[GShard §2]",
    ),
    define(
        "layer_moe_imbalance_s",
        "t_imb_lay",
        (3 + rc_full) * sympy.Subs(_symbol["moe_imbalance_s"], F_ffn, F_e),
        "routing imbalance of one MoE layer for one micro-batch: the forward's, the backward's twice, and any "
        "full recompute's (none at C_f = 1)",
        "s",
        "[Switch §2.2]",
    ),
    define(
        "layer_offload_exposed_s",
        "x_off_lay",
        _symbol["offload_layer_fwd_exposed_s"] + _symbol["offload_layer_bwd_exposed_s"],
        "one layer's offload copies for one micro-batch left on the critical path, forward and backward",
        "s",
        "[ZeRO-Infinity §5]",
    ),
)
define(
    "layer_device_s",
    "t_dev_lay",
    sympy.Add(*_layer),
    "device time of one layer's passes for one micro-batch: compute and exposed communication",
    "s",
    "[Megatron21 §3]",
    binds=t_dev,
    simplify=False,
)
t_wait = _symbol["layer_host_wait_s"]
define(
    "layer_time_s",
    "t_lay_s",
    t_dev + t_wait,
    "one layer's passes for one micro-batch: the device's time and any wait on the host",
    "s",
    "[Megatron21 §3], [Brrr]",
    binds=t_lay,
)


# formula: (the step report's key for it, its label in a table, its label in a narrow cell)
STEP_FIELDS: dict[str, tuple[str, str, str]] = {}


def _shown(name: str, key: str, label: str, short: str | None = None) -> str:
    """A formula that is a term of the step, shown in the report as ``key`` with ``label``."""
    STEP_FIELDS[name] = (key, label, short or label)
    return name


def _on_stage(name: str, symbol: str, layer: sympy.Symbol, what: str, shown: tuple[str, ...]) -> str:
    """A layer component over the step: the slowest stage's layers, every micro-batch."""
    of = FORMULAS[next(n for n, f in FORMULAS.items() if f.symbol == layer)]
    meaning = f"{what} of the step: the slowest pipeline stage's n_c layers, each of the m micro-batches"
    define(name, symbol, m_mb * n_crit * layer, meaning, "s", of.source)
    return _shown(name, *shown)


def _term(name: str, *definition: Any, shown: tuple[str, ...], **resolution: Any) -> str:
    """A term of the step that is not a layer component: defined, and named in STEP_TERMS."""
    define(name, *definition, **resolution)
    return _shown(name, *shown)


x_bwd_stage = n_crit * (t_bwd_c + _symbol["tp_exposed_s"] + x_CP_b)  # the last micro-batch's backward
# The terms of the step's breakdown, in the order it is shown; step_time_s is their sum.
STEP_TERMS: tuple[str, ...] = (
    _on_stage(
        "step_gemm_s", "T_mm", _layer[0], "matrix multiplies", ("matmul_s", "matrix multiplies", "matmuls")
    ),
    _on_stage("step_attn_s", "T_att", _layer[1], "attention", ("attention_s", "attention")),
    _on_stage(
        "step_elementwise_s",
        "T_el",
        _layer[2],
        "memory-bound elementwise work",
        ("elementwise_s", "elementwise (memory-bound)", "elementwise"),
    ),
    _on_stage(
        "step_host_wait_s",
        "T_wait",
        t_wait,
        "waits on the host (kernel launches)",
        ("host_wait_s", "waiting on the host (kernel launches)"),
    ),
    _on_stage("step_recompute_s", "T_rc", t_rc, "recompute", ("recompute_s", "recompute")),
    _on_stage(
        "step_tp_exposed_s",
        "X_TP",
        _layer[4],
        "exposed TP collectives",
        ("exposed_tp_s", "exposed TP comm", "TP comm"),
    ),
    _on_stage(
        "step_cp_exposed_s",
        "X_CP",
        _layer[5],
        "exposed CP communication",
        ("exposed_cp_s", "exposed CP comm", "CP comm"),
    ),
    _on_stage(
        "step_cp_overhead_s",
        "T_CP_ovh",
        _layer[6],
        "the ring's merges, copies and launches",
        ("cp_ring_overhead_s", "CP ring overheads (merge, copies, launches)", "ring overheads"),
    ),
    _on_stage(
        "step_ep_exposed_s",
        "X_EP",
        _layer[7],
        "exposed EP all-to-alls",
        ("exposed_ep_s", "exposed EP all-to-all (MoE)"),
    ),
    _on_stage(
        "step_moe_imbalance_s",
        "T_imb",
        _layer[8],
        "MoE routing imbalance",
        ("moe_imbalance_s", "MoE routing imbalance"),
    ),
    _on_stage(
        "step_offload_layer_s",
        "X_off",
        _layer[9],
        "exposed offload copies of the layers",
        ("offload_layer_s", "exposed offload copies (layers)", "offload copies"),
    ),
    _term(
        "step_head_s",
        "T_head",
        m_mb * h_crit * t_head,
        "output layer and loss of the step, where the slowest stage is the last: each of the m micro-batches",
        "s",
        "[Megatron21 §5.1]",
        shown=("head_s", "output layer and loss", "output layer"),
    ),
    _shown("pipeline_bubble_s", "pipeline_bubble_s", "pipeline bubble"),
    _term(
        "step_pp_exposed_s",
        "X_PP",
        sympy.Piecewise((_symbol["pp_exposed_s"], pp > 1), (0, True)),
        "stage-boundary sends of the step left on the critical path (none without a pipeline)",
        "s",
        "[Megatron21 §4.1]",
        shown=("exposed_pp_s", "exposed PP sends", "PP sends"),
    ),
    _term(
        "step_dp_exposed_s",
        "X_DP",
        x_DP_all + sympy.Max(x_DPo_all - x_bwd_stage, 0, evaluate=False),
        "the step's gradient reduction left on the critical path: the last bucket and what is not overlapped, "
        "and the other buckets beyond the last micro-batch's backward on the slowest stage (every weight a "
        "device holds, all its experts)",
        "s",
        "PyTorch DDP, [Megatron21 §5]",
        simplify=False,
        shown=("exposed_dp_s", "exposed DP comm", "DP comm"),
    ),
    _term(
        "step_zero3_gather_s",
        "X_Z3",
        m_mb * (sympy.Max(tau_Z3_all - T_stage, 0, evaluate=False) + tau_Z3_all / n_crit),
        "the step's ZeRO-3 gathers left on the critical path: beyond what prefetch hides under a micro-batch, and "
        "the first layer's, each micro-batch",
        "s",
        "[ZeRO §5.3]",
        shown=("zero3_gather_s", "exposed ZeRO-3 gathers", "ZeRO-3 gathers"),
    ),
    _term(
        "step_optimizer_s",
        "T_opt",
        t_opt_all,
        "the optimizer step on the device, over every weight it holds (all its experts)",
        "s",
        "[ZeRO §5], [GShard §2]",
        shown=("optimizer_s", "optimizer step", "optimizer"),
    ),
    _term(
        "step_offload_grad_s",
        "X_off_g",
        _symbol["offload_grad_exposed_s"] + _symbol["offload_weight_upload_s"],
        "optimizer offload's copies left on the critical path: gradients out beyond the last backward, the "
        "updated weights back",
        "s",
        "[ZeRO-Offload §4.1]",
        shown=("offload_grad_s", "exposed offload copies (gradients, weights)", "offload grads/weights"),
    ),
    _shown("host_adam_s", "host_adam_s", "host optimizer step (CPU Adam)", "host Adam"),
    _term(
        "step_framework_s",
        "T_fw",
        t_fw,
        "framework time per optimizer step outside the layers (a measured profile's)",
        "s",
        "kernel tables",
        shown=("framework_s", "framework time per step"),
    ),
)
define(
    "step_time_s",
    "T_iter",
    sympy.Add(*(FORMULAS[name].symbol for name in STEP_TERMS)),
    "one optimizer step on one device: the sum of its breakdown",
    "s",
    "[Megatron21 §2.2, §5.1]",
    simplify=False,
)
