"""``cp-plan step``: the whole training step's time, tokens/s, MFU and HFU, with a breakdown."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from costmodel.cli.options import Format, FormatOpt, console
from costmodel.plans.inputs import parse_tokens

SeqOpt = Annotated[int, typer.Option("--seq", "-s", parser=lambda text: parse_tokens(text), help="S, tokens.")]
HwOpt = Annotated[str, typer.Option("--hw", help="Hardware profile name or YAML path.")]


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class Scheme(str, Enum):
    ring = "ring"
    ulysses = "ulysses"
    usp = "usp"
    allgather = "allgather"


class Layout(str, Enum):
    contiguous = "contiguous"
    striped = "striped"
    zigzag = "zigzag"


def step_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="Model preset name or YAML path.")],
    seq: SeqOpt,
    hw: HwOpt,
    gpus: Annotated[int, typer.Option("--gpus", help="Devices in the job: tp x cp x pp x DP.")],
    global_batch: Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step.")],
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree (with sequence parallelism).")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual stages per device (interleaved 1F1B).")] = 1,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")] = 1,
    recompute: Annotated[
        Recompute, typer.Option("--recompute", help="Activation recompute.")
    ] = Recompute.selective,
    cp_scheme: Annotated[Scheme, typer.Option("--cp-scheme", help="How CP exchanges K and V.")] = Scheme.ring,
    layout: Annotated[
        Layout, typer.Option("--layout", help="Which tokens each CP rank holds.")
    ] = Layout.zigzag,
    zero3: Annotated[
        bool, typer.Option("--zero3/--no-zero3", help="ZeRO-3 / FSDP parameter sharding.")
    ] = False,
    efficiency: Annotated[
        Optional[float],
        typer.Option("--efficiency", help="Override: every kernel at this share of peak, (0, 1]."),
    ] = None,
    format: FormatOpt = Format.table,
) -> None:
    """Predict one training step: time, tokens/s, model TFLOP/s per GPU, MFU, HFU and where the time goes.

    Example: cp-plan step --model llama3-8b --seq 8192 --hw h100-nvlink --gpus 8 --global-batch 16
    """
    from pydantic import ValidationError

    from costmodel.core.errors import InputError, describe_validation
    from costmodel.training.step import StepSetup, evaluate_step

    try:
        setup = StepSetup(model=model, seq=seq, hw=hw, gpus=gpus, tp=tp, cp=cp, pp=pp, vpp=vpp,
                          micro_batch=micro_batch, global_batch=global_batch, recompute=recompute.value,
                          cp_scheme=cp_scheme.value, layout=layout.value, zero3=zero3,
                          efficiency=efficiency)  # fmt: skip
    except ValidationError as exc:
        field = str(exc.errors()[0]["loc"][0]).replace("_", "-")
        raise InputError(f"--{field}", describe_validation(exc).split(": ", 1)[-1]) from None
    result = evaluate_step(setup)
    if format is Format.json:
        sys.stdout.write(json.dumps(result, indent=2, allow_nan=False) + "\n")
    elif format is Format.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(result, sort_keys=False))
    else:
        _table(result)


def _table(result: dict) -> None:
    from rich import box
    from rich.table import Table

    from costmodel.core.units import seconds

    step, inputs = result["step"], result["inputs"]
    screen = console()
    screen.print(
        f"{inputs['model']} S={inputs['seq']} on {inputs['gpus']} x {inputs['hw']}: tp {inputs['tp']}, "
        f"cp {inputs['cp']} ({inputs['cp_scheme']}, {inputs['layout']}), pp {inputs['pp']} (v {inputs['vpp']}), "
        f"dp {inputs['dp']}, {inputs['micro_batches']} micro-batches of {inputs['micro_batch']}, "
        f"recompute {inputs['recompute']}"
    )
    screen.print(
        f"step {seconds(step['time_s'])}   {step['tokens_per_s']:,.0f} tokens/s "
        f"({step['tokens_per_s_per_gpu']:,.0f} per GPU)   {step['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU   "
        f"MFU {step['mfu']:.1%} ({step['mfu_causal_attention']:.1%} counting causal attention)   "
        f"HFU {step['hfu']:.1%}"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  caption="MFU: 6·P·tokens + 12·n_L·h·d·S·tokens model FLOP [PaLM]; HFU: what runs, recompute in")  # fmt: skip
    for column in ("component", "time", "share"):
        table.add_column(column, justify="left" if column == "component" else "right")
    for name, value in step["breakdown"].items():
        if value > 0:
            table.add_row(name, seconds(value), f"{value / step['time_s']:.1%}")
    screen.print(table)
