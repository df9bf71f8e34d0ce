"""The one mask rule, by global token position, and how a (query block, key block) pair is computed.

Rule ([A-OnlineNorm], "Varlen、causal 与任意 mask 不等价"): a query sees the keys of its own document
(varlen packing, boundaries ``cu_seqlens`` such as ``[0, 2, 5]``) and, when causal, only those at or
before it. Both conditions bound a range of global positions, so each query sees exactly one range
``[first_visible, last_visible]``. Everything else here is derived from :meth:`MaskRule.visible_range`:
the dense mask (reference kernel, masked fallback) and the block plan (which fused calls to make).

A layout only decides which positions a rank holds (:func:`costmodel.schedule.layouts.positions`, increasing
along each rank), so one rule serves contiguous, striped and zigzag alike. Because a rank's key
positions are increasing, the keys a query sees form one run ``[lo, hi)`` of *local* key indices;
:func:`plan_block` cuts the block into rectangles (fused op, no mask) and diagonals (fused op,
``is_causal``), and falls back to one explicitly masked piece only when that would take too many calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from costmodel.core.errors import InputError

PieceKind = Literal["full", "causal", "masked"]

# Beyond this many fused calls per block (many short documents in one block), one masked fp32 call
# over the block's bounding box is cheaper than the per-call overhead.
MAX_FUSED_PIECES = 32


def check_cu_seqlens(
    cu_seqlens: tuple[int, ...] | list[int], seq: int, field: str = "cu_seqlens"
) -> tuple[int, ...]:
    """Validate document boundaries of a packed sequence: starts at 0, strictly increasing, ends at ``seq``."""
    bounds = tuple(int(b) for b in cu_seqlens)
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != seq:
        raise InputError(
            field, f"document boundaries must run from 0 to the sequence length {seq}, got {list(bounds)}"
        )
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise InputError(field, f"document boundaries must be strictly increasing, got {list(bounds)}")
    return bounds


@dataclass(frozen=True)
class MaskRule:
    """Which keys a query may see: causal and/or varlen documents (``cu_seqlens``, global positions)."""

    causal: bool = False
    cu_seqlens: tuple[int, ...] | None = None

    def visible_range(self, q_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and last global key position (inclusive) each query position may see."""
        q_pos = np.asarray(q_pos, dtype=np.int64)
        if self.cu_seqlens is None:
            first = np.zeros_like(q_pos)
            last = np.full_like(q_pos, np.iinfo(np.int64).max)
        else:
            bounds = np.asarray(self.cu_seqlens, dtype=np.int64)
            doc = np.searchsorted(bounds, q_pos, side="right") - 1
            first, last = bounds[doc], bounds[doc + 1] - 1
        if self.causal:
            last = np.minimum(last, q_pos)
        return first, last

    def dense(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """Boolean (queries, keys) mask, True where the query sees the key. For small blocks and tests."""
        first, last = self.visible_range(q_pos)
        k_pos = np.asarray(k_pos, dtype=np.int64)[None, :]
        return (k_pos >= first[:, None]) & (k_pos <= last[:, None])

    def key_runs(self, q_pos: np.ndarray, k_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the run ``[lo, hi)`` of local key indices it sees; ``k_pos`` must be increasing."""
        k_pos = np.asarray(k_pos, dtype=np.int64)
        if k_pos.size > 1 and not np.all(np.diff(k_pos) > 0):
            raise ValueError("key positions must be strictly increasing (a layout's local order)")
        first, last = self.visible_range(q_pos)
        lo = np.searchsorted(k_pos, first, side="left")
        hi = np.maximum(np.searchsorted(k_pos, last, side="right"), lo)
        return lo, hi


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
