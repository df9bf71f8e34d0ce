"""Capacity-plan files and the checks CI gates on (`cp-plan check PLAN.yaml...`).

A plan file holds the declared inputs (:mod:`costmodel.plans.inputs`) flat, under the names of their
flags, with training defaults, plus its name, the model and what must hold: the worst verdict
allowed, a ceiling on the comm ratio, that memory fits, that N lies in the recommended window, a ceiling
on the step's time or floors on its tokens per second and MFU. With a confidence, memory and time pass
only when the measured runs of the plan's regime say they hold with that probability.
Problems in a file are reported with its path, the line and the field; every problem at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from costmodel.core.errors import (
    MAX_PROBLEMS,
    InputError,
    another_kind,
    more_problems,
    validation_problems,
)
from costmodel.core.fields import NumberAsWritten, Positive, Switch
from costmodel.core.fileio import YamlDocument, YamlInputError, not_a_mapping, read_yaml
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.bind import Evaluator
from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import (
    TRAINING_DEFAULTS,
    MachineOverrides,
    Parallelism,
    PlanInputs,
    TokenBudget,
    TrainingSetup,
    cp_stride,
    job_machine,
    problems,
)
from costmodel.plans.job import FrameworkKnobs, Job, StepSetup, make_job
from costmodel.plans.models import load_model
from costmodel.plans.uncertainty import memory_interval, time_within
from costmodel.plans.verdict import BANDS, Colour
from costmodel.training.report import StepTimes

M = TypeVar("M", bound=BaseModel)
ORDER = [band.verdict for band in BANDS]


class Expectations(BaseModel):
    """What must hold for the plan to pass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worst_verdict: Colour = Field("amber", description="the worst verdict allowed for the plan's pass")
    max_comm_ratio: Positive | None = Field(None, description="ceiling on the step comm ratio")
    fits_memory: Switch = Field(False, description="training memory must fit (needs gpus)")
    in_recommended_window: Switch = Field(
        False, description="N within [N_min(memory), N_max(comm)] (needs gpus)"
    )
    max_step_time_s: Positive | None = Field(
        None, description="ceiling on one optimizer step, seconds (needs gpus and global_batch)"
    )
    min_tokens_per_s: Positive | None = Field(
        None, description="floor on the job's trained tokens per second (needs gpus and global_batch)"
    )
    min_mfu: Annotated[float, NumberAsWritten, Field(gt=0, le=1, allow_inf_nan=False)] | None = Field(
        None,
        description="floor on model FLOP utilisation, a fraction in (0, 1] (needs gpus and global_batch)",
    )
    max_days: Positive | None = Field(
        None,
        description="ceiling on the wall days to train the plan's tokens at its step (needs gpus, global_batch "
        "and tokens)",
    )

    def timed(self) -> dict[str, float]:
        """The expectations on the step's time, by key: each bounds one figure of the step."""
        return {key: getattr(self, key) for key in TIMED if getattr(self, key) is not None}


# The expectations on the step's time: key -> (the step's figure, a ceiling (True) or a floor on it). Each is a
# bound on the step's time, since a rate is the step's work over it: a floor f on a rate r is the time t r / f.
TIMED = {
    "max_step_time_s": ("time_s", True),
    "min_tokens_per_s": ("tokens_per_s", False),
    "min_mfu": ("mfu", False),
    "max_days": ("days", True),  # the plan's token budget over its step: steps x time_s
}


