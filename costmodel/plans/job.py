"""A training job, declared, made and checked once.

A plan is model x hardware x framework x layout. Its inputs are declared as flags in a few groups: the
workload (:class:`~costmodel.plans.inputs.Workload`), the job's layout and memory knobs
(:class:`~costmodel.plans.inputs.TrainingSetup`), the step's own knobs (:class:`StepSetup`), the machine's
changes (:class:`~costmodel.plans.inputs.MachineOverrides`) and the framework with the knobs a job changes in
it (:class:`FrameworkKnobs`). :func:`make_job` turns them, from flags, a plan file, a runs-table row or a
search candidate, into one :class:`Job`: the model and the machine loaded, the framework's profile with the
job's changes, every default the framework sets filled in, the layout checked once
(:meth:`~costmodel.plans.inputs.Parallelism.check`) and what it implies (DP, micro-batches, the pipeline's
split, the USP split, the groups) computed once on it. Every training command takes a Job; nothing past
:func:`make_job` re-derives or re-checks it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from costmodel.core.errors import InputError
from costmodel.core.fields import NonNegative
from costmodel.frameworks.profiles import (
    DEFAULT,
    STATE_BYTES,
    CrossEntropy,
    Elementwise,
    Fp8Scaling,
    FrameworkProfile,
    Gqa,
    Loss,
    MasterDtype,
    OptimizerKernel,
    Reshard,
    SelectiveRecompute,
    StateDtype,
    TpInputs,
    load_framework,
)
from costmodel.machines.binding import LinkBinding, Machine
from costmodel.machines.kernels import check_kernel
from costmodel.machines.profiles import HardwareProfile, load_profile
from costmodel.machines.topology import NCCL_RING, strides
from costmodel.plans import cp as registry
from costmodel.plans.cp import TRAINING, usp
from costmodel.plans.inputs import (
    Count,
    Flag,
    MachineOverrides,
    Number,
    Overlaps,
    Parallelism,
    PlanInputs,
    TrainingSetup,
    Workload,
    build,
    declared_as,
    flag,
    job_machine,
)
from costmodel.plans.models import ModelPreset, load_model
from costmodel.plans.stages import StageSplit
from costmodel.schedule.layouts import ulysses_feasibility

Scheme = Literal[registry.names(TRAINING)]  # the registry's training schemes, as a flag's choices
CAPACITY_FACTOR = 1.25  # [Switch §2.2]: the most loaded expert computes 1.25x the mean tokens
FRAMEWORK_DEFAULT = "[default: the framework's]"


class StepSetup(BaseModel):
    """The step's own knobs beyond the workload and the layout. A knob the framework sets (the CP scheme, the
    overlaps, the gradient buckets, the optimizer's traffic) is None until the job fills it from the
    framework's profile (:func:`make_job`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    vpp: Count = declared_as(Parallelism, "vpp")
    micro_batch: Count = declared_as(Parallelism, "micro_batch")
    global_batch: Count | None = declared_as(Parallelism, "global_batch")
    cp_scheme: Scheme | None = flag(
        None, f"How CP exchanges K and V: {registry.choices(TRAINING)} {FRAMEWORK_DEFAULT}."
    )
    ulysses_degree: Count | None = flag(
        None,
        "USP's all-to-all degree (--cp-scheme usp): the CP ranks exchange heads in groups of this many and run a "
        "ring of --cp / it across the groups; it must divide --cp and split the query heads a TP rank holds "
        "(default: the largest that also divides its KV heads).",
        ge=1,
        le=1 << 20,
    )
    tp_comm_overlap: Flag | None = declared_as(Overlaps, "tp_comm_overlap")
    cp_overlap: Number = declared_as(Overlaps, "cp_overlap")
    dp_overlap: Number | None = flag(
        None,
        "Share of the gradient reduction overlapped with the backward, in [0, 1]: 1 bucketed (PyTorch DDP, "
        f"FSDP, Megatron's --overlap-grad-reduce), 0 reduced after it {FRAMEWORK_DEFAULT}.",
        ge=0,
        le=1,
    )
    gemm_dtype: Literal["fp8", "mxfp8"] | None = flag(
        None,
        "Precision of the linear layers' multiplies when it differs from --dtype: fp8 (Transformer Engine, "
        "torchao Float8) or mxfp8 (block-scaled, Blackwell); attention and the output layer stay at --dtype.",
    )
    fp8_scaling: Fp8Scaling | None = flag(
        None,
        "How --gemm-dtype fp8 casts take their scales: delayed (amax from past steps, taken in the cast: "
        "Transformer Engine) or current (an amax pass over each tensor first: torchao's tensorwise recipe) "
        f"{FRAMEWORK_DEFAULT}.",
    )
    pp_overlap: Number = declared_as(Overlaps, "pp_overlap")
    bucket_bytes: Number | None = flag(
        None, f"Gradient bucket size {FRAMEWORK_DEFAULT}.", unit="bytes", ge=1, le=2**40
    )
    optimizer_bytes: Number | None = flag(
        None,
        f"HBM bytes the optimizer step moves per parameter (Adam with fp32 master weights: 30) {FRAMEWORK_DEFAULT}.",
        unit="bytes",
        gt=0,
        le=1024,
    )
    grad_bytes: Count | None = flag(
        None,
        f"Bytes per gradient element the DP group reduces (fp32: 4) {FRAMEWORK_DEFAULT}.",
        unit="bytes",
        ge=1,
        le=8,
    )
    ring_merge_bytes: Number | None = flag(
        None,
        "HBM bytes a ring step's merge moves per element of the partial output: 12 fused (two fp32 partials "
        f"read, one written), 38 as torch's eager ops (torchtitan's context_parallel) {FRAMEWORK_DEFAULT}.",
        unit="bytes",
        gt=0,
        le=1024,
    )
    elementwise: Elementwise | None = flag(
        None,
        "How a layer's norms, rotary embedding and MLP activation run: fused (one kernel each: Transformer "
        "Engine, Liger, torch.compile) or eager (torch ops one by one with fp32 upcasts, about 3x the HBM "
        "traffic, and in a dense layer without recompute 8H + 2F bytes a token more kept for the backward) "
        f"{FRAMEWORK_DEFAULT}.",
    )
    gqa: Gqa | None = flag(
        None,
        "How attention reads GQA's shared K, V heads: native (the kernel reads the KV heads as they are) or repeat "
        "(the model code expands K and V to the query heads first, as torchtitan before 2026 and transformers' "
        f"eager attention do: CP moves h/n_kv times the K and V) {FRAMEWORK_DEFAULT}.",
    )
    ep: Count = declared_as(Parallelism, "ep")
    capacity_factor: Number = flag(
        CAPACITY_FACTOR,
        "MoE capacity factor: the most loaded expert rank computes this x the mean tokens (Switch: 1.25).",
        ge=1,
        le=16,
    )

    def resolved(self, framework: FrameworkProfile) -> StepSetup:
        """Every knob the job left to its framework, from the framework's profile."""
        t = framework.time
        defaults = {
            "cp_scheme": t.cp_scheme,
            "tp_comm_overlap": t.tp_comm_overlap,
            "dp_overlap": t.dp_overlap,
            "bucket_bytes": t.bucket_bytes,
            "optimizer_bytes": t.optimizer_bytes,
            "grad_bytes": t.grad_reduce_bytes,
            "ring_merge_bytes": t.ring_merge_bytes,
            "elementwise": t.elementwise,
            "gqa": t.gqa,
            "fp8_scaling": t.fp8_scaling,
        }
        return self.model_copy(update={k: v for k, v in defaults.items() if getattr(self, k) is None})


