"""Packed documents in a plan ([A-RingCost §5]): the contract of --docs, --packing, --window; the two
branches; the long-tail lock; and every way a distribution can be wrong (exit 2, one line)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from costmodel.plans.packing import first_fit, pack
from tests.support import plan

UNPACKED = {"compute", "ring", "backward", "verdict", "causal", "schemes", "usp", "ulysses", "tp", "memory"}


def _json(cli, *args: str) -> dict:
    result = cli(*args, "--format", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
@pytest.mark.parametrize("packing", ["dense", "varlen"])
def test_one_document_of_the_window_reproduces_the_unpacked_report(cli, layout: str, packing: str) -> None:
    base = ["--seq", "64k", "--n", "8", "--causal", "--layout", layout, "--hw", "h100-ib"]
    plain = _json(cli, *base)
    packed = _json(cli, *base, "--docs", "64k", "--packing", packing)
    assert {k: packed[k] for k in UNPACKED} == {k: plain[k] for k in UNPACKED}
    assert packed["packing"]["windows"] == 1 and plain["packing"] is None


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
def test_the_dense_branch_times_the_causal_window_whatever_the_documents(cli, layout: str) -> None:
    """Dense blanks the document mask's scores and runs the causal window: its layer time is the unpacked
    plan's, for sixty-four documents as for one (the pairs each rank sees, as the tables count them)."""
    base = ["--seq", "256k", "--n", "8", "--causal", "--layout", layout, "--hw", "h100-nvlink"]
    plain = _json(cli, *base)["ring"]["layer_time_s"]
    assert _json(cli, *base, "--docs", "4kx64", "--packing", "dense")["ring"]["layer_time_s"] == plain


def test_branches_share_traffic_and_split_compute() -> None:
    """Sixty-four 4k documents in a 256k window: dense executes the causal window, varlen 1/64 of it times
    the diagonal tiles' excess (4 tiles of 1,024 per document: 10 of 16 tile pairs run, 8 are useful)."""
    plain = plan(causal=True, layout="zigzag")
    dense = plan(causal=True, layout="zigzag", docs="4kx64", packing="dense")
    varlen = plan(causal=True, layout="zigzag", docs="4kx64")
    assert dense.compute.total_flops == plain.compute.total_flops
    assert varlen.compute.total_flops == pytest.approx(plain.compute.total_flops / 64 * 10 / 8, rel=0.01)
    assert varlen.compute.total_flops >= varlen.packing.useful_flops
    assert (
        varlen.ring.recv_bytes_per_layer == dense.ring.recv_bytes_per_layer == plain.ring.recv_bytes_per_layer
    )
    assert varlen.packing.varlen.intensity_step == pytest.approx(
        dense.packing.dense.intensity_step * varlen.packing.varlen.executed_share, rel=1e-12
    )
    assert varlen.packing.dense == dense.packing.dense  # both branches reported whichever is chosen


def test_varlen_turns_green_into_red_for_the_same_s_and_n(cli) -> None:
    base = ["--seq", "1M", "--n", "8", "--hw", "h100-nvlink", "--causal"]
    assert _json(cli, *base)["ring"]["verdict"] == "green"
    assert _json(cli, *base, "--docs", "4kx256", "--packing", "dense")["ring"]["verdict"] == "green"
    report = _json(cli, *base, "--docs", "4kx256")
    assert report["ring"]["verdict"] == "red"
    assert (
        report["packing"]["varlen"]["comm_ratio_step"] > 0.15 > report["packing"]["dense"]["comm_ratio_step"]
    )


def test_packing_evens_out_the_useful_work_striping_exists_to_balance() -> None:
    """One 256k document: contiguous holds 1/2 of its work in balance, striping ~1; many 4k documents:
    contiguous is already balanced, so striping gains little."""

    def gain(report) -> float:
        rows = {r.layout: r for r in report.packing.layouts}
        return rows["striped"].balance / rows["contiguous"].balance

    one, many = plan(causal=True, docs="256k", block=256), plan(causal=True, docs="4kx64", block=256)
    assert gain(one) > 1.8
    assert gain(many) < 1.05


