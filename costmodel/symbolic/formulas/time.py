"""Formulas of the group 'time': Times and ratios ([A-RingCost §4.1, §11]; alpha from [A-SPDeep])."""

from __future__ import annotations

from costmodel.symbolic.formulas.compute import W, W_step
from costmodel.symbolic.formulas.memory import C_step
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import B, F, N, alpha

GROUP = "time"
define = definer(GROUP)

t_comp = define(
    "step_compute_s", "t_step", W_step / F, "compute time of one ring step", "s", "[A-RingCost §4.1]"
)
t_comm = define(
    "step_comm_s",
    "tau_step",
    alpha + C_step / B,
    "receive time of one KV block",
    "s",
    "[A-RingCost §4.1], [A-SPDeep]",
)
t_layer = define(
    "layer_compute_s", "t_layer", W / F, "compute time of one layer on one device", "s", "[A-RingCost §4]"
)
tau_layer = define(
    "layer_comm_s",
    "tau_layer",
    (N - 1) * t_comm,
    "receive time of one layer (N-1 blocks)",
    "s",
    "[A-RingCost §4]",
)
define(
    "layer_send_s",
    "tau_send",
    N * t_comm,
    "send time of one layer counting the own block",
    "s",
    "[A-RingCost §4.1]",
)
define(
    "comm_ratio_step",
    "rho_step",
    t_comm / t_comp,
    "step receive time / step compute time: the verdict's ratio (no overlap credit)",
    "1",
    "[A-RingCost §11]",
)
define(
    "comm_ratio_layer",
    "rho_layer",
    tau_layer / t_layer,
    "layer receive time / layer compute time",
    "1",
    "[A-RingCost §4]",
)
