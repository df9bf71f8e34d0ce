"""Formulas of the group 'offload': Offload over the host link ([ZeRO-Offload], [ZeRO-Infinity], PyTorch FSDP CPUOffload)."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.fit import A_kept, P_layer_dev
from costmodel.symbolic.formulas.registry import FORMULAS, definer
from costmodel.symbolic.formulas.step import P_dev, n_crit, t_fwd_c
from costmodel.symbolic.symbols import B_h, R_h, n_h, o_act, o_opt, o_par, p, z_o, z_w

GROUP = "offload"
define = definer(GROUP)

# The plain schedule: the gradients of the device's optimizer share go to the host during the last
# micro-batch's backward; the CPU's Adam step and the upload of the updated bf16 weights follow the backward
# on the critical path (ZeRO-Offload's one-step delayed update, which hides them, is not modelled).
# Parameter offload fetches each layer's weight shard before its forward and again before its backward;
# activation offload copies a layer's kept activations out in the forward and back in the backward. Each
# direction of the host link is its own lane: in the forward the weights come in while the activations go
# out; in the backward both come in on one lane, one layer ahead of the compute that needs them.
t_bwd_c = FORMULAS["layer_compute_bwd_s"].symbol
t_rc = FORMULAS["layer_recompute_s"].symbol
tau_g2h = define(
    "offload_grad_copy_s",
    "tau_g2h",
    o_opt * z_o * P_dev * p / B_h,
    "gradients of the device's optimizer share copied to the host, bf16, once a step",
    "s",
    "[ZeRO-Offload §4.1]",
)
define(
    "offload_grad_exposed_s",
    "x_g2h",
    sympy.Max(tau_g2h - n_crit * t_bwd_c, 0, evaluate=False),
    "the gradient copy left after hiding it under the last micro-batch's backward on the slowest stage",
    "s",
    "[ZeRO-Offload §4.1]",
)
define(
    "host_adam_s",
    "t_cpu",
    o_opt * n_h * z_o * P_dev / R_h,
    "the CPU's Adam step over the optimizer shares of the n_h devices sharing one host, after the backward",
    "s",
    "[ZeRO-Offload §4.2]",
)
define(
    "offload_weight_upload_s",
    "tau_w_h2d",
    o_opt * (1 - o_par) * z_o * P_dev * p / B_h,
    "updated bf16 weights of the device's share copied back to it after the CPU step (none under parameter "
    "offload: the next step fetches them layer by layer)",
    "s",
    "[ZeRO-Offload §4.1]",
)
tau_pf = define(
    "offload_param_fetch_s",
    "tau_p_h2d",
    o_par * z_w * P_layer_dev * p / B_h,
    "one layer's bf16 weight shard fetched from the host, before its forward and again before its backward",
    "s",
    "[ZeRO-Infinity §5]",
)
tau_act = define(
    "offload_activation_copy_s",
    "tau_act",
    o_act * A_kept / B_h,
    "one layer's kept activations copied to the host (forward) or back (backward)",
    "s",
    "[ZeRO-Infinity §5]",
)
define(
    "offload_layer_fwd_exposed_s",
    "x_off_fwd",
    sympy.Max(sympy.Max(tau_pf, tau_act, evaluate=False) - t_fwd_c, 0, evaluate=False),
    "one layer's forward copies left on the critical path: the weights in and the activations out, each on "
    "its own direction of the link, beyond the layer's forward compute",
    "s",
    "[ZeRO-Infinity §5]",
)
define(
    "offload_layer_bwd_exposed_s",
    "x_off_bwd",
    sympy.Max(tau_pf + tau_act - t_bwd_c - t_rc, 0, evaluate=False),
    "one layer's backward copies left on the critical path: the weights and the activations in, one after "
    "the other on the inbound direction, beyond the layer's backward and recompute",
    "s",
    "[ZeRO-Infinity §5]",
)
