"""Predicted wall time of one attention layer on a profile: the time model, written once.

The report's layer time, the scheme comparison (so `cp-plan` and `recommend` alike) and `cp-plan validate`
all ask here; rates, links and fixed costs come from the machine binding.

Ring: per step, the slowest rank's compute (the (query, key) pairs its queries see at that step, counted
token by token as the kernel tables' rates are: :func:`~costmodel.schedule.simulator.visible_pairs`; a
packed or windowed plan's, the tiles its branch's kernel runs [Striped §3]; at the rate measured for that
much work with that many ranks busy) against the transfers that overlap it
(α + bytes/B), with the parts nothing can hide: the first block computes before anything arrives,
and in backward the last dK/dV hop goes home after the last step (:func:`ring_layer_time`).
Ulysses: its all-to-alls (Q, K, V in; O out) around local attention over the whole sequence for h/N
heads, none of it overlapped; backward the same exchanges in reverse around the backward's compute.

With a measured profile (one with ``calibration``) the rates, α and B are the measured ones, transfers
hide as much as was measured, and the measured fixed costs are added: per waited transfer in the ring,
per collective after compute in Ulysses, per layer of each kind; the all-to-all's excess past its knee
is added at its measured rate. Without, transfers hide fully and each kernel call
runs at the profile's published rate for its shape (L queries against the keys the block holds, causal
when masked: :func:`costmodel.machines.kernels.attention_rate`), or at peak x ``--efficiency`` when given
or when the profile has no tables; a machine asked as a datasheet (``Machine.as_datasheet``) is the
balanced model of [A-RingCost §4]: peak for every block, no α, the causal half counted as balanced.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from costmodel.core.scalars import largest, total
from costmodel.frameworks.profiles import FUSED_MERGE_BYTES
from costmodel.machines.binding import Machine
from costmodel.plans.bind import call, plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.packing import call_tokens, timed_pairs
from costmodel.schedule.simulator import ROWS_BUDGET, Rows, visible_pairs
from costmodel.symbolic import numeric

if TYPE_CHECKING:
    import numpy as np

Variant = Literal["ring", "ulysses"]
_UNIT = {"S": 1, "N": 1, "b": 1, "c": 1, "d": 1, "h": 1}
BACKWARD_FLOP = float(numeric.bwd_step_flops(**_UNIT) / numeric.step_flops(**_UNIT))  # 2.5, FlashAttention-2


def ring_layer_time(
    step_compute_s: Sequence[float],
    step_comm_s: Sequence[float] | float,
    tail_s: float = 0.0,
    overlap: float = 1.0,
    step_overhead_s: float = 0.0,
    step_waits: Sequence[int] | None = None,
    tail_waits: int = 0,
) -> float:
    """Wall time of a ring layer: step j computes on the block it holds while ``step_comm_s[j]`` is in flight
    (the next KV block; in backward also the step before's dK/dV sums), and step j+1 starts once both are
    done; ``tail_s`` is what nothing hides (backward: the last dK/dV hop home). Each step is the formula
    ``ring_step_s``, the overlap law the step model's ring exposure uses too: at ``overlap`` 1 a step takes
    max(compute, transfer), at 0 their sum. ``step_waits[j]``: transfers step j waits for (default 1 where
    it has one), each costing ``step_overhead_s``; ``tail_waits`` likewise for the tail. The share of SMs a
    transfer takes (``s_comm``) is 0 here: a measured profile's overlap and step overhead were measured
    with it in."""
    steps = [float(t) for t in step_compute_s]
    if not steps:
        raise ValueError("a ring has at least one step")
    if isinstance(step_comm_s, int | float):
        comm = [float(step_comm_s)] * (len(steps) - 1) + [0.0]  # forward: no block follows the last step
    else:
        comm = [float(c) for c in step_comm_s]
    if len(comm) != len(steps):
        raise ValueError("one transfer time per step")
    waits = list(step_waits) if step_waits is not None else [1 if c > 0 else 0 for c in comm]
    if len(steps) ** 2 > ROWS_BUDGET:  # a long ring (the window's): its steps at once, on arrays
        import numpy as np

        busy = numeric.ring_step_s(
            t_cs=np.asarray(steps),
            t_ms=np.asarray(comm),
            o_cp=overlap,
            s_comm=0.0,
            t_launch=np.asarray(waits, dtype=float) * step_overhead_s,
        )
        return float(np.sum(busy)) + tail_s + tail_waits * step_overhead_s
    # a plan's few steps one by one on Python floats, added in numpy's order: the same value, without numpy
    busy = [
        numeric.ring_step_s(t_cs=t, t_ms=c, o_cp=overlap, s_comm=0.0, t_launch=float(w) * step_overhead_s)
        for t, c, w in zip(steps, comm, waits, strict=True)
    ]
    return total(busy) + tail_s + tail_waits * step_overhead_s


@dataclass(frozen=True)
class Prediction:
    forward_s: float
    backward_s: float  # 0 when only the forward was asked for
    compute_s: float  # of which compute (the slowest rank's): total - compute is the exposed communication
    forward_compute_s: float  # the forward's part of compute_s

    def for_pass(self, pass_: str) -> tuple[float, float]:
        """(wall time, compute) of one pass: fwd, bwd, or both."""
        if pass_ == "fwd":
            return self.forward_s, self.forward_compute_s
        if pass_ == "bwd":
            return self.backward_s, self.compute_s - self.forward_compute_s
        return self.total_s, self.compute_s

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def exposed_s(self) -> float:
        return self.total_s - self.compute_s


def _call(name: str, values: dict[str, Any]) -> float:
    return float(call(name, values))


def predict(
    inputs: PlanInputs,
    machine: Machine,
    variant: Variant = "ring",
    backward: bool = False,
    span: int | None = None,
    merge_bytes: float = FUSED_MERGE_BYTES,
) -> Prediction:
    """Predicted seconds of one layer's forward (and backward) on every rank of the CP group.

    ``span``: how many ranks the transfers' group spans, when more than ``inputs.cp`` (the ring of a
    USP split runs over N/N_u ranks spread over all N). ``merge_bytes``: what the ring's merge of each step's
    partial output moves per element (:func:`ring_overhead_s`).
    """
    values = plan_values(inputs, machine)
    if variant == "ulysses":
        a2a = machine.link(span or inputs.cp, "alltoall")
        layer = _ulysses(inputs, machine, {**values, **a2a.values, **a2a.knee_values}, backward)
    else:
        layer = _ring(inputs, machine, span or inputs.cp, backward, merge_bytes)
    if inputs.cp == 1:
        return layer
    forward, backward_extra = machine.layer_overhead(variant, backward, inputs.layout, inputs.causal)
    return Prediction(
        layer.forward_s + forward, layer.backward_s + backward_extra, layer.compute_s, layer.forward_compute_s
    )


def ring_overhead_s(inputs: PlanInputs, machine: Machine, merge_bytes: float = FUSED_MERGE_BYTES) -> float:
    """One pass's work beside a ring's attention kernels, the step model's ``ring_overhead_s``: per step after
    the first, the merge of its partial output into the running one through HBM (``merge_bytes`` an element),
    the queries copied where zigzag shifts the mask, and the step's launches. 0 on a datasheet machine and on
    a measured profile, whose measured step overhead holds them."""
    kernels = machine.profile.kernels
    if machine.datasheet or machine.calibrated or inputs.cp == 1:
        return 0.0
    hbm = machine.profile.device.streaming_bandwidth  # none stated: the merges' traffic is not priced
    values = {
        **plan_values(inputs, machine),
        "t": 1.0,
        "k_merge": merge_bytes if hbm else 0.0,
        "k_copy": 1.0 if hbm and inputs.layout == "zigzag" else 0.0,
        "B_hbm": hbm or 1.0,  # the formula's simplified form takes no infinite bandwidth (inf x 0 launches)
        "t_launch": kernels.ring_step_launch_s if kernels else 0.0,
    }
    return _call("ring_overhead_s", values)


@dataclass(frozen=True)
class RingPass:
    """One pass of a ring layer unfolded: what each rank computes at each step and what is in flight.

    :func:`predict` sums it into a wall time; :mod:`costmodel.plans.gantt` draws it. A small ring's
    schedule is rows of Python floats (:func:`~costmodel.schedule.simulator.visible_pairs`) and its
    per-step figures lists, a large one's numpy arrays: the same numbers either way."""

    pairs: np.ndarray | Rows  # (ranks, steps) (query, key) pairs each rank computes at each step
    calls: Calls  # the distinct kernel calls among them
    call_s: np.ndarray | list[float]  # seconds of each distinct call
    comm_s: list[float]  # the transfer in flight under each step
    step_waits: list[int] | None  # transfers each step waits for (None: one where there is one)
    tail_s: float  # what still travels after the last step (backward: the last dK/dV hop home)
    overlap: float
    step_overhead_s: float

    @functools.cached_property
    def compute_s(self) -> np.ndarray | Rows:
        """(ranks, steps) seconds of each rank's compute at each step."""
        return self.calls.per_rank(self.call_s)

    @functools.cached_property
    def step_compute_s(self) -> np.ndarray | list[float]:
        """The slowest rank's compute per step: what sets each step."""
        return self.calls.slowest(self.call_s)

    @property
    def time_s(self) -> float:
        return ring_layer_time(
            self.step_compute_s,
            self.comm_s,
            tail_s=self.tail_s,
            step_waits=self.step_waits,
            tail_waits=1 if self.tail_s else 0,
            overlap=self.overlap,
            step_overhead_s=self.step_overhead_s,
        )


