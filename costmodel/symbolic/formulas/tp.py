"""Formulas of the group 'tp': Tensor parallel comparison ([A-RingCost §13])."""

from __future__ import annotations

from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.formulas.ring import C_recv
from costmodel.symbolic.symbols import S, b, d, h, p

GROUP = "tp"
define = definer(GROUP)

C_tp = define(
    "tp_bytes_per_layer",
    "C_TP",
    4 * b * S * h * d * p,
    "TP activation traffic per layer (two all-reduces of b·S·h·d)",
    "B",
    "[A-RingCost §13]",
)
define(
    "tp_to_ring_ratio",
    "C_TP_over_C_recv",
    C_tp / C_recv,
    "TP bytes / ring receive bytes",
    "1",
    "[A-RingCost §13]",
)
