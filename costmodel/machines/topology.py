"""Where a group of ranks sits on the network, and the bandwidth its collective gets there.

A job numbers its ranks by a rank order, innermost first (Megatron's ``tp-cp-dp-pp``: a TP group is
consecutive ranks, a CP group's members are TP ranks apart, ...). A group of ``size`` members ``stride``
ranks apart shares the fast domain (NVLink node or rack, xGMI node, ICI slice) while it fits in it; past
that, the fabric beyond (InfiniBand, RoCE, the data-center network) carries its traffic. What the group
gets inside follows from the domain's shape (:class:`~costmodel.machines.profiles.Topology`): a ring hop
is one link or port, an all-to-all is held to the bisection of the block the group occupies, an
all-gather on a torus runs a ring both ways along every dimension it spans. Every figure is a formula
of the "topology" group in :mod:`costmodel.symbolic.formulas`; this module only chooses their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from costmodel.core.errors import InputError
from costmodel.machines.profiles import HardwareProfile, Topology
from costmodel.symbolic import numeric

# p2p: one send to the next rank (a CP ring); ring: an NCCL ring collective (all-reduce, reduce-scatter,
# all-gather of TP, DP and PP groups); alltoall; allgather (Llama 3's CP, a ring collective too).
Collective = Literal["p2p", "ring", "alltoall", "allgather"]
RING_COLLECTIVES = ("ring", "allgather")
NCCL_RING: Collective = "ring"  # NCCL's ring algorithm: the TP and DP collectives (no CP scheme's name)
DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
MEGATRON_ORDER = "tp-cp-dp-pp"  # Megatron-LM's default rank order, innermost first (EP, when used, after CP)


def parse_order(text: str, field: str = "--rank-order") -> tuple[str, ...]:
    """``tp-cp-dp-pp`` as a tuple, innermost first; every one of tp, cp, dp, pp once, ep at most once."""
    parts = tuple(part.strip().lower() for part in text.split("-"))
    unknown = [p for p in parts if p not in DIMENSIONS]
    needed = [d for d in DIMENSIONS if d != "ep" and d not in parts]
    if unknown or needed or len(set(parts)) != len(parts):
        raise InputError(
            field,
            f"{text!r} is not a rank order; give tp, cp, dp and pp (and optionally ep) once each, innermost "
            f"first, joined by '-', e.g. {MEGATRON_ORDER} (Megatron's) or tp-dp-cp-pp",
        )
    return parts


def strides(order: str | tuple[str, ...], sizes: dict[str, int]) -> dict[str, int]:
    """How many ranks apart the members of each dimension's group are: the product of the degrees inside it."""
    dims = parse_order(order) if isinstance(order, str) else order
    out: dict[str, int] = {}
    inner = 1
    for dim in dims:
        out[dim] = inner
        inner *= sizes.get(dim, 1)
    return out


@dataclass(frozen=True)
class Placement:
    """A group of ``size`` members ``stride`` ranks apart with ``per_domain`` of them in one fast domain."""

    size: int
    stride: int
    per_domain: int
    inside: bool  # the whole group shares one fast domain
    rail_aligned: bool  # members in different domains sit at the same local index (one rail)
    extents: tuple[int, ...] | None  # torus: chips of the group along each dimension


@lru_cache(maxsize=4096)
def _extents(dims: tuple[int, ...], size: int, stride: int) -> tuple[int, ...]:
    """Distinct coordinates the members take along each torus dimension (ranks fill the first dimension
    first, as a slice's chips are numbered)."""
    seen: list[set[int]] = [set() for _ in dims]
    for member in range(size):
        index = member * stride
        for axis, length in enumerate(dims):
            seen[axis].add(index % length)
            index //= length
    return tuple(len(s) for s in seen)


def place(profile: HardwareProfile, size: int, stride: int, per_domain: int) -> Placement:
    """Where a group lies; ``per_domain`` is how many of its members one fast domain holds."""
    shape = profile.shape
    inside = size <= per_domain
    extents = None
    if inside and shape.kind == "torus" and shape.dims:
        extents = _extents(tuple(shape.dims), size, stride)
    return Placement(
        size=size,
        stride=stride,
        per_domain=per_domain,
        inside=inside,
        rail_aligned=per_domain == 1 and stride % profile.devices_per_node == 0,
        extents=extents,
    )


def _wraps(shape: Topology, extents: tuple[int, ...], axis: int) -> bool:
    if not shape.wraparound or shape.dims is None:
        return False
    return extents[axis] == shape.dims[axis] > 2 and shape.dims[axis] >= shape.wraparound_min


