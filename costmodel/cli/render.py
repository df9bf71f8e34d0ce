"""Turn a :class:`~costmodel.plans.schema.Report` into a rich screen, Markdown, JSON or YAML.

Presentation only: every number shown is a field of the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from costmodel.cli.options import house_table
from costmodel.core.intervals import Interval
from costmodel.core.units import count, percent, seconds, si, tokens_label
from costmodel.plans import cp as registry
from costmodel.plans.bind import Evaluation
from costmodel.plans.schema import Budget, MemoryCategories, Report
from costmodel.plans.verdict import band

if TYPE_CHECKING:
    from rich.console import Console

COLOURS = {"green": "bold green", "amber": "bold yellow", "red": "bold red"}


def coloured(cell: str) -> Any:
    """A verdict (green, amber, red) in its colour; any other cell as plain text."""
    from rich.text import Text

    return Text(cell, style=COLOURS.get(cell, ""))


CATEGORY_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer",
    "fsdp_buffers": "FSDP buffers",
    "activations": "activations",
    "loss": "loss",
    "working": "backward working set",
    "cp_buffers": "CP buffers",
}


def budget_line(budget: Budget) -> str:
    """A token budget at one step: steps, wall days, GPU-hours and the cost where priced, the days and the cost
    with their intervals where the step has one."""
    days = budget.wall_days_interval
    cost = ""
    if budget.cost is not None:
        cost = f" · {budget.cost:,.0f}{_within(budget.cost_interval, ',.0f')} at {budget.price_per_gpu_hour:g} per GPU-hour"
    return (
        f"{si(budget.tokens, '', 3).replace(' ', '')} tokens at {budget.tokens_per_step:,} a step: {budget.steps:,} steps · "
        f"{budget.wall_days:,.1f} days{_within(days, ',.1f')} · {budget.gpu_hours:,.0f} GPU-hours on "
        f"{budget.gpus:,} GPUs{cost}"
    )


def bounds_text(band: Interval | None, fmt: str) -> str | None:
    """``lo-hi`` in the number format ``fmt``, or None where there is no interval."""
    if band is None or not band.known:
        return None
    return f"{band.lo:{fmt}}-{band.hi:{fmt}}"


def _within(band: Interval | None, fmt: str) -> str:
    """`` (80%: lo-hi)`` after a figure, or nothing where it has no interval."""
    shown = bounds_text(band, fmt)
    return "" if shown is None else f" ({band.level:.0%}: {shown})"  # type: ignore[union-attr]


def memory_line(by: MemoryCategories, total: float, usable: float, fits: bool) -> str:
    """Memory per device at the step's peak, by what holds it, when the peak falls, and whether it fits."""
    labels = CATEGORY_LABELS
    if by.peak.startswith("the optimizer step"):
        labels = labels | {"working": "the step's temporaries"}
    parts = " + ".join(f"{label} {si(getattr(by, k), 'B')}" for k, label in labels.items() if getattr(by, k))
    verdict = "fits" if fits else "DOES NOT FIT"
    if not fits and by.floor_bytes <= usable:
        # The fit is judged on the reservation: published runs this tight both ran and ran out of memory
        # (docs/validation.md, "The chance to fit, against runs that ran out of memory").
        verdict += (
            f" (its tensors and the runtime, {si(by.floor_bytes, 'B')}, would fit only were the allocator to give back "
            "its cache: published runs this tight have run and have run out of memory)"
        )
    return (
        f"{parts} = {si(by.allocated_bytes, 'B')} allocated at {by.peak}; the allocator reserves "
        f"{si(by.allocator, 'B')} more, the runtime holds {si(by.runtime, 'B')}: {si(total, 'B')} of "
        f"{si(usable, 'B')} usable: {verdict}"
    )


def interval_text(band: Interval, shown: Callable[[float], str]) -> str:
    """``1.47 s-2.25 s (megatron on Hopper: 21 step times)``, or why there is no interval. Where the figure
    lies outside its own interval (the model errs one way on runs like it), it says which way, so the two do
    not read as a contradiction."""
    if not band.known:
        return f"no interval ({band.note})"
    text = f"{shown(band.lo)}-{shown(band.hi)} ({band.regime}"  # type: ignore[arg-type]
    if band.figure == "below":
        text += "; the figure lies below it: runs like this measured more than predicted"
    elif band.figure == "above":
        text += "; the figure lies above it: runs like this measured less than predicted"
    return text + ")"


