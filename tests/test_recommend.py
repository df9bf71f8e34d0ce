"""`cp-plan recommend` gives one answer per screen.

With --gpus the answer is the layout search's pick: it comes first, and the CP window under it is the one
at the plan's TP, PP, recompute and micro-batch. Without --gpus the answer is the window at the stated
flags. Llama 3 8B at 128k on 8 H100s is the example: at TP 1 · PP 1 no CP degree fits memory, while the
search's pick (TP 1 · CP 4 · PP 2, full recompute) does.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.plans.inputs import TRAINING_DEFAULTS, PlanInputs, TrainingSetup
from costmodel.plans.job import StepSetup, make_job
from costmodel.training.recommend import recommend

JOB = ["recommend", "--model", "llama3-8b", "--seq", "131072", "--hw", "h100-nvlink"]
SEARCHED = [*JOB, "--gpus", "8", "--tp", "1"]  # TP fixed: the window at TP 1 · PP 1 is empty


@pytest.fixture(scope="module")
def searched() -> dict:
    """The JSON and the table of the searched job, run once for the module."""
    import contextlib
    import io
    import json

    from costmodel.cli import main

    def run(*args: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert main(list(args)) == 0
        return out.getvalue()

    return {"json": json.loads(run(*SEARCHED, "-f", "json")), "table": run(*SEARCHED)}


def _lines(table: str) -> list[str]:
    """The screen's rows, each wrapped row joined back into one line."""
    rows: list[str] = []
    for line in table.splitlines():
        if line.startswith(" ") and rows and line.strip():
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    return rows


def test_the_first_answer_on_the_screen_is_the_searched_plan(searched) -> None:
    pick = searched["json"]["search"]["plans"][0]
    assert (pick["tp"], pick["cp"], pick["pp"], pick["recompute"]) == (1, 4, 2, "full")
    rows = _lines(searched["table"])
    uses = [row for row in rows if row.startswith("use")]
    assert uses == ["use       TP 1 · CP 4 (ring, zigzag) · PP 2 (v 2) · DP 1 · mb 1 · recompute full"]
    order = [
        next(i for i, row in enumerate(rows) if row.startswith(key)) for key in ("use", "step", "window")
    ]
    assert order == sorted(order)
    assert rows.index(uses[0]) < next(i for i, row in enumerate(rows) if row.startswith("Usable CP degrees"))
    assert rows.index(uses[0]) < next(i for i, row in enumerate(rows) if row.startswith("Layout search"))
    step = next(row for row in rows if row.startswith("step"))
    assert "224 s" in step and "MFU 35%" in step
    memory = next(row for row in rows if row.startswith("memory"))
    held = f"{pick['memory_bytes'] / 1e9:.2f} GB of 80.70 GB usable"  # the search's own memory for the plan
    assert memory.startswith("memory    at N = 4:") and held in memory


def test_the_window_shown_is_the_one_at_the_plans_tp_pp_recompute_and_micro_batch(searched) -> None:
    data = searched["json"]
    rec, pick = data["recommendation"], data["search"]["plans"][0]
    assert (data["setup"]["tp"], data["setup"]["pp"], data["setup"]["recompute"]) == (1, 2, "full")
    assert data["inputs"]["batch"] == pick["micro_batch"] == 1
    # the CP degrees of a TP 1 x PP 2 slice of 8 GPUs, not of TP 1 x PP 1
    assert [c["n"] for c in data["candidates"]] == [1, 2, 4]
    row = next(c for c in data["candidates"] if c["n"] == pick["cp"])
    assert row["fits"] and rec["n_min_memory"] == 4 <= pick["cp"] <= rec["n_max_comm"]
    # the fit is the search's own memory for the plan
    assert data["fit"]["n"] == pick["cp"] and data["fit"]["fits"]
    assert data["fit"]["total_bytes"] == pytest.approx(pick["memory_bytes"], rel=1e-12)
    # and the window is the one `recommend` gives when asked at those flags
    inputs = PlanInputs(seq=131_072, n=1, model="llama3-8b", **TRAINING_DEFAULTS)
    setup = TrainingSetup(gpus=8, tp=1, pp=2, recompute="full")
    job = make_job(inputs.model_copy(update={"hw": "h100-nvlink"}), setup, StepSetup(vpp=pick["vpp"]))
    alone = recommend(job, suggest=False)
    assert [c.model_dump(mode="json") for c in alone.candidates] == data["candidates"]
    assert (alone.recommendation.n_min_memory, alone.recommendation.n_max_comm) == (4, 4)
    table = " ".join(searched["table"].split())
    assert (
        "window at TP 1 · PP 2 (v 2) · mb 1 · recompute full: N_min(memory) .. N_max(comm) = [4, 4]" in table
    )
    assert "Usable CP degrees at TP 1 · PP 2 (v 2) · mb 1 · recompute full" in table


def test_no_memory_failure_of_another_layout_is_printed_when_the_pick_fits(searched) -> None:
    table = searched["table"]
    for other in ("Memory fails", "no CP degree works", "at TP 1·PP 1", "fix "):
        assert other not in table, other
    assert "Memory fails" not in searched["json"]["recommendation"]["reason"]


