"""Binding a plan to the formulas: the base symbols' values, and a recorder of evaluated formulas.

Everything that evaluates the model (the report, the time model, the schemes, the recommendation,
sweeps, calibration) takes its values from :func:`plan_values`, so there is one place that says which
input is which symbol, and the machine binding is the one place that says which link and rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.machines.binding import Machine
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.packing import compute_fraction
from costmodel.symbolic import numeric

ACCUMULATOR_BYTES = 4  # fp32 (m, l, O) of the online softmax [OnlineSoftmax]


@dataclass
class Evaluation:
    """One formula evaluated: what ``--explain`` prints."""

    name: str
    args: dict[str, Any]
    value: Any


@dataclass
class Evaluator:
    """Calls generated formulas with the plan's values, overridable per call, and records each call.

    A symbol that stands for a formula's value (``numeric.BINDS``: ``t_lay`` for ``layer_time_s``) and is not
    among the values is that formula, evaluated first (once, where no call overrides a value)."""

    values: dict[str, Any]
    trace: list[Evaluation] | None = field(default=None)
    _bound: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __call__(self, name: str, **overrides: Any) -> Any:
        args = {a: overrides[a] if a in overrides else self._value(a, overrides) for a in numeric.ARGS[name]}
        value = call(name, args)
        if self.trace is not None:
            self.trace.append(Evaluation(name, args, value))
        return value

    def _value(self, symbol: str, overrides: dict[str, Any]) -> Any:
        if symbol in self.values or symbol not in numeric.BINDS:
            return self.values.get(symbol)
        if overrides:
            return self(numeric.BINDS[symbol], **overrides)
        if symbol not in self._bound:
            self._bound[symbol] = self(numeric.BINDS[symbol])
        return self._bound[symbol]


def call(name: str, values: Mapping[str, Any]) -> Any:
    """The generated formula ``name`` at ``values`` (numbers, or arrays over a grid or a search), unrecorded:
    what an :class:`Evaluator` runs for each call, for the hot loops that need no trace."""
    return getattr(numeric, name)(**{a: values.get(a) for a in numeric.ARGS[name]})


def plan_values(inputs: PlanInputs, machine: Machine, n: int | None = None) -> dict[str, Any]:
    """The base symbols' values for a plan at CP degree ``n`` (default the plan's), on the link a ring
    over n ranks waits on. Counts are floats: products of large shapes stay exact to 2^53 and never wrap
    around as int64 would."""
    n = inputs.cp if n is None else n
    return {
        "S": float(inputs.seq),
        "N": float(n),
        "b": float(inputs.batch),
        "h": float(inputs.heads),
        "n_kv": float(inputs.kv_heads),
        "d": float(inputs.head_dim),
        "p": float(inputs.bytes_per_element),
        "p_acc": float(ACCUMULATOR_BYTES),
        "s_blk": float(inputs.block),
        "c": compute_fraction(inputs, n),  # packed or windowed: the share the kernel executes
        "F": machine.effective_flops,
        "F_peak": machine.peak_flops,
        "eta": 1.0 if inputs.efficiency is None else inputs.efficiency,
        **machine.link(n).values,
    }


PASSES = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd+bwd": ("fwd", "bwd")}
RATIO = {"fwd": "comm_ratio_step", "bwd": "bwd_comm_ratio_step"}


def pass_ratio(ev: Evaluator, pass_: str, **overrides: Any) -> float:
    """The step comm ratio of a pass; for fwd+bwd the worse one, since every step must hide its transfer."""
    return max(float(ev(RATIO[phase], **overrides)) for phase in PASSES[pass_])
