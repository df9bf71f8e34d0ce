"""``cp-plan kernel ...``: commands of the torch reference kernel. torch is imported inside commands only,
so importing this module (as the main CLI does at start-up) stays cheap."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer

from costmodel.errors import InputError
from costmodel.kernel import TORCH_DTYPE

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False)


@app.callback()
def kernel() -> None:
    """The torch reference kernel: exact ring and Ulysses attention over torch.distributed."""


def _parse_varlen(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise InputError("--varlen", f"expected comma-separated document boundaries such as 0,100,256; got {text!r}") from None


@app.command()
def selftest(
    nproc: Annotated[int, typer.Option(help="Local processes to spawn (ignored under torchrun).")] = 2,
    seq: Annotated[int, typer.Option(help="Sequence length S (whole sequence, all ranks).")] = 512,
    heads: Annotated[int, typer.Option(help="Query heads h.")] = 4,
    kv_heads: Annotated[int | None, typer.Option(help="Key/value heads n_kv (GQA when < h); defaults to --heads.")] = None,
    head_dim: Annotated[int, typer.Option(help="Head dimension d.")] = 32,
    batch: Annotated[int, typer.Option(help="Batch size b.")] = 1,
    causal: Annotated[bool, typer.Option(help="Causal mask.")] = False,
    layout: Annotated[Literal["contiguous", "striped", "zigzag"], typer.Option(help="Sequence layout.")] = "contiguous",
    varlen: Annotated[str | None, typer.Option(
        help="Packed documents as boundaries (cu_seqlens), e.g. 0,100,317,512: documents never see each other.")] = None,
    dtype: Annotated[Literal["fp32", "bf16", "fp16"], typer.Option(help="Input dtype.")] = "fp32",
    variant: Annotated[Literal["ring", "ulysses", "all"], typer.Option(
        help="Which kernel; 'all' skips Ulysses where SPEC §4.4 rules it out.")] = "all",
    seed: Annotated[int, typer.Option(help="Random seed of the inputs.")] = 0,
    atol: Annotated[float | None, typer.Option(help="Override the dtype's absolute tolerance.")] = None,
    rtol: Annotated[float | None, typer.Option(help="Override the dtype's relative tolerance.")] = None,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(
        help="auto: one GPU per rank with NCCL when there are enough, else CPU with gloo.")] = "auto",
    timeout: Annotated[float, typer.Option(help="Seconds before every rank is killed (deadlock guard).")] = 300.0,
    output_format: Annotated[Literal["table", "json"], typer.Option("--format", help="Output format.")] = "table",
) -> None:
    """Run ring and Ulysses attention on random inputs against a float64 reference, forward and backward.

    Reports the largest absolute error over all ranks of out, lse, dq, dk and dv, and exits 1 when one
    exceeds atol + rtol·max|reference| (0 when all pass, 2 on bad input). Run it locally with --nproc N,
    or on a cluster under torchrun (one process per GPU, NCCL), the way nccl-tests checks an install:

        torchrun --nnodes 2 --nproc-per-node 8 ... -m costmodel.kernel selftest --seq 4096 --causal
    """
    from costmodel.kernel.launch import LaunchError
    from costmodel.kernel.selftest import VARIANTS, SelftestConfig, run_selftest

    try:
        import torch  # noqa: F401 - only to fail early and clearly without the optional extra
    except ImportError:
        raise InputError("cp-plan kernel", "needs torch: pip install 'cp-plan[kernel]'") from None

    config = SelftestConfig(
        seq=seq, heads=heads, kv_heads=heads if kv_heads is None else kv_heads, head_dim=head_dim, batch=batch,
        causal=causal, layout=layout, varlen=_parse_varlen(varlen), dtype=TORCH_DTYPE[dtype],
        variants=VARIANTS if variant == "all" else (variant,), seed=seed, atol=atol, rtol=rtol, device=device)
    try:
        result = run_selftest(config, nproc, timeout_s=timeout)
    except LaunchError as exc:
        typer.echo(f"cp-plan: error: {exc}", err=True)
        raise typer.Exit(1) from None
    if _is_rank_zero():
        if output_format == "json":
            typer.echo(json.dumps(result.to_json(), indent=2))
        else:
            _print_table(result)
    raise typer.Exit(0 if result.passed else 1)


def _is_rank_zero() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


def _print_table(result) -> None:  # a SelftestResult, imported lazily
    from rich.console import Console
    from rich.table import Table

    config = result.config
    atol, rtol = config.tolerance()
    shape = (f"S={config.seq} b={config.batch} h={config.heads} n_kv={config.kv_heads} d={config.head_dim} "
             f"{config.dtype} {config.layout}{' causal' if config.causal else ''}"
             f"{f' varlen={list(config.varlen)}' if config.varlen else ''}")
    table = Table(title=f"kernel selftest: N={result.world_size} ({result.backend}, {result.device}), {shape}",
                  caption=f"tolerance = {atol:g} + {rtol:g}·max|reference|")
    for column in ("variant", "output", "max abs error", "tolerance", "result"):
        table.add_column(column, justify="right" if column in ("max abs error", "tolerance") else "left")
    for name, variant in result.variants.items():
        if variant.skipped is not None:
            table.add_row(name, "-", "-", "-", f"[yellow]skipped[/]: {variant.skipped}")
            continue
        for output, error in variant.errors.items():
            ok = error <= variant.tolerances[output]
            table.add_row(name, output, f"{error:.3e}", f"{variant.tolerances[output]:.3e}",
                          "[green]pass[/]" if ok else "[red]FAIL[/]")
    console = Console()
    console.print(table)
    console.print("[green]passed[/]" if result.passed else "[red]failed[/]")
