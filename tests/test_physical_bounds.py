"""Numbers a device cannot reach, and flags that would be ignored: profiles above their peak are refused,
MFU and HFU stay at or under 100 % whatever the precision flags, and every fixed flag is honoured or refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.machines.profiles import data_dir
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step
from tests.test_hostile_input import one_line_error

STEP = ["step", "--model", "llama3-8b", "--seq", "8k", "--gpus", "8", "--global-batch", "16"]
H200 = yaml.safe_load((data_dir("hardware") / "h200-nvlink.yaml").read_text(encoding="utf-8"))


class _Plain(yaml.SafeDumper):
    """Writes a list used twice out twice: the loader refuses anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _profile(tmp_path: Path, change: Any) -> str:
    data = copy.deepcopy(H200)
    change(data)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.dump(data, Dumper=_Plain), encoding="utf-8")
    return str(path)


def _set(*path: str, value: Any) -> Any:
    def change(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(path[-1]) if isinstance(node, list) else path[-1]] = value

    return change


def _scaled(table: str, factor: float) -> Any:
    def change(data: dict) -> None:
        curves = data["kernels"][table]
        for curve in curves if isinstance(curves, list) else [curves]:
            curve["flops_per_s"] = [rate * factor for rate in curve["flops_per_s"]]

    return change


def _every_seq(values: list[int]) -> Any:
    def change(data: dict) -> None:
        for curve in data["kernels"]["attention"]:
            curve["seq"] = values

    return change


def _without_fp8_peak(effective: dict[str, float]) -> Any:
    def change(data: dict) -> None:
        del data["device"]["peak_flops"]["fp8"], data["kernels"]["gemm_fp8"]
        data["device"]["effective_flops"] = effective

    return change


# --- Profiles: no stated rate above the peak it is read against; table sizes positive and increasing ------
@pytest.mark.parametrize(
    ("change", "words"),
    [
        pytest.param(
            _set("device", "effective_flops", value={"bf16": 9.89e15}),
            ("effective_flops.bf16", "above peak_flops.bf16"),
            id="effective-10x-peak",
        ),
        pytest.param(
            _without_fp8_peak({"fp8": 1e12}),
            ("effective_flops.fp8 needs peak_flops.fp8",),
            id="effective-of-a-dtype-without-peak",
        ),
        pytest.param(
            _scaled("attention", 10),
            ("kernels.attention.0.flops_per_s", "peak_flops.bf16"),
            id="attention-10x",
        ),
        pytest.param(_scaled("gemm", 10), ("kernels.gemm.flops_per_s", "peak_flops.bf16"), id="gemm-10x"),
        pytest.param(
            _set("device", "hbm_sustained", value=9.6e12),
            ("device", "hbm_sustained must be at most hbm_bandwidth"),
            id="sustained-above-datasheet-bandwidth",
        ),
        pytest.param(
            _scaled("gemm_fp8", 10), ("kernels.gemm_fp8.flops_per_s", "peak_flops.fp8"), id="fp8-10x"
        ),
        pytest.param(
            _set("kernels", "attention_scale", value=1e6),
            ("kernels.attention_scale", "20"),
            id="attention-scale-1e6",
        ),
        pytest.param(
            _set("kernels", "attention_scale", value=1.9),
            ("x attention_scale", "above device.peak_flops.bf16"),
            id="attention-scale-past-peak",
        ),
        pytest.param(_set("kernels", "gemm_scale", value=0.0), ("kernels.gemm_scale",), id="gemm-scale-zero"),
        pytest.param(
            _set("kernels", "gemm_size_exponent", value=-1),
            ("kernels.gemm_size_exponent", "0"),
            id="negative-size-exponent",
        ),
        pytest.param(
            _set("kernels", "attention", "0", "seq", "0", value=0),
            ("kernels.attention.0.seq.0", "greater than or equal to 1"),
            id="zero-edge",
        ),
        pytest.param(
            _set("kernels", "attention", "0", "seq", "0", value=-512),
            ("kernels.attention.0.seq.0", "greater than or equal to 1"),
            id="negative-edge",
        ),
        pytest.param(
            _every_seq([512, 512, 2048, 4096, 8192, 16384]),
            ("kernels.attention.0", "strictly increasing"),
            id="duplicate-edge",
        ),
        pytest.param(
            _set("kernels", "gemm", "edge", value=[512, 1024, 1024, 4096, 8192, 16384]),
            ("kernels.gemm", "edge must be strictly increasing"),
            id="duplicate-gemm-edge",
        ),
        pytest.param(
            _set("kernels", "gemm", "edge", value=[512, 4096, 2048, 1024, 8192, 16384]),
            ("kernels.gemm", "strictly increasing"),
            id="falling-gemm-edge",
        ),
    ],
)
def test_a_profile_past_physical_bounds_is_refused_naming_the_field(cli, tmp_path, change, words) -> None:
    one_line_error(cli(*STEP, "--hw", _profile(tmp_path, change)), "--hw", *words)


