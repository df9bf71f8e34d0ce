"""Formulas of the group 'ring': Ring traffic and intensity ([A-RingCost §2] invariant two, §4)."""

from __future__ import annotations

from costmodel.symbolic.formulas.compute import W, W_step
from costmodel.symbolic.formulas.memory import C_step
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import N

GROUP = "ring"
define = definer(GROUP)

C_recv = define(
    "recv_bytes_per_layer",
    "C_recv",
    (N - 1) * C_step,
    "bytes one device receives per layer (N-1 blocks; its own it keeps)",
    "B",
    "[A-RingCost §2]",
)
define(
    "send_bytes_per_layer",
    "C_send",
    N * C_step,
    "bytes one device sends per layer counting its own block",
    "B",
    "[A-RingCost §4.1]",
)
define("intensity_layer", "I", W / C_recv, "layer arithmetic intensity", "FLOP/B", "[A-RingCost §4]")
define(
    "intensity_step",
    "I_step",
    W_step / C_step,
    "step arithmetic intensity: the quantity to compare with beta",
    "FLOP/B",
    "[A-RingCost §4]",
)
