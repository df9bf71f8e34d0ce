"""``--timeline``: one layer's ring schedule on the terminal, one row per rank, one character per time slice.

The rows come from :mod:`costmodel.plans.gantt` (the time model, unfolded); this module only draws.
Each character shows what its rank spends most of that slice doing; the ``link`` row above the ranks
marks when a transfer is in flight, so a transfer hidden under compute shows there and nowhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from costmodel.core.errors import InputError
from costmodel.core.units import percent, seconds

if TYPE_CHECKING:
    from rich.console import Console

    from costmodel.machines.binding import Machine
    from costmodel.plans.gantt import Timeline
    from costmodel.plans.inputs import PlanInputs

TimelineOpt = Annotated[
    bool,
    typer.Option(
        "--timeline", help="Also draw one layer's ring schedule: a row per rank, a column per time slice."
    ),
]

GLYPHS = {"compute": "█", "idle": "·", "transfer": "▒", "overhead": "▚"}
STYLES = {"compute": "green", "transfer": "red", "idle": "dim", "overhead": "yellow"}
FLIGHT = {"full": "━", "part": "╸", "none": " "}
LABEL = 9  # "rank 63  "
SHARE = 9  # "  100 % c"
MIN_COLUMNS = 20


def check_request(n: int, format: str) -> None:
    """Before any work: the terminal draws it (an HTML page always holds it), one row per rank."""
    if format not in ("table", "html"):
        raise InputError(
            "timeline",
            f"draws on the terminal (--format table); an html page always holds it; {format} output cannot",
        )
    if format == "table":
        check_rows(n)


def check_rows(n: int) -> None:
    """One row per rank: refuse what would not read as a chart, in one line."""
    from costmodel.plans.gantt import MAX_RANKS

    if n > MAX_RANKS:
        raise InputError(
            "timeline",
            f"draws one row per rank, at most {MAX_RANKS} (N = {n}); lower --n, or "
            "read the per-layout layer times in the report",
        )


def columns(timeline: Timeline, rank: int, width: int) -> list[str]:
    """The kind each of ``width`` equal time slices of ``rank``'s row spends most of its time on."""
    share = [dict.fromkeys(GLYPHS, 0.0) for _ in range(width)]
    slice_s = timeline.total_s / width
    for segment in timeline.segments(rank):
        first = min(int(segment.start_s / slice_s), width - 1)
        last = min(int(segment.end_s / slice_s), width - 1)
        for k in range(first, last + 1):
            overlap = min(segment.end_s, (k + 1) * slice_s) - max(segment.start_s, k * slice_s)
            if overlap > 0:
                share[k][segment.kind] += overlap
    return [max(cell, key=cell.__getitem__) for cell in share]


def in_flight(timeline: Timeline, width: int) -> list[str]:
    """Per slice: a transfer in flight for at least half of it, for some of it, or none."""
    slice_s = timeline.total_s / width
    spans = [
        (float(start), float(start + comm)) for start, comm in zip(timeline.step_start_s, timeline.comm_s)
    ]
    end = float(timeline.step_start_s[-1])
    spans.append((end, end + timeline.tail_s))
    flags = []
    for k in range(width):
        low, high = k * slice_s, (k + 1) * slice_s
        covered = sum(max(0.0, min(high, b) - max(low, a)) for a, b in spans)
        flags.append("full" if covered >= 0.5 * slice_s else "part" if covered > 0 else "none")
    return flags


def render(inputs: PlanInputs, machine: Machine, screen: Console) -> None:
    """The plan's layout: forward, and backward too when the plan's pass includes it."""
    from costmodel.plans.gantt import ring_timeline

    check_rows(inputs.cp)
    passes = [False] + ([True] if inputs.pass_ != "fwd" else [])
    for backward in passes:
        screen.print()
        draw(ring_timeline(inputs, machine, backward), screen)


def draw(timeline: Timeline, screen: Console) -> None:
    from rich.text import Text

    width = max(MIN_COLUMNS, screen.width - LABEL - SHARE)
    slice_s = timeline.total_s / width
    name = "backward" if timeline.backward else "forward"
    screen.print(
        Text(
            f"Ring timeline, one layer {name} · {timeline.layout} · {seconds(timeline.total_s)} · "
            f"{timeline.ranks} ranks x {len(timeline.step_s)} steps",
            style="bold",
        )
    )
    ticks = [" "] * width
    for j, start in enumerate(timeline.step_start_s[:-1]):
        k = min(int(start / slice_s), width - 1)
        label = str(j)
        if all(c == " " for c in ticks[max(k - 1, 0) : k + len(label) + 1]):
            ticks[k : k + len(label)] = label
    screen.print(Text("step".ljust(LABEL) + "".join(ticks)[:width], style="dim"))
    link = "".join(FLIGHT[f] for f in in_flight(timeline, width))
    screen.print(Text("link".ljust(LABEL), style="bold") + Text(link, style="cyan"))
    for rank in range(timeline.ranks):
        row = Text(f"rank {rank}".ljust(LABEL), style="bold")
        for kind in columns(timeline, rank, width):
            row.append(GLYPHS[kind], style=STYLES[kind])
        busy = timeline.totals(rank)["compute"] / timeline.total_s
        row.append(f" {percent(busy, 2):>6} c".rjust(SHARE), style="dim")
        screen.print(row, no_wrap=True, overflow="crop")
    legend = Text("legend".ljust(LABEL), style="dim")
    for kind, glyph in GLYPHS.items():
        legend.append(glyph, style=STYLES[kind]).append(f" {kind}  ")
    legend.append(FLIGHT["full"], style="cyan").append(" in flight")
    screen.print(legend)
    screen.print(
        Text(f"one character = {seconds(slice_s)}; c = share of the layer spent computing", style="dim")
    )
    screen.print(
        Text("· waits on the slowest rank; ▒ then on the link; ╸ in flight for part of one", style="dim")
    )
