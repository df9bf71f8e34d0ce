"""Every input of a plan, declared once: name, type, unit, default, help, range and check.

The command-line flags (:mod:`costmodel.cli.options` builds them from these fields), capacity-plan
files, the report's ``inputs``, sweeps and calibration all derive from the two models below. A value
is validated once, when a model is built (:func:`build`), and any problem becomes one
:class:`~costmodel.core.errors.InputError` naming the flag. To add a flag, add a field here.

Ranges are the tool's supported limits (docs/limits.md): wide enough for any real job, narrow enough
that every accepted input is answered in bounded time and memory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from copy import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    computed_field,
    model_validator,
)

from costmodel.core.errors import InputError, pattern_in_words
from costmodel.core.fields import CountAsWritten, NumberAsWritten, Switch
from costmodel.core.units import TOKENS_HELP, parse_budget, parse_tokens
from costmodel.machines.binding import Machine, build_machine
from costmodel.machines.kernels import attention_kernels, check_kernel
from costmodel.machines.profiles import BYTES_PER_ELEMENT, Dtype, HardwareProfile, load_profile
from costmodel.machines.topology import parse_order, strides
from costmodel.plans.models import load_model
from costmodel.plans.packing import pack
from costmodel.plans.stages import StageSplit, split_stages
from costmodel.schedule.layouts import Layout, check_divisible
from costmodel.schedule.packed import MAX_MASKED_TOKENS, MAX_MASKED_WORK

if TYPE_CHECKING:
    from costmodel.plans.models import ModelPreset

Pass = Literal["fwd", "bwd", "fwd+bwd"]
Recompute = Literal["none", "selective", "full"]
LORA_RANK = 16  # the adapters' rank when --finetune lora names none (PEFT's and torchtune's recipes use 8-64)
Offload = Literal["none", "optimizer", "optimizer+params", "activations", "optimizer+activations", "all"]

MAX_TOKENS = 2**34  # 16G tokens: far past any context length in use, small enough for float64 exactness
MAX_DEVICES = 2**20  # 1M accelerators
MAX_CP = 2**10  # a ring over 1,024 ranks is far past any in use (Llama 3 trained with 16); N x N stays small
MAX_HEADS = 2**16  # query or KV heads of one layer, as a model preset bounds them
MAX_HEAD_DIM = 2**16  # elements per head (64 to 256 in use)
MAX_LAYERS = 2**16  # a model preset's layers: bounds the layers of a stage and the virtual stages
MAX_SEQUENCES = 2**30  # sequences in one optimizer step, or on one device: far past any batch in use


def _tokens(value: Any) -> Any:
    """Plan files write lengths as people say them (128k); anything else is left to the type check."""
    if isinstance(value, str):
        try:
            return parse_tokens(value)
        except InputError as exc:
            raise ValueError(exc.message) from None
    return value


def _budget(value: Any) -> Any:
    """Plan files write token budgets as people say them (1T, 300B: decimal multiples)."""
    if isinstance(value, str):
        try:
            return parse_budget(value, "tokens")
        except InputError as exc:
            raise ValueError(exc.message) from None
    return value


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML's true would pass for 1
        raise ValueError("expected a number, not a boolean")
    return value


# The matrices of a layer LoRA can adapt, and the names a target list may use for them: these, PEFT's module
# names (q_proj ... down_proj) and Megatron Core's (linear_qkv, linear_proj, linear_fc1, linear_fc2).
LORA_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    **{m: (m,) for m in LORA_MATRICES},
    **{f"{m}_proj": (m,) for m in LORA_MATRICES},
    "qkv": ("q", "k", "v"),
    "linear_qkv": ("q", "k", "v"),
    "proj": ("o",),
    "linear_proj": ("o",),
    "fc1": ("gate", "up"),
    "linear_fc1": ("gate", "up"),
    "fc2": ("down",),
    "linear_fc2": ("down",),
    "all": LORA_MATRICES,
}


def _finetune(value: Any) -> Any:
    accepted = (
        "accepted: full, lora, lora:RANK with RANK from 1 to 9999, lora:TARGETS or lora:RANK:TARGETS with "
        "TARGETS a comma list of q, k, v, o, gate, up, down (or qkv, proj, fc1, fc2, all; PEFT's q_proj ... and "
        "Megatron's linear_qkv ... names too)"
    )
    match = isinstance(value, str) and re.fullmatch(
        r"full|lora(:[1-9][0-9]{0,3})?(:[a-z_0-9]+(,[a-z_0-9]+)*)?", value, re.ASCII
    )
    if not match or (match.group(2) and any(t not in LORA_TARGETS for t in match.group(2)[1:].split(","))):
        raise ValueError(accepted)
    return value


Finetune = Annotated[str, AfterValidator(_finetune)]
Tokens = Annotated[int, BeforeValidator(_tokens), BeforeValidator(_no_bool), Strict()]
Count = Annotated[int, BeforeValidator(_no_bool), Strict()]
TokenBudget = Annotated[
    int, BeforeValidator(_budget), BeforeValidator(_no_bool), Strict(), Field(ge=1, le=10**18)
]
Number = Annotated[float, NumberAsWritten, Field(allow_inf_nan=False)]
Flag = Switch


def flag(
    default: Any,
    help: str,
    *,
    short: str | None = None,
    unit: str | None = None,
    tokens: bool = False,
    from_model: bool = False,
    aliases: tuple[str, ...] = (),
    fitted: str | None = None,
    **constraints: Any,
) -> Any:
    """A declared input: the CLI flag is ``--`` + the field name with dashes (``pass_`` is ``--pass``).

    ``from_model``: a model preset fills it when the flag is not given. ``tokens``: accepts 256k, 1M.
    ``aliases``: further long flags for the same field (``--n`` for ``--cp``). ``fitted``: the declared
    default is fitted to the other inputs when the flag is not given; says how, for the help."""
    extra = {
        "short": short,
        "unit": unit,
        "tokens": tokens,
        "from_model": from_model,
        "aliases": list(aliases),
        "fitted": fitted,
    }
    return Field(
        default, description=help, json_schema_extra={k: v for k, v in extra.items() if v}, **constraints
    )


def declared_as(model: type[BaseModel], name: str, **changes: Any) -> Any:
    """``model``'s declaration of the field ``name``, for another model that takes the same flag: one help,
    range and check wherever the flag appears. ``changes`` (a default) are the other model's own."""
    info = copy(model.model_fields[name])
    info.metadata = list(
        info.metadata
    )  # pydantic extends it with the annotation's: keep the original's whole
    for key, value in changes.items():
        setattr(info, key, value)
    return info


