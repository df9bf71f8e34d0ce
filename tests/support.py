"""Helpers the tests share: evaluate a plan, round as the article rounds."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import MachineOverrides, PlanInputs, machine_for
from costmodel.plans.job import Job
from costmodel.plans.schema import Report

REPO = Path(__file__).resolve().parent.parent


def half_up(value: float, digits: int) -> Decimal:
    """``value`` to ``digits`` significant digits, halves up ([A-RingCost] prints 0.5625 as 56.3 %)."""
    d = Decimal(repr(float(value)))
    if d == 0:
        return d
    exponent = d.adjusted() - digits + 1
    return d.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)


def plan(hw: str = "a100-nvlink", inter_bandwidth: str | None = None, **overrides: object) -> Report:
    """The worked example (256K tokens over 8 A100s) with overrides, evaluated on a built-in profile (its
    inter-node link replaced when ``inter_bandwidth`` is given, as ``--inter-node-bandwidth`` does)."""
    inputs = PlanInputs(**{"seq": 262_144, "n": 8, "hw": hw, **overrides})
    return evaluate(inputs, machine_for(inputs, MachineOverrides(inter_node_bandwidth=inter_bandwidth)))


def searched(**flags: object) -> tuple[Job, int]:
    """(the job a layout search starts from, its global batch) for flat flags: the search lays the job out
    itself, so its global batch is held apart from the job (no layout of it is checked against it yet)."""
    global_batch = int(flags.pop("global_batch"))  # type: ignore[call-overload]
    return Job.of(**flags), global_batch


def every_scheme(**flags: object) -> tuple[Job, int]:
    """:func:`searched` under the default framework running every CP scheme in every layout (the search's
    widest space, :func:`costmodel.training.search.widest`)."""
    from costmodel.frameworks import load_framework
    from costmodel.training.search import widest

    global_batch = int(flags.pop("global_batch"))  # type: ignore[call-overload]
    return Job.of(**flags, _framework=widest(load_framework("megatron"))), global_batch


def memory_values(inputs: PlanInputs, setup: object, n: int | None = None, model: object = None) -> dict:
    """The memory formulas' values of the job a single layer's ``inputs`` and a ``TrainingSetup`` make, at
    CP degree ``n`` (default the inputs'); ``model``, already loaded, stands in for ``inputs.model``."""
    from costmodel.plans.job import make_job
    from costmodel.training.memory import training_values

    job = make_job(inputs.model_copy(update={"cp": 1}), setup, model=model)  # type: ignore[arg-type]
    return training_values(job, inputs.cp if n is None else n)
