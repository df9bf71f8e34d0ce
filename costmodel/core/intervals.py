"""Prediction intervals by split-conformal prediction on measured runs' residuals [Conformal-Tutorial §2].

A calibration set is the model's log residuals ``r = ln(measured / predicted)`` on runs it was not fitted to.
For a new prediction ``p`` from the same regime, the interval at level ``L`` (miss rate ``a = 1 - L``) is
``[p e^r(lo), p e^r(hi)]`` with ``r(k)`` the k-th smallest residual. If the new run and the calibration runs are
exchangeable, its residual's rank among the n + 1 is uniform, so it falls inside with probability exactly
``(hi - lo) / (n + 1)`` whatever the residuals' distribution: no normality is assumed, and the interval is as
asymmetric as the model's bias. ``hi - lo`` is the least window reaching ``L``, ``ceil(L (n + 1))``; the
ranks it leaves out are split between the tails, the odd one to the lower, so the upper side (a run slower
or larger than planned) misses with probability at most ``a / 2``, and the lower at most one run's share more.
Equal tails would hold both at ``a / 2`` and, when ``(n + 1) a / 2`` falls between integers, give up a rank
on each side: 16 runs at 80 % would span all 16 (88 %). The price is a minimum sample: ``n >= 2 / a - 1``
(9 runs for 80 %, 39 for 95 %); with fewer, no interval is given rather than an invented one. Log residuals make a width a
ratio, so one set serves a 1 s step and a 100 s one alike.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KEPT = (
    200  # order statistics a stored set keeps: a fitted profile's thousand residuals thinned to its quantiles
)
DEFAULT_LEVEL = 0.8


def runs_needed(level: float) -> int:
    """The fewest calibration runs that give a finite two-sided interval at ``level``."""
    return math.ceil(2 / (1 - level) - 1 - 1e-9)


def runs_to_reach(share: float) -> int:
    """The fewest calibration runs whose conformal share (n / (n + 1) at most) can reach ``share``."""
    return math.ceil(share / (1 - share) - 1e-9)


class Residuals(BaseModel):
    """A calibration set: sorted log residuals ``ln(measured / predicted)``, or, past :data:`KEPT`, their
    evenly spaced order statistics with the count they stand for."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    runs: int = Field(ge=1, le=10**9, description="measured runs the set was taken from")
    # |r| <= 10: a prediction off by more than e^10 (22,000x) is no calibration, and e^r stays finite
    log_residuals: list[Annotated[float, Field(ge=-10, le=10)]] = Field(
        min_length=1,
        max_length=KEPT + 1,
        description="ln(measured / predicted), sorted; at most 201 order statistics of the runs",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Residuals:
        kept = self.log_residuals
        if any(b < a for a, b in zip(kept, kept[1:])):
            raise ValueError("log_residuals must be sorted, smallest first")
        if len(kept) > self.runs:
            raise ValueError(f"{len(kept)} log_residuals for {self.runs} runs")
        if len(kept) < self.runs and len(kept) < 2:
            raise ValueError("a thinned set keeps at least its smallest and largest residual")
        return self

    @classmethod
    def of(cls, values: Sequence[float]) -> Residuals:
        ordered = sorted(float(v) for v in values)
        if len(ordered) > KEPT:
            last = len(ordered) - 1
            ordered = [ordered[round(i * last / KEPT)] for i in range(KEPT + 1)]
        return cls(runs=len(values), log_residuals=[round(v, 5) for v in ordered])

    @classmethod
    def balanced(cls, groups: Sequence[Sequence[float]]) -> Residuals:
        """A set pooled from groups that count alike, however many runs each holds (every framework's runs for a
        framework with too few of its own, which is exchangeable with the frameworks, not with their runs): the
        equal-weight mixture of the groups' residuals, read at as many evenly spaced shares as they hold runs
        (at most :data:`KEPT` + 1, standing for them all)."""
        held = [sorted(float(v) for v in group) for group in groups if len(group)]
        if len(held) == 1:
            return cls.of(held[0])
        values = sorted(v for group in held for v in group)
        shares = [
            sum(bisect.bisect_right(group, v) / len(group) for group in held) / len(held) for v in values
        ]
        runs, points = len(values), min(len(values), KEPT + 1)  # past KEPT, thinned as :meth:`of` thins
        # the mixture's quantile at k / (points - 1): the least value whose share reaches it
        at = [min(bisect.bisect_left(shares, k / (points - 1) - 1e-12), runs - 1) for k in range(points)]
        return cls(runs=runs, log_residuals=[round(values[i], 5) for i in at])

    def order(self, k: int) -> float:
        """The k-th smallest of the ``runs`` residuals (1-based), read from the kept order statistics."""
        kept = self.log_residuals
        if len(kept) == self.runs:
            return kept[k - 1]
        where = (k - 1) / (self.runs - 1) * (len(kept) - 1)
        below = math.floor(where)
        above = min(below + 1, len(kept) - 1)
        return kept[below] + (where - below) * (kept[above] - kept[below])

    def bounds(self, level: float) -> tuple[float, float] | None:
        """The conformal lower and upper log residuals at ``level``; None when the set is too small for it."""
        spare = self.runs + 1 - math.ceil(level * (self.runs + 1) - 1e-9)  # ranks the window leaves out
        if spare < 2:  # a tail with no rank outside it is unbounded
            return None
        return self.order(spare - spare // 2), self.order(self.runs + 1 - spare // 2)

    def share_at_most(self, log_ratio: float) -> float:
        """A conformal lower bound on P(measured <= predicted x e^log_ratio): the runs whose residual is at
        most ``log_ratio`` over ``runs + 1`` (the new run counted as a miss)."""
        kept = self.log_residuals
        if len(kept) == self.runs:
            below = sum(r <= log_ratio for r in kept)
        else:
            below = round(sum(r <= log_ratio for r in kept) / len(kept) * self.runs)
        return below / (self.runs + 1)

    def least_at(self, share: float) -> float | None:
        """The least log ratio whose :meth:`share_at_most` is at least ``share``: how far under a ceiling a
        prediction must sit to stay under it with that probability; None when the set is too small to say it."""
        if self.runs < runs_to_reach(share):
            return None
        need = math.ceil(share * (self.runs + 1) - 1e-9)
        kept = self.log_residuals
        # a thinned set counts its order statistics: the least kept residual whose count reaches the need
        return next(r for r in kept if self.share_at_most(r) * (self.runs + 1) >= need - 1e-9)


def layout_class(tp: int, pp: int) -> tuple[int, bool]:
    """A layout's class for a fitted profile's residuals: its TP degree and whether it is pipelined."""
    return tp, pp > 1


class LayoutResiduals(BaseModel):
    """A fitted profile's residuals on the runs of one layout class: the tensor-parallel degree and whether the
    step is pipelined. These two choices set which of the fitted terms a step leans on (TP's collectives and
    kernel shapes, the pipeline's bubble and sends), so the fit errs differently across classes and alike
    within one: each class calibrated on its own runs is group-balanced conformal prediction
    [Conformal-Tutorial §4.1], narrower than the pool where a class errs less and wider where it errs more, each
    still at its level."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    tp: int = Field(ge=1, le=2**20, description="the tensor-parallel degree of the runs")
    pipelined: bool = Field(description="whether the runs' steps are pipelined (pp > 1)")
    residuals: Residuals

    @classmethod
    def grouped(cls, runs: Sequence[tuple[int, int, float]]) -> list[LayoutResiduals]:
        """``(tp, pp, residual)`` of each run, as one set per layout class, in order of (tp, pipelined)."""
        groups: dict[tuple[int, bool], list[float]] = {}
        for tp, pp, residual in runs:
            groups.setdefault(layout_class(tp, pp), []).append(residual)
        return [
            cls(tp=tp, pipelined=piped, residuals=Residuals.of(values))
            for (tp, piped), values in sorted(groups.items())
        ]

    def holds(self, tp: int, pp: int) -> bool:
        """Whether a plan of ``tp`` and ``pp`` is of this class."""
        return (self.tp, self.pipelined) == layout_class(tp, pp)

    def label(self) -> str:
        return f"TP {self.tp}, {'pipelined' if self.pipelined else 'no pipeline'}"


@dataclass(frozen=True)
class Calibration:
    """A calibration set and what it is: the regime its runs share (``framework megatron, Hopper``).

    ``own``: where the plan's own regime (its framework) holds too few runs for the level and a wider regime
    calibrates it, that regime's runs. A run that errs unlike the wider regime's would otherwise get an interval
    its own runs say it misses; the interval spans their range as well, which holds a new run of the regime
    with probability (n - 1) / (n + 1) for n exchangeable runs, whatever the wider regime's runs do. The
    chance to fit stays the wider regime's: a few runs' bound could say no plan fits at more than n / (n + 1)."""

    regime: str
    residuals: Residuals
    own: Residuals | None = None
    own_regime: str = ""
    # (regime, runs) more specific than ``residuals`` but too few for the level asked: each bounds the
    # interval at the highest level it holds, so that raising the level never narrows it
    finer: tuple[tuple[str, Residuals], ...] = ()


class Interval(BaseModel):
    """A prediction interval: the true value lies in [lo, hi] with probability ``level`` (split-conformal on
    the regime's measured runs); lo and hi are null when no measured run set supports that level."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    lo: float | None = Field(description="lower bound, in the figure's unit; null when there is no interval")
    hi: float | None = Field(description="upper bound; null when there is no interval")
    level: float = Field(description="the probability the interval holds the true value")
    regime: str = Field(description="the measured runs the width comes from")
    runs: int = Field(description="how many measured runs")
    note: str = Field("", description="why there is no interval, where there is none")
    figure: Literal["inside", "below", "above"] | None = Field(
        None,
        description="where the figure lies: inside its interval, or below (above) it where the model errs one "
        "way on runs like it and their measured values lay above (below) its predictions; null when there is "
        "no interval",
    )

    @property
    def known(self) -> bool:
        return self.lo is not None and self.hi is not None

    def scaled(self, factor: float) -> Interval:
        """The interval of ``factor`` times the figure (a budget's days from its step's seconds): the same runs
        and level, the bounds scaled."""
        if not self.known:
            return self
        return self.model_copy(update={"lo": self.lo * factor, "hi": self.hi * factor})  # type: ignore[operator]

    def holds(self, value: float) -> bool | None:
        """Whether ``value`` lies in the interval; None where there is no interval."""
        return None if not self.known else self.lo <= value <= self.hi  # type: ignore[operator]


def interval(value: float, calibration: Calibration | None, level: float, what: str) -> Interval:
    """``value``'s interval at ``level`` from ``calibration`` (None: no comparable measured run of ``what``)."""
    if calibration is None:
        return Interval(
            lo=None, hi=None, level=level, regime="", runs=0, note=f"no comparable measured {what}"
        )
    residuals = calibration.residuals
    bounds = residuals.bounds(level)
    if bounds is None:
        return Interval(
            lo=None,
            hi=None,
            level=level,
            regime=calibration.regime,
            runs=residuals.runs,
            note=f"{residuals.runs} comparable measured {what}s: {runs_needed(level)} needed at {level:.0%}",
        )
    lo, hi = bounds
    regime = calibration.regime
    for name, runs in calibration.finer:
        held = min(level, (runs.runs - 1) / (runs.runs + 1))  # the most its ranks vouch for
        inner = runs.bounds(held)
        if inner is not None and (inner[0] < lo or inner[1] > hi):
            lo, hi = min(lo, inner[0]), max(hi, inner[1])
            regime += f"; no narrower than {name} at {held:.0%}"
    own = calibration.own
    if own is not None and own.runs >= 2 and (own.order(1) < lo or own.order(own.runs) > hi):
        lo, hi = min(lo, own.order(1)), max(hi, own.order(own.runs))
        regime += (
            f"; spanning the range of {calibration.own_regime} too, which holds another of them "
            f"{(own.runs - 1) / (own.runs + 1):.0%} of the time"
        )
    figure = "below" if lo > 0 else "above" if hi < 0 else "inside"
    return Interval(
        lo=value * math.exp(lo),
        hi=value * math.exp(hi),
        level=level,
        regime=regime,
        runs=residuals.runs,
        figure=figure,
    )


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two known intervals share a value: their figures cannot be told apart at the level."""
    assert a.known and b.known
    return a.lo <= b.hi and b.lo <= a.hi  # type: ignore[operator]
