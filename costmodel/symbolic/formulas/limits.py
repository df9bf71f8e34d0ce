"""Formulas of the group 'limits': Critical shard length and the largest CP degree ([A-SPDeep], [A-RingCost §4], [A-SPDeep])."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.registry import _RESOLVE, _positive_root, definer
from costmodel.symbolic.formulas.time import t_comm, t_comp
from costmodel.symbolic.symbols import N, S, r

GROUP = "limits"
define = definer(GROUP)

# Solve r * t_step(L) = tau_step(L) for the shard length L; with alpha = 0 it is linear.
_ell = sympy.Symbol("ell", positive=True)


def _shard_at_ratio(compute: sympy.Symbol, comm: sympy.Symbol) -> sympy.Expr:
    """Shard length L at which r x compute(L) = comm(L), with S = L·N substituted."""
    at = {S: _ell * N}
    return _positive_root(r * _RESOLVE[compute].xreplace(at) - _RESOLVE[comm].xreplace(at), _ell)


L_r = define(
    "shard_tokens_at_ratio",
    "L_r",
    _shard_at_ratio(t_comp, t_comm),
    "shard length at which step comm = r x step compute",
    "tokens",
    "[A-SPDeep]",
)
define(
    "critical_shard_tokens",
    "L_star",
    L_r,
    "shard length L* where step comm = step compute: longer shards hide the link",
    "tokens",
    "[A-SPDeep]",
    at={r: 1},
)
define(
    "n_at_ratio",
    "N_at_r",
    S / L_r,
    "CP degree at which the step comm ratio reaches r",
    "devices",
    "[A-RingCost §4], [A-RingCost §11]",
)
define(
    "n_max",
    "N_max",
    S / L_r,
    "largest CP degree with step comm <= step compute ((h/n_kv)·S/beta at p = 2)",
    "devices",
    "[A-RingCost §4]",
    at={r: 1},
)
