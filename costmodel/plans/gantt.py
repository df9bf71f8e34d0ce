"""One layer's ring schedule as a timeline: what each rank does at each step, and when.

The same time model as :func:`costmodel.plans.timing.predict`, unfolded instead of summed: the
schedule (:func:`costmodel.schedule.simulator.visible_pairs`) gives the pairs each rank's queries see at
each step, ``pair_flops`` and the profile's rate turn them into seconds, and each step lasts
:func:`costmodel.plans.timing.ring_layer_time` of its slowest rank's compute against the
transfer in flight (α + bytes/B, ``step_comm_s``). So a timeline's total is the predicted layer time.

Within step j, starting at T_j, rank i computes for c_ij; then it idles until the slowest rank is done,
at T_j + max_i c_ij (the causal imbalance); then, if the transfer is still in flight, every rank waits
on it until T_j + m_j (exposed communication); a measured profile's unhidden share and fixed costs
close the step. Transfer time that ends before the slowest rank does is hidden and shows no segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from costmodel.machines.binding import Machine
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import ring_layer_time, ring_overhead_s, ring_pass
from costmodel.schedule.layouts import LAYOUTS, chunks_per_rank

if TYPE_CHECKING:
    import numpy as np

Kind = Literal["compute", "transfer", "idle", "overhead"]
KINDS: tuple[Kind, ...] = ("compute", "transfer", "idle", "overhead")
MEANING = {
    "compute": "attention on the block held",
    "transfer": "waiting on a KV (or dK/dV) transfer after the slowest rank: exposed communication",
    "idle": "done, waiting for the slowest rank of the step: causal imbalance",
    "overhead": "measured fixed cost or unhidden share of an overlapped step",
}
MAX_RANKS = 64  # one row per rank: more does not read as a chart


@dataclass(frozen=True)
class Segment:
    """One stretch of one rank's time; ``step`` is -1 for what follows the last step."""

    rank: int
    step: int
    kind: Kind
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Timeline:
    """A layer's pass on every rank: per-rank, per-step compute and the steps' transfers and bounds."""

    layout: str
    backward: bool
    pairs: np.ndarray  # (ranks, steps) (query, key) pairs each rank computes at each step
    compute_s: np.ndarray  # (ranks, steps) seconds of that compute
    comm_s: np.ndarray  # (steps,) transfer in flight during each step
    step_s: np.ndarray  # (steps,) each step's duration
    tail_s: float  # after the last step: backward's last dK/dV hop home (0 forward)
    tail_overhead_s: float  # the measured fixed cost of that hop
    layer_overhead_s: float  # a measured profile's per-layer fixed cost

    @property
    def ranks(self) -> int:
        return self.compute_s.shape[0]

    @property
    def step_start_s(self) -> np.ndarray:
        """(steps + 1,) when each step starts; the last entry is when the steps end."""
        import numpy as np

        return np.concatenate([[0.0], np.cumsum(self.step_s)])

    @property
    def total_s(self) -> float:
        return float(self.step_s.sum()) + self.tail_s + self.tail_overhead_s + self.layer_overhead_s

    def segments(self, rank: int) -> list[Segment]:
        """Rank ``rank``'s time, contiguous from 0 to :attr:`total_s`; empty stretches (and rounding's
        crumbs, under 1e-12 of the total) left out."""
        out: list[Segment] = []
        crumb = 1e-12 * self.total_s

        def add(step: int, kind: Kind, start: float, end: float) -> None:
            if end - start > crumb:
                out.append(Segment(rank, step, kind, start, end))

        starts = [float(t) for t in self.step_start_s]
        slowest = self.compute_s.max(axis=0)
        for j, start in enumerate(starts[:-1]):
            mine, most, flight = float(self.compute_s[rank, j]), float(slowest[j]), float(self.comm_s[j])
            add(j, "compute", start, start + mine)
            add(j, "idle", start + mine, start + most)
            add(j, "transfer", start + most, start + max(most, flight))
            add(j, "overhead", start + max(most, flight), starts[j + 1])
        end = starts[-1]
        add(-1, "transfer", end, end + self.tail_s)
        add(-1, "overhead", end + self.tail_s, self.total_s)
        return out

    def totals(self, rank: int) -> dict[str, float]:
        """Seconds of each kind on one rank; they add up to :attr:`total_s`."""
        sums = dict.fromkeys(KINDS, 0.0)
        for segment in self.segments(rank):
            sums[segment.kind] += segment.seconds
        return sums


def ring_timeline(inputs: PlanInputs, machine: Machine, backward: bool = False) -> Timeline:
    """The ring timeline of ``inputs`` (its layout) on ``machine``: forward, or with ``backward`` the
    backward pass, exactly as :func:`~costmodel.plans.timing.predict` times it."""
    import numpy as np

    unfolded = ring_pass(inputs, machine, backward)
    # every step after the first merges its partial output (and launches), as predict charges them
    merge = ring_overhead_s(inputs, machine) / max(inputs.cp - 1, 1)
    steps = [
        ring_layer_time(
            [c],
            [m],
            overlap=unfolded.overlap,
            step_overhead_s=unfolded.step_overhead_s,
            step_waits=None if unfolded.step_waits is None else [unfolded.step_waits[j]],
        )
        + (merge if j else 0.0)
        for j, (c, m) in enumerate(zip(unfolded.step_compute_s, unfolded.comm_s, strict=True))
    ]
    forward, backward_extra = (
        machine.layer_overhead("ring", backward, inputs.layout, inputs.causal)
        if inputs.cp > 1
        else (0.0, 0.0)
    )
    return Timeline(
        layout=inputs.layout,
        backward=backward,
        pairs=np.asarray(unfolded.pairs),  # a small ring's rows of floats, as arrays
        compute_s=np.asarray(unfolded.compute_s),
        comm_s=np.asarray(unfolded.comm_s),
        step_s=np.asarray(steps),
        tail_s=unfolded.tail_s,
        tail_overhead_s=unfolded.step_overhead_s if unfolded.tail_s else 0.0,
        layer_overhead_s=backward_extra if backward else forward,
    )


@dataclass(frozen=True)
class PassTimelines:
    """One pass's ring timeline under every layout; a layout the sequence does not split into is in
    ``skipped``, with why."""

    backward: bool
    timelines: dict[str, Timeline]
    skipped: dict[str, str]


def plan_timelines(inputs: PlanInputs, machine: Machine) -> list[PassTimelines]:
    """The forward pass and, unless the plan is forward only, the backward, under every layout; none
    beyond :data:`MAX_RANKS` ranks, which are not drawn."""
    if inputs.cp > MAX_RANKS:
        return []
    passes = []
    for backward in [False] + ([True] if inputs.pass_ != "fwd" else []):
        timelines, skipped = {}, {}
        for layout in LAYOUTS:
            parts = inputs.cp * chunks_per_rank(layout)
            if inputs.seq % parts:
                skipped[layout] = f"S = {inputs.seq:,} does not split into {parts} equal chunks."
                continue
            timelines[layout] = ring_timeline(inputs.model_copy(update={"layout": layout}), machine, backward)
        passes.append(PassTimelines(backward, timelines, skipped))
    return passes