def ring_pass(
    inputs: PlanInputs,
    machine: Machine,
    backward: bool = False,
    span: int | None = None,
    pairs: np.ndarray | None = None,
) -> RingPass:
    """The forward (or backward) pass of a ring over ``inputs.cp`` ranks on the link ``span`` ranks use;
    ``pairs`` (ranks, steps) replaces the plan's own schedule (another layout of a packed window)."""
    n, length = inputs.cp, inputs.seq // inputs.cp
    values = {**plan_values(inputs, machine), **machine.link(span or n).values}
    kv_s = _call("step_comm_s", values)  # alpha + KV block / B
    dkv_s = (
        values["alpha"]
        + (_call("bwd_step_recv_bytes", values) - _call("kv_block_bytes", values)) / values["B"]
    )
    call = None  # the tokens of one call where packed documents cut blocks into calls
    calls = None
    if pairs is not None:
        pass
    elif machine.datasheet:  # [A-RingCost §4]: every step balanced at c·L² pairs
        pairs = _balanced(n, values["c"] * length * length)
    elif inputs.masked:  # documents, windows, chunks: the branch's tiles ([A-RingCost §5])
        pairs = timed_pairs(inputs, inputs.layout, inputs.packing)
        call = call_tokens(inputs)
    else:  # the pairs each call sees, which the tables' rates are counted over (not the tiles it runs)
        rows = not _numpy_loaded() and n * n <= ROWS_BUDGET
        pairs, calls = _visible(inputs.layout, inputs.seq, n, inputs.causal, rows)
    pair_flops = _call("pair_flops", values)
    factor = BACKWARD_FLOP if backward else 1.0
    full = float(length) * length

    @functools.cache  # a schedule has few distinct blocks; each is one kernel call of L queries
    def seconds(block_pairs: float, diagonal: bool, ranks: int) -> float:
        """One rank's call at one step. The own block (and every striped block) carries the causal diagonal,
        a call of L queries against L keys with the mask; a zigzag half block is a full call against L/2 keys.
        Packed short documents (varlen): the block runs as calls of L_call tokens, at their rate."""
        if block_pairs <= 0:
            return 0.0
        masked = block_pairs < full and (diagonal or inputs.layout == "striped")
        queries, keys = float(length), float(length) if masked else max(block_pairs / length, 1.0)
        flops = call_flops = block_pairs * pair_flops
        if call is not None and call < length:
            queries = keys = call
            call_flops = min(block_pairs, call * call * (0.5 if masked else 1.0)) * pair_flops
        rate = machine.rate(call_flops, masked, backward, ranks, queries, keys, inputs.head_dim)
        return flops * factor / rate

    if calls is None:
        calls = distinct_calls(pairs)
    call_s = [seconds(*call) for call in calls.calls]
    if not isinstance(pairs, tuple):
        import numpy as np

        call_s = np.array(call_s)
    if not backward:
        comm, waits, tail = [kv_s] * (n - 1) + [0.0], None, 0.0
    elif n == 1:
        comm, waits, tail = [0.0], None, 0.0
    else:  # under step j fly the next KV block (j < N-1) and the dK/dV sums of step j-1 (j > 0)
        comm = [kv_s if j == 0 else (dkv_s if j == n - 1 else kv_s + dkv_s) for j in range(n)]
        waits, tail = [1 if j in (0, n - 1) else 2 for j in range(n)], dkv_s
    return RingPass(
        pairs, calls, call_s, comm, waits, tail, machine.overlap, machine.fixed("step_overhead_s")
    )


