"""The whole training step: hand-checked FLOP counts, the pipeline bubble, the breakdown adding up to the
step, the kernel tables read back, and the CLI contract (JSON keys, one-line bad input)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.machines.kernels import attention_rate, gemm_rate
from costmodel.machines.profiles import load_profile
from costmodel.plans.job import Job
from costmodel.symbolic import numeric
from costmodel.training.step import bind, evaluate_step
from tests.support import formula

LLAMA8B = {"H": 4096, "F_ffn": 14336, "V": 128256, "n_L": 32, "g": 1, "h": 32, "n_kv": 8, "d": 128, "e_m": 2}


def test_model_flops_are_six_per_parameter_for_a_short_sequence() -> None:
    """6·P·tokens for a dense model (Llama 3 8B: 7.50 B weights that multiply, input embedding aside)."""
    per_token = formula("model_flops_per_token", **LLAMA8B, S=1)
    weights = (
        32 * (4096 * 128 * (2 * 32 + 2 * 8) + 3 * 4096 * 14336) + 128256 * 4096
    )  # Q, K, V, O, MLP; output
    assert per_token == pytest.approx(6 * weights, rel=0.01)


def test_executed_flops_match_model_flops_without_recompute_or_attention() -> None:
    """With S -> 1 and no recompute, what the device runs per token is 6 per weight (norms aside)."""
    hw = formula("hardware_flops_per_token", **LLAMA8B, S=1, c=0.5, rc_sel=0, rc_full=0)
    model = formula("model_flops_per_token", **LLAMA8B, S=1)
    assert hw == pytest.approx(model, rel=0.001)


def test_full_recompute_adds_a_third_of_the_matmul_flops() -> None:
    """Full recompute runs the forward again: 8 instead of 6 FLOP per weight [Korthikanti22 §6]."""
    args = LLAMA8B | {"S": 1, "c": 0.5, "rc_sel": 0, "V": 0}
    assert formula("hardware_flops_per_token", **args, rc_full=1) / formula(
        "hardware_flops_per_token", **args, rc_full=0
    ) == pytest.approx(8 / 6, rel=1e-5)  # S = 1: attention adds a few parts per million


def test_attention_flops_count_the_causal_half() -> None:
    """Causal attention of one layer on one device: c·S²/N pairs x 4·b·h·d / t; 8K tokens, 32 heads."""
    flops = numeric.layer_attn_flops(S=8192, N=1, b=1, h=32, d=128, c=0.5, t=1)
    assert flops == 0.5 * 8192**2 * 4 * 32 * 128


# The output layer's symbols; V = 0 leaves no output layer, so stages differ by their layers only.
HEAD = {"B_hbm": 3.35e12, "F_head": 6e14, "H": 16384, "N": 1, "S": 8192, "V": 128256, "b": 1, "t": 8}


def _pipeline(name: str, pp: int, first: int, middle: int, last: int, **values: float) -> float:
    stages = {"n_first": first, "n_mid": middle, "n_last": last, "n_L": first + (pp - 2) * middle + last}
    return formula(name, **(HEAD | values | stages))


@pytest.mark.parametrize(
    ("pp", "v", "m", "bubble"),
    [(2, 1, 8, 1 / 8), (8, 1, 64, 7 / 64), (8, 2, 64, 7 / 128), (16, 4, 32, 15 / 128)],
)
def test_pipeline_bubble_over_even_stages(pp: int, v: int, m: int, bubble: float) -> None:
    """(p-1)/m for 1F1B, (p-1)/(v·m) interleaved [Megatron21 §2.2], when the stages are alike."""
    fraction = _pipeline("pipeline_bubble_fraction", pp, 4, 4, 4, V=0, t_lay=1e-3, v_pp=v, m_mb=m)
    assert fraction == pytest.approx(bubble, rel=1e-12)


def test_one_stage_has_no_bubble() -> None:
    values = {"n_first": 32, "n_mid": 0, "n_last": 32, "n_L": 32}
    assert formula("pipeline_bubble_s", **(HEAD | values | {"t_lay": 1e-3, "v_pp": 1})) == 0.0


def test_slowest_stage_sets_the_pace_and_the_rest_is_the_bubble() -> None:
    """Llama 3 405B's split, 7 + 14 x 8 + 7 of 126 layers: with an output layer worth half a layer the
    middle stages (8 layers) are slowest; worth two layers, the last (7 layers and the output layer) is."""
    head = formula("head_s", **HEAD)
    for layers_worth, crit, on_last in ((0.5, 8, 0), (2.0, 7, 1)):
        t_lay = head / layers_worth
        args = {"t_lay": t_lay, "v_pp": 2}
        assert _pipeline("critical_stage_layers", 16, 7, 8, 7, **args) == crit
        assert _pipeline("critical_stage_head", 16, 7, 8, 7, **args) == on_last
        slowest = max(8 * t_lay, 7 * t_lay + head)
        assert _pipeline("stage_max_s", 16, 7, 8, 7, **args) == pytest.approx(slowest, rel=1e-12)
        bubble = (126 * t_lay + head - slowest) / 2
        assert _pipeline("pipeline_bubble_s", 16, 7, 8, 7, **args) == pytest.approx(bubble, rel=1e-12)


@pytest.mark.parametrize(
    ("pp", "v", "m", "in_flight"),
    [
        (4, 1, 8, 4),  # 1F1B: the warm-up's pp - 1 forwards and one more
        (4, 1, 2, 2),  # fewer micro-batches than stages: all of them
        (4, 2, 8, 4 * (1 + 3 / 8)),  # interleaved: 1 + (pp - 1)/(pp·v) times more [Korthikanti22 §4.2]
        (8, 4, 64, 8 * (1 + 7 / 32)),
    ],
)
def test_first_stage_keeps_its_warm_up_in_flight(pp: int, v: int, m: int, in_flight: float) -> None:
    assert numeric.first_stage_in_flight(pp=pp, v_pp=v, m_mb=m) == pytest.approx(in_flight, rel=1e-12)


def test_ring_exposure_is_zero_when_compute_hides_it_and_all_of_it_with_no_overlap() -> None:
    base = {
        "S": 131072,
        "b": 1,
        "N": 8,
        "n_kv": 8,
        "x_rep": 0,  # the kernel reads the KV heads as they are
        "d": 128,
        "p": 2,
        "t": 1,
        "B_cp": 450e9,
        "c": 0.5,
        "h": 64,
        "u_cp": 1.0,
        "F_attn": 600e12,
        "s_comm": 0.0,
        "x_att": 1.0,  # a fused kernel: no score matrix through HBM
        "k_sf": 0.0,
        "B_hbm": 3.35e12,
    }
    assert numeric.cp_ring_fwd_exposed_s(**base, o_cp=1.0) == 0.0
    assert numeric.cp_ring_fwd_exposed_s(**base, o_cp=0.0) == pytest.approx(
        numeric.cp_ring_fwd_s(**{k: base[k] for k in numeric.ARGS["cp_ring_fwd_s"]}), rel=1e-12
    )


SETUPS = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["llama3-8b", "llama3-70b", "llama2-7b"]),
        "seq": st.sampled_from([4096, 8192, 32768]),
        "hw": st.sampled_from(["a100-ib", "h100-ib", "h100-nvlink"]),
        "tp": st.sampled_from([1, 2, 8]),
        "cp": st.sampled_from([1, 2, 4]),
        "pp": st.sampled_from([1, 2, 4]),
        "vpp": st.sampled_from([1, 2]),
        "dp": st.sampled_from([1, 2, 8]),
        "m": st.sampled_from([4, 8]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "cp_scheme": st.sampled_from(["ring", "ulysses", "usp", "allgather"]),
        "layout": st.sampled_from(["contiguous", "zigzag"]),
        "zero3": st.booleans(),
    }
)


@settings(max_examples=40, deadline=None)
@given(SETUPS)
def test_breakdown_sums_to_the_step_and_utilisation_is_bounded(s: dict) -> None:
    vpp = s["vpp"] if s["pp"] > 1 else 1
    built = Job.of(
        model=s["model"],
        seq=s["seq"],
        hw=s["hw"],
        gpus=s["tp"] * s["cp"] * s["pp"] * s["dp"],
        tp=s["tp"],
        cp=s["cp"],
        pp=s["pp"],
        vpp=vpp,
        global_batch=s["m"] * s["dp"],
        recompute=s["recompute"],
        cp_scheme="ring" if s["cp_scheme"] == "ulysses" else s["cp_scheme"],
        layout=s["layout"],
        zero=3 if s["zero3"] else 1,
    )
    setup = built.setup
    step = evaluate_step(built).model_dump(by_alias=True)["step"]
    assert sum(step["breakdown"].values()) == pytest.approx(step["time_s"], rel=1e-12)
    assert all(value >= 0 for value in step["breakdown"].values())
    assert 0 < step["mfu"] <= step["hfu"] < 1 and step["mfu"] <= step["mfu_full_square"]
    assert step["tokens_per_s_per_gpu"] * setup.gpus == pytest.approx(step["tokens_per_s"], rel=1e-12)


def test_longer_pipeline_interleaving_shrinks_the_bubble() -> None:
    common = {
        "model": "llama3-70b",
        "seq": 8192,
        "hw": "h100-ib",
        "gpus": 64,
        "tp": 8,
        "pp": 8,
        "global_batch": 16,
    }
    plain = evaluate_step(Job.of(**common)).model_dump(by_alias=True)["step"]
    interleaved = evaluate_step(Job.of(**common, vpp=5)).model_dump(by_alias=True)["step"]
    assert interleaved["breakdown"]["pipeline_bubble_s"] == pytest.approx(
        plain["breakdown"]["pipeline_bubble_s"] / 5, rel=1e-9
    )
    assert interleaved["time_s"] < plain["time_s"]


def test_contiguous_causal_ring_pays_the_imbalance() -> None:
    """Contiguous causal: the slowest rank does N - 1/2 blocks for N/2 useful, u = N/(2N-1) [A-RingCost §6]."""
    job = Job.of(
        model="llama3-8b", seq=65536, hw="h100-nvlink", gpus=8, cp=8, global_batch=1, layout="contiguous"
    )
    values = bind(job)
    assert values["u_cp"] == pytest.approx(8 / 15, rel=1e-12)


def test_kernel_tables_read_back_their_published_points() -> None:
    """[FA3] Fig. 5: FlashAttention-3 forward, head dim 128, causal, 8k: 602 TFLOP/s; non-causal 16k: 648."""
    h100 = load_profile("h100-nvlink")
    assert attention_rate(h100, "bf16", 8192, 8192, 128, True, False) == pytest.approx(602e12, rel=1e-9)
    assert attention_rate(h100, "bf16", 16384, 16384, 128, False, False) == pytest.approx(648e12, rel=1e-9)
    assert attention_rate(h100, "bf16", 1 << 20, 1 << 20, 128, False, False) == pytest.approx(
        648e12, rel=1e-9
    )
    between = attention_rate(h100, "bf16", 3000, 3000, 128, False, False)
    assert 625e12 < between < 638e12
    # the GEMM table fitted to Vidur's H100 linear layers (hardware/h100-nvlink.yaml): 695.3 TFLOP/s at 8192
    assert gemm_rate(h100, "bf16", 8192, 8192, 8192) == pytest.approx(695.3e12, rel=1e-9)
    assert gemm_rate(h100, "fp8", 8192, 8192, 8192) == pytest.approx(
        1227.5e12, rel=1e-9
    )  # its fp8 table: 695.3 x 1402.6 / 794.5


def test_step_json_contract(cli) -> None:
    result = cli(
        "step",
        "--model",
        "llama3-8b",
        "--seq",
        "8k",
        "--hw",
        "h100-nvlink",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--cp",
        "2",
        "--pp",
        "2",
        "--micro-batch",
        "1",
        "--global-batch",
        "8",
        "--format",
        "json",
    )
    assert result.code == 0, result.err
    step = result.json()["step"]
    for key in (
        "time_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "model_tflops_per_gpu",
        "mfu",
        "hfu",
        "breakdown",
    ):
        assert key in step
    assert step["tokens_per_s"] == pytest.approx(8 * 8192 / step["time_s"], rel=1e-12)


def test_step_table_prints_the_headline(cli) -> None:
    result = cli(
        "step",
        "-m",
        "llama3-70b",
        "--seq",
        "8k",
        "--hw",
        "h100-ib",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--pp",
        "4",
        "--vpp",
        "2",
        "--global-batch",
        "32",
        "--recompute",
        "full",
    )
    assert result.code == 0 and "MFU" in result.out and "pipeline bubble" in result.out


STEP = ["step", "--model", "llama3-8b", "--seq", "8k", "--hw", "h100-nvlink"]
BAD = [
    (["--gpus", "24", "--tp", "3", "--global-batch", "8"], "--tp: 3 must divide the model's 32 heads"),
    (
        ["--gpus", "12", "--tp", "4", "--cp", "2", "--global-batch", "8"],
        "--gpus: 12 is not divisible by tp x cp x pp = 8",
    ),
    (
        ["--gpus", "8", "--global-batch", "12"],
        "--global-batch: 12 is not divisible by micro-batch x DP = 1 x 8",
    ),
    (
        ["--gpus", "8", "--attention-kernel", "unfused", "--cp", "2", "--global-batch", "4"],
        "--attention-kernel",
    ),
    (["--gpus", "8", "--global-batch", "8", "--recompute", "some"], "--recompute"),
    (["--gpus", "8", "--global-batch", "8", "--cp-scheme", "star"], "--cp-scheme"),
    (["--gpus", "8", "--global-batch", "8", "--tp", "0"], "--tp: must be >= 1 (got 0)"),
    (["--gpus", "8", "--global-batch", "8", "--vpp", "2"], "--vpp: interleaving needs --pp > 1"),
]


@pytest.mark.parametrize(("args", "expected"), BAD)
def test_bad_step_input_is_one_line_and_exit_2(cli, args: list[str], expected: str) -> None:
    result = cli(*STEP, *args)
    assert result.code == 2 and result.out == ""
    assert expected in result.err and result.err.count("\n") == 1, result.err


def test_profile_without_kernel_tables_needs_efficiency(cli, tmp_path) -> None:
    """A profile with no kernels: section cannot be read for rates; --efficiency stands in for them."""
    from costmodel.core.resources import data_dir

    text = (data_dir("hardware") / "h100-nvlink.yaml").read_text(encoding="utf-8")
    bare = tmp_path / "bare.yaml"
    bare.write_text(text.split("# Published kernel efficiency")[0], encoding="utf-8")
    args = ["step", "-m", "llama3-8b", "--seq", "8k", "--hw", str(bare), "--gpus", "8", "--global-batch", "8"]
    missing = cli(*args)
    assert missing.code == 2 and "has no kernels: section" in missing.err
    given_ = cli(*args, "--efficiency", "0.5", "-f", "json")
    assert given_.code == 0, given_.err
    assert given_.json()["rates"]["gemm_flops_per_s"] == pytest.approx(0.5 * 989e12, rel=1e-12)


def test_cli_and_hand_built_step_agree(cli) -> None:
    """`cp-plan step ... --format json` is evaluate_step over Job.of of the same flags, number for number."""
    flags = {
        "model": "llama3-70b",
        "seq": "32k",
        "hw": "h100-ib",
        "gpus": "64",
        "tp": "8",
        "cp": "4",
        "pp": "2",
        "vpp": "2",
        "micro_batch": "1",
        "global_batch": "16",
        "recompute": "full",
        "cp_scheme": "usp",
        "layout": "striped",
        "zero": "3",
    }
    args = [part for name, value in flags.items() for part in ("--" + name.replace("_", "-"), value)]
    result = cli("step", *args, "--format", "json")
    assert result.code == 0, result.err
    typed = {
        name: value if name in {"model", "hw", "recompute", "cp_scheme", "layout"} else int(value)
        for name, value in flags.items()
        if name != "seq"
    }
    by_hand = evaluate_step(Job.of(**typed, seq=32768)).model_dump(by_alias=True)
    assert result.json() == json.loads(json.dumps(by_hand))  # JSON floats round-trip exactly


def test_cp_and_n_are_one_flag(cli) -> None:
    common = (
        "step",
        "-m",
        "llama3-8b",
        "--seq",
        "32k",
        "--hw",
        "h100-nvlink",
        "--gpus",
        "8",
        "--global-batch",
        "2",
        "-f",
        "json",
    )
    assert cli(*common, "--cp", "4").json() == cli(*common, "--n", "4").json()


def test_groups_wait_on_the_link_their_placement_gives() -> None:
    """Ranks TP innermost, then CP, DP, PP: on 8-GPU nodes TP 8 stays on NVLink and CP crosses nodes, even on
    an -ib profile (whose one CP rank per node stands in for that TP); --cp-ranks-per-node moves a CP group
    off the node. TP's collectives are NCCL rings, at the bus bandwidth NCCL's model gives NVLink (370.8 of
    450 GB/s on SM90); the CP ring's sends use the link whole."""
    nvlink, ib = 450e9, 50e9
    rings = nvlink * 0.824
    job = Job.of(model="llama3-70b", seq=32768, hw="h100-ib", gpus=128, tp=8, cp=4, pp=2, global_batch=4)
    values = bind(job)
    assert (values["B_tp"], values["B_cp"], values["B_dp"], values["B_pp"]) == pytest.approx(
        (rings, ib, ib, ib)
    )
    job = Job.of(model="llama3-8b", seq=32768, hw="h100-ib", gpus=8, tp=2, cp=4, global_batch=1)
    assert bind(job)["B_cp"] == nvlink  # 2 x 4 ranks: one node
    job = Job.of(
        model="llama3-8b",
        seq=32768,
        hw="h100-nvlink",
        gpus=8,
        tp=2,
        cp=4,
        global_batch=1,
        cp_ranks_per_node=4,
    )
    values = bind(job)
    assert (values["B_tp"], values["B_cp"]) == pytest.approx(
        (rings, ib)
    )  # 4 ranks a node: 2 CP ranks, stride 2


