"""The one scheme comparison: ring, Ulysses and every USP split at a CP degree, for a pass.

`cp-plan` prints it and `recommend` ranks it, so the same plan shows the same numbers in both. Per
scheme: the bytes a device receives per layer, the communication time of the pass (USP: all-to-all
and ring together), the ratio its verdict reads, and from the time model the layer's wall time and
the communication it leaves exposed.

Ratios: the ring's is the step ratio (receive / compute of one step; the worse pass for fwd+bwd),
since a ring hides each transfer under one step [A-RingCost §11]. Ulysses' all-to-alls hide under
nothing, so its ratio is all-to-all time / attention compute of the pass [Ulysses §3]. USP adds the
two: its ring's step ratio and its all-to-alls' share of the compute [USP §3].

Ranking (what `recommend` picks): least exposed communication, then least communication time, then
the simpler scheme (ring, USP, Ulysses).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from costmodel.machines.binding import Machine
from costmodel.plans.bind import PASSES, Evaluator, pass_ratio, plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict
from costmodel.plans.verdict import band
from costmodel.schedule.layouts import chunks_per_rank, divisors, ulysses_feasibility

_LAYER_COMM = {"fwd": "layer_comm_s", "bwd": "bwd_layer_comm_s"}
_LAYER_BYTES = {"fwd": "recv_bytes_per_layer", "bwd": "bwd_recv_bytes_per_layer"}
_LAYER_COMPUTE = {"fwd": "layer_compute_s", "bwd": "bwd_layer_compute_s"}
ORDER = ("ring", "usp", "ulysses")


@dataclass(frozen=True)
class SchemeResult:
    """One way to split attention over N devices."""

    scheme: str  # ring, usp, ulysses
    n_ulysses: int  # N_u: all-to-all degree (1 for the ring)
    n_ring: int  # N_r: ring degree (1 for Ulysses)
    layout: str | None  # the ring's layout; None for Ulysses
    feasible: bool
    reason: str
    kv_heads: int | None = None  # KV heads after replication to N_u
    a2a_recv_bytes: float | None = None  # per device per layer
    ring_recv_bytes: float | None = None
    a2a_comm_s: float | None = None  # per layer for the pass
    ring_comm_s: float | None = None
    ring_ratio: float | None = None  # the ring part's step ratio for the pass
    ratio: float | None = None
    time_s: float | None = None  # predicted layer wall time for the pass
    exposed_s: float | None = None  # of which communication nothing hides
    a2a_scope: str = "none"
    ring_scope: str = "none"

    @property
    def label(self) -> str:
        return {"ring": "ring", "ulysses": "Ulysses"}.get(self.scheme, f"USP {self.n_ulysses}x{self.n_ring}")

    @property
    def recv_bytes(self) -> float | None:
        return None if not self.feasible else (self.a2a_recv_bytes or 0.0) + (self.ring_recv_bytes or 0.0)

    @property
    def comm_s(self) -> float | None:
        return None if not self.feasible else (self.a2a_comm_s or 0.0) + (self.ring_comm_s or 0.0)

    @property
    def verdict(self) -> str | None:
        return band(self.ratio).verdict if self.ratio is not None else None

    def rank_key(self) -> tuple[float, float, int]:
        return (self.exposed_s or 0.0, self.comm_s or 0.0, ORDER.index(self.scheme))


def ring_layout(inputs: PlanInputs, n: int) -> str:
    """The ring layout to compare: the plan's when S splits for it, else contiguous."""
    return inputs.layout if inputs.seq % (n * chunks_per_rank(inputs.layout)) == 0 else "contiguous"