def fast_bandwidth(
    profile: HardwareProfile, placement: Placement, link_bandwidth: float, collective: Collective
) -> float:
    """Bytes/s per rank of a collective inside the fast domain, from the domain's shape."""
    shape, size, b_l = profile.shape, placement.size, link_bandwidth
    if collective in ("p2p", "ring") or size == 1:
        return float(numeric.ring_hop_bandwidth(l_h=1, B_l=b_l))
    if shape.kind == "mesh":
        links = size - 1  # one link to each peer of the group, all at once
        bisection = numeric.mesh_bisection_bandwidth(P_g=size, B_l=b_l)
    elif shape.kind == "torus" and placement.extents is not None:
        extents = placement.extents
        spanned = [axis for axis, extent in enumerate(extents) if extent > 1]
        longest = max(spanned, key=lambda axis: extents[axis])
        wrap = 2 if all(_wraps(shape, extents, axis) for axis in spanned) else 1
        if collective == "allgather":
            return float(numeric.torus_allgather_bandwidth(w_t=wrap, D_g=len(spanned), B_l=b_l))
        links = 2 * len(shape.dims or ())
        bisection = numeric.torus_bisection_bandwidth(
            w_t=2 if _wraps(shape, extents, longest) else 1, P_g=size, L_t=extents[longest], B_l=b_l
        )
    else:  # switch, nvlink-domain: one port into a non-blocking switch
        links = 1
        bisection = numeric.switch_bisection_bandwidth(P_g=size, B_l=b_l)
    if collective == "allgather":
        return float(numeric.injection_bandwidth(n_l=links, B_l=b_l))
    return float(numeric.alltoall_bandwidth(n_l=links, B_l=b_l, B_bis=bisection, P_g=size))


def outer_bandwidth(
    profile: HardwareProfile,
    placement: Placement,
    nic_bandwidth: float,
    collective: Collective = "p2p",
    fast_bandwidth: float = float("inf"),
) -> float:
    """Bytes/s per rank one way beyond the fast domain: its NICs, and the spine's oversubscription unless
    a rail-optimised fabric keeps the group on one rail's leaf. A ring collective's members on one node
    pool their NICs (one NCCL ring per NIC), up to what the fast domain carries between them."""
    shape = profile.shape
    on_rail = shape.rail_optimized and placement.rail_aligned
    o_x = 1.0 if on_rail else shape.spine_oversubscription
    if collective in RING_COLLECTIVES:
        members = max(1, min(placement.per_domain, placement.size))
        pooled = numeric.ring_collective_inter_node_bandwidth(
            k_n=members, n_nic=shape.nics_per_device, B_nic=nic_bandwidth, o_x=o_x
        )
        return float(min(pooled, fast_bandwidth))
    return float(numeric.inter_node_bandwidth(n_nic=shape.nics_per_device, B_nic=nic_bandwidth, o_x=o_x))


def describe(profile: HardwareProfile) -> str:
    """One line: the fast domain's shape and size, and how devices reach the fabric beyond it."""
    shape, size = profile.shape, profile.devices_per_node
    if shape.kind == "torus":
        dims = "x".join(map(str, shape.dims or ()))
        closed = [d for d in shape.dims or () if shape.wraparound and d >= shape.wraparound_min and d > 2]
        wrap = (
            ", wraparound"
            if len(closed) == len(shape.dims or ())
            else ", open on some dimensions"
            if closed
            else ""
        )
        domain = f"{len(shape.dims or ())}D torus {dims} ({size:,} chips{wrap})"
    elif shape.kind == "mesh":
        domain = f"full mesh of {size} (one link per peer)"
    elif shape.kind == "nvlink-domain":
        domain = f"NVLink domain of {size} (switched)"
    else:
        domain = f"switched node of {size}"
    beyond = profile.links.inter_node
    if beyond is None:
        return f"{domain}; nothing beyond it"
    nics = shape.nics_per_device
    rail = ", rail-optimised" if shape.rail_optimized else ""
    over = f", spine {shape.spine_oversubscription:g}:1" if shape.spine_oversubscription != 1 else ""
    return f"{domain}; beyond it {nics:g} NIC{'s' if nics != 1 else ''} per device{rail}{over}"


def ring_step_latency(size: int, per_domain: int, inside_s: float, network_s: float) -> float:
    """The mean latency of one step of a ring collective over ``size`` ranks, ``per_domain`` to a node: NCCL
    charges the network's latency only to the steps that cross it (tuning.cc's nInterSteps [NCCL-Tuning])."""
    nodes = -(-size // per_domain)
    return float(numeric.ring_step_latency(P_g=size, n_x=nodes, alpha_in=inside_s, alpha_out=network_s))


def leaves_domain_at(per_domain: int) -> int:
    """The smallest group size whose members no longer share one fast domain."""
    return max(per_domain, 1) + 1


def summary(profile: HardwareProfile) -> dict[str, object]:
    """The topology as the JSON outputs state it."""
    shape = profile.shape
    return {
        "kind": shape.kind,
        "fast_domain": profile.devices_per_node,
        "dims": list(shape.dims) if shape.dims else None,
        "wraparound": shape.wraparound if shape.kind == "torus" else None,
        "nics_per_device": shape.nics_per_device,
        "rail_optimized": shape.rail_optimized,
        "spine_oversubscription": shape.spine_oversubscription,
        "text": describe(profile),
    }
