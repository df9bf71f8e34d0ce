"""The kernel on one process (ring of one), against torch SDPA and its autograd, and against float64.

Tolerances are the self-test's: max|kernel - reference| <= atol + rtol * max|reference| with
(atol, rtol) = (1e-5, 1e-5) in fp32 and (2e-3, 2^-5) in bf16 (four units in the last place).
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from costmodel.kernel.masks import CAUSAL, AttentionOptions, MaskRule
from costmodel.kernel.reference import reference_attention
from costmodel.kernel.ring import local_attention, ring_attention
from costmodel.kernel.selftest import TOLERANCES

pytestmark = pytest.mark.kernel

SHAPES = [  # (heads, kv_heads, head_dim): MHA, GQA 4/2 and 6/1, odd head counts and head dims
    (4, 4, 16),
    (4, 2, 32),
    (6, 1, 8),
    (3, 3, 5),
    (5, 1, 12),
]


def assert_within(got: torch.Tensor, want: torch.Tensor, dtype: str) -> None:
    atol, rtol = TOLERANCES[dtype]
    assert torch.isfinite(got).all()
    error, bound = (got.double() - want.double()).abs().max().item(), atol + rtol * want.abs().max().item()
    assert error <= bound, f"max abs error {error:.3e} > tolerance {bound:.3e}"


def draw(
    heads: int, kv_heads: int, head_dim: int, seq: int = 48, batch: int = 2, dtype=torch.float32, seed=0
):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, h, seq, head_dim, generator=generator).to(dtype)
        for h in (heads, kv_heads, kv_heads, heads)
    ]


def sdpa_with_grads(q, k, v, dout, causal: bool):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return (out, *torch.autograd.grad(out, leaves, dout))


def kernel_with_grads(attention, q, k, v, dout, options: AttentionOptions, **kwargs):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attention(*leaves, options, **kwargs)
    return (out, lse, *torch.autograd.grad(out, leaves, dout))


@pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa_and_its_autograd_fp32(heads: int, kv_heads: int, head_dim: int, causal: bool) -> None:
    q, k, v, dout = draw(heads, kv_heads, head_dim)
    want = sdpa_with_grads(q, k, v, dout, causal)
    out, _lse, *grads = kernel_with_grads(local_attention, q, k, v, dout, AttentionOptions(causal=causal))
    for got, expected in zip((out, *grads), want, strict=True):
        assert_within(got, expected, "float32")


@pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_float64_reference(
    heads: int, kv_heads: int, head_dim: int, causal: bool, dtype: str
) -> None:
    """Against float64 on the same (rounded) inputs; lse too. bf16 gets the looser stated tolerance."""
    q, k, v, dout = draw(heads, kv_heads, head_dim, dtype=getattr(torch, dtype))
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = reference_attention(*leaves, MaskRule(causal))
    want = (ref_out, ref_lse, *torch.autograd.grad(ref_out, leaves, dout.double()))
    got = kernel_with_grads(local_attention, q, k, v, dout, AttentionOptions(causal=causal))
    assert got[0].dtype == got[2].dtype == getattr(torch, dtype)
    for g, w in zip(got, want, strict=True):
        assert_within(g, w, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_equals_sdpa_per_document(causal: bool) -> None:
    """Packed documents [0, 5, 17, 48): each document's rows equal SDPA over that document alone."""
    bounds = (0, 5, 17, 48)
    q, k, v, dout = draw(4, 2, 16)
    got = kernel_with_grads(
        local_attention, q, k, v, dout, AttentionOptions(causal=causal, cu_seqlens=bounds)
    )
    for start, end in itertools.pairwise(bounds):
        doc = [x[:, :, start:end] for x in (q, k, v, dout)]
        want = sdpa_with_grads(*doc, causal)
        assert_within(got[0][:, :, start:end], want[0], "float32")
        for g, w in zip(got[2:], want[1:], strict=True):
            assert_within(g[:, :, start:end], w, "float32")


def test_float64_kernel_is_exact() -> None:
    """In float64 the kernel (fused op and masked fallback) agrees with the reference to rounding."""
    q, k, v, dout = draw(4, 2, 8, dtype=torch.float64)
    rule = MaskRule(True, (0, 7, 9, 48))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = reference_attention(*leaves, rule)
    want = (ref_out, ref_lse, *torch.autograd.grad(ref_out, leaves, dout))
    for max_pieces in (32, 0):
        got = kernel_with_grads(
            local_attention,
            q,
            k,
            v,
            dout,
            AttentionOptions(causal=True, cu_seqlens=rule.cu_seqlens, max_fused_pieces=max_pieces),
        )
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12)


def test_ring_without_process_group_is_one_rank() -> None:
    q, k, v, dout = draw(4, 2, 16)
    a = kernel_with_grads(ring_attention, q, k, v, dout, CAUSAL, layout="zigzag")
    b = kernel_with_grads(local_attention, q, k, v, dout, CAUSAL)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_shape_errors_are_clear() -> None:
    q, k, v, _ = draw(4, 3, 8)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        local_attention(q, k, v)


def test_block_timing_counts_visible_flops() -> None:
    """time_block: forward and backward seconds, and 4·b·h·pairs·d FLOP (half the pairs + diagonal if causal)."""
    from costmodel.kernel.timing import LayerShape, Repeats, time_block

    once = Repeats(repeats=1, warmup=0)
    full = time_block(LayerShape(32, 4, 2, 8, torch.float32), repeats=once)
    causal = time_block(LayerShape(32, 4, 2, 8, torch.bfloat16), causal=True, repeats=once)
    assert full.forward_s > 0 and full.backward_s > 0
    assert full.forward_flops == 4 * 4 * 32 * 32 * 8
    assert causal.forward_flops == 4 * 4 * (32 * 33 // 2) * 8


def test_a_timing_figure_is_the_lower_quartile_and_its_spread_the_iqr_over_the_median() -> None:
    from costmodel.kernel.timing import QUANTILE, summary, typical

    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert QUANTILE == 0.25
    assert typical(samples) == 2.0
    assert typical(samples, 0.5) == 3.0
    assert summary(samples) == (2.0, pytest.approx((4.0 - 2.0) / 3.0, rel=1e-12))
