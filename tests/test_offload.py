"""Offload over the host link, from first principles: what it saves in device memory, what it costs in time.

Llama 3 8B has 8,030,261,248 parameters: 32 layers of 4096·128·(2·32 + 2·8) attention, 3·4096·14336 MLP and
two 4096 norms, untied 128256 x 4096 embeddings and a final norm. The host link of h100-nvlink is PCIe Gen5
x16 at 50 GB/s a direction; its host updates 10e9 / 2.57 parameters a second with CPU Adam.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from costmodel.core.errors import InputError
from costmodel.core.resources import data_dir
from costmodel.machines.profiles import HostLink, parse_profile
from costmodel.plans.job import Job
from costmodel.symbolic import numeric
from costmodel.training.search import Constraints, search, search_loop
from costmodel.training.step import bind, evaluate_step
from tests.support import searched

LLAMA3_8B_PARAMS = 32 * (4096 * 128 * (64 + 16) + 3 * 4096 * 14336 + 2 * 4096) + 2 * 128256 * 4096 + 4096
LLAMA3_8B_NORMS = (32 * 2 + 1) * 4096  # whole on every TP rank
PCIE5 = 50e9
CPU_ADAM = 10e9 / 2.57
MIXTRAL = Path(__file__).parent / "data" / "hf" / "mixtral-8x7b.json"
JOB = {"model": "llama3-8b", "seq": 131072, "hw": "h100-nvlink", "gpus": 4, "cp": 4, "global_batch": 4}


def _step(**values):  # noqa: ANN202
    built = Job.of(**(JOB | values))
    return built, evaluate_step(built).model_dump(by_alias=True)


def test_llama3_8b_has_the_parameters_counted_by_hand() -> None:
    """bf16 weights and fp32 gradients whole (ZeRO-1), the 12 bytes of optimizer states over CP 4."""
    _, result = _step()
    assert result["memory"]["model_state_bytes"] == pytest.approx(LLAMA3_8B_PARAMS * (2 + 4 + 12 / 4))


@pytest.mark.parametrize(("zero", "tp", "gpus"), [(0, 1, 4), (1, 1, 4), (1, 2, 8), (3, 1, 4)])
def test_optimizer_offload_saves_12_bytes_per_parameter_held(zero: int, tp: int, gpus: int) -> None:
    """fp32 master weights and both Adam moments leave the device: 12 bytes for each parameter whose states
    the device holds, the TP rank's share sharded over DP x CP from ZeRO-1 on."""
    _, plain = _step(zero=zero, tp=tp, gpus=gpus)
    _, offloaded = _step(zero=zero, tp=tp, gpus=gpus, offload="optimizer")
    held = ((LLAMA3_8B_PARAMS - LLAMA3_8B_NORMS) / tp + LLAMA3_8B_NORMS) / (1 if zero == 0 else gpus // tp)
    saved = plain["memory"]["model_state_bytes"] - offloaded["memory"]["model_state_bytes"]
    assert saved == pytest.approx(12 * held, rel=1e-12)
    assert offloaded["memory"]["activation_bytes"] == plain["memory"]["activation_bytes"]


def test_the_weight_upload_is_its_bytes_over_the_host_link() -> None:
    """Nothing hides the upload of the updated bf16 weights (the plain schedule, no delayed update), and a
    128K backward hides the gradients' copy: the exposed copies are 2 bytes x the device's share / 50 GB/s."""
    _, result = _step(offload="optimizer")
    share = LLAMA3_8B_PARAMS / 4  # ZeRO-1 over CP 4
    breakdown = result["step"]["breakdown"]
    assert breakdown["offload_grad_s"] == pytest.approx(2 * share / PCIE5)
    # The CPU of the one host runs Adam over all four devices' shares.
    assert breakdown["host_adam_s"] == pytest.approx(4 * share / CPU_ADAM)
    assert breakdown["optimizer_s"] == 0
    assert breakdown["offload_layer_s"] == 0


def test_offloading_the_optimizer_on_4_h100_costs_at_least_the_host_adam_step() -> None:
    """8B at 128K on 4 x H100: the CPU's Adam over 8B parameters takes 2 s; the step pays it whole."""
    _, plain = _step()
    _, offloaded = _step(offload="optimizer")
    host_adam = LLAMA3_8B_PARAMS / CPU_ADAM
    assert host_adam > 2
    assert (
        offloaded["step"]["time_s"] - plain["step"]["time_s"]
        >= host_adam - plain["step"]["breakdown"]["optimizer_s"]
    )
    assert offloaded["step"]["time_s"] > plain["step"]["time_s"] + 0.9 * host_adam


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.0, 3.0])
def test_activation_offload_exposes_only_the_copy_beyond_the_layer_compute(ratio: float) -> None:
    """A layer's activations go out during its forward: zero exposed while the forward is longer than the
    copy, copy - compute beyond it. The backward's fetch is compared with the backward the same way."""
    job, _ = _step(offload="activations")
    v = bind(job)
    kept = v["b"] * v["S"] / v["N"] * 4096 * (8 + 4 * 128 * (32 + 8) / 4096 + 2 * 3 * 14336 / 4096)
    assert numeric.offload_activation_copy_s(**_args("offload_activation_copy_s", v)) == pytest.approx(
        kept / PCIE5
    )
    compute = float(numeric.layer_compute_fwd_s(**_args("layer_compute_fwd_s", v)))
    at = {**v, "B_h": kept / (ratio * compute)}  # a host link whose copy takes ratio x the forward
    exposed = float(numeric.offload_layer_fwd_exposed_s(**_args("offload_layer_fwd_exposed_s", at)))
    assert exposed == pytest.approx(max(0.0, ratio - 1.0) * compute, abs=1e-15)
    backward = float(numeric.layer_compute_bwd_s(**_args("layer_compute_bwd_s", v)))
    recompute = float(numeric.layer_recompute_s(**_args("layer_recompute_s", v)))
    at = {**v, "B_h": kept / (ratio * (backward + recompute))}
    exposed = float(numeric.offload_layer_bwd_exposed_s(**_args("offload_layer_bwd_exposed_s", at)))
    assert exposed == pytest.approx(max(0.0, ratio - 1.0) * (backward + recompute), rel=1e-9, abs=1e-15)


