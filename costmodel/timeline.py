"""Wall time of a ring layer from its per-step compute and per-step transfer time.

Step j computes on block j while block j+1 is in flight, and step j+1 starts once both are done;
the last step has nothing left to receive. So the layer takes
    Σ_{j < N-1} max(compute_j, comm) + compute_{N-1},
which exposes the transfer only where it outlasts the compute it overlaps.
"""

from __future__ import annotations

from collections.abc import Sequence


def ring_layer_time(step_compute_s: Sequence[float], step_comm_s: float) -> float:
    steps = list(step_compute_s)
    if not steps:
        raise ValueError("a ring has at least one step")
    return sum(max(t, step_comm_s) for t in steps[:-1]) + steps[-1]
