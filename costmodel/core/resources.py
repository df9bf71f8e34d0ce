"""Where the built-in hardware profiles and model presets are, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # costmodel/


def data_dir(kind: str) -> Path:
    """``hardware`` or ``configs``: inside the wheel (``costmodel/_data``), else the repository root."""
    packaged = _PACKAGE / "_data" / kind
    return packaged if packaged.is_dir() else _PACKAGE.parent / kind
