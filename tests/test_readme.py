"""The README stays true: its test command is what CI runs, its example output is what cp-plan prints."""

from __future__ import annotations

import re

import pytest

from tests.support import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def fenced(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command() -> None:
    install_and_run, install_and_test = (block.strip() for block in fenced("bash"))
    assert install_and_run == "pip install . && cp-plan --seq 262144 --n 8 --hw a100-nvlink"
    assert "pytest" in install_and_test
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert install_and_test in ci.splitlines()


def test_readme_example_is_the_real_output(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    (example,) = fenced("text")
    printed = cli("--seq", "262144", "--n", "8", "--hw", "a100-nvlink").out
    assert [line.rstrip() for line in printed.splitlines()] == example.rstrip("\n").splitlines()
