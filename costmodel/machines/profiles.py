"""Hardware profiles (docs/hardware.md): YAML files validated by pydantic.

A profile names its source, gives dense peak FLOP/s per dtype, HBM, devices per node, how many
consecutive CP ranks share a node, and the intra- and inter-node links with their bandwidth **per
direction**. Datasheets print NVLink bidirectionally (A100: 600 GB/s = 300 GB/s each way); the
ring's receive time needs one direction, so every file states both and the two must agree.
"""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from costmodel.core.errors import InputError, another_kind, describe_validation
from costmodel.core.fields import (
    BytesPerSecond,
    Count,
    Finite,
    FlopRate,
    Latency,
    NonNegative,
    Overhead,
    Positive,
    Share,
    Switch,
    Within,
)
from costmodel.core.fileio import YamlDocument, builtin_path, load_builtin_or_file, not_a_mapping, read_input
from costmodel.core.intervals import LayoutResiduals, Residuals
from costmodel.core.resources import data_dir
from costmodel.core.units import GIB

Dtype = Literal["bf16", "fp16", "fp32", "fp8"]
BYTES_PER_ELEMENT: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
# The dtype the kernel tables (kernels.attention, kernels.gemm) are stated in; another dtype's rates are the
# table's scaled by the peaks' ratio (costmodel.machines.kernels).
TABLE_DTYPE = "bf16"
# A fitted factor on the kernel tables (attention_scale, gemm_scale) beyond this range says the runs behind it
# do not pin it down (audit --fit-profile refuses such fits too); within it the scaled table stays at or
# under the device's peak as well (HardwareProfile._within_peak).
SCALE_RANGE = (0.05, 20.0)
# A step's sustained clock over its tables' (boost) clock: the deepest power-limit throttle taken as a profile.
SUSTAINED_CLOCK_RANGE = (0.5, 1.0)
# Formats a device computes in but attention is not planned in: fp4 and fp6 are sub-byte (and block-scaled,
# so not even a fixed fraction of a byte per element), so they are recorded, shown, never used for Q, K, V.
LowPrecision = Literal["fp6", "fp4"]


GIB_PER_GB = GIB / 1e9  # a datasheet's GB of HBM is a binary GiB of stacks: the most it can hold


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Source(_Strict):
    """Where the numbers come from: a datasheet URL, or a measurement and its circumstances."""

    kind: Literal["datasheet", "measured"]
    url: str | None = Field(default=None, description="datasheet or spec page (required for datasheets)")
    notes: str | None = Field(default=None, description="assumptions, e.g. NIC per GPU")
    host: str | None = Field(default=None, description="measured on (required when measured)")
    date: str | None = Field(default=None, description="ISO date of the measurement (required when measured)")
    backend: str | None = Field(default=None, description="torch.distributed backend, e.g. nccl, gloo")
    torch_version: str | None = None
    nproc: Count() | None = Field(default=None, description="ranks that ran at once")

    @model_validator(mode="after")
    def _cited(self) -> Self:
        if self.kind == "datasheet" and not self.url:
            raise ValueError("a datasheet profile must give source.url")
        if self.kind == "measured" and not (self.host and self.date):
            raise ValueError("a measured profile must give source.host and source.date")
        return self


class Collective(_Strict):
    """Measured all-to-all figures of a link (Ulysses), when they differ from point-to-point."""

    bandwidth_per_direction: BytesPerSecond = Field(description="bytes/s each device receives")
    latency_s: Latency = Field(default=0.0, description="alpha of one all-to-all, s")


class _BothWays(_Strict):
    """A link stated per direction, with the datasheet's both-ways figure optionally beside it."""

    @model_validator(mode="after")
    def _directions_agree(self) -> Self:
        both = getattr(self, "bandwidth_bidirectional", None)
        per = self.bandwidth_per_direction  # type: ignore[attr-defined]
        if both is not None and abs(both - 2 * per) > 1e-6 * both:
            raise ValueError(
                f"bandwidth_bidirectional {both:.4g} is not twice bandwidth_per_direction {per:.4g}; "
                "per direction is half the datasheet's bidirectional figure"
            )
        return self


class Link(_BothWays):
    """One kind of connection between two accelerators."""

    name: str = Field(description="e.g. NVLink 4 (NVSwitch), InfiniBand NDR 400 Gb/s")
    bandwidth_per_direction: BytesPerSecond = Field(description="bytes/s one way; what a ring hop uses")
    bandwidth_bidirectional: BytesPerSecond | None = Field(
        default=None, description="the datasheet's both-ways figure; must be 2 x per direction"
    )
    latency_s: Latency = Field(default=0.0, description="alpha: per-message latency (0 on datasheets)")
    alltoall: Collective | None = Field(default=None, description="measured all-to-all, if it differs")
    collective_efficiency: Positive = Field(
        default=1.0,
        le=1,
        description="bus bandwidth an NCCL ring collective (all-reduce, reduce-scatter, all-gather) reaches "
        "over this link, as a share of bandwidth_per_direction",
    )
    hop_latency_s: Latency = Field(
        default=0.0,
        description="latency one step of a ring collective adds on this link (NCCL's model), s; a ring over "
        "k nodes crosses the network in k - 1 of its steps (an all-reduce's 2(k - 1)), and its steps inside a "
        "node cost the intra-node hop, at least NCCL's 3 us network overhead",
    )
    call_latency_s: Latency = Field(
        default=0.0,
        description="fixed latency of one ring collective call beyond its steps (NCCL's base latency: the "
        "kernel's launch and the ranks' handshake), s",
    )
    source: str | None = Field(
        default=None,
        description="where this link's figure comes from when not source.url "
        "(e.g. the system datasheet that names the NIC)",
    )

    def alltoall_bandwidth(self) -> float:
        return self.alltoall.bandwidth_per_direction if self.alltoall else self.bandwidth_per_direction

    def alltoall_latency(self) -> float:
        return self.alltoall.latency_s if self.alltoall else self.latency_s


