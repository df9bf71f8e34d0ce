"""Tables of the docs as Markdown: the model presets, and published figures next to the model's predictions.

The rows and predictions are :mod:`costmodel.training.validation`'s and :mod:`costmodel.inference.published`'s;
this module only writes them down."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from costmodel.audit.runs import RHO_GOAL, RHO_LAYOUTS, spearman
from costmodel.core.units import GIB
from costmodel.plans.models import builtin_models, load_model

if TYPE_CHECKING:
    from costmodel.inference.published import Published as Serving
    from costmodel.training.validation import Published as TrainingRow


def model_presets() -> str:
    """Every built-in model preset with the shape it sets (docs/index.md)."""
    lines = [
        "| preset | layers | hidden | heads (KV) | head dim | FFN | vocab | experts | what |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in builtin_models():
        m = load_model(name)
        experts = f"{m.experts_per_token} of {m.experts}" if m.experts else ""
        lines.append(
            f"| `{name}` | {m.layers} | {m.hidden:,} | {m.heads} ({m.kv_heads}) | {m.head_dim} | {m.ffn_hidden:,} "
            f"| {m.vocab:,} | {experts} | {m.description} |"
        )
    return "\n".join(lines)


def validation_table() -> str:
    """The validation table of docs/validation.md, then the rows outside GOAL with what the model misses, the
    rows held out, and how well each job's layouts are ordered."""
    from costmodel.training.validation import (
        GOAL,
        HELD_OUT,
        ROWS,
        VPP_ROWS,
        by_framework,
        predict,
        vpp_sensitivity,
    )

    header = [
        "| key | source | framework (profile) | run (as published) | metric | published | predicted | error "
        "| held to |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    predicted = {row.key: predict(row) for row in [*ROWS, *HELD_OUT]}
    misses: list[str] = []

    def table(rows: list[TrainingRow]) -> list[str]:
        lines = list(header)
        for row in rows:
            error = f"{100 * (predicted[row.key] / row.published - 1):+.1f} %"
            lines.append(
                f"| `{row.key}` | {row.source} | {row.framework} ({row.profile}) | {row.run} | {row.metric} "
                f"| {_shown(row.published, row.metric)} | {_shown(predicted[row.key], row.metric)} | {error} "
                f"| {'known miss' if row.misses else '15 %'} |"
            )
            if row.misses:
                misses.append(f"- `{row.key}` ({error}): {row.misses}.")
        return lines

    def summary(name: str, rows: list[TrainingRow]) -> str:
        errors = [abs(predicted[row.key] / row.published - 1) for row in rows]
        within = sum(e <= GOAL for e in errors)
        return f"{name}: {len(rows)} rows, median |error| {100 * statistics.median(errors):.1f} %, {within} within 15 %"

    kept, held = table(ROWS), table(HELD_OUT)
    cells = [
        f"v = {vpp}: " + ", ".join(f"{v:.0f}" for v in values) for vpp, values in vpp_sensitivity().items()
    ]
    keys = " and ".join(f"`{key}`" for key in VPP_ROWS)
    sensitivity = (
        f"Model TFLOP/s per GPU predicted for {keys} by virtual stages per device: {'; '.join(cells)}."
    )
    medians = "; ".join(
        f"{name} {100 * s['median']:.1f} % ({s['rows']} rows)" for name, s in by_framework().items()
    )
    return "\n".join(
        [
            *kept,
            "",
            f"Median |error| by framework: {medians}.",
            "",
            "Held out: rows no constant or choice of the model was made on (`validation/training_published_holdout.yaml`):",
            "",
            *held,
            "",
            f"{summary('Kept', ROWS)}; {summary('held out', HELD_OUT)}.",
            "",
            "Layouts of one job (model, sequence, GPUs, batch), kept and held-out rows together, in the order the",
            "model and the source put them: Spearman's rho between predicted and published figures, jobs of",
            f"{RHO_LAYOUTS} layouts or more (goal {RHO_GOAL}).",
            "",
            *_job_orders([*ROWS, *HELD_OUT], predicted),
            "",
            "Known misses (outside 15 %):",
            "",
            *misses,
            "",
            sensitivity,
        ]
    )


def job_orders(rows: list[TrainingRow], predicted: dict[str, float]) -> list[tuple[str, int, float | None]]:
    """Each job (:func:`~costmodel.training.validation.job_key`) of RHO_LAYOUTS layouts or more among ``rows``: its
    name, its layouts, and Spearman's rho between the published and the predicted figures (None: no order)."""
    from costmodel.training.validation import job_key

    jobs: dict[str, list[TrainingRow]] = {}
    for row in rows:
        jobs.setdefault(job_key(row), []).append(row)
    out = []
    for members in jobs.values():
        if len(members) < RHO_LAYOUTS:
            continue
        s = members[0].setup
        name = f"{s['model']}, {s['seq']:,} tokens, {s['gpus']} x {s['hw']}, batch {s['global_batch']}"
        rho = spearman([r.published for r in members], [predicted[r.key] for r in members])
        out.append((name, len(members), rho))
    return out


def _job_orders(rows: list[TrainingRow], predicted: dict[str, float]) -> list[str]:
    lines = ["| job | layouts | Spearman's rho |", "|---|---|---|"]
    for job, layouts, rho in job_orders(rows, predicted):
        lines.append(f"| {job} | {layouts} | {'-' if rho is None else f'{rho:+.2f}'} |")
    return lines


def memory_table() -> str:
    """The memory table of docs/validation.md: each published peak per GPU, the model's figure of its kind,
    the error; the fitting part, then the held-out part's summary."""
    from costmodel.training.memory_validation import GOAL, compared

    lines = [
        "| run | framework | reported | measured | model | error | held to |",
        "|---|---|---|---|---|---|---|",
    ]
    misses, summary = [], []
    for part in ("fitting", "holdout"):
        errors = []
        for row, predicted, why in compared(part):
            if predicted is None:
                misses.append(f"- `{row.id}` ({part}): {why}.")
                continue
            error = predicted / row.measured_bytes - 1
            errors.append(abs(error))
            if part == "fitting":
                lines.append(
                    f"| `{row.id}` | {row.framework} | {row.kind} | {row.measured_gib:.1f} GiB | "
                    f"{predicted / GIB:.1f} GiB | {100 * error:+.1f} % | {'known miss' if why else '15 %'} |"
                )
            if why and part == "fitting":
                misses.append(f"- `{row.id}` ({100 * error:+.1f} %): {why}.")
        within = sum(e <= GOAL for e in errors)
        summary.append(
            f"- {part}: {len(errors)} rows, median |error| {100 * statistics.median(errors):.1f} %, worst "
            f"{100 * max(errors):.1f} %, {within} within {GOAL:.0%}"
        )
    return "\n".join([*lines, "", *summary, "", "Known misses and rows not planned:", "", *misses])


def _shown(value: float, metric: str) -> str:
    if metric.startswith("mfu"):
        return f"{100 * value:.1f} %"
    return f"{value:.2f}" if metric == "time_s" else f"{value:.0f}"


def published_table() -> str:
    """The inference table of docs/inference.md: serving figures, the model's, the error, the median."""
    from costmodel.inference.published import ROWS, summary

    rows = [
        "| figure | source | serving (as stated) | run | published | model | error | known miss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        model = row.predicted()
        rows.append(
            f"| `{row.key}` | {row.source} | {row.serving} | {row.run} | {_rate(row, row.published)} | "
            f"{_rate(row, model)} | {model / row.published - 1:+.0%} | {row.misses or '—'} |"
        )
    stats = summary()
    rows.append("")
    rows.append(
        f"Median |error| {stats['median']:.0%} over all {len(ROWS)} rows (largest {stats['max']:.0%}); "
        f"{stats['median_unmissed']:.0%} over the {sum(not r.misses for r in ROWS)} rows without a named miss."
    )
    return "\n".join(rows)


def _rate(row: Serving, value: float) -> str:
    if row.metric != "tokens_per_s_per_gpu":  # a time: TTFT, TPOT or a batch's latency
        return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"
    return f"{value:,.0f} tok/s/GPU"
