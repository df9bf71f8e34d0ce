"""Planning a training run: `recommend`, `sweep` and `check`. Their flags come from the declared inputs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from costmodel.cli.options import (
    LevelOpt,
    PriceOpt,
    TokensOpt,
    console,
    declared,
    house_table,
    interval_level,
    token_budget,
    whole,
)
from costmodel.cli.output import Format, as_csv, emit, format_option
from costmodel.cli.search import (
    CELLS_KEY,
    PLAN_COLUMNS,
    CpOpt,
    GemmDtypeOpt,
    GlobalOpt,
    LayoutOpt,
    MicroOpt,
    PpOpt,
    RecomputeOpt,
    SchemeOpt,
    TopOpt,
    TpOpt,
    VppOpt,
    export,
    plan_cells,
    render_search,
    run_search,
)
from costmodel.core.errors import InputError
from costmodel.core.fileio import atomic_write_text, check_writable
from costmodel.core.intervals import Interval
from costmodel.core.text import displayed
from costmodel.core.units import parse_days, percent, seconds, short_percent, si, tokens_label
from costmodel.plans.inputs import (
    MAX_CP,
    MAX_DEVICES,
    MAX_TOKENS,
    TRAINING_DEFAULTS,
    MachineOverrides,
    PlanInputs,
    TrainingSetup,
    build,
    machine_for,
)
from costmodel.plans.job import FrameworkKnobs, StepSetup, make_job
from costmodel.plans.uncertainty import fit_margin
from costmodel.training.recommend import describe_scheme, recommend, recommend_plan
from costmodel.training.search import Constraints, check_constraints, label, weighed

COLOURS = {"green": "green", "amber": "yellow", "red": "red"}
# Flags that lay a job out: given, `recommend` searches layouts.
SEARCHED = (
    "gpus",
    "cp",
    "vpp",
    "micro_batch",
    "global_batch",
    "cp_scheme",
    "layout",
    "framework",
    "top",
    "gemm_dtype",
    "confidence",
)


@declared(
    inputs=PlanInputs,
    setup=TrainingSetup,
    machine_overrides=MachineOverrides,
    knobs=FrameworkKnobs,
    defaults=TRAINING_DEFAULTS | {"cp": 1},
    exclude={"cp", "layout", "tp", "pp", "recompute"},
)
def recommend_cmd(
    ctx: typer.Context,
    inputs: PlanInputs,
    setup: TrainingSetup,
    machine_overrides: MachineOverrides,
    knobs: FrameworkKnobs,
    tp: TpOpt = None,
    pp: PpOpt = None,
    cp: CpOpt = None,
    vpp: VppOpt = None,
    micro_batch: MicroOpt = None,
    global_batch: GlobalOpt = None,
    recompute: RecomputeOpt = None,
    cp_scheme: SchemeOpt = None,
    layout: LayoutOpt = None,
    gemm_dtype: GemmDtypeOpt = None,
    top: TopOpt = 5,
    max_seq: Annotated[
        bool,
        typer.Option(
            "--max-seq",
            help="Instead: the longest sequence that fits at each CP degree on --gpus (every other layout "
            "dimension searched), with the fastest plan there.",
        ),
    ] = False,
    tokens: TokensOpt = None,
    price: PriceOpt = None,
    level: LevelOpt = None,
    confidence: Annotated[
        Optional[str],
        typer.Option(
            "--confidence",
            help="Plan only layouts that fit memory with at least this probability, in [0.5, 0.99]: the "
            "search (and --max-seq, --all-plans) then plans within usable memory less the margin that measured "
            "peaks of the job's framework and GPU ask (0.9 needs 9 or more of them).",
            show_default=False,
        ),
    ] = None,
    deadline: Annotated[
        Optional[str],
        typer.Option(
            "--deadline",
            help="With --tokens: the fewest GPUs, of at most --gpus (doubling, then whole nodes between), whose "
            "pick trains the budget within this time (30d, 720h, 4w; a bare number is days), and the plan at that count; with "
            "--confidence, meets it with at least that probability too.",
            show_default=False,
        ),
    ] = None,
    all_plans: Annotated[
        Optional[Path],
        typer.Option(
            "--all-plans",
            help="Also write every plan the search weighed, fitting or not, to a .csv or .json file: layout, "
            "step time, MFU, memory and the step's breakdown.",
        ),
    ] = None,
    format: format_option("table", "json", "yaml", "megatron", "torchtitan") = Format.table,
) -> None:
    """The fastest layout that fits, and the CP degree to use: with --gpus, the plan over every
    TP x CP x PP x DP, micro-batch, recompute and CP scheme, then the window [N_min(memory), N_max(comm)]
    at that plan's TP, PP and recompute; without it, the window at the stated TP and PP.

    Needs --model: layers, hidden and vocabulary sizes set the memory and the step. --tp, --cp, --pp and
    the other layout flags fix a dimension of the search; the search keeps the plans --framework runs.
    --format megatron or torchtitan prints the plan as that framework's arguments (--format torchtitan
    plans for torchtitan unless --framework says otherwise). Example:
    cp-plan recommend --seq 128k --model llama3-8b --hw a100-nvlink --gpus 64
    """
    if inputs.model is None:
        raise InputError(
            "--model",
            "recommend needs a model preset (its layers, hidden and vocabulary sizes set "
            "the memory); e.g. --model llama3-8b",
        )
    stated = {"tp": tp or 1, "pp": pp or 1, "recompute": recompute or "selective"}
    setup = build(TrainingSetup, **setup.model_dump() | stated)
    fixed = {
        "tp": tp,
        "cp": cp,
        "pp": pp,
        "vpp": vpp,
        "micro_batch": micro_batch,
        "recompute": recompute,
        "cp_scheme": cp_scheme,
        "layout": layout,
    }
    if format is Format.torchtitan and not _given(ctx, "framework"):
        knobs = knobs.model_copy(update={"framework": "torchtitan"})
    if format is Format.torchtitan and not _given(ctx, "zero"):  # torchtitan shards with FSDP (ZeRO-3)
        setup = build(TrainingSetup, **setup.model_dump() | {"zero": 3})
    exporting = format in (Format.megatron, Format.torchtitan)
    budget_tokens, per_hour = token_budget(tokens, price)
    # The job is laid out when it is stated: its size, a flag only the search reads, a plan to export, or a
    # question only a plan answers.
    searching = (
        exporting or max_seq or budget_tokens is not None or all_plans is not None or _given(ctx, *SEARCHED)
    )
    _check_search_flags(max_seq, all_plans, format, budget_tokens is not None or deadline is not None)
    job = make_job(inputs, setup, build(StepSetup, gemm_dtype=gemm_dtype), machine_overrides, knobs)
    margin = sure = None
    if confidence is not None:
        sure = interval_level(confidence, "--confidence")
        margin = fit_margin(job, sure)
    if max_seq:
        _max_seq(job.training(), fixed, global_batch, format, margin)
        return
    job, weighed_counts = _within_deadline(
        job,
        fixed,
        global_batch,
        deadline=deadline,
        tokens=budget_tokens,
        gpus_given=_given(ctx, "gpus"),
        level=level,
        sure=sure,
        margin=margin,
        top=top,
    )
    found = None
    if searching:
        found = run_search(job.training(), fixed, global_batch, top, interval_level(level), margin=margin)
    if all_plans is not None:
        planned = job.training() if margin is None else margin.planned(job.training())
        _write_all_plans(planned, fixed, found["global_batch"], all_plans)
    if exporting:
        sys.stdout.write(export(found, format.value, inputs, job.setup))
        return
    if found is not None and found["pick"] is not None:
        report = recommend_plan(job, found)
        if budget_tokens is not None:
            from costmodel.training.capacity import budget

            pick = found["plans"][0]
            spent = budget(
                budget_tokens,
                found["global_batch"] * inputs.seq,
                pick["step_time_s"],
                job.gpus,
                per_hour,
                step_interval=Interval(**pick["time_s_interval"]),
            )
            report = report.model_copy(update={"budget": spent})
    else:
        report = recommend(job, level=interval_level(level)).model_copy(update={"search": found})
    report = report.model_copy(update={"deadline": weighed_counts})
    emit(report.model_dump(mode="json", by_alias=True), format, table=lambda: _render_report(report, found))


def _check_search_flags(max_seq: bool, all_plans: Path | None, format: Format, priced: bool) -> None:
    """--max-seq answers alone; a plans table is a .csv or .json that can be written (checked before the
    search)."""
    if max_seq and (priced or format in (Format.megatron, Format.torchtitan)):
        raise InputError(
            "--max-seq", "answers alone: not with --format megatron/torchtitan, --tokens or --deadline"
        )
    if all_plans is not None:
        if all_plans.suffix.lower() not in (".csv", ".json"):
            raise InputError("--all-plans", f"{all_plans.name}: accepted file types are .csv and .json")
        check_writable(all_plans, "--all-plans")


MOST_DAYS = 36_500.0  # a century: a deadline past it is a typo, not a plan


def _within_deadline(
    job, fixed: dict, global_batch, *, deadline, tokens, gpus_given: bool, level, sure, margin, top: int
):  # noqa: ANN001, ANN202
    """With --deadline, the counts it weighs (:func:`costmodel.training.capacity.fewest_gpus`) and the job at
    the fewest that meets it (at --gpus when none does); without it, the job as it is and None."""
    if deadline is None:
        return job, None
    from costmodel.training.capacity import Goal, fewest_gpus

    if tokens is None:
        raise InputError("--deadline", "needs --tokens: the budget to train within it")
    if not gpus_given:
        raise InputError("--deadline", "needs --gpus: the most GPUs the job may hold")
    days = parse_days(deadline, "--deadline")
    if not 0 < days <= MOST_DAYS:
        raise InputError(
            "--deadline", f"{deadline!r}; accepted: more than 0 and at most {MOST_DAYS:,.0f} days"
        )
    constraints = Constraints(**fixed)
    # the flags' layout checked at the most GPUs first, as the search checks it
    check_constraints(job.model, job.gpus, job.inputs.seq, constraints)
    counts = fewest_gpus(
        job.training(),
        Goal(tokens, days, sure),
        global_batch,
        constraints,
        level=interval_level(level),
        top=top,
        margin=margin,
    )
    return (job if counts.gpus is None else job.replace(gpus=counts.gpus)), counts


def _write_all_plans(job, fixed: dict, global_batch: int, path: Path) -> None:  # noqa: ANN001
    """Every plan the search weighed, to ``path`` as CSV or JSON, written whole or not at all."""
    rows = weighed(job, global_batch, Constraints(**fixed))
    text = as_csv(rows) if path.suffix.lower() == ".csv" else json.dumps(rows, indent=1) + "\n"
    atomic_write_text(path, text, "--all-plans")
    sys.stderr.write(
        f"wrote {displayed(str(path))}: {len(rows):,} plans, {sum(r['fits'] for r in rows):,} fit\n"
    )


def _max_seq(job, fixed: dict, global_batch: int | None, format: Format, margin=None) -> None:  # noqa: ANN001
    """The longest sequence that fits at each CP degree of the job's GPUs (with ``margin``, fits at its
    confidence), and the fastest plan there."""
    from costmodel.training.capacity import max_seq_table

    constraints = Constraints(**fixed)
    check_constraints(job.model, job.gpus, 1, Constraints(**(constraints.__dict__ | {"cp": None})))
    rows = max_seq_table(job if margin is None else margin.planned(job), global_batch, constraints)
    data = {
        "schema": "cp-plan/max-seq/v1",
        "model": job.model.name,
        "hw": job.machine.profile.name,
        "gpus": job.gpus,
        "global_batch_given": global_batch is not None,
        "constraints": constraints.given(),
        "confidence": None if margin is None else margin.as_dict(job.device_memory_bytes),
        "rows": [
            {
                "cp": r.cp,
                "seq": r.seq,
                "granularity": r.granularity,
                "global_batch": r.global_batch,
                "next_seq": None if r.seq is None else r.seq + r.granularity,
                "next_least_bytes": None if math.isnan(r.next_least_bytes) else r.next_least_bytes,
                "device_memory_bytes": r.device_bytes,
                "plan": r.plan,
            }
            for r in rows
        ],
    }
    emit(data, format, table=lambda: _render_max_seq(data))


def _render_max_seq(data: dict) -> None:
    out = console()
    sure = data["confidence"]
    out.print(
        "cp-plan   the longest sequence that fits"
        + ("" if sure is None else f" at {sure['level']:.0%}")
        + f" · {data['model']} · {data['hw']} · {data['gpus']} GPUs"
        + ("" if data["global_batch_given"] else " · global batch 4M tokens' worth, at least 1 sequence")
    )
    table = house_table(padding=(0, 1), collapse_padding=True)
    columns = ("N", "longest S", "step", *PLAN_COLUMNS, "step s", "tok/s", "S+step")
    for column in columns:
        table.add_column(column, justify="left" if column in ("CP", "rc") else "right", no_wrap=True)
    for row in data["rows"]:
        plan = row["plan"]
        if row["seq"] is None or plan is None:
            table.add_row(str(row["cp"]), "none fits", f"{row['granularity']:,}", *[""] * 6, _over(row))
            continue
        rate = row["global_batch"] * row["seq"] / plan["step_time_s"] / plan["gpus"]
        table.add_row(
            str(row["cp"]),
            f"{row['seq']:,}",
            f"{row['granularity']:,}",
            *plan_cells(plan),
            f"{plan['step_time_s']:.4g}",
            f"{rate:,.0f}",
            "longest accepted" if row["next_least_bytes"] is None else _over(row),
        )
    out.print(table)
    out.print(
        "N: the CP degree; tok/s: tokens per second per GPU; longest S: the longest multiple of the step that some plan at that CP degree fits (TP, PP, "
        "micro-batch, recompute and CP scheme searched), and the fastest plan there; S + step: how far the "
        f"least memory any plan then needs passes the {si(data['rows'][0]['device_memory_bytes'], 'B', 3)} "
        + (
            "usable"
            if sure is None
            else f"planned ({1 - 1 / sure['margin']:.1%} under usable memory: {sure['from']})"
        )
        + f" per device (none fits: at the shortest S); {CELLS_KEY}",
        style="dim",
    )


def _over(row: dict) -> str:
    """What the next length needs beyond the device: the margin that ends the search."""
    if math.isinf(row["next_least_bytes"]):
        return "no layout"
    return f"+{si(row['next_least_bytes'] - row['device_memory_bytes'], 'B', 3)}"


def _render_report(report, found) -> None:  # noqa: ANN001
    """The searched plan and its window, or the window at the stated TP and PP; then the search's ranking."""

    if report.recommendation.step_time_s is not None:
        _render_plan(report)
        _render_window(
            report, f"Usable CP degrees at {_plan_flags(report)}", plan_cp=report.recommendation.cp
        )
        render_search(found)
    else:
        _render_recommendation(report)
        if found is not None:
            render_search(found)


