"""Evaluate one plan: every number of the report, from the generated formulas and the simulator.

Nothing here restates a formula. Values come from :mod:`costmodel.symbolic.numeric` (generated from
:mod:`costmodel.symbolic.formulas`), links and rates from the machine binding, the schemes from the
one scheme comparison; what is left is assembling the :class:`~costmodel.plans.schema.Report`.
"""

from __future__ import annotations

from costmodel.machines import topology
from costmodel.machines.binding import Machine
from costmodel.plans import cp as registry
from costmodel.plans.bind import PASSES, PHASE_PREFIX, RATIO, Evaluation, Evaluator, pass_ratio, plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.packed_report import mask_section, masked_utilization, packing_section
from costmodel.plans.schema import (
    TP,
    Backward,
    Causal,
    Compute,
    Hardware,
    LayoutUtilization,
    Memory,
    Report,
    Ring,
    Scheme,
    Ulysses,
    USPEntry,
    Verdict,
)
from costmodel.plans.schemes import SchemeResult, compare
from costmodel.plans.timing import Prediction, predict
from costmodel.plans.verdict import AMBER, GREEN, band
from costmodel.schedule.layouts import LAYOUTS, chunks_per_rank
from costmodel.schedule.simulator import simulation_tile, utilization


def _largest_n_in_band(
    ev: Evaluator, machine: Machine, upper: float, strict: bool, inputs: PlanInputs
) -> int:
    """Largest integer N whose ring step ratio (the pass's, as the verdict's) stays in the band, each N on the
    link it would use.

    The ratio grows with N on a given link, so a binary search inside each scope finds the edge."""
    seq = inputs.seq

    def inside(n: int) -> bool:
        ratio = pass_ratio(ev, inputs.pass_, N=float(n), **machine.link(n).values)
        return ratio < upper or (not strict and ratio <= upper)

    ranks = machine.ranks_per_node
    scopes = [(ranks + 1, seq)] if machine.profile.links.inter_node and seq > ranks else []
    scopes.append((1, min(ranks, seq)))
    for low, high in scopes:
        if not inside(low):
            continue
        while low < high:  # invariant: inside(low)
            mid = (low + high + 1) // 2
            low, high = (mid, high) if inside(mid) else (low, mid - 1)
        return low
    return 1  # one device receives nothing


def evaluate(inputs: PlanInputs, machine: Machine, trace: list[Evaluation] | None = None) -> Report:
    """The full report for one plan on one machine."""
    link = machine.link(inputs.cp)
    ev = Evaluator(plan_values(inputs, machine), trace)
    profile = machine.profile
    hardware = Hardware(
        name=profile.name,
        source=profile.source.kind,
        peak_flops=machine.peak_flops,
        effective_flops=machine.effective_flops,
        link=link.name,
        link_scope=link.scope,
        link_bandwidth=link.bandwidth,
        latency=link.latency_s,
        beta=ev("beta"),
        beta_peak=ev("beta", F=machine.peak_flops),
        devices_per_node=profile.devices_per_node,
        cp_ranks_per_node=machine.ranks_per_node,
        topology=topology.describe(profile),
        attention_kernel=machine.attention_kernel or "flash",
        changed=profile.changed,
    )
    schemes = compare(inputs, machine)
    kernel = predict(inputs, machine, backward=True)  # compute at the rates the layer time reads
    ring = _ring(ev, inputs, machine, schemes[0], kernel)
    backward = _backward(ev, (kernel.compute_s - kernel.forward_compute_s) / inputs.cp)
    return Report(
        inputs=inputs,
        hardware=hardware,
        memory=Memory(**{name: ev(name) for name in Memory.model_fields}),
        compute=Compute(**{name: ev(name) for name in Compute.model_fields}),
        ring=ring,
        ulysses=_ulysses(schemes[-1] if inputs.cp > 1 else None, machine, inputs.cp),
        usp=[_usp(ev, s, machine) for s in schemes],
        schemes=[_scheme(s) for s in schemes],
        backward=backward,
        verdict=_verdict(ev, inputs, machine, ring, backward),
        tp=TP(
            bytes_per_layer=ev("tp_bytes_per_layer"),
            ratio_to_ring=ev("tp_to_ring_ratio") if inputs.cp > 1 else None,
        ),
        causal=_causal(ev, inputs),
        notes=_notes(inputs, machine, hardware, ring),
        packing=packing_section(ev, inputs, machine),
        mask=mask_section(ev, inputs),
    )