def _numpy_loaded() -> bool:
    """Python's rows spare a lone plan numpy's import; where numpy is loaded already (a search, recommend's
    window), its arrays are the faster of the two, and give the same times bit for bit."""
    return "numpy" in sys.modules


def _balanced(n: int, pairs: float) -> np.ndarray | Rows:
    """N ranks x N steps of ``pairs`` each: rows of Python floats for a ring of a few ranks, else numpy's."""
    if n * n <= ROWS_BUDGET:
        return ((pairs,) * n,) * n
    import numpy as np

    return np.full((n, n), pairs)


@dataclass(frozen=True)
class Calls:
    """A schedule's distinct kernel calls, each (block pairs, first step, ranks busy at that step); the one
    each rank runs at each step (``index``, ranks x steps) and those some rank runs at each step
    (``at_step``, calls x steps). Of a schedule of rows (:func:`distinct_calls`), ``index`` is rows of ints
    and ``at_step`` None."""

    calls: tuple[tuple[float, bool, int], ...]
    index: np.ndarray | tuple[tuple[int, ...], ...]
    at_step: np.ndarray | None

    def per_rank(self, call_s: np.ndarray | list[float]) -> np.ndarray | Rows:
        """(ranks, steps) seconds, from each distinct call's."""
        if isinstance(self.index, tuple):
            return tuple(tuple(call_s[c] for c in row) for row in self.index)
        return call_s[self.index]

    def slowest(self, call_s: np.ndarray | list[float]) -> np.ndarray | list[float]:
        """The slowest rank's seconds per step, without unfolding every rank."""
        if isinstance(self.index, tuple):
            return [largest([call_s[c] for c in step]) for step in zip(*self.index)]
        import numpy as np

        return np.where(self.at_step, call_s[:, None], -np.inf).max(axis=0)