def test_long_tail_lock() -> None:
    """200k + 4k x 16 in 256k windows at N = 8 (32k per device): the long one needs 7, the rest 1."""
    tail = plan(causal=True, docs="200k,4kx16").packing.long_tail
    assert (tail.longest_doc_tokens, tail.n_longest, tail.n_rest) == (204_800, 7, 1)
    # 200k tokens visit 6 other ranks instead of 7; the 56k of short documents in its window none.
    assert tail.dynamic_recv_share == pytest.approx(204_800 * 6 / (262_144 * 7), rel=1e-12)


def test_sliding_window_skips_ring_steps_and_splits_layer_types() -> None:
    report = plan(causal=True, window=4096, seq=65_536)  # shards of 8k: only the own and previous block
    assert report.mask.skippable_steps == 6
    kinds = {t.kind: t for t in report.mask.layer_types}
    assert kinds["local"].compute_fraction < kinds["global"].compute_fraction == 0.5
    assert kinds["local"].n_max < kinds["global"].n_max


@pytest.mark.parametrize("flag", ["--window", "--attention-chunk"])
def test_a_window_or_chunk_no_narrower_than_the_sequence_masks_nothing(cli, flag: str) -> None:
    """A query then sees every key it would without it: the plan is the unmasked one, figure for figure, and it
    takes no mask simulator, so a length past the simulator's bound is planned, not refused."""
    for seq, width in (("256k", "256k"), ("256k", "300k"), ("4M", "8M")):
        plain = cli("--seq", seq, "--causal", "-f", "json").json()
        wide = cli("--seq", seq, "--causal", flag, width, "-f", "json").json()
        assert wide["mask"] is None and wide["packing"] == plain["packing"]
        given = flag[2:].replace("-", "_")
        assert {k: v for k, v in wide.items() if k != "inputs"} == {
            k: v for k, v in plain.items() if k != "inputs"
        }
        assert wide["inputs"] == plain["inputs"] | {given: wide["inputs"][given]}
    assert "(no narrower than S: it masks nothing)" in " ".join(cli("--seq", "4M", flag, "8M").out.split())


def test_first_fit_in_order() -> None:
    assert first_fit([6, 5, 3, 2, 4], 10) == ((6, 3), (5, 2), (4,))
    assert pack("200k,4kx16,512x40", 262_144).windows[0] == (204_800, *[4096] * 14)


def test_files_and_synthetic_distributions(tmp_path: Path) -> None:
    (tmp_path / "lines.txt").write_text("4k\n4096\n\n8192\n")
    (tmp_path / "hist.json").write_text('{"4096": 2, "8192": 1}')
    (tmp_path / "pairs.json").write_text("[[4096, 2], [8192, 1]]")
    (tmp_path / "hist.csv").write_text("length,count\n4096,2\n8192,1\n")
    for name in ("lines.txt", "hist.json", "pairs.json", "hist.csv"):
        assert sorted(pack(str(tmp_path / name), 65_536).lengths) == [4096, 4096, 8192], name
    one = pack("lognormal:mean=4k,sigma=1,seed=3", 1 << 20)
    assert one == pack("lognormal:mean=4k,sigma=1,seed=3", 1 << 20) and sum(one.lengths) == 1 << 20
    many = pack("lognormal:mean=4k,sigma=0.5,count=500,seed=1", 1 << 20)
    assert len(many.lengths) == 500
    assert sum(many.lengths) / 500 == pytest.approx(4096, rel=0.1)  # the distribution's mean is `mean`
    assert math.isclose(len(many.windows), sum(many.lengths) / (1 << 20), abs_tol=1.5)


BAD = [
    (["--docs", "0"], "must be positive"),
    (["--docs", "4k,-5"], "--docs"),
    (["--docs", "300k"], "longer than the window S = 262,144"),
    (["--docs", "4kx0"], "repeat count"),
    (["--docs", "4k,,8k"], "--docs"),
    (["--docs", "books"], "neither lengths"),
    (["--docs", "lognormal:sigma=1"], "needs mean="),
    (["--docs", "lognormal:mean=4k,sigma=nan"], "sigma"),
    (["--docs", "lognormal:mean=1M,count=10"], "mean=1,048,576 is longer than the window S = 262,144"),
    (["--docs", "lognormal:mean=4k,mean=8k"], "mean= given twice"),
    (["--docs", "{tmp}/bad.json"], "malformed JSON"),
    (["--docs", "{tmp}/bad.csv"], "length,count"),
    (["--docs", "{tmp}/zero.txt"], "positive"),
    (["--docs", "{tmp}/empty.txt"], "no document lengths"),
    (["--packing", "sparse"], "--packing"),
    (["--window", "0"], "--window"),
]


