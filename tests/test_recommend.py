"""`cp-plan recommend` gives one answer per screen.

With --gpus the answer is the layout search's pick: it comes first, and the CP window under it is the one
at the plan's TP, PP, recompute and micro-batch. Without --gpus the answer is the window at the stated
flags. Llama 3 8B at 128k on 8 H100s is the example: at TP 1 · PP 1 no CP degree fits memory, while the
search's pick (TP 1 · CP 4 · PP 2, full recompute) does.
"""

from __future__ import annotations

import pytest

from costmodel.plans.inputs import TRAINING_DEFAULTS, PlanInputs, TrainingSetup
from costmodel.plans.job import make_job
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
    assert uses == ["use       TP 1 · CP 4 (ring, zigzag) · PP 2 · DP 1 · mb 1 · recompute full"]
    order = [
        next(i for i, row in enumerate(rows) if row.startswith(key)) for key in ("use", "step", "window")
    ]
    assert order == sorted(order)
    assert rows.index(uses[0]) < next(i for i, row in enumerate(rows) if row.startswith("Usable CP degrees"))
    assert rows.index(uses[0]) < next(i for i, row in enumerate(rows) if row.startswith("Layout search"))
    step = next(row for row in rows if row.startswith("step"))
    assert "198 s" in step and "MFU 40%" in step
    memory = next(row for row in rows if row.startswith("memory"))
    held = f"{pick['memory_bytes'] / 1e9:.2f} GB of 76.00 GB usable"  # the search's own memory for the plan
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
    alone = recommend(make_job(inputs.model_copy(update={"hw": "h100-nvlink"}), setup), suggest=False)
    assert [c.model_dump(mode="json") for c in alone.candidates] == data["candidates"]
    assert (alone.recommendation.n_min_memory, alone.recommendation.n_max_comm) == (4, 4)
    table = " ".join(searched["table"].split())
    assert "window at TP 1 · PP 2 · mb 1 · recompute full: N_min(memory) .. N_max(comm) = [4, 4]" in table
    assert "Usable CP degrees at TP 1 · PP 2 · mb 1 · recompute full" in table


def test_no_memory_failure_of_another_layout_is_printed_when_the_pick_fits(searched) -> None:
    table = searched["table"]
    for other in ("Memory fails", "no CP degree works", "at TP 1·PP 1", "fix "):
        assert other not in table, other
    assert "Memory fails" not in searched["json"]["recommendation"]["reason"]


def test_the_json_recommendation_describes_the_plan_it_recommends(searched) -> None:
    data = searched["json"]
    rec, pick = data["recommendation"], data["search"]["plans"][0]
    assert data["schema"] == "cp-plan/recommend/v6"
    for key in ("tp", "cp", "pp", "vpp", "micro_batch", "recompute", "cp_scheme", "step_time_s", "mfu"):
        assert rec[key] == pick[key], key
    assert (rec["n_recommended"], rec["dp"], rec["scheme"], rec["layout"]) == (4, 1, "ring", "zigzag")
    assert rec["fixes"] == []
    # the reason is the pick's: it fits, how fast, and where its CP lies in the window shown
    reason = rec["reason"]
    fitted, considered = data["search"]["fit"], data["search"]["considered"]
    assert reason.startswith(
        f"The fastest of the {fitted} plans that fit, of {considered:,}: 198 s per step at 40%"
    )
    assert "CP 4 lies in the window [4, 4]" in reason and "fails" not in reason


def test_a_plan_past_n_max_comm_says_so_and_still_gives_one_answer(cli) -> None:
    """Over IB with one CP rank per node no N keeps a comm ratio within 15 %; the step still ranks CP 8
    fastest, and the screen says both without a failure line or fixes."""
    args = ["recommend", "--model", "llama3-8b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "64"]
    args += ["--recompute", "full", "--cp-ranks-per-node", "1"]
    rec = cli(*args, "-f", "json").json()["recommendation"]
    assert (rec["cp"], rec["n_recommended"], rec["n_max_comm"]) == (8, 8, 2)
    assert "CP 8 is past N_max(comm) of the window [8, 2]" in rec["reason"] and rec["fixes"] == []
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
