"""A framework's host time per kernel: the figure a profile states, derived from public measurements, and the
step reading it in place of the hardware's eager-PyTorch floor (frameworks/*.yaml ``time.host_s_per_kernel``)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from costmodel.audit.runs import MeasuredRun, parse_assumptions, read_runs
from costmodel.frameworks.profiles import load_framework
from costmodel.machines.profiles import HardwareProfile, load_profile
from costmodel.plans.bind import Evaluator
from costmodel.plans.job import Job
from costmodel.training.step import LAYER_KERNELS, bind, evaluate_step, term_values

CLUSTER = str(Path(__file__).parent / "data" / "runs" / "a100-vtrain.yaml")

# CPU time of one Linear forward call, bf16, hidden 2,048, 8,192 tokens [TE-2053]: (host, torch's nn.Linear,
# Transformer Engine's Linear), in µs; None where [TE-2053] shows no row.
LINEAR_CALL_US = [
    ("H100 DGX, Xeon Platinum 8480C", 13.48, None),
    ("GH200, Grace", 33.17, 90.53),
    ("GB200, Grace", 37.08, 99.66),
]
# benchmarks/host_overhead.py: Megatron's GPT layer, full recompute, dispatches 94 operators that launch a
# kernel; the step counts LAYER_KERNELS["unfused"] forward twice and backward once.
OPERATORS_PER_LAYER = 94


def derived_host_s_per_kernel() -> float:
    """x86 torch per operator x (a framework's module over torch's, same host) x operators per counted kernel."""
    x86 = next(torch for host, torch, _ in LINEAR_CALL_US if "Xeon" in host)
    framework_over_torch = statistics.mean(te / torch for _, torch, te in LINEAR_CALL_US if te is not None)
    forward, backward = LAYER_KERNELS["unfused"]
    return x86 * 1e-6 * framework_over_torch * OPERATORS_PER_LAYER / (2 * forward + backward)


def test_the_derivation_steps() -> None:
    """2.71 the framework's module over torch's; 65 counted kernels a layer; 52.8 µs in all."""
    ratios = [te / torch for _, torch, te in LINEAR_CALL_US if te is not None]
    assert ratios == pytest.approx([2.729, 2.688], abs=1e-3)
    assert 2 * LAYER_KERNELS["unfused"][0] + LAYER_KERNELS["unfused"][1] == 65
    assert derived_host_s_per_kernel() == pytest.approx(52.8e-6, rel=1e-3)


def test_megatron_deepspeed_states_the_derived_figure() -> None:
    stated = load_framework("megatron-deepspeed").time.host_s_per_kernel
    assert stated == pytest.approx(derived_host_s_per_kernel(), rel=2e-3)


def test_frameworks_without_a_figure_read_the_hardware_floor() -> None:
    assert load_framework("megatron").time.host_s_per_kernel is None


# A host-bound run: GPT of hidden 1,024, 24 layers, micro-batch 1, TP 4 (a row of vTrain's single-node table).
ROW = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
)
ROW += "data parallelism,pipeline parallelism,iteration time (ms)\n4,8,1,1024,16,24,1024,4,1,1,340\n"
ASSUME = [
    "recompute=full",
    "precision=fp16",
    "attention_kernel=unfused",
    "dp_overlap=0",
    "sequence_parallel=false",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> MeasuredRun:
    path = tmp_path_factory.mktemp("runs") / "row.csv"
    path.write_text(ROW, encoding="utf-8")
    return read_runs(str(path), parse_assumptions(ASSUME), CLUSTER).runs[0]


def _job(run: MeasuredRun, framework: str, profile: HardwareProfile | None = None) -> Job:
    return Job.of(**(run.values | {"framework": framework}), _model=run.model, _profile=profile)


def test_the_framework_figure_is_the_steps_host_time_per_kernel(run: MeasuredRun) -> None:
    """The two frameworks bind the same step but for t_k, and the step is the formula at that t_k."""
    plain, framework = bind(_job(run, "megatron")), bind(_job(run, "megatron-deepspeed"))
    assert plain["t_k"] == load_profile(CLUSTER).kernels.launch_s
    assert framework["t_k"] == load_framework("megatron-deepspeed").time.host_s_per_kernel
    differ = {k for k in plain if plain[k] != framework[k]}
    # k_merge: a ring step's merge, which a CP-1 step does not run; x_lf: where LoRA's adapters sit, none here
    assert differ - {"k_merge", "x_lf"} == {"t_k"}
    job = _job(run, "megatron-deepspeed")
    at = Evaluator(term_values(plain | {"t_k": framework["t_k"]}, job.step.cp_scheme, job.model))
    step = evaluate_step(job).step.time_s
    assert step == pytest.approx(float(at("step_time_s")), rel=1e-9)
    assert step > evaluate_step(_job(run, "megatron")).step.time_s  # host-bound: the longer host time shows


def test_a_measured_profile_keeps_its_own_host_time(run: MeasuredRun) -> None:
    """A profile fitted to a cluster's runs measured the framework they ran: its kernels.launch_s stands."""
    data = load_profile(CLUSTER).model_dump(mode="python", exclude_none=True)
    data["kernels"]["launch_s"] = 40e-6
    data["source"] = {"kind": "measured", "url": data["source"]["url"], "host": "runs", "date": "2026-01-01"}
    fitted = HardwareProfile.model_validate(data)
    assert bind(_job(run, "megatron-deepspeed", fitted))["t_k"] == 40e-6
