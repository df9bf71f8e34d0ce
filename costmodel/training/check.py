"""Capacity-plan files and the checks CI gates on (`cp-plan check PLAN.yaml...`, [Korthikanti22]).

A plan file names a model, S, N, hardware and the training layout, and what must hold: the worst
verdict allowed, a ceiling on the comm ratio, that memory fits, that N lies in the recommended
window. Problems in a file are reported with its path, the line and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from costmodel.core.errors import InputError, describe_validation
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import TRAINING_DEFAULTS, PlanInputs, TrainingSetup, problems
from costmodel.plans.models import ModelPreset, load_model
from costmodel.plans.verdict import BANDS, Colour

M = TypeVar("M", bound=BaseModel)
ORDER = [band.verdict for band in BANDS]


class Expectations(BaseModel):
    """What must hold for the plan to pass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worst_verdict: Colour = Field("amber", description="the worst verdict allowed for the plan's pass")
    max_comm_ratio: float | None = Field(None, gt=0, description="ceiling on the step comm ratio")
    fits_memory: bool = Field(False, description="training memory must fit (needs gpus)")
    in_recommended_window: bool = Field(False, description="N within [N_min(memory), N_max(comm)] (needs gpus)")


class _PlanHead(BaseModel):
    """What a plan file holds beyond the declared inputs: its name, the required model, expectations."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(description="what the plan is for", max_length=1000)
    model: str = Field(description="model preset name or YAML path", max_length=4096)
    expect: Expectations = Field(default_factory=Expectations)

    @model_validator(mode="after")
    def _memory_checks_need_gpus(self) -> _PlanHead:
        if (self.expect.fits_memory or self.expect.in_recommended_window) and getattr(self, "gpus", None) is None:
            raise ValueError("expect.fits_memory and expect.in_recommended_window need gpus")
        return self


def _plan_fields() -> dict[str, Any]:
    """Every declared input, with the training defaults; gpus optional (memory checks need it)."""
    fields: dict[str, Any] = {}
    for declaration in (PlanInputs, TrainingSetup):
        for name, info in declaration.model_fields.items():
            if name in _PlanHead.model_fields:
                continue
            default = TRAINING_DEFAULTS.get(name, info.default)
            annotation = info.annotation
            if name == "gpus":
                annotation, default = annotation | None, None
            fields[name] = (annotation, FieldInfo.merge_field_infos(info, default=default))
    return fields


# A capacity plan (configs/plans/*.yaml): the declared inputs, flat, under the names of their flags.
PlanFile = create_model("PlanFile", __base__=_PlanHead, **_plan_fields())


@dataclass(frozen=True)
class Located:
    """A loaded plan with the line of every field, for messages and annotations."""

    path: str
    plan: PlanFile
    lines: dict[tuple[str, ...], int]

    def line(self, *keys: str) -> int:
        for end in range(len(keys), 0, -1):
            if keys[:end] in self.lines:
                return self.lines[keys[:end]]
        return 1


def _field_lines(node: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    import yaml

    lines: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            lines[path] = key.start_mark.line + 1
            lines.update(_field_lines(value, path))
    return lines


def load_plan(path: str) -> Located:
    """Parse with the safe loader, keeping line numbers; any problem is an InputError naming file:line."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise InputError(path, "not a UTF-8 YAML file") from None
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise InputError(f"{path}{where}", f"malformed YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise InputError(path, f"expected a mapping of plan fields, got {type(data).__name__}")
    lines = _field_lines(node)
    try:
        plan = PlanFile.model_validate(data)
    except ValidationError as exc:
        loc = tuple(str(part) for part in exc.errors()[0]["loc"])
        line = Located(path, None, lines).line(*loc) if loc else 1  # type: ignore[arg-type]
        raise InputError(f"{path}:{line}", describe_validation(exc)) from None
    return Located(path, plan, lines)


@dataclass(frozen=True)
class CheckResult:
    plan: str  # file path
    name: str  # the plan's name
    check: str  # expectation key
    passed: bool
    detail: str
    line: int


def _declared(located: Located, model: type[M], values: dict[str, Any]) -> M:
    """Build a declared model from the plan's fields; a problem names the file, line and field."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        field, message = problems(exc)[0]
        raise InputError(f"{located.path}:{located.line(field)}", f"{field}: {message}") from None


@dataclass(frozen=True)
class Resolved:
    """A plan file turned into what the model takes: the whole model's shape and one TP rank's attention."""

    model: ModelPreset
    machine: Machine  # CP ranks placed on nodes with TP innermost
    inputs: PlanInputs  # the model's heads
    setup: TrainingSetup
    attention: PlanInputs  # the heads one TP rank runs


def resolve(located: Located) -> Resolved:
    """Inputs, setup and placed machine of one plan; problems name the file and line."""
    plan = located.plan
    model = load_model(plan.model, field=f"{located.path}:{located.line('model')}: model")
    fields = plan.model_dump(exclude={"name", "expect"})
    shape = {"heads": model.heads, "kv_heads": model.kv_heads, "head_dim": model.head_dim, "model": model.name}
    inputs = _declared(located, PlanInputs, {k: v for k, v in fields.items() if k in PlanInputs.model_fields} | shape)
    setup_fields = {k: v for k, v in fields.items() if k in TrainingSetup.model_fields}
    setup = _declared(located, TrainingSetup, setup_fields | {"gpus": plan.gpus or plan.tp * plan.pp})
    try:
        attention = setup.attention(inputs)
    except InputError as exc:
        raise InputError(f"{located.path}:{located.line(exc.field)}", f"{exc.field}: {exc.message}") from None
    profile = load_profile(plan.hw, field=f"{located.path}:{located.line('hw')}: hw")
    machine = Machine(profile, inputs.dtype, inputs.efficiency).placed(setup.tp)
    return Resolved(model, machine, inputs, setup, attention)


def run_checks(located: Located) -> list[CheckResult]:
    """Evaluate one plan and compare it with its expectations."""
    plan = located.plan
    resolved = resolve(located)
    model, machine, inputs, setup = resolved.model, resolved.machine, resolved.inputs, resolved.setup
    report = evaluate(resolved.attention, machine)
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

        advice = recommend(inputs, model, setup, machine, suggest=False)
        row = next((r for r in advice.candidates if r.n == plan.n), None)
        if row is None:
            raise InputError(f"{located.path}:{located.line('n')}",
                             f"n: {plan.n} does not divide the {setup.shard_group} ranks of a TP x PP slice")  # fmt: skip
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


def junit(results: list[CheckResult]) -> str:
    """JUnit XML: one suite per plan file, one case per expectation."""
    from xml.etree import ElementTree as ET

    suites = ET.Element("testsuites", name="cp-plan check", tests=str(len(results)),
                        failures=str(sum(not r.passed for r in results)))  # fmt: skip
    by_file: dict[str, list[CheckResult]] = {}
    for r in results:
        by_file.setdefault(r.plan, []).append(r)
    for path, items in by_file.items():
        suite = ET.SubElement(suites, "testsuite", name=path, tests=str(len(items)),
                              failures=str(sum(not r.passed for r in items)))  # fmt: skip
        for r in items:
            case = ET.SubElement(suite, "testcase", classname=r.name, name=r.check, file=path, line=str(r.line))
            if not r.passed:
                ET.SubElement(case, "failure", message=r.detail).text = r.detail
            else:
                ET.SubElement(case, "system-out").text = r.detail
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def github(results: list[CheckResult]) -> str:
    """GitHub workflow commands: an error annotation on the failing line, a notice for each pass."""

    def escape(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    lines = []
    for r in results:
        level = "notice" if r.passed else "error"
        lines.append(f"::{level} file={r.plan},line={r.line},title=cp-plan {r.check}::{escape(f'{r.name}: {r.detail}')}")
    return "\n".join(lines) + "\n"