def _rank_order(value: str) -> str:

    try:
        return "-".join(parse_order(value))
    except InputError as exc:
        raise ValueError(exc.message) from None


RankOrder = Annotated[str, AfterValidator(_rank_order)]


@dataclass(frozen=True)
class Derived:
    """What a checked layout implies: DP, micro-batches per step (None when no global batch is stated) and
    the pipeline's split of the layers."""

    dp: int
    micro_batches: int | None
    stages: StageSplit


class Parallelism(BaseModel):
    """The parallel layout of a job, every degree declared once (torchtitan's ``ParallelDims``): G ranks as
    TP x CP x PP x DP with DP derived, the interleaved pipeline's virtual stages and its uneven end stages,
    EP carved out of DP, the micro-batch and global batch, and the rank order.

    The commands' input models take these fields (:func:`declared_as`), so a flag is declared once however
    many commands take it; :meth:`check` is the one validator of the degrees against each other, the job's
    GPUs and the model."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, populate_by_name=True)

    tp: Count = flag(1, "Tensor-parallel degree.", unit="devices", ge=1, le=MAX_DEVICES)
    cp: Count = flag(
        1,
        "N, the CP degree: devices the sequence (and a served request's KV cache) is split over.",
        short="-n",
        unit="devices",
        aliases=("--n",),
        validation_alias=AliasChoices("cp", "n"),  # plan files and notebooks written before the rename
        ge=1,
        le=MAX_CP,
    )
    pp: Count = flag(1, "Pipeline-parallel degree.", unit="devices", ge=1, le=MAX_DEVICES)
    vpp: Count = flag(
        1, "Virtual pipeline stages per device (interleaved 1F1B).", unit="stages", ge=1, le=MAX_LAYERS
    )
    first_stage_layers: Count | None = flag(
        None,
        "Layers on the first pipeline stage (Megatron's --decoder-first-pipeline-num-layers); the middle "
        "stages share the rest evenly [default: the balanced split].",
        unit="layers",
        ge=1,
        le=MAX_LAYERS,
    )
    last_stage_layers: Count | None = flag(
        None,
        "Layers on the last pipeline stage, which also runs the output layer and loss (Megatron's "
        "--decoder-last-pipeline-num-layers) [default: the balanced split].",
        unit="layers",
        ge=1,
        le=MAX_LAYERS,
    )
    ep: Count = flag(
        1,
        "Expert-parallel degree of an MoE model: ranks its experts are split over, out of DP.",
        unit="devices",
        ge=1,
        le=MAX_DEVICES,
    )
    micro_batch: Count = flag(1, "b, sequences per micro-batch.", unit="sequences", ge=1, le=MAX_SEQUENCES)
    global_batch: Count | None = flag(
        None,
        "Sequences per optimizer step: micro-batch x DP x micro-batches per pipeline.",
        unit="sequences",
        ge=1,
        le=MAX_SEQUENCES,
    )
    rank_order: RankOrder = flag(
        "tp-cp-dp-pp",
        "How ranks are numbered, innermost first: the inner groups share the fast domain (Megatron: tp-cp-dp-pp).",
        max_length=40,
    )

    @classmethod
    def of(cls, *declared: BaseModel) -> Parallelism:
        """The layout a command's built models state: each field from the first of them that has it."""
        values: dict[str, Any] = {}
        for model in declared:
            fields = type(model).model_fields
            values |= {
                name: getattr(model, name)
                for name in cls.model_fields
                if name in fields and name not in values
            }
        return cls.model_validate(values)

    def check_gpus(self, gpus: int) -> None:
        """The job's GPUs split into TP x PP slices (the part of :meth:`check` that needs no model)."""
        if gpus % (self.tp * self.pp):
            raise InputError("--gpus", f"{gpus} GPUs do not split into TP x PP = {self.tp * self.pp} groups")

    def check(self, model: ModelPreset, gpus: int | None = None) -> Derived:
        """The one check of a layout, in the order a user would fix it: the GPUs against TP x PP, TP against
        the heads, TP x CP x PP against the GPUs, the pipeline split, the batch split, EP. One line naming the
        flag for the first problem. DP is 1 when ``gpus`` is not stated (a serving replica)."""
        if gpus is not None:
            self.check_gpus(gpus)
        if model.heads % self.tp:
            raise InputError("--tp", f"{self.tp} must divide the model's {model.heads} heads")
        group = self.tp * self.cp * self.pp
        if gpus is not None and gpus % group:
            raise InputError("--gpus", f"{gpus} is not divisible by tp x cp x pp = {group}")
        dp = 1 if gpus is None else gpus // group
        stages = split_stages(
            model.layers, self.pp, self.vpp, self.first_stage_layers, self.last_stage_layers
        )
        micro = self._micro_batches(dp)
        self._experts(model, dp)
        return Derived(dp, micro, stages)

    def _micro_batches(self, dp: int) -> int | None:
        if self.global_batch is None:
            return None
        if self.global_batch % (self.micro_batch * dp):
            raise InputError(
                "--global-batch",
                f"{self.global_batch} is not divisible by micro-batch x DP = {self.micro_batch} x {dp}",
            )
        micro = self.global_batch // (self.micro_batch * dp)
        if self.vpp > 1 and micro < self.pp:  # the interleaved schedule fills every stage before it steadies
            raise InputError(
                "--vpp",
                f"interleaving needs at least --pp {self.pp} micro-batches per pipeline; the step has {micro} "
                "(--global-batch / (--micro-batch x DP))",
            )
        return micro

    def _experts(self, model: ModelPreset, dp: int) -> None:
        if self.ep == 1:
            return
        if not model.experts:
            raise InputError("--ep", f"{self.ep} needs an MoE model; {model.name} has no experts")
        if model.experts % self.ep:
            raise InputError("--ep", f"{self.ep} must divide the model's {model.experts} experts")
        if dp % self.ep:
            raise InputError(
                "--ep", f"{self.ep} must divide the data-parallel degree {dp} (EP is carved out of DP)"
            )


