"""Verdict bands on the step comm ratio ([A-RingCost §11]; [A-RingCost §11]).

The ratio is step receive time ÷ step compute time with no overlap credit. The 5 % and 15 % edges
are the working heuristic of [A-RingCost §11], not a theorem. A red ratio means communication is not negligible,
never that it "dominates": at 20 % a fully overlapped ring may still add no wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Colour = Literal["green", "amber", "red"]


@dataclass(frozen=True)
class Band:
    verdict: Colour
    upper: float  # ratios up to this edge fall in the band (green excludes its edge)
    text: str


GREEN = Band("green", 0.05, "overlap headroom")
AMBER = Band("amber", 0.15, "hiding depends on the implementation; measure end-to-end")
RED = Band("red", float("inf"), "communication not negligible; lower N, consider all-to-all, or TP/PP")
BANDS: tuple[Band, ...] = (GREEN, AMBER, RED)


def band(ratio: float) -> Band:
    """green below 5 %, amber from 5 % to 15 % inclusive, red above."""
    if ratio < GREEN.upper:
        return GREEN
    if ratio <= AMBER.upper:
        return AMBER
    return RED