def _given(ctx: typer.Context, *names: str) -> bool:
    """Whether any of these flags was given, rather than left at its default."""
    sources = (ctx.get_parameter_source(name) for name in names)
    return any(source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT") for source in sources)


def _plan_flags(report) -> str:  # noqa: ANN001
    """``TP 1 · PP 2 · mb 1 · recompute full``: where a searched plan's window is evaluated."""
    s = report.setup
    rec = report.recommendation
    stages = f" (v {rec.vpp})" if rec.vpp and rec.vpp > 1 else ""
    tuned = f" · {s.finetune}" if s.finetune != "full" else ""
    return f"TP {s.tp} · PP {s.pp}{stages} · mb {rec.micro_batch} · recompute {s.recompute}{tuned}"


def _header(report):  # noqa: ANN001, ANN202
    from rich.table import Table

    i = report.inputs
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    mask = "causal" if i.causal else "non-causal"
    head.add_row("cp-plan", f"recommend · S = {i.seq:,} · {i.model} · {report.hw} · {mask} · {i.pass_}")
    if report.changed:
        head.add_row("changed", report.changed)
    if report.topology:
        head.add_row("topology", report.topology)
    return head


def _memory_line(fit) -> str:  # noqa: ANN001
    from costmodel.cli.render import memory_line

    return f"at N = {fit.n}: " + memory_line(
        fit.by_category, fit.total_bytes, fit.device_memory_bytes, fit.fits
    )


def _certainty(time: Interval | None, fit) -> str:  # noqa: ANN001
    """The pick's intervals and the chance it fits, on one line."""
    from costmodel.cli.render import certainty_parts

    parts = certainty_parts(time, fit.total_bytes_interval, fit.fits_probability, fit.fits)
    return f"{fit.total_bytes_interval.level:.0%} interval: " + "; ".join(parts)


def _window_line(report) -> str:  # noqa: ANN001
    rec = report.recommendation
    window = f"[{rec.n_min_memory or '-'}, {rec.n_max_comm or '-'}]"
    if rec.n_min_memory_real is None:
        fits = "the model states alone do not fit"
    elif rec.n_min_memory_real <= 1:
        fits = "memory fits without CP"
    else:
        fits = f"memory fits from N = {rec.n_min_memory_real:.1f}"
        largest = report.candidates[-1].n
        if rec.n_min_memory_real > largest:
            fits += f", beyond the largest usable N = {largest}"
    return f"N_min(memory) .. N_max(comm) = {window} ({fits})"


def _render_plan(report) -> None:  # noqa: ANN001
    """The searched plan first, then the window at its TP, PP, recompute and micro-batch."""
    from rich.text import Text

    s, rec, search = report.setup, report.recommendation, report.search
    head = _header(report)
    head.add_row(
        "job",
        f"{search['gpus']} GPUs · {s.zero_label} · global batch {rec.global_batch:,} sequences · "
        f"{search['framework']} plans"
        + (f" · {search['gemm_dtype']} linear layers" if search["gemm_dtype"] else ""),
    )
    pick = search["plans"][0]
    used = f" · on {pick['gpus']:,} of the {search['gpus']:,} GPUs" if pick["gpus"] < search["gpus"] else ""
    head.add_row("use", Text(label(pick) + used, style="bold green"))
    head.add_row("step", f"{seconds(rec.step_time_s)} · MFU {rec.mfu:.0%} (layout search below)")
    head.add_row("memory", _memory_line(report.fit))
    head.add_row("sure", _certainty(Interval(**pick["time_s_interval"]), report.fit))
    head.add_row("window", f"at {_plan_flags(report)}: {_window_line(report)}")
    head.add_row("why", rec.reason)
    if report.budget is not None:
        from costmodel.cli.render import budget_line

        head.add_row("budget", budget_line(report.budget))
    _add_deadline(head, report.deadline)
    console().print(head)
    _render_counts(report.deadline)


def _render_recommendation(report) -> None:  # noqa: ANN001
    """The CP window at the stated TP and PP, and its pick."""
    from rich.text import Text

    i, s, rec = report.inputs, report.setup, report.recommendation
    head = _header(report)
    head.add_row(
        "job",
        f"{s.gpus} GPUs = TP {s.tp} x PP {s.pp} x (DP x CP {s.shard_group}) · {s.zero_label} · "
        f"recompute {s.recompute}",
    )
    if rec.n_recommended:
        scheme = describe_scheme(rec.scheme, i.layout, rec.n_recommended, rec.n_ulysses)
        dp = next(c.dp for c in report.candidates if c.n == rec.n_recommended)
        head.add_row("use", Text(f"N = {rec.n_recommended}, {scheme}, DP = {dp}", style="bold green"))
    else:
        head.add_row("use", Text("no CP degree works", style="bold red"))
    head.add_row("window", _window_line(report))
    head.add_row("why", rec.reason)
    head.add_row("memory", _memory_line(report.fit))
    head.add_row("sure", _certainty(None, report.fit))
    for fix in rec.fixes:
        head.add_row("fix", fix)
    _add_deadline(head, report.deadline)
    console().print(head)
    _render_counts(report.deadline)
    _render_window(report, "Usable CP degrees")


def _add_deadline(head, deadline) -> None:  # noqa: ANN001
    """The answer to --deadline, one row: the fewest GPUs that meet it, or that none up to --gpus does."""
    if deadline is None:
        return
    goal = f"{si(deadline.tokens, '', 3).replace(' ', '')} tokens within {deadline.days:g} days"
    if deadline.confidence is not None:
        goal += f" at {deadline.confidence:.0%} or more"
    if deadline.gpus is None:
        text = f"no count of at most {deadline.most_gpus:,} GPUs trains {goal}: the plan above is at {deadline.most_gpus:,}"
    else:
        met = next(c for c in deadline.counts if c.gpus == deadline.gpus)
        chance = (
            ""
            if met.meets_probability is None
            else f", meets it with probability {met.meets_probability:.0%}"
        )
        text = f"{met.gpus:,} GPUs, the fewest that train {goal}: {met.days:,.1f} days{chance}"
    head.add_row("deadline", text)


def _render_counts(deadline) -> None:  # noqa: ANN001
    """Each GPU count --deadline weighed, smallest first."""
    if deadline is None:
        return
    from costmodel.cli.render import bounds_text

    table = house_table(
        caption="counts weighed, smallest first: the plan recommend picks at each (layout TPxCPxPPxDP); "
        "P(meets): the chance the run ends in time"
    )
    level = next((row.days_interval.level for row in deadline.counts if row.days_interval), None)
    spread = "interval" if level is None else f"{level:.0%} interval"
    for column in ("GPUs", "layout", "step", "days", spread, "P(meets)"):
        table.add_column(column, justify="left" if column in ("layout", spread) else "right")
    for row in deadline.counts:
        if row.plan is None:
            table.add_row(f"{row.gpus:,}", "no plan fits", "-", "-", "-", "-")
            continue
        shown = bounds_text(row.days_interval, ",.1f") or "-"
        chance = "-" if row.meets_probability is None else f"{row.meets_probability:.0%}"
        table.add_row(
            f"{row.gpus:,}", row.layout, seconds(row.step_time_s), f"{row.days:,.1f}", shown, chance
        )
    console().print()
    console().print(table)


def _render_window(report, title: str, plan_cp: int | None = None) -> None:  # noqa: ANN001
    """One row per usable CP degree; the plan's, where there is one, in bold."""
    from rich.text import Text

    out = console()
    table = house_table(title=title)
    for name in ("N", "DP", "memory", "fits", "best scheme", "ratio", "exposed", "verdict", "link"):
        table.add_column(
            name, justify="right" if name in {"N", "DP", "memory", "ratio", "exposed"} else "left"
        )
    for c in report.candidates:
        table.add_row(
            str(c.n),
            str(c.dp),
            si(c.total_bytes, "B", 3),
            "yes" if c.fits else "no",
            c.best_scheme,
            percent(c.comm_ratio),
            seconds(c.exposed_comm_s),
            Text(c.verdict, style=COLOURS[c.verdict]),
            c.link_scope,
            style="bold" if c.n == plan_cp else None,
        )
    out.print()
    out.print(table)
    out.print(
        "best scheme: least exposed communication per layer (then least communication); exposed: per layer, "
        f"{report.inputs.pass_}",
        style="dim",
    )


@declared(
    inputs=PlanInputs,
    setup=TrainingSetup,
    machine_overrides=MachineOverrides,
    exclude={"seq", "cp", "block", "hw", "gpus"},
    only={
        "batch",
        "heads",
        "kv_heads",
        "head_dim",
        "dtype",
        "causal",
        "efficiency",
        "model",
        "pass_",
        "tp",
        "pp",
        "zero",
        "recompute",
        "offload",
        "sequence_parallel",
        "attention_kernel",
        "memory_headroom",
        "packing",
        "window",
        "attention_chunk",
        *MachineOverrides.model_fields,
    },
    # A sweep's setup holds its --gpus, or where none is given (no step times) one TP x PP slice.
    defaults={
        "seq": 1,
        "cp": 1,
        "block": 1,
        "gpus": lambda flags: flags["gpus"] or flags["tp"] * flags["pp"],
    },
)
def sweep_cmd(
    inputs: PlanInputs,
    setup: TrainingSetup,
    machine_overrides: MachineOverrides,
    gpus: Annotated[
        Optional[int],
        whole("--gpus", "-g", low=1, high=MAX_DEVICES, help="With --model: also N_min(memory) per S."),
    ] = None,
    seq: Annotated[
        str, typer.Option("--seq", "-s", help="S values: 256k, 8k,32k or 8k..1M (doubling).")
    ] = "8k..1M",
    cp: Annotated[
        str, typer.Option("--cp", "--n", "-n", help="CP degrees N: 8, 2,4,8 or 1..64 (doubling).")
    ] = "1..64",
    hw: Annotated[str, typer.Option("--hw", help="Profiles, comma-separated.")] = "a100-nvlink",
    format: format_option("table", "csv", "json", "html") = Format.table,
    plot: Annotated[
        Optional[Path], typer.Option("--plot", help="Write a .png or .svg plot (needs matplotlib).")
    ] = None,
    global_batch: GlobalOpt = None,
    docs: Annotated[
        Optional[str],
        typer.Option(
            "--docs", help="Packed documents, as for cp-plan, packed into every S (docs/packing.md)."
        ),
    ] = None,
) -> None:
    """The step comm ratio over a grid of S, N and machines, vectorised, with the verdict bands.

    With --model and --gpus it also gives N_min(memory) per S and the whole step's time per (S, N): the
    fastest plan that fits at that CP degree, with the stated --tp, --pp and --recompute. Example:
    cp-plan sweep --seq 8k..1M --cp 1..64 --hw a100-nvlink,h100-ib --causal --plot sweep.png
    """
    from costmodel.training.sweep import parse_grid, sweep

    seqs, ns = parse_grid(seq, "--seq", MAX_TOKENS), parse_grid(cp, "--cp", MAX_CP, tokens=False)
    from costmodel.training.sweep import MAX_PROFILES, MAX_STEP_SEARCHES

    if hw.count(",") >= MAX_PROFILES:  # before splitting: a huge list is refused without building it
        raise InputError("--hw", f"{hw.count(',') + 1} profiles; a sweep takes at most {MAX_PROFILES}")
    names = [name.strip() for name in hw.split(",") if name.strip()]
    if not names:
        raise InputError("--hw", "give at least one profile")
    timed = bool(inputs.model) and gpus is not None  # the step-time grid: a layout search per (S, profile)
    if not timed and global_batch is not None:
        raise InputError("--global-batch", "sets the step times, which need --model and --gpus")
    if timed and len(seqs) * len(names) > MAX_STEP_SEARCHES:
        raise InputError(
            "--seq",
            f"{len(seqs)} S values x {len(names)} --hw profiles: with --model and --gpus each pair is a layout "
            f"search for the step times; at most {MAX_STEP_SEARCHES} pairs",
        )
    if plot is not None:  # the destination before the grid; the plot itself after the table
        from costmodel.cli.plot import check_plot

        check_plot(plot)
    machines = [machine_for(inputs.model_copy(update={"hw": name}), machine_overrides) for name in names]
    jobs = [
        make_job(inputs.model_copy(update={"hw": name}), setup, None, machine_overrides) if timed else None
        for name in names
    ]
    grids = [
        sweep(inputs, seqs, ns, machine, job, docs=docs) for machine, job in zip(machines, jobs, strict=True)
    ]
    if jobs[0] is not None:
        from costmodel.training.sweep import step_times

        for grid, job in zip(grids, jobs, strict=True):
            step_times(grid, job, global_batch)
    rows = [row for grid in grids for row in grid.rows()]

    def html() -> str:
        from costmodel.cli.html import sweep_page

        return sweep_page(grids, inputs)

    emit(
        {"schema": "cp-plan/sweep/v1", "pass": inputs.pass_, "causal": inputs.causal, "rows": rows},
        format,
        table=lambda: _render_sweep(grids, inputs.pass_, [machine.profile.changed for machine in machines]),
        csv=lambda: as_csv(rows),
        html=html,
    )
    if plot is not None:  # after the table: a plot that cannot be drawn does not cost the answer
        from costmodel.cli.plot import plot_sweep

        sys.stderr.write(f"wrote {plot_sweep(grids, plot, inputs)}\n")


def _render_sweep(grids, pass_: str, changed: list[str]) -> None:  # noqa: ANN001
    """Each profile's grid; ``changed``, each profile's command-line changes (said under its grid)."""
    from rich.text import Text

    from costmodel.cli.render import changed_line

    out = console()
    names = ["green", "amber", "red"]
    for grid, said in zip(grids, changed, strict=True):
        out.print(f"{grid.profile}: {pass_} step comm ratio (rows S, columns N)", style="bold")
        table = house_table()  # the title above it: a table's own wraps at its width, a few columns wide
        table.add_column("S", justify="right")
        for n in grid.ns:
            table.add_column(f"{n}{'*' if grid.inter_node[list(grid.ns).index(n)] else ''}", justify="right")
        table.add_column("N_max", justify="right")
        verdicts = grid.verdicts()
        for i, seq in enumerate(grid.seqs):
            cells = []
            for j in range(len(grid.ns)):
                if verdicts[i, j] < 0:
                    cells.append("")
                    continue
                cells.append(Text(short_percent(grid.ratio[i, j]), style=COLOURS[names[verdicts[i, j]]]))
            table.add_row(tokens_label(int(seq)), *cells, f"{grid.n_max[i]:,.1f}")
        out.print(table)
        if any(grid.inter_node):
            out.print("* the ring leaves the node", style="dim")
        if said:
            out.print(changed_line(said, grid.profile), style="dim")
        if grid.step_time_s is not None:
            _render_step_times(grid)


def _render_step_times(grid) -> None:  # noqa: ANN001
    console().print(
        f"{grid.profile}: step time, the fastest plan that fits at each N (rows S, columns N)", style="bold"
    )
    table = house_table()
    table.add_column("S", justify="right")
    for n in grid.ns:
        table.add_column(str(n), justify="right")
    for i, seq in enumerate(grid.seqs):
        cells = ["" if math.isnan(t) else seconds(float(t)) for t in grid.step_time_s[i]]
        table.add_row(tokens_label(int(seq)), *cells)
    console().print(table)
    if any(math.isnan(t) for row in grid.step_time_s for t in row):
        console().print(
            "blank: no plan at that N fits in memory with the stated --tp, --pp and --recompute, or N does not "
            "divide S or --gpus (cp-plan recommend says what would fit)",
            style="dim",
        )


def check_cmd(
    plans: Annotated[list[str], typer.Argument(help="Capacity-plan YAML files.", show_default=False)],
    format: format_option("table", "json", "junit", "github") = Format.table,
    confidence: Annotated[
        Optional[str],
        typer.Option(
            "--confidence",
            help="fits_memory, max_step_time_s, min_tokens_per_s and min_mfu pass only when the plan meets them "
            "with at least this probability, in [0.5, 0.99] (from measured peaks and steps of its framework and "
            "GPU; 0.9 needs 9 or more of them).",
        ),
    ] = None,
) -> None:
    """Check capacity plans against their expectations: exit 0 all pass, 1 any fails, 2 invalid file.

    Example: cp-plan check configs/plans/*.yaml --format github
    """
    from costmodel.cli import ci
    from costmodel.training.check import InvalidPlan, load_plans, run_checks

    surely = None if confidence is None else interval_level(confidence, "--confidence")
    try:
        located = load_plans(plans)  # every file is valid before anything runs
        results = [result for plan in located for result in run_checks(plan, surely)]
    except InvalidPlan as exc:
        problems = {
            Format.github: ci.github_problems,
            Format.junit: ci.junit_problems,
            Format.json: ci.json_problems,
        }.get(format)
        if problems is not None:  # `> report.xml` made the file already: never leave it empty
            sys.stdout.write(problems(exc))
        raise
    data = {
        "schema": ci.CHECK_SCHEMA,
        "passed": all(r.passed for r in results),
        "results": [r.__dict__ for r in results],
        "invalid": [],
    }
    emit(
        data,
        format,
        table=lambda: _render_checks(results),
        junit=lambda: ci.junit(results),
        github=lambda: ci.github(results),
    )
    if not all(r.passed for r in results):
        raise typer.Exit(1)


def _render_checks(results) -> None:  # noqa: ANN001
    from rich.text import Text

    out = console()
    by_plan: dict[str, list] = {}
    for r in results:
        by_plan.setdefault(r.plan, []).append(r)
    for path, items in by_plan.items():
        ok = all(r.passed for r in items)
        out.print(
            Text("pass  " if ok else "FAIL  ", style="bold green" if ok else "bold red")
            + Text(displayed(path), style="bold")  # a name as the shell passed it, control characters escaped
        )
        out.print(f"      {items[0].name}", style="dim")
        for r in items:
            mark = Text("  ✓ " if r.passed else "  ✗ ", style="green" if r.passed else "red")
            out.print(mark + Text(f"{r.check} (line {r.line}): {r.detail}"))
    failed = sum(not r.passed for r in results)
    out.print(
        f"{len(results) - failed} checks passed, {failed} failed in {len(by_plan)} plan"
        + ("s" if len(by_plan) != 1 else ""),
        style="bold red" if failed else "bold green",
    )
