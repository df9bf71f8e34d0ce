"""The step model against published training runs: one row per figure, with its source, the parallel
layout the source states, the tolerance the row is held to and why a row falls outside 15 %.

No constant of the model is fitted to these rows: the kernel tables come from the kernel papers and
public benchmarks ([FA2], [FA3], the GEMM benchmarks cited in hardware/*.yaml), the overlaps are the
documented defaults of StepSetup. docs/validation.md prints this table; a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from costmodel.training.step import StepSetup, evaluate_step
from tests.support import REPO

GOAL = 0.15  # what we aim for; rows with a wider tolerance say why in `misses`


@dataclass(frozen=True)
class Published:
    key: str
    source: str
    run: str
    metric: str  # a key of the step's JSON
    published: float
    tolerance: float
    setup: dict[str, Any] = field(default_factory=dict)
    misses: str = ""  # what the model does not capture, when the row is outside GOAL


K22 = "[Korthikanti22] Tables 3, 5"
LLAMA3 = "[Llama3] Table 4"
TITAN = "[torchtitan] docs/performance.md"
GPT = {"seq": 2048, "hw": "a100-ib", "micro_batch": 1}

ROWS = [
    Published("k22-22b-mfu", K22, "GPT 22B, 8 A100, TP 8, batch 4, selective recompute + SP", "mfu", 0.415, 0.25,
              {**GPT, "model": "gpt-22b", "gpus": 8, "tp": 8, "global_batch": 4, "recompute": "selective"},
              "4 micro-batches on one node: per-kernel launch and framework time (not modelled) weigh most "
              "on the smallest model; head_dim 96 reads the head-dim 128 attention curve"),
    Published("k22-175b-mfu", K22, "GPT-3 175B, 64 A100, TP 8, PP 8, batch 64, selective + SP", "mfu", 0.514, GOAL,
              {**GPT, "model": "gpt3-175b", "gpus": 64, "tp": 8, "pp": 8, "global_batch": 64,
               "recompute": "selective"}),
    Published("k22-530b-mfu", K22, "GPT 530B, 280 A100, TP 8, PP 35, batch 280, selective + SP", "mfu", 0.560, GOAL,
              {**GPT, "model": "gpt-530b", "gpus": 280, "tp": 8, "pp": 35, "global_batch": 280,
               "recompute": "selective"}),
    Published("k22-1t-mfu", K22, "GPT 1T, 512 A100, TP 8, PP 64, batch 512, selective + SP", "mfu", 0.563, GOAL,
              {**GPT, "model": "gpt-1t", "gpus": 512, "tp": 8, "pp": 64, "global_batch": 512,
               "recompute": "selective"}),
    Published("k22-22b-full-s", K22, "GPT 22B as above, full recompute: iteration time", "time_s", 1.42, 0.20,
              {**GPT, "model": "gpt-22b", "gpus": 8, "tp": 8, "global_batch": 4, "recompute": "full"},
              "as the 22B MFU row: the model is 17 % fast on this small single-node run"),
    Published("k22-175b-full-s", K22, "GPT-3 175B as above, full recompute: iteration time", "time_s", 18.13, GOAL,
              {**GPT, "model": "gpt3-175b", "gpus": 64, "tp": 8, "pp": 8, "global_batch": 64, "recompute": "full"}),
    Published("k22-530b-full-s", K22, "GPT 530B as above, full recompute: iteration time", "time_s", 49.05, GOAL,
              {**GPT, "model": "gpt-530b", "gpus": 280, "tp": 8, "pp": 35, "global_batch": 280,
               "recompute": "full"}),
    Published("k22-1t-full-s", K22, "GPT 1T as above, full recompute: iteration time", "time_s", 94.42, GOAL,
              {**GPT, "model": "gpt-1t", "gpus": 512, "tp": 8, "pp": 64, "global_batch": 512, "recompute": "full"}),
    Published("llama3-8k-8192", LLAMA3, "Llama 3 405B, 8,192 H100, TP 8, PP 16, DP 64, 8K, 16M tokens/batch",
              "model_tflops_per_gpu", 430, 0.30,
              {"model": "llama3-405b", "seq": 8192, "hw": "h100-ib", "gpus": 8192, "tp": 8, "pp": 16, "vpp": 4,
               "global_batch": 2048, "recompute": "none"},
              "H100 clocks under sustained load, stragglers and network jitter over 1,024 nodes are not modelled; "
              "the virtual-stage count is not published (v = 4 assumed: ~2 layers per virtual stage)"),
    Published("llama3-8k-16384", LLAMA3, "Llama 3 405B, 16,384 H100, TP 8, PP 16, DP 128, 8K, 16M tokens/batch",
              "model_tflops_per_gpu", 400, 0.25,
              {"model": "llama3-405b", "seq": 8192, "hw": "h100-ib", "gpus": 16384, "tp": 8, "pp": 16, "vpp": 4,
               "global_batch": 2048, "recompute": "none"},
              "as the 8,192-GPU row; the model does get the drop from halving the micro-batches per pipeline"),
    Published("llama3-128k", LLAMA3, "Llama 3 405B, 16,384 H100, TP 8, CP 16 (all-gather), PP 16, DP 4, 128K",
              "mfu", 0.38, 0.60,
              {"model": "llama3-405b", "seq": 131072, "hw": "h100-ib", "gpus": 16384, "tp": 8, "cp": 16, "pp": 16,
               "vpp": 4, "global_batch": 128, "recompute": "none", "cp_scheme": "allgather", "layout": "zigzag"},
              "the paper does not say how it counts attention FLOP: with the causal half (mfu_causal_attention) "
              "the prediction is 41.9 % (+10 %); with the full square we state, 58.7 %"),
    Published("titan-8b-a100", TITAN, "Llama 3 8B, 64 A100, FSDP, 8K, local batch 1, selective AC", "mfu", 0.582,
              0.20,
              {"model": "llama3-8b", "seq": 8192, "hw": "a100-ib", "gpus": 64, "global_batch": 64,
               "recompute": "selective", "zero3": True},
              "FSDP's per-layer gather/scatter launch and Python overhead, and the GEMM table from a PCIe A100 "
              "(clocks lower than SXM) pulling the other way; net 18 % high"),
    Published("titan-70b-a100", TITAN, "Llama 3 70B, 64 A100, FSDP, 8K, local batch 1, full AC", "mfu", 0.517, GOAL,
              {"model": "llama3-70b", "seq": 8192, "hw": "a100-ib", "gpus": 64, "global_batch": 64,
               "recompute": "full", "zero3": True}),
]


def predict(row: Published) -> float:
    return float(evaluate_step(StepSetup(**row.setup))["step"][row.metric])


def test_at_least_eight_published_figures_and_every_wide_row_says_why() -> None:
    assert len(ROWS) >= 8 and len({row.key for row in ROWS}) == len(ROWS)
    assert sum(row.tolerance <= GOAL for row in ROWS) >= 6
    for row in ROWS:
        assert row.tolerance <= GOAL or row.misses, row.key


@pytest.mark.parametrize("row", ROWS, ids=[row.key for row in ROWS])
def test_published_figure(row: Published) -> None:
    predicted = predict(row)
    assert predicted == pytest.approx(row.published, rel=row.tolerance), f"{row.key}: predicted {predicted:.4g}"


def _shown(value: float, metric: str) -> str:
    if metric == "mfu":
        return f"{100 * value:.1f} %"
    return f"{value:.2f}" if metric == "time_s" else f"{value:.0f}"


def test_docs_table_prints_these_predictions() -> None:
    """docs/validation.md shows each row's prediction as the model computes it now."""
    text = (REPO / "docs" / "validation.md").read_text(encoding="utf-8")
    for row in ROWS:
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{row.key}` ")), "")
        assert line, f"docs/validation.md lacks a row for {row.key}"
        cells = [c.strip() for c in line.split("|")]
        predicted = predict(row)
        assert cells[5:8] == [_shown(row.published, row.metric), _shown(predicted, row.metric),
                              f"{100 * (predicted / row.published - 1):+.1f} %"], row.key  # fmt: skip
