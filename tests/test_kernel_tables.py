"""The built-in H200 tables and ring model held to what was measured on an H200 (benchmarks/results/
h200-linears-2026-12-04.json, `benchmarks/gpu_kernels.py measure --parts linears,casts,split`): a table or a
merge charge that drifts from the measurement fails here, with the figures docs/validation.md reports."""

from __future__ import annotations

import csv
import json
import statistics
import sys

import pytest

from costmodel.calibration.gpu import linear_errors
from costmodel.machines.profiles import load_profile
from tests.support import REPO

RESULTS = json.loads((REPO / "benchmarks" / "results" / "h200-linears-2026-12-04.json").read_text())


@pytest.mark.parametrize(
    ("dtype", "signed", "mape"),
    [("bf16", 0.021, 0.097), ("fp8", -0.005, 0.103)],  # as measured and reported; 296 shapes each
)
def test_the_h200_gemm_tables_read_the_measured_linears(dtype: str, signed: float, mape: float) -> None:
    errors = linear_errors(load_profile("h200-nvlink"), RESULTS["linears"], dtype)
    assert len(errors) == 296
    assert statistics.median(errors) == pytest.approx(signed, abs=0.002)
    assert statistics.mean(abs(e) for e in errors) == pytest.approx(mape, abs=0.002)
    # the claim docs/validation.md makes of it: unbiased within 5 %, MAPE under 12 %
    assert abs(statistics.median(errors)) < 0.05 and statistics.mean(abs(e) for e in errors) < 0.12


def test_the_ring_model_reads_the_measured_compute_within_six_points() -> None:
    """Zigzag and contiguous rings of 2, 4 and 8, forward and both passes: the model on the H200 profile,
    charging a fused merge, against the ring's compute measured on one H200 (efficiency over N single calls)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import ring_efficiency as bench
    finally:
        sys.path.pop(0)
    from costmodel.machines.binding import build_machine

    machine = build_machine(load_profile("h200-nvlink").at_boost())  # a one-GPU benchmark's clock
    shape = {**bench.SHAPE, "kv_heads": bench.SHAPE["heads"]}
    gaps = []
    for gpus in (2, 4, 8):
        for pass_ in ("fwd", "fwd+bwd"):
            for layout in ("contiguous", "zigzag"):
                measured = bench.measured_split(RESULTS["split"], layout, gpus, pass_)
                model = bench.efficiency(machine, "h200-nvlink", layout, pass_, 12.0, gpus, shape)
                gaps.append(model - measured)
    assert len(gaps) == 12
    assert max(abs(g) for g in gaps) == pytest.approx(0.054, abs=0.002)
    assert max(abs(g) for g in gaps) < 0.06


@pytest.mark.parametrize("hw", ["h200-nvlink", "h100-nvlink", "h100-ib"])
def test_the_sdpa_curves_are_the_h200_measurements(hw: str) -> None:
    """Every knot of the profiles' sdpa-flash and sdpa-cudnn curves is a measured SDPA rate: 512-16K on the
    FlashAttention grid (h200-2026-11-30.json), 32K-128K one sequence a call (h200-sdpa-long-2026-12-04.json),
    to the four digits the profile writes."""
    results = REPO / "benchmarks" / "results"
    rows = json.loads((results / "h200-2026-11-30.json").read_text())["sdpa"]
    rows += json.loads((results / "h200-sdpa-long-2026-12-04.json").read_text())["sdpa-long"]
    measured = {
        (f"sdpa-{r['backend']}", r["head_dim"], r["causal"], backward, r["seq"]): r[key] * 1e12
        for r in rows
        if "error" not in r
        for backward, key in ((False, "fwd_tflops"), (True, "bwd_tflops"))
    }
    curves = [c for c in load_profile(hw).kernels.attention if (c.kernel or "").startswith("sdpa-")]
    assert len(curves) == 16
    for curve in curves:
        assert curve.seq == [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
        for seq, rate in zip(curve.seq, curve.flops_per_s, strict=True):
            key = (curve.kernel, curve.head_dim, curve.causal, curve.backward, seq)
            assert rate == pytest.approx(measured[key], rel=5e-4)


KERNELS = REPO.parent / "shared" / "data" / "kernels"


@pytest.mark.parametrize("hw", ["h100-nvlink", "h100-ib"])
def test_the_h100_cudnn_causal_backward_is_derived_from_the_three_measured_curves(hw: str) -> None:
    """[FA3] has no causal backward panel: it is the non-causal backward times the forward's causal /
    non-causal ratio at each length, to the four digits the profile writes."""
    curves = {
        (c.head_dim, c.causal, c.backward): c
        for c in load_profile(hw).kernels.attention
        if c.kernel == "cudnn"
    }
    assert len(curves) == 8
    for head_dim in (64, 128):
        rates = {key[1:]: curve.flops_per_s for key, curve in curves.items() if key[0] == head_dim}
        for i, derived in enumerate(rates[True, True]):
            ratio = rates[True, False][i] / rates[False, False][i]
            assert derived == pytest.approx(rates[False, True][i] * ratio, rel=5e-4)


@pytest.mark.skipif(not KERNELS.is_dir(), reason="the public kernel tables are not on this machine")
@pytest.mark.parametrize("hw", ["h100-nvlink", "h100-ib"])
def test_the_h100_cudnn_curves_are_the_fa3_papers_cudnn_bars(hw: str) -> None:
    """Every measured knot of the H100 profiles' cudnn curves is a cuDNN bar of the FlashAttention-3 paper's
    bf16 figures (the public table, where it is on this machine)."""
    with (KERNELS / "fa3_paper_and_fa2_readme_h100_attention.csv").open(
        newline="", encoding="utf-8"
    ) as handle:
        bars = {
            (int(r["head_dim"]), r["causal"] == "True", r["pass"] == "bwd", int(r["seq"])): float(r["tflops"])
            * 1e12
            for r in csv.DictReader(handle)
            if r["kernel"] == "cuDNN" and r["dtype"] == "bf16/fp16"
        }
    measured = [
        c for c in load_profile(hw).kernels.attention if c.kernel == "cudnn" and not (c.causal and c.backward)
    ]
    assert len(measured) == 6
    for curve in measured:
        for seq, rate in zip(curve.seq, curve.flops_per_s, strict=True):
            assert rate == bars[curve.head_dim, curve.causal, curve.backward, seq]
