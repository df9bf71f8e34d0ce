"""Formulas of the group 'compute': Compute ([A-RingCost §2] invariant one, §4). c = 1/2 for causal: useful FLOP halve."""

from __future__ import annotations

from costmodel.symbolic.formulas.memory import L
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import S, b, c, d, h

GROUP = "compute"
define = definer(GROUP)

W_pair = define(
    "pair_flops",
    "W_pair",
    4 * b * h * d,
    "FLOP per (query, key) pair over all heads: QK^T and PV, 2 FLOP per multiply-add",
    "FLOP",
    "[A-RingCost §2]",
)
define(
    "total_flops",
    "F_total",
    c * S**2 * W_pair,
    "attention FLOP of one layer, all devices",
    "FLOP",
    "[A-RingCost §2]",
)
W = define(
    "device_flops_per_layer", "W", c * L * S * W_pair, "FLOP per device per layer", "FLOP", "[A-RingCost §4]"
)
W_step = define(
    "step_flops",
    "W_step",
    c * L**2 * W_pair,
    "FLOP per device per ring step (one shard of queries x one KV block)",
    "FLOP",
    "[A-RingCost §4, §4.1]",
)
