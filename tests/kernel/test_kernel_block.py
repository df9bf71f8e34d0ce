"""Block attention with LSE and the two merges of [A-OnlineNorm], on one process."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.kernel.block import (
    MLU,
    block_attention,
    block_attention_backward,
    masked_backward,
    masked_forward,
    merge_lse,
    merge_mlu,
)
from costmodel.kernel.masks import MaskRule, plan_block
from costmodel.kernel.reference import reference_attention
from costmodel.schedule.layouts import positions

pytestmark = pytest.mark.kernel


def scalar(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


class TestOnlineSoftmaxMerge:
    """A holds score 0 with value 2, B score ln 3 with value 10: the global output is 8, not 12 or 6."""

    def test_mlu_form(self) -> None:
        a = MLU(scalar(0.0), scalar(1.0), scalar(2.0).view(1, 1))
        b = MLU(scalar(math.log(3)), scalar(1.0), scalar(10.0).view(1, 1))
        merged = merge_mlu(a, b)
        assert merged.l.item() == pytest.approx(4 / 3)
        assert merged.u.item() == pytest.approx(32 / 3)
        assert (merged.u / merged.l.unsqueeze(-1)).item() == pytest.approx(8.0)

    def test_lse_form(self) -> None:
        out, lse = scalar(2.0).view(1, 1), scalar(0.0)
        merge_lse(out, lse, scalar(10.0).view(1, 1), scalar(math.log(3)))
        assert lse.item() == pytest.approx(math.log(4))
        assert out.item() == pytest.approx(8.0)

    def test_order_does_not_matter(self) -> None:
        out, lse = scalar(10.0).view(1, 1), scalar(math.log(3))
        merge_lse(out, lse, scalar(2.0).view(1, 1), scalar(0.0))
        assert out.item() == pytest.approx(8.0)


class TestEmptyContributions:
    """A fully masked block is an empty contribution ([A-OnlineNorm]): never -inf - -inf, never NaN."""

    def test_lse_empty_into_empty_stays_empty(self) -> None:
        out, lse = torch.zeros(1, 3), scalar(-math.inf).float()
        merge_lse(out, lse, torch.zeros(1, 3), scalar(-math.inf).float())
        assert torch.isneginf(lse).all() and (out == 0).all()

    def test_lse_empty_leaves_the_other_side(self) -> None:
        out, lse = torch.zeros(1, 2), scalar(-math.inf).float()
        merge_lse(out, lse, torch.tensor([[2.0, 5.0]]), torch.tensor([0.7]))
        merge_lse(out, lse, torch.zeros(1, 2), torch.tensor([-math.inf]))
        assert out.tolist() == [[2.0, 5.0]] and lse.item() == pytest.approx(0.7)

    def test_mlu_empty_is_neutral(self) -> None:
        empty = MLU(scalar(-math.inf), scalar(0.0), scalar(0.0).view(1, 1))
        a = MLU(scalar(0.0), scalar(1.0), scalar(2.0).view(1, 1))
        both_empty = merge_mlu(empty, empty)
        assert both_empty.m.item() == -math.inf and both_empty.l.item() == 0 and both_empty.u.item() == 0
        for merged in (merge_mlu(empty, a), merge_mlu(a, empty)):
            assert (merged.m.item(), merged.l.item(), merged.u.item()) == (0.0, 1.0, 2.0)

    def test_fully_masked_piece_gives_zero_and_minus_inf(self) -> None:
        q, k, v, dout = (torch.randn(1, 2, 4, 8) for _ in range(4))
        mask = torch.zeros(4, 4, dtype=torch.bool)
        out, lse = masked_forward(q, k, v, mask, 0.35)
        assert (out == 0).all() and torch.isneginf(lse).all()
        grads = masked_backward(dout, q, k, v, out, lse, mask, 0.35)
        assert all(torch.isfinite(g).all() and (g == 0).all() for g in grads)

    def test_fully_masked_block_is_skipped(self) -> None:
        plan = plan_block(MaskRule(causal=True), np.arange(0, 8), np.arange(8, 16))
        assert plan.skip and plan.visible_pairs == 0
        q = torch.randn(1, 2, 8, 8)
        out, lse = block_attention(q, q, q, plan)
        assert (out == 0).all() and torch.isneginf(lse).all()


# (layout, N, query rank, key rank): blocks whose mask is a rectangle, a diagonal, a strict lower
# triangle (striped, key rank after query rank), half blocks (zigzag), and the same with documents.
BLOCKS = [
    ("contiguous", 2, 1, 1),
    ("contiguous", 4, 3, 1),
    ("striped", 4, 1, 2),
    ("striped", 4, 2, 1),
    ("zigzag", 2, 0, 1),
    ("zigzag", 4, 2, 0),
    ("zigzag", 4, 1, 1),
]


@pytest.mark.parametrize("layout,n,q_rank,k_rank", BLOCKS)
@pytest.mark.parametrize("varlen", [None, (0, 9, 30, 64)])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "masked"])
def test_block_matches_float64(layout: str, n: int, q_rank: int, k_rank: int, varlen, fused: bool) -> None:
    """Every piece kind, forward and backward, fp32 within 1e-5 of float64 (GQA 4 query / 2 KV heads)."""
    rule = MaskRule(causal=True, cu_seqlens=varlen)
    held = positions(layout, 64, n)
    q_pos, k_pos = held[q_rank], held[k_rank]
    plan = plan_block(rule, q_pos, k_pos, max_fused_pieces=32 if fused else 0)
    kinds = {piece.kind for piece in plan.pieces}
    assert "masked" not in kinds if fused else kinds <= {"full", "masked"}  # full blocks are always fused
    generator = torch.Generator().manual_seed(1)
    q, dout = (torch.randn(2, 4, len(q_pos), 8, generator=generator) for _ in range(2))
    k, v = (torch.randn(2, 2, len(k_pos), 8, generator=generator) for _ in range(2))
    out, lse = block_attention(q, k, v, plan)
    ref_out, ref_lse = reference_attention(q, k, v, rule, q_pos=q_pos, k_pos=k_pos)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)  # -inf rows must match too

    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out = reference_attention(*leaves, rule, q_pos=q_pos, k_pos=k_pos)[0]
    ref_grads = torch.autograd.grad(ref_out, leaves, dout.double())
    grads = block_attention_backward(dout, q, k, v, out, lse, plan)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
