"""The tile-granular causal schedule simulator ([Striped §3]) against a brute-force count and the article's block counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.schedule.layouts import LAYOUTS, position_at, positions
from costmodel.schedule.simulator import (
    SIMULATION_BUDGET,
    schedule_rows,
    simulate,
    simulate_by_definition,
    simulation_tile,
    utilization,
    visible_pairs,
)


@settings(max_examples=80, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), n=st.integers(1, 6), per=st.integers(1, 12), tile=st.integers(1, 24))
def test_simulator_matches_brute_force(layout: str, n: int, per: int, tile: int) -> None:
    seq = per * n * 2  # divisible by 2N for zigzag
    schedule = simulate(layout, seq, n, tile)
    assert np.array_equal(schedule.rank_step_pairs, simulate_by_definition(layout, seq, n, tile))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_contiguous_tile_1_is_n_over_2n_minus_1(n: int) -> None:
    """[A-RingCost §6]'s fine model: exactly (NL+1)/((2N-1)L+1), which tends to N/(2N-1)."""
    length = 512
    u = simulate("contiguous", n * length, n, 1).utilization
    assert u == pytest.approx((n * length + 1) / ((2 * n - 1) * length + 1), rel=1e-12)
    assert u == pytest.approx(n / (2 * n - 1), abs=1 / length)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16])
