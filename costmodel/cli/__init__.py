"""Entry point of the ``cp-plan`` console script.

Exit codes (docs/index.md): 0 ok, 1 a check failed, 2 bad input. Bad input is one line on stderr naming
the flag or field and what is accepted; never a traceback.
"""

from __future__ import annotations

import re
import sys

PROG = "cp-plan"


def _flag(field: str) -> str:
    """``kv_heads`` -> ``--kv-heads``; anything already flag- or path-like stays as it is."""
    return "--" + field.replace("_", "-") if re.fullmatch(r"[a-z][a-z_]*", field) else field


def fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return code


def main(argv: list[str] | None = None) -> int:
    import typer
    from typer.main import get_command

    from costmodel.cli.app import app
    from costmodel.core.errors import InputError

    command = get_command(app)
    try:
        result = command.main(args=argv, prog_name=PROG, standalone_mode=False)
    except InputError as exc:
        return fail(f"{_flag(exc.field)}: {exc.message}")
    except typer.TyperException as exc:  # usage errors: unknown flag, wrong type, bad choice
        message = exc.format_message().replace("Value error, ", "").replace("\n", " ")
        return fail(message, getattr(exc, "exit_code", 2))
    except (typer.Abort, KeyboardInterrupt):
        return fail("interrupted", 130)
    except BrokenPipeError:
        return 0
    if result == 130:  # click turns Ctrl-C into Exit(130) before we see it
        return fail("interrupted", 130)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
