"""Prediction intervals: the split-conformal bounds, their coverage on exchangeable data, the regime a plan's
interval is calibrated on, and the commands that show and gate on them."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.cli.render import interval_text
from costmodel.core.errors import InputError
from costmodel.core.intervals import (
    Calibration,
    Interval,
    LayoutResiduals,
    Residuals,
    interval,
    runs_needed,
)
from costmodel.plans.job import Job
from costmodel.plans.uncertainty import (
    MeasuredResidual,
    calibration,
    chance_at_most,
    dominant_term,
    fit_margin,
    memory_interval,
    order_spread,
    table,
    time_interval,
)


@pytest.mark.parametrize(("level", "runs"), [(0.8, 9), (0.9, 19), (0.95, 39), (0.5, 3)])
def test_runs_needed_is_the_smallest_set_with_a_finite_interval(level: float, runs: int) -> None:
    assert runs_needed(level) == runs
    assert Residuals.of([0.0] * runs).bounds(level) is not None
    assert Residuals.of([0.0] * (runs - 1)).bounds(level) is None


def test_the_bounds_are_the_stated_order_statistics() -> None:
    """19 residuals at 0.9: the floor(20 x 0.05) = 1st and ceil(20 x 0.95) = 19th smallest."""
    values = [i / 100 for i in range(19)]
    assert Residuals.of(values).bounds(0.9) == (0.0, 0.18)
    band = interval(2.0, Calibration("test", Residuals.of(values)), 0.9, "step time")
    assert band.lo == pytest.approx(2.0) and band.hi == pytest.approx(2.0 * math.exp(0.18), rel=1e-12)


def test_the_window_is_the_least_that_reaches_the_level_with_the_odd_rank_cut_below() -> None:
    """16 runs at 0.8: ceil(0.8 x 17) = 14 ranks of window leave 3 out, two below and one above: the 2nd to the
    16th (14 / 17 = 82 %), where equal tails would span all 16 (88 %). The upper side still misses at most
    a / 2 = 1 / 10 (1 / 17 here) for every n."""
    values = [i / 100 for i in range(16)]
    assert Residuals.of(values).bounds(0.8) == (0.01, 0.15)
    for n in range(9, 200):
        bounds = Residuals.of([i / 100 for i in range(n)]).bounds(0.8)
        lo, hi = (round(b * 100) for b in bounds)  # type: ignore[union-attr]  # ranks minus one
        window = hi - lo
        assert window == math.ceil(0.8 * (n + 1) - 1e-9)
        assert (n - hi) / (n + 1) <= 0.1 + 1e-12  # runs above the upper bound: its miss
        assert 0 <= lo - (n - 1 - hi) <= 1  # the lower tail cuts as many ranks, or one more


def test_too_few_runs_give_no_interval_and_say_why() -> None:
    band = interval(1.0, Calibration("r", Residuals.of([0.1, 0.2])), 0.8, "step time")
    assert band.lo is None and band.hi is None and "2 comparable measured step times: 9 needed" in band.note
    assert interval(1.0, None, 0.8, "memory peak").note == "no comparable measured memory peak"


@settings(max_examples=40, deadline=None)
@given(st.integers(9, 60), st.sampled_from([0.8, 0.9]), st.integers(0, 10**6))
def test_coverage_holds_on_exchangeable_residuals(n: int, level: float, seed: int) -> None:
    """Whatever the distribution (a skewed mixture here), a fresh draw falls inside at least at the level, up
    to the sampling error of 400 calibration sets of n with 10 draws each (3.5 standard errors). The coverage
    of one set is Beta-distributed, of variance c(1 - c)/(n + 2) about its mean c >= level, and each set's 10
    draws add c(1 - c)/10: the sets, not the 4,000 draws, set the error."""
    rng = random.Random(seed)

    def draw() -> float:
        return rng.gauss(0.3, 0.05) if rng.random() < 0.3 else rng.expovariate(8.0) - 0.1

    if Residuals.of([0.0] * n).bounds(level) is None:
        return
    sets, draws, inside = 400, 10, 0
    for _ in range(sets):
        lo, hi = Residuals.of([draw() for _ in range(n)]).bounds(level)  # type: ignore[misc]
        inside += sum(lo <= draw() <= hi for _ in range(draws))
    spread = level * (1 - level) * (1 / (n + 2) + 1 / draws)
    assert inside / (sets * draws) >= level - 3.5 * math.sqrt(spread / sets)


def test_a_thinned_set_reads_its_order_statistics() -> None:
    values = [i / 1000 for i in range(1001)]
    kept = Residuals.of(values)
    assert kept.runs == 1001 and len(kept.log_residuals) == 201
    assert kept.order(1) == 0.0 and kept.order(1001) == 1.0 and kept.order(501) == pytest.approx(0.5)
    # ranks floor(1002 x 0.1) = 100 and ceil(1002 x 0.9) = 902 of the 1,001, read between kept ones
    assert kept.bounds(0.8) == pytest.approx((0.099, 0.901), abs=1e-9)


def test_fits_probability_is_a_conformal_lower_bound() -> None:
    held = Residuals.of([0.0, 0.1, 0.2, 0.3])
    assert held.share_at_most(0.15) == pytest.approx(2 / 5)
    assert held.share_at_most(1.0) == pytest.approx(4 / 5)  # never 1: the new run may be the worst


def test_a_plan_is_calibrated_on_its_framework_and_generation_when_they_hold_enough_runs() -> None:
    hopper = calibration("step_time", "megatron", "Hopper", 0.8)
    assert hopper is not None and hopper.regime.startswith("megatron on Hopper")
    # 39 needed at 95 %: megatron's runs on every generation hold them, torchtitan's need every framework's
    wide = calibration("step_time", "megatron", "Hopper", 0.95)
    assert wide is not None and wide.regime.startswith("megatron, every GPU generation")
    wider = calibration("step_time", "torchtitan", "Hopper", 0.95)
    assert wider is not None and wider.regime.startswith("every framework and GPU")
    assert calibration("serving", None, "Hopper", 0.8).regime.startswith("every run")  # type: ignore[union-attr]
    # a time on a GPU generation no run was measured on has no comparable run; a memory peak still does
    assert calibration("step_time", "megatron", "CDNA 3", 0.8) is None
    assert calibration("memory", "megatron", "CDNA 3", 0.8) is not None


def _runs(framework: str, residuals: list[float]) -> list[MeasuredResidual]:
    return [
        MeasuredResidual(id=f"{framework}-{i}", framework=framework, generation="Hopper", residual=r)
        for i, r in enumerate(residuals)
    ]


def test_a_framework_with_too_few_runs_is_bounded_by_them_as_well() -> None:
    """Eight runs of one framework, all far under the prediction, are too few for 80 % (9 needed): every
    framework's runs calibrate it, and the interval spans the eight's range too, which holds a ninth with
    probability 7/9 under exchangeability, so the framework's known error is not hidden by the others'."""
    others = _runs("megatron", [i / 100 - 0.1 for i in range(21)])  # -0.10 ... +0.10
    mine = _runs("deepspeed", [-0.9, -0.8, -0.6, -0.5, -0.4, -0.3, -0.2, -0.05])
    held = calibration("step_time", "deepspeed", "Hopper", 0.8, [*others, *mine])
    assert held is not None and held.regime.startswith(
        "every framework and GPU, each framework alike: 29 step times"
    )
    band = interval(2.0, held, 0.8, "step time")
    pooled = held.residuals.bounds(0.8)
    assert pooled is not None and pooled[0] > -0.9  # the 29 runs' own bound would miss the worst of the eight
    assert band.lo == pytest.approx(2.0 * math.exp(-0.9), rel=1e-12)
    assert band.hi == pytest.approx(2.0 * math.exp(pooled[1]), rel=1e-12)
    assert "range of deepspeed's 8 step times too, which holds another of them 78% of the time" in band.regime
    # with enough runs of its own, a framework is calibrated on them alone
    enough = calibration("step_time", "megatron", "Hopper", 0.8, [*others, *mine])
    assert enough is not None and enough.own is None and enough.regime.startswith("megatron on Hopper: 21")
    # a range inside the wider regime's bounds adds nothing, and the regime does not mention it
    inside = calibration("step_time", "deepspeed", "Hopper", 0.8, [*others, *_runs("deepspeed", [0.0, 0.01])])
    assert inside is not None and interval(1.0, inside, 0.8, "run").regime == inside.regime
    # one run has no range, and a framework no run used has none to add
    for framework, runs in (("deepspeed", [*others, *mine[:1]]), ("nemo", others)):
        alone = calibration("step_time", framework, "Hopper", 0.8, runs)
        assert alone is not None and alone.own is None


@given(
    pooled=st.lists(st.floats(-2, 2), min_size=9, max_size=40),
    own=st.lists(st.floats(-2, 2), min_size=2, max_size=8),
)
def test_own_runs_only_widen_an_interval(pooled: list[float], own: list[float]) -> None:
    wide = interval(1.0, Calibration("x", Residuals.of(pooled), Residuals.of(own), "y"), 0.8, "run")
    narrow = interval(1.0, Calibration("x", Residuals.of(pooled)), 0.8, "run")
    assert wide.lo <= narrow.lo and wide.hi >= narrow.hi  # type: ignore[operator]
    assert all(wide.holds(math.exp(round(r, 5))) for r in own)


def test_a_step_time_is_calibrated_on_runs_led_by_the_same_term() -> None:
    """Runs whose largest term is attention (long sequences) are calibrated apart from those led by the
    multiplies: each regime holds only its own runs. Where the framework on this GPU has too few runs led by
    that term, its runs on this GPU of every kind stand in (priced from the same tables) before its runs led
    by the term on other GPUs, which stand in where the GPU's are too few as well."""
    runs = table().step_time
    by_term = calibration("step_time", "megatron", "Hopper", 0.8, dominant="matmul_s")
    assert by_term is not None and by_term.regime.startswith("megatron on Hopper, led by matrix multiplies: ")
    members = [
        r for r in runs if (r.framework, r.generation, r.dominant) == ("megatron", "Hopper", "matmul_s")
    ]
    assert by_term.residuals.runs == len(members) >= runs_needed(0.8)
    attention = calibration("step_time", "megatron", "Hopper", 0.8, dominant="attention_s")
    hopper = [r for r in runs if (r.framework, r.generation) == ("megatron", "Hopper")]
    assert runs_needed(0.8) > sum(r.dominant == "attention_s" for r in hopper)  # too few led by attention
    assert attention is not None and attention.residuals.runs == len(hopper)
    assert attention.regime.startswith("megatron on Hopper: ")
    # too few on the GPU as well: the framework's runs led by the term on every GPU
    few = [r for r in runs if (r.framework, r.generation) != ("megatron", "Hopper")]
    led = [r for r in few if (r.framework, r.dominant) == ("megatron", "attention_s")]
    wider = calibration("step_time", "megatron", "Hopper", 0.8, few + hopper[:3], dominant="attention_s")
    assert wider is not None and wider.regime.startswith("megatron, every GPU generation, led by attention: ")
    assert wider.residuals.runs == len(led) + sum(r.dominant == "attention_s" for r in hopper[:3])
    # a term no measured run was led by: the framework on its GPU, as before
    other = calibration("step_time", "megatron", "Hopper", 0.8, dominant="exposed_dp_s")
    assert other is not None and other.regime.startswith("megatron on Hopper: ")
    assert dominant_term({"matmul_s": 1.0, "attention_s": 2.0, "exposed_cp_s": 0.5}) == "attention_s"


