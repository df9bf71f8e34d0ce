"""USP: an N_u-way all-to-all over consecutive ranks (inside a node where it fits), an N_r-way ring across,
N = N_u x N_r [USP §3]. Its ratio adds the ring's step ratio and the all-to-alls' share of the compute.
The Ulysses end of the split (N_u = N, no ring) is computed here too: :mod:`.ulysses` reports it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from costmodel.machines.binding import Machine
from costmodel.plans.bind import PASSES, Evaluator, call, pass_ratio, plan_values
from costmodel.plans.cp import ring
from costmodel.plans.cp.base import (
    TRAINING,
    Scheme,
    SchemeResult,
    pass_sum,
    ring_layout,
    ring_traffic,
)
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict
from costmodel.schedule.layouts import divisors, ulysses_feasibility

NAME = "usp"
_LAYER_COMPUTE = {"fwd": "layer_compute_s", "bwd": "bwd_layer_compute_s"}


def split(kv_heads: int, n: int) -> int:
    """N_u: the largest all-to-all degree dividing the CP degree and the KV heads a TP rank holds."""
    return max(u for u in divisors(n) if kv_heads % u == 0)


def exposure(values: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """All-to-alls over N_u ranks, then a ring over N_r at the N_r ranks' share of the sequence."""
    import numpy

    a2a = numpy.where(numpy.asarray(values["N_u"]) > 1, call("cp_usp_a2a_s", values), 0.0)
    n_r = numpy.asarray(values["N_r"])
    fwd, bwd, overhead = ring.exposure({**values, "N": n_r, "S": values["S"] * n_r // values["N"]})
    across = n_r > 1
    return (
        a2a + numpy.where(across, fwd, 0.0),
        a2a + numpy.where(across, bwd, 0.0),
        numpy.where(across, overhead, 0.0),
    )


def rows(
    inputs: PlanInputs, machine: Machine, pass_: str, n_us: list[int], name: str = NAME
) -> list[SchemeResult]:
    """The comparison's row of scheme ``name`` at each all-to-all degree (USP below N, Ulysses at N);
    infeasible head splits with the reason."""
    out = []
    for n_u in n_us:
        ok, reason = ulysses_feasibility(inputs.heads, inputs.kv_heads, n_u)
        if not ok:
            out.append(SchemeResult(name, n_u, inputs.cp // n_u, None, False, reason))
        else:
            out.append(_split(inputs, machine, pass_, n_u, reason, name))
    return out


def _split(
    inputs: PlanInputs, machine: Machine, pass_: str, n_u: int, reason: str, name: str
) -> SchemeResult:
    n, backward = inputs.cp, pass_ != "fwd"
    n_r = n // n_u
    ev = Evaluator(plan_values(inputs, machine))
    a2a_link = machine.link(n_u, "alltoall")
    factors = {"N_u": float(n_u), "N_r": float(n_r)}
    a2a_each = float(ev("usp_a2a_comm_s", **a2a_link.values, **factors))
    a2a_s = a2a_each * len(PASSES[pass_])  # the same exchanges again, reversed, in backward
    compute_s = pass_sum(ev, _LAYER_COMPUTE, pass_)
    # The all-to-all alone: N_u ranks, each holding S/N of every head, as a Ulysses layer over S·N_u/N
    # (its exchanges only: a packed window's documents do not cut into S·N_u/N).
    a2a_only = inputs.model_copy(
        update={
            "cp": n_u,
            "seq": inputs.seq // n_r,
            "layout": "contiguous",
            "block": 1,
            **dict.fromkeys(("docs", "window", "attention_chunk")),
        }
    )
    a2a_time, a2a_compute = predict(a2a_only, machine, "ulysses", backward).for_pass(pass_)  # kernel variant
    common = {
        "n_ulysses": n_u,
        "n_ring": n_r,
        "feasible": True,
        "reason": reason,
        "kv_heads": int(ev("usp_kv_heads", **factors)),
        "a2a_scope": a2a_link.scope,
    }
    if n_r == 1:  # Ulysses
        return SchemeResult(
            name,
            layout=None,
            a2a_recv_bytes=float(ev("ulysses_recv_bytes_per_layer")) * len(PASSES[pass_]),
            a2a_comm_s=a2a_s,
            ring_comm_s=0.0,
            ratio=a2a_s / compute_s,
            time_s=a2a_time,
            exposed_s=max(0.0, a2a_time - a2a_compute),
            **common,
        )
    # The ring across: N_r steps over h/N_u query heads and max(n_kv, N_u)/N_u KV heads, on the link a
    # group of all N ranks uses (its neighbours sit N_u ranks apart).
    sub = inputs.model_copy(
        update={
            "cp": n_r,
            "heads": inputs.heads // n_u,
            "kv_heads": max(inputs.kv_heads, n_u) // n_u,
            "layout": ring_layout(inputs, n_r),
            "block": min(inputs.block, inputs.seq // n_r),
        }
    )
    ring_link = machine.link(n)
    sub_ev = Evaluator({**plan_values(sub, machine), **ring_link.values})
    ring_ratio = pass_ratio(sub_ev, pass_)
    ring_time, ring_compute = predict(sub, machine, "ring", backward, span=n).for_pass(
        pass_
    )  # kernel variant
    ring_bytes, ring_s = ring_traffic(sub_ev, pass_)
    exposed = max(0.0, a2a_time - a2a_compute) + max(0.0, ring_time - ring_compute)
    return replace(
        SchemeResult(name, layout=sub.layout, **common),
        a2a_recv_bytes=float(ev("usp_a2a_recv_bytes_per_layer", **factors)) * len(PASSES[pass_]),
        ring_recv_bytes=ring_bytes,
        a2a_comm_s=a2a_s,
        ring_comm_s=ring_s,
        ring_ratio=ring_ratio,
        ratio=ring_ratio + a2a_s / compute_s,
        time_s=ring_compute + exposed,
        exposed_s=exposed,
        ring_scope=ring_link.scope,
    )


def buffers(v: Mapping[str, Any]) -> Any:
    """USP's buffers: the all-to-all's over N_u, then a ring over N_r of blocks of N_u shards' tokens with
    1/N_u of the heads [USP §3]."""
    import numpy

    n_u = v["N_u"]
    a2a = call("ulysses_buffer_bytes", v)  # the shard's S/N tokens, every head
    over = {"N": v["N_r"], "h": v["h"] / n_u, "n_kv": numpy.maximum(v["n_kv"] / n_u, 1)}
    return a2a + call("ring_buffer_bytes", {**v, **over})


SCHEME = Scheme(
    NAME,
    label="USP",
    summary={TRAINING: "all-to-all inside a ring"},
    rank=1,
    phases=frozenset({TRAINING}),
    ring=True,
    hybrid=True,
    layouts=("zigzag", "striped", "contiguous"),
    exports={"megatron": "a2a+p2p"},
    megatron_extra=lambda plan: [
        "--hierarchical-context-parallel-sizes",
        str(plan["cp_ulysses"]),
        str(plan["cp_ring"]),
    ],
    a2a_degree=split,
    exposure=exposure,
    attention_calls=lambda seq, n, n_r, layout: ring.calls(seq, n_r, layout),
    buffers=buffers,
    layer=lambda inputs, machine, pass_: rows(inputs, machine, pass_, divisors(inputs.cp)[1:-1]),
    describe=lambda layout, n, n_u: (
        f"USP {n_u}x{n // (n_u or 1)}: all-to-all over {n_u}, a {layout} ring across"
    ),
)
