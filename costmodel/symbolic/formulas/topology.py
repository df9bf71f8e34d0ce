"""Formulas of the group 'topology': define("""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import (
    B_bis,
    B_l,
    B_nic,
    D_g,
    L_t,
    P_g,
    alpha_in,
    alpha_out,
    k_n,
    l_h,
    n_l,
    n_nic,
    n_x,
    o_x,
    w_t,
)

GROUP = "topology"
define = definer(GROUP)

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
    sympy.Min(n_l * B_l, 4 * B_bis / P_g, evaluate=False),
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
define(
    "ring_step_latency",
    "alpha_ring",
    ((P_g - n_x) * alpha_in + (n_x - 1) * alpha_out) / (P_g - 1),
    "mean latency of one step of a ring collective over P_g ranks on n_x nodes: only n_x - 1 of its P_g - 1 "
    "hops (an all-reduce's 2(n_x - 1) of its 2(P_g - 1) steps) cross the network",
    "s",
    "[NCCL-Tuning]",
)

# --- Mixture of experts: the MLP of an MoE layer, its all-to-all and its routing imbalance ([Switch §2.2], --
# [GShard §2, §3]). The dense step formulas read F_ffn as the active width (k experts plus any shared one).
