"""The report's schema: what ``cp-plan --format json`` prints (docs/json.md).

Stable and versioned by the top-level ``schema``. All values in SI units (bytes, FLOP, seconds,
FLOP/byte), unrounded. docs/json-schema.md is generated from these models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from costmodel.core.intervals import Interval
from costmodel.plans.inputs import Pass, PlanInputs, TrainingSetup
from costmodel.plans.verdict import Colour

SCHEMA = (
    "cp-plan/report/v5"  # v2: inputs.cp, the CP degree, was inputs.n; v3: verdict.comm_ratio_step_kernel;
)
# v4: verdict.{intensity_step, n_max, n_max_green, n_max_amber, critical_shard_tokens}, the pass's (the band
# edges were ring.n_max_green and ring.n_max_amber, the forward's); v5: hardware.changed, what the command line
# changed in the profile


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


class Hardware(_Section):
    """The profile's figures this plan uses: the dtype's FLOP/s and the link the ring waits on."""

    name: str = Field(description="profile name")
    source: str = Field(description="datasheet or measured")
    peak_flops: float = Field(description="FLOP/s, dense, for the dtype")
    effective_flops: float = Field(description="FLOP/s the model uses: measured, or peak x efficiency")
    link: str = Field(description="the link the ring waits on")
    link_scope: str = Field(description="intra-node or inter-node")
    link_bandwidth: float = Field(description="B, bytes/s per direction")
    latency: float = Field(description="alpha, s per message")
    beta: float = Field(description="effective FLOP/s / B, FLOP/byte")
    beta_peak: float = Field(description="peak FLOP/s / B, FLOP/byte (β of [A-RingCost §4])")
    devices_per_node: int = Field(description="accelerators per node")
    cp_ranks_per_node: int = Field(description="consecutive CP ranks sharing a node")
    topology: str = Field(
        default="", description="the fast domain's shape and size, and how devices reach the fabric beyond it"
    )
    attention_kernel: str = Field(
        default="flash",
        description="the attention kernel whose tables the layer's calls read (flash: the profile's default)",
    )
    changed: str = Field(
        default="",
        description="what the command line changed in the profile (its memory, clock, links or placement); "
        "empty when nothing",
    )


class Memory(_Section):
    """Memory tiers of one layer ([A-RingCost §1]): attention temporaries at three granularities, ring buffers."""

    scores_full_bytes: float = Field(description="b·h·S²·p, full score matrix")
    scores_query_block_bytes: float = Field(description="b·h·s_blk·S·p, query block x all keys")
    scores_tile_bytes: float = Field(description="b·h·s_blk²·p, one tile")
    kv_block_bytes: float = Field(description="b·L·2·n_kv·d·p, the KV block in flight")
    kv_tile_bytes: float = Field(description="b·s_blk·2·n_kv·d·p, the KV of one tile")
    softmax_state_bytes: float = Field(description="fp32 (m, l, O) of one shard's queries")


class Compute(_Section):
    """Attention FLOP of one layer ([A-RingCost §2, §4]); causal counts the useful half."""

    total_flops: float = Field(description="one layer, all devices (causal: useful half)")
    device_flops_per_layer: float = Field(description="W")
    step_flops: float = Field(description="W_step")


class Ring(_Section):
    """Ring attention: traffic, intensity, times, the verdict and the limits on N ([A-RingCost §4, §11])."""

    recv_bytes_per_layer: float = Field(description="C_recv = (N-1) blocks")
    send_bytes_per_layer: float = Field(description="N blocks, counting the own one")
    step_recv_bytes: float = Field(description="one KV block, b·L·2·n_kv·d·p")
    intensity_step: float = Field(description="FLOP/byte; causal halves it")
    intensity_layer: float | None = Field(description="FLOP/byte; null at N = 1 (nothing received)")
    step_compute_s: float = Field(description="balanced step compute, W_step / F [A-RingCost §4]")
    step_comm_s: float = Field(description="alpha + block / B")
    layer_compute_s: float = Field(description="balanced layer compute, W / F [A-RingCost §4]")
    layer_comm_s: float = Field(description="receive side, N-1 blocks")
    layer_send_s: float = Field(description="send side counting the own block")
    comm_ratio_step: float = Field(description="the verdict's ratio, at effective FLOP/s")
    comm_ratio_step_peak: float = Field(description="the same at peak FLOP/s")
    comm_ratio_layer: float = Field(description="layer receive / layer compute")
    verdict: Colour = Field(description="band of comm_ratio_step: green < 5 %, amber <= 15 %, red above")
    verdict_text: str = Field(description="what the band means")
    n_max: float = Field(description="largest N with ratio <= 100 % on this plan's link ([A-RingCost §4])")
    n_max_intra_node: float | None = Field(description="the bound with the intra-node link")
    n_max_inter_node: float | None = Field(description="the bound with the inter-node link")
    critical_shard_tokens: float = Field(description="L*: shard length where step comm = step compute")
    layer_time_s: float = Field(
        description="predicted layer wall time: the pairs each rank sees at each step in this layout, "
        "transfers overlapped"
    )
    layer_compute_kernel_s: float = Field(
        description="the layer's compute at the rates layer_time_s reads (kernel tables; peak x efficiency "
        "when asked), the schedule's slowest rank per step"
    )
    step_compute_kernel_s: float = Field(description="layer_compute_kernel_s / N: a ring step at those rates")


class Backward(_Section):
    """The ring's backward pass ([Korthikanti22]): 2.5x the forward FLOP; K, V and fp32 dK/dV travel."""

    step_flops: float = Field(description="2.5 x the forward step (FlashAttention-2 count)")
    step_recv_bytes: float = Field(description="KV block plus its fp32 dK/dV accumulator")
    recv_bytes_per_layer: float = Field(description="N-1 KV blocks and N dK/dV blocks")
    intensity_step: float = Field(description="FLOP/byte")
    step_compute_s: float
    step_comm_s: float
    layer_compute_s: float
    step_compute_kernel_s: float = Field(
        description="a backward ring step at the kernel rates the layer time reads (as the forward's)"
    )
    comm_ratio_step: float = Field(description="backward step receive / step compute")
    verdict: Colour
    critical_shard_tokens: float = Field(description="backward L*")


