"""Packed documents: the length distribution, the packing into windows of S, and the plan's mask.

A distribution is given as lengths (``200k,4kx16,512x40``: ``xK`` repeats), a file (one length per line;
a JSON list of lengths, a JSON object ``{length: count}`` or list of ``[length, count]``; a CSV of
``length,count`` rows), or a seeded synthetic one (``lognormal:mean=4k,sigma=1,count=200,seed=0``;
without ``count`` it draws until one window is full). Documents are packed into windows of S tokens
first-fit in the given order: each goes to the first window with room for it, else opens a new one;
nothing splits a document, so one longer than S is an error. What is left of a window is padding,
masked out. The report describes the window that holds the longest document: it sets the CP degree
([A-RingCost §5], "长尾会把并行度锁死").
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from costmodel.core.errors import InputError
from costmodel.core.fileio import parse_json, read_input_text
from costmodel.core.units import parse_integer, parse_number, parse_tokens
from costmodel.schedule.layouts import LAYOUTS
from costmodel.schedule.masks import MaskRule
from costmodel.schedule.packed import simulate_masked
from costmodel.schedule.simulator import simulate, simulation_tile, visible_pairs
from costmodel.symbolic import numeric

Branch = Literal["dense", "varlen"]
BRANCHES: tuple[Branch, ...] = ("dense", "varlen")
FIELD = "docs"
MAX_DOCS = 1 << 16  # 65,536 documents: packing is a Python loop over them, then a simulation per layout
MAX_WINDOWS = 4096
MAX_FILE_BYTES = 16 << 20
RULE = "first-fit in the given order; a document is never split; the rest of a window is padding"

_REPEAT = re.compile(r"^\s*([^x×*]+?)\s*(?:[x×*]\s*([0-9]+)\s*)?$", re.ASCII)
_SYNTHETIC = re.compile(r"^\s*lognormal\s*:(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class Packed:
    """Documents packed into windows of ``seq`` tokens; ``windows[w]`` lists the lengths in window w."""

    seq: int
    lengths: tuple[int, ...]
    windows: tuple[tuple[int, ...], ...]
    source: str

    @functools.cached_property  # asked per layout and branch: computed once (a frozen dataclass has a __dict__)
    def window(self) -> int:
        """The window the report describes: the one holding the longest document (the first such)."""
        longest = max(self.lengths)
        return next(w for w, docs in enumerate(self.windows) if longest in docs)

    @functools.cached_property
    def cu_seqlens(self) -> tuple[int, ...]:
        """Document boundaries of the described window; the last is below S when the rest is padding."""
        import numpy as np

        return tuple(int(x) for x in np.r_[0, np.cumsum(self.windows[self.window])])

    @property
    def window_docs(self) -> tuple[int, ...]:
        return self.windows[self.window]

    @property
    def longest_other(self) -> int:
        """The longest document of the batch but the longest one (0 when there is only one)."""
        rest = sorted(self.lengths, reverse=True)[1:]
        return rest[0] if rest else 0


def _tokens(text: str) -> int:
    value = parse_tokens(text, FIELD)  # it strips ASCII blanks only: U+2028 and its kind are no blank
    if value < 1:
        raise InputError(FIELD, f"document lengths must be positive, got {text.strip()!r}")
    return value


def _lengths_from_list(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        match = _REPEAT.match(part)
        if not part.strip() or not match:
            raise InputError(FIELD, f"{part.strip()!r} is not a length or LENGTHxCOUNT (e.g. 4kx16)")
        count = int(match.group(2)) if match.group(2) else 1
        if count < 1:
            raise InputError(FIELD, f"{part.strip()!r}: a repeat count must be at least 1")
        if len(out) + count > MAX_DOCS:
            raise InputError(FIELD, f"more than {MAX_DOCS:,} documents")
        out.extend([_tokens(match.group(1))] * count)
    return out


def _histogram(pairs: list[tuple[object, object]], where: str) -> list[int]:
    out: list[int] = []
    for length, count in pairs:
        n = _whole(count, where)
        if n < 1:
            raise InputError(FIELD, f"{where}: counts must be at least 1, got {count!r}")
        if len(out) + n > MAX_DOCS:
            raise InputError(FIELD, f"{where}: more than {MAX_DOCS:,} documents")
        out.extend([_length(length, where)] * n)
    return out


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(FIELD, f"{where}: {value!r} is not a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise InputError(FIELD, f"{where}: {value!r} is not a whole number")
        return int(value)
    try:
        return parse_integer(value, FIELD)  # as a flag reads a count: not 1_0
    except InputError:
        raise InputError(FIELD, f"{where}: {value[:20]!r} is not a whole number") from None


def _length(value: object, where: str) -> int:
    if isinstance(value, str):
        return _tokens(value)
    n = _whole(value, where)
    if n < 1:
        raise InputError(FIELD, f"{where}: document lengths must be positive, got {value!r}")
    return n


def _lengths_from_file(path: Path) -> list[int]:

    where = path.name
    text = read_input_text(path, FIELD, "docs")
    stripped = text.strip()
    if not stripped:
        raise InputError(FIELD, f"{where} holds no document lengths")
    if stripped[0] in "[{":
        data = parse_json(stripped, FIELD, where, "docs")
        if isinstance(data, dict):
            return _histogram(list(data.items()), where)
        if isinstance(data, list) and all(isinstance(x, list) and len(x) == 2 for x in data) and data:
            return _histogram([tuple(x) for x in data], where)
        if isinstance(data, list) and data:
            _at_most(len(data), where)
            return [_length(x, where) for x in data]
        raise InputError(FIELD, f"{where}: expected a list of lengths or a {{length: count}} histogram")
    try:
        rows = [row for row in csv.reader(io.StringIO(stripped)) if row and any(c.strip() for c in row)]
    except csv.Error as exc:  # a field past csv's 131,072 characters, a NUL byte
        raise InputError(FIELD, f"{where}: not a readable CSV file: {exc}") from None
    if all(len(row) == 1 for row in rows):
        _at_most(len(rows), where)
        return [_length(row[0], where) for row in rows]
    if rows and not rows[0][0].strip()[:1].isdigit():
        rows = rows[1:]  # a header such as length,count
    if any(len(row) != 2 for row in rows):
        raise InputError(FIELD, f"{where}: CSV rows must be length,count")
    return _histogram([(row[0], row[1]) for row in rows], where)


def _at_most(count: int, where: str) -> None:
    if count > MAX_DOCS:
        raise InputError(FIELD, f"{where}: {count:,} documents; at most {MAX_DOCS:,} are packed")


def _synthetic(params: str, seq: int) -> tuple[list[int], str]:
    import numpy as np

    given: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in params.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in {"mean", "sigma", "count", "seed"}:
            raise InputError(FIELD, f"lognormal takes mean=, sigma=, count=, seed=; got {part!r}")
        if key.strip() in given:
            raise InputError(
                FIELD,
                f"lognormal: {key.strip()}= given twice; give each of mean=, sigma=, count=, seed= once",
            )
        given[key.strip()] = value.strip()
    if "mean" not in given:
        raise InputError(FIELD, "lognormal needs mean= (e.g. lognormal:mean=4k,sigma=1,seed=0)")
    mean = _tokens(given["mean"])
    if mean > seq:  # every draw would be cut to the window: no distribution of documents is left
        raise InputError(
            FIELD, f"lognormal: mean={mean:,} is longer than the window S = {seq:,}; accepted: at most S"
        )
    try:
        sigma = parse_number(given.get("sigma", "1"), FIELD)
    except InputError:
        raise InputError(FIELD, f"sigma={given['sigma'][:20]!r} is not a number") from None
    if not (math.isfinite(sigma) and 0 <= sigma <= 4):
        raise InputError(FIELD, f"sigma must be in [0, 4], got {sigma}")
    seed = _whole(given.get("seed", "0"), "lognormal")
    if not 0 <= seed < 2**64:  # numpy's generator takes a 64-bit unsigned word
        raise InputError(FIELD, f"lognormal: seed={given['seed']} must be a whole number from 0 to 2^64 - 1")
    rng = np.random.default_rng(seed)
    mu = math.log(mean) - sigma**2 / 2  # so the distribution's mean is `mean`
    if "count" in given:
        count = _whole(given["count"], "lognormal")
        if not 1 <= count <= MAX_DOCS:
            raise InputError(FIELD, f"count must be in [1, {MAX_DOCS:,}], got {count}")
        lengths = np.maximum(1, np.rint(rng.lognormal(mu, sigma, count))).astype(np.int64)
        lengths = np.minimum(lengths, seq)  # a draw past S is cut to one window
    else:  # fill one window: draw until S is reached, the last document cut to fit
        draws = np.maximum(1, np.rint(rng.lognormal(mu, sigma, min(MAX_DOCS, 4 * seq // mean + 16))))
        ends = np.cumsum(np.minimum(draws, seq).astype(np.int64))
        keep = int(np.searchsorted(ends, seq, side="left")) + 1
        lengths = np.diff(np.r_[0, np.minimum(ends[:keep], seq)])
        lengths = lengths[lengths > 0]
    label = f"lognormal mean {mean:,}, sigma {sigma:g}, seed {seed}, {lengths.size:,} documents"
    return [int(x) for x in lengths], label


def first_fit(lengths: list[int], seq: int) -> tuple[tuple[int, ...], ...]:
    """Pack in order: each document into the first window with room, else a new window."""
    import numpy as np

    room = np.empty(0, dtype=np.int64)
    windows: list[list[int]] = []
    for length in lengths:
        if length > seq:
            raise InputError(FIELD, f"a document of {length:,} tokens is longer than the window S = {seq:,}")
        fits = np.flatnonzero(room >= length)
        if fits.size:
            windows[int(fits[0])].append(length)
            room[fits[0]] -= length
            continue
        if len(windows) == MAX_WINDOWS:
            raise InputError(FIELD, f"the documents fill more than {MAX_WINDOWS:,} windows of S = {seq:,}")
        windows.append([length])
        room = np.append(room, seq - length)
    return tuple(tuple(w) for w in windows)


def _is_file(spec: str) -> bool:
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):  # a long list of lengths is no path the OS can even look up
        return False


@functools.lru_cache(maxsize=16)
def pack(spec: str, seq: int) -> Packed:
    """Parse ``spec`` and pack it into windows of ``seq`` tokens; any problem is one InputError on --docs."""
    synthetic = _SYNTHETIC.match(spec)
    if synthetic:
        lengths, source = _synthetic(synthetic.group(1), seq)
    elif _is_file(spec):
        lengths, source = _lengths_from_file(Path(spec)), f"file {Path(spec).name}"
    elif re.fullmatch(r"[\s0-9.kKmMgGx×*,]+", spec):
        lengths, source = _lengths_from_list(spec), "list"
    else:
        raise InputError(
            FIELD,
            f"{spec[:60]!r} is neither lengths (200k,4kx16), a readable file, nor lognormal:mean=...,sigma=...",
        )
    if not lengths:
        raise InputError(FIELD, "no documents")
    return Packed(seq, tuple(lengths), first_fit(lengths, seq), source)


def plan_rule(
    causal: bool, packed: Packed | None, window: int | None, chunk: int | None, branch: Branch
) -> MaskRule:
    """The mask a branch's kernel executes: varlen honours the documents, dense only blanks their scores
    (so it executes the causal window's tiles); windows and chunks are native to both."""
    documents = packed.cu_seqlens if packed is not None and branch == "varlen" else None
    return MaskRule(causal, documents, window, chunk)


def useful_rule(causal: bool, packed: Packed | None, window: int | None, chunk: int | None) -> MaskRule:
    """The mask of the work that matters: documents, padding, window and chunk all applied."""
    return plan_rule(causal, packed, window, chunk, "varlen")


def packed_of(inputs) -> Packed | None:  # noqa: ANN001 - PlanInputs, which imports this module
    return pack(inputs.docs, inputs.seq) if inputs.docs is not None else None


def call_tokens(inputs) -> float | None:  # noqa: ANN001
    """L_call of a varlen plan with documents: the piece one kernel call computes; None otherwise (dense
    blocks, windows and chunks run whole blocks)."""
    import numpy as np

    packed = packed_of(inputs)
    if packed is None or inputs.packing != "varlen":
        return None

    lengths = np.asarray(packed.window_docs, dtype=np.float64)
    weighted = float((lengths**3).sum() / (lengths**2).sum())
    return float(numeric.packed_call_tokens(l_w=weighted, S=inputs.seq, N=inputs.cp))


def schedule_for(inputs, layout: str, branch: Branch, n: int | None = None):  # noqa: ANN001, ANN201
    """The ring schedule of one layer in ``layout`` under the branch's mask, at the simulator's tile."""

    n = inputs.cp if n is None else n
    rule = plan_rule(inputs.causal, packed_of(inputs), inputs.window, inputs.attention_chunk, branch)
    return simulate_masked(layout, inputs.seq, n, simulation_tile(inputs.seq, n, inputs.block), rule)


def timed_pairs(inputs, layout: str, branch: Branch):  # noqa: ANN001, ANN201
    """The (ranks, steps) pairs a packed plan's kernel calls are timed on: under a branch whose mask is the
    plain causal window (the dense branch without a window or chunk, or one document), the pairs each rank
    sees, as the unpacked plan counts them and the kernel tables' rates are counted; else the tiles the
    branch's kernel runs at the simulator's tile."""

    rule = plan_rule(inputs.causal, packed_of(inputs), inputs.window, inputs.attention_chunk, branch)
    if layout in LAYOUTS and rule.plain(inputs.seq):
        return visible_pairs(layout, inputs.seq, inputs.cp, inputs.causal, rows=False)
    return schedule_for(inputs, layout, branch).rank_step_pairs


def compute_fraction(inputs, n: int | None = None, branch: Branch | None = None) -> float:  # noqa: ANN001
    """c of the plan: the plain c, or c_x = c·E_m/E_w with the tiles the branch executes in the plan's layout."""

    c = 0.5 if inputs.causal else 1.0
    if not inputs.masked:
        return c
    n = inputs.cp if n is None else n
    tile = simulation_tile(inputs.seq, n, inputs.block)
    window = simulate(inputs.layout, inputs.seq, n, tile, inputs.causal).rank_step_pairs.sum()
    executed = schedule_for(inputs, inputs.layout, branch or inputs.packing, n).rank_step_pairs.sum()
    return float(numeric.packed_compute_fraction(c=c, E_m=float(executed), E_w=float(window)))
