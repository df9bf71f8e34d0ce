"""Calibration (docs/calibration.md), the model side: fits, the measured profile, and the time prediction."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.calibration.fit import build_profile, fit_link, fit_overlap, fit_sync
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import ComputeCurve, load_profile, parse_profile, profile_yaml
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict, ring_layer_time


def samples(
    alpha: float, bandwidth: float, sizes: list[int], jitter: list[float] | None = None
) -> list[dict]:
    jitter = jitter or [0.0] * len(sizes)
    return [
        {"bytes": n, "seconds": (alpha + n / bandwidth) * (1 + j), "spread": 0.01}
        for n, j in zip(sizes, jitter)
    ]


SIZES = [4096 * 4**k for k in range(7)]


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(1e-6, 1e-3), bandwidth=st.floats(1e8, 1e11))
def test_fit_link_recovers_alpha_and_bandwidth(alpha: float, bandwidth: float) -> None:
    fit = fit_link(samples(alpha, bandwidth, SIZES))
    assert fit.latency_s == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_fit_link_on_noisy_samples_reports_the_fit_quality() -> None:
    fit = fit_link(samples(2e-4, 1e9, SIZES, jitter=[0.3, -0.2, 0.1, -0.1, 0.05, -0.05, 0.02]))
    assert fit.latency_s == pytest.approx(2e-4, rel=0.35) and fit.bandwidth == pytest.approx(1e9, rel=0.1)
    assert 0.9 < fit.r2 < 1.0


def test_all_to_all_bandwidth_counts_received_bytes() -> None:
    fit = fit_link(samples(1e-4, 1e9, SIZES), received_fraction=0.5)  # 2 ranks keep half
    assert fit.bandwidth == pytest.approx(0.5e9, rel=1e-6)


def test_fit_overlap_and_sync() -> None:
    def point(c: float, m: float, o: float, e: float) -> dict:
        both = max(c, m) + (1 - o) * min(c, m) + e
        return {"compute": c, "comm": m, "both": both, "a2a": m, "compute_then_a2a": c + m + 2 * e}

    serial = [point(c, m, 0.0, 3e-4) for c, m in ((1e-3, 2e-3), (4e-3, 3e-3), (1e-2, 5e-3), (3e-2, 8e-3))]
    assert fit_overlap(serial) == pytest.approx((0.0, 3e-4), abs=1e-9)
    assert fit_sync(serial) == pytest.approx(6e-4)
    hidden = [point(c, m, 1.0, 0.0) for c, m in ((1e-3, 2e-3), (4e-3, 3e-3), (1e-2, 5e-3))]
    assert fit_overlap(hidden) == pytest.approx((1.0, 0.0), abs=1e-9)


def test_ring_timeline() -> None:
    assert ring_layer_time([2.0, 2.0, 2.0], 1.0) == 6.0  # compute-bound: the transfers hide
    assert ring_layer_time([1.0, 1.0, 1.0], 3.0) == 7.0  # comm-bound: 3 + 3 + the last step
    assert ring_layer_time([2.0, 2.0, 2.0], 1.0, overlap=0.0) == 8.0  # serial
    assert (
        ring_layer_time(
            [2.0, 2.0], [1.0, 1.0], tail_s=1.0, step_overhead_s=0.5, step_waits=[1, 2], tail_waits=1
        )
        == 2 + 2 + 1 + 0.5 * 4
    )


def raw_measurements() -> dict:
    """What rank 0 of a 2-rank calibration returns, made up: 100 GFLOP/s at large blocks."""

    def curve(causal: bool, level: int) -> dict:
        points = []
        for tokens in (64, 256, 1024):
            flops = 4.0 * 8 * tokens * tokens * 64 * (0.5 if causal else 1.0)
            rate = 1e11 * tokens / (tokens + 64) / level
            points.append({"tokens": tokens, "flops": flops, "flops_per_s": rate, "spread": 0.02})
        return {
            "concurrency": level,
            "causal": causal,
            "forward": points,
            "backward": [dict(p, flops_per_s=p["flops_per_s"] / 2) for p in points],
        }

    return {
        "meta": {
            "host": "box",
            "torch_version": "2.13.0+cpu",
            "backend": "gloo",
            "nproc": 2,
            "device_name": "CPU test",
            "memory_bytes": 64e9,
            "ranks_per_node": 2,
        },
        "compute": [curve(causal, level) for level in (1, 2) for causal in (False, True)],
        "links": {
            "intra-node": {
                "ranks": 2,
                "p2p": samples(1e-4, 2e9, SIZES),
                "alltoall": samples(2e-4, 1e9, SIZES),
            }
        },
        "overlap": [
            {
                "tokens": 64,
                "compute": 1e-3,
                "comm": 2e-3,
                "both": 3.2e-3,
                "a2a": 2e-3,
                "compute_then_a2a": 3.3e-3,
            },
            {
                "tokens": 256,
                "compute": 4e-3,
                "comm": 3e-3,
                "both": 7.2e-3,
                "a2a": 3e-3,
                "compute_then_a2a": 7.3e-3,
            },
        ],
        "layers": {
            "tokens": 8,
            "ring fwd": 2e-3,
            "ring fwd+bwd": 5e-3,
            "ulysses fwd": 3e-3,
            "ulysses fwd+bwd": 7e-3,
        },
    }


SHAPE = {"dtype": "fp32", "batch": 1, "heads": 8, "kv_heads": 8, "head_dim": 64}


def test_measured_profile_round_trips_through_yaml(tmp_path) -> None:
    profile = build_profile(raw_measurements(), "box", SHAPE, date="2026-11-30")
    assert profile.source.kind == "measured" and profile.source.nproc == 2
    assert profile.links.intra_node.latency_s == pytest.approx(1e-4)
    assert profile.links.intra_node.bandwidth_per_direction == pytest.approx(2e9)
    assert profile.links.intra_node.alltoall.bandwidth_per_direction == pytest.approx(0.5e9)  # received half
    assert profile.device.effective_flops["fp32"] == pytest.approx(1e11 * 1024 / 1088 / 2)
    assert profile.calibration.overlap == pytest.approx(0.0, abs=1e-9)
    assert set(profile.calibration.layer_overhead_s) == {  # raw from before kinds: contiguous, no mask
        "ring contiguous fwd",
        "ring contiguous fwd+bwd",
        "ulysses contiguous fwd",
        "ulysses contiguous fwd+bwd",
    }
    path = tmp_path / "box.yaml"
    path.write_text(profile_yaml(profile, "calibrated"))
    assert yaml.safe_load(path.read_text())["source"]["kind"] == "measured"
    assert load_profile(str(path)) == profile


def test_the_decode_read_sets_the_memory_bandwidth() -> None:
    """A calibration that timed one decode query against a long cache states the bytes/s it read at as the
    device's memory bandwidth (what decode's KV-cache read and the merges are priced at); one measured
    before it states none, as before."""
    raw = raw_measurements()
    raw["inference"] = {
        "tokens": 8,
        "kinds": [],
        "calls": [],
        "read": {"tokens": 32768, "bytes": 134217728, "bytes_per_s": 5.0e9, "spread": 0.02},
    }
    profile = build_profile(raw, "box", SHAPE, date="2026-11-30")
    assert profile.device.hbm_bandwidth == 5.0e9
    assert "32768-token cache" in profile.source.notes
    assert build_profile(raw_measurements(), "box", SHAPE, date="2026-11-30").device.hbm_bandwidth is None


def test_inference_fixed_costs_are_the_tiny_layers_less_the_model() -> None:
    """Each scheme's fixed cost is its tiny layer's time less what the inference formulas predict for it
    without one; validate's prediction at that very shape then returns the time measured, and a datasheet
    ignores it."""
    from costmodel.calibration.compare import calibrated_inputs, calibrated_machine
    from costmodel.inference.kernel_runs import predict_run

    raw = raw_measurements()
    times = {"pass-kv": 4e-3, "pass-q": 6e-3, "decode": 2.5e-3}
    raw["inference"] = {
        "tokens": 8,
        "kinds": [
            {"scheme": s, "new_per_rank": 1 if s == "decode" else 8, "cached_per_rank": 8, "seconds": t}
            for s, t in times.items()
        ],
    }
    plain = build_profile(raw_measurements(), "box", SHAPE, date="2026-11-30")
    profile = build_profile(raw, "box", SHAPE, date="2026-11-30")
    assert plain.calibration.inference_overhead_s == {}
    inputs = calibrated_inputs(profile, 2, 1)
    for scheme, seconds in times.items():
        new = 1 if scheme == "decode" else 8
        without = predict_run(inputs, calibrated_machine(plain), scheme, new, 8)
        assert 0 < without < seconds
        assert profile.calibration.inference_overhead_s[scheme] == pytest.approx(seconds - without, rel=1e-9)
        assert predict_run(inputs, calibrated_machine(profile), scheme, new, 8) == pytest.approx(
            seconds, rel=1e-9
        )
        # at a larger shape the fixed cost is added once, unchanged
        big = predict_run(inputs, calibrated_machine(profile), scheme, new * 8, 64)
        assert big - predict_run(inputs, calibrated_machine(plain), scheme, new * 8, 64) == pytest.approx(
            seconds - without, rel=1e-9
        )
        assert predict_run(
            inputs, calibrated_machine(profile).as_datasheet(), scheme, new, 8
        ) == pytest.approx(
            predict_run(inputs, calibrated_machine(plain).as_datasheet(), scheme, new, 8), rel=1e-12
        )


def test_measured_profile_works_everywhere_hw_does(cli, tmp_path) -> None:
    path = tmp_path / "box.yaml"
    path.write_text(profile_yaml(build_profile(raw_measurements(), "box", SHAPE), "calibrated"))
    report = cli("--seq", "16k", "--n", "2", "--hw", str(path), "--dtype", "fp32", "-f", "json").json()
    assert report["hardware"]["source"] == "measured" and report["hardware"]["latency"] == pytest.approx(1e-4)
    assert (
        cli(
            "recommend",
            "--seq",
            "16k",
            "--model",
            "llama3-8b",
            "--hw",
            str(path),
            "--gpus",
            "2",
            "--dtype",
            "fp32",
        ).code
        == 0
    )


def test_validate_needs_a_measured_profile(cli) -> None:
    result = cli("validate", "--hw", "a100-nvlink")
    assert result.code == 2 and "validate needs a measured profile" in result.err


def test_calibrate_bad_input(cli, tmp_path) -> None:
    assert "--out" in cli("calibrate", "--out", str(tmp_path / "x.txt")).err
    assert (
        "at least 6 sizes"
        in cli("calibrate", "--out", str(tmp_path / "x.yaml"), "--message-bytes", "4k,8k").err
    )
    assert (
        "--kv-heads"
        in cli("calibrate", "--out", str(tmp_path / "x.yaml"), "--heads", "8", "--kv-heads", "3").err
    )
    empty = cli("calibrate", "--out", str(tmp_path / "x.yaml"), "--name", " ")
    assert empty.code == 2 and "--name: an empty name" in empty.err and not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("causal", [False, True])
def test_datasheet_prediction_is_the_seed_model(causal: bool) -> None:
    """With a datasheet profile the prediction is the balanced model of [A-RingCost §4]: N steps at W_step/F, transfers hidden."""
    inputs = PlanInputs(seq=262_144, n=8, causal=causal)
    report_step = (0.5 if causal else 1.0) * 4 * 32768**2 * 32 * 128 / 312e12
    got = predict(inputs, Machine(load_profile("a100-nvlink")).as_datasheet())
    assert got.forward_s == pytest.approx(8 * report_step, rel=1e-12)


def test_calibrated_prediction_uses_the_measured_rates() -> None:
    profile = build_profile(raw_measurements(), "box", SHAPE)
    inputs = PlanInputs(seq=2048, n=2, heads=8, kv_heads=8, head_dim=64, dtype="fp32", block=1, hw="box")
    work = 4.0 * 8 * 1024 * 1024 * 64
    rate = profile.calibration.rate(work, 2, False)  # the curve's, slowed as a ring step's compute measured
    kv_s = 1e-4 + 2 * 1024 * 8 * 64 * 4 / 2e9
    cal = profile.calibration
    expected = (
        work / rate + kv_s + cal.step_overhead_s + work / rate + cal.layer_overhead_s["ring contiguous fwd"]
    )
    machine = Machine(profile, "fp32")
    assert predict(inputs, machine).forward_s == pytest.approx(expected, rel=1e-9)
    assert math.isclose(
        predict(inputs, machine, "ring", backward=True).forward_s, predict(inputs, machine).forward_s
    )


def test_measured_profile_schema_rejects_nonsense() -> None:
    data = yaml.safe_load(profile_yaml(build_profile(raw_measurements(), "box", SHAPE), "calibrated"))
    data["calibration"]["overlap"] = 3
    with pytest.raises(Exception, match="calibration.overlap"):
        parse_profile(data, "x.yaml")


def test_validate_table_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cell on one line at 80 columns: no wrapped 'contigu…' and no 'ms' on a line of its own."""
    import io

    from rich.console import Console

    from costmodel.cli.render import render_validation

    rows = [
        {
            "variant": variant,
            "layout": layout,
            "causal": causal,
            "tokens_per_rank": tokens,
            "shard_over_critical": tokens / 164,
            "pass": pass_,
            "measured_s": 0.01234,
            "predicted_s": 0.01313,
            "error": 0.0641,
            "datasheet_s": 0.001,
            "datasheet_error": -0.8412,
        }
        for variant, layout in (("ring", "contiguous"), ("ring", "striped"), ("ulysses", "contiguous"))
        for causal in (False, True)
        for tokens in (32, 2048)
        for pass_ in ("fwd", "fwd+bwd")
    ]
    buffer = io.StringIO()
    report = {
        "hw": "box",
        "nproc": 2,
        "critical_shard_tokens": 164,
        "rows": rows,
        "passed": True,
        "median_abs_error": 0.05,
        "max_median_error": 0.1,
        "max_abs_error": 0.2,
        "datasheet_median_abs_error": 0.8,
        "datasheet_over_calibrated": 14.6,
    }
    render_validation(report, Console(file=buffer, width=80, highlight=False))
    lines = buffer.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    body = [line for line in lines if line.startswith(("ring", "Ulysses"))]
    assert len(body) == len(rows) and not any("…" in line for line in body)
    assert all(line.rstrip().endswith("%") for line in body)


