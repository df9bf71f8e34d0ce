"""Capacity-plan files and the checks CI gates on (`cp-plan check PLAN.yaml...`, issue 5).

A plan file names a model, S, N, hardware and the training layout, and what must hold: the worst
verdict allowed, a ceiling on the comm ratio, that memory fits, that N lies in the recommended
window. Problems in a file are reported with its path, the line and the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from costmodel.core.errors import InputError, validation_problems
from costmodel.core.fields import Count, NotBool, Positive
from costmodel.core.fileio import YamlDocument, YamlInputError, read_yaml
from costmodel.machines.profiles import Dtype, load_profile
from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import Pass, PlanInputs, Recompute, TrainingSetup, parse_tokens
from costmodel.plans.models import load_model
from costmodel.plans.verdict import BANDS, Colour
from costmodel.schedule.layouts import Layout

ORDER = [band.verdict for band in BANDS]
# The ranges of the flags of the same names.
MAX_TOKENS = 2**34  # 16G tokens
MAX_DEVICES = 2**20
MAX_DEGREE = 2**16  # TP, PP, batch


class Expectations(BaseModel):
    """What must hold for the plan to pass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worst_verdict: Colour = Field("amber", description="the worst verdict allowed for the plan's pass")
    max_comm_ratio: Positive | None = Field(None, description="ceiling on the step comm ratio")
    fits_memory: bool = Field(False, description="training memory must fit (needs gpus)")
    in_recommended_window: bool = Field(False, description="N within [N_min(memory), N_max(comm)] (needs gpus)")


class PlanFile(BaseModel):
    """A capacity plan (configs/plans/*.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(description="what the plan is for")
    model: str = Field(description="model preset name or YAML path")
    seq: Count(maximum=MAX_TOKENS) = Field(description="S, tokens; 128k and 1M are accepted")
    n: Count(maximum=MAX_DEVICES) = Field(description="N, the CP degree")
    hw: str = Field(description="hardware profile name or YAML path")
    gpus: Count(maximum=MAX_DEVICES) | None = Field(None, description="G, accelerators in the job (needed for memory checks)")
    tp: Count(maximum=MAX_DEGREE) = 1
    pp: Count(maximum=MAX_DEGREE) = 1
    zero: Annotated[Literal[0, 1, 2, 3], NotBool] = 1  # YAML's true would pass for 1
    recompute: Recompute = "selective"
    memory_headroom: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False), NotBool] = 0.10
    causal: bool = True
    layout: Layout = "zigzag"
    pass_: Pass = Field("fwd+bwd", alias="pass")
    dtype: Dtype = "bf16"
    batch: Count(maximum=MAX_DEGREE) = 1
    block: Count(maximum=MAX_TOKENS) = 1024
    efficiency: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), NotBool] = 1.0
    expect: Expectations = Field(default_factory=Expectations)

    @field_validator("seq", "block", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> Any:
        try:
            return parse_tokens(value) if isinstance(value, str | int) and not isinstance(value, bool) else value
        except InputError as exc:
            raise ValueError(exc.message) from None
        except (OverflowError, ValueError):  # digits beyond float's range
            raise ValueError(f"{str(value)[:40]!r} is not a length") from None

    @model_validator(mode="after")
    def _memory_checks_need_gpus(self) -> PlanFile:
        if (self.expect.fits_memory or self.expect.in_recommended_window) and self.gpus is None:
            raise ValueError("expect.fits_memory and expect.in_recommended_window need gpus")
        return self


@dataclass(frozen=True)
class Located:
    """A loaded plan with the line of every field, for messages and annotations."""

    path: str
    plan: PlanFile
    document: YamlDocument

    def line(self, *keys: str) -> int:
        return self.document.line(*keys)


class InvalidPlan(InputError):
    """Every problem found in plan files as (file, line or None, text): one line for the terminal, and
    one annotation each under ``--format github``."""

    def __init__(self, problems: list[tuple[str, int | None, str]]) -> None:
        def where(path: str, line: int | None) -> str:
            return path if line is None else f"{path}:{line}"

        (path, line, first), rest = problems[0], problems[1:]
        super().__init__(where(path, line), "; ".join([first, *(f"{where(p, n)}: {text}" for p, n, text in rest)]))
        self.problems = problems


def load_plan(path: str) -> Located:
    """Parse with the hardened loader, keeping line numbers; every problem in the file is reported at once."""
    try:
        document = read_yaml(path, path)
    except YamlInputError as exc:
        raise InvalidPlan([(path, exc.line, exc.problem)]) from None
    data = document.data
    if not isinstance(data, dict):
        raise InvalidPlan([(path, None, f"expected a mapping of plan fields, got {type(data).__name__}")])
    try:
        plan = PlanFile.model_validate(data)
    except ValidationError as exc:
        problems = [(path, document.line(*loc), (f"{'.'.join(loc)}: " if loc else "") + text)
                    for loc, text in validation_problems(exc)]  # fmt: skip
        raise InvalidPlan(problems) from None
    return Located(path, plan, document)


def load_plans(paths: list[str]) -> list[Located]:
    """Every file, each valid, before anything runs; otherwise the problems of all of them."""
    located, problems = [], []
    for path in paths:
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


def run_checks(located: Located) -> list[CheckResult]:
    """Evaluate one plan and compare it with its expectations."""
    plan = located.plan
    with _blame(located):
        model = load_model(plan.model, field="model")
        profile = load_profile(plan.hw, field="hw")
        inputs = PlanInputs(
            seq=plan.seq, n=plan.n, batch=plan.batch, heads=model.heads, kv_heads=model.kv_heads,
            head_dim=model.head_dim, dtype=plan.dtype, block=plan.block, causal=plan.causal, layout=plan.layout,
            efficiency=plan.efficiency, hw=profile.name, model=model.name, pass_=plan.pass_,
        ).check()  # fmt: skip
        setup = TrainingSetup(gpus=plan.gpus or plan.tp * plan.pp, tp=plan.tp, pp=plan.pp, zero=plan.zero,
                              recompute=plan.recompute, memory_headroom=plan.memory_headroom,
                              pass_=plan.pass_).check()  # fmt: skip
        report = evaluate(setup.attention(inputs), setup.placed(profile))
    results = []

    def add(key: str, passed: bool, detail: str) -> None:
        results.append(CheckResult(located.path, plan.name, key, passed, detail, located.line("expect", key)))

    want = plan.expect
    got = report.verdict
    add("worst_verdict", ORDER.index(got.verdict) <= ORDER.index(want.worst_verdict),
        f"{got.pass_} verdict {got.verdict} ({got.comm_ratio_step:.2%}); allowed up to {want.worst_verdict}")  # fmt: skip
    if want.max_comm_ratio is not None:
        add("max_comm_ratio", got.comm_ratio_step <= want.max_comm_ratio,
            f"step comm ratio {got.comm_ratio_step:.2%}; ceiling {want.max_comm_ratio:.2%}")  # fmt: skip
    if plan.gpus is not None and (want.fits_memory or want.in_recommended_window):
        from costmodel.training.recommend import recommend

        with _blame(located):
            advice = recommend(inputs, model, setup, profile, suggest=False)
        row = next((r for r in advice.candidates if r.n == plan.n), None)
        if row is None:
            raise InvalidPlan([(located.path, located.line("n"),
                                f"n: {plan.n} does not divide the {setup.shard_group} ranks of a TP x PP slice")])  # fmt: skip
        if want.fits_memory:
            add("fits_memory", row.fits, f"{row.total_bytes / 1e9:.1f} GB per device of "
                f"{advice.fit.device_memory_bytes / 1e9:.1f} GB usable")  # fmt: skip
        if want.in_recommended_window:
            rec = advice.recommendation
            inside = rec.n_min_memory is not None and rec.n_max_comm is not None and (
                rec.n_min_memory <= plan.n <= rec.n_max_comm)
            add("in_recommended_window", inside,
                f"N = {plan.n}; window [{rec.n_min_memory}, {rec.n_max_comm}], recommended {rec.n_recommended}")  # fmt: skip
    return results


def _xml_text(text: str) -> str:
    """``text`` without the characters XML 1.0 forbids (C0 controls but tab, CR, LF; lone surrogates;
    U+FFFE, U+FFFF), each shown as its code point instead, so a plan's name cannot break the report [XML-1.0 §2.2]."""
    import re

    return re.sub("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]",
                  lambda m: f"\\u{ord(m.group()):04x}", text)


