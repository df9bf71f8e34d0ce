"""Hardware profiles: the built-ins validate, cite their source, and carry the SPEC §8 figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.core.errors import InputError
from costmodel.core.resources import data_dir
from costmodel.machines.binding import LinkBinding, Machine
from costmodel.machines.profiles import builtin_names, load_profile

SPEC_8 = {  # name: (bf16 peak FLOP/s, ring link bandwidth per direction at N = 8, HBM bytes or None)
    "a100-nvlink": (312e12, 300e9, 80e9),
    "a100-ib": (312e12, 50e9, 80e9),
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
        assert link.latency_s == 0.0  # SPEC §2: datasheet profiles carry no alpha
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