# One host's CPU Adam throughput where a profile states none: DeepSpeed's CPU-Adam (SIMD) updated 10B parameters
# in 2.57 s on a DGX-2's host in the ZeRO-Offload paper's Adam latency table [ZeRO-Offload], its largest size
# (1B took 0.22 s). Not DeepSpeed's 1.4e9 a second for 11.6B [DeepSpeed-CPUAdam]: that is its scalar path, for
# CPUs without AVX. A modern host may be faster still; a profile states its own where measured.
CPU_ADAM_PARAMS_PER_S = 10e9 / 2.57


class HostLink(_BothWays):
    """The link between an accelerator and its host's memory, and the host's optimizer throughput: what
    optimizer, parameter and activation offload pay for [ZeRO-Offload]."""

    name: str = Field(description="e.g. PCIe Gen5 x16, NVLink-C2C")
    bandwidth_per_direction: BytesPerSecond = Field(
        description="bytes/s one device copies to or from pinned host memory, achievable, each way"
    )
    bandwidth_bidirectional: BytesPerSecond | None = Field(
        default=None, description="both ways; must be 2 x per direction"
    )
    devices_per_host: Count(maximum=2**20) | None = Field(
        default=None,
        description="devices whose offloaded optimizer one host's CPUs run; default devices_per_node",
    )
    optimizer_params_per_s: Positive = Field(
        default=CPU_ADAM_PARAMS_PER_S,
        description="parameters one host's CPUs update per second with CPU Adam (the ZeRO-Offload paper's figure "
        "by default)",
    )
    source: str = Field(description="where the bandwidth comes from: datasheet or measurement, by its key")


class Links(_Strict):
    """The links inside a node and between nodes, and to the host."""

    intra_node: Link
    inter_node: Link | None = Field(default=None, description="needed once a CP group spans nodes")
    host: HostLink | None = Field(default=None, description="device to host memory: needed by --offload")


class Device(_Strict):
    """One accelerator."""

    name: str = Field(description="model, e.g. H100-SXM5-80GB")
    vendor: str | None = Field(default=None, description="e.g. NVIDIA, AMD, Google (groups `hw list`)")
    generation: str | None = Field(default=None, description="architecture, e.g. Hopper, CDNA 3, TPU v5")
    peak_flops: dict[Dtype, Positive] = Field(description="dense FLOP/s per dtype, no sparsity")
    low_precision_peak_flops: dict[LowPrecision, Positive] | None = Field(
        default=None,
        description="dense FLOP/s of sub-byte formats (fp6, fp4): shown, not used to plan attention",
    )
    effective_flops: dict[Dtype, Positive] | None = Field(
        default=None, description="measured attention FLOP/s per dtype (measured profiles)"
    )
    hbm_bytes: Positive = Field(description="memory capacity, bytes (decimal, as datasheets)")
    allocatable_bytes: Positive | None = Field(
        default=None,
        description="the memory a process can allocate, bytes: the total torch.cuda.mem_get_info() reports "
        "(an '80 GB' part holds about 79.1 GiB, 84.9e9 bytes); at most hbm_bytes read as GiB; hbm_bytes where "
        "not stated",
    )
    hbm_bandwidth: BytesPerSecond | None = Field(default=None, description="memory bandwidth, bytes/s")
    hbm_sustained: BytesPerSecond | None = Field(
        default=None,
        description="the memory bandwidth memory-bound kernels reach, bytes/s (measured, at most "
        "hbm_bandwidth): what reading weights, caches and activations runs at; hbm_bandwidth where not stated",
    )
    max_matmul_flops: Positive | None = Field(
        default=None,
        description="the most a tuned bf16 matmul reaches on the device (maximum achievable matmul FLOP/s "
        "[MAMF]): the ceiling a fit may scale the multiply table to",
    )
    sm_count: Count() | None = Field(
        default=None,
        description="streaming multiprocessors (compute units): a matrix multiply's output tiles run in "
        "waves over them",
    )

    @model_validator(mode="after")
    def _peak_given(self) -> Self:
        if not self.peak_flops:
            raise ValueError("peak_flops must list at least one dtype")
        if self.allocatable_bytes is not None and self.allocatable_bytes > self.hbm_bytes * GIB_PER_GB:
            raise ValueError(
                f"allocatable_bytes {self.allocatable_bytes:.4g} passes hbm_bytes {self.hbm_bytes:.4g} read as GiB "
                f"({self.hbm_bytes * GIB_PER_GB:.4g}): a process cannot allocate more than the device holds"
            )
        return self

    @property
    def usable_bytes(self) -> float:
        """What a process can allocate: the runtime's total where the profile states it, else the datasheet's."""
        return self.allocatable_bytes or self.hbm_bytes

    @property
    def streaming_bandwidth(self) -> float | None:
        """The bandwidth a memory-bound kernel runs at: the measured sustained figure, else the datasheet's."""
        return self.hbm_sustained or self.hbm_bandwidth

    @model_validator(mode="after")
    def _sustained_within_datasheet(self) -> Self:
        if self.hbm_sustained is not None and (
            self.hbm_bandwidth is None or self.hbm_sustained > self.hbm_bandwidth
        ):
            raise ValueError("hbm_sustained must be at most hbm_bandwidth, which must be stated with it")
        return self

    @property
    def table_peak(self) -> float:
        """The peak the kernel tables are read against: bf16's, else (the tables then read unscaled for every
        dtype) the smallest the device states."""
        return self.peak_flops.get(TABLE_DTYPE) or min(self.peak_flops.values())

    @model_validator(mode="after")
    def _effective_within_peak(self) -> Self:
        """A measured rate cannot pass the dense peak of its dtype: no kernel outruns its tensor cores."""
        for dtype, rate in (self.effective_flops or {}).items():
            peak = self.peak_flops.get(dtype)
            if peak is None:
                raise ValueError(
                    f"effective_flops.{dtype} needs peak_flops.{dtype}, the peak it is a share of"
                )
            _within(f"effective_flops.{dtype}", rate, peak, f"peak_flops.{dtype}")
        if self.max_matmul_flops is not None and self.peak_flops:
            _within("max_matmul_flops", self.max_matmul_flops, self.table_peak, f"peak_flops.{TABLE_DTYPE}")
        return self


