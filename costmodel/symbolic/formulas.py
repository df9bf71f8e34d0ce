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

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
from sympy.functions.elementary.piecewise import ExprCondPair

from costmodel.symbolic.symbols import (
    SYMBOLS,
    B,
    B_bis,
    B_cp,
    B_dp,
    B_ep,
    B_h,
    B_hbm,
    B_l,
    B_nic,
    B_pp,
    B_tp,
    B_x,
    C_f,
    D,
    D_g,
    E_m,
    E_p,
    E_w,
    F,
    F_attn,
    F_attn_bwd,
    F_e,
    F_ffn,
    F_gemm,
    F_gemm_b,
    F_head,
    F_peak,
    F_sh,
    H,
    K_c,
    L_t,
    M_dev,
    N,
    N_r,
    N_u,
    P_g,
    R_h,
    S,
    S_kv,
    T_n,
    T_w,
    V,
    X_k,
    a_dp,
    a_tp,
    alpha,
    alpha_cp,
    alpha_tp,
    b,
    c,
    d,
    delta,
    e_m,
    eta,
    f8,
    g,
    g_pg,
    h,
    k_copy,
    k_E,
    k_n,
    k_opt,
    k_sb,
    k_sf,
    k_tp,
    l_h,
    l_max,
    l_rest,
    l_w,
    m_mb,
    n_bkt,
    n_E,
    n_first,
    n_h,
    n_kb,
    n_kf,
    n_kl,
    n_kv,
    n_L,
    n_l,
    n_last,
    n_mid,
    n_nic,
    o_act,
    o_cp,
    o_dp,
    o_opt,
    o_par,
    o_pp,
    o_tp,
    o_x,
    p,
    p_acc,
    p_g,
    p_kv,
    p_s,
    p_w,
    phi,
    pp,
    r,
    rc_full,
    rc_sel,
    rho,
    s_blk,
    s_comm,
    sigma,
    t,
    t_dev,
    t_fw,
    t_host,
    t_k,
    t_launch,
    t_lay,
    t_lf,
    t_opt_all,
    tau_Z3_all,
    u_cp,
    v_pp,
    w_t,
    x_att,
    x_CP_b,
    x_CP_f,
    x_CP_r,
    x_DP_all,
    x_DPo_all,
    z3,
    z_g,
    z_o,
    z_w,
)


@dataclass(frozen=True)
class Formula:
    """One quantity of the model."""

    name: str  # Python identifier; equals the JSON key where the report has one
    symbol: sympy.Symbol  # left-hand side, used when other formulas refer to this one
    definition: sympy.Expr  # as the source writes it, may use other formulas' symbols
    meaning: str
    unit: str
    source: str
    group: str
    binds: str | None = None  # the base symbol this formula's value is bound to, where later formulas read it

    @property
    def expr(self) -> sympy.Expr:
        """Resolved to base symbols only; built on first use (importing the module stays fast)."""
        return _RESOLVE[self.symbol]

    @property
    def latex(self) -> str:
        """``lhs = definition = expr`` in LaTeX (the middle part only where it differs)."""
        parts = [sympy.latex(self.symbol)]
        if self.definition != self.expr:
            parts.append(sympy.latex(self.definition))
        parts.append(sympy.latex(self.expr))
        return " = ".join(parts)

    @property
    def args(self) -> tuple[str, ...]:
        """Names of the base symbols the resolved expression depends on, in a stable order."""
        return tuple(sorted(s.name for s in self.expr.free_symbols))

    def subs(self, *args: Any, **values: Any) -> sympy.Expr:
        """The resolved expression with base symbols replaced, named as in code: ``subs(alpha=0)``;
        positional arguments go to sympy's ``Expr.subs`` as they are."""
        unknown = set(values) - set(SYMBOLS)
        if unknown:
            raise TypeError(f"{self.name}: no symbol named {', '.join(sorted(unknown))}")
        expr = self.expr.subs(*args) if args else self.expr
        return expr.subs({SYMBOLS[k].symbol: sympy.sympify(v) for k, v in values.items()})

    def evaluate(self, **values: Any) -> Any:
        """Substitute numbers exactly (sympy arithmetic); for speed use :mod:`costmodel.symbolic.numeric`."""
        missing = set(self.args) - set(values)
        if missing:
            raise TypeError(f"{self.name} needs {', '.join(sorted(missing))}")
        subs = {sym: sympy.Rational(values[sym.name]) for sym in self.expr.free_symbols}  # exact binary value
        value = self.expr.xreplace(subs)
        return int(value) if value.is_Integer else float(value)

    def __str__(self) -> str:
        return f"{self.symbol} = {self.expr}"


class _Resolver(Mapping):
    """Formula symbol -> its expression in base symbols, resolved and simplified on first lookup.

    Simplifying every formula takes about a minute, so nothing is built at import; the simplified forms
    come from :mod:`costmodel.symbolic.resolved` (generated by ``python -m costmodel.codegen``), keyed by
    the exact expression simplified, so a stale or missing entry is computed, never wrong."""

    def __init__(self) -> None:
        self._pending: dict[sympy.Symbol, tuple[sympy.Expr, dict[sympy.Symbol, Any] | None, bool]] = {}
        self._done: dict[sympy.Symbol, sympy.Expr] = {}

    def add(
        self, symbol: sympy.Symbol, definition: sympy.Expr, at: dict[sympy.Symbol, Any] | None, simplify: bool
    ) -> None:
        self._pending[symbol] = (definition, at, simplify)

    def __getitem__(self, symbol: sympy.Symbol) -> sympy.Expr:
        if symbol not in self._done:
            definition, at, simplify = self._pending[symbol]
            resolved = definition.xreplace(self).doit().xreplace(at or {})
            self._done[symbol] = _memo("simplify", resolved) if simplify else resolved
        return self._done[symbol]

    def __contains__(self, symbol: object) -> bool:
        return symbol in self._pending

    def __iter__(self) -> Iterator[sympy.Symbol]:
        return iter(self._pending)

    def __len__(self) -> int:
        return len(self._pending)


_NAMESPACE: dict[str, Any] = {}
USED: dict[str, str] = {}  # every cache entry looked up or computed in this process: what codegen writes
COMPUTED: list[str] = []  # entries the cache lacked (stale until python -m costmodel.codegen)


def _memo(operation: str, expr: sympy.Expr, *extra: sympy.Basic) -> sympy.Expr:
    """``sympy.simplify(expr)``, or ``_positive_root(expr, *extra)``, read from the generated cache when
    it holds this exact input (srepr is exact: symbols with their assumptions)."""
    from costmodel.symbolic import resolved

    key = hashlib.sha256(f"{operation}:{sympy.srepr(expr)}:{sympy.srepr(extra)}".encode()).hexdigest()[:32]
    text = resolved.CACHE.get(key)
    if text is not None:
        if not _NAMESPACE:
            _NAMESPACE.update(vars(sympy), ExprCondPair=ExprCondPair)
        result = eval(text, _NAMESPACE)  # noqa: S307 - our own generated file, sympy's srepr
    else:
        result = sympy.simplify(expr) if operation == "simplify" else _solve_positive(expr, *extra)
        text = sympy.srepr(result)
        COMPUTED.append(key)
    USED[key] = text
    return result


FORMULAS: dict[str, Formula] = {}
_RESOLVE = _Resolver()
_group = "memory"


def define(
    name: str,
    symbol: str,
    definition: sympy.Expr,
    meaning: str,
    unit: str,
    source: str,
    at: dict[sympy.Symbol, Any] | None = None,
    binds: sympy.Symbol | None = None,
    simplify: bool = True,
) -> sympy.Symbol:
    """Register a quantity and return its symbol, so later definitions can be written in its terms.

    ``at`` fixes base symbols after resolution (``critical_shard_tokens`` is ``L_r`` at r = 1). The
    resolved expression is built when first asked for (:attr:`Formula.expr`). ``binds`` names a base symbol
    that stands for this formula's value in later formulas (``t_lay``, the layer time the pipeline formulas
    read), so that their resolved forms stay small: an :class:`~costmodel.plans.bind.Evaluator` evaluates
    this formula wherever one of them needs that symbol and it is not bound. A sum of other formulas can
    stay a sum of their resolved forms (``simplify=False``): one fraction over a common denominator would be
    long to build, long to read and less exact.
    """
    if name in FORMULAS:
        raise ValueError(f"formula {name!r} defined twice")
    lhs = sympy.Symbol(symbol, positive=True)
    if lhs in _RESOLVE:
        raise ValueError(f"symbol {symbol!r} used by two formulas")
    written = sympy.sympify(definition)
    _RESOLVE.add(lhs, written, at, simplify)
    FORMULAS[name] = Formula(name, lhs, written, meaning, unit, source, _group, binds.name if binds else None)
    return lhs


def _positive_root(equation: sympy.Expr, var: sympy.Symbol) -> sympy.Expr:
    """The root of ``equation = 0`` in ``var`` that is positive for positive inputs."""
    return _memo("positive_root", equation, var)


def _solve_positive(equation: sympy.Expr, var: sympy.Symbol) -> sympy.Expr:
    roots = sympy.solve(equation, var)
    sample = {
        s: sympy.Rational(3, 2) + i for i, s in enumerate(sorted(equation.free_symbols - {var}, key=str))
    }
    positive = [root for root in roots if root.xreplace(sample) > 0]
    if len(positive) != 1:
        raise ValueError(f"expected one positive root of {equation} in {var}, got {roots}")
    return positive[0]


# --- Memory tiers ([A-RingCost §1]): temporaries at three granularities, then the ring's buffers. -----
_group = "memory"
L = define("shard_tokens", "L", S / N, "shard length per device", "tokens", "[A-RingCost §2]")
define(
    "scores_full_bytes",
    "M_scores",
    b * h * S**2 * p,
    "full score matrix, queries x all keys",
    "B",
    "[A-RingCost §1]",
)
define(
    "scores_query_block_bytes",
    "M_blk",
    b * h * s_blk * S * p,
    "score slice of one query block x all keys",
    "B",
    "[A-RingCost §1]",
)
define(
    "scores_tile_bytes",
    "M_tile",
    b * h * s_blk**2 * p,
    "score tile of one query block x one key block (the ring's steady-state window)",
    "B",
    "[A-RingCost §1]",
)
C_step = define(
    "kv_block_bytes",
    "C_step",
    b * L * 2 * n_kv * d * p,
    "K and V of one shard: the block in flight each ring step",
    "B",
    "[A-RingCost §1, §4.1]",
)
define(
    "kv_tile_bytes",
    "C_tile",
    b * s_blk * 2 * n_kv * d * p,
    "K and V of one compute tile",
    "B",
    "[A-RingCost §1]",
)
define(
    "softmax_state_bytes",
    "M_softmax",
    b * h * L * (d + 2) * p_acc,
    "online-softmax state (m, l, O) of one shard's queries, fp32",
    "B",
    "[A-RingCost §1, §3.1]",
)

