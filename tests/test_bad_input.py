"""Bad input (docs/index.md): exit code 2, one line on stderr naming the flag or field and what is accepted,
nothing on stdout, never a traceback. One row per distinct mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.core.resources import data_dir

GOOD_PROFILE = (data_dir("hardware") / "a100-nvlink.yaml").read_text()


def profile_with(old: str, new: str) -> str:
    assert old in GOOD_PROFILE
    return GOOD_PROFILE.replace(old, new, 1)


FILES = {  # name: YAML text written to a temporary file and passed as --hw
    "malformed.yaml": "name: [unclosed\n  device: {",
    "wrong-type.yaml": profile_with("bandwidth_per_direction: 300.0e+09", 'bandwidth_per_direction: "fast"'),
    "negative-bw.yaml": profile_with(
        "bandwidth_per_direction: 300.0e+09", "bandwidth_per_direction: -300.0e+09"
    ),
    "zero-flops.yaml": profile_with("bf16: 312.0e+12", "bf16: 0.0"),
    # within float range but no machine's: a unit slip that would print 30-digit figures
    "slow-launch.yaml": profile_with("launch_s: 2.5e-05", "launch_s: 1.0e+30"),
    "share-over-one.yaml": profile_with("comm_sm_slowdown: 0.15", "comm_sm_slowdown: 5.0"),
    "slow-link.yaml": profile_with("bandwidth_per_direction: 25.0e+09", "bandwidth_per_direction: 1.0e-30"),
    "python-tag.yaml": "!!python/object/apply:os.system ['touch {tmp}/pwned']\n",
    "list.yaml": "- a100\n- h100\n",
    "blank.yaml": "",
    "typo.yaml": profile_with("devices_per_node: 8", "devices_per_node: 8\ndevice_per_node: 8"),
    "no-url.yaml": "\n".join(line for line in GOOD_PROFILE.splitlines() if not line.startswith("  url:")),
    "bidir.yaml": profile_with("bandwidth_bidirectional: 600.0e+09", "bandwidth_bidirectional: 300.0e+09"),
    "no-devices.yaml": profile_with("devices_per_node: 8", "devices_per_node: 0"),
    "one-node.yaml": GOOD_PROFILE[: GOOD_PROFILE.index("  inter_node:")]  # links end at the node
    + GOOD_PROFILE[GOOD_PROFILE.index("  host:") :],
    "bad-model.yaml": "name: m\nsource: x\nheads: 32\nkv_heads: 5\nhead_dim: 128\nlayers: 2\nhidden: 4096\n"
    "ffn_hidden: 1\nvocab: 1\n",
}

CASES: list[tuple[list[str], str]] = [
    # lengths
    (["--seq", "0"], "--seq"),
    (["--seq", "-5"], "--seq"),
    (["--seq", "abc"], "accepted: a positive integer"),
    (["--seq", "12q"], "256k"),
    (["--seq", "0.5"], "whole number"),
    (["--seq", ""], "--seq"),
    (["--n", "0"], "--cp: must be >= 1 (got 0)"),
    (["--n", "-1"], "--n"),
    (["--n", "eight"], "--n"),
    (["--seq", "512", "--n", "1024", "--block", "1"], "--cp: CP degree 1024 exceeds the sequence length"),
    (["--seq", "1000", "--n", "3", "--block", "8"], "--seq: 1000 tokens do not split evenly over N = 3"),
    (
        ["--seq", "20", "--n", "4", "--layout", "zigzag", "--block", "1"],
        "--seq: 20 tokens do not split evenly over 2N = 8",
    ),
    # shape
    (["--kv-heads", "64"], "--kv-heads: 64 exceeds --heads 32"),
    (["--kv-heads", "5"], "--kv-heads: 5 does not divide --heads 32"),
    (["--heads", "0"], "--heads: must be >= 1 (got 0)"),
    (["--head-dim", "0"], "--head-dim"),
    (["--batch", "0"], "--batch"),
    (["--block", "65536"], "--block: tile of 65536 tokens is larger than the shard S/N = 32768"),
    (["--block", "0"], "--block"),
    # choices
    (["--dtype", "int4"], "'bf16', 'fp16', 'fp32', 'fp8'"),
    (["--layout", "spiral"], "'contiguous', 'striped', 'zigzag'"),
    (["--format", "xml"], "'table', 'json', 'yaml', 'markdown'"),
    (["--hw", "nosuch"], "unknown hardware 'nosuch'; built-in: a100-ib, a100-nvlink"),
    (["--hw", "a100-nvlink", "--dtype", "fp8"], "--dtype: profile 'a100-nvlink' has no fp8 FLOP/s"),
    (
        ["--model", "nosuch"],
        "unknown model 'nosuch'; built-in: deepseek-v3, gemma-3-27b, gpt-1t, gpt-22b, gpt-530b",
    ),
    (["--model", "nosuch"], "or a path to a YAML file, or a Hugging Face config.json"),
    (["--efficiency", "0"], "--efficiency: must be >= 0.001 (got 0.0)"),
    (["--efficiency", "1.5"], "--efficiency"),
    (["--efficiency", "fast"], "--efficiency"),
    (["--bogus"], "No such option: --bogus"),
    (["formulas", "nosuch"], "NAME: unknown formula 'nosuch'; `cp-plan formulas` lists all"),
    (["formulas", "n_maxx"], "NAME: unknown formula 'n_maxx'; nearest: n_max;"),
    (["hw", "show", "nosuch"], "NAME: unknown hardware 'nosuch'"),
    # files
    (["--hw", "missing.yaml"], "--hw: missing.yaml: file not found"),
    (["--hw", "{tmp}/malformed.yaml"], "malformed YAML"),
    (
        ["--hw", "{tmp}/wrong-type.yaml"],
        "links.intra_node.bandwidth_per_direction: Input should be a valid number",
    ),
    (
        ["--hw", "{tmp}/negative-bw.yaml"],
        "bandwidth_per_direction: must be from 1e+06 to 1e+15 bytes/s (got -300000000000.0)",
    ),
    (["--hw", "{tmp}/slow-launch.yaml"], "kernels.launch_s: must be 0 or from 1e-09 to 1 s (got 1e+30)"),
    (
        ["--hw", "{tmp}/share-over-one.yaml"],
        "kernels.comm_sm_slowdown: must be 0 or from 1e-06 to 0.99 (a share of the device) (got 5.0)",
    ),
    (
        ["--hw", "{tmp}/slow-link.yaml"],
        "links.inter_node.bandwidth_per_direction: must be from 1e+06 to 1e+15 bytes/s (got 1e-30)",
    ),
    (["--inter-node-bandwidth", "1e-30Gb"], "below any link (1 MB/s); check the prefix"),
    (["--hw", "{tmp}/zero-flops.yaml"], "device.peak_flops.bf16: must be more than 0 (got 0.0)"),
    (["--hw", "{tmp}/python-tag.yaml"], "could not determine a constructor for the tag"),
    (["--hw", "{tmp}/list.yaml"], "expected a mapping of hardware fields (key: value lines), got a list"),
    (["--hw", "{tmp}/typo.yaml"], "device_per_node: unknown key"),
    (["--hw", "{tmp}/no-url.yaml"], "source: a datasheet profile must give source.url"),
    (["--hw", "{tmp}/bidir.yaml"], "is not twice bandwidth_per_direction"),
    (["--hw", "{tmp}/no-devices.yaml"], "devices_per_node: Input should be greater than or equal to 1"),
    (
        ["--hw", "{tmp}/one-node.yaml", "--n", "16"],  # a refusal after loading still names the user's file
        "--hw: {tmp}/one-node.yaml has no links.inter_node, but 16 CP ranks span nodes (8 per node)",
    ),
    (["--hw", "{tmp}"], "--hw"),
    (
        ["--hw", "{tmp}/blank.yaml"],
        "expected a mapping of hardware fields (key: value lines), got an empty document",
    ),
    (["--hw", ""], "--hw: an empty name; give one of the built-in hardware names (a100-ib, "),
    (["--model", " "], "--model: an empty name; give one of the built-in model names"),
    (["check", ""], "'': an empty path; give the path of a YAML file"),
    (
        ["step", "--model", "llama3-8b", "--global-batch", "8", "--attention-kernel", "FLASH"],
        "--attention-kernel: must be a name of 1 to 40 lower-case letters, digits and hyphens (e.g. sdpa-cudnn) "
        "(got 'FLASH')",
    ),
    (["--model", "{tmp}/bad-model.yaml"], "--model: {tmp}/bad-model.yaml: kv_heads 5 must divide heads 32"),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad")
    for name, text in FILES.items():
        (folder / name).write_text(text.replace("{tmp}", str(folder)))
    return folder


def test_there_are_at_least_25_distinct_cases() -> None:
    assert len({tuple(args) for args, _ in CASES}) >= 25


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(cli, bad_files: Path, args: list[str], expected: str) -> None:
    args = [a.replace("{tmp}", str(bad_files)) for a in args]
    result = cli(*args)
    assert result.code == 2, result.err
    assert result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("cp-plan: error: ")
    assert expected.replace("{tmp}", str(bad_files)) in lines[0]
    assert "Traceback" not in result.err


def test_python_tag_is_never_executed(cli, bad_files: Path) -> None:
    assert cli("--hw", str(bad_files / "python-tag.yaml")).code == 2
    assert not (bad_files / "pwned").exists()


def test_names_are_case_insensitive_and_a_near_miss_gets_suggestions(cli) -> None:
    assert cli("--hw", "H100-NVLink", "--seq", "64k").code == 0
    assert cli("--model", "Llama3-8B", "--seq", "64k").code == 0
    err = cli("--hw", "h100").err
    assert err.startswith("cp-plan: error: --hw: unknown hardware 'h100'; did you mean h100-ib, h100-nvlink")
    assert "did you mean a100-nvlink" in cli("--hw", "a100-nvlnk").err


def test_an_unknown_key_is_named_with_the_key_it_likely_meant(cli, tmp_path: Path) -> None:
    """A key missing beside the unknown one first (sequence: for the missing seq:, though sequence_parallel is
    nearer in letters), else the nearest of its place's keys, nested models followed (device.peak_flop)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: x\nmodel: llama3-8b\nsequence: 8k\ncp: 2\nhw: a100-nvlink\nglobal_bach: 8\n")
    err = cli("check", str(plan)).err
    assert "plan.yaml:3: sequence: unknown key; did you mean seq;" in err
    assert "plan.yaml:6: global_bach: unknown key; did you mean global_batch;" in err
    profile = tmp_path / "hw.yaml"
    profile.write_text(profile_with("hbm_bytes:", "hbm_byte:"))
    assert "device.hbm_byte: unknown key; did you mean hbm_bytes;" in cli("--hw", str(profile)).err
    model = tmp_path / "model.yaml"
    model.write_text("name: x\nlayers: 2\nheads: 4\nhiden: 64\n")
    assert "line 4: hiden: unknown key; did you mean hidden;" in cli("--model", str(model)).err
    assert "k0: unknown key;" in cli("check", str(_keys(tmp_path))).err  # nothing near: nothing said


