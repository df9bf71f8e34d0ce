"""Fixtures: run the CLI in-process."""

from __future__ import annotations

import json

import pytest
from hypothesis import settings

from costmodel.cli import main

# `pytest --hypothesis-profile=deep`: long property and fuzz runs (tests/test_fuzz_files.py reads it).
settings.register_profile("deep", max_examples=2000, deadline=None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tier's tests run one after another on one worker (``--dist loadgroup``): each starts process
    groups of its own, and two at once on a 2-core machine would time each other's load."""
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("slow"))


def _summary_lines() -> list[str]:
    """How many fuzz cases ran, the slowest and the hungriest, and the hostile inputs' classes: of the tests
    this process ran."""
    import sys

    lines = []
    fuzz = sys.modules.get("tests.test_fuzz_files")
    if fuzz is not None and fuzz.STATS.cases:
        lines.append(fuzz.STATS.summary())
    hostile = sys.modules.get("tests.test_hostile_input")
    if hostile is not None and hostile.CASES:
        lines.append(f"hostile cases per class: {dict(sorted(hostile.CASES.items()))}")
        for seconds, rss, label in hostile.SLOWEST[:3]:
            lines.append(f"slow accepted input: {seconds:.2f} s of CPU, {rss / 2**20:.0f} MiB ({label})")
    return lines


WORKER_LINES: list[str] = []  # what each pytest-xdist worker reported when it finished


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller prints it
        workeroutput["summary"] = _summary_lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 - pytest-xdist's hook
    WORKER_LINES.extend(getattr(node, "workeroutput", {}).get("summary", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in WORKER_LINES + _summary_lines():
        terminalreporter.write_line(line)


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
