"""How a command's answer goes out: one :class:`Format` for every command, each command accepting its own
subset of it (:func:`format_option`), and one :func:`emit` that writes JSON and YAML from the command's
data and every other format from the renderer the command names for it."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Literal

import typer


class Format(str, Enum):
    """Every output format of the command line. ``json`` and ``yaml`` are the data itself; the others are
    views of it: ``table`` on the screen, ``csv`` rows, ``markdown`` and ``html`` pages, ``junit`` and
    ``github`` for CI, ``megatron`` and ``torchtitan`` a plan in that framework's own arguments."""

    table = "table"
    json = "json"
    yaml = "yaml"
    csv = "csv"
    markdown = "markdown"
    html = "html"
    junit = "junit"
    github = "github"
    megatron = "megatron"
    torchtitan = "torchtitan"


def format_option(*accepted: str, short: bool = True) -> Any:
    """The ``--format`` flag of a command that prints ``accepted`` (the first is the default's place in
    the help): any other value is refused by name, and the command receives a :class:`Format`."""
    names = ("--format", "-f") if short else ("--format",)
    choices = Literal.__getitem__(tuple(Format(name).value for name in accepted))
    return Annotated[choices, typer.Option(*names, help="Output format.", callback=_to_format)]


def _to_format(value: str | Format) -> Format:
    return Format(value)


def as_json(data: Any) -> str:
    """The data as strict JSON (no NaN), indented; what is not JSON already (a path, a date) as text."""
    return json.dumps(data, indent=2, allow_nan=False, default=str)


def as_yaml(data: Any) -> str:
    """The data as YAML, keys in their order, read through JSON so that it holds only plain values."""
    import yaml

    return yaml.safe_dump(json.loads(as_json(data)), sort_keys=False, allow_unicode=True)


def as_csv(rows: list[dict[str, Any]]) -> str:
    """Rows of one shape as CSV with a header line (``hw`` alone when there are none)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]) if rows else ["hw"])
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def emit(data: Any, format: Format, **views: Callable[[], str | None]) -> None:
    """Write a command's answer to stdout: JSON or YAML from ``data``; any other format from the view
    named after it, which returns the text or draws on the console itself and returns ``None``."""
    if format is Format.json:
        text: str | None = as_json(data) + "\n"
    elif format is Format.yaml:
        text = as_yaml(data)
    else:
        text = views[format.value]()
    if text:
        sys.stdout.write(text)
