"""Topology as data: where a ring leaves the fast domain on each network shape, and the bandwidth every
collective gets there (ring hop, all-to-all bisection, all-gather on a torus, NICs and rails beyond)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.machines.binding import Machine
from costmodel.machines.compose import ProfileChanges, override
from costmodel.machines.profiles import builtin_names, load_profile, parse_profile
from costmodel.machines.topology import MEGATRON_ORDER, parse_order, strides
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step
from tests.support import REPO

GB = 1e9

# (profile, TP degree before CP, the largest CP ring that stays in the fast domain, its link per direction
# inside, per direction beyond). TP t divides the domain: a node holds domain / t CP ranks.
LEAVES = [
    ("h100-nvlink", 1, 8, 450 * GB, 50 * GB),  # 8-GPU NVSwitch node
    ("h100-nvlink", 8, 1, 450 * GB, 50 * GB),  # TP fills the node: every CP hop is inter-node
    ("b200-nvlink", 2, 4, 900 * GB, 50 * GB),
    ("gb200-nvl72", 1, 72, 900 * GB, 50 * GB),  # the 72-GPU NVLink domain moves the exit to 72
    ("gb200-nvl72", 8, 9, 900 * GB, 50 * GB),  # TP 8 inside a rack leaves 9 CP ranks per domain
    ("mi300x-xgmi", 1, 8, 64 * GB, 50 * GB),  # full mesh: a hop is one of seven xGMI links
    ("tpu-v5p-ici", 1, 6144, 100 * GB, 6.25 * GB),  # 16x16x24 torus: the slice is the domain
    ("tpu-v5e-ici", 4, 64, 50 * GB, 3.125 * GB),
]


@pytest.mark.parametrize(("hw", "tp", "inside", "fast", "beyond"), LEAVES)
def test_ring_leaves_the_fast_domain(hw: str, tp: int, inside: int, fast: float, beyond: float) -> None:
    machine = Machine(load_profile(hw).model_copy(update={"cp_ranks_per_node": None})).placed(tp)
    last, first_out = machine.link(inside), machine.link(inside + 1)
    assert (last.scope, first_out.scope) == ("intra-node", "inter-node")
    assert last.bandwidth == pytest.approx(fast, rel=1e-12)
    assert first_out.bandwidth == pytest.approx(beyond, rel=1e-12)


def test_step_states_where_the_ring_leaves() -> None:
    """Llama 3.1 405B at 128K on GB200 NVL72: with TP 8 a rack holds 9 CP ranks, so CP 16 crosses racks."""
    result = evaluate_step(
        Job.of(
            model="llama3.1-405b", seq=131072, hw="gb200-nvl72", gpus=1152, tp=8, cp=16, pp=9, global_batch=16
        )
    ).model_dump(by_alias=True)
    topology = result["topology"]
    assert topology["kind"] == "nvlink-domain" and topology["fast_domain"] == 72
    assert topology["cp_ring_leaves_fast_domain_at"] == 10
    assert topology["groups"]["cp"]["scope"] == "inter-node"
    assert topology["groups"]["tp"]["bandwidth"] == pytest.approx(
        40.1 * 18 * GB, rel=1e-12
    )  # NCCL: 18 NVLinks, SM100


def test_rank_order_moves_cp_inside() -> None:
    """tp-cp-dp-pp puts CP 4 beside TP 2 in one 8-GPU node; tp-dp-cp-pp puts DP 4 there and CP across."""
    common = {"model": "llama3-8b", "seq": 32768, "hw": "h100-nvlink", "gpus": 32, "tp": 2, "cp": 4}
    megatron = evaluate_step(Job.of(**common, global_batch=8)).model_dump(by_alias=True)["topology"]["groups"]
    other = evaluate_step(Job.of(**common, global_batch=8, rank_order="tp-dp-cp-pp")).model_dump(
        by_alias=True
    )["topology"]["groups"]
    assert (megatron["cp"]["stride"], megatron["cp"]["scope"]) == (2, "intra-node")
    assert (other["cp"]["stride"], other["cp"]["scope"]) == (8, "inter-node")
    assert (other["dp"]["stride"], other["dp"]["scope"]) == (2, "intra-node")


def test_mesh_alltoall_uses_every_link() -> None:
    """MI300X: an all-to-all over the 8-GPU mesh receives over 7 links at once, 7 x 64 GB/s."""
    machine = Machine(load_profile("mi300x-xgmi"))
    assert machine.link(8, "alltoall").bandwidth == pytest.approx(7 * 64 * GB, rel=1e-12)
    assert machine.link(4, "alltoall").bandwidth == pytest.approx(3 * 64 * GB, rel=1e-12)
    assert machine.link(8, "p2p").bandwidth == pytest.approx(64 * GB, rel=1e-12)


def test_switch_alltoall_is_the_port() -> None:
    """A non-blocking switch: the all-to-all is held by each device's port, as before topology existed."""
    machine = Machine(load_profile("h100-nvlink"))
    assert machine.link(8, "alltoall").bandwidth == pytest.approx(450 * GB, rel=1e-12)


