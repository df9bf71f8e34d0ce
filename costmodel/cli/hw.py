"""``cp-plan hw``: hardware profiles from measurements. ``from-nccl-tests`` fits the links to nccl-tests
outputs; ``fit-kernels`` fits the GEMM and attention curves to measured kernel tables (docs/hardware.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from costmodel.cli.audit import MAX_FILES
from costmodel.cli.options import console, house_table
from costmodel.cli.output import Format, emit, format_option
from costmodel.core.errors import InputError
from costmodel.core.fileio import atomic_write_text, check_profile_output
from costmodel.machines.profiles import load_profile, profile_yaml

NCCL_HOW = "whose links were measured with nccl-tests (`cp-plan hw from-nccl-tests`): bus bandwidths (busbw)"
KERNELS_HOW = "whose kernel curves were fitted to measured tables (`cp-plan hw fit-kernels`)"


def fit_kernels(
    base: Annotated[str, typer.Option("--base", help="Profile whose curves are refitted; the rest is kept.")],
    gemm: Annotated[
        Optional[str],
        typer.Option(
            "--gemm",
            help="CSV of measured multiplies: m, n, k[, batch, dtype], ms|us|tflops.",
            show_default=False,
        ),
    ] = None,
    attention: Annotated[
        Optional[str],
        typer.Option(
            "--attention",
            help="CSV of measured attention calls: head_dim, causal, pass, seq, batch, heads[, kernel, dtype], ms|us|tflops.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Optional[str], typer.Option("--out", help="Write the fitted profile here (YAML).", show_default=False)
    ] = None,
    format: format_option("table", "json", "yaml") = Format.table,
) -> None:
    """Fit a profile's GEMM table (by shape and dtype) and attention curves (by kernel, head size, mask, pass
    and length) to measured kernel tables, report the error on one row in five kept aside, before and after,
    and write the profile.

    Example: cp-plan hw fit-kernels --base h100-nvlink --gemm gemms.csv --attention attn.csv --out my.yaml
    """
    from costmodel.machines.kernel_fit import fit_kernels as fit

    if out is not None:
        check_profile_output(out, "--out")
    profile = load_profile(base, field="--base")
    fitted, report = fit(profile, gemm, attention, Path(out).stem if out else f"{profile.name}-kernels")
    if out is not None:
        atomic_write_text(out, profile_yaml(fitted, KERNELS_HOW), "--out")
    document = {"base": profile.name, **report, "written": out}
    emit(document, format, table=lambda: _kernels_table(document))


def _errors(s: dict[str, Any] | None) -> str:
    return "-" if s is None else f"{s['mape']:.1%} / {s['max_abs_error']:.0%} ({s['n']})"


def _kernels_table(document: dict[str, Any]) -> None:
    table = house_table(
        caption="error on one row in five kept aside (MAPE / worst, rows), the base profile's and the fit's; "
        "every knot in --format yaml and the written profile"
    )
    for column in ("curve", "rows", "knots", "max TFLOP/s", document["base"], "fitted"):
        table.add_column(column, justify="left" if column == "curve" else "right")
    rows = [
        (g["table"], g, f", {g['bound_rows']} bound" if g["bound_rows"] else "") for g in document["gemm"]
    ]
    for a in document["attention"]:
        c = a["curve"]
        mask, direction = "causal" if c["causal"] else "full", "bwd" if c["backward"] else "fwd"
        rows.append((f"{c['kernel'] or 'attention'} d{c['head_dim']} {mask} {direction}", a, ""))
    for name, fit, note in rows:
        knots = fit["knots"]
        table.add_row(
            name,
            f"{fit['rows']}{note}",
            f"{knots[0]}-{knots[-1]} ({len(knots)})",
            f"{max(fit['flops_per_s']) / 1e12:.0f}",
            _errors(fit["aside_base"]),
            _errors(fit["aside"]),
        )
    screen = console()
    screen.print(table)
    for what, why in document["skipped_rows"].items():
        screen.print(f"not used ({what}): {why}")
    if document["written"] is not None:
        screen.print(f"wrote {document['written']}: use it anywhere as --hw {document['written']}")


def from_nccl_tests(
    files: Annotated[
        list[str], typer.Argument(help="Outputs of nccl-tests' *_perf binaries.", show_default=False)
    ],
    base: Annotated[
        str, typer.Option("--base", help="Profile whose device and kernel tables are kept.")
    ] = "h100-nvlink",
    out: Annotated[
        Optional[str],
        typer.Option("--out", help="Write the measured profile here (YAML).", show_default=False),
    ] = None,
    format: format_option("table", "json", "yaml") = Format.table,
) -> None:
    """Fit α and bus bandwidth per collective and scope to nccl-tests outputs (all_reduce, all_gather,
    reduce_scatter, alltoall, sendrecv) and write a profile whose links are measured.

    Example: cp-plan hw from-nccl-tests all_gather.txt sendrecv.txt --base h100-nvlink --out my.yaml
    """
    from costmodel.audit.nccl import fit_all, measured_profile

    if len(files) > MAX_FILES:
        raise InputError("FILE", f"{len(files):,} tables; from-nccl-tests takes at most {MAX_FILES} a run")
    if out is not None:
        check_profile_output(out, "--out")
    profile = load_profile(base, field="--base")
    fits = fit_all(files, profile)
    measured = measured_profile(profile, fits, Path(out).stem if out else f"{profile.name}-measured")
    if out is not None:
        atomic_write_text(out, profile_yaml(measured, NCCL_HOW), "--out")
    emit({"fits": fits, "written": out}, format, table=lambda: _nccl_table(fits, out))


def _nccl_table(fits: list[dict[str, Any]], out: str | None) -> None:
    table = house_table(
        caption="t = α + size·factor / B over out-of-place times; B is nccl-tests' busbw",
    )
    for column in ("file", "collective", "scope", "ranks", "α µs", "B GB/s", "R²"):
        table.add_column(column, justify="left" if column in ("file", "collective", "scope") else "right")
    for f in fits:
        table.add_row(
            Path(f["file"]).name,
            f["collective"],
            f["scope"],
            str(f["ranks"]),
            f"{f['latency_s'] * 1e6:.1f}",
            f"{f['bus_bandwidth'] / 1e9:.1f}",
            f"{f['r2']:.4f}",
        )
    screen = console()
    screen.print(table)
    if out is not None:
        screen.print(f"wrote {out}: use it anywhere as --hw {out}")