def test_the_json_recommendation_describes_the_plan_it_recommends(searched) -> None:
    data = searched["json"]
    rec, pick = data["recommendation"], data["search"]["plans"][0]
    assert data["schema"] == "cp-plan/recommend/v9"
    for key in ("tp", "cp", "pp", "vpp", "micro_batch", "recompute", "cp_scheme", "step_time_s", "mfu"):
        assert rec[key] == pick[key], key
    assert (rec["n_recommended"], rec["dp"], rec["scheme"], rec["layout"]) == (4, 1, "ring", "zigzag")
    assert rec["fixes"] == []
    # the reason is the pick's: it fits, how fast, and where its CP lies in the window shown
    reason = rec["reason"]
    fitted, considered = data["search"]["fit"], data["search"]["considered"]
    assert reason.startswith(
        f"The safest in memory of the {fitted} plans that fit, of {considered:,}: 224 s per step at 35%"
    )
    assert "CP 4 lies in the window [4, 4]" in reason and "fails" not in reason


def test_a_plan_past_n_max_comm_says_so_and_still_gives_one_answer(cli) -> None:
    """Over IB with one CP rank per node no N keeps a comm ratio within 15 %; the step still ranks CP 8
    fastest, and the screen says both without a failure line or fixes."""
    args = ["recommend", "--model", "llama3-8b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "64"]
    args += ["--recompute", "full", "--cp-ranks-per-node", "1"]
    rec = cli(*args, "-f", "json").json()["recommendation"]
    assert (rec["cp"], rec["n_recommended"], rec["n_max_comm"]) == (8, 8, 2)
    # the pick is the safest of the plans it cannot order (PP 2, 49 GB), its window taken at PP 2
    assert "CP 8 is past N_max(comm) of the window [4, 2]" in rec["reason"] and rec["fixes"] == []
    table = cli(*args).out
    assert "Communication fails" not in table and "fix " not in table


def test_without_gpus_the_window_at_the_stated_flags_is_the_answer(cli) -> None:
    table = cli(*JOB)
    assert table.code == 0
    rows = _lines(table.out)
    assert next(row for row in rows if row.startswith("job")).startswith("job       8 GPUs = TP 1 x PP 1")
    assert next(row for row in rows if row.startswith("use")) == "use       no CP degree works"
    assert any(row.startswith("why       Memory fails: even N = 8") for row in rows)
    assert "Usable CP degrees" in rows and "Layout search" not in table.out
    data = cli(*JOB, "-f", "json").json()
    assert data["search"] is None and data["recommendation"]["tp"] is None
    assert (data["setup"]["tp"], data["setup"]["pp"], data["setup"]["recompute"]) == (1, 1, "selective")
    assert [c["n"] for c in data["candidates"]] == [1, 2, 4, 8]


def test_without_a_model_recommend_is_one_line_naming_the_flag(cli) -> None:
    result = cli("recommend", "--seq", "131072", "--hw", "h100-nvlink", "--gpus", "8")
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("cp-plan: error: --model: recommend needs a model preset")
    assert result.err.count("\n") == 1


def test_a_flag_only_the_search_reads_runs_it_without_gpus(cli) -> None:
    """--cp fixes a dimension of the layout search: given alone, it lays out the default 8 GPUs."""
    data = cli(*JOB, "--cp", "4", "-f", "json").json()
    assert data["search"] is not None and data["recommendation"]["cp"] == 4
    assert data["recommendation"]["n_recommended"] == 4


# --- one screen, one answer: the pick's memory is one figure wherever the screen gives it ------------------

_JOBS = {
    "model": ["llama3-8b", "llama2-70b", "llama3-70b", "gpt3-20b", "qwen2.5-72b", "gemma-3-27b"],
    "hw": ["h100-ib", "a100-nvlink", "h200-nvlink", "mi300x-xgmi"],
    "gpus": [8, 16, 32, 64, 128],
    "seq": [4096, 16384, 65536, 131072],
    "batch": [None, 64, 256, 1024],
}


def _search_json(cli, model: str, hw: str, gpus: int, seq: int, batch: int | None, *more: str) -> dict:  # noqa: ANN001
    args = [
        "recommend",
        "--model",
        model,
        "--hw",
        hw,
        "--gpus",
        str(gpus),
        "--seq",
        str(seq),
        "--format",
        "json",
        *more,
    ]
    result = cli(*args, *(["--global-batch", str(batch)] if batch else []))
    assert result.code == 0, result.err
    return json.loads(result.out)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**{name: st.sampled_from(values) for name, values in _JOBS.items()})
def test_the_picks_memory_is_one_figure_on_the_screen(cli, model, hw, gpus, seq, batch) -> None:  # noqa: ANN001
    """The header's memory line, the CP table's row at the pick's degree and the search's first row were once
    three evaluations (61.2 GB over 59.6 GB: the window ignored the virtual stages and the global batch)."""
    data = _search_json(cli, model, hw, gpus, seq, batch)
    if data["search"]["pick"] is None:
        return
    fit = data["fit"]["total_bytes"]
    row = next(c for c in data["candidates"] if c["n"] == data["recommendation"]["cp"])
    assert row["total_bytes"] == pytest.approx(fit, rel=1e-9)
    assert data["search"]["plans"][0]["memory_bytes"] == pytest.approx(fit, rel=1e-9)


