"""Human-readable numbers: decimal SI prefixes (GB = 1e9 B), as datasheets write them."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


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


def _sig(x: float, digits: int) -> str:
    """``digits`` significant digits, no exponent, halves rounded up as [A-RingCost] rounds (56.25 -> 56.3)."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    rounded = Decimal(repr(x)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return f"{rounded:,.{decimals}f}"
