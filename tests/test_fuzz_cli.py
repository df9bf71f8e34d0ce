"""Hostile and extreme flags: every option of every planning command, valid, boundary and hostile values.

Each case runs the real CLI in a forked child with a memory limit, a CPU time limit (the work a case may do,
whatever else loads the machine) and a far wall-clock limit (a case that waits on nothing that long hangs),
so a case that would exhaust memory, compute for ever or hang fails the test instead of the machine. The promise checked for every case:
the exit code is 0, 1 or 2; there is never a traceback; exit 2 is one line on stderr that names a flag
or field; and every number of a JSON answer is finite and not negative.

The flags are read from the commands themselves (typer's click tree), so a new flag is fuzzed the day
it is declared. `--hypothesis-profile=deep` runs many more examples (tests/conftest.py).
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing
import os
import resource
import signal
import sys
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MEMORY_LIMIT = 3 << 30  # bytes of address space a case may use
CPU_LIMIT_S = 30  # CPU seconds a case may use (SIGXCPU past them); the slowest takes a few
WALL_LIMIT_S = 300.0  # wall seconds before a case counts as hung: far, so that no load reaches it

# A valid command line per command; one flag at a time is replaced by a fuzzed value.
BASELINES = {
    "": ["--seq", "64k", "--n", "8", "--hw", "a100-nvlink"],
    "recommend": ["recommend", "--seq", "32k", "--model", "llama3-8b", "--gpus", "16"],
    "sweep": ["sweep", "--seq", "8k..64k", "--n", "1..16", "--hw", "a100-nvlink"],
    "infer": ["infer", "--model", "llama3-8b", "--prompt", "64k", "--hw", "h100-ib", "--cp", "4"],
}
SKIP = {
    "--help",
    "--install-completion",
    "--show-completion",
    "--version",
    "--plot",
    "--explain",
    "--timeline",
}

HOSTILE_TEXT = [
    "",
    " ",
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "1024",
    "65537",
    "1e400",
    "1e-320",
    "5e-324",
    "nan",
    "inf",
    "-inf",
    "0.0",
    "1.5",
    "true",
    "None",
    "256k",
    "1M",
    "1G",
    "16G",
    "1T",
    "2" * 30,
    str(2**62),
    str(2**70),
    "１２",
    "٣",
    "8.5k",
    "0x10",
    "1_000",
    "\x00",
    "é" * 300,
    "a" * 300,
    "../../etc/passwd",
    "/dev/zero",
    "-",
    "--n",
]


def _options(command: str) -> list[Any]:
    from typer.main import get_command

    from costmodel.cli.app import with_subcommands

    root = get_command(with_subcommands())
    node = root if not command else root.commands[command]  # type: ignore[attr-defined]
    return [p for p in node.params if p.param_type_name == "option" and not set(p.opts) & SKIP]


def _values(option: Any) -> st.SearchStrategy[str]:
    kind = getattr(option, "bare_type", None) or getattr(option, "type", None)
    choices = list(getattr(kind, "choices", []) or [])
    return st.one_of(
        st.sampled_from(HOSTILE_TEXT),
        st.sampled_from([str(c) for c in choices] or ["x"]),
        st.integers(-(2**70), 2**70).map(str),
        st.floats(allow_nan=True).map(repr),
        st.text(max_size=12),
    )


def _case(command: str) -> st.SearchStrategy[list[str]]:
    options = _options(command)

    @st.composite
    def build(draw: st.DrawFn) -> list[str]:
        option = draw(st.sampled_from(options))
        args = list(BASELINES[command])
        name = max(option.opts, key=len)
        if option.is_flag:
            return [*args, draw(st.sampled_from(option.opts + option.secondary_opts))]
        value = draw(_values(option))
        # Replace the baseline's value for this flag, or add the flag.
        for i, arg in enumerate(args):
            if arg in option.opts and i + 1 < len(args):
                args[i + 1] = value
                return args
        return [*args, name, value]

    return build()


def _child(args: list[str], pipe) -> None:  # noqa: ANN001 - a multiprocessing Connection
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)  # a forked child's CPU time starts from zero
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S if hard == resource.RLIM_INFINITY else hard, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no core file
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            from costmodel.cli import main

            code = main(args)
    except BaseException as exc:  # noqa: BLE001 - what escapes is the finding
        code = -1
        err.write(f"Traceback (escaped): {type(exc).__name__}: {exc}\n")
    pipe.send((code, out.getvalue()[:2_000_000], err.getvalue()))


def run_isolated(args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``cp-plan args`` in a forked child with memory and time limits."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(args, send))
    child.start()
    send.close()  # the child's end alone: its death reads as the end of the pipe
    if not receive.poll(WALL_LIMIT_S):
        child.kill()
        child.join()
        pytest.fail(f"cp-plan {' '.join(args)!r} waited past {WALL_LIMIT_S} s")
    try:
        code, out, err = receive.recv()
    except EOFError:
        child.join()
        limit = f" (SIGXCPU: past {CPU_LIMIT_S} s of CPU)" if child.exitcode == -signal.SIGXCPU else ""
        pytest.fail(f"cp-plan {' '.join(args)!r} died with exit code {child.exitcode}{limit}")
    child.join()
    return code, out, err


def _numbers(data: object):  # noqa: ANN202
    if isinstance(data, bool):
        return
    if isinstance(data, int | float):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from _numbers(value)
    elif isinstance(data, list):
        for value in data:
            yield from _numbers(value)


def check_promise(args: list[str]) -> None:
    code, out, err = run_isolated(args)
    shown = f"cp-plan {' '.join(args)!r} -> {code}: {err[-500:]!r}"
    assert code in (0, 1, 2), shown
    assert "Traceback" not in err, shown
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("cp-plan: error: "), shown
        assert "--" in lines[0] or ":" in lines[0][len("cp-plan: error: ") :], shown
    if code == 0 and ("json" in args):
        for number in _numbers(json.loads(out)):
            assert math.isfinite(number) and number >= 0, shown
    sys.stdout.flush()


FUZZ = settings(
    max_examples=int(os.environ.get("CP_PLAN_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("command", sorted(BASELINES))
def test_every_option_of_the_baseline_is_fuzzable(command: str) -> None:
    assert _options(command), command
    code, _, err = run_isolated(BASELINES[command])
    assert code == 0, err


@FUZZ
@given(args=_case("infer"))
def test_fuzz_infer_flags_as_json(args: list[str]) -> None:
    check_promise([*args, "--format", "json"] if "--format" not in args and "-f" not in args else args)


@FUZZ
@given(args=_case(""))
def test_fuzz_report_flags(args: list[str]) -> None:
    check_promise(args)


@FUZZ
@given(args=_case(""))
def test_fuzz_report_flags_as_json(args: list[str]) -> None:
    check_promise([*args, "--format", "json"] if "--format" not in args and "-f" not in args else args)


@FUZZ
@given(args=_case("recommend"))
def test_fuzz_recommend_flags(args: list[str]) -> None:
    check_promise(args)


@FUZZ
@given(args=_case("sweep"))
def test_fuzz_sweep_flags(args: list[str]) -> None:
    check_promise(args)


EXTREMES = [
    ["--seq", "1M", "--n", "1048576", "--block", "1"],
    ["--seq", "1G", "--n", "1048576"],
    ["--seq", "16G", "--n", "1048576", "--format", "json"],
    [
        "--seq",
        "128M",
        "--n",
        "1024",
        "--heads",
        "1024",
        "--kv-heads",
        "1024",
        "--head-dim",
        "256",
        "--dtype",
        "fp32",
        "--batch",
        "64",
        "--block",
        "128k",
        "--format",
        "json",
    ],
    ["recommend", "--seq", "128k", "--model", "llama3-8b", "--gpus", "8192"],
    ["recommend", "--seq", "128k", "--model", "llama3-8b", "--gpus", str(2**20)],
    ["recommend", "--seq", "128k", "--model", "llama3-8b", "--gpus", str(2**70)],
    ["recommend", "--seq", "128k", "--model", "llama3-8b", "--gpus", "1"],
    ["sweep", "--seq", "1..16G", "--n", "1..1M"],
    ["sweep", "--kv-heads", "0"],
    ["sweep", "--efficiency", "nan", "--format", "json"],
    ["sweep", "--efficiency", "0"],
    ["sweep", "--heads", "-8"],
    ["sweep", "-m", "llama3-8b", "--heads", "7"],
    ["sweep", "--gpus", "0", "-m", "llama3-8b"],
    ["--head-dim", str(2**62)],
    ["--efficiency", "5e-324"],
    ["--hw", "h" * 300],
    ["--model", "m" * 300],
    ["--seq", "１２８k"],
    ["--n", "８"],
    ["--seq", str(2**53 + 1)],
]


@pytest.mark.parametrize("args", EXTREMES, ids=[" ".join(a)[:60] for a in EXTREMES])
def test_extreme_inputs_are_answered_or_refused_in_bounded_time_and_memory(args: list[str]) -> None:
    check_promise(args)
