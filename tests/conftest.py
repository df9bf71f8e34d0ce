"""Fixtures: run the CLI in-process."""

from __future__ import annotations

import json

import pytest

from costmodel.cli import main


class CLIResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # noqa: ANN201
    """``cli("--n", "8")`` runs cp-plan in-process and returns exit code, stdout, stderr."""

    def run(*args: str) -> CLIResult:
        code = main(list(args))
        captured = capsys.readouterr()
        return CLIResult(code, captured.out, captured.err)

    return run
