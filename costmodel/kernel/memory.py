"""One device's peak memory in a training step, measured on fake tensors: the reference for the analytic model.

A small pre-norm transformer stage is written in plain torch and run for a training iteration under
``FakeTensorMode`` (tensors with shapes, dtypes and storages, and no data: nothing is allocated) and
PyTorch's ``MemTracker`` [MemTracker], or ``FSDPMemTracker`` with ``fully_shard`` on a fake process group
when the case is ZeRO-3, as torchtitan's memory estimator does [torchtitan-estimate]. The tracker sees every
storage an aten op creates, and its weakref callbacks see it freed, so the peak it reports is what a caching
allocator would have to hold live, to the byte: fake tensors on the CPU device skip the 512-byte rounding it
applies to CUDA tensors. What the allocator reserves beyond it is replayed apart, for a case measured whole
(:mod:`costmodel.kernel.allocator`). A 405B stage costs a second or two, not 50 GB.

What is measured (:func:`measure`): ``in_flight`` forwards keeping their graphs, then their backwards, then
the optimizer step, once the optimizer's states exist; the peak is the most the live storages ever add up
to, with what they are at that moment (``by_category``) and when (``moment``). gc is paused throughout, so
a storage goes when its last reference does, as on a device, and never at a random point of the step.

Categories. MemTracker classes a storage by how it came to be: a module's parameter or buffer, a
parameter's gradient (grad hooks), an optimizer state (step hooks), otherwise an activation when made in
forward or a recomputation, a temporary when made in backward; FSDPMemTracker adds sharded and unsharded
parameters and gradients and its collectives' buffers. These are mapped to the report's keys, and two
refinements come from where in the model a storage was made:

- ``weights``: the parameters a module holds between steps, in ``param_dtype``. Under FSDP with a master
  dtype the sharded parameters *are* the master copy (``optimizer``): FSDP2 keeps no low-precision copy.
- ``gradients``: the gradient buffer the optimizer reads (Megatron-LM's ``main_grad``, in ``grad_dtype``),
  FSDP's sharded gradients, and a parameter's low-precision gradient before it is added in.
- ``optimizer``: the master copy and AdamW's two moments (``optimizer_dtype``).
- ``fsdp_buffers``: what FSDP gathers and scatters: unsharded parameters and gradients, all-gather outputs,
  reduce-scatter inputs.
- ``loss``: everything the output head makes, forward and backward (final norm, logits, their fp32 copies,
  softmax, the cross-entropy's gradients, the gradient of the head's input): module tracking tells when the
  head is running, backward included.
- ``cp_buffers``: what the CP scheme's own communication and merging code allocates: received and gathered
  K/V, all-to-all outputs, fp32 accumulators and their merge temporaries, in forward and backward. The
  attention kernel's own outputs on them stay ``activations``/``temporaries``, as in plain attention.
- ``activations``: the rest made in forward or recomputed in backward (the recomputation is tagged by the
  wrapper that runs it, so FSDP's tracker, which does not see it, agrees with MemTracker).
- ``temporaries``: the rest made in backward or the step: activation gradients, recv buffers of gradients.

The model ([Korthikanti22] for what each part keeps). RMSNorm and SwiGLU are written as the fused kernels
Megatron-LM and Transformer Engine use (save the input and the fp32 1/rms; silu recomputed in backward):
torch's ``F.rms_norm`` is decomposed on the CPU and would keep three fp32 copies of its input. QKV is one
projection split into views, so attention keeps that one storage. Attention is
``F.scaled_dot_product_attention``; on CPU fake tensors it dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu``, GQA included, whose meta kernel returns ``out`` and an
fp32 ``logsumexp`` (b, h, s) and whose backward takes exactly those: flash attention's footprint [FA2], no
S x S scores. RoPE and dropout are left out: neither changes what is kept once fused. Tensor parallelism
is in the per-rank shapes; with sequence parallelism the gathers and reduce-scatters around the column-
and row-parallel linears are written out, and the column-parallel linear keeps its sharded input and
gathers it again in backward, as Megatron-LM's does. Collectives are stood for by their output buffers
(``new_empty``): shapes are exact, values are not exchanged, as with the fake process group.

CP schemes, in the shapes the implementations allocate: ``ring`` after ring-flash-attention
[ring-flash-attn] (the next K/V block received while the current one is used, so two blocks beside the
local one; fp32 out and lse accumulators in forward; in backward fp32 dQ, fp32 dK/dV travelling with their
received pair, and the K/V blocks again); ``allgather`` after Transformer Engine's all-gather attention
[Llama3 §3.3.2], [TE-CP] (the whole sequence's K and V gathered, and a reordered copy of it, dropped after
forward and gathered again in backward with a whole-sequence dK/dV, reordered and reduce-scattered);
``ulysses`` [Ulysses] (all-to-alls of q, k, v to heads/cp over cp x tokens, K/V heads replicated to cp
first when fewer, the output back the same way, and the reverse in backward).

Losses: ``materialized`` (bf16 logits, an fp32 copy, ``F.cross_entropy``'s fp32 log-softmax kept for
backward); ``chunked`` (each ``loss_chunk_tokens`` rows' logits and loss under a checkpoint, recomputed in
backward: one chunk's logits live at a time); ``fused`` (Liger-Kernel's fused linear cross-entropy
[Liger]: the gradients of the hidden states and of the output weight computed chunk by chunk in forward
and kept until backward; no logits kept).

Recompute (``torch.utils.checkpoint``, non-reentrant): ``selective`` checkpoints the attention core (with
flash attention it drops only the lse), ``full`` each whole layer (only its input kept). Optimizer:
``torch.optim.AdamW(fused=True)``, which allocates nothing beyond its states, or ``foreach=True``, which
makes the square root of the second moment whole at the step [PyTorch-AdamW]. Without FSDP it steps
Megatron-LM's layout [Megatron-LM]: bf16 weights, a persistent ``grad_dtype`` gradient buffer the
backward adds into (1/shard_group of it from ZeRO-2), and an fp32 master of 1/shard_group of the
parameters from ZeRO-1 with AdamW's moments beside it [ZeRO]; the updated shard is copied back in place.
ZeRO-3 is FSDP2's ``fully_shard`` on every layer, the embedding, the head and the stage, with
``MixedPrecisionPolicy(param_dtype, reduce_dtype=grad_dtype)``. Moments of another dtype than what AdamW
steps are made by hand; torch's fused kernel would refuse them on a device, its meta kernel takes them, and
the footprint is that of a precision-aware optimizer such as Transformer Engine's ``FusedAdam``.

Pipeline: a stage that does not start the model receives its input; one that does not end it sends its
output and frees its data (Megatron-LM's ``deallocate_output_tensor``), then runs backward from a received
gradient.

Speed (2 CPU cores): every op costs some 0.1-0.2 ms of python (fake dispatch, tracking), about 50 ms a
layer and micro-batch, twice that under FSDP; so a deep stage, or many micro-batches in flight, is
measured at two small sizes and extrapolated, exactly (:func:`measure` says why), and any case takes a
few seconds (``benchmarks/memory_reference.py``).
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker, _UpdateType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard
from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
from torch.utils.checkpoint import checkpoint

from costmodel.core.errors import InputError
from costmodel.kernel.allocator import Replay

aten = torch.ops.aten
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CATEGORIES = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "loss",
    "cp_buffers",
    "fsdp_buffers",
    "temporaries",
)
MOMENTS = ("forward", "backward", "optimizer")
RECOMPUTE = ("none", "selective", "full")
LOSSES = ("materialized", "chunked", "fused")
CROSS_ENTROPY = ("torch", "megatron", "flash")
ELEMENTWISE = ("fused", "eager")
OPTIMIZER_KERNELS = ("fused", "foreach")
CP_SCHEMES = ("ring", "allgather", "ulysses")


@dataclass(frozen=True)
class MemoryCase:
    """One device's share of a training step: the per-device shapes and what the framework keeps."""

    tokens: int  # tokens of one sequence on this device (S / CP)
    micro_batch: int  # sequences per micro-batch
    layers: int  # transformer layers on this pipeline stage
    hidden: int
    heads: int  # query heads on this TP rank (h / TP)
    kv_heads: int  # KV heads on this TP rank (max(n_kv / TP, 1))
    head_dim: int
    ffn_hidden: int  # MLP width on this TP rank (F / TP); of an MoE layer its shared expert's (0: none)
    vocab: int  # output-layer rows on this TP rank (vocab-parallel: V / TP); the input embedding's too
    tp: int = 1  # TP degree (sequence parallel: norms and the residual stream hold tokens / TP)
    sequence_parallel: bool = False
    gated_mlp: bool = True
    input_embedding: bool = True  # this stage holds the input embedding (first stage)
    output_layer: bool = True  # this stage holds the output layer, final norm and loss (last stage)
    experts: int = 0  # routed experts on this rank (0: dense); every layer's MLP is then the MoE layer
    experts_per_token: int = 0
    expert_ffn: int = 0
    capacity_factor: float = 1.0
    # the stage's first layers whose MLP is dense (DeepSeek's first_k_dense_replace), and their width on this rank
    dense_layers: int = 0
    dense_ffn: int = 0
    # what the framework keeps
    param_dtype: str = "bf16"  # compute weights
    master_dtype: str | None = "fp32"  # master copy the optimizer updates (None: it steps the params)
    grad_dtype: str = "fp32"
    optimizer_dtype: str = "fp32"  # Adam moments
    optimizer_kernel: str = "fused"  # AdamW(fused=True), or foreach=True (a second-moment-sized temporary)
    # gradients: a persistent buffer the backward adds into (Megatron-LM's main_grad), or made by the backward
    # and freed once the step has flattened and cast them (InternEvo's hybrid ZeRO); FSDP2 keeps its shards
    grad_buffer: bool = True
    zero: int = 1  # 0..3; shards over shard_group ranks (3 is FSDP2: needs fsdp)
    shard_group: int = 1  # ranks ZeRO/FSDP shards over (DP x CP)
    # ranks that hold the same experts, over which ZeRO/FSDP shards their states: DP x CP / EP (Megatron's
    # expert data-parallel group, torchtitan's dp_shard_mod_ep); 0: shard_group, as without EP
    expert_shard_group: int = 0
    fsdp: bool = False  # ZeRO-3 as FSDP2 (per-layer all-gather, reshard after forward)
    reshard_after_forward: bool = True
    recompute: str = "selective"  # none | selective (attention core recomputed) | full (layer inputs kept)
    # fused norms and SwiGLU (Transformer Engine, Liger, torch.compile), or Hugging Face's eager torch ops
    elementwise: str = "fused"
    loss: str = "materialized"  # materialized (bf16 logits, fp32 upcast, fp32 grad) | chunked | fused
    loss_chunk_tokens: int = 4096
    cross_entropy: str = (
        "torch"  # torch's F.cross_entropy over logits.float(), Megatron's vocab-parallel one, or flash-attn's
    )
    cp: int = 1
    cp_scheme: str = "ring"  # ring | allgather | ulysses: the buffers CP adds in the attention
    in_flight: int = 1  # micro-batches whose activations this stage holds at its peak (1F1B: pp on stage 1)
    rounds: int = 1  # the in-flight forwards and backwards, run this many times before the optimizer step

    def __post_init__(self) -> None:
        for name in ("tokens", "micro_batch", "hidden", "heads", "kv_heads", "head_dim"):
            _at_least(self, name, 1)
        _at_least(self, "ffn_hidden", 0 if self.experts else 1)
        for name in ("vocab", "tp", "shard_group", "loss_chunk_tokens", "cp", "in_flight", "rounds"):
            _at_least(self, name, 1)
        _at_least(self, "layers", 0)
        _one_of(self, "recompute", RECOMPUTE)
        _one_of(self, "loss", LOSSES)
        _one_of(self, "cross_entropy", CROSS_ENTROPY)
        _one_of(self, "elementwise", ELEMENTWISE)
        _one_of(self, "cp_scheme", CP_SCHEMES)
        _one_of(self, "optimizer_kernel", OPTIMIZER_KERNELS)
        _one_of(self, "zero", (0, 1, 2, 3))
        for name in ("param_dtype", "grad_dtype", "optimizer_dtype"):
            _one_of(self, name, tuple(DTYPES))
        _one_of(self, "master_dtype", (*DTYPES, None))
        if self.heads % self.kv_heads:
            raise InputError("kv_heads", f"{self.kv_heads} does not divide heads = {self.heads}")
        if self.sequence_parallel and self.tokens % self.tp:
            raise InputError("tokens", f"sequence parallelism needs tokens divisible by tp = {self.tp}")
        if (
            self.cp > 1
            and self.cp_scheme == "ulysses"
            and (self.heads % self.cp or (self.kv_heads % self.cp and self.cp % self.kv_heads))
        ):
            raise InputError("heads", f"Ulysses splits heads and KV heads over cp = {self.cp} [Ulysses §3]")
        if self.experts and (self.experts_per_token < 1 or self.expert_ffn < 1):
            raise InputError("experts_per_token", "an MoE layer needs experts_per_token and expert_ffn >= 1")
        if self.dense_layers and not (
            self.experts and self.dense_ffn >= 1 and self.dense_layers <= self.layers
        ):
            raise InputError(
                "dense_layers", "dense layers come first in an MoE stage, of dense_ffn >= 1 each"
            )
        if self.expert_shard_group < 0 or self.shard_group % (self.expert_shard_group or 1):
            raise InputError("expert_shard_group", f"must divide shard_group = {self.shard_group}")
        self._check_sharding()

    def _check_sharding(self) -> None:
        if (self.zero == 3) != self.fsdp:
            raise InputError("fsdp", "ZeRO-3 is measured as FSDP2: zero = 3 exactly when fsdp is set")
        if not (self.fsdp or self.grad_buffer) and (self.shard_group > 1 or self.master_dtype is None):
            raise InputError(
                "grad_buffer",
                "gradients without a buffer are stepped as InternEvo's hybrid ZeRO on one data-parallel rank "
                "(shard_group 1) into a master copy",
            )
        stepped = self.master_dtype or self.param_dtype
        if self.fsdp and self.grad_dtype != stepped:
            raise InputError("grad_dtype", f"FSDP2 keeps sharded gradients in the sharded dtype, {stepped}")
        if not self.fsdp and self.master_dtype is None:
            if self.grad_dtype != self.param_dtype:
                raise InputError(
                    "grad_dtype", "without a master copy AdamW steps params with their own dtype"
                )
            if self.zero and self.shard_group > 1:
                raise InputError("master_dtype", "ZeRO-1/2 shards the master copy: set a master dtype")

    @property
    def expert_shards(self) -> int:
        """Ranks the experts' states are sharded over."""
        return self.expert_shard_group or self.shard_group

    @property
    def eager(self) -> bool:
        """Whether the norms and the activation run as eager torch ops (Hugging Face's modelling code)."""
        return self.elementwise == "eager"

    @property
    def residual_tokens(self) -> int:
        """Tokens of the residual stream on this rank: sequence parallelism splits them over TP."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @property
    def capacity(self) -> int:
        """Rows per expert: ceil(tokens x micro_batch x k / experts x capacity factor) [Switch §2.2]."""
        routed = self.tokens * self.micro_batch * self.experts_per_token
        return math.ceil(routed / self.experts * self.capacity_factor)


def _at_least(case: MemoryCase, name: str, low: int) -> None:
    if getattr(case, name) < low:
        raise InputError(name, f"must be >= {low}, got {getattr(case, name)}")


def _one_of(case: MemoryCase, name: str, choices: tuple) -> None:
    if getattr(case, name) not in choices:
        raise InputError(name, f"must be one of {', '.join(map(str, choices))}; got {getattr(case, name)!r}")


@dataclass(frozen=True)
class MemoryMeasurement:
    """The peak of the measured iteration: its bytes, what they were (every key of :data:`CATEGORIES`, the
    sum being ``peak_bytes``), and whether it came in forward, backward or the optimizer step; and the most
    the caching allocator would reserve over the whole run, replayed (:mod:`costmodel.kernel.allocator`):
    on fake tensors run whole and without FSDP, whose collectives allocate on streams of their own; else
    None."""

    peak_bytes: int
    by_category: dict[str, int] = field(default_factory=dict)
    moment: str = "forward"
    reserved_bytes: int | None = None


# ---------------------------------------------------------------------------------------------------------
# Attribution: the model says what it is doing; the tracker reads it when a storage is made.


class _Now:
    """What the step is doing: its phase, and a stack of categories the code running now makes storages for.
    Module-level because autograd runs backward (custom functions and recomputation included) in this
    thread, outside any call the driver could pass it to."""

    phase = "forward"
    place: object = "start"  # where in the stage the step last was (_Attributed._place)
    regions: list[str] = []


@contextmanager
def _making(category: str) -> Iterator[None]:
    """Storages made inside count as ``category`` (unless they are parameters, gradients or states)."""
    _Now.regions.append(category)
    try:
        yield
    finally:
        _Now.regions.pop()


# MemTracker's and FSDPMemTracker's reference types, by name, to the report's categories.
_FIXED = {
    "PARAM": "weights",
    "BUFFER": "weights",
    "GRAD": "gradients",
    "SHARDED_GRAD": "gradients",
    "OPT": "optimizer",
    "UNSHARDED_PARAM": "fsdp_buffers",
    "UNSHARDED_GRAD": "fsdp_buffers",
    "ALL_GATHER": "fsdp_buffers",
    "REDUCE_SCATTER": "fsdp_buffers",
}


class _Peak(NamedTuple):
    """A part of the step at its peak: bytes, their breakdown, and how many ops into the step it came (the
    earlier of two equal peaks is the one a running peak keeps)."""

    bytes: int
    by_category: dict[str, int]
    op: int


class _Attributed:
    """Keeps, beside MemTracker's own snapshot, the bytes of each of :data:`CATEGORIES`; the peak of their sum
    with its breakdown and phase; and the peak of each part of the step, a phase at one place of the stage
    (see :func:`measure`). MemTracker's per-module peaks are not kept: they walk every module after every op,
    which dominates the time of a deep stage; its per-module snapshots at hooks still are."""

    reserved: int | None = None  # the replayed allocator's peak reservation (:func:`_run`)

    def _attribute(self, layers: int, sharded_param: str) -> None:
        self.bytes = dict.fromkeys(CATEGORIES, 0)
        self._fixed = {**_FIXED, "SHARDED_PARAM": sharded_param}
        self._layers, self._places = layers, {}
        self.reset_peak()

    def reset_peak(self) -> None:
        self.peak: tuple[int, dict[str, int], str] = (-1, {}, "forward")
        self.peaks: dict[tuple[str, object], _Peak] = {}
        self._ops = 0

    def _category(self, reftype: object, region: str | None) -> str:
        name = reftype.name  # type: ignore[attr-defined]
        if name == "OPT" and region == "temporaries":  # made by the step itself, its states already there
            return "temporaries"
        if name in self._fixed:
            return self._fixed[name]
        if region:
            return region
        return "temporaries" if name == "TEMP" else "activations"

    def _place(self) -> object:
        """Where in the stage the step is (module tracking knows, in backward too): "embedding", "head", a
        layer by its distance from the nearer end (0, 1 or -2, -1; "middle" beyond), or None between modules.
        Two layers are running while one hands over to the next: the later in the step's order counts."""
        found = [self._order(name) for name in self._mod_tracker.parents]
        found = [place for place in found if place is not None]
        if not found:
            return None
        return (min if _Now.phase == "backward" else max)(found)[1]

    def _order(self, name: str) -> tuple[int, object] | None:
        """A module's (index along the stage, place) by its name: ``Stage.layers.3.attention`` is in layer 3."""
        if name not in self._places:
            parts = name.split(".") + [""]
            if parts[1] == "layers":
                index = int(parts[2])
                ends = (index, index - self._layers)
                self._places[name] = (index, next((end for end in ends if end in (0, 1, -2, -1)), "middle"))
            else:
                self._places[name] = {"embedding": (-1, "embedding"), "head": (self._layers, "head")}.get(
                    parts[1]
                )
        return self._places[name]

    def _region_now(self) -> str | None:
        if _Now.regions:
            return _Now.regions[-1]
        return "loss" if self._place() == "head" else None

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        if not hasattr(winfo, "region"):
            winfo.region = self._region_now()
        now = self._category(winfo.reftype, winfo.region)
        if u_type == _UpdateType.ADD:
            self.bytes[now] += winfo.mem_consumed
        elif u_type == _UpdateType.DEL:
            self.bytes[now] -= winfo.mem_consumed
        elif u_type == _UpdateType.REF:
            self.bytes[self._category(old_reftype, winfo.region)] -= winfo.mem_consumed
            self.bytes[now] += winfo.mem_consumed
        else:
            self.bytes[now] += winfo.mem_consumed - old_mem_consumed

    def _update_peak_stats(self, peak_state) -> None:
        total = sum(self.bytes.values())
        if total > self.peak[0]:
            self.peak = (total, dict(self.bytes), _Now.phase)
        place = self._place()
        if place is not None:  # between modules, the last place stands: a layer's reduce-scatter is its own
            _Now.place = place
        part = (_Now.phase, _Now.place)
        self._ops += 1
        if total > self.peaks.get(part, _Peak(-1, {}, 0)).bytes:
            self.peaks[part] = _Peak(total, dict(self.bytes), self._ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default:  # a device, not a storage: skip the bookkeeping
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class _Tracker(_Attributed, MemTracker):
    pass


class _FSDPTracker(_Attributed, FSDPMemTracker):
    pass


# ---------------------------------------------------------------------------------------------------------
# Collectives on one process: their output buffers, shapes exact, values not exchanged.


def _gathered(x: torch.Tensor, ranks: int, dim: int = 1) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= ranks
    return x.new_empty(shape)


def _scattered(x: torch.Tensor, ranks: int, dim: int = 1) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] //= ranks
    return x.new_empty(shape)


