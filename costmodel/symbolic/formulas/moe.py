"""Formulas of the group 'moe': define("""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.fit import (
    A,
    M_fsdp,
    M_fsdp_end,
    M_g,
    M_o,
    M_w,
    P,
    P_first,
    P_last,
    P_mid,
    _buffers,
    at_stage,
    replacing,
)
from costmodel.symbolic.formulas.registry import FORMULAS, definer
from costmodel.symbolic.formulas.step import P_dev, tau_dp
from costmodel.symbolic.symbols import (
    B_dp,
    B_ep,
    B_hbm,
    C_f,
    D,
    E_p,
    F_dn,
    F_ffn,
    F_gemm,
    F_sh,
    H,
    M_cpb,
    M_dev,
    M_fw,
    N,
    S,
    b,
    f_fr,
    f_pf,
    f_tr,
    g,
    g_p,
    k_E,
    k_opt,
    n_bkt,
    n_dn,
    n_E,
    n_first,
    n_L,
    n_last,
    n_mid,
    o_dp,
    p,
    p_g,
    phi,
    pp,
    q_c,
    q_g,
    q_m,
    q_o,
    q_w,
    r_k,
    t,
    u_g,
    u_w,
    z3,
    z_g,
    z_o,
    z_w,
)

GROUP = "moe"
define = definer(GROUP)

define(
    "moe_active_ffn",
    "F_act",
    k_E * F_ffn + F_sh,
    "FFN width one token computes through: its k routed experts (F_ffn each) and any shared expert",
    "elements",
    "[Switch §2], [GShard §2]",
)
_experts_a_layer = (
    n_E / E_p * (2 + g) * H * F_ffn / t + H * n_E
)  # a device's experts of one layer, and the router
# The first n_dn layers may keep a dense MLP (DeepSeek-V3's first three, 18,432 wide [DeepSeek-V3 §4.2]): no
# experts there, on the first stage.
_moe_layers = sympy.Piecewise(
    (n_L - n_dn, sympy.Eq(pp, 1)), (sympy.Max(n_first - n_dn, n_mid, n_last, evaluate=False), True)
)
P_exp = define(
    "moe_device_expert_params",
    "P_exp",
    _moe_layers * _experts_a_layer,
    "expert weights one device holds: its n_E/E_p experts of each MoE layer of its stage (the stage holding "
    "the most), TP-split, and the routers",
    "parameters",
    "[GShard §2], [DeepSeek-V3 §4.2]",
)
X_dn = n_dn * (2 + g) * H * (F_dn - F_sh)  # the dense layers' MLPs beyond the shared expert each layer counts
T_route = define(
    "moe_device_tokens",
    "T_r",
    b * S / (N * t),
    "tokens one rank routes in a layer: its CP shard, split t ways by sequence parallelism",
    "tokens",
    "[Korthikanti22 §4.2.2]",
)
C_disp = define(
    "moe_dispatch_bytes",
    "C_ep",
    T_route * k_E * H * p * (E_p - 1) / E_p,
    "bytes a rank sends in one all-to-all: each token's hidden state to its k experts, all but 1/E_p of them "
    "on other ranks (the combine returns as many)",
    "B",
    "[GShard §2]",
)
define(
    "moe_alltoall_s",
    "t_ep",
    2 * C_disp / B_ep,
    "one pass of an MoE layer's all-to-alls: dispatch and combine, not overlapped with compute",
    "s",
    "[GShard §2]",
)
define(
    "moe_optimizer_s",
    "t_opt_exp",
    k_opt * P_exp * E_p / (D * B_hbm),
    "optimizer step over the device's expert weights: Adam over their fp32 states, sharded over the D/E_p "
    "ranks that hold the same experts, memory-bound",
    "s",
    "[ZeRO §5], [GShard §2]",
)
define(
    "moe_imbalance_s",
    "t_imb",
    (C_f - 1) * 2 * (2 + g) * k_E * T_route * H * F_ffn / F_gemm,
    "forward time the most loaded expert rank spends beyond the balanced share: C_f x the mean tokens, "
    "as a capacity-bound expert computes its full capacity",
    "s",
    "[Switch §2.2]",
)
# What an MoE model puts on a device. Its dense part (attention, norms, any shared expert, embeddings) is
# the dense formulas' at the shared expert's width, split by TP and PP; its experts are P_exp, n_E/E_p of
# them per rank and each split by TP as Megatron-Core does [MoE-Folding]. The D/E_p ranks holding the same
# experts reduce their gradients and shard their ZeRO states. Every formula below reads F_ffn as ONE
# expert's width, and the fit and the layout search call them in place of their dense twins.
P_moe = define(
    "moe_params",
    "P_moe",
    sympy.Subs(P, F_ffn, F_sh) + X_dn + sympy.Subs(P_exp, (E_p, t, pp), (1, 1, 1)),
    "parameters of an MoE model: its dense part (attention, norms, any shared expert, embeddings, the first "
    "layers' dense MLPs) and every expert and router of every MoE layer",
    "1",
    "[GShard §2], [DeepSeek-V3 §4.2]",
)
define(
    "moe_device_params",
    "P_dev_moe",
    sympy.Subs(P_dev, F_ffn, F_sh) + X_dn / (t * pp) + P_exp,
    "parameters one device holds of an MoE model (before ZeRO-3): its share of the dense part and its experts",
    "1",
    "[Megatron21 §3], [MoE-Folding]",
)
# ZeRO shards expert states over the ranks holding the same experts, E_p times fewer: E_p times the share.
# An MoE model's states are counted on the stage holding the most parameters, its peak on the stage keeping
# the most activations (for a dense model, each stage's own, allocated_memory_bytes).


