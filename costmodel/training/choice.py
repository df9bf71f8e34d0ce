"""Which searched plan to pick when the model cannot tell the fastest ones apart.

Every plan of a search gets its intervals (:mod:`costmodel.plans.uncertainty`). Two layouts of one job share
most of the model's error, so whether their order holds is judged on the pair, not on two independent
intervals: at level L their predicted times must differ by more than the L-quantile of |r_a - r_b| over
measured pairs of layouts of one job, on one node or across nodes as the job is
(:func:`~costmodel.plans.uncertainty.order_spread`). Among the plans
the fastest cannot be told from, the pick is the safest in memory (the likeliest to fit), then the simplest
(fewest parallel groups crossing nodes), then the fastest; the search says which rule decided.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from costmodel.core.intervals import Interval, overlap
from costmodel.plans.job import Job
from costmodel.plans.uncertainty import job_span, memory_interval, order_spread, time_interval
from costmodel.training.search import Constraints, SearchResult, plan_as_job, search

if TYPE_CHECKING:
    from costmodel.plans.uncertainty import FitMargin


def _crossing(job: Job) -> int:
    """Parallel groups of more than one device whose members sit on different nodes."""
    return sum(
        1
        for group in job.machine.describe_groups(*job.groups, job.collectives)["groups"].values()
        if group["size"] > 1 and group["scope"] == "inter-node"
    )


def _preference(plan: dict[str, Any]) -> tuple[float, int, float]:
    """Safest in memory first (the probability it fits, in steps of one measured run), then simplest, then
    fastest."""
    return (-(plan["fits_probability"] or 0.0), plan["groups_across_nodes"], plan["step_time_s"])


def choose(plans: list[dict[str, Any]], job: Job, global_batch: int, level: float) -> dict[str, Any]:
    """Give each plan (fastest first) its intervals, then move the pick first: the fastest, unless plans it
    cannot be told from are simpler or safer. Returns how the pick was decided."""
    for plan in plans:
        planned = plan_as_job(plan, job, global_batch)
        plan["time_s_interval"] = time_interval(
            planned, plan["step_time_s"], level, plan["breakdown"]
        ).model_dump()
        band, fits = memory_interval(planned, plan["memory_bytes"], plan["device_memory_bytes"], level)
        plan["memory_bytes_interval"] = band.model_dump()
        plan["fits_probability"] = fits
        plan["groups_across_nodes"] = _crossing(planned)
    measured = order_spread(level, job_span(job))
    spread = measured.value
    told = {"level": level, "order_spread": spread, "order_spread_from": measured.regime}
    if not plans:
        return {**told, "decided_by": None, "rule": "no plan fits"}
    fastest = plans[0]

    def close(plan: dict[str, Any], to: dict[str, Any]) -> bool:
        return spread is not None and abs(math.log(plan["step_time_s"] / to["step_time_s"])) <= spread

    tied = [plan for plan in plans if close(plan, fastest)]
    pick = min(tied, key=_preference) if tied else fastest
    grow = f"{pick['step_time_s'] / fastest['step_time_s'] - 1:+.1%} predicted step time"
    if pick is fastest:
        decided_by = "fastest"
        rule = "fastest predicted" + (
            f"; {len(tied) - 1} more it cannot be told from, none safer in memory or simpler"
            if len(tied) > 1
            else ""
        )
    elif (pick["fits_probability"] or 0) > (fastest["fits_probability"] or 0):
        decided_by = "safest in memory"
        rule = (
            f"safest in memory of the plans the fastest cannot be told from: fits at "
            f"{pick['fits_probability']:.0%} against {fastest['fits_probability'] or 0:.0%}, {grow}"
        )
    else:
        decided_by = "simplest"
        rule = (
            f"simplest of the plans the fastest cannot be told from: {pick['groups_across_nodes']} parallel "
            f"group(s) across nodes against {fastest['groups_across_nodes']}, {grow}"
        )
    plans.remove(pick)
    plans.insert(0, pick)
    known = all(p["time_s_interval"]["lo"] is not None for p in plans)
    for plan in plans:
        plan["cannot_order_with_pick"] = plan is not pick and close(plan, pick)
        plan["interval_overlaps_pick"] = (
            plan is not pick
            and known
            and overlap(Interval(**plan["time_s_interval"]), Interval(**pick["time_s_interval"]))
        )
    return {**told, "decided_by": decided_by, "rule": rule}


def searched_pick(
    job: Job,
    global_batch: int,
    constraints: Constraints,
    top: int,
    level: float,
    *,
    margin: FitMargin | None = None,
) -> tuple[SearchResult, dict[str, Any]]:
    """The search's top plans of ``job`` with their intervals, the pick first (:func:`choose`), and how it was
    decided. With ``margin`` (``--confidence``) a plan fits when it fits with that probability: the search plans
    within usable memory less the margin, and each plan's chance to fit is read against what the device offers."""
    found = search(job if margin is None else margin.planned(job), global_batch, constraints, top=top)
    for plan in found.plans:
        plan["device_memory_bytes"] = job.device_memory_bytes
    return found, choose(found.plans, job, global_batch, level)
