"""Wall time of a ring layer from its per-step compute and the transfers that overlap each step.

Step j computes on the block it holds while ``comm[j]`` is in flight (the next KV block; in backward
also the dK/dV sums of the step before), and step j+1 starts once both are done. So the layer takes
    Σ_j max(compute_j, comm_j) + tail,
where the last step's comm is what still has to land before the layer ends (0 forward; the previous
step's dK/dV in backward) and ``tail`` is what nothing can hide (backward: the last dK/dV hop home).

That is perfect overlap. A measured profile carries how much really hides (``overlap``, o) and what
running both at once costs on top (``step_overhead_s``, e): a step with a transfer then takes
max(c, m) + (1 - o)·min(c, m) + e; serial at o = 0, as on a CPU whose cores the ranks fill.

The overlap law is the formulas' (``cp_ring_fwd_exposed_s``: what stays exposed is m - o·min(m, c)), so a
step is c plus that; ``tests/test_scheme_registry.py`` holds the two equal, since no formula stands for one
step on its own symbols for this module to call.
"""

from __future__ import annotations

from collections.abc import Sequence


def ring_layer_time(
    step_compute_s: Sequence[float],
    step_comm_s: Sequence[float] | float,
    tail_s: float = 0.0,
    overlap: float = 1.0,
    step_overhead_s: float = 0.0,
    step_waits: Sequence[int] | None = None,
    tail_waits: int = 0,
) -> float:
    """``step_waits[j]``: how many transfers step j waits for (default 1 where it has one), each costing
    ``step_overhead_s``; ``tail_waits`` likewise for the tail."""
    steps = [float(t) for t in step_compute_s]
    if not steps:
        raise ValueError("a ring has at least one step")
    if isinstance(step_comm_s, int | float):
        comm = [float(step_comm_s)] * (len(steps) - 1) + [0.0]  # forward: no block follows the last step
    else:
        comm = [float(c) for c in step_comm_s]
    if len(comm) != len(steps):
        raise ValueError("one transfer time per step")
    waits = list(step_waits) if step_waits is not None else [1 if c > 0 else 0 for c in comm]
    busy = [
        max(t, c) + (1 - overlap) * min(t, c) + w * step_overhead_s
        for t, c, w in zip(steps, comm, waits, strict=True)
    ]
    return sum(busy) + tail_s + tail_waits * step_overhead_s