def _within(where: str, rate: float, peak: float, peak_name: str) -> None:
    """``rate`` at most ``peak``, else one line naming both fields."""
    if rate > peak * (1 + 1e-9):
        raise ValueError(
            f"{where} {rate:.4g} FLOP/s is above {peak_name} {peak:.4g} FLOP/s ({rate / peak:.3g} x): "
            "no kernel runs faster than the device's dense peak"
        )


def _edges(values: list[int], name: str, paired: list[float]) -> None:
    """A table's sizes: strictly increasing (each once; interpolation over a repeated or falling size is
    undefined) and one-to-one with its rates. Positive: their type."""
    if len(values) != len(paired):
        raise ValueError(
            f"{name} has {len(values)} entries and flops_per_s {len(paired)}: pair them one-to-one"
        )
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must be strictly increasing, each size once (got {values})")


class RatePoint(_Strict):
    """Measured attention throughput of one block of ``tokens`` queries against as many keys."""

    tokens: Count() = Field(description="block edge: queries = keys = tokens")
    flops: Positive = Field(description="forward FLOP of the call, 4·b·h·pairs·d (pairs: the visible ones)")
    flops_per_s: FlopRate = Field(
        description="forward FLOP per second; for backward 2.5x the forward FLOP per second"
    )
    spread: NonNegative = Field(description="interquartile range / median over the repeats")
    uncertainty: NonNegative = Field(
        0.0,
        description="half the interquartile range of the figure (the calibration's quantile) over resampled repeats, / the figure",
    )


class ComputeCurve(_Strict):
    """Attention FLOP/s against block size, measured with ``concurrency`` ranks computing at once."""

    concurrency: Count() = Field(description="ranks computing at the same time (CPU cores are shared)")
    causal: Switch = Field(description="the block has the causal diagonal (a ring's own-block step)")
    forward: list[RatePoint] = Field(min_length=1)
    backward: list[RatePoint] = Field(min_length=1)

    def rate(self, flops: float, backward: bool = False) -> float:
        """FLOP/s of a kernel call doing ``flops`` (forward-counted), interpolated in log(work per call) over
        the measured blocks, flat beyond the largest. Work per call, not tokens, is what fills the machine,
        so the curve serves any head count and block shape.

        Below the smallest block a call is mostly its fixed cost (dispatch, allocation), so its *time* is
        extrapolated along the line through the two smallest blocks' times, not its rate held flat: a flat
        rate would price a call of a tenth of the FLOP at a tenth of the time, and whatever measures a
        tiny layer's fixed cost would absorb the difference and charge it again to every larger call."""

        import numpy as np

        points = self.backward if backward else self.forward
        first = points[0]
        if flops < first.flops and len(points) > 1:
            second = points[1]
            t0, t1 = first.flops / first.flops_per_s, second.flops / second.flops_per_s
            slope = max(0.0, (t1 - t0) / (second.flops - first.flops))
            if t0 - first.flops * slope > 0:  # a fixed cost is measured; else the rate held flat below
                return flops / (t0 - (first.flops - flops) * slope)
        return float(
            np.interp(np.log(flops), np.log([p.flops for p in points]), [p.flops_per_s for p in points])
        )


