"""Entry point of the ``cp-plan`` console script.

Exit codes (docs/index.md): 0 ok, 1 a check failed, 2 bad input. Bad input is one line on stderr naming
the flag or field and what is accepted; never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

from costmodel.core.text import displayed

PROG = "cp-plan"


def fail(message: str, code: int = 2) -> int:
    # One line whatever the input held, nothing a terminal acts on: a file's key or value, or a flag's text,
    # may carry line breaks, separators (str.splitlines breaks at \x1c-\x1e too) or escapes.
    message = displayed(message).replace("\n", "\\n")
    try:
        sys.stderr.write(f"{PROG}: error: {message}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr closed (2>&-) or full: the exit code still says it
        pass
    return code


def _stdout_failed(exc: BaseException) -> int:
    """Standard output cannot take the answer (a full disk, a closed descriptor, text its encoding lacks):
    one line and exit 2. What is still buffered goes to /dev/null so that the exit's flush stays quiet."""
    if isinstance(exc, UnicodeEncodeError):
        encoding = getattr(sys.stdout, "encoding", None) or exc.encoding
        reason = f"the answer holds {exc.object[exc.start : exc.end]!r}, which {encoding} cannot encode; set PYTHONIOENCODING=utf-8"
    else:
        reason = (getattr(exc, "strerror", None) or str(exc)).rstrip(".") or type(exc).__name__
    _quiet_broken_pipe()
    return fail(f"stdout: cannot write the answer: {reason}")


def _quiet_broken_pipe() -> int:
    """The reader went away (``cp-plan formulas | head -1``): exit 0 without a word. Python would flush
    stdout again at exit and fail once more, so point it at /dev/null first."""

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (tests capture it)
        pass
    return 0


def main(argv: list[str] | None = None, whole: bool = False) -> int:
    """Run the command line; ``whole`` registers every command even where ``argv`` seems to name none.

    ``argv`` None reads this process's own command line (the console script, ``python -m costmodel``), and
    the process ends when main returns. Its start-up (the imports, classes and validators of the command
    line, objects that live to the exit) runs with the garbage collector off: it would walk them some fifty
    times and find little (~10-15 ms, a twentieth of a plan). They are frozen out of it (gc.freeze) and the
    collector is back on before the command runs. What the command built is frozen too at the end, which
    Python would otherwise walk once more at exit (~20 ms, a tenth of a plan). Exit handlers and every object
    freed by its last reference still run; only cycles still held at exit are left to the OS."""
    from costmodel.core.fileio import forget_inputs

    starting = argv is None and gc.isenabled()
    if starting:
        gc.disable()  # until _run has loaded the command line
    forget_inputs()  # the files this run reads, which no output may replace; a test runs many in one process
    try:
        with _stdout_written_whole():
            return _run(argv, whole, starting)
    except KeyboardInterrupt:  # in start-up's imports, before _run's own handler is in place
        return fail("interrupted", 130)
    finally:
        forget_inputs()
        if argv is None:
            gc.freeze()
        if starting:
            gc.enable()


