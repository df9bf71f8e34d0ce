"""Formulas of the group 'moe': define("""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.fit import (
    A_kept,
    M_fbx,
    M_fsdp,
    M_fsdp_end,
    M_g,
    M_o,
    M_ost,
    M_w,
    P,
    P_first,
    P_last,
    P_mid,
    W_att,
    W_l,
    W_mlp,
    _buffers,
    activations,
    allocated,
    k_gs,
    replacing,
)
from costmodel.symbolic.formulas.registry import FORMULAS, definer
from costmodel.symbolic.formulas.step import D_w, P_dev, tau_dp
from costmodel.symbolic.symbols import (
    B_dp,
    B_ep,
    B_hbm,
    C_f,
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
    P_r,
    P_x,
    S,
    b,
    c_gm,
    f_fe,
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
# experts there, on the first stage. At pp = 1 the first and the last stage are the whole model.
_moe_first = sympy.Piecewise((n_L - n_dn, sympy.Eq(pp, 1)), (n_first - n_dn, True))
_moe_last = sympy.Piecewise((n_L - n_dn, sympy.Eq(pp, 1)), (n_last, True))
P_x1 = define(
    "moe_first_stage_expert_params",
    "P_x1",
    _moe_first * _experts_a_layer,
    "expert parameters a device of the first pipeline stage holds: its n_E/E_p experts of each of the "
    "stage's MoE layers, TP-split, and the routers (the whole model's at pp = 1)",
    "1",
    "[GShard §2], [DeepSeek-V3 §4.2]",
)
P_x2 = define(
    "moe_middle_stage_expert_params",
    "P_x2",
    n_mid * _experts_a_layer,
    "expert parameters a device of a middle pipeline stage holds",
    "1",
    "[GShard §2]",
)
P_xL = define(
    "moe_last_stage_expert_params",
    "P_xL",
    _moe_last * _experts_a_layer,
    "expert parameters a device of the last pipeline stage holds (the whole model's at pp = 1)",
    "1",
    "[GShard §2]",
)
P_exp = define(
    "moe_device_expert_params",
    "P_exp",
    sympy.Max(P_x1, P_x2, P_xL, evaluate=False),
    "expert weights one device holds on the stage holding the most: its n_E/E_p experts of each of the "
    "stage's MoE layers, TP-split, and the routers",
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
    k_opt * P_exp * sympy.Min(1, E_p * z_o, evaluate=False) / B_hbm,
    "optimizer step over the device's expert weights: Adam over their fp32 states, sharded under ZeRO over "
    "the D·N/E_p ranks that hold the same experts (E_p times the dense share z_o), memory-bound",
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
    sympy.Subs(P, F_ffn, F_sh) + X_dn + (n_L - n_dn) * sympy.Subs(_experts_a_layer, (E_p, t), (1, 1)),
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
# A stage of an MoE model holds a dense part, P_r as the dense formulas count it (each layer's MLP at the
# shared expert's width; on the first stage the dense layers' MLPs beside) and P_x of experts. ZeRO shards the
# experts' states over the D/E_p ranks holding the same experts: E_p times the dense part's share.
P_d1 = define(
    "moe_first_stage_dense_params",
    "P_d1",
    sympy.Subs(P_first, F_ffn, F_sh) + X_dn / t,
    "the dense part of an MoE model a device of the first pipeline stage holds: its layers with each MLP at "
    "the shared expert's width, the dense layers' MLPs and the input embedding (the whole model's at pp = 1)",
    "1",
    "[Megatron21 §2.2], [DeepSeek-V3 §4.2]",
)
P_d2 = define(
    "moe_middle_stage_dense_params",
    "P_d2",
    sympy.Subs(P_mid, F_ffn, F_sh),
    "the dense part of an MoE model a device of a middle pipeline stage holds",
    "1",
    "[Megatron21 §2.2]",
)
P_dL = define(
    "moe_last_stage_dense_params",
    "P_dL",
    sympy.Subs(P_last, F_ffn, F_sh),
    "the dense part of an MoE model a device of the last pipeline stage holds: its layers, the output layer "
    "and the final norm (the whole model's at pp = 1)",
    "1",
    "[Megatron21 §2.2]",
)
P_d = define(
    "moe_stage_dense_params",
    "P_d",
    sympy.Max(P_d1, P_d2, P_dL, evaluate=False),
    "the dense part of an MoE model a device holds on the stage holding the most of it",
    "1",
    "[Megatron21 §2.2]",
)
_stages = ({P_r: P_d1, P_x: P_x1}, {P_r: P_d2, P_x: P_x2}, {P_r: P_dL, P_x: P_xL})
# Where one stage stands for all (activation offload, the allocator's cache): the most of either part.
_largest = {P_r: P_d, P_x: P_exp}


def _dense(bytes_of_stage: sympy.Expr) -> sympy.Expr:
    """A dense formula of a device holding P_r parameters, for an MoE model's dense part."""
    return sympy.Subs(bytes_of_stage, F_ffn, F_sh)


_OF_A_STAGE = "of a device holding P_r parameters of its stage's dense part and P_x of its experts"
M_w_moe = define(
    "moe_weight_bytes",
    "M_w_moe",
    _dense(M_w) + P_x * q_w * sympy.Min(1, E_p * z_w, evaluate=False),
    f"the stored weights of an MoE model {_OF_A_STAGE}: the dense part's, and the experts' with ZeRO "
    "sharding over the ranks that hold the same experts",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
M_g_moe = define(
    "moe_gradient_bytes",
    "M_g_moe",
    _dense(M_g) + P_x * q_g * sympy.Min(1, E_p * z_g, evaluate=False),
    f"the gradients of an MoE model {_OF_A_STAGE}: the dense part's, and the experts'",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
M_o_moe = define(
    "moe_optimizer_state_bytes",
    "M_o_moe",
    _dense(M_o) + P_x * (q_m + 2 * q_o) * sympy.Min(1, E_p * z_o, evaluate=False),
    f"the optimizer's copies of an MoE model {_OF_A_STAGE}: the dense part's, and the experts'",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
M_ost_moe = define(
    "moe_optimizer_step_bytes",
    "M_ostep_moe",
    _dense(M_ost) + P_x * (c_gm * q_m + f_fe * q_o) * sympy.Min(1, E_p * z_o, evaluate=False),
    f"what the optimizer step of an MoE model allocates beside the states {_OF_A_STAGE}: the dense part's, and "
    "the experts'",
    "B",
    "[PyTorch-AdamW], [Megatron-LM]",
)
M_state_moe = define(
    "moe_model_state_bytes",
    "M_state_moe",
    sympy.Max(*(replacing(M_w_moe + M_g_moe + M_o_moe, at) for at in _stages), evaluate=False),
    "model states per device of an MoE model on the stage holding the most: its dense part's, and its "
    "experts' with ZeRO sharding over the ranks that hold the same experts",
    "B",
    "[ZeRO §3], [MoE-Folding]",
    simplify=False,
)
# ZeRO-3/FSDP gathers a layer's experts with the layer (each sharded over the ranks that hold the same
# experts, gathered whole): the layers in flight carry theirs, and a stage kept gathered all of its own.
_experts_kept = r_k * P_x * (u_w * q_c + u_g * q_g)
M_fsdp_moe = define(
    "moe_fsdp_buffer_bytes",
    "M_fsdp_moe",
    _dense(M_fsdp) + (1 - r_k) * u_w * (1 + f_pf) * _experts_a_layer * q_c + _experts_kept,
    f"ZeRO-3/FSDP's gathered weights and unsharded gradients of an MoE model {_OF_A_STAGE}: the dense "
    "part's, and the experts of the layers in flight (or of the whole stage, where kept)",
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

# At the backward's end the first layer's experts are gathered in their own backward, beside the MLP's working
# set; once it ends they are resharded and their unsharded gradients wait as a reduce-scatter's input beside the
# attention's backward, the smaller working set (the torch reference holds the two apart).
_mlp_over_attention = sympy.Subs(sympy.Max(W_mlp, W_att, evaluate=False) - W_att, F_ffn, F_mem)
M_fsdp_end_moe = define(
    "moe_fsdp_backward_end_bytes",
    "M_fsdp_end_moe",
    _dense(M_fsdp_end)
    + (1 - r_k)
    * u_w
    * sympy.Max(_experts_a_layer * q_c, _experts_a_layer * u_g * q_g - _mlp_over_attention, evaluate=False)
    + _experts_kept,
    f"ZeRO-3/FSDP's buffers at the backward's end of an MoE model {_OF_A_STAGE}: the dense part's, and the "
    "first layer's experts gathered in the MLP's backward or their unsharded gradients beside the "
    "attention's, whichever moment holds more (or the whole stage's, where kept)",
    "B",
    "[ZeRO §5], [FSDP2]",
)

# The dense layers keep a dense layer's activations at their own width, on the first stage. A layer's backward
# holds its working set and FSDP's extra of its dense part: the torch reference peaks in the experts'
# backward, the reduce-scatter input it holds the previous dense unit's (the experts' own is issued, and
# dropped, before the next).
_dense_kept = n_dn * sympy.Subs(A_kept, F_ffn, F_dn)
_layers = ((n_first - n_dn) * A_kept + _dense_kept, (n_L - n_dn) * A_kept + _dense_kept)
_backward = W_l + sympy.Subs(M_fbx, F_ffn, F_sh)


def _at_mem_width(kept: sympy.Expr) -> sympy.Expr:
    return sympy.Subs(kept, F_ffn, F_mem)


A_moe = define(
    "moe_activation_bytes",
    "A_moe",
    _at_mem_width(activations(*_layers, _backward)),
    "activations per device on the most loaded pipeline stage of an MoE model: the dense formula's with each "
    "MoE layer at the width F_mem, the dense layers at theirs",
    "B",
    "[Korthikanti22 §4.2], [Switch §2.2]",
    simplify=False,
)
M_alloc_moe = define(
    "moe_allocated_memory_bytes",
    "M_alloc_moe",
    allocated(
        M_w_moe + g_p * M_g_moe + M_o_moe + M_fsdp_moe,
        M_w_moe + M_g_moe + M_o_moe + M_fsdp_end_moe,
        M_w_moe + k_gs * M_g_moe + M_o_moe + M_ost_moe,
        _stages,
        _largest,
        _layers,
        _at_mem_width,
        _backward,
    ),
    "the tensors a device of the most loaded stage of an MoE model holds at the step's peak: each stage's "
    "own dense part, experts and activations",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
    simplify=False,
)
_churn = A_moe + replacing(M_fsdp_moe + (1 - g_p) * M_g_moe + M_ost_moe, _largest)
define(
    "moe_reserved_memory_bytes",
    "M_res_moe",
    M_alloc_moe + f_fr * _churn,
    "what the caching allocator holds at the peak, for an MoE model",
    "B",
    "[PyTorch-CUDA-Memory]",
    simplify=False,
)
define(
    "moe_training_memory_bytes",
    "M_total_moe",
    M_alloc_moe + f_fr * _churn + M_fw,
    "device memory a training step of an MoE model needs at its peak",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
    simplify=False,
)
define(
    "moe_n_min_memory",
    "N_min_moe",
    (1 + f_fr)
    * sympy.Subs(replacing(A_moe, {M_cpb: _buffers}), N, 1)
    / (M_dev - M_fw - replacing(M_w_moe + g_p * M_g_moe + M_o_moe + (1 + f_fr) * M_fsdp_moe, _largest)),
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
    + (2 - z3) * ((D_w - 1) * f_tr * X_dn / (t * pp) + (D_w - E_p) * P_exp) / D_w * p_g / B_dp,
    "gradient reduction of an MoE model: its dense part (the dense layers' MLPs too) over the D·N ranks "
    "holding the same weights (DP x CP), each expert's over the D·N/E_p ranks that hold it",
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
    + z3 * 2 * ((D_w - 1) * X_dn / (t * pp) + (D_w - E_p) * P_exp) / D_w * p / B_dp,
    "ZeRO-3 parameter all-gathers of one micro-batch of an MoE model: the dense part over the D·N ranks of "
    "DP x CP, the experts over D·N/E_p",
    "s",
    "[ZeRO §5.3], [GShard §2]",
)
