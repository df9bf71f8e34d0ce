"""The ``cp-plan`` command line (SPEC §6). Each command is a typed function; its docstring is its help."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from costmodel.errors import InputError
from costmodel.hardware import Dtype, builtin_names, load_profile
from costmodel.layouts import Layout
from costmodel.workload import TOKENS_HELP, PlanInputs, load_model, parse_tokens

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


class Format(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"
    markdown = "markdown"


def _tokens(field: str):  # noqa: ANN202 - a typer parser
    def parse(text: str) -> int:
        try:
            return parse_tokens(text, field)
        except InputError as exc:
            raise typer.BadParameter(exc.message) from None

    return parse


SEED = PlanInputs(seq=262_144, n=8)  # the defaults: seed 000's worked example

SeqOpt = Annotated[int, typer.Option("--seq", "-s", parser=_tokens("seq"), help=f"S, tokens: {TOKENS_HELP}.")]
NOpt = Annotated[int, typer.Option("--n", "-n", help="N, the CP degree: devices the sequence is split over.")]
HwOpt = Annotated[str, typer.Option("--hw", help=f"Hardware: {', '.join(builtin_names())}, or a YAML path.")]
ModelOpt = Annotated[
    Optional[str], typer.Option("--model", "-m", help="Model preset name or YAML path; sets heads, kv-heads, head-dim.")
]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", help="h, query heads [default: 32 or the model's].")]
KvOpt = Annotated[Optional[int], typer.Option("--kv-heads", help="n_kv, key/value heads [default: 8 or the model's].")]
DimOpt = Annotated[Optional[int], typer.Option("--head-dim", help="d, head dimension [default: 128 or the model's].")]
BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="b, sequences per device.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Element type of Q, K, V: sets p and the peak FLOP/s.")]
BlockOpt = Annotated[int, typer.Option("--block", parser=_tokens("block"), help="s_blk, compute tile rows.")]
CausalOpt = Annotated[bool, typer.Option("--causal/--no-causal", help="Causal mask: useful compute halves.")]
LayoutOpt = Annotated[Layout, typer.Option("--layout", help="Which tokens each device holds.")]
EffOpt = Annotated[float, typer.Option("--efficiency", help="Effective / peak FLOP/s, in (0, 1]; 1 = peak.")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Also print each formula, then with values.")]


def plan_inputs(seq: int, n: int, hw: str, model: str | None, heads: int | None, kv_heads: int | None,
                head_dim: int | None, batch: int, dtype: str, block: int, causal: bool, layout: str,
                efficiency: float) -> PlanInputs:  # fmt: skip
    """Flags over model preset over the seed's defaults; checked."""
    preset = load_model(model) if model else None

    def pick(flag: int | None, name: str) -> int:
        if flag is not None:
            return flag
        return getattr(preset, name) if preset else getattr(SEED, name)

    return PlanInputs(
        seq=seq, n=n, batch=batch, heads=pick(heads, "heads"), kv_heads=pick(kv_heads, "kv_heads"),
        head_dim=pick(head_dim, "head_dim"), dtype=dtype, block=block, causal=causal, layout=layout,
        efficiency=efficiency, hw=hw, model=preset.name if preset else None,
    ).check()  # fmt: skip


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
    format: FormatOpt = Format.table,
    explain: ExplainOpt = False,
) -> None:
    """Report memory tiers, traffic, intensity vs beta, times, the verdict and the CP degree to use.

    Example: cp-plan --seq 262144 --n 8 --hw a100-nvlink
    """
    if ctx.invoked_subcommand is not None:
        return
    from costmodel.cli import render
    from costmodel.plan import evaluate

    inputs = plan_inputs(seq, n, hw, model, heads, kv_heads, head_dim, batch, dtype, block, causal, layout,
                         efficiency)  # fmt: skip
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
        console = _console()
        render.render_table(result, console)
        if trace is not None:
            render.render_explain(trace, console)


def _console():  # noqa: ANN202 - rich is imported only when a screen is drawn
    from rich.console import Console

    return Console(highlight=False)


@hw_app.command("list")
def hw_list() -> None:
    """List the built-in hardware profiles."""
    from rich import box
    from rich.table import Table

    from costmodel.units import si

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
    _console().print(table)


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
    from costmodel import numeric

    if name is not None and name not in numeric.INFO:
        raise InputError("NAME", f"unknown formula {name!r}; known: {', '.join(numeric.INFO)}")
    names = [name] if name else list(numeric.INFO)
    if latex:
        from costmodel import formulas

        for n in names:
            sys.stdout.write(f"{n}: {formulas.FORMULAS[n].latex}\n")
        return
    from rich.text import Text

    console = _console()
    for n in names:
        symbol, expression, _, meaning, unit, source, _ = numeric.INFO[n]
        console.print(Text(n, style="bold") + Text(f"  {symbol} = {expression}  [{unit}]"))
        console.print(Text(f"    {meaning} ({source})", style="dim"))
