"""How sure a figure is: the measured runs a prediction's interval is calibrated on, chosen by regime.

``validation/residuals.json`` holds the model's log residual on every measured run of the published tables
(docs/validation.md): step times, memory peaks and serving times, each with the framework and the GPU
generation it ran on. It is generated with the docs (``python -m costmodel.codegen``) from the same
predictions, so it follows the model. A plan's interval is calibrated on the most specific regime that holds
enough runs for the level asked (:func:`costmodel.core.intervals.runs_needed`). A step time's regimes, most
specific first: its framework on its GPU generation where the same term of the step dominates, its framework on
its GPU generation, the first on any GPU, its framework on any GPU, every run (each framework counting alike).
What dominates sets which of the model's parts a figure leans on (a long sequence's attention, a short one's
multiplies), so runs where it errs alike are calibrated together; the GPU generation sets which tables those
parts are priced from (FlashAttention-2's curves on Ampere, FlashAttention-3's on Hopper), so a term's error on
one generation says less of another's than the framework's other runs on the same one. A fitted hardware profile carries
its own, narrower sets: its k-fold residuals on the owner's runs (``cp-plan audit --fit-profile``), by layout
class (the TP degree and whether the step is pipelined) where a class holds enough of them.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from costmodel.core.errors import InputError
from costmodel.core.intervals import (
    DEFAULT_LEVEL,
    Calibration,
    Interval,
    Residuals,
    interval,
    runs_needed,
    runs_to_reach,
)
from costmodel.core.resources import data_dir
from costmodel.plans.inputs import MOST_HEADROOM
from costmodel.symbolic.numeric import STEP_FIELDS

if TYPE_CHECKING:
    from costmodel.machines.profiles import HardwareProfile
    from costmodel.plans.job import Job
    from costmodel.plans.schema import Fit

Quantity = Literal["step_time", "memory", "serving"]
# Whether a job's devices span nodes: layouts of one node differ by their kernels and NVLink alone, layouts
# across nodes also by which groups cross the slower link, which the model errs on more (docs/validation.md).
Span = Literal["on one node", "across nodes"]
FILE = "residuals.json"
WHAT = {"step_time": "step times", "memory": "memory peaks", "serving": "serving times"}
# Times hang on the GPU: a plan on a generation no measured run used gets no interval. Memory peaks hang on
# the framework and the model; the GPU only sets the allocator's and runtime's share.
TIMED = ("step_time", "serving")
DOMINANT_LABELS = {field: label for field, label, _ in STEP_FIELDS.values()}


class MeasuredResidual(BaseModel):
    """One measured run: ln(measured / predicted), and the regime it ran in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    framework: str | None  # the framework profile it ran on (None: serving, whose runs share one regime)
    generation: str | None  # the GPU generation (Ampere, Hopper, Blackwell)
    job: str | None = None  # runs of one job in other layouts share it (model, sequence, GPUs, batch)
    dominant: str | None = None  # a step time's largest term (its breakdown field, e.g. ``attention_s``)
    span: Span | None = None  # a step time's: whether its job's devices span nodes
    residual: float


class ResidualTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step_time: list[MeasuredResidual]
    memory: list[MeasuredResidual]
    serving: list[MeasuredResidual]


@functools.cache
def table() -> ResidualTable:
    """The packaged table (generated, never user input: read as JSON, not through the hardened YAML reader)."""
    data = json.loads((data_dir("validation") / FILE).read_text(encoding="utf-8"))
    return ResidualTable.model_validate({k: v for k, v in data.items() if k != "about"})


