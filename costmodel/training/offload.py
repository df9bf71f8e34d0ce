"""Offload over the host link: what ``--offload`` keeps in host memory, bound to the "offload" formulas.

Optimizer offload keeps the fp32 master weights and Adam moments in host memory and runs Adam on the CPU
[ZeRO-Offload]; parameter offload keeps the weights there too and fetches each layer's before its forward and
backward; activation offload copies each layer's kept activations out in the forward and back in the
backward [ZeRO-Infinity]. The memory fit and the step read the same symbols from here, so that ``recommend``,
the layout search and ``cp-plan step`` agree on what a device holds and what the host link costs.
"""

from __future__ import annotations

from typing import Any

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.plans.inputs import TrainingSetup
from costmodel.plans.models import ModelPreset


def values(setup: TrainingSetup, machine: Machine, model: ModelPreset | None = None) -> dict[str, Any]:
    """o_opt, o_par, o_act and the host link's B_h, R_h, n_h; one line naming --offload where the profile
    has no host link or the model's experts would be offloaded (not modelled)."""
    host = machine.profile.links.host
    if setup.offload != "none":
        if host is None:
            raise InputError(
                "--offload",
                f"{setup.offload} copies over the host link, and {machine.profile.origin} states no links.host",
            )
        if model is not None and model.experts:
            raise InputError("--offload", f"offloading an MoE model ({model.name}) is not modelled")
    return {
        **setup.offloaded,
        # Without a host link nothing is offloaded: every term is multiplied by an o_* of 0.
        "B_h": host.bandwidth_per_direction if host else 1.0,
        "R_h": host.optimizer_params_per_s if host else 1.0,
        "n_h": min(devices_per_host(machine), setup.gpus),
    }


def devices_per_host(machine: Machine) -> int:
    """Devices whose offloaded optimizer one host's CPUs run: the profile's figure, else a node's devices."""
    host = machine.profile.links.host
    return (host.devices_per_host if host else None) or machine.profile.devices_per_node
