"""Every script in benchmarks/ runs in the suite in its smoke mode (small sizes, one timing), so none can
rot while the code it times moves on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO

BENCHMARKS = REPO / "benchmarks"
HELPERS = {"timing.py"}  # imported by the others, not run
# script -> (arguments of its smoke run, marks): the multi-process ones need torch; they and the full fits
# (fidelity.py fits every term to two synthetic tables) are the slow tier's.
SMOKE = {
    "cli_latency.py": (["--smoke"], ()),
    "collectives.py": (["--smoke"], ()),
    "fidelity.py": (["--smoke"], (pytest.mark.slow,)),
    "fit.py": (["--smoke"], ()),
    "kernel_curves.py": (["--smoke"], ()),
    "ring_efficiency.py": ([], ()),
    "host_overhead.py": (["--smoke"], (pytest.mark.kernel,)),
    "packed.py": (["--smoke"], ()),
    "search.py": (["--smoke"], ()),
    "simulator.py": (["--smoke"], ()),
    "sweep.py": (["--smoke"], ()),
    "walk.py": (["--smoke"], ()),
    "memory.py": (["--smoke"], (pytest.mark.kernel,)),
    "kernel.py": (["--smoke"], (pytest.mark.slow, pytest.mark.kernel)),
    "calibration_stability.py": (["--smoke"], (pytest.mark.slow, pytest.mark.kernel)),
}
# Run elsewhere in the suite, with the check that goes with it.
ELSEWHERE = {
    "gpu_kernels.py": "tests/test_varlen_calls.py::test_the_gpu_benchmark_runs_its_smoke_case_on_the_cpu",
    "memory_reference.py": "tests/kernel/test_memory_reference.py::test_the_benchmark_runs_its_smoke_grid",
}


def test_every_benchmark_has_a_smoke_run_in_the_suite() -> None:
    scripts = {path.name for path in BENCHMARKS.glob("*.py")} - HELPERS
    assert scripts == set(SMOKE) | set(ELSEWHERE)
    for name, test in ELSEWHERE.items():
        path, function = test.split("::")
        source = (REPO / path).read_text(encoding="utf-8")
        assert f"def {function}(" in source and name in source


@pytest.mark.parametrize("name", [pytest.param(name, marks=marks) for name, (_, marks) in SMOKE.items()])
def test_benchmark_smoke_run(name: str) -> None:
    if name in ("kernel.py", "calibration_stability.py", "host_overhead.py", "memory.py"):
        pytest.importorskip("torch")
    args, _ = SMOKE[name]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "a benchmark prints its figures"
