"""Measured runs as data (`cp-plan audit --runs`) and the machine terms fitted to them."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from costmodel.audit.runs import (
    TIE,
    Profiles,
    audit_runs,
    fit_runs,
    parse_assumptions,
    predictions,
    ranking,
    read_runs,
    spearman,
)
from costmodel.audit.synthetic import VTRAIN_ASSUMED, VTRAIN_HEADER, layouts, synthetic, write_table
from costmodel.machines.profiles import load_profile
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step

DATA = Path(__file__).parent / "data" / "runs"
VTRAIN_CLUSTER = DATA / "a100-vtrain.yaml"  # the A100 cluster vTrain's configurations state
VTRAIN = VTRAIN_ASSUMED


def test_vtrain_header_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(VTRAIN_HEADER + "\n2,16,8,1024,16,24,1024,1,1,2,372.160408\n", encoding="utf-8")
    table = read_runs(str(path), parse_assumptions(VTRAIN), "a100-nvlink")
    (first,) = table.runs
    assert first.measured_s == pytest.approx(0.372160408, rel=1e-12)
    stated = {"gpus": 2, "global_batch": 16, "micro_batch": 8, "seq": 1024, "tp": 1, "pp": 2}
    assert {k: first.values[k] for k in stated} == stated
    assert (first.model.hidden, first.model.heads, first.model.layers) == (1024, 16, 24)
    assert (first.model.ffn_hidden, first.model.vocab, first.model.tied_embeddings) == (4096, 50257, True)
    assert first.values["grad_bytes"] == 2  # fp16 reduces fp16 gradients
    assert table.assumed == dict(item.split("=") for item in VTRAIN)


def test_a_row_is_predicted_as_the_step_command_predicts_it(cli, tmp_path: Path) -> None:
    path = synthetic(tmp_path, {}, noise=0.0)
    table = read_runs(str(path), parse_assumptions(VTRAIN), "a100-nvlink")
    rows = audit_runs(table, predictions(table, Profiles()))["rows"]
    assert max(abs(row["error"]) for row in rows) < 1e-9  # times made by the model, read back by it
    run, row = table.runs[7], rows[7]
    model = tmp_path / "gpt.yaml"
    model.write_text(yaml.safe_dump(run.model.model_dump(exclude_none=True)))
    args = ["step", "--model", str(model), "--format", "json"]
    for key, value in run.values.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    result = cli(*args)
    assert result.code == 0, result.err
    assert row["predicted_s"] == pytest.approx(result.json()["step"]["time_s"], rel=1e-9)


def _row(job: str, measured: float, predicted: float) -> dict:
    return {
        "model": job,
        "seq": 1024,
        "gpus": 8,
        "global_batch": 16,
        "measured_s": measured,
        "predicted_s": predicted,
    }


def test_ranking_counts_the_fastest_found_the_regret_and_the_pairs_in_order() -> None:
    rows = [
        # job a: the run predicted fastest (1.0) measured 1.2 against the fastest's 1.0: regret 20 %;
        # of its three pairs, all over 5 % apart, (1.0, 1.2) is inverted
        _row("a", 1.0, 1.1),
        _row("a", 1.2, 1.0),
        _row("a", 1.5, 2.0),
        # job b: predicted fastest measured 2.05 against 2.0 (regret 2.5 %); its one pair is a tie (2.5 %)
        _row("b", 2.0, 2.1),
        _row("b", 2.05, 2.0),
        # job c: one layout, nothing to rank
        _row("c", 3.0, 1.0),
    ]
    result = ranking(rows)
    assert result == {
        "jobs": 2,
        "fastest_found": 0.0,
        "median_regret": pytest.approx((0.2 + 0.025) / 2, abs=1e-12),
        "max_regret": pytest.approx(0.2, abs=1e-12),
        "pairs": 3,
        "pairs_ordered": pytest.approx(2 / 3, abs=1e-12),
        "tie": TIE,
        "spearman": None,  # no job of four layouts
    }
    # held-out predictions in place of the rows' own: the inversion in job a gone
    held = ranking(rows, [1.0, 1.1, 2.0, 2.0, 2.1, 1.0])
    assert held["fastest_found"] == 1.0 and held["median_regret"] == 0.0 and held["pairs_ordered"] == 1.0
    assert ranking(rows[-1:]) is None


@pytest.mark.parametrize(
    ("measured", "predicted", "rho"),
    [
        ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
        ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
        # one swap of neighbours among four: 1 - 6·(1 + 1)/(4·15) = 0.8
        ([1, 2, 3, 4], [1, 3, 2, 4], 0.8),
        # ties share their mean rank: ranks (1.5, 1.5, 3, 4) against (1, 2, 3, 4), r = 0.9487
        ([1, 1, 3, 4], [1, 2, 3, 4], 3 / 10**0.5),
        ([2, 2, 2, 2], [1, 2, 3, 4], None),
    ],
)
def test_spearman_matches_hand_ranks(measured: list, predicted: list, rho: float | None) -> None:
    got = spearman(measured, predicted)
    assert got == rho if rho is None else got == pytest.approx(rho, abs=1e-12)


def test_ranking_reports_spearman_per_job_of_four_layouts_or_more() -> None:
    # job a: four layouts, the middle two inverted (rho 0.8); job b: five in order (rho 1); job c: three (none)
    rows = [_row("a", m, p) for m, p in ((1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 4.0))]
    rows += [_row("b", m, 2 * m) for m in (1.0, 2.0, 3.0, 4.0, 5.0)]
    rows += [_row("c", m, m) for m in (1.0, 2.0, 3.0)]
    rho = ranking(rows)["spearman"]
    assert rho["jobs"] == 2 and rho["min_layouts"] == 4 and rho["below_goal"] == 0
    assert rho["median"] == pytest.approx(0.9, abs=1e-12) and rho["min"] == pytest.approx(0.8, abs=1e-12)
    assert [r["job"].split("/")[0] for r in rho["per_job"]] == ["a", "b"]
    assert [r["layouts"] for r in rho["per_job"]] == [4, 5]


@given(
    # whole milliseconds, 1 ms apart or more: their predictions stay distinct after rounding (no tie to break)
    st.lists(st.integers(10, 100_000), min_size=2, max_size=12, unique=True),
    st.floats(0.2, 5.0),
    st.floats(0.2, 3.0),
)
def test_predictions_in_the_measured_order_rank_every_layout_right(
    milliseconds: list[int], scale: float, power: float
) -> None:
    """Any increasing function of the measured times, however far off in value, orders layouts perfectly."""
    rows = [_row("job", m / 1e3, scale * (m / 1e3) ** power) for m in milliseconds]
    result = ranking(rows)
    assert result["jobs"] == 1 and result["fastest_found"] == 1.0 and result["max_regret"] == 0.0
    assert result["pairs_ordered"] in (1.0, None)  # None: every pair within the tie
    if len(milliseconds) >= 4:
        assert result["spearman"]["min"] == pytest.approx(1.0, abs=1e-12)


BAD = [
    ("gpus,tp,bogus\n8,1,2\n", "unknown column(s) 'bogus'"),
    ("llama3-8b,8192,8\n", "unknown column(s) 'llama3-8b', '8192', '8' in its first line, the header"),
    ("# GPUs,tensor parallelism\n8,1,2\n", "3 cells for 2 columns"),
    (
        "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
        "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
        "8,16,1,1024,16,24,1024,2,2,1,100\n",
        "tp x cp x pp x dp = 4 is not the 8 GPUs",
    ),
    (
        "gpus,tp,seq,micro_batch,global_batch,hidden,heads,layers\n8,1,1024,1,8,1024,16,24\n",
        "no measured column",
    ),
    (
        "gpus,tp,seq,micro_batch,global_batch,hidden,heads,layers,iteration_ms\n8,x,1024,1,8,1024,16,24,5\n",
        "column tp is 'x', expected a whole number",
    ),
    (
        "gpus,tp,seq,micro_batch,global_batch,hidden,heads,layers,iteration_ms\n8,1,1024,1,8,1000,16,24,5\n",
        "heads 16 must divide hidden 1000",
    ),
    (
        "gpus,tp,seq,micro_batch,global_batch,hidden,heads,layers,iteration_ms\n8,1,1024,1,8,1024,16,24,nan\n",
        "expected a finite number",
    ),
    ("gpus,tp\n", "has a header but no runs"),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_a_bad_table_is_one_line_naming_runs_and_exit_2(
    cli, tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(text, encoding="utf-8")
    result = cli("audit", "--runs", str(path), "--hw", "a100-nvlink")
    assert result.code == 2 and result.out == ""
    assert result.err.count("\n") == 1 and "--runs" in result.err and expected in result.err, result.err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--assume", "recompute"], "is not COLUMN=VALUE"),
        (["--assume", "colour=red"], "unknown column 'colour'"),
        (["train.log"], "not both"),
    ],
)
def test_bad_runs_flags_are_one_line(cli, tmp_path: Path, args: list[str], expected: str) -> None:
    path = write_table(tmp_path / "runs.csv", layouts(2)[:2], [0.1, 0.2])
    result = cli("audit", "--runs", str(path), "--hw", "a100-nvlink", *args)
    assert result.code == 2 and expected in result.err and result.err.count("\n") == 1, result.err


def test_a_fit_of_named_terms_gives_them_back_exactly_from_noiseless_times(tmp_path: Path) -> None:
    """The fit's machinery in seconds: two named terms, two folds, 81 runs timed by the model itself."""
    truth = {"gemm_scale": 0.8, "launch_s": 3.0e-5}
    path = synthetic(tmp_path, truth, noise=0.0, max_gpus=4)
    table = read_runs(str(path), parse_assumptions(VTRAIN), "a100-nvlink")
    result = fit_runs(table, load_profile("a100-nvlink"), 2, "fitted", "2026-12-01", terms=list(truth))
    assert {name: t["value"] for name, t in result["terms"].items()} == pytest.approx(truth, rel=1e-6)
    assert result["cv"]["mape"] < 1e-6 and result["fitted_runs"] == len(table.runs) == 81
    assert result["not_fitted"] == [] and result["not_needed"] == []