# --- Compute ([A-RingCost §2] invariant one, §4). c = 1/2 for causal: useful FLOP halve. ------------
_group = "compute"
W_pair = define(
    "pair_flops",
    "W_pair",
    4 * b * h * d,
    "FLOP per (query, key) pair over all heads: QK^T and PV, 2 FLOP per multiply-add",
    "FLOP",
    "[A-RingCost §2]",
)
define(
    "total_flops",
    "F_total",
    c * S**2 * W_pair,
    "attention FLOP of one layer, all devices",
    "FLOP",
    "[A-RingCost §2]",
)
W = define(
    "device_flops_per_layer", "W", c * L * S * W_pair, "FLOP per device per layer", "FLOP", "[A-RingCost §4]"
)
W_step = define(
    "step_flops",
    "W_step",
    c * L**2 * W_pair,
    "FLOP per device per ring step (one shard of queries x one KV block)",
    "FLOP",
    "[A-RingCost §4, §4.1]",
)

# --- Ring traffic and intensity ([A-RingCost §2] invariant two, §4). --------------------------------
_group = "ring"
C_recv = define(
    "recv_bytes_per_layer",
    "C_recv",
    (N - 1) * C_step,
    "bytes one device receives per layer (N-1 blocks; its own it keeps)",
    "B",
    "[A-RingCost §2]",
)
define(
    "send_bytes_per_layer",
    "C_send",
    N * C_step,
    "bytes one device sends per layer counting its own block",
    "B",
    "[A-RingCost §4.1]",
)
define("intensity_layer", "I", W / C_recv, "layer arithmetic intensity", "FLOP/B", "[A-RingCost §4]")
define(
    "intensity_step",
    "I_step",
    W_step / C_step,
    "step arithmetic intensity: the quantity to compare with beta",
    "FLOP/B",
    "[A-RingCost §4]",
)

# --- Machine ([A-RingCost §4, §8] step 2; [A-SPDeep]–4.3). -------------------------------------------
_group = "machine"
define(
    "effective_flops", "F_eff", eta * F_peak, "FLOP/s at the given efficiency", "FLOP/s", "[A-RingCost §8]"
)
define("beta", "beta", F / B, "machine FLOP per byte of one link direction", "FLOP/B", "[A-RingCost §4]")

# --- Times and ratios ([A-RingCost §4.1, §11]; alpha from [A-SPDeep]). ------------------------------
_group = "time"
t_comp = define(
    "step_compute_s", "t_step", W_step / F, "compute time of one ring step", "s", "[A-RingCost §4.1]"
)
t_comm = define(
    "step_comm_s",
    "tau_step",
    alpha + C_step / B,
    "receive time of one KV block",
    "s",
    "[A-RingCost §4.1], [A-SPDeep]",
)
t_layer = define(
    "layer_compute_s", "t_layer", W / F, "compute time of one layer on one device", "s", "[A-RingCost §4]"
)
tau_layer = define(
    "layer_comm_s",
    "tau_layer",
    (N - 1) * t_comm,
    "receive time of one layer (N-1 blocks)",
    "s",
    "[A-RingCost §4]",
)
define(
    "layer_send_s",
    "tau_send",
    N * t_comm,
    "send time of one layer counting the own block",
    "s",
    "[A-RingCost §4.1]",
)
define(
    "comm_ratio_step",
    "rho_step",
    t_comm / t_comp,
    "step receive time / step compute time: the verdict's ratio (no overlap credit)",
    "1",
    "[A-RingCost §11]",
)
define(
    "comm_ratio_layer",
    "rho_layer",
    tau_layer / t_layer,
    "layer receive time / layer compute time",
    "1",
    "[A-RingCost §4]",
)

# --- Critical shard length and the largest CP degree ([A-SPDeep], [A-RingCost §4], [A-SPDeep]). --------
# Solve r * t_step(L) = tau_step(L) for the shard length L; with alpha = 0 it is linear.
_group = "limits"
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

# --- Ulysses ([A-RingCost §4.2, §7]; [Ulysses §3]). KV heads are replicated up to N when N > n_kv. -----
_group = "ulysses"
n_kv_u = define(
    "ulysses_kv_heads",
    "n_kv_U",
    sympy.Max(n_kv, N),
    "KV heads after replication to the all-to-all degree",
    "heads",
    "[Ulysses §3]",
)
C_u = define(
    "ulysses_recv_bytes_per_layer",
    "C_U",
    (N - 1) / N * b * L * (2 * h + 2 * n_kv_u) * d * p,
    "all-to-all receive bytes per device per layer: Q, K, V in and O out",
    "B",
    "[A-RingCost §4.2]",
)
# Four all_to_all calls (Q, K, V in, O out), as DeepSpeed-Ulysses and the reference kernel make them.
tau_u = define(
    "ulysses_comm_s",
    "tau_U",
    4 * alpha + C_u / B,
    "time of the all-to-alls: Q, K, V in and O out",
    "s",
    "[A-RingCost §7], [A-SPDeep]",
)
define(
    "ulysses_comm_ratio",
    "rho_U",
    tau_u / t_layer,
    "all-to-all time / layer compute time (the all-to-alls do not overlap attention)",
    "1",
    "[A-RingCost §7]",
)

# --- USP: N = N_u x N_r, all-to-all inside, ring across ([USP §3]). ---------------------------
_group = "usp"
n_kv_usp = define(
    "usp_kv_heads",
    "n_kv_USP",
    sympy.Max(n_kv, N_u),
    "KV heads after replication to the all-to-all degree N_u",
    "heads",
    "[USP §3]",
)
C_ua = define(
    "usp_a2a_recv_bytes_per_layer",
    "C_USP_a2a",
    (N_u - 1) / N_u * b * S / (N_u * N_r) * (2 * h + 2 * n_kv_usp) * d * p,
    "all-to-all part of the USP receive bytes",
    "B",
    "[USP §3]",
)
C_ur_step = define(
    "usp_ring_step_recv_bytes",
    "C_USP_step",
    b * S / N_r * 2 * (n_kv_usp / N_u) * d * p,
    "KV block of one USP ring step",
    "B",
    "[USP §3]",
)
C_ur = define(
    "usp_ring_recv_bytes_per_layer",
    "C_USP_ring",
    (N_r - 1) * C_ur_step,
    "ring part of the USP receive bytes",
    "B",
    "[USP §3]",
)
define(
    "usp_recv_bytes_per_layer",
    "C_USP",
    C_ua + C_ur,
    "USP receive bytes per device per layer",
    "B",
    "[USP §3]",
)
W_ur = define(
    "usp_ring_step_flops",
    "W_USP_step",
    c * (S / N_r) ** 2 * W_pair / N_u,
    "FLOP per device per USP ring step (h/N_u heads)",
    "FLOP",
    "[USP §3]",
)
define(
    "usp_a2a_comm_s",
    "tau_USP_a2a",
    4 * alpha + C_ua / B,
    "time of the USP all-to-alls (Q, K, V, O)",
    "s",
    "[USP §3]",
)
define(
    "usp_ring_comm_ratio_step",
    "rho_USP_step",
    (alpha + C_ur_step / B) / (W_ur / F),
    "USP ring step receive time / step compute time",
    "1",
    "[USP §3]",
)

# --- Tensor parallel comparison ([A-RingCost §13]). ------------------------------------------------
_group = "tp"
C_tp = define(
    "tp_bytes_per_layer",
    "C_TP",
    4 * b * S * h * d * p,
    "TP activation traffic per layer (two all-reduces of b·S·h·d)",
    "B",
    "[A-RingCost §13]",
)
define(
    "tp_to_ring_ratio",
    "C_TP_over_C_recv",
    C_tp / C_recv,
    "TP bytes / ring receive bytes",
    "1",
    "[A-RingCost §13]",
)

# --- Causal load balance, block-granular ([A-RingCost §6]). The tile simulator is costmodel.schedule.simulator. --
_group = "causal"
define(
    "utilization_coarse",
    "u_coarse",
    (N + 1) / (2 * N),
    "contiguous causal utilisation, diagonal block counted whole",
    "1",
    "[A-RingCost §6]",
)
define(
    "utilization_fine",
    "u_fine",
    N / (2 * N - 1),
    "contiguous causal utilisation, diagonal block counted as half",
    "1",
    "[A-RingCost §6]",
)