class Verdict(_Section):
    """The headline: the band of the step comm ratio for the chosen pass (the worse one for fwd+bwd)."""

    model_config = ConfigDict(frozen=True, defer_build=True, populate_by_name=True)

    pass_: Pass = Field(alias="pass", description="fwd, bwd, or fwd+bwd")
    comm_ratio_step: float = Field(
        description="max over the pass's phases, with compute balanced at effective FLOP/s: the bound the "
        "band is read on"
    )
    verdict: Colour
    text: str
    comm_ratio_step_kernel: float | None = Field(
        None,
        description="the same ratio with compute at the kernel rates the layer time and the timeline read "
        "(ring.step_compute_kernel_s, backward.step_compute_kernel_s); below 1 a transfer hides under its step "
        "when overlapped; null at N = 1",
    )
    intensity_step: float = Field(
        description="step arithmetic intensity, FLOP per received byte, of the phase the ratio is of"
    )
    n_max: float = Field(
        description="real N where the pass's step comm reaches its compute on this plan's link (fwd+bwd: the "
        "lower of the two phases'; ring.n_max is the forward's)"
    )
    n_max_green: int = Field(description="largest N whose pass ratio stays below 5 %, topology included")
    n_max_amber: int = Field(
        description="largest N whose pass ratio stays at or below 15 %, topology included"
    )
    critical_shard_tokens: float = Field(
        description="L* of the pass: the shortest shard that hides every phase's transfer (fwd+bwd: the longer)"
    )


class Ulysses(_Section):
    """DeepSpeed-Ulysses all-to-all over the same N devices [Ulysses], for the plan's pass."""

    feasible: bool = Field(description="h mod N = 0 and n_kv splits or replicates evenly")
    reason: str = Field(description="why, in one sentence")
    kv_heads: int | None = Field(description="KV heads after replication to N")
    recv_bytes_per_layer: float | None = Field(description="all-to-all receive bytes for the pass")
    comm_s: float | None = Field(
        description="the all-to-alls (Q, K, V in; O out) for the pass; not overlapped"
    )
    comm_ratio: float | None = Field(description="comm_s / attention compute of the pass")
    verdict: Colour | None = Field(description="band of comm_ratio")
    link_scope: str = Field(description="intra-node or inter-node")


