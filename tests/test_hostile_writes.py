"""What the tool writes, against hostile paths and outputs: an output that is also an input is refused and
the input kept; ``-`` is no output path; any legal file name can be written; an answer cut short on standard
output (a file-size limit) is exit 2 with one line, never a success."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from costmodel.core import fileio
from costmodel.core.resources import data_dir
from tests.support import REPO
from tests.test_hostile_input import _must_not_launch, one_line_error

AUDIT = REPO / "tests" / "data" / "audit"
TABLE = AUDIT / "nccl_1node_all_gather_perf.txt"
LOG = AUDIT / "megatron_tp2_cp2_8k.log"
PLAN = REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml"
PROFILE = data_dir("hardware") / "a100-nvlink.yaml"


# --- an output that is also an input ---------------------------------------------------------------------


def _same_name(folder: Path, source: Path, name: str) -> tuple[str, str]:
    shutil.copy(source, folder / name)
    return name, name


def _dot_slash(folder: Path, source: Path, name: str) -> tuple[str, str]:
    shutil.copy(source, folder / name)
    return name, f"./{name}"


def _symbolic_link(folder: Path, source: Path, name: str) -> tuple[str, str]:
    shutil.copy(source, folder / name)
    (folder / f"link-{name}").symlink_to(name)
    return f"link-{name}", name  # read through the link, written to the file it names


def _hard_link(folder: Path, source: Path, name: str) -> tuple[str, str]:
    shutil.copy(source, folder / name)
    os.link(folder / name, folder / f"linked-{name}")
    return name, f"linked-{name}"


SPELLINGS: dict[str, Callable[[Path, Path, str], tuple[str, str]]] = {
    "same name": _same_name,
    "./name": _dot_slash,
    "symbolic link": _symbolic_link,
    "hard link": _hard_link,
}

# command: (the input's source, its name, the arguments given (input, output), the output flag, the input's field)
WRITERS: dict[str, tuple[Path, str, Callable[[str, str], list[str]], str, str]] = {
    "hw from-nccl-tests --out": (
        TABLE,
        "all_gather.yaml",  # read whatever its name; a profile is written only under a YAML one
        lambda read, out: ["hw", "from-nccl-tests", read, "--out", out],
        "--out",
        "FILE",
    ),
    "audit --fit-profile": (
        LOG,
        "run.yaml",
        lambda read, out: ["audit", read, "--hw", "h100-nvlink", "--fit-profile", out],
        "--fit-profile",
        "LOG",
    ),
    "report --html": (PLAN, "plan.htm", lambda read, out: ["report", read, "--html", out], "--html", ""),
    "sweep --hw --plot": (
        PROFILE,
        "mine.png",  # a profile is YAML whatever its name; --plot wants .png
        lambda read, out: ["sweep", "--seq", "8k", "--cp", "1..8", "--hw", read, "--plot", out],
        "--plot",
        "--hw",
    ),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("writer", WRITERS)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    cli, tmp_path, monkeypatch, writer: str, spelling: str
) -> None:
    if writer == "sweep --hw --plot":
        pytest.importorskip("matplotlib")
    source, name, args, flag, field = WRITERS[writer]
    monkeypatch.chdir(tmp_path)
    read, out = SPELLINGS[spelling](tmp_path, source, name)
    before = source.read_bytes()
    line = one_line_error(cli(*args(read, out)), f"{flag}: ", "is also an input of this command", field)
    assert read in line.split("(")[-1]  # the input it would overwrite, by the name it was read
    assert (tmp_path / name).read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_output_read_on_standard_input_is_refused(cli, tmp_path, monkeypatch) -> None:
    """As ``cp-plan hw from-nccl-tests - --out T.yaml < T.yaml``."""
    table = tmp_path / "all_gather.yaml"
    shutil.copy(TABLE, table)
    monkeypatch.setattr(fileio, "_stdin_read", None)
    with table.open("rb") as stdin:
        monkeypatch.setattr(sys, "stdin", type("Stdin", (), {"buffer": stdin})())
        result = cli("hw", "from-nccl-tests", "-", "--out", str(table))
    one_line_error(result, "--out: ", "is also an input", "FILE standard input")
    assert table.read_bytes() == TABLE.read_bytes()


def test_calibrate_refuses_its_preset_as_output_before_measuring(cli, tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    import costmodel.kernel.launch

    monkeypatch.setattr(costmodel.kernel.launch, "launch", _must_not_launch)
    preset = tmp_path / "mine.yaml"
    shutil.copy(REPO / "configs" / "models" / "llama3-8b.yaml", preset)
    before = preset.read_bytes()
    one_line_error(cli("calibrate", "--model", str(preset), "--out", str(preset)), "--out: ", "--model")
    assert preset.read_bytes() == before


def test_the_inputs_are_those_of_this_run_only(cli, tmp_path) -> None:
    """Many runs share one process (these tests): a file read by one run is a free output for the next."""
    first, second = tmp_path / "all_gather.yaml", tmp_path / "again_all_gather.txt"
    shutil.copy(TABLE, first)
    shutil.copy(TABLE, second)
    assert cli("hw", "from-nccl-tests", str(first), "--out", str(tmp_path / "a.yaml")).code == 0
    assert cli("hw", "from-nccl-tests", str(second), "--out", str(first)).code == 0
    assert first.read_text().startswith("# Hardware profile")


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


# --- an answer cut short on standard output --------------------------------------------------------------


def _limited(args: list[str], stdout: Path, limit_bytes: int) -> subprocess.CompletedProcess[bytes]:
    """``cp-plan ARGS > stdout`` under ``ulimit -f`` of ``limit_bytes``: the real process and its descriptor."""
    with stdout.open("wb") as out:
        return subprocess.run(
            [sys.executable, "-c", "from costmodel.cli import main; raise SystemExit(main())", *args],
            stdout=out,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"},
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes)),
        )


@pytest.mark.parametrize(
    "args",
    [
        ["hw", "show", "a100-nvlink"],  # 6 KB, one write at the end
        ["sweep", "--seq", "8k..1M", "--cp", "1..64", "--hw", "a100-nvlink,h100-ib", "-f", "json"],  # 32 KB
    ],
)
def test_an_answer_cut_by_a_file_size_limit_is_exit_2(tmp_path, args: list[str]) -> None:
    done = _limited(args, tmp_path / "out", 4096)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.splitlines() == ["cp-plan: error: stdout: cannot write the answer: File too large"]


def test_an_answer_under_the_file_size_limit_is_whole(cli, tmp_path) -> None:
    done = _limited(["hw", "show", "a100-nvlink"], tmp_path / "out", 1 << 20)
    assert done.returncode == 0 and done.stderr == b""
    assert (tmp_path / "out").read_text() == cli("hw", "show", "a100-nvlink").out


@pytest.mark.parametrize("kind", ["symbolic link", "folder"])
def test_sweep_checks_its_plot_destination_before_any_work(cli, tmp_path, kind: str) -> None:
    """A --plot that cannot be written is one line naming the flag before the grid is computed or printed,
    as every writer's destination is."""
    target = tmp_path / "plot.png"
    if kind == "folder":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "elsewhere.png")
    result = cli("sweep", "--seq", "8k", "--cp", "1..8", "--plot", str(target))
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("cp-plan: error: --plot: cannot write") and result.err.count("\n") == 1
    assert not (tmp_path / "elsewhere.png").exists()
