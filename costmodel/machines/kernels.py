"""What real kernels achieve: attention and matrix-multiply FLOP/s read from a profile's published tables.

The tables (``kernels:`` in hardware/*.yaml) come from kernel papers and public benchmarks, never from
the end-to-end runs the step model is validated against. Interpolation is linear in log(length), flat
beyond the measured range. fp8 multiplies read the profile's fp8 table where it has one; any other dtype
than the tables' (bf16/fp16) scales by its peak ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.core.errors import InputError
from costmodel.core.scalars import interp
from costmodel.machines.profiles import TABLE_DTYPE, AttentionCurve, HardwareProfile, Kernels


def _kernels(profile: HardwareProfile) -> Kernels:
    if profile.kernels is None:
        raise InputError(
            "--hw",
            f"{profile.origin} has no kernels: section (published kernel tables); give --efficiency instead",
        )
    return profile.kernels


def _dtype_scale(profile: HardwareProfile, dtype: str) -> float:
    peaks = profile.device.peak_flops
    if dtype not in peaks:
        raise InputError("--dtype", f"{profile.origin} has no {dtype} FLOP/s; it has: {', '.join(peaks)}")
    return peaks[dtype] / peaks.get(TABLE_DTYPE, peaks[dtype])


def _interp(x: float, xs: list[int], ys: list[float]) -> float:
    # math.log where numpy's was: equal at the built-in tables' lengths (powers of two); elsewhere numpy's
    # SIMD log itself may differ from libm's in the last bit, CPU by CPU.
    return interp(math.log(max(x, 1.0)), [math.log(v) for v in xs], ys)


def attention_kernels(profile: HardwareProfile) -> list[str]:
    """The named attention kernels whose tables the profile holds (beside its default ones)."""
    if profile.kernels is None:
        return []
    return sorted({c.kernel for c in profile.kernels.attention if c.kernel is not None})


def check_kernel(name: str, profile: HardwareProfile, also: tuple[str, ...] = ()) -> None:
    """``name`` is ``flash`` (the profile's default tables), one of ``also``, or a kernel the profile holds
    tables for; else one line naming --attention-kernel and what the profile has."""
    named = attention_kernels(profile)
    if name not in ("flash", *also, *named):
        accepted = ", ".join(["flash", *also, *named])
        raise InputError("--attention-kernel", f"{name!r}: {profile.origin} has tables for {accepted}")


def _curve(
    kernels: Kernels, head_dim: int, causal: bool, backward: bool, kernel: str | None = None
) -> AttentionCurve:
    """The curve of the kernel, mask and pass with the nearest head dimension (ties: the larger)."""
    named = [c for c in kernels.attention if c.kernel == kernel] or list(kernels.attention)
    same = [c for c in named if c.causal == causal and c.backward == backward]
    same = same or [c for c in named if c.backward == backward] or named
    return min(same, key=lambda c: (abs(c.head_dim - head_dim), -c.head_dim))


def attention_rate(
    profile: HardwareProfile,
    dtype: str,
    q_tokens: int,
    k_tokens: int,
    head_dim: int,
    causal: bool,
    backward: bool,
    kernel: str | None = None,
) -> float:
    """Achieved FLOP/s of one attention call (FLOP counted over the visible pairs; backward: its 2.5x).

    The published benchmarks hold queries = keys = length with the GPU full (batch x length = 16k); a call
    of q queries against k keys is read at the geometric mean sqrt(q·k), which is the length for the
    square calls of a ring step and weights a long key loop (all-gather CP) by its own amortisation.
    A causal call whose keys lie wholly before its queries (a ring step past the diagonal) is full.
    """
    kernels = _kernels(profile)
    curve = _curve(kernels, head_dim, causal, backward, kernel)
    return (
        _interp(attention_length(q_tokens, k_tokens), curve.seq, curve.flops_per_s)
        * _dtype_scale(profile, dtype)
        * kernels.attention_scale
    )


def attention_length(q_tokens: int, k_tokens: int) -> float:
    """The length at which a call of q queries against k keys reads a curve: their geometric mean."""
    return math.sqrt(max(q_tokens, 1) * max(k_tokens, 1))


# Output tiles a tuned BLAS picks between for large bf16 multiplies on Ampere and Hopper (rows x columns of
# C one thread block computes) [CUTLASS]; the best of them for a shape sets how full its waves run.
GEMM_TILES = ((128, 256), (256, 128), (128, 128))
GEMM_SIZE_REFERENCE = 4096.0  # the edge at which a fitted size exponent leaves the rate unchanged
# No kernel runs shorter than one launched back to back from the host takes [CUDA-Graphs]: 3.8 us.
MIN_KERNEL_S = 3.8e-6


def tile_utilisation(m: int, n: int, sms: int, batch: int = 1) -> float:
    """Share of the device's tile slots a multiply's useful output fills with the best tile: its tiles run
    in waves of one per SM, and a partial tile or a partial last wave costs a whole one ("wave
    quantization" [CUTLASS])."""
    best = 0.0
    for rows, cols in GEMM_TILES:
        tiles = batch * math.ceil(m / rows) * math.ceil(n / cols)
        slots = math.ceil(tiles / sms) * sms * rows * cols
        best = max(best, batch * m * n / slots)
    return best


def _largest_tiles(m: int, n: int, batch: int) -> int:
    """Output tiles of the largest of GEMM_TILES a multiply's result cuts into."""
    rows, cols = max(GEMM_TILES, key=lambda tile: tile[0] * tile[1])
    return batch * math.ceil(m / rows) * math.ceil(n / cols)


def gemm_rate(
    profile: HardwareProfile,
    dtype: str,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    element_bytes: int = 2,
    clock: float = 1.0,
) -> float:
    """Achieved FLOP/s of ``batch`` m x k by k x n matrix multiplies: the faster of the two kinds of kernel
    a tuned BLAS picks between for the shape.

    A tiled kernel: the table holds square problems; a problem is read at the edge of the square with as
    many multiply-adds, (m·n·k)^(1/3), then scaled by how well its own output fills the SMs' waves against
    that square's, never above it (:func:`tile_utilisation`; a skinny TP shard of a few hundred columns
    loses here), held under what HBM can feed (its operands and result read and written once).

    A split-K kernel, which a BLAS picks for a problem whose output, cut into its largest tiles, does not
    fill one wave of the SMs (a decode's few rows, a small micro-batch's TP shard): it splits the reduction
    over the idle SMs, so the wave fill costs nothing, but its reads do not hide behind its math: its time is
    its bytes at the bandwidth memory-bound kernels reach (``device.hbm_sustained``) plus its FLOP at the
    table's rate for its volume. On Vidur's linear layers of 1-64 rows kept aside this takes the MAPE from
    28-34 % to 19-20 % on the H100 and from 30-32 % to 15-20 % on the A100 (docs/validation.md, "The kernel
    tables").

    Neither runs shorter than the shortest kernel (``MIN_KERNEL_S``). The H100 and A100 tables are fitted to
    linear layers at model shapes through this very reading (``cp-plan hw fit-kernels``). An fp8 multiply
    reads ``kernels.gemm_fp8`` where the profile has it: fp8 tensor cores reach a smaller share of their
    doubled peak than bf16 ones of theirs ([MAMF]: 71 % against 80 % on an H100 SXM). ``clock`` scales the
    table's compute rate, not what HBM feeds: a step's sustained clock (``kernels.sustained_clock``)."""
    kernels = _kernels(profile)
    if dtype == "fp8" and kernels.gemm_fp8 is not None:
        table, scale = kernels.gemm_fp8, 1.0
    else:
        table, scale = kernels.gemm, _dtype_scale(profile, dtype)
    shape = gemm_shape(profile, m, n, k, batch, element_bytes)
    return shape.rate(_interp(shape.edge, table.edge, table.flops_per_s) * scale * clock)


@dataclass(frozen=True)
class GemmShape:
    """How a multiply's shape reads the square table at its edge, whose rate is ``table``:
    rate = max(min(table x fill, cap), split-K) x factor (:func:`gemm_rate`)."""

    edge: float  # the square with as many multiply-adds, (m·n·k)^(1/3)
    fill: float  # its waves' fill against that square's, at most 1
    cap: float  # what HBM can feed and the shortest kernel allow, FLOP/s
    factor: float  # fitted factors on the kernel as run: gemm_scale x the size slope
    feed: float  # FLOP/s a split-K kernel's bytes allow at the sustained HBM rate; 0: no split-K kernel
    shortest: float  # FLOP/s at the shortest kernel's time

    def tiled(self, table: float) -> float:
        return min(table * self.fill, self.cap)

    def split_k(self, table: float) -> float:
        """A split-K kernel's rate: its reads, then its math at the table's rate, one after the other."""
        if not self.feed:
            return 0.0
        return min(1.0 / (1.0 / self.feed + 1.0 / table), self.shortest)

    def rate(self, table: float) -> float:
        return max(self.tiled(table), self.split_k(table)) * self.factor


def gemm_shape(
    profile: HardwareProfile, m: int, n: int, k: int, batch: int = 1, element_bytes: int = 2
) -> GemmShape:
    """The shape's terms of :func:`gemm_rate`, which a fit of the table divides out of a measured rate."""
    kernels = _kernels(profile)
    m, n, k = max(m, 1), max(n, 1), max(k, 1)
    edge = (float(m) * n * k) ** (1.0 / 3.0)
    fill = 1.0
    sms = profile.device.sm_count
    if sms:
        square = round(edge)
        # never above the square's own rate: the table is what the kernel reaches at that volume
        fill = min(1.0, tile_utilisation(m, n, sms, batch) / tile_utilisation(square, square, sms))
    shortest = 2.0 * batch * m * n * k / MIN_KERNEL_S
    cap, feed = shortest, 0.0
    bandwidth = profile.device.hbm_bandwidth
    if bandwidth:
        moved = element_bytes * (m * k + k * n + m * n)
        cap = min(cap, 2.0 * m * n * k * bandwidth / moved)
        # too few output tiles for one wave: a split-K kernel may split the reduction over the idle SMs
        if not sms or _largest_tiles(m, n, batch) < sms:
            feed = 2.0 * m * n * k * profile.device.streaming_bandwidth / moved
    # fitted factors on the kernel as run, memory-bound or not: its level, and its slope in problem size
    # below the reference edge (above it the table's own plateau holds: a fit never extrapolates a slope)
    slope = min(1.0, edge / GEMM_SIZE_REFERENCE) ** kernels.gemm_size_exponent
    return GemmShape(edge, fill, cap, kernels.gemm_scale * slope, feed, shortest)


def measured_attention(
    rows: list[dict], backend: str, source: str, kernel: str | None = None
) -> list[AttentionCurve]:
    """Attention curves from one backend's timings on the papers' grid (``benchmarks/gpu_kernels.py
    measure``): one curve per head dimension, mask and pass, to put in a profile's ``kernels:`` in place of
    the published ones."""
    curves = []
    timed = [r for r in rows if r["backend"] == backend and "error" not in r]
    for head_dim in sorted({r["head_dim"] for r in timed}):
        for causal in (False, True):
            points = sorted(
                (r["seq"], r) for r in timed if r["head_dim"] == head_dim and r["causal"] == causal
            )
            for backward, key in ((False, "fwd_tflops"), (True, "bwd_tflops")):
                if points:
                    curves.append(
                        AttentionCurve(
                            head_dim=head_dim,
                            causal=causal,
                            backward=backward,
                            seq=[seq for seq, _ in points],
                            flops_per_s=[r[key] * 1e12 for _, r in points],
                            source=source,
                            kernel=kernel,
                        )
                    )
    return curves
