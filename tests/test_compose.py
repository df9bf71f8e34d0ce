"""Profiles compose: bandwidth strings, and a device with other links or placement from flags."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from costmodel.calibration.fit import build_profile
from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine, build_machine
from costmodel.machines.compose import ProfileChanges, override, parse_bandwidth
from costmodel.machines.profiles import load_profile
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.job import Job
from costmodel.plans.timing import predict
from tests.support import TITAN_8B_8K
from tests.test_calibration import SHAPE, raw_measurements

BANDWIDTHS = [  # text, bytes/s per direction
    ("200Gb", 25e9),  # HDR InfiniBand: bits, lower-case b
    ("200Gb/s", 25e9),
    ("400 Gbit/s", 50e9),
    ("400 Gbps", 50e9),
    ("800Gbits/s", 100e9),
    ("25GB/s", 25e9),  # bytes, upper-case B
    ("50GB/s", 50e9),
    ("1.8TB/s", 1.8e12),
    ("450 GBps", 450e9),
    ("100 MB/s", 1e8),
    ("2.5e1GB/s", 25e9),
    ("0.5PB/s", 5e14),  # the most a link direction may be: 1 PB/s both ways
]


@pytest.mark.parametrize(("text", "expected"), BANDWIDTHS)
def test_bandwidth_strings(text: str, expected: float) -> None:
    assert parse_bandwidth(text, "--inter-node-bandwidth") == pytest.approx(expected, rel=1e-12)


HOSTILE = [
    ("", "is not a bandwidth"),
    ("fast", "is not a bandwidth"),
    ("50", "is not a bandwidth"),  # no unit: bits or bytes is the whole question
    ("-5GB/s", "is not a bandwidth"),
    ("nan GB/s", "is not a bandwidth"),
    ("inf", "is not a bandwidth"),
    ("1,800GB/s", "is not a bandwidth"),
    ("50 gb/s", "is not a bandwidth"),  # lower-case g is no decimal prefix
    ("25GB/s; rm -rf /", "is not a bandwidth"),
    ("0GB/s", "positive, finite"),
    ("1e999GB/s", "positive, finite"),
    ("50 GiB/s", "binary prefixes"),
    ("2e6TB/s", "beyond any link"),
    ("9" * 5000 + "GB/s", "positive, finite"),
]


@pytest.mark.parametrize(("text", "why"), HOSTILE)
def test_hostile_bandwidth_strings_name_the_flag(text: str, why: str) -> None:
    with pytest.raises(InputError, match=why) as caught:
        parse_bandwidth(text, "--intra-node-bandwidth")
    assert caught.value.field == "--intra-node-bandwidth"


@given(value=st.floats(8.0, 999.0), prefix=st.sampled_from(["M", "G", "T"]))  # from 1 MB/s, the least link
def test_bits_are_an_eighth_of_bytes(value: float, prefix: str) -> None:
    bits, octets = (
        parse_bandwidth(f"{value!r}{prefix}b/s", "f"),
        parse_bandwidth(f"{value!r}{prefix}B/s", "f"),
    )
    assert bits == pytest.approx(octets / 8, rel=1e-12)


def test_article_beta_6240_reproduces_on_a100_with_400_gbps(cli) -> None:
    """F / B = 312e12 / 50e9 = 6,240 FLOP/byte on the inter-node link at N = 16 [A-RingCost §4]."""
    data = cli(
        "--seq", "256k", "--n", "16", "--hw", "a100-nvlink", "--inter-node-bandwidth", "50GB/s", "-f", "json"
    ).json()["hardware"]
    assert data["link_scope"] == "inter-node" and data["link_bandwidth"] == 50e9
    assert data["beta_peak"] == pytest.approx(6240, rel=1e-12)
    real = cli("--seq", "256k", "--n", "16", "--hw", "a100-nvlink", "-f", "json").json()["hardware"]
    assert real["beta_peak"] == pytest.approx(12_480, rel=1e-12)  # HDR 200 Gb/s: 312e12 / 25e9


def test_h100_over_200g_roce_is_a_command_line(cli) -> None:
    data = cli(
        "--seq", "256k", "--n", "16", "--hw", "h100-nvlink", "--inter-node-bandwidth", "200Gb/s", "-f", "json"
    ).json()["hardware"]
    assert data["link_bandwidth"] == 25e9 and data["devices_per_node"] == 8
    assert data["beta_peak"] == pytest.approx(989e12 / 25e9, rel=1e-12)


def test_override_is_validated_and_says_so() -> None:
    base = load_profile("a100-nvlink")
    changed = override(
        base, ProfileChanges(inter_bandwidth="400Gb", intra_bandwidth=150e9, inter_latency=5e-6)
    )
    assert changed.links.inter_node.bandwidth_per_direction == 50e9
    assert changed.links.inter_node.bandwidth_bidirectional == 100e9
    assert changed.links.inter_node.latency_s == 5e-6
    assert changed.links.intra_node.bandwidth_per_direction == 150e9
    assert "overridden" in changed.description and "InfiniBand HDR 200 Gb/s" in changed.description
    assert "Overridden on the command line: inter-node 50 GB/s" in changed.source.notes
    assert changed.device == base.device and changed.name == base.name
    assert override(base, ProfileChanges()) is base  # nothing asked, nothing changed


def test_a_part_with_other_memory_keeps_its_profile_and_its_sustained_share() -> None:
    """torchtitan's 96 GB HBM2e H100 at 2.4 TB/s on the H100 profile: the size and the bandwidth are the part's,
    a process allocates the profile's share of the size (79.11 GiB of 80 GB) and memory-bound kernels reach
    the profile's measured share of the bandwidth (2.68 / 3.35), nothing else moves."""
    base = load_profile("h100-nvlink")
    part = override(base, ProfileChanges(hbm_bytes=96e9, hbm_bandwidth="2.4TB/s"))
    assert part.device.hbm_bytes == 96e9 and part.device.hbm_bandwidth == 2.4e12
    assert part.device.usable_bytes == pytest.approx(96e9 * 79.11 * 2**30 / 80e9, rel=1e-5)
    assert part.device.hbm_sustained == pytest.approx(2.4e12 * 2.68 / 3.35, rel=1e-12)
    assert part.kernels == base.kernels and part.links == base.links
    assert "HBM 96 GB (was 80 GB)" in part.description and "HBM 2.4 TB/s (was 3.35 TB/s)" in part.description


