"""The one error type for bad input: the CLI turns it into one line and exit code 2."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable

from pydantic import BaseModel


class InputError(ValueError):
    """Input the tool cannot accept. ``field`` is the flag or file field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    @property
    def flag(self) -> str:
        """The field as the user wrote it: ``kv_heads`` -> ``--kv-heads``; a flag or a path stays as it is."""
        return (
            "--" + self.field.replace("_", "-") if re.fullmatch(r"[a-z][a-z_]*", self.field) else self.field
        )


# A field's pattern in words: a regular expression is no answer to "what is accepted".
PATTERNS = {
    r"^[a-z0-9][a-z0-9-]{0,39}$": "a name of 1 to 40 lower-case letters, digits and hyphens (e.g. sdpa-cudnn)",
    r"^[^\n]*$": "one line (no line break)",
}


def pattern_in_words(error: dict) -> str | None:
    """A pydantic pattern mismatch as what is accepted, where the pattern is one :data:`PATTERNS` words."""
    if error["type"] == "string_pattern_mismatch" and error["ctx"]["pattern"] in PATTERNS:
        return f"must be {PATTERNS[error['ctx']['pattern']]}"
    return None


def validation_problems(exc: object, model: type | None = None) -> list[tuple[tuple[str, ...], str]]:
    """Every problem of a pydantic ``ValidationError`` as (location, text), unknown keys first.

    An unknown key is usually a misspelt known one (``sequence:`` for ``seq:``), so it is named as
    unknown before the "Field required" it causes, with the nearest key of its place in ``model`` (the model
    validated) where one is close."""
    problems = []
    errors = exc.errors()  # type: ignore[attr-defined]
    # a key missing beside an unknown one is the likeliest it stands for (sequence: for seq:)
    missing = [e["loc"] for e in errors if e["type"] == "missing" and e["loc"]]
    unknown = 0
    for error in errors:
        loc = tuple(_key(part) for part in error["loc"])
        if error["type"] == "extra_forbidden" and loc:
            place, near = error["loc"][:-1], None
            if unknown < MAX_PROBLEMS:  # only the ones a line names: unknown keys lead it
                near = _nearest(loc[-1], [str(m[-1]) for m in missing if m[:-1] == place], 0.5) or _nearest(
                    loc[-1], _keys_at(model, place), 0.8
                )
            unknown += 1
            problems.append((0, loc, "unknown key" + (f"; did you mean {near}" if near else "")))
            continue
        msg = pattern_in_words(error) or error["msg"].removeprefix("Value error, ")
        got = error.get("input")
        shown = "" if isinstance(got, dict | list) or error["type"] == "missing" else f" (got {_short(got)})"
        problems.append((1, loc, f"{msg}{shown}"))
    return [(loc, text) for _, loc, text in sorted(problems, key=lambda p: p[0])]


# What each kind of YAML input holds at its top, and where it goes: a file of one kind given where another is
# asked would otherwise get a line of every key it lacks and every key it has.
KINDS = {
    "hardware profile": (("device", "links"), "--hw"),
    "framework profile": (("memory", "time"), "--framework"),
    "model preset": (("heads", "layers"), "--model"),
    "capacity plan": (("expect",), "cp-plan check"),
}


def another_kind(data: object, expected: str) -> str | None:
    """What ``data`` is, where it is not ``expected`` (a key of :data:`KINDS`) but plainly another kind."""
    if not isinstance(data, dict):
        return None
    for kind, (keys, where) in KINDS.items():
        if kind != expected and all(key in data for key in keys):
            return f"a {kind} ({', '.join(keys)} at its top), not a {expected}: give it to {where}"
    return None


# Problems one line names: a file that is not what was asked (any text file given as a profile) would
# otherwise echo every line of it back as an unknown key.
MAX_PROBLEMS = 5


def describe_validation(
    exc: object, line: Callable[..., int] | None = None, model: type | None = None
) -> str:
    """One line for a pydantic ``ValidationError``: each field's dotted path and problem, ``; ``-separated,
    each after its line in the file when ``line(*location)`` gives it; the first few, and how many more.
    ``model``, the model validated, names the nearest key to an unknown one."""
    problems = validation_problems(exc, model)
    shown = "; ".join(
        (f"line {line(*loc)}: " if line and loc else "") + (f"{'.'.join(loc)}: " if loc else "") + text
        for loc, text in problems[:MAX_PROBLEMS]
    )
    more = more_problems(len(problems))
    return shown + (f"; {more}" if more else "")


def more_problems(total: int) -> str | None:
    """What a line naming the first :data:`MAX_PROBLEMS` of ``total`` problems says of the rest, if any."""
    more = total - MAX_PROBLEMS
    return f"and {more} more problem{'s' if more > 1 else ''}" if more > 0 else None


def _keys_at(model: type | None, path: tuple[object, ...]) -> list[str]:
    """The keys a mapping at ``path`` inside ``model`` accepts (its fields' names and aliases), following
    nested models through lists, dicts and optionals; none where the path leaves the models."""

    def models_in(annotation: object) -> list[type]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models_in(arg)]

    for part in path:
        if model is None:
            return []
        if not isinstance(part, str):  # an item of a list or a dict's value: the same model's items
            continue
        fields = model.model_fields  # type: ignore[attr-defined]
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return []
        inner = models_in(field.annotation)
        model = inner[0] if inner else None
    if model is None:
        return []
    fields = model.model_fields  # type: ignore[attr-defined]
    return [*fields, *(f.alias for f in fields.values() if f.alias)]


def _nearest(key: str, known: list[str], cutoff: float) -> str | None:
    close = difflib.get_close_matches(key, known, n=1, cutoff=cutoff)
    return close[0] if close else None


def _short(value: object, limit: int = 60) -> str:
    """``repr`` cut to one short line: a hostile file can hold a megabyte string or control characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _key(part: object) -> str:
    text = str(part)
    return text if text.isprintable() and len(text) <= 60 else _short(text)