def _keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text("name: x\nmodel: llama3-8b\nseq: 8k\ncp: 2\nhw: a100-nvlink\nk0: 1\nk1: 2\n")
    return path


@pytest.mark.parametrize("flag", ["--runtime-bytes", "--allocator-reserve"])
def test_a_framework_knob_below_the_smallest_quantity_is_one_line(cli, flag: str) -> None:
    """A knob that lands in the framework profile is held to the profile's own bounds where it is read: a
    denormal once passed the flag and failed in the profile, a traceback (found by the fuzz tests)."""
    result = cli("recommend", "--seq", "32k", "--model", "llama3-8b", "--gpus", "16", flag, "4.8e-169")
    assert result.code == 2 and result.out == ""
    assert result.err.splitlines() == [
        f"cp-plan: error: {flag}: must be 0 or in [1e-30, 1e+30] (got 4.8e-169)"
    ]


@pytest.mark.parametrize(
    ("value", "shown"),
    [(56.25, "56.3"), (1.234e20, "123,400,000,000,000,000,000"), (1e21, "1.00e+21"), (-3.2e28, "-3.20e+28")],
)
def test_a_figure_past_21_digits_is_printed_with_an_exponent_not_a_traceback(
    value: float, shown: str
) -> None:
    """Decimal's 28-digit context could not quantize a figure near 1e28 to its decimals; no plan's figure is
    that large, but a profile at the edge of what it accepts made one."""
    from costmodel.core.units import _sig

    assert _sig(value, 3) == shown