def test_more_memory_makes_a_plan_fit_and_slower_memory_a_step_longer(cli) -> None:
    """torchtitan's 8B at 8K on eight H100s (FSDP, local batch 2, selective recompute) needs more than an 80 GB
    H100's usable share, and ran on the 96 GB part: there it fits, and its elementwise passes, memory-bound,
    take 3.35 / 2.4 as long."""
    flags = TITAN_8B_8K
    before = cli(*flags, "-f", "json").json()
    after = cli(*flags, "--hbm-bytes", "96e9", "--hbm-bandwidth", "2.4TB/s", "-f", "json").json()
    assert not before["memory"]["fits"] and after["memory"]["fits"]
    assert after["memory"]["bytes_per_device"] == before["memory"]["bytes_per_device"]
    assert after["memory"]["device_memory_bytes"] == pytest.approx(
        before["memory"]["device_memory_bytes"] * 96 / 80, rel=1e-9
    )
    elementwise = before["step"]["breakdown"]["elementwise_s"]
    assert after["step"]["breakdown"]["elementwise_s"] == pytest.approx(elementwise * 3.35 / 2.4, rel=1e-6)


def test_a_part_at_a_lower_clock_runs_its_compute_bound_kernels_at_that_share(cli) -> None:
    """The same chip at a lower power limit (--clock-scale): the multiplies and attention take 1/0.9 as long,
    the memory-bound passes and the memory do not move, and the MFU keeps the profile's peak as its
    denominator (it falls as the step lengthens)."""
    flags = (*TITAN_8B_8K, "--hbm-bytes", "96e9", "--hbm-bandwidth", "2.4TB/s")
    before = cli(*flags, "-f", "json").json()
    after = cli(*flags, "--clock-scale", "0.9", "-f", "json").json()
    was, now = before["step"]["breakdown"], after["step"]["breakdown"]
    for term in ("matmul_s", "attention_s"):
        assert now[term] == pytest.approx(was[term] / 0.9, rel=1e-6)
    assert now["elementwise_s"] == was["elementwise_s"]
    assert after["memory"]["bytes_per_device"] == before["memory"]["bytes_per_device"]
    step = after["step"]["time_s"] / before["step"]["time_s"]
    assert after["step"]["mfu"] == pytest.approx(before["step"]["mfu"] / step, rel=1e-9)
    assert after["inputs"]["clock_scale"] == 0.9 and "clock_scale" not in before["inputs"]
    assert after["inputs"]["hbm_bandwidth"] == "2.4TB/s"  # the JSON says which part it priced
    assert after["rates"]["source"].endswith("read at 0.787 of their clock as a sustained load holds it")
    part = override(load_profile("h100-nvlink"), ProfileChanges(clock_scale=0.9))
    assert part.kernels.sustained_clock == pytest.approx(0.874 * 0.9, rel=1e-12)
    assert part.device == load_profile("h100-nvlink").device and "sustained clock 0.9" in part.description


