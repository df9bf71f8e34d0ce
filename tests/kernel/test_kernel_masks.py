"""The one mask rule by global position, and block plans that cover it exactly (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.kernel.masks import MaskRule, check_cu_seqlens, plan_block
from costmodel.schedule.layouts import LAYOUTS, chunks_per_rank, positions

pytestmark = pytest.mark.kernel


def test_seed_002_documents_never_see_each_other() -> None:
    """Two sequences of lengths 2 and 3 packed as [0, 2, 5] ([A-OnlineNorm])."""
    tokens = np.arange(5)
    expected = np.array(
        [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=bool
    )
    assert (MaskRule(cu_seqlens=(0, 2, 5)).dense(tokens, tokens) == expected).all()
    assert (MaskRule(causal=True, cu_seqlens=(0, 2, 5)).dense(tokens, tokens) == np.tril(expected)).all()


def test_causal_is_by_global_position_not_local_index() -> None:
    """Striped rank 0 holds 0, 2, 4, 6; rank 1 holds 1, 3, 5, 7. Rank 0's query 2 sees rank 1's key 1."""
    held = positions("striped", 8, 2)
    mask = MaskRule(causal=True).dense(held[0], held[1])
    assert mask.tolist() == [
        [False] * 4,
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
    ]


@pytest.mark.parametrize("bounds", [(0, 2), (1, 5), (0, 3, 3, 5), (0, 4, 2, 5), ()])
def test_bad_document_boundaries_name_the_field(bounds: tuple[int, ...]) -> None:
    with pytest.raises(InputError, match="^--varlen: "):
        check_cu_seqlens(bounds, 5, field="--varlen")


@st.composite
def ring_problems(draw):
    layout = draw(st.sampled_from(LAYOUTS))
    n = draw(st.integers(1, 5))
    seq = n * chunks_per_rank(layout) * draw(st.integers(1, 6))
    cuts = draw(st.sets(st.integers(1, seq - 1), max_size=4)) if seq > 1 else set()
    varlen = draw(st.booleans())
    rule = MaskRule(draw(st.booleans()), tuple(sorted({0, seq, *cuts})) if varlen else None)
    return layout, n, seq, rule, draw(st.sampled_from([0, 2, 32]))


@settings(max_examples=300, deadline=None)
@given(ring_problems())
def test_plans_cover_the_rule_exactly(problem) -> None:
    """For every layout, rank pair, causal/varlen rule and fallback threshold, the pieces of a block plan
    cover exactly the pairs the rule allows, each once; a block is skipped iff no pair is visible."""
    layout, n, seq, rule, max_pieces = problem
    held = positions(layout, seq, n)
    for q_rank in range(n):
        for k_rank in range(n):
            plan = plan_block(rule, held[q_rank], held[k_rank], max_pieces)
            want = rule.dense(held[q_rank], held[k_rank])
            assert (plan.dense(*want.shape) == want).all()
            assert plan.visible_pairs == want.sum()
            assert plan.skip == (not want.any())
            for piece in plan.pieces:
                rows, keys = piece.rows.stop - piece.rows.start, piece.keys.stop - piece.keys.start
                assert rows > 0 and keys > 0
                if piece.kind == "causal":
                    assert rows == keys


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_causal_rings_need_no_masked_fallback(layout: str, n: int) -> None:
    """Without documents every layout's blocks are rectangles and diagonals: the fused op does it all,
    in at most two calls per block, and the useful pairs add up to S(S+1)/2."""
    seq = 16 * n
    held = positions(layout, seq, n)
    rule = MaskRule(causal=True)
    plans = [plan_block(rule, held[i], held[j]) for i in range(n) for j in range(n)]
    assert all(piece.kind != "masked" for plan in plans for piece in plan.pieces)
    assert max(len(plan.pieces) for plan in plans) <= 2
    assert sum(plan.visible_pairs for plan in plans) == seq * (seq + 1) // 2


def test_contiguous_causal_skips_blocks_from_later_ranks() -> None:
    held = positions("contiguous", 32, 4)
    rule = MaskRule(causal=True)
    for i in range(4):
        for j in range(4):
            assert plan_block(rule, held[i], held[j]).skip == (j > i)


def test_zigzag_off_diagonal_blocks_are_half_blocks() -> None:
    """Zigzag pairs an early and a late chunk: off the diagonal a rank sees half of the other block."""
    held = positions("zigzag", 32, 2)
    plan = plan_block(MaskRule(causal=True), held[0], held[1])
    assert plan.visible_pairs == 16 * 16 // 2 and [p.kind for p in plan.pieces] == ["full"]


def test_many_short_documents_fall_back_to_one_masked_piece() -> None:
    tokens = np.arange(64)
    rule = MaskRule(causal=True, cu_seqlens=tuple(range(0, 65, 4)))
    assert len(plan_block(rule, tokens, tokens, max_fused_pieces=64).pieces) == 16
    fallback = plan_block(rule, tokens, tokens, max_fused_pieces=8)
    assert [p.kind for p in fallback.pieces] == ["masked"]
    assert (fallback.dense(64, 64) == rule.dense(tokens, tokens)).all()