def test_the_default_tile_shrinks_to_a_shorter_shard_and_one_device_receives_nothing(cli) -> None:
    """4K tokens over the default N = 8 leave shards of 512: the kernel's 1,024-row tile runs one partial tile
    there (an explicit --block larger than the shard is still refused). At N = 1 nothing travels: green."""
    data = cli("--seq", "4k", "-f", "json").json()
    assert data["inputs"]["block"] == 512
    alone = cli("--seq", "64", "-n", "1", "--block", "1", "-f", "json").json()["verdict"]
    assert alone["comm_ratio_step"] == 0 and alone["verdict"] == "green"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--hw", "frameworks/megatron.yaml"],
            "--hw: frameworks/megatron.yaml: a framework profile (memory, time",
        ),
        (
            [
                "step",
                "--model",
                "hardware/a100-nvlink.yaml",
                "--seq",
                "8k",
                "--gpus",
                "8",
                "--global-batch",
                "8",
            ],
            "--model: hardware/a100-nvlink.yaml: a hardware profile (device, links at its top), not a model preset: "
            "give it to --hw",
        ),
        (
            ["check", "hardware/a100-nvlink.yaml"],
            "a hardware profile (device, links at its top), not a capacity plan",
        ),
    ],
)
def test_a_file_of_another_kind_says_what_it_is_and_where_it_goes(cli, monkeypatch, args, said) -> None:
    """Not a line of every key it lacks and every key it has."""
    monkeypatch.chdir(Path(__file__).parents[1])
    result = cli(*args)
    assert result.code == 2 and said in result.err and len(result.err.strip().splitlines()) == 1, result.err


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "cp_schemes: [ring, ulysses, usp, allgather]",
            "cp_schemes: [ring, warp]",
            "names 'warp'; accepted: ring",
        ),
        ("cp_layouts: [zigzag]", "cp_layouts: []", "time.cp_layouts: List should have at least 1 item"),
    ],
)
def test_a_framework_names_only_schemes_and_layouts_there_are(
    cli, tmp_path, old: str, new: str, said: str
) -> None:
    text = (Path(__file__).parents[1] / "frameworks" / "megatron.yaml").read_text()
    assert old in text
    (tmp_path / "fw.yaml").write_text(text.replace(old, new))
    args = ["step", "--model", "llama3-8b", "--seq", "8k", "--gpus", "8", "--global-batch", "8"]
    result = cli(*args, "--framework", str(tmp_path / "fw.yaml"))
    assert result.code == 2 and "--framework" in result.err and said in result.err, result.err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--zero", "0", "--zero-shard", "8"], "--zero-shard: shards ZeRO's states; --zero 0 shards nothing"),
        (
            ["--zero-shard", "3"],
            "--zero-shard: 3 must divide the 16 ranks holding the same weights (DP x CP)",
        ),
        (["--zero-shard", "0"], "--zero-shard"),
        (
            ["--model", "deepseek-v3", "--zero-shard", "8"],
            "--zero-shard: hybrid sharding of an MoE model (deepseek-v3) is not modelled",
        ),
    ],
)
def test_hybrid_sharding_that_cannot_run_is_refused_naming_the_flag(cli, flags: list[str], said: str) -> None:
    args = ["step", "--model", "llama3-8b", "--seq", "8k", "--gpus", "16", "--global-batch", "16"]
    result = cli(*args, *flags)
    assert result.code == 2 and said in result.err and len(result.err.strip().splitlines()) == 1, result.err
