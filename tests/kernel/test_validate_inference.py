"""`cp-plan validate`'s inference rows: a pass-KV and a pass-Q prefill after a cached prefix and a decode
step, predicted by `cp-plan infer`'s formulas on the calibrated machine, held out and kept out of the
verdict. The profile is a real one, measured by `cp-plan calibrate --nproc 2` on a 2-core VM (gloo, fp32)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from costmodel.calibration.compare import calibrated_inputs, calibrated_machine, compare, critical_tokens
from costmodel.inference.kernel_runs import FORMULAS, predict_run
from costmodel.kernel.validate import InferenceCase, grid, inference_grid
from costmodel.machines.profiles import load_profile
from costmodel.plans.timing import predict
from costmodel.symbolic import numeric
from tests.support import REPO

pytestmark = pytest.mark.kernel

PROFILE = REPO / "tests" / "data" / "calibrated" / "cpu-gloo-2ranks.yaml"
N = 2


@pytest.fixture(scope="module")
def profile():  # noqa: ANN201
    return load_profile(str(PROFILE))


def _model_times(profile, slower: float):  # noqa: ANN001, ANN202
    """Training cases timed exactly as predicted, inference runs ``slower`` x their prediction."""
    machine, l_star = calibrated_machine(profile), critical_tokens(profile, N)
    cases = grid(l_star, fitted_tokens=profile.calibration.layer_tokens)
    measured = [
        {
            p: predict(
                calibrated_inputs(profile, N, c.tokens_per_rank, c.causal, c.layout),
                machine,
                c.variant,
                p != "fwd",
            ).total_s
            for p in c.passes
        }
        for c in cases
    ]
    inputs = calibrated_inputs(profile, N, 1)
    served = [
        (
            case,
            {
                "fwd": slower
                * predict_run(inputs, machine, case.scheme, case.new_per_rank, case.cached_per_rank)
            },
        )
        for case in inference_grid(l_star)
    ]
    return cases, measured, served


def test_the_grid_has_a_pass_kv_and_a_pass_q_prefill_and_a_decode_about_l_star(profile) -> None:  # noqa: ANN001
    l_star = critical_tokens(profile, N)
    assert 150 < l_star < 300  # this profile's L*: the training grid's shards are 64, 256 and 1024
    assert inference_grid(l_star) == [
        InferenceCase("pass-kv", 256, 1024),  # L* new tokens per rank after 4 L* cached
        InferenceCase("pass-q", 64, 1024),  # a short follow-up after the same long prefix
        InferenceCase("decode", 1, 1024),  # one token against the sharded cache
        InferenceCase("pass-kv", 64, 256),  # L*/4 new after L* cached
        InferenceCase("pass-q", 256, 1024),  # L* new after 4 L* cached
        InferenceCase("decode", 1, 256),  # one token against L* cached
    ]


def test_inference_rows_are_held_out_finite_and_outside_the_verdict(profile) -> None:  # noqa: ANN001
    cases, measured, served = _model_times(profile, slower=1.25)
    alone = compare(profile, N, cases, measured, 0.10)
    report = compare(profile, N, cases, measured, 0.10, served)
    rows = report["inference_rows"]
    assert [r["scheme"] for r in rows] == ["pass-kv", "pass-q", "decode"] * 2
    for r in rows:
        assert r["held_out"] and r["pass"] == "fwd" and r["formulas"] == list(FORMULAS[r["scheme"]])
        assert math.isfinite(r["predicted_s"]) and r["predicted_s"] > 0
        assert math.isfinite(r["datasheet_s"]) and 0 < r["datasheet_s"] < r["predicted_s"]  # peak, no α
        assert r["uncertainty_s"] > 0
        assert r["error"] == pytest.approx(1 / 1.25 - 1, rel=1e-9)
    assert report["inference_median_abs_error"] == pytest.approx(1 - 1 / 1.25, rel=1e-9)
    # the verdict and the training rows are exactly what they are without the inference runs
    assert report["rows"] == alone["rows"] and report["median_abs_error"] == alone["median_abs_error"] == 0
    assert report["passed"] and alone["inference_rows"] == [] and alone["inference_median_abs_error"] is None
    # this profile was measured before calibrate timed the inference layers: its rows say why they stay out
    assert (
        not report["inference_in_verdict"] and "calibrate again" in report["inference_not_in_verdict_because"]
    )


@pytest.mark.parametrize(("scheme", "formula"), [(s, f) for s, names in FORMULAS.items() for f in names])
def test_each_prediction_is_made_of_the_inference_formulas(profile, monkeypatch, scheme, formula) -> None:  # noqa: ANN001
    """One more second in a formula is one more second in the prediction: the rows read the inference
    group's compiled formulas, not a copy of them."""
    inputs, machine = calibrated_inputs(profile, N, 1), calibrated_machine(profile)
    case = next(c for c in inference_grid(critical_tokens(profile, N)) if c.scheme == scheme)
    shape = (case.scheme, case.new_per_rank, case.cached_per_rank)
    before = predict_run(inputs, machine, *shape)
    original = getattr(numeric, formula)
    monkeypatch.setattr(numeric, formula, lambda **kw: original(**kw) + 1.0)
    assert predict_run(inputs, machine, *shape) - before == pytest.approx(1.0, rel=1e-9)


def test_decode_is_the_attention_over_the_rank_s_cache_plus_the_merge(profile) -> None:  # noqa: ANN001
    """Decode of one token at the calibrated shape (8 heads of 64, fp32): 4·h·d·S_kv FLOP at the
    measured rate of a call that size, then one all-gather of (O, LSE) at the measured α and B (this
    profile has no measured decode fixed cost)."""
    inputs, machine = calibrated_inputs(profile, N, 1), calibrated_machine(profile)
    link = machine.link(N)
    flops = 4 * 8 * 64 * 1024  # one call: the new token against the rank's 1,024 cached keys
    rate = machine.rate(flops, False, False, N, 1, 1024, 64)
    merge = link.latency_s + 8 * (64 * 4 + 4) / link.bandwidth
    want = flops / rate + merge
    assert predict_run(inputs, machine, "decode", 1, 1024) == pytest.approx(want, rel=1e-9)


@pytest.mark.slow  # spawns two processes
def test_the_kernel_times_every_inference_run_on_two_ranks() -> None:
    from costmodel.kernel.launch import run_local
    from costmodel.kernel.validate import measure_cases

    shape = {"dtype": "fp32", "batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 16}
    cases = inference_grid(32, low=8, high=64)
    by_rank = run_local(measure_cases, 2, args=(cases, shape, 3, 1, 0.25, 16), timeout_s=240.0, device="cpu")
    times, sentinel = by_rank[0]["cases"], by_rank[0]["sentinel"]
    assert by_rank[1] is None and len(times) == len(cases) == 6
    assert all(math.isfinite(t["fwd"]) and t["fwd"] > 0 and t["fwd spread"] >= 0 for t in times)
    # calibrate's sentinel, timed again before and after the runs
    assert all(sentinel[when][what] > 0 for when in ("start", "end") for what in ("compute", "exchange"))
