"""``cp-plan kernel ...``: commands of the torch reference kernel. torch is imported inside commands only,
so importing this module (as the main CLI does at start-up) stays cheap."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import typer
from pydantic import BaseModel, ConfigDict

from costmodel.cli.options import HELP_FLAGS, console, decimal, declared, searched, whole, working
from costmodel.cli.output import Format, emit, format_option
from costmodel.core.errors import InputError
from costmodel.core.fileio import atomic_write_text, check_profile_output
from costmodel.core.units import parse_tokens, seconds, si
from costmodel.kernel import TORCH_DTYPE
from costmodel.machines.profiles import load_profile, profile_yaml
from costmodel.plans.inputs import Count, Flag, Tokens, flag
from costmodel.plans.models import load_model
from costmodel.symbolic import numeric

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings=HELP_FLAGS,
)


@app.callback()
def kernel() -> None:
    """The torch reference kernel: exact ring and Ulysses attention over torch.distributed."""


def _parse_varlen(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise InputError(
            "--varlen", f"expected comma-separated document boundaries such as 0,100,256; got {text!r}"
        ) from None


MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week; beyond it the rendezvous timeout overflows
MAX_SEED = 2**63 - 1  # the non-negative range torch.manual_seed takes


def _seconds(value: float, flag: str) -> float:
    """A timeout: finite, positive, at most a week. Checked here, before any rank is spawned."""

    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise InputError(flag, f"must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] (got {value})")
    return value


def _tolerance(value: float | None, flag: str) -> float | None:

    if value is not None and not (math.isfinite(value) and value >= 0):
        raise InputError(flag, f"must be a finite number >= 0 (got {value})")
    return value


MAX_KERNEL_TOKENS = 2**24  # 16M: what one machine's ranks hold in memory
MAX_KERNEL_HEADS = 1024


class KernelShape(BaseModel):
    """The attention a kernel command runs on random inputs: its shape, mask, layout and element type.
    Each field declares its flag, default and range, as :mod:`costmodel.plans.inputs` does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: Tokens = flag(
        512,
        "Sequence length S (whole sequence, all ranks): 512, 4k, ... up to 16M.",
        tokens=True,
        ge=1,
        le=MAX_KERNEL_TOKENS,
    )
    heads: Count = flag(4, "Query heads h.", ge=1, le=MAX_KERNEL_HEADS)
    kv_heads: Optional[Count] = flag(  # noqa: UP045 - typer reads Optional
        None, "Key/value heads n_kv (GQA when < h); defaults to --heads.", ge=1, le=MAX_KERNEL_HEADS
    )
    head_dim: Count = flag(32, "Head dimension d.", ge=1, le=MAX_KERNEL_HEADS)
    batch: Count = flag(1, "Batch size b.", ge=1, le=MAX_KERNEL_HEADS)
    causal: Flag = flag(False, "Causal mask.")
    layout: Literal["contiguous", "striped", "zigzag"] = flag("contiguous", "Sequence layout.")
    varlen: Optional[str] = flag(  # noqa: UP045
        None,
        "Packed documents as boundaries (cu_seqlens), e.g. 0,100,317,512: documents never see each other.",
    )
    dtype: Literal["fp32", "bf16", "fp16"] = flag("fp32", "Input dtype.")


