"""Self-contained HTML pages: one plan's report with its ring timelines, and a sweep's heatmap.

The charts are SVG written here, by hand, from Python: no dependency, nothing fetched at view time
(pages are read on air-gapped clusters), a few kilobytes per chart, sharp when printed, and hover
values come free from SVG ``<title>`` elements. One short inline script adds a readout of the hovered
value and marks the page rendered (the browser test reads that mark). The page is well-formed XML
too (scripts and styles in CDATA), so a test can parse it whole.

Presentation only: every number is a field of the :class:`~costmodel.plans.schema.Report`, of a
:class:`~costmodel.plans.gantt.Timeline` or of a sweep's grid.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from costmodel.cli import render
from costmodel.core.units import count, percent, seconds, short_percent, si, tokens_label
from costmodel.schedule.layouts import LAYOUTS

if TYPE_CHECKING:
    from costmodel.machines.profiles import HardwareProfile
    from costmodel.plans.bind import Evaluation
    from costmodel.plans.gantt import PassTimelines, Timeline
    from costmodel.plans.inputs import PlanInputs
    from costmodel.plans.schema import Fit, Report
    from costmodel.training.check import CheckResult
    from costmodel.training.sweep import Grid

KIND_CLASS = {"compute": "k-compute", "transfer": "k-transfer", "idle": "k-idle", "overhead": "k-overhead"}
KIND_LABEL = {"compute": "compute", "transfer": "exposed transfer", "idle": "idle", "overhead": "overhead"}
PANEL_WIDTH = 380  # SVG user units; panels scale to the page
LABEL_WIDTH = 52
AXIS_HEIGHT = 22

STYLE = """
:root { --ink: #1d2330; --muted: #5d6677; --line: #d5d9e0; --green: #2e8540; --amber: #c98a00;
  --red: #c0392b; --compute: #3b6fb6; --transfer: #d9534f; --idle: #e6e8ec; --overhead: #e0a526;
  --flight: #3aa39a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  margin: 0 auto; padding: 20px 28px 40px; max-width: 1280px; background: #fff; }
h1 { font-size: 21px; margin: 0 0 2px; } h2 { font-size: 16px; margin: 26px 0 8px; }
h3 { font-size: 14px; margin: 10px 0 4px; }
.sub { color: var(--muted); margin: 0; }
.verdict { display: flex; gap: 18px; align-items: stretch; margin: 14px 0 4px; }
.badge { color: #fff; font-weight: 700; font-size: 22px; letter-spacing: .04em; padding: 10px 18px;
  border-radius: 6px; display: flex; align-items: center; }
.v-green { background: var(--green); } .v-amber { background: var(--amber); } .v-red { background: var(--red); }
.answer { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; align-content: center; }
.answer b { color: var(--muted); font-weight: 600; }
table { border-collapse: collapse; margin: 4px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th:first-child, td:first-child, td.text { text-align: left; }
th { font-weight: 600; color: var(--muted); }
td.text { white-space: normal; }
.chip { display: inline-block; padding: 0 7px; border-radius: 9px; color: #fff; font-size: 12px; }
.caption, .note { color: var(--muted); font-size: 12.5px; margin: 2px 0; }
.panels { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 14px; }
.panel { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; }
.panel.chosen { border-color: var(--compute); box-shadow: 0 0 0 1px var(--compute); }
.panel h3 span { color: var(--muted); font-weight: 400; }
svg { display: block; width: 100%; height: auto; }
svg text { font: 10px system-ui, sans-serif; fill: var(--muted); }
svg text.halo { paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
.k-compute { fill: var(--compute); } .k-transfer { fill: var(--transfer); } .k-idle { fill: var(--idle); }
.k-overhead { fill: var(--overhead); } .k-flight { fill: var(--flight); }
.gantt g.rank rect.k-compute { stroke: #fff; stroke-width: 0.6; }
.bars { max-width: 980px; }
.chart rect:hover { stroke: var(--ink) !important; stroke-width: 1 !important; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 12.5px; color: var(--muted); margin: 6px 0; }
.legend i { display: inline-block; width: 11px; height: 11px; margin-right: 5px; vertical-align: -1px;
  border-radius: 2px; }
.readout { min-height: 1.5em; font-size: 12.5px; color: var(--ink); background: #f5f6f8; padding: 2px 8px;
  border-radius: 4px; margin: 6px 0; }
.checks li.pass::marker { content: "✓  "; color: var(--green); }
.checks li.fail::marker { content: "✗  "; color: var(--red); }
.omitted { color: var(--muted); font-style: italic; padding: 24px 0; }
footer { margin-top: 28px; color: var(--muted); font-size: 12px; }
@media (max-width: 900px) { .panels { grid-template-columns: 1fr; } }
@media print {
  body { max-width: none; padding: 0; font-size: 11px; }
  .readout { display: none; }
  section, .panel, table { break-inside: avoid; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  .panels { grid-template-columns: repeat(3, minmax(0, 1fr)); }
}
"""

# Installed first, so an error anywhere later lands in the DOM where a headless browser can read it.
ERROR_HOOK = """
window.addEventListener("error", function (event) {
  var body = document.body || document.documentElement;
  var seen = body.getAttribute("data-js-errors");
  body.setAttribute("data-js-errors", (seen ? seen + " | " : "") + event.message);
});
"""

# Hover readout, then the rendered mark with what was drawn, for the browser test.
SCRIPT = """
(function () {
  var readout = document.getElementById("readout");
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    svg.addEventListener("mouseover", function (event) {
      var title = event.target.querySelector ? event.target.querySelector("title") : null;
      if (readout && title) { readout.textContent = title.textContent; }
    });
  });
  var body = document.body;
  body.setAttribute("data-timelines", document.querySelectorAll("svg.gantt").length);
  body.setAttribute("data-rank-rows", document.querySelectorAll("svg.gantt g.rank").length);
  body.setAttribute("data-heatmaps", document.querySelectorAll("svg.heat").length);
  var clipped = [];  // a label past its chart's edge is cut off on screen: the browser test counts them
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    var view = svg.viewBox.baseVal;
    svg.querySelectorAll("text").forEach(function (text) {
      var box = text.getBBox();
      if (box.x < view.x - 0.5 || box.x + box.width > view.x + view.width + 0.5) {
        clipped.push(text.textContent);
      }
    });
  });
  body.setAttribute("data-clipped-labels", clipped.join(" | "));
  var timeline = document.getElementById("timeline");
  if (timeline) {
    body.setAttribute("data-timeline-top", Math.round(timeline.getBoundingClientRect().top + window.scrollY));
  }
  body.setAttribute("data-rendered", "true");
})();
"""


def _field(path: str, value: float | int | None, text: str) -> str:
    """A number of the report, tagged with its JSON path and exact value (the page's tests read both)."""
    raw = "null" if value is None else repr(float(value))
    return f'<span data-field="{escape(path)}" data-value="{raw}">{escape(text)}</span>'


def _page(title: str, body: Iterable[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8" />',
            '<meta name="viewport" content="width=device-width, initial-scale=1" />',
            f"<title>{escape(title)}</title>",
            f"<style>/*<![CDATA[*/{STYLE}/*]]>*/</style>",
            f"<script>//<![CDATA[\n{ERROR_HOOK}//]]></script>",
            "</head>",
            "<body>",
            *body,
            "<footer>Made by cp-plan from its cost model; self-contained: no network needed to view or print.</footer>",
            f"<script>//<![CDATA[\n{SCRIPT}//]]></script>",
            "</body>",
            "</html>",
            "",
        ]
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], text_columns: Sequence[int] = ()) -> str:
    """Cells are HTML already (escape before)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="text">{c}</td>' if i in text_columns else f"<td>{c}</td>" for i, c in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _chip(verdict: str) -> str:
    if verdict in {"green", "amber", "red"}:
        return f'<span class="chip v-{verdict}">{verdict}</span>'
    return escape(verdict)


# --- the plan page -------------------------------------------------------------------------------


def plan_page(
    report: Report,
    inputs: PlanInputs,
    profile: HardwareProfile,
    timelines: list[PassTimelines],
    trace: list[Evaluation] | None = None,
    fit: Fit | None = None,
    checks: list[CheckResult] | None = None,
    title: str | None = None,
) -> str:
    """The whole report of one plan as one page: verdict first, memory, timelines, schemes, notes.
    ``timelines`` are the plan's (:func:`costmodel.plans.gantt.plan_timelines`)."""
    heading = title or f"cp-plan: {render.headline(report)}"
    body = [
        f"<header><h1>{escape(heading)}</h1>",
        f'<p class="sub">{escape(render.headline(report)) if title else ""}</p>' if title else "",
        f'<p class="sub">{escape(render.shape_line(report))}</p>',
        f'<p class="sub">{escape(render.machine_line(report))} · {escape(render.link_line(report))}</p></header>',
        _verdict(report, checks),
        _memory(report, profile, fit),
        _timelines(report, inputs, timelines),
        _schemes(report),
        _notes(report),
    ]
    if trace is not None:
        body.append(_explain(trace))
    return _page(heading, [part for part in body if part])


def _verdict(report: Report, checks: list[CheckResult] | None) -> str:
    v, r, i = report.verdict, report.ring, report.inputs
    rows = [
        (
            "verdict",
            f"{escape(v.pass_)} step comm ratio {_field('verdict.comm_ratio_step', v.comm_ratio_step, percent(v.comm_ratio_step))}: "
            f"{escape(v.text)}{escape(render.kernel_clause(report))}",
        ),
        (
            "answer",
            f"N = {i.cp} is {escape(v.verdict)}; largest N green {_field('verdict.n_max_green', v.n_max_green, str(v.n_max_green))}, "
            f"amber {_field('verdict.n_max_amber', v.n_max_amber, str(v.n_max_amber))} (topology included)",
        ),
        (
            "layer",
            f"{escape(i.layout)} ring, forward, overlapped: "
            f"{_field('ring.layer_time_s', r.layer_time_s, seconds(r.layer_time_s))} per layer",
        ),
        *[("limits" if k == 0 else "", escape(line)) for k, line in enumerate(render.limits_lines(report))],
    ]
    answer = "".join(f"<b>{escape(k)}</b><span>{html}</span>" for k, html in rows)
    out = [
        f'<section class="verdict"><div class="badge v-{v.verdict}" data-field="verdict.verdict">'
        f'{escape(v.verdict.upper())}</div><div class="answer">{answer}</div></section>'
    ]
    if checks:
        items = "".join(
            f'<li class="{"pass" if c.passed else "fail"}"><b>{escape(c.check)}</b>: {escape(c.detail)}</li>'
            for c in checks
        )
        passed = sum(c.passed for c in checks)
        out.append(
            f'<section><h2>Checks: {passed} of {len(checks)} pass</h2><ul class="checks">{items}</ul></section>'
        )
    return "\n".join(out)


def _memory(report: Report, profile: Any, fit: Fit | None) -> str:
    hbm = profile.device.usable_bytes  # what a process can allocate: the line plans are fitted under
    m = report.memory
    tiers = [
        ("full score matrix", "memory.scores_full_bytes", m.scores_full_bytes),
        ("query block x all keys", "memory.scores_query_block_bytes", m.scores_query_block_bytes),
        ("one tile", "memory.scores_tile_bytes", m.scores_tile_bytes),
        ("KV block in flight", "memory.kv_block_bytes", m.kv_block_bytes),
        ("softmax state (fp32)", "memory.softmax_state_bytes", m.softmax_state_bytes),
    ]
    parts = [
        "<section><h2>Memory per device</h2>",
        f'<p class="caption">Attention temporaries of one layer against {escape(profile.device.name)}\'s '
        f"{si(hbm, 'B', 3)} a process can allocate (log scale; the line is that memory). Flash attention keeps "
        "the tile tier; the full matrix is what it avoids.</p>",
        _tier_bars(tiers, hbm),
    ]
    if fit is not None:
        parts.append(_fit_bar(fit, hbm))
    else:
        parts.append(
            '<p class="note">Training memory (weights, gradients, optimizer states, activations) needs '
            "a model and a job size: <code>cp-plan report PLAN.yaml --html OUT.html</code> with "
            "<code>gpus</code> in the plan.</p>"
        )
    parts.append(_table(["tier", "bytes"], ([escape(a), escape(b)] for a, b in render.memory_rows(report))))
    parts.append("</section>")
    return "\n".join(parts)


# Room right of the longest bar for its value ("999 TB" in 10 px type is about 40 px): a label past the
# viewBox is clipped ("8.80 TB" read "8.80 TI").
VALUE_ROOM = 56


def _tier_bars(tiers: list[tuple[str, str, float]], hbm: float) -> str:

    width, label, row = 760, 170, 20
    low = math.floor(math.log10(min(v for _, _, v in tiers if v > 0))) - 1
    high = math.ceil(math.log10(max(max(v for _, _, v in tiers), hbm))) + 0.3

    def x(value: float) -> float:
        return label + (width - label - VALUE_ROOM) * (math.log10(max(value, 10**low)) - low) / (high - low)

    out = [
        f'<svg class="chart bars" viewBox="0 0 {width} {len(tiers) * row + 24}" role="img" '
        'aria-label="memory tiers against HBM">'
    ]
    values = []
    for k, (name, path, value) in enumerate(tiers):
        y = k * row + 4
        over = value > hbm
        out.append(f'<text x="{label - 6}" y="{y + 12}" text-anchor="end">{escape(name)}</text>')
        out.append(
            f'<rect x="{label}" y="{y}" width="{x(value) - label:.1f}" height="{row - 6}" '
            f'class="{"k-transfer" if over else "k-compute"}" data-field="{path}" data-value="{float(value)!r}">'
            f"<title>{escape(name)}: {si(value, 'B')}{' — more than HBM' if over else ''}</title></rect>"
        )
        values.append(f'<text class="halo" x="{x(value) + 4:.1f}" y="{y + 12}">{si(value, "B", 3)}</text>')
    hx = x(hbm)
    bottom = len(tiers) * row + 4
    out.append(
        f'<line x1="{hx:.1f}" x2="{hx:.1f}" y1="0" y2="{bottom}" stroke="#1d2330" stroke-dasharray="3 2" />'
    )
    out.extend(values)  # over the HBM line, on a halo of the page's colour: a value it crosses stays legible
    out.append(f'<text x="{hx:.1f}" y="{bottom + 14}" text-anchor="middle">HBM {si(hbm, "B", 3)}</text>')
    out.append("</svg>")
    return "".join(out)


# The colour of each of the peak's categories as the bar stacks them (they sum to fit.total_bytes): what
# persists, what comes and goes within the step, and what the allocator and the runtime hold beyond the tensors.
_FIT_COLOURS = {"weights": "k-compute", "gradients": "k-compute", "optimizer": "k-compute"}
_FIT_COLOURS |= {"fsdp_buffers": "k-transfer", "cp_buffers": "k-transfer"}
_FIT_COLOURS |= {"activations": "k-flight", "loss": "k-flight", "working": "k-flight"}


def _fit_bar(fit: Fit, hbm: float) -> str:
    width, left, height = 760, 170, 26
    scale = max(fit.total_bytes, hbm) * 1.02
    by = fit.by_category
    stacked = by.tensors() | {"allocator": by.allocator, "runtime": by.runtime}
    parts = [
        (name.replace("_", " "), _FIT_COLOURS.get(name, "k-overhead"), value, f"fit.by_category.{name}")
        for name, value in stacked.items()
        if value > 0
    ]

    def x(value: float) -> float:
        return left + (width - left - 10) * value / scale

    out = [
        "<h3>Training memory per device at N = "
        + str(fit.n)
        + ("" if fit.fits else " — does not fit")
        + "</h3>",
        f'<p class="caption">The peak falls at {escape(by.peak)}: the model states (blue); what comes and '
        "goes within the step, activations, the loss and the working set of the backward or the optimizer "
        "step (teal), gathered weights and CP buffers (red); the allocator's reserve and the runtime "
        "(amber).</p>",
        f'<svg class="chart bars" viewBox="0 0 {width} 64" role="img" aria-label="training memory">',
        f'<text x="{left - 6}" y="{height / 2 + 8}" text-anchor="end">'
        f"{'fits' if fit.fits else 'does not fit'}</text>",
        f'<rect x="{left}" y="4" width="{x(hbm) - left:.1f}" height="{height}" class="k-idle">'
        f"<title>HBM a process can allocate {si(hbm, 'B', 4)}</title></rect>",
    ]
    at = 0.0
    for name, css, value, path in parts:
        out.append(
            f'<rect x="{x(at):.1f}" y="4" width="{x(at + value) - x(at):.1f}" height="{height}" class="{css}" '
            f'data-field="{path}" data-value="{float(value)!r}"><title>{name}: {si(value, "B", 4)}</title></rect>'
        )
        at += value
    usable = x(fit.device_memory_bytes)
    out.append(f'<line x1="{usable:.1f}" x2="{usable:.1f}" y1="0" y2="{height + 8}" stroke="#1d2330" />')
    out.append(
        f'<text x="{usable - 4:.1f}" y="{height + 20}" text-anchor="end">usable {si(fit.device_memory_bytes, "B", 3)}</text>'
    )
    out.append(
        f'<line x1="{x(hbm):.1f}" x2="{x(hbm):.1f}" y1="0" y2="{height + 20}" stroke="#1d2330" '
        'stroke-dasharray="3 2" />'
    )
    out.append(f'<text x="{x(hbm):.1f}" y="{height + 32}" text-anchor="end">HBM {si(hbm, "B", 3)}</text>')
    band = fit.total_bytes_interval
    if band is not None and band.known:  # the interval as a whisker over the bar
        lo, hi = x(band.lo), x(min(band.hi, scale))  # type: ignore[arg-type]
        out.append(
            f'<line x1="{lo:.1f}" x2="{hi:.1f}" y1="{height / 2 + 4}" y2="{height / 2 + 4}" stroke="#1d2330" '
            f'stroke-width="1.5" data-field="fit.total_bytes_interval"><title>{band.level:.0%} interval '
            f"{si(band.lo, 'B', 3)}-{si(band.hi, 'B', 3)}</title></line>"
        )
    out.append("</svg>")
    legend = "".join(
        f'<span><i class="{css}" style="background: var(--{css.removeprefix("k-")})"></i>{name} '
        f"{_field(path, value, si(value, 'B', 3))}</span>"
        for name, css, value, path in parts
    )
    headroom = fit.device_memory_bytes - fit.total_bytes
    legend += (
        f"<span>total {_field('fit.total_bytes', fit.total_bytes, si(fit.total_bytes, 'B', 3))} of "
        f"{_field('fit.device_memory_bytes', fit.device_memory_bytes, si(fit.device_memory_bytes, 'B', 3))} usable; "
        f"{'headroom ' + si(headroom, 'B', 3) if headroom >= 0 else 'over by ' + si(-headroom, 'B', 3)}</span>"
    )
    if fit.total_bytes_interval is not None:
        band = fit.total_bytes_interval
        legend += (
            f"<span>{band.level:.0%} interval {escape(render.interval_text(band, lambda b: si(b, 'B', 3)))}; "
            f"{escape(render.fits_text(fit.fits_probability, fit.fits, band.level))}</span>"
        )
    out.append(f'<div class="legend">{legend}</div>')
    return "\n".join(out)


# --- timelines -----------------------------------------------------------------------------------


def _timelines(report: Report, inputs: PlanInputs, passes: list[PassTimelines]) -> str:
    from costmodel.plans.gantt import MAX_RANKS, MEANING

    head = [
        '<section id="timeline"><h2>Ring timeline of one layer, rank by rank</h2>',
        '<p class="caption">Each row is a rank, time runs right; all panels share one time scale. '
        "Gaps are waits: idle until the slowest rank of the step is done (the causal imbalance), then on "
        "the link when the next block has not landed (exposed transfer). The top lane marks transfers in "
        "flight. Hover for values.</p>",
    ]
    if inputs.cp > MAX_RANKS:
        head.append(
            f'<p class="omitted">Not drawn: one row per rank reads up to N = {MAX_RANKS} ranks; this plan '
            f"has N = {inputs.cp}.</p></section>"
        )
        return "\n".join(head)
    legend = "".join(
        f'<span title="{escape(MEANING[k])}"><i style="background: var(--{k})"></i>{KIND_LABEL[k]}</span>'
        for k in KIND_CLASS
    )
    legend += '<span><i style="background: var(--flight)"></i>transfer in flight (link lane)</span>'
    head.append(f'<div class="legend">{legend}</div>')
    for one in passes:
        span = max(t.total_s for t in one.timelines.values())
        head.append(f"<h3>{'Backward' if one.backward else 'Forward'}</h3>")
        panels = []
        for layout in LAYOUTS:
            if layout in one.timelines:
                panels.append(_panel(one.timelines[layout], span, report, chosen=layout == inputs.layout))
            else:
                panels.append(
                    f'<div class="panel"><h3>{layout}</h3><p class="omitted">{escape(one.skipped[layout])}</p></div>'
                )
        head.append(f'<div class="panels">{"".join(panels)}</div>')
    head.append('<div class="readout" id="readout">Hover a bar for its rank, step and time.</div></section>')
    return "\n".join(head)


def _merged(timeline: Timeline, rank: int) -> list[tuple[str, float, float, list[int]]]:
    """A rank's segments with waiting neighbours of one kind joined (compute keeps its steps apart):
    (kind, start, end, steps)."""
    out: list[tuple[str, float, float, list[int]]] = []
    for s in timeline.segments(rank):
        if (
            out
            and out[-1][0] == s.kind != "compute"
            and abs(out[-1][2] - s.start_s) <= 1e-12 * timeline.total_s
        ):
            kind, start, _, steps = out[-1]
            out[-1] = (kind, start, s.end_s, steps + [s.step])
        else:
            out.append((s.kind, s.start_s, s.end_s, [s.step]))
    return out


def _steps_label(steps: list[int]) -> str:
    named = [s for s in steps if s >= 0]
    tail = " + after the last step" if -1 in steps else ""
    if not named:
        return "after the last step"
    return (f"step {named[0]}" if len(named) == 1 else f"steps {named[0]}–{named[-1]}") + tail


def _panel(timeline: Timeline, span_s: float, report: Report, chosen: bool) -> str:
    n = timeline.ranks
    row = max(5.0, min(20.0, 200.0 / n))
    lane = 8.0
    top = lane + 4
    height = top + n * row + AXIS_HEIGHT
    plot = PANEL_WIDTH - LABEL_WIDTH - 8
    scale = plot / span_s

    def x(t: float) -> float:
        return LABEL_WIDTH + t * scale

    svg = [
        f'<svg class="chart gantt" viewBox="0 0 {PANEL_WIDTH} {height:.0f}" role="img" '
        f'aria-label="{timeline.layout} ring timeline" data-layout="{timeline.layout}" '
        f'data-pass="{"bwd" if timeline.backward else "fwd"}" data-total-s="{timeline.total_s!r}" data-ranks="{n}">'
    ]
    svg.append(f'<text x="{LABEL_WIDTH - 4}" y="{lane}" text-anchor="end">link</text>')
    svg.append(f'<rect x="{LABEL_WIDTH}" y="1" width="{plot}" height="{lane - 1}" fill="#f5f6f8" />')
    starts = [float(t) for t in timeline.step_start_s]
    flights = [(starts[j], starts[j] + float(m), f"step {j}") for j, m in enumerate(timeline.comm_s) if m > 0]
    if timeline.tail_s > 0:
        flights.append((starts[-1], starts[-1] + timeline.tail_s, "after the last step"))
    what = "KV block" if not timeline.backward else "KV block and dK/dV"
    for a, b, label in flights:
        svg.append(
            f'<rect x="{x(a):.2f}" y="1" width="{max((b - a) * scale, 0.4):.2f}" height="{lane - 1}" '
            f'class="k-flight"><title>link, {label}: {what} in flight {seconds(b - a)}</title></rect>'
        )
    for rank in range(n):
        y = top + rank * row
        svg.append(f'<g class="rank" data-rank="{rank}">')
        if n <= 16 or rank % max(1, n // 8) == 0:
            svg.append(
                f'<text x="{LABEL_WIDTH - 4}" y="{y + row * 0.75:.1f}" text-anchor="end">rank {rank}</text>'
            )
        for kind, start, end, steps in _merged(timeline, rank):
            tip = f"rank {rank} · {_steps_label(steps)} · {KIND_LABEL[kind]} {seconds(end - start)}"
            if kind == "compute" and len(steps) == 1 and steps[0] >= 0:
                tip += f" · {count(int(timeline.pairs[rank, steps[0]]))} pairs"
            svg.append(
                f'<rect x="{x(start):.2f}" y="{y:.1f}" width="{max((end - start) * scale, 0.3):.2f}" '
                f'height="{row - 1:.1f}" class="{KIND_CLASS[kind]}"><title>{escape(tip)}</title></rect>'
            )
        svg.append("</g>")
    axis_y = top + n * row + 2
    for tick in _ticks(span_s):
        svg.append(
            f'<line x1="{x(tick):.2f}" x2="{x(tick):.2f}" y1="{axis_y}" y2="{axis_y + 4}" stroke="#9aa1ad" />'
        )
        svg.append(
            f'<text x="{x(tick):.2f}" y="{axis_y + 15}" text-anchor="middle">{seconds(tick, 2) if tick else "0"}</text>'
        )
    end = x(timeline.total_s)
    svg.append(
        f'<line x1="{end:.2f}" x2="{end:.2f}" y1="{top - 2}" y2="{axis_y}" stroke="#1d2330" stroke-width="1" />'
    )
    svg.append("</svg>")

    totals = [timeline.totals(r) for r in range(n)]
    busy = sum(t["compute"] for t in totals) / (n * timeline.total_s)
    exposed = max(t["transfer"] for t in totals)
    utilization = getattr(report.causal.utilization, timeline.layout)
    field = f"causal.utilization.{timeline.layout}"
    util = (
        f" · utilisation {_field(field, utilization, percent(utilization))}"
        if utilization is not None and report.inputs.causal and not timeline.backward
        else ""
    )
    mark = " <span>(this plan)</span>" if chosen else ""
    caption = (
        f'<p class="caption">{seconds(timeline.total_s)} · ranks computing {percent(busy)} of the time'
        f"{util} · exposed transfer {seconds(exposed) if exposed else 'none'}</p>"
    )
    return (
        f'<div class="panel{" chosen" if chosen else ""}" data-layout="{timeline.layout}">'
        f"<h3>{timeline.layout}{mark}</h3>{''.join(svg)}{caption}</div>"
    )


def _ticks(span_s: float) -> list[float]:
    """Three to six round ticks from 0 to ``span_s``."""

    raw = span_s / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [k * step for k in range(int(span_s / step + 1e-9) + 1)]


# --- schemes, notes, formulas --------------------------------------------------------------------


def _schemes(report: Report) -> str:
    rows = []
    for row in render.scheme_rows(report):
        cells = [escape(c) for c in row]
        cells[4] = _chip(row[4])
        rows.append(cells)
    ring = _table(
        ["", "FLOP", "compute", "receive", "ratio"],
        ([escape(c) for c in row] for row in render.time_rows(report)),
    )
    r = report.ring
    return "\n".join(
        [
            f"<section><h2>Schemes, {escape(report.inputs.pass_)}, per device per layer</h2>",
            _table(
                ["scheme", "receive", "comm", "ratio", "verdict", "exposed", "note"], rows, text_columns=(6,)
            ),
            f'<p class="caption">{escape(render.SCHEMES_CAPTION)}</p>',
            "<h3>Ring, one device</h3>",
            ring,
            f'<p class="caption">step receive {_field("ring.step_comm_s", r.step_comm_s, seconds(r.step_comm_s))} · '
            f"balanced step compute {_field('ring.step_compute_s', r.step_compute_s, seconds(r.step_compute_s))} · "
            f"{escape(render.time_caption(report))}</p>",
            "</section>",
        ]
    )


def _notes(report: Report) -> str:
    measured, blocks = render.causal_lines(report)
    items = "".join(f"<li>{escape(note)}</li>" for note in report.notes)
    return (
        f"<section><h2>Notes</h2><p>Causal utilisation, {escape(measured)}; {escape(blocks)}.</p>"
        f"<ul>{items}</ul></section>"
    )


def _explain(trace: list[Evaluation]) -> str:
    rows = (
        [escape(r["name"]), escape(r["formula"]), escape(r["substituted"]), escape(r["value"])]
        for r in render.explain_rows(trace)
    )
    return (
        "<section><h2>Formulas, then values</h2>"
        + _table(["quantity", "formula", "with values", "value"], rows, text_columns=(1, 2))
        + "</section>"
    )


# --- the sweep page ------------------------------------------------------------------------------


def sweep_page(grids: list[Grid], shape: PlanInputs) -> str:
    """One heatmap per profile: S down, N across, each cell the verdict's colour and the step ratio."""
    mask = "causal" if shape.causal else "non-causal"
    sub = (
        f"h = {shape.heads}, n_kv = {shape.kv_heads}, d = {shape.head_dim} · {shape.dtype} · {mask} · "
        f"{shape.pass_} step comm ratio · green &lt; 5 %, amber ≤ 15 %, red above"
    )
    body = [
        "<header><h1>cp-plan sweep</h1>",
        f'<p class="sub">{sub}</p></header>',
        '<div class="legend"><span><i class="v-green"></i>green: overlap headroom</span>'
        '<span><i class="v-amber"></i>amber: measure end-to-end</span>'
        '<span><i class="v-red"></i>red: communication not negligible</span>'
        '<span><i style="background: #f0f1f3"></i>N does not split S</span>'
        "<span>* the ring leaves the node</span></div>",
    ]
    for grid in grids:
        body.append(f"<section><h2>{escape(grid.profile)}</h2>{_heatmap(grid)}</section>")
    body.append('<div class="readout" id="readout">Hover a cell for its values.</div>')
    return _page("cp-plan sweep", body)


def _heatmap(grid: Grid) -> str:

    names = ["green", "amber", "red"]
    fills = {-1: "#f0f1f3", 0: "#2e8540", 1: "#c98a00", 2: "#c0392b"}
    cell_w, cell_h, left, top = 64, 24, 64, 30
    verdicts = grid.verdicts()
    width = left + cell_w * len(grid.ns) + 90
    height = top + cell_h * len(grid.seqs) + 8
    svg = [
        f'<svg class="chart heat" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(grid.profile)} step comm ratio heatmap" style="max-width: {width * 1.3:.0f}px">',
        f'<text x="{left - 8}" y="{top - 10}" text-anchor="end">S \\ N</text>',
        f'<text x="{left + cell_w * len(grid.ns) + 8}" y="{top - 10}">N_max</text>',
    ]
    for j, n in enumerate(grid.ns):
        star = "*" if grid.inter_node[j] else ""
        svg.append(
            f'<text x="{left + cell_w * (j + 0.5)}" y="{top - 10}" text-anchor="middle">{int(n)}{star}</text>'
        )
    for i, seq in enumerate(grid.seqs):
        y = top + i * cell_h
        svg.append(
            f'<text x="{left - 8}" y="{y + cell_h * 0.65}" text-anchor="end">{tokens_label(int(seq))}</text>'
        )
        for j, n in enumerate(grid.ns):
            code = int(verdicts[i, j])
            ratio = float(grid.ratio[i, j])
            x = left + j * cell_w
            if code < 0:
                tip = f"S = {tokens_label(int(seq))}, N = {int(n)}: N does not split S"
                label = ""
            else:
                scope = "inter-node" if grid.inter_node[j] else "intra-node"
                tip = (
                    f"S = {tokens_label(int(seq))}, N = {int(n)}: step comm ratio {percent(ratio)}, {names[code]}, "
                    f"{scope}; step compute {seconds(float(grid.step_compute_s[i, j]))}, step receive "
                    f"{seconds(float(grid.step_comm_s[i, j]))}"
                )
                label = short_percent(ratio)
            value = "null" if math.isnan(ratio) else repr(ratio)
            svg.append(
                f'<rect x="{x + 1}" y="{y + 1}" width="{cell_w - 2}" height="{cell_h - 2}" rx="2" '
                f'fill="{fills[code]}" data-seq="{int(seq)}" data-n="{int(n)}" data-value="{value}" '
                f'data-verdict="{names[code] if code >= 0 else ""}"><title>{escape(tip)}</title></rect>'
            )
            if label:
                svg.append(
                    f'<text x="{x + cell_w / 2}" y="{y + cell_h * 0.66}" text-anchor="middle" '
                    f'style="fill: #fff; pointer-events: none">{label}</text>'
                )
        svg.append(
            f'<text x="{left + cell_w * len(grid.ns) + 8}" y="{y + cell_h * 0.65}">'
            f"{grid.n_max[i]:,.1f}</text>"
        )
    svg.append("</svg>")
    return "".join(svg)
