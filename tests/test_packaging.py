"""A plain (non-editable) install carries the built-in profiles and presets inside the package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from costmodel.machines.profiles import builtin_names
from costmodel.plans.models import builtin_models
from tests.support import REPO

pytest.importorskip("hatchling", reason="building a wheel offline needs hatchling (the test extra)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (path,) = Path(out).glob("cp_plan-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_carries_profiles_presets_and_generated_module(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for profile in builtin_names():
        assert f"costmodel/_data/hardware/{profile}.yaml" in names
    for model in builtin_models():
        assert f"costmodel/_data/configs/models/{model}.yaml" in names
    for table in ("training_published", "serving_published", "memory_peaks"):
        assert f"costmodel/_data/validation/{table}.yaml" in names  # read when the modules are imported
    for table in ("training_published", "serving_published"):
        assert f"costmodel/_data/validation/{table}_holdout.yaml" in names
    assert "costmodel/symbolic/numeric.py" in names
    assert "costmodel/symbolic/formula_text.py" in names
    assert not any(name.startswith(("tests/", "docs/", "benchmarks/")) for name in names)


def test_wheel_declares_the_console_script_and_an_optional_torch(wheel: zipfile.ZipFile) -> None:
    entry = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "cp-plan = costmodel.cli:main" in wheel.read(entry).decode()
    meta = wheel.read(next(n for n in wheel.namelist() if n.endswith("METADATA"))).decode()
    torch_lines = [line for line in meta.splitlines() if line.startswith("Requires-Dist: torch")]
    assert torch_lines and all("extra ==" in line for line in torch_lines)
