"""Measured against predicted: the comparison `cp-plan validate` prints (docs/calibration.md). No torch here.

Each kernel timing is set beside two predictions of :mod:`costmodel.plans.timing`: the calibrated model
(measured rates per block size, alpha and B, the pairs each rank sees at each step) and the datasheet-style
model (one peak FLOP/s, no alpha, causal halves balanced). Error = predicted / measured - 1.

Each prediction carries its uncertainty: every fitted quantity of the profile moved by its spread over
resampled repeats (and the compute rates by theirs), one at a time, the changes added in quadrature.
Rows are split into held-out shapes, which calibrate never ran, and the shapes its fixed costs were
fitted on; the verdict is on the held-out ones.

Inference runs (pass-KV and pass-Q prefills after a cached prefix, decode steps) are compared apart, in
``inference_rows``: held out too, predicted by `cp-plan infer`'s formulas
(:mod:`costmodel.inference.kernel_runs`) on the same machine binding. On a profile that measured the
inference schemes' fixed costs they enter the verdict with a median of their own, held to the same bound
as the training rows; on one measured before, they are reported with the reason they stay out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from costmodel.calibration.fit import (
    DRIFT_MAX,
    calibrated_inputs,
    calibrated_machine,
    with_compute_scaled,
    with_fit,
)
from costmodel.inference.kernel_runs import FORMULAS, predict_run
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.bind import call, plan_values
from costmodel.plans.timing import predict

SCHEMA = "cp-plan/validate/v2"
INFERENCE_MAX_ERROR = 0.25  # the goal's bound on the largest held-out |error|, as for the training rows


def critical_tokens(profile: HardwareProfile, n: int) -> float:
    """L* of the calibrated shape, non-causal forward, on the profile's measured rate, alpha and B."""
    values = plan_values(calibrated_inputs(profile, n, 1024), calibrated_machine(profile))
    return float(call("critical_shard_tokens", values))


def perturbed_machines(profile: HardwareProfile) -> list[tuple[str, Machine]]:
    """The profile with each fitted quantity moved by its spread, one at a time, and with the compute
    rates moved by theirs: what a prediction's uncertainty is made of."""
    cal = profile.calibration
    assert cal is not None
    out = [
        (key, calibrated_machine(with_fit(profile, key, fit.value + fit.spread)))
        for key, fit in cal.fits.items()
        if fit.spread > 0
    ]
    if any(p.uncertainty for c in cal.compute for p in (*c.forward, *c.backward)):
        out.append(("compute", calibrated_machine(with_compute_scaled(profile, -1.0))))
    return out


def inference_rows(
    profile: HardwareProfile, n: int, runs: Sequence[tuple[Any, dict[str, float]]]
) -> list[dict[str, Any]]:
    """One row per timed inference run (case, {"fwd": seconds, "fwd spread": ...}): the inference model's
    prediction on the calibrated machine and as a datasheet, its uncertainty, and both errors."""
    machine = calibrated_machine(profile)
    moved = perturbed_machines(profile)
    inputs = calibrated_inputs(profile, n, 1)
    rows = []
    for case, times in runs:
        shape = (case.scheme, case.new_per_rank, case.cached_per_rank)
        model = predict_run(inputs, machine, *shape)
        datasheet = predict_run(inputs, machine.as_datasheet(), *shape)
        changes = {key: predict_run(inputs, m, *shape) - model for key, m in moved}
        rows.append(
            {
                "scheme": case.scheme,
                "new_per_rank": case.new_per_rank,
                "cached_per_rank": case.cached_per_rank,
                "pass": "fwd",
                "held_out": True,
                "formulas": list(FORMULAS[case.scheme]),
                **_judged(times["fwd"], times.get("fwd spread"), model, datasheet, changes),
            }
        )
    return rows


def _judged(
    seconds: float, spread: float | None, model: float, datasheet: float, changes: dict[str, float]
) -> dict[str, Any]:
    """A measured time against its prediction: the errors, and the uncertainty from what each fitted
    quantity's spread moves the prediction by (``changes``), added in quadrature."""
    uncertainty = math.sqrt(sum(c * c for c in changes.values()))
    return {
        "measured_s": seconds,
        "measured_spread": spread,
        "predicted_s": model,
        "uncertainty_s": uncertainty,
        "uncertainty": uncertainty / model,
        "largest_source": max(changes, key=lambda k: abs(changes[k])) if changes else None,
        "largest_source_s": max(map(abs, changes.values()), default=0.0),
        "error": model / seconds - 1,
        "datasheet_s": datasheet,
        "datasheet_error": datasheet / seconds - 1,
    }


