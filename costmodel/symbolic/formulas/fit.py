"""Formulas of the group 'fit': the memory of a training step at its peak ([Korthikanti22], [ZeRO], [FSDP2]).

Every byte a device holds at the step's peak, by category: the model states as the framework keeps them,
the buffers ZeRO-3/FSDP gathers, the activations the most loaded stage keeps for its backward, the loss's
logits, the working set of the layer being recomputed and differentiated, the CP scheme's buffers, what
the caching allocator reserves beyond them and what the runtime holds outside the tensors. The peak is
taken where it happens: at the loss, the forward's end on the last stage, or in the backward of a layer.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from costmodel.symbolic.formulas.backward import C_bwd
from costmodel.symbolic.formulas.memory import L
from costmodel.symbolic.formulas.registry import FORMULAS, definer, substitute
from costmodel.symbolic.symbols import (
    F_ffn,
    H,
    M_cpb,
    M_dev,
    M_fw,
    N,
    P_r,
    S,
    T_c,
    V,
    a_d,
    a_g,
    a_k,
    a_o,
    a_q,
    a_u,
    a_v,
    b,
    c_gm,
    c_q,
    d,
    d_qk,
    d_r,
    d_v,
    delta,
    e_m,
    f_b,
    f_fe,
    f_fr,
    f_pf,
    f_tr,
    g,
    g_p,
    h,
    k_l,
    k_li,
    l_f,
    m_la,
    m_mb,
    n_first,
    n_kv,
    n_L,
    n_last,
    n_mid,
    o_act,
    o_opt,
    o_par,
    p,
    p_acc,
    phi,
    phi_u,
    pp,
    q_c,
    q_g,
    q_m,
    q_o,
    q_w,
    r_k,
    r_kv,
    r_lo,
    r_q,
    rho,
    s_ag,
    sigma,
    t,
    u_g,
    u_w,
    v_pp,
    w_op,
    x_ek,
    x_lf,
    x_rep,
    z_g,
    z_o,
    z_w,
)

GROUP = "fit"
define = definer(GROUP)

# GQA's shared K and V as attention receives them. Where the model code repeats them to the query heads first
# (repeat_kv), the CP exchange moves, and attention's backward holds, h heads of them, not n_kv.
n_kv_a = define(
    "attention_kv_heads",
    "n_kv_a",
    n_kv + x_rep * (h - n_kv),
    "K, V heads attention receives: the model's KV heads, or the query heads where the model code repeats K "
    "and V before attention (x_rep = 1)",
    "heads",
    "[torchtitan-code], [torch-CP]",
)

# Activations per layer follow [Korthikanti22 §4] term by term. Stored per token: the two
# norm inputs, the QKV and MLP inputs and two dropout masks, which TP splits only with sequence
# parallelism; Q, K, V, the attention output and the MLP intermediates, which TP splits; and the
# 5·a·s²·b of attention scores, which flash attention and selective recompute do not keep (phi = 0).
# With MHA, a 4H GeLU MLP and dropout this is the paper's sbh(34 + 5as/h); GQA and a gated MLP
# generalise the same terms. Context parallelism leaves S/N tokens per device.
# Multi-head latent attention replaces the Q, K, V projections: queries through a rank-r_q latent (or
# directly), keys and values through one rank-r_kv latent that every head's K (less its shared rotary part) and
# V are projected up from, and a rotary key projected directly; the output projection reads h·d_v.
_q_mla = c_q * r_q * (H + h * d_qk) + (1 - c_q) * H * h * d_qk
A_qkv = define(
    "attention_qkv_params",
    "A_qkv",
    (1 - m_la) * H * (h + 2 * n_kv) * d + m_la * (_q_mla + H * (r_kv + d_r) + r_kv * h * (d_qk - d_r + d_v)),
    "weights of a layer's Q, K, V projections: GQA's, or MLA's latents and their up-projections",
    "1",
    "[Megatron21 §3], [DeepSeek-V2 §2.1]",
)
A_o = define(
    "attention_out_params",
    "A_o",
    (1 - m_la) * h * d * H + m_la * h * d_v * H,
    "weights of a layer's output projection (MLA's reads h value heads of d_v)",
    "1",
    "[Megatron21 §3], [DeepSeek-V2 §2.1]",
)
_latent_norms = m_la * (c_q * r_q + r_kv)
P_layer = define(
    "layer_params",
    "P_layer",
    A_qkv + A_o + (2 + g) * H * F_ffn + 2 * H + _latent_norms,
    "parameters of one layer: Q, K, V, O projections, the MLP (3 matrices when gated), two norms (and MLA's "
    "two latent norms)",
    "1",
    "model arithmetic",
)
# Tensor parallelism splits a layer's projections by heads and its MLP by columns; what it cannot split every
# TP rank keeps whole: the norms, and MLA's down-projections into the latents, which Megatron-Core runs as
# duplicated linears on the sequence-parallel shard of the tokens (about 15 M parameters a layer for
# DeepSeek-V3, 0.9 B over its 61 layers: on every TP rank, not 1/t of them).
R_layer = define(
    "layer_replicated_params",
    "R_layer",
    2 * H + _latent_norms + m_la * H * (c_q * r_q + r_kv + d_r),
    "parameters of one layer every TP rank keeps whole: the two norms, and MLA's down-projections into its "
    "latents with the latents' norms",
    "1",
    "[Megatron-LM]",
)
P_layer_dev = define(
    "layer_device_params",
    "P_layer_t",
    (P_layer - R_layer) / t + R_layer,
    "parameters of one layer a TP rank holds: its 1/t of the split projections and MLP, and the replicated "
    "ones whole",
    "1",
    "[Megatron21 §3], [Megatron-LM]",
)
_whole = n_L * P_layer + e_m * V * H + H
P = define(
    "params",
    "P",
    _whole,
    "parameters: layers, embeddings (input and, untied, output), final norm",
    "1",
    "model arithmetic",
)


# LoRA puts a pair of matrices (in x r, r x out) beside the linear layers it targets of every transformer layer:
# Q, K, V, O and the MLP's unless told (a_q ... a_d); the embeddings and the output layer stay as they are. Only
# the adapters train when the base is frozen, so gradients and optimizer states follow the trainable share, not P.
def lora_widths(tp: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """The summed input and output widths of the matrices LoRA adapts, on one of ``tp`` TP shards: Q, K, V and
    the MLP's input projections read the layer's input (H) whole on every rank, once per adapter (one for
    the fused Q/K/V and one for the fused gate/up where x_lf = 1 [NeMo-LoRA], which adapts the three or the
    two together, else one per matrix [PEFT]), the output and down projections their shard; each writes its
    own width (the row-parallel ones H, before their reduction)."""
    inputs = (
        (a_q + (1 - x_lf) * (a_k + a_v)) * H
        + a_o * h * d / tp
        + (a_u + g * a_g * (1 - x_lf)) * H
        + a_d * F_ffn / tp
    )
    outputs = (a_q * h + (a_k + a_v) * n_kv) * d / tp + a_o * H + (a_u + g * a_g) * F_ffn / tp + a_d * H
    return inputs, outputs


P_ad = define(
    "adapter_params",
    "P_ad",
    n_L * r_lo * sympy.Add(*lora_widths(1)),
    "LoRA adapter parameters: rank r_lo on each matrix of each layer it targets (Q, K, V, O and every MLP "
    "matrix unless told), one adapter on each fused projection where x_lf = 1 (none without adapters)",
    "1",
    "[LoRA §4]",
)
s_tr = define(
    "trainable_share",
    "s_tr",
    f_b + P_ad / P,
    "parameters that train per base parameter: the base's own (1, or 0 frozen) and the adapters'; bound as "
    "f_tr",
    "1",
    "[LoRA §4]",
)


def _on_a_rank(params: sympy.Expr) -> sympy.Expr:
    """What one TP rank holds of ``params`` (written over P_layer and the vocabulary): each layer as P_layer_t,
    the embeddings split by vocabulary, the final norm whole."""
    return params.xreplace({P_layer: P_layer_dev, V: V / t})


# The first stage holds its layers and the input embedding, the last its layers, the output layer and final
# norm (a copy of the embedding when tied, as Megatron keeps one there), a middle stage its layers only.
_stages = (n_first * P_layer + V * H, n_mid * P_layer, n_last * P_layer + V * H + H)
P_t = define(
    "tp_rank_params",
    "P_t",
    _on_a_rank(_whole),
    "parameters one TP rank holds of the whole model: its share of every layer, of the embeddings (split by "
    "vocabulary) and the final norm",
    "1",
    "[Megatron21 §3]",
)
P_stage = define(
    "stage_device_params",
    "P_stage",
    sympy.Piecewise(
        (P_t, sympy.Eq(pp, 1)),
        (sympy.Max(*map(_on_a_rank, _stages), evaluate=False), True),
    ),
    "parameters a device of the pipeline stage holding the most keeps (its TP share): the whole model's at "
    "pp = 1, else the largest of the first stage's (its layers and the input embedding), a middle one's and "
    "the last one's (its layers, the output layer and the final norm)",
    "1",
    "[Megatron21 §2.2]",
)


# The model states of a device holding P_r parameters of its pipeline stage: each copy at the bytes the
# framework keeps it (frameworks/*.yaml) and the share ZeRO leaves it [ZeRO §5]: Megatron's bf16 weights,
# fp32 main gradients, fp32 master weights and moments are 2 + 4 + (4 + 8)/D; FSDP2's fp32 weight, gradient
# and moment shards (4 + 4 + 8)/D. Offload moves the optimizer's copies to the host (o_opt), and the weights
# and gradients too (o_par), leaving two layers' compute weights and gradients in flight.
def replacing(expr: sympy.Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """``expr`` with base symbols replaced, inside the formulas it is written over too: each formula whose
    definition reaches one of them, however deep, is written out (a formula's own symbol stands for its
    value as defined)."""
    formulas = {f.symbol: f.definition for f in FORMULAS.values()}

    def reaches(symbol: sympy.Symbol, seen: frozenset = frozenset()) -> bool:
        free = formulas[symbol].free_symbols
        return bool(free & set(mapping)) or any(
            reaches(s, seen | {symbol}) for s in free if s in formulas and s not in seen
        )

    while written := {s: formulas[s] for s in expr.free_symbols if s in formulas and reaches(s)}:
        expr = substitute(expr, written, carry_out=False)
    return substitute(expr, mapping, carry_out=False)


def at_stage(expr: sympy.Expr, params: sympy.Expr) -> sympy.Expr:
    """``expr``, written over formulas of a device holding P_r parameters, for a device holding ``params``."""
    return replacing(expr, {P_r: params})


P_first = define(
    "first_stage_device_params",
    "P_1",
    sympy.Piecewise((P_t, sympy.Eq(pp, 1)), (_on_a_rank(_stages[0]), True)),
    "parameters a device of the first pipeline stage keeps (its TP share): its layers and the input embedding "
    "(the whole model's at pp = 1)",
    "1",
    "[Megatron21 §2.2]",
)
P_mid = define(
    "middle_stage_device_params",
    "P_2",
    _on_a_rank(_stages[1]),
    "parameters a device of a middle pipeline stage keeps (its TP share): its layers",
    "1",
    "[Megatron21 §2.2]",
)
P_last = define(
    "last_stage_device_params",
    "P_L",
    sympy.Piecewise((P_t, sympy.Eq(pp, 1)), (_on_a_rank(_stages[2]), True)),
    "parameters a device of the last pipeline stage keeps (its TP share): its layers, the output layer and "
    "the final norm",
    "1",
    "[Megatron21 §2.2]",
)
M_w = define(
    "weight_bytes",
    "M_wt",
    (1 - o_par) * P_r * (1 + f_tr - f_b) * q_w * z_w + o_par * 2 * P_layer_dev * q_c,
    "the stored weights a device holding P_r parameters keeps, LoRA adapters included (two layers' in "
    "flight under parameter offload)",
    "B",
    "[ZeRO §3], [ZeRO-Infinity §5]",
)
M_g = define(
    "gradient_bytes",
    "M_gr",
    f_tr * ((1 - o_par) * P_r * q_g * z_g + o_par * 2 * P_layer_dev * q_g),
    "the gradients a device holding P_r parameters keeps for the optimizer (main gradients, or FSDP's "
    "reduced shards), of the parameters that train",
    "B",
    "[ZeRO §3], [ZeRO-Infinity §5]",
)
M_o = define(
    "optimizer_state_bytes",
    "M_opt",
    (1 - o_opt) * f_tr * P_r * (q_m + 2 * q_o) * z_o,
    "the optimizer's copies a device holding P_r parameters keeps: master weights and Adam's two "
    "moments of the parameters that train, their ZeRO share",
    "B",
    "[ZeRO §3], [ZeRO-Offload §4]",
)
# The optimizer step allocates beside the states, for the parameters it steps: the gradients cast to the master
# copy's dtype where they differ (Megatron's .float() of a bf16 main_grad, InternEvo's flat fp32 gradient),
# and under torch's foreach AdamW the square root of the second moment, made whole before the update.
M_ost = define(
    "optimizer_step_bytes",
    "M_ostep",
    (1 - o_opt) * f_tr * P_r * z_o * (c_gm * q_m + f_fe * q_o),
    "what the optimizer step of a device holding P_r parameters allocates beside the states: the gradients "
    "cast to the master copy's dtype, and foreach AdamW's square root of the second moment",
    "B",
    "[PyTorch-AdamW], [Megatron-LM]",
)
# InternEvo's hybrid ZeRO makes the gradients in the backward and, with nothing else to keep them for, frees
# them once flattened and cast to its fp32 master's; a persistent buffer (Megatron's main_grad) or ZeRO-3's
# shards (FSDP steps before it zeroes them) stay through the step.
k_gs = define(
    "optimizer_step_gradient_share",
    "k_gs",
    1 - c_gm * (1 - g_p) * (1 - u_g),
    "the share of the gradients still held while the optimizer steps: all of them, or none where they are "
    "made each step, cast to the master copy and freed (InternEvo's hybrid ZeRO)",
    "1",
    "[InternEvo]",
)
M_state = define(
    "model_state_bytes",
    "M_state",
    at_stage(M_w + M_g + M_o, P_stage),
    "weights, gradients, master weights and Adam moments per device, as the framework keeps them, on the "
    "stage holding the most parameters; what offload keeps in host memory is left out",
    "B",
    "[ZeRO §3], [ZeRO-Offload §4], [ZeRO-Infinity §5]",
    simplify=False,
)
# ZeRO-3/FSDP runs each layer on a gathered compute copy. In the forward and the backward: the largest unit
# computing (a layer, or the output layer at the loss) and the f_pf layers prefetched; their unsharded
# gradients come and go with each layer, after the activations have begun to shrink. Where the framework does
# not reshard (torchtitan under PP), every layer of the stage stays gathered for the step, and the stage's
# unsharded gradients accumulate over its micro-batches; autocast caches a cast of every weight likewise.
_unit = sympy.Max(P_layer_dev, V * H / t, evaluate=False)
_kept_whole = r_k * P_r * (u_w * q_c + u_g * q_g)
M_fsdp = define(
    "fsdp_buffer_bytes",
    "M_fsdp",
    (1 - r_k) * u_w * (_unit + f_pf * P_layer_dev) * q_c + _kept_whole,
    "ZeRO-3/FSDP's gathered compute weights (and unsharded gradients, where kept) of a device holding "
    "P_r parameters in its forward and backward: the units in flight, or the whole stage's where kept",
    "B",
    "[ZeRO §5], [FSDP2]",
)
# At the backward's end every gradient has been made; the first unit (the embedding, or the first layer) is
# gathered with its unsharded gradient before the reduce-scatter.
M_fsdp_end = define(
    "fsdp_backward_end_bytes",
    "M_fsdp_end",
    (1 - r_k) * u_w * _unit * (q_c + u_g * q_g) + _kept_whole,
    "ZeRO-3/FSDP's buffers of a device holding P_r parameters at the backward's end: the first unit gathered with "
    "its unsharded gradient, or the whole stage's where kept",
    "B",
    "[ZeRO §5], [FSDP2]",
)
# FSDP2 keeps each reduce-scatter's input, the unit's unsharded gradients in the reduction's dtype, until the
# next unit's reduce-scatter is issued (reduce_scatter_max_input_buffers = 1), so that the two overlap: a
# layer's backward holds its predecessor's, at a stage's first the largest unit's (the output layer's). The
# layer's backward has that layer gathered, not the largest unit as at the loss.
M_rs = define(
    "fsdp_reduce_scatter_bytes",
    "M_rs",
    (1 - r_k) * u_w * u_g * _unit * q_g,
    "the unsharded gradients FSDP2 holds as the last reduce-scatter's input while the next unit's backward "
    "runs: the largest unit's",
    "B",
    "[FSDP2]",
)
M_fbx = define(
    "fsdp_backward_extra_bytes",
    "M_fsdp_bx",
    M_rs + (1 - r_k) * u_w * (P_layer_dev - _unit) * q_c,
    "what ZeRO-3/FSDP holds in a layer's backward beyond its buffers at the loss: the last reduce-scatter's "
    "input, and a layer gathered in place of the largest unit",
    "B",
    "[FSDP2]",
)
_split = sigma / t + 1 - sigma  # the share of the sequence-parallel terms a device keeps
# The attention's and the MLP's inputs (2H bytes a token each): a shard under sequence parallel where the
# linear gathers it again in its backward, whole where it keeps the gathered input (DTensor).
_gathered = s_ag + (1 - s_ag) * _split
# What eager torch ops keep beyond fused kernels (the torch reference's eager mode, costmodel/kernel/memory.py):
# an RMSNorm's fp32 upcast of its input beside its bf16 output, 4H bytes a token more than a fused norm's
# input; the SwiGLU's silu(gate), kept for the product's backward.
_eager_norm = b * L * 4 * H
_eager_silu = b * L * 2 * g * F_ffn / t
# Activations per layer follow [Korthikanti22 §4] term by term (see layer_activation_bytes above).
A_layer = define(
    "layer_activation_bytes",
    "A_layer",
    b
    * L
    * (
        (4 + 2 * delta) * H * _split
        + 2 * k_li * H * _gathered
        + (4 * h * d + (2 - k_li) * h * d + 4 * n_kv_a * d + (2 * (1 + g) + k_li) * F_ffn) / t
        + 5 * phi * h * L / t
    )
    + x_ek * (2 * _eager_norm * _split + _eager_silu),
    "activations one layer keeps for its backward, per device, without recompute (the attention's, the MLP's "
    "and its second projection's inputs at k_li bytes an element, and where that is FP8 a copy of the "
    "attention output beside the kernel's own); eager torch ops keep more: "
    "each RMSNorm its fp32 upcast beside its bf16 output (4H bytes a token more than a fused norm's input), "
    "the SwiGLU silu(gate) for the product's backward (2F)",
    "B",
    "[Korthikanti22 §4.1]",
)
A_in = define(
    "layer_input_bytes",
    "A_input",
    b * L * 2 * H * _split,
    "the layer input: all a layer keeps under full recompute",
    "B",
    "[Korthikanti22 §5]",
)
# Op-level selective recompute (torchtitan's) keeps the layer's input and every second matrix multiply's
# output (Q, V, the MLP's first input projection and its output, in the order they run), the attention's
# output and its fp32 log-sum-exp; the norms, the other projections and the elementwise work are recomputed.
A_op = define(
    "layer_op_checkpoint_bytes",
    "A_op",
    b * L * (2 * H * _split + 2 * (2 * h * d + n_kv * d + F_ffn) / t + 2 * H * _split + p_acc * h / t),
    "activations one layer keeps under op-level selective recompute",
    "B",
    "torchtitan activation_checkpoint.py",
)
A_kept = define(
    "layer_kept_bytes",
    "A_kept",
    (1 - rho) * ((1 - w_op) * A_layer + w_op * A_op) + rho * A_in,
    "activations one layer keeps for its backward under the job's recompute: all of them, the op-level "
    "checkpoints, or its input",
    "B",
    "[Korthikanti22 §5]",
)
# The backward of one layer at a time: under full recompute its activations return whole; under op-level
# recompute those it dropped; and the gradients in flight while it is differentiated: in its MLP the
# intermediates' and the hidden state's, in its attention Q's, K's and V's beside the CP scheme's buffers,
# whichever are more (the torch reference, costmodel/kernel/memory.py, holds 3F + H two-byte elements a
# token at the MLP's peak).
W_mlp = define(
    "mlp_gradient_bytes",
    "W_mlpg",
    b * L * ((2 + g) * F_ffn / t + H * _split) * p,
    "the gradients in flight in a layer's MLP backward: its intermediates' and the hidden state's",
    "B",
    "[Korthikanti22 §4.1]",
)
W_att = define(
    "attention_gradient_bytes",
    "W_attg",
    b * L * (h + 2 * n_kv_a) * d / t * p + M_cpb,
    "the gradients in flight in a layer's attention backward, Q's, K's and V's (the heads attention received), "
    "with the CP scheme's buffers",
    "B",
    "[FA2 §4], [RingAttn §3]",
)
W_l = define(
    "layer_backward_working_bytes",
    "W_layer",
    rho * (A_layer - x_ek * _eager_silu)
    + (1 - rho) * w_op * (A_layer - A_op)
    + (phi_u - phi) * 5 * b * h * L**2 / t
    + sympy.Max(W_mlp, W_att, evaluate=False),
    "the backward's working set beyond the kept activations: the layer being recomputed (an eager "
    "silu(gate) freed by the product's backward before the MLP's gradients peak, the norms' fp32 copies "
    "kept until their own), an unfused attention's scores, softmax and dropout mask made again where they "
    "were not kept, and the gradients in flight in its MLP or in its attention with the CP scheme's "
    "buffers, whichever are more",
    "B",
    "[Korthikanti22 §5]",
)
# The output layer's input, the final hidden state, stays for its backward.
A_out = define(
    "output_activation_bytes",
    "A_output",
    b * L * 2 * H,
    "the final hidden state, kept for the output layer's backward",
    "B",
    "[Korthikanti22 §4.2]",
)
# The loss holds the logits of its tokens (all of the micro-batch's, or a chunk's) at k_l bytes each at its
# peak: Megatron's vocab-parallel cross-entropy upcasts, subtracts the maximum and exponentiates in place
# and differentiates into the softmax it kept (about 6: the bf16 logits and one fp32 copy); torch's
# cross_entropy over logits.float() keeps the upcast, the log-softmax and its gradient (12, measured on
# fake tensors, costmodel/kernel/memory.py). A fused linear cross-entropy also holds the hidden state's
# gradient and the output layer's weight gradient from its forward on.
L_t = define(
    "loss_working_bytes",
    "W_loss",
    sympy.Min(b * L, T_c, evaluate=False) * V / t * k_l
    + l_f * (b * L * 2 * H + V * H / t * q_c)
    + x_ek * _eager_norm,
    "the loss's working set at its peak: the logits of the tokens computed at once, as the framework's "
    "cross-entropy holds them; a fused loss's gradients of the hidden state and the output layer; an eager "
    "final RMSNorm's fp32 upcast, kept until its backward",
    "B",
    "[Korthikanti22 §4.2], [Liger]",
)


def _in_flight(rank: sympy.Expr) -> sympy.Expr:
    """Micro-batches' worth of its layers that pipeline stage ``rank`` (0 the first) keeps for backward at
    the peak. 1F1B: the warm-up's pp - rank - 1 forwards and one more, at most m [Megatron21 §2.2].
    Interleaved: 2(pp - rank - 1) + (v - 1)·pp + 1 model chunks of 1/v of its layers, at most the m·v
    there are; on the first stage 1 + (pp - 1)/(pp·v) times the 1F1B figure [Korthikanti22 §4.2]."""
    return sympy.Piecewise(
        (sympy.Min(m_mb, pp - rank), sympy.Eq(v_pp, 1)),
        (sympy.Min(m_mb * v_pp, 2 * (pp - rank - 1) + (v_pp - 1) * pp + 1, evaluate=False) / v_pp, True),
    )


I_first = define(
    "first_stage_in_flight",
    "I_1",
    _in_flight(0),
    "micro-batches' worth of its layers the first pipeline stage keeps for backward at the peak: pp under "
    "1F1B, fewer when the step has fewer micro-batches, 1 + (pp - 1)/(pp·v) times more interleaved",
    "1",
    "[Korthikanti22 §4.2]",
)
define(
    "second_stage_in_flight",
    "I_2",
    _in_flight(1),
    "micro-batches' worth of its layers the second pipeline stage keeps for backward at the peak",
    "1",
    "[Korthikanti22 §4.2]",
)
define(
    "last_stage_in_flight",
    "I_L",
    _in_flight(pp - 1),
    "micro-batches' worth of its layers the last pipeline stage keeps for backward at the peak: one under "
    "1F1B",
    "1",
    "[Korthikanti22 §4.2]",
)
# The peak of each stage: its kept activations and, where it runs, the loss's working set at the forward's
# end or the backward's working set, whichever is larger (the loss's logits are freed before the backward
# of the last layer starts). The most loaded stage is the first (most micro-batches in flight), the second
# (the first middle stage, which may hold more layers) or the last (the output layer and the loss).
_backward = W_l + M_fbx


def _with_loss(backward: sympy.Expr) -> sympy.Expr:
    """The last stage's beyond its layers: the final hidden state, and the loss's working set at the forward's
    end or ``backward``, the backward's."""
    return A_out + sympy.Max(L_t, backward, evaluate=False)