def test_activation_offload_keeps_two_layers_on_the_device() -> None:
    _, plain = _step()
    _, offloaded = _step(offload="activations")
    # A layer keeps (8H + 4hd + 4 n_kv d + 6F) bytes a token with flash attention, of the 32,768 a rank holds;
    # the output layer's input and the loss's (or the backward's) working set stay whatever is offloaded.
    layer = 131072 / 4 * (8 * 4096 + 4 * 32 * 128 + 4 * 8 * 128 + 6 * 14336)
    assert offloaded["memory"]["activation_bytes"] == pytest.approx(
        plain["memory"]["activation_bytes"] - 30 * layer, rel=1e-12
    )
    assert offloaded["memory"]["model_state_bytes"] == plain["memory"]["model_state_bytes"]


def test_parameter_offload_fetches_each_layer_twice_a_micro_batch() -> None:
    """ZeRO-3 with parameters on the host: the device keeps two layers' weights and gradients in flight,
    no resident weights, gradients or optimizer states; no weight upload after the CPU step."""
    job, result = _step(offload="optimizer+params", zero=3)
    layer = 4096 * 128 * (64 + 16) + 3 * 4096 * 14336 + 2 * 4096
    assert result["memory"]["model_state_bytes"] == pytest.approx(2 * layer * (2 + 4))
    v = bind(job)
    fetch = float(numeric.offload_param_fetch_s(**_args("offload_param_fetch_s", v)))
    assert fetch == pytest.approx(layer / 4 * 2 / PCIE5)  # its ZeRO-3 shard, bf16
    assert float(numeric.offload_weight_upload_s(**_args("offload_weight_upload_s", v))) == 0


def test_optimizer_and_activation_offload_is_the_sum_of_its_parts() -> None:
    """ZeRO-Offload with activation offload (Arctic Long Sequence Training's setup): the activations of
    ``activations`` and the states of ``optimizer``, the weights staying on the device."""
    _, both = _step(offload="optimizer+activations", zero=3)
    _, states = _step(offload="optimizer", zero=3)
    _, layers = _step(offload="activations", zero=3)
    assert both["memory"]["activation_bytes"] == layers["memory"]["activation_bytes"]
    assert both["memory"]["model_state_bytes"] == states["memory"]["model_state_bytes"]
    assert both["step"]["breakdown"]["host_adam_s"] == states["step"]["breakdown"]["host_adam_s"] > 0
    assert both["step"]["breakdown"]["offload_layer_s"] == layers["step"]["breakdown"]["offload_layer_s"]


def test_the_search_ranks_with_the_offload_it_is_given() -> None:
    """The vectorised search and the plain loop agree under offload, and offload lets more plans fit."""
    job = {"model": "llama3-8b", "seq": 32768, "hw": "h100-nvlink", "gpus": 4, "global_batch": 4}
    constraints = Constraints(pp=1, recompute="selective")
    for mode in ("optimizer", "all"):
        built = searched(**job, offload=mode)
        fast = search(*built, constraints, top=None).plans
        slow = search_loop(*built, constraints)
        assert len(fast) == len(slow) > 0
        for a, b in zip(fast, slow, strict=True):
            assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12)
            assert a["memory_bytes"] == pytest.approx(b["memory_bytes"], rel=1e-12)
    plain = search(*searched(**job), constraints, top=None).plans
    assert len(search(*searched(**job, offload="all"), constraints, top=None).plans) >= len(plain)


def test_a_profile_without_a_host_link_names_offload(cli) -> None:
    result = cli("step", "--model", "llama3-8b", "--seq", "32k", "--hw", "tpu-v5p-ici", "--gpus", "4",
                 "--global-batch", "4", "--offload", "optimizer")  # fmt: skip
    assert result.code == 2
    assert result.out == ""
    assert result.err.strip().splitlines() == [
        "cp-plan: error: --offload: optimizer copies over the host link, and profile 'tpu-v5p-ici' states no "
        "links.host"
    ]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--offload", "gpu"], "--offload"),
        (["--model", str(MIXTRAL), "--offload", "optimizer"], "--offload: offloading an MoE model"),
    ],
)
def test_bad_offload_input_is_one_line_and_exit_2(cli, args: list[str], expected: str) -> None:
    base = {
        "--model": "llama3-8b",
        "--seq": "32k",
        "--hw": "h100-nvlink",
        "--gpus": "8",
        "--global-batch": "8",
    }
    flags = [x for k, val in base.items() if k not in args for x in (k, val)]
    result = cli("step", *flags, *args)
    assert result.code == 2, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert expected in result.err


def test_a_host_link_states_both_directions_consistently() -> None:
    with pytest.raises(ValueError, match="not twice"):
        HostLink(name="PCIe", bandwidth_per_direction=50e9, bandwidth_bidirectional=50e9, source="[PCIe]")
    data = yaml.safe_load((data_dir("hardware") / "gb200-nvl72.yaml").read_text())
    data["links"]["host"]["devices_per_host"] = 73
    with pytest.raises(InputError, match="devices_per_host"):
        parse_profile(data, "bad", field="--hw")


def _args(name: str, v: dict) -> dict:
    return {a: v[a] for a in numeric.ARGS[name]}