@app.command()
@declared(shape=KernelShape)
def selftest(
    shape: KernelShape,
    nproc: Annotated[
        int, whole("--nproc", low=1, high=1024, help="Local processes to spawn (ignored under torchrun).")
    ] = 2,
    variant: Annotated[
        Literal["ring", "ulysses", "pass-q", "decode", "all"],
        typer.Option(
            help="Which kernel (pass-q: the inference prefill passing queries; decode: the (O, LSE) merge "
            "over cache shards); 'all' skips Ulysses where [Ulysses §3] rules it out."
        ),
    ] = "all",
    seed: Annotated[int, whole("--seed", low=0, high=MAX_SEED, help="Random seed of the inputs.")] = 0,
    atol: Annotated[float | None, decimal("--atol", help="Override the dtype's absolute tolerance.")] = None,
    rtol: Annotated[float | None, decimal("--rtol", help="Override the dtype's relative tolerance.")] = None,
    device: Annotated[
        Literal["auto", "cpu", "cuda"],
        typer.Option(help="auto: one GPU per rank with NCCL when there are enough, else CPU with gloo."),
    ] = "auto",
    timeout: Annotated[
        float, decimal("--timeout", help="Seconds before every rank is killed (deadlock guard).")
    ] = 300.0,
    output_format: format_option("table", "json", short=False) = Format.table,
) -> None:
    """Run ring and Ulysses attention on random inputs against a float64 reference, forward and backward.

    Reports the largest absolute error over all ranks of out, lse, dq, dk and dv, and exits 1 when one
    exceeds atol + rtol·max|reference| (0 when all pass, 2 on bad input). Run it locally with --nproc N,
    or on a cluster under torchrun (one process per GPU, NCCL), the way nccl-tests checks an install:

        torchrun --nnodes 2 --nproc-per-node 8 ... -m costmodel.kernel selftest --seq 4096 --causal
    """
    from costmodel.kernel.launch import LaunchError
    from costmodel.kernel.selftest import VARIANTS, SelftestConfig, run_selftest

    timeout = _seconds(timeout, "--timeout")
    atol, rtol = _tolerance(atol, "--atol"), _tolerance(rtol, "--rtol")
    require_torch("cp-plan kernel")
    config = SelftestConfig(
        **shape.model_dump(exclude={"kv_heads", "varlen", "dtype"}),
        kv_heads=shape.heads if shape.kv_heads is None else shape.kv_heads,
        varlen=_parse_varlen(shape.varlen),
        dtype=TORCH_DTYPE[shape.dtype],
        variants=VARIANTS if variant == "all" else (variant,),
        seed=seed,
        atol=atol,
        rtol=rtol,
        device=device,
    )
    _check_device(device, nproc, "--device")

    try:
        with working(f"selftest of {len(config.variants)} variants on {nproc} ranks"):
            result = run_selftest(config, nproc, timeout_s=timeout)
    except LaunchError as exc:
        typer.echo(f"cp-plan: error: {exc}", err=True)
        raise typer.Exit(1) from None
    if _is_rank_zero():
        emit(_finite(result.to_json()), output_format, table=lambda: _print_table(result))
    raise typer.Exit(0 if result.passed else 1)


def _finite(data: Any) -> Any:
    """``data`` with a NaN or infinite error (a kernel gone wrong) as null, so that the JSON stays JSON."""
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(value) for value in data]
    return None if isinstance(data, float) and not math.isfinite(data) else data


def _is_rank_zero() -> bool:
    from costmodel.kernel.launch import launcher

    env = launcher()
    return env is None or env.rank == 0


def _print_table(result) -> None:  # a SelftestResult, imported lazily
    from rich.table import Table
    from rich.text import Text

    config = result.config
    atol, rtol = config.tolerance()
    shape = (
        f"S={config.seq} b={config.batch} h={config.heads} n_kv={config.kv_heads} d={config.head_dim} "
        f"{config.dtype} {config.layout}{' causal' if config.causal else ''}"
        f"{f' varlen={list(config.varlen)}' if config.varlen else ''}"
    )
    table = Table(
        title=f"kernel selftest: N={result.world_size} ({result.backend}, {result.device}), {shape}",
        caption=f"tolerance = {atol:g} + {rtol:g}·max|reference|",
    )
    for column in ("variant", "output", "max abs error", "tolerance", "result"):
        table.add_column(column, justify="right" if column in ("max abs error", "tolerance") else "left")
    for name, variant in result.variants.items():
        if variant.skipped is not None:
            table.add_row(name, "-", "-", "-", Text.assemble(("skipped", "yellow"), f": {variant.skipped}"))
            continue
        for output, error in variant.errors.items():
            ok = error <= variant.tolerances[output]
            table.add_row(
                name,
                output,
                f"{error:.3e}",
                f"{variant.tolerances[output]:.3e}",
                Text("pass", style="green") if ok else Text("FAIL", style="red"),
            )
    screen = console()
    screen.print(table)
    screen.print(Text("passed", style="green") if result.passed else Text("failed", style="red"))