def test_zigzag_tile_1_is_perfectly_balanced(n: int) -> None:
    assert simulate("zigzag", 2 * n * 64, n, 1).utilization == 1.0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_tile_equal_to_shard_falls_to_one_half(layout: str, n: int) -> None:
    """Striped Attention's point: with one tile per shard nothing can be skipped."""
    seq = n * 256
    u = simulate(layout, seq, n, seq // n).utilization
    assert u == pytest.approx((seq + 1) / (2 * seq), rel=1e-12)  # useful S(S+1)/2 over N·N·L²


def test_striped_beats_contiguous_at_fine_tiles() -> None:
    u = {layout: simulate(layout, 1 << 16, 8, 64).utilization for layout in LAYOUTS}
    assert u["contiguous"] < 0.55 < 0.95 < u["striped"]
    assert u["zigzag"] > 0.99


def test_non_causal_is_full_every_step() -> None:
    schedule = simulate("contiguous", 4096, 4, 128, causal=False)
    assert (schedule.rank_step_pairs == 1024 * 1024).all()
    assert schedule.utilization == 1.0


def test_one_million_tokens_on_64_devices_is_cheap() -> None:
    """S = 1M, N = 64, tile 128 is evaluated as one vectorised pass (timed in benchmarks/)."""
    schedule = simulate("zigzag", 1 << 20, 64, 128)
    assert schedule.rank_step_pairs.shape == (64, 64)
    assert 0.999 < schedule.utilization <= 1.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_partition_the_sequence(layout: str) -> None:
    pos = positions(layout, 96, 4)
    assert sorted(pos.ravel().tolist()) == list(range(96))
    assert (np.diff(pos, axis=1) > 0).all()


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(["contiguous", "striped", "zigzag"]),
    n=st.sampled_from([1, 2, 3, 4, 8]),
    chunks=st.integers(1, 12),
)
def test_position_at_is_the_layout_without_building_it(layout: str, n: int, chunks: int) -> None:
    seq = 2 * n * chunks
    ranks, index = np.arange(n)[:, None], np.arange(seq // n)[None, :]
    assert (position_at(layout, seq, n, ranks, index) == positions(layout, seq, n)).all()


@settings(max_examples=120, deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    n=st.integers(1, 12),
    per=st.integers(1, 40),
    tile=st.integers(1, 64),
    causal=st.booleans(),
)
def test_schedule_rows_are_the_simulation_entry_for_entry(
    layout: str, n: int, per: int, tile: int, causal: bool
) -> None:
    """The plain-Python schedule of a small ring (no numpy on a plan's path) is simulate's, float for float,
    and so is the utilisation read from it; position_at on ints is the array version's."""
    seq = per * n * 2
    rows = schedule_rows(layout, seq, n, tile, causal)
    assert rows is not None
    assert rows == tuple(map(tuple, simulate(layout, seq, n, tile, causal).rank_step_pairs.tolist()))
    assert utilization(layout, seq, n, tile) == simulate(layout, seq, n, tile).utilization
    index = np.arange(seq // n)[None, :]
    assert [[position_at(layout, seq, n, r, int(i)) for i in index[0]] for r in range(n)] == (
        position_at(layout, seq, n, np.arange(n)[:, None], index).tolist()
    )


@settings(max_examples=120, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), n=st.integers(1, 12), per=st.integers(1, 40), causal=st.booleans())
def test_visible_pairs_are_the_simulation_at_tile_one(layout: str, n: int, per: int, causal: bool) -> None:
    """The pairs each rank's queries see at each step, in closed form (rows of floats and numpy's array alike),
    are the simulator's at tile 1, where no tile holds a masked pair."""
    seq = per * n * 2
    exact = simulate(layout, seq, n, 1, causal).rank_step_pairs
    assert visible_pairs(layout, seq, n, causal, rows=True) == tuple(map(tuple, exact.tolist()))
    assert np.array_equal(visible_pairs(layout, seq, n, causal, rows=False), exact)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_long_shard_sees_half_its_square_at_every_step_but_contiguous(layout: str) -> None:
    """1M tokens over 64 ranks, far past what the simulator holds at tile 1: every pair counted once
    (S(S+1)/2 in all), and zigzag's and striped's steps each within L/2 of L²/2."""
    seq, n = 1 << 20, 64
    length = seq // n
    pairs = visible_pairs(layout, seq, n, rows=False)
    assert pairs.sum() == seq * (seq + 1) // 2
    if layout != "contiguous":
        assert np.abs(pairs - length * length / 2).max() <= length / 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_rank_of_sixteen_billion_tokens_is_counted_in_closed_form(layout: str) -> None:
    """One rank holds the sequence whole: with whole tiles its T(T+1)/2 tile pairs run S(S+t)/2 pairs, so the
    utilisation is (S+1)/(S+t), here without simulating 2^24 tiles."""
    seq, tile = 2**34, 1024
    assert utilization(layout, seq, 1, tile) == pytest.approx((seq + 1) / (seq + tile), rel=1e-15)


def test_schedule_rows_leave_large_or_inexact_schedules_to_numpy() -> None:
    assert schedule_rows("zigzag", 1 << 20, 64, 1024) is None  # 64 x 64 x 16 tiles: numpy's work
    assert schedule_rows("zigzag", 1 << 30, 8, 1 << 26) is None  # S·L past 2^53: sums may round
    assert schedule_rows("zigzag", 262144, 8, 1024) is not None  # the plan command's


def test_simulation_tile_keeps_memory_bounded_and_is_conservative() -> None:
    """1M tokens over 1,024 ranks at tile 1: the tile grows until N² x tiles fits; coarser never raises
    utilisation (fewer masked pairs can be skipped)."""
    tile = simulation_tile(1 << 20, 1024, 1)
    assert 1024 * 1024 * (1024 // tile) <= SIMULATION_BUDGET and tile > 1
    fine, coarse = simulate("zigzag", 1 << 16, 16, 64), simulate("zigzag", 1 << 16, 16, 1024)
    assert coarse.utilization <= fine.utilization
    with pytest.raises(ValueError, match="budget"):
        simulate("zigzag", 1 << 20, 1024, 1)


def test_sixteen_billion_tokens_need_no_array_of_positions() -> None:
    schedule = simulate("zigzag", 1 << 34, 64, simulation_tile(1 << 34, 64, 1024))
    assert 0.5 < schedule.utilization <= 1.0