def test_torus_alltoall_is_held_to_the_bisection() -> None:
    """v5p, a ring of 16 chips closing along x: the cut crosses 2 links, P·m/4 bytes cross it, so each chip
    gets 4·2·B/16 = B/2; on a line of 8 (no wraparound) one link is cut: 4·B/8 = B/2 as well."""
    machine = Machine(load_profile("tpu-v5p-ici"))
    assert machine.link(16, "alltoall").bandwidth == pytest.approx(50 * GB, rel=1e-12)
    assert machine.link(8, "alltoall").bandwidth == pytest.approx(50 * GB, rel=1e-12)
    # 256 chips = 16 x 16 plane, both dimensions closed: cut across 16 crosses 2·256/16 = 32 links.
    assert machine.link(256, "alltoall").bandwidth == pytest.approx(4 * 32 * 100 * GB / 256, rel=1e-12)


def test_torus_allgather_runs_both_ways_along_each_dimension() -> None:
    """v5p: a closed ring of 16 gathers both ways (2 links); a 16 x 16 plane over 2 dimensions (4 links);
    an open line of 8 chips one way round (1 link)."""
    machine = Machine(load_profile("tpu-v5p-ici"))
    assert machine.link(16, "allgather").bandwidth == pytest.approx(200 * GB, rel=1e-12)
    assert machine.link(256, "allgather").bandwidth == pytest.approx(400 * GB, rel=1e-12)
    assert machine.link(8, "allgather").bandwidth == pytest.approx(100 * GB, rel=1e-12)


def test_torus_dims_override() -> None:
    """--torus-dims 4x4x8: 128 chips; a ring of 4 closes along x, so its all-gather runs both ways."""
    profile = override(load_profile("tpu-v5p-ici"), ProfileChanges(torus_dims="4x4x8"))
    assert profile.devices_per_node == 128 and profile.shape.dims == [4, 4, 8]
    machine = Machine(profile)
    assert machine.link(4, "allgather").bandwidth == pytest.approx(200 * GB, rel=1e-12)
    assert machine.link(129).scope == "inter-node"


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"torus_dims": "4x4x8"}, "--torus-dims"),  # not a torus
        ({"devices_per_node": 16}, None),
    ],
)
def test_torus_dims_only_on_a_torus(kwargs: dict, flag: str | None) -> None:
    profile = load_profile("h100-nvlink")
    if flag:
        with pytest.raises(InputError) as error:
            override(profile, ProfileChanges(**kwargs))
        assert error.value.field == flag
    else:
        assert override(profile, ProfileChanges(**kwargs)).devices_per_node == 16


def test_torus_needs_dims_not_devices_per_node() -> None:
    with pytest.raises(InputError) as error:
        override(load_profile("tpu-v5p-ici"), ProfileChanges(devices_per_node=128))
    assert error.value.field == "--devices-per-node" and "--torus-dims" in error.value.message


@pytest.mark.parametrize("text", ["4x4x", "0x4", "4x4x4x4", "four", "4.5x2"])
def test_bad_torus_dims(text: str) -> None:
    with pytest.raises(InputError) as error:
        override(load_profile("tpu-v5p-ici"), ProfileChanges(torus_dims=text))
    assert error.value.field == "--torus-dims"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("4x8", "is a 3-D torus (its largest slice 16x16x24); give 3 chip counts"),
        ("32x4x4", "does not fit in the largest slice of profile 'tpu-v5p-ici', 16x16x24"),
        ("64x64x64", "does not fit in the largest slice"),
    ],
)
def test_a_slice_is_shaped_as_the_torus_and_fits_in_its_largest(text: str, says: str) -> None:
    assert (
        override(load_profile("tpu-v5p-ici"), ProfileChanges(torus_dims="24x16x4")).devices_per_node == 1536
    )
    with pytest.raises(InputError, match=re.escape(says)) as error:
        override(load_profile("tpu-v5p-ici"), ProfileChanges(torus_dims=text))
    assert error.value.field == "--torus-dims"


def test_rail_optimised_fabric_keeps_one_rail_off_the_spine() -> None:
    """Spine 2:1: a CP group with one member per node at the same local index stays on its rail's leaf and
    gets the full NIC; one with two members per node crosses rails and gets half."""
    data = load_profile("b200-nvlink").model_dump(exclude_none=True)
    data["topology"]["spine_oversubscription"] = 2.0
    machine = Machine(parse_profile(data, "test"))
    assert machine.placed(8).link(4).bandwidth == pytest.approx(50 * GB, rel=1e-12)  # stride 8: one rail
    assert machine.placed(4).link(4).bandwidth == pytest.approx(25 * GB, rel=1e-12)  # 2 per node
    data["topology"]["rail_optimized"] = False
    flat = Machine(parse_profile(data, "test"))
    assert flat.placed(8).link(4).bandwidth == pytest.approx(25 * GB, rel=1e-12)


