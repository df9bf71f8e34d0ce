"""How well the step model predicts measured runs, in one run: the built-in profile, a fit from single-node
runs (k-fold), runs kept aside from the fit, multi-node runs predicted from it, and the published tables:
training by framework and held out, the order of each job's layouts, serving, ring-flash-attention's ring
efficiency, and the intervals' coverage.

    python benchmarks/fidelity.py --data DIR     # DIR holds vTrain's ground_truth_single.csv, _multi.csv
    python benchmarks/fidelity.py --smoke        # a synthetic table: checks the pipeline, not the model

The measured runs are the vTrain dataset ([vTrain], data/ of its repository, MIT licence): 1,440 runs on
one 8-GPU A100 node and 109 on up to 512 A100s, Megatron-DeepSpeed (its framework profile, whose host time
per kernel comes from public figures), GPT 0.15-175B, fp16, full recompute, unfused attention, gradients
reduced after the backward. One fifth of the single-node runs (every fifth
row) is kept aside before anything is fitted and predicted only at the end. The multi-node runs are never
fitted to: they say how a fit from one node transfers to the cluster.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from ring_efficiency import published_rows as ring_rows
from ring_efficiency import summary as ring_summary

from costmodel.audit.runs import (
    Profiles,
    RunTable,
    audit_runs,
    compare_row,
    errors_summary,
    fit_runs,
    parse_assumptions,
    predict,
    predictions,
    read_runs,
    spans_nodes,
)
from costmodel.audit.synthetic import synthetic
from costmodel.calibration.residuals import coverage_report, median_half_width
from costmodel.cli.markdown import job_orders
from costmodel.core.intervals import interval
from costmodel.inference.published import summary as serving_summary
from costmodel.machines.profiles import HardwareProfile, load_profile
from costmodel.plans.uncertainty import fitted_calibration
from costmodel.training.memory_validation import fits_at_floor, out_of_memory, refused_ooms
from costmodel.training.validation import HELD_OUT, ROWS, by_framework, refused
from costmodel.training.validation import predict as published

# Dense bf16 TFLOP/s of the H100 SXM and NVL on NVIDIA's datasheet: the bracket torchtitan's benchmark puts its
# 500 W part's peak in (its rows state the middle, clock_scale 0.922).
SXM_PEAK, NVL_PEAK = 989.0, 835.0
ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "data" / "runs" / "a100-vtrain.yaml"  # the cluster vTrain's configurations state
VTRAIN = [
    "recompute=full",
    "precision=fp16",
    "attention_kernel=unfused",
    "dp_overlap=0",
    "sequence_parallel=false",
    "framework=megatron-deepspeed",  # its host time per kernel, from public figures (frameworks/*.yaml)
]


def line(label: str, s: dict) -> str:
    return (
        f"{label:<44} {s['n']:>5} runs  MAPE {s['mape']:6.1%}  median {s['median_abs_error']:6.1%}  "
        f"worst {s['max_abs_error']:6.1%}  signed {s['signed_median']:+6.1%}"
    )


def coverage_line(audit: dict) -> str:
    covered = audit["interval_coverage"]
    if covered is None:
        return f"{'  inside the 80 % intervals':<44} no run had one"
    return f"{'  inside the 80 % intervals':<44} {covered['covered']:4.0%} of {covered['runs']}"


def group_line(label: str, groups: dict[str, dict]) -> str:
    """Each group's signed median error and run count, on one line (where the errors lean by group)."""
    ordered = sorted(groups.items(), key=lambda item: int(item[0].split()[-1]))  # "TP 2" before "TP 16"
    cells = ", ".join(f"{name} {s['signed_median']:+.1%} ({s['n']})" for name, s in ordered)
    return f"{label:<44} {cells}"


def rank_line(label: str, r: dict | None) -> str:
    if r is None:
        return f"{label:<44} no job run in two layouts"
    return (
        f"{label:<44} {r['jobs']:>5} jobs  fastest found {r['fastest_found']:4.0%}  regret median "
        f"{r['median_regret']:5.1%}  worst {r['max_regret']:5.1%}  pairs in order {r['pairs_ordered']:4.0%} "
        f"of {r['pairs']}"
        + (
            f"\n{'':<44} Spearman rho over {r['spearman']['jobs']} jobs of 4+ layouts: median "
            f"{r['spearman']['median']:.2f}, worst {r['spearman']['min']:.2f}, "
            f"{r['spearman']['below_goal']} below {r['spearman']['goal']}"
            if r["spearman"]
            else ""
        )
    )


