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
from tests.support import REPO, wait_for_connected_ranks

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
        ("\x00\x01binary", "a control character"),
        # a standard tag on text it cannot read: PyYAML's constructors raised Python's own errors (a traceback)
        ("a: 1\nx: !!bool maybe\n", ":2: 'maybe' cannot be read as the tag !!bool says"),
        ("x: !!timestamp abc\n", ":1: 'abc' cannot be read as the tag !!timestamp says"),
        ("x: !!int abc\n", ":1: unreadable value: invalid literal for int()"),
        ("a: 1\nyes: 2\n", ":2: 'yes' is read as a boolean, not a name: quote a key that is one"),
        (
            "x: " + "9" * 5000 + "\n",
            ":1: unreadable value: a number of 5,000 characters; at most 4,300 digits",
        ),
    ],
    ids=[
        "alias-bomb",
        "deep-flow",
        "deep-block",
        "binary",
        "bool-tag",
        "timestamp-tag",
        "int-tag",
        "bool-key",
        "huge-int",
    ],
)
def test_hostile_yaml_is_refused_by_every_reader(cli, tmp_path, entry: str, text: str, expected: str) -> None:
    args, field = ENTRIES[entry]
    path = write(tmp_path, "hostile.yaml", text)
    line = one_line_error(cli(*args(path)), expected)
    # a plan's problems lead with its path, as every reader shows a path: cut in the middle past 80 characters
    assert line.startswith(f"cp-plan: error: {field}") if field else "/hostile.yaml:" in line


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
            "links.intra_node.latency_s: must be 0 or from 1e-09 to 1 s",
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
        f"cp-plan: error: {path}:3: sequence: unknown key; did you mean seq; {path}:7: colour: unknown key; "
        f"{path}:1: seq: Field required; {path}:6: tp: Input should be greater than or equal to 1 (got 0)"
    )


