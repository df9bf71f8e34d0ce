"""Follow one input of a command from its flag to the formulas: how many files it passes through, and how
often it climbs back into a file it has already left.

    python benchmarks/walk.py [--smoke]

A command runs in this process under a profile hook that sees every Python call in ``costmodel/``. A call
carries the input when one of its arguments is the parsed value itself, or holds it within two steps (a
field of a job, a value of a dict, a field of a job's workload). Counted over the calls that carry it:

- files entered: the distinct source files those calls run in, the generated formulas included;
- stays: maximal runs of consecutive carrying calls in one file (how often the reader changes file);
- climbs back: calls into a file that is already on the stack of carrying calls under a different file,
  i.e. a lower layer calling back up into a module that called it (each distinct pair of files once).

Goals: a step's input enters at most 8 files and climbs back at most twice; a recommend's at most 12 files.
The value followed is one no other input of the command shares, so that equality names it.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / "costmodel"

# command -> (argv, the value of the flag followed: distinctive among the command's numbers)
WALKS = {
    "step": (
        [
            "step",
            "--model",
            "llama3-8b",
            "--seq",
            "262147",
            "--gpus",
            "8",
            "--cp",
            "1",
            "--global-batch",
            "8",
            "--hw",
            "h100-nvlink",
        ],
        262147,
    ),
    "recommend": (
        [
            "recommend",
            "--model",
            "llama3-8b",
            "--seq",
            "131075",
            "--gpus",
            "64",
            "--global-batch",
            "64",
            "--hw",
            "h100-nvlink",
        ],
        131075,
    ),
}
GOALS = {"step": (8, 2), "recommend": (12, None)}


def _holds(value: Any, wanted: int, depth: int) -> bool:
    """``value`` is ``wanted`` (an int, not a bool) or holds it within ``depth`` steps of fields and items."""
    if type(value) is int or type(value) is float:
        return value == wanted
    if depth == 0:
        return False
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, (list, tuple)) and len(value) <= 16:
        children = value
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("costmodel"):
        children = vars(value).values()
    else:
        return False
    return any(_holds(child, wanted, depth - 1) for child in children)


@dataclass
class Walk:
    wanted: int
    calls: list[str] = field(default_factory=list)  # the file of each carrying call, in order
    climbs: set[tuple[str, str]] = field(default_factory=set)
    stack: list[tuple[FrameType, str]] = field(default_factory=list)

    def hook(self, frame: FrameType, event: str, _: Any) -> None:
        if event == "return":
            if self.stack and self.stack[-1][0] is frame:
                self.stack.pop()
            return
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(str(ROOT)):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
        names = code.co_varnames[:count]
        if not any(_holds(frame.f_locals.get(n), self.wanted, 2) for n in names):
            return
        file = str(Path(path).relative_to(ROOT.parent))
        if self.stack:
            caller = self.stack[-1][1]
            if file != caller and any(f == file for _, f in self.stack):
                self.climbs.add((caller, file))
        self.stack.append((frame, file))
        self.calls.append(file)

    @property
    def stays(self) -> int:
        return sum(1 for i, f in enumerate(self.calls) if i == 0 or self.calls[i - 1] != f)


def walk(argv: list[str], wanted: int) -> Walk:
    from costmodel.cli import main

    found = Walk(wanted)
    sys.setprofile(found.hook)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = main([*argv, "--format", "json"])
    finally:
        sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {code}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the step only")
    args = parser.parse_args()
    for name, (argv, wanted) in WALKS.items():
        if args.smoke and name != "step":
            continue
        found = walk(argv, wanted)
        files = sorted(set(found.calls), key=found.calls.index)
        most_files, most_climbs = GOALS[name]
        print(
            f"cp-plan {name}: --seq {wanted} through {len(files)} files (goal <= {most_files}), "
            f"{found.stays} stays, {len(found.climbs)} climbs back"
            + (f" (goal <= {most_climbs})" if most_climbs is not None else "")
        )
        for file in files:
            print(f"  {found.calls.count(file):6d} calls  {file}")
        for caller, callee in sorted(found.climbs):
            print(f"  climbs back: {caller} -> {callee}")


if __name__ == "__main__":
    main()
