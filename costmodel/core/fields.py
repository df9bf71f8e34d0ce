"""Field types of the YAML inputs (profiles, presets, plans): numbers finite, in range and written as numbers,
switches true or false.

YAML reads ``true`` as a boolean and pydantic would take it for 1; ``.inf``, ``1.0e+400`` and
``1e-320`` are floats that overflow or vanish in the model's products and quotients. Every quantity
therefore lies in a range the arithmetic survives: positive ones in [``FLOOR``, ``CEILING``], which
holds any real machine (1e-30 s is far below a clock tick, 1e30 FLOP/s far above any accelerator),
while the products and quotients of a handful of them stay far inside float64's 1e±308.

pydantic's lax reading would also take a count of ``8.0``, a quoted ``'1_000'`` (Python's ``int()`` reads
the underscore) and a switch of ``'yes'`` or ``1``; here a quoted number is read as a flag is
(:func:`~costmodel.core.units.parse_number`, :func:`~costmodel.core.units.parse_integer`), a count is
written whole and a switch is ``true`` or ``false``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, Strict

from costmodel.core.errors import InputError
from costmodel.core.units import NOT_DECIMAL, is_decimal, parse_integer

FLOOR = 1e-30
CEILING = 1e30
MAX_COUNT = 2**40  # counts (tokens, heads, layers, ...): 1.1e12, far beyond any model or job


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


def _decimal(value: Any) -> Any:
    """A number as written: a quoted one (``'312e12'``) read as a flag is, never ``'1_0'``; not a boolean."""
    value = _not_bool(value)
    if isinstance(value, str) and not is_decimal(value) and _reads_as(float, value):
        raise ValueError(f"{value[:20]!r} {NOT_DECIMAL}")
    return value  # past float64 a number is inf, which the field refuses as not finite


def _whole(value: Any) -> Any:
    """A count as written: an integer (a quoted one read as a flag is), not ``8.0``, ``'1_0'`` or a boolean."""
    value = _not_bool(value)
    if isinstance(value, float):
        raise ValueError("expected a whole number written without a point")
    if isinstance(value, str) and _reads_as(float, value):  # '8', and '8.0' or '1_0', which are refused
        try:
            return parse_integer(value, "value")
        except InputError as exc:
            raise ValueError(exc.message) from None
    return value


def _reads_as(kind: type, text: str) -> bool:
    """Whether Python's ``int()`` or ``float()`` reads ``text``: ``'1_0'`` and ``'nan'`` are refused as
    numbers written otherwise, ``'fast'`` is left to the field's own message."""
    try:
        kind(text)
    except (ValueError, OverflowError):
        return False
    return True


def _positive(value: float) -> float:
    if value <= 0:  # the range below is the arithmetic's; a sign is the plain mistake
        raise ValueError("must be more than 0")
    if not FLOOR <= value <= CEILING:
        raise ValueError(f"must be in [{FLOOR:g}, {CEILING:g}]")
    return value


def _non_negative(value: float) -> float:
    if value < 0:
        raise ValueError("must be 0 or more")
    if value != 0 and not FLOOR <= value <= CEILING:
        raise ValueError(f"must be 0 or in [{FLOOR:g}, {CEILING:g}]")
    return value


def _finite(value: float) -> float:
    if not -CEILING <= value <= CEILING:
        raise ValueError(f"must be in [-{CEILING:g}, {CEILING:g}]")
    return value


NotBool = BeforeValidator(_not_bool)
NumberAsWritten = BeforeValidator(_decimal)
CountAsWritten = BeforeValidator(_whole)
Switch = Annotated[bool, Strict()]
"""true or false: not ``'yes'``, ``1`` or ``'false'``."""

# The bounds are checked by the validators (for a readable message) and shown in the JSON schema (for the docs).
Positive = Annotated[
    float,
    Field(allow_inf_nan=False, json_schema_extra={"minimum": FLOOR, "maximum": CEILING}),
    AfterValidator(_positive),
    NumberAsWritten,
]
"""A quantity in [1e-30, 1e30]."""

NonNegative = Annotated[
    float,
    Field(allow_inf_nan=False, json_schema_extra={"minimum": 0, "maximum": CEILING}),
    AfterValidator(_non_negative),
    NumberAsWritten,
]
"""0, or a quantity in [1e-30, 1e30]."""

Finite = Annotated[
    float,
    Field(allow_inf_nan=False, json_schema_extra={"minimum": -CEILING, "maximum": CEILING}),
    AfterValidator(_finite),
    NumberAsWritten,
]
"""Any real number of magnitude at most 1e30."""


def Within(low: float, high: float, unit: str, *, zero: bool = False) -> Any:  # noqa: N802 - reads as a type
    """A physical quantity in [low, high] ``unit`` (0 too, with ``zero``): what a real machine can state. Beyond
    it a value is a unit slip (a bandwidth in bits, a latency in microseconds), and the model's figures from it
    would be nonsense that no check downstream catches."""

    def _inside(value: float) -> float:
        if not (low <= value <= high or (zero and value == 0)):
            raise ValueError(f"must be {'0 or ' if zero else ''}from {low:g} to {high:g} {unit}")
        return value

    return Annotated[
        float,
        Field(allow_inf_nan=False, json_schema_extra={"minimum": 0 if zero else low, "maximum": high}),
        AfterValidator(_inside),
        NumberAsWritten,
    ]


BytesPerSecond = Within(1e6, 1e15, "bytes/s")
"""A link's or a memory's bandwidth: 1 MB/s to 1 PB/s."""
Latency = Within(1e-9, 1.0, "s", zero=True)
"""A per-message, per-launch or per-call time: up to a second."""
Overhead = Within(1e-9, 3600.0, "s", zero=True)
"""A fixed time per step or per layer: up to an hour."""
Share = Within(1e-6, 0.99, "(a share of the device)", zero=True)
"""A share of a device's units, below the whole."""
FlopRate = Within(1e6, CEILING, "FLOP/s")
"""A kernel's measured or stated rate, from 1 MFLOP/s: far below is a unit slip. Above, a device's peak bounds
a profile's tables where it states one; a benchmark's smoke case on a CPU times empty work far faster."""


def Count(minimum: int = 1, maximum: int = MAX_COUNT) -> Any:  # noqa: N802 - reads as a type
    """A whole number in [minimum, maximum], written as one: not ``8.0``, ``'1_0'`` or a boolean."""
    return Annotated[
        int, Field(ge=minimum, le=maximum), CountAsWritten
    ]  # last: it runs first, Field shows in the schema