class USPEntry(_Section):
    """One factorisation N = N_u x N_r of USP ([USP §3]); N_u = 1 is the ring, N_r = 1 is Ulysses."""

    n_ulysses: int = Field(description="N_u: all-to-all degree, inside a node where it fits")
    n_ring: int = Field(description="N_r: ring degree")
    feasible: bool = Field(description="the Ulysses rule at degree N_u")
    reason: str = Field(description="why, in one sentence")
    kv_heads: int | None = Field(description="KV heads after replication to N_u")
    a2a_recv_bytes_per_layer: float | None = Field(description="all-to-all part")
    ring_recv_bytes_per_layer: float | None = Field(description="ring part")
    recv_bytes_per_layer: float | None = Field(description="both parts")
    a2a_comm_s: float | None = Field(description="both all-to-alls, not overlapped")
    ring_comm_ratio_step: float | None = Field(
        description="ring step receive / step compute; null at N_r = 1"
    )
    ring_verdict: Colour | None = Field(description="band of ring_comm_ratio_step")
    comm_s: float | None = Field(description="all-to-all and ring communication for the pass, per layer")
    comm_ratio: float | None = Field(
        description="ring step ratio + all-to-all time / compute: the verdict's ratio"
    )
    verdict: Colour | None = Field(description="band of comm_ratio")
    a2a_link_scope: str = Field(description="intra-node, inter-node, or none at N_u = 1")
    ring_link_scope: str = Field(description="intra-node, inter-node, or none at N_r = 1")


class Scheme(_Section):
    """One row of the scheme comparison that `cp-plan` prints and `recommend` ranks, for the plan's pass."""

    scheme: str = Field(description="ring, usp or ulysses")
    label: str = Field(description="ring, USP N_u x N_r, or Ulysses")
    n_ulysses: int = Field(description="N_u, the all-to-all degree")
    n_ring: int = Field(description="N_r, the ring degree")
    layout: str | None = Field(description="the ring's layout; null for Ulysses")
    feasible: bool
    reason: str
    recv_bytes_per_layer: float | None = Field(description="bytes a device receives per layer for the pass")
    comm_s: float | None = Field(description="communication time per layer for the pass, all of it")
    comm_ratio: float | None = Field(description="the verdict's ratio (see docs/formulas.md, schemes)")
    verdict: Colour | None
    layer_time_s: float | None = Field(description="predicted layer wall time for the pass (time model)")
    exposed_comm_s: float | None = Field(description="of which communication nothing hides")
    a2a_link_scope: str
    ring_link_scope: str


class TP(_Section):
    """Tensor parallelism's activation traffic for comparison ([A-RingCost §13])."""

    bytes_per_layer: float = Field(description="4·b·S·h·d·p")
    ratio_to_ring: float | None = Field(description="null at N = 1")


class LayoutUtilization(_Section):
    """Causal utilisation per layout from the tile-level simulator."""

    contiguous: float | None = Field(description="rank i holds [iL, (i+1)L)")
    striped: float | None = Field(description="rank i holds i, i+N, ...")
    zigzag: float | None = Field(description="null when S does not split into 2N chunks")


class Causal(_Section):
    """Causal load balance ([A-RingCost §6], [Striped §3]), reported whether or not --causal is set."""

    utilization_coarse: float = Field(description="(N+1)/2N, [A-RingCost §6]")
    utilization_fine: float = Field(description="N/(2N-1), [A-RingCost §6]")
    tile: int = Field(
        description="tile of the simulator: --block, or the finest multiple of it whose arrays fit in memory"
    )
    utilization: LayoutUtilization = Field(description="tile-level simulator, [Striped §3]")


class PackingBranch(_Section):
    """One branch of a packed window ([A-RingCost §5]): what the kernel executes and what it means for CP."""

    executed_flops: float = Field(description="FLOP one layer executes, all devices (forward)")
    device_flops_per_layer: float = Field(description="executed FLOP per device per layer, mean")
    executed_share: float = Field(description="E_m / E_w: executed tiles over the plain causal window's")
    useful_share: float = Field(description="useful FLOP / executed FLOP")
    compute_fraction: float = Field(description="c_x, the c every formula of this branch uses")
    intensity_step: float = Field(description="FLOP/byte of a mean step: falls with the executed work")
    comm_ratio_step: float = Field(description="step receive / mean step compute")
    verdict: Colour = Field(description="band of comm_ratio_step")


