"""The one error type for bad input: the CLI turns it into one line and exit code 2."""

from __future__ import annotations


class InputError(ValueError):
    """Input the tool cannot accept. ``field`` is the flag or file field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
