"""Reading and writing the files the tool touches: YAML in through one hardened safe loader, anything out atomically."""

from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.core.errors import InputError


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, field: str = "output") -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never half.

    The data goes to a temporary file in the same directory, is flushed to disk, then renamed over
    the target (rename is atomic within one filesystem). On any error, Ctrl-C included, the temporary
    file is removed and the target is untouched. A destination that cannot be written (a read-only
    folder, a parent that is a file, a target that is a folder, a full disk) is an :class:`InputError`
    naming ``field``, the flag that chose the path.
    """
    import tempfile

    target = Path(path)
    tmp: str | None = None
    try:
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        _make_parent(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        # mkstemp makes the file private (0600); give it the target's mode, or what a plain open() would.
        os.fchmod(fd, target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError | ValueError):
            raise InputError(field, f"cannot write {_shorten(str(target))}: {_reason(exc)}") from None
        raise
    return target


def check_writable(path: str | os.PathLike[str], field: str) -> None:
    """Fail now, not after a long computation, when :func:`atomic_write_bytes` could not write ``path``:
    create and remove a temporary file beside it."""
    import tempfile

    target = Path(path)
    try:
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        _make_parent(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        os.unlink(tmp)
    except (OSError, ValueError) as exc:
        raise InputError(field, f"cannot write {_shorten(str(target))}: {_reason(exc)}") from None


def _make_parent(target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's word for "a folder on the way is a file"
        raise NotADirectoryError(errno.ENOTDIR, "a folder on the path is a file") from None


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str, field: str = "output") -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"), field)


MAX_YAML_BYTES = 1 << 20  # 1 MiB: a profile, preset or plan is a few hundred bytes
MAX_YAML_DEPTH = 64  # nested mappings and lists; ours nest four deep


@dataclass(frozen=True)
class YamlDocument:
    """Parsed YAML and the line of every key (``("links", "intra_node", "latency_s") -> 23``), 1-based.

    List items are keyed by their index as text, so a pydantic error location maps to a line too."""

    data: Any
    lines: dict[tuple[str, ...], int]

    def line(self, *keys: object) -> int:
        """The line of the deepest known key on the path ``keys``; 1 when none is known."""
        path = tuple(str(key) for key in keys)
        for end in range(len(path), 0, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return 1


class YamlInputError(InputError):
    """A YAML input that cannot be read: ``problem`` at ``line`` (None: the whole file) of ``path``."""

    def __init__(self, field: str, path: str, line: int | None, problem: str) -> None:
        super().__init__(field, f"{path}{'' if line is None else f':{line}'}: {problem}")
        self.path, self.line, self.problem = path, line, problem


def read_yaml(path: str | os.PathLike[str], field: str) -> YamlDocument:
    """Read one YAML document with the safe loader, hardened against hostile files.

    Refused, each as one :class:`YamlInputError` naming ``field`` (a flag such as ``--hw``) and the
    file: files over :data:`MAX_YAML_BYTES`, nesting deeper than :data:`MAX_YAML_DEPTH`, anchors and
    aliases (an alias bomb expands a few hundred bytes into gigabytes), duplicate keys (YAML would keep
    the last one silently), Python tags, unreadable or missing files and text that is not UTF-8.
    """
    name = os.fspath(path)
    text = _read_text(name, field)
    import yaml

    loader = None
    try:
        loader = _hardened_loader()(text)  # checks the characters already
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise YamlInputError(field, name, exc.line, exc.message) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlInputError(
            field, name, mark.line + 1 if mark else None, f"malformed YAML: {problem}"
        ) from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of more digits than Python converts
        raise YamlInputError(field, name, None, f"unreadable value: {str(exc).splitlines()[0]}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return YamlDocument(data, _key_lines(node) if node is not None else {})


def load_yaml(path: str | os.PathLike[str], field: str) -> Any:
    """The data of :func:`read_yaml`, without the line map."""
    return read_yaml(path, field).data


def _read_text(name: str, field: str) -> str:
    def refuse(problem: str) -> YamlInputError:
        return YamlInputError(field, _shorten(name), None, problem)

    try:
        with open(name, "rb") as handle:
            raw = handle.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise refuse("file not found") from None
    except IsADirectoryError:
        raise refuse("is a directory, expected a YAML file") from None
    except PermissionError:
        raise refuse("permission denied") from None
    except (OSError, ValueError) as exc:  # name too long, a loop of links, a NUL in the name, ...
        raise refuse(f"cannot read: {_reason(exc)}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise refuse(f"larger than {MAX_YAML_BYTES // 1024} KiB; a YAML input is a few hundred bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("not a UTF-8 text file") from None


def _shorten(name: str, limit: int = 80) -> str:
    return name if len(name) <= limit else f"{name[: limit - 3]}..."


class _Refused(Exception):
    def __init__(self, node_or_event: Any, message: str) -> None:
        super().__init__(message)
        self.line = node_or_event.start_mark.line + 1
        self.message = message


@functools.cache
def _hardened_loader() -> type:
    import yaml
    from yaml.events import AliasEvent

    class Loader(yaml.SafeLoader):
        """SafeLoader (pure Python: the C composer cannot be limited) that composes every node once."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
                raise _Refused(event, "anchors and aliases (& and *) are not accepted; write the values out")
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                raise _Refused(event, f"nested deeper than {MAX_YAML_DEPTH} levels")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def compose_mapping_node(self, anchor: Any) -> Any:
            node = super().compose_mapping_node(anchor)
            seen: dict[tuple[str, str], int] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    raise _Refused(key, "keys must be plain names, not lists or mappings")
                line = key.start_mark.line + 1
                if (key.tag, key.value) in seen:
                    raise _Refused(
                        key, f"duplicate key {key.value!r} on lines {seen[key.tag, key.value]} and {line}"
                    )
                seen[key.tag, key.value] = line
            return node

    return Loader