def changed_line(changed: str, subject: str = "profile") -> str:
    """What the command line changed in a profile, as every table but the single layer's says it."""
    return f"{subject} changed on the command line: {changed}"


def fits_text(probability: float | None, fits: bool, level: float) -> str:
    """Whether a plan fits, as a probability: "fits at 93 %", "may not fit (70 %)", "does not fit (4 %)"."""
    if probability is None:
        return "fits (too few measured peaks to say how surely)" if fits else "does not fit"
    if probability >= level:
        return f"fits at {probability:.0%}"
    return f"{'may not fit' if fits else 'does not fit'} ({probability:.0%} it fits)"


def certainty_parts(
    time: Interval | None, memory: Interval, fits_probability: float | None, fits: bool
) -> list[str]:
    """The intervals of a plan's figures and the chance it fits: ``step ...``, then ``memory ...; fits ...``."""
    parts = [] if time is None else [f"step {interval_text(time, seconds)}"]
    memory_text = interval_text(memory, lambda b: si(b, "B"))
    return [*parts, f"memory {memory_text}; {fits_text(fits_probability, fits, memory.level)}"]


def certainty_lines(
    time: Interval | None, memory: Interval, fits_probability: float | None, fits: bool
) -> list[str]:
    """:func:`certainty_parts`, one line each under the level."""
    return [
        f"{memory.level:.0%} interval: {part}"
        for part in certainty_parts(time, memory, fits_probability, fits)
    ]


def report_data(report: Report, trace: list[Evaluation] | None = None) -> dict[str, Any]:
    """The report as JSON-ready data, with the formulas and their values under ``explain`` when traced."""
    data = report.model_dump(mode="json", by_alias=True)
    if trace is not None:
        data["explain"] = explain_rows(trace)
    return data


def headline(report: Report) -> str:
    i = report.inputs
    mask = "causal" if i.causal else "non-causal"
    return f"S = {count(i.seq)} · N = {i.cp} · {mask} · {i.layout} layout"


def shape_line(report: Report) -> str:
    i = report.inputs
    gqa = f"GQA {i.heads // i.kv_heads}" if i.kv_heads < i.heads else "MHA"
    model = f" · {i.model}" if i.model else ""
    return f"h = {i.heads}, n_kv = {i.kv_heads} ({gqa}) · d = {i.head_dim} · {i.dtype} · b = {i.batch}{model}"


def machine_line(report: Report) -> str:
    hw = report.hardware
    eff = "" if hw.effective_flops == hw.peak_flops else f", effective {si(hw.effective_flops, 'FLOP/s', 3)}"
    changed = f" · changed: {hw.changed}" if hw.changed else ""
    return (
        f"{hw.name} ({hw.source}) · {si(hw.peak_flops, 'FLOP/s', 3)} {report.inputs.dtype} peak{eff}{changed}"
    )


def link_line(report: Report) -> str:
    hw = report.hardware
    latency = f" · α {seconds(hw.latency)}" if hw.latency else ""
    return f"{hw.link} · {si(hw.link_bandwidth, 'B/s', 3)} per direction{latency} · {hw.link_scope}"


def verdict_line(report: Report) -> str:
    v, hw = report.verdict, report.hardware
    clause = kernel_clause(report)
    rate = "peak" if hw.effective_flops == hw.peak_flops else "effective"
    bound = f" (compute balanced at {rate} FLOP/s, [A-RingCost]'s bound)" if clause else ""
    return f"{v.pass_} step comm ratio {percent(v.comm_ratio_step)}{bound}: {v.text}{clause}"


def kernel_clause(report: Report) -> str:
    """Where the kernels run slower than the balanced bound assumes and that changes the story (the band, or
    whether a transfer hides), the ratio the step and the timeline charge: a red bound whose transfers still
    hide says so rather than contradict the timeline."""
    v = report.verdict
    timed = v.comm_ratio_step_kernel
    if timed is None or (band(timed).verdict == v.verdict and (timed < 1) == (v.comm_ratio_step < 1)):
        return ""
    fate = "hides under its step's compute when overlapped" if timed < 1 else "stays partly exposed"
    return f"; at the kernel rates the step and the timeline read, {percent(timed)}: each transfer {fate}"


