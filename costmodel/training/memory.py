"""Memory per device of a training job: what its most loaded pipeline stage holds at the peak.

The one memory model of training: `step`, `recommend`, `check`, the layout search and the report read it.
Every quantity is a formula of the "fit" group (:mod:`costmodel.symbolic.formulas`); this module binds a
:class:`~costmodel.plans.job.Job` to them: the shapes, what a device keeps (sequence parallel, dropout, stored
scores, recompute, the ZeRO shares), the pipeline's micro-batches in flight, offload and the experts.
"""

from __future__ import annotations

from typing import Any

from costmodel.plans.bind import Evaluator, counts, layer_shape, layout_degrees, plan_values
from costmodel.plans.job import Job
from costmodel.plans.schema import Fit
from costmodel.training import moe, offload


def zero_fractions(stage: int, group: Any) -> tuple[Any, Any, Any]:
    """Fractions of (weights, gradients, optimizer states) one device keeps under a ZeRO stage over ``group``
    ranks [ZeRO §5]; a number, or an array over many plans."""
    shard = 1 / group
    return (shard if stage >= 3 else 1.0, shard if stage >= 2 else 1.0, shard if stage >= 1 else 1.0)


def kept(job: Job) -> dict[str, Any]:
    """What a device keeps, as the memory fit and the step's offload copies read it: the activations a layer
    keeps (sequence parallel, dropout, stored scores, full recompute) and the ZeRO shares of the weights,
    gradients and optimizer states over DP x CP."""
    setup = job.setup
    z_w, z_g, z_o = zero_fractions(setup.zero, setup.shard_group)
    return {
        "sigma": int(setup.sp),
        "delta": int(job.model.dropout),
        # Scores are kept for backward only by an attention that materialises them and is not recomputed.
        "phi": int(setup.stores_scores),
        "rho": int(setup.recompute == "full"),
        "z_w": z_w,
        "z_g": z_g,
        "z_o": z_o,
    }


def training_values(job: Job, n: int | None = None) -> dict[str, Any]:
    """Every symbol the memory formulas need, at CP degree ``n`` (default the job's): the whole model's
    heads (the formulas divide by t themselves). The pipeline's micro-batches default to its stages when
    the job states no global batch (1F1B's steady state: the first stage keeps pp in flight)."""
    setup, model, machine = job.setup, job.model, job.machine
    return {
        **plan_values(job.inputs, machine, n),
        **counts(layer_shape(model)),
        **counts(layout_degrees(setup.tp, setup.pp, {})),
        **job.stages.values(),
        "m_mb": setup.pp if job.micro_batches is None else job.micro_batches,
        "v_pp": job.step.vpp,
        **kept(job),
        "M_dev": machine.profile.device.hbm_bytes * (1 - setup.memory_headroom),
        **moe.values(model, job.step.ep, job.step.capacity_factor),
        **offload.values(setup, machine, model),
    }


def memory(ev: Evaluator, name: str) -> Any:
    """A fit formula at the evaluator's values; for an MoE model its twin, counting every expert."""
    return ev(moe.twin(name, ev.values))


def fit_at(ev: Evaluator) -> Fit:
    """The memory of the bound job: model states, activations and buffers, and whether they fit."""
    state, activations = memory(ev, "model_state_bytes"), memory(ev, "activation_bytes")
    buffers = ev("ring_buffer_bytes")
    total = state + activations + buffers
    return Fit(
        n=int(ev.values["N"]),
        params=memory(ev, "params"),
        model_state_bytes=state,
        activation_bytes=activations,
        buffer_bytes=buffers,
        total_bytes=total,
        device_memory_bytes=ev.values["M_dev"],
        fits=bool(total <= ev.values["M_dev"]),
    )
