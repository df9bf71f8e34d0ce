"""The runs fit evaluates many trials in one call of the step's formulas (`costmodel.audit.fit`): each trial's
times are the step model's at that trial's profile, whatever else is evaluated beside it. How fast that is
is measured by benchmarks/fit.py, never asserted here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodel.audit import fit
from costmodel.audit.runs import Profiles, bound, read_runs
from costmodel.machines.profiles import HardwareProfile, load_profile
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "models"
MOE = """name: tiny-moe
description: a small mixture of experts
source: a test
hidden: 1024
heads: 16
kv_heads: 16
head_dim: 64
layers: 8
ffn_hidden: 1408
vocab: 32000
experts: 8
experts_per_token: 2
"""
# Dense and MoE runs, two CP schemes, pipeline stages: every kind of group the fast steps keep.
RUNS = """model,seq,gpus,tp,cp,pp,dp,micro_batch,global_batch,cp_scheme,iteration_ms
moe.yaml,4096,8,2,1,1,4,1,8,ring,300
moe.yaml,4096,8,1,2,1,4,1,8,ring,320
moe.yaml,4096,8,1,2,2,2,1,8,ring,330
moe.yaml,4096,8,2,2,1,2,1,8,ulysses,310
{dense},8192,8,2,2,1,2,1,8,ring,900
{dense},8192,8,2,2,1,2,1,8,ulysses,880
{dense},8192,8,2,2,2,1,1,8,ring,950
{dense},4096,8,4,1,1,2,2,8,ring,700
"""
# Three trials: each term at another value in each, the grid term at each of its values but one.
TRIALS = {
    "gemm_scale": [1.0, 0.7, 1.2],
    "attention_scale": [1.0, 0.8, 1.1],
    "launch_s": [5e-6, 4e-5, 1e-4],
    "step_s": [0.0, 0.01, 0.002],
    "intra_node_collective_efficiency": [0.8, 0.5, 0.9],
    "gemm_size_exponent": [0.0, 0.3, 0.6],
}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, HardwareProfile, fit.Steps]:
    folder = tmp_path_factory.mktemp("runs")
    (folder / "moe.yaml").write_text(MOE, encoding="utf-8")
    path = folder / "runs.csv"
    path.write_text(
        RUNS.format(dense=CONFIGS / "llama3-8b.yaml").replace("moe.yaml", str(folder / "moe.yaml"))
    )
    runs = read_runs(str(path), {}, "h100-nvlink").runs
    base = load_profile("h100-nvlink")

    def bind_all(profile: HardwareProfile) -> list[dict]:
        return [bound(run, Profiles(profile)) for run in runs]

    return runs, base, fit.Steps(bind_all, base)


def step_times(runs: list, profile: HardwareProfile) -> np.ndarray:
    return np.array(
        [evaluate_step(Job.of(**r.values, _profile=profile, _model=r.model)).step.time_s for r in runs]
    )


def test_trials_evaluated_together_are_the_step_model_at_each(table) -> None:
    runs, base, steps = table
    assert len(steps.fast.groups) == 4  # (scheme, model) for the MoE runs, a scheme for the dense ones
    rows = np.arange(len(runs))
    together = steps.times({name: np.array(values) for name, values in TRIALS.items()}, rows)
    assert together.shape == (3, len(runs))
    for k in range(3):
        terms = {name: values[k] for name, values in TRIALS.items()}
        alone = steps.times(terms, rows)[0]
        exact = step_times(runs, fit.with_terms(base, terms))
        assert together[k] == pytest.approx(exact, rel=1e-12)
        assert alone == pytest.approx(exact, rel=1e-12)


def test_each_trial_is_evaluated_at_its_own_runs(table) -> None:
    """``times_each``: trials of different folds, each at its runs (the fits run side by side)."""
    runs, base, steps = table
    rows = [np.array([0, 4, 5]), np.array([1, 2]), np.array([3, 6, 7, 0])]
    terms = {"gemm_scale": np.array([0.9, 1.1, 0.6]), "gemm_size_exponent": np.array([0.15, 0.45, 0.0])}
    each = steps.times_each(terms, rows)
    for k, runs_k in enumerate(rows):
        trial = {name: float(values[k]) for name, values in terms.items()}
        exact = step_times([runs[i] for i in runs_k], fit.with_terms(base, trial))
        assert each[k] == pytest.approx(exact, rel=1e-12)