class PackedLayoutRow(_Section):
    """One layout of the packed window under the plan's branch, forward ([A-RingCost §5], [Striped §3])."""

    layout: str = Field(
        description="window-level contiguous/striped/zigzag, or per-document doc-striped/doc-zigzag"
    )
    feasible: bool = Field(description="S splits evenly (window-level layouts need N or 2N to divide S)")
    utilization_dense: float | None = Field(
        description="useful / (N x sum of the slowest rank's executed pairs), dense"
    )
    utilization_varlen: float | None = Field(description="the same, varlen")
    balance: float | None = Field(
        description="sum over steps of the mean rank's varlen work / the slowest rank's: how even the useful work lies"
    )
    rank_executed_flops: list[float] | None = Field(description="executed FLOP per rank, plan's branch")
    rank_useful_flops: list[float] | None = Field(description="useful FLOP per rank")
    step_slowest_s: list[float] | None = Field(
        description="the slowest rank's compute per ring step, plan's branch"
    )
    step_comm_s: float | None = Field(description="the KV transfer under each step but the last")
    waiting_steps: int | None = Field(
        description="steps whose slowest rank computes for less than the transfer"
    )
    idle_steps: int | None = Field(description="steps no rank has work in: pure waiting, or skippable")
    exposed_s: float | None = Field(description="communication left exposed per layer, forward")
    layer_time_s: float | None = Field(description="forward layer time (time model)")


class LongTail(_Section):
    """The long tail locks the CP degree ([A-RingCost §5]): N is set by the longest document's activations."""

    longest_doc_tokens: int
    rest_longest_doc_tokens: int = Field(description="the longest of the other documents (0: none)")
    n_longest: int = Field(description="CP degree the longest document needs alone at S/N tokens per device")
    n_rest: int = Field(description="CP degree the rest of the batch needs")
    dynamic_recv_share: float | None = Field(
        description="share of the ring's KV traffic left with dynamic CP per micro-batch; null at N = 1"
    )
    dynamic_recv_bytes_saved_per_layer: float | None = Field(
        description="per device, what dynamic CP would not send; null at N = 1"
    )


class Packing(_Section):
    """Packed documents: the window described, both branches, the layouts and the long-tail lock."""

    source: str = Field(description="where the lengths came from")
    rule: str = Field(description="how documents are packed into windows")
    documents: int
    tokens: int = Field(description="document tokens over all windows")
    windows: int = Field(description="windows of S the documents fill")
    window: int = Field(description="the window described: the one holding the longest document")
    window_documents: int
    window_tokens: int = Field(description="document tokens in it; the rest is padding")
    branch: str = Field(description="the plan's branch (--packing): its numbers are the report's")
    useful_flops: float = Field(description="FLOP of the visible pairs, one layer, all devices")
    dense: PackingBranch
    varlen: PackingBranch
    layouts: list[PackedLayoutRow]
    long_tail: LongTail


class LayerType(_Section):
    """Global or local (sliding-window / chunked) layers of a model that alternates them."""

    kind: str = Field(description="global or local")
    compute_fraction: float = Field(description="c of this layer type, plan's layout and branch")
    comm_ratio_step: float = Field(description="step receive / mean step compute")
    verdict: Colour
    n_max: float = Field(description="largest N with ratio <= 100 %, at this layer's compute fraction")
    skippable_steps: int = Field(description="ring steps no rank has work in (their transfer can be skipped)")


class MaskSection(_Section):
    """The mask the plan's kernel runs ([A-RingCost §5]): documents, window, chunk."""

    causal: bool
    documents: bool = Field(description="a block-diagonal document mask (varlen honours it, dense blanks it)")
    window: int | None = Field(description="sliding window W, tokens")
    chunk: int | None = Field(description="aligned chunk C, tokens")
    skippable_steps: int = Field(description="ring steps with no work on any rank, plan's layout and branch")
    layer_types: list[LayerType] = Field(
        description="global and local layers, when --window or --attention-chunk is set"
    )


