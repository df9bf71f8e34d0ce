"""One GPU's measured attention kernels beside the model: the varlen branch's tile count and call rate.

``benchmarks/gpu_kernels.py measure`` times torch's attention kernels on a CUDA machine: SDPA on the
FlashAttention papers' grid, and one packed or windowed window through FlexAttention (whose 128 x 128 block
mask skips tiles with no visible pair) and through torch's varlen FlashAttention kernel. Here that
file meets the model: the profile's attention curves are replaced by the measured SDPA ones (the same
kernel family as the varlen kernel), and every masked window is predicted by the product's own timing
path, one rank, forward (:func:`costmodel.plans.timing.predict`): its executed tiles from the mask
simulator, each call at the rate of its length (documents: ``packed_call_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.machines.binding import build_machine
from costmodel.machines.kernels import gemm_rate, measured_attention
from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict
from costmodel.schedule.masks import MaskRule
from costmodel.schedule.packed import simulate_masked

TILE = 128  # FlexAttention's BLOCK_SIZE in the measurement


def measured_profile(profile: HardwareProfile, data: dict, backend: str | None = None) -> HardwareProfile:
    """``profile`` with its attention curves replaced by ``backend``'s measured ones (default: flash, the
    varlen kernel's family, where it was timed; else the first backend timed)."""
    timed = [r["backend"] for r in data["sdpa"] if "error" not in r]
    backend = backend or ("flash" if "flash" in timed else timed[0])
    if profile.kernels is None:
        raise ValueError(f"profile {profile.name!r} has no kernels: section to replace")
    source = f"{data['device']}, torch {data['torch']} SDPA {backend}, measured (benchmarks/gpu_kernels.py)"
    curves = measured_attention(data["sdpa"], backend, source)
    kernels = profile.kernels.model_copy(update={"attention": curves})
    return profile.model_copy(update={"kernels": kernels, "name": f"{profile.name}+{backend}"})


def mask_inputs(row: dict) -> PlanInputs:
    """The plan of one measured window: one rank, causal, its documents (a list) or its sliding window."""
    seq, bounds = row["seq"], row["cu_seqlens"]
    lengths = np.diff(bounds)
    packed = len(lengths) > 1 or bounds[-1] < seq
    return PlanInputs(
        seq=seq,
        n=1,
        batch=1,
        heads=row["heads"],
        kv_heads=row["heads"],
        head_dim=row["head_dim"],
        dtype="bf16",
        causal=True,
        block=TILE,
        docs=",".join(str(int(x)) for x in lengths) if packed else None,
        window=row["window"],
    )


@dataclass(frozen=True)
class MaskCheck:
    name: str
    tiles_measured: int  # FlexAttention's block mask: partial + full blocks
    tiles_simulated: int  # the mask simulator at the same tile
    predicted_ms: float  # the product's forward compute on the measured curves
    varlen_ms: float | None  # torch's varlen FlashAttention kernel
    flex_ms: float

    @property
    def varlen_error(self) -> float | None:
        return self.predicted_ms / self.varlen_ms - 1 if self.varlen_ms else None

    @property
    def flex_error(self) -> float:
        return self.predicted_ms / self.flex_ms - 1


def check_masks(profile: HardwareProfile, data: dict, backend: str | None = None) -> list[MaskCheck]:
    """Every measured window: block counts against the simulator, times against the prediction."""
    machine = build_machine(
        measured_profile(profile.at_boost(), data, backend), "bf16"
    )  # a benchmark's clock
    out = []
    for row in data["masks"]:
        inputs = mask_inputs(row)
        bounds = tuple(row["cu_seqlens"])
        rule = MaskRule(True, bounds if inputs.docs else None, window=row["window"])
        simulated = simulate_masked("contiguous", row["seq"], 1, TILE, rule).rank_step_pairs.sum() / TILE**2
        out.append(
            MaskCheck(
                name=row["name"],
                tiles_measured=row["partial_blocks"] + row["full_blocks"],
                tiles_simulated=round(float(simulated)),
                predicted_ms=predict(inputs, machine).forward_compute_s * 1e3,
                varlen_ms=row.get("varlen_fwd_ms"),
                flex_ms=row["flex_fwd_ms"],
            )
        )
    return out


def linear_errors(profile: HardwareProfile, rows: list[dict], dtype: str) -> list[float]:
    """predicted / measured - 1 of each linear layer ``benchmarks/gpu_kernels.py measure --parts linears``
    timed at a model shape in ``dtype`` (bf16 or fp8), read on ``profile``'s tables (the squares, the tables'
    own axis, left out)."""
    errors = []
    for row in rows:
        if row["what"] == "square" or f"{dtype}_ms" not in row:
            continue
        m, n, k = row["m"], row["n"], row["k"]
        measured = 2.0 * m * n * k / (row[f"{dtype}_ms"] * 1e-3)
        predicted = gemm_rate(profile, dtype, m, n, k, element_bytes=1 if dtype == "fp8" else 2)
        errors.append(predicted / measured - 1.0)
    return errors