def scope_line(report: Report) -> str | None:
    """Say loudly when the plan is not a training step."""
    i = report.inputs
    if i.causal and i.pass_ == "fwd+bwd":
        return None
    missing = " ".join(
        flag for flag, on in (("--causal", i.causal), ("--pass fwd+bwd", i.pass_ == "fwd+bwd")) if not on
    )
    masks = [
        *(["causal"] if i.causal else []),
        *([f"window {count(i.window)}{_nothing(i.window, i.seq)}"] if i.window else []),
        *(
            [f"chunks of {count(i.attention_chunk)}{_nothing(i.attention_chunk, i.seq)}"]
            if i.attention_chunk
            else []
        ),
        *(["packed documents"] if i.docs else []),
    ]
    return f"one layer, {i.pass_}, {' + '.join(masks) or 'no mask'}; for training add {missing}"


def _nothing(width: int, seq: int) -> str:
    return " (no narrower than S: it masks nothing)" if width >= seq else ""


def limits_lines(report: Report) -> list[str]:
    """The verdict's pass's limits: for fwd+bwd the phase that binds (the backward, on most links)."""
    v, hw = report.verdict, report.hardware
    return [
        f"step intensity {count(round(v.intensity_step))} vs β {count(round(hw.beta))} FLOP per link byte",
        f"largest N: green {v.n_max_green}, amber {v.n_max_amber} (topology included)",
        f"comm = compute at N = {_degree(v.n_max)}; L* = {count(round(v.critical_shard_tokens))} tokens "
        "(shortest shard hiding it)",
    ]


def _degree(n: float) -> str:
    """A real-valued CP degree; below one (S shorter than L*: no split hides the link), two significant
    digits, where one decimal would print 0.0."""
    return f"{n:,.1f}" if n >= 1 else f"{n:.2g} (S shorter than L*)"


def scheme_rows(report: Report) -> list[list[str]]:
    """scheme, receive bytes, comm time, ratio, verdict, exposed, note: the scheme comparison, then TP."""
    rows = []
    for s in report.schemes:
        if not s.feasible:
            rows.append([s.label, "", "", "", "infeasible", "", s.reason])
            continue
        scheme = registry.get(s.scheme)
        if scheme.hybrid:
            note = f"a2a {_short(s.a2a_link_scope)}, ring {_short(s.ring_link_scope)}"
        elif scheme.whole_sequence:
            note = _short(s.a2a_link_scope)
        else:
            note = f"{s.layout}, {_short(s.ring_link_scope)}"
        rows.append(
            [
                s.label,
                si(s.recv_bytes_per_layer, "B"),
                seconds(s.comm_s),
                percent(s.comm_ratio),
                s.verdict or "",
                seconds(s.exposed_comm_s),
                note,
            ]
        )
    tp = report.tp
    ratio = f"{tp.ratio_to_ring:.3g}x ring fwd" if tp.ratio_to_ring else ""
    rows.append(["TP", si(tp.bytes_per_layer, "B"), "", "", "", "", ratio])
    return rows


def memory_rows(report: Report) -> list[list[str]]:
    m, i = report.memory, report.inputs
    return [
        ["full score matrix, queries x all keys", si(m.scores_full_bytes, "B")],
        [f"query block ({count(i.block)}) x all keys", si(m.scores_query_block_bytes, "B")],
        ["one tile, query block x key block", si(m.scores_tile_bytes, "B")],
        [
            f"KV block in flight (L = {count(i.seq // i.cp)})",
            f"{si(m.kv_block_bytes, 'B')}  ({si(m.kv_tile_bytes, 'B')} per tile)",
        ],
        ["softmax state (m, l, O), fp32", si(m.softmax_state_bytes, "B")],
    ]


def time_rows(report: Report) -> list[list[str]]:
    r, c, bwd = report.ring, report.compute, report.backward
    return [
        [
            "step",
            si(c.step_flops, "FLOP"),
            seconds(r.step_compute_kernel_s),
            seconds(r.step_comm_s),
            percent(r.comm_ratio_step),
        ],
        [
            "layer",
            si(c.device_flops_per_layer, "FLOP"),
            seconds(r.layer_compute_kernel_s),
            seconds(r.layer_comm_s),
            percent(r.comm_ratio_layer),
        ],
        [
            "bwd step",
            si(bwd.step_flops, "FLOP"),
            seconds(bwd.step_compute_kernel_s),
            seconds(bwd.step_comm_s),
            percent(bwd.comm_ratio_step),
        ],
    ]


