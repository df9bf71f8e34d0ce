"""Evaluate one plan: every number of the report, from the generated formulas and the simulator.

Nothing here restates a formula. Values come from :mod:`costmodel.symbolic.numeric` (generated from
:mod:`costmodel.symbolic.formulas`); what is left is choosing inputs (which link, which dtype rate), the
feasibility rules of SPEC §4.4, and assembling the :class:`~costmodel.plans.schema.Report`.
"""

from __future__ import annotations

import math

from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.bind import Evaluation, Evaluator, pass_ratio, plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.schema import (
    TP,
    Backward,
    Causal,
    Compute,
    Hardware,
    Inputs,
    LayoutUtilization,
    Memory,
    Report,
    Ring,
    Ulysses,
    USPEntry,
    Verdict,
)
from costmodel.plans.timing import predict
from costmodel.plans.verdict import AMBER, GREEN, band
from costmodel.schedule.layouts import LAYOUTS, chunks_per_rank, divisors, ulysses_feasibility
from costmodel.schedule.simulator import simulate


def _largest_n_in_band(ev: Evaluator, profile: HardwareProfile, upper: float, strict: bool, seq: int) -> int:
    """Largest integer N whose ring step ratio stays in the band, using the link N would use."""
    ranks = profile.ranks_per_node
    scopes = [(ranks + 1, seq, profile.links.inter_node)] if profile.links.inter_node else []
    scopes.append((1, min(ranks, seq), profile.links.intra_node))
    for low, high, link in scopes:
        over = {"B": link.bandwidth_per_direction, "alpha": link.latency_s}
        bound = float(ev("n_at_ratio", r=upper, **over))
        candidate = min(high, math.floor(bound))
        while candidate >= low:
            ratio = float(ev("comm_ratio_step", N=candidate, **over))
            if ratio < upper or (not strict and ratio <= upper):
                return candidate
            candidate -= 1
    return 1  # one device receives nothing


def evaluate(inputs: PlanInputs, profile: HardwareProfile, trace: list[Evaluation] | None = None) -> Report:
    """The full report for one checked plan on one profile."""
    inputs.check()
    link, scope = profile.link_for(inputs.n)
    peak, effective = profile.flops(inputs.dtype, inputs.efficiency)
    ev = Evaluator(plan_values(inputs, profile), trace)

    hardware = Hardware(
        name=profile.name,
        source=profile.source.kind,
        peak_flops=peak,
        effective_flops=effective,
        link=link.name,
        link_scope=scope,
        link_bandwidth=link.bandwidth_per_direction,
        latency=link.latency_s,
        beta=ev("beta"),
        beta_peak=ev("beta", F=peak),
        devices_per_node=profile.devices_per_node,
        cp_ranks_per_node=profile.ranks_per_node,
    )
    memory = Memory(**{name: ev(name) for name in Memory.model_fields})
    compute = Compute(**{name: ev(name) for name in Compute.model_fields})
    ring = _ring(ev, inputs, profile, peak)
    return Report(
        inputs=Inputs(**inputs.model_dump(), bytes_per_element=inputs.bytes_per_element),
        hardware=hardware,
        memory=memory,
        compute=compute,
        ring=ring,
        ulysses=_ulysses(ev, inputs, profile),
        usp=[_usp(ev, inputs, profile, n_u) for n_u in divisors(inputs.n)],
        backward=_backward(ev),
        verdict=_verdict(ev, inputs),
        tp=TP(bytes_per_layer=ev("tp_bytes_per_layer"),
               ratio_to_ring=ev("tp_to_ring_ratio") if inputs.n > 1 else None),
        causal=_causal(ev, inputs),
        notes=_notes(inputs, profile, hardware, ring),
    )