# --- Backward pass of ring attention ([Korthikanti22]). -------------------------------------------------
# FlashAttention-2 counts the backward as 2.5x the forward FLOP: five matmuls against two, the
# recomputation of QK^T included. K and V travel the ring again, now with their dK/dV
# accumulators in fp32 (p_acc bytes): N-1 KV hops and N dK/dV hops (the last one brings them home).
_group = "backward"
W_bwd = define(
    "bwd_step_flops",
    "W_bwd_step",
    sympy.Rational(5, 2) * W_step,
    "FLOP per device per backward ring step",
    "FLOP",
    "[FA2 §4]",
)
C_bwd = define(
    "bwd_step_recv_bytes",
    "C_bwd_step",
    b * L * 2 * n_kv * d * (p + p_acc),
    "KV block and its fp32 dK/dV accumulator, received each backward step",
    "B",
    "[RingAttn §3]",
)
C_bwd_recv = define(
    "bwd_recv_bytes_per_layer",
    "C_bwd_recv",
    (N - 1) * C_step + N * b * L * 2 * n_kv * d * p_acc,
    "backward receive bytes per device per layer: N-1 KV blocks and N dK/dV blocks",
    "B",
    "[RingAttn §3], [FA2 §4]",
)
define(
    "bwd_intensity_step",
    "I_bwd_step",
    W_bwd / C_bwd,
    "backward step arithmetic intensity",
    "FLOP/B",
    "[RingAttn §3], [FA2 §4]",
)
t_bwd = define(
    "bwd_step_compute_s",
    "t_bwd_step",
    W_bwd / F,
    "compute time of one backward step",
    "s",
    "[RingAttn §3], [FA2 §4]",
)
tau_bwd = define(
    "bwd_step_comm_s",
    "tau_bwd_step",
    alpha + C_bwd / B,
    "receive time of one backward step",
    "s",
    "[RingAttn §3], [FA2 §4]",
)
define(
    "bwd_layer_compute_s",
    "t_bwd_layer",
    N * t_bwd,
    "backward compute time of one layer on one device",
    "s",
    "[RingAttn §3], [FA2 §4]",
)
define(
    "bwd_layer_comm_s",
    "tau_bwd_layer",
    (2 * N - 1) * alpha + C_bwd_recv / B,
    "backward receive time of one layer: N-1 KV blocks and N dK/dV blocks",
    "s",
    "[RingAttn §3]",
)
define(
    "bwd_comm_ratio_step",
    "rho_bwd_step",
    tau_bwd / t_bwd,
    "backward step receive time / step compute time",
    "1",
    "[RingAttn §3], [FA2 §4]",
)
L_bwd_r = define(
    "bwd_shard_tokens_at_ratio",
    "L_bwd_r",
    _shard_at_ratio(t_bwd, tau_bwd),
    "shard length at which backward step comm = r x its compute",
    "tokens",
    "[RingAttn §3], [FA2 §4]",
)
define(
    "bwd_critical_shard_tokens",
    "L_bwd_star",
    L_bwd_r,
    "backward L*: step comm = step compute",
    "tokens",
    "[RingAttn §3], [FA2 §4]",
    at={r: 1},
)
define(
    "bwd_n_at_ratio",
    "N_bwd_at_r",
    S / L_bwd_r,
    "CP degree at which the backward step ratio reaches r",
    "devices",
    "[RingAttn §3], [FA2 §4]",
)

# --- Memory fit of a training step ([Korthikanti22]). -------------------------------------------------
# Activations per layer follow [Korthikanti22 §4] term by term. Stored per token: the two
# norm inputs, the QKV and MLP inputs and two dropout masks, which TP splits only with sequence
# parallelism; Q, K, V, the attention output and the MLP intermediates, which TP splits; and the
# 5·a·s²·b of attention scores, which flash attention and selective recompute do not keep (phi = 0).
# With MHA, a 4H GeLU MLP and dropout this is the paper's sbh(34 + 5as/h); GQA and a gated MLP
# generalise the same terms. Context parallelism leaves S/N tokens per device.
_group = "fit"
P_layer = define(
    "layer_params",
    "P_layer",
    H * d * (2 * h + 2 * n_kv) + (2 + g) * H * F_ffn + 2 * H,
    "parameters of one layer: Q, K, V, O projections, the MLP (3 matrices when gated), two norms",
    "1",
    "model arithmetic",
)
P = define(
    "params",
    "P",
    n_L * P_layer + e_m * V * H + H,
    "parameters: layers, embeddings (input and, untied, output), final norm",
    "1",
    "model arithmetic",
)
# The first stage holds its layers and the input embedding, the last its layers, the output layer and final
# norm (a copy of the embedding when tied, as Megatron keeps one there), a middle stage its layers only.
P_stage = define(
    "stage_params",
    "P_stage",
    sympy.Piecewise(
        (P, sympy.Eq(pp, 1)),
        (sympy.Max(n_first * P_layer + V * H, n_mid * P_layer, n_last * P_layer + V * H + H), True),
    ),
    "parameters of the pipeline stage holding the most: the whole model at pp = 1, else the largest of the "
    "first (its layers and the input embedding), a middle and the last stage (its layers, the output layer "
    "and the final norm)",
    "1",
    "[Megatron21 §2.2]",
)
# bf16 weights, fp32 grads, fp32 master + 2 Adam moments; offload moves the optimizer's 12 bytes to the host
# (o_opt), and the weights and gradients too (o_par), leaving two layers' gathered ones in flight.
_state_bytes = (1 - o_par) * (2 * z_w + 4 * z_g) + (1 - o_opt) * 12 * z_o
M_state = define(
    "model_state_bytes",
    "M_state",
    P_stage / t * _state_bytes + o_par * 2 * P_layer / t * (2 + 4),
    "bf16 weights, fp32 gradients, fp32 master weights and Adam moments, per device, on the stage "
    "holding the most parameters; what offload keeps in host memory is left out (two layers' weights and "
    "gradients stay in flight under parameter offload)",
    "B",
    "[ZeRO §3], [ZeRO-Offload §4], [ZeRO-Infinity §5]",
)
_split = sigma / t + 1 - sigma  # the share of the sequence-parallel terms a device keeps
A_layer = define(
    "layer_activation_bytes",
    "A_layer",
    b
    * L
    * (
        (8 + 2 * delta) * H * _split
        + (4 * h * d + 4 * n_kv * d + 2 * (2 + g) * F_ffn) / t
        + 5 * phi * h * L / t
    ),
    "activations one layer keeps for its backward, per device",
    "B",
    "[Korthikanti22 §4.1]",
)
A_in = define(
    "layer_input_bytes",
    "A_input",
    b * L * 2 * H * _split,
    "the layer input: all a layer keeps under full recompute",
    "B",
    "[Korthikanti22 §5]",
)
A_out = define(
    "output_activation_bytes",
    "A_output",
    b * L * (2 * H + 4 * V / t),
    "final hidden state and the fp32 softmax of the vocab-parallel cross-entropy",
    "B",
    "[Korthikanti22 §4.2]",
)
A_kept = (1 - rho) * A_layer + rho * A_in  # what one layer keeps for its backward


def _in_flight(rank: sympy.Expr) -> sympy.Expr:
    """Micro-batches' worth of its layers that pipeline stage ``rank`` (0 the first) keeps for backward at
    the peak. 1F1B: the warm-up's pp - rank - 1 forwards and one more, at most m [Megatron21 §2.2].
    Interleaved: 2(pp - rank - 1) + (v - 1)·pp + 1 model chunks of 1/v of its layers, at most the m·v
    there are; on the first stage 1 + (pp - 1)/(pp·v) times the 1F1B figure [Korthikanti22 §4.2]."""
    return sympy.Piecewise(
        (sympy.Min(m_mb, pp - rank), sympy.Eq(v_pp, 1)),
        (sympy.Min(m_mb * v_pp, 2 * (pp - rank - 1) + (v_pp - 1) * pp + 1) / v_pp, True),
    )


I_first = define(
    "first_stage_in_flight",
    "I_1",
    _in_flight(0),
    "micro-batches' worth of its layers the first pipeline stage keeps for backward at the peak: pp under "
    "1F1B, fewer when the step has fewer micro-batches, 1 + (pp - 1)/(pp·v) times more interleaved",
    "1",
    "[Korthikanti22 §4.2]",
)
# The stage that keeps the most: the first (most micro-batches in flight), the second (the first middle
# stage, which may hold more layers) or the last (one micro-batch, and the output layer's logits).
_stage_activations = (
    I_first * n_first * A_kept,
    _in_flight(1) * n_mid * A_kept,
    _in_flight(pp - 1) * n_last * A_kept + A_out,
)
# Activation offload (o_act) keeps about two layers' in flight on the device: the one computing and the one
# whose copy to (forward) or from (backward) the host is under way [ZeRO-Infinity §5].
A = define(
    "activation_bytes",
    "A",
    (1 - o_act)
    * sympy.Piecewise((n_L * A_kept + A_out, sympy.Eq(pp, 1)), (sympy.Max(*_stage_activations), True))
    + o_act * (2 * A_kept + A_out),
    "activations per device on the most loaded pipeline stage: n_L layers' worth and the output "
    "layer at pp = 1; else the largest of the first stage (I_1 micro-batches of its layers), the second "
    "and the last (its layers and the output layer); two layers' and the output layer under activation "
    "offload",
    "B",
    "[Korthikanti22 §4.2], [ZeRO-Infinity §5]",
)
_buffers = (2 * C_bwd + b * h * L * d * p_acc) / t
R_buf = define(
    "ring_buffer_bytes",
    "M_ring",
    sympy.Min(N - 1, 1) * _buffers,
    "ring buffers of the larger pass, backward: two KV + fp32 dK/dV blocks in flight and fp32 dQ, "
    "for a TP rank's heads; none at N = 1",
    "B",
    "[RingAttn §3]",
)
define(
    "training_memory_bytes",
    "M_total",
    M_state + A + R_buf,
    "model states, activations and ring buffers per device on the most loaded stage",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
)
# With flash attention (phi = 0) activations and ring buffers all scale as 1/N once N > 1, so a stage
# fits from N = (its 1/N part at N = 1) / (the memory its states leave free); the most loaded stage sets N.
define(
    "n_min_memory",
    "N_min",
    sympy.Subs(A + _buffers, N, 1) / (M_dev - M_state),
    "smallest CP degree (real-valued) whose training memory fits M_dev, with flash attention; negative "
    "when the model states alone do not fit",
    "devices",
    "[Korthikanti22 §4]",
    at={phi: 0},
)

# --- The whole training step ([Megatron21], [Korthikanti22], [Llama3], [PaLM] appendix B). --------
# One device, one micro-batch of b sequences: CP leaves b·S/N tokens, TP splits every matrix multiply t
# ways and, with sequence parallelism, the elementwise work too. Backward costs 2x the forward for the
# matrix multiplies and 2.5x for attention [FA2 §4]. Every overlap is a named knob (o_*, n_bkt, s_comm).
_group = "step"


def _hidden(comm: sympy.Expr, compute: sympy.Expr, share: sympy.Expr) -> sympy.Expr:
    """Time of ``comm`` left on the critical path when ``share`` of it can hide under ``compute``; what hides
    still slows that compute by s_comm (the SMs a communication kernel takes)."""
    hideable = share * (comm - sympy.Max(comm - compute, 0))  # share x min(comm, compute)
    return comm - hideable + s_comm * hideable


