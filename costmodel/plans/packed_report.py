"""The report's ``packing`` and ``mask`` sections ([A-RingCost §5]): both branches of a packed window, the
layouts under the mask, the long-tail lock, and what a sliding window leaves to skip.

Dense branch: the kernel blanks the document mask's scores but computes the causal window's tiles, so
compute, intensity and the layer time are the unpacked ones; what packing changes is where the useful
work lies (``balance``). Varlen branch: the kernel skips masked tiles, so compute falls with
Σ over documents while the KV blocks still travel whole: intensity falls and steps with little work
wait on their transfer. Every count comes from the simulator (:mod:`costmodel.schedule.packed`), every
formula from :mod:`costmodel.symbolic.formulas`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.machines.binding import Machine
from costmodel.plans.bind import Evaluator
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.packing import (
    BRANCHES,
    RULE,
    Branch,
    compute_fraction,
    packed_of,
    schedule_for,
    timed_pairs,
    useful_rule,
)
from costmodel.plans.schema import (
    LayerType,
    LongTail,
    MaskSection,
    PackedLayoutRow,
    Packing,
    PackingBranch,
)
from costmodel.plans.timing import ring_pass
from costmodel.plans.verdict import band
from costmodel.schedule.layouts import LAYOUTS, chunks_per_rank
from costmodel.schedule.packed import DOC_LAYOUTS, PACKED_LAYOUTS, Placement

if TYPE_CHECKING:
    import numpy as np


def useful_pairs(inputs: PlanInputs) -> float:
    """(query, key) pairs the full mask leaves visible in the window."""
    return useful_rule(inputs.causal, packed_of(inputs), inputs.window, inputs.attention_chunk).useful_pairs(
        inputs.seq
    )


def feasible(layout: str, inputs: PlanInputs) -> bool:
    """Window-level layouts need S to split evenly; per-document ones split every document as it comes."""
    return layout in DOC_LAYOUTS or inputs.seq % (inputs.cp * chunks_per_rank(layout)) == 0


def utilization(inputs: PlanInputs, layout: str, branch: Branch) -> float:
    """Useful pairs over N x the slowest rank's executed pairs summed over steps ([Striped §3])."""
    executed = schedule_for(inputs, layout, branch).step_pairs.sum()
    return useful_pairs(inputs) / (inputs.cp * float(executed)) if executed else 0.0


def masked_utilization(inputs: PlanInputs) -> dict[str, float | None]:
    """``causal.utilization`` under the plan's mask and branch, for the window-level layouts."""
    return {
        layout: utilization(inputs, layout, inputs.packing) if feasible(layout, inputs) else None
        for layout in LAYOUTS
    }


def _branch(ev: Evaluator, inputs: PlanInputs, branch: Branch, useful_flops: float) -> PackingBranch:
    c = 0.5 if inputs.causal else 1.0
    c_x = compute_fraction(inputs, branch=branch)
    ratio = float(ev("comm_ratio_step", c=c_x))
    executed = float(ev("total_flops", c=c_x))
    return PackingBranch(
        executed_flops=executed,
        device_flops_per_layer=float(ev("device_flops_per_layer", c=c_x)),
        executed_share=c_x / c,
        useful_share=useful_flops / executed if executed else 0.0,
        compute_fraction=c_x,
        intensity_step=float(ev("intensity_step", c=c_x)),
        comm_ratio_step=ratio,
        verdict=band(ratio).verdict,
    )


def _rank_useful_pairs(inputs: PlanInputs, layout: str) -> np.ndarray:
    """Visible pairs of every rank's queries: per query, the length of its visible range."""
    import numpy as np

    rule = useful_rule(inputs.causal, packed_of(inputs), inputs.window, inputs.attention_chunk)
    placement = Placement(layout, inputs.seq, inputs.cp, rule.cu_seqlens)
    ordered, starts = placement.positions()
    first, last = rule.visible_range(ordered)
    seen = np.maximum(np.minimum(last, inputs.seq - 1) - first + 1, 0).astype(float)
    total = np.r_[0.0, np.cumsum(seen)]
    return np.diff(total[starts])


