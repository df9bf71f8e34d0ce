"""The docs build and the notebook runs: a newcomer's path must not rot.

The site must also work offline (formulas typeset by the vendored MathJax, no script or style from a CDN),
its numbered steps must number on, and every link in it and in the README must lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.browser import FLAGS, chromium
from tests.support import REPO

DOCS = REPO / "docs"
MATHJAX = DOCS / "javascript" / "mathjax" / "tex-svg-full.js"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``mkdocs build --strict`` writes it (any warning fails the build)."""
    pytest.importorskip("mkdocs", reason="the docs extra is part of the test extra")
    site_dir = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return site_dir


def test_mkdocs_builds_strict(site: Path) -> None:
    assert (site / "formulas" / "index.html").exists()


class _Assets(HTMLParser):
    """The URLs a page loads as scripts and stylesheets."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "script" and attr.get("src"):
            self.urls.append(attr["src"])
        elif tag == "link" and "stylesheet" in (attr.get("rel") or "").split() and attr.get("href"):
            self.urls.append(attr["href"])


REMOTE = re.compile(r"^(https?:)?//", re.I)


def test_site_loads_no_script_or_style_from_the_network(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 10
    remote = []
    for page in pages:
        parser = _Assets()
        parser.feed(page.read_text(encoding="utf-8"))
        remote += [f"{page.relative_to(site)}: {url}" for url in parser.urls if REMOTE.match(url)]
    for css in site.rglob("*.css"):  # a stylesheet may pull in more
        text = css.read_text(encoding="utf-8", errors="replace")
        imported = re.findall(r"""(?:@import|url\()\s*['"]?((?:https?:)?//[^'")\s]+)""", text)
        remote += [f"{css.relative_to(site)}: {url}" for url in imported]
    assert not remote, sorted(set(remote))


def test_formulas_page_loads_the_vendored_mathjax(site: Path) -> None:
    assert MATHJAX.stat().st_size > 1_000_000  # the whole single-file build, not a stub
    assert (MATHJAX.parent / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")
    parser = _Assets()
    parser.feed((site / "formulas" / "index.html").read_text(encoding="utf-8"))
    scripts = [url.removeprefix("../") for url in parser.urls]
    # the settings first: MathJax reads window.MathJax when it starts
    assert scripts.index("javascript/mathjax.js") < scripts.index("javascript/mathjax/tex-svg-full.js")
    assert (site / "javascript" / "mathjax" / "tex-svg-full.js").stat().st_size == MATHJAX.stat().st_size
    assert (site / "javascript" / "mathjax" / "LICENSE").exists()  # shipped beside the file it covers


@pytest.mark.skipif(
    chromium() is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)"
)
def test_formulas_render_offline_in_chromium(site: Path) -> None:
    page = site / "formulas" / "index.html"
    source = page.read_text(encoding="utf-8")
    formulas = source.count('class="arithmatex"')
    assert formulas > 100
    # every host name fails to resolve: the page gets only what the site itself holds
    flags = [f for f in FLAGS if not f.startswith("--virtual-time-budget")]
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [
                chromium(),
                *flags,
                "--virtual-time-budget=10000",
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--user-data-dir={profile}",
                "--dump-dom",
                page.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    dom, console = done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert dom.count("<mjx-container") == formulas, console
    assert 'jax="SVG"' in dom
    assert not re.search(r'<g[^>]*data-mml-node="merror"', dom)  # no formula MathJax could not parse
    left = [tex for tex in ("\\(", "\\[", "$$") if tex in dom]
    assert not left, f"raw TeX left on the page: {left}"


def sources() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def test_numbered_steps_number_on() -> None:
    """A code block or paragraph not indented under its item ends the list, and Markdown restarts the
    next one at 1 ("1. 1. 1."). With lazy numbering off, such an item shows as a list that starts
    anywhere but 1."""
    markdown = pytest.importorskip("markdown")
    from mkdocs.config import load_config

    config = load_config(str(REPO / "mkdocs.yml"))
    restarted = []
    for md in sources():
        converter = markdown.Markdown(
            extensions=[*config.markdown_extensions, "sane_lists"], extension_configs=config.mdx_configs
        )
        html = converter.convert(md.read_text(encoding="utf-8"))
        restarted += [f"{md.name}: item {n}" for n in re.findall(r'<ol start="(\d+)">', html)]
    assert not restarted, f"list items cut off from their list: {restarted}"


def test_calibration_steps_are_one_list_of_three(site: Path) -> None:
    html = (site / "calibration" / "index.html").read_text(encoding="utf-8")
    method = html.split('id="the-method', 1)[1].split("<h2", 1)[0]
    assert method.count("<ol>") == 1
    assert method.count("<li>") == 3
    assert method.split("</ol>", 1)[0].count('class="highlight"') == 3  # each step's commands inside it


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)


def relative_links(md: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)  # code is not a link
    targets = [inline or reference for inline, reference in LINK.findall(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_repository_page_links_resolve(name: str) -> None:
    md = REPO / name
    links = relative_links(md)
    if name == "README.md":
        assert len(links) >= 9  # the "Where next" list at least
    missing = [link for link in links if not (md.parent / link.split("#", 1)[0]).exists()]
    assert not missing, f"{name} links to files that do not exist: {missing}"


def test_quickstart_notebook_is_linked_and_served(site: Path) -> None:
    assert "notebooks/quickstart.ipynb" in relative_links(DOCS / "index.md")
    assert "docs/notebooks/quickstart.ipynb" in relative_links(REPO / "README.md")
    served = site / "notebooks" / "quickstart.ipynb"
    assert served.read_bytes() == (DOCS / "notebooks" / "quickstart.ipynb").read_bytes()
    assert 'href="notebooks/quickstart.ipynb"' in (site / "index.html").read_text(encoding="utf-8")


def released_versions() -> list[str]:
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, flags=re.M)


def test_changelog_matches_the_package_version() -> None:
    """A release has its section; a development version (0.2.0.dev0) comes after the last release,
    and its changes wait under [Unreleased]."""
    from packaging.version import Version

    found = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert found
    version, released = Version(found.group(1)), released_versions()
    assert released
    if version.is_devrelease or version.is_prerelease:
        assert Version(version.base_version) > max(map(Version, released))
    else:
        assert str(version) in released


def test_ci_install_line_pins_a_released_tag() -> None:
    """cp-plan is not on PyPI: the CI snippet installs from git at a tag the changelog lists."""
    planning = (DOCS / "planning.md").read_text(encoding="utf-8")
    assert not re.search(r"pip install ['\"]?cp-plan\b(?! @)", planning)
    tags = re.findall(
        r'pip install "cp-plan @ git\+https://<git-host>/<org>/cp-plan\.git@v([\d.]+)"', planning
    )
    assert tags and set(tags) <= set(released_versions())


def python_blocks(md: Path) -> list[str]:
    # the docs' own examples, not what a generated block holds
    text = re.sub(
        r"<!-- BEGIN GENERATED.*?<!-- END GENERATED[^>]*-->", "", md.read_text(encoding="utf-8"), flags=re.S
    )
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def run_checking_comments(block: str, where: str) -> int:
    """Run a docs example statement by statement; an expression line whose comment is one word (no
    spaces: ``f.intensity_step.expr  # 2*S*c*h/(N*n_kv*p)``) must print as that word. Returns the
    number of lines so checked."""
    import ast

    lines, scope, checked = block.splitlines(), {}, 0
    for node in ast.parse(block).body:
        code = compile(ast.Module([node], []), where, "exec")
        comment = lines[node.end_lineno - 1].partition("  # ")[2].strip()
        if isinstance(node, ast.Expr) and comment and " " not in comment:
            value = eval(compile(ast.Expression(node.value), where, "eval"), scope)  # noqa: S307
            assert str(value) == comment, (
                f"{where}: {ast.unparse(node)} gives {value}, the docs say {comment}"
            )
            checked += 1
        else:
            exec(code, scope)  # noqa: S102 - our own docs' examples
    return checked


@pytest.mark.parametrize("name", ["index.md", "formulas.md"])
def test_python_examples_in_the_docs_run(name: str) -> None:
    blocks = python_blocks(DOCS / name)
    assert blocks
    assert sum(run_checking_comments(block, f"docs/{name}") for block in blocks) >= 1


def test_quickstart_notebook_runs_with_a_real_kernel() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(REPO / "docs" / "notebooks" / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()  # raises CellExecutionError on the first failing assert
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs)


def test_the_kernel_page_lists_every_kernel_module() -> None:
    """docs/kernel.md's module table names each module of costmodel/kernel/ and no other."""
    text = (REPO / "docs" / "kernel.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", text, re.M))
    modules = {p.name for p in (REPO / "costmodel" / "kernel").glob("*.py")} - {"__init__.py", "__main__.py"}
    assert listed == modules