SCHEMES_CAPTION = (
    "comm: all communication of the pass · ratio (the verdict's): ring, step receive / step "
    "compute; Ulysses, all-to-all (a2a) / compute; USP, both summed · exposed: what no compute hides"
)


def time_caption(report: Report) -> str:
    r, h = report.ring, report.hardware
    rate = "peak" if h.effective_flops == h.peak_flops else "effective"
    e = report.inputs.efficiency
    named = "" if h.attention_kernel == "flash" else f", {h.attention_kernel} attention"
    rates = f"the profile's kernel rates{named}" if e is None else f"{e:g} x peak (--efficiency)"
    return (
        f"compute at {rates}, as the layer time; ratio (the verdict's): receive / compute "
        f"balanced at {rate} FLOP/s ({seconds(r.step_compute_s)} a step) · sending (own block included) "
        f"{seconds(r.layer_send_s)} · predicted layer time, {report.inputs.layout} layout, transfers "
        f"overlapped: {seconds(r.layer_time_s)}"
    )


def causal_lines(report: Report) -> tuple[str, str]:
    c = report.causal
    parts = [
        f"{name} {percent(value)}" for name, value in c.utilization.model_dump().items() if value is not None
    ]
    return (
        f"utilisation at tile {count(c.tile)}: " + " · ".join(parts),
        f"whole-block count: {percent(c.utilization_coarse)} (diagonal block whole), "
        f"{percent(c.utilization_fine)} (diagonal half) [A-RingCost §6]",
    )


def packing_title(report: Report) -> str:
    p = report.packing
    assert p is not None
    return (
        f"Packed window {p.window + 1} of {p.windows}: {p.window_documents:,} documents, "
        f"{p.window_tokens:,} tokens ({p.source}); plan's branch: {p.branch}"
    )


def packing_branch_rows(report: Report) -> list[list[str]]:
    p = report.packing
    assert p is not None
    rows = []
    for name in ("dense", "varlen"):
        b = getattr(p, name)
        rows.append(
            [
                name + (" (plan)" if name == p.branch else ""),
                si(b.executed_flops, "FLOP"),
                percent(b.executed_share),
                percent(b.useful_share),
                f"{b.intensity_step:,.0f}",
                percent(b.comm_ratio_step),
                b.verdict,
            ]
        )
    return rows


def packing_layout_rows(report: Report) -> list[list[str]]:
    p = report.packing
    assert p is not None
    rows = []
    for row in p.layouts:
        if not row.feasible:
            rows.append([row.layout, "S does not split evenly", "", "", "", "", ""])
            continue
        rows.append(
            [
                row.layout,
                percent(row.utilization_dense),
                percent(row.utilization_varlen),
                percent(row.balance),
                f"{row.waiting_steps} / {row.idle_steps}",
                seconds(row.exposed_s),
                seconds(row.layer_time_s),
            ]
        )
    return rows


def long_tail_line(report: Report) -> str:
    t = report.packing.long_tail if report.packing else None
    assert t is not None
    line = (
        f"the longest document ({t.longest_doc_tokens:,} tokens) needs N = {t.n_longest}, the rest of the "
        f"batch N = {t.n_rest}; the plan runs every document at N = {report.inputs.cp}"
    )
    if t.dynamic_recv_share is not None:
        line += (
            f"; dynamic CP per micro-batch would send {percent(t.dynamic_recv_share)} of the ring's KV "
            f"traffic ({si(t.dynamic_recv_bytes_saved_per_layer, 'B')} less per device per layer)"
        )
    return line


def mask_rows(report: Report) -> list[list[str]]:
    m = report.mask
    assert m is not None
    return [
        [
            t.kind,
            f"{t.compute_fraction:.4g}",
            percent(t.comm_ratio_step),
            t.verdict,
            f"{t.n_max:,.1f}",
            str(t.skippable_steps),
        ]
        for t in m.layer_types
    ]