def _dtype_shape(
    model: str | None, heads: int | None, kv_heads: int | None, head_dim: int | None, batch: int, dtype: str
) -> dict:
    """The attention shape to calibrate: flags over a model preset over 8 heads of 64 (quick on a CPU)."""

    preset = load_model(model) if model else None
    heads = heads or (preset.heads if preset else 8)
    kv_heads = kv_heads or (preset.kv_heads if preset else heads)
    if kv_heads > heads or heads % kv_heads:
        raise InputError("--kv-heads", f"{kv_heads} must divide --heads {heads}")
    return {
        "dtype": dtype,
        "batch": batch,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim or (preset.head_dim if preset else 64),
    }


SIZE_BOUNDS = {"--tokens": (3, 65_536), "--message-bytes": (6, 1 << 30)}  # (fewest sizes, largest size)
MAX_SIZES = 32  # sizes a list may name: each is timed for seconds on every rank


def _sizes(text: str | None, field: str) -> tuple[int, ...] | None:
    """Distinct, increasing, positive sizes, enough for the fit and each within its bound; checked here,
    before any rank starts."""
    if text is None:
        return None

    fewest, largest = SIZE_BOUNDS[field]
    sizes = [parse_tokens(part.strip(), field) for part in text.split(",") if part.strip()]
    if len(sizes) > MAX_SIZES:
        raise InputError(field, f"{len(sizes)} sizes; at most {MAX_SIZES}")
    for size in sizes:
        if not 1 <= size <= largest:
            raise InputError(field, f"{size} is out of range; each size is from 1 to {largest:,}")
    if len(set(sizes)) != len(sizes):
        twice = next(size for size in sizes if sizes.count(size) > 1)
        raise InputError(field, f"{twice} is given twice; name each size once")
    if len(sizes) < fewest:
        raise InputError(field, f"give at least {fewest} sizes for the fit, each once (got {len(sizes)})")
    return tuple(sorted(sizes))


def _check_device(asked: str, nproc: int, flag: str) -> None:
    """A GPU run (``--device cuda``, ``--backend nccl``) where torch sees fewer GPUs than ranks fails now,
    not after the ranks time out. Under torchrun each rank has its own GPU: not checked."""
    import torch

    from costmodel.kernel.launch import under_torchrun

    if asked in ("cuda", "nccl") and not under_torchrun():
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < nproc:
            raise InputError(
                flag, f"{asked} needs one GPU per rank: --nproc {nproc}, but torch sees {found} GPU(s)"
            )


def require_torch(flag: str = "cp-plan") -> None:
    """One line naming ``flag`` where torch, the optional kernel extra, is not installed."""
    try:
        import torch  # noqa: F401 - only to fail early and clearly without the optional extra
    except ImportError:
        raise InputError(
            flag,
            "needs torch, the kernel's optional dependency: install the build for your machine (pip install "
            "torch; CPU only: pip install torch --index-url https://download.pytorch.org/whl/cpu)",
        ) from None


BACKENDS = {"auto": "auto", "gloo": "cpu", "nccl": "cuda"}


def _default_dtype(backend: str) -> str:
    """bf16 where the ranks get GPUs. On CPUs fp32: on ours (an AMD EPYC without AMX) a bf16 matmul ran at
    0.7 GFLOP/s against fp32's 72, and bf16 attention backward 6x slower than fp32."""
    import torch

    gpu = backend == "nccl" or (backend == "auto" and torch.cuda.is_available())
    return "bf16" if gpu else "fp32"