class FrameworkKnobs(BaseModel):
    """The framework a job runs on, and the knobs of its profile a job changes."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    framework: str = flag(
        DEFAULT,
        "Training framework: a built-in profile (megatron, megatron-deepspeed, torchtitan, deepspeed, "
        "hf-trainer, internevo; each described in docs/frameworks.md) or a YAML path. It sets what a device "
        "keeps and the step's defaults.",
        max_length=4096,
    )
    loss: Loss | None = flag(
        None,
        "How the loss holds the logits: materialized (whole, upcast to fp32), chunked, or fused (a fused "
        f"linear cross-entropy keeps none) {FRAMEWORK_DEFAULT}.",
    )
    master_weights: MasterDtype | None = flag(
        None, f"The fp32 copy of the weights the optimizer steps, or none {FRAMEWORK_DEFAULT}."
    )
    grad_dtype: StateDtype | None = flag(None, f"Element type of the gradients kept {FRAMEWORK_DEFAULT}.")
    optimizer_dtype: StateDtype | None = flag(
        None, f"Element type of Adam's two moments {FRAMEWORK_DEFAULT}."
    )
    optimizer_kernel: OptimizerKernel | None = flag(
        None,
        "AdamW's implementation: fused (nothing beside its states) or foreach (torch's multi-tensor AdamW: a "
        f"temporary the size of the moments at the step) {FRAMEWORK_DEFAULT}.",
    )
    weights_dtype: StateDtype | None = flag(
        None,
        f"Element type of the stored weights, kept between steps (FSDP2's are fp32) {FRAMEWORK_DEFAULT}.",
    )
    compute_dtype: StateDtype | None = flag(
        None,
        "Element type of the weights the forward and backward read, gathered or cast per layer where it is "
        f"not the stored one {FRAMEWORK_DEFAULT}.",
    )
    gradients_persist: Flag | None = flag(
        None,
        "Gradients stay allocated from step to step (a main-gradient buffer), or each backward makes them and "
        f"the step frees them (--no-gradients-persist) {FRAMEWORK_DEFAULT}.",
    )
    cross_entropy: CrossEntropy | None = flag(
        None,
        "The cross-entropy over materialised logits: torch (F.cross_entropy over logits.float(), 12 bytes a "
        "logit), megatron (vocab-parallel, in place on one fp32 copy, 6) or flash (flash-attn's Triton kernel, "
        f"the gradient written into the bf16 logits, 2) {FRAMEWORK_DEFAULT}.",
    )
    loss_chunk_tokens: Count | None = flag(
        None, f"Tokens per chunk of a chunked or fused loss {FRAMEWORK_DEFAULT}.", ge=1, le=2**30
    )
    selective_recompute: SelectiveRecompute | None = flag(
        None,
        "What --recompute selective recomputes: attention (the core attention) or ops (op-level: matmul "
        f"outputs kept) {FRAMEWORK_DEFAULT}.",
    )
    tp_inputs: TpInputs | None = flag(
        None,
        "What a column-parallel linear keeps for its backward under sequence parallel: sharded (the sequence "
        "shard, gathered again: Megatron-Core) or gathered (the all-gathered input: torch's DTensor TP) "
        f"{FRAMEWORK_DEFAULT}.",
    )
    fsdp_prefetch: Count | None = flag(
        None, f"Layers ZeRO-3/FSDP gathers ahead of the one computing {FRAMEWORK_DEFAULT}.", ge=0, le=64
    )
    reshard_after_forward: Reshard | None = flag(
        None,
        "When ZeRO-3/FSDP frees a layer's gathered weights: always (after its forward), never (kept for the "
        f"step) or unless-pp {FRAMEWORK_DEFAULT}.",
    )
    runtime_bytes: NonNegative | None = flag(
        None,
        f"Device memory beyond the allocator's: CUDA context, NCCL's buffers, workspaces {FRAMEWORK_DEFAULT}.",
        unit="bytes",
        ge=0,
        le=2**50,
    )
    allocator_reserve: NonNegative | None = flag(
        None,
        "What the caching allocator reserves beyond the tensors, as a share of what comes and goes within a "
        f"step {FRAMEWORK_DEFAULT}.",
        ge=0,
        le=10,
    )

    def profile(
        self, loaded: FrameworkProfile | None = None, grad_bytes: int | None = None
    ) -> FrameworkProfile:
        """The framework's profile (``loaded``, or read from ``framework``) with the job's changes;
        ``grad_bytes``: the reduction the job's step states, where the framework keeps its gradients as it
        reduces them."""
        base = loaded or load_framework(self.framework)
        given = {
            key: getattr(self, name) for name, key in MEMORY_KNOBS.items() if getattr(self, name) is not None
        }
        time = {}
        if base.memory.gradients_reduced_as_kept and (grad_bytes or self.grad_dtype):
            dtype = _kept_as_reduced(base, self.grad_dtype, grad_bytes)
            given["gradients"], time["grad_reduce_bytes"] = dtype, STATE_BYTES[dtype]
        return base.with_changes(memory=given, time=time) if given else base


def _kept_as_reduced(framework: FrameworkProfile, grad_dtype: str | None, grad_bytes: int | None) -> str:
    """The one dtype a framework that keeps its gradients as it reduces them uses, from a job stating either
    (``--grad-dtype``, ``--grad-bytes``); one line where the two disagree or the bytes name no dtype."""
    if grad_bytes is None:
        return grad_dtype  # type: ignore[return-value]
    dtype = next((name for name in ("fp32", "bf16") if STATE_BYTES[name] == grad_bytes), None)
    if dtype is None:
        raise InputError(
            "--grad-bytes",
            f"{grad_bytes}: {framework.title} keeps its gradients in the dtype it reduces them; accepted: 4 "
            "(fp32) or 2 (bf16)",
        )
    if grad_dtype is not None and grad_dtype != dtype:
        raise InputError(
            "--grad-dtype",
            f"{grad_dtype} with --grad-bytes {grad_bytes}: {framework.title} reduces its gradients in the dtype "
            "it keeps them (grad_reduce_in_fp32), so the two are one setting; state one",
        )
    return dtype


# Each knob's field in a profile's memory policy (frameworks/*.yaml).
MEMORY_KNOBS = {
    "loss": "loss",
    "master_weights": "master_weights",
    "grad_dtype": "gradients",
    "optimizer_dtype": "optimizer_states",
    "optimizer_kernel": "optimizer_kernel",
    "weights_dtype": "weights",
    "compute_dtype": "compute_weights",
    "gradients_persist": "gradients_persist",
    "cross_entropy": "cross_entropy",
    "loss_chunk_tokens": "loss_chunk_tokens",
    "selective_recompute": "selective_recompute",
    "tp_inputs": "tp_inputs",
    "fsdp_prefetch": "fsdp_prefetch_layers",
    "reshard_after_forward": "reshard_after_forward",
    "runtime_bytes": "overhead_bytes",
    "allocator_reserve": "fragmentation",
}


# The declarations a training job is made from, in the order their flags are listed; every field name is
# unique across them, so a flat mapping of flags (a plan file, a runs-table row) splits without a table.
DECLARATIONS: tuple[type[BaseModel], ...] = (
    Workload,
    TrainingSetup,
    StepSetup,
    MachineOverrides,
    FrameworkKnobs,
)
# What a training job defaults to, where one attention layer defaults to the forward of a full mask.
JOB_DEFAULTS: dict[str, Any] = {"layout": "zigzag", "cp": 1}


@dataclass(frozen=True)
class Job:
    """One training job: what was asked, validated once, with what it implies.

    ``inputs`` is the job's attention at the model's shape (causal, fwd+bwd, micro-batch sequences), what
    every formula binder reads for the sequence, the CP degree, the layout and the masks."""

    inputs: PlanInputs
    setup: TrainingSetup
    step: StepSetup  # resolved: no knob left None
    overrides: MachineOverrides
    knobs: FrameworkKnobs
    model: ModelPreset
    framework: FrameworkProfile
    machine: Machine
    dp: int
    micro_batches: int | None  # None when the job states no global batch (the CP window of `recommend`)
    stages: StageSplit
    _parts: dict[str, BaseModel] = field(repr=False, compare=False, default_factory=dict)
    # The profile as loaded, before the command line's changes: a job made again (replace, training) applies
    # them to it once, where reusing the machine's would apply them twice (--clock-scale compounds).
    _profile: HardwareProfile | None = field(repr=False, compare=False, default=None)
    # (stride, size, collective) -> link on this machine, shared by the candidates of one search: a link
    # depends on nothing else, and placing a group is most of binding a candidate
    _links: dict[tuple[int, int, str], LinkBinding] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        _profile: HardwareProfile | None = None,
        _model: ModelPreset | None = None,
        _framework: FrameworkProfile | None = None,
        **values: Any,
    ) -> Job:
        """A Job from flat keyword values named as the flags (``model``, ``seq``, ``hw``, ``gpus``, ``tp``,
        ``cp``, ``pp``, ``vpp``, ``micro_batch``, ``global_batch``, ``recompute``, ``cp_scheme``,
        ``framework``, ...), with a training job's defaults, each declaration validated once: for notebooks,
        tests, plan files and runs tables. ``_profile``, ``_model`` and ``_framework``, already loaded, stand in
        for reading them."""
        return from_flags(_profile=_profile, _model=_model, _framework=_framework, **values)

    @property
    def gpus(self) -> int:
        return self.setup.gpus

    @property
    def tp(self) -> int:
        return self.setup.tp

    @property
    def cp(self) -> int:
        return self.inputs.cp

    @property
    def pp(self) -> int:
        return self.setup.pp

    @property
    def device_memory_bytes(self) -> float:
        """What a device offers the step: what a process can allocate, less the headroom."""
        return self.machine.profile.device.usable_bytes * (1 - self.setup.memory_headroom)

    @functools.cached_property
    def usp_split(self) -> tuple[int, int]:
        """USP: the all-to-all degree (``--ulysses-degree``, else the largest dividing the CP degree and the TP
        rank's KV heads) and the ring's."""
        n_u = self.step.ulysses_degree or usp.split(max(self.model.kv_heads // self.tp, 1), self.cp)
        return n_u, self.cp // n_u

    @functools.cached_property
    def groups(self) -> tuple[str, dict[str, int]]:
        """The rank order and every group's size; an MoE model's EP is split out of DP, inside it next to
        CP unless the rank order places it."""
        order, sizes = self.setup.rank_order, {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        if self.step.ep == 1:
            return order, sizes
        dims = order.split("-")
        if "ep" not in dims:
            dims.insert(dims.index("dp"), "ep")
        return "-".join(dims), {**sizes, "ep": self.step.ep, "dp": self.dp // self.step.ep}

    @property
    def collectives(self) -> dict[str, Any]:
        """The collective each group waits on: CP its scheme's (all-to-all for Ulysses, all-gather for Llama 3's
        scheme, else ring sends), EP's all-to-all; "ring" is NCCL's ring algorithm."""
        return {
            "tp": NCCL_RING,
            "cp": registry.get(self.step.cp_scheme).collective,
            "ep": "alltoall",
            "dp": NCCL_RING,
        }

    @functools.cached_property
    def links(self) -> dict[str, Any]:
        """The link of every group, its members placed by the rank order (:meth:`Machine.group_links`); "dp"
        is the group ZeRO shards over and gradients reduce-scatter over, of the ranks holding the same weights:
        DP x CP (EP too, which an MoE model's dense gradients reduce over), from the innermost of their strides,
        or its hybrid-sharding group; "dpr" links the hybrid groups' replicas."""
        order, sizes = self.groups
        placed, collectives = strides(order, sizes), self.collectives
        links = {
            dim: self._link(placed[dim], size, collectives.get(dim, "p2p"))
            for dim, size in sizes.items()
            if dim in placed
        }
        # ZeRO's group: the first zero_group of the DP x CP ranks; hybrid sharding's replicas: one rank of
        # each such group, zero_group times as far apart
        inner, group = min(placed[dim] for dim in ("cp", "ep", "dp") if dim in placed), self.zero_group
        links["dp"] = self._link(inner, group, NCCL_RING)
        links["dpr"] = self._link(inner * group, self.zero_replicas, NCCL_RING)
        return links

    @property
    def zero_group(self) -> int:
        """Ranks ZeRO shards over: DP x CP, or the hybrid-sharding group (``--zero-shard``)."""
        return self.setup.zero_group(self.dp * self.cp)

    @property
    def zero_replicas(self) -> int:
        """Copies of ZeRO's shards: the hybrid-sharding groups DP x CP holds (1 unless sharding is hybrid)."""
        return self.dp * self.cp // self.zero_group

    @property
    def zero_placement(self) -> dict[str, Any]:
        """Where the ranks holding the same weights reduce their gradients, as the step reports it: ZeRO's
        group (all of DP x CP, or hybrid sharding's) and the replicas across such groups, each with its link."""
        group, replicas = self.links["dp"], self.links["dpr"]
        return {
            "size": self.zero_group,
            "scope": group.scope,
            "bandwidth": group.bandwidth,
            "replicas": self.zero_replicas,
            "replica_scope": replicas.scope,
            "replica_bandwidth": replicas.bandwidth,
        }

    def _link(self, stride: int, size: int, collective: str) -> LinkBinding:
        key = (stride, size, collective)
        if key not in self._links:
            self._links[key] = self.machine.placed(stride).link(size, collective)  # type: ignore[arg-type]
        return self._links[key]

    def replace(self, **changes: Any) -> Job:
        """The job with some inputs changed, named as their flags, made and checked again (a search's
        candidate, a what-if); the loaded model, hardware profile and framework are reused where unchanged."""
        parts = dict(self._parts)
        for name, value in changes.items():
            key = next((k for k, part in parts.items() if name in type(part).model_fields), None)
            if key is None:
                raise TypeError(f"Job has no input {name}")
            part = parts[key]
            parts[key] = build(type(part), **_fields(part) | {name: value})
        return make_job(
            *parts.values(),
            profile=self._profile if "hw" not in changes else None,
            model=self.model if "model" not in changes else None,
            framework=None
            if any(name in FrameworkKnobs.model_fields for name in changes)
            else self.framework,
        )

    def training(self) -> Job:
        """This job's workload as a training job: a single layer's batch, tile, mask and pass (``recommend``
        states them for its CP window) give way to the training step's own."""
        workload = self._parts["workload"]
        if not isinstance(workload, PlanInputs):
            return self
        parts = dict(self._parts)
        parts["workload"] = build(Workload, **{k: getattr(workload, k) for k in Workload.model_fields})
        return make_job(*parts.values(), profile=self._profile, model=self.model, framework=self.framework)

    def candidate(self, **changes: Any) -> Job:
        """The job at another layout of the same workload and machine, for a search whose enumeration has
        already checked that every degree divides what it must: the declarations are copied, not validated
        again (a packed workload's documents are not packed again), and the derived quantities recomputed."""
        parts = dict(self._parts)
        for key, part in parts.items():
            mine = {k: v for k, v in changes.items() if k in _names(type(part))}
            if mine:
                parts[key] = part.model_copy(update=mine)
        unknown = set(changes).difference(*(_names(type(part)) for part in parts.values()))
        if unknown:
            raise TypeError(f"Job has no input {', '.join(sorted(unknown))}")
        setup, declared = _framework_defaults(parts["setup"], self.framework), parts["step"]
        step = declared.resolved(self.framework)
        attention = {k: changes[k] for k in ("cp", "layout") if k in changes}
        if "micro_batch" in changes and not isinstance(parts["workload"], PlanInputs):
            attention["batch"] = changes["micro_batch"]
        inputs = self.inputs.model_copy(update=attention)
        derived = Parallelism.of(inputs, setup, step).check(self.model, setup.gpus)
        return Job(
            inputs=inputs,
            setup=setup,
            step=step,
            overrides=self.overrides,
            knobs=self.knobs,
            model=self.model,
            framework=self.framework,
            machine=self.machine,
            dp=derived.dp,
            micro_batches=derived.micro_batches,
            stages=derived.stages,
            _parts=parts,
            _profile=self._profile,
            _links=self._links,
        )

    def on(self, machine: Machine) -> Job:
        """The same job on another machine binding (a what-if's slower link), whose profile holds the command
        line's changes already: made again, the job starts from it and changes nothing more."""
        unchanged = MachineOverrides()
        return dataclasses.replace(
            self,
            machine=machine,
            overrides=unchanged,
            _parts={**self._parts, "overrides": unchanged},
            _profile=machine.profile,
            _links={},
        )


@functools.cache
def _names(declaration: type[BaseModel]) -> frozenset[str]:
    """A declaration's field names: a read of pydantic's ``model_fields`` costs some 1.6 µs, and a search's
    candidates read it tens of thousands of times."""
    return frozenset(declaration.model_fields)


def _fields(part: BaseModel) -> dict[str, Any]:
    """A declaration's fields as given (no computed ones), to build it again with a change."""
    return {name: getattr(part, name) for name in type(part).model_fields}


def _framework_defaults(setup: TrainingSetup, framework: FrameworkProfile) -> TrainingSetup:
    """The setup with what it leaves to the framework filled in: its attention kernel and its ZeRO stage (its
    data parallelism: Megatron-Core's distributed optimizer, FSDP2's full sharding)."""
    given = {"attention_kernel": framework.time.attention_kernel, "zero": framework.memory.zero}
    missing = {name: value for name, value in given.items() if getattr(setup, name) is None}
    return setup.model_copy(update=missing) if missing else setup


def make_job(
    workload: Workload,
    setup: TrainingSetup,
    step: StepSetup | None = None,
    overrides: MachineOverrides | None = None,
    knobs: FrameworkKnobs | None = None,
    *,
    profile: HardwareProfile | None = None,
    model: ModelPreset | None = None,
    framework: FrameworkProfile | None = None,
) -> Job:
    """The one place a training job is made and checked: the model preset (``model``, already loaded, or
    ``workload.model``), the machine (``profile``, already loaded, or ``workload.hw``) placed by the job's
    layout, the framework's profile (``framework``, or the one ``knobs`` names, with its changes), the step's
    knobs resolved against it, and the layout's one check. One line naming the flag for the first problem."""
    if model is None:
        if workload.model is None:
            raise InputError(
                "--model",
                "a training job needs a model preset (its layers, hidden and vocabulary sizes); e.g. --model "
                "llama3-8b",
            )
        model = load_model(workload.model)
    knobs = knobs or FrameworkKnobs()
    declared, declared_setup = step or StepSetup(), setup
    loaded = framework if framework is not None and not _knobs_changed(knobs) else None
    framework = knobs.profile(loaded, declared.grad_bytes)
    _check_schemes(framework)
    step = declared.resolved(framework)
    sharded = workload  # a whole-sequence scheme has no layout of its own: its ranks hold the framework's
    if registry.get(step.cp_scheme).whole_sequence:
        sharded = workload.model_copy(update={"layout": framework.time.sharding(workload.layout)})
    setup = _framework_defaults(setup, framework)
    inputs = _attention(sharded, model, step)
    overrides = overrides or MachineOverrides()
    profile = profile if profile is not None else load_profile(inputs.hw)
    machine = job_machine(inputs, overrides, profile)
    derived = Parallelism.of(inputs, setup, step).check(model, setup.gpus)
    # What was declared, in make_job's order: Job.replace changes one and makes the job again (the step as
    # declared, so that a changed framework fills its defaults anew).
    parts = {
        "workload": workload,
        "setup": declared_setup,
        "step": declared,
        "overrides": overrides,
        "knobs": knobs,
    }
    job = Job(
        inputs=inputs,
        setup=setup,
        step=step,
        overrides=overrides,
        knobs=knobs,
        model=model,
        framework=framework,
        machine=machine,
        dp=derived.dp,
        micro_batches=derived.micro_batches,
        stages=derived.stages,
        _parts=parts,
        _profile=profile,
    )
    _check_step(job)
    _check_sharding(job)
    _refuse_unused(job, declared)
    return job


def _check_sharding(job: Job) -> None:
    """Hybrid sharding shards ZeRO's states over groups of DP x CP ranks: a stage that shards, groups that
    tile DP x CP, a dense model (an MoE model's experts shard over their own groups, not modelled here)."""
    shard, weights = job.setup.zero_shard, job.dp * job.cp
    if shard is None:
        return
    if job.setup.zero == 0:
        raise InputError(
            "--zero-shard", "shards ZeRO's states; --zero 0 shards nothing: give --zero 1, 2 or 3"
        )
    if weights % shard:
        raise InputError(
            "--zero-shard", f"{shard} must divide the {weights} ranks holding the same weights (DP x CP)"
        )
    if job.model.experts:
        raise InputError(
            "--zero-shard", f"hybrid sharding of an MoE model ({job.model.name}) is not modelled"
        )


def _check_schemes(framework: FrameworkProfile) -> None:
    """A framework's CP schemes are the registry's (a misspelt one would price no job, silently)."""
    known = registry.names(TRAINING)
    unknown = [name for name in (*framework.time.cp_schemes, framework.time.cp_scheme) if name not in known]
    if unknown:
        raise InputError(
            "--framework",
            f"{framework.title}'s time.cp_schemes or cp_scheme names {', '.join(map(repr, unknown))}; accepted: "
            f"{', '.join(known)}",
        )


def _knobs_changed(knobs: FrameworkKnobs) -> bool:
    """Whether ``knobs`` change the named profile (an already loaded one is then not the job's)."""
    return any(
        getattr(knobs, name) is not None for name in FrameworkKnobs.model_fields if name != "framework"
    )


def _attention(workload: Workload, model: ModelPreset, step: StepSetup) -> PlanInputs:
    """The job's attention at the model's shape: causal, forward and backward, a micro-batch of sequences.
    A single layer's inputs (``recommend`` states them) keep their own mask, pass and tile."""
    if isinstance(workload, PlanInputs):
        return workload
    return build(
        PlanInputs,
        **workload.model_dump(exclude={"bytes_per_element"}),
        batch=step.micro_batch,
        heads=model.heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        block=1,
        causal=True,
        pass_="fwd+bwd",
    )


def _check_step(job: Job) -> None:
    """What the layout's check does not know: the attention kernel against the profile's tables, the linear
    layers' precision against the device, the CP scheme against the heads and the framework."""
    inputs, setup, step, model, machine, framework = (
        job.inputs,
        job.setup,
        job.step,
        job.model,
        job.machine,
        job.framework,
    )
    try:
        check_kernel(setup.attention_kernel, machine.profile, also=("unfused",))
    except InputError as exc:
        if job._parts["setup"].attention_kernel is not None:
            raise
        raise InputError("--framework", f"{framework.title}'s time.attention_kernel {exc.message}") from None
    if step.gemm_dtype is not None:
        device = machine.profile.device
        if "fp8" not in device.peak_flops:
            raise InputError("--gemm-dtype", f"{machine.profile.origin} states no fp8 FLOP/s")
        if step.gemm_dtype == "mxfp8" and device.generation != "Blackwell":
            raise InputError(
                "--gemm-dtype", f"mxfp8 runs on Blackwell tensor cores; {device.name} is {device.generation}"
            )
    if step.tp_comm_overlap and setup.tp > 1 and not machine.inside(*job.groups, "tp"):
        raise InputError(
            "--tp-comm-overlap",
            f"pipelines TP's collectives over the fast domain's links (Transformer Engine's userbuffers, "
            f"torch's AsyncTP); TP {setup.tp} leaves a domain of {machine.profile.ranks_per_node} here: keep TP "
            "within one, or leave the overlap off",
        )
    if setup.attention_kernel == "unfused" and inputs.cp > 1:
        whose = "" if job._parts["setup"].attention_kernel else f" ({framework.title}'s default)"
        raise InputError(
            "--attention-kernel", f"unfused attention{whose} has no (O, LSE) to merge: CP needs flash"
        )
    if inputs.cp == 1:
        return
    framework.refuse_cp(str(inputs.cp))
    if step.cp_scheme not in framework.time.cp_schemes:
        raise InputError(
            "--cp-scheme",
            f"{step.cp_scheme}: {framework.title} runs {', '.join(framework.time.cp_schemes)}",
        )
    kv_heads = max(model.kv_heads // setup.tp, 1)
    reason = registry.get(step.cp_scheme).check(model.heads // setup.tp, kv_heads, inputs.cp, False)
    if reason:
        raise InputError("--cp-scheme", reason)
    if step.ulysses_degree is not None:
        _check_ulysses_degree(
            step.ulysses_degree, step.cp_scheme, model.heads // setup.tp, kv_heads, inputs.cp
        )


def _refuse_unused(job: Job, declared: StepSetup) -> None:
    """A knob given that nothing in this job reads is refused, naming what it needs, not echoed back as if
    it had changed the answer (the profile's own defaults are not given, and stay); ``declared``: the step's
    knobs as given, before the framework's defaults filled them."""
    setup, knobs, model, memory = job.setup, job.knobs, job.model, job.framework.memory
    gathered = (
        setup.zero == 3 or memory.compute_weights != memory.weights
    )  # u_w: layers gathered or cast whole
    unused = {
        "--fp8-scaling": (
            declared.fp8_scaling is not None and declared.gemm_dtype != "fp8",
            "sets how --gemm-dtype fp8 scales its casts; this job's multiplies are not fp8",
        ),
        "--loss-chunk-tokens": (
            knobs.loss_chunk_tokens is not None and memory.loss == "materialized",
            "a materialized loss holds its logits whole; chunks need --loss chunked or fused",
        ),
        "--fsdp-prefetch": (
            knobs.fsdp_prefetch is not None and not gathered,
            "the layers ZeRO-3/FSDP gathers ahead; this job keeps its weights whole (--zero 3 gathers them)",
        ),
        "--reshard-after-forward": (
            knobs.reshard_after_forward is not None and not gathered,
            "when ZeRO-3/FSDP frees a gathered layer; this job keeps its weights whole (--zero 3 gathers them)",
        ),
        "--capacity-factor": (
            declared.capacity_factor != CAPACITY_FACTOR and not model.experts,
            f"sets how loaded an MoE expert rank is; {model.name} has no experts",
        ),
    }
    for name, (given, why) in unused.items():
        if given:
            raise InputError(name, why)


def refuse_unread_recompute(setup: TrainingSetup, knobs: FrameworkKnobs) -> None:
    """--selective-recompute where the job's recompute is fixed to another level (a step, a plan file) reads
    nothing: refused. A search, which tries every level with the same knobs, does not call this."""
    if knobs.selective_recompute is not None and setup.recompute != "selective":
        raise InputError(
            "--selective-recompute",
            f"sets what --recompute selective recomputes; this job recomputes {setup.recompute}",
        )


def _check_ulysses_degree(degree: int, scheme: str, heads: int, kv_heads: int, cp: int) -> None:
    """USP's all-to-all degree: a divisor of the CP degree whose groups split the heads [USP §3]."""
    if scheme != usp.NAME:
        raise InputError(
            "--ulysses-degree", f"sets USP's all-to-all degree: it needs --cp-scheme usp, not {scheme}"
        )
    if cp % degree:
        raise InputError("--ulysses-degree", f"{degree} does not divide --cp {cp}")
    feasible, reason = ulysses_feasibility(heads, kv_heads, degree)
    if not feasible:
        raise InputError("--ulysses-degree", reason)


def split_flags(values: dict[str, Any], declarations: tuple[type[BaseModel], ...] = DECLARATIONS) -> dict:
    """Flat values named as flags (``cp`` or its former name ``n``), split by the declaration that owns each;
    a name none declares is one error naming it."""
    given = dict(values)
    if "n" in given:  # the CP degree's former name
        given["cp"] = given.pop("n")
    parts: dict[type[BaseModel], dict[str, Any]] = {model: {} for model in declarations}
    for name, value in given.items():
        owner = next((m for m in declarations if name in m.model_fields), None)
        if owner is None:
            raise InputError(name, "not an input of a training job")
        parts[owner][name] = value
    return parts


def from_flags(
    *,
    _profile: HardwareProfile | None = None,
    _model: ModelPreset | None = None,
    _framework: FrameworkProfile | None = None,
    **values: Any,
) -> Job:
    """:meth:`Job.of`."""
    parts = split_flags(values)
    workload = build(Workload, **JOB_DEFAULTS | parts[Workload])
    step = build(StepSetup, **parts[StepSetup])
    registry.refuse_fixed_layout(step.cp_scheme, parts[Workload].get("layout"))
    return make_job(
        workload,
        build(TrainingSetup, **parts[TrainingSetup]),
        step,
        build(MachineOverrides, **parts[MachineOverrides]),
        build(FrameworkKnobs, **parts[FrameworkKnobs]),
        profile=_profile,
        model=_model,
        framework=_framework,
    )
