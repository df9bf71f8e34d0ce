"""What real kernels achieve: attention and matrix-multiply FLOP/s read from a profile's published tables.

The tables (``kernels:`` in hardware/*.yaml) come from kernel papers and public benchmarks, never from
the end-to-end runs the step model is validated against. Interpolation is linear in log(length), flat
beyond the measured range. Dtypes other than the table's (bf16/fp16) scale by their peak ratio.
"""

from __future__ import annotations

import math

import numpy as np

from costmodel.core.errors import InputError
from costmodel.machines.profiles import AttentionCurve, HardwareProfile, Kernels

TABLE_DTYPE = "bf16"


def _kernels(profile: HardwareProfile) -> Kernels:
    if profile.kernels is None:
        raise InputError(
            "--hw",
            f"profile {profile.name!r} has no kernels: section (published kernel tables); "
            "give --efficiency instead",
        )
    return profile.kernels


def _dtype_scale(profile: HardwareProfile, dtype: str) -> float:
    peaks = profile.device.peak_flops
    if dtype not in peaks:
        raise InputError(
            "--dtype", f"profile {profile.name!r} has no {dtype} FLOP/s; it has: {', '.join(peaks)}"
        )
    return peaks[dtype] / peaks.get(TABLE_DTYPE, peaks[dtype])


def _interp(x: float, xs: list[int], ys: list[float]) -> float:
    return float(np.interp(math.log(max(x, 1.0)), np.log(xs), ys))


def _curve(kernels: Kernels, head_dim: int, causal: bool, backward: bool) -> AttentionCurve:
    """The curve of the same mask and pass with the nearest head dimension (ties: the larger)."""
    same = [c for c in kernels.attention if c.causal == causal and c.backward == backward]
    same = same or [c for c in kernels.attention if c.backward == backward] or list(kernels.attention)
    return min(same, key=lambda c: (abs(c.head_dim - head_dim), -c.head_dim))


def attention_rate(
    profile: HardwareProfile,
    dtype: str,
    q_tokens: int,
    k_tokens: int,
    head_dim: int,
    causal: bool,
    backward: bool,
) -> float:
    """Achieved FLOP/s of one attention call (FLOP counted over the visible pairs; backward: its 2.5x).

    The published benchmarks hold queries = keys = length with the GPU full (batch x length = 16k); a call
    of q queries against k keys is read at the geometric mean sqrt(q·k), which is the length for the
    square calls of a ring step and weights a long key loop (all-gather CP) by its own amortisation.
    A causal call whose keys lie wholly before its queries (a ring step past the diagonal) is full.
    """
    curve = _curve(_kernels(profile), head_dim, causal, backward)
    length = math.sqrt(max(q_tokens, 1) * max(k_tokens, 1))
    return _interp(length, curve.seq, curve.flops_per_s) * _dtype_scale(profile, dtype)


def gemm_rate(profile: HardwareProfile, dtype: str, m: int, n: int, k: int) -> float:
    """Achieved FLOP/s of an m x k by k x n matrix multiply, read at the edge of the square problem with
    as many multiply-adds, (m·n·k)^(1/3)."""
    table = _kernels(profile).gemm
    edge = (float(m) * n * k) ** (1.0 / 3.0)
    return _interp(edge, table.edge, table.flops_per_s) * _dtype_scale(profile, dtype)


def measured_attention(rows: list[dict], backend: str, source: str) -> list[AttentionCurve]:
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
                        )
                    )
    return curves
