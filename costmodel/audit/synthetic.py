"""Runs tables the step model times itself, in vTrain's format: what a fit of machine terms must give back.

``cp-plan audit --runs --fit-profile`` is checked end to end on them (the tests, ``benchmarks/fidelity.py
--smoke``, and docs/audit.md's example table, ``tests/data/runs/generate.py``): layouts of the kind vTrain
measured, timed on a profile whose terms are known, with lognormal noise.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from costmodel.audit import fit
from costmodel.audit.runs import parse_assumptions, read_runs
from costmodel.machines.profiles import load_profile
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step

# vTrain's published tables ([vTrain] data/ground_truth_*.csv) open with a byte-order mark and this header.
VTRAIN_HEADER = (
    "\ufeff# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
)
# What vTrain's runs assume beyond their columns: Megatron-DeepSpeed's GPT in fp16, fully recomputed, with
# its unfused attention and the gradient reduction after the backward.
VTRAIN_ASSUMED = ["recompute=full", "precision=fp16", "attention_kernel=unfused", "dp_overlap=0"]


def layouts(max_gpus: int = 8) -> list[dict[str, int]]:
    """GPT layouts of the kind vTrain measured: 0.15-1.2B models, 2-``max_gpus`` GPUs, TP x PP x DP, micro
    and global batch varied, seq 1,024."""
    out = []
    gpus = 2
    while gpus <= max_gpus:
        for tp in (1, 2, 4, 8, 16):
            for pp in (1, 2, 4):
                if gpus % (tp * pp):
                    continue
                dp = gpus // (tp * pp)
                for hidden, layers in ((1024, 12), (1024, 24), (2048, 16)):
                    for micro in (1, 2, 8):
                        out.append(
                            dict(
                                gpus=gpus,
                                tp=tp,
                                pp=pp,
                                dp=dp,
                                micro_batch=micro,
                                global_batch=micro * dp * 4,
                                hidden=hidden,
                                heads=16,
                                layers=layers,
                                seq=1024,
                            )
                        )
        gpus *= 2
    return out


def write_table(path: Path, rows: list[dict[str, int]], times_s: list[float]) -> Path:
    """A runs table in vTrain's header, exactly as it publishes it."""
    lines = [VTRAIN_HEADER]
    for r, t in zip(rows, times_s, strict=True):
        lines.append(
            f"{r['gpus']},{r['global_batch']},{r['micro_batch']},{r['hidden']},{r['heads']},{r['layers']},"
            f"{r['seq']},{r['tp']},{r['dp']},{r['pp']},{t * 1e3:.12g}"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def synthetic(
    folder: Path, truth: dict[str, float], noise: float, max_gpus: int = 8, hw: str = "a100-nvlink"
) -> Path:
    """Layouts timed by the step model on ``hw`` with ``truth``'s terms, times lognormal noise of ``noise``
    (seeded), written to ``folder``/synthetic.csv."""
    rows = layouts(max_gpus)
    placeholder = write_table(folder / "layouts.csv", rows, [1.0] * len(rows))
    runs = read_runs(str(placeholder), parse_assumptions(VTRAIN_ASSUMED), hw).runs
    truth_profile = fit.with_terms(load_profile(hw), truth)
    rng = np.random.default_rng(7)
    times = [
        evaluate_step(Job.of(_profile=truth_profile, _model=r.model, **r.values)).step.time_s
        * math.exp(rng.normal(0, noise))
        for r in runs
    ]
    return write_table(folder / "synthetic.csv", rows, times)