class Report(_Section):
    """Everything `cp-plan --format json` prints for one plan."""

    model_config = ConfigDict(frozen=True, defer_build=True, populate_by_name=True)

    schema_: str = Field(SCHEMA, alias="schema", description="contract version")
    inputs: PlanInputs
    hardware: Hardware
    memory: Memory
    compute: Compute
    verdict: Verdict
    ring: Ring
    backward: Backward
    ulysses: Ulysses
    usp: list[USPEntry] = Field(description="every factorisation N = N_u x N_r, N_u ascending")
    schemes: list[Scheme] = Field(description="the scheme comparison: ring, USP splits, Ulysses")
    tp: TP
    causal: Causal
    notes: list[str] = Field(description="topology and caveats, one sentence each")
    packing: Packing | None = Field(
        None, description="packed documents (--docs): both branches, layouts, long tail"
    )
    mask: MaskSection | None = Field(None, description="documents, window, chunk: what the kernel skips")


class MemoryCategories(_Section):
    """Every byte a device holds at the step's peak, by what holds it (summing to the total), and when the
    peak falls."""

    weights: float = Field(description="stored weights, their ZeRO share")
    gradients: float = Field(description="gradients kept for the optimizer, their ZeRO share")
    optimizer: float = Field(description="master weights and Adam's moments, their ZeRO share")
    fsdp_buffers: float = Field(description="ZeRO-3/FSDP's gathered compute weights and unsharded gradients")
    activations: float = Field(description="activations kept for the backward, micro-batches in flight")
    loss: float = Field(description="the loss's logits and their fp32 upcast, where the peak is at the loss")
    working: float = Field(
        description="the working set of the peak's moment: in the backward a recomputed layer and the gradients "
        "in flight, in the optimizer step its temporaries (gradients cast to the master dtype, foreach AdamW's)"
    )
    cp_buffers: float = Field(
        description="the CP scheme's buffers (ring blocks, gathered K and V, all-to-all)"
    )
    allocator: float = Field(description="what the caching allocator reserves beyond the tensors")
    runtime: float = Field(description="CUDA context, NCCL buffers and workspaces outside the allocator")
    allocated_bytes: float = Field(description="the tensors at the peak (torch.cuda.max_memory_allocated)")
    reserved_bytes: float = Field(description="what the allocator holds (torch.cuda.max_memory_reserved)")
    peak: str = Field(
        description="when the peak falls: at the loss, in the backward, at its end or in the optimizer step, "
        "and on which stage"
    )

    def tensors(self) -> dict[str, float]:
        """The tensors at the peak by category, in order: they sum to ``allocated_bytes``."""
        return {name: getattr(self, name) for name in TENSOR_CATEGORIES}

    @property
    def floor_bytes(self) -> float:
        """The least the step could run in: its tensors and the runtime's own, were the caching allocator to
        release every cached block before raising out-of-memory (the fit is judged on the reservation)."""
        return self.allocated_bytes + self.runtime


TENSOR_CATEGORIES = (
    "weights",
    "gradients",
    "optimizer",
    "fsdp_buffers",
    "activations",
    "loss",
    "working",
    "cp_buffers",
)


class Fit(_Section):
    """Training memory per device at one CP degree ([Korthikanti22]; activations after Korthikanti et al. 2022)."""

    n: int = Field(description="the CP degree this fit is for")
    params: float = Field(description="model parameters")
    model_state_bytes: float = Field(
        description="weights, gradients and optimizer states as the framework keeps them, after TP, PP and ZeRO"
    )
    activation_bytes: float = Field(
        description="activations at the peak: kept for backward, the loss's or the backward's working set"
    )
    buffer_bytes: float = Field(description="the CP scheme's buffers")
    total_bytes: float = Field(description="device memory at the step's peak, the runtime's own included")
    device_memory_bytes: float = Field(description="HBM less the headroom")
    fits: bool
    by_category: MemoryCategories | None = Field(None, description="the total by what holds it")
    total_bytes_interval: Interval | None = Field(
        None, description="total_bytes' prediction interval, from measured peaks of the plan's regime"
    )
    fits_probability: float | None = Field(
        None,
        description="the probability the measured peak stays within device_memory_bytes (a conformal lower "
        "bound); null with fewer than 9 measured peaks like the plan",
    )


