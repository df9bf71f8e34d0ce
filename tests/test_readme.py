"""The README stays true: its commands are what CI runs. (Its example output is a generated block that
`python -m costmodel.codegen --check` keeps equal to what cp-plan prints.)"""

from __future__ import annotations

import re

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


def test_readme_says_how_long_the_suite_takes_and_gives_the_fast_subset() -> None:
    """The fast subset it names selects by a marker the suite declares, and leaves tests out."""
    import tomllib

    assert re.search(r"whole suite .* takes about \d+ minutes", README, flags=re.S)
    fast = re.search(r'`(python -m pytest -m "not slow")`', README)
    assert fast is not None
    markers = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"][
        "ini_options"
    ]["markers"]
    assert any(marker.startswith("slow:") for marker in markers)
    slow = sum(
        "pytest.mark.slow" in path.read_text(encoding="utf-8") for path in (REPO / "tests").rglob("test_*.py")
    )
    assert slow >= 5  # the marker is in use