class _WholeWrites(io.RawIOBase):
    """Standard output's descriptor, each write made whole or failed. Python's buffered writer takes a short
    write as done and drops the rest (``ulimit -f 4`` cuts a write at 4 KiB and exit 0 followed); writing
    the rest again gets the reason as an error (EFBIG, ENOSPC, EPIPE), which :func:`_run` reports."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        while view:
            written = os.write(self.fd, view)
            if written == 0:  # no progress and no error: say so rather than loop
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            view = view[written:]
        return size


@contextlib.contextmanager
def _stdout_written_whole() -> Iterator[None]:
    """Standard output through :class:`_WholeWrites` for one run, then as it was. A stream without a
    descriptor (a test's capture) or a closed one is left as it is."""
    before = sys.stdout
    try:
        fd = before.fileno()
        before.flush()
    except (AttributeError, OSError, ValueError):
        yield
        return
    checked = io.TextIOWrapper(
        io.BufferedWriter(_WholeWrites(fd)),
        encoding=getattr(before, "encoding", None) or "utf-8",
        errors=getattr(before, "errors", None) or "strict",
        newline="\n",
        line_buffering=getattr(before, "line_buffering", False),
    )
    sys.stdout = checked
    try:
        yield
    finally:
        sys.stdout = before
        with contextlib.suppress(OSError, ValueError):  # reported already, or after an error that was
            checked.close()  # closes the wrapper, not the descriptor


def _run(argv: list[str] | None, whole: bool, starting: bool = False) -> int:
    """Load the command line and run the command ``argv`` names; ``starting``: the garbage collector is off
    for the start-up (see :func:`main`), and goes back on, the start-up frozen out of it, when the command runs."""
    _without_pydantic_plugins()
    # Lazy: importing any costmodel.cli module runs this package first; only running the CLI needs the rest.
    import typer
    from typer.main import get_command

    from costmodel.cli.app import app, names_a_command, with_subcommands
    from costmodel.cli.options import NOTES
    from costmodel.core.errors import InputError
    from costmodel.core.fileio import Terminated

    NOTES.clear()
    args = sys.argv[1:] if argv is None else list(argv)
    whole = whole or names_a_command(args)
    if sys.stdout is None:  # started with stdout closed (>&-): nowhere to put an answer
        return fail("stdout: closed; redirect it to a file or /dev/null")
    command = get_command(with_subcommands() if whole else app)
    _guard_completion(command)
    if starting:
        gc.freeze()
        gc.enable()
    try:
        result = command.main(args=args, prog_name=PROG, standalone_mode=False)
    except InputError as exc:
        return fail(f"{exc.flag}: {exc.message}")
    except typer.TyperException as exc:  # usage errors: unknown flag, wrong type, bad choice
        if not whole and "No such command" in exc.format_message():  # one of the unregistered ones, misspelt
            return _run(args, whole=True)
        message = exc.format_message().replace("Value error, ", "").replace("\n", " ")
        return fail(message, getattr(exc, "exit_code", 2))
    except (typer.Abort, KeyboardInterrupt):
        return fail("interrupted", 130)
    except Terminated:
        return fail("terminated", 143)
    except (
        OSError,
        ValueError,
        SystemExit,
    ) as exc:  # only a write to stdout gets here: inputs fail as InputError
        return _output_failed(exc)
    return _finish(result)


def _without_pydantic_plugins() -> None:
    """cp-plan uses no pydantic plugins: looking for them reads every installed distribution (0.1-0.2 s), so
    the command line (never the library: a notebook keeps its plugins) turns them off unless the environment
    names some. Off, pydantic's loader would answer "none" all the same, but importing it loads
    importlib.metadata (~10 ms, a twentieth of a plan); a module answering "none" stands in for it."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # Where pydantic imports get_plugins from when it first builds a validator.
    loader = "pydantic.plugin._loader"
    if os.environ["PYDANTIC_DISABLE_PLUGINS"] in ("__all__", "1", "true") and loader not in sys.modules:
        none = types.ModuleType(loader, "pydantic's plugin loader with every plugin off (costmodel.cli)")
        none.get_plugins = tuple  # type: ignore[attr-defined]  # get_plugins() -> (), as pydantic's own when off
        sys.modules[loader] = none


def _guard_completion(command: object) -> None:
    """``--install-completion`` writes the shell's start-up files under HOME: a HOME that is unset, read-only
    or not a folder is bad input, one line naming the flag, not the installer's traceback."""
    from costmodel.core.errors import InputError

    for param in getattr(command, "params", []):
        if param.name != "install_completion" or param.callback is None:
            continue
        install = param.callback

        def guarded(ctx: object, param: object, value: object, install: object = install) -> object:
            try:
                return install(ctx, param, value)  # type: ignore[operator]
            except (OSError, RuntimeError) as exc:
                where = getattr(exc, "filename", None)
                reason = (getattr(exc, "strerror", None) or str(exc)).rstrip(".")
                raise InputError(
                    "--install-completion",
                    f"cannot write under HOME{f' ({where})' if where else ''}: {reason}; set HOME to a "
                    "writable folder, or add the output of --show-completion to your shell's start-up file",
                ) from None

        param.callback = guarded


def _output_failed(exc: BaseException) -> int:
    """A write to stdout failed, directly or under a rich console that exited on it (exit 1 when the reader
    goes); anything else goes on up."""
    cause = exc.__context__ if isinstance(exc, SystemExit) else exc
    if isinstance(cause, BrokenPipeError):
        return _quiet_broken_pipe()
    if isinstance(cause, OSError | ValueError) and _is_stdout_failure(cause):
        return _stdout_failed(cause)
    raise exc


def _finish(result: object) -> int:
    """After the answer: the notes, the flush that shows a broken pipe, and the exit code."""
    _notes()
    try:
        sys.stdout.flush()  # a broken pipe shows here when the output fit in the buffer
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (OSError, ValueError) as exc:
        return _stdout_failed(exc)
    if result == 130:  # click turns Ctrl-C into Exit(130) before we see it
        return fail("interrupted", 130)
    return result if isinstance(result, int) else 0


def _notes() -> None:
    """The notes a command left for after its answer (an error instead would have been the only line)."""
    from costmodel.cli.options import NOTES

    for note in NOTES:
        try:
            sys.stderr.write(note.replace("\n", "\\n") + "\n")
        except (AttributeError, OSError, ValueError):
            break
    NOTES.clear()


def _is_stdout_failure(exc: BaseException) -> bool:
    """A write error of standard output: an encoding error, ENOSPC/EIO/EBADF/EFBIG, a closed file object."""
    if isinstance(exc, UnicodeEncodeError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT, errno.EFBIG)
    return "closed file" in str(exc)


if __name__ == "__main__":
    raise SystemExit(main())