class Recommendation(_Section):
    """The plan to use: the layout search's pick where it ran and found one, else the CP degree the window
    [N_min(memory), N_max(comm)] gives at the stated TP and PP. The window is always the one at this plan's
    TP, PP, recompute and micro-batch."""

    n_min_memory: int | None = Field(description="smallest usable N whose memory fits; null: none fits")
    n_min_memory_real: float | None = Field(
        description="the real-valued N at which memory just fits (formula); null when the model states alone do not fit"
    )
    n_max_comm: int | None = Field(description="largest usable N where some scheme's ratio stays <= 15 %")
    n_recommended: int | None = Field(
        description="the CP degree to use (the searched plan's cp where there is one); null when the window is empty"
    )
    dp: int | None = Field(description="data-parallel degree left: G / (TP x PP x N)")
    scheme: str | None = Field(description="ring, ulysses, usp, allgather, or none at N = 1")
    layout: str | None = Field(description="ring layout; zigzag balances a causal mask")
    n_ulysses: int | None = Field(
        description="the all-to-all degree (USP N_u; N for Ulysses; 1 for the ring)"
    )
    reason: str = Field(description="why this plan, and where its CP degree lies in the window")
    fixes: list[str] = Field(description="what would open an empty window, each checked where it can be")
    # The layout search (`cp-plan recommend --gpus G`): the fastest plan that fits; null where the search
    # did not run or nothing fits. Where it found one, every field above describes it.
    gpus: int | None = Field(
        None,
        description="searched plan: GPUs it uses (fewer than --gpus where no layout of them all is faster)",
    )
    tp: int | None = Field(None, description="searched plan: tensor-parallel degree")
    cp: int | None = Field(None, description="searched plan: context-parallel degree")
    pp: int | None = Field(None, description="searched plan: pipeline-parallel degree")
    first_stage_layers: int | None = Field(
        None, description="searched plan: layers on the first pipeline stage"
    )
    last_stage_layers: int | None = Field(
        None, description="searched plan: layers on the last pipeline stage"
    )
    vpp: int | None = Field(None, description="searched plan: virtual pipeline stages per device")
    micro_batch: int | None = Field(None, description="searched plan: sequences per micro-batch")
    global_batch: int | None = Field(None, description="sequences per optimizer step the search held fixed")
    recompute: str | None = Field(None, description="searched plan: none, selective or full")
    cp_scheme: str | None = Field(None, description="searched plan: ring, ulysses, usp, allgather, or none")
    step_time_s: float | None = Field(None, description="searched plan: predicted step time (cp-plan step)")
    mfu: float | None = Field(None, description="searched plan: model FLOP utilisation")


class RecommendCandidate(_Section):
    """One usable CP degree: N divides G / (TP x PP) and S."""

    n: int
    dp: int
    fits: bool
    total_bytes: float
    ring_comm_ratio_step: float = Field(
        description="the plain ring's step ratio for the setup's pass; 0 at N = 1"
    )
    best_scheme: str = Field(
        description="ring, Ulysses or USP N_u x N_r: the least exposed communication (the pick)"
    )
    comm_ratio: float = Field(description="the best scheme's ratio (its ring step, or all-to-all / compute)")
    exposed_comm_s: float = Field(
        description="communication the best scheme leaves exposed, per layer, for the pass"
    )
    verdict: Colour = Field(description="band of comm_ratio")
    lowest_ratio: float = Field(
        description="the lowest ratio of any scheme at this N: usable when within 15 %"
    )
    lowest_ratio_scheme: str = Field(description="the scheme with the lowest ratio")
    link_scope: str = Field(description="the link a ring over N uses")


