"""Formulas of the group 'usp': USP: N = N_u x N_r, all-to-all inside, ring across ([USP §3])."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.compute import W_pair
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import B, F, N_r, N_u, S, alpha, b, c, d, h, n_kv, p

GROUP = "usp"
define = definer(GROUP)

n_kv_usp = define(
    "usp_kv_heads",
    "n_kv_USP",
    sympy.Max(n_kv, N_u, evaluate=False),
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
