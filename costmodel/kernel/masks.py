"""How a (query block, key block) pair is computed under the one mask rule by global token position.

The rule (:class:`costmodel.schedule.masks.MaskRule`, shared with the simulator): a query sees the keys
of its own document (varlen packing, ``cu_seqlens``), when causal only those at or before it, within a
sliding window and an aligned chunk when given. Each query sees exactly one range
``[first_visible, last_visible]`` of global positions. Everything else here is derived from
:meth:`MaskRule.visible_range`:
the dense mask (reference kernel, masked fallback) and the block plan (which fused calls to make).

A layout only decides which positions a rank holds (:func:`costmodel.schedule.layouts.positions`, increasing
along each rank), so one rule serves contiguous, striped and zigzag alike. Because a rank's key
positions are increasing, the keys a query sees form one run ``[lo, hi)`` of *local* key indices;
:func:`plan_block` cuts the block into rectangles (fused op, no mask) and diagonals (fused op,
``is_causal``), and falls back to one explicitly masked piece only when that would take too many calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from costmodel.schedule.masks import MaskRule, check_cu_seqlens

__all__ = [
    "AttentionOptions",
    "CAUSAL",
    "FULL",
    "MaskRule",
    "check_cu_seqlens",
    "BlockPlan",
    "Piece",
    "plan_block",
    "executed_tile_pairs",
]

PieceKind = Literal["full", "causal", "masked"]

# Beyond this many fused calls per block (many short documents in one block), one masked fp32 call
# over the block's bounding box is cheaper than the per-call overhead.
MAX_FUSED_PIECES = 32


@dataclass(frozen=True)
class AttentionOptions:
    """The attention problem every kernel entry point takes, beside its tensors and process group.

    ``causal``, ``cu_seqlens`` (global document boundaries of a packed sequence: varlen), ``window`` (keys
    within W positions) and ``chunk`` (aligned local chunks) make the :class:`MaskRule`; ``scale`` defaults
    to head_dim^-0.5; ``max_fused_pieces`` is where :func:`plan_block` falls back to one masked call.
    """

    causal: bool = False
    cu_seqlens: tuple[int, ...] | list[int] | None = None
    window: int | None = None
    chunk: int | None = None
    scale: float | None = None
    max_fused_pieces: int = MAX_FUSED_PIECES

    def mask_rule(self, seq: int | None = None) -> MaskRule:
        """The rule; ``cu_seqlens`` checked to run from 0 to ``seq`` when the sequence length is known."""
        if self.cu_seqlens is None:
            bounds = None
        elif seq is None:
            bounds = tuple(int(b) for b in self.cu_seqlens)
        else:
            bounds = check_cu_seqlens(self.cu_seqlens, seq)
        return MaskRule(self.causal, bounds, self.window, self.chunk)

    def softmax_scale(self, head_dim: int) -> float:
        return head_dim**-0.5 if self.scale is None else self.scale


FULL = AttentionOptions()  # every key visible, scale head_dim^-0.5: the entry points' default
CAUSAL = AttentionOptions(causal=True)


@dataclass(frozen=True)
class Piece:
    """One call of the block kernel: query rows × key columns, unmasked, causal-diagonal or masked.

    ``causal`` pieces are square with the diagonal on the first key (``is_causal`` of the fused op).
    ``masked`` pieces carry their boolean mask, shape (rows, keys).
    """

    rows: slice
    keys: slice
    kind: PieceKind
    mask: np.ndarray | None = None


@dataclass(frozen=True)
class BlockPlan:
    """How one query block attends to one key block. No pieces: fully masked, skipped, not computed."""

    pieces: tuple[Piece, ...]
    visible_pairs: int

    @property
    def skip(self) -> bool:
        return not self.pieces

    def dense(self, rows: int, keys: int) -> np.ndarray:
        """The mask these pieces cover, for tests: must equal :meth:`MaskRule.dense`."""
        covered = np.zeros((rows, keys), dtype=np.int64)
        for piece in self.pieces:
            n_rows, n_keys = piece.rows.stop - piece.rows.start, piece.keys.stop - piece.keys.start
            if piece.kind == "full":
                part = np.ones((n_rows, n_keys), dtype=bool)
            elif piece.kind == "causal":
                part = np.tri(n_rows, n_keys, dtype=bool)
            else:
                part = piece.mask
            covered[piece.rows, piece.keys] += part
        if covered.max(initial=0) > 1:
            raise AssertionError("pieces overlap")
        return covered.astype(bool)


def plan_block(
    rule: MaskRule, q_pos: np.ndarray, k_pos: np.ndarray, max_fused_pieces: int = MAX_FUSED_PIECES
) -> BlockPlan:
    """Cut the (q_pos × k_pos) block into fused calls; vectorised over rows, a Python loop only over pieces."""
    lo, hi = rule.key_runs(q_pos, k_pos)
    rows, keys = len(lo), len(k_pos)
    visible_pairs = int((hi - lo).sum())
    if visible_pairs == 0:
        return BlockPlan((), 0)
    if visible_pairs == rows * keys:
        return BlockPlan((Piece(slice(0, rows), slice(0, keys), "full"),), visible_pairs)
    pieces = _fused_pieces(lo, hi, max_fused_pieces)
    if pieces is None:
        pieces = (_masked_piece(lo, hi),)
    return BlockPlan(pieces, visible_pairs)


def _fused_pieces(lo: np.ndarray, hi: np.ndarray, max_pieces: int) -> tuple[Piece, ...] | None:
    """Rows split into segments where ``lo`` is fixed and ``hi`` is fixed (a rectangle) or grows by one
    per row (a causal diagonal after a rectangle every row sees). None when that needs too many calls."""
    rows = len(lo)
    d_lo, d_hi = np.diff(lo), np.diff(hi)
    continues = (d_lo == 0) & ((d_hi == 0) | (d_hi == 1))
    # A new segment starts where a row cannot continue the previous one, or where hi switches
    # between staying flat and growing (while the previous step was itself a continuation).
    switches = np.r_[False, (d_hi[1:] != d_hi[:-1]) & continues[:-1]]
    starts = np.r_[0, np.flatnonzero(~continues | switches) + 1]
    if len(starts) > max_pieces:
        return None
    ends = np.r_[starts[1:], rows]
    pieces: list[Piece] = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        key_lo, hi_first, hi_last = int(lo[start]), int(hi[start]), int(hi[end - 1])
        if hi_first == hi_last:  # every row sees the same keys
            if hi_last > key_lo:
                pieces.append(Piece(slice(start, end), slice(key_lo, hi_last), "full"))
            continue
        # hi grows by one per row; rows that still see nothing (hi == lo) come first.
        empty_rows = max(0, key_lo - hi_first + 1)
        start, hi_first = start + empty_rows, hi_first + empty_rows
        diagonal_start = hi_first - 1
        if diagonal_start > key_lo:
            pieces.append(Piece(slice(start, end), slice(key_lo, diagonal_start), "full"))
        pieces.append(Piece(slice(start, end), slice(diagonal_start, diagonal_start + end - start), "causal"))
    return tuple(pieces) if len(pieces) <= max_pieces else None


def _masked_piece(lo: np.ndarray, hi: np.ndarray) -> Piece:
    """One masked piece over the bounding box of the visible pairs."""
    seen = np.flatnonzero(hi > lo)
    row0, row1 = int(seen[0]), int(seen[-1]) + 1
    key0, key1 = int(lo[seen].min()), int(hi[seen].max())
    key_index = np.arange(key0, key1)[None, :]
    mask = (key_index >= lo[row0:row1, None]) & (key_index < hi[row0:row1, None])
    return Piece(slice(row0, row1), slice(key0, key1), "masked", mask)


def executed_tile_pairs(plan: BlockPlan, rows: int, keys: int, tile: int) -> int:
    """(query, key) pairs in the ``tile`` x ``tile`` tiles of a block that its pieces reach with a visible
    pair: what a tiled kernel running this plan executes ("a tile pair costs if any pair in it is
    unmasked"). The simulator's per-rank, per-step counts must equal this."""
    if plan.skip:
        return 0
    covered = plan.dense(rows, keys)
    q_tiles, k_tiles = -(-rows // tile), -(-keys // tile)
    padded = np.zeros((q_tiles * tile, k_tiles * tile), dtype=bool)
    padded[:rows, :keys] = covered
    hit = padded.reshape(q_tiles, tile, k_tiles, tile).any(axis=(1, 3))
    q_sizes = np.minimum(tile, rows - np.arange(q_tiles) * tile)
    k_sizes = np.minimum(tile, keys - np.arange(k_tiles) * tile)
    return int((q_sizes[:, None] * k_sizes[None, :] * hit).sum())
