"""The elementwise functions the generated numeric twins (:mod:`costmodel.symbolic.numeric`) call.

Given an array (or a numpy scalar) each is numpy's own function. Given Python numbers (int, float, bool)
each gives numpy's answer from math and builtins without importing numpy, which costs a plan command
~50 ms of its start-up: the same IEEE value, NaN propagated the same way, the same sign of a tied zero,
mixed int and float compared as floats, a float for a float. What differs is the type: a Python number
where numpy gave its own scalar (or a 0-d array, from ``select``), so a Python int never wraps round as
int64 would, and a later division by zero raises ZeroDivisionError where numpy's scalar gave inf or NaN
(the one twin that divides so, ``dynamic_cp_recv_share`` at N = 1, is never asked there). One departs from
numpy on purpose: :func:`ceil` takes a value within a few ulps of an integer for that integer.
tests/test_formulas.py checks each function against numpy at the edges and every twin on both.
"""

from __future__ import annotations

import math
from typing import Any

nan = math.nan
_NUMBERS = (int, float, bool)  # exact types: numpy's scalars and arrays go to numpy


def _numbers(*values: Any) -> bool:
    return all(type(v) in _NUMBERS for v in values)


def _pair(a: Any, b: Any) -> tuple[Any, Any]:
    """Both operands as numpy would promote them: floats if either is one, bools if both are."""
    if type(a) is float or type(b) is float:
        return float(a), float(b)
    if type(a) is bool and type(b) is bool:
        return a, b
    return int(a), int(b)


def maximum(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.maximum(a, b)
    a, b = _pair(a, b)
    return a if a > b or a != a else b  # numpy's scalar loop: NaN wins, a tie gives b (max(0., -0.) is -0.)


def minimum(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.minimum(a, b)
    a, b = _pair(a, b)
    return a if a < b or a != a else b


def equal(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.equal(a, b)
    a, b = _pair(a, b)
    return a == b


def not_equal(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.not_equal(a, b)
    a, b = _pair(a, b)
    return a != b


def less(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.less(a, b)
    a, b = _pair(a, b)
    return a < b


def less_equal(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.less_equal(a, b)
    a, b = _pair(a, b)
    return a <= b


def greater(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.greater(a, b)
    a, b = _pair(a, b)
    return a > b


def greater_equal(a: Any, b: Any) -> Any:
    if not _numbers(a, b):
        import numpy

        return numpy.greater_equal(a, b)
    a, b = _pair(a, b)
    return a >= b


def select(condlist: list[Any], choicelist: list[Any], default: Any = 0) -> Any:
    """The first choice whose condition holds, else ``default``. sympy prints a Piecewise with a NaN
    default, and numpy's result type is then float whatever the choices: so is this one's."""
    if not _numbers(*condlist, *choicelist, default):
        import numpy

        return numpy.select(condlist, choicelist, default=default)
    as_float = any(type(v) is float for v in (*choicelist, default))
    for condition, choice in zip(condlist, choicelist):
        if condition:
            return float(choice) if as_float else choice
    return float(default) if as_float else default


def sqrt(x: Any) -> Any:
    if type(x) not in _NUMBERS:
        import numpy

        return numpy.sqrt(x)
    x = float(x)
    return math.sqrt(x) if x >= 0 or x != x else nan  # numpy: NaN below zero (and a warning), -0. is -0.


# The formulas' ceilings are of ratios of counts (a document's tokens x N / S): a value within a few ulps of an
# integer is that integer, which the twin's reordered products and quotients (common subexpressions shared)
# missed by their rounding; numpy.ceil would round it up a whole unit.
_ULPS = 4


def ceil(x: Any) -> Any:
    if type(x) not in _NUMBERS:
        import numpy

        near = numpy.round(x)
        return numpy.where(numpy.abs(x - near) <= _ULPS * numpy.spacing(near), near, numpy.ceil(x))[()]
    if type(x) is not float:  # numpy 2 keeps an integer an integer (1.x gave a float); twins divide first
        return x
    if not math.isfinite(x):  # math.ceil refuses inf and NaN
        return x
    near = float(round(x))
    up = near if abs(x - near) <= _ULPS * math.ulp(near) else float(math.ceil(x))  # an int from math
    return math.copysign(up, x) if up == 0 else up  # numpy: ceil(-0.5) is -0.
