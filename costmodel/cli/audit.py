"""``cp-plan audit LOG...``: training logs against the step model, and ``--fit-profile`` to learn from them;
``cp-plan hw from-nccl-tests FILE...``: a profile whose links nccl-tests measured (docs/audit.md).

The flags here override what a log states, so each defaults to "as the log says" (None), not to the
step's own defaults; ``cp-plan step`` documents each."""

from __future__ import annotations

import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from costmodel.cli.options import console, house_table, searched, whole
from costmodel.cli.output import Format, emit, format_option
from costmodel.core.errors import InputError
from costmodel.core.fileio import atomic_write_text, check_profile_output
from costmodel.core.units import parse_tokens, seconds
from costmodel.machines.profiles import load_profile, profile_yaml
from costmodel.plans import cp as registry
from costmodel.plans.cp import TRAINING
from costmodel.plans.inputs import PlanInputs, TrainingSetup
from costmodel.plans.job import StepSetup
from costmodel.training.report import LABELS

MAX_FILES = (
    64  # logs or nccl-tests tables a run: each is parsed and fitted or evaluated in well under a second
)

LogsArg = Annotated[
    Optional[list[str]],
    typer.Argument(help="Training logs of Megatron-LM or torchtitan.", show_default=False),
]


AS_LOGGED = "as the log or --config says"


def _option(help: str) -> Any:
    return typer.Option(help=f"{help} [default: {AS_LOGGED}]", show_default=False)


def _tokens(text: str) -> int:

    try:
        return parse_tokens(text, "--seq")
    except InputError as exc:
        raise typer.BadParameter(exc.message) from None


class FailOn(str, Enum):
    """The least severe finding that fails ``audit --fail-on``."""

    critical = "critical"
    warning = "warning"


