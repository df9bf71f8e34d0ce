"""Memory per device against published peaks (validation/memory_peaks.yaml): every row of the fitting part
within 15 % of the model's figure of its kind, or a named known miss that does miss."""

from __future__ import annotations

import statistics

import pytest

from costmodel.training.memory_validation import GOAL, KNOWN_MISSES, compared, rows

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
