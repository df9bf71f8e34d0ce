"""Hostile and extreme input files and flags: exit 2 with one line naming the flag or field, never a
traceback, nothing half-written, bounded time and memory. One test per way the tool used to break."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from costmodel.core import fileio
from costmodel.core.resources import data_dir
from tests.support import REPO

PROFILE = (data_dir("hardware") / "a100-nvlink.yaml").read_text()
MODEL = (data_dir("configs") / "models" / "llama3-8b.yaml").read_text()
PLAN = "name: x\nmodel: worked-example\nseq: 8k\nn: 8\nhw: a100-nvlink\n"


def one_line_error(result, *expected: str) -> str:  # noqa: ANN001 - a CLIResult
    """The result is bad input: exit 2, nothing on stdout, one stderr line holding every ``expected``."""
    assert result.code == 2, (result.out, result.err)
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cp-plan: error: "), result.err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def alias_bomb(levels: int = 20) -> str:
    """3**levels leaves from a file under a kilobyte."""
    lines = ["a0: &a0 {x: 1, y: 2}"]
    lines += [f"a{i}: &a{i} {{x: *a{i - 1}, y: *a{i - 1}, z: *a{i - 1}}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# Where each kind of YAML input enters: a flag or a command, and the field it is reported under.
ENTRIES = {
    "check": (lambda path: ["check", path], None),
    "--hw": (lambda path: ["--hw", path], "--hw"),
    "--model": (lambda path: ["--model", path, "--seq", "128k", "--n", "8"], "--model"),
    "hw show": (lambda path: ["hw", "show", path], "NAME"),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PLAN + alias_bomb(), "anchors and aliases"),
        ("name: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 64 levels"),
        ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 80)), "nested deeper than 64 levels"),
        ("x: " + "9" * 5000 + "\n", "unreadable value"),
        ("\x00\x01binary", "malformed YAML"),
    ],
    ids=["alias-bomb", "deep-flow", "deep-block", "huge-int", "binary"],
)
def test_hostile_yaml_is_refused_by_every_reader(cli, tmp_path, entry: str, text: str, expected: str) -> None:
    args, field = ENTRIES[entry]
    path = write(tmp_path, "hostile.yaml", text)
    line = one_line_error(cli(*args(path)), expected)
    assert line.startswith(f"cp-plan: error: {field or path}")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_file_over_the_size_bound_is_refused_unread(cli, tmp_path, entry: str) -> None:
    args, _ = ENTRIES[entry]
    path = write(tmp_path, "big.yaml", "# " + "x" * fileio.MAX_YAML_BYTES + "\n")
    one_line_error(cli(*args(path)), "larger than 1 MiB")


DPN = PROFILE.splitlines().index("devices_per_node: 8") + 1  # its line in the profile


@pytest.mark.parametrize(
    ("entry", "text", "expected"),
    [
        ("check", PLAN + "n: 4\n", ":6: duplicate key 'n' on lines 4 and 6"),
        (
            "--hw",
            PROFILE.replace("devices_per_node: 8\n", "devices_per_node: 8\ndevices_per_node: 4\n"),
            f"dup.yaml:{DPN + 1}: duplicate key 'devices_per_node' on lines {DPN} and {DPN + 1}",
        ),
        ("--model", MODEL + "heads: 64\n", "duplicate key 'heads' on lines 4 and 11"),
    ],
)
def test_duplicate_keys_name_the_key_and_both_lines(
    cli, tmp_path, entry: str, text: str, expected: str
) -> None:
    args, _ = ENTRIES[entry]
    one_line_error(cli(*args(write(tmp_path, "dup.yaml", text))), expected)


def test_the_line_map_visits_each_node_once_and_knows_list_items(tmp_path) -> None:
    doc = fileio.read_yaml(write(tmp_path, "a.yaml", "a:\n  b: 1\n  c:\n    - x\n    - y: 2\n"), "--hw")
    assert doc.data == {"a": {"b": 1, "c": ["x", {"y": 2}]}}
    assert doc.lines == {
        ("a",): 1,
        ("a", "b"): 2,
        ("a", "c"): 3,
        ("a", "c", "0"): 4,
        ("a", "c", "1"): 5,
        ("a", "c", "1", "y"): 5,
    }
    assert doc.line("a", "c", 1, "y") == 5 and doc.line("a", "nosuch") == 1 and doc.line("nosuch") == 1


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_unreadable_file_is_one_line(cli, tmp_path, monkeypatch, entry: str) -> None:
    """chmod 000 denies nothing to root, so opening is made to fail as it does for anyone else."""
    args, _ = ENTRIES[entry]
    path = write(tmp_path, "locked.yaml", PLAN)
    os.chmod(path, 0)
    if os.geteuid() == 0:
        real_open = os.open

        def denied(name, *rest, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if os.fspath(name) == path:
                raise PermissionError(13, "Permission denied", name)
            return real_open(name, *rest, **kwargs)

        monkeypatch.setattr(fileio.os, "open", denied)
    one_line_error(cli(*args(path)), "locked.yaml: permission denied")


@pytest.mark.parametrize("flag", ["--hw", "--model"])
def test_a_name_too_long_for_the_filesystem_is_one_line(cli, flag: str) -> None:
    one_line_error(cli(flag, "x" * 300, "--seq", "128k"), flag, "unknown")
    one_line_error(cli(flag, "x" * 300 + ".yaml", "--seq", "128k"), flag, "File name too long")


# --- output that cannot be written ---------------------------------------------------------------

SWEEP = ["sweep", "--seq", "8k", "--n", "1..4"]


def test_plot_into_a_folder_that_is_a_file_or_onto_a_folder(cli, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "file").write_text("")
    one_line_error(
        cli(*SWEEP, "--plot", str(tmp_path / "file" / "x.png")), "--plot: cannot write", "is a file"
    )
    one_line_error(cli(*SWEEP, "--plot", str(tmp_path / "file" / "a" / "x.png")), "--plot: cannot write")
    (tmp_path / "d.png").mkdir()
    one_line_error(cli(*SWEEP, "--plot", str(tmp_path / "d.png")), "--plot: cannot write", "Is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "file"]


def test_plot_into_a_read_only_folder(cli, tmp_path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    if os.geteuid() == 0:  # root writes anywhere: make creating the file fail as it would for a user
        import tempfile

        def denied(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "mkstemp", denied)
    one_line_error(cli(*SWEEP, "--plot", str(folder / "x.png")), "--plot: cannot write", "Permission denied")
    assert list(folder.iterdir()) == []


def test_calibrate_checks_its_destination_before_measuring(cli, tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    import costmodel.kernel.launch

    monkeypatch.setattr(costmodel.kernel.launch, "launch", _must_not_launch)
    (tmp_path / "file").write_text("")
    one_line_error(cli("calibrate", "--out", str(tmp_path / "file" / "me.yaml")), "--out: cannot write")
    one_line_error(cli("calibrate", "--out", str(tmp_path)), "--out")


def _must_not_launch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    raise AssertionError("ranks were started before the input was checked")


# --- numbers in profiles, presets and plans ------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("bf16: 312.0e+12", "bf16: .inf", "device.peak_flops.bf16: Input should be a finite number"),
        ("bf16: 312.0e+12", "bf16: '1e400'", "device.peak_flops.bf16: Input should be a finite number"),
        ("bf16: 312.0e+12", "bf16: 1.0e-320", "device.peak_flops.bf16: must be in [1e-30, 1e+30]"),
        ("bf16: 312.0e+12", "bf16: .nan", "device.peak_flops.bf16: Input should be a finite number"),
        ("bf16: 312.0e+12", "bf16: true", "device.peak_flops.bf16: expected a number, not a boolean"),
        (
            "latency_s: 0.0",
            "latency_s: 1.0e-320",
            "links.intra_node.latency_s: must be 0 or in [1e-30, 1e+30]",
        ),
        ("latency_s: 0.0", "latency_s: .inf", "links.intra_node.latency_s: Input should be a finite number"),
        (
            "bandwidth_bidirectional: 600.0e+09",
            "bandwidth_bidirectional: .inf",
            "links.intra_node.bandwidth_bidirectional: Input should be a finite number",
        ),
        ("hbm_bytes: 80.0e+9", "hbm_bytes: 1.0e+31", "device.hbm_bytes: must be in [1e-30, 1e+30]"),
        (
            "devices_per_node: 8",
            "devices_per_node: true",
            "devices_per_node: expected a number, not a boolean",
        ),
    ],
)
def test_profile_numbers_are_finite_in_range_and_not_booleans(
    cli, tmp_path, old: str, new: str, field: str
) -> None:
    assert old in PROFILE
    path = write(tmp_path, "p.yaml", PROFILE.replace(old, new, 1))
    one_line_error(cli("--hw", path), "--hw: ", field)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PLAN.replace("seq: 8k", "seq: true"), ":3: seq: expected a number, not a boolean"),
        (PLAN.replace("n: 8", "n: true"), ":4: n: expected a number, not a boolean"),
        (PLAN + "zero: true\n", ":6: zero: expected a number, not a boolean"),
        (PLAN + "efficiency: .nan\n", ":6: efficiency: Input should be"),
        (PLAN.replace("seq: 8k", "seq: " + "9" * 400), ":3: seq:"),
        (PLAN.replace("seq: 8k", "seq: '" + "9" * 400 + "k'"), ":3: seq:"),
    ],
)
def test_plan_numbers_are_finite_in_range_and_not_booleans(cli, tmp_path, text: str, expected: str) -> None:
    one_line_error(cli("check", write(tmp_path, "plan.yaml", text)), expected)


def test_model_counts_are_not_booleans(cli, tmp_path) -> None:
    path = write(tmp_path, "m.yaml", MODEL.replace("kv_heads: 8", "kv_heads: true"))
    one_line_error(
        cli("--model", path, "--seq", "128k"),
        "--model: ",
        "line 5: kv_heads: expected a number, not a boolean",
    )


# --- check: every problem, unknown keys, its output formats ---------------------------------------


def test_check_lists_every_problem_and_names_an_unknown_key(cli, tmp_path) -> None:
    path = write(tmp_path, "plan.yaml", PLAN.replace("seq:", "sequence:") + "tp: 0\ncolour: blue\n")
    line = one_line_error(cli("check", path))
    assert line == (
        f"cp-plan: error: {path}:3: sequence: unknown key; {path}:7: colour: unknown key; "
        f"{path}:1: seq: Field required; {path}:6: tp: Input should be greater than or equal to 1 (got 0)"
    )


def test_check_annotates_invalid_plans_for_github(cli, tmp_path) -> None:
    bad = write(tmp_path, "a,b:c.yaml", PLAN.replace("seq:", "sequence:"))
    dup = write(tmp_path, "dup.yaml", PLAN + "n: 4\n")
    result = cli("check", bad, dup, "-f", "github")
    assert result.code == 2 and len(result.err.splitlines()) == 1
    escaped = bad.replace(":", "%3A").replace(",", "%2C")
    assert result.out.splitlines() == [
        f"::error file={escaped},line=3,title=cp-plan invalid plan::sequence: unknown key",
        f"::error file={escaped},line=1,title=cp-plan invalid plan::seq: Field required",
        f"::error file={dup},line=6,title=cp-plan invalid plan::duplicate key 'n' on lines 4 and 6",
    ]


def test_github_properties_escape_colon_and_comma(cli, tmp_path) -> None:
    path = write(tmp_path, "x,y:z.yaml", PLAN.replace("name: x", "name: 'a: b, c'"))
    out = cli("check", path, "-f", "github").out
    escaped = path.replace(":", "%3A").replace(",", "%2C")
    assert out.startswith(
        f"::error file={escaped},line=1,title=cp-plan worst_verdict::a: b, c: fwd+bwd verdict red"
    )


def test_junit_stays_valid_xml_with_control_characters_in_the_name(cli, tmp_path) -> None:
    path = write(tmp_path, "plan.yaml", PLAN.replace("name: x", 'name: "a\\x01b\\x1bc\\uFFFE"'))
    result = cli("check", path, "-f", "junit")
    assert result.code == 1  # the plan's verdict is red; the report must still parse
    case = ET.fromstring(result.out.split("\n", 1)[1]).find(".//testcase")
    assert case.get("classname") == "a\\u0001b\\u001bc\\ufffe"


# --- kernel flags are checked before any rank is spawned ------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["kernel", "selftest", "--timeout", "nan"], "--timeout: must be a number of seconds in (0, 604800]"),
        (["kernel", "selftest", "--timeout", "-1"], "--timeout"),
        (["kernel", "selftest", "--timeout", "inf"], "--timeout"),
        (["kernel", "selftest", "--atol", "-1"], "--atol: must be a finite number >= 0"),
        (["kernel", "selftest", "--rtol", "nan"], "--rtol"),
        (["kernel", "selftest", "--seed", str(2**70)], "'--seed'"),
        (["kernel", "selftest", "--nproc", "0"], "'--nproc'"),
        (["kernel", "selftest", "--head-dim", "0"], "'--head-dim'"),
        (["calibrate", "--out", "x.yaml", "--head-dim", "-1"], "'--head-dim'"),
        (["calibrate", "--out", "x.yaml", "--heads", "0"], "'--heads'"),
        (["calibrate", "--out", "x.yaml", "--timeout", "nan"], "--timeout"),
        (["validate", "--hw", "a100-nvlink", "--timeout", "0"], "--timeout"),
        (["validate", "--hw", "a100-nvlink", "--max-median-error", "nan"], "--max-median-error"),
    ],
)
def test_kernel_flags_are_checked_at_the_edge(cli, monkeypatch, args: list[str], expected: str) -> None:
    import costmodel.kernel.launch

    monkeypatch.setattr(costmodel.kernel.launch, "launch", _must_not_launch)
    one_line_error(cli(*args), expected)


@pytest.mark.kernel
@pytest.mark.slow
def test_a_killed_run_leaves_no_store_and_no_semaphore(tmp_path) -> None:
    pytest.importorskip("torch")
    import signal
    import time

    before = set(Path("/tmp").glob("cp-plan-store-*"))
    run = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from costmodel.cli import main; main()",
            "kernel",
            "selftest",
            "--nproc",
            "2",
            "--seq",
            "4096",
            "--head-dim",
            "64",
            "--timeout",
            "120",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    time.sleep(5)  # the ranks are up and computing
    run.send_signal(signal.SIGKILL)
    _, err = run.communicate(timeout=60)
    assert run.returncode == -signal.SIGKILL
    assert set(Path("/tmp").glob("cp-plan-store-*")) == before
    assert "leaked" not in err, err


# --- a reader that goes away ---------------------------------------------------------------------


@pytest.mark.parametrize("args", [["formulas"], ["--seq", "256k", "--n", "8", "-f", "json"]])
def test_a_closed_pipe_exits_quietly(args: list[str]) -> None:
    """As ``cp-plan formulas | head -c 100``: the pipe holds 4 KiB, less than the output, so the reader
    closing it is certain to meet a write still under way."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("pipe size cannot be set here")
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    run = subprocess.Popen(
        [sys.executable, "-c", "from costmodel.cli import main; raise SystemExit(main())", *args],
        stdout=write_end,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"},
    )
    os.close(write_end)
    assert os.read(read_end, 100)
    os.close(read_end)
    err = run.stderr.read().decode()
    assert run.wait(timeout=60) in (0, 141) and err == ""