def test_a_job_names_what_it_does_not_know() -> None:
    from costmodel.core.errors import InputError

    with pytest.raises(InputError, match="block: not an input of a training job"):
        Job.of(model="llama3-8b", global_batch=8, block=512)
    with pytest.raises(InputError, match="--model"):
        evaluate_step(Job.of(global_batch=8)).model_dump(by_alias=True)


def test_fewer_micro_batches_than_stages_is_a_legal_job_with_its_bubble() -> None:
    """Megatron runs m < pp (the stages wait): 1F1B takes (m + pp - 1) slots of a stage's layers, so the
    bubble is (pp - 1)/m of the layers' time over the m micro-batches; the output layer, on the last stage
    alone, is not in the fill and drain, and the bubble fraction is over the busy time, output layer and all."""
    parts = Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, pp=8, global_batch=4)
    step = evaluate_step(parts).model_dump(by_alias=True)["step"]
    per_layer = (
        "matmul_s",
        "attention_s",
        "elementwise_s",
        "host_wait_s",
        "recompute_s",
        "exposed_tp_s",
        "exposed_cp_s",
        "cp_ring_overhead_s",
        "exposed_ep_s",
        "moe_imbalance_s",
    )
    layers = sum(step["breakdown"][k] for k in per_layer)
    assert step["breakdown"]["pipeline_bubble_s"] == pytest.approx(7 / 4 * layers, rel=1e-9)
    busy = layers + step["breakdown"]["head_s"]
    assert step["bubble_fraction"] == pytest.approx(step["breakdown"]["pipeline_bubble_s"] / busy, rel=1e-9)