class Budget(BaseModel):
    """What training on a token budget costs at one plan's step: steps, wall time, GPU-hours and, given a
    price, money. Every GPU the job holds is billed, the ones a plan leaves idle included."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    tokens: int = Field(description="the token budget")
    tokens_per_step: int = Field(description="global batch x sequence length")
    steps: int = Field(description="optimizer steps to see the budget, rounded up")
    wall_s: float = Field(description="steps x the step time, seconds")
    wall_days: float = Field(description="wall_s in days")
    gpus: int = Field(description="GPUs billed: every GPU the job holds")
    gpu_hours: float = Field(description="wall time x GPUs billed, hours")
    price_per_gpu_hour: float | None = Field(description="the stated price, per GPU-hour")
    cost: float | None = Field(description="gpu_hours x price, in the price's currency")
    wall_days_interval: Interval | None = Field(
        None, description="wall_days' prediction interval: the step time's, over the budget's steps"
    )
    cost_interval: Interval | None = Field(None, description="cost's prediction interval, as wall_days'")


class GpuCount(BaseModel):
    """One GPU count a deadline was weighed at: the plan ``recommend`` picks there, and the budget's days."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    gpus: int = Field(
        description="the GPUs the count's pick runs on: the count searched, less any its layout leaves idle"
    )
    plan: str | None = Field(None, description="the plan recommend picks at this count; null when none fits")
    layout: str | None = Field(None, description="its layout, TPxCPxPPxDP (PP 2v4: 2 stages of 4 virtual)")
    step_time_s: float | None = Field(None, description="its predicted step time")
    days: float | None = Field(None, description="the budget's wall days at that step")
    days_interval: Interval | None = Field(
        None, description="days' prediction interval, as budget.wall_days_interval"
    )
    meets_probability: float | None = Field(
        None,
        description="P(the measured run takes at most the deadline): a conformal lower bound on the measured "
        "step times of the plan's regime, as check's; null where they are too few",
    )
    meets: bool = Field(
        False, description="predicted within the deadline and, with --confidence, at least that probable"
    )


class Deadline(BaseModel):
    """The fewest GPUs that train a token budget within a deadline: each count weighed, smallest first."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    days: float = Field(description="the deadline, in days")
    tokens: int = Field(description="the token budget")
    most_gpus: int = Field(description="--gpus: the most the job may hold")
    confidence: float | None = Field(description="--confidence: the probability a count must meet it with")
    gpus: int | None = Field(
        description="the fewest GPUs that meet it; null when no count up to most_gpus does"
    )
    counts: list[GpuCount] = Field(
        description="the counts weighed, smallest first: the fixed layout's GPUs doubled up to the first that "
        "meets (most_gpus last), then the whole nodes between it and the count before, bisected"
    )


class RecommendReport(_Section):
    """What `cp-plan recommend --format json` prints."""

    model_config = ConfigDict(frozen=True, defer_build=True, populate_by_name=True)

    # v4: the search's plans carry their breakdown by the step's identifier keys (matmul_s, exposed_cp_s, ...);
    # v5: inputs.cp, the CP degree, was inputs.n; v6: setup.attention_kernel replaces setup.flash_attention,
    # and search.framework names the framework profile the plans are searched for; v7: fit.total_bytes_interval,
    # fit.fits_probability, and each searched plan's intervals with search.choice, the rule that picked;
    # v8: budget.wall_days_interval and budget.cost_interval, and deadline (--deadline); v9: changed, what the
    # command line changed in the profile
    schema_: str = Field("cp-plan/recommend/v9", alias="schema", description="contract version")
    inputs: PlanInputs = Field(
        description="the layer, with the searched plan's micro-batch as b where there is one"
    )
    setup: TrainingSetup = Field(
        description="the job; where the search found a plan, with its TP, PP and recompute (the flags given "
        "are search.constraints)"
    )
    hw: str
    changed: str = Field(
        default="",
        description="what the command line changed in the profile (its memory, clock, links or placement); "
        "empty when nothing",
    )
    topology: str = Field(
        default="", description="the fast domain's shape and size, and how devices reach the fabric beyond it"
    )
    fit: Fit = Field(description="at the recommended N, else at N_min(memory), else at the largest N")
    recommendation: Recommendation
    candidates: list[RecommendCandidate] = Field(description="every usable CP degree at setup's TP and PP")
    search: dict[str, Any] | None = Field(
        None,
        description="the layout search (with --gpus): global batch, constraints, candidates counted, the top "
        "plans with their breakdown and why each lost, the pick's sensitivity, with --confidence the margin planned "
        "to (confidence: level, margin, planned_bytes, from); empty_reason when nothing fits",
    )
    budget: Budget | None = Field(
        None, description="with --tokens: what the token budget costs at the pick's step"
    )
    deadline: Deadline | None = Field(
        None,
        description="with --deadline: the fewest GPUs that train the budget in time; the plan above is at that "
        "count, or at --gpus when none does",
    )
