"""Binding a plan to the formulas: the base symbols' values, and a recorder of evaluated formulas.

The one place that says which input is which symbol, in layers every binder composes: the attention's
shape (:func:`attention_shape`), the model's layer shape (:func:`layer_shape`) and the layout's degrees
(:func:`layout_degrees`). The single-layer plan adds the link and rates (:func:`plan_values`); the memory
fit (``training.recommend.training_values``), the step (``training.step.bind``) and serving
(``inference.serve.bind``) each add only what is theirs. The machine binding is the one place that says
which link and rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.machines.binding import Machine
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.models import ModelPreset
from costmodel.plans.packing import compute_fraction
from costmodel.symbolic import numeric

ACCUMULATOR_BYTES = 4  # fp32 (m, l, O) of the online softmax [OnlineSoftmax]


@dataclass
class Evaluation:
    """One formula evaluated: what ``--explain`` prints."""

    name: str
    args: dict[str, Any]
    value: Any


@dataclass
class Evaluator:
    """Calls generated formulas with the plan's values, overridable per call, and records each call.

    A symbol that stands for a formula's value (``numeric.BINDS``: ``t_lay`` for ``layer_time_s``) and is not
    among the values is that formula, evaluated first (once, where no call overrides a value)."""

    values: dict[str, Any]
    trace: list[Evaluation] | None = field(default=None)
    _bound: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    def __call__(self, name: str, **overrides: Any) -> Any:
        args = {a: overrides[a] if a in overrides else self._value(a, overrides) for a in numeric.ARGS[name]}
        value = call(name, args)
        if self.trace is not None:
            self.trace.append(Evaluation(name, args, value))
        return value

    def _value(self, symbol: str, overrides: dict[str, Any]) -> Any:
        if symbol in self.values or symbol not in numeric.BINDS:
            return self.values.get(symbol)
        if overrides:
            return self(numeric.BINDS[symbol], **overrides)
        if symbol not in self._bound:
            self._bound[symbol] = self(numeric.BINDS[symbol])
        return self._bound[symbol]


def call(name: str, values: Mapping[str, Any]) -> Any:
    """The generated formula ``name`` at ``values`` (numbers, or arrays over a grid or a search), unrecorded:
    what an :class:`Evaluator` runs for each call, for the hot loops that need no trace."""
    return getattr(numeric, name)(**{a: values.get(a) for a in numeric.ARGS[name]})


def attention_shape(inputs: PlanInputs, n: int, batch: int | None = None) -> dict[str, int]:
    """The attention's shape at CP degree ``n``: sequence, batch (default the plan's), the plan's heads and
    head size, and the bytes of an element and of the softmax accumulator; a model's layer shape
    (:func:`layer_shape`) replaces the heads where a preset is given."""
    return {
        "S": inputs.seq,
        "N": n,
        "b": inputs.batch if batch is None else batch,
        "h": inputs.heads,
        "n_kv": inputs.kv_heads,
        "d": inputs.head_dim,
        "p": inputs.bytes_per_element,
        "p_acc": ACCUMULATOR_BYTES,
    }


def layer_shape(model: ModelPreset) -> dict[str, int]:
    """The model's layer shape: heads, hidden and FFN widths, vocabulary, layers, the gated MLP, the
    embedding matrices (one when input and output share it) and latent attention's projections."""
    mla = model.mla
    return {
        "h": model.heads,
        "n_kv": model.kv_heads,
        "d": model.head_dim,
        "H": model.hidden,
        "F_ffn": model.ffn_hidden,
        "V": model.vocab,
        "n_L": model.layers,
        "g": int(model.gated_mlp),
        "e_m": 1 if model.tied_embeddings else 2,
        **(DIRECT_ATTENTION if mla is None else latent_attention(mla)),
    }


# Latent attention's symbols where Q, K and V are projected directly (m_la = 0: the rest is unused).
DIRECT_ATTENTION = {"m_la": 0, "c_q": 0, "r_q": 0, "r_kv": 0, "d_qk": 0, "d_r": 0, "d_v": 0}


def latent_attention(mla: Any) -> dict[str, int]:
    """Multi-head latent attention's projections (a :class:`~costmodel.plans.models.LatentAttention`)."""
    return {
        "m_la": 1,
        "c_q": int(mla.q_lora_rank is not None),
        "r_q": mla.q_lora_rank or 0,
        "r_kv": mla.kv_lora_rank,
        "d_qk": mla.qk_head_dim,
        "d_r": mla.qk_rope_head_dim,
        "d_v": mla.v_head_dim,
    }


def layout_degrees(tp: int, pp: int, stages: Mapping[str, Any]) -> dict[str, Any]:
    """The layout's TP and PP degrees and the layers of its stages (the most loaded one's)."""
    return {"t": tp, "pp": pp, **stages}


def overlaps(machine: Machine, tp: int, tp_comm_overlap: bool, cp_overlap: float) -> dict[str, float]:
    """What hides communication behind compute, in training and serving alike: the TP collectives' hidden
    share (all of it but the first chunk's when they overlap the multiplies), the CP ring's stated share,
    and the compute's slowdown while a collective shares the device."""
    kernels = machine.profile.kernels
    return {
        "o_tp": float(numeric.tp_overlap_share(k_tp=tp if tp_comm_overlap else 1)),
        "o_cp": cp_overlap,
        "s_comm": kernels.comm_sm_slowdown if kernels else 0.0,
    }


def counts(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every number as a float, for binders that meet arrays (sweeps, searches): products of
    large shapes stay exact to 2^53 and never wrap around as int64 would."""
    return {name: float(value) for name, value in values.items()}


def plan_values(inputs: PlanInputs, machine: Machine, n: int | None = None) -> dict[str, Any]:
    """The base symbols' values for a plan at CP degree ``n`` (default the plan's), on the link a ring
    over n ranks waits on; counts are floats (:func:`counts`)."""
    n = inputs.cp if n is None else n
    return {
        **counts(attention_shape(inputs, n)),
        "s_blk": float(inputs.block),
        "c": compute_fraction(inputs, n),  # packed or windowed: the share the kernel executes
        "F": machine.effective_flops,
        "F_peak": machine.peak_flops,
        "eta": 1.0 if inputs.efficiency is None else inputs.efficiency,
        **machine.link(n).values,
    }


PASSES = {"fwd": ("fwd",), "bwd": ("bwd",), "fwd+bwd": ("fwd", "bwd")}
# The backward's formulas are the forward's names with this prefix (formula group "backward").
PHASE_PREFIX = {"fwd": "", "bwd": "bwd_"}
RATIO = {phase: f"{prefix}comm_ratio_step" for phase, prefix in PHASE_PREFIX.items()}


def pass_ratio(ev: Evaluator, pass_: str, **overrides: Any) -> float:
    """The step comm ratio of a pass; for fwd+bwd the worse one, since every step must hide its transfer."""
    return max(float(ev(RATIO[phase], **overrides)) for phase in PASSES[pass_])
