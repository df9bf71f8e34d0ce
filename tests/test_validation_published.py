"""The step model against published training runs (validation/training_published.yaml holds the rows, read by
costmodel/training/validation.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from costmodel.core.errors import InputError
from costmodel.plans.job import Job
from costmodel.training.validation import (
    DRAWN,
    GOAL,
    HELD_OUT,
    ROWS,
    Published,
    draw_held_out,
    load,
    predict,
    refused,
)


def test_at_least_eight_published_figures_and_most_held_to_the_goal() -> None:
    assert len(ROWS) >= 8 and len({row.key for row in ROWS}) == len(ROWS)
    assert sum(not row.misses for row in ROWS) >= 6


def test_median_error_over_the_table_is_within_ten_percent() -> None:
    errors = sorted(abs(predict(row) / row.published - 1) for row in ROWS)
    assert statistics.median(errors) <= 0.10


@pytest.mark.xfail(
    strict=True,
    reason="30 of the 146 published runs, every one of which ran, are refused (median chance to fit 10 %): 15 "
    "are Megatron-LM and NeMo layouts at the edge of 80 GB whose sources leave recompute unstated (taken as "
    "none) and, for Megatron-Bridge, whose allocator runs with expandable segments (a reserve the profile's "
    "share may overstate); the others are Llama 3's 8K and 128K stages (knobs the paper does not state), NeMo "
    "AutoModel's LoRA runs and DeepSpeed's 256K offloaded run on the H200 (the memory table's named misses), and "
    "the nine Arctic Long Sequence Training runs, each at the longest sequence its memory allowed with tiled MLP "
    "and expandable segments (the model counts an MLP's working set whole and a fragmentation share)",
)
def test_every_published_run_fits_the_memory_it_ran_in() -> None:
    """Each published run ran, so the memory model should say its layout fits its GPUs."""
    assert [row.key for row, _ in refused([*ROWS, *HELD_OUT])] == []


def test_every_row_names_the_framework_it_ran_on_and_the_profile_it_is_predicted_with() -> None:
    from costmodel.frameworks.profiles import builtin_frameworks
    from costmodel.training.validation import by_framework

    assert all(row.framework and row.profile in builtin_frameworks() for row in ROWS)
    assert {row.profile for row in ROWS if row.framework == "torchtitan"} == {"torchtitan"}
    assert sum(s["rows"] for s in by_framework().values()) == len(ROWS)


def test_the_held_out_rows_are_the_draw_and_apart_from_the_rest() -> None:
    """HELD_OUT is draw_held_out of the rows of the DRAWN sources, none of them in ROWS; the keys are one set."""
    drawn = [row for row in ROWS + HELD_OUT if row.source.startswith(DRAWN)]
    assert {row.key for row in HELD_OUT} == draw_held_out(drawn)
    assert all(row.source.startswith(DRAWN) for row in HELD_OUT)
    assert len({row.key for row in ROWS + HELD_OUT}) == len(ROWS) + len(HELD_OUT)


KNOWN = [
    pytest.param(row, marks=pytest.mark.xfail(strict=True, reason=row.misses)) if row.misses else row
    for row in ROWS + HELD_OUT
]


@pytest.mark.parametrize("row", KNOWN, ids=[row.key for row in ROWS + HELD_OUT])
def test_published_figure(row: Published) -> None:
    """Each published figure within 15 %, the held-out rows as the rest; a known miss is a strict expected
    failure, so it fails the day the model starts to meet it (then its reason goes)."""
    predicted = predict(row)
    assert predicted == pytest.approx(row.published, rel=GOAL), f"{row.key}: predicted {predicted:.4g}"


def test_korthikanti_rows_agree_with_the_papers_own_abstract() -> None:
    """Cross-check of two figures we could not read in the paper's tables against a source we could.

    The selective-recompute MFUs (41.5, 51.4, 56.0, 56.3 %) are also printed in Megatron-LM's README.
    The 530B full-recompute iteration time (49.05 s on 280 GPUs) implies an MFU through the model FLOP
    count; the arXiv abstract gives the same run at DP 8 (2,240 GPUs) as 42.1 % against 54.2 % without
    recompute. The ratio of the two MFUs must match the abstract's within 2 %."""
    from costmodel.training.step import evaluate_step

    rows = {row.key: row for row in ROWS}
    full, selective = rows["k22-530b-full-s"], rows["k22-530b-mfu"]
    predicted = evaluate_step(Job.of(**full.setup)).model_dump(by_alias=True)["step"]
    seconds_at_peak = predicted["time_s"] * predicted["mfu_full_square"]  # the paper's model FLOP / peak
    implied_full_mfu = seconds_at_peak / full.published
    assert implied_full_mfu / selective.published == pytest.approx(42.1 / 54.2, rel=0.02)


ROW = """\
- key: k22-22b-mfu
  source: '[Korthikanti22] Tables 3, 5'
  framework: Megatron-LM
  run: GPT 22B, 8 A100, TP 8, batch 4, selective recompute + SP
  metric: mfu_full_square
  published: 0.415
  setup: {model: gpt-22b, seq: 2048, hw: a100-ib, gpus: 8, tp: 8, global_batch: 4}
  misses: ''
"""


@pytest.mark.parametrize(
    ("edit", "field", "line", "problem"),
    [
        (("published: 0.415", "published: fast"), "published", 6, "expected a positive number, got 'fast'"),
        (("setup: {model", "setup: {model: [gpt-22b], m"), "setup", 7, "expected a mapping of flag names"),
        (("misses: ''", "misses: ''\n  speedup: 2"), "speedup", 9, "unknown field; a row states key, source"),
        (("  misses: ''\n", ""), "misses", 1, "missing; every row states every field"),
        (("metric: mfu_full_square", "metric: mfu_full"), "metric", 5, "not a number of the step's JSON"),
        (("framework: Megatron-LM", "framework: 7"), "framework", 3, "expected text, got 7"),
    ],
)
def test_a_malformed_row_is_one_input_error_naming_the_file_the_key_and_the_field(
    tmp_path: Path, edit: tuple[str, str], field: str, line: int, problem: str
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(ROW)
    assert [row.key for row in load(good)] == ["k22-22b-mfu"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(ROW.replace(*edit))
    with pytest.raises(InputError) as raised:
        load(bad)
    assert f"{bad}:{line}: row 'k22-22b-mfu', field {field!r}: {problem}" in str(raised.value)


def test_a_repeated_key_or_a_source_on_two_frameworks_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.yaml"
    path.write_text(ROW + ROW)
    with pytest.raises(
        InputError, match=r"rows.yaml:9: row 'k22-22b-mfu', field 'key': the key of the row on line 1"
    ):
        load(path)
    path.write_text(ROW + ROW.replace("k22-22b-mfu", "k22-again").replace("Megatron-LM", "NeMo"))
    with pytest.raises(
        InputError, match=r"row 'k22-again', field 'framework': an earlier row of .* ran on Megatron"
    ):
        load(path)
