"""One plan, one topology: step, recommend (its window and its layout search), check, report and the HTML
page place every group from the same layout, so they give the same link, verdict and time."""

from __future__ import annotations

import re

import pytest

# The plan recommend picks for Llama 3 8B at 128K on 64 H100s over IB: TP 2 · CP 4, inside one node.
PLAN = """name: TP 2 CP 4 on H100 IB
model: llama3-8b
seq: 128k
n: 4
hw: h100-ib
gpus: 64
tp: 2
pp: 1
vpp: 1
micro_batch: 1
global_batch: 64
cp_scheme: ring
rank_order: tp-cp-dp-pp
recompute: full
causal: true
layout: zigzag
pass: fwd+bwd
expect:
  worst_verdict: amber
"""
JOB = ["--model", "llama3-8b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "64", "--tp", "2",
       "--recompute", "full"]  # fmt: skip
KNOBS = ["--pp", "1", "--vpp", "1", "--micro-batch", "1", "--global-batch", "64", "--cp-scheme", "ring",
         "--layout", "zigzag", "--rank-order", "tp-cp-dp-pp"]  # fmt: skip


def _everywhere(cli, tmp_path, plan: str, extra: list[str]) -> dict:
    path = tmp_path / "plan.yaml"
    path.write_text(plan, encoding="utf-8")
    search = cli("recommend", *JOB, "--cp", "4", *KNOBS, *extra, "-f", "json").json()["search"]["plans"][0]
    overlap = ["--tp-comm-overlap"] if search["tp_comm_overlap"] else []  # the search's choice for TP 2
    step = cli("step", *JOB, "--cp", "4", *KNOBS, *overlap, *extra, "-f", "json").json()
    recommend = cli("recommend", *JOB, *extra, "-f", "json").json()
    check = cli("check", str(path), "-f", "json")
    report = cli("report", str(path)).out
    html = tmp_path / "plan.html"
    assert cli("report", str(path), "--html", str(html)).code == 0
    row = next(c for c in recommend["candidates"] if c["n"] == 4)
    detail = check.json()["results"][0]["detail"]
    verdict, ratio = re.search(r"verdict (\w+) \(([\d.]+)%\)", detail).groups()
    return {
        "step": step,
        "row": row,
        "search": search,
        "check": (verdict, float(ratio) / 100, check.code),
        "report": report,
        "html": html.read_text(encoding="utf-8"),
    }


def test_the_same_plan_gives_the_same_link_verdict_and_time_everywhere(cli, tmp_path) -> None:
    seen = _everywhere(cli, tmp_path, PLAN, [])
    cp = seen["step"]["topology"]["groups"]["cp"]
    assert (cp["scope"], cp["bandwidth"]) == ("intra-node", pytest.approx(450e9))
    assert seen["row"]["link_scope"] == "intra-node"
    verdict, ratio, code = seen["check"]
    assert (verdict, code) == (seen["row"]["verdict"], 0) == ("green", 0)
    assert ratio == pytest.approx(seen["row"]["ring_comm_ratio_step"], abs=5e-5)  # check prints 0.01 %
    assert "450 GB/s per direction · intra-node" in seen["report"]
    assert "450 GB/s per direction · intra-node" in seen["html"] and "across nodes" not in seen["html"]
    # time: the layout search's array path and the step agree on this plan's step
    assert seen["search"]["step_time_s"] == pytest.approx(seen["step"]["step"]["time_s"], rel=1e-9)
    assert (seen["search"]["tp"], seen["search"]["cp"]) == (2, 4)


def test_a_plan_file_can_state_cp_ranks_per_node_and_every_command_follows(cli, tmp_path) -> None:
    """One CP rank per node (the -ib profiles' single-layer placement), stated: the ring crosses IB in
    all of them."""
    seen = _everywhere(cli, tmp_path, PLAN + "cp_ranks_per_node: 1\n", ["--cp-ranks-per-node", "1"])
    cp = seen["step"]["topology"]["groups"]["cp"]
    assert (cp["scope"], cp["bandwidth"]) == ("inter-node", pytest.approx(50e9))
    assert seen["row"]["link_scope"] == "inter-node"
    verdict, ratio, code = seen["check"]
    assert verdict == seen["row"]["verdict"] == "red" and code == 1  # the plan allows up to amber: fails
    assert ratio == pytest.approx(seen["row"]["ring_comm_ratio_step"], abs=5e-5)
    assert "inter-node" in seen["report"] and "50 GB/s" in seen["report"]
    assert seen["search"]["step_time_s"] == pytest.approx(seen["step"]["step"]["time_s"], rel=1e-9)


def test_plan_files_take_the_step_knobs_and_check_them() -> None:
    from costmodel.training.check import PlanFile

    for key in ("vpp", "micro_batch", "global_batch", "cp_scheme", "rank_order", "cp_ranks_per_node"):
        assert key in PlanFile.model_fields, key