def calibration(
    quantity: Quantity,
    framework: str | None,
    generation: str | None,
    level: float,
    runs: list[MeasuredResidual] | None = None,
    dominant: str | None = None,
) -> Calibration | None:
    """The calibration set of a prediction: the most specific regime with enough runs for ``level``, and for
    80 % at least (or the broadest, which then says how many more it needs); None when no run is like it
    (a time on a GPU generation no run was measured on). ``dominant``: the step's largest term.
    ``runs`` stands in for the table's (a run left out, to check coverage)."""
    every = getattr(table(), quantity) if runs is None else runs
    if quantity in TIMED and generation not in {r.generation for r in every}:
        return None  # a time on a GPU no measured run used says nothing about this one
    same = [r for r in every if r.generation == generation]
    mine = [r for r in every if framework is not None and r.framework == framework]
    if framework is None:
        chain = [(f"every run on {generation}", same)]
    else:
        chain = [
            (f"{framework} on {generation}", [r for r in mine if r.generation == generation]),
            (f"{framework}, every GPU generation", mine),
        ]
        if dominant is not None:
            term = f"led by {DOMINANT_LABELS.get(dominant, dominant)}"
            alike = [r for r in mine if r.dominant == dominant]
            chain = [
                (f"{framework} on {generation}, {term}", [r for r in alike if r.generation == generation]),
                chain[0],  # the same generation's tables before the same term on another's
                (f"{framework}, every GPU generation, {term}", alike),
                chain[1],
            ]
    chain.append((f"every {'run' if framework is None else 'framework and GPU'}", every))
    held = [(regime, members) for regime, members in chain if members]
    if not held:
        return None
    # Below 80 % the regime stays the one 80 % reads: a finer regime its fewer runs would allow could put a
    # lower level's interval outside the 80 % one, and every level's interval must hold each lower level's.
    enough = runs_needed(max(level, DEFAULT_LEVEL))
    index = next((i for i, (_, m) in enumerate(held) if len(m) >= enough), len(held) - 1)
    regime, members = held[index]
    pooled = members is every and framework is not None
    residuals = _frameworks_alike(every) if pooled else Residuals.of([r.residual for r in members])
    alike = ", each framework alike" if pooled else ""
    # A finer regime an 80 % statement reads, too few for this level, still bounds it: a higher level then
    # never gives a narrower interval (at 85 % megatron on Hopper's 16 runs, at 90 % every GPU's 31 would).
    finer = tuple(
        (f"{g}: {len(m)} {WHAT[quantity]}", Residuals.of([r.residual for r in m]))
        for g, m in held[:index]
        if len(m) >= runs_needed(DEFAULT_LEVEL)
    )
    chosen = Calibration(f"{regime}{alike}: {len(members)} {WHAT[quantity]}", residuals, finer=finer)
    if not pooled or len(mine) < 2:
        return chosen
    # The framework's runs are too few for the level: every framework's calibrate it, and its own bound them.
    own = Residuals.of([r.residual for r in mine])
    return replace(chosen, own=own, own_regime=f"{framework}'s {len(mine)} {WHAT[quantity]}")


def _frameworks_alike(runs: list[MeasuredResidual]) -> Residuals:
    """Every framework's runs, for a framework with too few of its own: it is one more framework, not one more
    run of the framework most runs were measured on, so each framework counts alike
    (:meth:`~costmodel.core.intervals.Residuals.balanced`)."""
    frameworks = sorted({r.framework for r in runs}, key=str)
    return Residuals.balanced([[r.residual for r in runs if r.framework == f] for f in frameworks])


def dominant_term(breakdown: Mapping[str, float]) -> str:
    """The step's largest term, by its breakdown field."""
    return max(breakdown, key=lambda name: breakdown[name])


def _regime(job: Job) -> tuple[str, str | None]:
    return job.framework.name, job.machine.profile.device.generation


def _time_calibration(job: Job, level: float, breakdown: Mapping[str, float]) -> Calibration | None:
    """The step time's calibration set: the hardware profile's own k-fold residuals where it was fitted to
    measured runs, else the published runs of the job's regime and of the step's dominant term."""
    if job.machine.profile.fit_residuals is not None:
        across = job_span(job) == "across nodes"
        return fitted_calibration(job.machine.profile, job.tp, job.pp, across, level)
    return calibration("step_time", *_regime(job), level, dominant=dominant_term(breakdown))


