"""All-gather (Llama 3's CP): every rank gathers all of K, V before attention and, in backward,
reduce-scatters dK, dV [Llama3 §3.3]; nothing hides them. Serving uses it for a prefill too
[CP-Infer]."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from costmodel.plans.bind import call
from costmodel.plans.cp.base import PREFILL, TRAINING, Scheme

NAME = "allgather"


def exposure(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    gather = call(
        "cp_allgather_s", values
    )  # K, V gathered forward; again, and dK, dV reduce-scattered backward
    return gather, 2 * gather, call("cp_allgather_merge_s", values)


SCHEME = Scheme(
    NAME,
    label="all-gather",
    summary={TRAINING: "K, V gathered, as Llama 3", PREFILL: "K, V gathered first"},
    rank=3,
    phases=frozenset({TRAINING, PREFILL}),
    collective="allgather",
    latency_per_step=True,
    layouts=("zigzag", "contiguous"),  # zigzag and striped shards see the same keys
    exports={"megatron": "allgather", "torchtitan": "allgather"},
    exposure=exposure,
    attention_calls=lambda seq, n, n_r, layout: [(seq // n, seq, True, 1.0)],  # local queries, gathered keys
    buffers=lambda v: call("allgather_buffer_bytes", v),
    prefill_exposed="prefill_allgather_s",
    prefill_bytes="prefill_allgather_bytes",
    describe=lambda layout, n, n_u: f"an all-gather of K, V over a {layout} split",
)
