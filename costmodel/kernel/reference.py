"""Naive float64 attention with the same mask rule: what the kernel must equal.

It materialises the (queries × keys) score matrix per head, so it is for tests and the self-test
(S up to a few thousand), not for speed. Differentiable: gradients come from autograd in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from costmodel.kernel.block import expand_kv_heads
from costmodel.kernel.masks import MaskRule


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rule: MaskRule,
    scale: float | None = None,
    q_pos: np.ndarray | None = None,
    k_pos: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64 for q (b, h, Lq, d) and k, v (b, n_kv, Lk, d) at global positions ``q_pos``,
    ``k_pos`` (default: the whole sequence in order). Rows that see no key give out = 0, lse = -inf,
    and zero gradients, like the kernel."""
    q_pos = np.arange(q.shape[2]) if q_pos is None else q_pos
    k_pos = np.arange(k.shape[2]) if k_pos is None else k_pos
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = expand_kv_heads(k, q.shape[1]).double(), expand_kv_heads(v, q.shape[1]).double()
    mask = torch.from_numpy(rule.dense(q_pos, k_pos)).to(q.device)
    seen = mask.any(-1, keepdim=True)
    # Rows that see nothing get finite stand-in scores, so no -inf - -inf reaches autograd either.
    scores = torch.where(seen, (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~mask, -torch.inf), 0.0)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - lse) * seen
    return probs @ v, torch.where(seen, lse, -torch.inf).squeeze(-1)
