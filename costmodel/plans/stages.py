"""The pipeline layout against the model: how many layers each stage holds, and the one check every command
(step, recommend, infer, report, check, audit) asks before it plans stages.

A split is Megatron-LM's: the first and the last stage may hold their own layer counts
(``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``) and the stages between
split the rest evenly. The first stage also holds the input embedding, the last the output layer and the
loss, so a balanced split gives them fewer layers (Megatron's ``--account-for-embedding-in-pipeline-split``
and ``--account-for-loss-in-pipeline-split`` count each as one layer) [Megatron21 §2.2].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from costmodel.core.errors import InputError


@dataclass(frozen=True)
class StageSplit:
    """Layers on the first stage, on each middle stage (0 below three stages) and on the last; with one
    stage, first and last are the same stage and hold every layer."""

    pp: int
    first: int
    middle: int
    last: int

    @classmethod
    def of(cls, plan: Mapping[str, Any]) -> StageSplit:
        """The split a plan or a step's inputs state (``pp``, ``first/middle/last_stage_layers``)."""
        return cls(
            plan["pp"], plan["first_stage_layers"], plan["middle_stage_layers"], plan["last_stage_layers"]
        )

    @property
    def layers(self) -> int:
        return self.first if self.pp == 1 else self.first + (self.pp - 2) * self.middle + self.last

    @property
    def even(self) -> bool:
        return self.pp == 1 or self.first == self.last == (self.middle if self.pp > 2 else self.first)

    def values(self) -> dict[str, int]:
        """The symbols n_first, n_mid, n_last of the pipeline formulas."""
        return {"n_first": self.first, "n_mid": self.middle, "n_last": self.last}

    def megatron_args(self) -> dict[str, int]:
        """Megatron-LM's flags for an uneven split; none for an even one."""
        if self.even:
            return {}
        return {
            "decoder-first-pipeline-num-layers": self.first,
            "decoder-last-pipeline-num-layers": self.last,
        }

    def text(self) -> str:
        """``7 + 14 x 8 + 7`` for an uneven split; empty for an even one."""
        if self.even:
            return ""
        middle = f" + {self.pp - 2} x {self.middle}" if self.pp > 2 else ""
        return f"{self.first}{middle} + {self.last}"


def balanced(layers: int, pp: int, fewer_first: int = 0, fewer_last: int = 0) -> StageSplit | None:
    """The most even split of ``layers`` over ``pp`` stages, counting ``fewer_first`` (``fewer_last``) more
    layers' worth of work on the first (last) stage: the middle stages take the ceiling, the ends share the
    rest; None when an end would be left without a layer."""
    if pp == 1:
        return StageSplit(1, layers, 0, layers) if not (fewer_first or fewer_last) else None
    total = layers + fewer_first + fewer_last
    for middle in (-(-total // pp), total // pp) if pp > 2 else (0,):
        rest = total - (pp - 2) * middle
        first, last = -(-rest // 2) - fewer_first, rest // 2 - fewer_last
        if first >= 1 and last >= 1 and (pp == 2 or middle >= 1):
            return StageSplit(pp, first, middle, last)
    return None


def candidate_splits(layers: int, pp: int) -> list[StageSplit]:
    """The splits the layout search tries at ``pp`` stages: the balanced one, and the balanced ones that count
    the loss (and the embedding) as a layer's work, as Megatron can."""
    splits = [balanced(layers, pp, *extra) for extra in ((0, 0), (0, 1), (1, 1), (0, 2))]
    return list(dict.fromkeys(s for s in splits if s is not None))


def split_stages(
    layers: int,
    pp: int,
    vpp: int = 1,
    first: int | None = None,
    last: int | None = None,
    pp_field: str = "--pp",
    vpp_field: str = "--vpp",
) -> StageSplit:
    """The split of ``layers`` over ``pp`` stages: ``first`` and ``last`` as given (the middle stages share
    the rest evenly), else the balanced split; each stage's layers divide into ``vpp`` virtual stages.
    One line naming the flag for any layout that leaves a stage without a layer."""
    if pp > layers:
        raise InputError(pp_field, f"{pp} pipeline stages exceed the model's {layers} layers")
    if vpp > 1 and pp == 1:
        raise InputError(vpp_field, "interleaving needs --pp > 1")
    if (first is not None or last is not None) and pp == 1:
        given = "--first-stage-layers" if first is not None else "--last-stage-layers"
        raise InputError(given, "a stage split needs --pp > 1")
    split = _given(layers, pp, first, last) if first is not None or last is not None else balanced(layers, pp)
    assert split is not None  # pp <= layers always has a balanced split
    fewest = min([split.first, split.last] + ([split.middle] if pp > 2 else []))
    if pp * vpp > layers:
        raise InputError(
            vpp_field,
            f"{pp} stages x {vpp} virtual stages = {pp * vpp} model chunks exceed the model's {layers} layers",
        )
    # Chunks may differ by a layer (Llama 3 interleaves a 7 + 14 x 8 + 7 split), never be empty.
    if vpp > fewest:
        raise InputError(
            vpp_field,
            f"{vpp} virtual stages leave a model chunk without a layer: a stage holds {fewest} "
            f"({split.text() or split.first} per stage); accepted: at most {fewest}",
        )
    return split


def _given(layers: int, pp: int, first: int | None, last: int | None) -> StageSplit:
    inner = pp - 2
    if first is None or last is None:  # one end given: the other takes what an even middle leaves
        flag, fixed = ("--first-stage-layers", first) if first is not None else ("--last-stage-layers", last)
        assert fixed is not None
        most = layers - (pp - 1)  # the other pp - 1 stages need a layer each
        if not 1 <= fixed <= most:
            raise InputError(
                flag,
                f"{fixed} of {layers} layers on one end stage leave {max(layers - fixed, 0)} for the other "
                f"{pp - 1} stage{'s' if pp > 2 else ''}, at least one each: accepted 1 to {most}",
            )
        rest = layers - fixed
        middles = (-(-rest // (pp - 1)), rest // (pp - 1)) if inner > 0 else (0,)
        other = next((rest - inner * m for m in middles if rest - inner * m >= 1), rest - inner * middles[-1])
        first, last = (fixed, other) if first is not None else (other, fixed)
    rest = layers - first - last
    if (
        first < 1
        or last < 1
        or rest < 0
        or (inner > 0 and (rest < inner or rest % inner))
        or (inner == 0 and rest)
    ):
        need = f"the {pp - 2} middle stages share {layers} - first - last layers evenly, at least one each"
        raise InputError(
            "--first-stage-layers",
            f"{first} first and {last} last of {layers} layers over {pp} stages: "
            + (need if inner > 0 else f"first + last must be the model's {layers} layers"),
        )
    return StageSplit(pp, first, rest // inner if inner > 0 else 0, last)


def check_stages(
    layers: int, pp: int, vpp: int = 1, pp_field: str = "--pp", vpp_field: str = "--vpp"
) -> StageSplit:
    """Refuse a layout that gives a stage or a virtual stage no layer; the balanced split otherwise."""
    return split_stages(layers, pp, vpp, pp_field=pp_field, vpp_field=vpp_field)
