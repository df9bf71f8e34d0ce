"""Layout search: every factorisation of a job, vectorised, against the plain per-candidate loop.

    python benchmarks/search.py [--smoke]

The goal: every plan of one model on 1,024 GPUs in under 1 s. The vectorised search
(:func:`costmodel.training.search.search`) evaluates the step and memory formulas on arrays of all
candidates; the loop (:func:`~costmodel.training.search.search_loop`) runs evaluate_step and a memory fit
per candidate, so it is timed on a small job and its per-candidate cost printed beside the vectorised
one (after checking that both rank that job the same).
"""

from __future__ import annotations

import argparse

from timing import median_seconds

from costmodel.training.search import Constraints, default_global_batch, search, search_loop
from costmodel.training.step import build_step

MODEL, HW = "llama3-70b", "h100-ib"


def job(gpus: int, seq: int):  # noqa: ANN201
    return build_step(model=MODEL, seq=seq, hw=HW, gpus=gpus, global_batch=default_global_batch(seq))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small jobs, one timing: the suite runs it")
    smoke = parser.parse_args(argv).smoke
    every = Constraints(framework="any")
    rates = {}
    jobs = (
        ((1024, 8192), (1024, 131072))
        if smoke
        else ((1024, 8192), (1024, 131072), (16384, 8192), (16384, 131072))
    )
    for gpus, seq in jobs:
        built = job(gpus, seq)
        search(*built, every)  # load the model, profile and kernel tables once
        seconds = median_seconds(lambda built=built: search(*built, every), 1 if smoke else 5)
        found = search(*built, every)
        rates[(gpus, seq)] = found.considered / seconds
        verdict = "met" if gpus > 1024 or seconds < 1 else "missed"
        print(
            f"{gpus:>6,} GPUs, S = {seq:>7,}: {found.considered:>7,} plans ({found.fits:,} fit) in "
            f"{seconds * 1e3:5.0f} ms = {rates[(gpus, seq)]:>9,.0f} plans/s"
            + (f"; goal < 1 s: {verdict}" if gpus == 1024 else "")
        )
    small = job(2, 8192) if smoke else job(16, 32768)
    looped = median_seconds(lambda: search_loop(*small, every), 1)
    reference = search_loop(*small, every)
    fast = search(*small, every, top=None).plans
    keys = ("tp", "cp", "pp", "vpp", "micro_batch", "recompute")
    assert [tuple(p[k] for k in keys) for p in fast] == [tuple(p[k] for k in keys) for p in reference]
    candidates = search(*small, every).considered
    slow = candidates / looped
    print(
        f"plain loop, {small[1].gpus} GPUs: {candidates:,} plans in {looped:.2f} s = {slow:,.0f} plans/s (same ranking)"
    )
    print(f"ratio at 1,024 GPUs, S = 131,072: {rates[(1024, 131072)] / slow:,.0f}x")


if __name__ == "__main__":
    main()
