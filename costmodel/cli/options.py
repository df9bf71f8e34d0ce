"""Command-line flags built from the declared inputs (:mod:`costmodel.plans.inputs`), and shared helpers.

A command asks for the models it needs (``@declared(inputs=PlanInputs, setup=TrainingSetup)``) and
receives them built and validated; every flag, its type, default, help and range come from the
model's field. Nothing here restates a flag.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import typer
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from costmodel.core.errors import InputError
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.core.units import parse_budget, parse_integer, parse_number, parse_tokens
from costmodel.plans.inputs import build, flag_name, shape_from_model
from costmodel.plans.models import load_model

if TYPE_CHECKING:
    from rich.console import Console


HELP_FLAGS = {"help_option_names": ["-h", "--help"]}  # -h too, on every command (subcommands inherit it)
# Piped or redirected, a table is as wide as its content up to this (rich would cut it at 80 columns and wrap
# or clip file names); COLUMNS still sets the width, as on a terminal.
PIPED_WIDTH = 200


def console(stderr: bool = False) -> Console:
    """rich is imported only when a screen is drawn. Piped or redirected, rich pads table and grid rows
    to the width with spaces: the lines go out trimmed, as a file or a diff wants them.

    Text is shown as it is written: no markup, no emoji codes, no highlighting. A label, a path or a name
    read from a file (``[red]x[/red]``, ``[link=...]``, ``:skull:``) is shown literally, never read as
    style; the tool's own colours are :class:`rich.text.Text` with a ``style``."""

    from rich.console import Console

    plain = {"highlight": False, "markup": False, "emoji": False}
    out = sys.stderr if stderr else sys.stdout
    if out.isatty():
        return Console(stderr=stderr, **plain)
    return Console(stderr=stderr, file=_Trimmed(out), width=_piped_width(), **plain)


def _piped_width() -> int:
    """COLUMNS when set to a width, else :data:`PIPED_WIDTH`."""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isascii() and text.isdigit() and 20 <= int(text) <= 10_000 else PIPED_WIDTH


@contextlib.contextmanager
def working(what: str, stream: Any = None) -> Iterator[None]:
    """Progress of a command that runs for many seconds while its ranks work in other processes: on a
    terminal, ``cp-plan: {what}... 12 s`` on stderr, counting every second, then how long it took;
    nothing when stderr is a pipe or a file (a CI log keeps only the result)."""

    out = stream or sys.stderr
    if not out.isatty() or os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 speaks
        yield
        return
    start, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(1.0):
            out.write(f"\rcp-plan: {what}... {time.monotonic() - start:.0f} s")
            out.flush()

    out.write(f"cp-plan: {what}...")
    out.flush()
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        out.write(f"\rcp-plan: {what}: {time.monotonic() - start:.1f} s\n")
        out.flush()


class _Trimmed:
    """A text stream that drops the spaces ending each line it passes on (held until the line goes on)."""

    def __init__(self, out: Any) -> None:
        self.out, self.held = out, ""

    def write(self, text: str) -> int:
        *lines, last = (self.held + text).split("\n")
        kept = last.rstrip(" ")
        self.held = last[len(kept) :]
        self.out.write("".join(line.rstrip(" ") + "\n" for line in lines) + kept)
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.out, "encoding", None) or "utf-8"


def house_table(**options: Any) -> Any:
    """A rich Table in the house style (a rule under the header, no outer edge, bold left titles);
    ``options`` adds columns' padding, a title or a caption."""
    from rich import box
    from rich.table import Table

    style = {"box": box.SIMPLE_HEAD, "pad_edge": False, "show_edge": False}
    return Table(
        **style | {"title_justify": "left", "title_style": "bold", "caption_justify": "left"} | options
    )


def _parser(parse: Callable[[str, str], int], field: str) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            return parse(text, field)
        except InputError as exc:
            raise typer.BadParameter(exc.message) from None

    return convert


def whole(*names: str, low: int, high: int, help: str) -> Any:
    """A command's own integer flag, read as every declared one is (:func:`parse_integer`: ASCII digits,
    exactly; ``1_0``, ``+1`` and ``٣`` refused) and held to [low, high], which its help shows."""
    read = _parser(parse_integer, names[0])

    def convert(text: str) -> int:
        value = read(text)
        if not low <= value <= high:
            raise typer.BadParameter(f"{value} is not in [{low:,}, {high:,}]")
        return value

    return typer.Option(*names, parser=convert, help=f"{help} [{low:,}..{high:,}]")


