"""Layout search: the vectorised search against the plain loop, and the whole `recommend` around it.

    python benchmarks/search.py [--repeats 5] [--smoke]

(a) The vectorised search (:func:`costmodel.training.search.search`) evaluates the step and memory formulas
on arrays of all candidates; the loop (:func:`~costmodel.training.search.search_loop`) runs evaluate_step
and a memory fit per candidate. Both run on a job small enough for the loop, interleaved round after round,
in plans per CPU-second (after checking that they rank it the same); then the search alone on larger jobs.
Goal: every plan of one model on 1,024 GPUs in under 1 s.

(b) `cp-plan recommend` as a user runs it, in a fresh process each round, at 16,384 and 131,072 GPUs,
split into the search, the CP window (:func:`costmodel.training.recommend.recommend`), the sensitivity
(:func:`~costmodel.training.search.sensitivity`, its own searches included) and start-up (the
interpreter, imports, parsing and printing: the process's wall time less the three). The child times the
three by wrapping those functions. Goals: at most 2 s at 16,384 GPUs and 10 s at 131,072.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from costmodel.frameworks import load_framework
from costmodel.plans.job import Job
from costmodel.training.search import (
    Constraints,
    TooManyPlans,
    default_global_batch,
    search,
    search_loop,
    widest,
)

MODEL, HW = "llama3-70b", "h100-ib"
RECOMMEND = ["--model", "llama3-405b", "--seq", "131072", "--hw", "h100-nvlink"]
WHOLE = {16384: (128, 2.0), 131072: (1024, 10.0)}  # GPUs: (global batch, goal in seconds)
PHASES = ("search", "window", "sensitivity")


def job(gpus: int, seq: int) -> tuple[Job, int]:
    """The job a search starts from, under a framework running every scheme and layout, and its batch."""
    every = widest(load_framework("megatron"))
    return Job.of(model=MODEL, seq=seq, hw=HW, gpus=gpus, _framework=every), default_global_batch(seq)


def cpu_seconds(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def search_against_loop(rounds: int, smoke: bool) -> None:
    every = Constraints()
    small = job(2, 8192) if smoke else job(8, 32768)
    reference = search_loop(*small, every)
    fast = search(*small, every, top=None).plans
    keys = ("tp", "cp", "pp", "vpp", "micro_batch", "recompute")
    assert [tuple(p[k] for k in keys) for p in fast] == [tuple(p[k] for k in keys) for p in reference]
    plans = search(*small, every).considered
    vectorised, looped = [], []
    for _ in range(rounds):  # interleaved: noise hits both alike
        vectorised.append(cpu_seconds(lambda: search(*small, every)))
        looped.append(cpu_seconds(lambda: search_loop(*small, every)))
    fast_rate = plans / statistics.median(vectorised)
    slow_rate = plans / statistics.median(looped)
    print(
        f"(a) {small[0].gpus} GPUs, S = {small[0].inputs.seq:,}: {plans:,} plans, the same ranking; {rounds} rounds"
    )
    print(f"    search  {fast_rate:>10,.0f} plans per CPU-second")
    print(f"    loop    {slow_rate:>10,.0f} plans per CPU-second")
    print(f"    ratio   {fast_rate / slow_rate:>10,.0f}x")
    jobs = ((1024, 131072),) if smoke else ((1024, 8192), (1024, 131072), (16384, 8192), (16384, 131072))
    built = {key: job(*key) for key in jobs}
    for key in jobs:
        try:
            search(*built[key], every)  # load the model, profile and kernel tables once
        except TooManyPlans as refused:  # past the bound a search weighs: refused before any work
            print(f"    {key[0]:>6,} GPUs, S = {key[1]:>7,}: refused, {refused.message}")
            del built[key]
    times: dict[tuple[int, int], list[float]] = {key: [] for key in built}
    for _ in range(rounds):
        for key in built:
            times[key].append(cpu_seconds(lambda key=key: search(*built[key], every)))
    for (gpus, seq), values in times.items():
        found = search(*built[(gpus, seq)], every)
        seconds = statistics.median(values)
        goal = f"; goal < 1 s: {'met' if seconds < 1 else 'missed'}" if gpus == 1024 else ""
        print(
            f"    {gpus:>6,} GPUs, S = {seq:>7,}: {found.considered:>7,} plans ({found.fits:,} fit) in "
            f"{seconds * 1e3:5.0f} ms CPU = {found.considered / seconds:>9,.0f} plans per CPU-second{goal}"
        )


def _child(out: str, args: list[str]) -> None:
    """Run `cp-plan recommend ARGS` here, timing the three phases; write them to ``out`` as JSON."""
    from costmodel.training import recommend as window
    from costmodel.training import search as layouts

    seconds = dict.fromkeys(PHASES, 0.0)
    active: list[str] = []

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            if (
                active
            ):  # called from inside a phase (sensitivity's searches, the window's fixes): counted there
                return fn(*a, **k)
            active.append(name)
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[name] += time.perf_counter() - start
                active.pop()

        return run

    layouts.search = timed("search", layouts.search)
    layouts.sensitivity = timed("sensitivity", layouts.sensitivity)
    window.recommend = timed("window", window.recommend)
    from costmodel.cli import main

    code = main(["recommend", *args])
    Path(out).write_text(json.dumps(seconds | {"code": code}), encoding="utf-8")


def whole_recommend(rounds: int, smoke: bool) -> None:
    sizes = (16384,) if smoke else tuple(WHOLE)
    runs: dict[int, list[dict[str, float]]] = {gpus: [] for gpus in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "phases.json")
        for _ in range(rounds):  # interleaved, a fresh process each time: as a user runs it
            for gpus in sizes:
                args = [*RECOMMEND, "--gpus", str(gpus), "--global-batch", str(WHOLE[gpus][0])]
                start = time.perf_counter()
                subprocess.run(
                    [sys.executable, __file__, "--child", out, *args], stdout=subprocess.DEVNULL, check=True
                )
                wall = time.perf_counter() - start
                phases = json.loads(Path(out).read_text(encoding="utf-8"))
                assert phases.pop("code") == 0
                runs[gpus].append(phases | {"start-up": wall - sum(phases.values()), "total": wall})
    print(f"(b) cp-plan recommend {' '.join(RECOMMEND)}, median of {rounds} interleaved runs (wall seconds)")
    columns = ("start-up", *PHASES, "total")
    print(f"    {'GPUs':>8} " + " ".join(f"{c:>11}" for c in columns) + "  around / search   goal")
    for gpus, values in runs.items():
        median = {c: statistics.median(v[c] for v in values) for c in columns}
        around = statistics.median((v["window"] + v["sensitivity"]) / v["search"] for v in values)
        goal = WHOLE[gpus][1]
        print(
            f"    {gpus:>8,} "
            + " ".join(f"{median[c]:>10.2f}s" for c in columns)
            + f"  {around:>14.2f}x   <= {goal:.0f} s: {'met' if median['total'] <= goal else 'missed'}"
        )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds of each measurement (median)")
    parser.add_argument("--smoke", action="store_true", help="small jobs, one round: the suite runs it")
    args = parser.parse_args(argv)
    rounds = 1 if args.smoke else args.repeats
    search_against_loop(rounds, args.smoke)
    whole_recommend(rounds, args.smoke)


if __name__ == "__main__":
    main()
