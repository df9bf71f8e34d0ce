"""The house rules of docs/architecture.md, checked on the source: which layer may import which.

Layers, lowest first. A module may import its own package and any package of a lower layer; the torch
kernel is a leaf that needs nothing above the sequence layouts; the CLI and the code generator sit on
top. Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "costmodel"
LAYER = {
    "core": 0,
    "symbolic": 1,
    "schedule": 1,
    "machines": 2,
    "plans": 3,
    "training": 4,
    "calibration": 4,
    "audit": 4,
    "inference": 4,
    "cli": 5,
    "codegen": 6,
}
KERNEL_MAY_IMPORT = {"core", "schedule", "kernel"}
# Entry points that exist to be run, not imported: they start the layer above them.
ENTRY_POINTS = {PACKAGE / "kernel" / "__main__.py"}


def _package(module: str) -> str | None:
    """``costmodel.plans.inputs`` -> ``plans``; ``costmodel.codegen`` -> ``codegen``; None outside."""
    parts = module.split(".")
    if parts[0] != "costmodel" or len(parts) < 2:
        return None
    return parts[1]


def _all_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names if node.module == "costmodel"}
    return found


def _imports(path: Path) -> set[str]:
    return {name for name in _all_imports(path) if _package(name)}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p not in ENTRY_POINTS)


def _owner(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_lower_layers_never_import_higher_ones(path: Path) -> None:
    owner = _owner(path)
    if owner == "__init__":
        return
    for module in _imports(path):
        target = _package(module)
        if owner == "kernel":
            assert target in KERNEL_MAY_IMPORT, f"the torch kernel imports {module}"
        elif target != owner and target in LAYER and owner in LAYER:
            assert LAYER[target] <= LAYER[owner] and (target, owner) != ("calibration", "training"), (
                f"{path.relative_to(REPO)} ({owner}) imports {module} ({target})"
            )
            assert target != "kernel" or owner == "cli", f"only the CLI may reach the torch kernel: {module}"


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - {"kernel"} <= set(LAYER)


def test_the_model_layers_import_no_torch_and_no_cli() -> None:
    for path in _modules():
        if _owner(path) in {"core", "symbolic", "schedule", "machines", "plans", "training", "calibration"}:
            imported = _all_imports(path)
            assert not any(
                name == "torch" or name.startswith(("torch.", "costmodel.cli")) for name in imported
            ), path
