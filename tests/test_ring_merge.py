"""What a ring pays beside its kernels, by framework: each step's merge of its partial output into the running
one (ring_merge_bytes an element through HBM), and torch's all-gather CP, which attends the gathered blocks one
by one and merges them as a ring does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.frameworks.profiles import EAGER_MERGE_BYTES, FUSED_MERGE_BYTES, load_framework
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs, build, machine_for
from costmodel.plans.job import Job
from costmodel.plans.timing import predict, ring_overhead_s
from costmodel.training.step import evaluate_step

LAYER = {"heads": 32, "kv_heads": 8, "head_dim": 128, "causal": True}


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([2, 4, 8, 16]),
    st.sampled_from([8192, 16384, 65536]),
    st.floats(1.0, 64.0),
    st.sampled_from(["zigzag", "contiguous", "striped"]),
)
def test_the_merge_costs_its_bytes_through_hbm_once_a_step(
    n: int, local: int, merge: float, layout: str
) -> None:
    """Every step after the first merges L x h x (d + 1) elements: a pass's time grows by exactly the extra
    bytes over the HBM bandwidth for each of its N - 1 merges."""
    inputs = build(PlanInputs, seq=n * local, cp=n, hw="h100-nvlink", layout=layout, **LAYER)
    machine = machine_for(inputs)
    base = predict(inputs, machine, "ring", True)
    more = predict(inputs, machine, "ring", True, merge_bytes=FUSED_MERGE_BYTES + merge)
    extra = (n - 1) * local * 32 * 129 * merge / load_profile("h100-nvlink").device.streaming_bandwidth
    assert more.forward_s - base.forward_s == pytest.approx(extra, rel=1e-9)
    assert more.backward_s - base.backward_s == pytest.approx(extra, rel=1e-9)
    assert more.compute_s - base.compute_s == pytest.approx(2 * extra, rel=1e-9)  # device work, not exposed
    assert more.exposed_s == pytest.approx(base.exposed_s, rel=1e-9, abs=1e-15)


def test_one_device_and_a_datasheet_pay_no_merge() -> None:
    alone = build(PlanInputs, seq=8192, cp=1, hw="h100-nvlink", **LAYER)
    assert ring_overhead_s(alone, machine_for(alone)) == 0.0
    ring = build(PlanInputs, seq=65536, cp=8, hw="h100-nvlink", **LAYER)
    assert ring_overhead_s(ring, machine_for(ring).as_datasheet()) == 0.0
    assert ring_overhead_s(ring, machine_for(ring)) > 0.0


def test_a_profile_without_hbm_bandwidth_prices_the_launches_alone(tmp_path) -> None:  # noqa: ANN001
    """A measured profile cut before its calibration states no HBM bandwidth: the ring pays its launches and
    no merge traffic, a finite figure (infinite bandwidth once made the formula's inf x 0 a NaN)."""
    import yaml

    data = load_profile("h100-nvlink").model_dump(mode="json", exclude_none=True)
    del (
        data["device"]["hbm_bandwidth"],
        data["device"]["hbm_sustained"],
    )  # one is not stated without the other
    path = tmp_path / "no-hbm.yaml"
    path.write_text(yaml.safe_dump(data))
    ring = build(PlanInputs, seq=65536, cp=8, hw=str(path), **LAYER)
    launches = 7 * load_profile("h100-nvlink").kernels.ring_step_launch_s
    assert ring_overhead_s(ring, machine_for(ring)) == pytest.approx(launches, rel=1e-12)


def test_a_fused_merge_is_the_default_and_a_framework_states_its_own() -> None:
    assert FUSED_MERGE_BYTES == 12.0  # two fp32 partials read, one written
    assert load_framework("megatron").time.ring_merge_bytes == 10.0  # Transformer Engine's fused correction
    torch_cp = load_framework("torchtitan").time
    assert (
        torch_cp.ring_merge_bytes == EAGER_MERGE_BYTES == 6 + 12 + 8 + 12
    )  # cast, difference, product, subtraction
    assert torch_cp.allgather_merges and not load_framework("megatron").time.allgather_merges


JOB = {"model": "llama3-8b", "seq": 65536, "hw": "h100-nvlink", "gpus": 8, "cp": 8, "global_batch": 8}


def _ring_overheads(**knobs: object) -> float:
    report = evaluate_step(Job.of(**JOB, **knobs)).model_dump(by_alias=True)
    return report["step"]["breakdown"]["cp_ring_overhead_s"]


def test_torch_all_gather_cp_pays_a_rings_merges_and_llama3_style_does_not() -> None:
    torch_cp = _ring_overheads(framework="torchtitan", cp_scheme="allgather")
    assert torch_cp > 0.0
    assert _ring_overheads(framework="megatron", cp_scheme="allgather") == 0.0
    # the same job as a ring in torchtitan pays the same merges (its layout copies the queries as well)
    ring = _ring_overheads(framework="torchtitan", cp_scheme="ring")
    assert ring >= torch_cp


def test_the_merge_bytes_flag_moves_the_ring_overheads_as_the_formula_says() -> None:
    fused = _ring_overheads(framework="megatron", cp_scheme="ring", ring_merge_bytes=12.0)
    eager = _ring_overheads(framework="megatron", cp_scheme="ring", ring_merge_bytes=38.0)
    default = _ring_overheads(framework="megatron", cp_scheme="ring")  # the framework's 10
    assert fused < eager and default < fused
    # the merge is linear in its bytes: the launches and the query copies stay, so the differences scale
    assert (eager - fused) / (fused - default) == pytest.approx((38 - 12) / (12 - 10), rel=1e-9)


def test_the_flag_is_refused_outside_its_range(cli) -> None:  # noqa: ANN001
    result = cli(
        "step",
        "--model",
        "llama3-8b",
        "--seq",
        "64k",
        "--n",
        "8",
        "--global-batch",
        "8",
        "--ring-merge-bytes",
        "0",
    )
    assert result.code == 2 and "--ring-merge-bytes" in result.err and result.err.count("\n") == 1
