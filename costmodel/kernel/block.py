"""Attention of a query block against one key/value block, returning (out, lse), and the merges.

Tensors are (batch, heads, tokens, head_dim), SDPA's layout. K/V may have fewer heads than Q (GQA:
query head i uses KV head i // (heads / kv_heads), as ``enable_gqa``). ``lse`` is the natural log of
the softmax denominator per query, shape (batch, heads, tokens). Accumulators and ``lse`` are fp32
(float64 for float64 inputs: :func:`accumulator_dtype`); "fp32" below means that.

Pieces (:class:`~costmodel.kernel.masks.Piece`) marked ``full`` or ``causal`` run on torch's fused
SDPA op that returns the log-sum-exp (CPU: ``_scaled_dot_product_flash_attention_for_cpu``; CUDA:
flash for fp16/bf16, memory-efficient otherwise). ``masked`` pieces, and shapes the fused op cannot
take, run as explicit fp32 matmuls. Every piece is merged into fp32 accumulators with the (O, LSE)
rule of [A-OnlineNorm]; a row no key is visible to keeps LSE = -inf and O = 0, never NaN.

Backward is recomputation from the *final* out and lse (FlashAttention-2's backward pass): with them, a block's
probabilities exp(s - lse) and the row term D = rowsum(dO ∘ O) are the global ones, so each block's
dQ, dK, dV are exact contributions that simply add up.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import torch

from costmodel.kernel.masks import BlockPlan, Piece

aten = torch.ops.aten
NEG_INF = -math.inf


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32 and the half types ([A-OnlineNorm]: merge in fp32); float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


class MLU(NamedTuple):
    """Unnormalised softmax state of one block for each query ([A-OnlineNorm]): max score, denominator, output."""

    m: torch.Tensor
    l: torch.Tensor  # the symbol of [A-OnlineNorm]
    u: torch.Tensor


class OutLse(NamedTuple):
    """A forward result: ``out`` (b, h, L, d) and ``lse`` (b, h, L), what backward recomputes from."""

    out: torch.Tensor
    lse: torch.Tensor


class Grads(NamedTuple):
    """fp32 gradient accumulators: ``dq`` of the query shard, ``dk`` and ``dv`` of the KV block."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def merge_mlu(a: MLU, b: MLU) -> MLU:
    """Merge two (m, l, u) states: rescale both to m = max(m_A, m_B); O = u / l at the end ([A-OnlineNorm]).

    An empty block has m = -inf, l = 0, u = 0; its scale is taken as 0 rather than exp(-inf - -inf).
    """
    m = torch.maximum(a.m, b.m)
    finite_m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    scale_a, scale_b = torch.exp(a.m - finite_m), torch.exp(b.m - finite_m)
    return MLU(m, scale_a * a.l + scale_b * b.l, scale_a.unsqueeze(-1) * a.u + scale_b.unsqueeze(-1) * b.u)


def merge_lse(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Merge a normalised block (O_B, LSE_B) into fp32 accumulators (O, LSE), in place ([A-OnlineNorm]):
    L = logaddexp(L_A, L_B), O = e^(L_A - L)·O_A + e^(L_B - L)·O_B.

    Rows empty on both sides stay LSE = -inf, O = 0: the weights are taken against a finite stand-in
    for L there, so -inf - -inf never happens.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    finite_lse = new_lse.masked_fill(torch.isneginf(new_lse), 0.0)
    out.mul_(torch.exp(lse - finite_lse).unsqueeze(-1))
    out.add_(torch.exp(block_lse - finite_lse).unsqueeze(-1) * block_out)
    lse.copy_(new_lse)


# --- the fused op --------------------------------------------------------------------------------


def _fused_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    if _cuda_flash_applies(q):
        out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return out, lse
    out, lse, *_ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)
    return out, lse[..., : q.shape[-2]]  # lse rows may be padded to a multiple of 32


def _fused_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, causal, scale=scale
        )
    # Without dropout the flash and efficient backward never read the RNG state, and the
    # cumulative sequence lengths are undefined (None) for dense, non-nested inputs. Pieces are
    # strided views of the shard; the CUDA kernels want dense rows.
    dout, q, k, v, out, lse = (x.contiguous() for x in (dout, q, k, v, out, lse))
    if _cuda_flash_applies(q):
        return aten._scaled_dot_product_flash_attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            None,
            None,
            q.shape[-2],
            k.shape[-2],
            0.0,
            causal,
            None,
            None,
            scale=scale,
        )
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        dout, q, k, v, None, out, lse, None, None, 0.0, [True, True, True, False], causal, scale=scale
    )
    return dq, dk, dv