def _stage_activations(
    first_layers: sympy.Expr, backward: sympy.Expr
) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """Each stage's activations at its peak, the first stage's layers keeping ``first_layers`` bytes a
    micro-batch, a layer's backward holding ``backward``."""
    return (
        I_first * first_layers + backward,
        _in_flight(1) * n_mid * A_kept + backward,
        _in_flight(pp - 1) * n_last * A_kept + _with_loss(backward),
    )


def activations(
    first_layers: sympy.Expr, all_layers: sympy.Expr, backward: sympy.Expr = _backward
) -> sympy.Expr:
    """The activations at the peak of the most loaded stage (the first stage's layers keeping
    ``first_layers`` bytes a micro-batch, the whole model's ``all_layers``, a layer's backward ``backward``),
    two layers' under offload."""
    last = _with_loss(backward)
    staged = sympy.Max(*_stage_activations(first_layers, backward), evaluate=False)
    kept = sympy.Piecewise((all_layers + last, sympy.Eq(pp, 1)), (staged, True))
    return (1 - o_act) * kept + o_act * (2 * A_kept + last)


# Activation offload (o_act) keeps about two layers' in flight on the device: the one computing and the one
# whose copy to (forward) or from (backward) the host is under way [ZeRO-Infinity §5].
A = define(
    "activation_bytes",
    "A",
    activations(n_first * A_kept, n_L * A_kept),
    "activations per device at the peak on the most loaded pipeline stage: its layers' kept activations for "
    "the micro-batches in flight, with the loss's or the backward's working set; two layers' under "
    "activation offload",
    "B",
    "[Korthikanti22 §4.2], [ZeRO-Infinity §5]",
    simplify=False,  # a sum of maxima: sympy's simplify takes minutes and gains nothing to evaluate
)
_buffers = (2 * C_bwd * n_kv_a / n_kv + b * h * L * d * p_acc) / t
R_buf = define(
    "ring_buffer_bytes",
    "M_ring",
    sympy.Min(N - 1, 1, evaluate=False) * _buffers,
    "ring buffers of the larger pass, backward: two KV + fp32 dK/dV blocks in flight and fp32 dQ, "
    "for a TP rank's heads; none at N = 1",
    "B",
    "[RingAttn §3]",
)
define(
    "allgather_buffer_bytes",
    "M_ag",
    sympy.Min(N - 1, 1, evaluate=False) * b * S * 2 * n_kv_a * d * (p + p_acc) / t,
    "all-gather CP's buffers of the larger pass, backward: the whole sequence's K and V gathered, and their "
    "fp32 gradients before the reduce-scatter, for the KV heads a TP rank's attention receives",
    "B",
    "[Llama3 §3.3]",
)
define(
    "ulysses_buffer_bytes",
    "M_a2a",
    sympy.Min(N - 1, 1, evaluate=False) * 2 * b * L * (h + 2 * n_kv) * d * p / t,
    "all-to-all CP's buffers: Q, K and V of the shard's tokens sent and the head groups received",
    "B",
    "[Ulysses §3]",
)


