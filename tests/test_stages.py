"""Pipeline stage splits as Megatron-LM runs them: balanced by default, the first and last stages' layer
counts as given, every legal split accepted by `step`, the rest one line naming the flag."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.plans.stages import StageSplit, balanced, candidate_splits, split_stages
from costmodel.training.export import megatron_arguments, torchtitan_tables


@pytest.mark.parametrize(
    ("layers", "pp", "split"),
    [
        (126, 16, (7, 8, 7)),  # Llama 3 405B: one layer fewer on the first and the last stage [Llama3 §3.3.2]
        (32, 4, (8, 8, 8)),  # an even split is the balanced one
        (32, 3, (11, 11, 10)),  # the last stage, which runs the output layer, takes the fewer
        (80, 6, (12, 14, 12)),
        (24, 2, (12, 0, 12)),
        (5, 4, (2, 1, 1)),  # the ceiling leaves no layer for the ends: the floor
        (7, 1, (7, 0, 7)),
    ],
)
def test_balanced_split(layers: int, pp: int, split: tuple[int, int, int]) -> None:
    got = split_stages(layers, pp)
    assert (got.first, got.middle, got.last) == split and got.layers == layers


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 160), data=st.data())
def test_every_candidate_split_holds_every_layer_once(layers: int, data: st.DataObject) -> None:
    pp = data.draw(st.integers(1, layers))
    splits = candidate_splits(layers, pp)
    assert splits and splits[0] == balanced(layers, pp)
    for split in splits:
        assert split.layers == layers and split.first >= 1 and split.last >= 1
        assert pp <= 2 or split.middle >= 1


def test_counting_the_loss_and_the_embedding_as_layers() -> None:
    """Megatron's --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split: 126
    layers and two more layers' worth over 16 stages put 8 everywhere but 7 on the ends. The search tries
    the loss as one and as two layers' work too; 32 layers over 4 stages give three distinct splits."""
    assert balanced(126, 16, 1, 1) == StageSplit(16, 7, 8, 7)
    assert balanced(32, 4, 0, 2) == StageSplit(4, 8, 9, 6)
    assert [(s.first, s.middle, s.last) for s in candidate_splits(32, 4)] == [(8, 8, 8), (8, 9, 6), (7, 9, 7)]


@pytest.mark.parametrize(
    ("first", "last", "split"),
    [(6, None, (6, 8, 8)), (None, 5, (9, 8, 5)), (7, 7, (7, 8, 7)), (14, 0 + 14, (14, 7, 14))],
)
def test_given_ends_and_the_middle_shares_the_rest(first, last, split) -> None:  # noqa: ANN001
    got = split_stages(126, 16, first=first, last=last)
    assert (got.first, got.middle, got.last) == split and got.layers == 126


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"layers": 32, "pp": 40}, "--pp", "40 pipeline stages exceed the model's 32 layers"),
        ({"layers": 32, "pp": 1, "vpp": 2}, "--vpp", "interleaving needs --pp > 1"),
        ({"layers": 32, "pp": 1, "first": 4}, "--first-stage-layers", "needs --pp > 1"),
        ({"layers": 32, "pp": 1, "last": 1}, "--last-stage-layers", "needs --pp > 1"),
        (
            {"layers": 32, "pp": 2, "last": 40},
            "--last-stage-layers",
            "leave 0 for the other 1 stage, at least one each: accepted 1 to 31",
        ),
        ({"layers": 32, "pp": 4, "first": 40}, "--first-stage-layers", "accepted 1 to 29"),
        ({"layers": 32, "pp": 4, "first": 9, "last": 8}, "--first-stage-layers", "share 32 - first - last"),
        ({"layers": 32, "pp": 2, "first": 20, "last": 20}, "--first-stage-layers", "must be the model's 32"),
        ({"layers": 32, "pp": 4, "vpp": 9}, "--vpp", "36 model chunks exceed the model's 32 layers"),
        (
            {"layers": 32, "pp": 5, "vpp": 6},
            "--vpp",
            "a stage holds 5 (6 + 3 x 7 + 5 per stage); accepted: at most 5",
        ),
    ],
)
def test_a_split_that_leaves_a_stage_empty_names_its_flag(kwargs: dict, field: str, says: str) -> None:
    with pytest.raises(InputError) as caught:
        split_stages(**kwargs)
    assert caught.value.field == field and says in caught.value.message


def test_step_takes_an_uneven_split_and_prints_it(cli) -> None:
    job = ["step", "--model", "llama3-405b", "--seq", "8k", "--hw", "h100-ib", "--gpus", "2048", "--tp", "8"]
    result = cli(*job, "--pp", "16", "--global-batch", "256", "--first-stage-layers", "6")
    assert result.code == 0, result.err
    assert "pp 16 (6 + 14 x 8 + 8 layers, v 1)" in result.out.replace("\n", " ")
    data = cli(*job, "--pp", "16", "--global-batch", "256", "--first-stage-layers", "6", "-f", "json").json()
    assert (data["inputs"]["first_stage_layers"], data["inputs"]["last_stage_layers"]) == (6, 8)
    bad = cli(*job, "--pp", "16", "--global-batch", "256", "--first-stage-layers", "120")
    assert bad.code == 2 and bad.out == "" and bad.err.count("\n") == 1
    assert bad.err.startswith("cp-plan: error: --first-stage-layers")


def test_interleaving_needs_a_micro_batch_per_stage(cli) -> None:
    result = cli(
        "step",
        "--model",
        "llama3-8b",
        "--seq",
        "8k",
        "--gpus",
        "8",
        "--pp",
        "4",
        "--vpp",
        "2",
        "--global-batch",
        "2",
    )
    assert result.code == 2 and "--vpp" in result.err and "at least --pp 4 micro-batches" in result.err


PLAN = {"tp": 8, "cp": 16, "pp": 16, "vpp": 4, "dp": 8, "micro_batch": 1, "recompute": "none"}
PLAN |= {"cp_scheme": "allgather", "layout": "zigzag", "cp_ulysses": 1, "cp_ring": 16, "ep": 1}


@pytest.mark.parametrize(("split", "flags"), [((7, 8, 7), True), ((8, 8, 8), False)])
def test_exports_carry_the_split(split: tuple[int, int, int], flags: bool) -> None:
    """Megatron-LM's first/last stage flags for an uneven split only; torchtitan's chunks of
    layers_per_stage, the first and last that many fewer, cover the model in pp x v chunks."""
    plan = PLAN | dict(
        zip(("first_stage_layers", "middle_stage_layers", "last_stage_layers"), split, strict=True)
    )
    args = megatron_arguments(plan, 131072, 128, 1)
    assert ("--decoder-first-pipeline-num-layers" in args) == flags
    if flags:
        at = args.index("--decoder-first-pipeline-num-layers")
        assert args[at + 1] == "7" and args[args.index("--decoder-last-pipeline-num-layers") + 1] == "7"
    toml = torchtitan_tables(plan, 131072, 128, 1)["parallelism"]
    per = int(toml["pipeline_parallel_layers_per_stage"])
    less = int(toml["pipeline_parallel_first_stage_less_layers"]) + int(
        toml["pipeline_parallel_last_stage_less_layers"]
    )
    layers = split[0] + 14 * split[1] + split[2]
    assert layers + less == 16 * 4 * per
