"""The README stays true: its commands are what CI runs. (Its example output is a generated block that
`python -m costmodel.codegen --check` keeps equal to what cp-plan prints.)"""

from __future__ import annotations

import re

from tests.support import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
SLOW_TIER = "python -m pytest -m slow"


def fenced(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_ci_runs_the_readme_test_command_then_the_slow_tier() -> None:
    install_and_run, install_and_test = (block.strip() for block in fenced("bash"))
    assert install_and_run == "pip install . && cp-plan --seq 262144 --n 8 --hw a100-nvlink"
    assert install_and_test.endswith("&& python -m pytest")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert install_and_test in ci
    assert SLOW_TIER in ci[ci.index(install_and_test) + 1 :]


def test_readme_says_what_each_tier_holds_and_how_long_it_takes() -> None:
    """The fast tier is the README's command (pytest's addopts leave the slow marker out), the slow tier one
    command beside it; the README gives each one's size and time on the CI machine."""
    import shlex
    import tomllib

    options = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"][
        "ini_options"
    ]
    addopts = shlex.split(options["addopts"])
    assert addopts[addopts.index("-m") + 1] == "not slow"
    assert any(marker.startswith("slow:") for marker in options["markers"])
    assert re.search(r"\*\*Fast\*\*, `python -m pytest`: about [\d,]+ tests in about \d+ minutes", README)
    assert re.search(rf"\*\*Slow\*\*, `{SLOW_TIER}`: about [\d,]+ tests in about \d+ minutes", README)
    slow = sum(
        "pytest.mark.slow" in path.read_text(encoding="utf-8") for path in (REPO / "tests").rglob("test_*.py")
    )
    assert slow >= 5  # the marker is in use