# The stage holding the most of the dense part: the first one keeps the dense layers' MLPs (at pp = 1 the
# middle stage holds nothing and the first and the last are the whole model).
_dense_stage = sympy.Max(P_first + X_dn / t, P_mid, P_last, evaluate=False)


def _dense(bytes_of_stage: sympy.Expr) -> sympy.Expr:
    """A dense formula of a device holding P_r parameters, for an MoE model's dense part on the stage holding
    the most (each layer's MLP at the shared expert's width, the dense layers' beside)."""
    return sympy.Subs(at_stage(bytes_of_stage, _dense_stage), F_ffn, F_sh)


M_w_moe = define(
    "moe_weight_bytes",
    "M_w_moe",
    _dense(M_w) + P_exp * q_w * sympy.Min(1, E_p * z_w, evaluate=False),
    "the stored weights per device of an MoE model: the dense part's, and its experts' with ZeRO sharding "
    "over the ranks that hold the same experts",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
M_g_moe = define(
    "moe_gradient_bytes",
    "M_g_moe",
    _dense(M_g) + P_exp * q_g * sympy.Min(1, E_p * z_g, evaluate=False),
    "the gradients per device of an MoE model: the dense part's, and its experts'",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
M_o_moe = define(
    "moe_optimizer_state_bytes",
    "M_o_moe",
    _dense(M_o) + P_exp * (q_m + 2 * q_o) * sympy.Min(1, E_p * z_o, evaluate=False),
    "the optimizer's copies per device of an MoE model: the dense part's, and its experts'",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
M_state_moe = define(
    "moe_model_state_bytes",
    "M_state_moe",
    M_w_moe + M_g_moe + M_o_moe,
    "model states per device of an MoE model on the stage holding the most: the dense part's, and its "
    "experts' with ZeRO sharding over the ranks that hold the same experts",
    "B",
    "[ZeRO §3], [MoE-Folding]",
    simplify=False,
)
# ZeRO-3/FSDP gathers a layer's experts with the layer (each sharded over the ranks that hold the same
# experts, gathered whole): the layers in flight carry theirs, and a stage kept gathered all of its own.
_experts_gathered = (1 - r_k) * u_w * _experts_a_layer + r_k * u_w * P_exp
_experts_kept_grads = r_k * u_g * P_exp * q_g
M_fsdp_moe = define(
    "moe_fsdp_buffer_bytes",
    "M_fsdp_moe",
    _dense(M_fsdp)
    + (1 - r_k) * u_w * f_pf * _experts_a_layer * q_c
    + _experts_gathered * q_c
    + _experts_kept_grads,
    "ZeRO-3/FSDP's gathered weights and unsharded gradients of an MoE model: its dense part's, and the "
    "experts of the layers in flight (or of the whole stage, where kept)",
    "B",
    "[ZeRO §5], [FSDP2]",
)
# A token's k_E routed copies, padded to C_f, each keep their dispatched hidden state (whole on every TP
# rank: the dispatcher gathers a TP group's tokens for its experts) and their expert's intermediates (TP-
# split): as a width, F_ffn + t·H/(2+g) per copy, since a dense layer keeps 2(2+g)F/t bytes per token.
F_mem = define(
    "moe_activation_ffn",
    "F_mem",
    F_sh + C_f * k_E * (F_ffn + t * H / (2 + g)),
    "MLP width whose dense activations equal an MoE layer's: the shared expert's, and for each of a "
    "token's k_E routed copies, times C_f, its dispatched hidden state and its expert's intermediates",
    "elements",
    "[Switch §2.2], [MoE-Folding]",
)
A_moe = define(
    "moe_activation_bytes",
    "A_moe",
    sympy.Subs(A, F_ffn, F_mem),
    "activations per device on the most loaded pipeline stage of an MoE model: the dense layers' at the "
    "width F_mem",
    "B",
    "[Korthikanti22 §4.2], [Switch §2.2]",
    simplify=False,
)
M_fsdp_end_moe = define(
    "moe_fsdp_backward_end_bytes",
    "M_fsdp_end_moe",
    _dense(M_fsdp_end)
    + _experts_gathered * q_c
    + (1 - r_k) * u_w * u_g * _experts_a_layer * q_g
    + _experts_kept_grads,
    "ZeRO-3/FSDP's buffers of an MoE model at the backward's end: its dense part's, and the first layer's "
    "experts gathered with their unsharded gradients (or the whole stage's, where kept)",
    "B",
    "[ZeRO §5], [FSDP2]",
)
M_alloc_moe = define(
    "moe_allocated_memory_bytes",
    "M_alloc_moe",
    sympy.Max(
        M_w_moe + g_p * M_g_moe + M_o_moe + M_fsdp_moe + A_moe, M_state_moe + M_fsdp_end_moe, evaluate=False
    ),
    "the tensors a device of an MoE model holds at the step's peak",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
    simplify=False,
)
define(
    "moe_reserved_memory_bytes",
    "M_res_moe",
    M_alloc_moe + f_fr * (A_moe + M_fsdp_moe),
    "what the caching allocator holds at the peak, for an MoE model",
    "B",
    "[PyTorch-CUDA-Memory]",
    simplify=False,
)
define(
    "moe_training_memory_bytes",
    "M_total_moe",
    M_alloc_moe + f_fr * (A_moe + M_fsdp_moe) + M_fw,
    "device memory a training step of an MoE model needs at its peak",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
    simplify=False,
)
define(
    "moe_n_min_memory",
    "N_min_moe",
    (1 + f_fr)
    * sympy.Subs(replacing(A, {M_cpb: _buffers}), (N, F_ffn), (1, F_mem))
    / (M_dev - M_fw - (M_w_moe + g_p * M_g_moe + M_o_moe + (1 + f_fr) * M_fsdp_moe)),
    "smallest CP degree (real-valued) whose training memory of an MoE model fits M_dev, with flash "
    "attention; negative when the model states alone do not fit",
    "devices",
    "[Korthikanti22 §4]",
    at={phi: 0},
    simplify=False,
)
tau_dp_moe = define(
    "moe_dp_comm_s",
    "tau_DP_moe",
    sympy.Subs(tau_dp, F_ffn, F_sh)
    + (2 - z3) * ((D - 1) * f_tr * X_dn / (t * pp) + (D - E_p) * P_exp) / D * p_g / B_dp,
    "gradient reduction of an MoE model: its dense part (the dense layers' MLPs too) over the D ranks, each "
    "expert's over the D/E_p ranks that hold it",
    "s",
    "[ZeRO §5], [GShard §2]",
)
define(
    "moe_dp_exposed_s",
    "x_DP_moe",
    tau_dp_moe * (1 - o_dp + o_dp / n_bkt),
    "the gradient reduction of an MoE model after the backward ends (as dp_exposed_s)",
    "s",
    "PyTorch DDP, [Megatron21 §5]",
)
define(
    "moe_dp_overflow_s",
    "x_DP_over_moe",
    sympy.Max(o_dp * tau_dp_moe * (n_bkt - 1) / n_bkt, 0),
    "the other buckets' reduction of an MoE model, to be compared with the backward that hides it",
    "s",
    "PyTorch DDP",
)
define(
    "moe_zero3_gather_s",
    "tau_Z3_moe",
    sympy.Subs(FORMULAS["zero3_gather_s"].symbol, F_ffn, F_sh)
    + z3 * 2 * ((D - 1) * X_dn / (t * pp) + (D - E_p) * P_exp) / D * p / B_dp,
    "ZeRO-3 parameter all-gathers of one micro-batch of an MoE model: the dense part over D ranks, the "
    "experts over D/E_p",
    "s",
    "[ZeRO §5.3], [GShard §2]",
)
