"""Hostile input that used to cost unbounded work or end in a traceback: huge integers, denormal measured
steps, a launcher's environment that is not numbers, a plotting backend matplotlib does not know, a HOME
the completion installer cannot write, logs of millions of empty lines and tables at their row bound.
Each is answered with one line and exit code 2 (or works), within its bound."""

from __future__ import annotations

import dataclasses
import resource
from pathlib import Path

import pytest

from costmodel.audit import runs as runs_module
from costmodel.core import fileio
from tests.test_hostile_input import one_line_error

HUGE = "1" + "0" * 5000  # past Python's 4,300-digit conversion limit


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- one integer parser for every integer flag ---------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--seq", HUGE, "--n", "8"],
        ["--seq", HUGE + "k", "--n", "8"],
        ["--heads", HUGE, "--seq", "8k", "--n", "8"],
        ["sweep", "--seq", HUGE],
        ["step", "--seq", "8k", "--gpus", "8", "--global-batch", HUGE],
        ["infer", "--prompt", HUGE],
        ["--seq", "1" + "0" * 30, "--n", "8"],  # just past the bound
    ],
    ids=["seq", "seq-suffix", "heads", "sweep-seq", "global-batch", "prompt", "31-digits"],
)
def test_a_huge_integer_flag_is_one_line(cli, args: list[str]) -> None:
    line = one_line_error(cli(*args), "digits; accepted: at most 30 digits")
    assert "sys.set_int_max_str_digits" not in line and len(line) < 300


def test_an_integer_within_the_digit_bound_reaches_the_range_check(cli) -> None:
    one_line_error(cli("--seq", "9" * 30, "--n", "8"), "--seq", "must be <= 17179869184")


def _number_options() -> list[tuple[str, str, object]]:
    """(command, flag, type) of every integer or number option of every command."""
    from typer.main import get_command

    from costmodel.cli.app import with_subcommands

    found, stack = [], [("", get_command(with_subcommands()))]
    while stack:
        path, command = stack.pop()
        stack.extend(
            (f"{path} {name}".strip(), sub) for name, sub in getattr(command, "commands", {}).items()
        )
        for param in command.params:
            described = getattr(param, "type_descriptor", None)
            if described is not None and described.annotation in (int, float):
                found.append((path, param.opts[0], described.parameter_info.parser))
    return found


def test_every_integer_and_number_option_is_read_by_the_one_parser() -> None:
    """A command's own option (audit --folds, kernel selftest --seed, recommend --top) reads as a declared
    flag does: typer's own int() and float() took 1_0, +1, Arabic digits and nan."""
    options = _number_options()
    assert {("audit", "--folds"), ("kernel selftest", "--seed"), ("validate", "--max-median-error")} <= {
        (command, flag) for command, flag, _ in options
    }
    assert [(command, flag) for command, flag, parser in options if parser is None] == []


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--runs", "r.csv", "--folds", "1_0"],
        ["audit", "x.log", "--gpus", "1_6"],
        ["audit", "x.log", "--micro-batch", "+1"],
        ["audit", "x.log", "--cp", "\u0662"],
        ["kernel", "selftest", "--seed", "1_0"],
        ["kernel", "selftest", "--nproc", "0_2"],
        ["kernel", "selftest", "--atol", "nan"],
        ["calibrate", "--out", "o.yaml", "--repeats", "1_0"],
        ["validate", "--hw", "x.yaml", "--timeout", "1_0"],
        ["recommend", "--model", "llama3-8b", "--top", "0_5"],
        ["infer", "--model", "llama3-8b", "--prompt", "8k", "--gpus", "1_6"],
        ["sweep", "--model", "llama3-8b", "--gpus", "0_8"],
    ],
    ids=lambda args: f"{args[0]}{args[-2]}",
)
def test_a_commands_own_number_option_refuses_what_a_declared_flag_refuses(cli, args: list[str]) -> None:
    line = one_line_error(cli(*args), f"'{args[-2]}'", "is not a")
    assert len(line) < 200


# --- measured steps held to what a step can take ---------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "yaml", "table"])
@pytest.mark.parametrize(
    ("column", "value"),
    [("iteration_ms", "1e-320"), ("iteration_ms", "1e300"), ("tokens_per_s", "1e-320"), ("iteration_s", "0")],
    ids=["denormal-ms", "huge-ms", "denormal-tps", "zero-s"],
)
def test_a_measured_step_outside_a_microsecond_to_a_day_is_refused(
    cli, tmp_path: Path, fmt: str, column: str, value: str
) -> None:
    table = tmp_path / "runs.csv"
    table.write_text(f"model,seq,gpus,tp,micro_batch,global_batch,{column}\nllama3-8b,8192,8,8,1,8,{value}\n")
    one_line_error(
        cli("audit", "--runs", str(table), "--hw", "h100-nvlink", "-f", fmt),
        "--runs",
        "line 2: column",
        "a measured step takes from 1 µs to one day",
    )


