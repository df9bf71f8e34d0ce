"""The HTML pages: well-formed, self-contained, the three timelines drawn, numbers equal to the report's."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from html.parser import HTMLParser
from xml.etree import ElementTree as ET

import pytest

from costmodel.cli.html import plan_page
from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.bind import Evaluator
from costmodel.plans.evaluate import evaluate
from costmodel.plans.gantt import plan_timelines, ring_timeline
from costmodel.plans.inputs import PlanInputs
from costmodel.training.check import load_plan, resolve
from costmodel.training.memory import fit_at, training_values
from costmodel.training.sweep import sweep
from tests.support import REPO

CAUSAL_PLAN = ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink", "--causal"]
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "wbr", "source", "track"}
PLAN = REPO / "configs" / "plans" / "llama3-8b-128k-a100-nvlink.yaml"


def xml(page: str) -> ET.Element:
    """The page as XML (it is written so that it parses as such; the doctype is not XML)."""
    assert page.startswith("<!DOCTYPE html>\n")
    return ET.fromstring(page.removeprefix("<!DOCTYPE html>\n"))


class _Nesting(HTMLParser):
    """Every non-void element closed in order, as a browser's parser would need no guessing."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        pass

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


def assert_well_formed(page: str) -> ET.Element:
    parser = _Nesting()
    parser.feed(page)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    return xml(page)


def assert_self_contained(page: str) -> None:
    root = xml(page)
    for element in root.iter():
        for name in ("src", "href", "{http://www.w3.org/1999/xlink}href"):
            value = element.get(name)
            assert value is None or not re.match(r"\s*(https?:)?//", value), f"{element.tag} {name}={value}"
    assert not re.search(r"@import|url\(\s*['\"]?(https?:)?//", page)  # styles or fonts fetched at view time
    assert "<link" not in page


def local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def find(root: ET.Element, tag: str, **attrs: str) -> list[ET.Element]:
    return [
        e
        for e in root.iter()
        if local(e.tag) == tag
        and all(
            attr in (e.get("class") or "").split() if key == "class_" else e.get(key) == attr
            for key, attr in attrs.items()
        )
    ]


def field(data: dict, path: str) -> object:
    for key in path.split("."):
        data = data[key]
    return data


def test_plan_page_has_three_timelines_one_row_per_rank(cli) -> None:
    result = cli(*CAUSAL_PLAN, "--format", "html")
    assert result.code == 0, result.err
    root = assert_well_formed(result.out)
    assert_self_contained(result.out)
    gantts = find(root, "svg", class_="gantt")
    assert [g.get("data-layout") for g in gantts] == ["contiguous", "striped", "zigzag"]
    for svg in gantts:
        ranks = find(svg, "g", class_="rank")
        assert [int(g.get("data-rank")) for g in ranks] == list(range(8))
        assert all(find(g, "rect") for g in ranks)  # every row has bars
        assert all(r.find("title") is not None for r in find(svg, "rect") if r.get("class"))  # hover values
    assert result.out.count('data-pass="bwd"') == 0  # --pass fwd: the forward only


def test_page_numbers_are_the_reports_fields(cli) -> None:
    page = cli(*CAUSAL_PLAN, "--format", "html").out
    report = cli(*CAUSAL_PLAN, "--format", "json").json()
    root = xml(page)
    tagged = [e for e in root.iter() if e.get("data-field") and e.get("data-value")]
    paths = {e.get("data-field") for e in tagged}
    assert {
        "verdict.comm_ratio_step",
        "ring.layer_time_s",
        "verdict.n_max_green",
        "ring.step_comm_s",
        "memory.scores_full_bytes",
        "causal.utilization.zigzag",
    } <= paths
    for element in tagged:
        assert float(element.get("data-value")) == pytest.approx(
            field(report, element.get("data-field")), rel=1e-15
        )
    # The plan's own layout: its timeline's total is the report's layer time.
    contiguous = next(g for g in find(root, "svg", class_="gantt") if g.get("data-layout") == "contiguous")
    assert float(contiguous.get("data-total-s")) == pytest.approx(report["ring"]["layer_time_s"], rel=1e-12)
    assert "GREEN" in page and "1.59 %" in page  # the verdict and its ratio, as the table prints them


def test_backward_panels_when_the_pass_has_one(cli) -> None:
    page = cli(*CAUSAL_PLAN, "--pass", "fwd+bwd", "--layout", "zigzag", "--format", "html").out
    root = xml(page)
    backward = [g for g in find(root, "svg", class_="gantt") if g.get("data-pass") == "bwd"]
    assert [g.get("data-layout") for g in backward] == ["contiguous", "striped", "zigzag"]
    inputs = PlanInputs(seq=262_144, n=8, causal=True, layout="zigzag")
    expected = ring_timeline(inputs, Machine(load_profile("a100-nvlink")), backward=True).total_s
    assert float(backward[2].get("data-total-s")) == pytest.approx(expected, rel=1e-15)


def test_layout_that_does_not_split_is_named_not_drawn(cli) -> None:
    page = cli("--seq", "24", "--n", "8", "--block", "1", "--causal", "--format", "html").out  # 24 % 16 != 0
    root = xml(page)
    assert [g.get("data-layout") for g in find(root, "svg", class_="gantt")] == ["contiguous", "striped"]
    assert "does not split into 16 equal chunks" in page