def test_every_built_in_profile_is_within_its_peak(cli) -> None:
    """The bounds hold the shipped profiles: each loads, and its step answers."""
    result = cli(*STEP, "--hw", "h200-nvlink", "--format", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["step"]["mfu"] <= 1


MEASURED = Path(__file__).parent / "data" / "calibrated" / "cpu-gloo-2ranks.yaml"


@pytest.mark.parametrize("part", ["forward", "backward"])
def test_a_measured_profile_whose_curves_pass_its_peak_is_refused_when_loaded(cli, tmp_path, part) -> None:
    """calibrate's curves are rates like the kernel tables: above the device's peak HFU would pass 100 %.
    calibrate states the best rate it measured, forward or backward, as the peak (it took the forward's,
    and its backward ran 1.2 % above it)."""
    data = yaml.safe_load(MEASURED.read_text())
    peak = data["device"]["peak_flops"]["fp32"]
    rates = [p["flops_per_s"] for c in data["calibration"]["compute"] for p in c["forward"] + c["backward"]]
    assert max(rates) == peak  # the shipped measurement holds
    data["calibration"]["compute"][1][part][0]["flops_per_s"] = 3 * peak
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(data))
    args = ["--seq", "8k", "--n", "2", "--dtype", "fp32", "--hw", str(path)]
    one_line_error(
        cli(*args), "--hw", f"calibration.compute.1.{part}.flops_per_s", "above device.peak_flops.fp32"
    )


# --- MFU and HFU: each FLOP held to the peak of the precision it runs in ----------------------------------
@pytest.mark.parametrize("hw", ["h200-nvlink", "b200-nvlink"])
@pytest.mark.parametrize("gemm", ["fp8", "mxfp8"])
def test_fp8_multiplies_at_efficiency_one_stay_under_100_percent(cli, hw, gemm) -> None:
    """Reported at 110-171 % when FP8 work was divided by the bf16 peak; now each part is over its own."""
    args = [*STEP, "--hw", hw, "--efficiency", "1", "--gemm-dtype", gemm, "--format", "json"]
    result = cli(*args)
    if gemm == "mxfp8" and hw == "h200-nvlink":
        one_line_error(result, "--gemm-dtype", "Blackwell")
        return
    step = json.loads(result.out)["step"]
    assert 0.5 < step["mfu"] <= step["hfu"] <= 1
    assert step["mfu_full_square"] <= 1


@pytest.mark.parametrize(
    "mask",
    [["--window", "1"], ["--attention-chunk", "16"], ["--docs", "512x16"]],
    ids=["window-1", "chunk-16", "small-docs"],
)
def test_a_packed_or_windowed_mask_has_no_full_square_figure(cli, mask) -> None:
    """The S² square is no share of a window's attention: it read 117-326 % of peak, now it is absent."""
    result = cli(*STEP, "--hw", "h200-nvlink", "--efficiency", "1", *mask, "--format", "json")
    step = json.loads(result.out)["step"]
    assert step["mfu_full_square"] is None
    assert step["mfu"] <= 1 and step["hfu"] <= 1
    text = cli(*STEP, "--hw", "h200-nvlink", "--efficiency", "1", *mask).out
    assert "full S² square" not in text and "MFU" in text


