"""Formulas of the group 'packing': Packed documents ([A-RingCost §5]): the two branches and the long-tail lock."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.memory import L
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import E_m, E_w, N, S, T_w, c, l_max, l_rest, l_w

GROUP = "packing"
define = definer(GROUP)

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
    sympy.Min(l_w, L, evaluate=False),
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