def smoke_table(directory: Path) -> tuple[Path, Path]:
    """Two small tables timed by the model itself on a slower profile, to run the pipeline end to end."""
    truth = {"gemm_scale": 0.8, "launch_s": 5e-5}
    single = synthetic(directory, truth, noise=0.03)
    multi = synthetic(directory / "multi", truth, noise=0.03, max_gpus=32, hw=str(CLUSTER))
    return single, multi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("CP_PLAN_VTRAIN"), help="folder of vTrain's tables")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a synthetic table instead of the dataset")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    if args.smoke:
        (work / "multi").mkdir()
        single_path, multi_path = smoke_table(work)
    elif args.data:
        single_path = Path(args.data) / "ground_truth_single.csv"
        multi_path = Path(args.data) / "ground_truth_multi.csv"
    else:
        raise SystemExit(
            "give --data DIR with vTrain's data/ground_truth_single.csv and ground_truth_multi.csv "
            "(github.com/VIA-Research/vTrain), or --smoke"
        )
    assume = parse_assumptions(VTRAIN)
    single = read_runs(str(single_path), assume, str(CLUSTER))
    multi = read_runs(str(multi_path), assume, str(CLUSTER)) if multi_path.is_file() else None
    builtin = Profiles()
    single_audit = audit_runs(single, predictions(single, builtin))
    print(line("single node, built-in profile", single_audit))
    print(coverage_line(single_audit))
    print(rank_line("  layouts ranked, built-in profile", single_audit["ranking"]))
    if multi is not None:
        multi_audit = audit_runs(multi, predictions(multi, builtin))
        print(line("multi-node, built-in profile", multi_audit))
        print(coverage_line(multi_audit))
        print(rank_line("  layouts ranked, built-in profile", multi_audit["ranking"]))
        print(group_line("  signed median error by TP degree", multi_audit["groups"]["tensor parallel"]))

    aside = single.runs[4::5]
    kept = [run for i, run in enumerate(single.runs) if i % 5 != 4]
    table = RunTable(single.path, kept + (multi.runs if multi else []), single.assumed)
    base = load_profile(str(CLUSTER))
    fit = fit_runs(table, base, args.folds, "a100-vtrain-fitted", datetime.date.today().isoformat())
    terms = ", ".join(f"{n} {t['value']:.4g} ± {t['spread']:.2g}" for n, t in fit["terms"].items())
    print(f"fitted on {fit['fitted_runs']} single-node runs: {terms}")
    print(line(f"single node, held out ({args.folds}-fold)", fit["cv"]))
    print(rank_line("  layouts ranked, held out", fit["cv_ranking"]))
    fitted = Profiles(fit["profile"])
    aside_rows = [compare_row(run, predict(run, fitted)) for run in aside]
    print(line("single node, kept aside (every 5th row)", errors_summary([r["error"] for r in aside_rows])))
    print(fitted_coverage("  fitted profile intervals, kept-aside rows", fit["profile"], aside))
    if fit["transfer"] is not None:
        print(line("multi-node, predicted from the single-node fit", fit["transfer"]))
        print(
            fitted_coverage("  fitted profile intervals, multi-node runs", fit["profile"], multi.runs, True)
        )
        print(rank_line("  layouts ranked, from the fit", fit["transfer_ranking"]))
    print_published()