class CallRate(_Strict):
    """Measured forward throughput of one fully visible call of fewer queries than keys, every rank busy:
    the shapes of an inference step (new tokens against a cached prefix, a decode query against a cache)."""

    queries: Count()
    keys: Count()
    flops: Positive = Field(description="forward FLOP of the call")
    flops_per_s: FlopRate
    spread: NonNegative = Field(description="interquartile range / median over the repeats")


def _call_factor(points: list[CallRate], square: Any, flops: float, aspect: float) -> float:
    """How much slower than the square curve a call ``aspect`` times as many keys as queries runs: 1 at
    aspect 1, the measured ratios in between and beyond, interpolated in log(aspect) and log(FLOP)."""

    import numpy as np

    aspects = sorted({p.keys / p.queries for p in points})
    factors = [1.0]
    for a in aspects:
        row = sorted((p for p in points if p.keys / p.queries == a), key=lambda p: p.flops)
        ratios = [square.rate(p.flops) / p.flops_per_s for p in row]
        factors.append(float(np.interp(np.log(flops), np.log([p.flops for p in row]), ratios)))
    return float(np.interp(np.log(max(aspect, 1.0)), np.log([1.0, *aspects]), factors))


class Sample(_Strict):
    bytes: Count() = Field(description="bytes each rank sends (point-to-point) or holds (all-to-all)")
    seconds: Positive = Field(description="the calibration's quantile over the repeats, slowest rank")
    spread: NonNegative = Field(description="interquartile range / median over the repeats")


class LinkFit(_Strict):
    """t = alpha + bytes / bandwidth, least squares over the samples."""

    latency_s: Latency
    bandwidth: BytesPerSecond = Field(description="bytes/s per direction")
    r2: Finite = Field(le=1, description="coefficient of determination of the fit")
    samples: list[Sample]
    knee_bytes: Positive | None = Field(
        None,
        description="bytes beyond which time grows faster than alpha-beta (all-to-all copies); None: none",
    )
    bandwidth_beyond_knee: BytesPerSecond | None = Field(
        None, description="bytes/s of the extra cost beyond the knee: t += (bytes - knee) / this"
    )


class OverlapPoint(_Strict):
    tokens: Count()
    compute: Positive = Field(description="s, block compute alone")
    comm: Positive = Field(description="s, its KV exchange alone")
    both: Positive = Field(description="s, both at once as a ring step")
    a2a: Positive = Field(description="s, an all-to-all of its queries alone")
    compute_then_a2a: Positive = Field(description="s, the compute and then that all-to-all")


def layer_key(variant: str, layout: str, causal: bool, pass_: str) -> str:
    """Name of one layer kind's fixed cost: 'ring zigzag causal fwd', 'ulysses contiguous fwd+bwd'."""
    return f"{variant} {layout}{' causal' if causal else ''} {pass_}"


class FitSpread(_Strict):
    """A fitted quantity and how far it moves when the repeats behind it are resampled."""

    value: Finite
    spread: NonNegative = Field(description="half the interquartile range over the resamples (value's unit)")
    unit: str = ""

    @property
    def relative(self) -> float:
        return self.spread / abs(self.value) if self.value else (0.0 if not self.spread else float("inf"))


class Quality(_Strict):
    """Calibrate's verdict on its own fits: noisy ones are written, flagged, never silently."""

    trusted: Switch
    reasons: list[str] = Field(default_factory=list, description="each check that failed, in words")
    r2_min: Finite = Field(description="bound a link fit's R² must reach")
    spread_max: NonNegative = Field(description="bound on a link's relative spread and the compute's")
    load_before: NonNegative | None = Field(None, description="1-min load average before the ranks started")
    busy_before: NonNegative | None = Field(
        None,
        le=1,
        description="share of CPU time other processes used in the second before the ranks started",
    )
    load_after: NonNegative | None = Field(None, description="1-min load average after (own ranks included)")
    cpus: Count() | None = None


class Sentinel(_Strict):
    """The same block compute and ring exchange timed at the end of calibrate and again by validate: how
    far the machine's speed moved in between."""

    tokens: Count() = Field(description="block size of the sentinel's compute and exchange")
    compute_s: Positive = Field(description="s, the block's forward compute")
    exchange_s: Positive = Field(description="s, its KV exchange")


