"""The CLI contract (docs/index.md, docs/json.md): the worked example on one screen, the JSON keys, the other formats."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.schema import SCHEMA
from costmodel.plans.timing import ring_overhead_s
from tests.support import REPO

WORKED = ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink"]

CONTRACT = {  # docs/json.md: at least these keys
    "inputs": "seq cp batch heads kv_heads head_dim bytes_per_element block causal layout hw",
    "hardware": "peak_flops effective_flops link_bandwidth latency beta",
    "memory": "scores_full_bytes scores_query_block_bytes scores_tile_bytes kv_block_bytes softmax_state_bytes",
    "compute": "total_flops device_flops_per_layer step_flops",
    "ring": "recv_bytes_per_layer send_bytes_per_layer step_recv_bytes intensity_step intensity_layer "
    "step_compute_s step_comm_s layer_compute_s layer_comm_s comm_ratio_step comm_ratio_layer verdict n_max "
    "critical_shard_tokens",
    "verdict": "pass comm_ratio_step verdict intensity_step n_max n_max_green n_max_amber critical_shard_tokens",
    "ulysses": "feasible reason recv_bytes_per_layer",
    "tp": "bytes_per_layer",
    "causal": "utilization_coarse utilization_fine utilization",
}


def test_worked_example_table_on_one_screen(cli) -> None:
    result = cli(*WORKED)
    assert result.code == 0, result.err
    out = result.out
    for text in (
        "4.398 TB",
        "17.18 GB",
        "67.11 MB",
        "134.2 MB",
        "939.5 MB",
        "587.2 MB",
        "8.590 GB",
        "56.4 ms",  # the balanced step at peak, the verdict's denominator (in the caption)
        "447 µs",
        "77.5 ms",  # the step, layer and backward step at the kernel tables' rates and the merges, as the layer time
        "620 ms",
        "221 ms",
        "3.13 ms",
        "3.58 ms",
        "0.793 %",
        "0.694 %",
        "GREEN",
        "overlap headroom",
        "β 1,040",
        "131,072",
        "comm = compute at N = 1,008",
        "L* = 260 tokens",
        "USP 2x4",
        "USP 4x2",
        "for training add --causal --pass fwd+bwd",
    ):
        assert text in out, text
    assert "dominat" not in out.lower()  # red means not negligible, never "communication dominates"
    assert "utilisation" not in out  # the causal line is for causal plans only
    assert len(out.splitlines()) <= 50


def test_a_sequence_shorter_than_l_star_says_so_rather_than_n_zero(cli) -> None:
    """N = S / L* below one printed as "N = 0.0" at one decimal: two significant digits, and why."""
    out = " ".join(cli("--seq", "1", "--n", "1", "--hw", "a100-nvlink").out.split())
    assert "comm = compute at N = 0.0038 (S shorter than L*); L* = 260 tokens" in out  # 1 / 260
    assert "(S shorter than L*)" not in cli(*WORKED).out


def test_the_scope_line_names_every_mask_the_plan_has(cli) -> None:
    """A window, chunks or packed documents shape the plan as much as causality: the header says so."""
    assert "one layer, fwd, no mask;" in cli(*WORKED).out
    out = cli(*WORKED, "--window", "8k").out
    assert "one layer, fwd, window 8,192; for training add --causal --pass fwd+bwd" in out
    out = " ".join(cli(*WORKED, "--causal", "--attention-chunk", "16k", "--docs", "100k,162144").out.split())
    assert "one layer, fwd, causal + chunks of 16,384 + packed documents; for training add --pass" in out


def test_ring_compute_column_reads_the_layer_times_rates_and_peak_only_when_asked(cli) -> None:
    """The compute column and the predicted layer time read the same rates: the kernel tables by default
    (layer 620 ms = the layer time, transfers hidden), peak x --efficiency when asked (the article's
    451 ms, and about 8 ms of merges beside the kernels: 7 steps of 32,768 x 32 x 129 x 12 bytes at the
    1.48 TB/s memory-bound kernels reach and 10 us a step); the verdict's ratio stays receive over the
    balanced compute at peak either way."""
    import re

    for extra, layer in (([], "620 ms"), (["--efficiency", "1"], "459 ms")):
        out = cli(*WORKED, *extra).out
        row = next(line for line in out.splitlines() if line.startswith("layer "))
        assert row.split()[3:5] == layer.split() and "0.694 %" in row
        assert re.search(rf"transfers\s+overlapped: {layer}", out)
        assert "0.793 %" in out
    data = cli(*WORKED, "-f", "json").json()["ring"]
    assert data["layer_compute_kernel_s"] == pytest.approx(data["layer_time_s"], rel=1e-9)
    assert data["layer_compute_s"] == pytest.approx(0.451, abs=5e-4)


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--causal", "--layout", "zigzag"),
        ("--causal", "--docs", "200k,4kx16,512x40"),
        ("--causal", "--window", "4k"),
        ("--n", "1"),
        ("--explain",),
    ],
)
def test_every_json_report_is_valid_under_the_published_schema(cli, extra: tuple[str, ...]) -> None:
    """docs/report.schema.json accepts what `--format json` writes: computed keys included, nothing
    undeclared (its objects forbid additional properties)."""
    schema = json.loads((REPO / "docs" / "report.schema.json").read_text(encoding="utf-8"))
    report = cli(*WORKED, *extra, "-f", "json").json()
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(report)]
    assert not errors, errors[:3]


def test_json_contract(cli) -> None:
    data = cli(*WORKED, "--format", "json").json()
    assert data["schema"] == SCHEMA
    for section, keys in CONTRACT.items():
        for key in keys.split():
            assert key in data[section], f"{section}.{key}"
    assert set(data["causal"]["utilization"]) == {"contiguous", "striped", "zigzag"}
    assert isinstance(data["usp"], list) and len(data["usp"]) == 4  # 1x8, 2x4, 4x2, 8x1
    # SI and unrounded: the hook's six headline numbers
    assert data["memory"]["scores_full_bytes"] == 4_398_046_511_104
    assert data["ring"]["recv_bytes_per_layer"] == 939_524_096
    assert data["ring"]["intensity_step"] == 131_072
    assert data["hardware"]["beta"] == 1040
    assert data["ulysses"]["recv_bytes_per_layer"] == 587_202_560
    assert data["tp"]["bytes_per_layer"] == 8_589_934_592


def test_causal_halves_intensity_and_n_max_but_not_traffic(cli) -> None:
    plain = cli(*WORKED, "-f", "json").json()["ring"]
    causal = cli(*WORKED, "--causal", "-f", "json").json()["ring"]
    assert causal["intensity_step"] == plain["intensity_step"] / 2
    assert causal["comm_ratio_step"] == pytest.approx(2 * plain["comm_ratio_step"])
    assert causal["n_max"] == pytest.approx(plain["n_max"] / 2)
    assert causal["recv_bytes_per_layer"] == plain["recv_bytes_per_layer"]
    assert causal["critical_shard_tokens"] == pytest.approx(2 * plain["critical_shard_tokens"])


def test_layout_sets_the_causal_layer_time(cli) -> None:
    """At one rate for every block (--efficiency 1: peak), the layout's schedule alone sets the layer time:
    zigzag's and striped's ranks each see about L²/2 pairs a step (the balanced figure), contiguous's last
    rank L(L+1)/2 + 7L², (2N - 1)/N times it. At the tables' rates striped's calls are causal ones, slower
    a FLOP than zigzag's unmasked half blocks."""

    def layer_s(layout: str, *more: str) -> float:
        args = (*WORKED, "--causal", "--layout", layout, *more, "-f", "json")
        return cli(*args).json()["ring"]["layer_time_s"]

    at_peak = {layout: layer_s(layout, "--efficiency", "1") for layout in ("contiguous", "striped", "zigzag")}
    balanced = cli(*WORKED, "--causal", "-f", "json").json()["ring"]["layer_compute_s"]
    # beside the kernels, every layout pays the same merges and launches; zigzag copies its queries too
    inputs = {"seq": 262_144, "n": 8, "causal": True, "hw": "a100-nvlink"}
    beside = {
        layout: ring_overhead_s(PlanInputs(**inputs, layout=layout), Machine(load_profile("a100-nvlink")))
        for layout in ("contiguous", "striped", "zigzag")
    }
    kernels = {layout: at_peak[layout] - beside[layout] for layout in at_peak}
    assert kernels["zigzag"] == pytest.approx(balanced, rel=1e-4)
    assert kernels["striped"] == pytest.approx(balanced, rel=1e-3)  # L/2 pairs more at every step
    assert kernels["contiguous"] == pytest.approx(balanced * 15 / 8, rel=1e-4)
    assert layer_s("zigzag") < layer_s("striped") < layer_s("contiguous")


