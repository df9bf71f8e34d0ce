"""The built-in profiles' kernel curves derived from public kernel measurements, with their error: each public
table turned into `cp-plan hw fit-kernels`' columns, fitted, the row in five kept aside predicted, and the
fit of one source checked on another it never saw (transfer); and the bandwidth memory-bound kernels reach
(the profiles' `device.hbm_sustained`): from the multiplies far below the ridge where a table of linear layers
is at hand (H100, A100), else from the cuDNN frontend's RMSNorm forward passes (H200, GB200).

    python benchmarks/kernel_curves.py --data DIR      # the public tables (docs/references.md): fits, errors
    python benchmarks/kernel_curves.py --data DIR --yaml                  # and each fitted curve as YAML
    python benchmarks/kernel_curves.py --smoke     # a table timed by the model itself: the pipeline, not the data

The tables are those of the data folder's SOURCES.md (Vidur's linear layers at real model shapes on H100 and
A100, XLA's matmul table on H100 and B200, DeepGEMM's block-scaled FP8 multiplies on H800, the cuDNN frontend's
attention and norm sweeps); the project commits what
is fitted from them (hardware/*.yaml, each curve's `source` naming this script), never the tables.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from costmodel.machines.kernel_fit import (
    STREAMING_MIN_S,
    attention_errors,
    fit_kernels,
    gemm_errors,
    read_attention_table,
    read_gemm_table,
    sustained_bandwidth,
)
from costmodel.machines.kernels import gemm_rate
from costmodel.machines.profiles import load_profile


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        yield from csv.DictReader(handle)


def vidur(data: Path, gpu: str) -> list[list]:
    """Vidur's linear layers (fp16, Kineto kernel time, median of 20 steps)."""
    return [
        [r["m"], r["n"], r["k"], 1, "fp16", r["median_ms"], ""]
        for r in _rows(data / f"vidur_{gpu}_fp16_linear_ops.csv")
    ]


def xla(data: Path, device: str) -> list[list]:
    """XLA's matmul table, bf16 x bf16 -> bf16 (its FP8 columns exceed the FP8 peak: not used)."""
    return [
        [r["m"], r["n"], r["k"], r["b"], "bf16", "", r["bf16xbf16_to_bf16_TFLOPs"]]
        for r in _rows(data / "xla_matmul_perf_table_tflops.csv")
        if r["device"].startswith(device)
    ]


def deepgemm(data: Path) -> list[list]:
    """DeepGEMM's block-scaled FP8 multiplies on an H800 (its README's latest table; a group is a batch entry)."""
    rows = list(_rows(data / "deepgemm_h800_fp8_gemm.csv"))
    latest = max(r["readme_date"] for r in rows)
    return [
        [r["m_per_group"], r["n"], r["k"], r["groups"], "fp8", "", r["tflops"]]
        for r in rows
        if r["readme_date"] == latest
    ]


def cudnn(data: Path, gpu: str, backend: str, cudnn_prefix: str) -> list[list]:
    """The cuDNN frontend's SDPA sweeps, one row per pass."""
    out = []
    for r in _rows(data / "cudnn_frontend_sdpa.csv"):
        if not (r["gpu"].startswith(gpu) and r["backend"] == backend and r["cudnn"].startswith(cudnn_prefix)):
            continue
        if r["dtype"] != "bf16" or r["window"] or r["d_qk"] != r["d_vo"]:
            continue
        causal = "true" if r["mask"] in ("causal", "top_left") else "false"
        for direction in ("fwd", "bwd"):
            ms, tflops = r[f"{direction}_ms"], r[f"{direction}_tflops"]
            # timed rows are counted here; the 2024 rows publish TFLOP/s only, under the same count (half the
            # square causal, 2.5x backward)
            if ms or tflops:
                out.append(
                    [
                        r["d_qk"],
                        causal,
                        direction,
                        r["seq_q"],
                        r["batch"],
                        r["heads_q"],
                        ms,
                        "" if ms else tflops,
                    ]
                )
    return out


def norm_bandwidth(data: Path, gpu: str) -> dict[str, float]:
    """What a memory-bound kernel reaches on ``gpu``: the median bytes a second of the cuDNN frontend's RMSNorm
    forward passes (input read, output written once, as the source counts them) that run at least
    STREAMING_MIN_S, the rule the multiplies' figure follows; shorter ones are their launch."""
    rates = [
        float(r["fwd_GBps"]) * 1e9
        for r in _rows(data / "cudnn_frontend_norms.csv")
        if r["gpu"] == gpu
        and r["backend"] == "cudnn"
        and r["norm_type"] == "rms_norm"
        and float(r["fwd_ms"]) * 1e-3 >= STREAMING_MIN_S
    ]
    return {"rows": len(rates), "bytes_per_s": statistics.median(rates), "min": min(rates), "max": max(rates)}


NORM_GPUS = {"H200": "h200-nvlink", "GB200": "gb200-nvl72"}


GEMM_HEADER = ["m", "n", "k", "batch", "dtype", "ms", "tflops"]
ATTENTION_HEADER = ["head_dim", "causal", "pass", "seq", "batch", "heads", "ms", "tflops"]


def _write(folder: Path, name: str, header: list[str], rows: list[list]) -> str:
    path = folder / name
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def _line(label: str, s: dict | None) -> str:
    if s is None:
        return f"    {label:<34} -"
    return (
        f"    {label:<34} {s['n']:>6} rows  MAPE {s['mape']:6.1%}  median {s['median_abs_error']:6.1%}  "
        f"worst {s['max_abs_error']:6.1%}  signed {s['signed_median']:+6.1%}"
    )


