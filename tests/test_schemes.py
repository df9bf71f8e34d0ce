"""One scheme comparison: `cp-plan` and `recommend` show the same ratios and times for the same plan, the
USP row counts all its communication, Ulysses has a verdict, and the pick is the least exposed."""

from __future__ import annotations

import pytest

from costmodel.machines.binding import Machine
from costmodel.machines.compose import ProfileChanges, override
from costmodel.machines.profiles import load_profile
from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import TRAINING_DEFAULTS, PlanInputs, TrainingSetup
from costmodel.plans.job import make_job
from costmodel.plans.schemes import best, compare
from costmodel.training.recommend import recommend

GRID = [  # (hw, seq, gpus, tp, pass)
    ("a100-nvlink", 131_072, 64, 1, "fwd+bwd"),
    ("h100-ib", 131_072, 64, 1, "fwd+bwd"),
    ("h100-nvlink", 262_144, 64, 8, "fwd+bwd"),
    ("a100-nvlink", 65_536, 16, 2, "fwd"),
    ("b200-nvlink", 524_288, 128, 1, "fwd+bwd"),
]


@pytest.mark.parametrize(("hw", "seq", "gpus", "tp", "pass_"), GRID)
def test_recommend_and_the_report_agree_on_every_scheme(
    hw: str, seq: int, gpus: int, tp: int, pass_: str
) -> None:
    """Every usable N of a recommendation, evaluated as a plan of its own, shows the same ratio and exposure."""
    inputs = PlanInputs(seq=seq, n=1, model="llama3-8b", **TRAINING_DEFAULTS | {"pass_": pass_})
    setup = TrainingSetup(gpus=gpus, tp=tp, recompute="full")
    job = make_job(inputs.model_copy(update={"hw": hw}), setup)
    advice = recommend(job, suggest=False)
    for row in advice.candidates:
        if row.n == 1:
            continue
        attention = setup.attention(inputs).model_copy(update={"cp": row.n, "layout": "zigzag"})
        report = evaluate(attention, job.machine.placed(tp))
        shown = {s.label: s for s in report.schemes if s.feasible}
        assert shown[row.best_scheme].comm_ratio == pytest.approx(row.comm_ratio, rel=1e-12)
        assert shown[row.best_scheme].exposed_comm_s == pytest.approx(
            row.exposed_comm_s, rel=1e-12, abs=1e-15
        )
        assert min(s.comm_ratio for s in shown.values()) == pytest.approx(row.lowest_ratio, rel=1e-12)
        least = min(shown.values(), key=lambda s: (s.exposed_comm_s, s.comm_s))
        assert least.exposed_comm_s == pytest.approx(row.exposed_comm_s, rel=1e-12, abs=1e-15)


def test_usp_row_counts_its_all_to_all_and_its_ring() -> None:
    inputs = PlanInputs(seq=262_144, n=8, causal=True, layout="zigzag", pass_="fwd+bwd")
    # at one rate for every kernel, so that the ratio's balanced compute and the time model's agree
    usp = next(
        s
        for s in compare(inputs, Machine(load_profile("a100-nvlink"), "bf16", 1.0))
        if (s.scheme, s.n_ulysses, s.n_ring) == ("usp", 2, 4)
    )
    assert usp.comm_s == pytest.approx(usp.a2a_comm_s + usp.ring_comm_s, rel=1e-12)
    assert usp.a2a_comm_s > 0 and usp.ring_comm_s > 0
    assert usp.ratio == pytest.approx(
        usp.ring_ratio + usp.a2a_comm_s / (usp.time_s - usp.exposed_s), rel=0.05
    )


def test_ulysses_has_a_verdict_and_its_all_to_alls_are_exposed() -> None:
    inputs = PlanInputs(seq=262_144, n=8, causal=True, layout="zigzag", pass_="fwd+bwd")
    ulysses = next(s for s in compare(inputs, Machine(load_profile("a100-nvlink"))) if s.scheme == "ulysses")
    assert ulysses.verdict == "green"
    assert ulysses.exposed_s == pytest.approx(ulysses.comm_s, rel=1e-9)  # nothing hides an all-to-all


def test_a_hidden_ring_beats_an_exposed_all_to_all_with_a_lower_ratio() -> None:
    """H100 over InfiniBand, 128K, N = 2: the ring's ratio is red (18 %) but its transfers hide under its steps;
    Ulysses is amber (10.8 %) and exposes all of it. Bands do not order the choice: the ring is picked."""
    inputs = PlanInputs(seq=131_072, n=2, heads=32, kv_heads=8, **TRAINING_DEFAULTS)
    results = compare(inputs, Machine(load_profile("h100-ib")))
    ring, ulysses = results[0], results[-1]
    assert ring.ratio > 0.15 > ulysses.ratio > 0.05
    assert ring.exposed_s < ulysses.exposed_s
    assert best(results) is ring


def test_the_table_shows_exposed_time_and_the_pass(cli) -> None:
    out = cli("--seq", "256k", "--n", "8", "--causal", "--pass", "fwd+bwd", "--layout", "zigzag").out
    assert "Schemes, fwd+bwd, per device per layer" in out and "exposed" in out


def test_overrides_reach_the_comparison() -> None:
    inputs = PlanInputs(seq=131_072, n=16, **TRAINING_DEFAULTS)
    slow = compare(inputs, Machine(load_profile("a100-nvlink")))[0]
    fast = compare(
        inputs, Machine(override(load_profile("a100-nvlink"), ProfileChanges(inter_bandwidth="800Gb")))
    )[0]
    assert fast.ring_comm_s == pytest.approx(slow.ring_comm_s / 4, rel=1e-9)  # 200 -> 800 Gb/s, no alpha