# Each stage's peak is in its forward and backward (its states, the gradients only where they persist,
# FSDP's buffers, its activations with the loss's or the backward's working set) or at the backward's end:
# every other gradient made while the first layer's backward runs, on its own input and working set (where
# gradients are made as the backward goes, FSDP's, this can be the larger); the step's peak is the largest
# stage's, at its own moment.
def allocated(
    forward: sympy.Expr,
    ended: sympy.Expr,
    stepping: sympy.Expr,
    stages: tuple[dict, dict, dict],
    largest: dict,
    layers: tuple[sympy.Expr, sympy.Expr] = (n_first * A_kept, n_L * A_kept),
    width: Callable[[sympy.Expr], sympy.Expr] = lambda activations: activations,
    backward: sympy.Expr = _backward,
) -> sympy.Expr:
    """The step's peak of states ``forward`` (in the forward and backward), ``ended`` (at the backward's end)
    and ``stepping`` (in the optimizer step, every activation freed), written over the parameters a stage holds, bound per stage by ``stages`` (first, middle, last; the
    first at pp = 1 is the whole model) and under activation offload by ``largest``; the first stage's and the
    whole model's layers keep ``layers`` a micro-batch, a layer's backward holds ``backward``, the
    activations read at ``width``."""

    def running(at: dict, kept: sympy.Expr) -> sympy.Expr:
        return replacing(forward, at) + width(kept)

    def end(at: dict) -> sympy.Expr:
        return replacing(ended, at) + width(A_kept + W_l)

    def step(at: dict) -> sympy.Expr:
        return replacing(stepping, at)

    first, whole = layers
    last = _with_loss(backward)
    one = running(stages[0], whole + last), end(stages[0]), step(stages[0])
    staged = (
        *map(running, stages, _stage_activations(first, backward)),
        *map(end, stages),
        *map(step, stages),
    )
    offloaded = running(largest, 2 * A_kept + last), end(largest), step(largest)
    peak = sympy.Piecewise(
        (sympy.Max(*one, evaluate=False), sympy.Eq(pp, 1)), (sympy.Max(*staged, evaluate=False), True)
    )
    return (1 - o_act) * peak + o_act * sympy.Max(*offloaded, evaluate=False)


