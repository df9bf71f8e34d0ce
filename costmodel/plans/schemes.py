"""The one scheme comparison: every registered scheme's rows at a CP degree, for a pass.

`cp-plan` prints it and `recommend` ranks it, so the same plan shows the same numbers in both. Per
scheme: the bytes a device receives per layer, the communication time of the pass (USP: all-to-all
and ring together), the ratio its verdict reads, and from the time model the layer's wall time and
the communication it leaves exposed. The rows come from the registry (:mod:`costmodel.plans.cp`):
each scheme with a ``layer`` gives its own (ring; every USP split N = N_u x N_r, 1 < N_u < N;
Ulysses), infeasible head splits listed with the reason.

Ratios: the ring's is the step ratio (receive / compute of one step; the worse pass for fwd+bwd),
since a ring hides each transfer under one step [A-RingCost §11]. Ulysses' all-to-alls hide under
nothing, so its ratio is all-to-all time / attention compute of the pass [Ulysses §3]. USP adds the
two: its ring's step ratio and its all-to-alls' share of the compute [USP §3].

Ranking (what `recommend` picks): least exposed communication, then least communication time, then
the simpler scheme (the registry's rank: ring, USP, Ulysses).
"""

from __future__ import annotations

from costmodel.machines.binding import Machine
from costmodel.plans import cp
from costmodel.plans.cp.base import SchemeResult, ring_layout
from costmodel.plans.inputs import PlanInputs

__all__ = ["SchemeResult", "best", "compare", "lowest_ratio", "rank_key", "ring_layout"]


def compare(inputs: PlanInputs, machine: Machine, pass_: str | None = None) -> list[SchemeResult]:
    """Every registered scheme's rows at the plan's N for ``pass_`` (default the plan's pass), simplest
    first."""
    pass_ = pass_ or inputs.pass_
    return [
        row
        for scheme in cp.schemes(ranked=True)
        if scheme.layer
        for row in scheme.layer(inputs, machine, pass_)
    ]


def rank_key(result: SchemeResult) -> tuple[float, float, int]:
    return (result.exposed_s or 0.0, result.comm_s or 0.0, cp.get(result.scheme).rank)


def best(results: list[SchemeResult]) -> SchemeResult:
    """The scheme to use: least exposed communication, then least communication, then the simplest."""
    return min((r for r in results if r.feasible), key=rank_key)


def lowest_ratio(results: list[SchemeResult]) -> SchemeResult:
    """The feasible scheme with the lowest ratio: N is usable when this one is within amber."""
    return min((r for r in results if r.feasible), key=lambda r: (r.ratio or 0.0, cp.get(r.scheme).rank))