def test_step_states_memory_and_strict_fails_a_plan_that_does_not_fit(cli) -> None:
    """Llama 3 70B at 128K, no CP, TP or PP, no recompute: 4.16 TB per device (what recommend sizes the
    same layout at) of 80.7 GB usable (79.11 GiB a process can allocate, less 5 %). The step is marked, JSON
    says fits: false, --strict exits 1."""
    args = (
        "step",
        "--model",
        "llama3-70b",
        "--seq",
        "128k",
        "--hw",
        "h100-ib",
        "--gpus",
        "64",
        "--tp",
        "1",
        "--cp",
        "1",
        "--pp",
        "1",
        "--global-batch",
        "64",
        "--recompute",
        "none",
    )
    data = cli(*args, "-f", "json").json()
    assert data["schema"] == "cp-plan/step/v9"
    assert data["fits"] is False and data["memory"]["fits"] is False
    assert data["memory"]["bytes_per_device"] == pytest.approx(4.075e12, rel=1e-3)
    assert data["memory"]["device_memory_bytes"] == pytest.approx(0.95 * 79.11 * 2**30, rel=1e-5)
    table = cli(*args)
    assert table.code == 0 and "4.075 TB of 80.70 GB usable: DOES NOT FIT" in " ".join(table.out.split())
    assert "give back its cache" not in table.out  # far past the floor too: no hedge
    assert cli(*args, "--strict").code == 1
    assert cli(*args, "--strict", "-f", "json").code == 1
    recommend = cli("recommend", *args[1:], "-f", "json").json()
    sized = {c["n"]: c["total_bytes"] for c in recommend["candidates"]}
    assert sized[1] == pytest.approx(data["memory"]["bytes_per_device"], rel=1e-9)