class Calibration(_Strict):
    """What `cp-plan calibrate` measured, beside the figures the profile derives from it (docs/calibration.md)."""

    dtype: Dtype
    batch: Count()
    heads: Count()
    kv_heads: Count()
    head_dim: Count()
    compute: list[ComputeCurve] = Field(min_length=1, description="per concurrency and mask")
    p2p: dict[Literal["intra-node", "inter-node"], LinkFit] = Field(description="ring exchanges, per scope")
    alltoall: dict[Literal["intra-node", "inter-node"], LinkFit] = Field(
        description="all_to_all_single, per scope"
    )
    overlap: NonNegative = Field(
        le=1,
        description="share of the shorter of compute and transfer that hides "
        "under the other in a ring step: 1 fully, 0 none (serial)",
    )
    step_overhead_s: Overhead = Field(
        0.0,
        description="fixed cost of a ring step that overlaps a transfer "
        "with compute (thread wake-ups, scheduling), beyond both",
    )
    sync_overhead_s: Overhead = Field(
        0.0,
        description="cost of a collective right after compute, beyond "
        "both alone (waiting for the slower rank, waking communication threads)",
    )
    overlap_samples: list[OverlapPoint] = Field(default_factory=list)
    layer_overhead_s: dict[str, Overhead] = Field(
        default_factory=dict,
        description="fixed software cost of a whole layer, by 'ring fwd', 'ring fwd+bwd', "
        "'ulysses fwd', 'ulysses fwd+bwd': a tiny layer's time less what the rest of the model predicts for it",
    )
    call_rates: list[CallRate] = Field(
        default_factory=list,
        description="forward calls of fewer queries than keys (4x and 16x), fully visible, every rank busy",
    )
    inference_overhead_s: dict[Literal["pass-kv", "pass-q", "decode"], Overhead] = Field(
        default_factory=dict,
        description="fixed cost of a whole inference attention layer, by scheme: a tiny pass-KV or pass-Q "
        "prefill, or a decode step, less what the inference formulas predict for it",
    )
    layer_tokens: Count() | None = Field(
        None, description="shard length of the layers timed for their fixed cost"
    )
    quantile: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="which quantile of its single-call samples every timed figure is (0.25: the lower "
        "quartile, as calibrate measures now; 0.5: the median, profiles measured before); validate "
        "times its runs with the same",
    )
    fits: dict[str, FitSpread] = Field(
        default_factory=dict,
        description="every fitted quantity with its spread over resampled repeats, by name",
    )
    quality: Quality | None = Field(None, description="whether the fits are steady enough to trust")
    sentinel: Sentinel | None = Field(None, description="the machine's speed at the end of calibrate")

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Profiles measured before the backward's excess term was retired carry ``bookkeeping`` and its fit
        (``fits["bookkeeping backward rate"]``): both ignored."""
        if not isinstance(data, dict) or "bookkeeping" not in data:
            return data
        fits = {k: v for k, v in data.get("fits", {}).items() if not k.startswith("bookkeeping ")}
        return {k: v for k, v in data.items() if k != "bookkeeping"} | (
            {"fits": fits} if "fits" in data else {}
        )

    def rate(self, flops: float, concurrency: int, causal: bool, backward: bool = False) -> float:
        """FLOP/s of one call inside a layer: the curve measured closest to ``concurrency`` ranks for the mask,
        slowed by :meth:`step_factor`."""
        return self.curve(concurrency, causal).rate(flops, backward) / self.step_factor(flops)

    def step_factor(self, flops: float) -> float:
        """How much longer a block's compute takes inside a ring step than on the compute curve: calibrate's
        overlap rounds time the same forward call among KV exchanges, as a layer runs it, where the curve
        times it among other blocks only (on a CPU the exchanges' copies share its caches and cores).
        The ratio at each block size measured in both, interpolated in log(FLOP) and flat beyond; 1 when
        the profile holds no overlap rounds."""
        import numpy as np

        blocks = {p.tokens: p for p in self.curve(max(c.concurrency for c in self.compute), False).forward}
        points = sorted(
            (blocks[s.tokens].flops, s.compute * blocks[s.tokens].flops_per_s / blocks[s.tokens].flops)
            for s in self.overlap_samples
            if s.tokens in blocks
        )
        if not points:
            return 1.0
        return float(np.interp(np.log(flops), np.log([f for f, _ in points]), [r for _, r in points]))

    def call_rate(self, flops: float, concurrency: int, queries: float, keys: float) -> float:
        """FLOP/s of a fully visible forward call of ``queries`` against ``keys`` inside a layer: :meth:`rate`,
        slowed by what calls of that shape measured against the square curve (none measured, or no more
        keys than queries: the square curve's)."""
        rate = self.rate(flops, concurrency, False)
        if not self.call_rates or keys <= queries:
            return rate
        return rate / _call_factor(self.call_rates, self.curve(concurrency, False), flops, keys / queries)

    def curve(self, concurrency: int, causal: bool) -> ComputeCurve:
        """The curve measured closest to ``concurrency`` ranks (ties: the busier one) for the mask."""
        curves = [c for c in self.compute if c.causal == causal] or self.compute
        return min(curves, key=lambda c: (abs(c.concurrency - concurrency), -c.concurrency))


class AttentionCurve(_Strict):
    """Published attention kernel throughput against sequence length for one shape class.

    Benchmarks of [FA2] and [FA3] keep batch x sequence = 16k tokens and h·d = 2048, so the GPU is full at
    every length and the length sets how well each tile's fixed costs amortise."""

    head_dim: Count()
    causal: Switch
    backward: Switch = Field(description="backward pass (FLOP/s of its own 2.5x forward FLOP)")
    kernel: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
        description="the kernel these figures are of when the profile holds several (--attention-kernel "
        "NAME, e.g. sdpa-cudnn); unnamed: the profile's default tables",
    )
    seq: list[Count()] = Field(
        min_length=1, description="sequence lengths of the benchmark (queries = keys), strictly increasing"
    )
    flops_per_s: list[FlopRate] = Field(
        min_length=1, description="achieved FLOP/s at each length (bf16/fp16)"
    )
    source: str = Field(description="figure the numbers are read from, or how they are derived")

    @model_validator(mode="after")
    def _paired(self) -> Self:
        _edges(self.seq, "seq", self.flops_per_s)
        return self


class GemmCurve(_Strict):
    """Achieved matrix-multiply FLOP/s against the edge of a square problem (m = n = k), in one input dtype
    (``kernels.gemm``: bf16/fp16; ``kernels.gemm_fp8``: fp8 e4m3)."""

    edge: list[Count()] = Field(min_length=1, description="square problem edges, strictly increasing")
    flops_per_s: list[FlopRate] = Field(min_length=1)
    source: str

    @model_validator(mode="after")
    def _paired(self) -> Self:
        _edges(self.edge, "edge", self.flops_per_s)
        return self


class Kernels(_Strict):
    """What real kernels achieve, as published (costmodel.machines.kernels reads these tables)."""

    attention: list[AttentionCurve] = Field(min_length=1)
    gemm: GemmCurve
    gemm_fp8: GemmCurve | None = Field(
        default=None,
        description="achieved fp8 (e4m3) multiply FLOP/s by square edge, what fp8 multiplies read (training "
        "--gemm-dtype fp8, inference fp8 weights); absent: the gemm table scaled by the fp8/bf16 peak ratio",
    )
    comm_sm_slowdown: Share = Field(
        description="share by which compute slows while a communication kernel "
        "runs beside it (SMs NCCL occupies / SMs of the device)"
    )
    ring_step_launch_s: Latency = Field(
        description="fixed cost per ring step outside the kernels: launches "
        "of the attention, merge and send/recv kernels"
    )
    launch_s: Latency = Field(
        default=0.0,
        description="fixed cost of one kernel on a training step's critical path: its launch and the "
        "framework's dispatch, when the host does not run ahead of the device",
    )
    step_s: Overhead = Field(
        default=0.0,
        description="fixed host time of one optimizer step beyond its kernels' work: the framework's "
        "bookkeeping between iterations (0: not known without measured runs)",
    )
    gemm_scale: Positive = Field(
        default=1.0,
        ge=SCALE_RANGE[0],
        le=SCALE_RANGE[1],
        description="factor on the gemm table's rates (a fitted profile's GEMM efficiency); the scaled table "
        "stays at or under the peak",
    )
    gemm_size_exponent: Finite = Field(
        default=0.0,
        ge=0,
        le=1,
        description="how a fitted profile's GEMM efficiency grows with problem size: rates x (edge / 4096)^this "
        "below a 4096 edge (0 to 1: a smaller problem never runs faster than the table)",
    )
    attention_scale: Positive = Field(
        default=1.0,
        ge=SCALE_RANGE[0],
        le=SCALE_RANGE[1],
        description="factor on the attention tables' rates (a fitted profile's kernel factor); the scaled "
        "tables stay at or under the peak",
    )
    sustained_clock: Positive = Field(
        default=1.0,
        ge=SUSTAINED_CLOCK_RANGE[0],
        le=SUSTAINED_CLOCK_RANGE[1],
        description="the SM clock a training step's or a prefill's sustained tensor-core load holds, as a share "
        "of the clock the tables were measured at (short kernel runs, boost clock): they read the tables' "
        "compute rates times it; a memory-bound decode, a kernel fit and comparisons with kernel benchmarks "
        "read them without it",
    )
    notes: str = Field(default="", description="how the numbers were derived")

    @model_validator(mode="after")
    def _one_curve_each(self) -> Self:
        """A shape class measured twice would be read by whichever came first: refused, naming it."""
        seen = set()
        for curve in self.attention:
            key = (curve.kernel, curve.head_dim, curve.causal, curve.backward)
            if key in seen:
                kernel = f"kernel {curve.kernel}, " if curve.kernel else ""
                raise ValueError(
                    f"two attention curves for {kernel}head_dim {curve.head_dim}, causal {curve.causal}, "
                    f"backward {curve.backward}: give each shape class once"
                )
            seen.add(key)
        return self


TopologyKind = Literal["switch", "nvlink-domain", "mesh", "torus"]


class Topology(_Strict):
    """The network's shape (docs/hardware.md, "Topology"): what the fast domain is built as, and how a
    device reaches the slower fabric beyond it. The fast domain's size is ``devices_per_node``.

    ``switch``: every device has one port of ``links.intra_node`` into a non-blocking switch (an 8-GPU
    NVSwitch node); ``nvlink-domain``: the same at rack scale (GB200 NVL72); ``mesh``: every device has
    one link of ``links.intra_node`` to each peer (MI300X xGMI); ``torus``: ``dims`` chips wired to their
    neighbours along each dimension by one link of ``links.intra_node`` each way (TPU ICI)."""

    kind: TopologyKind = Field(description="switch, nvlink-domain, mesh or torus")
    dims: list[Count(maximum=2**20)] | None = Field(
        default=None, description="torus only: chips along each dimension; their product is devices_per_node"
    )
    wraparound: Switch = Field(
        default=True, description="torus only: the last chip of each dimension links back to the first"
    )
    wraparound_min: Count(maximum=2**20) = Field(
        default=1,
        description="torus only: the shortest dimension that closes its ring (v5p: 4, a cube's edge; v5e: 16)",
    )
    nics_per_device: Within(0.01, 64.0, "NICs a device") = Field(
        default=1.0, description="NICs of links.inter_node each device drives at once (rail count per device)"
    )
    rail_optimized: Switch = Field(
        default=False,
        description="NIC i of every node hangs off leaf switch i: traffic between devices of the same "
        "local index stays on one leaf, any other crosses the spine",
    )
    spine_oversubscription: Positive = Field(
        default=1.0, ge=1.0, description="leaf down-links / up-links; 1 for a non-blocking fat tree"
    )
    source: str | None = Field(default=None, description="where the shape comes from when not source.url")

    @model_validator(mode="after")
    def _shape(self) -> Self:
        if self.kind == "torus" and not self.dims:
            raise ValueError("a torus topology must give dims (chips along each dimension)")
        if self.kind != "torus" and self.dims:
            raise ValueError(f"dims describe a torus, not a {self.kind}")
        return self


class FallbackEfficiency(_Strict):
    """The share of peak every kernel runs at when a profile has no published kernel tables."""

    value: Positive = Field(le=1, description="achieved / peak FLOP/s, in (0, 1]")
    source: str = Field(description="the published figure it is read from, or why it is assumed")


class HardwareProfile(_Strict):
    """A hardware profile (hardware/*.yaml). SI units; link bandwidth per direction."""

    name: str = Field(description="what --hw calls it")
    description: str = Field(default="", description="one line")
    source: Source
    device: Device
    devices_per_node: Annotated[Count(maximum=2**20), Field(description="accelerators per node")]
    cp_ranks_per_node: Count(maximum=2**20) | None = Field(
        default=None, description="consecutive CP ranks on one node; default devices_per_node"
    )
    links: Links
    calibration: Calibration | None = Field(
        default=None, description="the measurements of a measured profile"
    )
    kernels: Kernels | None = Field(
        default=None, description="published kernel efficiency tables (step model)"
    )
    topology: Topology | None = Field(
        default=None, description="the network's shape; default a switch of devices_per_node"
    )
    fallback_efficiency: FallbackEfficiency | None = Field(
        default=None, description="share of peak kernels run at where no kernels: tables are given"
    )
    fit_residuals: Residuals | None = Field(
        default=None,
        description="a profile fitted to measured runs (cp-plan audit --fit-profile): its k-fold residuals, "
        "ln(measured / predicted) of each run predicted by a fit that did not see it; step-time intervals "
        "are calibrated on them",
    )
    fit_residuals_by_layout: list[LayoutResiduals] | None = Field(
        default=None,
        description="the same residuals by layout class (TP degree, pipelined or not): a plan's step-time "
        "interval is calibrated on its class's runs where they are enough for the level, else on fit_residuals",
    )

    # The user's file it was read from, for refusals that come later than its loading (not a field).
    _origin: str = PrivateAttr(default="")
    # What the command line changed in it (compose.override), for every output to say so; "" as loaded.
    _changed: str = PrivateAttr(default="")

    def at_boost(self) -> HardwareProfile:
        """The profile with its kernel tables read as measured, at the boost clock of short kernel runs
        (``kernels.sustained_clock`` 1): what a kernel benchmark, not a training run, is compared with."""
        if self.kernels is None or self.kernels.sustained_clock == 1.0:
            return self
        return self.model_copy(update={"kernels": self.kernels.model_copy(update={"sustained_clock": 1.0})})

    @model_validator(mode="after")
    def _placement(self) -> Self:
        if self.ranks_per_node > self.devices_per_node:
            raise ValueError("cp_ranks_per_node cannot exceed devices_per_node")
        host = self.links.host
        if host and host.devices_per_host and host.devices_per_host > self.devices_per_node:
            raise ValueError("links.host.devices_per_host cannot exceed devices_per_node")
        dims = self.topology.dims if self.topology else None
        if dims and math.prod(dims) != self.devices_per_node:
            shape = "x".join(map(str, dims))
            raise ValueError(
                f"topology.dims {shape} hold {math.prod(dims)} chips, not devices_per_node {self.devices_per_node}"
            )
        return self

    @model_validator(mode="after")
    def _layout_classes(self) -> Self:
        by_layout = self.fit_residuals_by_layout or []
        if not by_layout:
            return self
        if self.fit_residuals is None:
            raise ValueError("fit_residuals_by_layout needs fit_residuals, every class's runs pooled")
        if len({(r.tp, r.pipelined) for r in by_layout}) < len(by_layout):
            raise ValueError("fit_residuals_by_layout holds one set per (tp, pipelined), each at most once")
        if sum(r.residuals.runs for r in by_layout) != self.fit_residuals.runs:
            raise ValueError("fit_residuals_by_layout's runs must add up to fit_residuals.runs")
        return self

    @model_validator(mode="after")
    def _within_peak(self) -> Self:
        """Every kernel table, times its fitted factor, and every rate calibrate measured at or under the peak
        it is read against: MFU and HFU are shares of that peak, and a rate above it would make them pass
        100 %."""
        kernels, device, calibration = self.kernels, self.device, self.calibration
        if calibration is not None:
            dtype = calibration.dtype
            if dtype not in device.peak_flops:
                raise ValueError(
                    f"calibration.dtype {dtype} needs device.peak_flops.{dtype}, the peak it ran at"
                )
            for i, curve in enumerate(calibration.compute):
                for part in ("forward", "backward"):
                    best = max(point.flops_per_s for point in getattr(curve, part))
                    where = f"calibration.compute.{i}.{part}.flops_per_s"
                    _within(where, best, device.peak_flops[dtype], f"device.peak_flops.{dtype}")
        if kernels is None:
            return self
        table_peak, peak_name = device.table_peak, f"device.peak_flops.{TABLE_DTYPE}"
        for i, curve in enumerate(kernels.attention):
            where = f"kernels.attention.{i}.flops_per_s x attention_scale"
            _within(where, max(curve.flops_per_s) * kernels.attention_scale, table_peak, peak_name)
        gemm = max(kernels.gemm.flops_per_s) * kernels.gemm_scale
        _within("kernels.gemm.flops_per_s x gemm_scale", gemm, table_peak, peak_name)
        if kernels.gemm_fp8 is not None:
            fp8 = device.peak_flops.get("fp8")
            if fp8 is None:
                raise ValueError("kernels.gemm_fp8 needs device.peak_flops.fp8, the peak it is read against")
            rate = max(kernels.gemm_fp8.flops_per_s) * kernels.gemm_scale
            _within("kernels.gemm_fp8.flops_per_s x gemm_scale", rate, fp8, "device.peak_flops.fp8")
        return self

    @property
    def shape(self) -> Topology:
        """The topology, defaulting to a non-blocking switch of devices_per_node with one NIC per device."""
        return self.topology or Topology(kind="switch")

    @property
    def ranks_per_node(self) -> int:
        return self.cp_ranks_per_node or self.devices_per_node

    def __eq__(self, other: object) -> bool:
        """Profiles of equal fields are equal, wherever each was read from."""
        if not isinstance(other, HardwareProfile):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = _Strict.__hash__  # defining __eq__ would otherwise drop the frozen model's hash

    @property
    def origin(self) -> str:
        """How a refusal names it: the user's file it was read from, else ``profile 'name'``."""
        return self._origin or f"profile {self.name!r}"

    @property
    def changed(self) -> str:
        """What the command line changed in the profile (``--hbm-bytes``, ``--clock-scale``, a link), "" if nothing."""
        return self._changed


def builtin_names() -> list[str]:
    return sorted(p.stem for p in data_dir("hardware").glob("*.yaml"))


def parse_profile(
    data: object, origin: str, field: str = "--hw", document: YamlDocument | None = None
) -> HardwareProfile:
    """Validate loaded YAML; any problem becomes one :class:`InputError` line naming the field (and its
    line, given the ``document`` the data came from)."""
    if not isinstance(data, dict):
        raise InputError(field, f"{origin}: {not_a_mapping(data, 'hardware')}")
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        said = another_kind(data, "hardware profile") or describe_validation(
            exc, document.line if document else None, HardwareProfile
        )
        raise InputError(field, f"{origin}: {said}") from None


def load_profile(spec: str, field: str = "--hw") -> HardwareProfile:
    """A built-in profile by name, or a YAML file by path."""
    return _prebuilt(spec, field) or read_profile(spec, field)


def _prebuilt(spec: str, field: str) -> HardwareProfile | None:
    """The built-in profile ``spec`` names as ``python -m costmodel.codegen`` validated it, built again with
    pydantic's ``model_construct`` (``costmodel/machines/builtin_profiles.py``): no YAML parser and no
    validation at run time, ~40 ms of a plan. Only while the file's bytes hash as they did then: an edited
    file (or a built-in codegen has not seen) is read and validated as a user's is. None otherwise."""
    path = builtin_path(spec, data_dir("hardware"))
    if path is None:
        return None
    from costmodel.machines import builtin_profiles

    entry = builtin_profiles.PROFILES.get(path.stem)
    if entry is None or hashlib.sha256(read_input(path, field, "yaml")).hexdigest() != entry[0]:
        return None
    return entry[1](sys.modules[__name__])  # the generated code names this module's classes


def read_profile(spec: str, field: str = "--hw") -> HardwareProfile:
    """:func:`load_profile` from the YAML, read and validated whatever the file is (codegen's source)."""
    data, origin, document = load_builtin_or_file(spec, data_dir("hardware"), field, "hardware")
    profile = parse_profile(data, origin, field, document)
    if Path(origin).parent != data_dir("hardware"):  # a user's file: later refusals name it
        profile._origin = origin
    return profile


def profile_yaml(profile: HardwareProfile, how: str) -> str:
    """The profile as YAML under a header that says how it was made (``how``, a sentence) and how to use it."""
    import yaml

    body = yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110)
    return (
        f"# Hardware profile {how}.\n"
        "# Units are SI: FLOP/s, bytes, bytes/s, seconds. Bandwidths are PER DIRECTION (a ring step's receive);\n"
        "# all-to-all bandwidth counts the bytes each rank receives. Use it anywhere: --hw this-file.yaml\n"
    ) + body