# What is allocated and freed again within a step: activations, FSDP's gathered copies, gradients that do not
# persist (made in the backward, freed by zero_grad or once cast) and the optimizer step's temporaries.
_churn = A + at_stage(M_fsdp + (1 - g_p) * M_g + M_ost, P_stage)
M_alloc = define(
    "allocated_memory_bytes",
    "M_alloc",
    allocated(
        M_w + g_p * M_g + M_o + M_fsdp,
        M_w + M_g + M_o + M_fsdp_end,
        M_w + k_gs * M_g + M_o + M_ost,
        ({P_r: P_first}, {P_r: P_mid}, {P_r: P_last}),
        {P_r: P_stage},
    ),
    "the tensors a device of the most loaded stage holds at the step's peak: in the forward and backward its "
    "model states, the buffers of ZeRO-3/FSDP and of the CP scheme and the activations with the loss's or "
    "the backward's working set; at the backward's end every state, with the first layer's backward; in "
    "the optimizer step the weights, the gradients it still holds and the optimizer's states, with what the "
    "step allocates",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
    simplify=False,
)
define(
    "reserved_memory_bytes",
    "M_res",
    M_alloc + f_fr * _churn,
    "what the caching allocator holds at the peak (torch.cuda.max_memory_reserved): the tensors, and a share "
    "of what comes and goes each step (activations, gathered weights, gradients made each step, the "
    "optimizer step's temporaries) it keeps cached; "
    "the states, made once, it does not multiply",
    "B",
    "[PyTorch-CUDA-Memory]",
    simplify=False,
)
define(
    "training_memory_bytes",
    "M_total",
    M_alloc + f_fr * _churn + M_fw,
    "device memory a training step needs at its peak: the allocator's reservation and the runtime's own",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
    simplify=False,
)
# With flash attention (phi = 0) the activations, the loss and the ring's buffers all scale as 1/N once N > 1,
# so a stage fits from N = (its 1/N part at N = 1) / (the memory its states and runtime leave free); the most
# loaded stage sets N. A chunked loss's working set is held at the job's chunk.
define(
    "n_min_memory",
    "N_min",
    (1 + f_fr)
    * sympy.Subs(replacing(A, {M_cpb: _buffers}), N, 1)
    / (M_dev - M_fw - at_stage(M_w + g_p * M_g + M_o + (1 + f_fr) * M_fsdp, P_stage)),
    "smallest CP degree (real-valued) whose training memory fits M_dev with the ring's buffers, with flash "
    "attention; negative when the model states alone do not fit",
    "devices",
    "[Korthikanti22 §4]",
    at={phi: 0},
    simplify=False,
)
