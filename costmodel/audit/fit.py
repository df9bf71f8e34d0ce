"""A profile whose efficiency terms are fitted to logged runs, with the leave-one-out error across them.

Two factors, both on the profile so every command uses them: ``compute`` multiplies the published kernel
rates (matrix multiply and attention tables) and the HBM bandwidth; ``comm`` multiplies every link's
bandwidth. The step's breakdown is split into what each moves (compute: multiplies, attention,
elementwise, recompute, output layer, optimizer, bubble; communication: every exposed transfer; the rest,
fixed launch costs, stays), and a step time is taken as ``C/compute + M/comm + rest``; the factors
minimise the squared relative error of that over the runs. One run, or runs whose communication shares do
not differ, fit ``compute`` alone. The errors are the full step model's, re-evaluated with the fitted
profile; leave-one-out fits on all runs but one and predicts that one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import HardwareProfile, parse_profile
from costmodel.training.step import build_step, evaluate_step

COMPUTE = (
    "matrix multiplies",
    "attention",
    "elementwise (memory-bound)",
    "recompute",
    "output layer and loss",
    "optimizer step",
    "pipeline bubble",
)
COMM = ("exposed TP comm", "exposed CP comm", "exposed PP sends", "exposed DP comm", "exposed ZeRO-3 gathers")
FACTOR_RANGE = (0.05, 20.0)  # outside it a fitted factor says the runs do not pin it down
LINK_FACTOR = 2.0  # links may be fitted up to this many times the profile's rate per direction, no more
ERROR_MAX = 0.25  # a fitted profile that still misses its own runs by a median 25 % has learnt nothing


@dataclass(frozen=True)
class Run:
    """One logged run: its step values (as ``cp-plan step``'s flags) and its measured median step time."""

    label: str
    values: dict[str, Any]
    measured_s: float


def scaled_profile(profile: HardwareProfile, compute: float, comm: float) -> HardwareProfile:
    """``profile`` with kernel rates and HBM bandwidth x ``compute`` and every link x ``comm``."""
    data = profile.model_dump(mode="python", exclude_none=True)
    kernels = data.get("kernels")
    if kernels is None:
        raise InputError("--hw", f"profile {profile.name!r} has no published kernel tables to fit")
    kernels["gemm"]["flops_per_s"] = [r * compute for r in kernels["gemm"]["flops_per_s"]]
    for curve in kernels["attention"]:
        curve["flops_per_s"] = [r * compute for r in curve["flops_per_s"]]
    if "hbm_bandwidth" in data["device"]:
        data["device"]["hbm_bandwidth"] *= compute
    for link in data["links"].values():
        link["bandwidth_per_direction"] *= comm
        link.pop("bandwidth_bidirectional", None)
        if "alltoall" in link:
            link["alltoall"]["bandwidth_per_direction"] *= comm
    return parse_profile(data, f"{profile.name} scaled", field="--fit-profile")


def most_compute(profile: HardwareProfile, dtype: str = "bf16") -> float:
    """The largest compute factor that keeps every published rate at or below the dense peak."""
    kernels = profile.kernels
    assert kernels is not None
    fastest = max([*kernels.gemm.flops_per_s, *(r for c in kernels.attention for r in c.flops_per_s)])
    return profile.device.peak_flops.get(dtype, fastest) / fastest


def predict(run: Run, profile: HardwareProfile | None = None) -> dict[str, Any]:
    """The step model for ``run``, on its own profile or on ``profile``."""
    inputs, setup, step, machine = build_step(**run.values)
    if profile is not None:
        machine = Machine(
            profile.model_copy(update={"cp_ranks_per_node": None}), machine.dtype, machine.efficiency
        )
    return evaluate_step(inputs, setup, step, machine)["step"]


def _groups(breakdown: dict[str, float]) -> tuple[float, float, float]:
    compute = sum(breakdown.get(k, 0.0) for k in COMPUTE)
    comm = sum(breakdown.get(k, 0.0) for k in COMM)
    return compute, comm, sum(breakdown.values()) - compute - comm


def fit_factors(runs: list[Run], base: HardwareProfile) -> tuple[float, float]:
    """(compute, comm) factors for ``base`` from ``runs`` (see the module's docstring)."""
    rows = np.array([[*_groups(predict(r, base)["breakdown"]), r.measured_s] for r in runs])
    compute, comm, rest, measured = rows.T
    target = 1 - rest / measured
    both = np.stack([compute / measured, comm / measured], axis=1)
    inverse = None
    if len(runs) >= 3 and np.ptp(comm / (compute + comm)) > 0.02:
        (a, b), *_ = np.linalg.lstsq(both, target, rcond=None)
        if a > 0 and b > 0 and all(FACTOR_RANGE[0] <= 1 / x <= FACTOR_RANGE[1] for x in (a, b)):
            inverse = (float(a), float(b))
    if inverse is None:  # communication as the profile has it; compute alone from the runs
        a = float(np.dot(both[:, 0], target - both[:, 1]) / np.dot(both[:, 0], both[:, 0]))
        inverse = (a, 1.0)
    speed = min(1 / inverse[0], most_compute(base))
    return float(np.clip(speed, *FACTOR_RANGE)), float(np.clip(1 / inverse[1], *FACTOR_RANGE))


def calibrate(runs: list[Run], base: HardwareProfile) -> dict[str, Any]:
    """Factors from every run, each run's error with them, and the leave-one-out error of each."""
    if not runs:
        raise InputError("LOG", "no runs to fit")
    compute, comm = fit_factors(runs, base)
    fitted = scaled_profile(base, compute, comm)
    rows = []
    for i, run in enumerate(runs):
        before = predict(run, base)["time_s"]
        after = predict(run, fitted)["time_s"]
        row = {
            "run": run.label,
            "measured_s": run.measured_s,
            "base_predicted_s": before,
            "base_error": before / run.measured_s - 1,
            "fitted_predicted_s": after,
            "fitted_error": after / run.measured_s - 1,
        }
        others = runs[:i] + runs[i + 1 :]
        if others:
            held = scaled_profile(base, *fit_factors(others, base))
            left_out = predict(run, held)["time_s"]
            row |= {"left_out_predicted_s": left_out, "left_out_error": left_out / run.measured_s - 1}
        rows.append(row)
    loo = [abs(r["left_out_error"]) for r in rows if "left_out_error" in r]
    return {
        "compute_factor": compute,
        "comm_factor": comm,
        "runs": rows,
        "base_median_abs_error": statistics.median(abs(r["base_error"]) for r in rows),
        "fitted_median_abs_error": statistics.median(abs(r["fitted_error"]) for r in rows),
        "left_out_median_abs_error": statistics.median(loo) if loo else None,
        "left_out_max_abs_error": max(loo) if loo else None,
        "profile": fitted,
    }


def fit_problem(result: dict[str, Any], base: HardwareProfile) -> str | None:
    """Why a fit must not become a profile, or None: a factor at the end of :data:`FACTOR_RANGE` (the runs
    do not pin it down; the fit clipped it), links above :data:`LINK_FACTOR` x the profile's, a non-finite
    number, or a median error over the fitted runs above :data:`ERROR_MAX`."""
    compute, comm = result["compute_factor"], result["comm_factor"]
    numbers = [compute, comm, result["fitted_median_abs_error"], result["base_median_abs_error"]]
    if not all(np.isfinite(numbers)):
        return "the fit is not finite; the logs' step times admit no profile"
    for name, value in (("kernel-rate", compute), ("link", comm)):
        if not FACTOR_RANGE[0] < value < FACTOR_RANGE[1]:
            return (
                f"the {name} factor reached {value:g}, the end of the range {FACTOR_RANGE[0]:g} to "
                f"{FACTOR_RANGE[1]:g}: the runs do not pin it down"
            )
    if comm > LINK_FACTOR:
        return (
            f"links x {comm:.3f} would carry more than {LINK_FACTOR:g} x {base.name}'s link rates; "
            "measure the links with nccl-tests instead (cp-plan hw from-nccl-tests)"
        )
    if result["fitted_median_abs_error"] > ERROR_MAX:
        return (
            f"the fitted profile still misses its runs by a median {result['fitted_median_abs_error']:.0%} "
            f"(more than {ERROR_MAX:.0%}): the step model does not describe these runs"
        )
    return None


def fitted_profile(result: dict[str, Any], base: HardwareProfile, name: str, date: str) -> HardwareProfile:
    """The fitted profile, its source saying which runs it was fitted to and how well it predicts."""
    profile: HardwareProfile = result["profile"]
    data = profile.model_dump(mode="python", exclude_none=True)
    runs = ", ".join(r["run"] for r in result["runs"])
    loo = result["left_out_median_abs_error"]
    said = (
        f"kernel rates and HBM x {result['compute_factor']:.3f}, links x {result['comm_factor']:.3f}, "
        f"fitted to {len(result['runs'])} logged run(s): {runs}; median |error| "
        f"{result['base_median_abs_error']:.1%} before, {result['fitted_median_abs_error']:.1%} after"
        + (f", {loo:.1%} left out" if loo is not None else "")
    )
    data["name"] = name
    data["description"] = f"{base.description} [efficiency fitted to training logs]".strip()
    data["source"] = {
        "kind": "measured",
        "url": base.source.url,
        "host": "training logs",
        "date": date,
        "notes": f"{base.source.notes or ''} Fitted by cp-plan audit --fit-profile: {said}.".strip(),
    }
    return parse_profile(data, "fitted profile", field="--fit-profile")