def test_too_many_ranks_to_draw_says_so(cli) -> None:
    result = cli("--seq", "1M", "--n", "128", "--hw", "h100-ib", "--format", "html")
    assert result.code == 0, result.err
    assert "Not drawn: one row per rank reads up to N = 64 ranks; this plan has N = 128." in result.out
    assert find(xml(result.out), "svg", class_="gantt") == []


def test_plan_file_page_is_written_with_training_memory(cli, tmp_path) -> None:
    out = tmp_path / "plan.html"
    result = cli("report", str(PLAN), "--html", str(out))
    assert result.code == 0, result.err
    page = out.read_text(encoding="utf-8")
    root = assert_well_formed(page)
    assert_self_contained(page)
    resolved = resolve(load_plan(str(PLAN)))
    placed = resolved.machine
    fit = fit_at(Evaluator(training_values(resolved.job, 8)))
    report = evaluate(resolved.attention, placed).model_dump(mode="json", by_alias=True)
    values = {
        e.get("data-field"): float(e.get("data-value"))
        for e in root.iter()
        if e.get("data-field") and e.get("data-value")
    }
    for name in ("total_bytes", "device_memory_bytes"):
        assert values[f"fit.{name}"] == pytest.approx(getattr(fit, name), rel=1e-15)
    # the bar stacks the peak's categories, which sum to the total
    parts = {k.rsplit(".", 1)[1]: v for k, v in values.items() if k.startswith("fit.by_category.")}
    assert {"weights", "optimizer", "activations", "allocator", "runtime"} <= set(parts)
    for name, value in parts.items():
        assert value == pytest.approx(getattr(fit.by_category, name), rel=1e-15)
    assert sum(parts.values()) == pytest.approx(fit.total_bytes, rel=1e-12)
    assert f"The peak falls at {html.escape(fit.by_category.peak)}" in page
    assert values["verdict.comm_ratio_step"] == pytest.approx(report["verdict"]["comm_ratio_step"], rel=1e-15)
    assert "Checks: 3 of 3 pass" in page
    assert [g.get("data-pass") for g in find(root, "svg", class_="gantt")] == ["fwd"] * 3 + ["bwd"] * 3
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left behind


def test_plan_file_report_bad_input(cli, tmp_path) -> None:
    result = cli("report", str(PLAN), "--html", str(tmp_path / "plan.pdf"))
    assert result.code == 2 and result.err.count("\n") == 1 and ".html" in result.err
    missing = cli("report", str(tmp_path / "none.yaml"), "--html", str(tmp_path / "x.html"))
    assert missing.code == 2 and "file not found" in missing.err
    assert not (tmp_path / "x.html").exists()


def test_sweep_heatmap_cells_carry_the_grid(cli) -> None:
    result = cli(
        "sweep",
        "--seq",
        "8k..64k",
        "--n",
        "1,2,4,8,16",
        "--hw",
        "a100-nvlink,h100-ib",
        "--causal",
        "--format",
        "html",
    )
    assert result.code == 0, result.err
    root = assert_well_formed(result.out)
    assert_self_contained(result.out)
    heatmaps = find(root, "svg", class_="heat")
    assert len(heatmaps) == 2
    shape = PlanInputs(seq=1, n=1, causal=True, block=1)
    for svg, hw in zip(heatmaps, ("a100-nvlink", "h100-ib"), strict=True):
        grid = sweep(shape, [8192, 16384, 32768, 65536], [1, 2, 4, 8, 16], Machine(load_profile(hw)))
        cells = [r for r in find(svg, "rect") if r.get("data-seq")]
        assert len(cells) == 4 * 5
        names = ["green", "amber", "red"]
        for cell in cells:
            i = [8192, 16384, 32768, 65536].index(int(cell.get("data-seq")))
            j = [1, 2, 4, 8, 16].index(int(cell.get("data-n")))
            assert float(cell.get("data-value")) == pytest.approx(grid.ratio[i, j], rel=1e-15)
            assert cell.get("data-verdict") == names[grid.verdicts()[i, j]]


def test_plan_page_with_explain_lists_formulas(cli) -> None:
    page = cli("--format", "html", "--explain").out
    assert_well_formed(page)
    assert "Formulas, then values" in page and "intensity_step" in page


def test_core_cli_does_not_import_the_html_module() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from costmodel.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['--causal'])\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['sweep', '--seq', '8k', '--n', '2'])\n"
        "print('costmodel.cli.html' in sys.modules, 'costmodel.plans.gantt' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_plan_page_function_escapes_text() -> None:
    inputs, machine = PlanInputs(seq=4096, n=2), Machine(load_profile("a100-nvlink"))
    timelines = plan_timelines(inputs, machine)
    page = plan_page(evaluate(inputs, machine), inputs, machine.profile, timelines, title="a <b> & c")
    assert "<title>a &lt;b&gt; &amp; c</title>" in page
    assert_well_formed(page)


def test_docs_show_modest_screenshots() -> None:
    page = (REPO / "docs" / "report.md").read_text(encoding="utf-8")
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "report.md" in nav
    shots = re.findall(r"!\[[^\]]+\]\(([\w-]+\.png)\)", page)
    assert len(shots) == 3
    for name in shots:
        data = (REPO / "docs" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 200_000, name


def test_plan_file_report_on_the_terminal(cli) -> None:
    result = cli("report", str(PLAN))
    assert result.code == 0, result.err
    assert "GREEN" in result.out and "zigzag layout" in result.out
