"""Open cp-plan's HTML pages in headless Chromium: the rendered DOM, console output, a screenshot.

The browser test uses this; run as a script it refreshes the screenshots in docs/:

    python -m tests.browser
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-extensions",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=3000",
]


def chromium() -> str | None:
    """The first Chromium-family browser on PATH."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@dataclass
class Opened:
    dom: str  # the DOM after scripts ran
    console: list[str]  # what the page wrote to its console (errors included)


def _run(page: Path, *flags: str, timeout: int = 90) -> subprocess.CompletedProcess:
    browser = chromium()
    if browser is None:
        raise RuntimeError("no Chromium on PATH")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", *flags, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def open_page(page: Path, width: int = 1200, height: int = 900) -> Opened:
    done = _run(page, "--dump-dom", f"--window-size={width},{height}")
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return Opened(done.stdout, console)


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 1600) -> Path:
    """The top ``width`` x ``height`` CSS pixels of the page."""
    _run(page, f"--window-size={width},{height}", f"--screenshot={png}").check_returncode()
    return png


def png_size(png: Path) -> tuple[int, int]:
    """Width and height from the PNG header."""
    data = png.read_bytes()[:24]
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{png} is not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


DOCS = {  # file in docs/ -> (cp-plan arguments, size, whether to start at the timelines)
    "report-plan.png": (
        ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink", "--causal", "--format", "html"],
        (1200, 1560),
        False,
    ),
    "report-timeline-ib.png": (
        ["--seq", "64k", "--n", "8", "--hw", "h100-ib", "--causal", "--pass", "fwd+bwd", "--format", "html"],
        (1200, 640),
        True,
    ),
    "report-sweep.png": (
        [
            "sweep",
            "--seq",
            "8k..1M",
            "--n",
            "1..64",
            "--hw",
            "a100-nvlink,h100-ib",
            "--causal",
            "--format",
            "html",
        ],
        (1000, 820),
        False,
    ),
}


def refresh_docs(docs: Path) -> list[Path]:
    """Write the docs' screenshots, reduced to a 64-colour palette to keep them small."""
    import contextlib
    import io

    from costmodel.cli import main

    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (args, (width, height), at_timeline) in DOCS.items():
            page = Path(tmp) / f"{name}.html"
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                if main(args) != 0:
                    raise RuntimeError(f"cp-plan {' '.join(args)} failed")
            page.write_text(out.getvalue(), encoding="utf-8")
            top = 0
            if at_timeline:  # the page marks where its timeline section starts
                dom = open_page(page, width, height).dom
                top = max(0, int(dom.split('data-timeline-top="', 1)[1].split('"', 1)[0]) - 12)
            png = screenshot(page, Path(tmp) / name, width, top + height)
            written.append(_shrink(png, docs / name, top))
    return written


def _shrink(png: Path, target: Path, top: int = 0) -> Path:
    """Crop ``top`` pixels off, then a 256-colour palette without dithering: flat charts stay exact."""
    import io

    from PIL import Image

    from costmodel.core.fileio import atomic_write_bytes

    image = Image.open(png).convert("RGB")
    image = image.crop((0, top, image.width, image.height))
    buffer = io.BytesIO()
    image.quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(
        buffer, format="PNG", optimize=True
    )
    return atomic_write_bytes(target, buffer.getvalue())


if __name__ == "__main__":
    if chromium() is None:
        sys.exit("no Chromium on PATH (Debian: apt-get install -y chromium)")
    for path in refresh_docs(Path(__file__).resolve().parent.parent / "docs"):
        print(f"wrote {path} ({path.stat().st_size // 1024} kB)")
