"""Plots of a sweep: step comm ratio against N per S, the verdict bands shaded, N_max marked ([Korthikanti22]).

matplotlib is an optional extra (``pip install matplotlib``, or ``.[plot]`` from a clone); without it
``plot_sweep`` refuses ``--plot`` after the table is out. A file type it cannot draw or a path it cannot
write is refused before the sweep (:func:`check_plot`).
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.core.errors import InputError
from costmodel.core.fileio import atomic_write_bytes, check_writable
from costmodel.core.units import tokens_label
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.verdict import AMBER, GREEN
from costmodel.training.sweep import Grid


def check_plot(path: Path) -> None:
    """Refuse ``--plot`` before any work: a file type it cannot draw, a path it cannot write."""
    if path.suffix.lower() not in {".png", ".svg"}:
        raise InputError("--plot", f"{path.name}: accepted file types are .png and .svg")
    check_writable(path, "--plot")


def plot_sweep(grids: list[Grid], path: Path, shape: PlanInputs) -> Path:
    """One panel per profile, to a path :func:`check_plot` accepted; returns the path written."""
    plt = _pyplot()
    with warnings.catch_warnings():  # a missing glyph or a layout hint is not the user's to read
        warnings.simplefilter("ignore")
        return _draw(plt, grids, path, shape)


def _pyplot() -> Any:
    """matplotlib's pyplot drawing to files only (Agg), quiet on stderr.

    The backend is chosen before matplotlib is imported: it reads ``MPLBACKEND`` as it loads, and a name
    it does not know (or a display's backend on a machine without one) would fail there. Its own log (a
    cache folder it cannot write, the font cache being built) is not ours to print."""
    os.environ["MPLBACKEND"] = "agg"
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    try:
        import matplotlib
    except ImportError:
        raise InputError(
            "--plot",
            "needs matplotlib: pip install matplotlib (or the plot extra: pip install -e '.[plot]' in a "
            "clone of cp-plan); the sweep above is complete, no plot was written",
        ) from None
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    return plt


def _draw(plt: Any, grids: list[Grid], path: Path, shape: PlanInputs) -> Path:
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, len(grids), figsize=(6.2 * len(grids), 4.6), squeeze=False, sharey=True)
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(grids[0].seqs)))
    top = max(2.0, max(float(np.nanmax(grid.ratio)) for grid in grids) * 1.5)
    for ax, grid in zip(axes[0], grids, strict=True):
        ns = grid.ns.astype(float)
        ax.axhspan(1e-6, GREEN.upper, color="tab:green", alpha=0.12, lw=0)
        ax.axhspan(GREEN.upper, AMBER.upper, color="gold", alpha=0.18, lw=0)
        ax.axhspan(AMBER.upper, top, color="tab:red", alpha=0.10, lw=0)
        for y, text in (
            (GREEN.upper**0.5 * 1e-2, "green < 5 %"),
            ((GREEN.upper * AMBER.upper) ** 0.5, "amber"),
            (AMBER.upper * 2.2, "red > 15 %"),
        ):
            ax.text(0.015, y, text, transform=ax.get_yaxis_transform(), fontsize=7, color="0.3", va="center")
        ax.axhline(1.0, color="0.3", lw=0.8, ls=":")
        for colour, seq, ratio, n_max, n_min in zip(
            colours,
            grid.seqs,
            grid.ratio,
            grid.n_max,
            _or_nan(grid.n_min_memory, len(grid.seqs)),
            strict=True,
        ):
            label = f"S = {tokens_label(int(seq))}"
            ax.plot(ns, np.where(ratio > 0, ratio, np.nan), marker="o", ms=3, color=colour, label=label)
            if ns[0] <= n_max <= ns[-1]:
                ax.plot([n_max], [1.0], marker="v", color=colour, ms=8)
            if np.isfinite(n_min) and ns[0] <= n_min <= ns[-1]:
                ax.axvline(n_min, color=colour, lw=1, ls="--", alpha=0.7)
        crossing = grid.ns[grid.inter_node]
        if crossing.size:
            ax.axvline(float(crossing[0]) / np.sqrt(2), color="0.5", lw=1)
            ax.text(
                float(crossing[0]) / np.sqrt(2), top / 12, " ring leaves\n the node", fontsize=8, color="0.35"
            )
        ax.set(xscale="log", yscale="log", xlabel="CP degree N", ylim=(1e-4, top))
        ax.set_title(grid.profile, fontsize=10)
        ax.set_xticks(ns, [str(int(n)) for n in ns])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{100 * y:g} %"))
        ax.set_yticks([1e-3, 1e-2, GREEN.upper, AMBER.upper, 1.0])
        ax.grid(alpha=0.25, which="both")
    mask = "causal" if shape.causal else "non-causal"
    axes[0][0].set_ylabel(f"{shape.pass_} step receive / step compute")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    drawn_n_min = any(grid.n_min_memory is not None for grid in grids)
    fig.suptitle(
        f"h = {shape.heads}, n_kv = {shape.kv_heads}, d = {shape.head_dim}, {shape.dtype}, {mask}; "
        "▼ N_max (ratio 100 %)" + (", dashed: N_min(memory)" if drawn_n_min else ""),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))  # the title inside the figure

    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lower().lstrip("."), dpi=130)
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue(), "--plot")


def _or_nan(values: np.ndarray | None, size: int) -> np.ndarray:
    return np.full(size, np.nan) if values is None else values
