"""Published serving figures the inference model is held to: prefill (time to first token) and decode-heavy
throughput, batch 1 and batched, one row per figure, with its source and the framework, precision and
parallel layout the source states: the rows of ``validation/serving_published.yaml`` (ROWS) and
``validation/serving_published_holdout.yaml`` (HELD_OUT). The files say where each source's figures come from
and what is assumed.

Every row is within GOAL or names why not (``misses``): tests/test_inference.py holds the first kind to
GOAL and runs the second as a strict expected failure, so a miss that closes is noticed. ROWS are the
calibration rows of the serving prediction intervals; HELD_OUT, a third of the rows added after the first 13
drawn at random per source (:func:`draw_held_out`), is held to the same rule but calibrates nothing. No constant
is fitted to these rows: kernel rates are the profiles' published tables ([FA3], [GEMM-bench]), overlaps the
documented defaults of :class:`~costmodel.inference.setup.InferenceSetup`. docs/inference.md prints them.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from costmodel.core.resources import data_dir
from costmodel.core.tables import draw_thirds, read_rows
from costmodel.inference.serve import evaluate_infer
from costmodel.inference.setup import build_infer

GOAL = 0.15
FILES = {"rows": "serving_published.yaml", "held_out": "serving_published_holdout.yaml"}


@dataclass(frozen=True)
class Published:
    """One published serving figure, every field as the table states it."""

    key: str
    source: str
    serving: str  # framework, precision and parallel layout, as the source states them
    run: str
    metric: Literal["ttft", "tokens_per_s_per_gpu", "tpot", "latency"]
    published: float
    setup: dict[str, Any]  # cp-plan infer's flags by name
    misses: str  # why the row is outside GOAL: a named known miss; else ""
    added_later: bool  # added after the first 13 rows: held out or not by the draw (draw_held_out)

    def predicted(self) -> float:
        """TTFT in seconds; the mean time per output token (``tpot``) in seconds; a static batch's whole
        latency, its prefill and its output tokens at the mean TPOT (``latency``), in seconds; or that batch's
        output tokens/s per GPU: b x output over that latency and the GPUs."""
        out = evaluate_infer(*build_infer(**self.setup)).inference
        if self.metric == "ttft":
            return out.ttft_s
        if self.metric == "tpot":
            return out.tpot_s
        batch, output = self.setup.get("batch", 1), self.setup["output"]
        latency = out.ttft_s + output * out.tpot_s
        if self.metric == "latency":
            return latency
        return batch * output / latency / out.gpus

    def error(self) -> float:
        return self.predicted() / self.published - 1


@cache
def load(path: str | os.PathLike[str], held_out: bool = False) -> tuple[Published, ...]:
    """The rows of ``path``, read once. A malformed row, a source not led by its bracketed citation (the
    draw groups by it), a row without the flags its metric needs, or a held-out row not added later is an
    InputError naming the file, the row and the field."""

    def check(row: Published) -> tuple[str, str] | None:
        if not (row.source.startswith("[") and "]" in row.source):
            return "source", "must start with the bracketed citation, as [TRTLLM-Perf] low latency"
        needed = ("hw",) if row.metric in ("ttft", "tpot") else ("hw", "output")
        if missing := [name for name in needed if name not in row.setup]:
            return "setup", f"states no {' or '.join(missing)}, which {row.metric} needs"
        if held_out and not row.added_later:
            return "added_later", "a held-out row is one added later: the first 13 rows are all in ROWS"
        return None

    return tuple(read_rows(path, Published, check))


def draw_held_out(rows: list[Published]) -> set[str]:
    """The keys kept aside from ``rows``: a third of each source (its bracketed citation), :func:`draw_thirds`."""
    return draw_thirds((row.source.split("]")[0] + "]", row.key) for row in rows)


# A third of the rows added after the first 13 is kept aside, never in ROWS, to see how the model and its
# intervals do on figures nothing was read against. Drawn once (draw_held_out); tests/test_inference.py draws
# it again and checks it is this set.
ROWS = list(load(data_dir("validation") / FILES["rows"]))
HELD_OUT = list(load(data_dir("validation") / FILES["held_out"], held_out=True))
HELD_KEYS = frozenset(row.key for row in HELD_OUT)
NEW = [row for row in ROWS + HELD_OUT if row.added_later]  # the rows the draw was made from


def summary(part: Literal["rows", "held_out"] = "rows") -> dict[str, float]:
    """Median and largest |error| over every row of ``part`` (ROWS, or the HELD_OUT rows), and over its rows
    without a named miss."""
    rows = ROWS if part == "rows" else HELD_OUT
    errors = [abs(row.error()) for row in rows]
    kept = [abs(row.error()) for row in rows if not row.misses]
    return {
        "median": statistics.median(errors),
        "max": max(errors),
        "median_unmissed": statistics.median(kept),
    }