# --- the launcher's environment, read in one place -------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "variable", "accepted"),
    [
        ({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE", "from 1 to 1048576"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK", "from 0 to 1"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK", "from 0 to 1"),
        ({"RANK": "0", "WORLD_SIZE": HUGE}, "WORLD_SIZE", "from 1 to 1048576"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1e3"}, "LOCAL_WORLD_SIZE", "from 1 to 2"),
        ({"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE", "from 1 to 1048576"),
    ],
    ids=["world-text", "rank-text", "rank-past-world", "world-huge", "local-world-float", "local-alone"],
)
@pytest.mark.parametrize("command", ["selftest", "calibrate"])
def test_a_launcher_variable_that_is_not_a_count_is_one_line(
    cli, monkeypatch, tmp_path: Path, env: dict[str, str], variable: str, accepted: str, command: str
) -> None:
    pytest.importorskip("torch")
    if command == "calibrate" and "RANK" not in env:
        pytest.skip("a local calibrate checks LOCAL_WORLD_SIZE after a second's look at the load")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = {
        "selftest": ["kernel", "selftest", "--seq", "64", "--nproc", "2"],
        "calibrate": ["calibrate", "--out", str(tmp_path / "cal.yaml"), "--nproc", "2"],
    }[command]
    line = one_line_error(cli(*args), f"{variable}: the environment variable is", accepted)
    assert line.startswith(f"cp-plan: error: {variable}:")
    assert not (tmp_path / "cal.yaml").exists()


# --- plots: the backend chosen safely, matplotlib quiet --------------------------------------------------


@pytest.mark.parametrize("backend", ["nosuch", "tkagg", ""])
def test_any_mplbackend_still_writes_the_plot_quietly(cli, monkeypatch, tmp_path: Path, backend: str) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MPLBACKEND", backend)
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "not-a-folder"))
    (tmp_path / "not-a-folder").write_text("")  # matplotlib cannot keep its cache there: it would warn
    out = tmp_path / "sweep.png"
    result = cli("sweep", "--seq", "8k,16k", "--n", "2,4", "--plot", str(out))
    assert result.code == 0, result.err
    assert result.err.strip() == f"wrote {out}"
    assert out.read_bytes().startswith(b"\x89PNG")


# --- shell completion: HOME unset, not a folder, read-only -----------------------------------------------


def _no_home(monkeypatch) -> None:
    import pwd

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))


