"""Formulas of the group 'machine': Machine ([A-RingCost §4, §8] step 2; [A-SPDeep]–4.3)."""

from __future__ import annotations

from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import B, F, F_peak, eta

GROUP = "machine"
define = definer(GROUP)

define(
    "effective_flops", "F_eff", eta * F_peak, "FLOP/s at the given efficiency", "FLOP/s", "[A-RingCost §8]"
)
define("beta", "beta", F / B, "machine FLOP per byte of one link direction", "FLOP/B", "[A-RingCost §4]")