def _cuda_flash_applies(q: torch.Tensor) -> bool:
    return q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256


class FusedSupport(NamedTuple):
    usable: bool  # the fused op gives exact results for this device, dtype and head_dim
    native_gqa: bool  # ... also when K/V have fewer heads than Q


@functools.cache
def fused_support(device_type: str, dtype: torch.dtype, head_dim: int) -> FusedSupport:
    """Probe once per (device, dtype, head_dim) whether the fused op runs and is exact, against
    :func:`masked_forward` and :func:`masked_backward` on a tiny GQA problem. Keeps untested
    backends (CUDA here) correct by construction: if a probe fails, the fp32 path is used."""
    device = torch.device(device_type)
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, h, 5, head_dim, generator=gen).to(device, dtype) for h in (2, 1, 1, 2))
    scale = head_dim**-0.5
    rtol = 2.0**-6 if dtype in (torch.float16, torch.bfloat16) else 1e-4  # a few units in the last place

    def exact(kk: torch.Tensor, vv: torch.Tensor) -> bool:
        out, lse = _fused_forward(q, kk, vv, True, scale)
        dq, dk, dv = _fused_backward(dout, q, kk, vv, out, lse, True, scale)
        mask = torch.ones(5, 5, dtype=torch.bool, device=device).tril()
        ref_out, ref_lse = masked_forward(q, k, v, mask, scale)
        ref_grads = masked_backward(dout, q, k, v, out, lse, mask, scale)
        got_grads = (dq, reduce_kv_heads(dk, 1), reduce_kv_heads(dv, 1))
        pairs = [(out, ref_out), (lse, ref_lse), *zip(got_grads, ref_grads, strict=True)]
        return all(
            bool(((a.double() - b.double()).abs() <= rtol * (1 + b.double().abs())).all()) for a, b in pairs
        )

    try:
        usable = exact(expand_kv_heads(k, 2), expand_kv_heads(v, 2))
    except (RuntimeError, NotImplementedError):
        usable = False
    if not usable:
        warnings.warn(
            f"fused SDPA op unusable for {device_type} {dtype} head_dim={head_dim}: "
            "using the slower fp32 matmul path",
            RuntimeWarning,
            stacklevel=2,
        )
        return FusedSupport(False, False)
    try:
        return FusedSupport(True, exact(k, v))
    except (RuntimeError, NotImplementedError):
        return FusedSupport(True, False)


