"""Formulas of the group 'backward': Backward pass of ring attention ([Korthikanti22])."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.compute import W_step
from costmodel.symbolic.formulas.limits import _shard_at_ratio
from costmodel.symbolic.formulas.memory import C_step, L
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import B, F, N, S, alpha, b, d, n_kv, p, p_acc, r

GROUP = "backward"
define = definer(GROUP)

# FlashAttention-2 counts the backward as 2.5x the forward FLOP: five matmuls against two, the
# recomputation of QK^T included. K and V travel the ring again, now with their dK/dV
# accumulators in fp32 (p_acc bytes): N-1 KV hops and N dK/dV hops (the last one brings them home).
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
