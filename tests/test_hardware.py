"""Hardware profiles: the built-ins validate, cite their source, and carry the docs/hardware.md figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from costmodel.core.errors import InputError
from costmodel.core.resources import data_dir
from costmodel.machines import builtin_profiles, profiles
from costmodel.machines.binding import LinkBinding, Machine
from costmodel.machines.profiles import (
    BYTES_PER_ELEMENT,
    builtin_names,
    load_profile,
    parse_profile,
    read_profile,
)
from tests.support import REPO

SPEC_8 = {  # name: (bf16 peak FLOP/s, ring link bandwidth per direction at N = 8, HBM bytes or None)
    "a100-nvlink": (312e12, 300e9, 80e9),
    "a100-ib": (312e12, 25e9, 80e9),  # HDR 200 Gb/s, one ConnectX-6 per GPU [DGX-A100]
    "h100-nvlink": (989e12, 450e9, 80e9),
    "h100-ib": (989e12, 50e9, 80e9),
    "h800-nvlink": (989e12, 200e9, 80e9),
    "h800-ib": (989e12, 50e9, 80e9),
    "a800-nvlink": (312e12, 200e9, 80e9),
    "h200-nvlink": (989e12, 450e9, 141e9),
}


def test_all_spec_profiles_are_built_in() -> None:
    assert set(SPEC_8) <= set(builtin_names())


@pytest.mark.parametrize("name", sorted(SPEC_8))
def test_spec_8_figures(name: str) -> None:
    peak, link_bw, hbm = SPEC_8[name]
    profile = load_profile(name)
    assert profile.name == name
    assert profile.device.peak_flops["bf16"] == peak
    assert Machine(profile).link(8).bandwidth == link_bw
    assert profile.device.hbm_bytes == hbm


@pytest.mark.parametrize("name", builtin_names())
def test_profile_cites_source_and_states_both_directions(name: str) -> None:
    profile = load_profile(name)
    assert profile.source.kind == "datasheet" and profile.source.url.startswith("https://")
    for link in (profile.links.intra_node, profile.links.inter_node):
        assert link is not None
        assert link.bandwidth_bidirectional == 2 * link.bandwidth_per_direction
        assert link.latency_s == 0.0  # [A-RingCost §2]: datasheet profiles carry no alpha
    text = (data_dir("hardware") / f"{name}.yaml").read_text()
    assert "PER DIRECTION" in text and "bidirectional" in text


def test_ring_leaves_the_node_beyond_cp_ranks_per_node() -> None:
    nvlink = Machine(load_profile("a100-nvlink"))
    assert nvlink.link(8).scope == "intra-node"
    inter = nvlink.profile.links.inter_node
    assert nvlink.link(16) == LinkBinding(inter.name, "inter-node", inter.bandwidth_per_direction, 0.0)
    assert Machine(load_profile("a100-ib")).link(2).scope == "inter-node"


def test_tp_placement_moves_cp_neighbours_off_the_node() -> None:
    """TP innermost: with TP 8 on 8-GPU nodes every CP neighbour is on another node."""
    placed = Machine(load_profile("h100-nvlink")).placed(8)
    assert placed.ranks_per_node == 1 and placed.link(2).scope == "inter-node"
    assert Machine(load_profile("h100-nvlink")).placed(2).link(4).scope == "intra-node"


def test_measured_rate_wins_over_peak_times_efficiency(tmp_path: Path) -> None:
    text = (data_dir("hardware") / "a100-nvlink.yaml").read_text()
    text = text.replace("  hbm_bytes:", "  effective_flops:\n    bf16: 150.0e+12\n  hbm_bytes:")
    path = tmp_path / "measured.yaml"
    path.write_text(text)
    measured = Machine(load_profile(str(path)), "bf16", 0.5)
    assert (measured.peak_flops, measured.effective_flops) == (312e12, 150e12)
    sheet = Machine(load_profile("a100-nvlink"), "bf16", 0.5)
    assert (sheet.peak_flops, sheet.effective_flops) == (312e12, 156e12)
    assert sheet.as_datasheet().effective_flops == 312e12


def test_missing_dtype_lists_what_the_profile_has() -> None:
    with pytest.raises(InputError, match="no fp8 FLOP/s; it has: bf16, fp16, fp32"):
        Machine(load_profile("a100-nvlink"), "fp8")


# name: (vendor, intra-node both ways, inter-node per direction, fast domain, first N whose ring leaves it)
TOPOLOGY = {
    "a100-ib": ("NVIDIA", 600e9, 25e9, 8, 2),  # one CP rank per node: N = 2 already crosses
    "a100-nvlink": ("NVIDIA", 600e9, 25e9, 8, 9),  # HDR 200 Gb/s, one ConnectX-6 per GPU [DGX-A100]
    "a800-nvlink": ("NVIDIA", 400e9, 25e9, 8, 9),
    "b200-nvlink": ("NVIDIA", 1.8e12, 50e9, 8, 9),  # NVLink 5, 400 Gb/s ConnectX-7 [DGX-B200]
    "gb200-nvl72": ("NVIDIA", 1.8e12, 50e9, 72, 73),  # the rack is one NVLink domain
    "h100-ib": ("NVIDIA", 900e9, 50e9, 8, 2),
    "h100-nvlink": ("NVIDIA", 900e9, 50e9, 8, 9),
    "h20-nvlink": ("NVIDIA", 900e9, 50e9, 8, 9),
    "h200-nvlink": ("NVIDIA", 900e9, 50e9, 8, 9),
    "h800-ib": ("NVIDIA", 400e9, 50e9, 8, 2),
    "h800-nvlink": ("NVIDIA", 400e9, 50e9, 8, 9),
    "mi300x-xgmi": ("AMD", 128e9, 50e9, 8, 9),  # one 128 GB/s xGMI link per peer, not the 896 GB/s sum
    "mi325x-xgmi": ("AMD", 128e9, 50e9, 8, 9),
    "tpu-v5p-ici": ("Google", 200e9, 6.25e9, 6144, 6145),  # 1200 GB/s per chip over 6 links; DCN 50 Gb/s
    "tpu-v5e-ici": ("Google", 100e9, 3.125e9, 256, 257),  # 400 GB/s per chip over 4 ports; DCN 25 Gb/s
}


def test_topology_table_covers_every_built_in() -> None:
    assert set(TOPOLOGY) == set(builtin_names())


@pytest.mark.parametrize("name", sorted(TOPOLOGY))
def test_links_fast_domain_and_where_the_ring_leaves_it(name: str) -> None:
    vendor, intra_both, inter_one_way, domain, leaves = TOPOLOGY[name]
    profile = load_profile(name)
    assert profile.device.vendor == vendor and profile.device.generation
    intra, inter = profile.links.intra_node, profile.links.inter_node
    assert intra.bandwidth_bidirectional == intra_both
    assert intra.bandwidth_per_direction == pytest.approx(intra_both / 2, rel=1e-12)
    assert inter.bandwidth_per_direction == inter_one_way
    assert profile.devices_per_node == domain
    machine = Machine(profile)
    assert machine.link(leaves - 1).scope == "intra-node"
    assert (
        machine.link(leaves).scope == "inter-node"
        and machine.link(leaves).bandwidth == inter.bandwidth_per_direction
    )


PEAKS = {  # name: (dense bf16, dense fp8 or None, dense fp4 or None) FLOP/s, from each source.url
    "b200-nvlink": (2.25e15, 4.5e15, 9e15),
    "gb200-nvl72": (2.5e15, 5e15, 10e15),
    "h20-nvlink": (148e12, 296e12, None),
    "mi300x-xgmi": (1307.4e12, 2614.9e12, None),
    "mi325x-xgmi": (1307.4e12, 2614.9e12, None),
    "tpu-v5p-ici": (459e12, 459e12, None),
    "tpu-v5e-ici": (197e12, None, None),
}


@pytest.mark.parametrize("name", sorted(PEAKS))
def test_new_profiles_dense_peaks(name: str) -> None:
    bf16, fp8, fp4 = PEAKS[name]
    device = load_profile(name).device
    assert device.peak_flops["bf16"] == bf16
    assert device.peak_flops.get("fp8") == fp8
    assert (device.low_precision_peak_flops or {}).get("fp4") == fp4


def test_fp4_is_shown_but_not_an_attention_dtype(cli) -> None:
    assert "fp4" not in BYTES_PER_ELEMENT  # half a byte, plus block scales: no whole bytes per element
    result = cli("--hw", "b200-nvlink", "--dtype", "fp4")
    assert result.code == 2 and result.err.count("\n") == 1
    shown = yaml.safe_load(cli("hw", "show", "b200-nvlink").out)
    assert shown["device"]["low_precision_peak_flops"] == {"fp6": 4.5e15, "fp4": 9e15}


def test_hw_show_names_every_source(cli) -> None:
    out = cli("hw", "show", "a100-ib").out
    assert out.startswith("# source (profile): https://")
    assert (
        "# source (links.inter_node): https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
        "nvidia-dgx-a100-datasheet.pdf" in out
    )


def test_hw_list_json_lists_every_profile_with_its_fields(cli) -> None:
    listing = cli("hw", "list", "--format", "json").json()["profiles"]
    assert sorted(p["name"] for p in listing) == builtin_names()
    by_name = {p["name"]: p for p in listing}
    assert by_name["gb200-nvl72"]["devices_per_node"] == 72
    assert by_name["mi300x-xgmi"]["links"]["intra_node"]["bandwidth_per_direction"] == 64e9
    assert load_profile("tpu-v5p-ici").model_dump(mode="json", exclude_none=True) == by_name["tpu-v5p-ici"]


def test_hw_list_table_groups_by_vendor_and_generation(cli) -> None:
    out = cli("hw", "list").out
    order = [
        out.index(family)
        for family in ("AMD CDNA 3", "Google TPU v5", "NVIDIA Ampere", "NVIDIA Blackwell", "NVIDIA Hopper")
    ]
    assert order == sorted(order)
    assert out.index("NVIDIA Blackwell") < out.index("gb200-nvl72") < out.index("NVIDIA Hopper")


def _identical(built: object, validated: object, where: str = "profile") -> None:
    """The same tree: each model of the same class with the same fields given and private values, each
    value of the same type and equal (NaN to NaN)."""
    assert type(built) is type(validated), where
    if isinstance(validated, BaseModel):
        assert built.model_fields_set == validated.model_fields_set, where
        assert built.__pydantic_private__ == validated.__pydantic_private__, where
        assert built.__pydantic_extra__ == validated.__pydantic_extra__, where
        assert built.__dict__.keys() == validated.__dict__.keys(), where
        for name, value in validated.__dict__.items():
            _identical(built.__dict__[name], value, f"{where}.{name}")
    elif isinstance(validated, list | tuple):
        assert len(built) == len(validated), where
        for i, (a, b) in enumerate(zip(built, validated, strict=True)):
            _identical(a, b, f"{where}[{i}]")
    elif isinstance(validated, dict):
        assert list(built) == list(validated), where
        for key in validated:
            _identical(built[key], validated[key], f"{where}.{key}")
    else:
        assert built == validated or (built != built and validated != validated), where


@pytest.mark.parametrize("name", builtin_names())
def test_a_built_in_profile_is_built_as_its_yaml_validates(name: str) -> None:
    """load_profile builds a built-in from costmodel/machines/builtin_profiles.py (model_construct, no
    validation): the very tree reading and validating its YAML gives."""
    built = profiles._prebuilt(name, "--hw")
    assert built is not None, (
        f"{name}: no generated entry, or its YAML changed; run python -m costmodel.codegen"
    )
    _identical(built, read_profile(name))
    assert load_profile(name.upper()) is not built and load_profile(name.upper()) == built  # names: any case


def test_an_edited_built_in_or_a_users_file_is_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a built-in whose YAML still hashes as codegen saw it skips validation; a changed one, and any
    file named by path, is read and validated: an invalid copy is refused with its line."""
    monkeypatch.setitem(
        builtin_profiles.PROFILES, "a100-nvlink", ("0" * 64, builtin_profiles.PROFILES["a100-nvlink"][1])
    )
    validated = []
    monkeypatch.setattr(
        profiles, "parse_profile", lambda *args, **kw: validated.append(args[1]) or parse_profile(*args, **kw)
    )
    builtin = data_dir("hardware") / "a100-nvlink.yaml"
    edited = load_profile("a100-nvlink")  # its hash no longer matches: read and validated
    assert validated == [str(builtin)]
    text = builtin.read_text(encoding="utf-8")
    copy = tmp_path / "mine.yaml"
    copy.write_text(text, encoding="utf-8")
    assert load_profile(str(copy)) == edited and validated[-1] == str(copy)
    copy.write_text(text.replace("devices_per_node: 8", "devices_per_node: -8"), encoding="utf-8")
    with pytest.raises(InputError, match="devices_per_node"):
        load_profile(str(copy))


