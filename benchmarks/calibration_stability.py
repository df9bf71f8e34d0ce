"""Does a calibration hold run after run? `cp-plan calibrate` + `cp-plan validate`, twice in a row.

For each run it prints the held-out median and max |error| (shapes calibrate never ran), the same on
the shapes calibrate fitted on, how many rows fall within their predicted uncertainty, the machine's
load, calibrate's own verdict on its fits, and how far the machine's speed moved from calibrate to
validate. Then the drift of every fitted quantity from profile 1 to profile 2, beside the spread each
profile claimed for it: a drift much larger than the claimed spreads means the spreads under-state the
noise. And, per run, the held-out error with each calibrated term taken out in turn (same timings, no
new measurement): a term earns its place where it lowers it. Goal (docs/calibration.md): on a quiet
machine both runs give a held-out median <= 10 % and a max <= 25 % over the whole grid (held-out and
fitted rows); on a busy one calibrate flags its profile.

Both commands run as subprocesses, exactly as a user runs them; profiles and JSON reports are kept in
--keep (default: a temporary folder, removed).

    python benchmarks/calibration_stability.py [--nproc 2] [--runs 2] [--keep DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

GOAL_MEDIAN, GOAL_MAX = 0.10, 0.25
CLI = [sys.executable, "-c", "from costmodel.cli import main; main()"]  # this Python, this tree


def _load() -> str:
    try:
        return "{:.1f}".format(os.getloadavg()[0])
    except OSError:
        return "?"


def one_run(index: int, folder: Path, nproc: int, extra: list[str]) -> dict:
    """Calibrate into folder/run{index}.yaml, then validate it; the report, the profile and timings."""
    profile = folder / f"run{index}.yaml"
    load_before = _load()
    start = time.perf_counter()
    cal = subprocess.run(
        [*CLI, "calibrate", "--nproc", str(nproc), "--out", str(profile), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    calibrate_s = time.perf_counter() - start
    if cal.returncode != 0:
        sys.exit(f"run {index}: calibrate failed (exit {cal.returncode}):\n{cal.stderr[-2000:]}")
    start = time.perf_counter()
    val = subprocess.run(
        [*CLI, "validate", "--hw", str(profile), "--nproc", str(nproc), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    validate_s = time.perf_counter() - start
    # 1: above the gate, a report on stdout; or a rank that failed, died or hung, said on stderr alone
    if val.returncode not in (0, 1) or not val.stdout.strip():
        sys.exit(f"run {index}: validate failed (exit {val.returncode}):\n{val.stderr[-2000:]}")
    report = json.loads(val.stdout)
    (folder / f"run{index}.validate.json").write_text(val.stdout)
    return {
        "profile": str(profile),
        "calibration": yaml.safe_load(profile.read_text())["calibration"],
        "report": report,
        "calibrate_s": calibrate_s,
        "validate_s": validate_s,
        "load_before": load_before,
        "load_after": _load(),
    }


def summary(run: dict) -> dict:
    r, quality = run["report"], run["calibration"].get("quality") or {}
    return {
        "held_out_median": r["median_abs_error"],
        "held_out_max": r["max_abs_error"],
        "fitted_median": r.get("fitted_median_abs_error"),
        "fitted_max": r.get("fitted_max_abs_error"),
        "within_uncertainty": r.get("within_uncertainty"),
        "trusted": quality.get("trusted"),
        "reasons": quality.get("reasons", []),
        # the median on held-out rows (validate's gate), the max over the whole grid, fitted rows included
        "goal_met": r["median_abs_error"] <= GOAL_MEDIAN
        and max(r["max_abs_error"], r.get("fitted_max_abs_error") or 0.0) <= GOAL_MAX,
        "machine_drift": r.get("machine_drift"),
        # the inference rows, held to the same goal when the profile measured their fixed costs
        "inference_median": r.get("inference_median_abs_error"),
        "inference_max": r.get("inference_max_abs_error"),
        "inference_in_verdict": r.get("inference_in_verdict"),
        "inference_goal_met": r.get("inference_median_abs_error") is not None
        and r["inference_median_abs_error"] <= GOAL_MEDIAN
        and r["inference_max_abs_error"] <= GOAL_MAX,
        "worst": sorted(
            (row for row in r["rows"] if row.get("held_out", True)), key=lambda row: -abs(row["error"])
        )[:3],
    }


def drift(first: dict, second: dict) -> list[dict]:
    """Every fitted quantity of both profiles: values, claimed spreads, and the relative drift."""
    a, b = first["calibration"].get("fits", {}), second["calibration"].get("fits", {})
    rows = []
    for key in a.keys() & b.keys():
        x, y = a[key]["value"], b[key]["value"]
        scale = max(abs(x), abs(y))
        rows.append(
            {
                "quantity": key,
                "unit": a[key].get("unit", ""),
                "run1": x,
                "run2": y,
                "drift": (y - x) / scale if scale else 0.0,
                "spread1": a[key]["spread"] / scale if scale else 0.0,
                "spread2": b[key]["spread"] / scale if scale else 0.0,
            }
        )
    return sorted(rows, key=lambda row: -abs(row["drift"]))


TERMS = ("all-to-all knee", "fixed cost per kind")


def without(profile_path: str, term: str):  # noqa: ANN201 - a HardwareProfile
    """The profile with one calibrated term taken out (the all-to-all refitted as plain alpha-beta; the
    layer kinds' fixed costs replaced by the contiguous, unmasked kind's, as one cost per variant)."""
    from costmodel.calibration.fit import fit_link
    from costmodel.machines.profiles import HardwareProfile, layer_key, load_profile

    profile = load_profile(profile_path)
    data = profile.model_dump(mode="json", exclude_none=True)
    cal = data["calibration"]
    if term == "all-to-all knee":
        n = profile.source.nproc or 2
        for scope, fit in cal["alltoall"].items():
            points = [dict(s, bytes=s["bytes"] * n / (n - 1)) for s in fit["samples"]]  # held bytes again
            cal["alltoall"][scope] = fit_link(points, (n - 1) / n).model_dump(mode="json", exclude_none=True)
    elif term == "fixed cost per kind":
        fixed = cal["layer_overhead_s"]
        cal["layer_overhead_s"] = {
            f"{variant} {pass_}": fixed.get(layer_key(variant, "contiguous", False, pass_), 0.0)
            for variant in ("ring", "ulysses")
            for pass_ in ("fwd", "fwd+bwd")
        }
    return HardwareProfile.model_validate(data)


def ablation(run: dict) -> dict[str, tuple[float, float]]:
    """Held-out (median, max) |error| of this run's measured times with every term, and with each one out:
    a term earns its place where taking it out raises the error on shapes it was not fitted on."""
    from costmodel.calibration.compare import calibrated_inputs, calibrated_machine
    from costmodel.machines.profiles import load_profile
    from costmodel.plans.timing import predict

    report = run["report"]
    rows = [r for r in report["rows"] if r.get("held_out", True)]
    out = {}
    for term in ("(none)", *TERMS):
        profile = load_profile(run["profile"]) if term == "(none)" else without(run["profile"], term)
        machine = calibrated_machine(profile)
        errors = []
        for r in rows:
            inputs = calibrated_inputs(
                profile,
                report["nproc"],
                r["tokens_per_rank"],
                r["causal"],
                r["layout"],
                r.get("documents", 1),
            )
            predicted = predict(inputs, machine, r["variant"], r["pass"] == "fwd+bwd").total_s
            errors.append(abs(predicted / r["measured_s"] - 1))
        out[term] = (statistics.median(errors), max(errors))
    return out


def _kernel(row: dict) -> str:
    mask = " causal" if row["causal"] else ""
    name = "ulysses" if row["variant"] == "ulysses" else f"ring {row['layout']}"
    return f"{name}{mask} L={row['tokens_per_rank']} {row['pass']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", help="folder for the profiles and reports (kept)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("calibrate_args", nargs="*", help="passed to calibrate after --, e.g. -- --repeats 9")
    parser.add_argument("--smoke", action="store_true", help="one short run: the suite runs it")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.calibrate_args = 1, ["--repeats", "3", *args.calibrate_args]
    folder = Path(args.keep or tempfile.mkdtemp(prefix="cp-plan-stability-"))
    folder.mkdir(parents=True, exist_ok=True)
    runs = []
    for index in range(1, args.runs + 1):
        print(f"run {index}: calibrate --nproc {args.nproc} + validate (load {_load()}) ...", flush=True)
        runs.append(one_run(index, folder, args.nproc, args.calibrate_args))
    print(
        f"\nGoal per run: held-out median <= {GOAL_MEDIAN:.0%} and max <= {GOAL_MAX:.0%} over the whole grid"
        " (held-out and fitted rows)"
    )
    print(
        f"{'run':>3} {'median':>7} {'max':>7} {'fit med':>7} {'fit max':>7} {'in ±':>5} {'load':>9} {'s':>5}  verdict"
    )
    summaries = [summary(run) for run in runs]
    for index, (run, s) in enumerate(zip(runs, summaries, strict=True), 1):
        fitted = (
            f"{s['fitted_median']:7.1%} {s['fitted_max']:7.1%}"
            if s["fitted_median"] is not None
            else f"{'-':>7} {'-':>7}"
        )
        within = f"{s['within_uncertainty']:5.0%}" if s["within_uncertainty"] is not None else f"{'-':>5}"
        verdict = ("goal met" if s["goal_met"] else "goal missed") + (
            "; profile trusted"
            if s["trusted"]
            else "; profile FLAGGED noisy"
            if s["trusted"] is False
            else ""
        )
        print(
            f"{index:>3} {s['held_out_median']:7.1%} {s['held_out_max']:7.1%} {fitted} {within} "
            f"{run['load_before']:>4}>{run['load_after']:<4} {run['calibrate_s'] + run['validate_s']:5.0f}  {verdict}"
        )
        for reason in s["reasons"]:
            print(f"      flagged: {reason}")
        if s["machine_drift"]:
            moved = s["machine_drift"]
            print(
                f"      machine since calibrate: compute {moved['compute']:+.1%}, exchange {moved['exchange']:+.1%}"
                + (" (moved)" if moved["moved"] else "")
            )
        for row in s["worst"]:
            print(f"      worst: {_kernel(row):<40} {row['error']:+.1%} (± {row.get('uncertainty', 0):.0%})")
        if s["inference_median"] is not None:
            print(
                f"      inference rows: median {s['inference_median']:.1%}, max {s['inference_max']:.1%} "
                + ("(in the verdict; " if s["inference_in_verdict"] else "(not in the verdict; ")
                + ("goal met)" if s["inference_goal_met"] else "goal missed)")
            )
    print("\nEach calibrated term taken out in turn (held-out median / max |error| of the same timings):")
    print(f"{'term taken out':<24}" + "".join(f"{'run ' + str(i):>17}" for i in range(1, len(runs) + 1)))
    ablations = [ablation(run) for run in runs]
    for term in ("(none)", *TERMS):
        cells = "".join(f"{a[term][0]:>8.1%} /{a[term][1]:>7.1%}" for a in ablations)
        print(f"{term:<24}{cells}")
    drifts = []
    if len(runs) >= 2:
        drifts = drift(runs[0], runs[1])
        print(
            "\nFitted quantities, run 1 -> run 2 (drift relative to the larger; spreads as each profile claimed):"
        )
        print(f"{'quantity':<42} {'run 1':>11} {'run 2':>11} {'drift':>7} {'spread1':>8} {'spread2':>8}")
        for row in drifts:
            print(
                f"{row['quantity']:<42} {row['run1']:>11.4g} {row['run2']:>11.4g} {row['drift']:>+7.1%} "
                f"{row['spread1']:>8.1%} {row['spread2']:>8.1%}"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": summaries, "drift": drifts, "ablation": ablations}, indent=2, default=str)
        )
    print(f"\nprofiles and reports: {folder}")


if __name__ == "__main__":
    main()