def test_strict_passes_a_plan_that_fits(cli) -> None:
    args = (
        "step",
        "--model",
        "llama3-8b",
        "--seq",
        "8k",
        "--hw",
        "h100-ib",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--zero",
        "3",
        "--strict",
        "-f",
        "json",
    )
    result = cli(*args)
    assert result.code == 0 and result.json()["fits"] is True


def test_every_breakdown_field_is_a_term_of_step_time_s() -> None:
    """One formula and one field per term: the breakdown's formulas are STEP_TERMS, in order, and step_time_s
    is their sum (so the report's time is its breakdown's sum)."""
    from costmodel.symbolic import formulas
    from costmodel.training.report import FORMULAS, LABELS, StepBreakdown

    assert tuple(FORMULAS.values()) == formulas.STEP_TERMS
    assert set(LABELS) == set(StepBreakdown.model_fields)
    total = formulas.FORMULAS["step_time_s"].definition
    assert total == sum(formulas.FORMULAS[name].symbol for name in formulas.STEP_TERMS)
    report = evaluate_step(Job.of(model="llama3-8b", seq=8192, gpus=16, tp=2, pp=2, global_batch=16))
    parts = report.step.breakdown.model_dump()
    assert report.step.time_s == pytest.approx(sum(parts.values()), rel=1e-12)


