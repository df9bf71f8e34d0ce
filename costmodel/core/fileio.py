"""Reading and writing the files the tool touches: YAML in through one hardened safe loader, anything out atomically."""

from __future__ import annotations

import contextlib
import difflib
import errno
import functools
import io
import json
import math
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from costmodel.core.errors import InputError
from costmodel.core.text import displayed, problem_in_value, refused, unsafe_in_raw


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, field: str = "output") -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never half.

    The data goes to a temporary file in the same directory, is flushed to disk, then renamed over
    the target (rename is atomic within one filesystem). Only a regular file or a new path is replaced:
    a symbolic link, a device (``/dev/null``), a FIFO or a folder is refused, so a link is never followed
    nor replaced. On any error, Ctrl-C and SIGTERM included, the temporary file is removed and the target
    is untouched. A destination that cannot be written (a read-only folder, a parent that is a file, a full
    disk), ``-`` or a file this run read (:func:`_not_an_input`) is an :class:`InputError` naming ``field``,
    the flag that chose the path.
    """
    target = _output_path(path, field)
    tmp: str | None = None
    try:
        with _signals_raise():
            existing = _replaceable(target)
            _make_parent(target)
            fd, tmp = _temporary_beside(target)
            # mkstemp makes the file private (0600); give it the target's mode, or what a plain open() would.
            os.fchmod(fd, existing.st_mode & 0o7777 if existing else 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _replaceable(target)  # still not a link or a device: rename replaces the entry, never its target
            os.replace(tmp, target)
            tmp = None
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
    target = _output_path(path, field)
    try:
        _replaceable(target)
        _make_parent(target)
        fd, tmp = _temporary_beside(target)
        os.close(fd)
        os.unlink(tmp)
    except (OSError, ValueError) as exc:
        raise InputError(field, f"cannot write {_shorten(str(target))}: {_reason(exc)}") from None


def check_profile_output(path: str | os.PathLike[str], field: str) -> None:
    """A profile is written as YAML: a name that says otherwise is refused, after what refuses any output
    (``-``, a file this run reads, one that cannot be written)."""
    check_writable(path, field)
    if Path(path).suffix.lower() not in {".yaml", ".yml"}:
        raise InputError(field, f"{_shorten(str(path))}: the profile is YAML; name it .yaml or .yml")


def _output_path(path: str | os.PathLike[str], field: str) -> Path:
    """The target of an output flag, refused when it is ``-`` or a file this run read.

    ``-`` is standard input to every input flag; as an output it would put a file into the command's own
    answer on standard output, so it is refused rather than taken as a file named ``-``."""
    if os.fspath(path) == STDIN:
        raise InputError(
            field,
            "- is not accepted for a file the tool writes (standard output carries the answer); name a file",
        )
    target = Path(path)
    _not_an_input(target, field)
    return target


def _not_an_input(target: Path, field: str) -> None:
    """Refuse to write over a file this run read (``--out T.txt`` given ``T.txt`` as its table): by inode,
    so ``./T.txt``, a symbolic or a hard link to it are caught too. A path that does not exist is new."""
    try:
        info = os.stat(target)
    except (OSError, ValueError):  # a new path, or one the writer itself will refuse with its reason
        return
    read = _inputs_read.get((info.st_dev, info.st_ino))
    if read is not None:
        read_field, name = read
        what = name if read_field == name else f"{read_field} {name}"
        raise InputError(
            field,
            f"{_shorten(os.fspath(target))} is also an input of this command ({what}); writing it would "
            "replace what was read: name another file",
        )


def _temporary_beside(target: Path) -> tuple[int, str]:
    """A new temporary file in the target's folder, so that the rename over the target is atomic. Its name
    is short and its own, not the target's with more around it: a target may take all 255 bytes a name may."""
    import tempfile  # here: only a write needs it, and the plan command writes no file

    return tempfile.mkstemp(prefix=".cp-plan-", suffix=".tmp", dir=target.parent)


