"""What the inference model predicts for the reference kernel's inference runs, which `cp-plan validate`
times: one attention layer of a pass-KV or pass-Q prefill after a cached prefix, or of one decode step.

Each prediction is `cp-plan infer`'s own (:mod:`costmodel.inference.serve`) for a model of one attention
layer and no weights: a prefill costs its attention, the scheme's exposed ring and the ring's overheads,
as a chunk's layer does; a decode step costs tpot_s, which without weights is max(KV read, attention) plus
the merge of (O, LSE). Rates, α, B, the overlap and the per-step cost come through the machine binding:
the measured ones on a calibrated profile, peak and no α when it is asked as a datasheet.
"""

from __future__ import annotations

from typing import Any

from costmodel.inference.serve import (
    attention_bind,
    decode_attention_rate,
    decode_values,
    prefill_attention,
)
from costmodel.inference.setup import InferenceSetup
from costmodel.machines.binding import Machine
from costmodel.plans import cp as registry
from costmodel.plans.bind import DIRECT_ATTENTION, call
from costmodel.plans.cp import PREFILL
from costmodel.plans.inputs import PlanInputs

# The inference formulas each run's prediction is made of (JSON rows name them): a ring prefill's are its
# scheme's (the kernel runs the ring schemes), decode's the step's.
FORMULAS = {
    **{
        s.name: (
            "prefill_attn_s",
            s.prefill_exposed,
            "ring_overhead_s",
            *([s.prefill_extra] if s.prefill_extra else []),
            "inference_layer_fixed_s",
        )
        for s in registry.schemes(PREFILL)
        if s.ring
    },
    "decode": ("tpot_s",),
}
# One attention layer and nothing else: no weights to read or multiply.
_NO_WEIGHTS = {"H": 0, "F_ffn": 0, "V": 0, "n_L": 1, "n_first": 1, "n_mid": 0, "n_last": 1, "g": 0, "e_m": 1}
_NO_WEIGHTS |= DIRECT_ATTENTION


def _values(inputs: PlanInputs, machine: Machine, new_tokens: int, cached_tokens: int) -> dict[str, Any]:
    n = inputs.cp
    setup = InferenceSetup(
        prompt=new_tokens,
        cached=cached_tokens,
        cp=n,
        cp_overlap=machine.overlap,
        comm_latency=machine.link(n).latency_s,  # measured (0 on a datasheet), never infer's stated default
    )
    values = attention_bind(inputs, setup, machine)
    p = values["p"]
    # the kernel caches K, V in the attention dtype; its all-to-alls pay their own measured latency
    return {**values, **_NO_WEIGHTS, "p_w": p, "p_kv": p, "alpha_cpa": machine.link(n, "alltoall").latency_s}


def predict_run(
    inputs: PlanInputs, machine: Machine, scheme: str, new_per_rank: int, cached_per_rank: int
) -> float:
    """Seconds of one inference attention layer on ``inputs.cp`` ranks at the shape of ``inputs``.

    pass-kv, pass-q: ``new_per_rank`` new tokens on each rank (load-balanced), each rank holding
    ``cached_per_rank`` cached tokens; decode: ``new_per_rank`` new tokens per sequence (the same on every
    rank) against a cache of ``cached_per_rank`` tokens on each rank."""
    if scheme not in FORMULAS:
        raise ValueError(f"scheme {scheme!r}: expected one of {', '.join(FORMULAS)}")
    n = inputs.cp
    cached = cached_per_rank * n
    if scheme == "decode":
        values = _values(inputs, machine, new_per_rank, cached)
        rate = decode_attention_rate(machine, values, cached)
        # No weights, so the matrix-multiply rate cancels; any finite one will do.
        step = decode_values(values, cached, 0, machine.effective_flops, rate, machine)
        return float(call("tpot_s", step))
    new = new_per_rank * n
    values = {**_values(inputs, machine, new, cached), "T_n": new, "K_c": cached}
    parts = prefill_attention(values, scheme, machine)
    return sum(seconds for name, seconds in parts.items() if not name.startswith("_"))