def audit_cmd(
    logs: LogsArg = None,
    runs: Annotated[
        Optional[str],
        typer.Option(
            "--runs",
            help="A CSV table of measured runs, one per row (docs/audit.md: the columns; vTrain's header as it "
            "is), each predicted and compared; with --fit-profile, machine terms fitted to its single-node runs.",
            show_default=False,
        ),
    ] = None,
    assume: Annotated[
        Optional[list[str]],
        typer.Option(
            "--assume",
            help="COLUMN=VALUE for a column the --runs table lacks, for every row (repeat), e.g. recompute=full.",
            show_default=False,
        ),
    ] = None,
    folds: Annotated[
        int, whole("--folds", low=2, high=50, help="Folds of the cross-validation of a --runs fit.")
    ] = 5,
    config: Annotated[
        Optional[list[str]],
        typer.Option(
            "--config",
            help="The framework's file for each log, in order: torchtitan's TOML, or a Megatron launch script "
            "or flag file. A LOG.toml beside a log is read without it.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[Optional[str], _option("Model preset or YAML (cp-plan step --model).")] = None,
    hw: Annotated[Optional[str], _option("Hardware profile (cp-plan hw list) or a YAML path.")] = None,
    gpus: searched(TrainingSetup, "gpus", AS_LOGGED) = None,
    tp: searched(TrainingSetup, "tp", AS_LOGGED) = None,
    cp: searched(PlanInputs, "cp", AS_LOGGED, names=("--cp",)) = None,
    pp: searched(TrainingSetup, "pp", AS_LOGGED) = None,
    seq: Annotated[
        Optional[int],
        typer.Option(
            parser=_tokens,
            help="Sequence length, tokens: 8192, 8k, 1M. [default: as the log or --config says]",
            show_default=False,
        ),
    ] = None,
    global_batch: searched(StepSetup, "global_batch", AS_LOGGED) = None,
    micro_batch: searched(StepSetup, "micro_batch", AS_LOGGED) = None,
    recompute: Annotated[Optional[str], _option("Activation recompute: none, selective, full.")] = None,
    cp_scheme: Annotated[Optional[str], _option(f"{registry.listed(TRAINING)}.")] = None,
    fit_profile: Annotated[
        Optional[str],
        typer.Option(
            "--fit-profile",
            help="Write a profile whose kernel rates and link bandwidths are fitted to the logs (all on one "
            "--hw), with the leave-one-out error across them.",
            show_default=False,
        ),
    ] = None,
    format: format_option("table", "json", "yaml") = Format.table,
    fail_on: Annotated[
        Optional[FailOn],
        typer.Option(
            "--fail-on",
            help="Exit 1 when any log has a finding this severe or worse (critical; warning: warning or "
            "critical), for CI. [default: exit 0 whatever the findings]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Compare training logs with the step model: measured vs predicted step time, TFLOP/s per GPU and MFU,
    where the difference most likely sits, and findings (over peak, far below the plan, memory, CP exposed).

    Example: cp-plan audit train.log --hw h100-nvlink
    """
    if runs is not None:
        if logs:
            raise InputError("--runs", "give training logs or one --runs table, not both")
        _runs(runs, assume or [], hw, fit_profile, folds, format)
        return
    given = {
        "model": model,
        "hw": hw,
        "gpus": gpus,
        "tp": tp,
        "cp": cp,
        "pp": pp,
        "seq": seq,
        "global_batch": global_batch,
        "micro_batch": micro_batch,
        "recompute": recompute,
        "cp_scheme": cp_scheme,
    }
    _logs(logs or [], config, given, fit_profile, format, fail_on)


def _logs(
    logs: list[str],
    config: list[str] | None,
    given: dict[str, Any],
    fit_profile: str | None,
    format: Format,
    fail_on: FailOn | None,
) -> None:
    """``audit LOG...``: each log against the step model, and the fit when ``fit_profile`` is given."""
    _check_logs(logs, config, fit_profile)
    results, runs, left_out = _audit_logs(logs, config, given)
    fit = None
    if fit_profile is not None:
        if not runs:
            raise InputError("--fit-profile", "every log has a critical finding; none can be fitted to")
        fit = _fit(runs, fit_profile) | {"left_out_runs": left_out}
    from costmodel.audit.compare import SCHEMA

    document: dict[str, Any] = {"schema": SCHEMA}
    document |= {"audit": results[0]} if len(results) == 1 else {"audits": results}
    if len(results) > 1:
        document["audit"] = results[0]
    if fit is not None:
        document["fit"] = fit

    def table() -> None:
        if len(results) == 1:
            _table(results[0])
        else:
            _summary(results)
        if fit is not None:
            _fit_table(fit)

    emit(document, format, table=table)
    failing = {"critical"} if fail_on is FailOn.critical else {"critical", "warning"} if fail_on else set()
    if any(f["severity"] in failing for result in results for f in result["findings"]):
        raise typer.Exit(1)


def _check_logs(logs: list[str], config: list[str] | None, fit_profile: str | None) -> None:
    if not logs:
        raise InputError("LOG", "give training logs (Megatron-LM, torchtitan), or --runs TABLE.csv")
    if len(logs) > MAX_FILES:
        raise InputError("LOG", f"{len(logs):,} logs; audit takes at most {MAX_FILES} a run")
    if config and len(config) != len(logs):
        raise InputError("--config", f"give one per log ({len(logs)}), in the same order; got {len(config)}")
    if fit_profile is not None:
        check_profile_output(fit_profile, "--fit-profile")


def _audit_logs(
    logs: list[str], config: list[str] | None, given: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any], float]], list[str]]:
    """Each log's audit, the runs a fit may learn from (label, values, median step) and the logs it may
    not (a critical finding: its numbers cannot be right, and would teach the profile nonsense)."""
    from costmodel.audit.compare import audit
    from costmodel.audit.config import named_by_source, resolve
    from costmodel.audit.logs import parse_log

    results, runs, left_out = [], [], []
    for index, path in enumerate(logs):
        log = parse_log(path)
        sibling = Path(path).with_suffix(".toml")
        file = config[index] if config else (str(sibling) if sibling.is_file() else None)
        sources: dict[str, tuple[str, str]] = {}
        values = resolve(log, given, file, sources)
        try:
            result = audit(log, values)
        except InputError as exc:
            raise named_by_source(exc, sources) from None
        results.append(result)
        if any(f["severity"] == "critical" for f in result["findings"]):
            left_out.append(Path(path).name)
        else:
            runs.append((Path(path).name, values, result["measured"]["step_time_s"]["median"]))
    return results, runs, left_out


def _runs(path: str, assume: list[str], hw: str | None, out: str | None, folds: int, format: Format) -> None:
    """``audit --runs``: every measured run against the step model, and the fit when ``out`` is given."""
    from costmodel.audit import runs as measured

    if out is not None:
        check_profile_output(out, "--fit-profile")
    table = measured.read_runs(path, measured.parse_assumptions(assume), hw)
    names = {run.values["hw"] for run in table.runs}
    if out is not None:
        if len(names) > 1:
            raise InputError("--fit-profile", f"the runs name several profiles ({', '.join(sorted(names))})")
        measured.check_fit_size(table)
    reports = measured.predictions(table, measured.Profiles())
    document: dict[str, Any] = {"schema": measured.SCHEMA, "runs": measured.audit_runs(table, reports)}
    if out is not None:
        base = load_profile(names.pop())
        fit = measured.fit_runs(
            table, base, folds, Path(out).stem, datetime.date.today().isoformat(), reports=reports
        )
        atomic_write_text(
            out,
            profile_yaml(fit.pop("profile"), "fitted to measured runs (`cp-plan audit --runs`)"),
            "--fit-profile",
        )
        document["fit"] = fit | {"base": base.name, "written": out}
    emit(document, format, table=lambda: _runs_table(document))


def _errors_line(label: str, s: dict[str, Any]) -> str:
    return (
        f"{label}: {s['n']} runs, MAPE {s['mape']:.1%}, median |error| {s['median_abs_error']:.1%}, worst "
        f"{s['max_abs_error']:.1%}, signed median {s['signed_median']:+.1%}, {s['within_15']:.0%} within 15 %"
    )


def _ranking_line(label: str, r: dict[str, Any] | None) -> str | None:
    if r is None:
        return None
    pairs = (
        f"{r['pairs_ordered']:.0%} of {r['pairs']} pairs measured over {r['tie']:.0%} apart in order"
        if r["pairs"]
        else f"no pair measured over {r['tie']:.0%} apart"
    )
    rho = r["spearman"]
    order = (
        f"; Spearman's rho over the {rho['jobs']} jobs of {rho['min_layouts']} layouts or more: median "
        f"{rho['median']:.2f}, worst {rho['min']:.2f}, {rho['below_goal']} below {rho['goal']:.1f}"
        if rho
        else ""
    )
    return (
        f"{label}: of {r['jobs']} jobs run in two layouts or more, the predicted fastest is the measured "
        f"fastest in {r['fastest_found']:.0%} and costs a median {r['median_regret']:.1%} more (worst "
        f"{r['max_regret']:.1%}); {pairs}{order}"
    )


def _runs_table(document: dict[str, Any]) -> None:

    screen, result = console(), document["runs"]
    if result["assumed"]:
        screen.print("assumed for every row: " + ", ".join(f"{k}={v}" for k, v in result["assumed"].items()))
    screen.print(_errors_line(f"{result['path']}, built-in profile", result))
    if (line := _ranking_line("ranking, built-in profile", result["ranking"])) is not None:
        screen.print(line)
    if (covered := result["interval_coverage"]) is not None:
        screen.print(
            f"inside the predictions' {covered['level']:.0%} intervals: {covered['covered']:.0%} of the "
            f"{covered['runs']} runs that had one"
        )
    groups = house_table(caption="error by group: runs, MAPE, signed median")
    for column in ("group", "value", "runs", "MAPE", "signed median"):
        groups.add_column(column, justify="left" if column in ("group", "value") else "right")
    for name, values in result["groups"].items():
        for value, s in values.items():
            groups.add_row(name, value, str(s["n"]), f"{s['mape']:.1%}", f"{s['signed_median']:+.1%}")
    screen.print(groups)
    worst = sorted(result["rows"], key=lambda row: -abs(row["error"]))[:10]
    misses = house_table(caption="the ten largest misses and the component each most likely sits in")
    for column in ("run", "tp·pp·dp", "measured", "predicted", "error", "most likely in"):
        misses.add_column(column, justify="left" if column in ("run", "most likely in") else "right")
    for row in worst:
        miss = row.get("miss")
        misses.add_row(
            row["label"],
            f"{row['tp']}·{row['pp']}·{row['dp']}",
            seconds(row["measured_s"]),
            seconds(row["predicted_s"]),
            f"{row['error']:+.1%}",
            (LABELS.get(miss["component"], miss["component"]) if miss["component"] else "outside the model")
            if miss
            else "-",
        )
    screen.print(misses)
    if document.get("fit") is not None:
        _runs_fit_table(document["fit"])


def _runs_fit_table(fit: dict[str, Any]) -> None:
    """The machine terms fitted to a --runs table, and the errors before and after."""
    screen = console()
    terms = house_table(caption=f"fitted to {fit['fitted_runs']} single-node runs -> {fit['written']}")
    for column in ("term", "base", "fitted", "± (fold spread)"):
        terms.add_column(column, justify="left" if column == "term" else "right")
    for name, t in fit["terms"].items():
        terms.add_row(name, f"{t['base']:.4g}", f"{t['value']:.4g}", f"{t['spread']:.2g}")
    screen.print(terms)
    if fit["not_fitted"]:
        screen.print("not fitted (no run moves them): " + ", ".join(fit["not_fitted"]))
    if fit["not_needed"]:
        screen.print(
            "kept at the base profile (held-out error no worse without): " + ", ".join(fit["not_needed"])
        )
    screen.print(_errors_line(f"held out, {fit['folds']}-fold", fit["cv"]))
    if (line := _ranking_line("ranking, held out", fit["cv_ranking"])) is not None:
        screen.print(line)
    screen.print(_errors_line("fitted, in sample", fit["in_sample"]))
    if fit["transfer"] is not None:
        screen.print(_errors_line("groups spanning nodes, predicted from the fit", fit["transfer"]))
    if (line := _ranking_line("ranking, groups spanning nodes", fit["transfer_ranking"])) is not None:
        screen.print(line)


def _fit(runs: list[tuple[str, dict[str, Any], float]], out: str) -> dict[str, Any]:
    from costmodel.audit.fit import Run, calibrate, fit_problem, fitted_profile

    profiles = {values["hw"] for _, values, _ in runs}
    if len(profiles) > 1:
        raise InputError(
            "--fit-profile",
            f"the logs name several profiles ({', '.join(sorted(profiles))}); fit one --hw at a time",
        )
    base = load_profile(profiles.pop())
    result = calibrate([Run(label, values, seconds) for label, values, seconds in runs], base)
    problem = fit_problem(result, base)
    if problem is not None:  # refused, not written with a flag
        raise InputError("--fit-profile", f"not written: {problem}")
    name = Path(out).stem
    profile = fitted_profile(result, base, name, datetime.date.today().isoformat())
    atomic_write_text(
        out, profile_yaml(profile, "fitted to training logs (`cp-plan audit`)"), "--fit-profile"
    )
    return {k: v for k, v in result.items() if k != "profile"} | {"written": out, "base": base.name}


def _table(result: dict[str, Any]) -> None:

    screen = console()
    c, m, p = result["config"], result["measured"], result["predicted"]
    screen.print(
        f"{result['log']} ({result['framework']}): {c['model']} S={c['seq']} on {c['gpus']} x {c['hw']}, "
        f"tp {c['tp']}, cp {c['cp']} ({c['cp_scheme']}), pp {c['pp']}, dp {c['dp']}, recompute {c['recompute']}"
    )
    table = house_table()
    for column in ("", "measured", "predicted", "ratio"):
        table.add_column(column, justify="left" if not column else "right")
    time = m["step_time_s"]
    table.add_row(
        "step time",
        f"{seconds(time['median'])} ±{time['spread']:.0%}",
        seconds(p["step_time_s"]),
        f"{time['median'] / p['step_time_s']:.2f}",
    )
    table.add_row(
        "model TFLOP/s per GPU",
        f"{m['model_tflops_per_gpu']:.0f}",
        f"{p['tflops_per_gpu']:.0f}",
        f"{m['model_tflops_per_gpu'] / p['tflops_per_gpu']:.2f}",
    )
    if m["tflops_per_gpu_source"] == "log":
        table.add_row("TFLOP/s per GPU (log)", f"{m['tflops_per_gpu']:.0f}", "", "")
    table.add_row("MFU", f"{m['mfu']:.1%}", "-" if p["mfu"] is None else f"{p['mfu']:.1%}", "")
    if m["memory_bytes"] is not None:
        table.add_row(
            "peak memory", f"{m['memory_bytes'] / 1e9:.1f} GB", f"{p['memory_bytes'] / 1e9:.1f} GB", ""
        )
    screen.print(table)
    screen.print(f"difference: {result['comparison']['attribution']['explanation']}")
    for finding in result["findings"]:
        screen.print(f"  {finding['severity']:<8} {finding['message']}")
    screen.print()


def _summary(results: list[dict[str, Any]]) -> None:
    """One row per log: measured and predicted step, their ratio, and the most severe finding."""

    table = house_table(caption="cp-plan audit LOG for one run in full")
    table.add_column("log", no_wrap=True, max_width=28)
    for column in ("measured", "predicted", "ratio", "most severe finding"):
        table.add_column(column, justify="right" if column in ("measured", "predicted", "ratio") else "left")
    for result in results:
        time = result["measured"]["step_time_s"]["median"]
        worst = result["findings"][0]
        table.add_row(
            Path(result["log"]).name,
            seconds(time),
            seconds(result["predicted"]["step_time_s"]),
            f"{time / result['predicted']['step_time_s']:.2f}",
            "-" if worst["kind"] == "read" else f"{worst['severity']} {worst['kind']}",
        )
    console().print(table)


def _fit_table(fit: dict[str, Any]) -> None:

    screen = console()
    screen.print(
        f"fitted {fit['base']}: kernel rates x {fit['compute_factor']:.3f}, links x {fit['comm_factor']:.3f} "
        f"-> {fit['written']}"
    )
    table = house_table()
    for column in ("run", "measured", "base", "fitted", "left out"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for row in fit["runs"]:
        left = f"{row['left_out_error']:+.1%}" if "left_out_error" in row else "-"
        table.add_row(
            row["run"],
            seconds(row["measured_s"]),
            f"{row['base_error']:+.1%}",
            f"{row['fitted_error']:+.1%}",
            left,
        )
    screen.print(table)
    if fit["left_out_runs"]:
        screen.print(f"not fitted (a critical finding): {', '.join(fit['left_out_runs'])}")
    loo = fit["left_out_median_abs_error"]
    screen.print(
        f"median |error|: base {fit['base_median_abs_error']:.1%}, fitted {fit['fitted_median_abs_error']:.1%}"
        + (f", left out {loo:.1%} (max {fit['left_out_max_abs_error']:.1%})" if loo is not None else "")
    )