def test_hw_show_prints_the_part_every_override_makes(cli) -> None:
    """`hw show` takes the same changes as a plan: the 96 GB, 2.4 TB/s, 0.922-clock H100 of torchtitan's rows."""
    flags = ("--hbm-bytes", "96e9", "--hbm-bandwidth", "2.4TB/s", "--clock-scale", "0.922")
    shown = yaml.safe_load(cli("hw", "show", "h100-nvlink", *flags).out)
    assert shown["device"]["hbm_bytes"] == 96e9 and shown["device"]["hbm_bandwidth"] == 2.4e12
    assert shown["kernels"]["sustained_clock"] == pytest.approx(0.874 * 0.922, rel=1e-12)


def test_a_job_made_again_applies_the_command_lines_changes_once(cli) -> None:
    """A search's candidates and what-ifs make the job again (Job.replace, Job.training, Job.on): each applies
    --clock-scale to the profile as loaded, once; applied to the changed profile it would compound (0.9 four
    times over in recommend's what-ifs read its clock at 0.573 of the tables' before this test)."""
    job = Job.of(model="llama3-8b", seq=8192, hw="h100-nvlink", gpus=8, global_batch=16, clock_scale=0.9)
    once = pytest.approx(0.874 * 0.9, rel=1e-12)
    for again in (job, job.replace(seq=16384).replace(gpus=16), job.training(), job.candidate(tp=2)):
        assert again.machine.profile.kernels.sustained_clock == once
    slower = build_machine(job.machine.profile, changes={"inter_bandwidth": 25e9})
    what_if = job.on(slower).replace(seq=16384)  # a what-if's link stays, and the clock is not applied again
    assert what_if.machine.profile.kernels.sustained_clock == once
    assert what_if.machine.profile.links.inter_node.bandwidth_per_direction == 25e9
    changed = cli(
        "recommend",
        "--model",
        "llama3-8b",
        "--seq",
        "32k",
        "--gpus",
        "16",
        "--global-batch",
        "16",
        "--hw",
        "h100-nvlink",
        "--clock-scale",
        "0.9",
        "-f",
        "json",
    ).json()["changed"]
    assert changed == "sustained clock 0.9 of the profile's (0.787 of the tables', was 0.874)"


def test_every_table_says_what_the_command_line_changed_in_the_profile(cli) -> None:
    """A plan on a changed part names the change wherever it prints the machine: the single layer's machine
    line, the step's header, infer's, recommend's, each profile of a sweep; a placement restated as it is
    changes nothing."""
    said = "sustained clock 0.9 of the profile's (0.787 of the tables', was 0.874)"
    flags = ("--hw", "h100-nvlink", "--clock-scale", "0.9")

    def text(*args: str) -> str:  # the table's words, whatever the terminal's width wrapped
        return " ".join(cli(*args).out.split())

    assert f"changed: {said}" in text("--seq", "64k", "--n", "8", *flags)
    assert said in text(*TITAN_8B_8K, "--clock-scale", "0.9")
    assert said in text("infer", "--model", "llama3-8b", "--prompt", "1024", "--output", "8", *flags)
    assert said in text("sweep", "--seq", "64k", "--cp", "4,8", *flags)
    restated = cli("--seq", "64k", "--n", "8", "--hw", "h100-ib", "--cp-ranks-per-node", "1", "-f", "json")
    assert restated.json()["hardware"]["changed"] == ""


def test_a_lower_clock_needs_kernel_tables_and_a_clock_a_profile_accepts() -> None:
    with pytest.raises(InputError, match="no kernel tables: its compute runs at --efficiency") as caught:
        override(load_profile("mi300x-xgmi"), ProfileChanges(clock_scale=0.9))
    assert caught.value.field == "--clock-scale"
    with pytest.raises(InputError, match="under the 0.5 a profile accepts; give at least 0.572"):
        override(load_profile("h100-nvlink"), ProfileChanges(clock_scale=0.5))
    # a deployment that holds its boost clock under load reads the tables as measured, and no faster
    boost = override(load_profile("h100-nvlink"), ProfileChanges(clock_scale=1 / 0.874))
    assert boost.kernels.sustained_clock == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(InputError, match="over the tables' own \\(boost\\) clock; give at most 1.144"):
        override(load_profile("h100-nvlink"), ProfileChanges(clock_scale=1.2))


def test_fast_domain_size_moves_where_the_ring_leaves_it() -> None:
    nvlink = override(load_profile("h100-nvlink"), ProfileChanges(devices_per_node=4))
    assert nvlink.ranks_per_node == 4  # CP ranks filled the node and still do
    assert Machine(nvlink).scope(4) == "intra-node" and Machine(nvlink).scope(5) == "inter-node"
    ib = override(load_profile("h100-ib"), ProfileChanges(devices_per_node=4))
    assert ib.ranks_per_node == 1  # one CP rank per node stays one
    placed = override(load_profile("h100-nvlink"), ProfileChanges(cp_ranks_per_node=2))
    assert placed.devices_per_node == 8 and Machine(placed).scope(3) == "inter-node"