ZIGZAG_128K = [
    "--seq",
    "128k",
    "--n",
    "8",
    "--hw",
    "h100-nvlink",
    "--causal",
    "--layout",
    "zigzag",
    "-f",
    "json",
]


def zigzag_128k_layer_s(kernel: str | None = None) -> float:
    """The zigzag ring's forward at 128K over 8 H100s from the tables: the own block a causal call of
    L = 16,384 queries against L keys, every other block a full call against L/2 keys (NVLink hides every
    transfer), and the merges, query copies and launches beside the kernels."""
    from costmodel.machines.kernels import attention_rate

    h100, length = load_profile("h100-nvlink"), 16_384
    pair_flops = 4 * 32 * 128

    def rate(
        keys: int, causal: bool
    ) -> float:  # a layer of a training step reads them at the sustained clock
        return Machine(h100).sustained_clock * attention_rate(
            h100, "bf16", length, keys, 128, causal, False, kernel
        )

    # the tables count a causal call's visible pairs, L(L+1)/2; each of the seven others sees L·L/2
    own, other = length * (length + 1) / 2, length * (length // 2)
    kernels = own * pair_flops / rate(length, True) + 7 * other * pair_flops / rate(length // 2, False)
    inputs = PlanInputs(seq=131_072, n=8, causal=True, layout="zigzag", hw="h100-nvlink")
    return kernels + ring_overhead_s(inputs, Machine(h100))


def test_published_kernel_rates_set_the_layer_time_not_peak(cli) -> None:
    """Without --efficiency the time model reads the profile's FlashAttention-3 tables [FA3]: at 128K over 8
    H100s the own block is a causal call of L = 16,384 queries against L keys, every other zigzag block a
    full call against L/2 keys. NVLink hides every transfer, so the layer time is the slowest rank's calls
    at those rates; the balanced formulas (layer_compute_s) stay at peak."""
    tables, peak = cli(*ZIGZAG_128K).json(), cli(*ZIGZAG_128K, "--efficiency", "1").json()
    assert tables["ring"]["layer_time_s"] == pytest.approx(zigzag_128k_layer_s(), rel=1e-9)
    assert tables["ring"]["layer_time_s"] / peak["ring"]["layer_time_s"] > 1.4  # 989 TFLOP/s is not what runs
    assert tables["ring"]["layer_compute_s"] == peak["ring"]["layer_compute_s"]


def test_ring_across_nodes_uses_and_names_the_inter_node_link(cli) -> None:
    data = cli("--seq", "256k", "--n", "16", "--hw", "a100-nvlink", "-f", "json").json()
    assert data["hardware"]["link_scope"] == "inter-node"
    assert data["hardware"]["link_bandwidth"] == 25e9  # HDR 200 Gb/s, one ConnectX-6 per GPU [DGX-A100]
    assert any("spans nodes" in note for note in data["notes"])
    usp = {(e["n_ulysses"], e["n_ring"]): e for e in data["usp"]}
    assert usp[(8, 2)]["a2a_link_scope"] == "intra-node" and usp[(8, 2)]["ring_link_scope"] == "inter-node"
    assert usp[(16, 1)]["a2a_link_scope"] == "inter-node"


def test_largest_green_and_amber_n_follow_the_topology(cli) -> None:
    verdict = cli(*WORKED, "-f", "json").json()["verdict"]
    # step ratio on IB = N x 2 n_kv p F / (4 S h B) = N x 2 x 8 x 2 x 312e12 / (4 x 262144 x 32 x 25e9) = N x 1.19 %
    assert verdict["n_max_green"] == 8  # all of the NVLink node; IB at N = 9 is 10.7 %
    assert verdict["n_max_amber"] == 12  # on HDR IB: 14.3 % at N = 12, 15.5 % at N = 13


def test_the_limits_are_the_verdicts_pass(cli) -> None:
    """fwd+bwd is bound by the backward (2.5x the FLOP, but K, V and fp32 dK, dV to receive): its ratio is the
    verdict's, and N_max, L*, the intensity and the band edges are the backward's, as sweep's N_max for the
    same job (Llama 3 8B's attention at 128K, N = 4 on H100s over NDR: 36.2 % at N = 4, so N_max = 4 / 0.362).
    A forward plan's limits are the ring's own."""
    args = ("--seq", "128k", "--n", "4", "--hw", "h100-ib", "--causal", "--layout", "zigzag")
    both = cli(*args, "--pass", "fwd+bwd", "-f", "json").json()
    verdict, backward = both["verdict"], both["backward"]
    assert verdict["comm_ratio_step"] == backward["comm_ratio_step"] > both["ring"]["comm_ratio_step"]
    assert verdict["n_max"] == pytest.approx(4 / verdict["comm_ratio_step"], rel=0.01)
    assert verdict["critical_shard_tokens"] == backward["critical_shard_tokens"]
    assert verdict["intensity_step"] == backward["intensity_step"]
    swept = cli("sweep", "--seq", "128k", "--n", "4", "--hw", "h100-ib", "--causal", "--pass", "fwd+bwd").out
    assert re.search(rf"128k\s+36\.2%\s+{verdict['n_max']:.1f}\b", swept), swept
    forward = cli(*args, "-f", "json").json()
    for key in ("n_max", "critical_shard_tokens", "intensity_step"):
        assert forward["verdict"][key] == pytest.approx(forward["ring"][key], rel=1e-12)
    assert forward["verdict"]["n_max_amber"] >= verdict["n_max_amber"]


def test_ulysses_infeasible_says_why(cli) -> None:
    data = cli("--seq", "96k", "--n", "3", "--hw", "a100-nvlink", "-f", "json").json()
    assert data["ulysses"] == {
        "feasible": False,
        "reason": "h = 32 query heads do not split over 3 devices (h mod N = 2)",
        "kv_heads": None,
        "recv_bytes_per_layer": None,
        "comm_s": None,
        "comm_ratio": None,
        "verdict": None,
        "link_scope": "intra-node",
    }


def test_ulysses_replicates_kv_heads_when_n_exceeds_them(cli) -> None:
    data = cli("--seq", "256k", "--n", "16", "--hw", "h100-nvlink", "-f", "json").json()["ulysses"]
    assert data["feasible"] and data["kv_heads"] == 16 and "replicated 2x" in data["reason"]
    assert data["recv_bytes_per_layer"] == pytest.approx(15 / 16 * 262144 / 16 * (64 + 32) * 128 * 2)


def test_model_preset_sets_the_shape_and_flags_override_it(cli) -> None:
    data = cli(*WORKED, "--model", "llama3-70b", "-f", "json").json()["inputs"]
    assert (data["heads"], data["kv_heads"], data["head_dim"], data["model"]) == (64, 8, 128, "llama3-70b")
    data = cli(*WORKED, "--model", "llama3-70b", "--kv-heads", "64", "-f", "json").json()["inputs"]
    assert data["kv_heads"] == 64


def test_efficiency_shows_both_ratios(cli) -> None:
    result = cli(*WORKED, "--efficiency", "0.4")
    assert "effective 125 TFLOP/s" in result.out
    data = cli(*WORKED, "--efficiency", "0.4", "-f", "json").json()
    assert data["ring"]["comm_ratio_step"] == pytest.approx(0.4 * data["ring"]["comm_ratio_step_peak"])
    assert data["hardware"]["beta"] == pytest.approx(416) and data["hardware"]["beta_peak"] == 1040


def test_seq_suffixes(cli) -> None:
    for text, tokens in (("256k", 262_144), ("1M", 1_048_576), ("262144", 262_144), ("0.5M", 524_288)):
        assert cli("--seq", text, "--n", "8", "-f", "json").json()["inputs"]["seq"] == tokens


def test_yaml_and_markdown_carry_the_same_report(cli) -> None:
    as_json = cli(*WORKED, "-f", "json").json()
    as_yaml = yaml.safe_load(cli(*WORKED, "-f", "yaml").out)
    assert as_yaml == as_json
    markdown = cli(*WORKED, "-f", "markdown").out
    assert markdown.startswith("## cp-plan:") and "| ring | 939.5 MB |" in markdown


def test_explain_prints_formula_then_values(cli) -> None:
    out = cli(*WORKED, "--explain").out
    assert "I_step = 2*S*c*h/(N*n_kv*p)" in out
    assert "= 2*262144*1*32/(8*8*2)" in out
    data = cli(*WORKED, "--explain", "-f", "json").json()
    row = next(r for r in data["explain"] if r["name"] == "intensity_step")
    assert row["value"] == "131072 FLOP/B"


def test_formulas_command(cli) -> None:
    out = cli("formulas").out
    assert "intensity_step" in out and "critical_shard_tokens" in out
    latex = cli("formulas", "intensity_step", "--latex").out
    assert latex.startswith("intensity_step: I_{step} = ") and r"\frac{2 S c h}{N n_{kv} p}" in latex


def test_hw_list_and_show(cli) -> None:
    listing = cli("hw", "list", "-f", "json").json()["profiles"]
    for name in ("a100-nvlink", "h100-ib", "h200-nvlink"):
        assert name in [p["name"] for p in listing]
    shown = yaml.safe_load(cli("hw", "show", "h100-nvlink").out)
    assert shown["links"]["intra_node"]["bandwidth_per_direction"] == 450e9


def test_help_lists_the_commands(cli) -> None:
    result = cli("--help")
    assert result.code == 0
    for word in ("--seq", "--hw", "--explain", "formulas", "hw"):
        assert word in result.out


@pytest.mark.parametrize("command", [[], ["step"], ["recommend"], ["hw"], ["hw", "fit-kernels"], ["kernel"]])
def test_dash_h_is_help_on_every_command(cli, command: list[str]) -> None:
    short, long = cli(*command, "-h"), cli(*command, "--help")
    assert short.code == long.code == 0 and short.out == long.out and short.out.startswith("Usage: cp-plan")


def test_python_dash_m_runs_the_command_line() -> None:
    """``python -m costmodel`` is ``cp-plan`` where the console script is not on PATH."""
    done = subprocess.run(
        [sys.executable, "-m", "costmodel", *WORKED, "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ring"]["intensity_step"] == 131_072


def test_piped_tables_keep_their_long_cells_whole(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, a table once stopped at 80 columns and cut file names ("nccl_2node_all_g..."); COLUMNS still
    sets the width."""
    nccl = sorted(str(p) for p in (REPO / "tests" / "data" / "audit").glob("nccl_*node_*.txt"))
    monkeypatch.delenv("COLUMNS", raising=False)
    result = cli("hw", "from-nccl-tests", *nccl, "--base", "h100-ib")
    assert result.code == 0, result.err
    assert all(Path(name).name in result.out for name in nccl)
    assert max(map(len, result.out.splitlines())) > 80
    monkeypatch.setenv("COLUMNS", "60")
    narrow = cli("hw", "from-nccl-tests", *nccl, "--base", "h100-ib")
    assert max(map(len, narrow.out.splitlines())) <= 60


@pytest.mark.parametrize("layout", ["contiguous", "striped", "zigzag"])
def test_one_rank_takes_any_length_in_any_layout(cli, layout: str) -> None:
    """CP 1 splits nothing: an odd S is no reason to refuse the zigzag layout it does not use."""
    assert cli("--seq", "4097", "--n", "1", "--causal", "--layout", layout, "--hw", "h100-ib").code == 0
    step = cli(
        "step",
        "--model",
        "llama3-8b",
        "--seq",
        "4097",
        "--cp",
        "1",
        "--layout",
        layout,
        "--global-batch",
        "8",
    )
    assert step.code == 0, step.err
    two = cli("--seq", "4097", "--n", "2", "--causal", "--layout", layout, "--hw", "h100-ib")
    assert two.code == 2 and "do not split evenly" in two.err


@pytest.mark.skipif(shutil.which("cp-plan") is None, reason="console script not installed")
def test_console_script_from_another_directory(tmp_path) -> None:
    """The installed script finds its built-in profiles wherever it runs (docs/index.md)."""
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(
        ["cp-plan", *WORKED, "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ring"]["intensity_step"] == 131_072
    bad = subprocess.run(["cp-plan", "--n", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_numeric_path_imports_neither_sympy_nor_torch() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from costmodel.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['--format', 'json'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'sympy', 'torch'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_only_the_process_entry_freezes_the_collector(cli) -> None:
    """main() reading the process's own command line loads the command line with the collector off, then
    freezes what it loaded and runs the command with the collector on; it freezes the collector again as it
    returns (the process ends: Python's collection at exit would walk everything once more). Called with
    arguments, as here, it leaves the collector as it was."""
    before = gc.get_freeze_count()
    assert cli("--format", "json").code == 0
    assert gc.get_freeze_count() == before
    assert gc.isenabled()
    code = (
        "import gc, io, contextlib, sys\n"
        "import costmodel.plans.evaluate as plans\n"
        "from costmodel.cli import main\n"
        "evaluate, during = plans.evaluate, []\n"
        "def watched(*args):\n"
        "    during.append((gc.isenabled(), gc.get_freeze_count() > 0))\n"
        "    return evaluate(*args)\n"
        "plans.evaluate = watched\n"
        "sys.argv = ['cp-plan', '--format', 'json']\n"
        "with contextlib.redirect_stdout(io.StringIO()): code = main()\n"
        "print(code, during == [(True, True)], gc.get_freeze_count() > 0, gc.isenabled())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["0", "True", "True", "True"], done.stderr


@pytest.mark.parametrize(
    ("args", "flag", "command"),
    [
        (["--seq", "8k", "--hw", "h100-ib", "step", "--model", "llama3-8b", "--gpus", "8"], "--seq", "step"),
        (["--hw", "h100-ib", "recommend", "--seq", "8k"], "--hw", "recommend"),
        (["--format", "json", "hw", "list"], "--format", "hw"),
        (["--causal", "check", "plan.yaml"], "--causal", "check"),
    ],
)
def test_root_options_before_a_subcommand_are_an_error_naming_the_flag(cli, args, flag, command) -> None:
    """A root option given before a subcommand is never silently dropped: one line naming it, exit 2."""
    result = cli(*args)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith(f"cp-plan: error: {flag}: given before the subcommand {command!r}")
    assert result.err.count("\n") == 1


def test_root_options_still_apply_without_a_subcommand(cli) -> None:
    assert cli("--seq", "8k", "--n", "2", "-f", "json").json()["inputs"]["seq"] == 8192
    assert cli("--version").code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--seq", "256k", "--n", "8", "--hw", "a100-nvlink"],
        ["--seq", "128k", "--n", "8", "--hw", "h100-ib", "--causal", "--pass", "fwd+bwd", "--explain"],
        ["step", "--model", "llama3-8b", "--seq", "8k", "--gpus", "8", "--global-batch", "8"],
        ["recommend", "--model", "llama3-8b", "--seq", "128k", "--hw", "h100-ib", "--gpus", "64"],
        ["infer", "--model", "llama3-70b", "--hw", "h100-nvlink", "--tp", "8", "--prompt", "128k"],
        ["hw", "list"],
        ["sweep", "--hw", "h100-ib"],
    ],
    ids=lambda args: " ".join(args[:1]),
)
def test_piped_output_has_no_trailing_spaces(cli, args) -> None:
    """Redirected to a file or a pipe, no line ends in the spaces rich pads tables to the width with."""
    result = cli(*args)
    assert result.code == 0, result.err
    padded = [line for line in result.out.splitlines() if line != line.rstrip(" ")]
    assert len(result.out.splitlines()) > 5 and padded == []


class _Terminal:
    """A stderr that says it is a terminal, keeping what was written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_progress_counts_seconds_on_a_terminal_and_stays_quiet_in_a_pipe(capsys) -> None:
    import io
    import time

    from costmodel.cli.options import working

    terminal = _Terminal()
    with working("validate: timing 24 cases on 2 ranks", terminal):
        deadline = time.monotonic() + 60
        while "\r" not in terminal.text:  # the first count, a second in (later on a loaded machine)
            assert time.monotonic() < deadline, "the progress line never counted a second"
            time.sleep(0.05)
    assert terminal.text.startswith("cp-plan: validate: timing 24 cases on 2 ranks...")
    assert re.search(r"\rcp-plan: validate: timing 24 cases on 2 ranks\.\.\. [1-9][0-9]* s", terminal.text)
    assert terminal.text.endswith(" s\n")
    pipe = io.StringIO()
    with working("validate", pipe):
        time.sleep(0.01)
    assert pipe.getvalue() == ""


def test_selftest_and_validate_run_under_the_progress_line(cli, monkeypatch) -> None:
    """The two commands that wait on other processes for many seconds say what they wait for."""
    import contextlib

    pytest.importorskip("torch")
    from costmodel.cli import kernel as kernel_cli
    from costmodel.kernel import selftest

    seen = []

    @contextlib.contextmanager
    def recording(what, stream=None):  # noqa: ANN001, ANN202
        seen.append(what)
        yield

    class Result:
        passed = True

        def to_json(self) -> dict:
            return {"passed": True}

    monkeypatch.setattr(kernel_cli, "working", recording)
    monkeypatch.setattr(selftest, "run_selftest", lambda config, nproc, timeout_s: Result())
    assert cli("kernel", "selftest", "--nproc", "2", "--format", "json").code == 0
    assert seen == [f"selftest of {len(selftest.VARIANTS)} variants on 2 ranks"]

    from costmodel.kernel import launch

    def failing(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise launch.LaunchError("no ranks here")

    monkeypatch.setattr(launch, "launch", failing)
    profile = next((REPO / "tests" / "data" / "calibrated").glob("*.yaml"))
    result = cli("validate", "--hw", str(profile), "--nproc", "2")
    assert result.code == 1 and "no ranks here" in result.err
    assert seen[1].startswith("validate: timing ") and seen[1].endswith(" cases on 2 ranks")


@pytest.mark.parametrize(
    ("args", "schema"),
    [
        (["--seq", "8k"], "cp-plan/report/v5"),
        (["recommend", "--seq", "128k", "--model", "llama3-8b"], "cp-plan/recommend/v9"),
        (["recommend", "--model", "llama3-8b", "--gpus", "8", "--seq", "8k"], "cp-plan/recommend/v9"),
        (["sweep"], "cp-plan/sweep/v1"),
        (["hw", "list"], "cp-plan/hw-list/v1"),
        (["infer", "--model", "llama3-8b", "--prompt", "8k"], "cp-plan/inference/v7"),
        (
            ["step", "--model", "llama3-8b", "--gpus", "8", "--seq", "8k", "--global-batch", "8"],
            "cp-plan/step/v9",
        ),
        (["check", "configs/plans/fail-llama3-8b-128k-h100-ib.yaml"], "cp-plan/check/v1"),
        (["audit", "tests/data/audit/titan_cp2_16k.log"], "cp-plan/audit/v2"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) else None,
)
def test_every_json_output_names_its_schema(cli, monkeypatch, args, schema) -> None:
    monkeypatch.chdir(REPO)
    result = cli(*args, "--format", "json")
    assert result.code in (0, 1), result.err
    assert result.json()["schema"] == schema


def test_attention_kernel_sets_the_tables_one_layer_reads(cli) -> None:
    """--attention-kernel NAME reads the profile's named tables for every call of the layer: at 128K over
    8 H100s the zigzag ring's own block is a causal call of 16,384 queries, the rest full calls against
    8,192 keys, at torch's SDPA FlashAttention-2 rates; the merges beside the kernels stay the same."""
    named = cli(*ZIGZAG_128K, "--attention-kernel", "sdpa-flash").json()
    assert named["hardware"]["attention_kernel"] == "sdpa-flash"
    assert cli(*ZIGZAG_128K).json()["hardware"]["attention_kernel"] == "flash"
    assert named["ring"]["layer_time_s"] == pytest.approx(zigzag_128k_layer_s("sdpa-flash"), rel=1e-9)


@pytest.mark.parametrize("kernel", ["nope", "unfused"])
def test_an_attention_kernel_the_profile_has_no_tables_for_is_one_line(cli, kernel: str) -> None:
    result = cli(*WORKED, "--hw", "h100-nvlink", "--attention-kernel", kernel)
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1
    assert "--attention-kernel" in result.err and "sdpa-flash" in result.err


def test_a_red_bound_whose_transfers_hide_at_kernel_rates_says_both(cli) -> None:
    """64K over 8 H100s across InfiniBand: balanced at peak the ring step's receive is 121 % of its compute (red),
    at the kernel rates the step and the timeline read 57 %: the headline says both, not one against the other."""
    args = ["--seq", "64k", "--n", "8", "--hw", "h100-ib", "--causal", "--layout", "zigzag"]
    data = cli(*args, "-f", "json").json()
    verdict, ring = data["verdict"], data["ring"]
    assert verdict["verdict"] == "red" and verdict["comm_ratio_step"] > 1
    assert verdict["comm_ratio_step_kernel"] == pytest.approx(
        ring["step_comm_s"] / ring["step_compute_kernel_s"], rel=1e-9
    )
    assert verdict["comm_ratio_step_kernel"] < 1
    out = " ".join(cli(*args).out.split())
    assert "at the kernel rates the step and the timeline read, 57.2 %: each transfer hides" in out
    quiet = " ".join(cli("--seq", "262144", "--n", "8", "--hw", "a100-nvlink").out.split())
    assert "GREEN fwd step comm ratio 0.793 %: overlap headroom limits" in quiet  # the same story: no clause


def test_the_framework_flag_names_every_built_in_profile() -> None:
    from costmodel.frameworks.profiles import builtin_frameworks
    from costmodel.plans.job import FrameworkKnobs

    described = FrameworkKnobs.model_fields["framework"].description
    assert all(re.search(rf"\b{re.escape(name)}\b", described) for name in builtin_frameworks())