def junit(results: list[CheckResult]) -> str:
    """JUnit XML: one suite per plan file, one case per expectation."""
    from xml.etree import ElementTree as ET

    x = _xml_text
    suites = ET.Element("testsuites", name="cp-plan check", tests=str(len(results)),
                        failures=str(sum(not r.passed for r in results)))  # fmt: skip
    by_file: dict[str, list[CheckResult]] = {}
    for r in results:
        by_file.setdefault(r.plan, []).append(r)
    for path, items in by_file.items():
        suite = ET.SubElement(suites, "testsuite", name=x(path), tests=str(len(items)),
                              failures=str(sum(not r.passed for r in items)))  # fmt: skip
        for r in items:
            case = ET.SubElement(suite, "testcase", classname=x(r.name), name=r.check, file=x(path), line=str(r.line))
            if not r.passed:
                ET.SubElement(case, "failure", message=x(r.detail)).text = x(r.detail)
            else:
                ET.SubElement(case, "system-out").text = x(r.detail)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _escape_data(text: str) -> str:
    """A workflow command's message [GH-Commands]."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value (file=, title=): ``:`` and ``,`` end it unless escaped."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(level: str, path: str, line: int | None, title: str, message: str) -> str:
    where = f"file={_escape_property(path)}" + ("" if line is None else f",line={line}")
    return f"::{level} {where},title={_escape_property(title)}::{_escape_data(message)}"


def github(results: list[CheckResult]) -> str:
    """GitHub workflow commands: an error annotation on the failing line, a notice for each pass."""
    lines = [_annotation("notice" if r.passed else "error", r.plan, r.line, f"cp-plan {r.check}", f"{r.name}: {r.detail}")
             for r in results]  # fmt: skip
    return "\n".join(lines) + "\n"


def github_problems(error: InvalidPlan) -> str:
    """An error annotation for every problem of invalid plan files, on its line."""
    return "".join(_annotation("error", path, line, "cp-plan invalid plan", text) + "\n"
                   for path, line, text in error.problems)  # fmt: skip
