"""The one machine binding: everything the model asks of a machine, answered in one place.

For a group of ``group`` ranks doing a collective, which link it waits on and at what α and B (a
job's other parallel dimensions place the group: :meth:`Machine.placed`); how much of a transfer hides
under compute; at what FLOP/s a kernel call runs (measured curves, the profile's published kernel
tables, its stated fallback efficiency, or peak x ``--efficiency``); which fixed costs a measured profile adds. Datasheet and measured
profiles answer through the same questions, so no command picks a link or a rate on its own.

``datasheet=True`` asks the datasheet-style question of a measured profile too: peak FLOP/s for every
call, no α, transfers fully hidden, no fixed costs (what `cp-plan validate` sets beside the model).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from costmodel.core.errors import InputError
from costmodel.machines import kernels, topology
from costmodel.machines.compose import ProfileChanges, override
from costmodel.machines.profiles import BYTES_PER_ELEMENT, HardwareProfile, layer_key

if TYPE_CHECKING:
    import numpy as np

Collective = topology.Collective
# The least a ring step inside a node costs once the ring spans nodes: NCCL's network overhead, 1 us on an
# Intel host, three times that for the Simple protocol large messages take [NCCL-Tuning].
NET_RING_STEP_FLOOR_S = 3.0e-6
Scope = Literal["intra-node", "inter-node"]


@dataclass(frozen=True)
class LinkBinding:
    """The link a group waits on, as the model uses it."""

    name: str
    scope: Scope
    bandwidth: float  # B: bytes/s per direction (all-to-all: bytes each rank receives per second)
    latency_s: float  # α: per message (per collective call for all-to-all)
    knee_bytes: float = float("inf")  # X_k: a measured all-to-all bends upward past it
    bandwidth_beyond_knee: float = float("inf")  # B_x: rate of the extra cost past the knee
    call_latency_s: float = 0.0  # a: fixed cost of one ring collective call beyond its steps

    @property
    def values(self) -> dict[str, float]:
        """The formulas' symbols for this link."""
        return {"B": self.bandwidth, "alpha": self.latency_s}

    @property
    def knee_values(self) -> dict[str, float]:
        """The knee's symbols (no knee: infinite, so the excess is 0)."""
        return {"X_k": self.knee_bytes, "B_x": self.bandwidth_beyond_knee}