Backend = Literal["auto", "gloo", "nccl"]
DtypeName = Literal["bf16", "fp16", "fp32"]


def calibrate(
    out: Annotated[str, typer.Option("--out", "-o", help="The measured profile to write (YAML).")],
    nproc: Annotated[
        int,
        whole("--nproc", low=1, high=1024, help="Local ranks measuring at once (ignored under torchrun)."),
    ] = 2,
    backend: Annotated[Backend, typer.Option(help="gloo (CPU), nccl (one GPU per rank), or auto.")] = "auto",
    dtype: Annotated[
        DtypeName | None, typer.Option(help="Element type of Q, K, V [default: bf16 on GPUs, fp32 on CPUs].")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Take heads, kv-heads, head-dim from a preset.")
    ] = None,
    heads: searched(KernelShape, "heads", "8 or the model's") = None,
    kv_heads: searched(KernelShape, "kv_heads", "the model's with --model") = None,
    head_dim: searched(KernelShape, "head_dim", "64 or the model's") = None,
    batch: searched(KernelShape, "batch", "1") = None,
    name: Annotated[str | None, typer.Option(help="Profile name [default: the file's stem].")] = None,
    tokens: Annotated[str | None, typer.Option(help="Block sizes to time, e.g. 128,256,...,4096.")] = None,
    message_bytes: Annotated[
        str | None, typer.Option(help="Message sizes (bytes, k = 1,024), >= 6 values.")
    ] = None,
    repeats: Annotated[
        int,
        whole(
            "--repeats", low=3, high=1000, help="Timed repeats per figure (its lower quartile and spread)."
        ),
    ] = 7,
    timeout: Annotated[
        float, decimal("--timeout", help="Seconds before every rank is killed, naming the slow one.")
    ] = 300.0,
) -> None:
    """Measure this machine's attention FLOP/s per block size, and its links' latency and bandwidth.

    Writes a measured hardware profile that --hw accepts everywhere. The write is atomic: a crash,
    Ctrl-C, or a rank that dies or hangs leaves no file and no processes behind. Under torchrun the
    same command spans nodes and measures intra- and inter-node links separately.

    Example: cp-plan calibrate --nproc 2 --out me.yaml
    """

    from costmodel.calibration.fit import build_profile

    timeout = _seconds(timeout, "--timeout")
    if name is not None and not name.strip():  # now, not in the profile written after minutes of measuring
        raise InputError("--name", "an empty name; give one, or leave --name out for the file's stem")
    require_torch()
    from costmodel.kernel.calibrate import CalibrationConfig, measure
    from costmodel.kernel.launch import LaunchError, launch, under_torchrun

    shape = _dtype_shape(model, heads, kv_heads, head_dim, batch or 1, dtype or _default_dtype(backend))
    from costmodel.plans.timing import BACKWARD_FLOP

    pair_flops = float(numeric.pair_flops(b=shape["batch"], h=shape["heads"], d=shape["head_dim"]))
    config = CalibrationConfig(
        **shape,
        repeats=repeats,
        pair_flops=pair_flops,
        backward_flop_factor=BACKWARD_FLOP,
        **{
            k: v
            for k, v in (
                ("tokens", _sizes(tokens, "--tokens")),
                ("message_bytes", _sizes(message_bytes, "--message-bytes")),
            )
            if v
        },
    )
    if len(config.message_bytes) < 6:
        raise InputError(
            "--message-bytes",
            f"give at least 6 sizes for the alpha-beta fit (got {len(config.message_bytes)})",
        )
    if not under_torchrun() and nproc < 2:
        raise InputError("--nproc", f"a link needs at least 2 ranks (got {nproc})")
    _check_device(backend, nproc, "--backend")
    target = Path(out)
    check_profile_output(target, "--out")  # now, not after minutes of measuring
    load_before, busy_before = _load(), _busy_share()  # before our ranks start: what else runs here
    try:
        results = launch(measure, nproc, args=(config,), timeout_s=timeout, device=BACKENDS[backend])
    except LaunchError as exc:
        typer.echo(f"cp-plan: error: calibration failed, no profile written: {exc}", err=True)
        raise typer.Exit(1) from None
    raw = results.get(0)
    if raw is None:  # a torchrun rank other than 0: rank 0 writes the profile
        return

    raw["meta"] |= {
        "load_before": load_before,
        "busy_before": busy_before,
        "load_after": _load(),
        "cpus": os.cpu_count(),
    }
    try:
        profile = build_profile(raw, name or target.stem, shape)
    except (ValueError, ArithmeticError) as exc:  # keep minutes of measurement for a later look
        kept = target.with_suffix(".raw.json")
        atomic_write_text(kept, json.dumps(raw, default=float), "--out")
        typer.echo(
            f"cp-plan: error: fitting failed, no profile written ({exc}); raw measurements: {kept}", err=True
        )
        raise typer.Exit(1) from None
    atomic_write_text(
        target, profile_yaml(profile, f"written by `cp-plan calibrate` on {profile.source.date}"), "--out"
    )
    _print_calibration(profile, target)
    if profile.calibration.quality is not None and not profile.calibration.quality.trusted:
        raise typer.Exit(1)  # written and flagged, but a script must not take it as a good calibration