class _PlanHead(BaseModel):
    """What a plan file holds beyond the declared inputs: its name, the required model, expectations."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # one line: a report prints it on one, and a line of its own that began "::" would be a command to a CI log
    name: str = Field(description="what the plan is for, on one line", max_length=1000, pattern=r"^[^\n]*$")
    model: str = Field(description="model preset name or YAML path", max_length=4096)
    tokens: TokenBudget | None = Field(
        None, description="a token budget (1T, 300B: decimal multiples): what expect.max_days trains"
    )
    expect: Expectations = Field(default_factory=Expectations)

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        """A field under two of its names (``cp`` and ``n``) is one field given twice, not an unknown key."""
        if isinstance(data, dict):
            for name, info in cls.model_fields.items():
                choices = getattr(info.validation_alias, "choices", [info.alias or name])
                given = [key for key in dict.fromkeys([name, *choices]) if key in data]
                if len(given) > 1:
                    raise ValueError(f"{' and '.join(given)} name one field: give one")
        return data

    @model_validator(mode="after")
    def _memory_checks_need_gpus(self) -> _PlanHead:
        if (self.expect.fits_memory or self.expect.in_recommended_window) and getattr(
            self, "gpus", None
        ) is None:
            raise ValueError("expect.fits_memory and expect.in_recommended_window need gpus")
        if self.expect.timed() and None in (getattr(self, "gpus", None), getattr(self, "global_batch", None)):
            raise ValueError(
                f"expect.{', '.join(self.expect.timed())}: a step's time needs gpus and global_batch"
            )
        if self.expect.max_days is not None and self.tokens is None:
            raise ValueError("expect.max_days: needs tokens, the budget to train within it")
        return self


REQUIRED = ("seq", "cp", "hw")  # a plan states what it plans; the flags' defaults are for a first look


def _plan_fields() -> dict[str, Any]:
    """Every declared input, with the training defaults: the attention's, the job's layout, the step's
    knobs (vpp, micro-batch, CP scheme, overlaps) and the machine's changes (cp_ranks_per_node, links),
    so a plan file says whatever `cp-plan step` and `recommend` are told; gpus and global_batch optional."""
    fields: dict[str, Any] = {}
    for declaration in (PlanInputs, TrainingSetup, StepSetup, MachineOverrides, FrameworkKnobs):
        for name, info in declaration.model_fields.items():
            if name in _PlanHead.model_fields or name in fields:
                continue
            default = TRAINING_DEFAULTS.get(name, info.default)
            if name in REQUIRED:
                default = PydanticUndefined
            if name in ("gpus", "global_batch"):  # optional here: the constraints go inside the Optional
                inner = Annotated.__class_getitem__((info.annotation, *info.metadata))  # type: ignore[attr-defined]
                fields[name] = (inner | None, Field(None, description=info.description))
                continue
            field = FieldInfo.merge_field_infos(info)
            field.default = default  # the plan file's default, or none: required
            fields[name] = (info.annotation, field)
    return fields


# A capacity plan (configs/plans/*.yaml): the declared inputs, flat, under the names of their flags.
PlanFile = create_model("PlanFile", __base__=_PlanHead, **_plan_fields())


@dataclass(frozen=True)
class Located:
    """A loaded plan with the line of every field, for messages and annotations."""

    path: str
    plan: PlanFile
    document: YamlDocument

    def line(self, *keys: str) -> int:
        if keys[:1] == ("cp",) and ("cp",) not in self.document.lines:  # written under its former key, n
            keys = ("n", *keys[1:])
        return self.document.line(*keys)


class InvalidPlan(InputError):
    """Every problem found in plan files as (file, line or None, text): one line for the terminal, and
    one annotation each under ``--format github``."""

    def __init__(self, problems: list[tuple[str, int | None, str]]) -> None:
        def where(path: str, line: int | None) -> str:
            return path if line is None else f"{path}:{line}"

        (path, line, first), rest = problems[0], problems[1:]
        super().__init__(
            where(path, line), "; ".join([first, *(f"{where(p, n)}: {text}" for p, n, text in rest)])
        )
        self.problems = problems


def load_plan(path: str) -> Located:
    """Parse with the hardened loader, keeping line numbers; every problem in the file is reported at once."""
    try:
        document = read_yaml(path, path)
    except YamlInputError as exc:  # the path as the reader shows it: shortened, quoted where empty
        raise InvalidPlan([(exc.path, exc.line, exc.problem)]) from None
    data = document.data
    if not isinstance(data, dict):
        raise InvalidPlan([(path, None, not_a_mapping(data, "plan"))])
    try:
        plan = PlanFile.model_validate(data)
    except ValidationError as exc:
        other = another_kind(data, "capacity plan")
        if other is not None:
            raise InvalidPlan([(path, None, other)]) from None
        every = validation_problems(exc, PlanFile)
        problems = [
            (path, document.line(*loc), (f"{'.'.join(loc)}: " if loc else "") + text)
            for loc, text in every[:MAX_PROBLEMS]
        ]
        if more := more_problems(len(every)):  # a file that is no plan would name each of its lines
            problems.append((path, None, more))
        raise InvalidPlan(problems) from None
    return Located(path, plan, document)


MAX_PLANS = 64  # plan files a run: each is about 50 ms here (2 cores), so a run stays within seconds


def load_plans(paths: list[str]) -> list[Located]:
    """Every file once (a path named twice, or by a glob and by name, is one plan: checked twice it would count
    its checks twice), each valid, before anything runs; otherwise the problems of all of them."""
    if len(paths) > MAX_PLANS:
        raise InputError(
            "PLAN", f"{len(paths):,} plan files; check takes at most {MAX_PLANS} a run (split them)"
        )
    by_file: dict[str, str] = {}
    for path in paths:
        by_file.setdefault(path if path == "-" else os.path.realpath(path), path)
    located, problems = [], []
    for path in by_file.values():
        try:
            located.append(load_plan(path))
        except InvalidPlan as exc:
            problems += exc.problems
    if problems:
        raise InvalidPlan(problems)
    return located


@dataclass(frozen=True)
class CheckResult:
    plan: str  # file path
    name: str  # the plan's name
    check: str  # expectation key
    passed: bool
    detail: str
    line: int


@contextmanager
def _blame(located: Located) -> Iterator[None]:
    """Any bad input found while evaluating a plan is reported at the line of the field at fault."""
    try:
        yield
    except InvalidPlan:
        raise
    except InputError as exc:
        field = exc.field.lstrip("-").replace("-", "_")
        raise InvalidPlan([(located.path, located.line(field), f"{field}: {exc.message}")]) from None


def _declared(located: Located, model: type[M], values: dict[str, Any]) -> M:
    """Build a declared model from the plan's fields; every problem names the file, line and field."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise InvalidPlan(
            [(located.path, located.line(field), f"{field}: {message}") for field, message in problems(exc)]
        ) from None