def test_calls_of_fewer_queries_than_keys_run_at_their_measured_rate() -> None:
    """A fully visible call of q queries against 4q keys runs at the rate measured for that shape; at one
    key per query it is the square curve's; between measured shapes the slowdown is interpolated."""
    raw = raw_measurements()
    square = build_profile(raw, "box", SHAPE, date="2026-11-30").calibration.curve(2, False)
    calls = []
    for queries, keys in ((64, 256), (256, 1024)):
        flops = 4.0 * 8 * 64 * queries * keys
        calls.append({"queries": queries, "keys": keys, "flops": flops, "spread": 0.0})
        calls[-1]["flops_per_s"] = square.rate(flops) / 1.5  # measured 1.5x slower than a square block
    raw["inference"] = {"tokens": 8, "kinds": [], "calls": calls}
    cal = build_profile(raw, "box", SHAPE, date="2026-11-30").calibration
    for call in calls:  # inside a layer, each slowed as a ring step's compute is
        assert cal.call_rate(call["flops"], 2, call["queries"], call["keys"]) == pytest.approx(
            call["flops_per_s"] / cal.step_factor(call["flops"]), rel=1e-12
        )
    flops = 4.0 * 8 * 64 * 128 * 128
    step = cal.step_factor(flops)
    assert cal.call_rate(flops, 2, 128, 128) == pytest.approx(square.rate(flops) / step, rel=1e-12)
    between = cal.call_rate(flops, 2, 128, 256)  # 2 keys per query: half way in log(aspect)
    assert between == pytest.approx(square.rate(flops) / 1.25 / step, rel=1e-9)


