"""The ring timeline is the time model unfolded: its total is ``predict``'s layer time, rank by rank."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.calibration.fit import build_profile
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.gantt import KINDS, ring_timeline
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import predict, ring_overhead_s
from costmodel.schedule.layouts import LAYOUTS
from tests.test_calibration import SHAPE, raw_measurements

A100 = Machine(
    load_profile("a100-nvlink"), efficiency=1.0
)  # one rate for every block: tile counts set the ratios
MEASURED = Machine(build_profile(raw_measurements(), "box", SHAPE), "fp32")
TIGHT = 1e-12  # the same floating-point operations, summed step by step


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("hw", "n"), [("a100-nvlink", 8), ("a100-nvlink", 1), ("h100-ib", 16), ("h100-ib", 2)]
)
def test_total_is_the_predicted_layer_time(layout: str, causal: bool, hw: str, n: int) -> None:
    profile = Machine(load_profile(hw))
    inputs = PlanInputs(seq=65_536, n=n, causal=causal, layout=layout, hw=hw)
    predicted = predict(inputs, profile, backward=True)
    assert ring_timeline(inputs, profile).total_s == pytest.approx(predicted.forward_s, rel=TIGHT)
    assert ring_timeline(inputs, profile, backward=True).total_s == pytest.approx(
        predicted.backward_s, rel=TIGHT
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 2])
def test_total_on_a_measured_profile_includes_its_fixed_costs(layout: str, n: int) -> None:
    """Overlap 0, per-step and per-layer overheads: the overhead segments carry exactly these."""
    inputs = PlanInputs(
        seq=4096,
        n=n,
        causal=True,
        layout=layout,
        dtype="fp32",
        heads=8,
        kv_heads=8,
        head_dim=64,
        block=256,
        hw="box",
    )
    predicted = predict(inputs, MEASURED, backward=True)
    forward, backward = ring_timeline(inputs, MEASURED), ring_timeline(inputs, MEASURED, backward=True)
    assert forward.total_s == pytest.approx(predicted.forward_s, rel=TIGHT)
    assert backward.total_s == pytest.approx(predicted.backward_s, rel=TIGHT)
    if n > 1:
        assert forward.totals(0)["overhead"] > 0


def test_causal_imbalance_and_balance_at_256k_on_8() -> None:
    """S = 256k, N = 8 causal: contiguous leaves rank 0 idle after its diagonal block; zigzag keeps every
    rank computing."""
    contiguous = ring_timeline(PlanInputs(seq=262_144, n=8, causal=True, layout="contiguous"), A100)
    zigzag = ring_timeline(PlanInputs(seq=262_144, n=8, causal=True, layout="zigzag"), A100)
    last = contiguous.totals(7)
    # the last rank sets every step; each step after the first ends with its merge (overhead)
    assert last["compute"] + last["overhead"] == pytest.approx(contiguous.total_s, rel=TIGHT)
    merges = ring_overhead_s(PlanInputs(seq=262_144, n=8, causal=True, layout="contiguous"), A100)
    assert last["overhead"] == pytest.approx(merges, rel=1e-9)
    # In the pairs its queries see (L = 32,768 a shard): rank 0 its diagonal block's L(L+1)/2, rank 7 those
    # plus 7 full blocks of L² each.
    length = 32_768
    diagonal = length * (length + 1) / 2
    assert contiguous.totals(0)["compute"] / last["compute"] == pytest.approx(
        diagonal / (diagonal + 7 * length**2), rel=1e-9
    )
    for rank in range(8):
        assert (
            zigzag.totals(rank)["idle"] / zigzag.total_s < 1e-4
        )  # every step L·L/2 pairs (L/2 more at the first)
        assert zigzag.totals(rank)["transfer"] == 0.0  # NVLink hides every block


def test_exposed_transfer_shows_on_a_slow_link() -> None:
    """h100-ib at S = 32k, N = 8: each step's KV block takes longer than its compute (ratio > 1)."""
    inputs = PlanInputs(seq=32_768, n=8, causal=True, layout="zigzag", hw="h100-ib")
    timeline = ring_timeline(inputs, Machine(load_profile("h100-ib")))
    exposed = timeline.totals(0)["transfer"]
    predicted = predict(inputs, Machine(load_profile("h100-ib")))
    assert exposed == pytest.approx(predicted.exposed_s, rel=1e-9)  # the model's exposed communication
    assert exposed > 0


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    n=st.sampled_from([1, 2, 3, 4, 8]),
    blocks=st.integers(1, 8),
    causal=st.booleans(),
    backward=st.booleans(),
)
def test_each_rank_row_is_contiguous_and_adds_up(
    layout: str, n: int, blocks: int, causal: bool, backward: bool
) -> None:
    seq = 2 * n * 64 * blocks
    timeline = ring_timeline(PlanInputs(seq=seq, n=n, causal=causal, layout=layout, block=64), A100, backward)
    for rank in range(n):
        segments = timeline.segments(rank)
        assert segments[0].start_s == 0.0
        for before, after in zip(segments, segments[1:]):
            assert after.start_s == pytest.approx(before.end_s, rel=1e-12, abs=1e-15)
        assert sum(timeline.totals(rank).values()) == pytest.approx(timeline.total_s, rel=1e-12)
        assert set(timeline.totals(rank)) == set(KINDS)
    # the slowest rank of each step never idles in it
    slowest = timeline.compute_s.argmax(axis=0)
    for step, rank in enumerate(slowest):
        assert not any(s.kind == "idle" and s.step == step for s in timeline.segments(int(rank)))
