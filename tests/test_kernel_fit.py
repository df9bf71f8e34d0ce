"""Kernel curves fitted to measured tables (costmodel/machines/kernel_fit.py, ``cp-plan hw fit-kernels``): tables
made here from known curves must be read back, and the built-in curves derived from public tables must be
what the fit of those tables gives."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from costmodel.machines.kernel_fit import (
    GemmRow,
    fit_curve,
    fit_kernels,
    read_gemm_table,
    sustained_bandwidth,
)
from costmodel.machines.kernels import attention_rate, gemm_rate, gemm_shape
from costmodel.machines.profiles import load_profile

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "kernels"


def _write(path: Path, header: list[str], rows: list[list]) -> str:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(1.0, 1000.0), min_size=2, max_size=6),
    st.lists(st.floats(0.0, 1.0), min_size=40, max_size=80),
)
def test_a_curve_read_linearly_in_log_size_is_recovered_at_its_knots(
    values: list[float], spots: list[float]
) -> None:
    """Rows on a known curve (knots at powers of two, read as the model reads them) give its knots back."""
    knots = 2.0 ** np.arange(8, 8 + len(values))
    # rows spread over the whole span, both ends included, so every knot is pinned
    sizes = np.exp(np.log(knots[0]) + np.array([0.0, 1.0, *spots]) * (np.log(knots[-1]) - np.log(knots[0])))
    targets = np.interp(np.log(sizes), np.log(knots), values)
    if len(np.unique(np.round(sizes))) <= 16:
        return  # a benchmark's grid: its sizes are the knots (the next test)
    weights = [
        np.interp(np.log(sizes), np.log(knots), np.eye(len(knots))[j]).sum() for j in range(len(knots))
    ]
    assume(
        min(weights) >= 1.0
    )  # a knot with under one row's weight is dropped (MIN_SUPPORT): not recoverable
    got_knots, got = fit_curve(sizes, targets)
    assert got_knots == [int(k) for k in knots]
    assert got == pytest.approx(values, rel=1e-6)


def test_a_benchmark_grid_is_fitted_at_its_own_lengths() -> None:
    sizes = np.array([512, 1024, 2048, 4096] * 3, dtype=float)
    targets = np.array([100.0, 200.0, 300.0, 400.0] * 3) * np.repeat([0.9, 1.0, 1.1], 4)
    knots, values = fit_curve(sizes, targets)
    assert knots == [512, 1024, 2048, 4096]
    # least squares in relative error over r = 0.9, 1.0, 1.1 x the value: y = sum(1/r) / sum(1/r^2)
    factors = np.array([0.9, 1.0, 1.1])
    shrink = (1 / factors).sum() / (1 / factors**2).sum()  # 0.98667: relative error weighs the slow rows more
    assert values == pytest.approx([100.0 * shrink, 200.0 * shrink, 300.0 * shrink, 400.0 * shrink], rel=1e-9)


def _shapes() -> list[tuple[int, int, int]]:
    rng = np.random.default_rng(7)
    return [
        tuple(int(v) for v in rng.choice([1024, 1536, 2048, 3072, 4096, 6144, 8192], 3)) for _ in range(120)
    ]


def test_gemm_rows_timed_on_a_known_table_give_it_back(tmp_path: Path) -> None:
    """Multiplies timed by the model on a known table (knots 1024-8192) are fitted back to it, and the rows
    kept aside are read within 0.1 %."""
    base = load_profile("h100-nvlink")
    truth_table = {"edge": [1024, 2048, 4096, 8192], "flops_per_s": [150e12, 450e12, 520e12, 560e12]}
    data = base.model_dump(mode="python", exclude_none=True)
    data["kernels"]["gemm"] = truth_table | {"source": "test"}
    truth = type(base).model_validate(data)
    rows = [
        [m, n, k, "bf16", 2.0 * m * n * k / gemm_rate(truth, "bf16", m, n, k) * 1e3] for m, n, k in _shapes()
    ]
    table = _write(tmp_path / "gemm.csv", ["m", "n", "k", "dtype", "ms"], rows)
    fitted, report = fit_kernels(base, table, None, "fitted")
    (gemm,) = report["gemm"]
    assert gemm["table"] == "gemm" and gemm["rows"] == 120 and gemm["bound_rows"] == 0
    assert gemm["knots"] == truth_table["edge"]
    assert gemm["flops_per_s"] == pytest.approx(truth_table["flops_per_s"], rel=1e-6)
    assert gemm["aside"]["n"] == 24 and gemm["aside"]["max_abs_error"] < 1e-3
    assert (
        gemm["aside_base"]["signed_median"] > 0.1
    )  # the base table (670-696 TFLOP/s) is faster than the truth
    assert fitted.name == "fitted" and fitted.kernels.gemm_fp8 == base.kernels.gemm_fp8


def test_rows_read_as_split_k_kernels_fit_back_as_they_are_read(tmp_path: Path) -> None:
    """The 120 multiplies and 15 decode-sized ones (8-64 rows) timed by the model on a known table, which
    reads 15 of them as split-K kernels: 13 of the decode-sized ones and two of the 120, whose few tiles a
    split reduction runs faster. Each enters the fit at the table rate its math implies, or not at all where
    its reads take over half its time; the table comes back, and every row is read back within 0.1 %."""
    base = load_profile("h100-nvlink")
    truth_table = {"edge": [1024, 2048, 4096, 8192], "flops_per_s": [150e12, 450e12, 520e12, 560e12]}
    data = base.model_dump(mode="python", exclude_none=True)
    data["kernels"]["gemm"] = truth_table | {"source": "test"}
    truth = type(base).model_validate(data)
    skinny = [(m, n, k) for m in (8, 16, 32, 48, 64) for n, k in ((4096, 4096), (6144, 4096), (4096, 14336))]
    shapes = _shapes() + skinny

    def read_as_split_k(m: int, n: int, k: int) -> bool:
        shape = gemm_shape(truth, m, n, k)
        table = float(np.interp(np.log(shape.edge), np.log(truth_table["edge"]), truth_table["flops_per_s"]))
        return shape.split_k(table) > shape.tiled(table)

    assert sum(read_as_split_k(*s) for s in shapes) == 15
    rows = [
        [m, n, k, "bf16", 2.0 * m * n * k / gemm_rate(truth, "bf16", m, n, k) * 1e3] for m, n, k in shapes
    ]
    table = _write(tmp_path / "gemm.csv", ["m", "n", "k", "dtype", "ms"], rows)
    fitted, report = fit_kernels(base, table, None, "fitted")
    (gemm,) = report["gemm"]
    assert gemm["knots"] == truth_table["edge"]
    assert gemm["flops_per_s"] == pytest.approx(truth_table["flops_per_s"], rel=1e-6)
    read = [gemm_rate(fitted, "bf16", m, n, k) / gemm_rate(truth, "bf16", m, n, k) for m, n, k in shapes]
    assert max(abs(r - 1) for r in read) < 1e-3


def test_fp8_rows_fit_the_fp8_table_and_leave_the_bf16_one(tmp_path: Path) -> None:
    base = load_profile("h100-nvlink")
    rows = [[m, n, k, "fp8", 2.0 * m * n * k / 900e12 * 1e3] for m, n, k in _shapes()]
    fitted, report = fit_kernels(
        base, _write(tmp_path / "f8.csv", ["m", "n", "k", "dtype", "ms"], rows), None, "x"
    )
    assert [g["table"] for g in report["gemm"]] == ["gemm_fp8"]
    assert fitted.kernels.gemm == base.kernels.gemm
    # the rate is 900 TFLOP/s over shapes that fill the waves: read back within the tile fill's loss
    assert gemm_rate(fitted, "fp8", 8192, 8192, 8192, element_bytes=1) == pytest.approx(900e12, rel=0.05)


def test_attention_rows_fit_a_named_kernel_beside_the_profiles_curves(tmp_path: Path) -> None:
    base = load_profile("h100-nvlink")
    rows = []
    for causal in ("true", "false"):
        for direction in ("fwd", "bwd"):
            for seq in (1024, 2048, 4096, 8192, 16384):
                rate = 300e12 + 20e12 * math.log2(seq / 1024) - (50e12 if causal == "true" else 0)
                flop = (
                    4
                    * 2
                    * 16
                    * seq
                    * seq
                    * 128
                    * (0.5 if causal == "true" else 1)
                    * (2.5 if direction == "bwd" else 1)
                )
                rows.append(["mine", 128, causal, direction, seq, 2, 16, flop / rate * 1e3])
    header = ["kernel", "head_dim", "causal", "pass", "seq", "batch", "heads", "ms"]
    fitted, report = fit_kernels(base, None, _write(tmp_path / "a.csv", header, rows), "x")
    assert len(report["attention"]) == 4 and all(a["curve"]["kernel"] == "mine" for a in report["attention"])
    assert len(fitted.kernels.attention) == len(base.kernels.attention) + 4  # the profile's own are kept
    got = attention_rate(fitted, "bf16", 4096, 4096, 128, causal=True, backward=True, kernel="mine")
    assert got == pytest.approx(300e12 + 40e12 - 50e12, rel=1e-6)
    # a length between two measured ones reads the interpolation the model uses
    got = attention_rate(fitted, "bf16", 3000, 3000, 128, causal=False, backward=False, kernel="mine")
    assert got == pytest.approx(300e12 + 20e12 * math.log2(3000 / 1024), rel=1e-6)


def test_the_cli_writes_a_profile_that_plans_with_the_fitted_table(cli, tmp_path: Path) -> None:  # noqa: ANN001
    rows = [[m, n, k, "bf16", 2.0 * m * n * k / 400e12 * 1e3] for m, n, k in _shapes()]
    table = _write(tmp_path / "g.csv", ["m", "n", "k", "dtype", "ms"], rows)
    out = tmp_path / "mine.yaml"
    result = cli(
        "hw", "fit-kernels", "--base", "h100-nvlink", "--gemm", table, "--out", str(out), "--format", "json"
    )
    assert result.code == 0, result.err
    document = result.json()
    assert document["written"] == str(out) and document["gemm"][0]["rows"] == 120
    profile = yaml.safe_load(out.read_text())
    assert profile["name"] == "mine" and "fit-kernels" in out.read_text().splitlines()[0]
    job = ("--model", "llama3-8b", "--seq", "32768", "--n", "8", "--global-batch", "8", "--format", "json")
    step, fast = cli("step", "--hw", str(out), *job), cli("step", "--hw", "h100-nvlink", *job)
    assert step.code == 0, step.err
    assert step.json()["step"]["time_s"] > fast.json()["step"]["time_s"]  # 400 TFLOP/s against ~690


BAD = [
    ("m,n,k\n1,2,3\n", "--gemm", "exactly one of ms, us, tflops"),
    ("m,n,k,ms,tflops\n1,2,3,1,1\n", "--gemm", "exactly one of ms, us, tflops (got ms, tflops)"),
    ("m,n,k,ms\n-1,2,3,1\n", "--gemm", "m must be positive"),
    ("m,n,k,ms\n1.5,2,3,1\n", "--gemm", "m must be a whole number"),
    ("m,n,k,ms,dtype\n1,2,3,1,int8\n", "--gemm", "dtype must be one of bf16, fp16, fp8"),
    ("m,n,kk,ms\n1,2,3,1\n", "--gemm", "unknown column(s) kk"),
    ("m,n,k,ms,m\n1,2,3,1,1\n", "--gemm", "named twice"),
    ("m,n,k,ms\n", "--gemm", "has a header but no timings"),
    ("m,n,k,tflops\n4096,4096,4096,5000\n", "--gemm", "above the device's bf16 peak"),
    ("m,n,k,tflops\n4096,4096,4096,1e-30\n", "--gemm", "below 1e-05 of the device's bf16 peak"),
    ("head_dim,causal,pass,seq_q,seq_kv,batch,heads,ms\n128,true,fwd,1024,2048,1,1,1\n", "--attention", "seq_q = seq_kv"),
    ("head_dim,causal,pass,seq,batch,heads,ms\n128,maybe,fwd,1024,1,1,1\n", "--attention", "causal must be true or false"),
    ("head_dim,causal,pass,seq,batch,heads,ms\n128,true,both,1024,1,1,1\n", "--attention", "pass must be fwd or bwd"),
    ("kernel,head_dim,causal,pass,seq,batch,heads,ms\nMy Kernel,128,true,fwd,1024,1,1,1\n", "--attention", "kernel must be"),
    ("head_dim,causal,pass,seq,batch,heads,ms,dtype\n128,true,fwd,1024,1,1,1,fp8\n", "--attention", "no bf16 or fp16 row"),
    ("head_dim,causal,pass,seq,batch,heads,tflops\n128,true,fwd,1024,1,1,2000\n", "--attention", "above the device's bf16 peak"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "flag", "said"), BAD)
def test_a_bad_table_is_one_line_naming_its_flag(
    cli, tmp_path: Path, text: str, flag: str, said: str
) -> None:  # noqa: ANN001
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    option = "--gemm" if text.startswith("m,") else "--attention"
    out = tmp_path / "never.yaml"
    result = cli("hw", "fit-kernels", "--base", "h100-nvlink", option, str(path), "--out", str(out))
    assert result.code == 2 and result.out == "" and not out.exists()
    assert result.err.count("\n") == 1 and flag in result.err and said in result.err, result.err


def test_no_table_and_a_profile_without_kernels_are_refused(cli, tmp_path: Path) -> None:  # noqa: ANN001
    result = cli("hw", "fit-kernels", "--base", "h100-nvlink")
    assert result.code == 2 and "--gemm" in result.err and "give a table" in result.err
    table = _write(tmp_path / "g.csv", ["m", "n", "k", "ms"], [[4096, 4096, 4096, 0.3]])
    result = cli("hw", "fit-kernels", "--base", "mi300x-xgmi", "--gemm", table)
    assert result.code == 2 and "--base" in result.err and "no kernels" in result.err


# The built-in GEMM tables of these profiles are the fit of Vidur's linear layers on the GPU they were measured
# on (benchmarks/kernel_curves.py); profiles of the same compute die carry it. Refitting the public table must
# give what each holds, within the rounding of the YAML (0.1 TFLOP/s).
DERIVED = [
    ("vidur_h100_fp16_linear_ops.csv", "h100-nvlink", ("h100-nvlink", "h100-ib", "h200-nvlink", "h800-nvlink", "h800-ib")),
    ("vidur_a100_fp16_linear_ops.csv", "a100-nvlink", ("a100-nvlink", "a100-ib", "a800-nvlink")),
]  # fmt: skip


@pytest.mark.skipif(not SHARED.is_dir(), reason="the public kernel tables are not on this machine")
@pytest.mark.parametrize(("source", "measured_on", "profiles"), DERIVED, ids=[p[0] for p in DERIVED])
def test_built_in_gemm_tables_are_the_fit_of_their_public_table(
    tmp_path: Path, source: str, measured_on: str, profiles: tuple
) -> None:
    with (SHARED / source).open(newline="", encoding="utf-8") as handle:
        rows = [[r["m"], r["n"], r["k"], "fp16", r["median_ms"]] for r in csv.DictReader(handle)]
    table = _write(tmp_path / "t.csv", ["m", "n", "k", "dtype", "ms"], rows)
    assert len(read_gemm_table(table)) == len(rows)
    fitted, _ = fit_kernels(load_profile(measured_on), table, None, measured_on)
    for name in profiles:
        held = load_profile(name).kernels.gemm
        assert held.edge == fitted.kernels.gemm.edge, name
        assert held.flops_per_s == pytest.approx(fitted.kernels.gemm.flops_per_s, abs=0.06e12), name


SUSTAINED = [
    ("vidur_h100_fp16_linear_ops.csv", "h100-nvlink", ("h100-nvlink", "h100-ib", "h800-nvlink", "h800-ib")),
    ("vidur_a100_fp16_linear_ops.csv", "a100-nvlink", ("a100-nvlink", "a100-ib", "a800-nvlink")),
]


@pytest.mark.skipif(not SHARED.is_dir(), reason="the public kernel tables are not on this machine")
@pytest.mark.parametrize(("source", "measured_on", "profiles"), SUSTAINED, ids=[p[0] for p in SUSTAINED])
def test_built_in_sustained_bandwidth_is_the_median_of_the_memory_bound_multiplies(
    tmp_path: Path, source: str, measured_on: str, profiles: tuple
) -> None:
    """hbm_sustained: the median rate of the public table's multiplies far below the ridge, to the three
    figures the YAML keeps; below the datasheet (H100 0.80x, A100 0.73x)."""
    with (SHARED / source).open(newline="", encoding="utf-8") as handle:
        rows = [[r["m"], r["n"], r["k"], "fp16", r["median_ms"]] for r in csv.DictReader(handle)]
    table = read_gemm_table(_write(tmp_path / "t.csv", ["m", "n", "k", "dtype", "ms"], rows))
    derived = sustained_bandwidth(load_profile(measured_on), table)
    assert derived is not None and derived["rows"] > 300
    for name in profiles:
        device = load_profile(name).device
        assert device.hbm_sustained == pytest.approx(derived["bytes_per_s"], rel=0.005), name
        assert device.streaming_bandwidth == device.hbm_sustained < device.hbm_bandwidth


@pytest.mark.skipif(not SHARED.is_dir(), reason="the public kernel tables are not on this machine")
@pytest.mark.parametrize(
    ("gpu", "profile", "share"), [("H200", "h200-nvlink", 0.78), ("GB200", "gb200-nvl72", 0.75)]
)
def test_built_in_sustained_bandwidth_without_linears_is_the_median_of_cudnns_norms(
    gpu: str, profile: str, share: float
) -> None:
    """Where no table of linear layers is public, hbm_sustained is the median rate of the cuDNN frontend's
    RMSNorm forward passes of 20 us or more (benchmarks/kernel_curves.py): 10 on the H200 (78 % of its
    datasheet, as the H100's multiplies reach 80 % of its), 7 on the GB200 (75 %)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from kernel_curves import norm_bandwidth  # the derivation the profiles cite
    finally:
        sys.path.pop(0)
    derived = norm_bandwidth(SHARED, gpu)
    device = load_profile(profile).device
    assert derived["rows"] >= 7
    assert device.hbm_sustained == pytest.approx(derived["bytes_per_s"], rel=0.001)
    assert device.hbm_sustained / device.hbm_bandwidth == pytest.approx(share, abs=0.005)


def test_sustained_bandwidth_reads_only_long_memory_bound_multiplies() -> None:
    """A GEMV-like multiply of 67 MB of weights in 40 us is counted (1.7 TB/s); a compute-bound one and one
    short enough to be its launch are not."""
    profile = load_profile("h100-nvlink")

    def row(m: int, n: int, k: int, seconds: float) -> GemmRow:
        return GemmRow(0, m, n, k, 1, "bf16", 2.0 * m * n * k / seconds)

    rows = [row(1, 4096, 8192, 40e-6), row(4096, 4096, 4096, 0.2e-3), row(1, 512, 512, 5e-6)]
    got = sustained_bandwidth(profile, rows)
    assert got is not None and got["rows"] == 1
    assert got["bytes_per_s"] == pytest.approx(2 * (8192 + 4096 * 8192 + 4096) / 40e-6, rel=1e-12)
