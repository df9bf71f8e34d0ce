"""MoE layers in the step: active width, the EP all-to-all, the routing imbalance, EP against CP for the node."""

from __future__ import annotations

import pytest

from costmodel.core.errors import InputError
from costmodel.machines.profiles import load_profile
from costmodel.plans.job import Job
from costmodel.plans.models import load_model
from costmodel.training import moe
from costmodel.training.step import evaluate_step
from tests.support import REPO, formula

HF = REPO / "tests" / "data" / "hf"
MIXTRAL = str(HF / "mixtral-8x7b.json")
QWEN_MOE = str(HF / "qwen1.5-moe-a2.7b.json")


def test_mixtral_active_and_total_parameters() -> None:
    """Mixtral 8x7B: 12.9B active (2 of 8 experts), 46.7B in all, as Mistral AI publishes them (to 0.1B)."""
    model = load_model(MIXTRAL)
    shape = {"H": 4096, "V": 32000, "d": 128, "e_m": 2, "g": 1, "h": 32, "n_L": 32, "n_kv": 8}
    assert formula("params", F_ffn=moe.active_ffn(model), **shape) == pytest.approx(12.9e9, abs=0.05e9)
    assert formula("params", F_ffn=8 * model.ffn_hidden, **shape) == pytest.approx(46.7e9, abs=0.05e9)


def test_shared_expert_joins_the_active_width() -> None:
    """Qwen1.5-MoE-A2.7B: 4 routed experts of 1408 and a shared expert of 5632 are 11,264 wide."""
    model = load_model(QWEN_MOE)
    assert (model.experts, model.experts_per_token, model.shared_expert_ffn) == (60, 4, 5632)
    assert moe.active_ffn(model) == 4 * 1408 + 5632


def _step(**values: object) -> dict:
    base = {"model": MIXTRAL, "seq": 32768, "hw": "h100-nvlink", "gpus": 32, "tp": 2, "global_batch": 16}
    return evaluate_step(Job.of(**(base | values))).model_dump(by_alias=True)


def test_alltoall_time_is_the_dispatch_and_combine_bytes_over_the_ep_link() -> None:
    """CP 1, TP 2, EP 4 on one 8-GPU node: 16,384 tokens a rank x 2 experts x 4096 x 2 bytes, 3/4 of it off the
    rank, twice (dispatch and combine), at 450 GB/s; forward and backward, 32 layers, one micro-batch (DP 16)."""
    result = _step(ep=4)
    per_pass = 2 * 16384 * 2 * 4096 * 2 * 3 / 4 / 450e9
    assert result["moe"]["ep_scope"] == "intra-node"
    assert result["step"]["breakdown"]["exposed_ep_s"] == pytest.approx(2 * 32 * per_pass, rel=1e-9)


def test_no_imbalance_at_capacity_factor_one_and_no_alltoall_without_ep() -> None:
    balanced = _step(capacity_factor=1.0)["step"]["breakdown"]
    assert balanced["moe_imbalance_s"] == 0.0 and balanced["exposed_ep_s"] == 0.0
    loaded = _step(capacity_factor=1.5)["step"]["breakdown"]
    assert loaded["moe_imbalance_s"] > 0.0


def test_imbalance_is_the_capacity_factor_share_of_expert_compute() -> None:
    """The imbalance term scales with C_f - 1: doubling it from 1.25 to 1.5 doubles the term."""
    quarter = _step(capacity_factor=1.25)["step"]["breakdown"]["moe_imbalance_s"]
    half = _step(capacity_factor=1.5)["step"]["breakdown"]["moe_imbalance_s"]
    assert half == pytest.approx(2 * quarter, rel=1e-9)


def test_ep_competes_with_cp_for_the_node() -> None:
    """TP 2 x CP 2 leaves room for EP 2 in an 8-GPU node; EP 4 spans two nodes and waits on InfiniBand."""
    inside = _step(cp=2, ep=2, global_batch=16)
    outside = _step(cp=2, ep=4, global_batch=16)
    assert inside["moe"]["ep_scope"] == "intra-node" and inside["topology"]["rank_order"] == "tp-cp-ep-dp-pp"
    assert outside["moe"]["ep_scope"] == "inter-node"
    assert outside["moe"]["ep_bandwidth"] == pytest.approx(50e9, rel=1e-12)
    moved = _step(cp=2, ep=4, global_batch=16, rank_order="tp-ep-cp-dp-pp")
    assert moved["moe"]["ep_scope"] == "intra-node"
    assert moved["topology"]["groups"]["cp"]["scope"] == "inter-node"


def test_dense_models_are_untouched() -> None:
    """A dense model has no MoE section and no MoE time."""
    result = evaluate_step(
        Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=8)
    ).model_dump(by_alias=True)
    assert result["moe"] == {}
    assert result["step"]["breakdown"]["moe_imbalance_s"] == 0.0


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"model": "llama3-8b", "ep": 2}, "needs an MoE model"),
        ({"ep": 3, "gpus": 24, "global_batch": 24}, "must divide the model's 8 experts"),
        ({"ep": 8, "gpus": 8, "tp": 2, "global_batch": 4}, "must divide the data-parallel degree 4"),
    ],
)
def test_bad_ep_names_the_flag(values: dict, why: str) -> None:
    with pytest.raises(InputError) as error:
        _step(**values)
    assert error.value.field == "--ep" and why in error.value.message


def test_optimizer_reads_the_experts_a_device_holds() -> None:
    """Mixtral, TP 2, EP 4: a device holds 2 experts of 32 layers, TP-split, and the routers: 5.64e9 weights,
    their Adam states sharded over DP / EP = 4 ranks at 30 bytes each through HBM."""
    result = _step(ep=4)
    held = 32 * (2 * 3 * 4096 * 14336 / 2 + 4096 * 8)
    assert result["moe"]["expert_params_per_device"] == pytest.approx(held, rel=1e-12)
    hbm = load_profile("h100-nvlink").device.streaming_bandwidth
    experts = 30 * held / (16 / 4 * hbm)
    assert experts < result["step"]["breakdown"]["optimizer_s"] < 1.1 * experts
