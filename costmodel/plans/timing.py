"""Predicted wall time of one attention layer on a profile: the time model, written once.

The report's layer time, the recommendation's choice of scheme and `cp-plan validate` all ask here.

Ring: per step, the slowest rank's compute (its pairs from the tile-level schedule of SPEC §4.1, at
the rate measured for that much work with that many ranks busy) against the transfers that overlap it
(α + bytes/B), with the parts nothing can hide: the first block computes before anything arrives,
and in backward the last dK/dV hop goes home after the last step (:mod:`costmodel.schedule.timeline`).
Ulysses: its all-to-alls (Q, K, V in; O out) around local attention over the whole sequence for h/N
heads, none of it overlapped; backward the same exchanges in reverse around the backward's compute.

With a measured profile (one with ``calibration``) the rates, α and B are the measured ones, transfers
hide as much as was measured, and the measured fixed costs are added: per waited transfer in the ring,
per collective after compute in Ulysses, per layer. Without, or with ``datasheet=True``, this is the
seed's model: one FLOP/s for every block, transfers hidden, and (datasheet) no α and the causal half
counted as balanced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from costmodel.machines.profiles import HardwareProfile, LinkFit
from costmodel.plans.bind import plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.schedule.simulator import simulate
from costmodel.schedule.timeline import ring_layer_time
from costmodel.symbolic import numeric

Variant = Literal["ring", "ulysses"]
_UNIT = {"S": 1, "N": 1, "b": 1, "c": 1, "d": 1, "h": 1}
BACKWARD_FLOP = float(numeric.bwd_step_flops(**_UNIT) / numeric.step_flops(**_UNIT))  # 2.5, FlashAttention-2


@dataclass(frozen=True)
class Prediction:
    forward_s: float
    backward_s: float  # 0 when only the forward was asked for
    compute_s: float  # of which compute (the slowest rank's): total - compute is the exposed communication

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def exposed_s(self) -> float:
        return self.total_s - self.compute_s


@dataclass(frozen=True)
class _Machine:
    """The rates one prediction uses: measured ones, or the datasheet's constants."""

    profile: HardwareProfile
    inputs: PlanInputs
    datasheet: bool
    span: int  # the group whose link the transfers use (a USP ring spans all N ranks)

    @property
    def calibrated(self) -> bool:
        return self.profile.calibration is not None and not self.datasheet

    def rate(self, flops: float, masked: bool, backward: bool, busy: int | None = None) -> float:
        """FLOP/s of a kernel call of ``flops`` forward FLOP, fully visible or ``masked`` (causal), while
        ``busy`` ranks compute at once (default all N; fewer contend less for shared CPU cores)."""
        if not self.calibrated:
            peak, effective = self.profile.flops(self.inputs.dtype, self.inputs.efficiency)
            return peak if self.datasheet else effective
        curve = self.profile.calibration.curve(busy or self.inputs.n, masked)  # type: ignore[union-attr]
        return curve.rate(flops, backward)

    def link(self, collective: bool) -> dict[str, float]:
        """alpha and B of the link the group uses; datasheet: no alpha."""
        link, scope = self.profile.link_for(self.span)
        if self.calibrated:
            cal = self.profile.calibration
            fits: dict[str, LinkFit] = cal.alltoall if collective else cal.p2p  # type: ignore[union-attr]
            if scope in fits:
                return {"alpha": fits[scope].latency_s, "B": fits[scope].bandwidth}
        bandwidth = link.alltoall_bandwidth() if collective else link.bandwidth_per_direction
        latency = link.alltoall_latency() if collective else link.latency_s
        return {"alpha": 0.0 if self.datasheet else latency, "B": bandwidth}

    def fixed(self, name: str) -> float:
        """A measured fixed cost of the calibration (0 on datasheets)."""
        return float(getattr(self.profile.calibration, name)) if self.calibrated else 0.0

    @property
    def overlap(self) -> float:
        return self.profile.calibration.overlap if self.calibrated else 1.0  # type: ignore[union-attr]


def _call(name: str, values: dict[str, Any]) -> float:
    return float(getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]}))