def decimal(*names: str, help: str) -> Any:
    """A command's own number flag, read as every declared one is (:func:`parse_number`: a finite decimal;
    ``1_0``, ``nan`` and ``inf`` refused); the command checks its range."""
    return typer.Option(*names, parser=_parser(parse_number, names[0]), help=help)


def _base_type(annotation: Any) -> Any:
    """int for ``Annotated[int, ...]``; the inner type of ``X | None``."""
    if typing.get_origin(annotation) is Annotated:
        return _base_type(typing.get_args(annotation)[0])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if type(None) in typing.get_args(annotation) and len(args) == 1:
        return _base_type(args[0])
    return annotation


def _range(info: FieldInfo) -> str:
    bounds = {}
    for item in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(item, key, None) is not None:
                bounds[key] = getattr(item, key)
    low = f"{bounds['ge']:,}" if "ge" in bounds else None
    high = f"{bounds['le']:,}" if "le" in bounds else None
    return f" [{low}..{high}]" if low is not None and high is not None and bounds["le"] >= 1024 else ""


def _parameter(model: type[BaseModel], name: str, info: FieldInfo, default: Any) -> inspect.Parameter:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    names = [flag_name(model, name), *extra.get("aliases", ())] + (
        [extra["short"]] if extra.get("short") else []
    )
    base = _base_type(info.annotation)
    help_text = (info.description or "") + _range(info)
    option: dict[str, Any] = {"help": help_text}
    if base is int or (
        typing.get_origin(base) is Literal and all(isinstance(a, int) for a in typing.get_args(base))
    ):
        option["parser"] = _parser(parse_tokens if extra.get("tokens") else parse_integer, name)
        base = int
    elif base is float:  # one reading of a number for every flag: typer's float() takes "0_1" and "nan"
        option["parser"] = _parser(parse_number, name)
    if base is bool:
        names = [f"{names[0]}/--no-{names[0][2:]}"]
    if extra.get("from_model") or extra.get("fitted"):
        shown = extra.get("fitted") or f"{info.default} or the model's"
        option["help"] = f"{help_text} [default: {shown}]"
        option["show_default"] = False
        default = None
    if default is PydanticUndefined:  # a required input: the flag must be given
        default = inspect.Parameter.empty
    if default is None:
        base = Optional[base]  # noqa: UP045 - typer reads Optional
    annotation = Annotated[base, typer.Option(*names, **option)]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def searched(model: type[BaseModel], name: str, default: str, names: tuple[str, ...] = ()) -> Any:
    """The flag of a declared field that a search fills when it is absent: the field's type, help and
    range, ``None`` by default and checked against the field when given. ``default`` says what the
    command does without it; ``names`` replaces the field's flag names."""
    info = model.model_fields[name]
    base, option = typing.get_args(_parameter(model, name, info, None).annotation)
    option.help = f"{info.description} [default: {default}]"
    if names:  # typer keeps the first name where a default would go
        option.default, option.param_decls = names[0], names[1:]
    base_type = _base_type(info.annotation)

    def check(value: Any) -> Any:
        if value is None:
            return None
        field = TypeAdapter(Annotated[base_type, *info.metadata] if info.metadata else base_type)
        try:
            return field.validate_python(value)
        except ValidationError as exc:
            raise typer.BadParameter(exc.errors()[0]["msg"]) from None

    option.callback = check
    return Annotated[base, option]