def _load() -> float | None:
    """The 1-minute load average, where the system has one."""

    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _busy_share(seconds: float = 1.0) -> float | None:
    """Share of all CPUs' time that other processes used over the next ``seconds`` (from /proc/stat;
    None elsewhere). Unlike the load average it does not remember a job that just ended."""

    def ticks() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as handle:
                fields = [int(v) for v in handle.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    first = ticks()
    time.sleep(seconds)
    second = ticks()
    if first is None or second is None or second[0] == first[0]:
        return None
    return 1.0 - (second[1] - first[1]) / (second[0] - first[0])


def _print_calibration(profile, target) -> None:  # noqa: ANN001 - a HardwareProfile
    from rich.text import Text

    cal = profile.calibration
    out = console(stderr=True)
    out.print(f"wrote {target} ({profile.source.nproc} ranks, {profile.source.backend}, {cal.dtype})")
    busiest = max(c.concurrency for c in cal.compute)
    full = next(c for c in cal.compute if c.concurrency == busiest and not c.causal)
    rates = ", ".join(f"{p.tokens}: {si(p.flops_per_s, 'FLOP/s', 3)}" for p in full.forward)
    out.print(f"  attention forward, {busiest} ranks busy: {rates}")
    for scope, fit in cal.p2p.items():
        a2a = cal.alltoall[scope]
        out.print(
            f"  {scope} point-to-point: alpha {seconds(fit.latency_s)}, {si(fit.bandwidth, 'B/s', 3)} "
            f"(R² {fit.r2:.3f}); all-to-all: alpha {seconds(a2a.latency_s)}, {si(a2a.bandwidth, 'B/s', 3)} "
            f"(R² {a2a.r2:.3f})"
            + (
                f", past {si(a2a.knee_bytes, 'B', 3)} +1 s per {si(a2a.bandwidth_beyond_knee, 'B', 3)}"
                if a2a.knee_bytes
                else ""
            )
        )
    out.print("  fitted quantities ± half the interquartile range over resampled repeats:")
    for key, fit in cal.fits.items():
        value = (
            seconds(fit.value)
            if fit.unit == "s"
            else si(fit.value, fit.unit, 3)
            if fit.unit != "1"
            else f"{fit.value:.2f}"
        )
        out.print(
            f"    {key:<40} {value:>12} ± {fit.relative:.0%}" if fit.value else f"    {key:<40} {value:>12}"
        )
    quality = cal.quality
    if quality is not None and not quality.trusted:
        out.print(
            Text.assemble(
                (f"warning: {target} is too noisy to trust", "red"), " (written, and marked so in the file):"
            )
        )
        for reason in quality.reasons:
            out.print(f"  - {reason}")
        out.print("  calibrate again on a quiet machine, or with more --repeats.")
    elif quality is not None:
        out.print(f"  fits steady: link R² ≥ {quality.r2_min}, spreads ≤ {quality.spread_max:.0%}")


def validate(
    hw: Annotated[str, typer.Option("--hw", help="A measured profile (from cp-plan calibrate).")],
    nproc: Annotated[
        int, whole("--nproc", low=1, high=1024, help="Local ranks, N (ignored under torchrun).")
    ] = 2,
    backend: Annotated[Backend, typer.Option(help="gloo (CPU), nccl (one GPU per rank), or auto.")] = "auto",
    max_median_error: Annotated[
        float, decimal("--max-median-error", help="Exit 1 when the median |error| exceeds this.")
    ] = 0.10,
    repeats: Annotated[
        int, whole("--repeats", low=3, high=1000, help="Timed repeats per configuration.")
    ] = 9,
    timeout: Annotated[float, decimal("--timeout", help="Seconds before every rank is killed.")] = 600.0,
    output_format: format_option("table", "json", short=False) = Format.table,
) -> None:
    """Run the kernel over a grid of configurations and compare each time with the model's prediction.

    The grid spans shards on both sides of the profile's critical length L*, causal and not, every
    layout, Ulysses, forward and forward+backward. Also reports how the datasheet-style model (one
    peak FLOP/s, no latency, balanced causal halves) fares on the same runs, and, apart from the
    verdict, inference runs (pass-KV and pass-Q prefill after a cached prefix, decode) against the
    predictions of cp-plan infer.

    Example: cp-plan validate --hw me.yaml --nproc 2
    """
    from costmodel.calibration.compare import compare, critical_tokens
    from costmodel.cli.render import render_validation

    timeout = _seconds(timeout, "--timeout")
    _tolerance(max_median_error, "--max-median-error")
    profile = load_profile(hw)
    if profile.calibration is None:
        raise InputError(
            "--hw", f"{hw}: validate needs a measured profile (write one with cp-plan calibrate)"
        )
    require_torch()
    from costmodel.kernel.launch import LaunchError, launch, launcher
    from costmodel.kernel.validate import grid, inference_grid, measure_cases

    env = launcher()
    world = env.world_size if env is not None else nproc
    if world < 2:
        raise InputError("--nproc", f"a ring needs at least 2 ranks (got {world})")
    cal = profile.calibration
    shape = {
        "dtype": cal.dtype,
        "batch": cal.batch,
        "heads": cal.heads,
        "kv_heads": cal.kv_heads,
        "head_dim": cal.head_dim,
    }
    _check_device(backend, nproc, "--backend")
    l_star = critical_tokens(profile, world)
    cases, served = grid(l_star, fitted_tokens=cal.layer_tokens), inference_grid(l_star)

    try:  # one launch, so the training layers and the inference runs are timed in the same rounds
        with working(f"validate: timing {len(cases) + len(served)} cases on {world} ranks"):
            results = launch(
                measure_cases,
                nproc,
                args=(cases + served, shape, repeats, 1, cal.quantile, cal.sentinel and cal.sentinel.tokens),
                timeout_s=timeout,
                device=BACKENDS[backend],
            )
    except LaunchError as exc:
        typer.echo(f"cp-plan: error: validation failed: {exc}", err=True)
        raise typer.Exit(1) from None
    result = results.get(0)
    if result is None:
        return
    measured, trained = result["cases"], len(cases)
    report = compare(
        profile,
        world,
        cases,
        measured[:trained],
        max_median_error,
        list(zip(served, measured[trained:])),
        sentinel=result["sentinel"],
    )
    emit(_finite(report), output_format, table=lambda: render_validation(report, console()))
    raise typer.Exit(0 if report["passed"] else 1)