def compare(
    profile: HardwareProfile,
    n: int,
    cases: list[Any],
    measured: list[dict[str, float]],
    max_median_error: float,
    inference: Sequence[tuple[Any, dict[str, float]]] = (),
    sentinel: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """One row per (case, pass) with both predictions, the model's uncertainty and both errors, and the
    summary of held-out rows (the verdict) and of the rows on fitted shapes; ``inference``: timed inference
    runs, compared in rows of their own that do not enter the verdict; ``sentinel``: calibrate's sentinel
    timed again by validate ({"start", "end"} x {"compute", "exchange"}), for the machine's drift."""
    l_star = critical_tokens(profile, n)
    machine = calibrated_machine(profile)
    moved = perturbed_machines(profile)
    rows = []
    for case, times in zip(cases, measured, strict=True):
        documents = getattr(case, "documents", 1)
        inputs = calibrated_inputs(profile, n, case.tokens_per_rank, case.causal, case.layout, documents)
        for pass_ in case.passes:
            backward = pass_ == "fwd+bwd"
            model = predict(inputs, machine, case.variant, backward).total_s
            datasheet = predict(inputs, machine.as_datasheet(), case.variant, backward).total_s
            changes = {key: predict(inputs, m, case.variant, backward).total_s - model for key, m in moved}
            rows.append(
                {
                    "variant": case.variant,
                    "layout": case.layout,
                    "causal": case.causal,
                    "tokens_per_rank": case.tokens_per_rank,
                    "documents": documents,
                    "shard_over_critical": case.tokens_per_rank / l_star,
                    "pass": pass_,
                    "held_out": not getattr(case, "fitted", False),
                    **_judged(times[pass_], times.get(f"{pass_} spread"), model, datasheet, changes),
                }
            )
    held_out = [r for r in rows if r["held_out"]] or rows
    fitted = [r for r in rows if not r["held_out"]]
    repeatability = statistics.median([abs(r["error"]) for r in fitted]) if fitted else None
    served = inference_rows(profile, n, inference)
    for row in (*rows, *served):
        with_repeatability(row, repeatability)
    errors = [abs(r["error"]) for r in held_out]
    datasheet_errors = [abs(r["datasheet_error"]) for r in held_out]
    median, sheet = statistics.median(errors), statistics.median(datasheet_errors)
    quality = profile.calibration.quality  # type: ignore[union-attr]
    spreads = [r["measured_spread"] for r in rows if r["measured_spread"] is not None]
    served_errors = [abs(r["error"]) for r in served]
    gated, why_not = inference_gated(profile, served)
    served_median = statistics.median(served_errors) if served_errors else None
    served_passed = None if served_median is None else served_median <= max_median_error
    return {
        "schema": SCHEMA,
        "hw": profile.name,
        "nproc": n,
        "critical_shard_tokens": l_star,
        "rows": rows,
        "median_abs_error": median,  # held-out rows: shapes calibrate never ran
        "max_abs_error": max(errors),
        "held_out_rows": len(held_out),
        "fitted_rows": len(fitted),
        "fitted_median_abs_error": statistics.median([abs(r["error"]) for r in fitted]) if fitted else None,
        "fitted_max_abs_error": max(abs(r["error"]) for r in fitted) if fitted else None,
        "repeatability": repeatability,
        "within_uncertainty": sum(abs(r["predicted_s"] - r["measured_s"]) <= r["uncertainty_s"] for r in rows)
        / len(rows),
        "datasheet_median_abs_error": sheet,
        "datasheet_over_calibrated": sheet / median if median else float("inf"),
        "max_median_error": max_median_error,
        "passed": median <= max_median_error and (not gated or bool(served_passed)),
        "training_passed": median <= max_median_error,
        "quality": quality.model_dump(mode="json") if quality is not None else None,
        "measured_spread": statistics.median(spreads) if spreads else None,  # IQR / median, median row
        "inference_rows": served,  # held out, not in the verdict
        "inference_median_abs_error": served_median,
        "inference_max_abs_error": max(served_errors) if served_errors else None,
        "inference_passed": served_passed,
        "inference_in_verdict": gated,
        "inference_not_in_verdict_because": why_not,
        "machine_drift": machine_drift(profile, sentinel),
    }


def inference_gated(profile: HardwareProfile, served: Sequence[Any]) -> tuple[bool, str | None]:
    """Whether the inference rows enter the verdict, and the reason when they do not: only a profile that
    measured every scheme's fixed cost predicts them with all the model's terms."""
    if not served:
        return False, "no inference runs were timed"
    have = set(profile.calibration.inference_overhead_s)  # type: ignore[union-attr]
    missing = sorted({r["scheme"] for r in served} - have)
    if missing:
        return False, (
            f"the profile has no measured fixed cost for {', '.join(missing)} (measured before calibrate "
            "timed the inference layers): calibrate again"
        )
    return True, None


def with_repeatability(row: dict[str, Any], repeatability: float | None) -> None:
    """Widen a row's uncertainty by how far a timing repeats: the fitted rows re-time the very layers
    calibrate fitted on, so their median |error| is how much one figure moves minutes later, which the
    profile's spreads (noise within one run) cannot see. Added in quadrature, relative to the prediction;
    the spreads' part stays as ``fit_uncertainty_s``."""
    row["fit_uncertainty_s"] = row["uncertainty_s"]
    if not repeatability:
        return
    floor = repeatability * row["predicted_s"]
    row["uncertainty_s"] = math.hypot(row["uncertainty_s"], floor)
    row["uncertainty"] = row["uncertainty_s"] / row["predicted_s"]
    if floor > row["largest_source_s"]:
        row["largest_source"], row["largest_source_s"] = "repeatability", floor


def machine_drift(profile: HardwareProfile, sentinel: dict[str, dict[str, float]] | None) -> dict | None:
    """How much slower (+) or faster (-) the machine ran the same block compute and ring exchange while
    validating (mean of before and after the runs) than at the end of calibrate; ``moved``: either by
    more than calibrate itself tolerates within one run. None without a sentinel on both sides."""

    kept = profile.calibration.sentinel  # type: ignore[union-attr]
    if kept is None or sentinel is None:
        return None
    then = {"compute": kept.compute_s, "exchange": kept.exchange_s}
    drift = {what: (sentinel["start"][what] + sentinel["end"][what]) / 2 / then[what] - 1 for what in then}
    return drift | {"moved": any(abs(x) > DRIFT_MAX for x in drift.values()), "bound": DRIFT_MAX}