def test_recommend_ranks_fp8_plans_under_100_percent(cli) -> None:
    result = cli(
        "recommend", "--model", "llama3-8b", "--seq", "8k", "--hw", "b200-nvlink", "--gpus", "8",
        "--efficiency", "1", "--gemm-dtype", "fp8", "--format", "json",
    )  # fmt: skip
    assert result.code == 0, result.err
    plans = json.loads(result.out)["search"]["plans"]
    assert plans and all(0 < plan["mfu"] <= 1 for plan in plans)


@settings(max_examples=16, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    hw=st.sampled_from(["h100-nvlink", "h200-nvlink", "b200-nvlink", "mi300x-xgmi", "h800-ib"]),
    dtype=st.sampled_from(["bf16", "fp16", "fp8"]),
    gemm=st.sampled_from([None, "fp8"]),
    efficiency=st.sampled_from([None, 0.3, 0.7, 1.0]),
    seq=st.sampled_from([2048, 8192, 32768]),
)
def test_mfu_never_passes_1_over_dtype_hardware_and_efficiency(hw, dtype, gemm, efficiency, seq) -> None:
    """Invariant: MFU <= HFU <= 1 at any dtype, FP8 multiplies or not, kernel tables or any efficiency."""
    job = Job.of(
        model="llama3-8b", seq=seq, hw=hw, gpus=8, cp=8 if seq > 8192 else 1, global_batch=8,
        dtype=dtype, efficiency=efficiency, gemm_dtype=gemm, recompute="full",
    )  # fmt: skip
    step = evaluate_step(job).step
    assert 0 < step.mfu <= step.hfu * (1 + 1e-9)
    assert step.hfu <= 1 + 1e-9


# --- Flags honoured or refused ---------------------------------------------------------------------------
RECOMMEND_8B = ["recommend", "--model", "llama3-8b", "--hw", "h100-nvlink", "--gpus", "8"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(
            [*RECOMMEND_8B, "--seq", "128k", "--cp", "3"],
            ("--cp", "3 does not divide the sequence"),
            id="recommend-cp-3-of-128k",
        ),
        pytest.param(
            [*RECOMMEND_8B, "--seq", "128k", "--cp", "16"],
            ("--gpus", "fewer than the fixed tp x cp x pp = 16"),
            id="recommend-cp-past-gpus",
        ),
        pytest.param(["sweep", "--n", "1..2048", "--seq", "128k"], ("--cp", "[1, 1,024]"), id="sweep-n-2048"),
        pytest.param(
            [*STEP, "--fp8-scaling", "current"], ("--fp8-scaling", "not fp8"), id="fp8-scaling-without-fp8"
        ),
        pytest.param(
            [*STEP, "--loss", "materialized", "--loss-chunk-tokens", "1024"],
            ("--loss-chunk-tokens", "materialized loss"),
            id="chunk-of-a-whole-loss",
        ),
        pytest.param(
            [*STEP, "--zero", "1", "--fsdp-prefetch", "2"], ("--fsdp-prefetch", "--zero 3"), id="prefetch"
        ),
        pytest.param(
            [*STEP, "--zero", "1", "--reshard-after-forward", "never"],
            ("--reshard-after-forward", "--zero 3"),
            id="reshard-without-fsdp",
        ),
        pytest.param(
            [*STEP, "--capacity-factor", "2"], ("--capacity-factor", "no experts"), id="capacity-dense"
        ),
        pytest.param(
            [*STEP, "--recompute", "full", "--selective-recompute", "ops"],
            ("--selective-recompute", "this job recomputes full"),
            id="selective-choice-beside-full-recompute",
        ),
        pytest.param(
            [*RECOMMEND_8B, "--seq", "8k", "--cp-scheme", "ulysses", "--layout", "striped"],
            ("--layout", "no layout to fix"),
            id="layout-of-ulysses",
        ),
        pytest.param(
            [*STEP, "--cp", "2", "--cp-scheme", "ulysses", "--layout", "zigzag"],
            ("--layout", "no layout to fix"),
            id="layout-of-ulysses-in-a-step",  # even the default's value, given, is refused
        ),
        pytest.param(
            ["sweep", "--seq", "8k", "--global-batch", "8"],
            ("--global-batch", "need --model and --gpus"),
            id="sweep-global-batch-without-step-times",
        ),
        pytest.param(
            [*STEP, "--efficiency", "0_1"], ("--efficiency", "'0_1' is not a number"), id="underscore"
        ),
        pytest.param([*STEP, "--efficiency", "nan"], ("--efficiency", "not a number"), id="nan"),
        pytest.param([*STEP, "--cp-overlap", "inf"], ("--cp-overlap", "not a number"), id="inf"),
        pytest.param(
            [*STEP, "--memory-headroom", "٠.5"], ("--memory-headroom", "not a number"), id="arabic-digit"
        ),
    ],
)
def test_a_flag_is_honoured_or_refused(cli, args, words) -> None:
    one_line_error(cli(*args), *words)


