"""The ring's time model: a pass timed once per distinct kernel call equals the pass timed step by step, and
a small ring timed on Python floats (no numpy on a plan's path) equals it timed on numpy arrays."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.core.scalars import interp, largest, total
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans import timing
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.timing import distinct_calls, predict, ring_layer_time, ring_pass
from costmodel.symbolic import numeric


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
    rows = distinct_calls(tuple(map(tuple, pairs.tolist())))  # a small ring's rows of floats
    assert rows.calls == calls.calls and rows.index == tuple(map(tuple, calls.index.tolist()))
    assert rows.slowest(call_s.tolist()) == calls.slowest(call_s).tolist()
    assert rows.per_rank(call_s.tolist()) == tuple(map(tuple, calls.per_rank(call_s).tolist()))


CASES = [
    {"seq": 65536, "n": 8, "layout": "zigzag"},
    {"seq": 65536, "n": 16, "layout": "contiguous"},
    {"seq": 65536, "n": 8, "layout": "striped"},
    {"seq": 65536, "n": 4, "layout": "contiguous", "causal": False},
    {"seq": 256 * 1024, "n": 8, "docs": "1kx256", "packing": "varlen"},
    {"seq": 32768, "n": 1, "layout": "zigzag"},
    {"seq": 32768, "n": 2, "layout": "zigzag"},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("backward", [False, True])
def test_a_ring_pass_is_positive_exactly_where_ranks_compute(case: dict, backward: bool) -> None:
    inputs = PlanInputs(hw="h100-nvlink", **case)
    ring = ring_pass(inputs, Machine(load_profile("h100-nvlink"), "bf16"), backward)
    compute, pairs = np.asarray(ring.compute_s), np.asarray(ring.pairs)  # rows of floats on a small ring
    assert compute.shape == (inputs.cp, inputs.cp)
    assert (compute[pairs <= 0] == 0).all() and (compute[pairs > 0] > 0).all()


@pytest.mark.parametrize(
    "case", [c for c in CASES if "docs" not in c], ids=lambda c: "-".join(map(str, c.values()))
)
@pytest.mark.parametrize(
    "hw", ["h100-nvlink", "h100-ib", "a100-nvlink", "datasheet", "tests/data/calibrated/cpu-gloo-2ranks.yaml"]
)
def test_a_small_ring_on_floats_is_the_ring_on_arrays(
    case: dict, hw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every figure of a layer's prediction, bit for bit, whether its schedule is rows of Python floats or
    numpy's arrays (the path a ring beyond ROWS_BUDGET takes)."""
    profile = load_profile("h100-nvlink" if hw == "datasheet" else hw)
    dtype = "fp32" if "cpu" in hw else "bf16"
    machine = Machine(profile, dtype).as_datasheet() if hw == "datasheet" else Machine(profile, dtype)
    inputs = PlanInputs(hw="h100-nvlink", dtype=dtype, **case)
    if "cpu" in hw and inputs.cp > 2:
        return  # the calibrated profile holds two ranks on one node and no inter-node link
    monkeypatch.setattr(timing, "_numpy_loaded", lambda: False)  # as in a plan's own process
    on_floats = [predict(inputs, machine, variant, backward=True) for variant in ("ring", "ulysses")]
    assert isinstance(ring_pass(inputs, machine).pairs, tuple)
    monkeypatch.setattr(timing, "ROWS_BUDGET", 0)
    assert not isinstance(ring_pass(inputs, machine).pairs, tuple)
    on_arrays = [predict(inputs, machine, variant, backward=True) for variant in ("ring", "ulysses")]
    assert [dataclasses.astuple(p) for p in on_floats] == [dataclasses.astuple(p) for p in on_arrays]


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(st.floats(0, 1e-2) | st.just(0.0), min_size=1, max_size=40)
    | st.lists(st.floats(0, 1e-2), min_size=129, max_size=300),  # past ROWS_BUDGET: on arrays
    comm=st.floats(0, 1e-2),
    overlap=st.floats(0, 1),
    overhead=st.floats(0, 1e-4),
)
def test_ring_layer_time_on_floats_is_numpys(
    steps: list[float], comm: float, overlap: float, overhead: float
) -> None:
    """The layer's steps added on Python floats give what the formula on arrays and numpy's sum gave."""
    comms = [comm * (j % 3) for j in range(len(steps))]
    waits = [1 if c > 0 else 0 for c in comms]
    busy = numeric.ring_step_s(
        t_cs=np.asarray(steps),
        t_ms=np.asarray(comms),
        o_cp=overlap,
        s_comm=0.0,
        t_launch=np.asarray(waits, dtype=float) * overhead,
    )
    expected = float(np.sum(busy)) + 1e-5 + overhead
    assert ring_layer_time(steps, comms, 1e-5, overlap, overhead, tail_waits=1) == expected


def _bits(value: float) -> tuple[bool, float]:
    return (True, 0.0) if math.isnan(value) else (False, value, math.copysign(1.0, value))


def test_total_adds_in_numpys_order() -> None:
    rng = np.random.default_rng(7)
    for n in [*range(0, 260), 511, 512, 1000, 1024, 4096]:
        values = rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))
        assert _bits(total(values.tolist())) == _bits(float(np.sum(values))), n
    assert _bits(total([-0.0])) == _bits(float(np.sum(np.array([-0.0]))))
    assert total([]) == 0.0


def test_largest_lets_nan_win_as_numpy() -> None:
    for values in ([1.0, math.nan, 3.0], [math.nan, 1.0], [2.0, -math.inf], [0.0, 5e-324]):
        assert _bits(largest(values)) == _bits(float(np.max(values)))


def test_interp_at_one_point_is_numpys() -> None:
    rng = np.random.default_rng(3)
    for size in (1, 2, 3, 4, 5, 9, 30):
        xp = np.cumsum(rng.uniform(0.1, 2.0, size)) + rng.uniform(-5, 5)
        fp = rng.standard_normal(size) * 1e12
        points = [*xp, xp[0] - 1, xp[-1] + 1, *rng.uniform(xp[0] - 1, xp[-1] + 1, 50), math.nan]
        for x in points:
            assert _bits(interp(x, xp.tolist(), fp.tolist())) == _bits(float(np.interp(x, xp, fp))), (size, x)
    # an infinite slope (a huge value over a tiny step): numpy retries from the right end, as interp does
    xp, fp = [0.0, 5e-324, 1.0], [0.0, 1e308, 1e308]
    for x in (1e-324, 2.5e-324, 0.5):
        assert _bits(interp(x, xp, fp)) == _bits(float(np.interp(x, xp, fp)))
