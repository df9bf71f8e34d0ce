"""The ``cp-plan`` command line. Each command is a typed function; its docstring is its help; its flags come
from the declared inputs (:mod:`costmodel.plans.inputs`)."""

from __future__ import annotations

import difflib
import functools
import os
import sys
from typing import Annotated, Optional

import typer

from costmodel import __version__
from costmodel.cli import timeline as drawing
from costmodel.cli.options import HELP_FLAGS, console, declared, house_table
from costmodel.cli.output import Format, emit, format_option
from costmodel.cli.timeline import TimelineOpt
from costmodel.core.errors import InputError
from costmodel.machines.compose import ProfileChanges, override
from costmodel.machines.profiles import HardwareProfile, builtin_names, load_profile
from costmodel.plans.inputs import LayerKernel, MachineOverrides, PlanInputs, machine_for

app = typer.Typer(
    name="cp-plan",
    help="Should this sequence be split over N devices, and how? A cost model for context parallelism.",
    add_completion=True,
    no_args_is_help=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings=HELP_FLAGS,
)
hw_app = typer.Typer(
    help="Hardware profiles: built-in names or YAML files.", add_completion=False, context_settings=HELP_FLAGS
)
app.add_typer(hw_app, name="hw")
# Commands whose modules load the training step, the search, the audit or the kernel: registered only when
# the command line may name one, so that the plan itself (no subcommand) starts without them.
SUBCOMMANDS = (
    "kernel",
    "calibrate",
    "validate",
    "recommend",
    "sweep",
    "check",
    "report",
    "step",
    "audit",
    "infer",
)
SUBCOMMANDS_OF_HW = ("from-nccl-tests", "fit-kernels")


@functools.cache
def with_subcommands() -> typer.Typer:
    """The whole command line: ``app`` with every command registered."""
    from costmodel.cli import audit, hw, infer, kernel, plan_file, planning, step

    app.add_typer(kernel.app, name="kernel")
    app.command("calibrate")(kernel.calibrate)
    app.command("validate")(kernel.validate)
    app.command("recommend")(planning.recommend_cmd)
    app.command("sweep")(planning.sweep_cmd)
    app.command("check")(planning.check_cmd)
    app.command("report")(plan_file.report_cmd)
    app.command("step")(step.step_cmd)
    app.command("audit")(audit.audit_cmd)
    hw_app.command("from-nccl-tests")(hw.from_nccl_tests)
    hw_app.command("fit-kernels")(hw.fit_kernels)
    app.command("infer")(infer.infer_cmd)
    return app


def names_a_command(argv: list[str]) -> bool:
    """Whether ``argv`` may name a command of :func:`with_subcommands`, or asks for help or completion (a
    value that happens to spell a command only costs time)."""
    asks = {
        *SUBCOMMANDS,
        *SUBCOMMANDS_OF_HW,
        *HELP_FLAGS["help_option_names"],
        "--install-completion",
        "--show-completion",
    }
    return any(key.startswith("_CP_PLAN_COMPLETE") for key in os.environ) or bool(asks.intersection(argv))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cp-plan {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
@declared(inputs=PlanInputs, machine_overrides=MachineOverrides, kernel=LayerKernel)
def report(
    ctx: typer.Context,
    inputs: PlanInputs,
    machine_overrides: MachineOverrides,
    kernel: LayerKernel,
    format: format_option("table", "json", "yaml", "markdown", "html") = Format.table,
    explain: Annotated[
        bool, typer.Option("--explain", help="Also print each formula, then with values.")
    ] = False,
    timeline: TimelineOpt = False,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_version, help="Print the version and exit.")
    ] = False,
) -> None:
    """Report memory tiers, traffic, intensity vs beta, times, the verdict and the CP degree to use.

    Example: cp-plan --seq 262144 --n 8 --hw a100-nvlink
    """
    if ctx.invoked_subcommand is not None:
        _refuse_root_options(ctx)
        return
    from costmodel.cli import render
    from costmodel.plans.evaluate import evaluate

    machine = machine_for(inputs, machine_overrides, kernel=kernel)
    if timeline:
        drawing.check_request(inputs.cp, format.value)
    trace: list | None = [] if explain else None
    result = evaluate(inputs, machine, trace)

    def table() -> None:
        screen = console()
        render.render_table(result, screen)
        if trace is not None:
            render.render_explain(trace, screen)
        if timeline:
            drawing.render(inputs, machine, screen)

    def html() -> str:
        from costmodel.cli import html
        from costmodel.plans.gantt import plan_timelines

        return html.plan_page(result, inputs, machine.profile, plan_timelines(inputs, machine), trace)

    emit(
        render.report_data(result, trace),
        format,
        table=table,
        html=html,
        markdown=lambda: render.to_markdown(result, trace),
    )


def _refuse_root_options(ctx: typer.Context) -> None:
    """The root options feed the single-layer report only; one given before a subcommand would be
    silently dropped (``cp-plan --seq 8k step ...`` planning the default S), so it is an error."""
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            flag = max(param.opts, key=len)
            raise InputError(
                flag,
                f"given before the subcommand {ctx.invoked_subcommand!r}, where it would not apply; "
                f"root options belong to the single-layer report: give it after the subcommand "
                f"(cp-plan {ctx.invoked_subcommand} {flag} ...) if that command takes it",
            )


