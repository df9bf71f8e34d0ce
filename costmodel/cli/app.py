"""The ``cp-plan`` command line (SPEC §6). Each command is a typed function; its docstring is its help."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from costmodel.cli import kernel as kernel_cli
from costmodel.cli import planning, step
from costmodel.cli.kernel import app as kernel_app
from costmodel.cli.options import (
    SEED,
    BatchOpt,
    BlockOpt,
    CausalOpt,
    DimOpt,
    DtypeOpt,
    EffOpt,
    ExplainOpt,
    Format,
    FormatOpt,
    HeadsOpt,
    HwOpt,
    KvOpt,
    LayoutOpt,
    ModelOpt,
    NOpt,
    PassOpt,
    SeqOpt,
    console,
    plan_inputs,
)
from costmodel.core.errors import InputError
from costmodel.machines.profiles import builtin_names, load_profile

app = typer.Typer(
    name="cp-plan",
    help="Should this sequence be split over N devices, and how? A cost model for context parallelism.",
    add_completion=False,
    no_args_is_help=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
hw_app = typer.Typer(help="Hardware profiles: built-in names or YAML files.", add_completion=False)
app.add_typer(hw_app, name="hw")
app.add_typer(kernel_app, name="kernel")
app.command("calibrate")(kernel_cli.calibrate)
app.command("validate")(kernel_cli.validate)
app.command("recommend")(planning.recommend_cmd)
app.command("sweep")(planning.sweep_cmd)
app.command("check")(planning.check_cmd)
app.command("step")(step.step_cmd)


@app.callback(invoke_without_command=True)
def report(
    ctx: typer.Context,
    seq: SeqOpt = SEED.seq,
    n: NOpt = SEED.n,
    hw: HwOpt = SEED.hw,
    model: ModelOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvOpt = None,
    head_dim: DimOpt = None,
    batch: BatchOpt = SEED.batch,
    dtype: DtypeOpt = SEED.dtype,
    block: BlockOpt = SEED.block,
    causal: CausalOpt = SEED.causal,
    layout: LayoutOpt = SEED.layout,
    efficiency: EffOpt = SEED.efficiency,
    pass_: PassOpt = SEED.pass_,
    format: FormatOpt = Format.table,
    explain: ExplainOpt = False,
) -> None:
    """Report memory tiers, traffic, intensity vs beta, times, the verdict and the CP degree to use.

    Example: cp-plan --seq 262144 --n 8 --hw a100-nvlink
    """
    if ctx.invoked_subcommand is not None:
        return
    from costmodel.cli import render
    from costmodel.plans.evaluate import evaluate

    inputs = plan_inputs(seq, n, hw, model, heads, kv_heads, head_dim, batch, dtype, block, causal, layout,
                         efficiency, pass_)  # fmt: skip
    profile = load_profile(hw)
    trace: list | None = [] if explain else None
    result = evaluate(inputs, profile, trace)
    if format is Format.json:
        sys.stdout.write(render.to_json(result, trace) + "\n")
    elif format is Format.yaml:
        sys.stdout.write(render.to_yaml(result, trace))
    elif format is Format.markdown:
        sys.stdout.write(render.to_markdown(result, trace))
    else:
        screen = console()
        render.render_table(result, screen)
        if trace is not None:
            render.render_explain(trace, screen)


@hw_app.command("list")
def hw_list() -> None:
    """List the built-in hardware profiles."""
    from rich import box
    from rich.table import Table

    from costmodel.core.units import si

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  caption="links per direction; a ring leaves the node beyond CP/node ranks")  # fmt: skip
    for column in ("name", "device", "bf16 peak", "intra-node", "inter-node", "CP/node"):
        table.add_column(column, no_wrap=True)
    for name in builtin_names():
        p = load_profile(name)
        inter = p.links.inter_node
        table.add_row(
            name, p.device.name, si(p.device.peak_flops.get("bf16"), "FLOP/s", 3),
            si(p.links.intra_node.bandwidth_per_direction, "B/s", 3),
            si(inter.bandwidth_per_direction, "B/s", 3) if inter else "none", str(p.ranks_per_node),
        )  # fmt: skip
    console().print(table)


@hw_app.command("show")
def hw_show(name: Annotated[str, typer.Argument(help="Built-in name or YAML path.")]) -> None:
    """Print one profile as validated YAML (units SI; bandwidth per direction)."""
    import yaml

    profile = load_profile(name, field="NAME")
    sys.stdout.write(yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False))


@app.command("formulas")
def formulas_cmd(
    name: Annotated[Optional[str], typer.Argument(help="One formula; all when omitted.")] = None,
    latex: Annotated[bool, typer.Option("--latex", help="LaTeX (imports sympy).")] = False,
) -> None:
    """List the model's formulas: name, expression, meaning, unit and source."""
    from costmodel.symbolic import numeric

    if name is not None and name not in numeric.INFO:
        raise InputError("NAME", f"unknown formula {name!r}; known: {', '.join(numeric.INFO)}")
    names = [name] if name else list(numeric.INFO)
    if latex:
        from costmodel.symbolic import formulas

        for n in names:
            sys.stdout.write(f"{n}: {formulas.FORMULAS[n].latex}\n")
        return
    from rich.text import Text

    screen = console()
    for n in names:
        symbol, expression, _, meaning, unit, source, _ = numeric.INFO[n]
        screen.print(Text(n, style="bold") + Text(f"  {symbol} = {expression}  [{unit}]"))
        screen.print(Text(f"    {meaning} ({source})", style="dim"))
