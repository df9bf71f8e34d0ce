"""The fit of `cp-plan audit --runs TABLE --fit-profile OUT`: CPU seconds per phase and evaluations of the step.

    python benchmarks/fit.py [--repeats 3] [--smoke]

The table is the docs' example (docs/audit.md: tests/data/runs/example.csv, 162 single-node runs, vTrain's
assumptions) and its first 12 runs; ``--smoke`` fits the 12 runs once. Each round runs
:func:`costmodel.audit.runs.fit_runs` as the command does and splits its CPU time into binding the runs (at
each value of the grid term), choosing the terms that move them (:func:`~costmodel.audit.fit.identified`),
the cross-validations (:func:`~costmodel.audit.fit.cross_validate`, one with every term that moves the runs
and one without each in turn), the final fit, and the rest (the predictions before and after). An
evaluation is one call of the generated ``step_time_s`` (one per CP scheme in the table, whatever the number
of runs and trials it is evaluated over); each costs a few ms of numpy overhead, so their count sets the
time. Goal: a few seconds for the 162 runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from costmodel.audit import fit
from costmodel.audit.runs import fit_runs, parse_assumptions, read_runs
from costmodel.machines.profiles import load_profile

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tests" / "data" / "runs" / "example.csv"
ASSUME = ["recompute=full", "precision=fp16", "attention_kernel=unfused", "dp_overlap=0"]
HW = "a100-nvlink"
PHASES = {"bind": ("Steps", "__init__"), "identify": ("identified",), "cross-validate": ("cross_validate",)}


class Counted:
    """Wraps the fit's module-level functions (and the bound runs' constructor) to add up CPU seconds per
    phase and to count the step's evaluations; the fit itself is not changed."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys([*PHASES, "final fit"], 0.0)
        self.evaluations = 0
        self.saved: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[phase] += time.process_time() - begin

        self.saved.append((owner, name, inner))
        setattr(owner, name, timed)

    def __enter__(self) -> Counted:
        for phase, (*path, name) in PHASES.items():
            owner = getattr(fit, path[0]) if path else fit
            self.wrap(owner, name, phase)
        evaluator = fit.Evaluator

        def counting(values: dict[str, Any]) -> Any:
            self.evaluations += 1
            return evaluator(values)

        self.saved.append((fit, "Evaluator", evaluator))
        fit.Evaluator = counting  # type: ignore[misc,assignment]
        kfold = fit.kfold_fit

        def final_fit(*args: Any, **kwargs: Any) -> Any:  # kfold_fit less its cross-validations and choice
            begin = time.process_time()
            before = self.seconds["cross-validate"] + self.seconds["identify"]
            try:
                return kfold(*args, **kwargs)
            finally:
                inside = self.seconds["cross-validate"] + self.seconds["identify"] - before
                self.seconds["final fit"] += time.process_time() - begin - inside

        self.saved.append((fit, "kfold_fit", kfold))
        fit.kfold_fit = final_fit  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, inner in reversed(self.saved):
            setattr(owner, name, inner)


def one_fit(path: Path) -> tuple[float, Counted, dict[str, Any]]:
    table = read_runs(str(path), parse_assumptions(ASSUME), HW)
    begin = time.process_time()
    with Counted() as counted:
        result = fit_runs(table, load_profile(HW), 5, "fitted", "2026-12-01")
    return time.process_time() - begin, counted, result


def report(label: str, rounds: list[tuple[float, Counted, dict[str, Any]]]) -> None:
    total = statistics.median(r[0] for r in rounds)
    _, counted, result = min(rounds, key=lambda r: r[0])
    phases = "  ".join(f"{phase} {seconds:5.2f}" for phase, seconds in counted.seconds.items())
    rest = total - sum(counted.seconds.values())
    print(f"{label:<22} {total:6.2f} s CPU (median of {len(rounds)})  {counted.evaluations:>6} evaluations")
    print(f"{'':<22} {phases}  rest {rest:5.2f}")
    terms = ", ".join(f"{n} {t['value']:.6g}" for n, t in result["terms"].items())
    print(f"{'':<22} {terms}; {result['folds']}-fold MAPE {result['cv_mape']:.4%}")


def first_runs(path: Path, count: int, folder: Path) -> Path:
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    out = folder / f"first{count}.csv"
    out.write_text("\n".join(lines[: count + 1]) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="the 12 runs once: the suite runs it")
    args = parser.parse_args(argv)
    rounds = 1 if args.smoke else args.repeats
    with tempfile.TemporaryDirectory() as folder:
        tables: dict[str, Callable[[], Path]] = {"12 runs": lambda: first_runs(EXAMPLE, 12, Path(folder))}
        if not args.smoke:
            tables["162 runs (docs)"] = lambda: EXAMPLE
        for label, table in tables.items():
            path = table()
            report(label, [one_fit(path) for _ in range(rounds)])


if __name__ == "__main__":
    main()