def _ring(
    ev: Evaluator, inputs: PlanInputs, machine: Machine, ring: SchemeResult, kernel: Prediction
) -> Ring:
    ratio = float(ev("comm_ratio_step"))
    verdict = band(ratio)
    bounds = {}
    for scope, link in (
        ("intra", machine.profile.links.intra_node),
        ("inter", machine.profile.links.inter_node),
    ):
        alpha = 0.0 if machine.datasheet else link.latency_s if link else 0.0
        bounds[scope] = float(ev("n_max", B=link.bandwidth_per_direction, alpha=alpha)) if link else None
    return Ring(
        recv_bytes_per_layer=ev("recv_bytes_per_layer"),
        send_bytes_per_layer=ev("send_bytes_per_layer"),
        step_recv_bytes=ev("kv_block_bytes"),
        intensity_step=ev("intensity_step"),
        intensity_layer=ev("intensity_layer") if inputs.cp > 1 else None,
        step_compute_s=ev("step_compute_s"),
        step_comm_s=ev("step_comm_s"),
        layer_compute_s=ev("layer_compute_s"),
        layer_comm_s=ev("layer_comm_s"),
        layer_send_s=ev("layer_send_s"),
        comm_ratio_step=ratio,
        comm_ratio_step_peak=ev("comm_ratio_step", F=machine.peak_flops),
        comm_ratio_layer=ev("comm_ratio_layer"),
        verdict=verdict.verdict,
        verdict_text=verdict.text,
        n_max=ev("n_max"),
        n_max_intra_node=bounds["intra"],
        n_max_inter_node=bounds["inter"],
        critical_shard_tokens=ev("critical_shard_tokens"),
        layer_time_s=kernel.forward_s,
        layer_compute_kernel_s=kernel.forward_compute_s,
        step_compute_kernel_s=kernel.forward_compute_s / inputs.cp,
    )


def _backward(ev: Evaluator, step_compute_kernel_s: float) -> Backward:
    ratio = float(ev("bwd_comm_ratio_step"))
    return Backward(
        step_flops=ev("bwd_step_flops"),
        step_recv_bytes=ev("bwd_step_recv_bytes"),
        recv_bytes_per_layer=ev("bwd_recv_bytes_per_layer"),
        intensity_step=ev("bwd_intensity_step"),
        step_compute_s=ev("bwd_step_compute_s"),
        step_comm_s=ev("bwd_step_comm_s"),
        layer_compute_s=ev("bwd_layer_compute_s"),
        step_compute_kernel_s=step_compute_kernel_s,
        comm_ratio_step=ratio,
        verdict=band(ratio).verdict,
        critical_shard_tokens=ev("bwd_critical_shard_tokens"),
    )


def _verdict(ev: Evaluator, inputs: PlanInputs, machine: Machine, ring: Ring, backward: Backward) -> Verdict:
    """The band of the balanced ratio (the bound [A-RingCost] reasons with), and beside it the ratio at the
    kernel rates the layer time and the timeline read, so the headline and the timeline tell one story. The
    limits are the same pass's: for fwd+bwd, N_max the lower and L* the longer of the two phases'."""
    ratio = pass_ratio(ev, inputs.pass_) if inputs.cp > 1 else 0.0  # one device receives nothing
    chosen = band(ratio)
    phases = {"fwd": (ring.step_comm_s, ring.step_compute_kernel_s)}
    phases["bwd"] = (backward.step_comm_s, backward.step_compute_kernel_s)
    timed = [comm / compute for comm, compute in (phases[p] for p in PASSES[inputs.pass_]) if compute > 0]
    prefixes = [PHASE_PREFIX[p] for p in PASSES[inputs.pass_]]
    binding = max(PASSES[inputs.pass_], key=lambda p: float(ev(RATIO[p])))
    return Verdict(
        pass_=inputs.pass_,
        comm_ratio_step=ratio,
        verdict=chosen.verdict,
        text=chosen.text,
        comm_ratio_step_kernel=max(timed) if inputs.cp > 1 and timed else None,
        intensity_step=ev(PHASE_PREFIX[binding] + "intensity_step"),
        n_max=min(float(ev(prefix + "n_at_ratio", r=1.0)) for prefix in prefixes),
        n_max_green=_largest_n_in_band(ev, machine, GREEN.upper, strict=True, inputs=inputs),
        n_max_amber=_largest_n_in_band(ev, machine, AMBER.upper, strict=False, inputs=inputs),
        critical_shard_tokens=max(float(ev(prefix + "critical_shard_tokens")) for prefix in prefixes),
    )


def _ulysses(result: SchemeResult | None, machine: Machine, n: int) -> Ulysses:
    """The all-to-all over all N devices [Ulysses], from the scheme comparison (N = 1: nothing to split)."""
    if result is None or not result.feasible:
        reason = result.reason if result else "one device: nothing to exchange"
        return Ulysses(
            feasible=False,
            reason=reason,
            kv_heads=None,
            recv_bytes_per_layer=None,
            comm_s=None,
            comm_ratio=None,
            verdict=None,
            link_scope=machine.scope(n),
        )
    return Ulysses(
        feasible=True,
        reason=result.reason,
        kv_heads=result.kv_heads,
        recv_bytes_per_layer=result.a2a_recv_bytes,
        comm_s=result.a2a_comm_s,
        comm_ratio=result.ratio,
        verdict=result.verdict,
        link_scope=result.a2a_scope,
    )


