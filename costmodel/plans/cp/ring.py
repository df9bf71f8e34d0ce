"""Ring attention: every rank passes its K, V block on to the next, N - 1 times, each transfer hidden under
one step of attention [RingAttn §3], [A-RingCost §11]. Its ratio is the step ratio (receive / compute of
one step; the worse pass for fwd+bwd)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from costmodel.machines.binding import Machine
from costmodel.plans.bind import Evaluator, call, pass_ratio, plan_values
from costmodel.plans.cp.base import TRAINING, Call, Scheme, SchemeResult, ring_layout, ring_traffic
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict

NAME = "ring"


def exposure(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return (
        call("cp_ring_fwd_exposed_s", values),
        call("cp_ring_bwd_exposed_s", values),
        call("ring_overhead_s", values),
    )


def calls(seq: int, ring: int, layout: str) -> list[Call]:
    """A ring over ``ring`` ranks: one causal diagonal step, the rest full blocks (zigzag's half blocks)."""
    block = seq // ring
    other = block // 2 if layout == "zigzag" else block
    return [(block, block, True, 0.5), (block, other, False, (ring - 1) * other / block)]


def layer(inputs: PlanInputs, machine: Machine, pass_: str) -> list[SchemeResult]:
    n = inputs.cp
    ring = inputs.model_copy(update={"layout": ring_layout(inputs, n)})
    ev = Evaluator(plan_values(ring, machine))
    time, compute = predict(ring, machine, "ring", pass_ != "fwd").for_pass(pass_)  # the kernel variant
    if n == 1:
        nothing = dict.fromkeys(("ring_recv_bytes", "ring_comm_s", "ring_ratio", "ratio", "exposed_s"), 0.0)
        return [
            SchemeResult(
                NAME,
                1,
                1,
                ring.layout,
                True,
                "one device: nothing is split",
                inputs.kv_heads,
                time_s=time,
                **nothing,
            )
        ]
    ratio = pass_ratio(ev, pass_)
    recv, comm = ring_traffic(ev, pass_)
    return [
        SchemeResult(
            NAME,
            1,
            n,
            ring.layout,
            True,
            "every device passes its KV block on",
            kv_heads=inputs.kv_heads,
            ring_recv_bytes=recv,
            ring_comm_s=comm,
            ring_ratio=ratio,
            ratio=ratio,
            time_s=time,
            exposed_s=max(0.0, time - compute),
            ring_scope=machine.scope(n),
        )
    ]


SCHEME = Scheme(
    NAME,
    label="ring",
    summary={TRAINING: ""},
    rank=0,
    phases=frozenset({TRAINING}),
    ring=True,
    layouts=("zigzag", "striped", "contiguous"),
    exports={"megatron": "p2p", "torchtitan": "alltoall"},
    exposure=exposure,
    attention_calls=lambda seq, n, n_r, layout: calls(seq, n, layout),
    buffers=lambda v: call("ring_buffer_bytes", v),
    layer=layer,
    describe=lambda layout, n, n_u: f"{layout} ring",
)
