"""Framework profiles (frameworks/*.yaml): what a training framework keeps in memory and how it runs a step.

A plan is model x hardware x framework x layout. The same layout holds different bytes and takes different
time in Megatron-Core, torchtitan, DeepSpeed or the Hugging Face Trainer: which copies of the weights,
gradients and optimizer states exist and in which dtype, whether the loss materialises fp32 logits, how
FSDP gathers ahead and when it frees, what "selective" recompute keeps, what the allocator reserves beyond
what tensors hold, and which CP scheme, overlaps and gradient buckets a job gets unless it says otherwise.
A profile states each with its source (code path and version, docs/references.md); every knob can be
overridden per job (:class:`~costmodel.plans.inputs.FrameworkKnobs`).
"""

from __future__ import annotations

import functools
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodel.core.errors import InputError, another_kind, describe_validation
from costmodel.core.fields import Count, NonNegative, Positive, Within
from costmodel.core.fileio import YamlDocument, load_builtin_or_file
from costmodel.core.resources import data_dir

StateDtype = Literal["fp32", "bf16"]
MasterDtype = Literal["fp32", "bf16", "none"]  # none: the optimizer steps the stored weights themselves
STATE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "none": 0}
Loss = Literal["materialized", "chunked", "fused"]
# Bytes per logit a cross-entropy holds at its peak, measured on fake tensors by the torch memory reference
# (costmodel/kernel/memory.py; tests/kernel/test_memory_reference.py holds both): torch's keeps the bf16
# logits, their fp32 upcast, its fp32 log-softmax and that one's gradient (12); Megatron-Core's subtracts,
# exponentiates and divides in place on the fp32 copy and makes its gradient in the softmax it kept, so the
# bf16 logits and one fp32 copy (6). flash-attn's Triton cross-entropy reads the bf16 logits, keeps a row's
# fp32 log-sum-exp and, with inplace_backward, writes the gradient into the logits themselves (2). A fused
# linear cross-entropy (Liger) computes a chunk's logits in bf16 and their gradient in place (2).
LOGIT_BYTES = {"torch": 12.0, "megatron": 6.0, "flash": 2.0, "fused": 2.0}
# HBM bytes a ring step's merge moves per element of the partial output (the step formula's k_merge). A fused
# merge reads the step's output and the running one in fp32 and writes one (12); Transformer Engine's fused
# correction reads the bf16 step output and updates the fp32 running one in place (10); torch's
# context_parallel merger, eager, casts the step output to fp32 and runs three elementwise ops, each through
# HBM: the cast (2 read, 4 written), out - block (8, 4), sigmoid(dlse) x that (4, 4), out - the product (8, 4):
# 38. ring-flash-attention's update_out_and_lse runs the same four ops.
FUSED_MERGE_BYTES = 12.0
EAGER_MERGE_BYTES = 6.0 + 12.0 + 8.0 + 12.0
Reshard = Literal["always", "never", "unless-pp"]
SelectiveRecompute = Literal["attention", "ops"]
TpInputs = Literal["sharded", "gathered"]
Fp8Inputs = Literal["fp8", "bf16"]
OptimizerKernel = Literal["fused", "foreach"]
CrossEntropy = Literal["torch", "megatron", "flash"]
Fp8Scaling = Literal["delayed", "current"]
# How a layer's norms, rotary embedding and MLP activation run: fused (one kernel each: Transformer Engine,
# Megatron's fused kernels, Liger, torch.compile) or eager (torch ops one by one, the bf16 input upcast to fp32
# and cast back; the step formula's x_eager counts what each op moves).
Elementwise = Literal["fused", "eager"]
# How attention reads GQA's shared K and V heads: native (the kernel takes n_kv heads) or repeat (the model code
# expands them to the query heads first: repeat_kv, the step formulas' x_rep).
Gqa = Literal["native", "repeat"]
# Where a framework's LoRA puts its adapters: beside every matrix (PEFT) or on its fused projections (Megatron
# Core's performant LoRA) [NeMo-LoRA].
LoraAdapters = Literal["per_matrix", "fused"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Source(_Strict):
    """One place a profile's facts were read: a repository or document, the version, the files."""

    url: str = Field(description="repository or documentation page")
    version: str = Field(description="release or commit the facts were read at", max_length=200)
    files: list[str] = Field(default_factory=list, description="code paths the knobs come from")
    notes: str | None = Field(default=None, description="what was read there, and any assumption")


class MemoryPolicy(_Strict):
    """What a device keeps, as the framework allocates it."""

    weights: StateDtype = Field(
        description="the stored parameters, kept between steps (FSDP2 stores fp32 shards and gathers bf16; "
        "Megatron stores bf16 and keeps an fp32 master copy in the optimizer)"
    )
    compute_weights: StateDtype = Field(
        "bf16", description="the copy the forward and backward read; gathered per layer when it is not stored"
    )
    master_weights: MasterDtype = Field(
        description="the fp32 copy the optimizer steps, beside the stored weights; none when it steps them"
    )
    gradients: StateDtype = Field(description="gradients kept for the optimizer (main_grad, reduce dtype)")
    gradients_reduced_as_kept: bool = Field(
        False,
        description="the kept gradients are in the dtype the data-parallel group reduces them, one setting: "
        "Megatron-Core's grad buffer is fp32 where grad_reduce_in_fp32, else the parameters' bf16; a job "
        "stating either (--grad-bytes, --grad-dtype) states both",
    )
    optimizer_states: StateDtype = Field(description="Adam's two moments")
    optimizer_kernel: OptimizerKernel = Field(
        "fused",
        description="AdamW's implementation: fused (one kernel over the states, nothing allocated beside them: "
        "torch's fused=True, Apex's and Transformer Engine's FusedAdam) or foreach (torch's multi-tensor "
        "AdamW, which makes the square root of the second moment as a temporary the size of the moments)",
    )
    gradients_persist: bool = Field(
        description="the gradients stay allocated from step to step (Megatron's main-gradient buffer), rather "
        "than freed by zero_grad and made as the backward reaches each layer (FSDP2, set_to_none)"
    )
    loss: Loss = Field(
        description="materialized: the output layer's logits whole, upcast to fp32 for the softmax; chunked: "
        "the same over chunks of loss_chunk_tokens; fused: no logits kept (a fused linear cross-entropy)"
    )
    loss_chunk_tokens: Count() = Field(4096, description="tokens per chunk of a chunked or fused loss")
    cross_entropy: CrossEntropy = Field(
        description="the cross-entropy over the logits: torch's F.cross_entropy over logits.float(), "
        "Megatron-Core's vocab-parallel one (in place on the fp32 logits), or flash-attn's Triton one (no fp32 "
        "copy, the gradient written into the logits)"
    )
    selective_recompute: SelectiveRecompute = Field(
        description="what --recompute selective recomputes: attention (the core attention, Megatron's "
        "default module) or ops (op-level selective checkpointing: matmul outputs kept, the rest recomputed)"
    )
    tp_inputs: TpInputs = Field(
        "sharded",
        description="what a column-parallel linear keeps for its weight gradient under sequence parallel: its "
        "input's sequence shard, all-gathered again in the backward (Megatron-Core's), or the all-gathered "
        "input itself (torch's DTensor SequenceParallel into ColwiseParallel, as torchtitan and transformers "
        "plan TP): the attention's and the MLP's inputs, whole, in every layer's activations",
    )
    fp8_linear_inputs: Fp8Inputs = Field(
        "bf16",
        description="what an FP8 linear keeps of its input for the weight gradient: the FP8 cast it multiplied "
        "(Transformer Engine's Linear and LayerNormLinear), or the bf16 input, cast again in the backward "
        "(torchao's Float8Linear)",
    )
    zero: Literal[0, 1, 2, 3] = Field(
        1,
        description="the ZeRO stage over DP x CP a job gets unless it names one (--zero): 1 where the states are "
        "sharded by a distributed optimizer (Megatron-Core's), 3 where data parallelism is FSDP (torchtitan's "
        "and accelerate's FSDP2 shard the weights too)",
    )
    fsdp_prefetch_layers: Count(minimum=0, maximum=64) = Field(
        1, description="layers whose parameters ZeRO-3/FSDP gathers ahead of the one computing"
    )
    reshard_after_forward: Reshard = Field(
        "always",
        description="when ZeRO-3/FSDP frees a layer's gathered parameters: after its forward (always), never "
        "within a step, or unless pipeline parallel (torchtitan's default)",
    )
    overhead_bytes: NonNegative = Field(
        description="bytes per device beyond the tensors: CUDA context, NCCL's buffers, library workspaces"
    )
    fragmentation: NonNegative = Field(
        description="what the caching allocator reserves beyond the allocated peak, as a share of the bytes "
        "that come and go within a step (activations, gathered weights, unsharded gradients, gradients made "
        "each step, the optimizer step's temporaries)"
    )
    reports: Literal["reserved", "allocated"] = Field(
        description="the peak the framework logs: torch.cuda.max_memory_reserved or max_memory_allocated"
    )


class TimePolicy(_Strict):
    """How the framework runs a step unless the job says otherwise."""

    cp_scheme: str = Field(
        description="the CP scheme a job gets by default (cp-plan step --cp-scheme); where the framework runs "
        "none, the scheme whose formulas price a job without CP"
    )
    cp_schemes: list[str] = Field(description="the CP schemes the framework can run; none: no CP (--cp 1)")
    cp_layouts: list[Literal["zigzag", "striped", "contiguous"]] = Field(
        ["zigzag"],
        min_length=1,
        description="the token layouts its ring and all-gather split a causal sequence into; the first is how "
        "its ranks hold the sequence under a whole-sequence scheme (Ulysses), which S must divide into",
    )
    a2a_splits_kv_heads: bool = Field(
        False,
        description="its all-to-all splits the KV heads over the CP ranks (Transformer Engine), rather than "
        "copying them where the ranks outnumber the heads (DeepSpeed-Ulysses)",
    )
    ep_from_dp: bool = Field(
        True, description="expert parallelism carved out of data parallelism (Megatron-Core), searched"
    )
    attention_kernel: str = Field("flash", description="the attention kernel it calls")
    allgather_merges: bool = Field(
        False,
        description="its all-gather CP attends the gathered K, V block by block and merges the partial outputs "
        "as a ring does (torch's context_parallel), rather than in one call over all the keys (Llama 3, "
        "Transformer Engine)",
    )
    ring_merge_bytes: Positive = Field(
        FUSED_MERGE_BYTES,
        le=1024,
        description="HBM bytes its ring moves per element of the partial output to merge one step's result "
        "into the running one: 12 a fused merge (two fp32 partials read, one written); unfused torch ops "
        "(a cast, then three elementwise passes) 34-38",
    )
    elementwise: Elementwise = Field(
        "fused",
        description="how a layer's norms, rotary embedding and MLP activation run: fused (one kernel each) or "
        "eager (torch ops one by one with fp32 upcasts, as a model's PyTorch code runs without torch.compile), "
        "whose intermediates a dense layer keeps for its backward (each RMSNorm's fp32 input, silu(gate))",
    )
    gqa: Gqa = Field(
        "native",
        description="how attention reads GQA's shared K and V heads: native (the kernel reads the KV heads as "
        "they are) or repeat (the model code expands K and V to the query heads first, as torchtitan did until "
        "January 2026 and transformers' eager attention does: CP moves, and the backward holds, h/n_kv times "
        "the K and V)",
    )
    lora_adapters: LoraAdapters = Field(
        "per_matrix",
        description="where its LoRA puts adapters: per_matrix (one beside each of Q, K, V, O, gate, up and down, "
        "as PEFT does) or fused (one on the fused Q/K/V projection and one on the fused gate/up, as Megatron "
        "Core's performant LoRA does): each adapter reads its projection's input again",
    )
    fp8_scaling: Fp8Scaling = Field(
        "delayed",
        description="how its FP8 casts take their scale: delayed (the amax taken in the cast itself and "
        "used from past steps: Transformer Engine's default recipe) or current (an amax pass over each tensor "
        "before its cast: torchao's tensorwise recipe)",
    )
    host_s_per_kernel: NonNegative | None = Field(
        None,
        le=1e-3,
        description="host time per kernel the step counts, run eagerly: the framework's own Python (its modules, "
        "autograd Functions, hooks), PyTorch's dispatch and autograd, the CUDA launch; a layer takes the longer "
        "of its host's and its device's time. None: the hardware profile's kernels.launch_s, eager PyTorch's "
        "floor. A hardware profile measured on a cluster (fitted to its runs) keeps its own",
    )
    dp_overlap: float = Field(ge=0, le=1, description="share of the gradient reduction hidden by default")
    tp_comm_overlap: bool = Field(False, description="TP collectives pipelined with their multiplies")
    bucket_bytes: Within(1024, 1e12, "bytes") = Field(description="gradient bucket size, bytes")
    grad_reduce_bytes: Count(minimum=1, maximum=8) = Field(description="bytes per gradient element reduced")
    optimizer_bytes: Positive = Field(description="HBM bytes the optimizer step moves per parameter")

    def sharding(self, layout: str) -> str:
        """How the ranks of a whole-sequence scheme (Ulysses) hold the sequence, asked for ``layout``: it, where
        the framework shards in it, else the framework's first (DeepSpeed contiguously, Megatron-Core in zigzag
        chunks). The scheme's time does not read it; what S must divide into does."""
        return layout if layout in self.cp_layouts else self.cp_layouts[0]


class FrameworkProfile(_Strict):
    """A training framework at a version: its memory and time policies, each knob with its source."""

    name: str = Field(description="what --framework calls it", max_length=80)
    title: str = Field(description="the framework as users name it", max_length=200)
    description: str = Field("", description="what the profile covers, in a few lines", max_length=4000)
    sources: list[Source] = Field(min_length=1)
    memory: MemoryPolicy
    time: TimePolicy

    @model_validator(mode="after")
    def _schemes(self) -> Self:
        if self.time.cp_schemes and self.time.cp_scheme not in self.time.cp_schemes:
            raise ValueError(f"time.cp_scheme {self.time.cp_scheme!r} is not among time.cp_schemes")
        kept = STATE_BYTES[self.memory.gradients]
        if self.memory.gradients_reduced_as_kept and kept != self.time.grad_reduce_bytes:
            raise ValueError(
                f"memory.gradients {self.memory.gradients} ({kept} bytes) and time.grad_reduce_bytes "
                f"{self.time.grad_reduce_bytes} differ, where memory.gradients_reduced_as_kept makes them one"
            )
        return self

    def refuse_cp(self, asked: str) -> None:
        """One line naming --cp where a job asks (``asked``: the degree, a scheme or a layout) for context
        parallelism of a framework that runs none."""
        if not self.time.cp_schemes:
            raise InputError("--cp", f"{asked}: {self.title} runs no context parallelism; accepted: 1")

    def with_changes(self, memory: dict | None = None, time: dict | None = None) -> FrameworkProfile:
        """The profile with some knobs changed (a job's flags), each checked as the profile's own."""
        data = self.model_dump()
        data["memory"] |= memory or {}
        data["time"] |= time or {}
        return type(self).model_validate(data)


DEFAULT = "megatron"


def builtin_frameworks() -> list[str]:
    return sorted(p.stem for p in data_dir("frameworks").glob("*.yaml"))


def parse_framework(
    data: object, origin: str, field: str = "--framework", document: YamlDocument | None = None
) -> FrameworkProfile:
    """Validate loaded YAML; a problem becomes one :class:`InputError` line naming the field and its line."""
    if not isinstance(data, dict):
        raise InputError(
            field, f"{origin}: expected a mapping of framework fields, got {type(data).__name__}"
        )
    try:
        return FrameworkProfile.model_validate(data)
    except ValidationError as exc:
        where = document.line if document is not None else None
        said = another_kind(data, "framework profile") or describe_validation(exc, where, FrameworkProfile)
        raise InputError(field, f"{origin}: {said}") from None


def load_framework(spec: str, field: str = "--framework") -> FrameworkProfile:
    """A built-in framework profile by name, or a YAML file by path."""
    if spec.lower() in _builtins():
        return _builtin(spec.lower(), field)
    data, origin, document = load_builtin_or_file(spec, data_dir("frameworks"), field, "framework")
    return parse_framework(data, origin, field, document)


@functools.cache
def _builtins() -> frozenset[str]:
    return frozenset(p.stem.lower() for p in data_dir("frameworks").glob("*.yaml"))


@functools.cache
def _builtin(name: str, field: str) -> FrameworkProfile:
    """A built-in profile, read once a process: every job reads its framework's, and a table of runs or a fit
    makes thousands of jobs (reading the YAML was most of a run's prediction). Profiles are frozen."""
    data, origin, document = load_builtin_or_file(name, data_dir("frameworks"), field, "framework")
    return parse_framework(data, origin, field, document)