PACKING_BRANCH_COLUMNS = ["branch", "executed", "of window", "useful", "I_step", "ratio", "verdict"]
PACKING_LAYOUT_COLUMNS = [
    "layout",
    "util dense",
    "util varlen",
    "balance",
    "wait / idle",
    "exposed",
    "layer fwd",
]
MASK_COLUMNS = ["layers", "c", "ratio", "verdict", "N_max", "skippable steps"]
PACKING_CAPTION = (
    "executed: FLOP one layer runs, all devices · of window: share of the causal window's tiles · "
    "util: useful / (N x slowest rank per step) · balance: mean / slowest rank's varlen work · "
    "wait: steps shorter than their transfer · idle: steps with no work (docs/packing.md)"
)


def _table(title: str, columns: list[str]):  # noqa: ANN202
    table = house_table(title=title, padding=(0, 1))
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 or name in {"verdict", "note"} else "right")
    return table


def render_table(report: Report, console: Console) -> None:
    """The report on the screen: the heading grid, memory, the ring's times, the schemes, packing and
    mask tables where the plan has them, then the causal and other notes."""
    _render_head(report, console)
    _print_table(console, _table("Memory tiers, one layer", ["tier", "bytes"]), memory_rows(report))
    times = _table("Ring, one device", ["", "FLOP", "compute", "receive", "ratio"])
    for row in time_rows(report):
        times.add_row(*row)
    console.print(times)
    console.print(time_caption(report), style="dim")
    console.print()
    schemes = _table(
        f"Schemes, {report.inputs.pass_}, per device per layer",
        ["scheme", "receive", "comm", "ratio", "verdict", "exposed", "note"],
    )
    for row in scheme_rows(report):
        schemes.add_row(*row[:4], coloured(row[4]), *row[5:])
    console.print(schemes)
    console.print(SCHEMES_CAPTION, style="dim")
    console.print()
    if report.packing is not None:
        _render_packing(report, console)
    if report.mask is not None and report.mask.layer_types:
        _print_table(console, _table("Global and local layers", MASK_COLUMNS), mask_rows(report))
    _render_tail(report, console)


def _print_table(console: Console, table: Any, rows: list[list[str]]) -> None:
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print()


