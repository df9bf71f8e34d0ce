"""The pipeline layout against the model: the one check every command (step, recommend, infer, report,
check, audit) asks before it plans stages."""

from __future__ import annotations

from costmodel.core.errors import InputError


def check_stages(
    layers: int, pp: int, vpp: int = 1, pp_field: str = "--pp", vpp_field: str = "--vpp"
) -> None:
    """Refuse a layout that gives a stage or a virtual stage no layer: ``pp`` stages of ``vpp`` chunks each
    hold ``layers / (pp x vpp)`` layers, so ``pp x vpp`` may not exceed the layers; interleaving (``vpp``
    above 1) needs more than one stage."""
    if pp > layers:
        raise InputError(pp_field, f"{pp} pipeline stages exceed the model's {layers} layers")
    if vpp > 1 and pp == 1:
        raise InputError(vpp_field, "interleaving needs --pp > 1")
    if pp * vpp > layers:
        raise InputError(
            vpp_field,
            f"{pp} stages x {vpp} virtual stages = {pp * vpp} model chunks exceed the model's {layers} layers",
        )
