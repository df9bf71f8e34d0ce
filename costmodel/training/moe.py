"""Mixture-of-experts layers in the training step: active FLOP, the EP all-to-all, the routing imbalance.

An MoE model's MLP is ``experts`` FFNs of ``ffn_hidden`` each (plus any shared expert), of which every
token runs ``experts_per_token``. The step's dense formulas then read the active width (formula
``moe_active_ffn``); this module adds what the dense layer does not have, each a formula of the "moe"
group: the dispatch and combine all-to-alls over the expert-parallel group (``moe_alltoall_s``), and
the time the most loaded expert rank computes beyond the balanced share at a stated capacity factor
(``moe_imbalance_s``) — routing imbalance on top of the causal imbalance CP already balances.

What counts parameters or memory counts every expert: each such dense formula has an MoE twin
(:data:`TWINS`) that splits the model into its dense part and its experts, n_E/E_p per rank. The step
(gradient reduction, buckets, ZeRO-3 gathers), the memory fit of ``recommend`` and the layout search call
the twin for an MoE model, at one expert's width.

Expert parallelism is carved out of data parallelism, as in Megatron-LM: EP ranks hold different
experts and the same dense weights. In the rank order EP sits inside DP (``tp-cp-ep-dp-pp`` unless
``--rank-order`` places ``ep`` elsewhere), so on a fast domain it competes with CP for the NVLink or
xGMI ranks: CP x EP ranks beyond the domain put one of the two on the slower fabric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from costmodel.machines.binding import Machine
from costmodel.plans.bind import call
from costmodel.plans.job import CAPACITY_FACTOR
from costmodel.plans.models import ModelPreset
from costmodel.symbolic import numeric

# Formulas counting parameters or memory, and their twins counting every expert of an MoE model.
TWINS = {
    "params": "moe_params",
    "device_params": "moe_device_params",
    "dp_exposed_s": "moe_dp_exposed_s",
    "dp_overflow_s": "moe_dp_overflow_s",
    "zero3_gather_s": "moe_zero3_gather_s",
    "weight_bytes": "moe_weight_bytes",
    "gradient_bytes": "moe_gradient_bytes",
    "optimizer_state_bytes": "moe_optimizer_state_bytes",
    "optimizer_step_bytes": "moe_optimizer_step_bytes",
    "model_state_bytes": "moe_model_state_bytes",
    "fsdp_buffer_bytes": "moe_fsdp_buffer_bytes",
    "fsdp_backward_end_bytes": "moe_fsdp_backward_end_bytes",
    "activation_bytes": "moe_activation_bytes",
    "allocated_memory_bytes": "moe_allocated_memory_bytes",
    "reserved_memory_bytes": "moe_reserved_memory_bytes",
    "training_memory_bytes": "moe_training_memory_bytes",
    "n_min_memory": "moe_n_min_memory",
}


def values(model: ModelPreset, ep: int = 1, capacity_factor: float = CAPACITY_FACTOR) -> dict[str, Any]:
    """The "moe" group's symbols; a dense model gets one expert of its FFN, no EP, no imbalance."""
    return {
        "n_E": model.experts or 1,
        "k_E": model.experts_per_token or 1,
        "F_sh": model.shared_expert_ffn or 0,
        "n_dn": model.dense_layers,
        "F_dn": model.dense_ffn or 0,
        "E_p": ep,
        "C_f": capacity_factor if model.experts else 1.0,
    }


def twin(name: str, v: Mapping[str, Any]) -> str:
    """The formula to call for ``name`` at values ``v``: its MoE twin when they describe routed experts."""
    return TWINS[name] if v.get("n_E", 1) > 1 else name


def counted(name: str, v: Mapping[str, Any], model: ModelPreset) -> Any:
    """A dense formula of the step that counts parameters, with every expert counted: ``v`` binds F_ffn to the
    active width, the twin reads one expert's."""
    chosen = twin(name, v)
    return call(chosen, v if chosen == name else {**v, "F_ffn": model.ffn_hidden})


def active_ffn(model: ModelPreset) -> float:
    """The FFN width a token computes through (``moe_active_ffn``); the dense width for a dense model."""
    if not model.experts:
        return model.ffn_hidden
    return float(
        numeric.moe_active_ffn(
            k_E=model.experts_per_token, F_ffn=model.ffn_hidden, F_sh=model.shared_expert_ffn or 0
        )
    )


def per_layer(v: Mapping[str, Any], expert_ffn: int) -> tuple[Any, Any]:
    """(all-to-all, imbalance) seconds of one MoE layer's forward on one micro-batch; 0 for a dense model."""
    if v["n_E"] == 1:
        return 0.0, 0.0
    moe = {**v, "F_ffn": expert_ffn}
    a2a = np.where(np.asarray(v["E_p"]) > 1, call("moe_alltoall_s", moe), 0.0)
    return a2a, call("moe_imbalance_s", moe)


def optimizer_s(v: Mapping[str, Any], model: ModelPreset) -> Any:
    """The optimizer step: the dense formula for a dense model; for an MoE model its non-expert weights (and
    any shared expert) sharded over DP, plus its experts sharded over the D/E_p ranks holding the same ones."""
    if not model.experts:
        return call("optimizer_s", v)
    dense = call("optimizer_s", {**v, "F_ffn": model.shared_expert_ffn or 0})
    return dense + call("moe_optimizer_s", {**v, "F_ffn": model.ffn_hidden})


def summary(
    model: ModelPreset, v: dict[str, Any], machine: Machine, order: str, sizes: dict[str, int]
) -> dict:
    """What the step states about the MoE layers: routing, EP placement and the expert weights a device holds."""
    if not model.experts:
        return {}
    expert = {**v, "F_ffn": model.ffn_hidden}
    params = float(call("moe_device_expert_params", expert))  # a Piecewise evaluates to a 0-d array
    link = machine.group_links(order, sizes, {"ep": "alltoall"}).get("ep")
    return {
        "params": float(call("moe_params", expert)),
        "params_per_device": float(call("moe_device_params", expert)),
        "experts": model.experts,
        "experts_per_token": model.experts_per_token,
        "shared_expert_ffn": model.shared_expert_ffn,
        "ep": v["E_p"],
        "capacity_factor": v["C_f"],
        "active_ffn": active_ffn(model),
        "expert_params_per_device": params,
        "expert_weight_bytes_per_device": params * v["p"],
        "ep_scope": link.scope if link and v["E_p"] > 1 else "none",
        "ep_bandwidth": link.bandwidth if link and v["E_p"] > 1 else None,
    }
