"""Formulas of the group 'ulysses': Ulysses ([A-RingCost §4.2, §7]; [Ulysses §3]). KV heads are replicated up to N when N > n_kv."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.memory import L
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.formulas.time import t_layer
from costmodel.symbolic.symbols import B, N, alpha, b, d, h, n_kv, p

GROUP = "ulysses"
define = definer(GROUP)

n_kv_u = define(
    "ulysses_kv_heads",
    "n_kv_U",
    sympy.Max(n_kv, N, evaluate=False),
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