def expand_kv_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat KV heads up to the query heads, locally (never on the wire): head i uses KV head i // group."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def reduce_kv_heads(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Sum a gradient over the query heads that share each KV head: the adjoint of :func:`expand_kv_heads`."""
    b, heads, n, d = grad.shape
    return grad if heads == kv_heads else grad.view(b, kv_heads, heads // kv_heads, n, d).sum(2)


# --- the explicit fp32 path ----------------------------------------------------------------------


def masked_forward(q, k, v, mask: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention under a boolean (rows, keys) mask; rows with no visible key give O = 0, LSE = -inf."""
    wide = accumulator_dtype(q.dtype)
    q, k, v = q.to(wide), expand_kv_heads(k, q.shape[1]).to(wide), expand_kv_heads(v, q.shape[1]).to(wide)
    scores = (q @ k.transpose(-1, -2)).mul_(scale).masked_fill_(~mask, NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
    return probs @ v, lse


def masked_backward(dout, q, k, v, out, lse, mask: torch.Tensor, scale: float):
    """fp32 gradients of :func:`masked_forward` given the final out and lse; dK, dV with K/V's heads."""
    kv_heads, wide = k.shape[1], accumulator_dtype(q.dtype)
    k, v = expand_kv_heads(k, q.shape[1]).to(wide), expand_kv_heads(v, q.shape[1]).to(wide)
    q, dout, lse = q.to(wide), dout.to(wide), lse.to(wide)
    scores = (q @ k.transpose(-1, -2)).mul_(scale).masked_fill_(~mask, NEG_INF)
    probs = torch.exp(scores - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
    row_term = (dout * out.to(wide)).sum(-1, keepdim=True)  # D = rowsum(dO ∘ O)
    dscores = probs * (dout @ v.transpose(-1, -2) - row_term)
    dq = (dscores @ k).mul_(scale)
    dk = (dscores.transpose(-1, -2) @ q).mul_(scale)
    dv = probs.transpose(-1, -2) @ dout
    return dq, reduce_kv_heads(dk, kv_heads), reduce_kv_heads(dv, kv_heads)


# --- one block, piece by piece -------------------------------------------------------------------


def _piece_mask(piece: Piece, device: torch.device) -> torch.Tensor:
    if piece.kind == "masked":
        return torch.from_numpy(piece.mask).to(device)
    rows, keys = piece.rows.stop - piece.rows.start, piece.keys.stop - piece.keys.start
    full = torch.ones(rows, keys, dtype=torch.bool, device=device)
    return full.tril() if piece.kind == "causal" else full


def _piece_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, support: FusedSupport):
    if support.native_gqa:
        return k, v
    return expand_kv_heads(k, q.shape[1]), expand_kv_heads(v, q.shape[1])


def block_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: BlockPlan,
    scale: float,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> None:
    """Attend ``q`` to one KV block as ``plan`` says and merge into the fp32 accumulators ``out``, ``lse``."""
    support = fused_support(q.device.type, q.dtype, q.shape[-1])
    for piece in plan.pieces:
        q_p, k_p, v_p = q[:, :, piece.rows], k[:, :, piece.keys], v[:, :, piece.keys]
        if piece.kind == "masked" or not support.usable:
            piece_out, piece_lse = masked_forward(q_p, k_p, v_p, _piece_mask(piece, q.device), scale)
        else:
            k_p, v_p = _piece_kv(q_p, k_p, v_p, support)
            piece_out, piece_lse = _fused_forward(q_p, k_p, v_p, piece.kind == "causal", scale)
        merge_lse(out[:, :, piece.rows], lse[:, :, piece.rows], piece_out, piece_lse)


def block_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    saved: OutLse,
    plan: BlockPlan,
    scale: float,
    grads: Grads,
) -> None:
    """Add this KV block's gradient contributions into the fp32 ``grads``.

    ``saved`` is the final (merged) forward result for ``q``, its ``out`` in ``q``'s dtype.
    """
    support = fused_support(q.device.type, q.dtype, q.shape[-1])
    kv_heads, (out, lse) = k.shape[1], saved
    for piece in plan.pieces:
        rows, keys = piece.rows, piece.keys
        args = (
            dout[:, :, rows],
            q[:, :, rows],
            k[:, :, keys],
            v[:, :, keys],
            out[:, :, rows],
            lse[:, :, rows],
        )
        if piece.kind == "masked" or not support.usable:
            dq_p, dk_p, dv_p = masked_backward(*args, _piece_mask(piece, q.device), scale)
        else:
            dout_p, q_p, k_p, v_p, out_p, lse_p = args
            k_p, v_p = _piece_kv(q_p, k_p, v_p, support)
            dq_p, dk_p, dv_p = _fused_backward(
                dout_p, q_p, k_p, v_p, out_p, lse_p, piece.kind == "causal", scale
            )
            dk_p, dv_p = reduce_kv_heads(dk_p, kv_heads), reduce_kv_heads(dv_p, kv_heads)
        grads.dq[:, :, rows] += dq_p
        grads.dk[:, :, keys] += dk_p
        grads.dv[:, :, keys] += dv_p


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block on its own: (out in q's dtype, lse fp32). What the ring does per step, for timing."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    wide = accumulator_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=wide, device=q.device)
    lse = torch.full(q.shape[:-1], NEG_INF, dtype=wide, device=q.device)
    block_forward(q, k, v, plan, scale, out, lse)
    return out.to(q.dtype), lse


def block_attention_backward(dout, q, k, v, out, lse, plan: BlockPlan, scale: float | None = None):
    """Gradients of :func:`block_attention` (fp32 dq, dk, dv) given its out and lse."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    wide = accumulator_dtype(q.dtype)
    grads = Grads(*(torch.zeros(x.shape, dtype=wide, device=x.device) for x in (q, k, v)))
    block_backward(dout, q, k, v, OutLse(out, lse), plan, scale, grads)
    return grads