def test_a_fitted_profile_uses_its_own_residuals() -> None:
    job = Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=16)
    fitted = Residuals.of([-0.05 + i / 100 for i in range(11)])
    profile = job.machine.profile.model_copy(update={"fit_residuals": fitted})
    mine = time_interval(
        Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=16, _profile=profile),
        1.0,
        0.8,
        {"matmul_s": 0.7, "attention_s": 0.3},
    )
    assert mine.regime.startswith("the fitted profile's k-fold residuals: 11")
    assert (mine.lo, mine.hi) == pytest.approx((math.exp(-0.05), math.exp(0.05)))


def _classed(profile, classes: dict[tuple[int, int], list[float]]):
    """``profile`` fitted, as ``audit --fit-profile`` writes it, to runs of the given (tp, pp) residuals."""
    runs = [(tp, pp, r) for (tp, pp), values in classes.items() for r in values]
    return profile.model_copy(
        update={
            "fit_residuals": Residuals.of([r for *_, r in runs]),
            "fit_residuals_by_layout": LayoutResiduals.grouped(runs),
        }
    )


def test_a_fitted_profile_reads_the_runs_of_the_plans_layout_class() -> None:
    """TP 2 runs err by +-1 %, TP 1 runs by +-20 %: a TP 2 plan on one node gets TP 2's width, a TP 1 plan TP
    1's, a pipelined TP 2 plan (a class with no run) and one across nodes (no class the fit saw) the pool's."""
    narrow = [-0.01 + i / 500 for i in range(11)]
    wide = [-0.2 + i / 25 for i in range(11)]
    base = Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=16)
    profile = _classed(base.machine.profile, {(2, 1): narrow, (1, 1): wide})
    pooled = Residuals.of(narrow + wide).bounds(0.8)

    def band(**layout):
        job = Job.of(
            model="llama3-8b", seq=8192, hw="h100-nvlink", global_batch=16, _profile=profile, **layout
        )
        return time_interval(job, 1.0, 0.8, {"matmul_s": 1.0})

    tp2 = band(gpus=8, tp=2)
    assert tp2.regime.startswith("the fitted profile's k-fold residuals of its TP 2, no pipeline runs: 11")
    assert (tp2.lo, tp2.hi) == pytest.approx((math.exp(narrow[0]), math.exp(narrow[-1])))
    tp1 = band(gpus=8, tp=1)
    assert (tp1.lo, tp1.hi) == pytest.approx((math.exp(wide[0]), math.exp(wide[-1])))
    for other in (band(gpus=8, tp=2, pp=2), band(gpus=16, tp=2)):
        assert other.regime == "the fitted profile's k-fold residuals: 22 step times"
        assert (other.lo, other.hi) == pytest.approx(tuple(math.exp(b) for b in pooled))