def test_check_annotates_invalid_plans_for_github(cli, tmp_path) -> None:
    bad = write(tmp_path, "a,b:c.yaml", PLAN.replace("seq:", "sequence:"))
    dup = write(tmp_path, "dup.yaml", PLAN + "n: 4\n")
    result = cli("check", bad, dup, "-f", "github")
    assert result.code == 2 and len(result.err.splitlines()) == 1
    escaped = bad.replace(":", "%3A").replace(",", "%2C")
    assert result.out.splitlines() == [
        f"::error file={escaped},line=3,title=cp-plan invalid plan::sequence: unknown key; did you mean seq",
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


def test_junit_stays_valid_xml_with_characters_xml_refuses_in_the_name(cli, tmp_path) -> None:
    """Control characters are refused when the plan is read (tests/test_hostile_text.py); a noncharacter such
    as U+FFFE is text YAML reads and XML does not."""
    path = write(tmp_path, "plan.yaml", PLAN.replace("name: x", 'name: "a\\uFFFEb"'))
    result = cli("check", path, "-f", "junit")
    assert result.code == 1  # the plan's verdict is red; the report must still parse
    case = ET.fromstring(result.out.split("\n", 1)[1]).find(".//testcase")
    assert case.get("classname") == "a\\ufffeb"


# --- kernel flags are checked before any rank is spawned ------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["kernel", "selftest", "--timeout", "nan"], "'--timeout': 'nan' is not a number"),
        (["kernel", "selftest", "--timeout", "1e9"], "--timeout: must be a number of seconds in (0, 604800]"),
        (["kernel", "selftest", "--timeout", "-1"], "--timeout"),
        (["kernel", "selftest", "--timeout", "inf"], "--timeout"),
        (["kernel", "selftest", "--atol", "-1"], "--atol: must be a finite number >= 0"),
        (["kernel", "selftest", "--rtol", "nan"], "--rtol"),
        (["kernel", "selftest", "--seed", str(2**70)], "'--seed'"),
        (["kernel", "selftest", "--nproc", "0"], "'--nproc'"),
        (["kernel", "selftest", "--head-dim", "0"], "--head-dim: must be >= 1"),
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
    wait_for_connected_ranks(run, 2)  # the ranks are up: the store and the process group exist
    run.send_signal(signal.SIGKILL)
    _, err = run.communicate(timeout=120)  # the ranks hold its pipes until they see it gone
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


# --- second round: generators per class, each case under 60 s of CPU and +2 GiB (tests/test_fuzz_files.py) ---

import collections  # noqa: E402 - this section's own needs
import json  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.test_fuzz_files import STATS, run_cli  # noqa: E402

ROUND = settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
CASES: collections.Counter[str] = collections.Counter()  # cases per class, printed by tests/conftest.py
SLOWEST: list[tuple[float, int, str]] = []  # (CPU seconds, peak RSS bytes, label) of accepted inputs
AUDIT = REPO / "tests" / "data" / "audit"
TABLE = (AUDIT / "nccl_1node_all_gather_perf.txt").read_text().splitlines()
HEADER = [line for line in TABLE if not line.strip() or line.lstrip().startswith("#")][:17]
ROWS = [
    [float(x) if i in (5, 6, 7, 9, 10, 11) else x for i, x in enumerate(line.split())]
    for line in TABLE
    if line[:12].strip().isdigit()
]


def _run(kind: str, args: list[str], label: str) -> Any:  # an Outcome
    """One case in a forked child under the fuzz limits; the promise every case keeps, then the outcome."""
    outcome = run_cli([str(a) for a in args])
    CASES[kind] += 1
    STATS.add(outcome, label)
    assert outcome.signal is None, f"{label}: killed by signal {outcome.signal}\n{outcome.err}"
    assert "Traceback" not in outcome.err, f"{label}:\n{outcome.err}"
    assert outcome.code in (0, 1, 2), f"{label}: exit {outcome.code}\n{outcome.err}"
    if outcome.code == 2:
        lines = outcome.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("cp-plan: error: "), f"{label}:\n{outcome.err}"
    else:
        SLOWEST.append((outcome.cpu_s, outcome.peak_rss_bytes, label))
        SLOWEST.sort(reverse=True)
        del SLOWEST[5:]
    return outcome


def _row(size: int, out_us: float, in_us: float, extra: int = 0) -> str:
    algbw_out, algbw_in = size / (out_us * 1e3), size / (in_us * 1e3)
    cells = [f"{size:12d}", f"{size // 4:12d}", "float", "none", "-1"]
    cells += [f"{out_us:8.2f}", f"{algbw_out:7.2f}", f"{algbw_out * 7 / 8:7.2f}", "0"]
    cells += [f"{in_us:8.2f}", f"{algbw_in:7.2f}", f"{algbw_in * 7 / 8:7.2f}", "0"]
    return "  ".join(cells + ["7"] * extra)


def _table(rows: list[tuple[int, float]], extra: int = 0, header: list[str] = HEADER) -> str:
    return "\n".join([*header, *(_row(size, t, t, extra) for size, t in rows)]) + "\n"


GOOD = [(int(r[0]), float(r[5])) for r in ROWS]


@st.composite
def garbage_tables(draw: st.DrawFn) -> tuple[str, str]:
    """A table a fit would turn into nonsense, each way it can: what is wrong, and the file's text."""
    kind = draw(
        st.sampled_from(
            [
                "extra columns",
                "two tables",
                "constant",
                "decreasing",
                "few rows",
                "repeated size",
                "extreme time",
                "too fast",
                "flat then fast",
            ]
        )
    )
    rows = list(GOOD)
    if kind == "extra columns":
        return kind, _table(rows, extra=draw(st.integers(1, 3)))
    if kind == "two tables":
        other = draw(st.sampled_from(["all_gather_perf", "sendrecv_perf", "all_reduce_perf"]))
        second = [line.replace("all_gather_perf", other) for line in HEADER]
        return kind, _table(rows) + _table(rows[: draw(st.integers(1, len(rows)))], header=second)
    if kind == "constant":
        t = draw(st.floats(1, 1e4))
        return kind, _table([(size, t) for size, _ in rows])
    if kind == "decreasing":
        start = draw(st.floats(100, 1e6))
        step = draw(st.floats(0.5, 0.95))
        return kind, _table([(size, start * step**i) for i, (size, _) in enumerate(rows)])
    if kind == "few rows":
        picked = sorted(draw(st.lists(st.sampled_from(rows), min_size=1, max_size=3, unique=True)))
        return kind, _table(picked)
    if kind == "repeated size":
        i = draw(st.integers(1, len(rows) - 1))
        return kind, _table([*rows[: i + 1], rows[i], *rows[i + 1 :]])
    if kind == "extreme time":
        i = draw(st.integers(0, len(rows) - 1))
        t = draw(st.sampled_from([1e-300, 5e-324, 1e300, 1e-9, 1e12]))
        return kind, "\n".join(
            [
                *HEADER,
                *(
                    _row(s, x, x) if j != i else _row(s, 1.0, 1.0).replace(f"{1.0:8.2f}", f"{t!r:>8}", 1)
                    for j, (s, x) in enumerate(rows)
                ),
            ]
        ) + "\n"
    if kind == "too fast":  # consistent columns, a bus far beyond any link: B x 10..1e6
        scale = draw(st.floats(10, 1e6))
        return kind, _table([(size, max(t / scale, 0.01)) for size, t in rows])
    # a latency floor that ends in an impossible jump: the largest messages take almost no time more
    return kind, _table([(size, 12.0 + 1e-9 * size) for size, _ in rows])


@ROUND
@given(garbage_tables())
def test_nccl_tables_that_would_fit_garbage_are_refused(case: tuple[str, str]) -> None:
    kind, text = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "all_gather_perf.txt"
        path.write_text(text)
        out = Path(folder) / "p.yaml"
        outcome = _run("fits", ["hw", "from-nccl-tests", path, "--base", "h100-nvlink", "--out", out], kind)
        assert outcome.code == 2, f"{kind}: accepted\n{outcome.out}"
        assert not out.exists() and sorted(p.name for p in Path(folder).iterdir()) == ["all_gather_perf.txt"]


@ROUND
@given(st.lists(st.integers(0, len(GOOD) - 1), min_size=6, unique=True), st.floats(0.99, 1.01))
def test_a_clean_table_with_sizes_left_out_still_fits_within_the_link(keep: list[int], jitter: float) -> None:
    """The refusals above leave real tables alone: any 6 or more of the sizes, times off by 1 %."""
    rows = [(GOOD[i][0], GOOD[i][1] * (jitter if i % 2 else 1)) for i in sorted(keep)]
    if rows[-1][1] < 1.2 * rows[0][1]:  # only latency-bound sizes kept: no bandwidth shows, refused
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "all_gather_perf.txt"
        path.write_text(_table(rows))
        outcome = _run("fits", ["hw", "from-nccl-tests", path, "-f", "json"], "clean subset")
    assert outcome.code == 0, outcome.err
    (fit,) = json.loads(outcome.out)["fits"]
    assert fit["r2"] >= 0.95 and fit["latency_s"] >= 0 and 0 < fit["bus_bandwidth"] <= 2 * 450e9


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.one_of(
        st.tuples(st.just("leading zeros"), st.integers(0, 10**9), st.integers(1, 12)),
        st.tuples(st.just("base 60"), st.lists(st.integers(0, 59), min_size=2, max_size=4), st.just(0)),
        st.tuples(st.just("octal"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("hex"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("underscore"), st.integers(1000, 10**9), st.just(0)),
    )
)
def test_yaml_numbers_mean_what_was_written(tmp_path_factory, case: tuple) -> None:
    """YAML 1.2's core schema in every YAML reader: no 1.1 octal or base 60 surprises."""
    kind, value, width = case
    text, expected = {
        "leading zeros": lambda: (f"{value:0{width}d}", value),
        "base 60": lambda: (":".join(str(v) for v in value), ":".join(str(v) for v in value)),
        "octal": lambda: (f"0o{value:o}", value),
        "hex": lambda: (f"0x{value:x}", value),
        "underscore": lambda: (f"{value:_d}", f"{value:_d}"),
    }[kind]()
    CASES["numbers"] += 1
    path = tmp_path_factory.mktemp("yaml") / "n.yaml"
    path.write_text(f"seq: {text}\nlist: [{text}]\n")
    data = fileio.load_yaml(path, "--hw")
    assert data == {"seq": expected, "list": [expected]}, (text, data)


def test_a_plan_with_a_leading_zero_plans_the_decimal_length(cli, tmp_path) -> None:
    CASES["numbers"] += 1
    path = write(tmp_path, "p.yaml", PLAN.replace("seq: 8k", "seq: 020000"))
    from costmodel.training.check import load_plan

    assert load_plan(path).plan.seq == 20000


@st.composite
def json_with_a_duplicate(draw: st.DrawFn) -> tuple[str, str]:
    """A config.json whose mapping at some depth repeats a key; the text, and the key."""
    key = draw(st.sampled_from(["num_attention_heads", "hidden_size", "model_type", "a", "é"]))
    depth = draw(st.integers(0, 3))
    inner = f'{{"{key}": 1, "other": [1, 2], "{key}": {draw(st.integers(0, 99))}}}'
    for _ in range(depth):
        inner = f'{{"text_config": {inner}, "model_type": "llama"}}'
    return inner, key


@ROUND
@given(json_with_a_duplicate())
def test_json_duplicate_keys_are_refused_at_any_depth(case: tuple[str, str]) -> None:
    text, key = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(text)
        outcome = _run("numbers", ["--model", path, "--seq", "8k"], "duplicate key")
    assert outcome.code == 2 and f"duplicate key {key!r}" in outcome.err, outcome.err


LAYERS = 32  # llama3-8b


@ROUND
@given(
    st.integers(1, 80), st.integers(1, 8), st.sampled_from(["step", "infer", "check", "recommend", "report"])
)
def test_every_command_asks_the_one_layout_check(pp: int, vpp: int, command: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        plan = Path(folder) / "p.yaml"
        plan.write_text(f"name: x\nmodel: llama3-8b\nseq: 8k\nn: 1\nhw: h100-nvlink\npp: {pp}\ngpus: {pp}\n")
        args = {
            "step": [
                "step",
                "--model",
                "llama3-8b",
                "--seq",
                "8k",
                "--cp",
                "1",
                "--pp",
                pp,
                "--vpp",
                vpp,
                "--gpus",
                pp,
                "--global-batch",
                4 * pp,
            ],
            "infer": ["infer", "--model", "llama3-8b", "--prompt", "8k", "--pp", pp, "--hw", "h100-nvlink"],
            "check": ["check", plan],
            "report": ["report", plan],
            "recommend": ["recommend", "--model", "llama3-8b", "--seq", "8k", "--pp", pp, "--gpus", pp],
        }[command]
        outcome = _run("layout", args, f"{command} pp {pp} vpp {vpp}")
    chunks = pp * (vpp if command == "step" else 1)
    if pp > LAYERS or chunks > LAYERS:
        assert outcome.code == 2 and f"exceed the model's {LAYERS} layers" in outcome.err, (
            command,
            outcome.err,
        )
        assert ("--pp" if pp > LAYERS else "--vpp") in outcome.err or "pp:" in outcome.err
    else:
        assert "exceed the model's" not in outcome.err


MEGATRON_LOGS = sorted(AUDIT.glob("megatron_*.log"))


@ROUND
@given(
    st.sampled_from(["two configs", "started over slower", "resumed", "started over alike"]),
    st.sampled_from(MEGATRON_LOGS),
    st.sampled_from(MEGATRON_LOGS),
    st.floats(1.6, 10),
)
def test_a_log_of_two_runs_is_refused_and_a_resumed_run_read(
    kind: str, first: Path, second: Path, factor: float
) -> None:
    import re as regex

    text = first.read_text()
    if kind == "two configs":
        if first == second:
            return
        text += second.read_text()
    else:
        lines = text.splitlines()
        steps = [line for line in lines if "elapsed time per iteration (ms)" in line]
        if kind == "resumed":  # back to an iteration past the first one logged: the same run
            again = steps[len(steps) // 2 :]
        else:
            slow = factor if kind == "started over slower" else 1.05
            again = [
                regex.sub(
                    r"(elapsed time per iteration \(ms\): )([\d.]+)",
                    lambda m: f"{m[1]}{float(m[2]) * slow:.1f}",
                    s,
                )
                for s in steps
            ]
        text = "\n".join([*lines, *again]) + "\n"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.log"
        path.write_text(text)
        outcome = _run("numbers", ["audit", path, "--hw", "h100-nvlink", "-f", "json"], kind)
    if kind in ("two configs", "started over slower"):
        assert outcome.code == 2 and "two runs in one file" in outcome.err, (kind, outcome.err)
    else:
        assert outcome.code in (0, 1) and "two runs" not in outcome.err, (kind, outcome.err)


# --- writing ---------------------------------------------------------------------------------------

WRITERS = {
    "--out": lambda target: [
        "hw",
        "from-nccl-tests",
        AUDIT / "nccl_1node_all_gather_perf.txt",
        "--out",
        target,
    ],
    "--fit-profile": lambda target: [
        "audit",
        AUDIT / "megatron_tp2_cp2_8k.log",
        "--hw",
        "h100-nvlink",
        "--fit-profile",
        target,
    ],
    "--html": lambda target: [
        "report",
        REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml",
        "--html",
        target,
    ],
}


def _make(kind: str, folder: Path, name: str) -> tuple[Path, Path | None]:
    """A target that is not a regular file, and the file it points at (unchanged afterwards) if any."""
    target, pointee = folder / name, None
    if kind in ("link to a file", "link to a link"):
        pointee = folder / "real.yaml"
        pointee.write_text("kept\n")
        if kind == "link to a link":
            (folder / "middle").symlink_to(pointee)
            target.symlink_to(folder / "middle")
        else:
            target.symlink_to(pointee)
    elif kind == "dangling link":
        target.symlink_to(folder / "nowhere")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null
    else:
        target.mkdir()
    return target, pointee


@ROUND
@given(
    st.sampled_from(sorted(WRITERS)),
    st.sampled_from(["link to a file", "link to a link", "dangling link", "fifo", "device", "folder"]),
    st.sampled_from(["p.yaml", "p.html", "x.yml"]),
)
def test_the_writer_replaces_only_regular_files(flag: str, kind: str, name: str) -> None:
    if kind == "device" and os.geteuid() != 0:
        return  # mknod needs root
    if flag == "--html":
        name = name.rsplit(".", 1)[0] + ".html"
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        target, pointee = _make(kind, base, name)
        before = sorted(p.name for p in base.iterdir())
        mode = os.lstat(target).st_mode
        outcome = _run("writing", WRITERS[flag](target), f"{flag} onto a {kind}")
        assert outcome.code == 2 and flag in outcome.err and "cannot write" in outcome.err, outcome.err
        assert os.lstat(target).st_mode == mode and sorted(p.name for p in base.iterdir()) == before
        if pointee is not None:
            assert pointee.read_text() == "kept\n"


@settings(max_examples=10, deadline=None, database=None)
@given(st.sampled_from([signal.SIGTERM, signal.SIGINT]), st.integers(0, 1 << 20), st.booleans())
def test_a_signal_during_a_write_removes_the_temporary_file(sig: int, size: int, existed: bool) -> None:
    CASES["writing"] += 1
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "out.yaml"
        if existed:
            target.write_text("old\n")
        real_fsync = os.fsync

        def signalled(fd: int) -> None:
            real_fsync(fd)
            os.kill(os.getpid(), sig)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fileio.os, "fsync", signalled)
            with pytest.raises(fileio.Terminated if sig == signal.SIGTERM else KeyboardInterrupt):
                fileio.atomic_write_bytes(target, b"x" * size, "--out")
        assert sorted(p.name for p in Path(folder).iterdir()) == (["out.yaml"] if existed else [])
        if existed:
            assert target.read_text() == "old\n"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_sigterm_while_writing_is_one_line_and_exit_143(cli, monkeypatch, tmp_path) -> None:
    CASES["writing"] += 1
    monkeypatch.setattr(fileio.os, "fsync", lambda fd: os.kill(os.getpid(), signal.SIGTERM))
    out = tmp_path / "p.yaml"
    result = cli("hw", "from-nccl-tests", str(AUDIT / "nccl_1node_all_gather_perf.txt"), "--out", str(out))
    assert result.code == 143 and result.err == "cp-plan: error: terminated\n"
    assert list(tmp_path.iterdir()) == []


STDOUT_COMMANDS = [
    ["formulas"],
    ["--seq", "64k", "-f", "json"],
    ["hw", "list"],
    ["--seq", "64k"],
    ["hw", "show", "a100-nvlink"],
]


def _subprocess(
    args: list[str], stdout: Any, env: dict | None = None, stderr: Any = subprocess.PIPE
) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-c", "from costmodel.cli import main; raise SystemExit(main())", *args],
        stdout=stdout,
        stderr=stderr,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", **(env or {})},
    )
    return run.returncode, (run.stderr or b"").decode()


@settings(max_examples=8, deadline=None, database=None)
@given(st.sampled_from(STDOUT_COMMANDS), st.sampled_from(["/dev/full", "closed", "ascii"]))
def test_stdout_that_cannot_take_the_answer_is_one_line_and_exit_2(args: list[str], failure: str) -> None:
    CASES["writing"] += 1
    if failure == "/dev/full":
        if not os.path.exists("/dev/full"):
            return
        with open("/dev/full", "w") as full:
            code, err = _subprocess(args, full)
    elif failure == "closed":
        code, err = _closed_stdout(args)
    else:
        with open(os.devnull, "w") as null:
            code, err = _subprocess(args, null, env={"PYTHONIOENCODING": "ascii"})
        if code == 0:  # this answer is all ASCII: nothing to refuse
            assert err == ""
            return
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("cp-plan: error: stdout: "), (failure, err)


def _closed_stdout(args: list[str]) -> tuple[int, str]:
    run = subprocess.run(
        [
            "sh",
            "-c",
            'exec "$0" -c "from costmodel.cli import main; raise SystemExit(main())" "$@" >&-',
            sys.executable,
            *args,
        ],
        stderr=subprocess.PIPE,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return run.returncode, run.stderr.decode()


@settings(max_examples=6, deadline=None, database=None)
@given(
    st.sampled_from(
        [
            ["--seq", "0"],
            ["--n", "-1"],
            ["--hw", "nope"],
            ["step", "--global-batch", "x"],
            ["--docs", "lognormal:mean=4k,seed=-3"],
        ]
    )
)
def test_bad_input_with_stderr_closed_still_exits_2(args: list[str]) -> None:
    CASES["exit codes"] += 1
    with open(os.devnull, "w") as null:
        run = subprocess.run(
            [
                "sh",
                "-c",
                'exec "$0" -c "from costmodel.cli import main; raise SystemExit(main())" "$@" 2>&-',
                sys.executable,
                *args,
            ],
            stdout=null,
            cwd=REPO,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert run.returncode == 2


# --- hangs, unbounded work and tracebacks ------------------------------------------------------------


@settings(max_examples=3, deadline=None, database=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=5))
def test_log_parsing_is_linear_in_restarts(drops: list[int]) -> None:
    """60,000 lines whose iteration count drops on many of them: one pass, seconds."""
    lines, iteration = [], 10**6
    for i in range(60_000):
        iteration += 1 if drops[i % len(drops)] else -(i % 7 + 1)
        lines.append(
            f" iteration {iteration:8d}/ 2000000 | elapsed time per iteration (ms): 1806.4 | global batch size: 16 |"
        )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "restarts.log"
        path.write_text("\n".join(lines) + "\n")
        outcome = _run(
            "bounds",
            [
                "audit",
                path,
                "--hw",
                "h100-nvlink",
                "--model",
                "llama3-8b",
                "--seq",
                "8k",
                "--gpus",
                "8",
                "-f",
                "json",
            ],
            "60k restarts",
        )
    assert outcome.code in (0, 1) and outcome.cpu_s < 20, (outcome.cpu_s, outcome.err[-300:])


@st.composite
def beyond_a_bound(draw: st.DrawFn) -> tuple[str, list[str], str]:
    """A command past one of the documented bounds: what it breaks, the arguments, the words naming it."""
    which = draw(
        st.sampled_from(["masked seq", "docs count", "check plans", "sweep profiles", "logs", "tables"])
    )
    if which == "masked seq":
        n = draw(st.sampled_from([8, 16, 64]))
        seq = n * draw(
            st.integers(2**21 // n + 1, 2**34 // n)
        )  # splits over N: the mask's bound is what breaks
        if n > 8 and draw(st.booleans()):  # S within its bound, S x N past 2^24 (at N = 8 it cannot be)
            seq = n * draw(st.integers(2**24 // n // n + 1, 2**21 // n))
        mask = draw(st.sampled_from([["--window", "1"], ["--attention-chunk", "4k"], ["--docs", "4kx4"]]))
        return which, ["--seq", str(seq), "--n", str(n), "--causal", *mask], "S x N = 16,777,216"
    if which == "docs count":
        count = draw(st.integers(65_537, 2_000_000))
        return which, ["--seq", "2M", "--docs", f"1x{count}"], "65,536 documents"
    if which == "check plans":
        n = draw(st.integers(65, 3000))
        plan = str(REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml")
        return which, ["check", *([plan] * n)], "at most 64"
    if which == "sweep profiles":
        n = draw(st.integers(17, 5001))
        return which, ["sweep", "--hw", ",".join(["a100-nvlink"] * n)], "at most 16"
    n = draw(st.integers(65, 500))
    if which == "logs":
        return which, ["audit", *([str(AUDIT / "megatron_tp2_cp2_8k.log")] * n)], "at most 64"
    return (
        which,
        ["hw", "from-nccl-tests", *([str(AUDIT / "nccl_1node_all_gather_perf.txt")] * n)],
        "at most 64",
    )


@ROUND
@given(beyond_a_bound())
def test_work_past_a_bound_is_refused_up_front_naming_it(case: tuple[str, list[str], str]) -> None:
    which, args, words = case
    outcome = _run("bounds", args, which)
    assert outcome.code == 2 and words in outcome.err, (which, outcome.err)
    assert outcome.cpu_s < 10, (which, outcome.cpu_s)


@settings(max_examples=4, deadline=None, database=None)
@given(
    st.sampled_from(
        [
            ["--window", "1"],
            ["--window", "64"],
            ["--attention-chunk", "8k"],
            ["--docs", "1x65536"],
            ["--docs", "lognormal:mean=512,sigma=2"],
        ]
    ),
    st.sampled_from([("2M", "8"), ("256k", "64"), ("512k", "32")]),
)
def test_accepted_inputs_at_the_bounds_finish_in_seconds(mask: list[str], shape: tuple[str, str]) -> None:
    seq, n = shape  # S x N at its bound, 2^24
    label = f"{seq} {' '.join(mask)} N {n}"
    outcome = _run("bounds", ["--seq", seq, "--n", n, "--causal", *mask, "-f", "json"], label)
    assert outcome.code in (0, 2) and outcome.cpu_s < 30 and outcome.peak_rss_bytes < 1 << 30, (
        outcome.cpu_s,
        outcome.err,
    )


@st.composite
def traceback_cases(draw: st.DrawFn) -> tuple[str, list[str], dict[str, bytes]]:
    """Inputs that used to end in a traceback: what it is, the arguments, the files they name."""
    which = draw(
        st.sampled_from(
            [
                "deep json",
                "big integer",
                "toml inf",
                "toml deep",
                "tiny elapsed",
                "csv field",
                "bucket bytes",
                "nccl extremes",
            ]
        )
    )
    if which == "deep json":
        depth = draw(st.integers(65, 200_000))
        return which, ["--model", "{d}/config.json"], {"config.json": (b"[" * depth + b"]" * depth)}
    if which == "big integer":
        digits = draw(st.integers(4301, 6000))
        return (
            which,
            ["--model", "{d}/config.json"],
            {"config.json": b'{"model_type": "llama", "hidden_size": ' + b"7" * digits + b"}"},
        )
    log = (AUDIT / "megatron_tp2_cp2_8k.log").read_bytes()
    if which in ("toml inf", "toml deep"):
        body = (
            f"[training]\nseq_len = {draw(st.sampled_from(['inf', '-inf', 'nan', '+inf']))}\n"
            if which == "toml inf"
            else "x = " + "[" * draw(st.integers(65, 5000)) + "]" * 0 + "\n"
        )
        return (
            which,
            ["audit", "{d}/run.log", "--config", "{d}/job.toml", "--hw", "h100-nvlink"],
            {"run.log": log, "job.toml": body.encode()},
        )
    if which == "tiny elapsed":
        value = draw(st.sampled_from(["1e-300", "5e-324", "0.0000001", "1e300", "-1"]))
        text = log.decode()
        import re as regex

        text = regex.sub(
            r"elapsed time per iteration \(ms\): [\d.]+", f"elapsed time per iteration (ms): {value}", text
        )
        return (
            which,
            ["audit", "{d}/run.log", "--hw", "h100-nvlink", "-f", "json"],
            {"run.log": text.encode()},
        )
    if which == "csv field":
        width = draw(st.integers(131_073, 400_000))
        return (
            which,
            ["--seq", "64k", "--docs", "{d}/docs.csv"],
            {"docs.csv": b"length,count\n" + b"1" * width + b",2\n"},
        )
    if which == "bucket bytes":
        value = draw(st.sampled_from(["1e-300", "5e-324", "0.5", "1e-10"]))
        return (
            which,
            ["step", "--model", "llama3-8b", "--seq", "8k", "--global-batch", "8", "--bucket-bytes", value],
            {},
        )
    rows = [
        (GOOD[i][0], draw(st.sampled_from([1e-300, 1e300, 1e-301]))) if i == 3 else GOOD[i]
        for i in range(len(GOOD))
    ]
    return (
        which,
        ["hw", "from-nccl-tests", "{d}/all_gather_perf.txt"],
        {"all_gather_perf.txt": _table(rows).encode()},
    )


@ROUND
@given(traceback_cases())
def test_inputs_that_raised_tracebacks_are_one_line(case: tuple[str, list[str], dict[str, bytes]]) -> None:
    which, args, files = case
    with tempfile.TemporaryDirectory() as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        outcome = _run("tracebacks", [a.replace("{d}", folder) for a in args], which)
    assert outcome.code == 2, (which, outcome.code, outcome.err[-300:])
    assert json.dumps(outcome.out, allow_nan=False)


@settings(max_examples=12, deadline=None, database=None)
@given(
    st.one_of(
        st.lists(st.integers(-3, 70_000), min_size=1, max_size=6).map(
            lambda xs: ["calibrate", "--out", "x.yaml", "--tokens", ",".join(map(str, xs))]
        ),
        st.just(["kernel", "selftest", "--device", "cuda"]),
        st.just(["calibrate", "--out", "x.yaml", "--backend", "nccl"]),
    )
)
def test_kernel_flags_are_checked_before_any_rank_starts(args: list[str]) -> None:
    import torch

    import costmodel.kernel.launch
    import costmodel.kernel.selftest  # patched below, whichever tests ran before in this process

    if "--tokens" in args:
        sizes = [int(x) for x in args[-1].split(",")]
        if len(set(sizes)) == len(sizes) >= 3 and all(1 <= s <= 65_536 for s in sizes):
            return  # a valid list: it would measure
    elif torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return  # GPUs enough here: it would run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(costmodel.kernel.launch, "launch", _must_not_launch)
        patch.setattr(costmodel.kernel.selftest, "run_selftest", _must_not_launch, raising=False)
        outcome = _run("exit codes", args, " ".join(args))
    assert outcome.code == 2 and (
        "--tokens" in outcome.err or "--device" in outcome.err or "--backend" in outcome.err
    ), outcome.err


@ROUND
@given(
    st.sampled_from(["folder", "txt"]),
    st.sampled_from(["seed=-1", "seed=-99", f"seed={2**64}", "seed=x"]),
    st.sampled_from(["--seq", "0"]),
)
def test_messages_name_the_flag_the_user_gave(target: str, seed: str, _: str) -> None:
    plan = REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml"
    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder) / ("out.html" if target == "folder" else "out.txt")
        if target == "folder":
            where.mkdir()
        html = _run("exit codes", ["report", plan, "--html", where], f"--html onto a {target}")
        assert html.code == 2 and "--html:" in html.err and "--output" not in html.err, html.err
        docs = _run("exit codes", ["--seq", "64k", "--docs", f"lognormal:mean=4k,{seed}"], seed)
        assert docs.code == 2 and "--docs:" in docs.err and "--input" not in docs.err, docs.err
        config = Path(folder) / "config.json"
        config.write_text((REPO / "tests" / "data" / "hf" / "gemma-3-27b.json").read_text())
        both = _run("exit codes", ["--model", config, "--seq", "0"], "note and error")
        assert both.code == 2 and "note" not in both.err, both.err


@settings(max_examples=4, deadline=None, database=None)
@given(st.sampled_from(["--hw", "--model"]), st.booleans())
def test_dash_reads_standard_input_once(flag: str, twice: bool) -> None:
    """``-`` is standard input, bounded like a file; given to two flags, the second is refused."""
    CASES["hangs"] += 1
    source = PROFILE if flag == "--hw" else MODEL
    args = [flag, "-", "--seq", "64k", "-f", "json"] + (
        ["--hw" if flag == "--model" else "--model", "-"] if twice else []
    )
    with tempfile.TemporaryFile() as stdin:
        stdin.write(source.encode())
        stdin.seek(0)
        run = subprocess.run(
            [sys.executable, "-c", "from costmodel.cli import main; raise SystemExit(main())", *args],
            stdin=stdin,
            capture_output=True,
            cwd=REPO,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    if twice:
        # whichever flag is read first takes the stream: the other is refused, or its text fails as that kind
        assert run.returncode == 2 and len(run.stderr.splitlines()) == 1 and b": -" in run.stderr, run.stderr
    else:
        assert run.returncode == 0 and json.loads(run.stdout)["inputs"]["seq"] == 65536, run.stderr


@settings(max_examples=8, deadline=None, database=None)
@given(st.one_of(st.floats(1e-4, 0.02), st.floats(60, 1e4), st.floats(0.9, 1.1)))
def test_fit_profile_writes_nothing_from_a_fit_it_would_flag(scale: float) -> None:
    """Step times scaled far off the model pin a factor at the end of its range (or trip a critical
    finding): refused, nothing written. Near the logged times the fit is written."""
    import re as regex

    text = regex.sub(
        r"(elapsed time per iteration \(ms\): )([\d.]+)",
        lambda m: f"{m[1]}{float(m[2]) * scale:.6g}",
        (AUDIT / "megatron_tp2_cp2_8k.log").read_text(),
    )
    with tempfile.TemporaryDirectory() as folder:
        log, out = Path(folder) / "run.log", Path(folder) / "fit.yaml"
        log.write_text(text)
        outcome = _run(
            "fits", ["audit", log, "--hw", "h100-nvlink", "--fit-profile", out, "-f", "json"], f"x {scale:g}"
        )
        if 0.9 <= scale <= 1.1:
            assert outcome.code in (0, 1) and out.exists(), outcome.err
            fit = json.loads(outcome.out)["fit"]
            assert 0.05 < fit["compute_factor"] < 20 and fit["comm_factor"] <= 2
        else:
            assert outcome.code == 2 and "--fit-profile" in outcome.err and not out.exists(), outcome.err
            assert sorted(p.name for p in Path(folder).iterdir()) == ["run.log"]


@settings(max_examples=60, deadline=None, database=None)
@given(
    st.floats(0.01, 30),
    st.floats(0.01, 30),
    st.floats(0, 1),
)
def test_a_log_fit_is_flagged_exactly_outside_its_bounds(compute: float, comm: float, error: float) -> None:
    """`--fit-profile`'s gate, on any factors and error: a reason iff a factor touches the ends of
    0.05..20, links pass 2x, or the median error passes 25 %; and then nothing is written."""
    from costmodel.audit import fit as log_fit
    from costmodel.cli import audit as audit_cli
    from costmodel.machines.profiles import load_profile

    CASES["fits"] += 1
    base = load_profile("h100-nvlink")
    result = {
        "compute_factor": compute,
        "comm_factor": comm,
        "fitted_median_abs_error": error,
        "base_median_abs_error": 0.2,
    }
    flagged = not (0.05 < compute < 20 and 0.05 < comm < 20) or comm > 2 or error > 0.25
    assert (log_fit.fit_problem(result, base) is not None) == flagged
    if not flagged:
        return
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        patch.setattr(log_fit, "calibrate", lambda runs, profile: result | {"runs": [], "profile": profile})
        out = Path(folder) / "fit.yaml"
        with pytest.raises(fileio.InputError, match="not written"):
            audit_cli._fit([("run.log", {"hw": "h100-nvlink"}, 1.0)], str(out))
        assert not out.exists()