# (profile, table name, rows, header, what the fit of it is checked on: (label, rows) pairs)
Case = tuple[
    str, str, Callable[[Path], list[list]], list[str], list[tuple[str, Callable[[Path], list[list]]]]
]
CASES: list[Case] = [
    ("h100-nvlink", "Vidur H100 linears", lambda d: vidur(d, "h100"), GEMM_HEADER, [("XLA H100 squares", lambda d: xla(d, "H100"))]),
    ("h100-nvlink", "XLA H100 squares", lambda d: xla(d, "H100"), GEMM_HEADER, [("Vidur H100 linears", lambda d: vidur(d, "h100"))]),
    ("a100-nvlink", "Vidur A100 linears", lambda d: vidur(d, "a100"), GEMM_HEADER, []),
    ("b200-nvlink", "XLA B200 squares", lambda d: xla(d, "B200"), GEMM_HEADER, []),
    ("h800-nvlink", "DeepGEMM block-scaled FP8 on H800", deepgemm, GEMM_HEADER, [("every DeepGEMM row", deepgemm)]),
    (
        "h200-nvlink",
        "cuDNN 9.1 (NGC 24.03) on H200",
        lambda d: cudnn(d, "H200", "cudnn", "9.1.0"),
        ATTENTION_HEADER,
        [("cuDNN 9.19 on H200", lambda d: cudnn(d, "H200", "cudnn", "91901"))],
    ),
    ("b200-nvlink", "cuDNN 9.10 on B200", lambda d: cudnn(d, "B200", "cudnn_fe", "9.10"), ATTENTION_HEADER, [("cuDNN 9.13 on B200", lambda d: cudnn(d, "B200", "cudnn_fe", "9.13"))]),
]  # fmt: skip


def smoke(_: Path) -> list[list]:
    """Multiplies timed by the model on the H100 profile at 0.9 of its table: the fit must read 0.9 back."""
    base = load_profile("h100-nvlink")
    sizes = (1024, 2048, 3072, 4096, 8192)
    return [
        [m, n, k, 1, "bf16", 2.0 * m * n * k / (0.9 * gemm_rate(base, "bf16", m, n, k)) * 1e3, ""]
        for m in sizes
        for n in sizes
        for k in sizes
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="the folder of public kernel tables (SOURCES.md)")
    parser.add_argument("--yaml", action="store_true", help="print each fitted curve as YAML")
    parser.add_argument("--smoke", action="store_true", help="a table made by the model instead of the data")
    args = parser.parse_args()
    if not args.data and not args.smoke:
        raise SystemExit("give --data DIR (the public kernel tables) or --smoke")
    data = Path(args.data or ".")
    cases = (
        [("h100-nvlink", "the model's own H100 table at 0.9", smoke, GEMM_HEADER, [])]
        if args.smoke
        else CASES
    )
    work = Path(tempfile.mkdtemp())
    for number, (name, label, make, header, checks) in enumerate(cases):
        gemm = header is GEMM_HEADER
        table = _write(work, f"{number}.csv", header, make(data))
        base = load_profile(name)
        fitted, report = fit_kernels(base, table if gemm else None, None if gemm else table, f"{name}-fitted")
        print(f"{label} -> {name}")
        for fit in report["gemm"] + report["attention"]:
            what = fit.get("table") or "{kernel} d{head_dim} causal={causal} bwd={backward}".format(
                **fit["curve"]
            )
            print(f"  {what}: knots {fit['knots']}, TFLOP/s {[round(v / 1e12) for v in fit['flops_per_s']]}")
            print(_line(f"built-in {name}, rows kept aside", fit["aside_base"]))
            print(_line("fit of the rest, rows kept aside", fit["aside"]))
        for check, rows in checks:
            path = _write(work, f"{number}-check.csv", header, rows(data))
            errors = gemm_errors if gemm else attention_errors
            measured = read_gemm_table(path) if gemm else read_attention_table(path)
            print(_line(f"on {check}: built-in", errors(base, measured)))
            print(_line(f"on {check}: this fit", errors(fitted, measured)))
        streaming = sustained_bandwidth(base, read_gemm_table(table)) if gemm else None
        if streaming:  # the profiles' device.hbm_sustained
            print(
                f"  memory-bound multiplies: {streaming['rows']} rows, median {streaming['bytes_per_s'] / 1e12:.3f} "
                f"TB/s (IQR {streaming['p25'] / 1e12:.2f}-{streaming['p75'] / 1e12:.2f}) of the datasheet's "
                f"{base.device.hbm_bandwidth / 1e12:.3f}"
            )
        if args.yaml:
            kernels = fitted.model_dump(mode="json", exclude_none=True)["kernels"]
            part = {"gemm": kernels["gemm"]} if gemm else {"attention": kernels["attention"]}
            print(yaml.safe_dump(part, sort_keys=False, width=110))
    if not args.smoke:
        for gpu, name in NORM_GPUS.items():
            norms, datasheet = norm_bandwidth(data, gpu), load_profile(name).device.hbm_bandwidth
            assert datasheet is not None
            print(
                f"cuDNN RMSNorm forward on {gpu}: {norms['rows']} passes of at least {STREAMING_MIN_S * 1e6:.0f} us, "
                f"median {norms['bytes_per_s'] / 1e12:.3f} TB/s ({norms['min'] / 1e12:.2f}-{norms['max'] / 1e12:.2f}), "
                f"{norms['bytes_per_s'] / datasheet:.0%} of the datasheet's {datasheet / 1e12:.3f} -> {name}"
            )


if __name__ == "__main__":
    main()
