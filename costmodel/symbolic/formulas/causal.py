"""Formulas of the group 'causal': Causal load balance, block-granular ([A-RingCost §6]). The tile simulator is costmodel.schedule.simulator."""

from __future__ import annotations

from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import N

GROUP = "causal"
define = definer(GROUP)

define(
    "utilization_coarse",
    "u_coarse",
    (N + 1) / (2 * N),
    "contiguous causal utilisation, diagonal block counted whole",
    "1",
    "[A-RingCost §6]",
)
define(
    "utilization_fine",
    "u_fine",
    N / (2 * N - 1),
    "contiguous causal utilisation, diagonal block counted as half",
    "1",
    "[A-RingCost §6]",
)
