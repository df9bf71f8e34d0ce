"""Measured tables read from CSV, and how far predictions sit from them: one reader and one error summary for
every command that compares the model with measurements (``audit --runs``, ``hw fit-kernels``)."""

from __future__ import annotations

import csv
import io
import statistics
from typing import Any

from costmodel.core.errors import InputError
from costmodel.core.fileio import read_input_text

GOAL = 0.15  # |error| a prediction is held to; beyond it a row is a miss to explain


def read_csv(
    path: str, field: str, kind: str, max_rows: int
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """A CSV table's header and its non-blank rows with their line numbers, each as long as the header.

    A byte-order mark is dropped (spreadsheets and vTrain's tables write one); an empty file, a ragged row,
    malformed quoting, no rows or more than ``max_rows`` are one :class:`InputError` line on ``field``."""
    text = read_input_text(path, field, kind).removeprefix("\ufeff")
    try:
        with io.StringIO(text, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise InputError(field, f"{path} is empty; expected a header row and one row per {kind}")
            rows = []
            for number, cells in enumerate(reader, start=2):
                if not any(cell.strip() for cell in cells):
                    continue
                if len(cells) != len(header):
                    raise InputError(
                        field, f"{path} line {number}: {len(cells)} cells for {len(header)} columns"
                    )
                if len(rows) >= max_rows:
                    raise InputError(field, f"{path}: more than {max_rows:,} {kind}")
                rows.append((number, cells))
    except csv.Error as exc:
        raise InputError(field, f"{path}: malformed CSV: {exc}") from None
    if not rows:
        raise InputError(field, f"{path} has a header but no {kind}")
    return header, rows


def errors_summary(errors: list[float]) -> dict[str, Any]:
    """MAPE, median and worst |error|, signed median and the share within 15 % of a list of relative errors."""
    absolute = [abs(e) for e in errors]
    return {
        "n": len(errors),
        "mape": statistics.fmean(absolute),
        "median_abs_error": statistics.median(absolute),
        "max_abs_error": max(absolute),
        "signed_median": statistics.median(errors),
        "within_15": sum(a <= GOAL for a in absolute) / len(absolute),
    }
