"""ruff owns formatting and lint: the tree is as `ruff format` writes it and `ruff check` passes."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support import REPO


def _ruff() -> list[str]:
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.importorskip("ruff", reason="ruff is in the test extra")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("args", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff(args: list[str]) -> None:
    done = subprocess.run(
        [*_ruff(), *args, "costmodel", "tests", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