def _ring(ev: Evaluator, inputs: PlanInputs, profile: HardwareProfile, peak: float) -> Ring:
    ratio = float(ev("comm_ratio_step"))
    verdict = band(ratio)
    by_link = {}
    for scope, link in (("intra", profile.links.intra_node), ("inter", profile.links.inter_node)):
        by_link[scope] = (
            float(ev("n_max", B=link.bandwidth_per_direction, alpha=link.latency_s)) if link else None
        )
    return Ring(
        recv_bytes_per_layer=ev("recv_bytes_per_layer"),
        send_bytes_per_layer=ev("send_bytes_per_layer"),
        step_recv_bytes=ev("kv_block_bytes"),
        intensity_step=ev("intensity_step"),
        intensity_layer=ev("intensity_layer") if inputs.n > 1 else None,
        step_compute_s=ev("step_compute_s"),
        step_comm_s=ev("step_comm_s"),
        layer_compute_s=ev("layer_compute_s"),
        layer_comm_s=ev("layer_comm_s"),
        layer_send_s=ev("layer_send_s"),
        comm_ratio_step=ratio,
        comm_ratio_step_peak=ev("comm_ratio_step", F=peak),
        comm_ratio_layer=ev("comm_ratio_layer"),
        verdict=verdict.verdict,
        verdict_text=verdict.text,
        n_max=ev("n_max"),
        n_max_intra_node=by_link["intra"],
        n_max_inter_node=by_link["inter"],
        n_max_green=_largest_n_in_band(ev, profile, GREEN.upper, strict=True, seq=inputs.seq),
        n_max_amber=_largest_n_in_band(ev, profile, AMBER.upper, strict=False, seq=inputs.seq),
        critical_shard_tokens=ev("critical_shard_tokens"),
        layer_time_s=predict(inputs, profile).forward_s,
    )


def _backward(ev: Evaluator) -> Backward:
    ratio = float(ev("bwd_comm_ratio_step"))
    return Backward(
        step_flops=ev("bwd_step_flops"),
        step_recv_bytes=ev("bwd_step_recv_bytes"),
        recv_bytes_per_layer=ev("bwd_recv_bytes_per_layer"),
        intensity_step=ev("bwd_intensity_step"),
        step_compute_s=ev("bwd_step_compute_s"),
        step_comm_s=ev("bwd_step_comm_s"),
        layer_compute_s=ev("bwd_layer_compute_s"),
        comm_ratio_step=ratio,
        verdict=band(ratio).verdict,
        critical_shard_tokens=ev("bwd_critical_shard_tokens"),
    )


def _verdict(ev: Evaluator, inputs: PlanInputs) -> Verdict:
    ratio = pass_ratio(ev, inputs.pass_)
    chosen = band(ratio)
    return Verdict(pass_=inputs.pass_, comm_ratio_step=ratio, verdict=chosen.verdict, text=chosen.text)


def _ulysses(ev: Evaluator, inputs: PlanInputs, profile: HardwareProfile) -> Ulysses:
    ok, reason = ulysses_feasibility(inputs.heads, inputs.kv_heads, inputs.n)
    link, scope = profile.link_for(inputs.n)
    if not ok:
        return Ulysses(feasible=False, reason=reason, kv_heads=None, recv_bytes_per_layer=None, comm_s=None,
                       comm_ratio=None, link_scope=scope)  # fmt: skip
    over = {"B": link.alltoall_bandwidth(), "alpha": link.alltoall_latency()}
    return Ulysses(
        feasible=True,
        reason=reason,
        kv_heads=int(ev("ulysses_kv_heads")),
        recv_bytes_per_layer=ev("ulysses_recv_bytes_per_layer"),
        comm_s=ev("ulysses_comm_s", **over),
        comm_ratio=ev("ulysses_comm_ratio", **over),
        link_scope=scope,
    )