def _home_is_a_file(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "home").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _read_only_home(monkeypatch, tmp_path: Path) -> None:
    """chmod denies nothing to root, so the write is made to fail as a read-only HOME makes it."""
    monkeypatch.setenv("HOME", str(tmp_path))

    def denied(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", denied)
    monkeypatch.setattr(Path, "mkdir", denied)


@pytest.mark.parametrize(
    ("home", "expected"),
    [
        (lambda mp, tmp: _no_home(mp), "Could not determine home directory"),
        (_home_is_a_file, "File exists"),
        (_read_only_home, "Permission denied"),
    ],
    ids=["unset", "a-file", "read-only"],
)
def test_install_completion_without_a_writable_home_is_one_line(
    cli, monkeypatch, tmp_path: Path, home, expected: str
) -> None:
    import typer._completion_shared as shared

    monkeypatch.setattr(shared, "_get_shell_name", lambda: "bash")
    home(monkeypatch, tmp_path)
    one_line_error(cli("--install-completion"), "--install-completion: cannot write under HOME", expected)


# --- bounded work ----------------------------------------------------------------------------------------


def test_a_log_of_millions_of_empty_lines_is_refused_at_its_line_bound(
    cli, monkeypatch, tmp_path: Path
) -> None:
    """64 MiB of empty lines took 90 s to be refused; a log is now bounded in lines (1M, a few seconds),
    checked here at a smaller bound to stay fast."""
    assert fileio.KINDS["log"].max_lines == 1 << 20
    bound = 10_000
    monkeypatch.setitem(fileio.KINDS, "log", dataclasses.replace(fileio.KINDS["log"], max_lines=bound))
    log = tmp_path / "empty.log"
    log.write_bytes(b"\n" * (bound + 1))
    one_line_error(cli("audit", str(log), "--hw", "h100-nvlink"), f"more than {bound:,} lines")
    log.write_bytes(b"\n" * bound)
    one_line_error(cli("audit", str(log), "--hw", "h100-nvlink"), "no iteration lines", f"in {bound} lines")


def test_a_runs_table_over_its_row_bound_is_refused_before_any_prediction(cli, tmp_path: Path) -> None:
    row = "llama3-8b,8192,8,8,1,8,1000\n"
    table = tmp_path / "runs.csv"
    table.write_text(
        "model,seq,gpus,tp,micro_batch,global_batch,iteration_ms\n" + row * (runs_module.MAX_ROWS + 1)
    )
    start = cpu_s()
    one_line_error(
        cli("audit", "--runs", str(table), "--hw", "h100-nvlink"), f"more than {runs_module.MAX_ROWS:,} runs"
    )
    assert cpu_s() - start < 2


def test_a_fit_past_its_run_bound_is_refused_before_any_prediction(cli, tmp_path: Path) -> None:
    """A fit costs ~45 ms of CPU a run (docs/limits.md): 1,000 runs took 55 s. The bound is checked on the
    table as read, before any run is predicted, and writes nothing."""
    assert runs_module.MAX_FIT_RUNS == 200
    header, *rows = (
        (Path(__file__).parent / "data" / "runs" / "example.csv").read_text("utf-8-sig").splitlines()
    )
    table = tmp_path / "runs.csv"
    table.write_text("\n".join([header, *(rows * 2)[: runs_module.MAX_FIT_RUNS + 1]]) + "\n")
    out = tmp_path / "fitted.yaml"
    start = cpu_s()
    result = cli("audit", "--runs", str(table), "--hw", "a100-nvlink", "--fit-profile", str(out))
    one_line_error(result, "--fit-profile", "201 runs; a fit takes at most 200")
    assert cpu_s() - start < 2 and not out.exists()


def test_a_sweeps_step_times_past_their_search_bound_are_refused_up_front(cli) -> None:
    """With --model and --gpus each (S, profile) pair is a layout search (~50 ms): 256 S values on 15
    profiles, each within its own bound, took 110 s. Their product is bounded, checked before any search."""
    from costmodel.training.sweep import MAX_STEP_SEARCHES

    seqs = ",".join(str(1024 * (i + 1)) for i in range(MAX_STEP_SEARCHES // 4 + 1))
    hw = "h100-nvlink,a100-nvlink,b200-nvlink,h200-nvlink"
    start = cpu_s()
    args = ["sweep", "--model", "llama3-8b", "--gpus", "64", "--seq", seqs, "--n", "1,2", "--hw", hw]
    one_line_error(cli(*args), "--seq", "17 S values x 4 --hw profiles", f"at most {MAX_STEP_SEARCHES} pairs")
    assert cpu_s() - start < 2
    assert cli(*[a for a in args if a != "--model" and a != "llama3-8b"]).code == 0  # no step times: no bound


def test_a_search_past_its_plan_bound_is_refused_before_weighing_any(cli, monkeypatch) -> None:
    """G may be 2^20, but the layouts of DeepSeek-V3 on 1M GPUs are 1.9M plans: 48 s and 2 GB for recommend.
    A search counts its plans first and refuses past the bound, naming --gpus; a what-if of the pick whose
    own search would pass it (a 10 % longer sequence has other divisors) re-times the pick alone."""
    from costmodel.training import search as searching

    assert searching.MAX_WEIGHED == 1_500_000
    start = cpu_s()
    args = [
        "recommend",
        "--model",
        "deepseek-v3",
        "--seq",
        "128k",
        "--hw",
        "h100-nvlink",
        "--gpus",
        "1048576",
    ]
    one_line_error(cli(*args), "--gpus", "1,899,477 plans to weigh", "at most 1,500,000")
    assert cpu_s() - start < 5
    count = searching._weighed_count

    def past_the_bound_when_longer(job, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if job.inputs.seq != 8192:
            raise searching.TooManyPlans("--gpus", "8 GPUs give 2,000,000 plans to weigh; at most 1,000,000")
        return count(job, *args, **kwargs)

    monkeypatch.setattr(searching, "_weighed_count", past_the_bound_when_longer)
    result = cli(
        "recommend", "--model", "llama3-8b", "--seq", "8k", "--hw", "h100-nvlink", "--gpus", "8", "-f", "json"
    )
    longer = result.json()["search"]["sensitivity"][1]
    assert result.code == 0 and longer["change"] == "sequence 10 % longer (9,012 tokens)"
    assert longer["text"].endswith(
        "not searched again (8 GPUs give 2,000,000 plans to weigh; at most 1,000,000)"
    )