def fitted_calibration(
    profile: HardwareProfile, tp: int, pp: int, across_nodes: bool, level: float
) -> Calibration | None:
    """A fitted profile's calibration set for a plan of ``tp`` and ``pp``: the k-fold residuals of its layout
    class (:class:`~costmodel.core.intervals.LayoutResiduals`) where they are enough for ``level`` and for
    80 %, else every class's pooled, bounded by the class's own as far as they vouch; None when the profile
    was fitted to no runs. The fit learns from runs on one node: a plan ``across_nodes`` is like none of its
    classes (the slower links its groups cross are not in them) and reads the pooled set."""
    pooled = profile.fit_residuals
    if pooled is None:
        return None
    whole = f"the fitted profile's k-fold residuals: {pooled.runs} step times"
    mine = next((r for r in profile.fit_residuals_by_layout or [] if r.holds(tp, pp)), None)
    if mine is None or across_nodes:
        return Calibration(whole, pooled)
    held = mine.residuals
    own = f"the fitted profile's k-fold residuals of its {mine.label()} runs: {held.runs} step times"
    if held.runs >= runs_needed(max(level, DEFAULT_LEVEL)):
        return Calibration(own, held)
    finer = ((own, held),) if held.runs >= runs_needed(DEFAULT_LEVEL) else ()
    return Calibration(whole, pooled, finer=finer)


def time_interval(job: Job, time_s: float, level: float, breakdown: Mapping[str, float]) -> Interval:
    """The step time's interval at ``level`` (``breakdown``: the step's terms by field)."""
    band = interval(time_s, _time_calibration(job, level, breakdown), level, "step time")
    return _on(band, job.machine.profile.device.generation, "step time")


def time_within(job: Job, time_s: float, budget_s: float, breakdown: Mapping[str, float]) -> float | None:
    """P(the measured step takes at most ``budget_s``), a conformal lower bound read, as the chance to fit, on
    the set an 80 % statement is calibrated on; None where that set is too small."""
    return chance_at_most(_time_calibration(job, DEFAULT_LEVEL, breakdown), time_s, budget_s)


def memory_interval(
    job: Job, bytes_per_device: float, usable_bytes: float, level: float
) -> tuple[Interval, float | None]:
    """The memory peak's interval at ``level`` and the probability the plan fits. The probability is read on
    the regime an 80 % statement is calibrated on, whatever the level, so that it does not move with it."""
    held = calibration("memory", *_regime(job), level)
    chance = chance_at_most(
        calibration("memory", *_regime(job), DEFAULT_LEVEL), bytes_per_device, usable_bytes
    )
    return interval(bytes_per_device, held, level, "memory peak"), chance


def certain_fit(fit: Fit, job: Job, level: float) -> Fit:
    """A memory fit with its interval at ``level`` and the probability it fits."""
    band, chance = memory_interval(job, fit.total_bytes, fit.device_memory_bytes, level)
    return fit.model_copy(update={"total_bytes_interval": band, "fits_probability": chance})


@dataclass(frozen=True)
class FitMargin:
    """What fitting at a confidence asks: a plan's predicted peak at most ``1 / factor`` of usable memory."""

    confidence: float
    factor: float  # >= 1: the model's own figure must fit too
    regime: str  # the measured peaks it is read on

    def planned(self, job: Job) -> Job:
        """``job`` with the margin taken out of its usable memory as headroom: every "fits" of what is planned
        on it (a search, its what-ifs, the longest sequence) then fits at the confidence."""
        headroom = 1 - (1 - job.setup.memory_headroom) / self.factor
        if headroom > MOST_HEADROOM:
            raise InputError(
                "--confidence",
                f"{self.confidence:.0%} asks plans to fit {1 - 1 / self.factor:.0%} under usable memory ({self.regime}), "
                f"which with --memory-headroom leaves more than {MOST_HEADROOM:.0%} free: ask a lower confidence",
            )
        return job.replace(memory_headroom=headroom)

    def as_dict(self, device_bytes: float) -> dict[str, float | str]:
        return {
            "level": self.confidence,
            "margin": self.factor,
            "planned_bytes": device_bytes / self.factor,
            "from": self.regime,
        }


def fit_margin(job: Job, confidence: float) -> FitMargin:
    """The margin under usable memory that makes "fits" mean "fits with probability ``confidence``": the least
    ratio usable / predicted at which :func:`chance_at_most` reaches it, on the memory peaks the chance to fit
    is read on (one regime for every layout of the job: its framework and GPU generation)."""
    held = calibration("memory", *_regime(job), DEFAULT_LEVEL)
    least = None if held is None else held.residuals.least_at(confidence)
    if held is None or least is None:
        runs = 0 if held is None else held.residuals.runs
        raise InputError(
            "--confidence",
            f"{confidence:.0%} needs {runs_to_reach(confidence)} or more measured memory "
            f"peaks like this job; {runs} ({'none' if held is None else held.regime}) can say at most "
            f"{runs / (runs + 1):.0%}",
        )
    # a hair over the residual, so that a plan sized exactly to the margin counts it (log(exp(r)) may round under r)
    return FitMargin(confidence, max(1.0, math.exp(least + 1e-9)), held.regime)


