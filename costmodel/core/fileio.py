"""Reading and writing the files the tool touches: YAML in with ``safe_load``, anything out atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from costmodel.core.errors import InputError


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never half.

    The data goes to a temporary file in the same directory, is flushed to disk, then renamed over
    the target (rename is atomic within one filesystem). On any error, Ctrl-C included, the temporary
    file is removed and the target is untouched.
    """
    import tempfile

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp makes the file private (0600); give it the target's mode, or what a plain open() would.
        os.fchmod(fd, target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def load_yaml(path: str | os.PathLike[str], field: str) -> Any:
    """Parse a YAML file with ``safe_load`` (no Python tags), reporting problems as :class:`InputError`.

    ``field`` names the flag or file kind in the error, e.g. ``--hw``.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=loader)  # noqa: S506 - CSafeLoader is safe_load's loader
    except FileNotFoundError:
        raise InputError(field, f"file not found: {path}") from None
    except IsADirectoryError:
        raise InputError(field, f"is a directory, expected a YAML file: {path}") from None
    except UnicodeDecodeError:
        raise InputError(field, f"not a UTF-8 text file: {path}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(field, f"malformed YAML in {path}{where}: {problem}") from None


def load_builtin_or_file(spec: str, directory: Path, field: str, noun: str) -> tuple[Any, str]:
    """The YAML of a built-in (``spec`` names a file in ``directory``) or of the file at path ``spec``.

    Returns (data, where it came from); unknown names list the built-ins. The caller validates."""
    builtins = sorted(p.stem for p in directory.glob("*.yaml"))
    path = directory / f"{spec}.yaml" if spec in builtins else Path(spec)
    if spec not in builtins and path.suffix not in {".yaml", ".yml"} and os.sep not in spec and not path.exists():
        raise InputError(field, f"unknown {noun} {spec!r}; built-in: {', '.join(builtins)}, or a path to a YAML file")
    data = load_yaml(path, field)
    if not isinstance(data, dict):
        raise InputError(field, f"{path}: expected a mapping of {noun} fields, got {type(data).__name__}")
    return data, str(path)

