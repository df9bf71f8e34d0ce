"""Options and helpers shared by the commands: one definition per flag."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from costmodel.core.errors import InputError
from costmodel.machines.profiles import Dtype, builtin_names
from costmodel.plans.inputs import TOKENS_HELP, Pass, PlanInputs, parse_tokens
from costmodel.plans.models import load_model
from costmodel.schedule.layouts import Layout

if TYPE_CHECKING:
    from rich.console import Console


def console() -> Console:
    """rich is imported only when a screen is drawn."""
    from rich.console import Console

    return Console(highlight=False)


class Format(str, Enum):
    """Output formats of the report commands."""

    table = "table"
    json = "json"
    yaml = "yaml"
    markdown = "markdown"
    html = "html"


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
PassOpt = Annotated[Pass, typer.Option("--pass", help="Which pass the verdict covers; fwd+bwd takes the worse.")]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output format.")]
ExplainOpt = Annotated[bool, typer.Option("--explain", help="Also print each formula, then with values.")]


def plan_inputs(seq: int, n: int, hw: str, model: str | None, heads: int | None, kv_heads: int | None,
                head_dim: int | None, batch: int, dtype: str, block: int, causal: bool, layout: str,
                efficiency: float, pass_: str = "fwd") -> PlanInputs:  # fmt: skip
    """Flags over model preset over the seed's defaults; checked."""
    preset = load_model(model) if model else None

    def pick(flag: int | None, name: str) -> int:
        if flag is not None:
            return flag
        return getattr(preset, name) if preset else getattr(SEED, name)

    return PlanInputs(
        seq=seq, n=n, batch=batch, heads=pick(heads, "heads"), kv_heads=pick(kv_heads, "kv_heads"),
        head_dim=pick(head_dim, "head_dim"), dtype=dtype, block=block, causal=causal, layout=layout,
        efficiency=efficiency, hw=hw, model=preset.name if preset else None, pass_=pass_,
    ).check()  # fmt: skip
