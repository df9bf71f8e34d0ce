"""`--timeline`: the ring schedule on the terminal, one row per rank, with its legend; bad requests exit 2."""

from __future__ import annotations

import re

import pytest

from costmodel.cli.timeline import GLYPHS, columns
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.gantt import ring_timeline
from costmodel.plans.inputs import PlanInputs

CAUSAL_PLAN = ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink", "--causal"]


def rank_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"rank \d+ ", line)]


@pytest.mark.parametrize(("n", "pass_", "panels"), [(8, "fwd", 1), (4, "fwd+bwd", 2), (1, "fwd", 1)])
def test_one_row_per_rank_and_a_legend(cli, n: int, pass_: str, panels: int) -> None:
    result = cli(
        "--seq", "256k", "--n", str(n), "--causal", "--layout", "contiguous", "--pass", pass_, "--timeline"
    )
    assert result.code == 0, result.err
    rows = rank_rows(result.out)
    assert len(rows) == n * panels
    assert [int(r.split()[1]) for r in rows] == list(range(n)) * panels
    assert result.out.count("legend") == panels
    for glyph, kind in zip(GLYPHS.values(), GLYPHS, strict=True):
        assert f"{glyph} {kind}" in result.out
    assert result.out.count("Ring timeline, one layer") == panels


def test_contiguous_rows_show_the_imbalance(cli) -> None:
    """Rank 0 computes its diagonal block, then idles; rank 7 computes the whole layer but its merges."""
    rows = rank_rows(cli(*CAUSAL_PLAN, "--layout", "contiguous", "--timeline").out)
    first, last = rows[0], rows[7]
    assert first.count(GLYPHS["idle"]) > 10 * first.count(GLYPHS["compute"])
    assert GLYPHS["idle"] not in last.split("%")[0].removeprefix("rank 7")
    assert int(re.search(r"(\d+) % c", last).group(1)) >= 98  # 1 % of the layer merges partial outputs


def test_columns_follow_the_segments() -> None:
    """Slices of an 8-rank zigzag forward on NVLink are compute, and the merge that ends each step after the
    first: nothing idles, nothing waits on the link."""
    timeline = ring_timeline(
        PlanInputs(seq=262_144, n=8, causal=True, layout="zigzag"), Machine(load_profile("a100-nvlink"))
    )
    for rank in range(8):
        kinds = columns(timeline, rank, 60)
        assert set(kinds) <= {"compute", "overhead"} and kinds.count("compute") >= 55


def test_exposed_transfer_on_a_slow_link(cli) -> None:
    rows = rank_rows(
        cli("--seq", "32k", "--n", "8", "--hw", "h100-ib", "--causal", "--layout", "zigzag", "--timeline").out
    )
    assert all(GLYPHS["transfer"] in row for row in rows)


def test_too_many_ranks_exits_2_in_one_line(cli) -> None:
    result = cli("--seq", "1M", "--n", "128", "--hw", "h100-ib", "--timeline")
    assert result.code == 2 and result.out == ""
    assert result.err.count("\n") == 1 and "--timeline" in result.err and "at most 64" in result.err


def test_timeline_needs_a_drawing_format(cli) -> None:
    result = cli(*CAUSAL_PLAN, "--timeline", "--format", "json")
    assert result.code == 2 and result.err.count("\n") == 1 and "--timeline" in result.err
    assert cli(*CAUSAL_PLAN, "--timeline", "--format", "html").code == 0