def _key_lines(root: Any) -> dict[tuple[str, ...], int]:
    """Line of every mapping key and list item; iterative, each node visited once."""
    import yaml

    lines: dict[tuple[str, ...], int] = {}
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = (*prefix, str(key.value))
                lines.setdefault(path, key.start_mark.line + 1)
                stack.append((value, path))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                path = (*prefix, str(index))
                lines.setdefault(path, item.start_mark.line + 1)
                stack.append((item, path))
    return lines


def load_builtin_or_file(spec: str, directory: Path, field: str, noun: str) -> tuple[Any, str, YamlDocument]:
    """The YAML of a built-in (``spec`` names a file in ``directory``) or of the file at path ``spec``.

    Returns (data, where it came from, the document with its line map); unknown names list the
    built-ins. The caller validates."""
    builtins = sorted(p.stem for p in directory.glob("*.yaml"))
    named = {name.lower(): name for name in builtins}.get(spec.lower())  # names are case-insensitive
    path = directory / f"{named}.yaml" if named else Path(spec)
    if not named and path.suffix not in {".yaml", ".yml"} and os.sep not in spec and not _exists(path):
        import difflib

        close = [name for name in builtins if spec.lower() in name]  # h100 -> h100-ib, h100-nvlink
        close += [
            name
            for name in difflib.get_close_matches(spec.lower(), builtins, n=3, cutoff=0.5)
            if name not in close
        ]
        close = close[:3]
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise InputError(
            field,
            f"unknown {noun} {_shorten(spec)!r}; {hint}built-in: {', '.join(builtins)}, "
            "or a path to a YAML file",
        )
    document = read_yaml(path, field)
    if not isinstance(document.data, dict):
        raise InputError(
            field, f"{path}: expected a mapping of {noun} fields, got {type(document.data).__name__}"
        )
    return document.data, str(path), document


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte: no such file
        return False