def _render_head(report: Report, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    verdict = report.verdict.verdict
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("cp-plan", headline(report))
    scope = scope_line(report)
    if scope:
        head.add_row("scope", Text(scope, style="bold yellow"))
    head.add_row("shape", shape_line(report))
    head.add_row("machine", machine_line(report))
    head.add_row("link", link_line(report))
    head.add_row("topology", report.hardware.topology)
    head.add_row(
        Text(verdict.upper(), style=COLOURS[verdict]), Text(verdict_line(report), style=COLOURS[verdict])
    )
    for i, line in enumerate(limits_lines(report)):
        head.add_row("limits" if i == 0 else "", line)
    console.print(head)
    console.print()


def _render_packing(report: Report, console: Console) -> None:
    from rich.text import Text

    for title, columns, rows in (
        (packing_title(report), PACKING_BRANCH_COLUMNS, packing_branch_rows(report)),
        ("Layouts of the packed window, fwd", PACKING_LAYOUT_COLUMNS, packing_layout_rows(report)),
    ):
        table = _table(title, columns)
        for row in rows:
            table.add_row(*[coloured(c) for c in row])
        console.print(table)
    console.print(PACKING_CAPTION, style="dim")
    console.print(Text("long tail: " + long_tail_line(report)))
    console.print()


def _render_tail(report: Report, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    tail = Table.grid(padding=(0, 2))
    tail.add_column(style="bold")
    tail.add_column()
    if report.inputs.causal:
        measured, blocks = causal_lines(report)
        tail.add_row("causal", measured)
        tail.add_row("", Text(blocks, style="dim"))
    for note in report.notes:
        tail.add_row("note", Text(note, style="dim"))
    console.print(tail)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def to_markdown(report: Report, trace: list[Evaluation] | None = None) -> str:
    verdict = report.verdict.verdict
    out = [
        f"## cp-plan: {headline(report)}",
        "",
        f"- shape: {shape_line(report)}",
        f"- machine: {machine_line(report)}",
        f"- link: {link_line(report)}",
        f"- topology: {report.hardware.topology}",
        f"- **{verdict.upper()}**: {verdict_line(report)}",
        *[f"- {line}" for line in limits_lines(report)],
        "",
        "### Memory tiers, one layer",
        "",
    ]
    out += _md_table(["tier", "bytes"], memory_rows(report))
    out += ["", "### Ring, one device", ""]
    out += _md_table(["", "FLOP", "compute", "receive", "ratio"], time_rows(report))
    out += ["", time_caption(report)]
    out += ["", f"### Schemes, {report.inputs.pass_}, per device per layer", ""]
    out += _md_table(
        ["scheme", "receive", "comm", "ratio", "verdict", "exposed", "note"], scheme_rows(report)
    )
    out += ["", SCHEMES_CAPTION, ""]
    if report.packing is not None:
        out += [f"### {packing_title(report)}", ""]
        out += _md_table(PACKING_BRANCH_COLUMNS, packing_branch_rows(report))
        out += ["", "### Layouts of the packed window, fwd", ""]
        out += _md_table(PACKING_LAYOUT_COLUMNS, packing_layout_rows(report))
        out += ["", PACKING_CAPTION, "", f"**Long tail** {long_tail_line(report)}.", ""]
    if report.mask is not None and report.mask.layer_types:
        out += ["### Global and local layers", ""]
        out += _md_table(MASK_COLUMNS, mask_rows(report))
        out += [""]
    if report.inputs.causal:
        measured, blocks = causal_lines(report)
        out += [f"**Causal** {measured}; {blocks}.", ""]
    out += [f"- {note}" for note in report.notes]
    if trace is not None:
        out += ["", "### Formulas", ""]
        out += _md_table(
            ["quantity", "formula", "with values", "value"],
            [[r["name"], r["formula"], r["substituted"], r["value"]] for r in explain_rows(trace)],
        )
    return "\n".join(out) + "\n"


def explain_rows(trace: list[Evaluation]) -> list[dict[str, str]]:
    """Each distinct evaluation: the formula, then the same with values substituted, then the value."""
    from costmodel.symbolic.formula_text import INFO  # here: a plan without --explain prints no formula

    rows, seen = [], set()
    for e in trace:
        key = (e.name, tuple(sorted(e.args.items())))
        if key in seen:
            continue
        seen.add(key)
        symbol, expression, template, meaning, unit, source, _ = INFO[e.name]
        substituted = template.format(
            **{k: f"{v:g}" if isinstance(v, float) else v for k, v in e.args.items()}
        )
        value = float(e.value)
        rows.append(
            {
                "name": e.name,
                "meaning": meaning,
                "source": source,
                "formula": f"{symbol} = {expression}",
                "substituted": substituted,
                "value": f"{value:.6g} {unit}",
            }
        )
    return rows


def term_rows(trace: list[Evaluation]) -> list[dict[str, str]]:
    """Each distinct formula of a trace as written (in other formulas' symbols, as docs/formulas.md shows
    it) and its value: how the step's terms build up to step_time_s."""
    from costmodel.symbolic.formula_text import DEFINITIONS, INFO

    rows, seen = [], set()
    for e in trace:
        if e.name in seen:
            continue
        seen.add(e.name)
        symbol, expression, _, meaning, unit, source, _ = INFO[e.name]
        rows.append(
            {
                "name": e.name,
                "meaning": meaning,
                "source": source,
                "formula": f"{symbol} = {DEFINITIONS.get(e.name, expression)}",
                "value": f"{float(e.value):.6g} {unit}",
            }
        )
    return rows


def _heading(row: dict[str, Any], console: Console) -> None:
    """A formula's name, then what it means and where it comes from (sources carry their own brackets)."""
    from rich.text import Text

    console.print(
        Text(row["name"], style="bold") + Text(f"  {row['meaning']}  ({row['source']})", style="dim")
    )


def render_terms(
    trace: list[Evaluation], console: Console, title: str = "The step, term by term (group step)"
) -> None:
    console.rule(f"{title} (costmodel.symbolic.formulas)")
    for row in term_rows(trace):
        _heading(row, console)
        console.print(f"    {row['formula']}")
        console.print(f"    = {row['value']}", style="bold")


def render_explain(trace: list[Evaluation], console: Console) -> None:
    console.rule("Formulas, then values (costmodel.symbolic.formulas)")
    for row in explain_rows(trace):
        _heading(row, console)
        console.print(f"    {row['formula']}")
        console.print(f"    = {row['substituted']}")
        console.print(f"    = {row['value']}", style="bold")


def _short(scope: str) -> str:
    return {"intra-node": "in node", "inter-node": "across nodes"}.get(scope, scope)


NOISY_TIMINGS = 0.25  # validate's own IQR / median above which its errors are the machine's as much


def _compact_ratio(value: float) -> str:
    """Three significant digits, never an exponent (7,992 rather than 7.99e+03): 80 columns hold it."""
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def _compact_error(value: float) -> str:
    """A signed percentage, one decimal below ±1000 %, whole percents beyond (four digits either way)."""
    return f"{value:+.1%}" if abs(value) < 10 else f"{value:+.0%}"


def render_validation(report: dict, console: Console) -> None:
    """`cp-plan validate`'s table, kept inside 80 columns: one row per case and pass."""

    table = house_table(
        padding=(0, 0, 0, 0),  # the column divider is the one space: 80 columns hold every digit
        title=f"{report['hw']}: measured vs predicted, N = {report['nproc']}, "
        f"L* = {report['critical_shard_tokens']:,.0f} tokens",
    )
    uncertain = any("uncertainty" in r for r in report["rows"])
    # With the uncertainty column the datasheet's per-row error gives way (80 columns); its median stays.
    names = ("kernel", "mask", "L/rank", "L/L*", "pass", "measured", "model", "±", "error", "sheet")
    for name in tuple(n for n in names if n != ("sheet" if uncertain else "±")):
        table.add_column(
            f" {name}" if name in {"mask", "pass"} else name,  # two spaces before a text column
            justify="left" if name in {"kernel", "mask", "pass"} else "right",
            no_wrap=True,
        )
    short = {"contiguous": "contig", "striped": "striped", "zigzag": "zigzag"}
    rows = sorted(report["rows"], key=lambda r: not r.get("held_out", True))  # held out first
    for index, r in enumerate(rows):
        if index and rows[index - 1].get("held_out", True) and not r.get("held_out", True):
            table.add_section()
        kernel = "Ulysses" if r["variant"] == "ulysses" else f"ring {short[r['layout']]}"
        cells = [
            kernel,
            (" causal" if r["causal"] else " full")
            + (f" {r['documents']}d" if r.get("documents", 1) > 1 else ""),
            tokens_label(r["tokens_per_rank"]),
            _compact_ratio(r["shard_over_critical"]),
            f" {r['pass']}",
            seconds(r["measured_s"]),
            seconds(r["predicted_s"]),
            *([f"{r['uncertainty']:.0%}"] if uncertain else []),
            _compact_error(r["error"]),
            *([] if uncertain else [f"{r['datasheet_error']:+.0%}"]),
        ]
        table.add_row(*cells)
    console.print(table)
    _validation_summary(report, uncertain, console)
    if report.get("inference_rows"):
        _render_inference_validation(report, console)


def _validation_summary(report: dict, uncertain: bool, console: Console) -> None:
    """Under the validation table: what its columns mean, the errors, and whether to trust the machine."""
    from rich.text import Text

    verdict = Text("within", style="green") if report["passed"] else Text("above", style="red")
    if uncertain:
        console.print(
            "±: the model's uncertainty from the profile's spreads and how far a timing repeats\n"
            "(the fitted rows' median |error|). Above the line: held-out shapes calibrate never\n"
            "ran; below it: the shapes it fitted fixed costs on, re-timed.",
            style="dim",
        )
    else:
        console.print("sheet: error of the datasheet-style model (peak FLOP/s, no α, balanced)", style="dim")
    console.print(
        Text.assemble(
            f"held-out median |error| {report['median_abs_error']:.1%} (",
            verdict,
            f" {report['max_median_error']:.0%}), max {report['max_abs_error']:.1%}"
            + (f"; {report['held_out_rows']} rows" if "held_out_rows" in report else ""),
        )
    )
    if report.get("fitted_rows"):
        console.print(
            f"fitted shapes: median |error| {report['fitted_median_abs_error']:.1%}, "
            f"max {report['fitted_max_abs_error']:.1%}; {report['fitted_rows']} rows; "
            f"{report['within_uncertainty']:.0%} of all rows within their ±"
        )
    noise = report.get("measured_spread")
    if noise is not None and noise > NOISY_TIMINGS:
        console.print(
            f"validate's own timings moved ±{noise:.0%} (IQR / median, median row): the machine "
            "is busy, and these errors say as much about it as about the model",
            style="yellow",
        )
    drift = report.get("machine_drift")
    if drift is not None:
        line = (
            f"since calibrate, the same block compute takes {drift['compute']:+.0%} and its exchange "
            f"{drift['exchange']:+.0%}"
        )
        if drift["moved"]:
            console.print(
                f"{line}: the machine changed speed (> ±{drift['bound']:.0%}), and errors of that "
                "size are the machine's, not the model's",
                style="yellow",
            )
        else:
            console.print(line, style="dim")
    quality = report.get("quality")
    if quality and not quality["trusted"]:
        console.print("this profile was flagged as too noisy to trust:", style="red")
        for reason in quality["reasons"]:
            console.print(f"  - {reason}")
    console.print(
        f"datasheet-style model (peak FLOP/s, no α, balanced): median {report['datasheet_median_abs_error']:.1%}, "
        f"{report['datasheet_over_calibrated']:.1f}x the error"
    )


def _render_inference_validation(report: dict, console: Console) -> None:
    """validate's inference runs against `cp-plan infer`'s formulas: held out, in the verdict when the
    profile measured the schemes' fixed costs."""
    from rich.text import Text

    gated = report.get("inference_in_verdict")
    table = house_table(
        padding=(0, 0, 0, 1),
        title="inference runs vs cp-plan infer's formulas (held out, "
        + ("in the verdict)" if gated else "not in the verdict)"),
    )
    for name in ("kernel", "new/rank", "cached/rank", "measured", "model", "±", "error", "sheet"):
        table.add_column(name, justify="left" if name == "kernel" else "right", no_wrap=True)
    names = {"pass-kv": "pass-KV prefill", "pass-q": "pass-Q prefill", "decode": "decode"}
    for r in report["inference_rows"]:
        table.add_row(
            names[r["scheme"]],
            str(r["new_per_rank"]),
            str(r["cached_per_rank"]),
            seconds(r["measured_s"]),
            seconds(r["predicted_s"]),
            f"{r['uncertainty']:.0%}",
            _compact_error(r["error"]),
            f"{r['datasheet_error']:+.0%}",
        )
    console.print(table)
    line = (
        f"inference median |error| {report['inference_median_abs_error']:.1%}, "
        f"max {report['inference_max_abs_error']:.1%}; {len(report['inference_rows'])} rows"
    )
    if gated:
        verdict = Text("within") if report["inference_passed"] else Text("above", style="red")
        console.print(Text.assemble(f"{line} (", verdict, f" {report['max_median_error']:.0%})"))
    else:
        console.print(line)
        console.print(f"not in the verdict: {report.get('inference_not_in_verdict_because')}", style="dim")


def topology_lines(topology: dict) -> list[str]:
    """The network's shape, the rank order and the link every parallel group waits on, as two lines."""

    def where(scope: str) -> str:
        return "inside the fast domain" if scope == "intra-node" else "across domains"

    groups = []
    for dim, group in topology["groups"].items():
        if group["size"] > 1:
            nics = group.get("nics_per_node")
            over = f" over {nics:g} NIC{'s' if nics != 1 else ''} a node" if nics else ""
            groups.append(
                f"{dim.upper()} {group['size']} {where(group['scope'])}, {group['bandwidth'] / 1e9:g} GB/s{over}"
            )
    zero = topology.get("zero")
    if zero and zero["replicas"] > 1:  # hybrid sharding: where its groups and their replicas lie
        groups.append(
            f"ZeRO in groups of {zero['size']} {where(zero['scope'])}, {zero['bandwidth'] / 1e9:g} GB/s, "
            f"{zero['replicas']} replicas {where(zero['replica_scope'])}, {zero['replica_bandwidth'] / 1e9:g} GB/s"
        )
    leaves = topology["cp_ring_leaves_fast_domain_at"]
    cp = topology["groups"].get("cp", {}).get("size", 1)
    ring = f"; a CP ring leaves the fast domain at {leaves} ranks" if cp > 1 else ""
    return [
        f"topology: {topology['text']}",
        f"ranks {topology['rank_order']}: {'; '.join(groups) or 'one device'}{ring}",
    ]