def test_explain_shows_each_term_down_to_the_step_time(cli) -> None:
    result = cli("step", "--model", "llama3-8b", "--seq", "8192", "--gpus", "8", "--global-batch", "8",
                 "--explain", "--format", "json")  # fmt: skip
    rows = result.json()["explain"]
    from costmodel.training.report import FORMULAS

    names = [row["name"] for row in rows]
    assert set(FORMULAS.values()) <= set(names) and names[-1] == "step_time_s"
    assert rows[-1]["formula"].startswith("T_iter = ")
    assert float(rows[-1]["value"].split()[0]) == pytest.approx(result.json()["step"]["time_s"], rel=1e-5)


def test_a_job_runs_its_frameworks_attention_kernel_unless_it_names_one(tmp_path) -> None:
    """Megatron-DeepSpeed's core attention is unfused unless --use-flash-attn (frameworks/megatron-deepspeed.yaml):
    a job on it gets that kernel, a job naming flash keeps it, and the same job moved to Megatron-Core takes
    Core's. A framework naming a kernel the hardware has no table for is refused, naming --framework."""
    from costmodel.core.errors import InputError
    from costmodel.core.resources import data_dir

    job = {"model": "llama3-8b", "seq": 4096, "hw": "a100-nvlink", "gpus": 8, "global_batch": 8}
    deepspeed = Job.of(**job, framework="megatron-deepspeed")
    assert deepspeed.setup.attention_kernel == "unfused"
    assert (
        Job.of(**job, framework="megatron-deepspeed", attention_kernel="flash").setup.attention_kernel
        == "flash"
    )
    assert deepspeed.replace(framework="megatron").setup.attention_kernel == "flash"
    unfused, fused = (
        evaluate_step(j).step.time_s for j in (deepspeed, deepspeed.replace(attention_kernel="flash"))
    )
    assert unfused > fused  # the score matrices through HBM
    text = (
        (data_dir("frameworks") / "megatron.yaml")
        .read_text()
        .replace("attention_kernel: flash", "attention_kernel: nope")
    )
    (tmp_path / "fw.yaml").write_text(text)
    with pytest.raises(InputError, match="time.attention_kernel 'nope'") as caught:
        Job.of(**job, framework=str(tmp_path / "fw.yaml"))
    assert caught.value.field == "--framework"