def compare(inputs: PlanInputs, machine: Machine, pass_: str | None = None) -> list[SchemeResult]:
    """Ring, every USP split N = N_u x N_r (1 < N_u < N) and Ulysses, at the plan's N, for ``pass_``
    (default the plan's pass). Infeasible head splits are listed with the reason."""
    pass_ = pass_ or inputs.pass_
    n = inputs.cp
    out = [_ring(inputs, machine, pass_)]
    for n_u in divisors(n)[1:]:
        ok, reason = ulysses_feasibility(inputs.heads, inputs.kv_heads, n_u)
        scheme = "ulysses" if n_u == n else "usp"
        if not ok:
            out.append(SchemeResult(scheme, n_u, n // n_u, None, False, reason))
        else:
            out.append(_split(inputs, machine, pass_, n_u, reason))
    return out


def best(results: list[SchemeResult]) -> SchemeResult:
    """The scheme to use: least exposed communication, then least communication, then the simplest."""
    return min((r for r in results if r.feasible), key=SchemeResult.rank_key)


def lowest_ratio(results: list[SchemeResult]) -> SchemeResult:
    """The feasible scheme with the lowest ratio: N is usable when this one is within amber."""
    return min((r for r in results if r.feasible), key=lambda r: (r.ratio or 0.0, ORDER.index(r.scheme)))


def _pass_sum(ev: Evaluator, names: dict[str, str], pass_: str, **over: float) -> float:
    return sum(float(ev(names[phase], **over)) for phase in PASSES[pass_])


def _ring_traffic(ev: Evaluator, pass_: str) -> tuple[float, float]:
    """(bytes received, receive time) of a ring layer for the pass: KV blocks, and in backward dK/dV too."""
    return _pass_sum(ev, _LAYER_BYTES, pass_), _pass_sum(ev, _LAYER_COMM, pass_)


def _ring(inputs: PlanInputs, machine: Machine, pass_: str) -> SchemeResult:
    n = inputs.cp
    ring = inputs.model_copy(update={"layout": ring_layout(inputs, n)})
    ev = Evaluator(plan_values(ring, machine))
    scope = machine.scope(n) if n > 1 else "none"
    if n == 1:
        time, _ = predict(ring, machine, "ring", pass_ != "fwd").for_pass(pass_)
        return SchemeResult(
            "ring",
            1,
            1,
            ring.layout,
            True,
            "one device: nothing is split",
            kv_heads=inputs.kv_heads,
            ring_recv_bytes=0.0,
            ring_comm_s=0.0,
            ring_ratio=0.0,
            ratio=0.0,
            time_s=time,
            exposed_s=0.0,
        )
    ratio = pass_ratio(ev, pass_)
    time, compute = predict(ring, machine, "ring", pass_ != "fwd").for_pass(pass_)
    recv, comm = _ring_traffic(ev, pass_)
    return SchemeResult(
        "ring",
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
        ring_scope=scope,
    )


def _split(inputs: PlanInputs, machine: Machine, pass_: str, n_u: int, reason: str) -> SchemeResult:
    """N_u-way all-to-all over consecutive ranks (inside a node where it fits), N_r-way ring across."""
    n, backward = inputs.cp, pass_ != "fwd"
    n_r = n // n_u
    ev = Evaluator(plan_values(inputs, machine))
    a2a_link = machine.link(n_u, "alltoall")
    factors = {"N_u": float(n_u), "N_r": float(n_r)}
    a2a_each = float(ev("usp_a2a_comm_s", **a2a_link.values, **factors))
    a2a_s = a2a_each * len(PASSES[pass_])  # the same exchanges again, reversed, in backward
    compute_s = _pass_sum(ev, _LAYER_COMPUTE, pass_)
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
    a2a_time, a2a_compute = predict(a2a_only, machine, "ulysses", backward).for_pass(pass_)
    common = {
        "n_ulysses": n_u,
        "n_ring": n_r,
        "feasible": True,
        "reason": reason,
        "kv_heads": int(ev("usp_kv_heads", **factors)),
        "a2a_scope": a2a_link.scope,
    }
    if n_r == 1:  # Ulysses
        ratio = a2a_s / compute_s
        return SchemeResult(
            "ulysses",
            layout=None,
            a2a_recv_bytes=float(ev("ulysses_recv_bytes_per_layer")) * len(PASSES[pass_]),
            a2a_comm_s=a2a_s,
            ring_comm_s=0.0,
            ratio=ratio,
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
    ring_time, ring_compute = predict(sub, machine, "ring", backward, span=n).for_pass(pass_)
    ring_bytes, ring_s = _ring_traffic(sub_ev, pass_)
    exposed = max(0.0, a2a_time - a2a_compute) + max(0.0, ring_time - ring_compute)
    return replace(
        SchemeResult("usp", layout=sub.layout, **common),
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