def _curve(fixed_s: float, flops_per_s: float) -> ComputeCurve:
    """A compute curve of calls that take exactly fixed_s + flops / flops_per_s, at 32-512 token blocks."""
    points = []
    for tokens in (32, 128, 512):
        flops = 4.0 * 8 * 64 * tokens * tokens
        seconds = fixed_s + flops / flops_per_s
        points.append({"tokens": tokens, "flops": flops, "flops_per_s": flops / seconds, "spread": 0.0})
    return ComputeCurve(concurrency=1, causal=False, forward=points, backward=points)


@pytest.mark.parametrize("fraction", [1e-4, 0.01, 0.25, 0.9])
def test_a_call_smaller_than_every_measured_block_still_pays_its_fixed_cost(fraction: float) -> None:
    """Calls that take 0.4 ms + FLOP / 30 GFLOP/s: one of a fraction of the smallest block's FLOP takes
    0.4 ms + its own FLOP's share, read along the two smallest blocks' times, not the smallest block's
    rate (which would make a call of 1 % of the FLOP take 1 % of the time)."""
    fixed, speed = 4e-4, 3e10
    curve = _curve(fixed, speed)
    flops = fraction * curve.forward[0].flops
    assert flops / curve.rate(flops) == pytest.approx(fixed + flops / speed, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    fixed=st.floats(0.0, 1e-2),
    speed=st.floats(1e9, 1e13),
    fractions=st.lists(st.floats(1e-6, 1.0), min_size=2, max_size=6),
)
def test_below_the_smallest_block_a_larger_call_never_takes_less_time(
    fixed: float, speed: float, fractions: list[float]
) -> None:
    """Up to the smallest measured block, time grows with the FLOP, stays positive and meets the block's."""
    curve = _curve(fixed, speed)
    sizes = sorted(f * curve.forward[0].flops for f in fractions)
    times = [f / curve.rate(f) for f in sizes]
    assert all(t > 0 for t in times)
    assert all(b >= a * (1 - 1e-9) for a, b in zip(times, times[1:]))