@hw_app.command("list")
def hw_list(format: format_option("table", "json", "yaml") = Format.table) -> None:
    """List the built-in hardware profiles, grouped by vendor and generation, with each fast-domain size."""
    profiles = [load_profile(name) for name in builtin_names()]
    profiles.sort(key=lambda p: (p.device.vendor or "~", p.device.generation or "", p.name))
    listing = {
        "schema": "cp-plan/hw-list/v1",
        "profiles": [p.model_dump(mode="json", exclude_none=True) for p in profiles],
    }
    emit(listing, format, table=lambda: _hw_table(profiles))


def _hw_table(profiles: list[HardwareProfile]) -> None:
    from rich.text import Text

    table = house_table(
        caption="dense peaks; links per direction; `hw show NAME` for the device and sources; fast domain: devices per node (NVLink, xGMI or ICI "
        "slice; NVL: a switched NVLink rack, mesh: one link per peer, AxBxC: a torus); a ring leaves the node beyond CP/node ranks",
    )
    table.add_column("name", no_wrap=True)
    for column in (
        "bf16\nTFLOP/s",
        "fp8\nTFLOP/s",
        "HBM\nGB",
        "fast\ndomain",
        "CP/\nnode",
        "intra\nGB/s",
        "inter\nGB/s",
    ):
        table.add_column(column, justify="right", no_wrap=True)

    def number(value: float | None, unit: float) -> str:
        return "-" if value is None else f"{value / unit:.4g}"

    group = None
    for p in profiles:
        family = f"{p.device.vendor or 'other'} {p.device.generation or ''}".strip()
        if family != group:
            if group is not None:
                table.add_section()
            table.add_row(Text(family, style="bold"))
            group = family
        inter = p.links.inter_node
        table.add_row(
            p.name,
            number(p.device.peak_flops.get("bf16"), 1e12),
            number(p.device.peak_flops.get("fp8"), 1e12),
            number(p.device.hbm_bytes, 1e9),
            _domain(p),
            str(p.ranks_per_node),
            number(p.links.intra_node.bandwidth_per_direction, 1e9),
            number(inter.bandwidth_per_direction if inter else None, 1e9),
        )
    console().print(table)


def _domain(profile: HardwareProfile) -> str:
    """The fast domain in a few characters: 8 (a switched node), 72 NVL, 8 mesh, 16x16x24 (a torus)."""
    shape = profile.shape
    if shape.dims:
        return "x".join(map(str, shape.dims))
    suffix = {"nvlink-domain": " NVL", "mesh": " mesh"}.get(shape.kind, "")
    return f"{profile.devices_per_node}{suffix}"


@hw_app.command("show")
@declared(machine_overrides=MachineOverrides)
def hw_show(
    machine_overrides: MachineOverrides,
    name: Annotated[str, typer.Argument(help="Built-in name or YAML path.")],
) -> None:
    """Print one profile as validated YAML (units SI; bandwidth per direction), its sources first; with the
    composition flags, the profile as they change it (e.g. --inter-node-bandwidth 800Gb, --torus-dims 4x4x8)."""
    import yaml

    profile = load_profile(name, field="NAME")
    profile = override(profile, ProfileChanges(**machine_overrides.changes()))
    sources = [("profile", profile.source.url or f"measured on {profile.source.host}, {profile.source.date}")]
    for scope in ("intra_node", "inter_node"):
        link = getattr(profile.links, scope)
        if link is not None and link.source:
            sources.append((f"links.{scope}", link.source))
    for part in ("topology", "fallback_efficiency"):
        cited = getattr(profile, part)
        if cited is not None and cited.source:
            sources.append((part, cited.source))
    header = "".join(f"# source ({what}): {where}\n" for what, where in sources)
    body = yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False)
    sys.stdout.write(header + body)


@app.command("formulas")
def formulas_cmd(
    name: Annotated[Optional[str], typer.Argument(help="One formula; all when omitted.")] = None,
    latex: Annotated[bool, typer.Option("--latex", help="LaTeX (imports sympy).")] = False,
) -> None:
    """List the model's formulas: name, expression, meaning, unit and source."""
    from costmodel.symbolic.formula_text import INFO

    if name is not None and name not in INFO:
        near = difflib.get_close_matches(name, INFO, n=5, cutoff=0.5)
        hint = f"nearest: {', '.join(near)}; " if near else ""
        raise InputError(
            "NAME", f"unknown formula {name[:80]!r}; {hint}`cp-plan formulas` lists all {len(INFO)}"
        )
    names = [name] if name else list(INFO)
    if latex:
        from costmodel.symbolic import formulas

        for n in names:
            sys.stdout.write(f"{n}: {formulas.FORMULAS[n].latex}\n")
        return
    from rich.text import Text

    screen = console()
    for n in names:
        symbol, expression, _, meaning, unit, source, _ = INFO[n]
        screen.print(Text(n, style="bold") + Text(f"  {symbol} = {expression}  [{unit}]"))
        screen.print(Text(f"    {meaning} ({source})", style="dim"))