@pytest.mark.parametrize("name", ["a100-nvlink", "a100-ib", "a800-nvlink"])
def test_ampere_nvlink_rings_are_the_ones_measured_on_an_a100_node(name: str) -> None:
    """The A100-class profiles' ring collectives are the fit to vTrain's A100 all-reduce tables that its
    cluster's profile holds (an A800's eight links at the same share of each), not a second copy to drift."""
    measured = read_profile(str(REPO / "tests" / "data" / "runs" / "a100-vtrain.yaml")).links.intra_node
    link = load_profile(name).links.intra_node
    for field in ("collective_efficiency", "hop_latency_s", "call_latency_s"):
        assert getattr(link, field) == getattr(measured, field), field


# What a process can allocate on each part: the total torch.cuda.mem_get_info() reports, in GiB [GPU-Capacity].
ALLOCATABLE_GIB = {
    "a100-nvlink": 79.15,
    "a100-ib": 79.15,
    "a800-nvlink": 79.15,
    "h100-nvlink": 79.11,
    "h100-ib": 79.11,
    "h800-nvlink": 79.11,
    "h800-ib": 79.11,
    "h200-nvlink": 139.80,
    "b200-nvlink": 178.35,
}


@pytest.mark.parametrize("name", builtin_names())
def test_a_profile_plans_with_what_a_process_can_allocate(name: str) -> None:
    """Where the runtime's total is published the plan's memory is that, within the datasheet's GB read as GiB
    (an '80 GB' part: 79.1 GiB, 84.9e9 bytes, not 80e9); elsewhere the datasheet's figure."""
    device = load_profile(name).device
    expected = ALLOCATABLE_GIB.get(name)
    if expected is None:
        assert device.allocatable_bytes is None and device.usable_bytes == device.hbm_bytes
        return
    assert device.usable_bytes == pytest.approx(expected * 2**30, rel=1e-5)
    assert device.hbm_bytes < device.usable_bytes <= device.hbm_bytes * 2**30 / 1e9


