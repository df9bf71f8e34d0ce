"""``cp-plan kernel selftest``: exit codes, JSON, bad input, and a start-up that never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from costmodel.cli.kernel import app
from costmodel.core.errors import InputError

pytestmark = pytest.mark.kernel

SMALL = ["--seq", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--timeout", "240"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["selftest", *args])


def test_importing_the_cli_does_not_import_torch() -> None:
    code = "import sys, costmodel.cli.kernel; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_selftest_passes_and_reports_every_output_as_json() -> None:
    pytest.importorskip("torch")
    result = invoke(
        "--nproc", "2", *SMALL, "--causal", "--layout", "zigzag", "--varlen", "0,10,40,64", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["schema"] == "cp-plan.kernel.selftest/1" and report["passed"] is True
    assert report["config"]["nproc"] == 2 and report["config"]["varlen"] == [0, 10, 40, 64]
    for variant in ("ring", "ulysses"):
        outputs = report["variants"][variant]["outputs"]
        assert set(outputs) == {"out", "lse", "dq", "dk", "dv"}
        assert all(o["max_abs_error"] <= o["tolerance"] < 1e-3 for o in outputs.values())


@pytest.mark.slow
def test_selftest_past_tolerance_exits_1_with_a_table() -> None:
    pytest.importorskip("torch")
    result = invoke("--nproc", "2", *SMALL, "--variant", "ring", "--atol", "0", "--rtol", "0")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "failed" in result.output


@pytest.mark.parametrize(
    "args,field",
    [
        (["--heads", "4", "--kv-heads", "3"], "--kv-heads"),
        (["--seq", "30", "--nproc", "4"], "--seq"),
        (["--seq", "36", "--nproc", "4", "--layout", "zigzag"], "--seq"),
        (["--seq", "64", "--varlen", "0,10,70"], "--varlen"),
        (["--seq", "64", "--varlen", "0,x,64"], "--varlen"),
        (["--heads", "6", "--kv-heads", "2", "--nproc", "4", "--variant", "ulysses"], "--heads"),
    ],
)
def test_bad_input_raises_input_error_naming_the_flag(args: list[str], field: str) -> None:
    """The main CLI turns InputError into one line and exit code 2; no rank is started for these."""
    pytest.importorskip("torch")  # without torch the command stops earlier, at its own InputError
    result = invoke(*args)
    assert isinstance(result.exception, InputError), result.output
    assert result.exception.field == field


def test_selftest_takes_lengths_as_the_planner_does(cli) -> None:
    """`--seq 256k` is accepted as everywhere else (then refused here only for torch, if it is missing)."""
    bad = cli("kernel", "selftest", "--seq", "32M")
    assert bad.code == 2 and "--seq: must be <= 16777216" in bad.err
    assert "not a length" in cli("kernel", "selftest", "--seq", "lots").err
    assert "--seq" not in cli("kernel", "selftest", "--seq", "256k", "--nproc", "0").err