@pytest.mark.parametrize(
    ("kwargs", "field", "why"),
    [
        ({"devices_per_node": 0}, "--devices-per-node", "at least 1"),
        ({"cp_ranks_per_node": 9}, "--cp-ranks-per-node", "exceeds the 8 devices"),
        ({"devices_per_node": 2, "cp_ranks_per_node": 4}, "--cp-ranks-per-node", "exceeds the 2 devices"),
        ({"inter_bandwidth": -1.0}, "--inter-node-bandwidth", "positive, finite"),
        ({"inter_bandwidth": float("nan")}, "--inter-node-bandwidth", "positive, finite"),
        ({"inter_latency": -1.0}, "--inter-node-latency", "non-negative"),
        ({"hbm_bytes": 0.0}, "--hbm-bytes", "positive, finite"),
        ({"hbm_bandwidth": "fast"}, "--hbm-bandwidth", "not a bandwidth"),
        ({"hbm_bandwidth": float("inf")}, "--hbm-bandwidth", "positive, finite"),
        # the profile sustains 0.726 of its HBM rate, and the sustained rate is a bandwidth of 1 MB/s at least
        ({"hbm_bandwidth": "1MB/s"}, "--hbm-bandwidth", "accepted: 1.38e\\+06 to 1e\\+15 bytes/s"),
        (
            {"inter_bandwidth": "1PB/s"},
            "--inter-node-bandwidth",
            "accepted: at most 5e\\+14 \\(1 PB/s both ways",
        ),
        ({"clock_scale": 0.0}, "--clock-scale", "a positive share of the profile's clock"),
        ({"clock_scale": float("nan")}, "--clock-scale", "a positive share of the profile's clock"),
        ({"clock_scale": 1.2}, "--clock-scale", "over the tables' own \\(boost\\) clock; give at most 1$"),
    ],
)
def test_bad_overrides_name_their_flag(kwargs: dict, field: str, why: str) -> None:
    with pytest.raises(InputError, match=why) as caught:
        override(load_profile("a100-nvlink"), ProfileChanges(**kwargs))
    assert caught.value.field == field


def test_a_new_link_forgets_what_was_measured_on_the_old_one() -> None:
    measured = build_profile(raw_measurements(), "box", SHAPE, date="2026-11-30")
    inputs = PlanInputs(seq=16_384, n=2, heads=8, kv_heads=8, head_dim=64, dtype="fp32", block=1024)
    assert "intra-node" in measured.calibration.p2p
    faster = override(measured, ProfileChanges(intra_bandwidth="1TB/s"))
    assert "intra-node" not in faster.calibration.p2p and "intra-node" not in faster.calibration.alltoall
    assert faster.links.intra_node.alltoall is None
    # the measured compute curve stays; only the link is new, so the layer can only get faster
    assert (
        predict(inputs, Machine(faster, "fp32")).forward_s
        < predict(inputs, Machine(measured, "fp32")).forward_s
    )


@pytest.mark.parametrize(
    ("hw", "flags"),
    [
        ("a100-nvlink", ["--intra-node-bandwidth", "300GB/s"]),
        ("h100-ib", ["--inter-node-bandwidth", "400Gb", "--intra-node-bandwidth", "450GB/s"]),
    ],
)
def test_a_link_given_the_bandwidth_it_has_changes_no_figure(cli, hw: str, flags: list[str]) -> None:
    """Only the bandwidth of an overridden link changes: its collective efficiency and latencies stay, so the
    profile's own bandwidth gives back the profile's step (the A100's ring collective efficiency was once
    dropped, and a TP 8 step read 5.7 % fast)."""
    job = ["step", "--model", "llama3-8b", "--seq", "8k", "--gpus", "64", "--global-batch", "64"]
    job += ["--recompute", "none", "--tp", "8", "--format", "json"]

    def seconds(*extra: str) -> float:
        result = cli(*job, "--hw", hw, *extra)
        assert result.code == 0, result.err
        return json.loads(result.out)["step"]["time_s"]

    assert seconds(*flags) == pytest.approx(seconds(), rel=1e-12)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--inter-node-bandwidth", "fast"),
        ("--intra-node-bandwidth", "50"),
        ("--devices-per-node", "0"),
        ("--cp-ranks-per-node", "99"),
    ],
)
def test_cli_rejects_bad_composition_in_one_line(cli, flag: str, value: str) -> None:
    result = cli("--hw", "a100-nvlink", flag, value)
    assert result.code == 2 and result.err.count("\n") == 1 and flag in result.err
