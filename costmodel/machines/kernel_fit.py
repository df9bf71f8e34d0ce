"""A profile's kernel curves fitted to measured tables: GEMM rates by shape and dtype, attention rates by kernel,
head dimension, mask, pass and length (``cp-plan hw fit-kernels``, docs/hardware.md).

A curve is fitted as the model reads it, so that the model reads the measurements back: the GEMM table is
read at the edge of the square with as many multiply-adds and scaled by the shape's wave fill
(:func:`~costmodel.machines.kernels.gemm_shape`), an attention curve at the geometric mean of the query and
key lengths. Both interpolate linearly in log(size) between knots, so a measured rate is a known linear
combination of the two knots around it and the knots' values solve a least-squares problem in relative
error. Rows the table cannot explain are left out and counted: a multiply the HBM or the shortest kernel
bounds, an FP8 attention kernel (a profile's attention curves are bf16/fp16). One row in five, in file
order, is kept aside: the curve fitted to the other four predicts it, which is the error reported; the
written curve is then fitted to every row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from costmodel.core.errors import InputError, describe_validation
from costmodel.core.tables import errors_summary, read_csv
from costmodel.core.units import parse_integer, parse_number
from costmodel.machines.kernels import (
    GemmShape,
    _interp,
    attention_length,
    attention_rate,
    gemm_rate,
    gemm_shape,
)
from costmodel.machines.profiles import AttentionCurve, GemmCurve, HardwareProfile

MAX_ROWS = 100_000  # Vidur's A100 linear-layer table, the largest public one, holds 36,516
ASIDE = 5  # every fifth row is predicted by the fit of the others
MIN_SUPPORT = (
    1.0  # a knot needs one row's worth of weight around it: less cannot set it apart from its neighbours
)
MAX_ROUNDS = 8  # refits of the GEMM table as the rows it reads at a bound drop out (two or three suffice)
BOUND = 0.5  # a multiply measured above half its HBM or launch bound is held by it (GEMV-like kernels reach
# 60-90 % of HBM), so it says nothing of the table
GEMM_DTYPES = {"bf16": 2, "fp16": 2, "fp8": 1}  # input dtypes and their bytes


@dataclass(frozen=True)
class GemmRow:
    line: int
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    flops_per_s: float


@dataclass(frozen=True)
class AttentionRow:
    line: int
    kernel: str | None
    dtype: str
    head_dim: int
    causal: bool
    backward: bool
    q_tokens: int
    k_tokens: int
    flops_per_s: float

    @property
    def curve(self) -> tuple[str | None, int, bool, bool]:
        return self.kernel, self.head_dim, self.causal, self.backward


def _number(cells: dict[str, str], column: str, where: str, field: str, integer: bool = False) -> float:
    """A cell read as a flag is (:func:`parse_number`, :func:`parse_integer`: no ``1_024``, ``nan``),
    positive and finite."""
    text = cells.get(column, "").strip()
    kind = "a whole number" if integer else "a number"
    try:
        value = parse_number(text, column)
    except InputError:
        raise InputError(field, f"{where}: {column} must be {kind}, got {text[:20]!r}") from None
    if value <= 0 or value > 1e18:
        raise InputError(field, f"{where}: {column} must be positive and finite, got {text[:20]!r}")
    if integer:
        try:
            return parse_integer(text, column)
        except InputError:
            raise InputError(field, f"{where}: {column} must be {kind}, got {text[:20]!r}") from None
    return value


def _rate(cells: dict[str, str], flop: float, where: str, field: str) -> float:
    """FLOP/s from the row's time (``ms`` or ``us``) or its stated ``tflops`` (cp-plan's FLOP count)."""
    given = [c for c in ("ms", "us", "tflops") if cells.get(c, "").strip()]
    if len(given) != 1:
        raise InputError(
            field, f"{where}: give exactly one of ms, us, tflops (got {', '.join(given) or 'none'})"
        )
    value = _number(cells, given[0], where, field)
    return {"ms": flop / (value * 1e-3), "us": flop / (value * 1e-6), "tflops": value * 1e12}[given[0]]


def _table(path: str, field: str, kind: str, required: set[str], allowed: set[str]) -> list[tuple[str, dict]]:

    def known(header: list[str]) -> None:
        columns = [name.strip().lower() for name in header]
        if len(set(columns)) != len(columns):
            raise InputError(field, f"{path}: a column is named twice in the header")
        unknown = sorted(set(columns) - allowed)
        if unknown:
            shown = ", ".join(name[:40] for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise InputError(
                field, f"{path}: unknown column(s) {shown}; accepted: {', '.join(sorted(allowed))}"
            )
        missing = sorted(required - set(columns))
        if missing:
            raise InputError(field, f"{path}: missing column(s) {', '.join(missing)}")

    header, rows = read_csv(path, field, kind, MAX_ROWS, check_header=known)
    columns = [name.strip().lower() for name in header]
    return [(f"{path} line {number}", dict(zip(columns, cells, strict=True))) for number, cells in rows]


GEMM_COLUMNS = {"m", "n", "k", "batch", "dtype", "ms", "us", "tflops", "source"}


def read_gemm_table(path: str, field: str = "--gemm") -> list[GemmRow]:
    """Measured multiplies: m, n, k, optional batch (1) and dtype (bf16), and ms, us or tflops (2·b·m·n·k)."""

    def read(where: str, cells: dict) -> GemmRow:
        m, n, k = (int(_number(cells, c, where, field, integer=True)) for c in "mnk")
        batch = (
            int(_number(cells, "batch", where, field, integer=True)) if cells.get("batch", "").strip() else 1
        )
        dtype = cells.get("dtype", "").strip().lower() or "bf16"
        if dtype not in GEMM_DTYPES:
            raise InputError(field, f"{where}: dtype must be one of {', '.join(GEMM_DTYPES)}, got {dtype!r}")
        line = int(where.rsplit(" ", 1)[1])
        return GemmRow(line, m, n, k, batch, dtype, _rate(cells, 2.0 * batch * m * n * k, where, field))

    return [read(w, c) for w, c in _table(path, field, "timings", {"m", "n", "k"}, GEMM_COLUMNS)]


ATTENTION_COLUMNS = {
    *("kernel", "dtype", "head_dim", "causal", "pass", "seq", "seq_q", "seq_kv", "batch", "heads"),
    *("ms", "us", "tflops", "source"),
}
TRUE, FALSE = {"true", "1", "yes"}, {"false", "0", "no"}
KERNEL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # as a profile names its attention kernels


def read_attention_table(path: str, field: str = "--attention") -> list[AttentionRow]:
    """Measured attention calls: head_dim, causal, pass (fwd or bwd), seq (or seq_q and seq_kv), batch, heads,
    optional kernel and dtype (bf16), and ms, us or tflops. FLOP are cp-plan's count: 4·batch·heads·seq_q·
    seq_kv·head_dim forward, half of it causal, 2.5x that backward (the FlashAttention papers' count)."""

    def read(where: str, cells: dict) -> AttentionRow:
        head_dim = int(_number(cells, "head_dim", where, field, integer=True))
        causal = cells["causal"].strip().lower()
        if causal not in TRUE | FALSE:
            raise InputError(field, f"{where}: causal must be true or false, got {cells['causal']!r}")
        direction = cells["pass"].strip().lower()
        if direction not in ("fwd", "bwd"):
            raise InputError(field, f"{where}: pass must be fwd or bwd, got {cells['pass']!r}")
        if cells.get("seq", "").strip():
            both = [c for c in ("seq_q", "seq_kv") if cells.get(c, "").strip()]
            if both:  # one of the two would be read and the other dropped
                raise InputError(
                    field, f"{where}: give seq, or seq_q and seq_kv, not seq and {' and '.join(both)}"
                )
            q = kv = int(_number(cells, "seq", where, field, integer=True))
        else:
            q, kv = (int(_number(cells, c, where, field, integer=True)) for c in ("seq_q", "seq_kv"))
        if causal in TRUE and q != kv:
            raise InputError(
                field, f"{where}: a causal row needs seq_q = seq_kv (a square mask), got {q} and {kv}"
            )
        batch, heads = (int(_number(cells, c, where, field, integer=True)) for c in ("batch", "heads"))
        flop = 4.0 * batch * heads * q * kv * head_dim * (0.5 if causal in TRUE else 1.0)
        flop *= 2.5 if direction == "bwd" else 1.0
        kernel = cells.get("kernel", "").strip().lower() or None
        if kernel is not None and not KERNEL_NAME.fullmatch(kernel):
            raise InputError(
                field, f"{where}: kernel must be lower-case letters, digits and '-', got {kernel!r}"
            )
        dtype = cells.get("dtype", "").strip().lower() or "bf16"
        line = int(where.rsplit(" ", 1)[1])
        rate = _rate(cells, flop, where, field)
        return AttentionRow(line, kernel, dtype, head_dim, causal in TRUE, direction == "bwd", q, kv, rate)

    required = {"head_dim", "causal", "pass", "batch", "heads"}
    return [read(w, c) for w, c in _table(path, field, "timings", required, ATTENTION_COLUMNS)]


def knots_for(sizes: np.ndarray) -> np.ndarray:
    """Knots of a curve over measured sizes: the sizes themselves when they are few (a benchmark's grid),
    else the powers of two that span them."""
    distinct = np.unique(np.round(sizes).astype(int))
    if len(distinct) <= 16:
        return distinct.astype(float)
    low, high = math.floor(math.log2(sizes.min())), math.ceil(math.log2(sizes.max()))
    return 2.0 ** np.arange(low, high + 1)


def fit_curve(sizes: np.ndarray, targets: np.ndarray) -> tuple[list[int], list[float]]:
    """Knot values of a curve read linearly in log(size), least squares in relative error over the rows.

    A knot with less than MIN_SUPPORT rows' weight around it cannot be told apart from its neighbours and is dropped,
    as is one whose value comes out non-positive (two rows far apart pulling on it); the rest are refitted."""
    knots = knots_for(sizes)
    x = np.log(sizes)
    while True:
        logs = np.log(knots)
        design = np.column_stack([np.interp(x, logs, np.eye(len(knots))[j]) for j in range(len(knots))])
        keep = design.sum(axis=0) >= MIN_SUPPORT
        if not keep.all() and keep.any():
            knots = knots[keep]
            continue
        values, *_ = np.linalg.lstsq(design / targets[:, None], np.ones(len(targets)), rcond=None)
        if (values > 0).all() or len(knots) == 1:
            break
        knots = knots[values > 0] if (values > 0).any() else knots[:1]
    return [int(round(k)) for k in knots], [float(v) for v in values]


LEAST_SHARE = 1e-5  # of the peak: a GEMV on an H100 reaches ~1e-3 of it; a rate far below is a unit slip


def _under_peak(profile: HardwareProfile, rows: list, field: str, label: str) -> None:
    """A measured rate above the device's peak in its dtype, or below a hundred-thousandth of it, is a timing
    or a FLOP count gone wrong."""
    peaks = profile.device.peak_flops
    for row in rows:
        dtype = row.dtype if row.dtype in peaks else "bf16"
        peak = peaks.get(dtype, profile.device.table_peak)
        where = f"{label} line {row.line}: {row.flops_per_s / 1e12:,.3g} TFLOP/s is"
        if row.flops_per_s > peak:
            raise InputError(
                field,
                f"{where} above the device's {dtype} peak of {peak / 1e12:,.0f} ({profile.name}): a wrong time, "
                "or another FLOP count than cp-plan's",
            )
        if row.flops_per_s < LEAST_SHARE * peak:
            raise InputError(
                field,
                f"{where} below {LEAST_SHARE:g} of the device's {dtype} peak ({profile.name}): check the unit "
                "(TFLOP/s, seconds)",
            )


def _split(rows: list) -> tuple[list, list]:
    """Every fifth row aside, the rest to fit; with fewer than ten rows, nothing aside (fitted in sample)."""
    if len(rows) < 2 * ASIDE:
        return rows, []
    return [r for i, r in enumerate(rows) if i % ASIDE != ASIDE - 1], rows[ASIDE - 1 :: ASIDE]


def _errors(predicted: list[float], measured: list[float]) -> dict[str, Any] | None:
    if not measured:
        return None
    return errors_summary([p / m - 1 for p, m in zip(predicted, measured, strict=True)])


# ----------------------------------------------------------------------------------------------------- GEMM


STREAMING_INTENSITY = 0.1  # FLOP per byte, as a share of the device's ridge (peak / datasheet bandwidth)
STREAMING_MIN_S = 20e-6  # a multiply this short is its launch, not its reads


def sustained_bandwidth(profile: HardwareProfile, rows: list[GemmRow]) -> dict[str, float] | None:
    """What memory-bound kernels reach on the device, from timed multiplies: the median bytes a second of the
    multiplies far below the ridge (FLOP per byte under a tenth of peak / datasheet bandwidth: a decode's
    weight reads, GEMV-like) that run long enough for their reads to dominate their launch. Bytes: the two
    inputs read and the output written once. None when the table holds no such multiply."""
    peak, datasheet = profile.device.table_peak, profile.device.hbm_bandwidth
    if datasheet is None:
        return None
    rates = []
    for r in rows:
        moved = GEMM_DTYPES[r.dtype] * r.batch * (r.m * r.k + r.k * r.n + r.m * r.n)
        flop = 2.0 * r.batch * r.m * r.n * r.k
        seconds = flop / r.flops_per_s
        if flop / moved < STREAMING_INTENSITY * peak / datasheet and seconds >= STREAMING_MIN_S:
            rates.append(moved / seconds)
    if not rates:
        return None
    low, median, high = np.percentile(rates, [25, 50, 75])
    return {"rows": len(rates), "bytes_per_s": float(median), "p25": float(low), "p75": float(high)}


def _table_target(shape: GemmShape, measured: float, table: float | None) -> float | None:
    """The table's rate at the shape's edge that reads ``measured`` back, as the kernel the model reads the
    shape as with the table at ``table`` (None: the first round, the tiled kernel). None where the row says
    nothing of the table: the model reads it at the HBM or launch bound, or it is a split-K kernel whose
    reads take over half its time (its math, what the table sets, is then a small difference of two)."""
    rate = measured / shape.factor
    if table is None or shape.tiled(table) >= shape.split_k(table):
        return rate / shape.fill if table is None or table * shape.fill < shape.cap else None
    math_share = 1.0 - rate / shape.feed  # of a split-K kernel's time: 1/rate = 1/feed + 1/table
    return rate / math_share if math_share >= 0.5 and rate < shape.shortest else None


def _gemm_fit(base: HardwareProfile, rows: list[GemmRow], fp8: bool) -> GemmCurve | None:
    """The table that reads ``rows`` back, from the rows the table sets: not those measured near their HBM or
    launch bound, nor those the fitted table itself reads at that bound or as split-K kernels timed mostly by
    their reads; each row as the kernel the model reads it as (:func:`_table_target`). Which kernel that is
    depends on the fit, so the fit is repeated until the rows it reads each way stop changing."""
    shapes = [gemm_shape(base, r.m, r.n, r.k, r.batch, GEMM_DTYPES[r.dtype]) for r in rows]
    usable = [(s, r) for s, r in zip(shapes, rows, strict=True) if r.flops_per_s < BOUND * s.cap]
    curve: tuple[list[int], list[float]] | None = None
    used: list[tuple[float, float]] | None = None
    for _ in range(MAX_ROUNDS):
        # the table read at each shape's edge as the model reads it
        targets = [
            (s.edge, _table_target(s, r.flops_per_s, _interp(s.edge, *curve) if curve else None))
            for s, r in usable
        ]
        now = [(edge, t) for edge, t in targets if t is not None]
        if not now:
            return None
        if now == used:
            break
        used = now
        curve = fit_curve(np.array([e for e, _ in now]), np.array([t for _, t in now]))
    assert curve is not None and used is not None
    table = "fp8 (e4m3)" if fp8 else "bf16/fp16"
    return GemmCurve(
        edge=curve[0], flops_per_s=curve[1], source=f"fitted to {len(used)} measured {table} multiplies"
    )


def _with_gemm(base: HardwareProfile, bf16: GemmCurve | None, fp8: GemmCurve | None) -> HardwareProfile:
    kernels = base.kernels.model_dump() if base.kernels else None
    assert kernels is not None
    if bf16 is not None:
        kernels["gemm"] = bf16.model_dump()
    if fp8 is not None:
        kernels["gemm_fp8"] = fp8.model_dump()
    return _validated(base, kernels)


def gemm_errors(profile: HardwareProfile, rows: list[GemmRow]) -> dict[str, Any] | None:
    predicted = [gemm_rate(profile, r.dtype, r.m, r.n, r.k, r.batch, GEMM_DTYPES[r.dtype]) for r in rows]
    return _errors(predicted, [r.flops_per_s for r in rows])


def fit_gemm(base: HardwareProfile, rows: list[GemmRow], label: str) -> tuple[HardwareProfile, list[dict]]:
    """``base`` with its GEMM tables fitted to ``rows`` (bf16/fp16 into ``gemm``, fp8 into ``gemm_fp8``), and
    a report per table: rows used and bound, the knots, the error on the rows kept aside, before and after."""
    _under_peak(base, rows, "--gemm", label)
    reports, fitted = [], {}
    for fp8 in (False, True):
        mine = [r for r in rows if (r.dtype == "fp8") == fp8]
        if not mine:
            continue
        fit_on, aside = _split(mine)
        trial = _gemm_fit(base, fit_on, fp8)
        final = _gemm_fit(base, mine, fp8)
        if final is None:
            raise InputError(
                "--gemm", f"{label}: every multiply is bound by HBM or its launch; none sets the table"
            )
        fitted[fp8] = final.model_copy(update={"source": f"{final.source} ({label})"})
        held = _with_gemm(base, trial if not fp8 else None, trial if fp8 else None) if trial else base
        bound = sum(
            r.flops_per_s >= BOUND * gemm_shape(base, r.m, r.n, r.k, r.batch, GEMM_DTYPES[r.dtype]).cap
            for r in mine
        )
        reports.append(
            {
                "table": "gemm_fp8" if fp8 else "gemm",
                "rows": len(mine),
                "bound_rows": bound,
                "knots": final.edge,
                "flops_per_s": final.flops_per_s,
                "aside": gemm_errors(held, aside),
                "aside_base": gemm_errors(base, aside) if base.kernels else None,
            }
        )
    return _with_gemm(base, fitted.get(False), fitted.get(True)), reports


# ------------------------------------------------------------------------------------------------ attention


def _attention_curve(rows: list[AttentionRow], label: str) -> AttentionCurve:
    kernel, head_dim, causal, backward = rows[0].curve
    seq, rates = fit_curve(
        np.array([attention_length(r.q_tokens, r.k_tokens) for r in rows]),
        np.array([r.flops_per_s for r in rows]),
    )
    return AttentionCurve(
        head_dim=head_dim,
        causal=causal,
        backward=backward,
        kernel=kernel,
        seq=seq,
        flops_per_s=rates,
        source=f"fitted to {len(rows)} measured calls ({label})",
    )


def _with_attention(base: HardwareProfile, curves: list[AttentionCurve]) -> HardwareProfile:
    kernels = base.kernels.model_dump() if base.kernels else None
    assert kernels is not None
    replaced = {(c.kernel, c.head_dim, c.causal, c.backward) for c in curves}
    kept = [
        c
        for c in kernels["attention"]
        if (c.get("kernel"), c["head_dim"], c["causal"], c["backward"]) not in replaced
    ]
    kernels["attention"] = kept + [c.model_dump() for c in curves]
    return _validated(base, kernels)


def attention_errors(profile: HardwareProfile, rows: list[AttentionRow]) -> dict[str, Any] | None:
    predicted = [
        attention_rate(profile, "bf16", r.q_tokens, r.k_tokens, r.head_dim, r.causal, r.backward, r.kernel)
        for r in rows
    ]
    return _errors(predicted, [r.flops_per_s for r in rows])


def fit_attention(
    base: HardwareProfile, rows: list[AttentionRow], label: str
) -> tuple[HardwareProfile, list[dict]]:
    """``base`` with one attention curve per kernel, head dimension, mask and pass of ``rows`` (replacing the
    profile's curve of the same four, keeping the others), and a report per curve as :func:`fit_gemm`'s."""
    if base.kernels is None:
        raise InputError("--base", f"{base.origin} has no kernels: section to fit attention curves into")
    usable = [r for r in rows if r.dtype in ("bf16", "fp16")]
    if not usable:
        raise InputError(
            "--attention", f"{label}: no bf16 or fp16 row; a profile's attention curves are bf16/fp16"
        )
    _under_peak(base, usable, "--attention", label)
    groups: dict[tuple, list[AttentionRow]] = {}
    for row in usable:
        groups.setdefault(row.curve, []).append(row)
    # the attention scale divides out, as the GEMM's factors do: the fitted curve times it reads the rows back
    scale = base.kernels.attention_scale
    curves, reports = [], []
    for key, measured in sorted(groups.items(), key=lambda item: (item[0][0] or "", *item[0][1:])):
        fit_on, aside = _split(measured)
        final = _attention_curve([_scaled(r, 1 / scale) for r in measured], label)
        curves.append(final)
        held = _with_attention(base, [_attention_curve([_scaled(r, 1 / scale) for r in fit_on], label)])
        reports.append(
            {
                "curve": {"kernel": key[0], "head_dim": key[1], "causal": key[2], "backward": key[3]},
                "rows": len(measured),
                "knots": final.seq,
                "flops_per_s": final.flops_per_s,
                "aside": attention_errors(held, aside),
                "aside_base": attention_errors(base, aside),
            }
        )
    return _with_attention(base, curves), reports


def _scaled(row: AttentionRow, factor: float) -> AttentionRow:
    return AttentionRow(**{**row.__dict__, "flops_per_s": row.flops_per_s * factor})


# ------------------------------------------------------------------------------------------------- together


def _validated(base: HardwareProfile, kernels: dict) -> HardwareProfile:
    """The profile with ``kernels``, checked as any profile: a fitted rate above the device's peak (a table
    timed wrong, or under another FLOP count) is one line naming the table."""
    data = base.model_dump(mode="python", exclude_none=True)
    data["kernels"] = kernels
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise InputError(
            "--gemm/--attention", f"the fitted curves do not fit {base.name!r}: {describe_validation(exc)}"
        ) from None


def fit_kernels(
    base: HardwareProfile, gemm: str | None, attention: str | None, name: str
) -> tuple[HardwareProfile, dict[str, Any]]:
    """``base`` with the curves that ``gemm`` and ``attention`` (measured tables) fit, renamed ``name``, and
    the fit's report: per table its rows, knots and error on the rows kept aside, before and after."""
    if gemm is None and attention is None:
        raise InputError("--gemm", "give a table to fit: --gemm FILE, --attention FILE or both")
    if base.kernels is None:
        raise InputError("--base", f"{base.origin} has no kernels: section to fit into")
    profile, report = base, {"gemm": [], "attention": [], "skipped_rows": {}}
    if gemm is not None:
        profile, report["gemm"] = fit_gemm(profile, read_gemm_table(gemm), Path(gemm).name)
    if attention is not None:
        rows = read_attention_table(attention)
        skipped = [r for r in rows if r.dtype not in ("bf16", "fp16")]
        if skipped:
            report["skipped_rows"]["attention"] = (
                f"{len(skipped)} rows of dtype {', '.join(sorted({r.dtype for r in skipped}))}: a profile's attention curves are bf16/fp16"
            )
        profile, report["attention"] = fit_attention(profile, rows, Path(attention).name)
    data = profile.model_dump(mode="python", exclude_none=True) | {"name": name}
    return HardwareProfile.model_validate(data), report