def distinct_calls(pairs: np.ndarray | Rows) -> Calls:
    """The calls of a (ranks, steps) schedule. It has few distinct ones, so each is timed once for the whole
    pass rather than once per step: the window times passes of up to MAX_CP steps."""
    if isinstance(pairs, tuple):
        return _distinct_calls_of_rows(pairs)
    import numpy as np

    flat = np.sort(pairs, axis=None)  # np.unique's answer, without the numpy.ma it imports (start-up)
    blocks = flat[np.concatenate(([True], flat[1:] != flat[:-1]))]
    which = np.searchsorted(blocks, pairs)  # cheaper than unique's inverse, an argsort of N² entries
    first = np.arange(pairs.shape[1]) == 0
    kinds, kind = np.unique(2 * (pairs > 0).sum(axis=0) + first, return_inverse=True)  # per step
    present = np.zeros((len(blocks), len(kinds)), dtype=bool)
    present[which, kind[None, :]] = True
    number = np.cumsum(present.ravel()).reshape(present.shape) - 1  # row-major, as np.nonzero lists them
    calls = tuple(
        (float(blocks[b]), bool(kinds[k] % 2), int(kinds[k] // 2))
        for b, k in zip(*np.nonzero(present), strict=True)
    )
    index = number[which, kind[None, :]].astype(np.min_scalar_type(len(calls)))
    at_step = np.zeros((len(calls), pairs.shape[1]), dtype=bool)
    at_step[index, np.arange(pairs.shape[1])[None, :]] = True
    index.flags.writeable = at_step.flags.writeable = False
    return Calls(calls, index, at_step)


def _distinct_calls_of_rows(rows: Rows) -> Calls:
    """:func:`distinct_calls` of rows of Python floats, the same calls in the same order: by block pairs,
    then by the step's kind (2 x ranks busy, + 1 at the first step)."""
    blocks = {pairs: b for b, pairs in enumerate(sorted(set(itertools.chain.from_iterable(rows))))}
    step_kinds = [2 * sum(pairs > 0 for pairs in step) + (j == 0) for j, step in enumerate(zip(*rows))]
    kinds = {kind: k for k, kind in enumerate(sorted(set(step_kinds)))}
    keys = [[(blocks[pairs], kinds[step_kinds[j]]) for j, pairs in enumerate(row)] for row in rows]
    present = sorted(set(itertools.chain.from_iterable(keys)))
    number = {key: c for c, key in enumerate(present)}
    by_block, by_kind = list(blocks), list(kinds)
    calls = tuple((float(by_block[b]), bool(by_kind[k] % 2), by_kind[k] // 2) for b, k in present)
    return Calls(calls, tuple(tuple(number[key] for key in row) for row in keys), None)


@functools.lru_cache(maxsize=64)  # both passes, every scheme and every fix share one
def _visible(layout: str, seq: int, n: int, causal: bool, rows: bool) -> tuple[np.ndarray | Rows, Calls]:
    pairs = visible_pairs(layout, seq, n, causal, rows)
    if not rows:
        pairs.flags.writeable = False  # type: ignore[union-attr]
    return pairs, distinct_calls(pairs)


def _ring(inputs: PlanInputs, machine: Machine, span: int, backward: bool, merge_bytes: float) -> Prediction:
    # the merges and launches beside the kernels are device work each pass: compute, not exposed transfer
    beside = ring_overhead_s(inputs, machine, merge_bytes)
    forward = ring_pass(inputs, machine, False, span)
    forward_compute = total(forward.step_compute_s) + beside
    if not backward:
        return Prediction(forward.time_s + beside, 0.0, forward_compute, forward_compute)
    back = ring_pass(inputs, machine, True, span)
    return Prediction(
        forward.time_s + beside,
        back.time_s + beside,
        forward_compute + total(back.step_compute_s) + beside,
        forward_compute,
    )


def _ulysses(inputs: PlanInputs, machine: Machine, values: dict[str, Any], backward: bool) -> Prediction:
    seq, n = inputs.seq, inputs.cp
    exchanges = (
        (
            _call("ulysses_comm_s", values)
            + _call("alltoall_excess_s", values)
            + machine.fixed("sync_overhead_s")
        )
        if n > 1
        else 0.0
    )
    pairs = seq * (seq + 1) / 2 if inputs.causal else float(seq) * seq
    if (machine.datasheet and inputs.causal) or inputs.masked:
        pairs = values["c"] * seq * seq
    flops = pairs * _call("pair_flops", {**values, "h": inputs.heads // n})
    shape = (seq, seq, inputs.head_dim)  # every rank attends its h/N heads over the whole sequence
    forward_compute = flops / machine.rate(flops, inputs.causal, False, n, *shape)
    if not backward:
        return Prediction(exchanges + forward_compute, 0.0, forward_compute, forward_compute)
    backward_compute = BACKWARD_FLOP * flops / machine.rate(flops, inputs.causal, True, n, *shape)
    return Prediction(
        exchanges + forward_compute,
        exchanges + backward_compute,
        forward_compute + backward_compute,
        forward_compute,
    )
