"""Human-readable numbers: decimal SI prefixes (GB = 1e9 B), as datasheets write them."""

from __future__ import annotations

import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from costmodel.core.errors import InputError

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))
GIB = 2**30  # bytes in a gibibyte: torch, nvidia-smi and framework logs count memory in them
TOKENS_HELP = "a positive integer, optionally with k, M or G (k = 1,024), e.g. 262144, 256k, 1M"

_TOKENS = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", re.ASCII)
_INTEGER = re.compile(r"\s*[0-9]+\s*", re.ASCII)
# A decimal number as a flag takes it: ASCII digits, an optional fraction and exponent. Python's float() also
# reads "0_1", "inf", "nan" and non-ASCII digits; the integer flags refuse those, so the number flags do too.
_NUMBER = re.compile(r"\s*[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*", re.ASCII)
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# The widest integer any input takes is 2^40 (13 digits); past this many digits a number is refused as it is
# read, before Python's 4,300-digit conversion limit or a range check has to print it.
MAX_DIGITS = 30


def si(value: float | None, unit: str, digits: int = 4) -> str:
    """``si(939524096, "B") == "939.5 MB"``; four significant digits by default."""
    if value is None:
        return "n/a"
    if value == 0 or not math.isfinite(value):
        return f"{value:g} {unit}"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{_sig(value / scale, digits)} {prefix}{unit}"
    return f"{_sig(value, digits)} {unit}"


def seconds(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{_sig(value / scale, digits)} {unit}"
    return f"{_sig(value / 1e-9, digits)} ns"


def percent(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{_sig(100 * value, digits)} %"


def short_percent(ratio: float) -> str:
    """A ratio as a percent in at most four characters of digits: ``0.0042`` -> ``0.42%``, ``1.5`` -> ``150%``."""
    if ratio == 0:
        return "0"
    value = 100 * ratio
    return f"{value:.2f}%" if value < 1 else f"{value:.1f}%" if value < 100 else f"{value:,.0f}%"


def count(value: float | None) -> str:
    """Thousands separators; one decimal when not whole (26.5)."""
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    if abs(value - round(value)) < 1e-9:
        return f"{round(value):,}"
    return f"{value:,.1f}"


def tokens_label(tokens: int) -> str:
    """Sequence lengths as people say them: 262144 -> 256k, 1048576 -> 1M (binary multiples)."""
    for scale, suffix in ((1 << 20, "M"), (1 << 10, "k")):
        if tokens % scale == 0:
            return f"{tokens // scale}{suffix}"
    return f"{tokens:,}"


# Past this a figure is printed with an exponent: no plan's figure is that large, but a profile or flag at the
# edge of what it accepts can make one, and its 22+ digits would say nothing a reader could take in.
EXPONENT_FROM = 1e21


def _sig(x: float, digits: int) -> str:
    """``digits`` significant digits, halves rounded up as [A-RingCost] rounds (56.25 -> 56.3); no exponent
    below :data:`EXPONENT_FROM`."""
    if x == 0:
        return "0"
    if not math.isfinite(x) or abs(x) >= EXPONENT_FROM:
        return f"{x:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    rounded = Decimal(repr(x)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return f"{rounded:,.{decimals}f}"


def parse_tokens(text: str | int, field: str = "seq") -> int:
    """``262144``, ``256k`` or ``1M`` (binary multiples, as sequence lengths are) to an exact int.

    ASCII digits only, computed in decimal so that no length is rounded through a float."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _TOKENS.fullmatch(str(text)) if isinstance(text, str) else None
    if not match:
        raise InputError(field, f"{_shown(text)} is not a length; accepted: {TOKENS_HELP}")
    _check_digits(match.group(1), field)
    try:
        number = Decimal(match.group(1)) * _SUFFIX[match.group(2).lower()]
    except InvalidOperation:  # pragma: no cover - the pattern admits only plain decimals
        raise InputError(field, f"{text!r} is not a length; accepted: {TOKENS_HELP}") from None
    if number != number.to_integral_value():
        raise InputError(field, f"{text!r} is not a whole number of tokens")
    return int(number)


_BUDGET = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", re.ASCII)
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
BUDGET_HELP = "a whole number of tokens, optionally with K, M, B or T (decimal: 1T = 10^12), e.g. 2T or 300B"


def parse_budget(text: str | int, field: str) -> int:
    """A token budget as people state one: ``2T``, ``300B``, ``15000000000`` (decimal multiples, unlike a
    sequence's length), exactly."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = _BUDGET.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise InputError(field, f"{_shown(text)} is not a token count; accepted: {BUDGET_HELP}")
    _check_digits(match.group(1), field)
    number = Decimal(match.group(1)) * _DECIMAL[match.group(2).lower()]
    if number != number.to_integral_value() or number < 1:
        raise InputError(field, f"{_shown(text)} is not a whole, positive number of tokens")
    return int(number)


HOUR = 3600.0  # seconds
DAY = 86_400.0

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([hdwHDW]?)\s*", re.ASCII)
_DAYS_IN = {"h": 1 / 24, "d": 1.0, "w": 7.0, "": 1.0}
DURATION_HELP = "a number of days, or of hours or weeks with h or w, e.g. 30, 30d, 720h or 4w"


def parse_days(text: str | float, field: str) -> float:
    """A wall-clock time as people state a deadline (``30d``, ``720h``, ``4w``, ``30`` days), in days."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise InputError(field, f"{_shown(text)} is not a duration; accepted: {DURATION_HELP}")
    _check_digits(match.group(1), field)
    return float(match.group(1)) * _DAYS_IN[match.group(2).lower()]


def parse_integer(text: str | int, field: str) -> int:
    """A plain count: ASCII digits, exactly."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if not isinstance(text, str) or not _INTEGER.fullmatch(text):
        negative = isinstance(text, str) and text.strip().startswith("-") and text.strip()[1:].isdigit()
        raise InputError(
            field, f"{_shown(text)} is not a whole number{': counts are never negative' if negative else ''}"
        )
    _check_digits(text.strip(), field)
    return int(text)


def _check_digits(digits: str, field: str) -> None:
    """Every integer flag is read by :func:`parse_integer` or :func:`parse_tokens`, and both refuse here a
    number too long to be any accepted value."""
    whole = digits.split(".")[0].lstrip("0")
    if len(whole) > MAX_DIGITS:
        raise InputError(
            field, f"{_shown(digits)} has {len(whole):,} digits; accepted: at most {MAX_DIGITS} digits"
        )


def _shown(text: object) -> str:
    """The input as the message quotes it: its first 20 characters (a flag's value may be megabytes)."""
    if not isinstance(text, str):
        return repr(text)
    return repr(text[:20] + "...") if len(text) > 20 else repr(text)


NOT_DECIMAL = "is not a number; write it in decimal, e.g. 0.5 or 1e-3"


def is_decimal(text: str) -> bool:
    """Whether ``text`` is a number as a flag or a file writes one: ASCII digits, an optional fraction and
    exponent (not ``0_1``, ``inf``, ``nan`` or other scripts' digits)."""
    return _NUMBER.fullmatch(text) is not None


def parse_number(text: str | float, field: str) -> float:
    """A finite decimal number, as :func:`parse_integer` reads a count: ASCII digits, written out."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    if not isinstance(text, str) or not is_decimal(text):
        raise InputError(field, f"{text!r} {NOT_DECIMAL}")
    value = float(text)
    if not math.isfinite(value):
        raise InputError(field, f"{text!r} is too large")
    return value
