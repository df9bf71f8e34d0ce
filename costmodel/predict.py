"""Predicted wall time of one attention layer on a profile: the model that `cp-plan validate` checks.

Ring: per step, the slowest rank's compute (its pairs from the tile-level schedule of SPEC §4.1, at
the rate measured for that block size and mask) against the transfers that overlap it (α + bytes/B),
with the parts nothing can hide: the first block computes before anything arrives, and in backward
the last dK/dV hop goes home after the last step (:mod:`costmodel.timeline`).
Ulysses: four all-to-alls (Q, K, V in; O out) around local attention over the whole sequence for
h/N heads, none of it overlapped, and the measured cost of the collective that follows compute;
backward the same exchanges in reverse around a 2.5x compute.

With a measured profile (one with ``calibration``) the rates, α and B are the measured ones, and each
layer adds its measured fixed software cost (dispatch, allocation: what a tiny layer takes). Without,
or with ``datasheet=True``, this is the seed's model: one FLOP/s (peak x efficiency) for every block,
α = 0, and the causal half counted as balanced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from costmodel import numeric
from costmodel.causal import simulate
from costmodel.hardware import HardwareProfile, LinkFit
from costmodel.plan import ACCUMULATOR_BYTES, plan_values
from costmodel.timeline import ring_layer_time
from costmodel.workload import PlanInputs

BACKWARD_FLOP = 2.5  # FlashAttention-2's count, as in costmodel.formulas
Variant = Literal["ring", "ulysses"]


@dataclass(frozen=True)
class Prediction:
    forward_s: float
    backward_s: float  # 0 when only the forward was asked for

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class _Machine:
    """The rates one prediction uses: measured ones, or the datasheet's constants."""

    profile: HardwareProfile
    inputs: PlanInputs
    datasheet: bool

    @property
    def calibrated(self) -> bool:
        return self.profile.calibration is not None and not self.datasheet

    def rate(self, flops: float, masked: bool, backward: bool, busy: int | None = None) -> float:
        """FLOP/s of a kernel call of ``flops`` forward FLOP, fully visible or ``masked`` (causal), while
        ``busy`` ranks compute at once (default all N; fewer contend less for shared CPU cores)."""
        if not self.calibrated:
            return float(plan_values(self.inputs, self.profile)["F"]) if not self.datasheet else self._peak()
        curve = self.profile.calibration.curve(busy or self.inputs.n, masked)  # type: ignore[union-attr]
        return curve.rate(flops, backward)

    @property
    def overlap(self) -> dict[str, float]:
        """How transfers hide under compute: measured, or (datasheet) completely and for free."""
        if not self.calibrated:
            return {"overlap": 1.0, "step_overhead_s": 0.0}
        cal = self.profile.calibration
        return {"overlap": cal.overlap, "step_overhead_s": cal.step_overhead_s}  # type: ignore[union-attr]

    @property
    def sync_overhead(self) -> float:
        """Measured cost of a collective that follows compute; none on a datasheet."""
        return self.profile.calibration.sync_overhead_s if self.calibrated else 0.0  # type: ignore[union-attr]

    def _peak(self) -> float:
        return self.profile.flops(self.inputs.dtype, 1.0)[0]

    def link(self, collective: bool) -> tuple[float, float]:
        """(alpha, bandwidth) of the link a group of N uses; datasheet: no alpha."""
        link, scope = self.profile.link_for(self.inputs.n)
        if self.calibrated:
            cal = self.profile.calibration
            fits: dict[str, LinkFit] = cal.alltoall if collective else cal.p2p  # type: ignore[union-attr]
            if scope in fits:
                return fits[scope].latency_s, fits[scope].bandwidth
        bandwidth = link.alltoall_bandwidth() if collective else link.bandwidth_per_direction
        latency = (link.alltoall_latency() if collective else link.latency_s) if not self.datasheet else 0.0
        return latency, bandwidth


def predict(inputs: PlanInputs, profile: HardwareProfile, variant: Variant = "ring", backward: bool = False,
            datasheet: bool = False) -> Prediction:  # fmt: skip
    """Predicted seconds of one layer's forward (and backward) on every rank of the CP group."""
    machine = _Machine(profile, inputs, datasheet)
    layer = (_ulysses if variant == "ulysses" else _ring)(inputs, machine, backward)
    if not machine.calibrated or inputs.n == 1:
        return layer
    fixed = profile.calibration.layer_overhead_s  # type: ignore[union-attr]
    forward = fixed.get(f"{variant} fwd", 0.0)
    both = fixed.get(f"{variant} fwd+bwd", forward)
    return Prediction(layer.forward_s + forward, layer.backward_s + (both - forward) if backward else 0.0)


