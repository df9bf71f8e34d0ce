"""Masks as data and the packed-layout simulator ([A-RingCost §5], [Striped §3]): every mask rule and
layout against the tile rule by definition, and against the tiles the reference kernel's block plans reach."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.kernel.masks import executed_tile_pairs, plan_block
from costmodel.schedule import packed
from costmodel.schedule.layouts import LAYOUTS, positions
from costmodel.schedule.masks import MaskRule
from costmodel.schedule.packed import PACKED_LAYOUTS, Placement, executed_by_definition, simulate_masked
from costmodel.schedule.simulator import simulate

simulate_fresh = simulate_masked.__wrapped__  # no cache between examples


@st.composite
def cases(draw):
    n = draw(st.integers(1, 5))
    layout = draw(st.sampled_from(PACKED_LAYOUTS))
    parts = n * (2 if layout == "zigzag" else 1)
    seq = parts * draw(st.integers(1, 12)) if layout in LAYOUTS else draw(st.integers(n, 50))
    end = seq - draw(st.integers(0, min(3, seq - 1)))
    cuts = draw(st.lists(st.integers(1, max(1, end - 1)), max_size=6, unique=True)) if end > 1 else []
    cu = tuple([0, *sorted(c for c in cuts if c < end), end])
    rule = MaskRule(
        draw(st.booleans()),
        draw(st.sampled_from([cu, None])),
        draw(st.sampled_from([None, 1, 3, 8])),
        draw(st.sampled_from([None, 4, 6])),
    )
    return layout, seq, n, draw(st.integers(1, 9)), rule


@settings(max_examples=150, deadline=None)
@given(cases())
def test_simulator_counts_every_tile_pair_holding_a_visible_pair(case) -> None:
    layout, seq, n, tile, rule = case
    got = simulate_fresh(layout, seq, n, tile, rule).rank_step_pairs
    assert np.array_equal(got, executed_by_definition(layout, seq, n, tile, rule))


@st.composite
def many_short_documents(draw):
    """More ranks than most documents have tokens, and windows or chunks shorter than N: the walks
    over key tiles then cross many hidden stretches."""
    n = draw(st.integers(2, 12))
    layout = draw(st.sampled_from(PACKED_LAYOUTS))
    seq = draw(st.integers(n, 160))
    if layout in LAYOUTS:  # the closed-form simulator takes whole shards
        seq = max(1, seq // (2 * n)) * 2 * n
    end = seq - draw(st.integers(0, min(5, seq - 1)))  # the rest is padding
    lengths = draw(st.lists(st.integers(1, 3 * n), min_size=1, max_size=40))
    cu = tuple(sorted({0, end, *(b for b in np.cumsum(lengths).tolist() if b < end)}))
    rule = MaskRule(
        draw(st.booleans()),
        draw(st.sampled_from([cu, None])),
        draw(st.sampled_from([None, 1, 2, 5, 17])),
        draw(st.sampled_from([None, 3, 16])),
    )
    return layout, seq, n, draw(st.integers(1, 16)), rule


@settings(max_examples=80, deadline=None)
@given(many_short_documents(), st.integers(1, 40))
def test_the_key_tile_walk_counts_every_reached_tile_in_any_column_chunk(case, chunk) -> None:
    """Many short documents over up to 12 ranks, the walks split into column chunks of few key ranks."""
    layout, seq, n, tile, rule = case
    with mock.patch.object(packed, "_CHUNK", chunk):
        got = simulate_fresh(layout, seq, n, tile, rule).rank_step_pairs
    assert np.array_equal(got, executed_by_definition(layout, seq, n, tile, rule))


def owner_by_definition(split: str, length: int, n: int, offset: int) -> int:
    """The rank that holds ``offset`` of a segment: N (contiguous) or 2N (zigzag) near-equal chunks, or
    offset mod N (striped)."""
    if split == "striped":
        return offset % n
    parts = n if split == "contiguous" else 2 * n
    chunk = max(j for j in range(parts) if j * length // parts <= offset)
    return chunk if chunk < n else 2 * n - 1 - chunk


@settings(max_examples=60, deadline=None)
@given(many_short_documents(), st.data())
def test_placement_holds_every_segment_by_its_split_and_counts_below_any_position(case, data) -> None:
    layout, seq, n, _, rule = case
    placement = Placement(layout, seq, n, rule.cu_seqlens)
    expected = [[] for _ in range(n)]
    for start, stop in zip(placement.bounds[:-1], placement.bounds[1:], strict=True):
        for offset in range(stop - start):
            expected[owner_by_definition(placement.split, stop - start, n, offset)].append(start + offset)
    held = placement.rank_positions()
    assert all(np.array_equal(a, b) for a, b in zip(held, expected, strict=True))
    x = np.array(data.draw(st.lists(st.integers(0, seq), min_size=1, max_size=20)))
    rank = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=x.size, max_size=x.size)))
    below = [np.searchsorted(held[k], p) for p, k in zip(x, rank, strict=True)]
    assert np.array_equal(placement.index_below(x, rank), below)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_simulator_equals_the_kernels_executed_tiles(case) -> None:
    """The reference kernel's block plans for every (rank, step) reach exactly the simulator's tiles."""
    layout, seq, n, tile, rule = case
    held = Placement(layout, seq, n, rule.cu_seqlens).rank_positions()
    kernel = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            keys = held[(i - j) % n]
            plan = plan_block(rule, held[i], keys)
            kernel[i, j] = executed_tile_pairs(plan, held[i].size, keys.size, tile)
    assert np.array_equal(simulate_fresh(layout, seq, n, tile, rule).rank_step_pairs, kernel)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_window_level_placement_is_the_layout(layout: str) -> None:
    held = Placement(layout, 96, 4).rank_positions()
    assert all(np.array_equal(a, b) for a, b in zip(held, positions(layout, 96, 4), strict=True))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_document_of_the_window_is_todays_causal_schedule(layout: str) -> None:
    plain = simulate(layout, 1 << 14, 8, 64)
    packed = simulate_fresh(layout, 1 << 14, 8, 64, MaskRule(True, (0, 1 << 14)))
    assert np.array_equal(packed.rank_step_pairs, plain.rank_step_pairs)


def test_documents_shrink_executed_work_but_not_below_useful() -> None:
    """Sixteen documents of 1k in a 16k window: a varlen kernel executes about 1/16 of the causal window."""
    cu = tuple(range(0, (1 << 14) + 1, 1024))
    causal = simulate("zigzag", 1 << 14, 8, 64).rank_step_pairs.sum()
    packed = simulate_fresh("zigzag", 1 << 14, 8, 64, MaskRule(True, cu))
    assert packed.rank_step_pairs.sum() / causal == pytest.approx(1 / 16, rel=0.1)
    assert packed.useful_pairs == 16 * 1024 * 1025 / 2
    assert packed.rank_step_pairs.sum() >= packed.useful_pairs


def test_doc_zigzag_balances_every_document() -> None:
    """Each 2k document split in 2N chunks over all ranks: every rank does the same work at tile 1."""
    cu = tuple(range(0, 8193, 2048))
    pairs = simulate_fresh("doc-zigzag", 8192, 4, 1, MaskRule(True, cu)).rank_step_pairs
    assert np.allclose(pairs.sum(axis=1), pairs.sum() / 4, rtol=0)


def test_a_short_window_leaves_ring_steps_empty() -> None:
    """W = 512 over shards of 2k (contiguous): only the own block and the previous one are ever needed."""
    pairs = simulate_fresh("contiguous", 1 << 14, 8, 128, MaskRule(True, None, 512)).rank_step_pairs
    assert (pairs[:, 2:] == 0).all() and (pairs[:, :2].sum(axis=0) > 0).all()


def test_padding_sees_nothing() -> None:
    rule = MaskRule(True, (0, 100))
    assert rule.useful_pairs(128) == 100 * 101 / 2
    assert not rule.dense(np.arange(100, 128), np.arange(128)).any()
