"""The parallel layout: each flag declared once, every degree checked once, DP and micro-batches derived."""

from __future__ import annotations

import pathlib
import re

import pytest

from costmodel.core.errors import InputError
from costmodel.inference.setup import InferenceSetup
from costmodel.plans.inputs import (
    LayerKernel,
    MachineOverrides,
    Parallelism,
    PlanInputs,
    TrainingSetup,
    build,
)
from costmodel.plans.job import FrameworkKnobs, StepSetup
from costmodel.plans.models import load_model

DECLARED = (
    PlanInputs,
    TrainingSetup,
    LayerKernel,
    MachineOverrides,
    StepSetup,
    FrameworkKnobs,
    InferenceSetup,
)
ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_flag_several_commands_take_is_one_declaration() -> None:
    seen: dict[str, tuple] = {}
    for model in DECLARED:
        for name, info in model.model_fields.items():
            # the default is each command's own (cp-plan plans 8 ranks, infer 1), and so is how a missing flag
            # is fitted (training's kernel is its framework's); metadata once each: the shared declaration's,
            # beside its annotation's own validators
            extra = info.json_schema_extra
            extra = {k: v for k, v in extra.items() if k != "fitted"} if isinstance(extra, dict) else extra
            declaration = (info.description, sorted(set(map(repr, info.metadata))), extra)
            assert seen.setdefault(name, declaration) == declaration, f"{name} declared twice"


@pytest.mark.parametrize(
    ("layout", "gpus", "dp", "micro"),
    [
        ({"tp": 2, "cp": 4, "pp": 2, "micro_batch": 1, "global_batch": 32}, 64, 4, 8),
        ({"tp": 8, "cp": 1, "pp": 1, "micro_batch": 2, "global_batch": 16}, 64, 8, 1),
        ({"tp": 1, "cp": 1, "pp": 4, "vpp": 2, "global_batch": 4}, 4, 1, 4),
        ({"tp": 4, "cp": 2}, None, 1, None),  # a serving replica: no DP, no global batch
    ],
)
def test_check_derives_dp_and_micro_batches(
    layout: dict, gpus: int | None, dp: int, micro: int | None
) -> None:
    derived = Parallelism(**layout).check(load_model("llama3-8b"), gpus)
    assert (derived.dp, derived.micro_batches) == (dp, micro)
    assert derived.stages.first + derived.stages.last >= 1


@pytest.mark.parametrize(
    ("layout", "gpus", "flag", "says"),
    [
        ({"tp": 3}, 9, "--tp", "3 must divide the model's 32 heads"),
        ({"tp": 2, "pp": 2}, 6, "--gpus", "6 GPUs do not split into TP x PP = 4 groups"),
        ({"tp": 2, "cp": 3}, 8, "--gpus", "8 is not divisible by tp x cp x pp = 6"),
        ({"pp": 64}, 64, "--pp", "64 pipeline stages exceed the model's 32 layers"),
        ({"global_batch": 3}, 2, "--global-batch", "3 is not divisible by micro-batch x DP = 1 x 2"),
        ({"pp": 4, "vpp": 2, "global_batch": 2}, 4, "--vpp", "interleaving needs at least --pp 4"),
        ({"ep": 2}, 8, "--ep", "needs an MoE model"),
    ],
)
def test_check_names_the_flag(layout: dict, gpus: int, flag: str, says: str) -> None:
    with pytest.raises(InputError) as caught:
        Parallelism(**layout).check(load_model("llama3-8b"), gpus)
    assert caught.value.field == flag and says in caught.value.message


def test_each_degree_has_its_own_range() -> None:
    assert build(PlanInputs, batch=2**17).batch == 2**17  # sequences, not bounded by a head count
    assert build(TrainingSetup, gpus=2**18, tp=2**17).tp == 2**17  # devices: the job's GPUs bound it
    with pytest.raises(InputError, match="must be <= 1024"):
        build(PlanInputs, cp=2048)


def test_the_cp_degree_keeps_its_former_name() -> None:
    assert build(PlanInputs, n=4).cp == build(PlanInputs, cp=4).cp == 4
    assert PlanInputs(seq=4096, n=2).model_dump()["cp"] == 2
    with pytest.raises(TypeError, match="no field n"):  # a copy would otherwise keep the old degree silently
        PlanInputs().model_copy(update={"n": 2})


def test_machines_are_built_in_machines_only() -> None:
    pattern = re.compile(r"(?<![\w.])Machine\(")
    sites = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("costmodel", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "machines" not in path.relative_to(ROOT).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert sites == [], "build_machine (machines/binding.py) is the one constructor"
