"""The inverse questions of a training job: the longest sequence that fits at each CP degree on its GPUs, what
a token budget costs at a plan's step time, and the fewest GPUs that train it within a deadline.

The longest sequence is found by bisection on the search's own memory fit (:func:`costmodel.training.search.
fitting`, every layout the constraints allow at that CP degree): memory grows with S for every plan, so the
answer is the largest multiple of the CP degree's granularity that some plan fits, and the next multiple fits
none. The granularity is what every layout can split: 2N tokens (the zigzag layout's 2N chunks) unless
the layout is fixed to one that needs N; one rank takes any length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costmodel.core.errors import InputError
from costmodel.core.intervals import Interval
from costmodel.core.units import DAY, HOUR
from costmodel.plans.inputs import MAX_CP, MAX_TOKENS
from costmodel.plans.job import Job
from costmodel.plans.schema import Budget, Deadline, GpuCount
from costmodel.plans.uncertainty import time_within
from costmodel.schedule.layouts import chunks_per_rank, divisors
from costmodel.training.choice import searched_pick
from costmodel.training.search import (
    Constraints,
    default_global_batch,
    fitting,
    label,
    layout_name,
    plan_as_job,
    search,
)

if TYPE_CHECKING:
    from costmodel.plans.uncertainty import FitMargin


def granularity(cp: int, layout: str | None) -> int:
    """The step between sequence lengths every allowed layout splits over ``cp`` ranks."""
    if cp == 1:
        return 1
    return cp * (chunks_per_rank(layout) if layout else 2)


@dataclass(frozen=True)
class Longest:
    """The longest sequence some plan fits at one CP degree, and what the next length needs."""

    cp: int
    granularity: int
    seq: int | None  # None: not even the shortest length fits
    next_least_bytes: float  # the least memory a plan needs at seq + granularity
    device_bytes: float
    plan: dict[str, Any] | None  # the fastest plan at seq
    global_batch: int | None


def _fits(job: Job, seq: int, cp: int, global_batch: int | None, c: Constraints) -> tuple[bool, float, float]:
    batch = global_batch or default_global_batch(seq)
    found = fitting(_at(job, seq, cp), batch, c)
    return found.table is not None, found.least_bytes, found.device_bytes


def _at(job: Job, seq: int, cp: int) -> Job:
    """The job at another length and CP degree, its own batch left to the search (which states one)."""
    return job.replace(seq=seq, cp=cp, global_batch=None)


def longest_sequence(job: Job, cp: int, global_batch: int | None, constraints: Constraints) -> Longest:
    """Bisection on S in steps of :func:`granularity`, starting from the job's own length: the largest
    multiple that some plan at ``cp`` fits; then the fastest plan there."""
    c = Constraints(**(constraints.__dict__ | {"cp": cp}))
    step = granularity(cp, c.layout)
    top = MAX_TOKENS // step
    start = max(1, min(job.inputs.seq // step, top))
    ok, least, device = _fits(job, start * step, cp, global_batch, c)
    above = math.nan  # the least memory a plan needs one step past the answer; none past the longest allowed
    if ok:  # double until a length does not fit, or the longest allowed does
        low, high = start, None
        while high is None:
            probe = min(low * 2, top)
            ok, least, device = _fits(job, probe * step, cp, global_batch, c)
            if not ok:
                high, above = probe, least
            elif probe == top:
                low, high = probe, probe + 1  # the longest allowed fits: nothing left to bisect
            else:
                low = probe
    else:  # halve until one fits, or not even the shortest does
        high, above = start, least
        low = 0
        probe = start
        while probe > 1:
            probe //= 2
            ok, least, device = _fits(job, probe * step, cp, global_batch, c)
            if ok:
                low = probe
                break
            high, above = probe, least
        if low == 0:
            return Longest(cp, step, None, above, device, None, global_batch)
    while high - low > 1:  # low fits, high does not
        middle = (low + high) // 2
        ok, least, device = _fits(job, middle * step, cp, global_batch, c)
        if ok:
            low = middle
        else:
            high, above = middle, least
    seq = low * step
    batch = global_batch or default_global_batch(seq)
    plans = search(_at(job, seq, cp), batch, c, top=1).plans
    return Longest(cp, step, seq, above, device, plans[0] if plans else None, batch)


def cp_degrees(job: Job, constraints: Constraints) -> list[int]:
    """The CP degrees asked about: the fixed one, else every divisor of the GPU count that leaves room for a
    fixed TP and PP, up to the largest CP."""
    if constraints.cp is not None:
        return [constraints.cp]
    room = job.gpus // ((constraints.tp or 1) * (constraints.pp or 1))
    return [n for n in divisors(job.gpus) if n <= min(MAX_CP, room)]


def max_seq_table(job: Job, global_batch: int | None, constraints: Constraints) -> list[Longest]:
    if job.inputs.docs is not None:
        raise InputError("--max-seq", "not with --docs: the documents fix the sequence's length")
    return [longest_sequence(job, n, global_batch, constraints) for n in cp_degrees(job, constraints)]


def budget(
    tokens: int,
    tokens_per_step: int,
    step_time_s: float,
    gpus: int,
    price: float | None,
    *,
    step_interval: Interval | None = None,
) -> Budget:
    """What ``tokens`` cost at one step. The step's interval carries over whole: a budget repeats one plan's
    step, so the model's error on it is the same at every step, not averaged away over the steps."""
    steps = -(-tokens // tokens_per_step)
    wall = steps * step_time_s
    hours = wall * gpus / HOUR
    days = None if step_interval is None else step_interval.scaled(steps / DAY)
    spent = (
        None if step_interval is None or price is None else step_interval.scaled(steps * gpus / HOUR * price)
    )
    return Budget(
        tokens=tokens,
        tokens_per_step=tokens_per_step,
        steps=steps,
        wall_s=wall,
        wall_days=wall / DAY,
        gpus=gpus,
        gpu_hours=hours,
        price_per_gpu_hour=price,
        cost=None if price is None else hours * price,
        wall_days_interval=days,
        cost_interval=spent,
    )


def gpu_counts(most: int, fixed: int) -> list[int]:
    """The GPU counts a deadline is weighed at first: ``fixed`` (the devices the flags' fixed TP x CP x PP take)
    times each power of two below ``most``, then ``most``."""
    counts, gpus = [], fixed
    while gpus < most:
        counts.append(gpus)
        gpus *= 2
    return [*counts, most]


def between(low: int, high: int, unit: int) -> list[int]:
    """The multiples of ``unit`` strictly between ``low`` and ``high``: the whole-node counts that a doubling
    step skipped."""
    return list(range((low // unit + 1) * unit, high, unit))


@dataclass(frozen=True)
class Goal:
    """What --deadline asks: ``tokens`` trained within ``days``, with ``confidence`` where it is stated."""

    tokens: int
    days: float
    confidence: float | None = None


def fewest_gpus(
    job: Job,
    goal: Goal,
    global_batch: int | None,
    constraints: Constraints,
    *,
    level: float,
    top: int = 5,
    margin: FitMargin | None = None,
) -> Deadline:
    """The fewest GPUs, of at most ``job.gpus``, whose plan trains the goal's tokens within its days, its plan
    the one ``recommend`` picks there (of the ``top`` fastest). Each count of :func:`gpu_counts` is searched in
    turn, smallest first, up to the first that meets it; past a node, the whole nodes (and whole fixed layouts)
    between that count and the last that missed are then bisected, so 48 GPUs is found where 32 miss and 64
    meet. Bisection takes more GPUs to train no slower, as a search over more devices mostly does. A count is
    the GPUs its pick runs on: where no layout of all of them divides, the search leaves some idle, and the
    same pick is what it finds on just the GPUs it uses. The global batch is held, so every count takes the
    same steps. With a confidence, a count meets the deadline only where the measured step times of its
    plan's regime say it does with at least that probability; with ``margin`` (--confidence's memory margin),
    a plan fits only within it."""
    batch = global_batch or default_global_batch(job.inputs.seq)
    deadline_s = goal.days * DAY
    fixed = (constraints.tp or 1) * (constraints.pp or 1) * (constraints.cp or 1)

    def weigh(gpus: int) -> GpuCount:
        at = job.replace(gpus=gpus)
        found, _ = searched_pick(at, batch, constraints, top, level, margin=margin)
        if not found.plans:
            return GpuCount(gpus=gpus)
        plan = found.plans[0]
        step = plan["step_time_s"]
        spent = budget(
            goal.tokens,
            batch * job.inputs.seq,
            step,
            plan["gpus"],
            None,
            step_interval=Interval(**plan["time_s_interval"]),
        )
        chance = time_within(plan_as_job(plan, at, batch), step, deadline_s / spent.steps, plan["breakdown"])
        return GpuCount(
            gpus=plan["gpus"],
            plan=label(plan),
            layout=layout_name(plan),
            step_time_s=step,
            days=spent.wall_days,
            days_interval=spent.wall_days_interval,
            meets_probability=chance,
            meets=spent.wall_s <= deadline_s
            and (goal.confidence is None or (chance or 0.0) >= goal.confidence),
        )

    weighed: dict[int, GpuCount] = {}

    def weigh_once(gpus: int) -> GpuCount:
        count = weigh(gpus)
        weighed.setdefault(count.gpus, count)
        return count

    missed = None  # the most GPUs weighed that miss, before the first that meets
    for gpus in gpu_counts(job.gpus, fixed):
        count = weigh_once(gpus)
        if count.meets:
            break
        missed = gpus
    node = job.machine.profile.devices_per_node
    if count.meets and missed is not None and missed >= node:
        left = between(missed, count.gpus, math.lcm(node, fixed))
        while left:
            middle = left[len(left) // 2]
            count = weigh_once(middle)
            # a pick on fewer GPUs than searched is the pick on those too: what lies between is weighed
            left = [c for c in left if c < count.gpus] if count.meets else [c for c in left if c > middle]
    counts = sorted(weighed.values(), key=lambda c: c.gpus)
    met = next((c.gpus for c in counts if c.meets), None)
    return Deadline(
        days=goal.days,
        tokens=goal.tokens,
        most_gpus=job.gpus,
        confidence=goal.confidence,
        gpus=met,
        counts=counts,
    )
