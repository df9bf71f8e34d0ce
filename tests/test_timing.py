"""The ring's time model: a pass timed once per distinct kernel call equals the pass timed step by step."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import distinct_calls, ring_pass


def _step_by_step(pairs: np.ndarray, seconds) -> np.ndarray:  # noqa: ANN001
    """The straightforward loop: each step's distinct blocks, with that step's busy ranks."""
    out = np.empty(pairs.shape)
    for step in range(pairs.shape[1]):
        column = pairs[:, step]
        busy = int((column > 0).sum())
        for block in np.unique(column):
            out[column == block, step] = seconds(float(block), step == 0, busy)
    return out


def _probe(block: float, first: bool, busy: int) -> float:
    """A call time that tells every argument apart."""
    return 0.0 if block <= 0 else block * 1e-6 + (0.5 if first else 0.0) + busy * 1e-3


@pytest.mark.parametrize("n", [1, 2, 3, 8, 33])
@pytest.mark.parametrize("values", [1, 2, 5, 2000])  # 2,000: more calls than a uint8 index holds
def test_calls_timed_once_are_the_step_by_step_loop(n: int, values: int) -> None:
    rng = np.random.default_rng(n * 10 + values)
    pairs = rng.integers(0, values + 1, size=(n, n)).astype(float) * 4096.0  # zeros: idle ranks
    calls = distinct_calls(pairs)
    call_s = np.array([_probe(*call) for call in calls.calls])
    expected = _step_by_step(pairs, _probe)
    assert np.array_equal(calls.per_rank(call_s), expected)
    assert np.array_equal(calls.slowest(call_s), expected.max(axis=0))


CASES = [
    {"seq": 65536, "n": 8, "layout": "zigzag"},
    {"seq": 65536, "n": 16, "layout": "contiguous"},
    {"seq": 65536, "n": 8, "layout": "striped"},
    {"seq": 65536, "n": 4, "layout": "contiguous", "causal": False},
    {"seq": 256 * 1024, "n": 8, "docs": "1kx256", "packing": "varlen"},
    {"seq": 32768, "n": 1, "layout": "zigzag"},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("backward", [False, True])
def test_a_ring_pass_is_positive_exactly_where_ranks_compute(case: dict, backward: bool) -> None:
    inputs = PlanInputs(hw="h100-nvlink", **case)
    ring = ring_pass(inputs, Machine(load_profile("h100-nvlink"), "bf16"), backward)
    assert ring.compute_s.shape == (inputs.cp, inputs.cp)
    assert (ring.compute_s[ring.pairs <= 0] == 0).all() and (ring.compute_s[ring.pairs > 0] > 0).all()