def print_published() -> None:
    """The published table's errors by framework, and the intervals' coverage on it."""
    errors = [abs(published(row) / row.published - 1) for row in ROWS]
    known = sum(bool(row.misses) for row in ROWS)
    print(
        f"published table (docs/validation.md): {len(ROWS)} rows, median |error| {statistics.median(errors):.1%}, "
        f"{sum(e <= 0.15 for e in errors)} within 15 %, {known} named known misses"
    )
    for name, s in by_framework().items():
        print(f"  ran on {name:<42} {s['rows']:>5} rows  median |error| {s['median']:6.1%}")
    held = [abs(published(row) / row.published - 1) for row in HELD_OUT]
    print(
        f"  held out (validation/training_published_holdout.yaml) {len(held):>3} rows  median |error| "
        f"{statistics.median(held):6.1%}, {sum(e <= 0.15 for e in held)} within 15 %"
    )
    print(clock_bracket())
    predicted = {row.key: published(row) for row in [*ROWS, *HELD_OUT]}
    for job, layouts, rho in job_orders([*ROWS, *HELD_OUT], predicted):
        shown = "-" if rho is None else f"{rho:+.2f}"
        print(f"  layouts of {job:<52} {layouts:>3}  Spearman rho {shown} (goal 0.8)")
    unfit = refused([*ROWS, *HELD_OUT])
    chances = sorted(p for _, p in unfit if p is not None)
    print(
        f"  runs the memory model says would not fit (every one ran): {len(unfit)} of {len(ROWS) + len(HELD_OUT)}"
        + (f", their median chance to fit {statistics.median(chances):.0%}" if chances else "")
    )
    ooms = refused_ooms()
    ran_out = [p for _, fits, p in ooms if not fits]
    print(
        f"  published configurations that ran out of memory (validation/memory_oom.yaml): {len(ran_out)} of "
        f"{len(ooms)} refused" + (f", their chance to fit at most {max(ran_out):.0%}" if ran_out else "")
    )
    floor = sum(fits_at_floor(row.job) for row, _ in unfit)
    floor_ooms = sum(fits_at_floor(job) for _, job in out_of_memory())
    print(
        f"  judged at the allocator's floor (allocated + runtime) instead: {floor} of the {len(unfit)} refused "
        f"runs would fit, and {floor_ooms} of the {len(ooms)} that ran out of memory"
    )
    serving, held_out = serving_summary(), serving_summary("held_out")
    print(
        f"published serving rows (docs/inference.md): median |error| {serving['median']:.1%}, worst "
        f"{serving['max']:.1%} ({serving['median_unmissed']:.1%} without the named misses); held out: median "
        f"{held_out['median']:.1%}, worst {held_out['max']:.1%}"
    )
    print("ring-flash-attention's 8-GPU layers, " + ring_summary(ring_rows()))
    print(
        "prediction intervals on the published tables (split-conformal; leave-one-out, memory's holdout apart):"
    )
    for regime, levels in coverage_report().items():
        cells = "  ".join(
            f"{level}: {c['covered']:4.0%} of {c['given']} {c['unit']}"
            if c["covered"] is not None
            else f"{level}: none of {c['runs']}"
            for level, c in levels.items()
        )
        print(f"  {regime:<52} {cells}")
    for quantity in ("step_time", "memory", "serving"):
        width = median_half_width(quantity, 0.8)
        print(f"  median 80 % half-width, {quantity:<10} " + ("none" if width is None else f"±{width:.1%}"))


def clock_bracket() -> str:
    """The rows that state a part's clock (``clock_scale``: torchtitan's 500 W H100, the middle of the peak its
    benchmark puts "between SXM and NVL") read at the bracket's ends too: how much the unpublished clock moves."""
    rows = [row for row in [*ROWS, *HELD_OUT] if "clock_scale" in row.setup]
    ends = {"NVL end": NVL_PEAK / SXM_PEAK, "as stated": None, "SXM end": 1.0}
    cells = []
    for end, scale in ends.items():
        at = [
            row if scale is None else replace(row, setup=row.setup | {"clock_scale": scale}) for row in rows
        ]
        errors = [abs(published(row) / row.published - 1) for row in at]
        cells.append(
            f"{end} {sum(e <= 0.15 for e in errors)} within 15 %, median {statistics.median(errors):.1%}"
        )
    return f"  {len(rows)} rows state their part's clock; read at " + "; ".join(cells)


def fitted_coverage(label: str, profile: HardwareProfile, runs: list, across_only: bool = False) -> str:
    """The fitted profile's own intervals (its k-fold residuals by layout class) on runs it was not fitted to:
    the share inside and the median half-width, over all of them and by the regime that calibrated each (those of
    10 runs or more). ``across_only``: only the runs whose groups span nodes."""
    if profile.fit_residuals is None:
        return "fitted profile: no residuals"
    fitted = Profiles(profile)
    pairs = [(run, predict(run, fitted)) for run in runs]
    runs, reports = zip(*[(run, r) for run, r in pairs if spans_nodes(r) or not across_only], strict=True)
    overall, regimes = [], {}
    for level in (0.8, 0.95):
        inside, widths = [], []
        for run, report in zip(runs, reports, strict=True):
            groups = report.topology["groups"]
            tp, pp = groups["tp"]["size"], groups["pp"]["size"]
            held = fitted_calibration(profile, tp, pp, spans_nodes(report), level)
            band = interval(1.0, held, level, "step time")
            if band.known:
                hit = band.lo <= run.measured_s / report.step.time_s <= band.hi
                inside.append(hit)
                widths.append((band.hi - band.lo) / 2)
                classes = profile.fit_residuals_by_layout or []
                regime = next((c.label() for c in classes if c.residuals is held.residuals), "pooled")
                regimes.setdefault(regime, {}).setdefault(level, []).append(hit)
        overall.append(
            f"{level:.0%} covers {sum(inside) / len(inside):.0%} of {len(inside)}, "
            f"median half-width ±{statistics.median(widths):.1%}"
        )
    lines = [f"{label:<44} " + "; ".join(overall)]
    for regime, marks in sorted(regimes.items()):
        if len(marks.get(0.8, [])) >= 10:  # a class too small at 95 % is read on the pool there
            shares = ", ".join(f"{lvl:.0%}: {sum(m) / len(m):.0%} of {len(m)}" for lvl, m in marks.items())
            lines.append(f"    {regime:<40} {shares}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
