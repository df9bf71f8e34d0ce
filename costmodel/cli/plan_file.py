"""`cp-plan report PLAN.yaml`: one capacity-plan file as a report, on the terminal or as an HTML page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from costmodel.cli.options import console
from costmodel.core.errors import InputError
from costmodel.core.fileio import atomic_write_text
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.core.text import displayed


def report_cmd(
    plan: Annotated[
        str, typer.Argument(help="A capacity-plan YAML file (configs/plans/*.yaml).", show_default=False)
    ],
    html: Annotated[
        Optional[Path], typer.Option("--html", help="Write a self-contained HTML page here.")
    ] = None,
) -> None:
    """Report one capacity plan: its attention per TP rank, training memory, timelines and checks.

    Example: cp-plan report configs/plans/llama3-8b-128k-a100-nvlink.yaml --html plan.html
    """
    from costmodel.plans.evaluate import evaluate
    from costmodel.training.check import load_plan, resolve, run_checks

    located = load_plan(plan)
    resolved = resolve(located)
    placed = resolved.machine
    report = evaluate(resolved.attention, placed)
    if html is None:
        from costmodel.cli import render

        render.render_table(report, console())
        return
    if html.suffix.lower() not in {".html", ".htm"}:
        raise InputError("--html", f"{html.name}: accepted file types are .html and .htm")
    from costmodel.cli import html as page
    from costmodel.plans.bind import Evaluator
    from costmodel.plans.gantt import plan_timelines
    from costmodel.plans.uncertainty import certain_fit
    from costmodel.training.memory import fit_at, training_values

    fit = None
    if resolved.job is not None:  # ZeRO shards over DP x CP, which needs the job's size
        fit = certain_fit(fit_at(Evaluator(training_values(resolved.job))), resolved.job, DEFAULT_LEVEL)
    text = page.plan_page(
        report,
        resolved.attention,
        placed.profile,
        plan_timelines(resolved.attention, placed),
        fit=fit,
        checks=run_checks(located),
        title=located.plan.name,
    )
    written = atomic_write_text(html, text, "--html")
    sys.stderr.write(f"wrote {displayed(str(written))}\n")
