"""The one error type for bad input: the CLI turns it into one line and exit code 2."""

from __future__ import annotations


class InputError(ValueError):
    """Input the tool cannot accept. ``field`` is the flag or file field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def describe_validation(exc: object) -> str:
    """One line for a pydantic ``ValidationError``: the first field's dotted path and problem."""
    errors = exc.errors()  # type: ignore[attr-defined]
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) or first["type"] == "missing" else f" (got {got!r})"
    more = len(errors) - 1
    return (f"{loc}: " if loc else "") + f"{msg}{shown}" + (f" (and {more} more)" if more else "")