def test_a_ring_step_computes_at_what_the_overlap_rounds_measured() -> None:
    """Calibrate times each block's compute twice: on the compute curve, among other blocks, and in the
    overlap rounds, among the KV exchanges a layer runs beside it. A layer's calls take the second: the
    curve's rate slowed by their ratio at the block's FLOP (1 with no overlap rounds)."""
    raw = raw_measurements()
    cal = build_profile(raw, "box", SHAPE).calibration
    curve = cal.curve(2, False)
    for sample in raw["overlap"]:
        block = next(p for p in curve.forward if p.tokens == sample["tokens"])
        ratio = sample["compute"] / (block.flops / block.flops_per_s)
        assert cal.step_factor(block.flops) == pytest.approx(ratio, rel=1e-12)
        assert cal.rate(block.flops, 2, False) == pytest.approx(block.flops_per_s / ratio, rel=1e-12)
    bare = cal.model_copy(update={"overlap_samples": []})
    assert bare.step_factor(1e9) == 1.0
    assert bare.rate(1e9, 2, True, backward=True) == bare.curve(2, True).rate(1e9, backward=True)


@pytest.mark.parametrize("uncertain", [True, False])
def test_validate_table_keeps_every_digit_at_80_columns_in_the_widest_rows(uncertain: bool) -> None:
    """The widest cells validate prints (ring striped, 12 documents, 100,000 tokens per rank, L/L* in the
    thousands, errors past 1000 %): nothing cut to '…' at 80 columns, every digit there."""
    import io

    from rich.console import Console

    from costmodel.cli.render import render_validation

    rows = [
        {
            "variant": variant,
            "layout": layout,
            "causal": True,
            "documents": 12,
            "held_out": held_out,
            "tokens_per_rank": tokens,
            "shard_over_critical": tokens / 16.4,
            "pass": "fwd+bwd",
            "measured_s": 0.0001234,
            "predicted_s": 0.0001313,
            "error": error,
            "datasheet_s": 0.001,
            "datasheet_error": 12.3,
            **({"uncertainty": 1.23} if uncertain else {}),
        }
        for variant, layout in (("ring", "striped"), ("ring", "contiguous"), ("ulysses", "contiguous"))
        for tokens in (131072, 100000)
        for error in (-0.999, 12.345)
        for held_out in (True, False)
    ]
    report = {
        "hw": "my-calibrated-cluster-h100",
        "nproc": 8,
        "critical_shard_tokens": 164.0,
        "rows": rows,
        "passed": True,
        "median_abs_error": 0.05,
        "max_median_error": 0.1,
        "max_abs_error": 0.2,
        "datasheet_median_abs_error": 0.8,
        "datasheet_over_calibrated": 14.6,
    }
    buffer = io.StringIO()
    render_validation(report, Console(file=buffer, width=80, highlight=False))
    lines = buffer.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines) and not any("…" in line for line in lines)
    body = " ".join(line for line in lines if line.startswith(("ring", "Ulysses")))
    for cell in ("100,000", "128k", "6,098", "7,992", "+1234%", "-99.9%", "123 µs", "131 µs", "causal 12d"):
        assert cell in body
    assert ("123%" in body) == uncertain and ("+1230%" in body) != uncertain