def test_a_class_too_small_for_the_level_still_bounds_the_pooled_interval() -> None:
    """At 95 % the 11 TP 1 runs are too few (39 needed): the pool of 60 calibrates it, no narrower than the
    class's own range, which holds another of its runs (n - 1) / (n + 1) = 83 % of the time."""
    base = Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=16)
    wide = [-0.5 + i / 10 for i in range(11)]
    profile = _classed(base.machine.profile, {(1, 1): wide, (2, 1): [0.0] * 49})
    job = Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=16, _profile=profile)
    band = time_interval(job, 1.0, 0.95, {"matmul_s": 1.0})
    assert band.regime.startswith("the fitted profile's k-fold residuals: 60 step times; no narrower than")
    assert (band.lo, band.hi) == pytest.approx((math.exp(wide[0]), math.exp(wide[-1])))


def test_step_json_carries_the_intervals(cli) -> None:
    args = ["step", "--model", "llama3-8b", "--seq", "8192", "--hw", "h100-nvlink", "--gpus", "8"]
    data = cli(*args, "--global-batch", "16", "--zero", "3", "-f", "json").json()
    band = data["step"]["time_s_interval"]
    assert band["level"] == 0.8 and band["lo"] <= band["hi"] and band["runs"] >= 9
    memory = data["memory"]["bytes_per_device_interval"]
    assert (
        memory["lo"] <= data["memory"]["bytes_per_device"] * 2 and 0 <= data["memory"]["fits_probability"] < 1
    )
    wider = cli(*args, "--global-batch", "16", "--zero", "3", "--interval-level", "0.95", "-f", "json").json()
    assert wider["step"]["time_s_interval"]["level"] == 0.95
    narrow, wide = memory, wider["memory"]["bytes_per_device_interval"]
    assert wide["runs"] >= runs_needed(0.95) and wide["lo"] <= narrow["lo"] and wide["hi"] >= narrow["hi"]
    assert wider["memory"]["fits_probability"] == data["memory"]["fits_probability"]  # not the level's
    bad = cli(*args, "--global-batch", "16", "--interval-level", "1")
    assert bad.code == 2 and "--interval-level" in bad.err