def _usp(ev: Evaluator, s: SchemeResult, machine: Machine) -> USPEntry:
    """One factorisation N = N_u x N_r [USP]; N_u = 1 is the ring, N_r = 1 is Ulysses."""
    entry = {
        "n_ulysses": s.n_ulysses,
        "n_ring": s.n_ring,
        "feasible": s.feasible,
        "reason": s.reason,
        "a2a_link_scope": s.a2a_scope,
        "ring_link_scope": s.ring_scope,
    }
    if not s.feasible:
        nothing = (
            "kv_heads",
            "a2a_recv_bytes_per_layer",
            "ring_recv_bytes_per_layer",
            "recv_bytes_per_layer",
            "a2a_comm_s",
            "ring_comm_ratio_step",
            "ring_verdict",
            "comm_s",
            "comm_ratio",
            "verdict",
        )
        return USPEntry(**entry, **dict.fromkeys(nothing))
    return USPEntry(
        **entry,
        kv_heads=s.kv_heads,
        a2a_recv_bytes_per_layer=s.a2a_recv_bytes or 0.0,
        ring_recv_bytes_per_layer=s.ring_recv_bytes or 0.0,
        recv_bytes_per_layer=s.recv_bytes,
        a2a_comm_s=s.a2a_comm_s or 0.0,
        ring_comm_ratio_step=s.ring_ratio if s.n_ring > 1 else None,
        ring_verdict=band(s.ring_ratio).verdict if s.n_ring > 1 and s.ring_ratio is not None else None,
        comm_s=s.comm_s,
        comm_ratio=s.ratio,
        verdict=s.verdict,
    )


def _scheme(s: SchemeResult) -> Scheme:
    return Scheme(
        scheme=s.scheme,
        label=registry.get(s.scheme).split_label(s.n_ulysses, s.n_ring),
        n_ulysses=s.n_ulysses,
        n_ring=s.n_ring,
        layout=s.layout,
        feasible=s.feasible,
        reason=s.reason,
        recv_bytes_per_layer=s.recv_bytes,
        comm_s=s.comm_s,
        comm_ratio=s.ratio,
        verdict=s.verdict,
        layer_time_s=s.time_s,
        exposed_comm_s=s.exposed_s,
        a2a_link_scope=s.a2a_scope,
        ring_link_scope=s.ring_scope,
    )


def _causal(ev: Evaluator, inputs: PlanInputs) -> Causal:
    tile = simulation_tile(inputs.seq, inputs.cp, inputs.block)
    per_layout = {
        layout: utilization(layout, inputs.seq, inputs.cp, tile)
        if inputs.seq % (inputs.cp * chunks_per_rank(layout)) == 0
        else None
        for layout in LAYOUTS
    }
    if inputs.masked:  # under the plan's mask and branch ([A-RingCost §5])
        per_layout = masked_utilization(inputs)
    return Causal(
        utilization_coarse=ev("utilization_coarse"),
        utilization_fine=ev("utilization_fine"),
        tile=tile,
        utilization=LayoutUtilization(**per_layout),
    )


def _notes(inputs: PlanInputs, machine: Machine, hw: Hardware, ring: Ring) -> list[str]:
    notes = []
    gbps = hw.link_bandwidth / 1e9
    if hw.link_scope == "inter-node":
        notes.append(
            f"The ring of N = {inputs.cp} spans nodes ({machine.ranks_per_node} CP ranks per node): every step "
            f"waits on the inter-node link, {hw.link} at {gbps:g} GB/s per direction."
        )
    else:
        notes.append(f"The ring stays inside one node ({machine.ranks_per_node} CP ranks per node).")
    if hw.effective_flops != hw.peak_flops:
        notes.append(
            f"Compute at {hw.effective_flops / hw.peak_flops:.0%} of peak: step ratio {ring.comm_ratio_step:.2%} "
            f"({ring.comm_ratio_step_peak:.2%} at peak). Slower compute hides the link more easily but the "
            "layer takes longer [A-RingCost §8]."
        )
    if inputs.causal:
        notes.append(
            "Causal: useful FLOP halve and traffic does not, so intensity, ratio and N_max use half the "
            f"compute [A-RingCost §4]; the {inputs.layout} layout's schedule (the pairs each rank sees at each "
            "step) sets the layer time."
        )
    if inputs.masked:
        what = {
            "dense": "blanks the document mask's scores and executes the causal window's tiles",
            "varlen": "skips every tile with no visible pair",
        }[inputs.packing]
        notes.append(
            f"Masked ({inputs.packing} branch): the kernel {what}; compute, intensity, ratios and the layer "
            "time follow what it executes, traffic does not change [A-RingCost §5] (docs/packing.md)."
        )
    if inputs.cp == 1:
        notes.append(
            "N = 1: nothing is split and nothing is received; the ring figures are per would-be block."
        )
    tile = simulation_tile(inputs.seq, inputs.cp, inputs.block)
    if inputs.causal and tile != min(inputs.block, inputs.seq // inputs.cp):
        notes.append(
            f"The causal schedule is simulated at tile {tile:,}, the finest whose N x N x tiles arrays fit "
            "in memory: a lower bound on the utilisation at your tile."
        )
    return notes