def test_the_docs_example_table_gives_back_what_made_it() -> None:
    """docs/audit.md says the fit of tests/data/runs/example.csv gives back the cluster that made it: true
    while the table is what its generator writes with today's step model (after a model change, run
    ``python tests/data/runs/generate.py``)."""
    from tests.data.runs.generate import HERE, TRUTH

    table = read_runs(str(HERE / "example.csv"), parse_assumptions(VTRAIN), "a100-nvlink")
    result = fit_runs(table, load_profile("a100-nvlink"), 2, "fitted", "2026-12-01", terms=list(TRUTH))
    terms = {name: t["value"] for name, t in result["terms"].items()}
    assert terms["gemm_scale"] == pytest.approx(TRUTH["gemm_scale"], rel=0.02)
    assert terms["launch_s"] == pytest.approx(TRUTH["launch_s"], rel=0.05)
    assert terms["step_s"] == pytest.approx(TRUTH["step_s"], rel=0.15)  # it shares its signal with launch_s


@pytest.mark.slow  # a full fit: every term, five folds, 162 runs (about 10 s)
def test_the_fit_gives_back_the_terms_that_made_the_times(tmp_path: Path) -> None:
    truth = {"gemm_scale": 0.8, "launch_s": 3.0e-5, "intra_node_collective_efficiency": 0.6}
    path = synthetic(tmp_path, truth, noise=0.02)
    table = read_runs(str(path), parse_assumptions(VTRAIN), "a100-nvlink")
    result = fit_runs(table, load_profile("a100-nvlink"), 5, "fitted", "2026-12-01")
    terms = {name: t["value"] for name, t in result["terms"].items()}
    assert set(result["not_fitted"]) == {"attention_scale", "inter_node_collective_efficiency"}
    assert terms["gemm_scale"] == pytest.approx(0.8, rel=0.03)
    assert terms["launch_s"] == pytest.approx(3.0e-5, rel=0.05)
    assert terms["intra_node_collective_efficiency"] == pytest.approx(0.6, rel=0.15)
    # 2 % lognormal noise: held-out MAPE near sqrt(2/pi) x 2 % = 1.6 %
    assert result["cv"]["mape"] == pytest.approx(0.016, abs=0.006)
    assert result["fitted_runs"] == len(table.runs) and result["transfer"] is None


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param(["gemm_scale", "launch_s"], id="two-named-terms"),
        pytest.param(None, id="every-term", marks=pytest.mark.slow),  # the full fit: about 10 s
    ],
)
def test_fit_profile_is_written_and_step_reads_it(cli, monkeypatch, tmp_path: Path, terms) -> None:
    """The command end to end; the fast tier fits the two terms that made the times (the command fits every
    term that moves the runs, as the slow tier does)."""
    if terms is not None:
        from costmodel.audit import runs

        monkeypatch.setattr(runs, "fit_runs", functools.partial(fit_runs, terms=terms))
    small = synthetic(tmp_path, {"gemm_scale": 0.7, "launch_s": 5e-5}, noise=0.03)
    out = tmp_path / "fitted.yaml"
    args = [
        "audit",
        "--runs",
        str(small),
        "--hw",
        "a100-nvlink",
        "--fit-profile",
        str(out),
        "--format",
        "json",
    ]
    for item in VTRAIN:
        args += ["--assume", item]
    result = cli(*args)
    assert result.code == 0, result.err
    document = result.json()
    assert document["schema"] == "cp-plan/runs/v3" and document["fit"]["written"] == str(out)
    assert 0 < document["fit"]["cv_mape"] < document["runs"]["mape"]
    # held-out predictions order the layouts at least as well as the built-in profile's
    built_in, held = document["runs"]["ranking"], document["fit"]["cv_ranking"]
    assert held["jobs"] == built_in["jobs"] > 0 and held["pairs"] == built_in["pairs"] > 0
    assert held["pairs_ordered"] >= built_in["pairs_ordered"]
    profile = load_profile(str(out))
    assert profile.source.kind == "measured"
    assert profile.kernels.launch_s == pytest.approx(document["fit"]["terms"]["launch_s"]["value"])
    table = read_runs(str(small), parse_assumptions(VTRAIN), str(out))
    run = table.runs[0]
    step = evaluate_step(Job.of(_model=run.model, **run.values)).step
    assert step.time_s == pytest.approx(document["fit"]["rows"][0]["predicted_s"], rel=1e-9)
    # the profile keeps its k-fold residuals: 3 % lognormal noise gives an 80 % interval near +-1.28 x 3 %
    residuals = profile.fit_residuals
    assert residuals is not None and residuals.runs == document["fit"]["fitted_runs"]
    classes = profile.fit_residuals_by_layout or []  # every fitted run in one layout class
    assert len(classes) >= 2 and sum(c.residuals.runs for c in classes) == residuals.runs
    band = step.time_s_interval
    assert band.regime.startswith("the fitted profile's k-fold residuals")
    assert band.hi / band.lo == pytest.approx(math.exp(2 * 1.28 * 0.03), rel=0.05)


@pytest.mark.slow  # a full fit of 396 runs (about 10 s)
def test_runs_spanning_nodes_are_predicted_from_the_fit_never_fitted(tmp_path: Path) -> None:
    truth = {"gemm_scale": 0.8, "launch_s": 5e-5, "inter_node_collective_efficiency": 0.5}
    path = synthetic(tmp_path, truth, noise=0.02, max_gpus=32, hw=str(VTRAIN_CLUSTER))
    table = read_runs(str(path), parse_assumptions(VTRAIN), str(VTRAIN_CLUSTER))
    result = fit_runs(table, load_profile(str(VTRAIN_CLUSTER)), 3, "fitted", "2026-12-01")
    inside = sum(r["gpus"] <= 8 for r in layouts(32))
    assert result["fitted_runs"] == inside and result["transfer"]["n"] == len(table.runs) - inside
    assert "inter_node_collective_efficiency" in result["not_fitted"]  # no single-node run crosses nodes
    # the fit never saw the cross-node efficiency of 0.5: its runs come out fast, by as much as they move
    assert result["transfer"]["signed_median"] < -0.01
