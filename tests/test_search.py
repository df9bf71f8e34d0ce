"""The layout search: the vectorised ranking is the plain loop's, constraints fix what they name, an empty
set names its culprit, and the exports carry only the frameworks' own argument names."""

from __future__ import annotations

import argparse
import functools
import shlex
import tomllib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.frameworks import builtin_frameworks
from costmodel.plans.job import Job
from costmodel.plans.stages import StageSplit
from costmodel.training.search import (
    Constraints,
    _compute_bound,
    _Shapes,
    enumerate_plans,
    evaluate_plan,
    evaluate_table,
    framework_pairs,
    plan_as_job,
    search,
    search_loop,
    sensitivity,
    why_lost,
    with_pairs,
)
from costmodel.training.step import bind, compute_values, evaluate_step
from tests.support import REPO, every_scheme, searched

KEYS = ("tp", "cp", "pp", "vpp", "dp", "micro_batch", "recompute", "cp_scheme", "layout")


def _job(model: str = "llama3-8b", seq: int = 32768, hw: str = "h100-ib", gpus: int = 16, **extra):  # noqa: ANN202
    return searched(
        model=model, seq=seq, hw=hw, gpus=gpus, global_batch=extra.pop("global_batch", 16), **extra
    )


@pytest.mark.parametrize(
    ("job", "constraints"),
    [
        ({}, Constraints()),  # GQA (8 KV heads): ring, USP 2x4 and Ulysses all appear
        ({"model": "llama2-7b", "gpus": 8, "zero": 3, "global_batch": 8}, Constraints(recompute="selective")),
        # hybrid sharding in groups of 4: the layouts whose DP x CP the groups tile, two links each
        ({"gpus": 16, "zero": 3, "zero_shard": 4}, Constraints(recompute="full")),
    ],
)
def test_vectorised_search_ranks_as_the_plain_loop(job: dict, constraints: Constraints) -> None:
    """Every plan that fits, in the same order, each step time equal to evaluate_step's to 1e-12."""
    built = _job(**job)
    fast = search(*built, constraints, top=None).plans
    slow = search_loop(*built, constraints)
    assert len(fast) == len(slow) > 100
    assert [tuple(p[k] for k in KEYS) for p in fast] == [
        tuple(p[k] if p["cp"] > 1 else {"cp_scheme": "none", "layout": None}.get(k, p[k]) for k in KEYS)
        for p in slow
    ]
    for a, b in zip(fast, slow, strict=True):
        assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12)
        assert a["memory_bytes"] == pytest.approx(b["memory_bytes"], rel=1e-12)
        assert a["mfu"] == pytest.approx(b["mfu"], rel=1e-12)