T_mb = define(
    "mb_tokens", "T_mb", b * S / N, "tokens of one micro-batch on one CP rank", "tokens", "[Llama3 §3.3]"
)
W_qkv = define(
    "layer_qkv_flops",
    "W_qkv",
    2 * T_mb * H * (h + 2 * n_kv) * d / t,
    "forward FLOP of the Q, K, V projections (GQA: n_kv heads for K and V), per device",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_out = define(
    "layer_out_proj_flops",
    "W_o",
    2 * T_mb * h * d * H / t,
    "forward FLOP of the output projection",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_mlp = define(
    "layer_mlp_flops",
    "W_mlp",
    2 * (2 + g) * T_mb * H * F_ffn / t,
    "forward FLOP of the MLP: 3 matrices gated (SwiGLU), 2 plain (GeLU)",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_gemm = define(
    "layer_gemm_flops",
    "W_gemm",
    W_qkv + W_out + W_mlp,
    "forward FLOP of a layer's matrix multiplies",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_att = define(
    "layer_attn_flops",
    "W_att",
    W / t,
    "forward FLOP of attention per device: c·S²/N pairs x 4·b·h·d over t (causal c = 1/2)",
    "FLOP",
    "[FA2 §4]",
)
E_lay = define(
    "layer_elementwise_bytes",
    "E_layer",
    T_mb * p * (10 * H / (1 + sigma * (t - 1)) + (2 * (h + n_kv) * d + (2 + g) * F_ffn) / t),
    "forward HBM bytes of the memory-bound work: two norms and two residual adds (10·H), split t ways only "
    "with sequence parallelism (else every TP rank runs them whole), and rotary on Q and K and the MLP "
    "activation ((2+g)·F_ffn) on the rank's heads and columns",
    "B",
    "[Korthikanti22 §4]",
)
K_in = define(
    "layer_gemm_input_width",
    "K_in",
    H + h * d / t + H + F_ffn / t,
    "widths of the four multiplies' inputs on one TP shard (QKV, output projection, MLP in, MLP out)",
    "elements",
    "[Megatron21 §3]",
)
N_out = define(
    "layer_gemm_output_width",
    "N_out",
    (h + 2 * n_kv) * d / t + H + (1 + g) * F_ffn / t + H,
    "widths of the four multiplies' outputs on one TP shard",
    "elements",
    "[Megatron21 §3]",
)
W_el = define(
    "layer_gemm_weight_elements",
    "W_el",
    ((h + 2 * n_kv) * d * H + H * h * d + (1 + g) * F_ffn * H + H * F_ffn) / t,
    "weight elements of the four multiplies on one TP shard",
    "1",
    "[Megatron21 §3]",
)
define(
    "layer_fp8_cast_bytes",
    "E_f8",
    f8
    * (
        T_mb * K_in * (p + 1 + p_s)
        + W_el * (p + 1 + p_s)
        + T_mb * N_out * (p + 1 + p_s)
        + 2 * T_mb * K_in
        + 2 * W_el
    ),
    "HBM bytes one layer's forward and backward move to run its multiplies in FP8: each input cast from p "
    "bytes to one (with its scales), the weights cast once a micro-batch, each output gradient cast, and "
    "transposed FP8 copies of the inputs and weights for the backward's multiplies",
    "B",
    "[FP8-Formats], [MX-Formats]",
)
W_head = define(
    "head_flops",
    "W_head",
    2 * T_mb * H * V / t,
    "forward FLOP of the output layer (vocab-parallel)",
    "FLOP",
    "[Megatron21 §5.1]",
)
E_loss = define(
    "loss_bytes",
    "E_loss",
    3 * T_mb * 4 * V / t,
    "HBM bytes of the fp32 softmax cross-entropy over the logits: three passes",
    "B",
    "[Korthikanti22 §4.2]",
)
tau_tp = define(
    "tp_comm_s",
    "tau_TP",
    4 * (t - 1) / t * T_mb * H * p / B_tp + 4 * (t - 1) * alpha_tp + 2 * (1 + sigma) * a_tp,
    "TP with sequence parallelism, one layer, one pass: two all-gathers and two reduce-scatters of "
    "the layer's activations, t - 1 ring hops each (without it, two all-reduces: the same bytes and hops, "
    "half the calls), and each call's fixed latency",
    "s",
    "[Korthikanti22 §4.2.2]",
)
C_ag = define(
    "cp_allgather_bytes",
    "C_AG",
    (N - 1) / N * b * S * 2 * n_kv * d * p / t,
    "all-gather of K and V over the CP group, per device per layer (the backward reduce-scatters dK, dV "
    "as many bytes)",
    "B",
    "[Llama3 §3.3]",
)
Z_sc = define(
    "layer_score_elements",
    "Z_sc",
    x_att * W_att / (4 * d),
    "score-matrix elements one device's attention computes per layer (an unfused kernel: the whole square)",
    "1",
    "[FA2 §3]",
)
t_att_f = define(
    "layer_attn_fwd_s",
    "t_att_fwd",
    (x_att * W_att / F_attn + k_sf * Z_sc / B_hbm) / u_cp,
    "attention forward of one layer, the slowest CP rank: the kernel's FLOP, and an unfused kernel's passes "
    "over the score matrix (scores, softmax, dropout) through HBM",
    "s",
    "[FA2 §4], [A-RingCost §6]",
)
t_att_b = define(
    "layer_attn_bwd_s",
    "t_att_bwd",
    (sympy.Rational(5, 2) * x_att * W_att / F_attn_bwd + k_sb * Z_sc / B_hbm) / u_cp,
    "attention backward of one layer, the slowest CP rank",
    "s",
    "[FA2 §4]",
)
M_step = define(
    "ring_merge_bytes",
    "M_merge",
    b * L * h * (3 * (d + 1) * p_acc + 2 * k_copy * d * p) / t,
    "HBM bytes per ring step outside the kernel: read two partial (O, LSE) in fp32 and write one, and "
    "copy the queries when the layout shifts the mask",
    "B",
    "[ring-flash-attn], [OnlineSoftmax]",
)
t_ring_x = define(
    "ring_overhead_s",
    "t_ring_x",
    (N - 1) * (M_step / B_hbm + t_launch),
    "per layer and pass: the ring's merges, copies and launches beside the attention kernel",
    "s",
    "[ring-flash-attn]",
)
tau_ring_f = define(
    "cp_ring_fwd_s",
    "tau_ring_fwd",
    C_recv / (t * B_cp),
    "ring forward transfers of one layer (N-1 KV blocks of the TP rank's heads)",
    "s",
    "[RingAttn §3]",
)
tau_ring_b = define(
    "cp_ring_bwd_s",
    "tau_ring_bwd",
    ((N - 1) * C_step + N * b * L * 2 * n_kv * d * p_acc) / (t * B_cp),
    "ring backward transfers of one layer: N-1 KV blocks and N fp32 dK/dV blocks",
    "s",
    "[RingAttn §3], [FA2 §4]",
)
define(
    "cp_ring_fwd_exposed_s",
    "x_ring_fwd",
    _hidden(tau_ring_f, t_att_f, o_cp),
    "ring forward transfers left on the critical path after hiding o_cp of them under attention",
    "s",
    "[RingAttn §3]",
)
define(
    "cp_ring_bwd_exposed_s",
    "x_ring_bwd",
    _hidden(tau_ring_b, t_att_b, o_cp),
    "ring backward transfers left on the critical path",
    "s",
    "[RingAttn §3]",
)
define(
    "cp_allgather_s",
    "tau_AG",
    C_ag / B_cp + (N - 1) * alpha_cp,
    "all-gather of K, V (forward) or reduce-scatter of dK, dV, N - 1 ring steps; exposed",
    "s",
    "[Llama3 §3.3]",
)
define(
    "cp_ulysses_s",
    "tau_U_step",
    C_u / (t * B_cp),
    "Ulysses all-to-alls of one layer and pass; exposed",
    "s",
    "[Ulysses §3]",
)
define(
    "cp_usp_a2a_s",
    "tau_USP_step",
    C_ua / (t * B_cp),
    "USP all-to-alls of one layer and pass; exposed",
    "s",
    "[USP §3]",
)
# Pipelining a collective with its multiply in k chunks hides all but the first chunk's transfer where the
# multiply is the longer, and (k - 1)/k of the multiply's time where the collective is: the share of
# _hidden, with its limit (one chunk stays exposed) built in.
define(
    "tp_overlap_share",
    "o_TP_k",
    (k_tp - 1) / k_tp,
    "share of the TP collectives that can hide under the matrix multiplies when both are split into k_tp "
    "chunks and pipelined: 0 unchunked, (t - 1)/t with Transformer Engine's userbuffers or AsyncTP",
    "1",
    "[Korthikanti22 §4.2.2], [AsyncTP]",
)
define(
    "tp_exposed_s",
    "x_TP",
    _hidden(tau_tp, W_gemm / F_gemm, o_tp),
    "TP collectives of one layer and pass left after hiding o_tp of them under the matrix multiplies",
    "s",
    "[Korthikanti22 §4.2.2]",
)
t_mm_f = define(
    "layer_gemm_fwd_s",
    "t_mm_fwd",
    W_gemm / F_gemm,
    "forward matrix multiplies of one layer, each at its own (m, n, k) per TP shard",
    "s",
    "[Megatron21 §5.1]",
)
t_mm_b = define(
    "layer_gemm_bwd_s",
    "t_mm_bwd",
    2 * W_gemm / F_gemm_b,
    "backward matrix multiplies of one layer: the input and the weight gradient of each, at their shapes",
    "s",
    "[Megatron21 §5.1]",
)
t_fwd_c = define(
    "layer_compute_fwd_s",
    "t_fwd_c",
    t_mm_f + t_att_f + E_lay / B_hbm,
    "forward compute of one layer: matrix multiplies, attention, memory-bound elementwise",
    "s",
    "[Megatron21 §5.1]",
)
define(
    "layer_compute_bwd_s",
    "t_bwd_c",
    t_mm_b + t_att_b + 2 * E_lay / B_hbm,
    "backward compute of one layer (matrix multiplies twice the forward)",
    "s",
    "[Megatron21 §5.1]",
)
define(
    "layer_recompute_s",
    "t_rc",
    rc_sel * t_att_f + rc_full * t_fwd_c,
    "recompute of one layer in backward: the attention core (selective) or the whole forward (full)",
    "s",
    "[Korthikanti22 §5]",
)
t_hl = define(
    "layer_host_s",
    "t_hl",
    (n_kf * (1 + rc_full) + n_kb) * t_k,
    "host time to launch one layer's kernels for one micro-batch: its forward, the forward again under full "
    "recompute, its backward",
    "s",
    "[Brrr], [CUDA-Graphs]",
)
define(
    "layer_host_wait_s",
    "t_wait",
    sympy.Max(t_hl - t_dev, 0),
    "time the device waits on the host in one layer's passes: the host issues kernels one after another and "
    "the device cannot run ahead of it, so a layer takes the longer of the two",
    "s",
    "[Brrr]",
)
t_head = define(
    "head_s",
    "t_head",
    3 * W_head / F_head + E_loss / B_hbm,
    "output layer forward and backward with the loss, on the last pipeline stage",
    "s",
    "[Megatron21 §5.1]",
)
tau_pp = define(
    "pp_send_s",
    "tau_PP",
    T_mb * H * p / (t * B_pp),
    "one stage-boundary send of a micro-batch's activations (or gradients), scattered over TP",
    "s",
    "[Megatron21 §4.1]",
)
define(
    "pp_exposed_s",
    "x_PP",
    (v_pp * pp - 1) * tau_pp * (2 + 2 * (1 - o_pp) * m_mb / pp),
    "stage-boundary sends on the critical path: the fill and drain chains, plus the share 1 - o_pp of the "
    "steady-state sends",
    "s",
    "[Megatron21 §4.1]",
)
# The pipeline: a micro-batch's pass through stage i takes L_i·t_lay, plus the output layer on the last.
# 1F1B runs m micro-batches through the slowest stage and fills and drains through the others, so a step
# takes m·T_stage + (sum of the stages - T_stage); interleaving cuts the fill and drain v-fold
# [Megatron21 §2.2]. With even stages the bubble is the textbook (pp - 1)/(v·m) of the busy time.
_last_slowest = n_last * t_lay + t_head >= sympy.Max(n_first, n_mid) * t_lay
n_crit = define(
    "critical_stage_layers",
    "n_c",
    sympy.Piecewise((n_last, _last_slowest), (sympy.Max(n_first, n_mid), True)),
    "layers on the pipeline stage slowest per micro-batch: the last, which also runs the output layer and "
    "the loss, unless another holds enough more layers",
    "layers",
    "[Megatron21 §2.2]",
)
h_crit = define(
    "critical_stage_head",
    "h_c",
    sympy.Piecewise((1, _last_slowest), (0, True)),
    "1 when the slowest pipeline stage is the last (it runs the output layer and loss), else 0",
    "1",
    "[Megatron21 §2.2]",
)
T_stage = define(
    "stage_max_s",
    "T_stage",
    n_crit * t_lay + h_crit * t_head,
    "one micro-batch through the slowest pipeline stage, forward and backward",
    "s",
    "[Megatron21 §2.2]",
)
T_bubble = define(
    "pipeline_bubble_s",
    "T_bubble",
    (n_L * t_lay + t_head - T_stage) / v_pp,
    "pipeline fill and drain: the other stages' share of one micro-batch's pass, cut v-fold by interleaving",
    "s",
    "[Megatron21 §2.2]",
)
define(
    "pipeline_bubble_fraction",
    "beta_PP",
    T_bubble / (m_mb * T_stage),
    "pipeline bubble over the busy time m·T_stage: (p-1)/m for 1F1B over even stages, (p-1)/(v·m) "
    "interleaved",
    "1",
    "[Megatron21 §2.2]",
)
P_dev = define(
    "device_params",
    "P_dev",
    P / (t * pp),
    "parameters one device holds (before ZeRO-3)",
    "1",
    "[Megatron21 §3]",
)
tau_dp = define(
    "dp_comm_s",
    "tau_DP",
    (2 - z3) * (D - 1) / D * P_dev * p_g / B_dp + n_bkt * a_dp,
    "gradient reduce-scatter plus parameter all-gather (an all-reduce's bytes) over the DP group, one call "
    "per gradient bucket; under ZeRO-3 the gathers are counted per layer instead, leaving the reduce-scatter. "
    "No latency per ring step: across many nodes NCCL reduces small buckets over trees, log D steps",
    "s",
    "[ZeRO §5]",
)
define(
    "dp_exposed_s",
    "x_DP",
    tau_dp * (1 - o_dp + o_dp / n_bkt),
    "the gradient reduction after the backward ends: the last bucket of the overlapped share o_dp, and all "
    "the rest (Megatron reduces after the backward unless told to overlap)",
    "s",
    "PyTorch DDP, [Megatron21 §5]",
)
define(
    "dp_overflow_s",
    "x_DP_over",
    sympy.Max(o_dp * tau_dp * (n_bkt - 1) / n_bkt, 0),
    "the other buckets' reduction, to be compared with the last micro-batch's backward that hides it",
    "s",
    "PyTorch DDP",
)
define(
    "zero3_gather_s",
    "tau_Z3",
    z3 * 2 * (D - 1) / D * P_dev * p / B_dp,
    "ZeRO-3 parameter all-gathers of one micro-batch (forward and backward), hidden by prefetch",
    "s",
    "[ZeRO §5.3]",
)
define(
    "optimizer_s",
    "t_opt",
    (1 - o_opt) * k_opt * P_dev / (D * B_hbm),
    "optimizer step: Adam over the device's 1/D share of fp32 states, memory-bound; none on the device under "
    "optimizer offload",
    "s",
    "[ZeRO §5]",
)
P_flop = P - (e_m - 1) * V * H  # the input embedding is a lookup, no matmul
mf_tok = define(
    "model_flops_per_token",
    "f_model",
    6 * P_flop + 12 * n_L * h * d * S,
    "model FLOP per token: 6 per weight (forward and backward) plus attention 12·n_L·h·d·S "
    "(the full square, causal or not, as published MFUs count it)",
    "FLOP",
    "[PaLM] appendix B, [Megatron21 §5.1]",
)
define(
    "model_flops_per_token_causal",
    "f_model_c",
    6 * P_flop + 12 * c * n_L * h * d * S,
    "model FLOP per token with attention counted over the pairs the trained mask keeps (c = 1/2 causal; "
    "packed documents and windows: the share of the window's tiles the kernel executes): what MFU counts",
    "FLOP",
    "[PaLM] appendix B",
)
define(
    "hardware_flops_per_token",
    "f_hw",
    n_L * ((3 + rc_full) * (W_gemm / T_mb * t) + (7 + 2 * rc_sel + 2 * rc_full) * c * 2 * S * h * d)
    + 6 * H * V,
    "FLOP a device executes per token, recompute included and the causal half skipped",
    "FLOP",
    "[Korthikanti22 §6]",
)
define(
    "step_tokens",
    "T_step",
    b * S * m_mb * D,
    "tokens per optimizer step (global batch)",
    "tokens",
    "[Megatron21 §5.1]",
)

# --- Offload over the host link ([ZeRO-Offload], [ZeRO-Infinity], PyTorch FSDP CPUOffload). -------------
# The plain schedule: the gradients of the device's optimizer share go to the host during the last
# micro-batch's backward; the CPU's Adam step and the upload of the updated bf16 weights follow the backward
# on the critical path (ZeRO-Offload's one-step delayed update, which hides them, is not modelled).
# Parameter offload fetches each layer's weight shard before its forward and again before its backward;
# activation offload copies a layer's kept activations out in the forward and back in the backward. Each
# direction of the host link is its own lane: in the forward the weights come in while the activations go
# out; in the backward both come in on one lane, one layer ahead of the compute that needs them.
_group = "offload"
t_bwd_c = FORMULAS["layer_compute_bwd_s"].symbol
t_rc = FORMULAS["layer_recompute_s"].symbol
tau_g2h = define(
    "offload_grad_copy_s",
    "tau_g2h",
    o_opt * z_o * P_dev * p / B_h,
    "gradients of the device's optimizer share copied to the host, bf16, once a step",
    "s",
    "[ZeRO-Offload §4.1]",
)
define(
    "offload_grad_exposed_s",
    "x_g2h",
    sympy.Max(tau_g2h - n_crit * t_bwd_c, 0),
    "the gradient copy left after hiding it under the last micro-batch's backward on the slowest stage",
    "s",
    "[ZeRO-Offload §4.1]",
)
define(
    "host_adam_s",
    "t_cpu",
    o_opt * n_h * z_o * P_dev / R_h,
    "the CPU's Adam step over the optimizer shares of the n_h devices sharing one host, after the backward",
    "s",
    "[ZeRO-Offload §4.2], [DeepSpeed-CPUAdam]",
)
define(
    "offload_weight_upload_s",
    "tau_w_h2d",
    o_opt * (1 - o_par) * z_o * P_dev * p / B_h,
    "updated bf16 weights of the device's share copied back to it after the CPU step (none under parameter "
    "offload: the next step fetches them layer by layer)",
    "s",
    "[ZeRO-Offload §4.1]",
)
tau_pf = define(
    "offload_param_fetch_s",
    "tau_p_h2d",
    o_par * z_w * P_layer * p / (t * B_h),
    "one layer's bf16 weight shard fetched from the host, before its forward and again before its backward",
    "s",
    "[ZeRO-Infinity §5]",
)
tau_act = define(
    "offload_activation_copy_s",
    "tau_act",
    o_act * A_kept / B_h,
    "one layer's kept activations copied to the host (forward) or back (backward)",
    "s",
    "[ZeRO-Infinity §5]",
)
define(
    "offload_layer_fwd_exposed_s",
    "x_off_fwd",
    sympy.Max(sympy.Max(tau_pf, tau_act) - t_fwd_c, 0),
    "one layer's forward copies left on the critical path: the weights in and the activations out, each on "
    "its own direction of the link, beyond the layer's forward compute",
    "s",
    "[ZeRO-Infinity §5]",
)
define(
    "offload_layer_bwd_exposed_s",
    "x_off_bwd",
    sympy.Max(tau_pf + tau_act - t_bwd_c - t_rc, 0),
    "one layer's backward copies left on the critical path: the weights and the activations in, one after "
    "the other on the inbound direction, beyond the layer's backward and recompute",
    "s",
    "[ZeRO-Infinity §5]",
)

# --- Inference: prefill against a cached prefix, and decode, under TP x CP x PP ([CP-Infer]). ---------
# A prefill computes T_n new tokens per sequence whose queries see K_c cached tokens and, causally, each
# other; CP splits the new tokens N ways (load-balanced) and leaves each rank (K_c + T_n)/N cached tokens.
# Three ways to bring keys to queries: pass-KV rings the K and V of every rank's tokens, pass-Q rings the
# queries and returns partial (O, LSE) by one all-to-all, all-gather collects K and V first. Decode keeps
# the cache sharded: every rank attends the new token to its shard and the (O, LSE) partials are merged.
# A TP rank holds n_kv/t KV heads, at least one (replicated when t > n_kv).
_group = "inference"
_kv_tp = sympy.Max(n_kv / t, 1)
_new = b * T_n / N  # new tokens one CP rank computes
define(
    "weight_bytes_per_device",
    "M_w",
    P_stage / t * p_w,
    "weights one device holds: its pipeline stage's parameters over TP, at p_w bytes each",
    "B",
    "[Megatron21 §3]",
)
M_kv = define(
    "kv_cache_bytes_per_device",
    "M_kv",
    b * S_kv * 2 * _kv_tp * d * p_kv * n_L / pp,
    "KV cache one device holds: b sequences x S_kv tokens x K and V of the TP rank's KV heads, for its "
    "stage's layers",
    "B",
    "[CP-Infer]",
)
define(
    "prefill_activation_bytes",
    "A_prefill",
    _new * p * (2 * H + ((h + 2 * n_kv) * d + (2 + g) * F_ffn) / t)
    + 2 * b * (T_n + K_c) / N * 2 * _kv_tp * d * p
    + _new * h / t * (d + 1) * p_acc,
    "working set of one layer's prefill per device (no backward keeps anything): the residual and "
    "normed input, the QKV and MLP intermediates, two KV blocks in flight and the fp32 (O, LSE) "
    "accumulators",
    "B",
    "[Korthikanti22 §4.1], [RingAttn §3]",
)
W_pf = define(
    "prefill_attn_flops",
    "W_prefill",
    4 * b * (h / t) * d * T_n * (K_c + c * T_n) / N,
    "attention FLOP of one layer's prefill per device: T_n new queries see the K_c cached keys and, "
    "causally (c = 1/2), the new ones; balanced over the N ranks",
    "FLOP",
    "[CP-Infer], [FA2 §4]",
)
C_pkv = define(
    "passkv_step_bytes",
    "C_passKV",
    b * (T_n + K_c) / N * 2 * _kv_tp * d * p,
    "pass-KV: K and V of one rank's cached and new tokens, sent by each TP rank every ring step",
    "B",
    "[CP-Infer]",
)
C_pq = define(
    "passq_step_bytes",
    "C_passQ",
    _new * (h / t) * d * p,
    "pass-Q: the queries of one rank's new tokens, sent by each TP rank every ring step",
    "B",
    "[CP-Infer]",
)
C_pqo = define(
    "passq_return_bytes",
    "C_passQ_out",
    (N - 1) * _new * (h / t) * (d * p + p_acc),
    "pass-Q: partial outputs and their fp32 LSE that one rank receives back from the others by one "
    "all-to-all",
    "B",
    "[CP-Infer], [OnlineSoftmax]",
)
C_agp = define(
    "prefill_allgather_bytes",
    "C_AG_prefill",
    (N - 1) * C_pkv,
    "all-gather: K and V of every other rank's cached and new tokens, received before attention",
    "B",
    "[Llama3 §3.3], [CP-Infer]",
)
t_pf = define(
    "prefill_attn_s",
    "t_att_prefill",
    W_pf / F_attn,
    "attention of one layer's prefill on one device",
    "s",
    "[FA2 §4]",
)
tau_pkv = define(
    "passkv_comm_s",
    "tau_passKV",
    (N - 1) * (alpha + C_pkv / B_cp),
    "pass-KV ring transfers of one layer: N-1 steps",
    "s",
    "[CP-Infer], [RingAttn §3]",
)
tau_pq = define(
    "passq_comm_s",
    "tau_passQ",
    (N - 1) * (alpha + C_pq / B_cp),
    "pass-Q ring transfers of one layer: N-1 steps",
    "s",
    "[CP-Infer]",
)
define(
    "passkv_exposed_s",
    "x_passKV",
    _hidden(tau_pkv, t_pf, o_cp),
    "pass-KV transfers left on the critical path after hiding o_cp of them under the attention",
    "s",
    "[CP-Infer], [RingAttn §3]",
)
define(
    "passq_exposed_s",
    "x_passQ",
    _hidden(tau_pq, t_pf, o_cp) + alpha + C_pqo / B_cp,
    "pass-Q: the query ring left after hiding under the attention, plus the all-to-all of partial "
    "outputs, which waits for the last step",
    "s",
    "[CP-Infer]",
)
define(
    "prefill_allgather_s",
    "tau_AG_prefill",
    (N - 1) * alpha + C_agp / B_cp,
    "all-gather of K and V before attention, exposed",
    "s",
    "[Llama3 §3.3]",
)
define(
    "passkv_hidden_min_new_tokens",
    "T_hide",
    N * _kv_tp * p * F_attn / (2 * (h / t) * B_cp),
    "new tokens per sequence from which a pass-KV ring step hides under its attention step (every pair "
    "visible, alpha = 0): from there pass-KV costs nothing extra and wins",
    "tokens",
    "[CP-Infer] (pass-KV vs pass-Q heuristic)",
)
define(
    "passq_max_new_fraction",
    "f_passQ",
    2 * _kv_tp / (h / t),
    "share of new tokens T_n/(T_n + K_c) below which a pass-Q ring step moves fewer bytes than a "
    "pass-KV step: 2·n_kv/h",
    "1",
    "[CP-Infer] (pass-KV vs pass-Q heuristic)",
)
define(
    "layer_weight_read_s",
    "t_w_layer",
    P_layer * p_w / (t * B_hbm),
    "reading one layer's weights from HBM once: the floor under its matrix multiplies",
    "s",
    "[Roofline]",
)
define(
    "output_weight_read_s",
    "t_w_out",
    V * H * p_w / (t * B_hbm),
    "reading the output layer's weights (vocabulary x hidden, vocab-parallel) from HBM once: the floor "
    "under the first token's logits",
    "s",
    "[Roofline]",
)
t_w_dec = define(
    "decode_weight_read_s",
    "t_w_decode",
    P_stage * p_w / (t * B_hbm),
    "reading one stage's weights from HBM once per decode step",
    "s",
    "[Roofline]",
)
t_kv_dec = define(
    "decode_kv_read_s",
    "t_kv_decode",
    M_kv / B_hbm,
    "reading one device's KV cache once per decode step",
    "s",
    "[Roofline], [CP-Infer]",
)
t_c_dec = define(
    "decode_compute_s",
    "t_c_decode",
    2 * b * P_stage / t / F_gemm + 4 * b * (h / t) * d * S_kv * (n_L / pp) / F_attn,
    "FLOP of one decode step on one stage: 2 per weight per sequence, and the new queries against the "
    "rank's cache",
    "s",
    "[Roofline]",
)
C_merge = define(
    "decode_merge_bytes",
    "C_merge",
    (N - 1) * b * (h / t) * (d * p + p_acc),
    "decode under CP, one layer: the partial output and fp32 LSE of every other CP rank for the new "
    "token, received by an all-gather and merged by log-sum-exp",
    "B",
    "[CP-Infer], [OnlineSoftmax]",
)
tau_merge = define(
    "decode_merge_s",
    "tau_merge",
    (N - 1) * alpha + C_merge / B_cp,
    "all-gather of (O, LSE) for one layer: N-1 ring steps of alpha each, latency-bound at decode sizes",
    "s",
    "[CP-Infer], [A-SPDeep]",
)
tau_tp_dec = define(
    "decode_tp_s",
    "tau_TP_decode",
    2 * (2 * (t - 1) * alpha_tp + 2 * (t - 1) / t * b * H * p / B_tp),
    "two ring all-reduces (attention and MLP outputs) of the new tokens' hidden states per layer, "
    "2(t-1) steps each",
    "s",
    "[Megatron21 §3], [A-SPDeep]",
)
t_fix = define(
    "inference_layer_fixed_s",
    "t_fix",
    t_lf + n_kl * t_k,
    "fixed cost of one inference layer beyond its modelled work: the scheme's measured fixed cost on a "
    "calibrated machine, plus the launches the device waits for",
    "s",
    "[A-RingCost §11], [CUDA-Graphs]",
)
define(
    "passkv_page_gather_s",
    "t_gather",
    g_pg * 2 * C_pkv / B_hbm,
    "pass-KV over a paged cache, one layer: each rank reads its KV pages and writes them into one "
    "contiguous block before the ring sends it (the kernel's stack of K and V)",
    "s",
    "[PagedAttention], [CP-Infer]",
)
t_pmerge = define(
    "decode_partial_merge_s",
    "t_merge_decode",
    (N - 1) * b * (h / t) * 3 * (d + 1) * p_acc / B_hbm,
    "decode under CP, one layer: merging the N-1 other ranks' partial (O, LSE) of the new token into the "
    "own by log-sum-exp, in fp32 (each merge reads two and writes one)",
    "s",
    "[OnlineSoftmax], [CP-Infer]",
)
t_sample = define(
    "decode_sampling_s",
    "t_sample",
    2 * b * V * p_acc / B_hbm,
    "sampling one token per sequence: the fp32 logits read by the softmax and again by the sampler",
    "s",
    "[Roofline]",
)
define(
    "tpot_s",
    "t_token",
    pp * sympy.Max(t_w_dec + t_kv_dec, t_c_dec)
    + n_L * (tau_merge + tau_tp_dec + t_pmerge + t_fix)
    + (pp - 1) * (alpha + b * H * p / B_pp)
    + t_sample
    + t_host,
    "time per output token: each stage in turn reads its weights and KV cache (or computes, when "
    "slower), every layer merges over CP, all-reduces over TP and pays its fixed cost, the stages hand "
    "the token on, it is sampled, and the host prepares the next step",
    "s",
    "[Roofline], [CP-Infer]",
)

# --- Topology: the links a group's collective waits on, from the network's shape ([Dally-Towles ch. 3], ----
# [ScalingBook], [RailOnly]). A group's shape in the fast domain comes from costmodel.machines.topology.

_group = "topology"
define(
    "ring_hop_bandwidth",
    "B_hop",
    l_h * B_l,
    "bytes/s a ring hop moves one way: the links it sends over (a switch port, or one mesh or torus link)",
    "B/s",
    "[RingAttn §3]",
)
define(
    "injection_bandwidth",
    "B_inj",
    n_l * B_l,
    "bytes/s a device can receive at once over all its links of the fast domain",
    "B/s",
    "[Dally-Towles ch. 3]",
)
define(
    "switch_bisection_bandwidth",
    "B_bis_sw",
    P_g * B_l / 2,
    "bisection of a non-blocking switch: half the group sends to the other half at its full port rate",
    "B/s",
    "[Dally-Towles ch. 3]",
)
define(
    "mesh_bisection_bandwidth",
    "B_bis_mesh",
    P_g**2 * B_l / 4,
    "bisection of a full mesh: every one of (P_g/2)² pairs across the cut has its own link",
    "B/s",
    "[Dally-Towles ch. 3]",
)
define(
    "torus_bisection_bandwidth",
    "B_bis_torus",
    w_t * P_g / L_t * B_l,
    "bisection of a torus block: the cut across its longest dimension crosses P_g/L_t rings, "
    "each twice with wraparound",
    "B/s",
    "[Dally-Towles ch. 3]",
)
define(
    "alltoall_bandwidth",
    "B_a2a",
    sympy.Min(n_l * B_l, 4 * B_bis / P_g),
    "bytes/s each rank of an all-to-all receives: its injection, or the bisection's share (half of every "
    "rank's data crosses the cut, so P_g/2 · P_g/2 · m/P_g bytes cross it)",
    "B/s",
    "[Dally-Towles ch. 3], [ScalingBook]",
)
define(
    "torus_allgather_bandwidth",
    "B_ag_torus",
    w_t * D_g * B_l,
    "bytes/s each chip of a torus all-gather receives: a ring per dimension it spans, both ways round "
    "with wraparound",
    "B/s",
    "[ScalingBook]",
)
define(
    "inter_node_bandwidth",
    "B_out",
    n_nic * B_nic / o_x,
    "bytes/s a device moves one way beyond the fast domain: its NICs, divided by the spine oversubscription "
    "when the group's traffic leaves a rail",
    "B/s",
    "[RailOnly]",
)
define(
    "ring_collective_inter_node_bandwidth",
    "B_out_ring",
    k_n * n_nic * B_nic / o_x,
    "bytes/s per member of a ring collective (all-reduce, reduce-scatter, all-gather) whose group spans "
    "nodes: NCCL lays one ring per NIC, so the k_n members on a node drive all k_n·n_nic NICs they hold; "
    "the groups running at once on a node each keep their own members' NICs",
    "B/s",
    "[NCCL-Tuning]",
)

# --- Mixture of experts: the MLP of an MoE layer, its all-to-all and its routing imbalance ([Switch §2.2], --
# [GShard §2, §3]). The dense step formulas read F_ffn as the active width (k experts plus any shared one).

_group = "moe"
define(
    "moe_active_ffn",
    "F_act",
    k_E * F_ffn + F_sh,
    "FFN width one token computes through: its k routed experts (F_ffn each) and any shared expert",
    "elements",
    "[Switch §2], [GShard §2]",
)
P_exp = define(
    "moe_device_expert_params",
    "P_exp",
    sympy.Max(n_first, n_mid, n_last) * (n_E / E_p * (2 + g) * H * F_ffn / t + H * n_E),
    "expert weights one device holds: its n_E/E_p experts of its stage's layers, TP-split, and the routers",
    "parameters",
    "[GShard §2]",
)
T_route = define(
    "moe_device_tokens",
    "T_r",
    b * S / (N * t),
    "tokens one rank routes in a layer: its CP shard, split t ways by sequence parallelism",
    "tokens",
    "[Korthikanti22 §4.2.2]",
)
C_disp = define(
    "moe_dispatch_bytes",
    "C_ep",
    T_route * k_E * H * p * (E_p - 1) / E_p,
    "bytes a rank sends in one all-to-all: each token's hidden state to its k experts, all but 1/E_p of them "
    "on other ranks (the combine returns as many)",
    "B",
    "[GShard §2]",
)
define(
    "moe_alltoall_s",
    "t_ep",
    2 * C_disp / B_ep,
    "one pass of an MoE layer's all-to-alls: dispatch and combine, not overlapped with compute",
    "s",
    "[GShard §2]",
)
define(
    "moe_optimizer_s",
    "t_opt_exp",
    k_opt * P_exp * E_p / (D * B_hbm),
    "optimizer step over the device's expert weights: Adam over their fp32 states, sharded over the D/E_p "
    "ranks that hold the same experts, memory-bound",
    "s",
    "[ZeRO §5], [GShard §2]",
)
define(
    "moe_imbalance_s",
    "t_imb",
    (C_f - 1) * 2 * (2 + g) * k_E * T_route * H * F_ffn / F_gemm,
    "forward time the most loaded expert rank spends beyond the balanced share: C_f x the mean tokens, "
    "as a capacity-bound expert computes its full capacity",
    "s",
    "[Switch §2.2]",
)
# What an MoE model puts on a device. Its dense part (attention, norms, any shared expert, embeddings) is
# the dense formulas' at the shared expert's width, split by TP and PP; its experts are P_exp, n_E/E_p of
# them per rank and each split by TP as Megatron-Core does [MoE-Folding]. The D/E_p ranks holding the same
# experts reduce their gradients and shard their ZeRO states. Every formula below reads F_ffn as ONE
# expert's width, and the fit and the layout search call them in place of their dense twins.
P_moe = define(
    "moe_params",
    "P_moe",
    sympy.Subs(P, F_ffn, F_sh) + sympy.Subs(P_exp, (E_p, t, n_first, n_mid, n_last), (1, 1, n_L, 0, n_L)),
    "parameters of an MoE model: its dense part (attention, norms, any shared expert, embeddings) and "
    "every expert and router of every layer",
    "1",
    "[GShard §2]",
)
define(
    "moe_device_params",
    "P_dev_moe",
    sympy.Subs(P_dev, F_ffn, F_sh) + P_exp,
    "parameters one device holds of an MoE model (before ZeRO-3): its share of the dense part and its experts",
    "1",
    "[Megatron21 §3], [MoE-Folding]",
)
# ZeRO shards expert states over the ranks holding the same experts, E_p times fewer: E_p times the share.
_expert_state_bytes = 2 * sympy.Min(1, E_p * z_w) + 4 * sympy.Min(1, E_p * z_g) + 12 * sympy.Min(1, E_p * z_o)
M_state_moe = define(
    "moe_model_state_bytes",
    "M_state_moe",
    sympy.Subs(M_state, F_ffn, F_sh) + P_exp * _expert_state_bytes,
    "model states per device of an MoE model on the stage holding the most: the dense part's, and its "
    "experts' with ZeRO sharding over the ranks that hold the same experts",
    "B",
    "[ZeRO §3], [MoE-Folding]",
)
# A token's k_E routed copies, padded to C_f, each keep their dispatched hidden state (whole on every TP
# rank: the dispatcher gathers a TP group's tokens for its experts) and their expert's intermediates (TP-
# split): as a width, F_ffn + t·H/(2+g) per copy, since a dense layer keeps 2(2+g)F/t bytes per token.
F_mem = define(
    "moe_activation_ffn",
    "F_mem",
    F_sh + C_f * k_E * (F_ffn + t * H / (2 + g)),
    "MLP width whose dense activations equal an MoE layer's: the shared expert's, and for each of a "
    "token's k_E routed copies, times C_f, its dispatched hidden state and its expert's intermediates",
    "elements",
    "[Switch §2.2], [MoE-Folding]",
)
A_moe = define(
    "moe_activation_bytes",
    "A_moe",
    sympy.Subs(A, F_ffn, F_mem),
    "activations per device on the most loaded pipeline stage of an MoE model: the dense layers' at the "
    "width F_mem",
    "B",
    "[Korthikanti22 §4.2], [Switch §2.2]",
)
define(
    "moe_training_memory_bytes",
    "M_total_moe",
    M_state_moe + A_moe + R_buf,
    "model states, activations and ring buffers per device of an MoE model on the most loaded stage",
    "B",
    "[Korthikanti22 §4], [ZeRO §3]",
)
define(
    "moe_n_min_memory",
    "N_min_moe",
    sympy.Subs(A + _buffers, (N, F_ffn), (1, F_mem)) / (M_dev - M_state_moe),
    "smallest CP degree (real-valued) whose training memory of an MoE model fits M_dev, with flash "
    "attention; negative when the model states alone do not fit",
    "devices",
    "[Korthikanti22 §4]",
    at={phi: 0},
)
tau_dp_moe = define(
    "moe_dp_comm_s",
    "tau_DP_moe",
    sympy.Subs(tau_dp, F_ffn, F_sh) + (2 - z3) * (D - E_p) / D * P_exp * p_g / B_dp,
    "gradient reduction of an MoE model: its dense part over the D ranks, each expert's over the D/E_p "
    "ranks that hold it",
    "s",
    "[ZeRO §5], [GShard §2]",
)
define(
    "moe_dp_exposed_s",
    "x_DP_moe",
    tau_dp_moe * (1 - o_dp + o_dp / n_bkt),
    "the gradient reduction of an MoE model after the backward ends (as dp_exposed_s)",
    "s",
    "PyTorch DDP, [Megatron21 §5]",
)
define(
    "moe_dp_overflow_s",
    "x_DP_over_moe",
    sympy.Max(o_dp * tau_dp_moe * (n_bkt - 1) / n_bkt, 0),
    "the other buckets' reduction of an MoE model, to be compared with the backward that hides it",
    "s",
    "PyTorch DDP",
)
define(
    "moe_zero3_gather_s",
    "tau_Z3_moe",
    sympy.Subs(FORMULAS["zero3_gather_s"].symbol, F_ffn, F_sh) + z3 * 2 * (D - E_p) / D * P_exp * p / B_dp,
    "ZeRO-3 parameter all-gathers of one micro-batch of an MoE model: the dense part over D ranks, the "
    "experts over D/E_p",
    "s",
    "[ZeRO §5.3], [GShard §2]",
)

# --- The step, term by term ([Megatron21 §2.2], [Korthikanti22]). ------------------------------------------
# Every component of the step's breakdown is one formula below and step_time_s is their sum. One layer's
# passes for one micro-batch come first, by component: they add to t_dev, the device's time, and with the wait
# on the host to t_lay, the layer time the pipeline formulas read (each bound to its symbol, so the stage
# formulas stay small). The slowest stage runs every micro-batch: m·n_c times each layer component, m·h_c
# times the output layer; the other stages' share is the bubble. What the CP scheme leaves exposed (x_CP_*)
# and what counts every expert a device holds (x_DP_all, x_DPo_all, tau_Z3_all, t_opt_all) are bound inputs.
_group = "step"
_symbol = {name: formula.symbol for name, formula in FORMULAS.items()}
_passes = 2 + rc_full  # forward, backward, and the forward again under full recompute
_layer = (
    define(
        "layer_gemm_s",
        "t_mm",
        t_mm_f + t_mm_b,
        "matrix multiplies of one layer for one micro-batch, forward and backward",
        "s",
        "[Megatron21 §5.1]",
    ),
    define(
        "layer_attn_s",
        "t_att",
        t_att_f + t_att_b,
        "attention of one layer for one micro-batch, forward and backward, the slowest CP rank",
        "s",
        "[FA2 §4]",
    ),
    define(
        "layer_elementwise_s",
        "t_el",
        (3 * E_lay + _symbol["layer_fp8_cast_bytes"]) / B_hbm,
        "memory-bound work of one layer for one micro-batch: the elementwise bytes forward (once) and backward "
        "(twice), and any FP8 casts",
        "s",
        "[Korthikanti22 §4], [FP8-Formats]",
    ),
    t_rc,
    define(
        "layer_tp_exposed_s",
        "x_TP_lay",
        _passes * _symbol["tp_exposed_s"],
        "TP collectives of one layer for one micro-batch left on the critical path: forward, backward and any "
        "full recompute",
        "s",
        "[Korthikanti22 §4.2.2]",
    ),
    define(
        "layer_cp_exposed_s",
        "x_CP_lay",
        (1 + rc_full) * x_CP_f + x_CP_b,
        "CP communication of one layer for one micro-batch left on the critical path: forward, backward and any "
        "full recompute's forward",
        "s",
        "[RingAttn §3], [Ulysses §3], [USP §3], [Llama3 §3.3]",
    ),
    define(
        "layer_cp_overhead_s",
        "t_CP_ovh",
        _passes * x_CP_r,
        "the ring's merges, copies and launches of one layer for one micro-batch, every pass",
        "s",
        "[ring-flash-attn]",
    ),
    define(
        "layer_ep_exposed_s",
        "x_EP_lay",
        _passes * _symbol["moe_alltoall_s"],
        "EP all-to-alls of one MoE layer for one micro-batch, every pass (none without EP)",
        "s",
        "[GShard §2]",
    ),
    define(
        "layer_moe_imbalance_s",
        "t_imb_lay",
        (3 + rc_full) * sympy.Subs(_symbol["moe_imbalance_s"], F_ffn, F_e),
        "routing imbalance of one MoE layer for one micro-batch: the forward's, the backward's twice, and any "
        "full recompute's (none at C_f = 1)",
        "s",
        "[Switch §2.2]",
    ),
    define(
        "layer_offload_exposed_s",
        "x_off_lay",
        _symbol["offload_layer_fwd_exposed_s"] + _symbol["offload_layer_bwd_exposed_s"],
        "one layer's offload copies for one micro-batch left on the critical path, forward and backward",
        "s",
        "[ZeRO-Infinity §5]",
    ),
)
define(
    "layer_device_s",
    "t_dev_lay",
    sympy.Add(*_layer),
    "device time of one layer's passes for one micro-batch: compute and exposed communication",
    "s",
    "[Megatron21 §3]",
    binds=t_dev,
    simplify=False,
)
t_wait = _symbol["layer_host_wait_s"]
define(
    "layer_time_s",
    "t_lay_s",
    t_dev + t_wait,
    "one layer's passes for one micro-batch: the device's time and any wait on the host",
    "s",
    "[Megatron21 §3], [Brrr]",
    binds=t_lay,
)


def _on_stage(name: str, symbol: str, layer: sympy.Symbol, what: str) -> str:
    """A layer component over the step: the slowest stage's layers, every micro-batch."""
    of = FORMULAS[next(n for n, f in FORMULAS.items() if f.symbol == layer)]
    meaning = f"{what} of the step: the slowest pipeline stage's n_c layers, each of the m micro-batches"
    define(name, symbol, m_mb * n_crit * layer, meaning, "s", of.source)
    return name


def _term(name: str, *definition: Any) -> str:
    """A term of the step that is not a layer component: defined, and named in STEP_TERMS."""
    define(name, *definition)
    return name


x_bwd_stage = n_crit * (t_bwd_c + _symbol["tp_exposed_s"] + x_CP_b)  # the last micro-batch's backward
# The terms of the step's breakdown, in the order it is shown; step_time_s is their sum.
STEP_TERMS: tuple[str, ...] = (
    _on_stage("step_gemm_s", "T_mm", _layer[0], "matrix multiplies"),
    _on_stage("step_attn_s", "T_att", _layer[1], "attention"),
    _on_stage("step_elementwise_s", "T_el", _layer[2], "memory-bound elementwise work"),
    _on_stage("step_host_wait_s", "T_wait", t_wait, "waits on the host (kernel launches)"),
    _on_stage("step_recompute_s", "T_rc", t_rc, "recompute"),
    _on_stage("step_tp_exposed_s", "X_TP", _layer[4], "exposed TP collectives"),
    _on_stage("step_cp_exposed_s", "X_CP", _layer[5], "exposed CP communication"),
    _on_stage("step_cp_overhead_s", "T_CP_ovh", _layer[6], "the ring's merges, copies and launches"),
    _on_stage("step_ep_exposed_s", "X_EP", _layer[7], "exposed EP all-to-alls"),
    _on_stage("step_moe_imbalance_s", "T_imb", _layer[8], "MoE routing imbalance"),
    _on_stage("step_offload_layer_s", "X_off", _layer[9], "exposed offload copies of the layers"),
    _term(
        "step_head_s",
        "T_head",
        m_mb * h_crit * t_head,
        "output layer and loss of the step, where the slowest stage is the last: each of the m micro-batches",
        "s",
        "[Megatron21 §5.1]",
    ),
    "pipeline_bubble_s",
    _term(
        "step_pp_exposed_s",
        "X_PP",
        sympy.Piecewise((_symbol["pp_exposed_s"], pp > 1), (0, True)),
        "stage-boundary sends of the step left on the critical path (none without a pipeline)",
        "s",
        "[Megatron21 §4.1]",
    ),
    _term(
        "step_dp_exposed_s",
        "X_DP",
        x_DP_all + sympy.Max(x_DPo_all - x_bwd_stage, 0),
        "the step's gradient reduction left on the critical path: the last bucket and what is not overlapped, "
        "and the other buckets beyond the last micro-batch's backward on the slowest stage (every weight a "
        "device holds, all its experts)",
        "s",
        "PyTorch DDP, [Megatron21 §5]",
        None,
        None,
        False,
    ),
    _term(
        "step_zero3_gather_s",
        "X_Z3",
        m_mb * (sympy.Max(tau_Z3_all - T_stage, 0) + tau_Z3_all / n_crit),
        "the step's ZeRO-3 gathers left on the critical path: beyond what prefetch hides under a micro-batch, and "
        "the first layer's, each micro-batch",
        "s",
        "[ZeRO §5.3]",
    ),
    _term(
        "step_optimizer_s",
        "T_opt",
        t_opt_all,
        "the optimizer step on the device, over every weight it holds (all its experts)",
        "s",
        "[ZeRO §5], [GShard §2]",
    ),
    _term(
        "step_offload_grad_s",
        "X_off_g",
        _symbol["offload_grad_exposed_s"] + _symbol["offload_weight_upload_s"],
        "optimizer offload's copies left on the critical path: gradients out beyond the last backward, the "
        "updated weights back",
        "s",
        "[ZeRO-Offload §4.1]",
    ),
    "host_adam_s",
    _term(
        "step_framework_s",
        "T_fw",
        t_fw,
        "framework time per optimizer step outside the layers (a measured profile's)",
        "s",
        "kernel tables",
    ),
)
define(
    "step_time_s",
    "T_iter",
    sympy.Add(*(FORMULAS[name].symbol for name in STEP_TERMS)),
    "one optimizer step on one device: the sum of its breakdown",
    "s",
    "[Megatron21 §2.2, §5.1]",
    simplify=False,
)

# --- Calibrated terms ([A-RingCost §11]): what a measured profile adds, each measured by calibrate. ----
_group = "calibration"
m_u = define(
    "ulysses_exchange_recv_bytes",
    "m_U",
    C_u / 4,
    "bytes a rank receives in one of Ulysses' four all-to-alls (their mean under GQA)",
    "B",
    "[A-RingCost §4.2]",
)
tau_ux = define(
    "alltoall_excess_s",
    "tau_Ux",
    4 * sympy.Max(0, m_u - X_k) / B_x,
    "extra time of Ulysses' all-to-alls beyond the knee, where the kernel's copies outgrow alpha-beta "
    "(added to tau_U on a measured profile)",
    "s",
    "[A-RingCost §11]",
)

# --- Packed documents ([A-RingCost §5]): the two branches and the long-tail lock. --------------------
_group = "packing"
define(
    "packed_compute_fraction",
    "c_x",
    c * E_m / E_w,
    "compute fraction of the branch: the plain model's c scaled by the share of the window's tiles the "
    "branch executes (dense: all of them, so c; varlen: the unmasked tiles)",
    "1",
    "[A-RingCost §5]",
)
N_long = define(
    "doc_cp_degree",
    "N_doc",
    sympy.ceiling(l_max * N / S),
    "CP degree the longest document needs alone at the plan's tokens per device S/N",
    "devices",
    "[A-RingCost §5]",
)
N_rest = define(
    "rest_cp_degree",
    "N_rest",
    sympy.ceiling(l_rest * N / S),
    "CP degree the rest of the batch needs: its longest document at S/N tokens per device",
    "devices",
    "[A-RingCost §5]",
)
define(
    "packed_call_tokens",
    "L_call",
    sympy.Min(l_w, L),
    "tokens of one kernel call's document piece in the varlen branch: a block of short documents runs "
    "at the rate of calls that long, as a batch of short sequences does [FA2 §4.1]",
    "tokens",
    "[A-RingCost §5]",
)
define(
    "dynamic_cp_recv_share",
    "chi_dyn",
    (l_max * (N_long - 1) + (T_w - l_max) * (N_rest - 1)) / (T_w * (N - 1)),
    "share of the ring's KV traffic left when each document runs at the CP degree it needs (every "
    "token's KV visits N_x - 1 other ranks) instead of all at N",
    "1",
    "[A-RingCost §5]",
)

GROUPS: tuple[str, ...] = tuple(dict.fromkeys(f.group for f in FORMULAS.values()))


def __getattr__(name: str) -> Formula:
    """``formulas.intensity_step`` is the Formula of that name."""
    try:
        return FORMULAS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
