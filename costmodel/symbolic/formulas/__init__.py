"""Every formula of the cost model, defined once as a sympy expression ([A-RingCost]–§4).

This module is the single source of truth. The numbers the CLI prints come from
:mod:`costmodel.symbolic.numeric`, which ``python -m costmodel.codegen`` generates from the expressions
below (a test fails when it is stale); ``cp-plan formulas`` and the docs print them.

In a notebook::

    >>> from costmodel.symbolic import formulas as f
    >>> f.intensity_step.expr
    2*S*c*h/(N*n_kv*p)
    >>> f.intensity_step.evaluate(S=262144, N=8, h=32, n_kv=8, p=2, c=1)
    131072
    >>> f.critical_shard_tokens.subs(alpha=0)
    F*n_kv*p/(2*B*c*h)

Each quantity is written the way its source writes it (``definition``, in terms of other
quantities) and also resolved down to the base symbols of :mod:`costmodel.symbolic.symbols` (``expr``,
built on first use from the generated :mod:`costmodel.symbolic.resolved`, so the import takes about a
second); ``subs`` takes base symbols by their names in code.
With p = 2 (bf16) the shorter forms of [A-RingCost §4] reappear: I_step = (h/n_kv)·S/N.
"""

from __future__ import annotations

# Imported in this order, each module after those whose formulas it is written in: FORMULAS, the
# numeric module and the docs list the formulas in it.
# isort: off
import costmodel.symbolic.formulas.memory  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.compute  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.ring  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.machine  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.time  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.limits  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.ulysses  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.usp  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.tp  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.causal  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.backward  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.fit  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.step  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.offload  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.inference  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.topology  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.moe  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.step_terms  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.calibration  # noqa: F401 - it registers its formulas
import costmodel.symbolic.formulas.packing  # noqa: F401 - it registers its formulas

# isort: on
from costmodel.symbolic.formulas.registry import COMPUTED, FORMULAS, USED, Formula, define
from costmodel.symbolic.formulas.step_terms import STEP_FIELDS, STEP_TERMS

__all__ = ["COMPUTED", "FORMULAS", "GROUPS", "STEP_FIELDS", "STEP_TERMS", "USED", "Formula", "define"]

GROUPS: tuple[str, ...] = tuple(dict.fromkeys(f.group for f in FORMULAS.values()))


def __getattr__(name: str) -> Formula:
    """``formulas.intensity_step`` is the Formula of that name."""
    try:
        return FORMULAS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
