"""Numeric field types of the YAML inputs (profiles, presets, plans): finite, in range, never a boolean.

YAML reads ``true`` as a boolean and pydantic would take it for 1; ``.inf``, ``1.0e+400`` and
``1e-320`` are floats that overflow or vanish in the model's products and quotients. Every quantity
therefore lies in a range the arithmetic survives: positive ones in [``FLOOR``, ``CEILING``], which
holds any real machine (1e-30 s is far below a clock tick, 1e30 FLOP/s far above any accelerator),
while the products and quotients of a handful of them stay far inside float64's 1e±308.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

FLOOR = 1e-30
CEILING = 1e30
MAX_COUNT = 2**40  # counts (tokens, heads, layers, ...): 1.1e12, far beyond any model or job


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


def _positive(value: float) -> float:
    if not FLOOR <= value <= CEILING:
        raise ValueError(f"must be in [{FLOOR:g}, {CEILING:g}]")
    return value


def _non_negative(value: float) -> float:
    if value != 0 and not FLOOR <= value <= CEILING:
        raise ValueError(f"must be 0 or in [{FLOOR:g}, {CEILING:g}]")
    return value


def _finite(value: float) -> float:
    if not -CEILING <= value <= CEILING:
        raise ValueError(f"must be in [-{CEILING:g}, {CEILING:g}]")
    return value


NotBool = BeforeValidator(_not_bool)

# The bounds are checked by the validators (for a readable message) and shown in the JSON schema (for the docs).
Positive = Annotated[
    float,
    Field(allow_inf_nan=False, json_schema_extra={"minimum": FLOOR, "maximum": CEILING}),
    AfterValidator(_positive),
    NotBool,
]
"""A quantity in [1e-30, 1e30]."""

NonNegative = Annotated[
    float,
    Field(allow_inf_nan=False, json_schema_extra={"minimum": 0, "maximum": CEILING}),
    AfterValidator(_non_negative),
    NotBool,
]
"""0, or a quantity in [1e-30, 1e30]."""

Finite = Annotated[
    float,
    Field(allow_inf_nan=False, json_schema_extra={"minimum": -CEILING, "maximum": CEILING}),
    AfterValidator(_finite),
    NotBool,
]
"""Any real number of magnitude at most 1e30."""


def Count(minimum: int = 1, maximum: int = MAX_COUNT) -> Any:  # noqa: N802 - reads as a type
    """A whole number in [minimum, maximum], not a boolean."""
    return Annotated[
        int, Field(ge=minimum, le=maximum), NotBool
    ]  # NotBool last: it runs first, Field shows in the schema