def test_the_window_is_evaluated_at_the_picks_virtual_stages(cli) -> None:
    result = cli(
        "recommend",
        "--model",
        "llama2-70b",
        "--seq",
        "4096",
        "--hw",
        "a100-nvlink",
        "--gpus",
        "64",
        "--global-batch",
        "1024",
        "--cp",
        "1",
    )
    assert result.code == 0, result.err
    assert "Usable CP degrees at TP 4 · PP 4 (v 20)" in result.out
    memory = re.search(r"of [\d.]+ GB usable: fits", result.out)
    top = re.search(r"the runtime holds [\d.]+ GB: ([\d.]+) GB of", result.out).group(1)
    row = re.search(r"^1 +4 +([\d.]+) GB +yes", result.out, flags=re.M).group(1)
    assert memory and round(float(top), 1) == float(row)  # 69.79 GB and 69.8 GB: one figure


def test_a_pick_that_fills_the_device_says_so(cli) -> None:
    """Within 5 % of the usable memory the memory model's own error can decide: the answer says it."""
    tight = _search_json(cli, "llama3-8b", "h100-ib", 64, 3_300_000, None)  # 97 % full
    assert tight["fit"]["total_bytes"] / tight["fit"]["device_memory_bytes"] > 0.95
    assert "Caution: it fills" in tight["recommendation"]["reason"]
    roomy = _search_json(cli, "llama3-8b", "h100-ib", 64, 131072, 64)
    assert roomy["fit"]["total_bytes"] / roomy["fit"]["device_memory_bytes"] < 0.95
    assert "Caution" not in roomy["recommendation"]["reason"]


def test_a_tile_longer_than_the_picks_shard_is_the_whole_shard(cli) -> None:
    """GPT-3 20B at 4K on 16 MI300X at CP 8 (512-token shards): the default 1,024-token tile once refused it."""
    data = _search_json(cli, "gpt3-20b", "mi300x-xgmi", 16, 4096, 256, "--cp", "8")
    assert data["recommendation"]["cp"] == 8 and data["inputs"]["block"] == 512


CONFIDENT = ["recommend", "--model", "llama3-8b", "--seq", "262144", "--hw", "h100-nvlink", "--gpus", "8"]


def test_confidence_plans_only_layouts_that_fit_with_it(cli) -> None:  # noqa: ANN001
    """Llama 3 8B at 256K on 8 H100s: the plain search picks TP 4 · CP 2, which fits at 80 %; asked for 90 %,
    every plan shown fits at 90 % or more, each within usable memory less the stated margin, and the pick
    changes. What a device offers and the chance to fit are still the device's."""
    plain = cli(*CONFIDENT, "--format", "json").json()["search"]
    sure = cli(*CONFIDENT, "--confidence", "0.9", "--format", "json").json()["search"]
    assert plain["confidence"] is None and plain["plans"][0]["fits_probability"] < 0.9
    said = sure["confidence"]
    assert said["level"] == 0.9 and said["margin"] > 1 and said["from"].endswith("memory peaks")
    assert sure["plans"] and sure["fit"] < plain["fit"]
    for plan in sure["plans"]:
        assert plan["fits_probability"] >= 0.9
        assert plan["memory_bytes"] <= said["planned_bytes"] * (1 + 1e-12)
        assert plan["device_memory_bytes"] == pytest.approx(said["planned_bytes"] * said["margin"], rel=1e-12)
    assert (sure["pick"]["tp"], sure["pick"]["cp"]) != (plain["pick"]["tp"], plain["pick"]["cp"])


def test_confidence_shortens_the_longest_sequence_that_fits(cli) -> None:  # noqa: ANN001
    args = ["recommend", "--max-seq", "--model", "llama3-8b", "--hw", "h100-ib", "--gpus", "16"]
    plain = cli(*args, "--format", "json").json()
    sure = cli(*args, "--confidence", "0.9", "--format", "json").json()
    assert sure["confidence"]["level"] == 0.9 and plain["confidence"] is None
    pairs = list(zip(plain["rows"], sure["rows"], strict=True))
    assert all(s["seq"] is None or s["seq"] <= p["seq"] for p, s in pairs)
    assert any(s["seq"] is not None and s["seq"] < p["seq"] for p, s in pairs)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--confidence", "0.99"], "can say at most"),
        (["--confidence", "1.5"], "a probability from 0.5 to 0.99"),
        (["--confidence", "0.95", "--memory-headroom", "0.85"], "ask a lower confidence"),
    ],
)
def test_a_confidence_it_cannot_plan_for_is_one_line(cli, flags: list[str], said: str) -> None:  # noqa: ANN001
    result = cli(*CONFIDENT, *flags)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("cp-plan: error: --confidence: ") and said in result.err
    assert result.err.count("\n") == 1
