"""What every CP scheme gives: :class:`Scheme`, and the single-layer comparison's row, :class:`SchemeResult`.

A scheme is data: the registry (:mod:`costmodel.plans.cp`) lists one per module, and the step, the search,
serving, ``recommend``, the exports and the reports ask it instead of naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from costmodel.plans.bind import PASSES, Evaluator
from costmodel.plans.verdict import band
from costmodel.schedule.layouts import chunks_per_rank

if TYPE_CHECKING:
    from costmodel.machines.binding import Machine
    from costmodel.machines.topology import Collective
    from costmodel.plans.inputs import PlanInputs

TRAINING, PREFILL = "training", "prefill"
# A kernel call of one layer: (queries, keys, causal, how many such calls per layer)
Call = tuple[float, float, bool, float]
_LAYER_COMM = {"fwd": "layer_comm_s", "bwd": "bwd_layer_comm_s"}
_LAYER_BYTES = {"fwd": "recv_bytes_per_layer", "bwd": "bwd_recv_bytes_per_layer"}


def _always_runs(heads: int, kv_heads: int, n: int, split_kv: bool) -> str | None:
    return None


def _no_all_to_all(kv_heads: int, n: int) -> int:
    return 1


@dataclass(frozen=True)
class Scheme:
    """One way to split attention over a CP group of N ranks, and what each command asks of it."""

    name: str  # the identifier: flags, plan files, JSON
    label: str  # for display
    summary: Mapping[str, str]  # phase -> what it does there, for the flag's help ("" where the name says it)
    rank: int  # among equals the simpler first: in the comparison's ranking and the search's order
    phases: frozenset[str]  # TRAINING (the step, the search), PREFILL (serving a prompt)
    collective: Collective = "p2p"  # what the CP group waits on (Machine.link)
    ring: bool = False  # passes blocks round a ring: ring overheads, a zigzag shard's copies
    whole_sequence: bool = False  # a rank attends the whole sequence for its heads: no layout enters
    hybrid: bool = False  # all-to-all inside, ring across: its split N_u x N_r is named
    latency_per_step: bool = False  # a collective of N - 1 ring steps, each paying the link's latency
    layouts: tuple[str, ...] = ()  # the layouts the search tries with it
    # framework -> the value that selects it there (Megatron-LM's --cp-comm-type, torchtitan's
    # context_parallel_rotate_method); also how a log's setting is read back
    exports: Mapping[str, str] = field(default_factory=dict)
    megatron_extra: Callable[[Mapping[str, Any]], list[str]] = lambda plan: []
    # (heads, KV heads a TP rank holds, N, whether the KV heads must split too) -> why it cannot run
    check: Callable[[int, int, int, bool], str | None] = _always_runs
    a2a_degree: Callable[[int, int], int] = _no_all_to_all  # N_u at (KV heads a TP rank holds, N)
    # the training step: the forward, backward and ring-overhead time a layer leaves exposed (x_CP_f, x_CP_b,
    # x_CP_r) from the bound symbols, and the attention kernel calls at (S, N, N_r, layout), N > 1
    exposure: Callable[[Mapping[str, Any]], tuple[Any, Any, Any]] | None = None
    attention_calls: Callable[[int, int, int, str], list[Call]] | None = None
    # the training step's memory: the scheme's buffers at the peak, from the bound symbols (N > 1)
    buffers: Callable[[Mapping[str, Any]], Any] | None = None
    # the single-layer comparison (`cp-plan`, recommend): its rows at (inputs, machine, pass)
    layer: Callable[[PlanInputs, Machine, str], list[SchemeResult]] | None = None
    # prefill: the formulas of the exposed transfers, the bytes per step, and what a ring step adds
    prefill_exposed: str | None = None
    prefill_bytes: str | None = None
    prefill_extra: str | None = None
    describe: Callable[[str | None, int, int | None], str] = lambda layout, n, n_u: ""

    def serves(self, phase: str) -> bool:
        return phase in self.phases

    def split_label(self, n_ulysses: int | None, n_ring: int | None) -> str:
        """``USP 2x4`` for a hybrid, else the label."""
        return f"{self.label} {n_ulysses}x{n_ring}" if self.hybrid else self.label

    def megatron_args(self, plan: Mapping[str, Any]) -> list[str]:
        return ["--cp-comm-type", self.exports["megatron"], *self.megatron_extra(plan)]


@dataclass(frozen=True)
class SchemeResult:
    """One way to split attention over N devices, in the single-layer comparison."""

    scheme: str  # a registered scheme's name
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
    def recv_bytes(self) -> float | None:
        return None if not self.feasible else (self.a2a_recv_bytes or 0.0) + (self.ring_recv_bytes or 0.0)

    @property
    def comm_s(self) -> float | None:
        return None if not self.feasible else (self.a2a_comm_s or 0.0) + (self.ring_comm_s or 0.0)

    @property
    def verdict(self) -> str | None:
        return band(self.ratio).verdict if self.ratio is not None else None


def ring_layout(inputs: PlanInputs, n: int) -> str:
    """The ring layout to compare: the plan's when S splits for it, else contiguous."""
    return inputs.layout if inputs.seq % (n * chunks_per_rank(inputs.layout)) == 0 else "contiguous"


def pass_sum(ev: Evaluator, names: dict[str, str], pass_: str, **over: float) -> float:
    return sum(float(ev(names[phase], **over)) for phase in PASSES[pass_])


def ring_traffic(ev: Evaluator, pass_: str) -> tuple[float, float]:
    """(bytes received, receive time) of a ring layer for the pass: KV blocks, and in backward dK/dV too."""
    return pass_sum(ev, _LAYER_BYTES, pass_), pass_sum(ev, _LAYER_COMM, pass_)