class _GatherTokens(torch.autograd.Function):
    """Sequence parallelism's all-gather of the tokens over TP; reduce-scatter in backward [Korthikanti22 §4.2.2]."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ranks: int) -> torch.Tensor:
        ctx.ranks = ranks
        return _gathered(x, ranks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _scattered(grad, ctx.ranks), None


class _ScatterTokens(torch.autograd.Function):
    """Sequence parallelism's reduce-scatter after a row-parallel linear; all-gather in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ranks: int) -> torch.Tensor:
        ctx.ranks = ranks
        return _scattered(x, ranks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _gathered(grad, ctx.ranks), None


class _ColumnLinearSP(torch.autograd.Function):
    """Column-parallel linear on sequence-parallel input, as Megatron-LM's: keeps the sharded input and gathers
    it again in backward, where the input gradient is reduce-scattered before the weight gradient is made."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, ranks: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.ranks = ranks
        return F.linear(_gathered(x, ranks), weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        full = _gathered(x, ctx.ranks)
        grad_input = _scattered(grad @ weight, ctx.ranks)
        grad_weight = grad.flatten(0, -2).t() @ full.flatten(0, -2)
        return grad_input, grad_weight, None


def _column(x: torch.Tensor, weight: torch.Tensor, case: MemoryCase) -> torch.Tensor:
    if case.sequence_parallel and case.tp > 1:
        return _ColumnLinearSP.apply(x, weight, case.tp)
    return F.linear(x, weight)


def _row(x: torch.Tensor, weight: torch.Tensor, case: MemoryCase) -> torch.Tensor:
    out = F.linear(x, weight)  # without sequence parallelism the all-reduce is in place
    if case.sequence_parallel and case.tp > 1:
        return _ScatterTokens.apply(out, case.tp)
    return out


# ---------------------------------------------------------------------------------------------------------
# Fused kernels, as their footprint: what they save and what they write.


class _RMSNorm(torch.autograd.Function):
    """RMSNorm as Transformer Engine's / Apex's fused kernel: saves its input and the fp32 1/rms per token."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        rstd = norm.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd.to(x.dtype)).mul_(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        normed = x * rstd.to(x.dtype)
        grad_weight = (grad * normed).flatten(0, -2).sum(0)
        scaled = grad * weight
        mean = (scaled * normed).mean(-1, keepdim=True)
        return scaled.sub_(normed.mul_(mean)).mul_(rstd.to(x.dtype)), grad_weight, None


class RMSNorm(nn.Module):
    """The fused kernel, or (``eager``) Hugging Face's ``LlamaRMSNorm`` as torch ops: autograd keeps the fp32
    upcast (for the square and the scaling) and the bf16 normalised copy (for the weight's gradient)."""

    def __init__(self, hidden: int, dtype: torch.dtype, eager: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, dtype=dtype))
        self.eager = eager

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.eager:
            return _RMSNorm.apply(x, self.weight, 1e-5)
        upcast = x.to(torch.float32)
        scaled = upcast * torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + 1e-5)
        return self.weight * scaled.to(x.dtype)