def test_a_profile_cannot_allocate_more_than_its_device_holds(tmp_path) -> None:
    text = (data_dir("hardware") / "h100-nvlink.yaml").read_text()
    text = text.replace("  allocatable_bytes: 8.49437e+10", "  allocatable_bytes: 8.6e+10")
    path = tmp_path / "big.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match="allocatable_bytes 8.6e\\+10 passes hbm_bytes 8e\\+10 read as GiB"):
        load_profile(str(path))


def test_a_shape_class_measured_twice_is_refused_not_read_first_come(tmp_path) -> None:
    data = yaml.safe_load((data_dir("hardware") / "a100-nvlink.yaml").read_text())
    first = data["kernels"]["attention"][
        0
    ]  # a copy 100x slower: every list its own (YAML aliases are refused)
    twin = {**first, "seq": list(first["seq"]), "flops_per_s": [rate / 100 for rate in first["flops_per_s"]]}
    data["kernels"]["attention"].append(twin)
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        InputError, match="two attention curves for head_dim 128, causal False, backward False"
    ):
        load_profile(str(path))


def test_a_file_that_is_no_profile_is_not_echoed_back_line_by_line(cli, tmp_path) -> None:
    """Any text file given as a profile parses as YAML keys: the line names the first five, then a count."""
    path = tmp_path / "passwd.yaml"
    path.write_text("".join(f"user{i}: x\n" for i in range(30)))
    result = cli("--hw", str(path))
    assert result.code == 2 and result.err.count("\n") == 1 and len(result.err) < 400, result.err
    # 25 more unknown keys, and the fields a profile needs that the file lacks
    assert re.search(r"line 5: user4: unknown key; and \d\d more problems$", result.err.strip()), result.err
    assert "user5" not in result.err