def test_a_figure_outside_its_own_interval_says_which_way_the_runs_like_it_went(cli) -> None:
    """Llama 3 70B at 128K on A100s reads on Megatron's attention-led runs on Ampere, which measured slower than
    the model says: the 80 % interval lies wholly above the step's figure, and both the JSON (``figure``) and
    the table say so rather than leave the two to read as a contradiction. A figure inside its interval gets
    no such clause."""
    job = ["step", "--model", "llama3-70b", "--seq", "128k", "--gpus", "64", "--tp", "8", "--cp", "8"]
    job += ["--global-batch", "16", "--hw", "a100-ib"]
    step = cli(*job, "-f", "json").json()["step"]
    assert step["time_s"] < step["time_s_interval"]["lo"] and step["time_s_interval"]["figure"] == "below"
    assert "the figure lies below it: runs like this measured more than predicted" in " ".join(
        cli(*job).out.split()
    )
    residuals = Residuals.of([-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert interval(1.0, Calibration("r", residuals), 0.8, "").figure == "inside"
    high = interval(1.0, Calibration("r", Residuals.of([0.1 * k for k in range(1, 10)])), 0.8, "")
    low = interval(1.0, Calibration("r", Residuals.of([-0.1 * k for k in range(1, 10)])), 0.8, "")
    assert (high.figure, low.figure) == ("below", "above") and high.lo > 1.0 > low.hi
    assert interval(1.0, None, 0.8, "step time").figure is None
    band = Interval(lo=1.0, hi=2.0, level=0.8, regime="r", runs=9, figure="inside")
    assert interval_text(band, str) == "1.0-2.0 (r)"
    assert interval_text(band.model_copy(update={"figure": "above"}), str) == (
        "1.0-2.0 (r; the figure lies above it: runs like this measured less than predicted)"
    )


def test_check_gates_on_confidence(cli) -> None:
    """The 8B 128K plan fits at its point estimate (72.5 of 80.7 GB) but only at 68 % by measured peaks."""
    plan = "configs/plans/llama3-8b-128k-a100-nvlink.yaml"
    assert cli("check", plan).code == 0
    gated = cli("check", plan, "--confidence", "0.9", "-f", "json")
    assert gated.code == 1
    failed = [c for c in json.loads(gated.out)["results"] if not c["passed"]]
    assert [c["check"] for c in failed] == ["fits_memory"] and "90% required" in failed[0]["detail"]


def _job_runs(job: str, span: str, residuals: list[float]) -> list[MeasuredResidual]:
    return [
        MeasuredResidual(id=f"{job}-{i}", framework="f", generation="g", job=job, span=span, residual=r)
        for i, r in enumerate(residuals)
    ]


def test_the_order_spread_is_read_on_pairs_of_jobs_of_the_same_span() -> None:
    # one node: pair gaps 0.01 .. 0.05 (5 jobs of two layouts); across: one job of 4 layouts, gaps 0.1 .. 0.5
    runs = [r for k in range(5) for r in _job_runs(f"one{k}", "on one node", [0.0, 0.01 * (k + 1)])]
    runs += _job_runs("wide", "across nodes", [0.0, 0.1, 0.3, 0.5])
    one = order_spread(0.8, "on one node", runs)
    # ceil((5 + 1) * 0.8) = 5th smallest of 0.01..0.05
    assert one.value == pytest.approx(0.05) and one.pairs == 5 and one.regime.endswith("on one node")
    across = order_spread(0.8, "across nodes", runs)
    # 6 gaps 0.1, 0.2, 0.2, 0.3, 0.4, 0.5: ceil(7 * 0.8) = 6th
    assert across.value == pytest.approx(0.5) and across.pairs == 6
    # 95 % needs 19 pairs; neither span nor all 11 hold them
    assert order_spread(0.95, "on one node", runs).value is None
    # too few pairs in one span: every pair is read
    every = order_spread(0.8, "on one node", runs[:4] + runs[10:])
    assert every.pairs == 2 + 6 and every.regime.endswith("or across")


def test_recommend_marks_the_plans_it_cannot_order_and_says_which_rule_picked(cli) -> None:
    args = [
        "recommend",
        "--model",
        "llama3-8b",
        "--seq",
        "128k",
        "--hw",
        "h100-ib",
        "--gpus",
        "32",
        "-f",
        "json",
    ]
    search = cli(*args).json()["search"]
    spread = order_spread(0.8, "across nodes").value  # 32 H100s: four nodes
    assert search["choice"]["order_spread"] == pytest.approx(spread)
    assert search["choice"]["order_spread_from"].endswith("across nodes")
    pick = search["plans"][0]
    for plan in search["plans"][1:]:
        close = abs(math.log(plan["step_time_s"] / pick["step_time_s"])) <= spread
        assert plan["cannot_order_with_pick"] == close
    fastest = min(search["plans"], key=lambda p: p["step_time_s"])
    if fastest is not pick:
        assert pick["fits_probability"] > fastest["fits_probability"] or (
            pick["groups_across_nodes"] < fastest["groups_across_nodes"]
        )
        assert not search["choice"]["rule"].startswith("fastest")


def test_infer_json_carries_its_times_intervals(cli) -> None:
    args = ["infer", "--model", "llama3-8b", "--prompt", "32k", "--hw", "h100-nvlink", "-f", "json"]
    from costmodel.inference.published import ROWS
    from costmodel.machines.profiles import load_profile

    hopper = sum(load_profile(row.setup["hw"]).device.generation == "Hopper" for row in ROWS)
    out = cli(*args).json()["inference"]
    for name in ("ttft", "tpot"):
        band = out[f"{name}_s_interval"]
        assert band["level"] == 0.8 and band["lo"] < band["hi"] and band["runs"] == hopper  # the plan's GPUs
    at_95 = cli(*args, "--interval-level", "0.95").json()["inference"]["ttft_s_interval"]
    narrow = out["ttft_s_interval"]
    assert hopper >= runs_needed(0.95)  # 39 Hopper serving figures: enough for a 95 % interval
    assert at_95["runs"] == hopper and at_95["lo"] <= narrow["lo"] and at_95["hi"] >= narrow["hi"]
    memory = out["memory"]
    parts = ("weight_bytes_per_device", "kv_cache_bytes_per_device", "prefill_activation_bytes")
    assert memory["bytes_per_device"] == pytest.approx(sum(memory[k] for k in parts), rel=1e-12)
    assert memory["bytes_per_device"] + memory["free_bytes"] == pytest.approx(
        memory["usable_bytes"], rel=1e-12
    )
    # no measured serving memory peak is published: the figure says so instead of borrowing a width
    band = memory["bytes_per_device_interval"]
    assert band["lo"] is None and band["hi"] is None and band["runs"] == 0
    assert band["note"] == "no comparable measured serving memory peak"
    assert "memory no interval (no comparable measured serving memory peak)" in cli(*args[:-2]).out.replace(
        "\n", " "
    )


def test_every_searched_serving_layout_carries_its_times_intervals(cli) -> None:
    """One calibration (the generation's serving runs) for every layout: each interval is the same ratio of its
    figure, the pick's is the report's own, and the table says the ratio once."""
    args = ["infer", "--model", "llama3-70b", "--prompt", "256k", "--hw", "h200-nvlink", "--gpus", "16"]
    out = cli(*args, "-f", "json").json()
    layouts = out["search"]["layouts"]
    ratios = {
        (round(row[f"{t}_interval"]["lo"] / row[t], 9), round(row[f"{t}_interval"]["hi"] / row[t], 9))
        for row in layouts
        for t in ("ttft_s", "tpot_s")
    }
    assert len(ratios) == 1 and all(row["ttft_s_interval"]["runs"] >= 9 for row in layouts)
    assert layouts[0]["ttft_s_interval"] == out["inference"]["ttft_s_interval"]
    (low, high), table = ratios.pop(), cli(*args).out
    assert f"80% intervals: each time x{low:.2f} to x{high:.2f}" in " ".join(table.split())


def test_the_html_report_draws_the_memory_interval(cli, tmp_path) -> None:
    page = tmp_path / "r.html"
    assert cli("report", "configs/plans/llama3-8b-128k-a100-nvlink.yaml", "--html", str(page)).code == 0
    text = page.read_text()
    checked = cli("check", "configs/plans/llama3-8b-128k-a100-nvlink.yaml", "--format", "json").json()
    detail = next(r["detail"] for r in checked["results"] if r["check"] == "fits_memory")
    chance = detail.rsplit("fits with probability ", 1)[1]  # the same plan's probability, as check states it
    assert 'data-field="fit.total_bytes_interval"' in text and f"may not fit ({chance} it fits)" in text


POOLED = "fit_residuals:\n  runs: 3\n  log_residuals: [0.0, 0.0, 0.1]\n"
ONE_CLASS = "{tp: 1, pipelined: false, residuals: {runs: 1, log_residuals: [0.0]}}"


@pytest.mark.parametrize(
    ("appended", "said", "field"),
    [
        (
            "fit_residuals:\n  runs: 3\n  log_residuals: [0.3, 0.1, 0.2]\n",
            "log_residuals must be sorted, smallest first",
            "fit_residuals",
        ),
        (
            "fit_residuals:\n  runs: 3\n  log_residuals: [0.1, 0.2, 1e300]\n",
            "less than or equal to 10",
            "fit_residuals",
        ),
        (
            POOLED + f"fit_residuals_by_layout: [{ONE_CLASS}, {ONE_CLASS}]\n",
            "each at most once",
            "fit_residuals_by_layout",
        ),
        (
            POOLED + f"fit_residuals_by_layout: [{ONE_CLASS}]\n",
            "must add up to fit_residuals.runs",
            "fit_residuals_by_layout",
        ),
    ],
)
def test_a_profile_with_bad_residuals_is_one_line(
    cli, tmp_path, appended: str, said: str, field: str
) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(cli("hw", "show", "h100-nvlink").out + appended)
    args = [
        "--model",
        "llama3-8b",
        "--seq",
        "8192",
        "--hw",
        str(profile),
        "--gpus",
        "8",
        "--global-batch",
        "16",
    ]
    result = cli("step", *args)
    assert result.code == 2 and said in result.err and field in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_a_rows_residual_is_measured_over_predicted_time_whatever_its_metric() -> None:
    """A throughput read too high is a step read too short: ln(measured / predicted time) > 0, for every
    rate a published row compares (tokens/s, model TFLOP/s on either count, MFU) as for the step time."""
    from costmodel.calibration.residuals import step_residuals
    from costmodel.training.validation import ROWS, predict

    by_key = {row.key: row for row in ROWS}
    seen = set()
    for run in step_residuals():
        row = by_key[run.id]
        ratio = predict(row) / row.published
        slower = ratio if row.metric != "time_s" else 1 / ratio  # measured time / predicted time
        assert run.residual == pytest.approx(math.log(slower), rel=1e-12, abs=1e-12)
        seen.add(row.metric)
    assert {"time_s", "model_tflops_per_gpu", "tokens_per_s_per_gpu"} <= seen


@given(
    st.lists(st.floats(-2, 2, allow_nan=False), min_size=1, max_size=400),
    st.floats(0.5, 0.99),
)
def test_least_at_is_the_least_log_ratio_whose_share_reaches_it(values: list[float], share: float) -> None:
    """The margin behind `recommend --confidence`: at the residual it returns the share is reached, at every
    smaller kept residual it is not; where even the largest residual cannot reach it, None."""
    held = Residuals.of(values)
    least = held.least_at(share)
    if math.ceil(share * (held.runs + 1) - 1e-9) > held.runs:
        assert least is None
        return
    assert least is not None and held.share_at_most(least) >= share - 1e-12
    assert all(held.share_at_most(r) < share - 1e-12 for r in held.log_residuals if r < least)


def test_the_margin_to_fit_at_a_confidence_is_read_where_the_chance_to_fit_is() -> None:
    """A plan sized exactly to the margin fits with the confidence asked; a hair more memory and it does not
    (the chance moves in steps of one measured peak); 99 % asks more peaks than the job's regime holds."""
    job = Job.of(model="llama3-8b", seq=131072, hw="h100-nvlink", gpus=8, cp=8)
    held = calibration("memory", job.framework.name, job.machine.profile.device.generation, 0.8)
    assert held is not None
    for confidence in (0.5, 0.8, 0.9):
        margin = fit_margin(job, confidence)
        assert margin.factor >= 1 and margin.regime == held.regime
        assert chance_at_most(held, 1.0, margin.factor) >= confidence
        if margin.factor > 1:
            assert chance_at_most(held, 1.0, margin.factor * (1 - 1e-6)) < confidence
    with pytest.raises(InputError, match="can say at most"):
        fit_margin(job, 0.99)


@given(st.lists(st.floats(-2, 2, allow_nan=False), min_size=2, max_size=300), st.integers(1, 5))
def test_groups_of_one_size_pool_as_their_runs_do(values: list[float], groups: int) -> None:
    """Each framework counting alike changes nothing where every framework holds as many runs."""
    size = len(values) // groups
    if size == 0:
        return
    kept = values[: size * groups]
    split = [kept[i * size : (i + 1) * size] for i in range(groups)]
    pooled = Residuals.balanced(split)
    assert pooled.runs == len(kept)
    if len(kept) <= 201:  # thinned past it, where the two thin alike only approximately
        assert pooled.log_residuals == Residuals.of(kept).log_residuals


def test_a_framework_of_few_runs_weighs_as_much_as_one_of_many() -> None:
    """One run at +1 beside 99 at 0: pooled run by run it is an outlier past the 80 % interval; each group
    counting alike it is half the mixture, and the interval reaches it."""
    many, one = [0.0] * 99, [1.0]
    assert Residuals.of(many + one).bounds(0.8) == (0.0, 0.0)
    pooled = Residuals.balanced([many, one])
    assert pooled.runs == 100 and pooled.bounds(0.8) == (0.0, 1.0)
    assert pooled.share_at_most(0.5) == pytest.approx(50 / 101, abs=1 / 101)


@pytest.mark.parametrize(
    "job",
    [
        {"model": "llama3-8b", "seq": 32768, "hw": "h100-nvlink", "gpus": 8, "global_batch": 16},
        {
            "model": "llama3-8b",
            "seq": 8192,
            "hw": "h100-nvlink",
            "gpus": 8,
            "global_batch": 64,
            "recompute": "full",
        },
        {"model": "llama3-8b", "seq": 131072, "hw": "a100-nvlink", "gpus": 16, "cp": 4, "global_batch": 4},
        {
            "model": "llama3-8b",
            "seq": 8192,
            "hw": "h100-nvlink",
            "gpus": 8,
            "global_batch": 8,
            "framework": "torchtitan",
        },
        # a finer regime of 3-5 runs below 80 %: megatron on Blackwell led by multiplies, deepspeed on Hopper
        {"model": "llama3-8b", "seq": 8192, "hw": "b200-nvlink", "gpus": 8, "global_batch": 8},
        {
            "model": "llama3-8b",
            "seq": 8192,
            "hw": "h100-nvlink",
            "gpus": 8,
            "global_batch": 8,
            "framework": "deepspeed",
        },
    ],
)
def test_a_higher_level_never_gives_a_narrower_interval(job: dict) -> None:
    """From 50 % to 98 %, every level's interval holds the last one's, time and memory: where the level outgrows
    a regime's runs and a broader regime calibrates it, the finer one still bounds it at the most it vouches
    for (Megatron on Hopper, led by multiplies: 9.21 s at 85 % on its 16 runs; 9.29 s at 90 % on the 31 of
    every GPU alone); below 80 % the regime is 80 %'s (a finer one of 3-8 runs once put 82 of 780 lower-level
    intervals outside a higher level's)."""
    from costmodel.training.step import evaluate_step

    plan = Job.of(**job)
    step = evaluate_step(plan).step
    breakdown = step.breakdown.model_dump()
    last_time = last_memory = None
    for level in [0.5 + k / 100 for k in range(49)]:
        time = time_interval(plan, step.time_s, level, breakdown)
        memory, _ = memory_interval(plan, 50e9, 80e9, level)
        for now, last in ((time, last_time), (memory, last_memory)):
            if now.known and last is not None and last.known:
                assert now.lo <= last.lo * (1 + 1e-12) and now.hi >= last.hi * (1 - 1e-12), (level, now, last)
        last_time, last_memory = time, memory


def test_held_out_coverage_is_reported_whole_and_by_regime_where_a_regime_holds_enough_runs() -> None:
    """The rows kept aside are each checked once against their regime's interval: the groups partition them,
    the whole part's share is the groups' pooled one, and a regime's own line is printed only from ten runs."""
    from costmodel.calibration.residuals import (
        HELD_OUT_REGIME_RUNS,
        coverage_report,
        holdout_coverage,
        step_residuals,
    )

    groups = holdout_coverage("step_time", 0.8)
    marks = [m for group in groups.values() for m in group]
    assert len(marks) == len(step_residuals("holdout"))
    report = coverage_report((0.8,))
    whole = report["step_time / holdout rows"]["80%"]
    given = [m for m in marks if m is not None]
    assert whole["runs"] == len(marks) and whole["covered"] == pytest.approx(sum(given) / len(given))
    for name, levels in report.items():
        if ", " in name and "/ holdout rows" in name:
            assert levels["80%"]["runs"] >= HELD_OUT_REGIME_RUNS