class _SwiGLU(torch.autograd.Function):
    """silu(a) * b of the two halves of its input, as Megatron-LM's fused ``bias_swiglu``: saves the input
    alone and writes one gradient of its size in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        a, b = x.chunk(2, -1)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return _swiglu_backward(x, grad)


def _swiglu_backward(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of silu(a) * b, written into one tensor of the input's size."""
    a, b = x.chunk(2, -1)
    out = torch.empty_like(x)
    da, db = out.chunk(2, -1)
    torch.sigmoid(a, out=da)
    torch.mul(a, da, out=db)  # silu(a)
    da.mul_((a - db).add_(1)).mul_(grad).mul_(b)  # silu'(a) = s (1 + a - silu(a))
    db.mul_(grad)
    return out


class _WeightedSwiGLU(torch.autograd.Function):
    """silu(a) * b * w, each routed row weighted by its router probability, as Megatron-LM's fused
    ``weighted_bias_swiglu``: saves the input and the weights, so the expert's output keeps nothing more."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weights)
        a, b = x.chunk(2, -1)
        return F.silu(a) * b * weights

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weights = ctx.saved_tensors
        a, b = x.chunk(2, -1)
        dweights = (F.silu(a) * b * grad).sum(-1, keepdim=True)
        return _swiglu_backward(x, grad * weights), dweights


def _activation(
    x: torch.Tensor, gated: bool, weights: torch.Tensor | None = None, eager: bool = False
) -> torch.Tensor:
    """The MLP's activation; ``eager``: silu(gate) * up as two torch ops (Hugging Face's ``LlamaMLP``), the
    product keeping silu(gate) for its backward."""
    if weights is not None:
        return _WeightedSwiGLU.apply(x, weights) if gated else F.gelu(x, approximate="tanh") * weights
    if gated and eager:
        gate, up = x.chunk(2, -1)
        return F.silu(gate) * up
    return _SwiGLU.apply(x) if gated else F.gelu(x, approximate="tanh")


# ---------------------------------------------------------------------------------------------------------
# Attention and its CP schemes.


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):
    """(out, lse) of the op ``F.scaled_dot_product_attention`` runs on CPU, GQA native to it; on a CUDA device
    (:func:`measure`'s check against the caching allocator) FlashAttention's, which takes as many K/V heads
    as query heads."""
    if q.is_cuda:
        out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return out, lse
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse


def _flash_backward(dout, q, k, v, out, lse, causal: bool):
    if q.is_cuda:  # no dropout: the RNG state and the cumulative lengths are not read
        length_q, length_k = q.shape[-2], k.shape[-2]
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, length_q, length_k, 0.0, causal, None, None
        )
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal)


def _merge(
    out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor, block_lse: torch.Tensor
):
    """ring-flash-attention's ``update_out_and_lse`` into fp32 accumulators [A-OnlineNorm]."""
    if out is None:
        return block_out.float(), block_lse
    out = out - torch.sigmoid(block_lse - lse).unsqueeze(-1) * (out - block_out)
    return out, lse - F.logsigmoid(lse - block_lse)


class _RingAttention(torch.autograd.Function):
    """Ring attention as ring-flash-attention's ``ring_flash_attn_forward/backward`` allocates it [ring-flash-attn]:
    each step receives the next K/V block while it attends to the current one."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int) -> torch.Tensor:
        out = lse = None
        block_k, block_v = k, v
        for step in range(ranks):
            with _making("cp_buffers"):
                following = (torch.empty_like(k), torch.empty_like(v)) if step + 1 < ranks else None
            block_out, block_lse = _flash(q, block_k, block_v, causal=step == 0)
            with _making("cp_buffers"):
                out, lse = _merge(out, lse, block_out, block_lse)
            del block_out, block_lse
            if following:
                block_k, block_v = following
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ranks = ranks
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq = received = None
        block_k, block_v = k, v
        for step in range(ctx.ranks):
            with _making("cp_buffers"):
                following = (torch.empty_like(k), torch.empty_like(v)) if step + 1 < ctx.ranks else None
            block_dq, block_dk, block_dv = _flash_backward(dout, q, block_k, block_v, out, lse, step == 0)
            with _making("cp_buffers"):
                dq = block_dq.float() if dq is None else dq.add_(block_dq)
                if received is None:  # this rank's own block starts the travelling fp32 dK/dV
                    dk, dv = block_dk.float(), block_dv.float()
                else:  # the pair received from the neighbour, plus this block's share
                    dk, dv = received[0] + block_dk, received[1] + block_dv
                received = (torch.empty_like(dk), torch.empty_like(dv))  # arriving while dk, dv are sent
            del block_dq, block_dk, block_dv
            if following:
                block_k, block_v = following
        return dq.to(q.dtype), received[0].to(k.dtype), received[1].to(v.dtype), None


def _gather_sequence(x: torch.Tensor, ranks: int) -> torch.Tensor:
    """K or V (b, h, s, d) of the whole sequence, and Transformer Engine's reordered copy (zigzag chunks in order)."""
    gathered = _gathered(x, ranks, dim=2)
    return gathered.index_select(2, torch.arange(gathered.shape[2], device=x.device))


class _AllGatherAttention(torch.autograd.Function):
    """All-gather attention as Transformer Engine's ``AttnFuncWithCPAndKVAllGather`` [Llama3 §3.3.2], [TE-CP]."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int) -> torch.Tensor:
        with _making("cp_buffers"):
            whole_k, whole_v = _gather_sequence(k, ranks), _gather_sequence(v, ranks)
        out, lse = _flash(q, whole_k, whole_v, causal=False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ranks = ranks
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        with _making("cp_buffers"):
            whole_k, whole_v = _gather_sequence(k, ctx.ranks), _gather_sequence(v, ctx.ranks)
            dk, dv = torch.zeros_like(whole_k), torch.zeros_like(whole_v)
        dq, block_dk, block_dv = _flash_backward(dout, q, whole_k, whole_v, out, lse, causal=False)
        with _making("cp_buffers"):
            dk.add_(block_dk)
            dv.add_(block_dv)
            del block_dk, block_dv, whole_k, whole_v
            order = torch.arange(dk.shape[2], device=dk.device)
            dk, dv = dk.index_select(2, order), dv.index_select(2, order)
        return dq, _scattered(dk, ctx.ranks, dim=2), _scattered(dv, ctx.ranks, dim=2), None


class _AllToAll(torch.autograd.Function):
    """Ulysses' all-to-all [Ulysses]: (b, heads, s, d) -> (b, heads / ranks, ranks x s, d); the reverse in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ranks: int, to_heads: bool) -> torch.Tensor:
        ctx.ranks, ctx.to_heads = ranks, to_heads
        with _making("cp_buffers"):
            return _exchanged(x, ranks, to_heads)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        with _making("cp_buffers"):
            return _exchanged(grad, ctx.ranks, not ctx.to_heads), None, None


def _exchanged(x: torch.Tensor, ranks: int, to_heads: bool) -> torch.Tensor:
    b, h, s, d = x.shape
    return x.new_empty((b, h // ranks, s * ranks, d) if to_heads else (b, h * ranks, s // ranks, d))


def _ulysses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int) -> torch.Tensor:
    if k.shape[1] < ranks:  # replicate K/V heads so each rank receives the one its queries use
        with _making("cp_buffers"):
            k, v = (x.repeat_interleave(ranks // x.shape[1], dim=1) for x in (k, v))
    q, k, v = (_AllToAll.apply(x, ranks, True) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return _AllToAll.apply(out, ranks, False)


class CoreAttention(nn.Module):
    """softmax(q k^T) v, by flash attention, or by the case's CP scheme over ``cp`` ranks."""

    def __init__(self, case: MemoryCase) -> None:
        super().__init__()
        self.cp, self.scheme = case.cp, case.cp_scheme

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.cp == 1:
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
            )
        if self.scheme == "ring":
            return _RingAttention.apply(q, k, v, self.cp)
        if self.scheme == "allgather":
            return _AllGatherAttention.apply(q, k, v, self.cp)
        return _ulysses(q, k, v, self.cp)


class Recomputed(nn.Module):
    """Runs ``inner`` under a non-reentrant checkpoint; what it makes again in backward is an activation."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._run, *args, use_reentrant=False)

    def _run(self, *args: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() == -1:  # forward
            return self.inner(*args)
        with _making("activations"):  # the recomputation, inside backward
            return self.inner(*args)


def _parameter(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    """Weights are left uninitialised: here only their sizes matter."""
    return nn.Parameter(torch.empty(shape, dtype=dtype))


class Attention(nn.Module):
    def __init__(self, case: MemoryCase, dtype: torch.dtype) -> None:
        super().__init__()
        self.case = case
        self.norm = RMSNorm(case.hidden, dtype, case.eager)
        self.qkv = _parameter((case.heads + 2 * case.kv_heads) * case.head_dim, case.hidden, dtype=dtype)
        self.out = _parameter(case.hidden, case.heads * case.head_dim, dtype=dtype)
        core = CoreAttention(case)
        self.core = Recomputed(core) if case.recompute == "selective" else core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        case = self.case
        qkv = _column(self.norm(x), self.qkv, case)  # one projection; q, k, v are views of it
        batch, tokens = qkv.shape[:2]
        q, k, v = qkv.view(batch, tokens, -1, case.head_dim).split(
            [case.heads, case.kv_heads, case.kv_heads], dim=2
        )
        out = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return x + _row(out.transpose(1, 2).reshape(batch, tokens, -1), self.out, case)


class MLP(nn.Module):
    def __init__(self, case: MemoryCase, dtype: torch.dtype, width: int = 0) -> None:
        super().__init__()
        self.case = case
        width = width or case.ffn_hidden
        self.norm = RMSNorm(case.hidden, dtype, case.eager)
        self.up = _parameter((2 if case.gated_mlp else 1) * width, case.hidden, dtype=dtype)
        self.down = _parameter(case.hidden, width, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        case = self.case
        hidden = _activation(_column(self.norm(x), self.up, case), case.gated_mlp, eager=case.eager)
        return x + _row(hidden, self.down, self.case)


def _dispatch(chosen: torch.Tensor, weights: torch.Tensor, experts: int, capacity: int):
    """Which token fills each of the experts x capacity slots, and its routing weight [Switch §2.2]: the i-th
    choice of expert e takes slot e·C + i while i < C, later ones are dropped; empty slots read token 0 with
    weight 0. Fixed shapes throughout, so it runs on fake tensors."""
    flat = chosen.flatten()
    slots = experts * capacity
    with torch.no_grad():
        onehot = F.one_hot(flat, experts)
        position = (onehot.cumsum(0) * onehot).sum(1) - 1
        slot = torch.where(position < capacity, flat * capacity + position, slots)
        token = torch.arange(flat.numel(), device=flat.device) // chosen.shape[1]
        token_of = torch.zeros(slots + 1, dtype=torch.long, device=flat.device).scatter_(0, slot, token)[
            :slots
        ]
    weight_of = weights.new_zeros(slots + 1).scatter(0, slot, weights.flatten())[:slots]
    return token_of, weight_of


class _Combine(torch.autograd.Function):
    """Each token's weighted expert outputs summed back into its row, keeping the index alone, as Megatron-LM's
    fused unpermute does (torch's ``index_add_`` also keeps the expert outputs for its backward)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, token_of: torch.Tensor, tokens: int) -> torch.Tensor:
        ctx.save_for_backward(token_of)
        return out.new_zeros(tokens, out.shape[-1]).index_add_(0, token_of, out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (token_of,) = ctx.saved_tensors
        return grad.index_select(0, token_of), None, None


class Experts(nn.Module):
    """The rank's ``experts`` expert MLPs as stacked weights: a module of their own, as frameworks keep them,
    since their states shard over the ranks holding the same experts, not over all of DP x CP."""

    def __init__(self, case: MemoryCase, dtype: torch.dtype) -> None:
        super().__init__()
        self.gated = case.gated_mlp
        width = (2 if case.gated_mlp else 1) * case.expert_ffn
        self.up = _parameter(case.experts, case.hidden, width, dtype=dtype)
        self.down = _parameter(case.experts, case.expert_ffn, case.hidden, dtype=dtype)

    def forward(self, routed: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The experts' outputs, each row weighted by its router probability inside the activation."""
        return torch.bmm(_activation(torch.bmm(routed, self.up), self.gated, weights), self.down)


class MoE(nn.Module):
    """Router, top-k, ``experts`` expert MLPs of ``capacity`` rows each as batched matmuls, weighted combine;
    beside them any shared expert, a TP-split MLP of width ``ffn_hidden`` every token runs, as Megatron-Core's
    ``SharedExpertMLP`` on the same normalised input [Qwen-MoE]."""

    def __init__(self, case: MemoryCase, dtype: torch.dtype) -> None:
        super().__init__()
        self.case = case
        self.norm = RMSNorm(case.hidden, dtype, case.eager)
        self.router = _parameter(case.experts, case.hidden, dtype=dtype)
        self.experts = Experts(case, dtype)
        if case.ffn_hidden:
            self.shared_up = _parameter(
                (2 if case.gated_mlp else 1) * case.ffn_hidden, case.hidden, dtype=dtype
            )
            self.shared_down = _parameter(case.hidden, case.ffn_hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        case = self.case
        h = self.norm(x)
        if case.ffn_hidden:
            shared = _activation(_column(h, self.shared_up, case), case.gated_mlp)
            x = x + _row(shared, self.shared_down, case)
        if case.sequence_parallel and case.tp > 1:
            h = _GatherTokens.apply(h, case.tp)
        rows = h.reshape(-1, case.hidden)
        probs = F.linear(rows, self.router).float().softmax(-1)
        weights, chosen = probs.topk(case.experts_per_token, dim=-1)
        token_of, weight_of = _dispatch(chosen, weights, case.experts, case.capacity)
        routed = rows.index_select(0, token_of).view(case.experts, case.capacity, case.hidden)
        weights = weight_of.view(case.experts, case.capacity, 1).to(x.dtype)
        out = self.experts(routed, weights).view(-1, case.hidden)
        combined = _Combine.apply(out, token_of, rows.shape[0]).view(h.shape)
        if case.sequence_parallel and case.tp > 1:
            combined = _ScatterTokens.apply(combined, case.tp)
        return x + combined


class Layer(nn.Module):
    def __init__(self, case: MemoryCase, dtype: torch.dtype, dense: bool = False) -> None:
        super().__init__()
        self.attention = Attention(case, dtype)
        if dense:  # one of an MoE model's dense layers before its MoE ones
            self.mlp = MLP(case, dtype, case.dense_ffn)
        else:
            self.mlp = MoE(case, dtype) if case.experts else MLP(case, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attention(x))


class Embedding(nn.Module):
    """Vocab-parallel input embedding; reduce-scattered to the sequence-parallel residual stream."""

    def __init__(self, case: MemoryCase, dtype: torch.dtype) -> None:
        super().__init__()
        self.case = case
        self.weight = _parameter(case.vocab, case.hidden, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = F.embedding(ids, self.weight)
        return (
            _ScatterTokens.apply(x, self.case.tp) if self.case.sequence_parallel and self.case.tp > 1 else x
        )


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger-Kernel's fused linear cross-entropy [Liger]: in forward, chunk by chunk, logits, softmax minus
    one-hot in place, and their products into the gradients of the input and of the weight, which are kept
    for backward; the logits of one chunk live at a time and none are kept."""

    @staticmethod
    def forward(
        ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        grad_h, grad_weight = torch.empty_like(h), torch.zeros_like(weight)
        loss = h.new_zeros((), dtype=torch.float32)
        for start in range(0, h.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = h[rows] @ weight.t()
            lse = torch.logsumexp(logits, -1, keepdim=True)  # in the kernel: one pass, fp32 in registers
            loss += (lse.squeeze(1) - logits.gather(1, targets[rows, None]).squeeze(1)).float().sum()
            logits.sub_(lse).exp_().scatter_add_(1, targets[rows, None], -logits.new_ones(logits.shape[0], 1))
            torch.mm(logits, weight, out=grad_h[rows])
            grad_weight.addmm_(logits.t(), h[rows])
            del logits, lse
        ctx.save_for_backward(grad_h, grad_weight)
        return loss / h.shape[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_h, grad_weight = ctx.saved_tensors
        scale = grad / grad_h.shape[0]
        return grad_h.mul_(scale.to(grad_h.dtype)), grad_weight.mul_(scale.to(grad_weight.dtype)), None, None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-Core's vocab-parallel cross-entropy [Megatron-LM] (``tensor_parallel/cross_entropy.py``): on
    the fp32 logits it is given, the maximum subtracted, exp and the division by the sum in place, the softmax
    kept for backward, and the gradient made in that softmax in place; the TP all-reduces of the maximum and
    the sum are stood for by their (tokens,) results."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits.sub_(logits.amax(-1, keepdim=True))
        predicted = logits.gather(-1, targets[:, None]).squeeze(-1)
        logits.exp_()
        sum_exp = logits.sum(-1)
        loss = torch.log(sum_exp) - predicted
        logits.div_(sum_exp[:, None])
        ctx.save_for_backward(logits, targets)
        return loss.sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, targets = ctx.saved_tensors
        softmax.scatter_add_(-1, targets[:, None], -softmax.new_ones(softmax.shape[0], 1))
        return softmax.mul_(grad), None


class _FlashCrossEntropy(torch.autograd.Function):
    """flash-attn's cross-entropy [FlashAttention-CE] (``ops/triton/cross_entropy.py``) as InternEvo calls it,
    ``inplace_backward=True``: one Triton kernel a pass, stood for by what it writes. Forward reads the bf16
    logits and writes each row's fp32 loss and log-sum-exp, keeping the logits and the log-sum-exp; backward
    writes the gradient into the logits' own storage."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses = logits.new_empty(logits.shape[0], dtype=torch.float32)
        lse = logits.new_empty(logits.shape[0], dtype=torch.float32)
        ctx.save_for_backward(logits, lse, targets)
        return losses.sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, _, _ = ctx.saved_tensors
        return logits.mul_(grad), None


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor, case: MemoryCase) -> torch.Tensor:
    """The cross-entropy over bf16 ``logits`` (tokens x vocab) as the case's framework computes it."""
    if case.cross_entropy == "megatron":
        return _VocabParallelCrossEntropy.apply(logits.float(), targets)
    if case.cross_entropy == "flash":
        return _FlashCrossEntropy.apply(logits, targets)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def _chunk_loss(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, case: MemoryCase
) -> torch.Tensor:
    return _cross_entropy(F.linear(h, weight), targets, case)


class OutputHead(nn.Module):
    """Final norm, vocab-parallel output layer and cross-entropy: the ``loss`` category."""

    def __init__(self, case: MemoryCase, dtype: torch.dtype) -> None:
        super().__init__()
        self.case = case
        self.norm = RMSNorm(case.hidden, dtype, case.eager)
        self.weight = _parameter(case.vocab, case.hidden, dtype=dtype)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        case = self.case
        h = self.norm(x)
        if case.loss == "materialized":
            logits = _column(h, self.weight, case)
            return _cross_entropy(logits.flatten(0, 1), targets.flatten(), case) / targets.numel()
        if case.sequence_parallel and case.tp > 1:
            h = _GatherTokens.apply(h, case.tp)
        rows, labels = h.flatten(0, 1), targets.flatten()
        chunk = case.loss_chunk_tokens
        if case.loss == "fused":
            return _FusedLinearCrossEntropy.apply(rows, self.weight, labels, chunk)
        total = sum(
            checkpoint(
                _chunk_loss,
                rows[i : i + chunk],
                self.weight,
                labels[i : i + chunk],
                case,
                use_reentrant=False,
            )
            for i in range(0, rows.shape[0], chunk)
        )
        return total / rows.shape[0]


class Stage(nn.Module):
    """One pipeline stage of the model: the embedding if first, ``layers`` layers, the output head if last."""

    def __init__(self, case: MemoryCase, dtype: torch.dtype) -> None:
        super().__init__()
        self.embedding = Embedding(case, dtype) if case.input_embedding else None
        layers = (Layer(case, dtype, dense=i < case.dense_layers) for i in range(case.layers))
        self.layers = nn.ModuleList(
            Recomputed(layer) if case.recompute == "full" else layer for layer in layers
        )
        self.head = OutputHead(case, dtype) if case.output_layer else None

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x, targets) if self.head is not None else x


# ---------------------------------------------------------------------------------------------------------
# The optimizer side.


class _ForeachAdamW(torch.optim.AdamW):
    """torch's foreach AdamW (``_multi_tensor_adam``, decoupled weight decay) as the foreach ops it runs, in
    its order [PyTorch-AdamW]: the moments updated in place, then ``exp_avg_sq_sqrt = _foreach_sqrt(...)``
    made whole, divided and added to in place, and the update added into the parameters. torch's own reads
    the step count with ``.item()``, which a fake tensor cannot answer; the step is counted in Python here,
    and what is allocated is the same."""

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002 - torch's signature
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            states = [self.state[p] for p in params]
            grads = [p.grad for p in params]
            exp_avgs = [s["exp_avg"] for s in states]
            exp_avg_sqs = [s["exp_avg_sq"] for s in states]
            self._steps = getattr(self, "_steps", 0) + 1
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
            step_size = group["lr"] / (1 - beta1**self._steps)
            exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(exp_avg_sq_sqrt, math.sqrt(1 - beta2**self._steps))
            torch._foreach_add_(exp_avg_sq_sqrt, group["eps"])
            torch._foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, -step_size)


def _adamw(stepped: list[torch.Tensor], case: MemoryCase) -> torch.optim.AdamW:
    """AdamW, fused or foreach as the case says, with its moments made now in the case's dtype (counted as
    ``optimizer``); the optimizers step it among ``temporaries``, which foreach's square root is."""
    dtype = DTYPES[case.optimizer_dtype]
    if case.optimizer_kernel == "foreach":
        optimizer = _ForeachAdamW(stepped, foreach=True)
    else:
        optimizer = torch.optim.AdamW(stepped, fused=True)
    with _making("optimizer"):
        for tensor in stepped:
            optimizer.state[tensor] = {
                "step": torch.zeros((), dtype=torch.float32),
                "exp_avg": torch.zeros_like(tensor, dtype=dtype),
                "exp_avg_sq": torch.zeros_like(tensor, dtype=dtype),
            }
    return optimizer


def _master(flat: torch.Tensor, numel: int, case: MemoryCase) -> torch.Tensor:
    """The optimizer's master copy of the first ``numel`` flat parameters (the rank's ZeRO-1 share), in the
    case's master dtype (counted as ``optimizer``)."""
    with _making("optimizer"):
        master = torch.empty(numel, dtype=DTYPES[case.master_dtype])
        master.copy_(flat[:numel])
    return master


def _buckets(stage: Stage, case: MemoryCase) -> list[tuple[list[nn.Parameter], int]]:
    """The stage's parameters as Megatron-LM buffers them, each with the ranks its states shard over: the
    dense ones over DP x CP, the experts' apart over the ranks that hold the same experts."""
    experts = {
        id(p) for module in stage.modules() if isinstance(module, Experts) for p in module.parameters()
    }
    params = list(stage.parameters())
    dense = [p for p in params if id(p) not in experts]
    routed = [p for p in params if id(p) in experts]
    return [
        (group, shards)
        for group, shards in ((dense, case.shard_group), (routed, case.expert_shards))
        if group
    ]


def _flat_parameters(params: list[nn.Parameter], dtype: torch.dtype) -> torch.Tensor:
    """Make every parameter a view of one buffer, in order, as Megatron-LM's ``ParamAndGradBuffer`` keeps
    them, and return it."""
    flat = torch.empty(sum(p.numel() for p in params), dtype=dtype)
    start = 0
    for p in params:
        p.data = flat[start : start + p.numel()].view_as(p)
        start += p.numel()
    return flat


class _MegatronOptimizer:
    """Megatron-LM's DDP gradient buffer and distributed optimizer [Megatron-LM], [ZeRO]: backward adds each
    parameter's gradient into a persistent ``grad_dtype`` buffer (its 1/shard_group shard from ZeRO-2, the
    reduce-scatter); AdamW steps the master copy (1/shard_group of the flat parameters from ZeRO-1), whose
    gradient is that buffer's shard cast to the master dtype (a view when they match); the updated shard is
    copied back into the parameter buffer in place (the all-gather)."""

    def __init__(self, case: MemoryCase, params: list[nn.Parameter], flat: torch.Tensor, shards: int) -> None:
        self.params, self.flat = params, flat
        shard = -(-flat.numel() // shards)
        with _making("gradients"):
            self.grads = torch.zeros(shard if case.zero >= 2 else flat.numel(), dtype=DTYPES[case.grad_dtype])
        self.grad_views = []
        start = 0
        for p in params:
            covered = min(p.numel(), self.grads.numel() - start)
            view = self.grads[start : start + covered] if covered > 0 else None
            if covered == p.numel():
                view = view.view_as(p)
            self.grad_views.append(view)
            p.register_post_accumulate_grad_hook(self._adder(view))
            start += p.numel()
        self.master = None
        if case.master_dtype:
            self.master = _master(flat, shard if case.zero >= 1 else flat.numel(), case)
        self.optimizer = _adamw([self.master] if self.master is not None else params, case)

    @staticmethod
    def _adder(view: torch.Tensor | None):
        def add(p: nn.Parameter) -> None:
            if view is not None:
                view.add_(p.grad if view.shape == p.shape else p.grad.view(-1)[: view.numel()])
            p.grad = None

        return add

    def step(self) -> None:
        if self.master is None:
            for p, view in zip(self.params, self.grad_views):
                p.grad = view
        else:
            with _making("temporaries"):
                self.master.grad = self.grads[: self.master.numel()].to(self.master.dtype)
        with _making("temporaries"):
            self.optimizer.step()
        with torch.no_grad():
            if self.master is not None:
                self.flat[: self.master.numel()].copy_(self.master)
                self.master.grad = None
            self.grads.zero_()
        for p in self.params:
            p.grad = None


class _HybridZeroOptimizer:
    """InternEvo's HybridZeroOptimizer on one data-parallel rank [InternEvo]: the backward leaves each
    parameter's gradient in its own dtype, and nothing keeps them between steps; the step flattens them into one
    buffer and drops them, casts that to the master copy's dtype as its gradient (dropping the flat one), steps
    the flat master and copies it back into the parameters."""

    def __init__(self, case: MemoryCase, params: list[nn.Parameter], flat: torch.Tensor) -> None:
        self.params, self.flat = params, flat
        self.master = _master(flat, flat.numel(), case)
        self.optimizer = _adamw([self.master], case)

    def step(self) -> None:
        with _making("temporaries"):
            grads = [p.grad.reshape(-1) for p in self.params]
            for p in self.params:
                p.grad = None
            flat = torch.cat(grads)
            del grads
            self.master.grad = flat.to(self.master.dtype)
            del flat
            self.optimizer.step()
        with torch.no_grad():
            self.flat.copy_(self.master)
        self.master.grad = None


class _Optimizers(NamedTuple):
    """One optimizer a buffer, stepped together."""

    each: list[_MegatronOptimizer | _HybridZeroOptimizer]

    def step(self) -> None:
        for optimizer in self.each:
            optimizer.step()


class _FSDPOptimizer:
    """AdamW over FSDP2's sharded parameters (the master copy when their dtype differs from the compute one)."""

    def __init__(self, case: MemoryCase, params: list[nn.Parameter]) -> None:
        self.optimizer = _adamw(params, case)
        # One step on zero gradients now: DTensor's first dispatch of each op propagates shardings by running
        # it on fake tensors of the global shape, in this same fake mode, so the tracker would count them.
        # The propagation is cached, and the step measured later makes none.
        for p in params:
            p.grad = torch.zeros_like(p)
        self.step()

    def step(self) -> None:
        with _making("temporaries"):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------------------
# The step.


@contextmanager
def _fake_world(case: MemoryCase, device: str = "cpu") -> Iterator[object]:
    """A fake-tensor mode, and for FSDP2 a fake process group of ``shard_group`` ranks with its device meshes
    (built before the mode, which cannot run the mesh's checks): all of them, and the experts' shard group;
    gc paused, so that storages are freed when their last reference goes, as they are on a device, and never
    mid-step. On any other device the tensors are real ones there instead: ``"cuda"``, or ``"cpu:0"`` (real
    CPU tensors, which the suite holds to the fake ones); no process group, so FSDP cases run fake only."""
    if device != "cpu":
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.device(device):
                yield None
        finally:
            if was_enabled:
                gc.enable()
        return
    meshes = None
    if case.fsdp:
        if dist.is_initialized():
            raise InputError("fsdp", "measure makes its own fake process group; one is already initialised")
        dist.init_process_group("fake", rank=0, world_size=case.shard_group, store=FakeStore())
        mesh = init_device_mesh("cpu", (case.shard_group,))
        experts = case.expert_shards
        if experts != case.shard_group:
            shape = (case.shard_group // experts, experts)
            meshes = mesh, init_device_mesh("cpu", shape, mesh_dim_names=("ep", "experts"))["experts"]
        else:
            meshes = mesh, mesh
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with FakeTensorMode():
            yield meshes
    finally:
        if was_enabled:
            gc.enable()
        if case.fsdp:
            dist.destroy_process_group()


def _shard(stage: Stage, case: MemoryCase, meshes) -> None:
    """``fully_shard`` each layer's experts over their shard group, each layer, the embedding, the head and
    the stage, as torchtitan does. The experts' stacked weights shard on their second dimension: a rank may
    hold fewer experts than the group has ranks, and sharding on the first would leave most ranks a padded
    row and the rest whole experts."""
    mesh, expert_mesh = meshes
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[case.param_dtype], reduce_dtype=DTYPES[case.grad_dtype])
    for experts in (m for m in stage.modules() if isinstance(m, Experts)):
        fully_shard(
            experts,
            mesh=expert_mesh,
            mp_policy=policy,
            reshard_after_forward=case.reshard_after_forward,
            shard_placement_fn=lambda _: Shard(1),
        )
    parts = [*stage.layers, stage.embedding, stage.head]
    for part in (p for p in parts if p is not None):
        fully_shard(part, mesh=mesh, mp_policy=policy, reshard_after_forward=case.reshard_after_forward)
    fully_shard(stage, mesh=mesh, mp_policy=policy, reshard_after_forward=case.reshard_after_forward)


def _inputs(case: MemoryCase) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (or the hidden states received from the previous stage) and the targets."""
    targets = torch.zeros(case.micro_batch, case.tokens, dtype=torch.long)
    if case.input_embedding:
        return torch.zeros(case.micro_batch, case.tokens, dtype=torch.long), targets
    shape = (case.micro_batch, case.residual_tokens, case.hidden)
    return torch.empty(shape, dtype=DTYPES[case.param_dtype], requires_grad=True), targets


def _iteration(case: MemoryCase, stage: Stage, optimizer, tracker: _Attributed) -> None:
    """``in_flight`` forwards keeping their graphs and their backwards, ``rounds`` times, then the optimizer
    step."""
    for last in (index == case.rounds - 1 for index in range(case.rounds)):
        _micro_batches(case, stage, tracker, last)
    _Now.phase, _Now.place = "optimizer", "step"
    optimizer.step()


def _micro_batches(case: MemoryCase, stage: Stage, tracker: _Attributed, last_round: bool) -> None:
    """``in_flight`` forwards keeping their graphs, then their backwards."""
    _Now.phase = "forward"
    steps = []
    for _ in range(case.in_flight):
        _Now.place = "start"
        tracker.reset_mod_stats()  # MemTracker refuses a second forward of a root module otherwise
        x, targets = _inputs(case)
        out = stage(x, targets)
        if not case.output_layer:  # sent on; Megatron-LM's deallocate_output_tensor keeps only the graph
            out.data = torch.empty((1,), dtype=out.dtype)
        steps.append((x, out))
    del x, out
    _Now.phase = "backward"
    # FSDP without resharding runs under a pipeline: torch.distributed.pipelining's stages reduce the gradients
    # only in the last micro-batch's backward, accumulating them unsharded before [PyTorch-Pipelining].
    accumulate = case.fsdp and not case.reshard_after_forward and case.in_flight * case.rounds > 1
    while steps:
        x, out = steps.pop(0)
        if accumulate:
            stage.set_requires_gradient_sync(last_round and not steps)
            stage.set_reshard_after_backward(last_round and not steps)
        if case.output_layer:
            with _making("loss"):  # d loss / d loss = 1
                ones = torch.ones_like(out)
            out.backward(ones)
            del ones
        else:
            with _making("temporaries"):  # the gradient received from the next stage
                grad = torch.empty((case.micro_batch, case.residual_tokens, case.hidden), dtype=out.dtype)
            # The output's data is gone: call the engine directly, as Megatron-LM's custom_backward does.
            torch.autograd.Variable._execution_engine.run_backward(
                (out,), (grad,), False, False, (), True, accumulate_grad=True
            )
            del grad
        if x.requires_grad:  # received: its gradient is sent back and both are freed, explicitly, as module
            x.grad = None  # tracking's hook on a leaf input keeps the tensor object alive for good
            x.data = torch.empty((0,), dtype=x.dtype)
        del x, out


# A stage deeper, or with more micro-batches in flight, is measured at these and extrapolated (see measure).
MEASURED = {"layers": (4, 5), "in_flight": (2, 3)}


def measure(
    case: MemoryCase, *, full: bool = False, warmup: bool = False, device: str = "cpu"
) -> MemoryMeasurement:
    """The peak bytes of one device in a training iteration of ``case``, on fake tensors.

    ``device="cuda"`` runs the same iteration whole on real tensors of a CUDA device, to hold the fake-tensor
    figure to what the caching allocator reports (``benchmarks/memory_reference.py --cuda``; ``"cpu:0"`` does
    it on real CPU tensors): ZeRO-3/FSDP cases, which need a process group, are refused on any real device,
    and GQA on CUDA, whose FlashAttention op wants as many K/V heads as query heads.

    A stage deeper than five layers is run with four and with five, and extrapolated to ``layers``; so are
    more than three micro-batches in flight from two and three. ``full=True`` runs the whole case instead
    (python time grows by some 50 ms a layer and micro-batch, FSDP's twice that). Why it is exact: layers
    are identical, so what one holds at a point of its own forward or backward (its working set, FSDP's
    gathered parameters) is the same in every layer, and what the rest of the stage holds then grows by the
    same amount per layer before it (activations kept) and per layer after it (gradients, FSDP's sharded
    ones); the optimizer step holds all of them. So the step is cut into parts: a phase (forward, backward,
    step) at one place of the stage (the embedding, the head, the first, second, second-to-last and last
    layer, and the layers between, known while they run from module tracking, the moments between two
    modules given to the last), and each part's peak bytes and their breakdown are affine in the depth,
    which two depths fix. A layer between the second and the second-to-last peaks no higher than one of
    those two (its peak is linear in its index), so that part is left out, and the stage's peak is the
    largest of the others. Micro-batches are identical too: a part peaks in the last one's forward and the
    first one's backward, holding what each of the others keeps, so the same holds of their number from two
    on (one is both first and last: under FSDP without resharding the first forward gathers what the later
    ones reuse); the two together are bilinear, which four runs fix. Exact to the byte (the tests compare full runs), but
    for a ZeRO-1/2 shard of the flat buffers, ceil(parameters / shard_group), whose rounding moves by under
    16 x shard_group bytes.

    The optimizer's states are made before the iteration, so a warm-up iteration (MemTracker's documented
    pattern, for states made by the first step) changes nothing; ``warmup=True`` runs one, to show it.
    """
    # Gradients accumulated unsharded over a pipeline's micro-batches (FSDP without resharding) make the
    # first micro-batch's backward unlike the others': such a stage is run whole.
    accumulating = case.fsdp and not case.reshard_after_forward and case.in_flight * case.rounds > 1
    if device != "cpu":
        if case.fsdp:
            raise InputError(
                "fsdp", "ZeRO-3 is measured on fake tensors only (its process group is a fake one)"
            )
        if torch.device(device).type == "cuda" and case.kv_heads != case.heads:
            raise InputError(
                "kv_heads", f"on {device}, FlashAttention's op needs kv_heads = heads = {case.heads}"
            )
        total, parts, moment = _run(case, warmup, device).peak
        return MemoryMeasurement(total, parts, moment)
    if full or accumulating or all(getattr(case, name) <= points[-1] for name, points in MEASURED.items()):
        tracker = _run(case, warmup, replay=True)
        total, parts, moment = tracker.peak
        return MemoryMeasurement(total, parts, moment, tracker.reserved)
    (moment, _), peak = min(_peaks(case, warmup).items(), key=lambda item: (-item[1].bytes, item[1].op))
    return MemoryMeasurement(peak.bytes, peak.by_category, moment)


def stages_peak(stages: dict[str, dict], *, reserved: bool = False) -> tuple[str, MemoryMeasurement]:
    """The largest peak of a job's stages (``costmodel.training.memory.reference_cases``: their
    :class:`MemoryCase` fields by where they are), and where; its ``reserved_bytes`` the most any stage
    reserves. ``reserved``: with the caching allocator's replayed reservation, each stage run whole over two
    iterations (seconds a stage, where the peak alone is extrapolated from shallower runs in a second); a
    ZeRO-3 stage, which the replay cannot place, is not."""
    measured = {}
    for where, fields in stages.items():
        case = MemoryCase(**fields)
        whole = reserved and not case.fsdp
        measured[where] = measure(case, full=whole, warmup=whole)
    where, peak = max(measured.items(), key=lambda item: item[1].peak_bytes)
    each = [m.reserved_bytes for m in measured.values()]
    most = None if None in each else max(each)  # type: ignore[type-var]
    return where, replace(peak, reserved_bytes=most)


def _peaks(case: MemoryCase, warmup: bool) -> dict[tuple[str, object], _Peak]:
    """Each part's peak, extrapolated along each of :data:`MEASURED` beyond its points (the op count from the
    larger run: it only orders equal peaks, and parts come in the same order at every size)."""
    for name, (low, high) in MEASURED.items():
        if getattr(case, name) > high:
            at_low, at_high = (_peaks(replace(case, **{name: n}), warmup) for n in (low, high))
            extra = getattr(case, name) - low
            peaks = {}
            for part in at_low.keys() & at_high.keys():
                a, b = at_low[part].by_category, at_high[part].by_category
                parts = {key: a[key] + extra * (b[key] - a[key]) for key in CATEGORIES}
                peaks[part] = _Peak(sum(parts.values()), parts, at_high[part].op)
            return peaks
    return _run(case, warmup).peaks


def _run(case: MemoryCase, warmup: bool, device: str = "cpu", replay: bool = False) -> _Attributed:
    """The tracker after one iteration of ``case`` (or two: the peaks are the second's); with ``replay``, the
    caching allocator's peak reservation over the whole run (``reserved``) where it can be replayed (a
    quarter more time: only a case measured whole uses it)."""
    replaying = replay and device == "cpu" and not case.fsdp
    with (
        _fake_world(case, device) as meshes,
        warnings.catch_warnings(),
        Replay(_thread) if replaying else contextlib.nullcontext() as replayed,
    ):
        # MemTracker's post-accumulate hook runs after ours has moved the gradient out, and warns at None.
        warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
        stage = Stage(
            case, DTYPES[case.master_dtype or case.param_dtype] if case.fsdp else DTYPES[case.param_dtype]
        )
        tracker = _tracker(case, stage, meshes)
        buffers = (
            []
            if case.fsdp
            else [
                (*bucket, _flat_parameters(bucket[0], DTYPES[case.param_dtype]))
                for bucket in _buckets(stage, case)
            ]
        )
        if not case.fsdp:
            tracker.track_external(stage)
        with tracker:
            _Now.phase = "optimizer"
            optimizer = (
                _FSDPOptimizer(case, list(stage.parameters()))
                if case.fsdp
                else _Optimizers(
                    [
                        _MegatronOptimizer(case, params, flat, shards)
                        if case.grad_buffer
                        else _HybridZeroOptimizer(case, params, flat)
                        for params, shards, flat in buffers
                    ]
                )
            )
            del buffers
            for _ in range(2 if warmup else 1):
                gc.collect(1)
                tracker.reset_peak()
                _iteration(case, stage, optimizer, tracker)
        tracker.reserved = replayed.allocator.peak_reserved if replayed is not None else None
        return tracker


def _thread() -> str:
    """The thread that would run the step's GEMMs now: autograd's in backward, else the caller's."""
    return "autograd" if _Now.phase == "backward" else "caller"


def _tracker(case: MemoryCase, stage: Stage, meshes) -> _Attributed:
    """MemTracker, or FSDPMemTracker over the stage after ``fully_shard``; with the report's attribution."""
    if case.fsdp:
        _shard(stage, case, meshes)
        tracker: _Attributed = _FSDPTracker(stage)
    else:
        tracker = _Tracker()
    tracker._attribute(case.layers, "optimizer" if case.fsdp and case.master_dtype else "weights")
    return tracker


def timed(case: MemoryCase, *, full: bool = False) -> tuple[MemoryMeasurement, float]:
    """:func:`measure` and its wall time in seconds."""
    start = time.perf_counter()
    result = measure(case, full=full)
    return result, time.perf_counter() - start
