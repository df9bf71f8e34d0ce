"""Measured tables read from CSV or YAML, and how far predictions sit from them: one reader of each and one
error summary for every command and table that compares the model with measurements (``audit --runs``,
``hw fit-kernels``, the published figures of ``validation/``)."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import random
import statistics
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

from costmodel.core.errors import InputError
from costmodel.core.fileio import FileInputError, read_input_text, read_yaml

Row = TypeVar("Row")

GOAL = 0.15  # |error| a prediction is held to; beyond it a row is a miss to explain


def read_csv(
    path: str,
    field: str,
    kind: str,
    max_rows: int,
    check_header: Callable[[list[str]], None] | None = None,
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """A CSV table's header and its non-blank rows with their line numbers, each as long as the header.

    A byte-order mark is dropped (spreadsheets and vTrain's tables write one); an empty file, a ragged row,
    malformed quoting, no rows or more than ``max_rows`` are one :class:`InputError` line on ``field``.
    ``check_header`` reads the header first: a table whose first line is a row, not a header, is told so
    by its unknown columns, not as a header without rows."""
    text = read_input_text(path, field, kind)
    try:
        with io.StringIO(text, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise InputError(
                    field, f"{path} is empty; expected a header row and a row for each of its {kind}"
                )
            if check_header is not None:
                check_header(header)
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


def draw_thirds(keys: Iterable[tuple[str, str]], generator: int = 2026) -> set[str]:
    """The keys a table keeps aside, from (group, key) pairs: ``random.Random(generator)``, then for each group in
    sorted order ``random.sample(sorted(its keys), round(n / 3))``, one generator through all groups."""
    rng = random.Random(generator)
    by_group: dict[str, list[str]] = {}
    for group, key in keys:
        by_group.setdefault(group, []).append(key)
    held: set[str] = set()
    for group in sorted(by_group):
        held.update(rng.sample(sorted(by_group[group]), round(len(by_group[group]) / 3)))
    return held


def read_rows(
    path: str | os.PathLike[str],
    row_type: type[Row],
    check: Callable[[Row], tuple[str, str] | None] | None = None,
    field: str = "validation",
) -> list[Row]:
    """The rows of a table of published figures: a YAML list with one mapping per figure, each stating every
    field of the dataclass ``row_type`` (among them ``key``, the row's name) and nothing else.

    A row that is not a mapping, lacks a field, has one the dataclass does not, holds a value of the wrong
    type, repeats an earlier key or fails ``check`` (which returns the field at fault and the problem) is
    one :class:`InputError` naming the file, the line, the row's key and the field: the tables are typed by
    hand, and a typo should read as one, not as a wrong prediction."""
    name = os.fspath(path)
    document = read_yaml(name, field)
    if not isinstance(document.data, list):
        raise FileInputError(field, name, None, "expected a list of rows, one mapping per published figure")
    fields = [f.name for f in dataclasses.fields(row_type)]  # type: ignore[arg-type]
    hints = typing.get_type_hints(row_type)
    rows: list[Row] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(document.data):
        key = raw.get("key") if isinstance(raw, dict) else None
        who = f"row {key!r}" if isinstance(key, str) and key else f"row {index + 1}"
        if not isinstance(raw, dict):
            problem = f"{who}: expected a mapping of {', '.join(fields)}"
            raise FileInputError(field, name, document.line(index), problem)
        fault = _row_problem(raw, fields, hints)
        if fault is None and key in seen:
            fault = ("key", f"the key of the row on line {seen[key]} too")
        row = row_type(**raw) if fault is None else None
        if row is not None and check is not None:
            fault = check(row)
        if fault is not None:
            at, problem = fault
            line = document.line(index, at)  # the field's line, else the row's
            raise FileInputError(field, name, line, f"{who}, field {at!r}: {problem}")
        seen[key] = document.line(index)
        rows.append(row)  # type: ignore[arg-type]
    return rows


def _row_problem(raw: dict[Any, Any], fields: list[str], hints: dict[str, Any]) -> tuple[str, str] | None:
    """The first field of a row at fault, and why: unknown, missing, or of the wrong type."""
    for at in raw:
        if at not in fields:
            return str(at), f"unknown field; a row states {', '.join(fields)}"
    for at in fields:
        if at not in raw:
            return at, "missing; every row states every field"
        if (problem := _type_problem(raw[at], hints[at])) is not None:
            return at, problem
    return None


def _type_problem(value: Any, hint: Any) -> str | None:
    """Why ``value`` is not of the row field's type ``hint``; None when it is."""
    got = f"got {value!r:.60}"
    if hint is str:
        return None if isinstance(value, str) else f"expected text, {got}"
    if hint is bool:
        return None if isinstance(value, bool) else f"expected true or false, {got}"
    if hint is float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return None if number and math.isfinite(value) and value > 0 else f"expected a positive number, {got}"
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        return None if value in choices else f"expected one of {', '.join(choices)}, {got}"
    if typing.get_origin(hint) is dict:  # flags by name: text keys, plain values
        plain = isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in value.items()
        )
        return None if plain else f"expected a mapping of flag names to plain values, {got}"
    raise TypeError(f"a row field of type {hint} is not readable from a table")