def test_a_job_shards_as_its_framework_does_unless_it_names_a_zero_stage(cli) -> None:
    """Megatron-Core's data parallelism is its distributed optimizer (ZeRO-1), torchtitan's and accelerate's
    FSDP2 (ZeRO-3): a job that names no stage gets its framework's, in the step, in every plan a search makes
    (each a candidate of the job) and in the plan it exports; a job naming --zero keeps it, and a job moved to
    another framework takes that one's."""
    job = {"model": "llama3-8b", "seq": 8192, "hw": "h100-nvlink", "gpus": 16, "global_batch": 16}
    stages = {fw: Job.of(**job, framework=fw).setup.zero for fw in ("megatron", "torchtitan", "hf-trainer")}
    assert stages == {"megatron": 1, "torchtitan": 3, "hf-trainer": 3}
    titan = Job.of(**job, framework="torchtitan")
    assert Job.of(**job, framework="torchtitan", zero=1).setup.zero == 1
    assert titan.replace(framework="megatron").setup.zero == 1
    assert titan.candidate(tp=2, cp=1, gpus=16).setup.zero == 3
    fsdp, zero1 = (evaluate_step(j).memory for j in (titan, titan.replace(zero=1)))
    assert fsdp.model_state_bytes < zero1.model_state_bytes / 2  # FSDP shards the fp32 weights and gradients
    args = ["recommend", "--model", "llama3-8b", "--seq", "8192", "--hw", "h100-nvlink", "--gpus", "16"]
    data = cli(*args, "--global-batch", "16", "--framework", "torchtitan", "-f", "json").json()
    assert data["setup"]["zero"] == 3
    exported = cli(*args, "--global-batch", "16", "--framework", "torchtitan", "--format", "torchtitan").out
    assert "data_parallel_shard_degree" in exported


def test_a_plan_refused_only_by_the_allocator_reserve_says_so(cli) -> None:
    """USP's Llama 3 8B at 64K on 16 A800s, ring 16, no recompute (it ran): reserved 82.4 GB of 80.7 usable,
    its tensors and the runtime 77.6 GB. It stays refused (the fit is the reservation) and the line says the
    floor would fit and that published runs this tight went both ways."""
    args = "step --model llama3-8b --seq 65536 --hw a800-nvlink --gpus 16 --tp 1 --cp 16 --global-batch 1"
    result = cli(*args.split(), "--recompute", "none", "--cp-scheme", "ring", "--framework", "megatron")
    text = " ".join(result.out.split())
    assert result.code == 0 and "82.36 GB of 80.74 GB usable: DOES NOT FIT" in text
    assert (
        "its tensors and the runtime, 77.64 GB, would fit only were the allocator to give back its cache"
        in text
    )
