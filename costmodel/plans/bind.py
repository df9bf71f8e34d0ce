"""Binding a plan to the formulas: the base symbols' values, and a recorder of evaluated formulas.

Everything that evaluates the model (the report, the time prediction, the recommendation) goes
through here, so there is one place that says which input is which symbol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.inputs import PlanInputs
from costmodel.symbolic import numeric

ACCUMULATOR_BYTES = 4  # fp32 (m, l, O), seed 000 §3.1


@dataclass
class Evaluation:
    """One formula evaluated: what ``--explain`` prints."""

    name: str
    args: dict[str, Any]
    value: Any


@dataclass
class Evaluator:
    """Calls generated formulas with the plan's values, overridable per call, and records each call."""

    values: dict[str, Any]
    trace: list[Evaluation] | None = field(default=None)

    def __call__(self, name: str, **overrides: Any) -> Any:
        args = {a: overrides.get(a, self.values.get(a)) for a in numeric.ARGS[name]}
        value = getattr(numeric, name)(**args)
        if self.trace is not None:
            self.trace.append(Evaluation(name, args, value))
        return value


def plan_values(inputs: PlanInputs, profile: HardwareProfile, n: int | None = None) -> dict[str, Any]:
    """The base symbols' values for a plan at CP degree ``n`` (default the plan's), on the link n uses."""
    n = inputs.n if n is None else n
    link, _ = profile.link_for(n)
    peak, effective = profile.flops(inputs.dtype, inputs.efficiency)
    return {
        "S": inputs.seq, "N": n, "b": inputs.batch, "h": inputs.heads, "n_kv": inputs.kv_heads,
        "d": inputs.head_dim, "p": inputs.bytes_per_element, "p_acc": ACCUMULATOR_BYTES,
        "s_blk": inputs.block, "c": 0.5 if inputs.causal else 1, "F": effective, "F_peak": peak,
        "eta": inputs.efficiency, "B": link.bandwidth_per_direction, "alpha": link.latency_s,
    }  # fmt: skip


PASSES = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd+bwd": ("fwd", "bwd")}
RATIO = {"fwd": "comm_ratio_step", "bwd": "bwd_comm_ratio_step"}


def pass_ratio(ev: Evaluator, pass_: str, **overrides: Any) -> float:
    """The step comm ratio of a pass; for fwd+bwd the worse one, since every step must hide its transfer."""
    return max(float(ev(RATIO[phase], **overrides)) for phase in PASSES[pass_])