@dataclass(frozen=True)
class Machine:
    """A profile bound to a dtype and an efficiency, with CP ranks placed ``ranks_per_node`` to a node.

    ``efficiency`` None: no share of peak was asked for, so kernel calls run at the profile's published
    rates where it has them (the balanced formulas still read peak)."""

    profile: HardwareProfile
    dtype: str = "bf16"
    efficiency: float | None = None
    datasheet: bool = False
    ranks_per_node: int = 0  # consecutive CP ranks sharing a node; 0: the profile's own placement
    stride: int = 1  # ranks between a group's members (:meth:`placed`); sets the torus block and the rail
    attention_kernel: str | None = None  # the named tables attention calls read (None: the default ones)

    def __post_init__(self) -> None:
        if self.dtype not in self.profile.device.peak_flops:
            have = ", ".join(self.profile.device.peak_flops)
            raise InputError("--dtype", f"{self.profile.origin} has no {self.dtype} FLOP/s; it has: {have}")
        if not self.ranks_per_node:
            object.__setattr__(self, "ranks_per_node", self.profile.ranks_per_node)

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def calibrated(self) -> bool:
        """Measured rates, fits and fixed costs are used (a measured profile, not asked as a datasheet)."""
        return self.profile.calibration is not None and not self.datasheet

    def placed(self, stride: int) -> Machine:
        """The machine as a job lays out a group whose members are ``stride`` ranks apart: a node holds
        ranks_per_node / stride of them. Ranks are numbered TP innermost, then CP, DP and PP (Megatron's
        order), so a TP group has stride 1, CP stride t, DP stride t·N and PP stride t·N·DP; TP 8 on
        8-GPU nodes puts every CP neighbour on another node."""
        return replace(self, ranks_per_node=max(1, self.profile.ranks_per_node // stride), stride=stride)

    def as_datasheet(self) -> Machine:
        return replace(self, datasheet=True)

    # --- compute --------------------------------------------------------------------------------
    @property
    def peak_flops(self) -> float:
        return self.profile.device.peak_flops[self.dtype]

    @property
    def effective_flops(self) -> float:
        """The one FLOP/s of the balanced formulas: measured where the profile has it, else peak x efficiency
        (peak when none was given)."""
        if self.datasheet:
            return self.peak_flops
        measured = (self.profile.device.effective_flops or {}).get(self.dtype)
        if measured is not None:
            return measured
        return self.peak_flops * (1.0 if self.efficiency is None else self.efficiency)

    @property
    def published_rates(self) -> bool:
        """Kernel calls run at the profile's published tables (``kernels:``): it has them, measured nothing,
        no --efficiency was given and it is not asked as a datasheet."""
        measured = (self.profile.device.effective_flops or {}).get(self.dtype) is not None
        return (
            self.profile.kernels is not None
            and self.efficiency is None
            and not self.datasheet
            and not self.calibrated
            and not measured
        )

    @property
    def fallback_rates(self) -> bool:
        """Kernel calls run at the profile's stated ``fallback_efficiency`` x peak: it has no kernel tables, and
        nothing measured or asked for overrides it."""
        measured = (self.profile.device.effective_flops or {}).get(self.dtype) is not None
        return (
            self.profile.kernels is None
            and self.profile.fallback_efficiency is not None
            and self.efficiency is None
            and not self.datasheet
            and not self.calibrated
            and not measured
        )

    @property
    def rate_source(self) -> str:
        """Where the kernel rates come from, as the step states it."""
        if self.calibrated:
            return "measured curves (calibration)"
        if self.published_rates:
            named = f", attention: {self.attention_kernel}" if self.attention_kernel else ""
            clock = self.sustained_clock
            held = f", read at {clock:.3g} of their clock as a sustained load holds it" if clock < 1 else ""
            return f"published kernel tables (kernels:{named}){held}"
        if self.fallback_rates:
            fallback = self.profile.fallback_efficiency
            return f"{fallback.value:g} of peak, the profile's fallback_efficiency: {fallback.source}"  # type: ignore[union-attr]
        if self.efficiency is not None and not self.datasheet:
            return f"--efficiency {self.efficiency:g} of peak"
        return "peak"

    def rate(
        self,
        flops: float,
        masked: bool,
        backward: bool,
        busy: int,
        q_tokens: float,
        k_tokens: float,
        head_dim: int,
        kernel: str | None = None,
    ) -> float:
        """FLOP/s of one attention call of ``flops`` forward FLOP, ``q_tokens`` queries against ``k_tokens``
        keys of ``head_dim``, fully visible or ``masked`` (causal), while ``busy`` ranks compute at once (on
        a CPU they share cores). Measured curves where calibrated; else the published kernel tables where
        the profile has them and no efficiency was given; else :attr:`effective_flops`."""
        if self.calibrated:
            return self.profile.calibration.rate(flops, busy, masked, backward)  # type: ignore[union-attr]
        if self.published_rates:
            return self.sustained_clock * kernels.attention_rate(
                self.profile,
                self.dtype,
                q_tokens,
                k_tokens,
                head_dim,
                masked,
                backward,
                kernel if kernel is not None else self.attention_kernel,
            )
        if self.fallback_rates:
            return self.peak_flops * self.profile.fallback_efficiency.value  # type: ignore[union-attr]
        return self.effective_flops

    def call_rate(
        self, flops: float, masked: bool, busy: int, q_tokens: float, k_tokens: float, head_dim: int
    ) -> float:
        """:meth:`rate` of a forward call, with a calibrated profile's measured rates of calls of fewer
        queries than keys (an inference step's shapes) where it has them."""
        if self.calibrated and not masked:
            return self.profile.calibration.call_rate(flops, busy, q_tokens, k_tokens)  # type: ignore[union-attr]
        return self.rate(flops, masked, False, busy, q_tokens, k_tokens, head_dim)

    def gemm_rate(self, m: int, n: int, k: int, batch: int = 1) -> float:
        """FLOP/s of ``batch`` m x k by k x n matrix multiplies: :attr:`effective_flops` when an efficiency
        was given (or asked as a datasheet), else the published tables at the problem's shape; a profile
        without them is an error naming --hw."""
        if self.efficiency is not None or self.datasheet:
            return self.effective_flops
        if self.fallback_rates:
            return self.peak_flops * self.profile.fallback_efficiency.value  # type: ignore[union-attr]
        size = BYTES_PER_ELEMENT.get(self.dtype, 2)
        return kernels.gemm_rate(self.profile, self.dtype, m, n, k, batch, size, self.sustained_clock)

    def at_boost(self) -> Machine:
        """This machine with its tables read at the boost clock (:meth:`HardwareProfile.at_boost`): a decode
        step's memory-bound kernels draw too little power to bring the clock down."""
        return replace(self, profile=self.profile.at_boost())

    @property
    def sustained_clock(self) -> float:
        """The share of the tables' clock a step's sustained load holds (the profile's kernels:), 1 without
        kernel tables: what the tables' compute rates are read times."""
        kernels_ = self.profile.kernels
        return 1.0 if kernels_ is None else kernels_.sustained_clock

    @property
    def step_s(self) -> float:
        """Fixed host time of one optimizer step (the profile's kernels:), 0 as a datasheet."""
        kernels_ = self.profile.kernels
        return 0.0 if self.datasheet or kernels_ is None else kernels_.step_s

    @property
    def launch_s(self) -> float:
        """Fixed cost of one kernel on a step's critical path (the profile's kernels:), 0 as a datasheet."""
        kernels_ = self.profile.kernels
        return 0.0 if self.datasheet or kernels_ is None else kernels_.launch_s

    # --- links ----------------------------------------------------------------------------------
    def scope(self, group: int) -> Scope:
        """Where a group of ``group`` consecutive CP ranks sits: one hop off the node is enough to wait on it."""
        return "intra-node" if group <= self.ranks_per_node else "inter-node"

    def placement(self, group: int) -> topology.Placement:
        """Where a group of ``group`` members :attr:`stride` ranks apart lies on the network."""
        return topology.place(self.profile, group, self.stride, self.ranks_per_node)

    def link(self, group: int, collective: Collective = "p2p") -> LinkBinding:
        """α and B of the link a ring (``p2p``), all-to-all or all-gather over ``group`` ranks waits on.

        A ring step is as slow as its slowest hop, so one inter-node hop sets the whole ring's link. B
        follows from the topology (:mod:`costmodel.machines.topology`): a ring hop is one link or port, an
        all-to-all is held to the bisection of the block the group occupies, and beyond the fast domain
        a device has its NICs, less the spine's oversubscription off its rail.
        """
        scope = self.scope(group)
        link = self.profile.links.intra_node if scope == "intra-node" else self.profile.links.inter_node
        if link is None:
            raise InputError(
                "--hw",
                f"{self.profile.origin} has no links.inter_node, but {group} CP ranks span nodes "
                f"({self.ranks_per_node} per node)",
            )
        if self.calibrated:
            cal = self.profile.calibration
            fits = cal.alltoall if collective == "alltoall" else cal.p2p  # type: ignore[union-attr]
            if scope in fits:
                fit = fits[scope]
                knee = (
                    (fit.knee_bytes, fit.bandwidth_beyond_knee)
                    if fit.knee_bytes and fit.bandwidth_beyond_knee
                    else (float("inf"), float("inf"))
                )
                return LinkBinding(link.name, scope, fit.bandwidth, fit.latency_s, *knee)
        if collective == "alltoall" and link.alltoall is not None:  # measured: it already holds the fabric
            bandwidth, latency, call = link.alltoall.bandwidth_per_direction, link.alltoall.latency_s, 0.0
        else:
            placement, per_link = self.placement(group), link.bandwidth_per_direction
            bandwidth = (
                topology.fast_bandwidth(self.profile, placement, per_link, collective)
                if scope == "intra-node"
                else topology.outer_bandwidth(
                    self.profile,
                    placement,
                    per_link,
                    collective,
                    self.profile.links.intra_node.bandwidth_per_direction,
                )
            )
            latency, call = link.latency_s, 0.0
            # NCCL's ring: its bus bandwidth, its latency per step and per call
            if collective in topology.RING_COLLECTIVES:
                bandwidth *= link.collective_efficiency
                if link.hop_latency_s or link.call_latency_s:  # else the message latency, for each step
                    latency, call = link.hop_latency_s, link.call_latency_s
                    if scope == "inter-node":
                        latency = self._ring_step_latency(group, latency)
        if self.datasheet:
            latency = call = 0.0
        return LinkBinding(link.name, scope, bandwidth, latency, call_latency_s=call)

    def _ring_step_latency(self, group: int, network_s: float) -> float:
        """A ring over nodes: its steps inside a node cost the node's hop, at least NCCL's network overhead
        [NCCL-Tuning]. Charging every step the network's hop read nccl-tests' 1-64 MB all-reduces over 2-8
        H100 nodes 2.7x slow (``benchmarks/collectives.py --public``)."""
        inside = max(self.profile.links.intra_node.hop_latency_s or 0.0, NET_RING_STEP_FLOOR_S)
        return topology.ring_step_latency(group, self.ranks_per_node, inside, network_s)

    def group_links(
        self, order: str, sizes: dict[str, int], collectives: dict[str, Collective] | None = None
    ) -> dict[str, LinkBinding]:
        """The link each parallel group waits on when ranks are numbered by ``order`` (innermost first):
        a group's members are as many ranks apart as the product of the degrees inside it."""
        strides = topology.strides(order, sizes)
        wanted = collectives or {}
        return {
            dim: self.placed(strides[dim]).link(size, wanted.get(dim, "p2p"))
            for dim, size in sizes.items()
            if dim in strides
        }

    def inside(self, order: str, sizes: dict[str, int], dim: str) -> bool:
        """Whether ``dim``'s group lies inside one fast domain (NVLink, xGMI or ICI) when ranks are numbered by
        ``order``: what pipelining TP's collectives into its multiplies needs (Transformer Engine's userbuffers
        and torch's AsyncTP map peers' memory over that fabric)."""
        stride = topology.strides(order, sizes)[dim]
        return self.placed(stride).scope(sizes[dim]) == "intra-node"

    def describe_groups(
        self, order: str, sizes: dict[str, int], collectives: dict[str, Collective] | None = None
    ) -> dict[str, object]:
        """The topology, the rank order and where each group lies, as the step and recommend state them."""
        strides = topology.strides(order, sizes)
        links = self.group_links(order, sizes, collectives)
        wanted = collectives or {}
        cp_per_domain = max(1, self.profile.ranks_per_node // strides.get("cp", 1))

        def nics(dim: str) -> float | None:
            """NICs a node's members of the group drive at once (None inside the fast domain)."""
            if links[dim].scope == "intra-node":
                return None
            members = max(1, min(self.profile.ranks_per_node // strides[dim], sizes[dim]))
            pooled = wanted.get(dim, "p2p") in topology.RING_COLLECTIVES
            return self.profile.shape.nics_per_device * (members if pooled else 1)

        return {
            **topology.summary(self.profile),
            "rank_order": order,
            "cp_ring_leaves_fast_domain_at": topology.leaves_domain_at(cp_per_domain),
            "groups": {
                dim: {
                    "size": sizes[dim],
                    "stride": strides[dim],
                    "scope": links[dim].scope,
                    "link": links[dim].name,
                    "bandwidth": links[dim].bandwidth,
                    "nics_per_node": nics(dim),
                }
                for dim in links
            },
        }

    def link_arrays(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B, α, crosses nodes) for every group size of an array: the vectorised :meth:`link` of sweeps."""

        import numpy as np

        bindings = [self.link(int(g)) for g in np.asarray(groups).ravel()]
        shape = np.shape(groups)
        return (
            np.reshape([b.bandwidth for b in bindings], shape),
            np.reshape([b.latency_s for b in bindings], shape),
            np.reshape([b.scope == "inter-node" for b in bindings], shape),
        )

    # --- what a measured profile adds ------------------------------------------------------------
    @property
    def overlap(self) -> float:
        """Share of the shorter of compute and transfer that hides under the other: 1 on datasheets."""
        return self.profile.calibration.overlap if self.calibrated else 1.0  # type: ignore[union-attr]

    def fixed(self, name: str) -> float:
        """A measured fixed cost (``step_overhead_s``, ``sync_overhead_s``); 0 on datasheets."""
        return float(getattr(self.profile.calibration, name)) if self.calibrated else 0.0

    def inference_overhead(self, scheme: str) -> float:
        """Measured fixed cost of a whole inference attention layer of ``scheme`` (pass-kv, pass-q, decode);
        0 on datasheets and on profiles measured before it was."""
        if not self.calibrated:
            return 0.0
        return float(self.profile.calibration.inference_overhead_s.get(scheme, 0.0))  # type: ignore[union-attr]

    def layer_overhead(
        self, variant: str, backward: bool, layout: str = "contiguous", causal: bool = False
    ) -> tuple[float, float]:
        """Measured fixed software cost of a whole layer of this kind, split (forward, backward); 0 on
        datasheets. Profiles measured before kinds were told apart have one cost per variant."""
        if not self.calibrated:
            return 0.0, 0.0
        fixed = self.profile.calibration.layer_overhead_s  # type: ignore[union-attr]
        layout = "contiguous" if variant == "ulysses" else layout

        def cost(pass_: str, default: float) -> float:
            key = layer_key(variant, layout, causal, pass_)
            return fixed.get(key, fixed.get(f"{variant} {pass_}", default))

        forward = cost("fwd", 0.0)
        both = cost("fwd+bwd", forward) if backward else forward
        return forward, both - forward

    def at(self, dtype: str) -> Machine:
        """The same machine computing in ``dtype`` (inference's fp8 weights): its placement kept."""
        return replace(self, dtype=dtype)


def build_machine(
    profile: HardwareProfile,
    dtype: str = "bf16",
    efficiency: float | None = None,
    *,
    changes: dict[str, Any] | None = None,
    job: bool = False,
) -> Machine:
    """The one constructor of a :class:`Machine`: ``profile`` changed as a command line says (``changes``,
    the fields of :class:`~costmodel.machines.compose.ProfileChanges`; None values change nothing), bound to a
    dtype and an efficiency.

    ``job``: the machine of a job that states its layout (TP and the rank order). A profile's
    ``cp_ranks_per_node`` stands in for the TP a single-layer plan does not know (the -ib profiles put one
    CP rank per node: TP fills it); a job's node holds devices_per_node consecutive ranks and every group is
    placed from them, unless ``changes`` states ``cp_ranks_per_node``."""
    given = {key: value for key, value in (changes or {}).items() if value is not None}
    if given:
        profile = override(profile, ProfileChanges(**given))
    if job:
        profile = profile.model_copy(update={"cp_ranks_per_node": given.get("cp_ranks_per_node")})
    return Machine(profile, dtype, efficiency)
