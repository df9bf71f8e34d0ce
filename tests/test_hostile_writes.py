"""What the tool writes, against hostile paths: ``-`` is no output path; any legal file name can be written."""

from __future__ import annotations

import pytest

from costmodel.core import fileio
from tests.support import REPO
from tests.test_hostile_input import one_line_error

AUDIT = REPO / "tests" / "data" / "audit"
TABLE = AUDIT / "nccl_1node_all_gather_perf.txt"
LOG = AUDIT / "megatron_tp2_cp2_8k.log"
PLAN = REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml"


# --- `-` as an output path ------------------------------------------------------------------------------

DASH = {
    "hw from-nccl-tests --out": (
        ["hw", "from-nccl-tests", str(TABLE), "--out", "-"],
        "--out: - is not accepted",
    ),
    "audit --fit-profile": (
        ["audit", str(LOG), "--hw", "h100-nvlink", "--fit-profile", "-"],
        "--fit-profile: - is not accepted",
    ),
    "audit --runs --fit-profile": (
        ["audit", "--runs", str(REPO / "tests" / "data" / "runs" / "example.csv"), "--fit-profile", "-"],
        "--fit-profile: - is not accepted",
    ),
    "report --html": (["report", str(PLAN), "--html", "-"], "--html: -: accepted file types are .html"),
    "sweep --plot": (
        ["sweep", "--seq", "8k", "--cp", "1..8", "--plot", "-"],
        "--plot: -: accepted file types",
    ),
}


@pytest.mark.parametrize("case", DASH)
def test_dash_is_no_output_file(cli, tmp_path, monkeypatch, case: str) -> None:
    """Standard output carries the answer, so ``-`` is refused by every output flag, never a file named ``-``."""
    args, expected = DASH[case]
    monkeypatch.chdir(tmp_path)
    one_line_error(cli(*args), expected)
    assert not (tmp_path / "-").exists()


# --- long file names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [245, 250, 255])
def test_any_legal_file_name_is_written(tmp_path, length: int) -> None:
    """The temporary file beside the target has a short name of its own, so the target's may take 255 bytes."""
    target = tmp_path / ("a" * (length - 5) + ".yaml")
    fileio.atomic_write_text(target, "x: 1\n")
    assert target.read_text() == "x: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_long_output_name_is_written_by_the_command(cli, tmp_path) -> None:
    out = tmp_path / ("p" * 240 + ".yaml")
    assert cli("hw", "from-nccl-tests", str(TABLE), "--out", str(out), "-f", "json").code == 0
    assert out.read_text().startswith("# Hardware profile")
    one_line_error(
        cli("hw", "from-nccl-tests", str(TABLE), "--out", str(tmp_path / ("p" * 252 + ".yaml"))),
        "--out: cannot write",
        "File name too long",
    )
