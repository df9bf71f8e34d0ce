"""Masks as data: which keys each query sees, by global token position ([A-RingCost §5], [A-OnlineNorm]).

One rule serves the simulator (:mod:`costmodel.schedule.packed`) and the torch reference kernel
(:mod:`costmodel.kernel.masks` builds its block plans from :meth:`MaskRule.visible_range`), so the two
cannot disagree on what is masked. A query at position q sees the keys of one range
``[first(q), last(q)]``, the intersection of:

- its document (varlen packing, boundaries ``cu_seqlens`` such as ``[0, 2, 5]``; positions at or past
  the last boundary are padding, seen by nothing and seeing nothing);
- causal: keys at or before q;
- a sliding window of W tokens: keys within W positions (q - W < k, and k < q + W when not causal);
- chunked (local) attention: keys in the same aligned chunk of C tokens.

Both ends of the range never decrease as q grows, which is what lets the simulator merge the ranges of
a tile's queries into a few intervals.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.core.errors import InputError

if TYPE_CHECKING:
    import numpy as np


def check_cu_seqlens(
    cu_seqlens: tuple[int, ...] | list[int], seq: int, field: str = "cu_seqlens", padding: bool = False
) -> tuple[int, ...]:
    """Validate document boundaries of a packed sequence: starts at 0, strictly increasing, ends at ``seq``
    (or, with ``padding``, at most ``seq``: the rest of the window is padding)."""
    bounds = tuple(int(b) for b in cu_seqlens)
    ends_right = bounds[-1] <= seq if padding and bounds else bounds[-1:] == (seq,)
    if len(bounds) < 2 or bounds[0] != 0 or not ends_right:
        raise InputError(
            field, f"document boundaries must run from 0 to the sequence length {seq}, got {list(bounds)}"
        )
    if any(b <= a for a, b in itertools.pairwise(bounds)):
        raise InputError(field, f"document boundaries must be strictly increasing, got {list(bounds)}")
    return bounds


@dataclass(frozen=True)
class MaskRule:
    """Which keys a query may see: causal, varlen documents (``cu_seqlens``), a sliding ``window`` of W
    tokens, aligned ``chunk`` s of C tokens; any combination. ``None`` leaves that condition out."""

    causal: bool = False
    cu_seqlens: tuple[int, ...] | None = None
    window: int | None = None
    chunk: int | None = None

    def plain(self, seq: int) -> bool:
        """Nothing but (maybe) causal over one whole sequence of ``seq``: the closed-form simulator's case."""
        return self.window is None and self.chunk is None and self.cu_seqlens in (None, (0, seq))

    def visible_range(self, q_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and last global key position (inclusive) each query position may see; first > last when
        it sees nothing (padding)."""
        import numpy as np

        q_pos = np.asarray(q_pos, dtype=np.int64)
        first = np.zeros_like(q_pos)
        last = np.full_like(q_pos, np.iinfo(np.int64).max // 2)
        if self.cu_seqlens is not None:
            bounds = np.asarray(self.cu_seqlens, dtype=np.int64)
            doc = np.searchsorted(bounds, q_pos, side="right") - 1
            inside = doc < len(bounds) - 1
            doc = np.minimum(doc, len(bounds) - 2)
            first = np.where(inside, bounds[doc], q_pos + 1)
            last = np.where(inside, bounds[doc + 1] - 1, q_pos)
        if self.causal:
            last = np.minimum(last, q_pos)
        if self.window is not None:
            first = np.maximum(first, q_pos - self.window + 1)
            if not self.causal:
                last = np.minimum(last, q_pos + self.window - 1)
        if self.chunk is not None:
            start = q_pos // self.chunk * self.chunk
            first, last = np.maximum(first, start), np.minimum(last, start + self.chunk - 1)
        return first, last

    def dense(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """Boolean (queries, keys) mask, True where the query sees the key. For small blocks and tests."""
        import numpy as np

        first, last = self.visible_range(q_pos)
        k_pos = np.asarray(k_pos, dtype=np.int64)[None, :]
        return (k_pos >= first[:, None]) & (k_pos <= last[:, None])

    def key_runs(self, q_pos: np.ndarray, k_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the run ``[lo, hi)`` of local key indices it sees; ``k_pos`` must be increasing."""
        import numpy as np

        k_pos = np.asarray(k_pos, dtype=np.int64)
        if k_pos.size > 1 and not np.all(np.diff(k_pos) > 0):
            raise ValueError("key positions must be strictly increasing (a layout's local order)")
        first, last = self.visible_range(q_pos)
        lo = np.searchsorted(k_pos, first, side="left")
        hi = np.maximum(np.searchsorted(k_pos, last, side="right"), lo)
        return lo, hi

    def useful_pairs(self, seq: int) -> float:
        """(query, key) pairs the mask leaves visible over a whole sequence of ``seq`` tokens (float64)."""
        return _useful_pairs(self, seq)


# A packed plan's report asks for the same count 14-23 times (each layout, branch and utilisation), and
# each count is a pass over all S positions: count once per distinct (rule, S).
@functools.lru_cache(maxsize=64)
def _useful_pairs(rule: MaskRule, seq: int) -> float:
    import numpy as np

    first, last = rule.visible_range(np.arange(seq, dtype=np.int64))
    return float(np.maximum(np.minimum(last, seq - 1) - first + 1, 0).sum(dtype=np.float64))