@pytest.mark.parametrize(("args", "expected"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_distributions_exit_2_with_one_line(cli, tmp_path: Path, args: list[str], expected: str) -> None:
    (tmp_path / "bad.json").write_text('{"4096": 2,')
    (tmp_path / "bad.csv").write_text("4096,2,7\n")
    (tmp_path / "zero.txt").write_text("4096\n0\n")
    (tmp_path / "empty.txt").write_text("\n")
    result = cli("--causal", *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.code == 2, result.out
    assert result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cp-plan: error: ") and expected in lines[0], result.err


def test_the_step_model_takes_the_branch(cli) -> None:
    """A training step of Llama 3 8B at 128k over CP 8: one document is the unpacked step; 32 documents
    of 4k run varlen in about a quarter of the time (attention dominates at 128k), dense in the same."""
    base = ["step", "-m", "llama3-8b", "--seq", "128k", "--hw", "h100-nvlink", "--gpus", "8", "--cp", "8"]
    base += ["--global-batch", "8"]
    time = {
        name: _json(cli, *base, *extra)["step"]["time_s"]
        for name, extra in {
            "plain": [],
            "one": ["--docs", "128k"],
            "dense": ["--docs", "4kx32", "--packing", "dense"],
            "varlen": ["--docs", "4kx32"],
        }.items()
    }
    assert time["one"] == time["plain"] == time["dense"]
    assert 0.15 < time["varlen"] / time["plain"] < 0.4


def test_sweep_takes_the_distribution_per_cell(cli) -> None:
    """Packed into every S: one document of 64k is the unpacked sweep; sixteen of 4k, each cell's ratio
    grows by its executed share (the same plan as `cp-plan` at that S and N)."""
    base = ["sweep", "--seq", "64k", "--n", "2,8", "--hw", "h100-nvlink", "--causal"]
    plain = {r["n"]: r["comm_ratio_step"] for r in _json(cli, *base)["rows"]}
    one = {r["n"]: r["comm_ratio_step"] for r in _json(cli, *base, "--docs", "64k")["rows"]}
    many = {r["n"]: r["comm_ratio_step"] for r in _json(cli, *base, "--docs", "4kx16")["rows"]}
    assert one == plain
    for n in (2, 8):
        report = _json(
            cli, "--seq", "64k", "--n", str(n), "--hw", "h100-nvlink", "--causal", "--docs", "4kx16"
        )
        assert many[n] == pytest.approx(report["ring"]["comm_ratio_step"], rel=1e-12)


def test_plan_files_take_the_distribution(cli, tmp_path: Path) -> None:
    """The same 1M window over 8 H100s as a plan file: green as one document, red packed varlen."""
    body = "name: x\nmodel: llama3-8b\nseq: 1M\nn: 8\ngpus: 8\nhw: h100-nvlink\ncausal: true\n{extra}"
    body += "expect:\n  worst_verdict: green\n"
    (tmp_path / "one.yaml").write_text(body.format(extra="docs: 1M\n"))
    (tmp_path / "packed.yaml").write_text(body.format(extra="docs: 4kx256\npacking: varlen\n"))
    assert cli("check", str(tmp_path / "one.yaml")).code == 0
    result = cli("check", str(tmp_path / "packed.yaml"))
    assert result.code == 1 and "red" in result.out


def test_a_list_too_long_for_a_file_name_is_still_a_list(cli) -> None:
    """600 lengths (2,400 characters) are longer than any file name the OS looks up: still lengths."""
    report = _json(cli, "--seq", "64k", "--n", "8", "--causal", "--docs", ",".join(["100"] * 600))
    assert report["packing"]["documents"] == 600


def test_a_docs_file_may_start_with_a_byte_order_mark(cli, tmp_path) -> None:
    """Some editors write UTF-8 with a byte-order mark first: every text input reads past it, as the runs table."""
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("4096\n2048\n2048\n")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    runs = [cli("--seq", "8k", "--n", "2", "--docs", str(path), "-f", "json") for path in (plain, marked)]
    assert runs[1].code == 0, runs[1].err
    packed = [{k: v for k, v in run.json()["packing"].items() if k != "source"} for run in runs]
    assert packed[1] == packed[0]
