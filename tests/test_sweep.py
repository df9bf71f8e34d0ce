"""Sweeps: the vectorised grid equals the per-plan report point by point; ranges parse; plots are written."""

from __future__ import annotations

import builtins
import csv
import io
import json

import numpy as np
import pytest

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs
from costmodel.symbolic import numeric
from costmodel.training.sweep import parse_grid, sweep
from tests.support import plan


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("8k..64k", [8192, 16384, 32768, 65536]),
        ("1..64", [1, 2, 4, 8, 16, 32, 64]),
        ("3..24", [3, 6, 12, 24]),
        ("8k,1M, 32k", [8192, 32768, 1 << 20]),
        ("256k", [262_144]),
    ],
)
def test_parse_grid(text: str, values: list[int]) -> None:
    assert parse_grid(text, "--seq", 1 << 34) == values


@pytest.mark.parametrize(
    ("text", "message"), [("64k..8k", "runs downwards"), ("", "empty"), ("8k..x", "not a length")]
)
def test_parse_grid_rejects(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_grid(text, "--seq", 1 << 34)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.5", "'1.5' is not a whole number; accepted: a whole number, a list \\(2,4,8\\)"),
        ("-1", "'-1' is not a whole number"),
        ("0", "values must lie in \\[1, 1,024\\] \\(got 0\\)"),
        ("2..4096", "\\(got 4,096\\)"),
        ("", "empty; accepted: a whole number"),
    ],
)
def test_a_grid_of_cp_degrees_reads_whole_numbers(text: str, message: str) -> None:
    assert parse_grid("1..8", "--cp", 1024, tokens=False) == [1, 2, 4, 8]
    with pytest.raises(InputError, match=message) as caught:
        parse_grid(text, "--cp", 1024, tokens=False)
    assert caught.value.field == "--cp"


@pytest.mark.parametrize("hw", ["a100-nvlink", "h100-ib"])
@pytest.mark.parametrize(("causal", "pass_"), [(False, "fwd"), (True, "fwd+bwd")])
def test_grid_equals_the_report_point_by_point(hw: str, causal: bool, pass_: str) -> None:
    seqs, ns = [16_384, 131_072, 1 << 20], [2, 8, 16, 64]
    shape = PlanInputs(seq=1, n=1, causal=causal, pass_=pass_, block=1)
    grid = sweep(shape, seqs, ns, Machine(load_profile(hw)))
    for i, seq in enumerate(seqs):
        for j, n in enumerate(ns):
            report = plan(hw, seq=seq, n=n, causal=causal, pass_=pass_, block=64)  # block: only the schedule
            assert grid.ratio[i, j] == pytest.approx(report.verdict.comm_ratio_step, rel=1e-12)
            assert grid.inter_node[j] == (report.hardware.link_scope == "inter-node")
        # N_max: where the pass's ratio reaches 100 % on the link that N uses, or the node's edge.
        profile, n_max = load_profile(hw), float(grid.n_max[i])
        link = profile.links.inter_node if n_max > profile.ranks_per_node else profile.links.intra_node
        values = {
            "S": seq,
            "N": n_max,
            "b": 1,
            "c": 0.5 if causal else 1,
            "d": 128,
            "h": 32,
            "n_kv": 8,
            "p": 2,
            "p_acc": 4,
            "F": 312e12 if hw.startswith("a100") else 989e12,
            "B": link.bandwidth_per_direction,
            "alpha": 0.0,
        }
        worst = max(
            getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]})
            for name in (["comm_ratio_step"] + (["bwd_comm_ratio_step"] if pass_ == "fwd+bwd" else []))
        )
        assert worst == pytest.approx(1.0, rel=1e-9) or (n_max == profile.ranks_per_node and worst < 1)


def test_one_device_receives_nothing_and_undivided_cells_are_empty() -> None:
    grid = sweep(PlanInputs(seq=1, n=1, block=1), [24, 1024], [1, 5, 8], Machine(load_profile("a100-nvlink")))
    assert (grid.ratio[:, 0] == 0).all()
    assert np.isnan(grid.ratio[0, 1]) and np.isnan(grid.ratio[1, 1]) and np.isfinite(grid.ratio[1, 2])
    assert [r["n"] for r in grid.rows() if r["seq"] == 24] == [1, 8]


def test_sweep_cli_formats(cli) -> None:
    args = ["sweep", "--seq", "32k..128k", "--n", "4..16", "--hw", "a100-nvlink,h100-ib"]
    rows = json.loads(cli(*args, "-f", "json").out)["rows"]
    assert len(rows) == 3 * 3 * 2 and {r["verdict"] for r in rows} <= {"green", "amber", "red"}
    table = list(csv.DictReader(io.StringIO(cli(*args, "-f", "csv").out)))
    assert [float(r["comm_ratio_step"]) for r in table] == [r["comm_ratio_step"] for r in rows]
    screen = cli(*args).out
    assert "16*" in screen and "N_max" in screen
    # each grid's title on one line however narrow the grid, the footnote only under a grid with a '*'
    assert "a100-nvlink: fwd step comm ratio (rows S, columns N)\n" in screen
    assert "h100-ib: fwd step comm ratio (rows S, columns N)\n" in screen
    assert "* the ring leaves the node" in screen
    assert "*" not in cli("sweep", "--seq", "32k..128k", "--n", "2..8", "--hw", "a100-nvlink").out


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_is_written(cli, tmp_path, suffix: str) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / f"sweep{suffix}"
    result = cli(
        "sweep",
        "--seq",
        "8k..1M",
        "--n",
        "1..64",
        "--hw",
        "a100-nvlink,h100-ib",
        "--causal",
        "--model",
        "llama3-8b",
        "--gpus",
        "64",
        "--plot",
        str(target),
    )
    assert result.code == 0, result.err
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:500]
    assert not list(tmp_path.glob(".*.tmp"))


def test_plot_without_matplotlib_prints_the_sweep_then_fails_with_an_installable_hint(
    cli, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = cli("sweep", "--seq", "64k", "--n", "8", "--plot", str(tmp_path / "x.png"))
    assert result.code == 2 and "step comm ratio" in result.out  # the answer is not lost to the plot
    assert result.err.startswith("cp-plan: error: --plot: needs matplotlib: pip install matplotlib")
    assert "cp-plan[plot]" not in result.err  # cp-plan is installed from a clone: that name installs nothing
    assert not (tmp_path / "x.png").exists()


def test_plot_rejects_other_file_types(cli, tmp_path) -> None:
    result = cli("sweep", "--seq", "64k", "--n", "8", "--plot", str(tmp_path / "x.pdf"))
    assert result.code == 2 and "--plot: x.pdf: accepted file types are .png and .svg" in result.err
