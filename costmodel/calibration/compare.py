"""Measured against predicted: the comparison `cp-plan validate` prints (docs/calibration.md). No torch here.

Each kernel timing is set beside two predictions of :mod:`costmodel.plans.timing`: the calibrated model
(measured rates per block size, alpha and B, the tile-level causal schedule) and the datasheet-style
model (one peak FLOP/s, no alpha, causal halves balanced). Error = predicted / measured - 1.
"""

from __future__ import annotations

import statistics
from typing import Any

from costmodel.machines.binding import Machine
from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.bind import plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict
from costmodel.symbolic import numeric

SCHEMA = "cp-plan/validate/v1"


def calibrated_inputs(
    profile: HardwareProfile, n: int, tokens_per_rank: int, causal: bool = False, layout: str = "contiguous"
) -> PlanInputs:
    """A plan in the shape the profile was measured with, ``tokens_per_rank`` on each of ``n`` ranks."""
    cal = profile.calibration
    assert cal is not None
    return PlanInputs(
        seq=tokens_per_rank * n,
        n=n,
        batch=cal.batch,
        heads=cal.heads,
        kv_heads=cal.kv_heads,
        head_dim=cal.head_dim,
        dtype=cal.dtype,
        causal=causal,
        layout=layout,
        block=1,
        hw=profile.name,
    )


def calibrated_machine(profile: HardwareProfile) -> Machine:
    """The measured profile bound to the dtype it was measured in."""
    return Machine(profile, profile.calibration.dtype)  # type: ignore[union-attr]


def critical_tokens(profile: HardwareProfile, n: int) -> float:
    """L* of the calibrated shape, non-causal forward, on the profile's measured rate, alpha and B."""
    values = plan_values(calibrated_inputs(profile, n, 1024), calibrated_machine(profile))
    return float(
        numeric.critical_shard_tokens(**{a: values[a] for a in numeric.ARGS["critical_shard_tokens"]})
    )


def compare(
    profile: HardwareProfile,
    n: int,
    cases: list[Any],
    measured: list[dict[str, float]],
    max_median_error: float,
) -> dict[str, Any]:
    """One row per (case, pass) with both predictions and their errors, and the summary."""
    l_star = critical_tokens(profile, n)
    machine = calibrated_machine(profile)
    rows = []
    for case, times in zip(cases, measured, strict=True):
        inputs = calibrated_inputs(profile, n, case.tokens_per_rank, case.causal, case.layout)
        documents = getattr(case, "documents", 1)
        if documents > 1:  # the same window packed with equal documents, varlen
            inputs = inputs.model_copy(update={"docs": f"{inputs.seq // documents}x{documents}"})
        for pass_ in case.passes:
            backward = pass_ == "fwd+bwd"
            model = predict(inputs, machine, case.variant, backward).total_s
            datasheet = predict(inputs, machine.as_datasheet(), case.variant, backward).total_s
            seconds = times[pass_]
            rows.append(
                {
                    "variant": case.variant,
                    "layout": case.layout,
                    "causal": case.causal,
                    "tokens_per_rank": case.tokens_per_rank,
                    "documents": documents,
                    "shard_over_critical": case.tokens_per_rank / l_star,
                    "pass": pass_,
                    "measured_s": seconds,
                    "predicted_s": model,
                    "error": model / seconds - 1,
                    "datasheet_s": datasheet,
                    "datasheet_error": datasheet / seconds - 1,
                }
            )
    errors = [abs(r["error"]) for r in rows]
    datasheet_errors = [abs(r["datasheet_error"]) for r in rows]
    median, sheet = statistics.median(errors), statistics.median(datasheet_errors)
    return {
        "schema": SCHEMA,
        "hw": profile.name,
        "nproc": n,
        "critical_shard_tokens": l_star,
        "rows": rows,
        "median_abs_error": median,
        "max_abs_error": max(errors),
        "datasheet_median_abs_error": sheet,
        "datasheet_over_calibrated": sheet / median if median else float("inf"),
        "max_median_error": max_median_error,
        "passed": median <= max_median_error,
    }