def test_the_pick_is_the_step_of_its_own_flags(cli) -> None:
    """`cp-plan step` with the picked layout, uneven stages and the GPUs it uses, predicts the time the
    search ranked it by, to 1e-9: Llama 3 405B at 128K on 16,384 H100s picks an uneven split."""
    job = {"model": "llama3-405b", "seq": 131072, "hw": "h100-nvlink", "gpus": 16384, "global_batch": 128}
    best = search(*searched(**job), top=1).plans[0]
    assert not StageSplit.of(best).even
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in job.items() if k != "gpus"]
    for name in ("gpus", "tp", "cp", "pp", "vpp", "micro_batch", "recompute", "first_stage_layers",
                 "last_stage_layers", "cp_scheme", "layout"):  # fmt: skip
        flags.append(f"--{name.replace('_', '-')}={best[name]}")
    if best["tp_comm_overlap"]:
        flags.append("--tp-comm-overlap")
    step = cli("step", *flags, "--format", "json").json()["step"]
    assert step["time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)


def _published_jobs() -> list:
    from costmodel.training.validation import ROWS

    return [row for row in ROWS if row.setup.get("model")]


@pytest.mark.parametrize("row", _published_jobs(), ids=lambda row: row.key)
def test_the_search_never_loses_to_a_published_plan(row) -> None:
    """Each published plan of docs/validation.md that fits is in the search's space, so the search's pick
    on the same job (GPUs, batch, machine, overlaps) is never slower under the same model."""
    published = evaluate_step(row.job).model_dump(by_alias=True)
    best = search(*searched(**row.setup), top=1).plans
    if published["fits"]:
        assert best and best[0]["step_time_s"] <= published["step"]["time_s"] * (1 + 1e-9)


# Random legal plans of one job: any TP dividing the heads, CP the sequence, any depth with the splits and
# virtual stages the search tries, any DP the GPUs and the batch allow, any micro-batch size and scheme.
JOB = {"model": "llama3-8b", "seq": 32768, "hw": "h100-ib", "gpus": 16, "global_batch": 16}


@functools.cache
def _best_of_job() -> float:
    return search(*searched(**JOB), top=1).plans[0]["step_time_s"]


@st.composite
def _legal_plans(draw: st.DrawFn) -> dict:
    from costmodel.plans.stages import candidate_splits
    from costmodel.schedule.layouts import divisors

    gpus, layers, batch = JOB["gpus"], 32, JOB["global_batch"]
    tp = draw(st.sampled_from([t for t in divisors(32) if t <= gpus]))
    cp = draw(st.sampled_from([n for n in (1, 2, 4, 8, 16) if tp * n <= gpus]))
    pp = draw(st.integers(1, min(layers, gpus // (tp * cp))))
    split = draw(st.sampled_from(candidate_splits(layers, pp)))
    mb = draw(st.sampled_from([b for b in (1, 2, 4, 8) if batch % b == 0]))
    dp = draw(st.sampled_from([d for d in divisors(batch // mb) if tp * cp * pp * d <= gpus]))
    sizes = [split.first, split.last] + ([split.middle] if pp > 2 else [])
    vpps = [1] + [v for v in divisors(max(sizes)) if 1 < v <= min(sizes)] * (batch // (mb * dp) >= pp > 1)
    plan = {
        "gpus": tp * cp * pp * dp,
        "tp": tp,
        "cp": cp,
        "pp": pp,
        "vpp": draw(st.sampled_from(vpps)),
        "micro_batch": mb,
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        # pipelined TP collectives need the TP group inside one node of 8 (userbuffers, AsyncTP)
        "tp_comm_overlap": 1 < tp <= 8 and draw(st.booleans()),
    }
    if pp > 1:
        plan |= {"first_stage_layers": split.first, "last_stage_layers": split.last}
    if cp > 1:
        plan |= {"cp_scheme": draw(st.sampled_from(["ring", "allgather", "ulysses"])), "layout": "zigzag"}
    return plan


@settings(max_examples=40, deadline=None)
@given(plan=_legal_plans())
def test_the_search_never_loses_to_a_random_legal_plan(plan: dict) -> None:
    try:
        result = evaluate_step(Job.of(**(JOB | plan))).model_dump(by_alias=True)
    except InputError:  # Ulysses needs CP to divide the heads a TP rank holds
        assert plan.get("cp_scheme") == "ulysses"
        return
    if result["fits"]:
        assert _best_of_job() <= result["step"]["time_s"] * (1 + 1e-9)


@settings(max_examples=12, deadline=None)
@given(
    gpus=st.sampled_from([8, 16, 32]),
    fixed=st.sampled_from([{"tp": 2}, {"cp": 4}, {"pp": 2}, {"recompute": "full"}, {"cp_scheme": "ulysses"}]),
)
def test_fixing_a_dimension_keeps_it_and_never_beats_the_free_search(gpus: int, fixed: dict) -> None:
    built = _job(gpus=gpus, global_batch=32)
    free = search(*built, top=None)
    held = search(*built, Constraints(**fixed), top=None)
    assert all(p[k] == v for p in held.plans for k, v in fixed.items())
    times = [p["step_time_s"] for p in free.plans]
    assert times == sorted(times) and all(p["memory_bytes"] <= p["device_memory_bytes"] for p in free.plans)
    if held.plans:
        assert held.plans[0]["step_time_s"] >= free.plans[0]["step_time_s"] * (1 - 1e-12)


@pytest.mark.parametrize("framework", builtin_frameworks())
def test_frameworks_keep_only_what_they_run(framework: str) -> None:
    job, batch = _job(gpus=32, global_batch=32, framework=framework)
    runs = framework_pairs(job.framework)
    plans = search(job, batch, top=None).plans
    assert plans and all((p["cp_scheme"], p["layout"]) in runs for p in plans if p["cp"] > 1)
    assert {p["cp_scheme"] for p in plans if p["cp"] > 1} <= set(job.framework.time.cp_schemes)


def test_a_whole_sequence_scheme_shards_the_sequence_as_its_framework_does(cli) -> None:
    """Ulysses has no layout: DeepSpeed's ranks hold contiguous shards (S divides by N: 15.5M over 32, as
    Arctic Long Sequence Training ran), Megatron-Core's its zigzag chunks (S divides by 2N), so the same job
    is planned on one and refused in one line on the other; the search finds the DeepSpeed plan too."""
    job = [
        "--model",
        "llama3-8b",
        "--seq",
        "15500000",
        "--gpus",
        "32",
        "--hw",
        "h100-ib",
        "--global-batch",
        "1",
    ]
    deepspeed = cli(
        "step", *job, "--cp", "32", "--cp-scheme", "ulysses", "--framework", "deepspeed", "-f", "json"
    )
    assert deepspeed.code == 0 and deepspeed.json()["step"]["time_s"] > 0
    megatron = cli("step", *job, "--cp", "32", "--cp-scheme", "ulysses", "--framework", "megatron")
    assert megatron.code == 2 and "2N = 64 (zigzag layout)" in megatron.err
    odd = 32 * 31_745  # 1,015,840 tokens: a multiple of 32, not of 64
    found = search(Job.of(model="llama3-8b", seq=odd, hw="h100-ib", gpus=32, framework="deepspeed", zero=3), 1,
                   Constraints(cp=32), top=None).plans  # fmt: skip
    assert found and {(p["cp_scheme"], p["cp"]) for p in found} == {("ulysses", 32)}


def test_a_framework_of_every_scheme_searches_every_layout() -> None:
    every = search(
        *every_scheme(model="llama3-8b", seq=32768, hw="h100-ib", gpus=32, global_batch=32), top=None
    )
    assert {p["layout"] for p in every.plans if p["cp"] > 1} == {"zigzag", "striped", "contiguous"}


def test_sensitivity_moves_the_right_way() -> None:
    """A slower inter-node link never speeds the pick up; 10 % more tokens cost at least 10 % more time;
    one more recompute level costs time and saves no memory it did not already save."""
    built = _job(model="llama3-70b", seq=65536, gpus=64, global_batch=16)
    pick = search(*built, top=1).plans[0]
    link, longer, recompute, *hybrid = sensitivity(pick, *built)
    assert link["step_time_change"] >= 0
    assert longer["step_time_change"] >= 0.10
    if pick["recompute"] != "full":
        assert recompute["step_time_change"] > 0 and recompute["memory_bytes"] <= pick["memory_bytes"]
    again = evaluate_plan(pick, *built)
    assert again["step_time_s"] == pytest.approx(pick["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("zero", [3, 0])
def test_sensitivity_tries_the_pick_sharded_per_node(zero: int) -> None:
    """FSDP across 8 nodes: the what-ifs end with the pick sharded in groups of one node's DP x CP ranks, the
    step and memory `step --zero-shard` gives it (more memory: 1/8 of the states, not 1/64 of them); DDP shards
    nothing, so there is nothing to try."""
    job, batch = _job(gpus=64, global_batch=64, zero=zero, recompute="full")
    pick = search(job, batch, top=1).plans[0]
    said = sensitivity(pick, job, batch)
    if zero == 0:
        assert len(said) == 3
        return
    group = 8 // pick["tp"]
    hybrid = said[-1]
    assert hybrid["change"] == f"ZeRO in groups of {group}, one node each (hybrid sharding)"
    again = evaluate_step(plan_as_job(pick, job, batch).replace(zero_shard=group))
    assert hybrid["step_time_s"] == pytest.approx(again.step.time_s, rel=1e-9)
    assert hybrid["memory_bytes"] == pytest.approx(again.memory.bytes_per_device, rel=1e-9)
    assert hybrid["memory_bytes"] > pick["memory_bytes"]


@pytest.mark.parametrize("extra", [{}, {"framework": "torchtitan"}, {"model": "llama3-70b", "gpus": 64}])
def test_a_layouts_bound_is_its_fastest_pairs(extra: dict) -> None:
    """Bounded before the (scheme, layout) pairs multiply it, a layout's bound is the least of the bounds of
    the plans it becomes: pruning layouts first removes no plan that the plans' own bound keeps."""
    job, batch = _job(**{"global_batch": 64, **extra})
    layouts, shape_pairs = enumerate_plans(job, batch, Constraints(), expand=False)
    layouts.columns["row"] = np.arange(len(layouts))
    shapes = _Shapes(job)
    per_layout = _compute_bound(layouts, shapes, shape_pairs)
    table = with_pairs(layouts, shape_pairs, job)
    per_plan = _compute_bound(table, shapes)
    least = np.full(len(layouts), np.inf)
    np.minimum.at(least, table.columns["row"], per_plan)
    assert len(table) > len(layouts) and np.isfinite(per_layout).any()
    assert np.array_equal(per_layout, least)


@pytest.mark.parametrize(
    "extra",
    [
        {"gpus": 64, "global_batch": 64},  # pipelines with interleaving and uneven splits
        {"model": "llama3-70b", "seq": 65536, "gpus": 128, "global_batch": 32, "framework": "torchtitan"},
        {"model": "deepseek-v3", "seq": 8192, "gpus": 256, "global_batch": 256},  # MoE: EP and its all-to-all
        {
            "model": "gpt3-175b",
            "seq": 8192,
            "hw": "a100-nvlink",
            "gpus": 128,
            "global_batch": 128,
            "framework": "megatron-deepspeed",
        },  # unfused attention  # fmt: skip
    ],
)
def test_the_compute_bound_never_exceeds_a_plans_step(extra: dict) -> None:
    """The branch-and-bound's premise: every plan's bound (its stages' multiplies and attention and the
    pipeline's fill and drain) is at most its step, so pruning by it never drops a faster plan. The bound
    is also tight enough to prune: its median is above half the step."""
    job, batch = _job(**extra)
    table, _ = enumerate_plans(job, batch, Constraints())
    shapes = _Shapes(job)
    ratio = _compute_bound(table, shapes) / evaluate_table(table, job, shapes)["time_s"]
    assert len(table) > 1000 and (table.columns["vpp"] > 1).any()
    assert ratio.max() <= 1 + 1e-12
    assert np.median(ratio) > 0.4


def test_a_jobs_fixed_ulysses_degree_is_not_carried_into_other_plans() -> None:
    """A search chooses each plan's USP split itself: a job stated with --ulysses-degree 8 at CP 16 (which 8
    does not divide at CP 2 or 4) searches as the same job without it."""
    flags = {"model": "llama3-8b", "seq": 65536, "hw": "a800-nvlink", "gpus": 16, "cp": 16, "global_batch": 1}
    fixed = Job.of(**flags, cp_scheme="usp", ulysses_degree=8)
    free = Job.of(**flags, cp_scheme="usp")
    got, want = search(fixed, 1, top=5).plans, search(free, 1, top=5).plans
    assert got and [p["step_time_s"] for p in got] == [p["step_time_s"] for p in want]
    assert {p["cp"] for p in search(fixed, 1, top=None).plans} > {16}


def test_a_shapes_compute_part_is_what_its_binding_holds() -> None:
    """The symbols a lower bound reads, bound alone, equal the whole binding's (1e-12)."""
    job, _ = _job(cp=8, global_batch=8)
    part, whole = compute_values(job), bind(job)
    assert part.keys() <= whole.keys()
    assert all(whole[k] == pytest.approx(v, rel=1e-12) for k, v in part.items())


def _sensitivity_by_search(plan: dict, job: Job, batch: int, constraints: Constraints) -> list[dict]:
    """The what-ifs the straightforward way: the pick evaluated again and a whole search per scenario."""
    from costmodel.machines.binding import Machine
    from costmodel.machines.compose import ProfileChanges, override

    machine = job.machine
    inter = machine.profile.links.inter_node
    slower = Machine(
        override(machine.profile, ProfileChanges(inter_bandwidth=inter.bandwidth_per_direction / 2)),
        machine.dtype,
        machine.efficiency,
    )
    unit = 2 * plan["cp"]
    longer = job.replace(seq=-(-job.inputs.seq * 11 // (10 * unit)) * unit)
    out = []
    for at in (job.on(slower), longer):
        row = evaluate_plan(plan, at, batch)
        best = search(at, batch, constraints, top=1).plans
        out.append((row, best[0] if best else None))
    return out


@pytest.mark.parametrize(
    ("job", "constraints"),
    [
        ({"gpus": 64, "global_batch": 64}, Constraints()),  # shapes inside one node keep their binding
        ({"hw": "h100-nvlink", "gpus": 8, "global_batch": 8}, Constraints()),  # no group reaches the link
        ({"model": "llama3-70b", "seq": 65536, "gpus": 64}, Constraints(recompute="selective")),
        ({"gpus": 128, "global_batch": 32, "framework": "torchtitan"}, Constraints(tp=4)),
    ],
)
@pytest.mark.parametrize("reuse", [True, False])
def test_sensitivity_is_a_search_per_scenario(job: dict, constraints: Constraints, reuse: bool) -> None:
    """Reusing the search's candidates and shapes, or skipping a scenario that cannot move anything, gives
    what a whole search per scenario gives, to 1e-9."""
    built = _job(**job)
    found = search(*built, constraints, top=1)
    pick = found.plans[0]
    got = sensitivity(pick, *built, constraints, found if reuse else None)
    for item, (row, best) in zip(got, _sensitivity_by_search(pick, *built, constraints), strict=False):
        assert item["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9)
        assert item["memory_bytes"] == pytest.approx(row["memory_bytes"], rel=1e-9)
        assert item["fits"] == (row["memory_bytes"] <= row["device_memory_bytes"])
        if item["best"] is None:  # the pick stays the fastest
            assert best is not None and all(best[k] == pick[k] for k in KEYS if k != "dp")
        else:
            assert {k: item["best"][k] for k in KEYS} == {k: best[k] for k in KEYS}
            assert item["best"]["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    recompute = got[2]
    if pick["recompute"] != "full":
        again = evaluate_plan(
            pick | {"recompute": "selective" if pick["recompute"] == "none" else "full"}, *built
        )
        assert recompute["step_time_s"] == pytest.approx(again["step_time_s"], rel=1e-9)


RECOMMEND = ["recommend", "--model", "llama3-8b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "1024"]


def test_recommend_json_contract(cli) -> None:
    result = cli(*RECOMMEND, "--tp", "8", "--format", "json")
    assert result.code == 0, result.err
    data = result.json()
    rec = data["recommendation"]
    for key in (
        "tp",
        "cp",
        "pp",
        "dp",
        "micro_batch",
        "recompute",
        "cp_scheme",
        "layout",
        "step_time_s",
        "mfu",
    ):
        assert rec[key] is not None, key
    assert rec["tp"] == 8 and rec["tp"] * rec["cp"] * rec["pp"] * rec["dp"] == 1024
    assert rec["global_batch"] == 32  # 4M tokens of 128k sequences
    search_ = data["search"]
    assert len(search_["plans"]) == 5 and search_["plans"][0]["step_time_s"] == rec["step_time_s"]
    assert all("why_lost" in p for p in search_["plans"][1:])
    assert [s["change"].split(" ")[0] for s in search_["sensitivity"]] == [
        "inter-node",
        "sequence",
        "recompute",
    ]
    assert set(search_["plans"][0]["exposed_s"]) == {"TP", "CP", "PP", "DP"}


def test_a_runner_up_says_why_it_lost_and_never_lost_by_a_negative_margin() -> None:
    """Behind the pick: by how much and the two components that grow most. Predicted faster than a pick chosen
    for simplicity or memory (indistinguishable at the level): that rule, with the margin the other way."""
    pick = {"step_time_s": 10.0, "breakdown": {"matmul_s": 6.0, "attention_s": 3.0, "exposed_tp_s": 1.0}}
    slower = {"step_time_s": 10.5, "breakdown": {"matmul_s": 6.0, "attention_s": 3.1, "exposed_tp_s": 1.4}}
    faster = {"step_time_s": 9.84, "breakdown": {"matmul_s": 6.0, "attention_s": 2.84, "exposed_tp_s": 1.0}}
    assert why_lost(slower, pick).startswith("lost by +5.0%: ")
    assert why_lost(faster, pick) == (
        "predicted 1.6% faster, but cannot be told from the pick, which is simpler or safer"
    )
    assert why_lost(dict(pick), pick) == "lost by +0.0%"


def test_recommend_table_shows_the_plans_side_by_side(cli) -> None:
    out = cli(*RECOMMEND).out
    assert "Layout search" in out and "#2 lost by" in out and "inter-node link 2x slower" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpus", "48", "--tp", "3"], "--tp: 3 must divide the model's 32 heads"),
        (["--gpus", "8", "--cp", "16"], "--gpus: 8 GPUs are fewer than the fixed tp x cp x pp = 16"),
        (["--gpus", "8", "--pp", "3"], "--gpus"),
        (["--gpus", "64", "--pp", "64"], "--pp: 64 pipeline stages exceed the model's 32 layers"),
        (["--gpus", "8", "--cp", "0"], "--cp"),
        (["--gpus", "64", "--vpp", "17"], "--vpp: 17 virtual stages on each of at least 2 stages make 34"),
    ],
)
def test_bad_constraints_are_one_line_and_exit_2(cli, args: list[str], expected: str) -> None:
    result = cli("recommend", "--model", "llama3-8b", "--seq", "32k", *args)
    assert result.code == 2 and result.out == ""
    assert expected in result.err and result.err.count("\n") == 1, result.err


def test_an_empty_set_names_the_constraint_that_empties_it(cli) -> None:
    args = ["recommend", "--model", "llama3-70b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "64"]
    data = cli(*args, "--tp", "1", "--pp", "1", "-f", "json").json()
    reason = data["search"]["empty_reason"]
    assert data["recommendation"]["step_time_s"] is None
    assert reason.startswith("no plan fits memory") and "empties it: --tp (plans fit without it)" in reason
    exported = cli(*args, "--tp", "1", "--format", "megatron")
    assert exported.code == 2 and exported.err.startswith("cp-plan: error: --tp: nothing to export")


# Megatron-LM's arguments as megatron/training/arguments.py declares them (commit d98e8a64, 2026-08-22): the
# literal add_argument calls, and the fields of ModelParallelConfig, TransformerConfig and TrainingConfig
# that its ArgumentGroupFactory turns into flags (x_y -> --x-y; list -> nargs='+'; False bool -> store_true).
MEGATRON = {
    "--tensor-model-parallel-size": {"type": int},
    "--pipeline-model-parallel-size": {"type": int},
    "--context-parallel-size": {"type": int},
    "--num-virtual-stages-per-pipeline-rank": {"type": int},
    "--cp-comm-type": {"nargs": "+", "choices": ["p2p", "a2a", "allgather", "a2a+p2p"]},
    "--hierarchical-context-parallel-sizes": {"nargs": "+", "type": int},
    "--sequence-parallel": {"action": "store_true"},
    "--micro-batch-size": {"type": int},
    "--global-batch-size": {"type": int},
    "--seq-length": {"type": int},
    "--recompute-granularity": {"choices": ["full", "selective"]},
    "--recompute-method": {"choices": ["uniform", "block"]},
    "--recompute-num-layers": {"type": int},
    "--decoder-first-pipeline-num-layers": {"type": int},
    "--tp-comm-overlap": {"action": "store_true"},
    "--expert-model-parallel-size": {"type": int},
    "--decoder-last-pipeline-num-layers": {"type": int},
    "--use-distributed-optimizer": {"action": "store_true"},
    "--num-distributed-optimizer-instances": {"type": int},
    "--overlap-grad-reduce": {"action": "store_true"},
    "--overlap-param-gather": {"action": "store_true"},
}


def _megatron_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    for name, spec in MEGATRON.items():
        parser.add_argument(name, **spec)
    return parser


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--tp", "8", "--cp-scheme", "usp", "--model", "llama2-7b"],
        ["--cp-scheme", "ulysses", "--recompute", "full", "--model", "llama2-7b"],  # MHA: 32 KV heads
        ["--pp", "4", "--zero", "0", "--cp-scheme", "allgather"],
        ["--zero-shard", "8"],
    ],
)
def test_megatron_export_parses_as_megatron_arguments(cli, extra: list[str]) -> None:
    args = [*RECOMMEND, *extra]
    if "--model" in extra:
        args = args[:1] + args[3:]
    result = cli(*args, "--format", "megatron")
    assert result.code == 0, result.err
    parsed = _megatron_parser().parse_args(shlex.split(result.out.replace("\\\n", " ")))
    plan = cli(*args, "--format", "json").json()["recommendation"]
    assert parsed.tensor_model_parallel_size == plan["tp"] and parsed.context_parallel_size == plan["cp"]
    assert (
        parsed.pipeline_model_parallel_size == plan["pp"] and parsed.micro_batch_size == plan["micro_batch"]
    )
    assert parsed.seq_length == 131072 and parsed.global_batch_size == 32
    if plan["cp"] > 1:
        comm = {"ring": "p2p", "ulysses": "a2a", "allgather": "allgather", "usp": "a2a+p2p"}[
            plan["cp_scheme"]
        ]
        assert parsed.cp_comm_type == [comm]
    if plan["cp_scheme"] == "usp":
        assert len(parsed.hierarchical_context_parallel_sizes) == 2
        assert (
            parsed.hierarchical_context_parallel_sizes[0] * parsed.hierarchical_context_parallel_sizes[1]
            == plan["cp"]
        )
    assert parsed.sequence_parallel == (plan["tp"] > 1)
    assert parsed.recompute_granularity == {"none": None}.get(plan["recompute"], plan["recompute"])
    if parsed.overlap_param_gather:  # Megatron asserts both with the distributed optimizer
        assert parsed.overlap_grad_reduce and parsed.use_distributed_optimizer
    # hybrid sharding: one distributed optimizer per group of 8 of the DP x CP ranks
    instances = plan["dp"] * plan["cp"] // 8 if "--zero-shard" in extra else None
    assert parsed.num_distributed_optimizer_instances == (instances if instances != 1 else None)


# torchtitan's TOML job-file tables as torchtitan/config/job_config.py declares them (its last version,
# 238fa995, 2026-02-23, before jobs moved to Python configs).
TORCHTITAN = {
    "training": {"local_batch_size", "global_batch_size", "seq_len"},
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_layers_per_stage",
        "enable_async_tensor_parallel",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
        "context_parallel_degree",
        "context_parallel_rotate_method",
    },
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components"},
}


@pytest.mark.parametrize(
    "extra", [[], ["--zero", "3", "--pp", "2", "--model", "llama3-70b"], ["--recompute", "selective"]]
)
def test_torchtitan_export_is_its_job_file(cli, extra: list[str]) -> None:
    args = [*RECOMMEND, *extra]
    if "--model" in extra:
        args = args[:1] + args[3:]
    result = cli(*args, "--format", "torchtitan")
    assert result.code == 0, result.err
    job = tomllib.loads(result.out)
    assert set(job) <= set(TORCHTITAN) and set(TORCHTITAN) - set(job) <= {"compile"}
    for table, keys in job.items():
        keys = TORCHTITAN[table]
        assert set(job[table]) <= keys, table
    par = job["parallelism"]
    degrees = (
        par["data_parallel_replicate_degree"]
        * par["data_parallel_shard_degree"]
        * par["tensor_parallel_degree"]
        * par["pipeline_parallel_degree"]
        * par["context_parallel_degree"]
    )
    assert degrees == 1024
    assert par.get("context_parallel_rotate_method", "alltoall") in {"allgather", "alltoall"}
    assert job["activation_checkpoint"]["mode"] in {"none", "selective", "full"}
    assert job["training"]["seq_len"] == 131072
    if "--zero" in extra:
        assert par["data_parallel_replicate_degree"] == 1


def test_torchtitan_export_of_hybrid_sharding_is_hsdp(cli) -> None:
    """FSDP in groups of 16 of the DP x CP ranks: torchtitan shards over dp_shard x CP, so dp_shard is 16 / CP and
    the rest of DP replicates; a group that CP does not divide has no torchtitan mesh."""
    args = [*RECOMMEND, "--zero", "3", "--zero-shard", "16", "--format"]
    par = tomllib.loads(cli(*args, "torchtitan").out)["parallelism"]
    plan = cli(*args, "json").json()["recommendation"]
    assert par["data_parallel_shard_degree"] * par["context_parallel_degree"] == 16
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan["dp"]
    refused = cli(*RECOMMEND, "--zero", "3", "--zero-shard", "2", "--cp", "4", "--format", "torchtitan")
    assert (
        refused.code == 2
        and "--zero-shard: torchtitan v0.2.2's FSDP shards over its dp_shard x CP" in refused.err
    )


def test_sweep_step_time_is_the_fastest_fitting_plan_at_each_n(cli) -> None:
    """`sweep --model --gpus` gains step_time_s: at each (S, N) the search's best with CP fixed to N."""
    args = ["sweep", "-m", "llama3-8b", "--gpus", "64", "--seq", "32k,128k", "--n", "2,8", "--hw", "h100-ib"]
    rows = cli(*args, "--tp", "2", "-f", "json").json()["rows"]
    assert len(rows) == 4
    for row in rows:
        job = Job.of(model="llama3-8b", seq=row["seq"], hw="h100-ib", gpus=64, tp=2)
        fixed = Constraints(tp=2, pp=1, cp=row["n"], recompute="selective")
        best = search(job, 2**22 // row["seq"], fixed, top=1).plans
        expected = best[0]["step_time_s"] if best else None
        assert row["step_time_s"] == (pytest.approx(expected, rel=1e-12) if expected else None)
    # 1M tokens at TP 1 fits at no N of the grid: the cells are blank and the table says why
    table = cli(
        "sweep", "-m", "llama3-8b", "--gpus", "64", "--seq", "1M", "--n", "8,64", "--hw", "h100-ib"
    ).out
    assert "blank: no plan at that N fits in memory" in table


def test_megatron_ulysses_splits_the_kv_heads_too() -> None:
    """Transformer Engine's a2a asserts KV heads % CP == 0: with 8 KV heads and TP 4, Ulysses stops at CP 2."""
    ulysses = Constraints(tp=4, cp_scheme="ulysses")
    megatron = search(*_job(gpus=32, global_batch=32), ulysses, top=None).plans
    job = {"model": "llama3-8b", "seq": 32768, "hw": "h100-ib", "gpus": 32, "global_batch": 32}
    anywhere = search(*every_scheme(**job), ulysses, top=None).plans
    assert {p["cp"] for p in megatron} == {2}
    assert {p["cp"] for p in anywhere} == {2, 4, 8}


def test_recommend_plans_fp8_linear_layers_when_asked(cli) -> None:
    """--gemm-dtype fp8 runs every plan's linear layers in FP8: the pick is faster than in bf16, and
    `cp-plan step` on its flags with --gemm-dtype fp8 gives its time."""
    job = ["--model", "llama3-70b", "--seq", "32k", "--hw", "h100-ib", "--gpus", "64", "--global-batch", "64"]
    fp8 = cli("recommend", *job, "--gemm-dtype", "fp8", "-f", "json").json()["search"]
    bf16 = cli("recommend", *job, "-f", "json").json()["search"]
    assert fp8["gemm_dtype"] == "fp8" and bf16["gemm_dtype"] is None
    pick = fp8["plans"][0]
    assert pick["step_time_s"] < bf16["plans"][0]["step_time_s"]
    flags = [
        f"--{k.replace('_', '-')}={pick[k]}" for k in ("tp", "cp", "pp", "vpp", "micro_batch", "recompute")
    ]
    if pick["pp"] > 1:
        flags += [f"--first-stage-layers={pick['first_stage_layers']}"]
        flags += [f"--last-stage-layers={pick['last_stage_layers']}"]
    flags += ["--tp-comm-overlap"] if pick["tp_comm_overlap"] else []
    flags += [f"--cp-scheme={pick['cp_scheme']}", f"--layout={pick['layout']}"] if pick["cp"] > 1 else []
    step = cli("step", *job, *flags, "--gemm-dtype", "fp8", "-f", "json").json()["step"]
    assert step["time_s"] == pytest.approx(pick["step_time_s"], rel=1e-9)


# Twenty-four searched plans, each exported for both frameworks: uneven pipeline stages, every CP scheme, EP
# (Mixtral), TP overlap, ZeRO levels, recompute, on several machines.
MIXTRAL = str(REPO / "tests" / "data" / "hf" / "mixtral-8x7b.json")
EXPORTED = [
    ("llama3-8b", "131072", "h100-ib", "1024", []),
    ("llama3-8b", "131072", "h100-ib", "64", ["--cp-scheme", "usp"]),
    ("llama3-8b", "65536", "a100-nvlink", "32", ["--cp-scheme", "allgather"]),
    ("llama2-7b", "32768", "h100-nvlink", "16", ["--cp-scheme", "ulysses"]),
    ("llama3-70b", "8192", "h100-ib", "64", ["--pp", "4"]),
    ("llama3-70b", "131072", "h100-ib", "1024", ["--tp", "8"]),
    ("llama3-70b", "32768", "h200-nvlink", "128", ["--pp", "8", "--recompute", "full"]),
    ("llama3-405b", "8192", "h100-ib", "2048", ["--tp", "8", "--pp", "16"]),
    ("llama2-13b", "4096", "a100-nvlink", "40", ["--pp", "5"]),  # 40 layers over 5 stages
    ("gpt3-175b", "2048", "a100-nvlink", "96", ["--tp", "8", "--pp", "12"]),  # 96 layers
    ("qwen2.5-72b", "32768", "h100-ib", "256", ["--recompute", "selective"]),
    ("gemma-3-27b", "16384", "mi300x-xgmi", "32", []),
    (MIXTRAL, "16384", "h100-nvlink", "32", ["--tp", "2"]),
    (MIXTRAL, "32768", "h100-ib", "64", ["--cp", "2"]),
    ("llama3-8b", "524288", "h100-ib", "256", ["--cp", "32"]),
    ("llama3-70b", "262144", "h100-ib", "512", ["--cp", "16", "--layout", "zigzag"]),
    ("mistral-large", "32768", "h100-ib", "256", ["--pp", "8"]),  # 88 layers: uneven over 8
    ("llama3.1-405b", "131072", "h100-ib", "4096", ["--tp", "8", "--pp", "16", "--cp", "16"]),
    ("gpt3-20b", "8192", "h100-nvlink", "16", ["--zero", "0"]),
    ("llama3-8b", "16384", "a800-nvlink", "8", ["--recompute", "none"]),
    ("llama2-70b", "4096", "a100-nvlink", "64", ["--cp", "1"]),
    ("llama3-70b", "65536", "b200-nvlink", "64", ["--cp-scheme", "ring", "--layout", "zigzag"]),
    ("gpt3-5b", "8192", "h800-ib", "32", ["--micro-batch", "2"]),
    ("llama3-8b", "1048576", "h200-nvlink", "64", []),
]


@pytest.mark.parametrize(("model", "seq", "hw", "gpus", "extra"), EXPORTED)
def test_searched_plans_export_as_both_frameworks_read_them(
    cli, model: str, seq: str, hw: str, gpus: str, extra: list[str]
) -> None:
    args = ["recommend", "--model", model, "--seq", seq, "--hw", hw, "--gpus", gpus, *extra]
    megatron = cli(*args, "--format", "megatron")
    assert megatron.code == 0, megatron.err
    assert "arguments as Megatron-LM core_v0.17.1 declares them" in megatron.err
    parsed = _megatron_parser().parse_args(shlex.split(megatron.out.replace("\\\n", " ")))
    plan = cli(*args, "--format", "json").json()["search"]["plans"][0]
    assert (parsed.tensor_model_parallel_size, parsed.context_parallel_size) == (plan["tp"], plan["cp"])
    assert parsed.pipeline_model_parallel_size == plan["pp"] and parsed.seq_length == int(seq)
    if plan["pp"] > 1 and plan["first_stage_layers"] != plan["last_stage_layers"]:
        assert parsed.decoder_first_pipeline_num_layers == plan["first_stage_layers"]
    if plan["ep"] > 1:
        assert parsed.expert_model_parallel_size == plan["ep"]
    assert parsed.tp_comm_overlap == plan["tp_comm_overlap"]
    titan = cli(*args, "--format", "torchtitan")
    if titan.code:  # refused only for what torchtitan does not run, naming why
        ddp = "runs ZeRO" in titan.err and "DDP" in titan.err and "--zero" in extra
        scheme = "--cp-scheme" in extra and "that torchtitan (PyTorch-native" in titan.err
        assert ddp or scheme, titan.err
        return
    assert titan.out.startswith("# torchtitan v0.2.2 job file")
    job = tomllib.loads(titan.out)
    for table, keys in job.items():
        assert set(keys) <= TORCHTITAN[table], table
    par = job["parallelism"]
    # torchtitan's own refusals at v0.2.2, restated: async TP needs the compiled model; DDP runs alone
    if par.get("enable_async_tensor_parallel"):
        assert job["compile"]["enable"] and "model" in job["compile"]["components"]
    shard, replicate = par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]
    others = par["tensor_parallel_degree"] * par["pipeline_parallel_degree"]
    assert not (replicate > 1 and shard == 1 and par["context_parallel_degree"] == 1 and others > 1)


def test_torchtitan_plans_shard_with_fsdp_and_refuse_ddp_beside_tp(cli) -> None:
    """torchtitan v0.2.2 raises "DDP has not supported > 1D parallelism": its plans default to ZeRO-3 (FSDP),
    and a ZeRO-1 plan with TP or PP is refused with that reason rather than written as replicate 4 / shard 1."""
    args = ["recommend", "--model", "llama2-70b", "--seq", "4096", "--hw", "a100-nvlink", "--gpus", "64"]
    args += ["--global-batch", "1024", "--cp", "1"]
    job = tomllib.loads(cli(*args, "--format", "torchtitan").out)
    assert job["parallelism"]["data_parallel_replicate_degree"] == 1
    refused = cli(*args, "--format", "torchtitan", "--zero", "1", "--tp", "4")
    assert refused.code == 2 and refused.err.startswith(
        "cp-plan: error: --zero: torchtitan v0.2.2 runs ZeRO-1"
    )
    assert "--zero 3" in refused.err and refused.out == ""


@pytest.mark.parametrize(("hw", "domain"), [("h100-ib", 8), ("gb200-nvl72", 72)])
def test_tp_collectives_are_pipelined_only_inside_one_fast_domain(hw: str, domain: int) -> None:
    """Transformer Engine's userbuffers and torch's AsyncTP map TP peers' memory over NVLink: a TP group that
    leaves the fast domain is searched unpipelined only, and a fixed overlap rules it out."""
    job, batch = _job(model="llama3-70b", seq=131072, hw=hw, gpus=256, global_batch=32, tp=16)
    plans = search(job, batch, Constraints(tp=16), top=None).plans
    assert plans and {p["tp"] for p in plans} == {16}
    assert any(p["tp_comm_overlap"] for p in plans) is (16 <= domain)
    held = search(job, batch, Constraints(tp=16, tp_comm_overlap=True), top=None).plans
    assert bool(held) is (16 <= domain) and all(p["tp_comm_overlap"] for p in held)


def test_a_step_refuses_to_pipeline_tp_across_nodes(cli) -> None:
    args = ["step", "--model", "llama3-70b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "64", "--cp", "4"]
    result = cli(*args, "--tp", "16", "--global-batch", "32", "--tp-comm-overlap")
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1
    assert (
        result.err.startswith("cp-plan: error: --tp-comm-overlap: pipelines TP's collectives")
        and "TP 16" in result.err
    )
    assert cli(*args, "--tp", "8", "--global-batch", "32", "--tp-comm-overlap").code == 0
