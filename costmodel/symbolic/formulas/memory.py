"""Formulas of the group 'memory': Memory tiers ([A-RingCost §1]): temporaries at three granularities, then the ring's buffers."""

from __future__ import annotations

from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.symbols import N, S, b, d, h, n_kv, p, p_acc, s_blk

GROUP = "memory"
define = definer(GROUP)

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