CONTEXT = "cli_context"  # the click context a declared command receives, to tell given flags from defaults


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave flag ``name`` (its value may equal the default) rather than left it."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def declared(
    defaults: dict[str, Any] | None = None,
    exclude: Iterable[str] = (),
    only: Iterable[str] | Mapping[str, Iterable[str]] | None = None,
    **models: type[BaseModel],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one flag per field of each model, and call it with the models built.

    ``defaults`` replaces declared defaults for this command (training commands default to causal
    fwd+bwd), and gives an excluded field the value the command sets itself: a value, or a function of the
    flags (the models' and the command's own, by name) that returns it. ``exclude`` and ``only`` pick fields,
    ``only`` per model when a mapping from the models' names (a model it does not name gives every field).
    The command's own parameters come after."""
    defaults, exclude = defaults or {}, set(exclude)
    wanted = {
        key: None
        if only is None
        else set(only.get(key, model.model_fields) if isinstance(only, Mapping) else only)
        for key, model in models.items()
    }

    def fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
        picked = wanted[next(key for key, m in models.items() if m is model)]
        return [
            (name, info)
            for name, info in model.model_fields.items()
            if name not in exclude and (picked is None or name in picked)
        ]

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.name not in models
        ]
        params = [
            _parameter(model, name, info, defaults.get(name, info.default))
            for model in models.values()
            for name, info in fields(model)
        ]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            ctx: typer.Context = kwargs.pop(CONTEXT) if context == CONTEXT else kwargs[context]
            if all(_given(ctx, name) for name in ("cp_scheme", "layout")):  # defaults are not refused
                from costmodel.plans import cp as registry  # the schemes' modules: only when both are given

                registry.refuse_fixed_layout(kwargs["cp_scheme"], kwargs["layout"])
            built = {}
            flags = dict(kwargs)  # every flag by name, for the excluded fields a command sets from them
            for key, model in models.items():
                values = {name: kwargs.pop(name) for name, _ in fields(model)}
                if str(values.get("model") or "").endswith(".json"):
                    _note_unmapped(values["model"])
                if any(_from_model(info) for _, info in fields(model)):
                    values = shape_from_model(values)
                built[key] = build(
                    model, **{k: v for k, v in values.items() if v is not None} | _fixed(model, flags)
                )
            return command(**built, **kwargs)

        # typer passes its context to one parameter: the command's own, else one added here
        context = next((p.name for p in own if p.annotation is typer.Context), CONTEXT)
        if context == CONTEXT:
            own.append(inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        run.__signature__ = inspect.Signature(params + own)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params + own}
        return run

    def _fixed(model: type[BaseModel], flags: dict[str, Any]) -> dict[str, Any]:
        """The excluded fields the command sets itself, at ``flags``."""
        return {
            k: v(flags) if callable(v) else v
            for k, v in defaults.items()
            if k in model.model_fields and k in exclude
        }

    return wrap


def _note_unmapped(path: str) -> None:
    """One line on stderr naming what a Hugging Face config holds that the plan does not use."""

    unmapped: list[str] = []
    load_model(path, unmapped=unmapped)
    if unmapped:  # said once the command has answered: an error after it stays the only line
        NOTES.append(f"cp-plan: note: --model {path}: not used by the cost model: {'; '.join(unmapped)}")


TokensOpt = Annotated[
    Optional[str],
    typer.Option(
        "--tokens",
        help="A token budget (2T, 300B: decimal multiples): the steps, wall days and GPU-hours of training on "
        "it at this step, and the cost with --price.",
    ),
]
PriceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--price", help="Price of one GPU-hour, with --tokens: the budget's cost, in the price's currency."
    ),
]


LevelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--interval-level",
        help="Probability the intervals beside times and memory hold the true value, in [0.5, 0.99] "
        "[default: 0.8]; an interval needs 2 / (1 - level) - 1 measured runs like the plan (9 at 0.8).",
    ),
]


def interval_level(text: str | None, flag: str = "--interval-level") -> float:
    """A probability flag (--interval-level, --confidence) read and checked: in [0.5, 0.99]."""
    if text is None:
        return DEFAULT_LEVEL
    value = parse_number(text, flag)
    if not 0.5 <= value <= 0.99:
        raise InputError(flag, f"{text!r}; accepted: a probability from 0.5 to 0.99")
    return value


def token_budget(tokens: str | None, price: str | None) -> tuple[int | None, float | None]:
    """--tokens and --price read and checked together: a price without a budget prices nothing."""
    if tokens is None:
        if price is not None:
            raise InputError("--price", "needs --tokens: the price of the GPU-hours of a token budget")
        return None, None
    budget = parse_budget(tokens, "--tokens")
    if budget > 10**18:
        raise InputError("--tokens", f"{budget:,} tokens; accepted: at most 10^18")
    if price is None:
        return budget, None
    value = parse_number(price, "--price")
    if not 0 < value <= 1e6:
        raise InputError(
            "--price", f"{price!r}; accepted: a price per GPU-hour above 0 and at most 1,000,000"
        )
    return budget, value


REQUIRED = PydanticUndefined  # a command's default for a field it requires (``declared(defaults=...)``)
NOTES: list[str] = []  # lines for stderr after a command's answer (cli.main writes them, or drops them)


def _from_model(info: FieldInfo) -> bool:
    return bool(isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("from_model"))
