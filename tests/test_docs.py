"""The docs build and the notebook runs: a newcomer's path must not rot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import REPO


def test_mkdocs_builds_strict(tmp_path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is part of the test extra")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "formulas" / "index.html").exists()


def test_quickstart_notebook_runs_with_a_real_kernel() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(REPO / "docs" / "notebooks" / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})  # fmt: skip
    client.execute()  # raises CellExecutionError on the first failing assert
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs)
