"""Hardware profiles: the built-ins validate, cite their source, and carry the SPEC §8 figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.core.errors import InputError
from costmodel.core.resources import data_dir
from costmodel.machines.profiles import builtin_names, load_profile

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
    assert profile.link_for(8)[0].bandwidth_per_direction == link_bw
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
    nvlink = load_profile("a100-nvlink")
    assert nvlink.link_for(8)[1] == "intra-node"
    assert nvlink.link_for(16) == (nvlink.links.inter_node, "inter-node")
    ib = load_profile("a100-ib")
    assert ib.link_for(2)[1] == "inter-node"


def test_measured_rate_wins_over_peak_times_efficiency(tmp_path: Path) -> None:
    text = (data_dir("hardware") / "a100-nvlink.yaml").read_text()
    text = text.replace("  hbm_bytes:", "  effective_flops:\n    bf16: 150.0e+12\n  hbm_bytes:")
    path = tmp_path / "measured.yaml"
    path.write_text(text)
    assert load_profile(str(path)).flops("bf16", 0.5) == (312e12, 150e12)
    assert load_profile("a100-nvlink").flops("bf16", 0.5) == (312e12, 156e12)


def test_missing_dtype_lists_what_the_profile_has() -> None:
    with pytest.raises(InputError, match="no fp8 FLOP/s; it has: bf16, fp16, fp32"):
        load_profile("a100-nvlink").flops("fp8", 1.0)
