"""The tile-level ring schedule under any mask of :mod:`costmodel.schedule.masks`, for packed layouts.

Layouts as data, generalised: the window of S tokens is cut into *segments* and each segment is split
over the N ranks by one rule (contiguous, striped, zigzag). Window-level layouts have one segment, the
whole window (the layouts of :mod:`costmodel.schedule.layouts`, position for position); per-document
layouts (``doc-zigzag``, ``doc-striped``) have one segment per document, as Megatron's THD path and
ring-flash-attention's varlen functions split every document over all ranks ([ring-flash-attn]).
A rank holds its parts of every segment in order, so its positions increase along its local order.

The tile rule is the simulator's ([Striped §3]): a (query tile, key tile) pair costs s_q·s_k when any
pair of positions in it is visible. Each query sees one range of global key positions whose ends never
decrease (:class:`~costmodel.schedule.masks.MaskRule`); the ranges of a query tile's queries merge into
sorted, disjoint intervals. For every (query tile, key rank) the simulator then walks the key tiles it
reaches: from key index x, the first interval of the query tile ending at or past key x's position
either holds key x (the key tiles of every key from x to the interval's end are reached: count them,
go to the start of the tile after them) or starts past it (the keys up to its start are hidden: go to
the first key at or past it). Each step counts an interval's key tiles or passes to an interval, and the
walks of all (query tile, key rank) pairs advance together as arrays. Work: at most two steps per
interval a walk meets, whatever the tile (one token included), never N x N x tiles x tiles and nothing
per (query, key) pair.
Striped and per-document layouts spread a tile's queries over many documents, so their intervals are
many (about one per document a tile touches) while each rank's key tiles they reach stay few.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, get_args

from costmodel.core.errors import InputError
from costmodel.schedule.layouts import LAYOUTS
from costmodel.schedule.masks import MaskRule
from costmodel.schedule.simulator import Schedule, simulate, simulation_tile

if TYPE_CHECKING:
    import numpy as np

Split = Literal["contiguous", "striped", "zigzag"]
DOC_LAYOUTS: tuple[str, ...] = ("doc-striped", "doc-zigzag")
PackedLayout = Literal["contiguous", "striped", "zigzag", "doc-striped", "doc-zigzag"]
PACKED_LAYOUTS: tuple[str, ...] = get_args(PackedLayout)

MAX_MASKED_TOKENS = 1 << 21  # the query side is per token: 2M tokens simulate in a few seconds, 250 MB
# S x N of a plan (checked with its inputs): the walks are per (query tile, key rank), and a window of one
# token at S = 2M over N = 64 took 30 s; 2M at N = 8 or 256k at N = 64 take a few seconds.
MAX_MASKED_WORK = 1 << 24
MASKED_BUDGET = 1 << 28  # intervals x key ranks of one simulation: bounds the steps of its walks
_CHUNK = 1 << 22  # (query tile, key rank) walks per work array (~32 MB an int64 array)


def split_of(layout: str) -> Split:
    """The rule that splits each segment: ``doc-zigzag`` splits every document as ``zigzag`` does the window."""
    return layout.removeprefix("doc-")  # type: ignore[return-value]


def segments_of(layout: str, seq: int, cu_seqlens: tuple[int, ...] | None) -> np.ndarray:
    """Segment boundaries: the whole window, or every document and the padding after the last one."""
    import numpy as np

    if layout not in PACKED_LAYOUTS:
        raise InputError("layout", f"unknown layout {layout!r}; accepted: {', '.join(PACKED_LAYOUTS)}")
    if layout in LAYOUTS or cu_seqlens is None:
        return np.array([0, seq], dtype=np.int64)
    bounds = list(cu_seqlens) + ([seq] if cu_seqlens[-1] < seq else [])
    return np.asarray(bounds, dtype=np.int64)


def _count_below(split: Split, n: int, length: np.ndarray, off: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """How many of the positions ``rank`` holds in a segment of ``length`` lie before offset ``off``."""
    import numpy as np

    if split == "contiguous":
        start, end = rank * length // n, (rank + 1) * length // n
        return np.clip(off - start, 0, end - start)
    if split == "striped":
        return np.maximum((off - rank + n - 1) // n, 0)
    edge = lambda j: j * length // (2 * n)  # noqa: E731 - zigzag chunk j starts here
    late = 2 * n - 1 - rank
    return np.clip(off - edge(rank), 0, edge(rank + 1) - edge(rank)) + np.clip(
        off - edge(late), 0, edge(late + 1) - edge(late)
    )


class Placement:
    """Where every token of the window lives: segments, per-rank counts, and the inverse map."""

    def __init__(self, layout: str, seq: int, n: int, cu_seqlens: tuple[int, ...] | None = None):
        import numpy as np

        self.split, self.seq, self.n = split_of(layout), seq, n
        self.bounds = segments_of(layout, seq, cu_seqlens)
        lengths = np.diff(self.bounds)
        ranks = np.arange(n, dtype=np.int64)
        counts = _count_below(self.split, n, lengths[:, None], lengths[:, None], ranks[None, :])
        self.before = np.vstack([np.zeros((1, n), dtype=np.int64), np.cumsum(counts, axis=0)])
        self.lengths = self.before[-1]  # L_k: tokens rank k holds (equal for window-level layouts)
        # Per segment and rank, the offsets it holds as runs of (first offset, count) that step by
        # `stride`: contiguous one run, zigzag two (chunks k and 2N - 1 - k), striped one of step N. So
        # counting is clipping rather than dividing, and positions() lays the runs end to end.
        self.stride = n if self.split == "striped" else 1
        if self.split == "striped":
            tables = [(np.broadcast_to(ranks, counts.shape), counts)]
        else:
            chunks = 2 if self.split == "zigzag" else 1
            edge = lambda j: j * lengths[:, None] // (n * chunks)  # noqa: E731
            owned = [ranks[None, :]] + ([2 * n - 1 - ranks[None, :]] if chunks == 2 else [])
            tables = [(edge(j), edge(j + 1) - edge(j)) for j in owned]
        # Stored rank-major (rank, segment), C-contiguous: one flat gather per lookup.
        small = np.int32 if seq < 1 << 31 else np.int64  # counts below S: half the memory traffic
        by_rank = lambda table: np.ascontiguousarray(table.T, dtype=small)  # noqa: E731
        self.runs = [(by_rank(start), by_rank(size)) for start, size in tables]
        self.before_by_rank = by_rank(self.before[:-1])

    def locate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(segment, offset in it) of each global position x (x = S: the end of the last segment)."""
        import numpy as np

        seg = np.clip(np.searchsorted(self.bounds, x, side="right") - 1, 0, len(self.bounds) - 2)
        return seg, x - self.bounds[seg]

    def index_below(self, x: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """How many positions ``rank`` holds below global position ``x`` (elementwise, x = S allowed)."""
        import numpy as np

        seg, off = self.locate(x)
        flat = rank * (len(self.bounds) - 1) + seg
        if self.split == "striped":
            inside = np.maximum((off - rank + self.n - 1) // self.n, 0)
        else:
            off = off.astype(self.before_by_rank.dtype)
            inside = sum(
                np.minimum(np.maximum(off - np.take(start, flat), 0), np.take(size, flat))
                for start, size in self.runs
            )
        return inside + np.take(self.before_by_rank, flat)

    def positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every token's global position in rank-major, local order, and the rank offsets into it."""
        # The runs in local order: by rank, then segment, then run (a rank's chunks increase).
        import numpy as np

        first = np.stack([start + self.bounds[None, :-1] for start, _ in self.runs], axis=-1).ravel()
        count = np.stack([size for _, size in self.runs], axis=-1).ravel().astype(np.int64)
        begin = np.cumsum(count) - count  # where each run starts in the output
        ordered = np.repeat(first - self.stride * begin, count) + self.stride * np.arange(self.seq)
        return ordered, np.r_[0, np.cumsum(self.lengths)]

    def rank_positions(self) -> list[np.ndarray]:
        """Each rank's global positions in its local order (small cases: tests and the kernel)."""
        ordered, starts = self.positions()
        return [ordered[starts[k] : starts[k + 1]] for k in range(self.n)]


def _query_intervals(placement: Placement, ordered: np.ndarray, rule: MaskRule, tile: int):
    """The merged visible intervals of every query tile, in tile order and increasing within a tile:
    (first, last, query rank, tile size, tile id). ``ordered``: :meth:`Placement.positions`."""
    import numpy as np

    n, seq = placement.n, placement.seq
    per_rank = -(-placement.lengths // tile)  # query tiles of each rank, rank-major; the last may be short
    tile_rank = np.repeat(np.arange(n, dtype=np.int64), per_rank)
    in_rank = np.arange(tile_rank.size) - np.repeat(np.cumsum(per_rank) - per_rank, per_rank)
    tile_size = np.minimum(tile, placement.lengths[tile_rank] - in_rank * tile)
    tile_id = np.repeat(np.arange(tile_rank.size, dtype=np.int64), tile_size)
    first, last = rule.visible_range(ordered)
    last = np.minimum(last, seq - 1)
    seen = first <= last
    first, last, tile_id = first[seen], last[seen], tile_id[seen]
    # A new interval where the tile changes or a query's range starts past the previous one's end + 1.
    new = np.r_[True, (tile_id[1:] != tile_id[:-1]) | (first[1:] > last[:-1] + 1)]
    begin = np.flatnonzero(new)
    end = np.r_[begin[1:], first.size] - 1
    q_tile = tile_id[begin]
    return first[begin], last[end], tile_rank[q_tile], tile_size[q_tile], q_tile


def _walk_key_tiles(
    placement: Placement,
    ordered: np.ndarray,
    starts: np.ndarray,
    intervals: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    tile: int,
    ranks: np.ndarray,
) -> np.ndarray:
    """(query tiles, ``ranks``): how many keys of each rank the key tiles each query tile reaches hold.

    ``intervals``: (first, last, query tile id, head), ``head`` each query tile's first interval. Per
    (query tile, key rank), a walk over the rank's key indices x keeps one invariant: every key tile
    holding a visible key below x is counted; so the count is exact when the walk ends, past the rank's
    last key or past the query tile's last interval. A step takes the first interval of the query tile
    that ends at or past key x's position (the last step's interval while it still does, else a binary
    search): the intervals before it end before key x, so no key from x up to its start is visible, and
    x moves to the first key at or past its start. If key x then lies in the interval, it and every key of
    the rank up to the interval's end are visible (a rank's positions increase with x): their key tiles are
    counted and x moves to the start of the tile after them. Otherwise key x lies past the interval, and
    the next step looks further on."""
    import numpy as np

    first, last, q_tile, head = intervals
    lengths, scale = placement.lengths, placement.seq + 1
    sort_key = q_tile * scale + last  # every interval by (query tile, last position): increasing
    tail = np.r_[head[1:], first.size]  # one past each query tile's last interval
    base, end = q_tile[head] * scale, last[tail - 1]
    at = np.r_[ordered, placement.seq]  # key x of rank k lies at at[starts[k] + x], for x <= L_k
    row = np.arange(head.size * ranks.size)  # (query tile, key rank), tile-major: searches go in order
    q, k = row // ranks.size, np.tile(ranks, head.size)
    j = head[q]
    x = placement.index_below(first[j], k).astype(np.int64)
    pos = at[starts[k] + x]
    reached = np.zeros(row.size)
    while True:
        live = (x < lengths[k]) & (pos <= end[q])  # else past the rank's keys or the query tile's reach
        row, q, k, x, j, pos = row[live], q[live], k[live], x[live], j[live], pos[live]
        if not row.size:
            break
        far = pos > last[j]  # else the last step's interval is still the first to reach key x
        j[far] = np.searchsorted(sort_key, base[q[far]] + pos[far])
        jump = first[j] > pos
        x[jump] = placement.index_below(first[j[jump]], k[jump])
        pos[jump] = at[starts[k[jump]] + x[jump]]
        seen = (x < lengths[k]) & (pos <= last[j])
        # Every key of the rank from x up to the interval's end is visible: count their tiles in one step.
        x_seen, k_seen = x[seen], k[seen]
        tile_start = x_seen // tile * tile
        inside_end = placement.index_below(last[j[seen]] + 1, k_seen)  # one past the last key inside
        stop = np.minimum(-(-inside_end // tile) * tile, lengths[k_seen])  # the next key tile's start, or L_k
        reached[row[seen]] += stop - tile_start  # a walk appears once per step: no index repeats
        x[seen] = stop
        pos[seen] = at[starts[k_seen] + stop]
    return reached.reshape(head.size, ranks.size)


@functools.lru_cache(maxsize=32)
def simulate_masked(layout: str, seq: int, n: int, tile: int, rule: MaskRule) -> Schedule:
    """The ring schedule of one layer under ``rule`` in ``layout`` (window-level or per-document).

    ``rank_step_pairs[i, j]``: (query, key) pairs rank i executes at step j, against the KV of rank
    (i - j) mod N, counting every tile pair that holds a visible pair. A plain causal (or full) mask in a
    window-level layout takes the closed-form :func:`~costmodel.schedule.simulator.simulate`."""
    import numpy as np

    if tile < 1:
        raise ValueError("tile must be >= 1")
    if layout in LAYOUTS and rule.plain(seq):
        return simulate(layout, seq, n, simulation_tile(seq, n, tile), rule.causal)
    if seq > MAX_MASKED_TOKENS:
        raise InputError(
            "seq", f"a packed or windowed mask is simulated up to {MAX_MASKED_TOKENS:,} tokens, got {seq:,}"
        )
    placement = Placement(layout, seq, n, rule.cu_seqlens)
    ordered, starts = placement.positions()
    first, last, q_rank, q_size, q_tile = _query_intervals(placement, ordered, rule, tile)
    if first.size * n > MASKED_BUDGET:
        raise InputError(
            "docs",
            f"{first.size:,} query intervals x N = {n} is over the simulator's budget; use a larger --block",
        )
    if first.size == 0:  # nothing but padding
        return Schedule(np.zeros((n, n)), 0.0)
    head = np.flatnonzero(np.r_[True, q_tile[1:] != q_tile[:-1]])
    intervals = (first, last, q_tile, head)
    keys = np.zeros((head.size, n))
    step = max(1, _CHUNK // head.size)
    for k0 in range(0, n, step):
        ranks = np.arange(k0, min(n, k0 + step), dtype=np.int64)
        keys[:, ranks] = _walk_key_tiles(placement, ordered, starts, intervals, tile, ranks)
    # pairs: reached keys x query tile size, summed over each query rank's tiles (sorted by rank)
    present = np.flatnonzero(np.bincount(q_rank[head], minlength=n))
    pairs = np.zeros((n, n))
    pairs[present] = np.add.reduceat(keys * q_size[head, None], np.searchsorted(q_rank[head], present))
    ranks = np.arange(n)
    schedule = pairs[ranks[:, None], (ranks[:, None] - ranks[None, :]) % n]
    schedule.flags.writeable = False
    return Schedule(schedule, rule.useful_pairs(seq))


def executed_by_definition(layout: str, seq: int, n: int, tile: int, rule: MaskRule) -> np.ndarray:
    """``rank_step_pairs`` of :func:`simulate_masked` by the definition, one tile pair at a time (the
    tests' oracle; slow on purpose)."""
    import numpy as np

    held = Placement(layout, seq, n, rule.cu_seqlens).rank_positions()
    out = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            keys = held[(i - j) % n]
            for q0 in range(0, held[i].size, tile):
                q = held[i][q0 : q0 + tile]
                for k0 in range(0, keys.size, tile):
                    k = keys[k0 : k0 + tile]
                    if rule.dense(q, k).any():
                        out[i, j] += q.size * k.size
    return out