def predict(inputs: PlanInputs, profile: HardwareProfile, variant: Variant = "ring", backward: bool = False,
            datasheet: bool = False, span: int | None = None) -> Prediction:  # fmt: skip
    """Predicted seconds of one layer's forward (and backward) on every rank of the CP group.

    ``span``: how many ranks the transfers' group spans, when more than ``inputs.n`` (the ring of a
    USP split runs over N/N_u ranks spread over all N).
    """
    machine = _Machine(profile, inputs, datasheet, span or inputs.n)
    values = {**plan_values(inputs, profile), **machine.link(collective=variant == "ulysses")}
    layer = (_ulysses if variant == "ulysses" else _ring)(inputs, machine, values, backward)
    if not machine.calibrated or inputs.n == 1:
        return layer
    fixed = profile.calibration.layer_overhead_s  # type: ignore[union-attr]
    forward = fixed.get(f"{variant} fwd", 0.0)
    both = fixed.get(f"{variant} fwd+bwd", forward) if backward else forward
    return Prediction(layer.forward_s + forward, layer.backward_s + both - forward, layer.compute_s)


def _ring(inputs: PlanInputs, machine: _Machine, values: dict[str, Any], backward: bool) -> Prediction:
    n, length = inputs.n, inputs.seq // inputs.n
    kv_s = _call("step_comm_s", values)  # alpha + KV block / B
    dkv_s = values["alpha"] + (_call("bwd_step_recv_bytes", values) - _call("kv_block_bytes", values)) / values["B"]
    if machine.datasheet:  # the seed: every step balanced at c·L² pairs
        pairs = np.full((n, n), (0.5 if inputs.causal else 1.0) * length * length)
    else:
        tile = min(inputs.block, length)
        pairs = simulate(inputs.layout, inputs.seq, n, tile, causal=inputs.causal).rank_step_pairs.astype(float)
    pair_flops = _call("pair_flops", values)

    def step_times(bwd: bool) -> np.ndarray:
        work = pairs * pair_flops  # forward FLOP of each rank's block at each step
        masked = pairs < length * length
        busy = np.broadcast_to((pairs > 0).sum(axis=0), pairs.shape)  # ranks computing in each step
        rate = np.vectorize(lambda w, m, k: machine.rate(max(w, 1.0), bool(m), bwd, int(max(k, 1))))
        seconds = np.where(pairs > 0, work * (BACKWARD_FLOP if bwd else 1.0) / rate(work, masked, busy), 0.0)
        return seconds.max(axis=0)  # the slowest rank sets each step

    timing = {"overlap": machine.overlap, "step_overhead_s": machine.fixed("step_overhead_s")}
    forward_steps = step_times(False)
    forward = ring_layer_time(forward_steps, [kv_s] * (n - 1) + [0.0], **timing)
    if not backward:
        return Prediction(forward, 0.0, float(forward_steps.sum()))
    backward_steps = step_times(True)
    compute = float(forward_steps.sum() + backward_steps.sum())
    if n == 1:
        return Prediction(forward, ring_layer_time(backward_steps, [0.0], **timing), compute)
    # Under step j fly the next KV block (j < N-1) and the dK/dV sums of step j-1 (j > 0); the last
    # sums go home after the last step.
    comm = [kv_s if j == 0 else (dkv_s if j == n - 1 else kv_s + dkv_s) for j in range(n)]
    waits = [1 if j in (0, n - 1) else 2 for j in range(n)]
    tail = ring_layer_time(backward_steps, comm, tail_s=dkv_s, step_waits=waits, tail_waits=1, **timing)
    return Prediction(forward, tail, compute)


def _ulysses(inputs: PlanInputs, machine: _Machine, values: dict[str, Any], backward: bool) -> Prediction:
    seq, n = inputs.seq, inputs.n
    exchanges = (_call("ulysses_comm_s", values) + machine.fixed("sync_overhead_s")) if n > 1 else 0.0
    pairs = seq * (seq + 1) / 2 if inputs.causal else float(seq) * seq
    if machine.datasheet and inputs.causal:
        pairs = 0.5 * seq * seq
    flops = pairs * _call("pair_flops", {**values, "h": inputs.heads // n})
    forward_compute = flops / machine.rate(flops, inputs.causal, False)
    if not backward:
        return Prediction(exchanges + forward_compute, 0.0, forward_compute)
    backward_compute = BACKWARD_FLOP * flops / machine.rate(flops, inputs.causal, True)
    return Prediction(exchanges + forward_compute, exchanges + backward_compute, forward_compute + backward_compute)