def _values(inputs: PlanInputs, profile: HardwareProfile) -> dict[str, float]:
    return plan_values(inputs, profile)


def _ring(inputs: PlanInputs, machine: _Machine, backward: bool) -> Prediction:
    n, length = inputs.n, inputs.seq // inputs.n
    values = _values(inputs, machine.profile)
    pair_flops = float(numeric.pair_flops(b=inputs.batch, d=inputs.head_dim, h=inputs.heads))
    alpha, bandwidth = machine.link(collective=False)
    kv = float(numeric.kv_block_bytes(**{a: values[a] for a in numeric.ARGS["kv_block_bytes"]}))
    kv_s = alpha + kv / bandwidth
    dkv_s = alpha + kv * ACCUMULATOR_BYTES / inputs.bytes_per_element / bandwidth

    if machine.datasheet:  # the seed: every step balanced at c·L² pairs, one rate, no alpha
        pairs = np.full((n, n), (0.5 if inputs.causal else 1.0) * length * length)
    else:
        pairs = simulate(inputs.layout, inputs.seq, n, 1, causal=inputs.causal).rank_step_pairs.astype(float)

    def step_times(bwd: bool) -> np.ndarray:
        work = pairs * pair_flops  # forward FLOP of each rank's block at each step
        masked = pairs < length * length
        busy = np.broadcast_to((pairs > 0).sum(axis=0), pairs.shape)  # ranks computing in each step
        rate = np.vectorize(lambda w, m, k: machine.rate(max(w, 1.0), bool(m), bwd, int(max(k, 1))))
        seconds = np.where(pairs > 0, work * (BACKWARD_FLOP if bwd else 1.0) / rate(work, masked, busy), 0.0)
        return seconds.max(axis=0)  # the slowest rank sets each step

    timing = machine.overlap
    forward = ring_layer_time(step_times(False), [kv_s] * (n - 1) + [0.0], **timing)
    if not backward:
        return Prediction(forward, 0.0)
    # Under step j fly the next KV block (j < N-1) and the dK/dV sums of step j-1 (j > 0); the last
    # sums go home after the last step.
    if n == 1:
        return Prediction(forward, ring_layer_time(step_times(True), [0.0], **timing))
    comm = [kv_s if j == 0 else (dkv_s if j == n - 1 else kv_s + dkv_s) for j in range(n)]
    waits = [1 if j in (0, n - 1) else 2 for j in range(n)]
    return Prediction(forward, ring_layer_time(step_times(True), comm, tail_s=dkv_s, step_waits=waits, tail_waits=1,
                                               **timing))


def _ulysses(inputs: PlanInputs, machine: _Machine, backward: bool) -> Prediction:
    n, seq = inputs.n, inputs.seq
    kv_heads = max(inputs.kv_heads, n)
    alpha, bandwidth = machine.link(collective=True)
    shard = inputs.batch * (seq // n) * inputs.head_dim * inputs.bytes_per_element * (n - 1) / n  # one head, received

    def exchange(heads: int) -> float:
        return alpha + heads * shard / bandwidth if n > 1 else 0.0

    heads_per_rank = inputs.heads // n
    pairs = seq * (seq + 1) / 2 if inputs.causal else float(seq) * seq
    flops = pairs * float(numeric.pair_flops(b=inputs.batch, d=inputs.head_dim, h=heads_per_rank))
    if machine.datasheet:
        flops *= (0.5 * seq * seq / pairs) if inputs.causal else 1.0
    # Q and K, V in; O out; each pass also waits once at the all-to-all that follows its compute.
    a2a = 2 * exchange(inputs.heads) + 2 * exchange(kv_heads) + (machine.sync_overhead if n > 1 else 0.0)
    forward = a2a + flops / machine.rate(flops, inputs.causal, False)
    if not backward:
        return Prediction(forward, 0.0)
    return Prediction(forward, a2a + BACKWARD_FLOP * flops / machine.rate(flops, inputs.causal, True))