class Terminated(BaseException):
    """SIGTERM arrived while a file was being written (its temporary file is removed on the way out)."""


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` and SIGINT ``KeyboardInterrupt`` while a file is written, so the
    writer's cleanup runs; the handlers before are restored after (signals only reach the main thread)."""

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, terminate), signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


def _replaceable(target: Path) -> os.stat_result | None:
    """The target's own status (a link not followed), None for a new path; anything but a regular file
    is refused."""
    try:
        info = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):  # a new path; a file on the way is named by mkdir
        return None
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    if not stat.S_ISREG(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else _what(info.st_mode)
        raise ValueError(f"it is {kind}; only a regular file or a new path is replaced")
    return info


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


@dataclass(frozen=True)
class Kind:
    """One kind of input file: what it is called in messages and the bounds it is read under."""

    noun: str
    max_bytes: int
    max_depth: int = 64  # nested objects and lists (JSON, TOML; YAML has its own)
    max_lines: int | None = (
        None  # files read line by line: work is per line, and a byte bound allows 64M of them
    )


KINDS = {
    "yaml": Kind("YAML file", MAX_YAML_BYTES, MAX_YAML_DEPTH),
    "json": Kind("config.json", 1 << 20),  # a Hugging Face config is a few kilobytes
    "toml": Kind("TOML file", 1 << 20),  # a training config is a few kilobytes
    "docs": Kind("document-length file", 16 << 20),  # a million lengths in CSV or JSON
    "log": Kind("training log", 64 << 20, max_lines=1 << 20),  # parsed in a few seconds
    "flags": Kind("launch script or flag file", 1 << 20),
    "nccl": Kind("nccl-tests output", 1 << 20),  # a table is a few kilobytes
    "runs": Kind("runs table", 1 << 20),  # 2,000 runs (runs.MAX_ROWS) of a few hundred bytes
    "timings": Kind("kernel timings table", 16 << 20),  # 100,000 rows (kernel_fit.MAX_ROWS) of ~60 bytes
}
STDIN = "-"
_stdin_read: tuple[str, bytes] | None = None  # (field, bytes): standard input is read once, then kept
# (st_dev, st_ino) -> (field, name) of every file read in this run: the writer never replaces one of them.
_inputs_read: dict[tuple[int, int], tuple[str, str]] = {}


def forget_inputs() -> None:
    """Start a new run's record of the files it read (the command line does so each time it starts)."""
    _inputs_read.clear()


def _remember_input(info: os.stat_result, field: str, name: str) -> None:
    _inputs_read.setdefault((info.st_dev, info.st_ino), (field, name))


class FileInputError(InputError):
    """An input file that cannot be read: ``problem`` at ``line`` (None: the whole file) of ``path``."""

    def __init__(self, field: str, path: str, line: int | None, problem: str) -> None:
        super().__init__(field, f"{path}{'' if line is None else f':{line}'}: {problem}")
        self.path, self.line, self.problem = path, line, problem


YamlInputError = FileInputError  # the name the plan checker knows


def open_input(path: str | os.PathLike[str], field: str, kind: str) -> BinaryIO:
    """A binary stream of one input file, refused unless it can be read whole in bounded time.

    Only a regular file is opened (a FIFO would block for ever, a device such as /dev/zero never ends),
    or ``-``: standard input, read once, up to the kind's size cap, into memory. A file over the cap
    (:data:`KINDS`) is refused before it is read. Every refusal is one :class:`FileInputError`."""
    name = os.fspath(path)
    bound = KINDS[kind]
    shown = _shorten(name)

    def refuse(problem: str) -> FileInputError:
        return FileInputError(field, shown, None, problem)

    if not name.strip():
        raise FileInputError(field, repr(name), None, f"an empty path; give the path of a {bound.noun}")
    too_big = f"larger than {_size(bound.max_bytes)}, the bound for a {bound.noun}"
    if name == STDIN:
        return io.BytesIO(_stdin(field, kind, refuse, too_big))
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; cleared again for a regular file.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise refuse("file not found") from None
    except IsADirectoryError:
        raise refuse(f"is a directory, expected a {bound.noun}") from None
    except PermissionError:
        raise refuse("permission denied") from None
    except (OSError, ValueError) as exc:  # name too long, a loop of links, a NUL in the name, ...
        raise refuse(f"cannot read: {_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise refuse(f"is a directory, expected a {bound.noun}")
        if not stat.S_ISREG(info.st_mode):
            raise refuse(f"is {_what(info.st_mode)}, not a regular file (- reads standard input)")
        if info.st_size > bound.max_bytes:
            raise refuse(too_big)
        os.set_blocking(fd, True)
        _remember_input(info, field, shown)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _stdin(field: str, kind: str, refuse: Any, too_big: str) -> bytes:
    """Standard input, read once up to the kind's bound; a second read for the same flag gets the same
    bytes (a command may load its profile twice), another flag is refused (one stream, one file)."""
    global _stdin_read
    if _stdin_read is not None:
        if _stdin_read[0] != field:
            raise refuse(f"standard input (-) is already read for {_stdin_read[0]}; name a file here")
        return _stdin_read[1]
    stream = sys.stdin.buffer if sys.stdin is not None else None
    if stream is None:
        raise refuse("standard input is closed")
    try:
        raw = stream.read(KINDS[kind].max_bytes + 1)
    except (OSError, ValueError) as exc:
        raise refuse(f"cannot read standard input: {_reason(exc)}") from None
    if len(raw) > KINDS[kind].max_bytes:
        raise refuse(too_big)
    _stdin_read = (field, raw)
    with contextlib.suppress(OSError, ValueError):  # standard input redirected from a file (< T.txt)
        _remember_input(os.fstat(stream.fileno()), field, "standard input")
    return raw


def read_input(path: str | os.PathLike[str], field: str, kind: str) -> bytes:
    """The bytes of one input file (:func:`open_input`), at most the kind's size cap."""
    bound = KINDS[kind]
    with open_input(path, field, kind) as handle:
        try:
            raw = handle.read(bound.max_bytes + 1)
        except OSError as exc:
            raise FileInputError(
                field, _shorten(os.fspath(path)), None, f"cannot read: {_reason(exc)}"
            ) from None
    if len(raw) > bound.max_bytes:  # the file grew while it was read
        raise FileInputError(
            field,
            _shorten(os.fspath(path)),
            None,
            f"larger than {_size(bound.max_bytes)}, the bound for a {bound.noun}",
        )
    return raw


def read_input_text(path: str | os.PathLike[str], field: str, kind: str) -> str:
    """:func:`read_input` decoded as UTF-8; anything else, and text holding a control character or a line
    separator (:mod:`costmodel.core.text`), is refused with its line and column."""
    raw = read_input(path, field, kind)
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark some editors write first
    except UnicodeDecodeError:
        raise FileInputError(field, _shorten(os.fspath(path)), None, "not a UTF-8 text file") from None
    check_raw_text(text, field, _shorten(os.fspath(path)))
    return text


def check_raw_text(text: str, field: str, name: str, line_offset: int = 0) -> None:
    """Refuse ``text`` of the file ``name`` holding a control character (tab, LF and CR aside) or a Unicode
    line separator, naming its line and column: before parsing, so a line break no editor shows never
    hides a key, and no byte of the file reaches the terminal as an escape."""
    found = unsafe_in_raw(text)
    if found is not None:
        line, column, char = found
        raise FileInputError(
            field,
            name,
            line + line_offset,
            f"column {column}: {refused(char)}; control characters and line separators are not accepted",
        )


def check_strings(data: Any, field: str, name: str) -> None:
    """Refuse a parsed key or string value holding a control character (tab and LF aside) or a line
    separator, naming its key: what a JSON or TOML escape (``\\u001b``) wrote, which the raw text did not
    show."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{key}" if where else str(key)
                if (problem := problem_in_value(str(key))) is not None:
                    raise FileInputError(field, name, None, f"key {displayed(path)!r}: {problem}")
                stack.append((path, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        elif isinstance(value, str) and (problem := problem_in_value(value)) is not None:
            raise FileInputError(field, name, None, f"{displayed(where) or 'value'}: {problem}")


def read_json(path: str | os.PathLike[str], field: str, kind: str = "json") -> Any:
    """One JSON document, read as strictly as YAML is: duplicate keys, ``NaN`` and ``Infinity``, nesting
    past the kind's depth and integers of more digits than Python converts are refused, naming the file."""
    return parse_json(read_input_text(path, field, kind), field, _shorten(os.fspath(path)), kind)


def parse_json(text: str, field: str, name: str, kind: str = "json") -> Any:
    """:func:`read_json` of text already read from the file ``name``."""

    depth = KINDS[kind].max_depth
    if _nesting(text) > depth:  # before parsing: the decoder recurses once per level
        raise FileInputError(field, name, None, f"nested deeper than {depth} levels")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                raise _Refused(
                    None, f"duplicate key {_short_key(key)}; JSON would silently keep the last one"
                )
            seen[key] = value
        return seen

    def constant(word: str) -> Any:
        raise _Refused(None, f"{word} is not a number JSON allows; numbers must be finite")

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except _Refused as exc:
        raise FileInputError(field, name, None, exc.message) from None
    except json.JSONDecodeError as exc:
        raise FileInputError(
            field, name, exc.lineno, f"malformed JSON (column {exc.colno}): {exc.msg}"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of more than 4,300 digits
        raise FileInputError(field, name, None, f"unreadable value: {str(exc).splitlines()[0]}") from None
    check_strings(data, field, name)
    return data


def read_toml(path: str | os.PathLike[str], field: str) -> dict[str, Any]:
    """One TOML document: nesting past 64 levels, ``inf`` and ``nan`` are refused, naming the file."""
    import tomllib

    name = _shorten(os.fspath(path))
    text = read_input_text(path, field, "toml")
    depth = KINDS["toml"].max_depth
    if _nesting(text) > depth:
        raise FileInputError(field, name, None, f"nested deeper than {depth} levels")
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:
        raise FileInputError(
            field, name, None, f"not a readable TOML file: {str(exc).splitlines()[0]}"
        ) from None
    for where, value in _leaves(data):
        if isinstance(value, float) and not math.isfinite(value):
            raise FileInputError(field, name, None, f"{where}: {value} is not a finite number")
    check_strings(data, field, name)
    return data


def _leaves(data: Any) -> Iterator[tuple[str, Any]]:
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))
        else:
            yield where, value


def _nesting(text: str) -> int:
    """The deepest nesting of brackets and braces outside quoted strings (JSON and TOML alike)."""

    import numpy as np

    bare = re.sub(r'"(?:[^"\\\n]|\\.)*"' + r"|'[^'\n]*'", "", text)  # strings may hold brackets
    codes = np.frombuffer(bare.encode("utf-8"), dtype=np.uint8)
    steps = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64)) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def _short_key(key: str) -> str:
    text = repr(key)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _what(mode: int) -> str:
    for test, word in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def read_yaml(path: str | os.PathLike[str], field: str) -> YamlDocument:
    """Read one YAML document with the safe loader, hardened against hostile files.

    Refused, each as one :class:`YamlInputError` naming ``field`` (a flag such as ``--hw``) and the
    file: anything :func:`open_input` refuses (not a regular file, over :data:`MAX_YAML_BYTES`),
    nesting deeper than :data:`MAX_YAML_DEPTH`, anchors and aliases (an alias bomb expands a few
    hundred bytes into gigabytes), duplicate keys (YAML would keep the last one silently), Python
    tags and text that is not UTF-8. Numbers follow YAML 1.2's core schema: ``020000`` is twenty
    thousand and ``2:16:32`` is text, not YAML 1.1's octal and base 60.
    """
    name = os.fspath(path)
    text = read_input_text(name, field, "yaml")
    import yaml

    loader = None
    try:
        loader = _hardened_loader()(text)  # checks the characters already
        node = loader.get_single_node()
        _check_scalar(node, "value")
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise YamlInputError(field, name, exc.line, exc.message) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlInputError(
            field, name, mark.line + 1 if mark else None, f"malformed YAML: {problem}"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return YamlDocument(data, _key_lines(node) if node is not None else {})


def load_yaml(path: str | os.PathLike[str], field: str) -> Any:
    """The data of :func:`read_yaml`, without the line map."""
    return read_yaml(path, field).data


def _shorten(name: str, limit: int = 80) -> str:
    """A long name cut in its middle: the file's own name, at the end, is what the reader looks for."""
    if len(name) <= limit:
        return name
    tail = (limit - 3) * 2 // 3
    return f"{name[: limit - 3 - tail]}...{name[-tail:]}"


class _Refused(Exception):
    def __init__(self, node_or_event: Any, message: str) -> None:
        super().__init__(message)
        self.line = node_or_event.start_mark.line + 1 if node_or_event is not None else None
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
            for key, value in node.value:
                _check_key(key)
                line = key.start_mark.line + 1
                if (key.tag, key.value) in seen:
                    raise _Refused(
                        key, f"duplicate key {key.value!r} on lines {seen[key.tag, key.value]} and {line}"
                    )
                seen[key.tag, key.value] = line
                _check_scalar(key, "key")
                _check_scalar(value, displayed(key.value))
            return node

        def compose_sequence_node(self, anchor: Any) -> Any:
            node = super().compose_sequence_node(anchor)
            for index, item in enumerate(node.value):
                _check_scalar(item, f"item {index}")
            return node

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep)
            except (AttributeError, KeyError, TypeError, IndexError, ValueError, OverflowError) as exc:
                raise _Refused(node, _unconstructed(node, exc)) from None

    _core_schema_numbers(Loader)
    _no_merge_keys(Loader)
    return Loader


def _check_key(key: Any) -> None:
    """A mapping's key is a name: not a list or mapping, nor what YAML reads as null or a boolean (``null:``,
    ``yes:``), which would reach a model as None or True."""
    import yaml

    if not isinstance(key, yaml.ScalarNode):
        raise _Refused(key, "keys must be plain names, not lists or mappings")
    if key.tag.endswith((":null", ":bool")):
        shown = repr(displayed(key.value)) if key.value else "an empty key"
        read = "null" if key.tag.endswith(":null") else "a boolean"
        raise _Refused(key, f"{shown} is read as {read}, not a name: quote a key that is one")


def _unconstructed(node: Any, exc: Exception) -> str:
    """Why a node's value cannot be built: a standard tag on text it cannot read (``!!bool maybe``,
    ``!!timestamp abc``: PyYAML's constructors fail there with Python's own errors, not a YAMLError), or a
    number Python does not convert (``!!int abc``, an integer of more digits than it reads)."""
    if not isinstance(exc, ValueError | OverflowError):
        value = f"{_short_key(node.value)} " if isinstance(node.value, str) else ""
        return f"{value}cannot be read as the tag !!{node.tag.rsplit(':', 1)[-1]} says"
    if "Exceeds the limit" in str(exc):  # Python's own advice (sys.set_int_max_str_digits) is not the user's
        digits = sys.get_int_max_str_digits()
        return f"unreadable value: a number of {len(node.value):,} characters; at most {digits:,} digits are read"
    return f"unreadable value: {str(exc).splitlines()[0]}"


def _check_scalar(node: Any, where: str) -> None:
    """Refuse a scalar holding what a YAML escape (``"\\e[2J"``, ``"\\u2028"``) wrote and the raw text
    check never saw: a control character or a line separator."""
    value = getattr(node, "value", None)
    if isinstance(value, str) and (problem := problem_in_value(value)) is not None:
        raise _Refused(node, f"{where}: {problem}")


def _no_merge_keys(loader: type) -> None:
    """Refuse YAML 1.1's merge key (``<<: {seq: 1M}``): its keys are overridden silently by the mapping's own,
    so a duplicate the loader refuses elsewhere would hide behind it. YAML 1.2 has no merge key."""

    flatten = loader.flatten_mapping  # type: ignore[attr-defined]

    def flatten_mapping(self: Any, node: Any) -> None:
        for key, _ in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                raise _Refused(key, "merge keys (<<) are not accepted; write the keys out")
        flatten(self, node)

    loader.flatten_mapping = flatten_mapping  # type: ignore[attr-defined]


# YAML 1.2's core schema [YAML-1.2 §10.3.2]: decimal integers (leading zeros are decimal), 0o octal and
# 0x hexadecimal; no 1.1 base 60 (2:16:32) or 0-prefixed octal, which read plausible lengths as others.
_INT_12 = r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"
_FLOAT_12 = r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"


def _core_schema_numbers(loader: type) -> None:
    int_tag, float_tag = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
    loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (int_tag, float_tag)]
        for first, resolvers in loader.yaml_implicit_resolvers.items()
    }
    loader.add_implicit_resolver(int_tag, re.compile(_INT_12), list("-+0123456789"))
    loader.add_implicit_resolver(float_tag, re.compile(_FLOAT_12), list("-+.0123456789"))

    def construct_int(self: Any, node: Any) -> int:
        text = str(self.construct_scalar(node))
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text, 10)  # an explicit !!int of another form is refused as unreadable

    loader.add_constructor(int_tag, construct_int)


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


def not_a_mapping(data: object, noun: str) -> str:
    """Why a YAML document that should map ``noun`` fields does not, in the user's words."""
    held = {type(None): "an empty document", list: "a list", str: "a single string"}.get(
        type(data), f"a single {type(data).__name__} value"
    )
    return f"expected a mapping of {noun} fields (key: value lines), got {held}"


def builtin_path(spec: str, directory: Path) -> Path | None:
    """The built-in file in ``directory`` that ``spec`` names (names are case-insensitive), or None."""
    return {p.stem.lower(): p for p in directory.glob("*.yaml")}.get(spec.lower())


def load_builtin_or_file(spec: str, directory: Path, field: str, noun: str) -> tuple[Any, str, YamlDocument]:
    """The YAML of a built-in (``spec`` names a file in ``directory``) or of the file at path ``spec``.

    Returns (data, where it came from, the document with its line map); unknown names list the
    built-ins. The caller validates."""
    builtins = sorted(p.stem for p in directory.glob("*.yaml"))
    if not spec.strip():  # Path("") is the working directory
        raise InputError(
            field,
            f"an empty name; give one of the built-in {noun} names ({', '.join(builtins)}) or a YAML file's path",
        )
    named = builtin_path(spec, directory)
    path = named or Path(spec)
    if (
        not named
        and spec != STDIN
        and path.suffix not in {".yaml", ".yml"}
        and os.sep not in spec
        and not _exists(path)
    ):
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
        raise InputError(field, f"{path}: {not_a_mapping(document.data, noun)}")
    return document.data, str(path), document


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte: no such file
        return False
