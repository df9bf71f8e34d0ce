"""The validation tables of the docs as Markdown: published figures next to the model's predictions.

The rows and predictions are :mod:`costmodel.training.validation`'s and :mod:`costmodel.inference.published`'s;
this module only writes them down."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from costmodel.inference.published import Published as Serving


def validation_table() -> str:
    """The validation table of docs/validation.md, then the rows outside GOAL with what the model misses."""
    from costmodel.training.validation import ROWS, VPP_ROWS, predict, vpp_sensitivity

    lines = [
        "| key | source | run (as published) | metric | published | predicted | error | held to |",
        "|---|---|---|---|---|---|---|---|",
    ]
    misses = []
    for row in ROWS:
        predicted = predict(row)
        error = f"{100 * (predicted / row.published - 1):+.1f} %"
        lines.append(
            f"| `{row.key}` | {row.source} | {row.run} | {row.metric} | {_shown(row.published, row.metric)} "
            f"| {_shown(predicted, row.metric)} | {error} | {'known miss' if row.misses else '15 %'} |"
        )
        if row.misses:
            misses.append(f"- `{row.key}` ({error}): {row.misses}.")
    cells = [
        f"v = {vpp}: " + ", ".join(f"{v:.0f}" for v in values) for vpp, values in vpp_sensitivity().items()
    ]
    keys = " and ".join(f"`{key}`" for key in VPP_ROWS)
    sensitivity = (
        f"Model TFLOP/s per GPU predicted for {keys} by virtual stages per device: {'; '.join(cells)}."
    )
    return "\n".join([*lines, "", "Known misses (outside 15 %):", "", *misses, "", sensitivity])


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
        f"{stats['held_median']:.0%} over the {sum(not r.misses for r in ROWS)} rows without a named miss."
    )
    return "\n".join(rows)


def _rate(row: Serving, value: float) -> str:
    if row.metric == "ttft":
        return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"
    return f"{value:,.0f} tok/s/GPU"