def test_a_whole_sequence_scheme_states_no_layout(cli) -> None:
    """Left unsaid, the layout is not echoed beside a scheme it does not enter; said in Python (or a plan
    file), it is refused as on the command line."""
    result = cli(*STEP, "--cp", "2", "--cp-scheme", "ulysses")
    assert result.code == 0, result.err
    assert "cp 2 (ulysses), pp 1" in result.out
    with pytest.raises(InputError, match="no layout to fix"):
        Job.of(
            model="llama3-8b", seq=8192, gpus=8, global_batch=8, cp=2, cp_scheme="ulysses", layout="zigzag"
        )


def test_a_fixed_cp_that_divides_is_honoured(cli) -> None:
    result = cli(*RECOMMEND_8B, "--seq", "24k", "--cp", "3", "--format", "json")
    assert result.code == 0, result.err
    plans = json.loads(result.out)["search"]["plans"]
    assert plans and {plan["cp"] for plan in plans} == {3}


@pytest.mark.parametrize("pass_", ["fwd", "bwd", "fwd+bwd"])
def test_a_sweep_row_ratio_and_times_describe_one_pass(cli, pass_) -> None:
    """The ratio is the comm over the compute of the pass it names: the backward's ratio once sat beside
    the forward's times."""
    result = cli(
        "sweep",
        "--seq",
        "1k,128k",
        "--n",
        "8",
        "--hw",
        "h100-nvlink",
        "--pass",
        pass_,
        "--causal",
        "-f",
        "json",
    )
    for row in json.loads(result.out)["rows"]:
        assert row["ratio_pass"] in pass_.split("+")
        assert row["comm_ratio_step"] == pytest.approx(row["step_comm_s"] / row["step_compute_s"], rel=1e-9)


@pytest.mark.parametrize(
    "merge",
    ["<<: {seq: 1M}\nseq: 128k\n", "seq: 128k\n<<: [{seq: 1M}, {cp: 2}]\n"],
    ids=["inline-mapping", "list-of-mappings"],
)
def test_a_yaml_merge_key_is_refused_not_hiding_a_duplicate(cli, tmp_path, merge) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(f"name: t\nmodel: llama3-8b\nhw: h100-nvlink\n{merge}cp: 8\ngpus: 64\n", encoding="utf-8")
    one_line_error(cli("check", str(path)), "plan.yaml", "merge keys (<<) are not accepted")


def test_a_quoted_merge_key_is_a_plain_unknown_key(cli, tmp_path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        'name: t\nmodel: llama3-8b\nhw: h100-nvlink\n"<<": 1\nseq: 128k\ncp: 8\n', encoding="utf-8"
    )
    one_line_error(cli("check", str(path)), "<<", "unknown key")