def _usp(ev: Evaluator, inputs: PlanInputs, profile: HardwareProfile, n_u: int) -> USPEntry:
    """N = N_u x N_r with the all-to-all over consecutive ranks (inside a node where it fits)."""
    n_r = inputs.n // n_u
    a2a_link, a2a_scope = profile.link_for(n_u)
    ring_link, ring_scope = profile.link_for(inputs.n) if n_r > 1 else (a2a_link, "none")
    ok, reason = ulysses_feasibility(inputs.heads, inputs.kv_heads, n_u)
    entry = {"n_ulysses": n_u, "n_ring": n_r, "feasible": ok, "reason": reason,
             "a2a_link_scope": a2a_scope if n_u > 1 else "none", "ring_link_scope": ring_scope}  # fmt: skip
    if not ok:
        nothing = ("kv_heads", "a2a_recv_bytes_per_layer", "ring_recv_bytes_per_layer", "recv_bytes_per_layer",
                   "a2a_comm_s", "ring_comm_ratio_step", "ring_verdict")  # fmt: skip
        return USPEntry(**entry, **dict.fromkeys(nothing))
    factors = {"N_u": n_u, "N_r": n_r}
    ratio = float(ev("usp_ring_comm_ratio_step", B=ring_link.bandwidth_per_direction, alpha=ring_link.latency_s,
                     **factors))  # fmt: skip
    return USPEntry(
        **entry,
        kv_heads=int(ev("usp_kv_heads", **factors)),
        a2a_recv_bytes_per_layer=ev("usp_a2a_recv_bytes_per_layer", **factors),
        ring_recv_bytes_per_layer=ev("usp_ring_recv_bytes_per_layer", **factors),
        recv_bytes_per_layer=ev("usp_recv_bytes_per_layer", **factors),
        a2a_comm_s=ev("usp_a2a_comm_s", B=a2a_link.alltoall_bandwidth(), alpha=a2a_link.alltoall_latency(),
                      **factors) if n_u > 1 else 0.0,  # fmt: skip
        ring_comm_ratio_step=ratio if n_r > 1 else None,
        ring_verdict=band(ratio).verdict if n_r > 1 else None,
    )


def _causal(ev: Evaluator, inputs: PlanInputs) -> Causal:
    per_layout = {
        layout: simulate(layout, inputs.seq, inputs.n, inputs.block).utilization
        if inputs.seq % (inputs.n * chunks_per_rank(layout)) == 0 and inputs.block <= inputs.seq // inputs.n
        else None
        for layout in LAYOUTS
    }
    return Causal(
        utilization_coarse=ev("utilization_coarse"),
        utilization_fine=ev("utilization_fine"),
        tile=inputs.block,
        utilization=LayoutUtilization(**per_layout),
    )


def _notes(inputs: PlanInputs, profile: HardwareProfile, hw: Hardware, ring: Ring) -> list[str]:
    notes = []
    gbps = hw.link_bandwidth / 1e9
    if hw.link_scope == "inter-node":
        notes.append(
            f"The ring of N = {inputs.n} spans nodes ({profile.ranks_per_node} CP ranks per node): every step "
            f"waits on the inter-node link, {hw.link} at {gbps:g} GB/s per direction."
        )
    else:
        notes.append(f"The ring stays inside one node ({profile.ranks_per_node} CP ranks per node).")
    if hw.effective_flops != hw.peak_flops:
        notes.append(
            f"Compute at {hw.effective_flops / hw.peak_flops:.0%} of peak: step ratio {ring.comm_ratio_step:.2%} "
            f"({ring.comm_ratio_step_peak:.2%} at peak). Slower compute hides the link more easily but the "
            "layer takes longer (seed 000 §8 step 2)."
        )
    if inputs.causal:
        notes.append(
            "Causal: useful FLOP halve and traffic does not, so intensity, ratio and N_max use half the "
            f"compute (seed 000 §4); the {inputs.layout} layout's tile-level schedule sets the layer time."
        )
    if inputs.n == 1:
        notes.append("N = 1: nothing is split and nothing is received; the ring figures are per would-be block.")
    return notes
