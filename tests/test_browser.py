"""The pages in a real browser (headless Chromium): scripts run without errors, the charts render, and a
screenshot comes out. CI installs Chromium (.ci/run); without it these tests skip and say why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser import chromium, open_page, png_size, screenshot
from tests.support import REPO

pytestmark = pytest.mark.skipif(
    chromium() is None,
    reason="Chromium is not installed (Debian: apt-get install -y chromium); CI installs it",
)

CAUSAL_PLAN = ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink", "--causal", "--format", "html"]


def body_attributes(dom: str) -> dict[str, str]:
    tag = re.search(r"<body([^>]*)>", dom)
    assert tag, "no <body> in the rendered DOM"
    return dict(re.findall(r'([\w-]+)="([^"]*)"', tag.group(1)))


def write(cli, tmp_path: Path, *args: str) -> Path:  # noqa: ANN001 - the cli fixture
    result = cli(*args)
    assert result.code == 0, result.err
    page = tmp_path / "page.html"
    page.write_text(result.out, encoding="utf-8")
    return page


def test_plan_page_renders_without_errors(cli, tmp_path) -> None:
    opened = open_page(write(cli, tmp_path, *CAUSAL_PLAN))
    body = body_attributes(opened.dom)
    assert body.get("data-rendered") == "true", "the page's script did not finish"
    assert "data-js-errors" not in body, body.get("data-js-errors")
    assert opened.console == []  # nothing logged: no error, no warning
    assert body["data-timelines"] == "3" and body["data-rank-rows"] == str(3 * 8)
    assert body["data-clipped-labels"] == ""  # every label inside its chart ("8.80 TB" once read "8.80 TI")


def test_plan_file_and_sweep_pages_render(cli, tmp_path) -> None:
    page = tmp_path / "plan.html"
    plan = REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml"
    assert cli("report", str(plan), "--html", str(page)).code == 0
    body = body_attributes(open_page(page).dom)
    assert body.get("data-rendered") == "true" and "data-js-errors" not in body
    assert body["data-timelines"] == "6"  # forward and backward: the plan's pass is fwd+bwd
    assert body["data-clipped-labels"] == ""
    sweep = write(
        cli,
        tmp_path,
        "sweep",
        "--seq",
        "8k..256k",
        "--n",
        "1..16",
        "--hw",
        "a100-nvlink,h100-ib",
        "--causal",
        "--format",
        "html",
    )
    opened = open_page(sweep)
    body = body_attributes(opened.dom)
    assert body.get("data-rendered") == "true" and "data-js-errors" not in body and opened.console == []
    assert body["data-heatmaps"] == "2" and body["data-timelines"] == "0"
    assert body["data-clipped-labels"] == ""


def test_a_script_error_would_be_caught(cli, tmp_path) -> None:
    """The check above can fail: an error thrown by the page lands in the DOM and on the console."""
    page = write(cli, tmp_path, *CAUSAL_PLAN)
    text = page.read_text(encoding="utf-8").replace(
        "</body>", "<script>notDefinedAnywhere();</script></body>"
    )
    page.write_text(text, encoding="utf-8")
    opened = open_page(page)
    assert "notDefinedAnywhere" in body_attributes(opened.dom).get("data-js-errors", "")
    assert any("notDefinedAnywhere" in line for line in opened.console)


def test_screenshot(cli, tmp_path) -> None:
    png = screenshot(write(cli, tmp_path, *CAUSAL_PLAN), tmp_path / "plan.png", 1200, 1500)
    assert png_size(png) == (1200, 1500)
    assert png.stat().st_size > 20_000  # a blank page compresses to a few kB


def test_the_largest_tier_label_stays_inside_its_chart(cli, tmp_path) -> None:
    """At 362K tokens the score matrix is 8.80 TB, its bar the longest a plan draws: its label once ran past
    the chart's right edge and read "8.80 TI"."""
    page = write(
        cli, tmp_path, "--seq", "370728", "--n", "8", "--hw", "a100-nvlink", "--causal", "--format", "html"
    )
    body = body_attributes(open_page(page).dom)
    assert body.get("data-rendered") == "true" and body["data-clipped-labels"] == ""
    assert "8.80 TB" in page.read_text(encoding="utf-8")