def chance_at_most(held: Calibration | None, predicted: float, ceiling: float) -> float | None:
    """P(the measured value stays at or under ``ceiling``) for a prediction ``predicted``: a conformal lower
    bound; None below 9 runs (an 80 % statement needs them)."""
    if held is None or held.residuals.runs < runs_needed(DEFAULT_LEVEL) or predicted <= 0:
        return None
    return held.residuals.share_at_most(math.log(ceiling / predicted))


def serving_interval(seconds: float, generation: str | None, level: float) -> Interval:
    band = interval(seconds, calibration("serving", None, generation, level), level, "serving time")
    return _on(band, generation, "serving time")


def serving_memory_interval(bytes_per_device: float, level: float) -> Interval:
    """A served request's memory per device. No measured peak of it is published that the model could be read
    against (engines report their own preallocated share, not what a request holds), so none calibrates it
    and the interval says so rather than borrowing training's peaks, whose activations it does not hold."""
    return interval(bytes_per_device, None, level, "serving memory peak")


def _on(band: Interval, generation: str | None, what: str) -> Interval:
    """A missing interval's note names the device generation no run was measured on."""
    if band.runs:
        return band
    return band.model_copy(update={"note": f"no comparable measured {what}: no run on {generation}"})


def job_span(job: Job) -> Span:
    return "across nodes" if job.gpus > job.machine.profile.devices_per_node else "on one node"


@dataclass(frozen=True)
class OrderSpread:
    """How far apart two layouts of one job must be predicted for their order to hold at a level: the
    conformal quantile of |r_a - r_b| over pairs of measured layouts of one job (their common error cancels),
    and which pairs it was read on."""

    value: float | None  # None: too few pairs for the level
    pairs: int
    regime: str


def order_spread(
    level: float, span: Span | None = None, runs: list[MeasuredResidual] | None = None
) -> OrderSpread:
    """The order spread at ``level`` from the pairs of jobs of ``span`` (on one node, or across nodes), or from
    every pair where that span holds too few; ``runs`` stands in for the table's."""
    jobs: dict[str, list[MeasuredResidual]] = {}
    for run in table().step_time if runs is None else runs:
        if run.job is not None:
            jobs.setdefault(run.job, []).append(run)

    def gaps(of: Span | None) -> list[float]:
        return sorted(
            abs(a.residual - b.residual)
            for rs in jobs.values()
            if of is None or rs[0].span == of
            for i, a in enumerate(rs)
            for b in rs[i + 1 :]
        )

    def quantile(values: list[float]) -> float | None:
        rank = math.ceil((len(values) + 1) * level - 1e-9)  # a one-sided conformal quantile
        return values[rank - 1] if 0 < rank <= len(values) else None

    mine = gaps(span) if span is not None else []
    if quantile(mine) is not None:
        return OrderSpread(
            quantile(mine), len(mine), f"{len(mine)} measured pairs of layouts of one job {span}"
        )
    every = gaps(None)
    return OrderSpread(
        quantile(every),
        len(every),
        f"{len(every)} measured pairs of layouts of one job, on one node or across",
    )


def coverage(quantity: Quantity, level: float) -> dict[str, list[bool | None]]:
    """Leave-one-out: each run's residual against the interval calibrated on the others of the table (at a
    predicted value of 1), grouped by the regime that calibrated it; None where no interval was given."""
    every = getattr(table(), quantity)
    out: dict[str, list[bool | None]] = {}
    for i, run in enumerate(every):
        others = every[:i] + every[i + 1 :]
        held = calibration(quantity, run.framework, run.generation, level, others, run.dominant)
        band = interval(1.0, held, level, WHAT[quantity])
        out.setdefault(regime_of(held), []).append(band.holds(math.exp(run.residual)))
    return out


def regime_of(held: Calibration | None) -> str:
    """The regime a calibration set is named by in coverage tables: its name without the run count."""
    return held.regime.split(":")[0] if held else "none"
