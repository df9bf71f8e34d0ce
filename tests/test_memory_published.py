"""Memory per device against published peaks (validation/memory_peaks.yaml): every row of the fitting part
within 15 % of the model's figure of its kind, or a named known miss that does miss; and every published
configuration that ran out of memory (validation/memory_oom.yaml) refused."""

from __future__ import annotations

import statistics

import pytest

from costmodel.training.memory_validation import (
    GOAL,
    KNOWN_MISSES,
    KNOWN_OOM_MISSES,
    compared,
    fits_at_floor,
    out_of_memory,
    refused_ooms,
    rows,
)

FITTING = compared("fitting")


@pytest.mark.parametrize(("row", "predicted", "why"), FITTING, ids=[row.id for row, *_ in FITTING])
def test_published_peak(row, predicted, why) -> None:
    if predicted is None:
        assert why and why.startswith("not planned"), row.id
        return
    error = predicted / row.measured_bytes - 1
    if why is None:
        assert abs(error) <= GOAL, f"{row.id}: {error:+.1%}"
    else:
        assert abs(error) > GOAL, f"{row.id} is named a known miss but lies within {GOAL:.0%} ({error:+.1%})"


def test_known_misses_name_rows_of_the_table() -> None:
    ids = {row.id for row in rows("fitting")}
    assert set(KNOWN_MISSES) <= ids


def test_the_fitting_part_holds_its_median() -> None:
    """The median |error| over the planned rows of the fitting part, as docs/validation.md states it."""
    errors = [abs(p / row.measured_bytes - 1) for row, p, _ in FITTING if p is not None]
    assert len(errors) == 49 and statistics.median(errors) == pytest.approx(0.085, abs=0.0005)


def test_the_held_out_part_is_reported_apart() -> None:
    """The held-out rows load and are planned; none is held to a tolerance (they were not looked at while the
    model was built) and none names a known miss."""
    held = compared("holdout")
    assert len(held) == 28 and not {row.id for row, *_ in held} & {row.id for row, *_ in FITTING}
    assert all(why is None or why.startswith("not planned") for _, _, why in held)


OOMS = refused_ooms()


@pytest.mark.parametrize(
    ("oom", "fits"),
    [
        pytest.param(oom, fits, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_OOM_MISSES[oom.id])])
        if oom.id in KNOWN_OOM_MISSES
        else (oom, fits)
        for oom, fits, _ in OOMS
    ],
    ids=[oom.id for oom, *_ in OOMS],
)
def test_a_configuration_that_ran_out_of_memory_is_refused(oom, fits) -> None:
    assert not fits, oom.id


@pytest.mark.parametrize(
    ("oom", "chance"), [(oom, chance) for oom, _, chance in OOMS], ids=[o.id for o, *_ in OOMS]
)
def test_a_configuration_that_ran_out_of_memory_gets_less_than_an_even_chance(oom, chance) -> None:
    """2-10 %, and 40 % for the Llama 3 70B run that ran out of memory in 30-60 % of its runs."""
    assert chance is not None and chance < 0.5, f"{oom.id}: {chance}"


def test_the_allocator_floor_would_pass_two_that_ran_out_of_memory() -> None:
    """Why the fit is judged on what the allocator reserves, not on its floor (the tensors and the runtime, had
    it released every cached block): the floor would pass the Qwen3-4B 128K, the Qwen2 7B batch-48 and
    Megatron-Bridge's Llama 3 70B runs, which ran out of memory. A known miss of the floor, named so that a
    change to the fit rule meets it."""
    passed = {oom.id for oom, job in out_of_memory() if fits_at_floor(job)}
    assert passed == {
        "hf-ulysses-qwen3-4b-sp4-4gpu-128k",
        "liger-qwen2-7b-fsdp4-bs48-nolgr-512",
        "mbridge-llama3-70b-sft-tp4-pp4-vp5-fp8cs-4k",
    }


def test_an_out_of_memory_entry_is_a_changed_row_or_a_setup() -> None:
    entry = {
        "id": "x",
        "base": "liger-qwen2-7b-fsdp4-bs32-nolgr-512",
        "change": {"micro_batch": 48, "global_batch": 192},
        "evidence": "e",
    }
    ((_, job),) = out_of_memory([entry])
    assert job.step.micro_batch == 48 and job.inputs.seq == 512 and job.gpus == 4
    with pytest.raises(ValueError, match="no row of the peak tables"):
        out_of_memory([{**entry, "base": "nowhere"}])
    with pytest.raises(ValueError, match="change names sequence"):
        out_of_memory([{**entry, "change": {"sequence": 1}}])
    setup = {"model": "llama3-8b", "seq": 8192, "gpus": 8, "hw": "h100-nvlink", "global_batch": 8}
    ((_, job),) = out_of_memory([{"id": "y", "setup": setup, "evidence": "e"}])
    assert job.inputs.seq == 8192 and job.gpus == 8
    with pytest.raises(ValueError, match="not both or neither"):
        out_of_memory([{**entry, "setup": setup}])
    with pytest.raises(ValueError, match="not both or neither"):
        out_of_memory([{"id": "z", "evidence": "e"}])