@dataclass(frozen=True)
class Resolved:
    """A plan file turned into what the model takes: the job, and its one TP rank's attention."""

    machine: Machine  # CP ranks placed on nodes with TP innermost
    attention: PlanInputs  # the heads one TP rank runs
    job: Job | None  # the training job, where the plan states its GPUs (its DP, memory and window need them)


def resolve(located: Located) -> Resolved:
    """Inputs, setup and placed machine of one plan; problems name the file and line."""
    plan = located.plan
    with _blame(located):
        model = load_model(plan.model, field="model")
    # what the file states and the training defaults; the rest is each declaration's own default, unset as a
    # flag not given is (a default tile on a shorter shard shrinks to it; one the plan states is refused)
    fields = {
        k: v
        for k, v in plan.model_dump(exclude={"name", "expect"}).items()
        if k in plan.model_fields_set or k in TRAINING_DEFAULTS
    }
    if (
        "micro_batch" in plan.model_fields_set
    ):  # the job's sequences a device runs at once, as in `cp-plan step`
        if "batch" in plan.model_fields_set and plan.batch != plan.micro_batch:
            with _blame(located):
                raise InputError(
                    "micro_batch",
                    f"{plan.micro_batch} is not the plan's batch {plan.batch}: both are the sequences a device "
                    "runs at once; state one",
                )
        fields["batch"] = plan.micro_batch
    shape = {"heads": model.heads, "kv_heads": model.kv_heads, "head_dim": model.head_dim}
    inputs = _declared(
        located, PlanInputs, {k: v for k, v in fields.items() if k in PlanInputs.model_fields} | shape
    )
    setup_fields = {k: v for k, v in fields.items() if k in TrainingSetup.model_fields}
    setup = _declared(located, TrainingSetup, setup_fields | {"gpus": plan.gpus or plan.tp * plan.pp})
    overrides, step, knobs = (
        _declared(located, declaration, {k: v for k, v in fields.items() if k in declaration.model_fields})
        for declaration in (MachineOverrides, StepSetup, FrameworkKnobs)
    )
    with _blame(located):
        load_profile(plan.hw, field="hw")
        Parallelism.of(setup).check(model)  # TP and PP alone: a plan without GPUs plans one layer
        job = None
        if plan.gpus is not None:
            job = make_job(inputs, setup, step, overrides, knobs, model=model)  # the job's one check
        attention = setup.attention(inputs)
        # The job's placement, as `cp-plan step` and `recommend` make it: ranks by the rank order, a node
        # holding devices_per_node of them unless the plan states cp_ranks_per_node.
        machine = job_machine(inputs, overrides).placed(cp_stride(setup, inputs.cp))
    return Resolved(machine, attention, job)


