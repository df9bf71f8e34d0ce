"""Formulas of the group 'fit': Memory fit of a training step ([Korthikanti22])."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.backward import C_bwd
from costmodel.symbolic.formulas.memory import L
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import (
    F_ffn,
    H,
    M_dev,
    N,
    V,
    b,
    d,
    delta,
    e_m,
    g,
    h,
    m_mb,
    n_first,
    n_kv,
    n_L,
    n_last,
    n_mid,
    o_act,
    o_opt,
    o_par,
    p_acc,
    phi,
    pp,
    rho,
    sigma,
    t,
    v_pp,
    z_g,
    z_o,
    z_w,
)

GROUP = "fit"
define = definer(GROUP)

# Activations per layer follow [Korthikanti22 §4] term by term. Stored per token: the two
# norm inputs, the QKV and MLP inputs and two dropout masks, which TP splits only with sequence
# parallelism; Q, K, V, the attention output and the MLP intermediates, which TP splits; and the
# 5·a·s²·b of attention scores, which flash attention and selective recompute do not keep (phi = 0).
# With MHA, a 4H GeLU MLP and dropout this is the paper's sbh(34 + 5as/h); GQA and a gated MLP
# generalise the same terms. Context parallelism leaves S/N tokens per device.
P_layer = define(
    "layer_params",
    "P_layer",
    H * d * (2 * h + 2 * n_kv) + (2 + g) * H * F_ffn + 2 * H,
    "parameters of one layer: Q, K, V, O projections, the MLP (3 matrices when gated), two norms",
    "1",
    "model arithmetic",
)
P = define(
    "params",
    "P",
    n_L * P_layer + e_m * V * H + H,
    "parameters: layers, embeddings (input and, untied, output), final norm",
    "1",
    "model arithmetic",
)
# The first stage holds its layers and the input embedding, the last its layers, the output layer and final
# norm (a copy of the embedding when tied, as Megatron keeps one there), a middle stage its layers only.
P_stage = define(
    "stage_params",
    "P_stage",
    sympy.Piecewise(
        (P, sympy.Eq(pp, 1)),
        (
            sympy.Max(
                n_first * P_layer + V * H, n_mid * P_layer, n_last * P_layer + V * H + H, evaluate=False
            ),
            True,
        ),
    ),
    "parameters of the pipeline stage holding the most: the whole model at pp = 1, else the largest of the "
    "first (its layers and the input embedding), a middle and the last stage (its layers, the output layer "
    "and the final norm)",
    "1",
    "[Megatron21 §2.2]",
)
# bf16 weights, fp32 grads, fp32 master + 2 Adam moments; offload moves the optimizer's 12 bytes to the host
# (o_opt), and the weights and gradients too (o_par), leaving two layers' gathered ones in flight.
_state_bytes = (1 - o_par) * (2 * z_w + 4 * z_g) + (1 - o_opt) * 12 * z_o
M_state = define(
    "model_state_bytes",
    "M_state",
    P_stage / t * _state_bytes + o_par * 2 * P_layer / t * (2 + 4),
    "bf16 weights, fp32 gradients, fp32 master weights and Adam moments, per device, on the stage "
    "holding the most parameters; what offload keeps in host memory is left out (two layers' weights and "
    "gradients stay in flight under parameter offload)",
    "B",
    "[ZeRO §3], [ZeRO-Offload §4], [ZeRO-Infinity §5]",
)
_split = sigma / t + 1 - sigma  # the share of the sequence-parallel terms a device keeps
A_layer = define(
    "layer_activation_bytes",
    "A_layer",
    b
    * L
    * (
        (8 + 2 * delta) * H * _split
        + (4 * h * d + 4 * n_kv * d + 2 * (2 + g) * F_ffn) / t
        + 5 * phi * h * L / t
    ),
    "activations one layer keeps for its backward, per device",
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
A_out = define(
    "output_activation_bytes",
    "A_output",
    b * L * (2 * H + 4 * V / t),
    "final hidden state and the fp32 softmax of the vocab-parallel cross-entropy",
    "B",
    "[Korthikanti22 §4.2]",
)
A_kept = (1 - rho) * A_layer + rho * A_in  # what one layer keeps for its backward


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
# The stage that keeps the most: the first (most micro-batches in flight), the second (the first middle
# stage, which may hold more layers) or the last (one micro-batch, and the output layer's logits).
_stage_activations = (
    I_first * n_first * A_kept,
    _in_flight(1) * n_mid * A_kept,
    _in_flight(pp - 1) * n_last * A_kept + A_out,
)
# Activation offload (o_act) keeps about two layers' in flight on the device: the one computing and the one
# whose copy to (forward) or from (backward) the host is under way [ZeRO-Infinity §5].
A = define(
    "activation_bytes",
    "A",
    (1 - o_act)
    * sympy.Piecewise(
        (n_L * A_kept + A_out, sympy.Eq(pp, 1)), (sympy.Max(*_stage_activations, evaluate=False), True)
    )
    + o_act * (2 * A_kept + A_out),
    "activations per device on the most loaded pipeline stage: n_L layers' worth and the output "
    "layer at pp = 1; else the largest of the first stage (I_1 micro-batches of its layers), the second "
    "and the last (its layers and the output layer); two layers' and the output layer under activation "
    "offload",
    "B",
    "[Korthikanti22 §4.2], [ZeRO-Infinity §5]",
)
_buffers = (2 * C_bwd + b * h * L * d * p_acc) / t
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
    "training_memory_bytes",
    "M_total",
    M_state + A + R_buf,
    "model states, activations and ring buffers per device on the most loaded stage",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
)
# With flash attention (phi = 0) activations and ring buffers all scale as 1/N once N > 1, so a stage
# fits from N = (its 1/N part at N = 1) / (the memory its states leave free); the most loaded stage sets N.
define(
    "n_min_memory",
    "N_min",
    sympy.Subs(A + _buffers, N, 1) / (M_dev - M_state),
    "smallest CP degree (real-valued) whose training memory fits M_dev, with flash attention; negative "
    "when the model states alone do not fit",
    "devices",
    "[Korthikanti22 §4]",
    at={phi: 0},
)