def _layout_row(ev: Evaluator, inputs: PlanInputs, machine: Machine, layout: str) -> PackedLayoutRow:
    import numpy as np

    if not feasible(layout, inputs):
        return PackedLayoutRow(layout=layout, feasible=False, **dict.fromkeys(_ROW_NUMBERS))
    n, pair_flops = inputs.cp, float(ev("pair_flops"))
    varlen = schedule_for(inputs, layout, "varlen").rank_step_pairs
    pairs = schedule_for(inputs, layout, inputs.packing).rank_step_pairs
    timed = inputs.model_copy(update={"layout": layout}) if layout in LAYOUTS else inputs
    forward = ring_pass(timed, machine, pairs=np.asarray(timed_pairs(inputs, layout, inputs.packing)))
    slowest = forward.step_compute_s
    comm = forward.comm_s
    slowest_varlen = varlen.max(axis=0).sum()
    return PackedLayoutRow(
        layout=layout,
        feasible=True,
        utilization_dense=utilization(inputs, layout, "dense"),
        utilization_varlen=utilization(inputs, layout, "varlen"),
        balance=float(varlen.mean(axis=0).sum() / slowest_varlen) if slowest_varlen else None,
        rank_executed_flops=(pairs.sum(axis=1) * pair_flops).tolist(),
        rank_useful_flops=(_rank_useful_pairs(inputs, layout) * pair_flops).tolist(),
        step_slowest_s=slowest.tolist(),
        step_comm_s=comm[0] if n > 1 else 0.0,
        waiting_steps=int(sum(1 for j in range(n - 1) if slowest[j] < comm[j])),
        idle_steps=int((pairs.max(axis=0) == 0).sum()),
        exposed_s=_exposed(forward.time_s, float(slowest.sum())),
        layer_time_s=forward.time_s,
    )


def _exposed(time_s: float, compute_s: float) -> float:
    """Wall time past compute; float noise of a fully hidden ring reads as 0."""
    exposed = time_s - compute_s
    return exposed if exposed > 1e-9 * time_s else 0.0


_ROW_NUMBERS = [name for name in PackedLayoutRow.model_fields if name not in ("layout", "feasible")]


def _long_tail(ev: Evaluator, inputs: PlanInputs) -> LongTail:
    packed = packed_of(inputs)
    assert packed is not None
    longest, rest = max(packed.lengths), packed.longest_other
    window_tokens = sum(packed.window_docs)
    values = {"l_max": float(longest), "l_rest": float(max(rest, 1)), "T_w": float(window_tokens)}
    share = float(ev("dynamic_cp_recv_share", **values)) if inputs.cp > 1 else None
    return LongTail(
        longest_doc_tokens=longest,
        rest_longest_doc_tokens=rest,
        n_longest=int(ev("doc_cp_degree", **values)),
        n_rest=int(ev("rest_cp_degree", **values)) if rest else 0,
        dynamic_recv_share=share,
        dynamic_recv_bytes_saved_per_layer=(1 - share) * float(ev("recv_bytes_per_layer"))
        if share is not None
        else None,
    )


def packing_section(ev: Evaluator, inputs: PlanInputs, machine: Machine) -> Packing | None:
    packed = packed_of(inputs)
    if packed is None:
        return None
    useful_flops = useful_pairs(inputs) * float(ev("pair_flops"))
    return Packing(
        source=packed.source,
        rule=RULE,
        documents=len(packed.lengths),
        tokens=sum(packed.lengths),
        windows=len(packed.windows),
        window=packed.window,
        window_documents=len(packed.window_docs),
        window_tokens=sum(packed.window_docs),
        branch=inputs.packing,
        useful_flops=useful_flops,
        **{branch: _branch(ev, inputs, branch, useful_flops) for branch in BRANCHES},
        layouts=[_layout_row(ev, inputs, machine, layout) for layout in PACKED_LAYOUTS],
        long_tail=_long_tail(ev, inputs),
    )


def _idle_steps(inputs: PlanInputs) -> int:
    return int((schedule_for(inputs, inputs.layout, inputs.packing).step_pairs == 0).sum())


def _layer_type(ev: Evaluator, inputs: PlanInputs, kind: str) -> LayerType:
    c_x = compute_fraction(inputs)
    ratio = float(ev("comm_ratio_step", c=c_x))
    return LayerType(
        kind=kind,
        compute_fraction=c_x,
        comm_ratio_step=ratio,
        verdict=band(ratio).verdict,
        n_max=float(ev("n_max", c=c_x)),
        skippable_steps=_idle_steps(inputs) if inputs.masked else 0,
    )


def mask_section(ev: Evaluator, inputs: PlanInputs) -> MaskSection | None:
    if not inputs.masked:
        return None
    types = []
    if inputs.window is not None or inputs.attention_chunk is not None:
        global_layer = inputs.model_copy(update={"window": None, "attention_chunk": None})
        types = [_layer_type(ev, global_layer, "global"), _layer_type(ev, inputs, "local")]
    return MaskSection(
        causal=inputs.causal,
        documents=inputs.docs is not None,
        window=inputs.window,
        chunk=inputs.attention_chunk,
        skippable_steps=_idle_steps(inputs),
        layer_types=types,
    )
