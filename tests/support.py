"""Helpers the tests share: evaluate a plan, round as the article rounds."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import MachineOverrides, PlanInputs, machine_for
from costmodel.plans.schema import Report

REPO = Path(__file__).resolve().parent.parent


def half_up(value: float, digits: int) -> Decimal:
    """``value`` to ``digits`` significant digits, halves up ([A-RingCost] prints 0.5625 as 56.3 %)."""
    d = Decimal(repr(float(value)))
    if d == 0:
        return d
    exponent = d.adjusted() - digits + 1
    return d.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)


def plan(hw: str = "a100-nvlink", inter_bandwidth: str | None = None, **overrides: object) -> Report:
    """The worked example (256K tokens over 8 A100s) with overrides, evaluated on a built-in profile (its
    inter-node link replaced when ``inter_bandwidth`` is given, as ``--inter-node-bandwidth`` does)."""
    inputs = PlanInputs(**{"seq": 262_144, "n": 8, "hw": hw, **overrides})
    return evaluate(inputs, machine_for(inputs, MachineOverrides(inter_node_bandwidth=inter_bandwidth)))