def run_checks(located: Located, confidence: float | None = None) -> list[CheckResult]:
    """Evaluate one plan and compare it with its expectations; with ``confidence``, fits_memory asks that the
    plan fit with at least that probability (:mod:`costmodel.plans.uncertainty`)."""
    plan = located.plan
    resolved = resolve(located)
    job, machine = resolved.job, resolved.machine
    with _blame(located):
        report = evaluate(resolved.attention, machine)
    results = []

    def add(key: str, passed: bool, detail: str) -> None:
        results.append(CheckResult(located.path, plan.name, key, passed, detail, located.line("expect", key)))

    want = plan.expect
    got = report.verdict
    add(
        "worst_verdict",
        ORDER.index(got.verdict) <= ORDER.index(want.worst_verdict),
        f"{got.pass_} verdict {got.verdict} ({got.comm_ratio_step:.2%}); allowed up to {want.worst_verdict}",
    )
    if want.max_comm_ratio is not None:
        add(
            "max_comm_ratio",
            got.comm_ratio_step <= want.max_comm_ratio,
            f"step comm ratio {got.comm_ratio_step:.2%}; ceiling {want.max_comm_ratio:.2%}",
        )
    if job is not None and (want.fits_memory or want.in_recommended_window):
        from costmodel.training.recommend import recommend

        with _blame(located):
            advice = recommend(job, suggest=False)
        row = next(r for r in advice.candidates if r.n == plan.cp)  # CP divides the slice (resolve)
        if want.fits_memory:
            usable = advice.fit.device_memory_bytes
            level = confidence or DEFAULT_LEVEL
            band, chance = memory_interval(job, row.total_bytes, usable, level)
            detail = _memory_detail(job, plan.cp, usable)
            if band.known:
                detail += f"; {level:.0%} interval {band.lo / 1e9:.1f}-{band.hi / 1e9:.1f} GB"  # type: ignore[operator]
            add("fits_memory", *_gated(row.fits, detail, chance, confidence, "memory"))
        if want.in_recommended_window:
            rec = advice.recommendation
            inside = (
                rec.n_min_memory is not None
                and rec.n_max_comm is not None
                and (rec.n_min_memory <= plan.cp <= rec.n_max_comm)
            )
            add(
                "in_recommended_window",
                inside,
                f"N = {plan.cp}; window [{rec.n_min_memory}, {rec.n_max_comm}], recommended {rec.n_recommended}",
            )
    if job is not None and want.timed():
        from costmodel.training.step import evaluate_step

        with _blame(located):
            step = evaluate_step(job, level=confidence or DEFAULT_LEVEL).step
        days = None
        if plan.tokens is not None:
            from costmodel.training.capacity import budget

            days = budget(plan.tokens, plan.global_batch * plan.seq, step.time_s, job.gpus, None).wall_days
        for key, bound in want.timed().items():
            add(key, *_time_check(job, step, key, bound, confidence, days=days))
    return results


# What a check's probability says, and the measured runs it is read on: by what the check bounds.
SAID = {"memory": ("fits", "peaks"), "time": ("meets it", "steps")}


def _gated(
    passed: bool, detail: str, chance: float | None, confidence: float | None, bounds: str
) -> tuple[bool, str]:
    """A check's outcome with its probability; with ``confidence``, passed only when the probability is that
    high (``bounds``: memory or time, which names the probability and the runs it is read on)."""
    said, measured = SAID[bounds]
    if chance is not None:
        detail += f"; {said} with probability {chance:.0%}"
    if confidence is None:
        return passed, detail
    if chance is None:
        return False, detail + f"; too few measured {measured} like it to say so at {confidence:.0%}"
    return chance >= confidence, detail + f", {confidence:.0%} required"


def _figure(figure: str, value: float) -> str:
    if figure == "time_s":
        return f"{value:.3g} s"
    if figure == "days":
        return f"{value:,.1f} days"
    return f"{value:.1%} MFU" if figure == "mfu" else f"{value:,.0f} tokens/s"


def _time_check(
    job: Job, step: StepTimes, key: str, bound: float, confidence: float | None, *, days: float | None = None
) -> tuple[bool, str]:
    """A bound on one of the step's figures, its interval, and the chance the measured step meets it. Each
    figure is the step time times a constant (a ceiling: the time, the token budget's ``days`` at it) or a constant
    over it (a floor: a rate), so a bound is the step time it allows: ``time_s x bound / value`` or
    ``time_s x value / bound``."""
    figure, ceiling = TIMED[key]
    value = days if figure == "days" else getattr(step, figure)
    detail = f"{_figure(figure, value)}; {'ceiling' if ceiling else 'floor'} {_figure(figure, bound)}"
    band = step.time_s_interval
    if band.known:
        lo, hi = band.lo, band.hi
        if ceiling:  # the time's interval, scaled as the figure is
            lo, hi = lo * value / step.time_s, hi * value / step.time_s  # type: ignore[operator]
        else:  # a rate's interval is the time's, turned over
            lo, hi = value * step.time_s / hi, value * step.time_s / lo  # type: ignore[operator]
        detail += f"; {band.level:.0%} interval {_figure(figure, lo)} to {_figure(figure, hi)}"
    budget_s = step.time_s * bound / value if ceiling else step.time_s * value / bound
    chance = time_within(job, step.time_s, budget_s, step.breakdown.model_dump())
    passed = value <= bound if ceiling else value >= bound
    return _gated(passed, detail, chance, confidence, "time")


def _memory_detail(job: Job, cp: int, usable: float) -> str:
    """The fit at the plan's CP degree, its largest category and the peak's moment: what to change first."""
    from costmodel.training.memory import fit_at, training_values

    by = fit_at(Evaluator(training_values(job, cp))).by_category
    total = by.reserved_bytes + by.runtime
    largest, size = max(by.tensors().items(), key=lambda item: item[1])
    return (
        f"{total / 1e9:.1f} GB per device of {usable / 1e9:.1f} GB usable; the most, "
        f"{largest.replace('_', ' ')} {size / 1e9:.1f} GB, at {by.peak}"
    )