class Overlaps(BaseModel):
    """How much of each parallel dimension's communication hides under compute, declared once for the step
    and the prefill (a command takes the fields it models, :func:`declared_as`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    tp_comm_overlap: Flag | None = flag(
        None,
        "TP collectives pipelined with their matrix multiplies in t chunks (Megatron's --tp-comm-overlap, "
        "Transformer Engine's userbuffers; torch's AsyncTP): all but one chunk's transfer can hide "
        "[default: the training framework's; off when serving].",
    )
    cp_overlap: Number = flag(
        1.0,
        "Share of CP's ring transfers hidden under attention (the step's, the prefill's), in [0, 1].",
        ge=0,
        le=1,
    )
    pp_overlap: Number = flag(1.0, "Share of steady-state pipeline sends hidden, in [0, 1].", ge=0, le=1)


class Workload(BaseModel):
    """What a job trains on and where: the sequence, its CP split and layout, the masks, the element type,
    the hardware profile and the model. A training job (:class:`~costmodel.plans.job.Job`) takes these; one
    attention layer (:class:`PlanInputs`) adds its own shape."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, populate_by_name=True)

    seq: Tokens = flag(
        262_144, f"S, tokens: {TOKENS_HELP}.", short="-s", unit="tokens", tokens=True, ge=1, le=MAX_TOKENS
    )
    cp: Count = declared_as(Parallelism, "cp", default=8)
    dtype: Dtype = flag("bf16", "Element type of Q, K, V: sets p and the peak FLOP/s.")
    layout: Layout = flag(
        "contiguous", "Which tokens each device holds (zigzag and striped balance a causal mask)."
    )
    efficiency: Number | None = flag(
        None,
        "Effective / peak FLOP/s for every kernel, in [0.001, 1]; default: the profile's measured or "
        "published kernel rates where it has them, else peak.",
        ge=0.001,
        le=1,
    )
    hw: str = flag(
        "a100-nvlink", "Hardware profile: a built-in name (cp-plan hw list) or a YAML path.", max_length=4096
    )
    model: str | None = flag(
        None, "Model preset name or YAML path; sets heads, kv-heads, head-dim.", short="-m", max_length=4096
    )
    docs: str | None = flag(
        None,
        "Packed documents in windows of S: lengths (200k,4kx16,512x40), a file (a length per line, or a "
        "JSON/CSV histogram), or lognormal:mean=4k,sigma=1,count=200,seed=0; first-fit in order "
        "(docs/packing.md).",
        max_length=4096,
    )
    packing: Literal["dense", "varlen"] = flag(
        "varlen",
        "How the kernel treats the document mask: dense blanks scores and computes the causal window, "
        "varlen skips masked tiles.",
    )
    window: Tokens | None = flag(
        None,
        "Sliding window W: a query sees keys within W tokens.",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )
    attention_chunk: Tokens | None = flag(
        None,
        "Chunked (local) attention: a query sees keys in its aligned chunk of C tokens.",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )

    @computed_field(description="p, bytes per element, from dtype")  # type: ignore[prop-decorator]
    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.dtype]

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update``; a key that names no field (``n``, the CP degree's former name) is refused,
        where pydantic would add it silently and leave the field as it was."""
        unknown = sorted(set(update or ()) - set(type(self).model_fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(unknown)}")
        return super().model_copy(update=update, deep=deep)

    @property
    def shard_tokens(self) -> int:
        return self.seq // self.cp

    @property
    def masked(self) -> bool:
        """Documents, or a sliding window or chunks narrower than the sequence: the schedule comes from the mask
        simulator. A window or a chunk of S tokens or more masks nothing."""
        return self.docs is not None or self._narrower is not None

    @property
    def _narrower(self) -> str | None:
        """The first of the window and the chunk that is narrower than the sequence, by its field's name."""
        given = (("window", self.window), ("attention_chunk", self.attention_chunk))
        return next((name for name, value in given if value is not None and value < self.seq), None)

    @model_validator(mode="after")
    def _split(self) -> Self:
        if self.cp > self.seq:
            raise InputError("cp", f"CP degree {self.cp} exceeds the sequence length {self.seq}")
        # Every rank holds S/N tokens whatever the scheme; the layout's own chunks are checked where the layout
        # is settled (PlanInputs): a job's whole-sequence scheme shards as its framework does (make_job).
        if self.seq % self.cp:
            raise InputError("seq", f"{self.seq} tokens do not split evenly over N = {self.cp} ranks")
        if self.masked:  # before packing: a refused S reads no documents
            if self.seq > MAX_MASKED_TOKENS or self.seq * self.cp > MAX_MASKED_WORK:
                raise InputError(
                    "docs" if self.docs else self._narrower,
                    f"packed and windowed masks are simulated up to S = {MAX_MASKED_TOKENS:,} tokens and "
                    f"S x N = {MAX_MASKED_WORK:,} (got S = {self.seq:,}, N = {self.cp})",
                )
        if self.docs is not None:
            pack(self.docs, self.seq)
        return self


class PlanInputs(Workload):
    """One attention layer to plan: the workload, the layer's shape, and which pass the verdict covers."""

    batch: Count = flag(1, "b, sequences per device.", short="-b", unit="sequences", ge=1, le=MAX_SEQUENCES)
    heads: Count = flag(32, "h, query heads.", unit="heads", from_model=True, ge=1, le=MAX_HEADS)
    kv_heads: Count = flag(
        8, "n_kv, key/value heads (GQA when fewer than h).", unit="heads", from_model=True, ge=1, le=MAX_HEADS
    )
    head_dim: Count = flag(
        128, "d, the head dimension.", unit="elements", from_model=True, ge=1, le=MAX_HEAD_DIM
    )
    block: Tokens = flag(
        1024,
        "s_blk, compute tile rows (a kernel's query block): the memory tiers' tile and the causal utilisation's; "
        "the layer time reads the kernel tables.",
        unit="tokens",
        tokens=True,
        fitted="1024, or the shard S/N where it is shorter",
        ge=1,
        le=MAX_TOKENS,
    )
    causal: Flag = flag(False, "Causal mask: useful compute halves, traffic does not.")
    pass_: Pass = Field(
        "fwd", alias="pass", description="Which pass the verdict covers; fwd+bwd takes the worse."
    )

    @model_validator(mode="after")
    def _shape(self) -> Self:
        check_divisible(self.layout, self.seq, self.cp)
        if self.kv_heads > self.heads:
            raise InputError("kv_heads", f"{self.kv_heads} exceeds --heads {self.heads}")
        if self.heads % self.kv_heads:
            raise InputError("kv_heads", f"{self.kv_heads} does not divide --heads {self.heads} (GQA groups)")
        if self.block > self.shard_tokens:
            if "block" in self.model_fields_set:
                raise InputError(
                    "block", f"tile of {self.block} tokens is larger than the shard S/N = {self.shard_tokens}"
                )
            # the kernel's default tile on a shorter shard: one partial tile, as FlashAttention runs it
            object.__setattr__(self, "block", self.shard_tokens)
        return self


class MachineOverrides(BaseModel):
    """What a command line changes in a profile: "H100 with 8 GPUs per node over 200 Gb/s RoCE" is
    ``--hw h100-ib --inter-node-bandwidth 200Gb``, not a new file (:func:`costmodel.machines.compose.override`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    inter_node_bandwidth: str | None = flag(
        None,
        "Replace the profile's inter-node link, per direction: 200Gb (bits), 25GB/s (bytes), 1.8TB/s.",
        max_length=40,
    )
    intra_node_bandwidth: str | None = flag(
        None,
        "Replace the profile's intra-node link, per direction, as --inter-node-bandwidth.",
        max_length=40,
    )
    devices_per_node: Count | None = flag(
        None,
        "Accelerators per node: the fast domain (NVLink, xGMI or ICI slice).",
        unit="devices",
        ge=1,
        le=MAX_DEVICES,
    )
    cp_ranks_per_node: Count | None = flag(
        None,
        "Consecutive CP ranks on one node; the ring leaves the node beyond them.",
        unit="devices",
        ge=1,
        le=MAX_DEVICES,
    )
    torus_dims: str | None = flag(
        None,
        "A torus profile's slice shape, e.g. 4x4x8 (TPU v5p) or 4x8 (v5e): sets the fast domain to its chips.",
        max_length=40,
    )
    hbm_bytes: Number | None = flag(
        None,
        "Replace the device's memory, in bytes as its datasheet states it (a part sold with other HBM, e.g. 96e9 "
        "for a 96 GB H100): a process allocates the profile's share of it.",
        unit="bytes",
        gt=0,
        le=2**50,
    )
    hbm_bandwidth: str | None = flag(
        None,
        "Replace the device's memory bandwidth, as --inter-node-bandwidth (e.g. 2.4TB/s): memory-bound kernels "
        "keep the profile's share of it.",
        max_length=40,
    )
    clock_scale: Number | None = flag(
        None,
        "The part's sustained tensor-core clock as a share of the profile's part's: under 1 the same chip at a "
        "lower power limit (e.g. 0.92), over 1 one that holds more of its boost clock under load, up to the "
        "kernel tables' own clock (1.144 on Hopper's 0.874); compute-bound kernels run at that share; memory, "
        "links and the peak MFU is stated against stay the profile's.",
        gt=0,
    )

    def changes(self) -> dict[str, Any]:
        """The profile changes these flags make, as :class:`~costmodel.machines.compose.ProfileChanges`' fields."""
        return {
            "inter_bandwidth": self.inter_node_bandwidth,
            "intra_bandwidth": self.intra_node_bandwidth,
            "devices_per_node": self.devices_per_node,
            "cp_ranks_per_node": self.cp_ranks_per_node,
            "torus_dims": self.torus_dims,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bandwidth": self.hbm_bandwidth,
            "clock_scale": self.clock_scale,
        }


def machine_for(
    inputs: PlanInputs,
    overrides: MachineOverrides | None = None,
    profile: HardwareProfile | None = None,
    kernel: LayerKernel | None = None,
) -> Machine:
    """The plan's machine: its profile (``inputs.hw``, or ``profile`` already loaded), changed as the command
    line says, bound to its dtype and efficiency, its attention calls reading ``kernel``'s tables."""
    machine = _machine(inputs, overrides, profile, job=False)
    return machine if kernel is None else reading_kernel(machine, kernel.attention_kernel)


def reading_kernel(machine: Machine, kernel: str) -> Machine:
    """``machine`` with its attention calls reading ``kernel``'s tables (``flash``: the profile's default
    ones); one line naming --attention-kernel where the profile holds none of that name."""
    if kernel == "flash":
        return machine
    if kernel == "unfused":  # a name the training flag accepts: its score matrices are the step's alone
        tables = ", ".join(["flash", *attention_kernels(machine.profile)])
        raise InputError(
            "--attention-kernel",
            f"unfused is Megatron's training attention (cp-plan step); {machine.profile.origin} has tables for "
            f"{tables}",
        )
    check_kernel(kernel, machine.profile)
    return replace(machine, attention_kernel=kernel)


def job_machine(
    inputs: PlanInputs, overrides: MachineOverrides | None = None, profile: HardwareProfile | None = None
) -> Machine:
    """The machine of a job that states its layout (`step`, `recommend`, `check`, `report`, the HTML page).

    A profile's ``cp_ranks_per_node`` stands in for the TP a single-layer plan does not know (the -ib
    profiles put one CP rank per node: TP fills it). A job states TP and the rank order, so a node holds
    devices_per_node consecutive ranks, and every group is placed from them, unless ``cp_ranks_per_node``
    is given (``--cp-ranks-per-node``, a plan file's key). ``profile``, already loaded, stands in for
    reading ``inputs.hw`` again."""
    return _machine(inputs, overrides, profile, job=True)


def _machine(
    inputs: PlanInputs, overrides: MachineOverrides | None, profile: HardwareProfile | None, job: bool
) -> Machine:
    changes = (overrides or MachineOverrides()).changes()
    return build_machine(
        profile or load_profile(inputs.hw), inputs.dtype, inputs.efficiency, changes=changes, job=job
    )


def cp_stride(setup: TrainingSetup, n: int) -> int:
    """Ranks between CP neighbours under the job's rank order (TP's degree in Megatron's tp-cp-dp-pp)."""

    dp = max(1, setup.gpus // (setup.tp * n * setup.pp))
    return strides(setup.rank_order, {"tp": setup.tp, "cp": n, "dp": dp, "pp": setup.pp})["cp"]


# What a training job defaults to, where one attention layer defaults to the forward of a full mask.
TRAINING_DEFAULTS: dict[str, Any] = {"causal": True, "layout": "zigzag", "pass_": "fwd+bwd"}


MOST_HEADROOM = 0.9  # the most of a device's memory --memory-headroom may leave free


class TrainingSetup(BaseModel):
    """How the rest of the job is laid out around CP."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    gpus: Count = flag(8, "G: accelerators in the job.", short="-g", unit="devices", ge=1, le=MAX_DEVICES)
    tp: Count = declared_as(Parallelism, "tp")
    pp: Count = declared_as(Parallelism, "pp")
    first_stage_layers: Count | None = declared_as(Parallelism, "first_stage_layers")
    last_stage_layers: Count | None = declared_as(Parallelism, "last_stage_layers")
    zero: Annotated[Literal[0, 1, 2, 3], CountAsWritten] | None = flag(
        None,
        "ZeRO stage over DP x CP (1 = distributed optimizer, 3 = FSDP) [default: the framework's: 1 for "
        "megatron, 3 for torchtitan and hf-trainer].",
    )
    zero_shard: Count | None = flag(
        None,
        "Hybrid sharding: ZeRO shards over groups of this many consecutive DP x CP ranks and replicates "
        "across the groups, which all-reduce their gradient shards (torch's HSDP, Megatron's "
        "--num-distributed-optimizer-instances, DeepSpeed's MiCS, InternEvo's zero1 size) [default: all of "
        "DP x CP].",
        unit="devices",
        ge=1,
        le=MAX_DEVICES,
    )
    recompute: Recompute = flag("selective", "Activation recompute: selective recomputes the attention core.")
    offload: Offload = flag(
        "none",
        "What lives in host memory over the profile's host link: optimizer (fp32 master weights and Adam "
        "moments; the CPU runs Adam, as ZeRO-Offload), optimizer+params (the weights too, fetched per layer, "
        "as ZeRO-3 or FSDP CPU offload), activations (each layer's copied out in the forward, back in the "
        "backward), optimizer+activations (ZeRO-Offload with activation offload), all.",
    )
    sequence_parallel: Flag | None = flag(
        None, "Sequence parallelism with TP: splits norms and dropouts too [default: on when TP > 1]."
    )
    attention_kernel: str | None = flag(
        None,
        "The attention kernel: flash (fused, the profile's attention tables; the score matrix is never "
        "stored), unfused (Megatron's core attention: batched multiplies with the score matrix through HBM, "
        "softmax and dropout; no CP), or a kernel whose tables the profile holds (cp-plan hw show: e.g. "
        "sdpa-cudnn).",
        fitted="the framework's: flash, unfused for megatron-deepspeed",
        pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
    )
    finetune: Finetune = flag(
        "full",
        "What trains: full (every weight, as pre-training) or lora[:RANK][:TARGETS] (the base frozen: no "
        "gradients, optimizer states or weight-gradient multiplies for it; low-rank adapters of RANK, 16 unless "
        "given, train instead, beside every linear layer or the TARGETS named: a comma list of q, k, v, o, gate, "
        "up, down, or qkv, proj, fc1, fc2, as lora:16:q,v).",
    )
    memory_headroom: Number = flag(
        0.05,
        "Fraction of the memory a process can allocate left free beyond what the step needs at its peak (the "
        "allocator's reserve and the runtime's own are counted in the step), in [0, 0.9].",
        ge=0,
        le=MOST_HEADROOM,
    )
    rank_order: RankOrder = declared_as(Parallelism, "rank_order")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        Parallelism.of(self).check_gpus(self.gpus)
        return self

    @property
    def stores_scores(self) -> bool:
        """Whether a layer keeps its score matrix for backward: an unfused kernel, not recomputed."""
        return self.attention_kernel == "unfused" and self.recompute == "none"

    @property
    def lora_rank(self) -> int:
        """The adapters' rank under ``finetune = lora[:RANK][:TARGETS]``; 0 in full training."""
        if self.finetune == "full":
            return 0
        ranks = [part for part in self.finetune.split(":")[1:] if part.isdigit()]
        return int(ranks[0]) if ranks else LORA_RANK

    @property
    def lora_targets(self) -> frozenset[str]:
        """The matrices of :data:`LORA_MATRICES` the adapters sit beside: every one unless ``TARGETS`` names
        some; none in full training."""
        if self.finetune == "full":
            return frozenset()
        named = [part for part in self.finetune.split(":")[1:] if not part.isdigit()]
        return frozenset(
            m for name in (named[0].split(",") if named else ["all"]) for m in LORA_TARGETS[name]
        )

    @property
    def offloaded(self) -> dict[str, int]:
        """o_opt, o_par, o_act of the offload formulas: what ``offload`` keeps in host memory."""
        parts = {"all": "optimizer+params+activations"}.get(self.offload, self.offload).split("+")
        params = "params" in parts
        return {
            "o_opt": int(params or "optimizer" in parts),
            "o_par": int(params),
            "o_act": int("activations" in parts),
        }

    @property
    def sp(self) -> bool:
        """Sequence parallel in effect: as asked, else on whenever TP splits the layer."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel and self.tp > 1

    def stages(self, layers: int, vpp: int = 1) -> StageSplit:
        """The pipeline split of ``layers``: the first and last stages' counts as given, else balanced."""
        return split_stages(layers, self.pp, vpp, self.first_stage_layers, self.last_stage_layers)

    @property
    def shard_group(self) -> int:
        """D = DP x CP: ranks that hold the same weights, over which ZeRO shards optimizer states."""
        return self.gpus // (self.tp * self.pp)

    @property
    def zero_label(self) -> str:
        """The ZeRO stage as a plan's header states it, with hybrid sharding's groups."""
        hybrid = "" if self.zero_shard is None else f" in groups of {self.zero_shard} (hybrid)"
        return f"ZeRO-{self.zero}{hybrid}"

    def zero_group(self, weights: Any) -> Any:
        """Ranks ZeRO shards over, of ``weights`` holding the same weights (DP x CP; a number or a column of
        layouts): all of them, or the hybrid-sharding group."""
        return weights if self.zero_shard is None else self.zero_shard

    def attention(self, inputs: PlanInputs) -> PlanInputs:
        """The attention one TP rank runs: h/t query heads and n_kv/t KV heads (at least one, replicated)."""
        if self.tp == 1:  # TP divides the heads: the layout is checked first (Parallelism.check)
            return inputs
        return inputs.model_copy(
            update={"heads": inputs.heads // self.tp, "kv_heads": max(inputs.kv_heads // self.tp, 1)}
        )


def layer_kernel() -> Any:
    """--attention-kernel where no framework stands behind the layer (one layer's plan, serving): flash unless
    named, with the training flag's help, range and check."""
    extra = TrainingSetup.model_fields["attention_kernel"].json_schema_extra
    own = {k: v for k, v in extra.items() if k != "fitted"} if isinstance(extra, dict) else extra
    return declared_as(
        TrainingSetup, "attention_kernel", default="flash", annotation=str, json_schema_extra=own
    )


class LayerKernel(BaseModel):
    """Which attention kernel's tables one layer's calls read: the single-layer plan's, declared as a training
    job's (:class:`TrainingSetup`); :func:`reading_kernel` refuses ``unfused``, the step's alone."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    attention_kernel: str = layer_kernel()


M = TypeVar("M", bound=BaseModel)


def flag_name(model: type[BaseModel], field: str) -> str:
    """The flag of a field: ``kv_heads`` -> ``--kv-heads``; ``pass_`` -> ``--pass``."""
    info = model.model_fields.get(field)
    name = info.alias if info is not None and info.alias else field
    return "--" + name.replace("_", "-")


def build(declaration: type[M], /, **values: Any) -> M:
    """Validate ``values`` into ``model``; the first problem becomes one :class:`InputError` naming its flag."""
    try:
        return declaration.model_validate(values)
    except ValidationError as exc:
        field, message = problems(exc)[0]
        raise InputError(flag_name(declaration, field) if field else "input", message) from None


def problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Every error of ``exc`` as (field, message): a check's InputError keeps its field, pydantic's own are
    put in our words. Unknown keys are named as unknown."""
    out = []
    for error in exc.errors():
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, InputError):  # a check names a field or its flag: the field, as pydantic would
            out.append((cause.field.lstrip("-").replace("-", "_"), cause.message))
            continue
        loc = ".".join(str(part) for part in error["loc"])
        out.append((loc, "unknown field" if error["type"] == "extra_forbidden" else _message(error)))
    return out


def shape_from_model(values: dict[str, Any]) -> dict[str, Any]:
    """Fill the fields a model preset sets (``from_model``) that were not given: from ``values["model"]``
    when one is named, else from the declared defaults. Returns a new dict."""

    filled = dict(values)
    preset = load_model(values["model"]) if values.get("model") else None
    for name, info in PlanInputs.model_fields.items():
        if (info.json_schema_extra or {}).get("from_model") and filled.get(name) is None:
            filled[name] = getattr(preset, name) if preset else info.default
    return filled


_MESSAGES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "string_too_long": "is longer than {max_length} characters",
}


def _message(error: dict[str, Any]) -> str:
    """pydantic's message in our words, with the value that was given."""
    template = _MESSAGES.get(error["type"])
    text = template.format(**error.get("ctx", {})) if template else error["msg"].removeprefix("Value error, ")
    text = pattern_in_words(error) or text
    got = error.get("input")
    if error["type"] == "missing" or isinstance(got, dict | list):
        return text
    shown = repr(got) if not isinstance(got, str) else repr(got[:60] + ("..." if len(got) > 60 else ""))
    return f"{text} (got {shown})"