def test_nics_per_device_multiply_the_fabric() -> None:
    data = load_profile("mi300x-xgmi").model_dump(exclude_none=True)
    data["topology"]["nics_per_device"] = 2
    assert Machine(parse_profile(data, "test")).link(16).bandwidth == pytest.approx(100 * GB, rel=1e-12)


def test_every_builtin_states_or_defaults_its_topology() -> None:
    for name in builtin_names():
        profile = load_profile(name)
        assert profile.shape.kind in {"switch", "nvlink-domain", "mesh", "torus"}
        if profile.topology is not None:
            assert profile.topology.source or profile.source.url


def test_torus_dims_must_hold_the_domain() -> None:
    data = load_profile("tpu-v5e-ici").model_dump(exclude_none=True)
    data["topology"]["dims"] = [8, 8]
    with pytest.raises(InputError, match="hold 64 chips, not devices_per_node 256"):
        parse_profile(data, "test")


@given(
    order=st.permutations(["tp", "cp", "dp", "pp"]),
    sizes=st.fixed_dictionaries({d: st.integers(1, 16) for d in ("tp", "cp", "dp", "pp")}),
)
def test_strides_number_every_rank_once(order: list[str], sizes: dict[str, int]) -> None:
    """Any rank order is a mixed-radix numbering: the ranks reached by all group coordinates are 0..G-1."""
    step = strides("-".join(order), sizes)
    ranks = {0}
    for dim in order:
        ranks = {r + i * step[dim] for r in ranks for i in range(sizes[dim])}
    total = sizes["tp"] * sizes["cp"] * sizes["dp"] * sizes["pp"]
    assert ranks == set(range(total))


@pytest.mark.parametrize("text", ["tp-cp-dp", "tp-cp-dp-pp-pp", "tp-cp-xp-pp", ""])
def test_bad_rank_order(text: str) -> None:
    with pytest.raises(InputError) as error:
        parse_order(text)
    assert error.value.field == "--rank-order"


def test_megatron_is_the_default_order() -> None:
    assert parse_order(MEGATRON_ORDER) == ("tp", "cp", "dp", "pp")


ONE_PER_TOPOLOGY = [  # an NVLink domain, a full mesh and a torus: each command runs with no extra flag and names it
    (
        "llama3.1-405b",
        "gb200-nvl72",
        ["--gpus", "1152", "--tp", "8", "--pp", "9"],
        ["--cp", "8"],
        "NVLink domain of 72",
    ),
    ("qwen2.5-72b", "mi300x-xgmi", ["--gpus", "64", "--tp", "8"], ["--cp", "2"], "full mesh of 8"),
    (
        str(REPO / "tests/data/hf/gemma-3-27b.json"),
        "tpu-v5p-ici",
        ["--gpus", "128", "--tp", "4"],
        ["--cp", "8"],
        "3D torus",
    ),
]


@pytest.mark.parametrize(("model", "hw", "job", "cp", "shape"), ONE_PER_TOPOLOGY)
def test_plans_run_end_to_end_and_state_the_topology(
    cli, model: str, hw: str, job: list, cp: list, shape: str
) -> None:
    common = ["--model", model, "--hw", hw, "--seq", "128k"]
    report = cli(*common, "--n", "8", "-f", "json")
    assert report.code == 0 and shape in json.loads(report.out)["hardware"]["topology"]
    recommend = cli("recommend", *common, *job, "-f", "json")
    assert recommend.code == 0 and shape in json.loads(recommend.out)["topology"]
    step = cli("step", *common, *job, *cp, "--global-batch", "64")
    assert step.code == 0 and f"topology: {shape}" in step.out.replace("\n", " ")


def test_hw_show_prints_the_composed_profile_with_every_source(cli) -> None:
    import yaml

    result = cli("hw", "show", "tpu-v5p-ici", "--torus-dims", "4x4x8")
    assert result.code == 0
    shown = yaml.safe_load(result.out)
    assert shown["devices_per_node"] == 128 and shown["topology"]["dims"] == [4, 4, 8]
    assert "Overridden on the command line: torus 4x4x8" in shown["source"]["notes"]
    sources = [line for line in result.out.splitlines() if line.startswith("# source")]
    assert [s.split(")")[0] for s in sources] == [
        "# source (profile",
        "# source (topology",
        "# source (fallback_efficiency",
    ]


@pytest.mark.parametrize(
    ("hw", "dims", "group", "expected"),
    [
        ("tpu-v5p-ici", "4x4x8", 4, 200 * GB),  # a cube's edge closes: both ways round
        ("tpu-v5p-ici", "2x2x1", 2, 100 * GB),  # under a cube: an open line, one way
        ("tpu-v5e-ici", "16x16", 16, 100 * GB),  # the pod's 16 closes
        ("tpu-v5e-ici", "4x8", 4, 50 * GB),  # a smaller slice is open
    ],
)
def test_short_torus_dimensions_are_open(hw: str, dims: str, group: int, expected: float) -> None:
    machine = Machine(override(load_profile(hw), ProfileChanges(torus_dims=dims)))
    assert machine.link(group, "allgather").bandwidth == pytest.approx(expected, rel=1e-12)
