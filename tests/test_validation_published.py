"""The step model against published training runs (costmodel/training/validation.py holds the rows)."""

from __future__ import annotations

import pytest

from costmodel.training.validation import GOAL, ROWS, Published, predict


def test_at_least_eight_published_figures_and_every_wide_row_says_why() -> None:
    assert len(ROWS) >= 8 and len({row.key for row in ROWS}) == len(ROWS)
    assert sum(row.tolerance <= GOAL for row in ROWS) >= 6
    for row in ROWS:
        assert row.tolerance <= GOAL or row.misses, row.key


@pytest.mark.parametrize("row", ROWS, ids=[row.key for row in ROWS])
def test_published_figure(row: Published) -> None:
    """Each published figure within its stated tolerance (15 % unless the row says why not)."""
    predicted = predict(row)
    assert predicted == pytest.approx(row.published, rel=row.tolerance), (
        f"{row.key}: predicted {predicted:.4g}"
    )
