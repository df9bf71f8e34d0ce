"""Ulysses: all-to-alls turn a rank's S/N tokens of every head into all S tokens of h/N heads, attention
runs whole, and all-to-alls turn it back [Ulysses §3]. Nothing hides them, so its ratio is all-to-all
time / attention compute of the pass; it needs N dividing the heads a TP rank holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from costmodel.machines.binding import Machine
from costmodel.plans.bind import call
from costmodel.plans.cp import usp
from costmodel.plans.cp.base import TRAINING, Scheme, SchemeResult
from costmodel.plans.inputs import PlanInputs

NAME = "ulysses"


def exposure(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    a2a = call("cp_ulysses_s", values)
    return a2a, a2a, 0.0


def check(heads: int, kv_heads: int, n: int, split_kv: bool) -> str | None:
    if heads % n:
        return f"{NAME} needs --cp {n} dividing the {heads} heads a TP rank holds"
    if split_kv and kv_heads % n:
        return (
            f"{NAME} with its KV heads split needs --cp {n} dividing the {kv_heads} KV heads a TP rank holds"
        )
    return None


def layer(inputs: PlanInputs, machine: Machine, pass_: str) -> list[SchemeResult]:
    """USP with N_u = N: its all-to-alls and no ring."""
    return usp.rows(inputs, machine, pass_, [inputs.cp] if inputs.cp > 1 else [], NAME)


SCHEME = Scheme(
    NAME,
    label="Ulysses",
    summary={TRAINING: "all-to-all"},
    rank=2,
    phases=frozenset({TRAINING}),
    collective="alltoall",
    whole_sequence=True,
    layouts=("zigzag",),
    exports={"megatron": "a2a"},
    check=check,
    a2a_degree=lambda kv_heads, n: n,
    exposure=exposure,
    attention_calls=lambda seq, n, n_r, layout: [(seq, seq, True, 1.0)],
    buffers=lambda v: call("ulysses_buffer_bytes", v),
    layer=layer,
    describe=lambda layout, n, n_u: "Ulysses all-to-all",
)
