"""The symbols of the cost model ([A-RingCost §2]), each with its meaning, unit and source.

Every formula in :mod:`costmodel.symbolic.formulas` is an expression over these symbols and nothing else.
Units are SI throughout: bytes, FLOP, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class SymbolInfo:
    """A base symbol: the sympy object plus what it stands for."""

    symbol: sympy.Symbol
    meaning: str
    unit: str
    source: str

    @property
    def name(self) -> str:
        return self.symbol.name

    @property
    def latex(self) -> str:
        return sympy.latex(self.symbol)


SYMBOLS: dict[str, SymbolInfo] = {}


def _symbol(name: str, meaning: str, unit: str, source: str, **assumptions: bool) -> sympy.Symbol:
    """Positive unless told otherwise; counts (tokens, heads, devices) are also integers."""
    if "nonnegative" not in assumptions:
        assumptions = {"positive": True, **assumptions}
    sym = sympy.Symbol(name, **assumptions)
    SYMBOLS[name] = SymbolInfo(sym, meaning, unit, source)
    return sym


# Workload shape.
S = _symbol("S", "sequence length", "tokens", "[A-RingCost §2]", integer=True)
b = _symbol("b", "batch size", "sequences", "[A-RingCost §2]", integer=True)
N = _symbol("N", "CP degree: devices the sequence is split over", "devices", "[A-RingCost §2]", integer=True)
h = _symbol("h", "query heads", "heads", "[A-RingCost §2]", integer=True)
n_kv = _symbol("n_kv", "key/value heads (GQA when < h)", "heads", "[A-RingCost §2]", integer=True)
d = _symbol("d", "head dimension", "elements", "[A-RingCost §2]", integer=True)
p = _symbol("p", "bytes per element of Q, K, V, O", "B", "[A-RingCost §2]", integer=True)
p_acc = _symbol(
    "p_acc",
    "bytes per element of the fp32 softmax accumulators (m, l, O)",
    "B",
    "[A-RingCost §1]",
    integer=True,
)
s_blk = _symbol(
    "s_blk", "compute tile rows (not the shard length)", "tokens", "[A-RingCost §1]", integer=True
)
c = _symbol(
    "c", "causal compute fraction: 1 non-causal, 1/2 causal (useful FLOP halve)", "1", "[A-RingCost §4]"
)

# Machine.
F_peak = _symbol("F_peak", "peak dense FLOP/s of one accelerator for the dtype", "FLOP/s", "docs/hardware.md")
eta = _symbol("eta", "compute efficiency: effective / peak FLOP/s", "1", "[A-RingCost §8] step 2")
F = _symbol(
    "F", "FLOP/s used by the model (effective = eta · peak, or measured)", "FLOP/s", "[A-RingCost §4]"
)
B = _symbol("B", "link bandwidth per direction", "B/s", "[A-RingCost §4]")
alpha = _symbol("alpha", "per-message latency of the link", "s", "[A-SPDeep]", nonnegative=True)
alpha_cpa = _symbol(
    "alpha_cpa", "latency of one all-to-all call over the CP group", "s", "[A-SPDeep]", nonnegative=True
)

# Planning knobs.
r = _symbol("r", "target ratio of step receive time to step compute time", "1", "[A-RingCost §11]")
N_u = _symbol("N_u", "USP all-to-all (Ulysses) degree", "devices", "[USP §3]", integer=True)
N_r = _symbol("N_r", "USP ring degree", "devices", "[USP §3]", integer=True)

# Whole model and training setup: the memory fit; activation terms follow [Korthikanti22 §4].
KORTHIKANTI = "[Korthikanti22 §4]"
H = _symbol("H", "hidden size", "elements", KORTHIKANTI, integer=True)
F_ffn = _symbol("F_ffn", "MLP inner size", "elements", KORTHIKANTI, integer=True)
V = _symbol("V", "vocabulary size", "tokens", KORTHIKANTI, integer=True)
n_L = _symbol("n_L", "transformer layers", "layers", KORTHIKANTI, integer=True)
g = _symbol(
    "g", "gated MLP (SwiGLU): 1, plain (GeLU): 0", "1", "model preset", nonnegative=True, integer=True
)
delta = _symbol(
    "delta", "dropout masks stored: 1, no dropout: 0", "1", KORTHIKANTI, nonnegative=True, integer=True
)
phi = _symbol(
    "phi",
    "attention scores kept for backward: 0 with flash attention or selective recompute, 1 otherwise",
    "1",
    KORTHIKANTI,
    nonnegative=True,
    integer=True,
)
phi_u = _symbol(
    "phi_u",
    "attention materialises its scores (unfused core attention): 1, whether it keeps them (phi) or makes them "
    "again in the backward; flash attention: 0",
    "1",
    KORTHIKANTI,
    nonnegative=True,
    integer=True,
)
sigma = _symbol(
    "sigma", "sequence parallel with TP: 1 on, 0 off", "1", KORTHIKANTI, nonnegative=True, integer=True
)
s_ag = _symbol(
    "s_ag",
    "under sequence parallel, the column-parallel linears keep their all-gathered input (torch's DTensor): "
    "1; the sequence shard, gathered again in the backward (Megatron-Core's): 0",
    "1",
    "torch.distributed.tensor.parallel",
    nonnegative=True,
    integer=True,
)
t = _symbol("t", "tensor-parallel degree", "devices", KORTHIKANTI, integer=True)
pp = _symbol("pp", "pipeline-parallel degree", "devices", "[Megatron21 §2.2]", integer=True)
z_w = _symbol("z_w", "fraction of the bf16 weights a device keeps (1/D under ZeRO-3)", "1", "[ZeRO §5]")
z_g = _symbol("z_g", "fraction of the fp32 gradients a device keeps (1/D from ZeRO-2)", "1", "[ZeRO §5]")
z_o = _symbol(
    "z_o", "fraction of the fp32 master weights and Adam moments kept (1/D from ZeRO-1)", "1", "[ZeRO §5]"
)
rho = _symbol(
    "rho",
    "full activation recompute: 1 (only layer inputs kept), else 0",
    "1",
    KORTHIKANTI,
    nonnegative=True,
    integer=True,
)
e_m = _symbol(
    "e_m", "embedding matrices: 2 untied input and output, 1 tied", "1", "model preset", integer=True
)
M_dev = _symbol(
    "M_dev",
    "usable device memory: what a process can allocate (the profile's allocatable_bytes, else its HBM) x "
    "(1 - headroom)",
    "B",
    "hardware profile",
)

# What the framework keeps (frameworks/*.yaml, docs/references.md): bytes per parameter of each copy, how
# ZeRO-3/FSDP gathers, how the loss holds the logits, and what the allocator and runtime add.
FRAMEWORK = "framework profile"
q_w = _symbol("q_w", "bytes per stored weight (kept between steps; FSDP2 stores fp32 shards)", "B", FRAMEWORK)
q_c = _symbol("q_c", "bytes per weight as the forward and backward read it (bf16)", "B", FRAMEWORK)
q_m = _symbol(
    "q_m", "bytes per master weight the optimizer steps beside the stored one (0: none)", "B", FRAMEWORK,
    nonnegative=True,
)  # fmt: skip
q_g = _symbol("q_g", "bytes per gradient kept for the optimizer (fp32 main_grad)", "B", FRAMEWORK)
q_o = _symbol("q_o", "bytes per parameter of each of Adam's two moments", "B", FRAMEWORK)
c_gm = _symbol(
    "c_gm",
    "the optimizer step casts the gradients to a master copy of another dtype (bf16 gradients, fp32 master): 1, "
    "else 0",
    "1",
    FRAMEWORK,
    nonnegative=True,
    integer=True,
)
f_fe = _symbol(
    "f_fe",
    "AdamW runs torch's multi-tensor (foreach) implementation, which makes the square root of the second moment "
    "whole: 1; fused: 0",
    "1",
    FRAMEWORK,
    nonnegative=True,
    integer=True,
)
u_w = _symbol(
    "u_w",
    "a layer's weights are gathered or cast into a compute copy before it runs (ZeRO-3/FSDP, autocast): 1, else 0",
    "1",
    "[ZeRO §5], [FSDP2]",
    nonnegative=True,
    integer=True,
)
u_g = _symbol(
    "u_g",
    "a layer's gradients are computed unsharded and reduce-scattered into shards (ZeRO-3/FSDP): 1, else 0",
    "1",
    "[ZeRO §5], [FSDP2]",
    nonnegative=True,
    integer=True,
)
r_k = _symbol(
    "r_k",
    "the compute copies (and unsharded gradients) of every layer of the stage stay for the whole step (FSDP "
    "without resharding, as torchtitan runs it under PP; autocast's cast cache): 1, else 0",
    "1",
    "[FSDP2], torchtitan",
    nonnegative=True,
    integer=True,
)
g_p = _symbol(
    "g_p",
    "the gradients stay allocated from step to step (Megatron's main-gradient buffer): 1; freed by zero_grad "
    "and made as the backward reaches each layer (FSDP2): 0",
    "1",
    FRAMEWORK,
    nonnegative=True,
    integer=True,
)
f_pf = _symbol(
    "f_pf", "layers ZeRO-3/FSDP gathers ahead of the one computing", "layers", "[FSDP2]", nonnegative=True,
    integer=True,
)  # fmt: skip
w_op = _symbol(
    "w_op",
    "selective recompute is op-level (matmul outputs kept, every second one and the rest recomputed, as "
    "torchtitan's): 1; the core attention's (Megatron's): 0",
    "1",
    "torchtitan",
    nonnegative=True,
    integer=True,
)
k_l = _symbol(
    "k_l",
    "bytes per logit the loss holds at its peak: the bf16 logits, their fp32 upcast, the softmax it keeps and "
    "its gradient, as the framework's cross-entropy allocates them",
    "B",
    FRAMEWORK,
)
l_f = _symbol(
    "l_f",
    "a fused linear cross-entropy computes the gradients in the forward (Liger): 1, else 0",
    "1",
    "[Liger]",
    nonnegative=True,
    integer=True,
)
T_c = _symbol(
    "T_c",
    "tokens per chunk of a chunked or fused loss, whose logits exist at once (unbounded: the loss takes the "
    "micro-batch's whole logits)",
    "tokens",
    FRAMEWORK,
)
M_fw = _symbol(
    "M_fw",
    "device memory outside the tensors: CUDA context, NCCL's buffers, library workspaces",
    "B",
    FRAMEWORK,
    nonnegative=True,
)
f_fr = _symbol(
    "f_fr",
    "what the caching allocator reserves beyond the allocated peak, as a share of it",
    "1",
    "[PyTorch-CUDA-Memory]",
    nonnegative=True,
)
P_r = _symbol(
    "P_r",
    "parameters a device of the pipeline stage holds, its TP share (the state bytes are counted for)",
    "1",
    "[Megatron21 §2.2]",
)
M_cpb = _symbol(
    "M_cpb",
    "the CP scheme's buffers at the peak (its own formula: ring, all-gather, all-to-all), 0 without CP",
    "B",
    "plans/cp",
    nonnegative=True,
)

# The whole training step ([Megatron21], [Korthikanti22], [Llama3]). Rates F_gemm and F_attn come from
# the profile's kernel tables (costmodel.machines.kernels); every overlap is a named knob with a default.
STEP = "[Megatron21]"
m_mb = _symbol(
    "m_mb", "micro-batches per step in each pipeline (gradient accumulation)", "1", STEP, integer=True
)
v_pp = _symbol(
    "v_pp",
    "virtual pipeline stages per device (interleaved schedule; 1: plain 1F1B)",
    "1",
    STEP,
    integer=True,
)
D = _symbol("D", "data-parallel degree", "devices", STEP, integer=True)
Z_s = _symbol(
    "Z_s",
    "ranks ZeRO shards over: all of DP x CP, or under hybrid sharding a group of them, the states replicated "
    "across the D·N/Z_s groups",
    "devices",
    STEP,
    integer=True,
)
n_first = _symbol(
    "n_first", "layers on the first pipeline stage (all of them at pp = 1)", "layers", STEP, integer=True
)
n_mid = _symbol(
    "n_mid",
    "layers on each middle pipeline stage (none below three stages)",
    "layers",
    STEP,
    integer=True,
    nonnegative=True,
)
n_last = _symbol(
    "n_last", "layers on the last pipeline stage (all of them at pp = 1)", "layers", STEP, integer=True
)
t_lay = _symbol(
    "t_lay",
    "one layer's forward, backward and recompute for one micro-batch on one device, with its exposed "
    "communication and any wait on the host",
    "s",
    STEP,
)
B_hbm = _symbol(
    "B_hbm",
    "HBM bandwidth a memory-bound kernel reaches on one accelerator (measured; else the datasheet's)",
    "B/s",
    "profile: device.hbm_sustained, else hbm_bandwidth",
)
F_gemm = _symbol("F_gemm", "achieved FLOP/s of the layer's matrix multiplies", "FLOP/s", "kernel tables")
F_attn = _symbol("F_attn", "achieved FLOP/s of the attention kernel, forward", "FLOP/s", "[FA2], [FA3]")
F_attn_bwd = _symbol(
    "F_attn_bwd", "achieved FLOP/s of the attention kernel, backward (its own FLOP)", "FLOP/s", "[FA2], [FA3]"
)
B_tp = _symbol("B_tp", "per-direction bandwidth of the TP group's link", "B/s", "hardware profile")
B_cp = _symbol("B_cp", "per-direction bandwidth of the CP group's link", "B/s", "hardware profile")
B_pp = _symbol("B_pp", "per-direction bandwidth between pipeline stages", "B/s", "hardware profile")
B_dp = _symbol(
    "B_dp",
    "per-direction bandwidth of the link of the ranks ZeRO shards over (DP x CP, or a hybrid-sharding group)",
    "B/s",
    "hardware profile",
)
B_dpr = _symbol(
    "B_dpr",
    "per-direction bandwidth of the link between hybrid-sharding groups, which all-reduce their shards of the "
    "gradients",
    "B/s",
    "hardware profile",
)
B_cpa = _symbol(
    "B_cpa",
    "per-direction bandwidth of an all-to-all over the CP group (bisection-bound)",
    "B/s",
    "hardware profile",
)
rc_sel = _symbol(
    "rc_sel",
    "selective recompute (attention core again in backward): 1, else 0",
    "1",
    "[Korthikanti22 §5]",
    nonnegative=True,
    integer=True,
)
rc_full = _symbol(
    "rc_full",
    "full recompute (the whole layer forward again in backward): 1, else 0",
    "1",
    "[Korthikanti22 §5]",
    nonnegative=True,
    integer=True,
)
u_cp = _symbol(
    "u_cp",
    "causal load balance of the CP layout: useful / slowest rank's attention work",
    "1",
    "[A-RingCost §6]",
)
o_tp = _symbol(
    "o_tp",
    "share of TP collectives hidden under compute (0 Megatron's synchronous SP, up to 1 with async TP)",
    "1",
    "[Korthikanti22 §4.2.2]",
    nonnegative=True,
)
k_tp = _symbol(
    "k_tp",
    "chunks each TP collective and its matrix multiply are split into and pipelined: t with Transformer "
    "Engine's userbuffers or torch's AsyncTP (the collective decomposed into its ring steps), 1 without",
    "1",
    "[Korthikanti22 §4.2.2]",
    integer=True,
)
o_cp = _symbol(
    "o_cp",
    "share of the ring's transfers hidden under its attention compute",
    "1",
    "[RingAttn §3]",
    nonnegative=True,
)
o_pp = _symbol(
    "o_pp", "share of stage-boundary sends hidden under compute", "1", "[Megatron21 §4.1]", nonnegative=True
)
n_bkt = _symbol(
    "n_bkt", "gradient buckets: all but the last reduce under the backward", "1", "PyTorch DDP", integer=True
)
z3 = _symbol(
    "z3",
    "ZeRO-3 / FSDP: parameters gathered per layer in forward and backward: 1, else 0",
    "1",
    "[ZeRO]",
    nonnegative=True,
    integer=True,
)
p_g = _symbol(
    "p_g", "bytes per element of the gradients the DP group reduces", "B", "[Megatron21]", integer=True
)
k_opt = _symbol(
    "k_opt", "bytes the optimizer step moves through HBM per parameter (Adam, fp32 states)", "B", "[ZeRO]"
)
s_comm = _symbol(
    "s_comm",
    "slowdown of compute that runs beside a communication kernel (SMs it takes)",
    "1",
    "kernel tables",
    nonnegative=True,
)
t_launch = _symbol(
    "t_launch",
    "fixed cost of one ring step outside the kernels (launches, stream waits)",
    "s",
    "kernel tables",
    nonnegative=True,
)
t_cs = _symbol("t_cs", "compute of one ring step on its slowest rank", "s", "[RingAttn §3]", nonnegative=True)
t_ms = _symbol(
    "t_ms",
    "transfer in flight under one ring step (the next KV block; in backward also the last step's dK/dV)",
    "s",
    "[RingAttn §3]",
    nonnegative=True,
)
k_merge = _symbol(
    "k_merge",
    "HBM bytes a ring step's merge of two partial outputs moves per output element: 12 fused (two fp32 "
    "partials read, one written), 34-38 as unfused torch ops (a cast, then three elementwise passes)",
    "B",
    "[ring-flash-attn], [OnlineSoftmax]",
)
x_ek = _symbol(
    "x_ek",
    "1 where a dense layer's norms and MLP activation run as eager torch ops whose intermediates autograd keeps "
    "for the backward (an RMSNorm's fp32 upcast, silu(gate)), 0 under fused kernels (Transformer Engine, Liger, "
    "torch.compile)",
    "1",
    "[Liger], costmodel/kernel/memory.py",
    nonnegative=True,
)
k_li = _symbol(
    "k_li",
    "bytes a linear layer keeps per element of its input for the weight gradient: 2 (its bf16 input), 1 where "
    "FP8 linears keep the FP8 cast they multiplied (Transformer Engine), beside an FP8 copy of the attention "
    "output the projection reads",
    "B",
    "[TE-Linear]",
    positive=True,
)
k_agm = _symbol(
    "k_agm",
    "1 where an all-gather CP still attends block by block and merges the partial outputs as a ring does "
    "(torch's context_parallel), 0 where one call covers the gathered keys (Llama 3, Transformer Engine)",
    "1",
    "[torch-CP], [TE-CP]",
    nonnegative=True,
)
x_eager = _symbol(
    "x_eager",
    "1 where a layer's norms, rotary embedding and MLP activation run as eager torch ops (bf16 upcast to fp32 "
    "and back, each op through HBM), 0 where each is one fused kernel",
    "1",
    "[torchtitan-code], [Liger]",
    nonnegative=True,
)
x_rep = _symbol(
    "x_rep",
    "1 where the model code expands K and V to the query heads before attention (GQA by repeat_kv: torchtitan "
    "before 2026, transformers' eager attention), so CP moves and the backward holds h heads of K and V; 0 where "
    "the kernel reads the n_kv heads as they are",
    "1",
    "[torchtitan-code], [torch-CP]",
    nonnegative=True,
)
x_qh = _symbol(
    "x_qh",
    "1 where a decode attention kernel runs one thread block per query head, each reading its KV head's cache "
    "(TensorRT-LLM's masked multi-head attention before v0.7's XQA kernels), so a step reads the cache once per "
    "query head; 0 where it reads each KV head's cache once",
    "1",
    "[TRTLLM-MMHA]",
    nonnegative=True,
)
k_copy = _symbol(
    "k_copy",
    "query copies per ring step when a layout shifts the mask (zigzag: 1, else 0)",
    "1",
    "[ring-flash-attn]",
    nonnegative=True,
)
# What real runs pay beyond the FLOP: each multiply at its own shape, an unfused attention's score matrix,
# a fixed cost per kernel, collective latency per hop, and a gradient reduction that may not overlap.
F_gemm_b = _symbol(
    "F_gemm_b",
    "achieved FLOP/s of the layer's backward multiplies (input and weight gradients, at their shapes)",
    "FLOP/s",
    "kernel tables",
)
F_head = _symbol("F_head", "achieved FLOP/s of the output layer's multiply", "FLOP/s", "kernel tables")
x_att = _symbol(
    "x_att",
    "score pairs the attention kernel computes per visible pair (fused: 1; unfused: 1/c, the whole square)",
    "1",
    "[FA2 §3]",
)
k_sf = _symbol(
    "k_sf",
    "HBM bytes per score element an unfused attention's forward moves (scores, softmax, dropout; fused: 0)",
    "B",
    "[Megatron21 §3]",
    nonnegative=True,
)
k_sb = _symbol(
    "k_sb",
    "HBM bytes per score element an unfused attention's backward moves (fused: 0)",
    "B",
    "[Megatron21 §3]",
    nonnegative=True,
)
n_kf = _symbol(
    "n_kf", "kernels one layer's forward launches on a device", "1", "[Megatron21 §3]", integer=True
)
n_kb = _symbol(
    "n_kb", "kernels one layer's backward launches on a device", "1", "[Megatron21 §3]", integer=True
)
t_k = _symbol(
    "t_k",
    "fixed cost of one kernel launch on the critical path (launch, framework dispatch, the gap between kernels)",
    "s",
    "kernel tables",
    nonnegative=True,
)
t_dev = _symbol(
    "t_dev",
    "device time of one layer's passes for one micro-batch (compute and exposed communication)",
    "s",
    "[Megatron21 §3]",
)
# Bound per CP scheme and per model, so the step's terms need no dispatch: what a scheme leaves exposed
# (its own formulas: cp_ring_*_exposed_s, cp_allgather_s, cp_ulysses_s, cp_usp_a2a_s), and what counts every
# expert a device holds (the dense formula, or its MoE twin at one expert's width).
x_CP_f = _symbol(
    "x_CP_f",
    "CP communication one layer's forward leaves on the critical path, by the chosen scheme's formulas",
    "s",
    "[RingAttn §3], [Ulysses §3], [USP §3], [Llama3 §3.3]",
    nonnegative=True,
)
x_CP_b = _symbol(
    "x_CP_b",
    "CP communication one layer's backward leaves on the critical path, by the chosen scheme's formulas",
    "s",
    "[RingAttn §3], [Ulysses §3], [USP §3], [Llama3 §3.3]",
    nonnegative=True,
)
x_CP_r = _symbol(
    "x_CP_r",
    "the ring's merges, copies and launches of one layer and pass (ring_overhead_s over the scheme's ring; "
    "0 without one)",
    "s",
    "[ring-flash-attn]",
    nonnegative=True,
)
F_e = _symbol(
    "F_e", "FFN width of one routed expert (a dense model's MLP inner size)", "elements", "[Switch §2]"
)
x_DP_all = _symbol(
    "x_DP_all",
    "exposed gradient reduction of every weight a device holds: dp_exposed_s, or moe_dp_exposed_s at one "
    "expert's width",
    "s",
    "PyTorch DDP, [GShard §2]",
    nonnegative=True,
)
x_DPo_all = _symbol(
    "x_DPo_all",
    "the other buckets' reduction of every weight a device holds: dp_overflow_s, or moe_dp_overflow_s",
    "s",
    "PyTorch DDP, [GShard §2]",
    nonnegative=True,
)
tau_Z3_all = _symbol(
    "tau_Z3_all",
    "ZeRO-3 gathers of one micro-batch of every weight a device holds: zero3_gather_s, or moe_zero3_gather_s",
    "s",
    "[ZeRO §5.3], [GShard §2]",
    nonnegative=True,
)
t_opt_all = _symbol(
    "t_opt_all",
    "the device's optimizer step over every weight it holds: optimizer_s, or for an MoE model its dense part's "
    "and moe_optimizer_s over its experts",
    "s",
    "[ZeRO §5], [GShard §2]",
    nonnegative=True,
)
t_fw = _symbol(
    "t_fw",
    "framework time per optimizer step outside the layers (a measured profile's; 0 on a datasheet)",
    "s",
    "kernel tables",
    nonnegative=True,
)
f8 = _symbol(
    "f8",
    "the linear layers' multiplies run in FP8 (Transformer Engine, torchao Float8; attention stays at p): 1, "
    "else 0",
    "1",
    "[FP8-Formats]",
    nonnegative=True,
    integer=True,
)
F_peak_g = _symbol(
    "F_peak_g",
    "peak dense FLOP/s of the linear layers' multiplies: the FP8 peak where they run in FP8 (f8 = 1), else F_peak",
    "FLOP/s",
    "docs/hardware.md",
)
p_s = _symbol(
    "p_s",
    "scale bytes per FP8 element (MXFP8: one byte per block of 32; per-tensor FP8: 0)",
    "B",
    "[MX-Formats]",
    nonnegative=True,
)
a_f8 = _symbol(
    "a_f8",
    "reads of a tensor before its FP8 cast to take its amax: 1 under current (dynamic) per-tensor scaling, "
    "torchao's tensorwise recipe; 0 under delayed scaling, whose cast takes the amax as it goes and uses past "
    "steps' (Transformer Engine's default), and under MXFP8, whose block scales come from the cast's own tile",
    "1",
    "[FP8-Formats]",
    nonnegative=True,
    integer=True,
)
o_dp = _symbol(
    "o_dp",
    "share of the gradient reduction that overlaps the backward (1: bucketed as PyTorch DDP; 0: after it)",
    "1",
    "PyTorch DDP, [Megatron21 §5]",
    nonnegative=True,
)

# Multi-head latent attention ([DeepSeek-V2 §2.1]): Q and K, V pass through low-rank latents; attention and its
# traffic see h heads of (d_qk + d_v) / 2 on average, the projections their own shapes.
m_la = _symbol(
    "m_la",
    "multi-head latent attention: 1, else 0 (Q, K, V projected directly)",
    "1",
    "[DeepSeek-V2 §2.1]",
    nonnegative=True,
    integer=True,
)
c_q = _symbol(
    "c_q",
    "MLA's queries through a latent: 1, else 0 (projected directly)",
    "1",
    "[DeepSeek-V2 §2.1]",
    nonnegative=True,
    integer=True,
)
r_q = _symbol(
    "r_q",
    "MLA's query latent rank (with c_q = 1)",
    "elements",
    "[DeepSeek-V2 §2.1]",
    nonnegative=True,
    integer=True,
)
r_kv = _symbol(
    "r_kv", "MLA's key-value latent rank", "elements", "[DeepSeek-V2 §2.1]", nonnegative=True, integer=True
)
d_qk = _symbol(
    "d_qk",
    "MLA's query and key head dimension (its rotary part included)",
    "elements",
    "[DeepSeek-V2 §2.1]",
    nonnegative=True,
    integer=True,
)
d_r = _symbol(
    "d_r",
    "MLA's rotary key dimension, shared by every head",
    "elements",
    "[DeepSeek-V2 §2.1]",
    nonnegative=True,
    integer=True,
)
d_v = _symbol(
    "d_v", "MLA's value head dimension", "elements", "[DeepSeek-V2 §2.1]", nonnegative=True, integer=True
)

# Fine-tuning ([LoRA]): the base weights trained or frozen, and the rank of low-rank adapters beside them.
f_b = _symbol(
    "f_b",
    "base weights trained: 1 (pre-training, full fine-tuning), 0 (frozen under LoRA: no gradients, no optimizer "
    "states, no weight-gradient multiplies)",
    "1",
    "[LoRA §4]",
    nonnegative=True,
    integer=True,
)
f_tr = _symbol(
    "f_tr",
    "parameters that train per base parameter, bound from s_tr: 1 in full training, the adapters' share under "
    "LoRA",
    "1",
    "[LoRA §4]",
    nonnegative=True,
)
# Which of a layer's matrices LoRA adapts (--finetune lora:RANK:TARGETS; every one unless named).
a_q = _symbol(
    "a_q",
    "1 where LoRA puts an adapter beside the query projection, else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
a_k = _symbol(
    "a_k",
    "1 where LoRA puts an adapter beside the key projection, else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
a_v = _symbol(
    "a_v",
    "1 where LoRA puts an adapter beside the value projection, else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
a_o = _symbol(
    "a_o",
    "1 where LoRA puts an adapter beside the attention's output projection, else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
a_g = _symbol(
    "a_g",
    "1 where LoRA puts an adapter beside the MLP's gate projection (gated MLPs), else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
a_u = _symbol(
    "a_u",
    "1 where LoRA puts an adapter beside the MLP's up projection, else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
a_d = _symbol(
    "a_d",
    "1 where LoRA puts an adapter beside the MLP's down projection, else 0",
    "1",
    "[LoRA §4], [PEFT]",
    nonnegative=True,
    integer=True,
)
x_lf = _symbol(
    "x_lf",
    "LoRA adapters on fused projections: 1 where one adapter serves the fused Q/K/V projection and one the fused "
    "gate/up (Megatron Core's performant LoRA), 0 where each matrix has its own (PEFT)",
    "1",
    "[NeMo-LoRA], [PEFT]",
    nonnegative=True,
)
r_lo = _symbol(
    "r_lo",
    "LoRA rank: the inner width of each adapter pair (0: no adapters)",
    "1",
    "[LoRA §4]",
    nonnegative=True,
    integer=True,
)

# Offload over the host link ([ZeRO-Offload], [ZeRO-Infinity]): what lives in host memory, and the link to it.
o_opt = _symbol(
    "o_opt",
    "optimizer offload: fp32 master weights and Adam moments in host memory, the CPU runs Adam: 1, else 0",
    "1",
    "[ZeRO-Offload §4]",
    nonnegative=True,
    integer=True,
)
o_par = _symbol(
    "o_par",
    "parameter offload: the bf16 weights and gradients in host memory, each layer's fetched before its "
    "forward and backward: 1, else 0",
    "1",
    "[ZeRO-Infinity §5]",
    nonnegative=True,
    integer=True,
)
o_act = _symbol(
    "o_act",
    "activation offload: each layer's kept activations copied to host memory in the forward and back in the "
    "backward: 1, else 0",
    "1",
    "[ZeRO-Infinity §5]",
    nonnegative=True,
    integer=True,
)
B_h = _symbol(
    "B_h", "host link bandwidth of one device, per direction (PCIe, NVLink-C2C)", "B/s", "profile links.host"
)
R_h = _symbol(
    "R_h",
    "parameters one host's CPUs update per second with CPU Adam (all its cores)",
    "params/s",
    "[ZeRO-Offload]",
)
n_h = _symbol(
    "n_h",
    "devices of the job sharing one host's CPUs for the offloaded optimizer step",
    "devices",
    "profile links.host",
    integer=True,
)

# Inference: a prefill of new tokens against a cached prefix, and decode, under TP x CP x PP ([CP-Infer]).
INFER = "[CP-Infer]"
T_n = _symbol(
    "T_n", "new tokens per sequence in one prefill (or prefill chunk)", "tokens", INFER, integer=True
)
K_c = _symbol(
    "K_c",
    "tokens already in the KV cache before that prefill (cached prefix, earlier chunks)",
    "tokens",
    INFER,
    nonnegative=True,
    integer=True,
)
S_kv = _symbol(
    "S_kv",
    "KV-cache tokens one CP rank holds per sequence (rounded up to whole pages when paged)",
    "tokens",
    INFER,
    integer=True,
)
p_w = _symbol("p_w", "bytes per weight element (bf16: 2, fp8: 1)", "B", INFER, integer=True)
p_kv = _symbol("p_kv", "bytes per KV-cache element (bf16: 2, fp8: 1)", "B", INFER, integer=True)
alpha_cp = _symbol(
    "alpha_cp",
    "latency of one step of the CP group's ring collective (all-gather CP)",
    "s",
    "[NCCL-Tuning]",
    nonnegative=True,
)
t_lf = _symbol(
    "t_lf",
    "fixed cost of one inference attention layer of its scheme beyond its modelled work (host dispatch, "
    "position and partial-output collectives' fixed part, merges' dispatch): a tiny layer timed whole by "
    "calibrate, less the model; 0 on a datasheet",
    "s",
    "[A-RingCost §11]",
    nonnegative=True,
)
n_kl = _symbol(
    "n_kl",
    "kernel launches per layer the host issues one by one and the device waits for (eager decode: the "
    "layer's kernels; CUDA graphs or a prefill whose kernels outlast their launch: 0)",
    "1",
    "[CUDA-Graphs]",
    nonnegative=True,
)
t_host = _symbol(
    "t_host",
    "serving framework's host time per decode step not overlapped with the device (scheduling, input "
    "preparation, stop checks); 0 under an overlap scheduler",
    "s",
    "[TRTLLM-Overlap]",
    nonnegative=True,
)
g_pg = _symbol(
    "g_pg",
    "1 when the KV cache is paged (its blocks gathered into a contiguous buffer before a ring sends "
    "them), else 0",
    "1",
    "[PagedAttention]",
    nonnegative=True,
)
alpha_tp = _symbol(
    "alpha_tp", "latency of one step of a TP collective (per message)", "s", "[A-SPDeep]", nonnegative=True
)
a_tp = _symbol(
    "a_tp",
    "fixed latency of one TP collective call beyond its ring steps (NCCL's base latency: the kernel's "
    "launch and the ranks' handshake)",
    "s",
    "[NCCL-Tuning]",
    nonnegative=True,
)
a_dp = _symbol(
    "a_dp",
    "fixed latency of one DP collective call (one gradient bucket) beyond its ring steps",
    "s",
    "[NCCL-Tuning]",
    nonnegative=True,
)
# Topology of the fast domain and the fabric beyond it (docs/hardware.md, "Topology").
B_l = _symbol(
    "B_l",
    "per-direction bandwidth of one link of the fast domain: a switch port, one mesh or torus link",
    "B/s",
    "hardware profile",
)
n_l = _symbol(
    "n_l",
    "links a device drives at once: 1 into a switch, P_g - 1 in a full mesh, 2 per torus dimension",
    "links",
    "hardware profile",
    integer=True,
)
l_h = _symbol(
    "l_h", "links one ring hop sends over (a one-way ring: 1)", "links", "[RingAttn §3]", integer=True
)
P_g = _symbol("P_g", "ranks of one communication group", "devices", "[Dally-Towles ch. 3]", integer=True)
B_bis = _symbol(
    "B_bis",
    "bisection bandwidth of the group: bytes/s one way across the worst cut into two halves",
    "B/s",
    "[Dally-Towles ch. 3]",
)
w_t = _symbol(
    "w_t",
    "links a torus ring has across a cut: 2 with wraparound, 1 on a line",
    "links",
    "[ScalingBook]",
    integer=True,
)
L_t = _symbol(
    "L_t", "chips along the group's longest torus dimension", "devices", "[Dally-Towles ch. 3]", integer=True
)
D_g = _symbol("D_g", "torus dimensions the group spans", "1", "[ScalingBook]", integer=True)
B_nic = _symbol(
    "B_nic", "per-direction bandwidth of one NIC of the inter-node fabric", "B/s", "hardware profile"
)
n_nic = _symbol("n_nic", "NICs a device drives at once", "NICs", "hardware profile")
k_n = _symbol(
    "k_n", "members of a group on one node (they share the NICs they hold)", "devices", "[NCCL-Tuning]"
)
n_x = _symbol("n_x", "nodes a ring collective's group spans", "nodes", "[NCCL-Tuning]", integer=True)
alpha_in = _symbol(
    "alpha_in",
    "latency of a ring step between two ranks of one node, once the ring spans nodes (at least NCCL's "
    "network overhead)",
    "s",
    "[NCCL-Tuning]",
    nonnegative=True,
)
alpha_out = _symbol(
    "alpha_out", "latency of a ring step that crosses the network", "s", "[NCCL-Tuning]", nonnegative=True
)
o_x = _symbol(
    "o_x",
    "spine oversubscription the group's inter-node traffic meets (1 when it stays on one rail's leaf)",
    "1",
    "[RailOnly]",
)

# Mixture of experts ([Switch §2.2], [GShard §2]).
n_E = _symbol("n_E", "routed experts per MoE layer", "experts", "[Switch §2]", integer=True)
k_E = _symbol("k_E", "experts each token is routed to (top-k)", "experts", "[GShard §2]", integer=True)
F_sh = _symbol(
    "F_sh",
    "FFN width of the always-active shared expert(s), 0 without",
    "elements",
    "[Qwen-MoE]",
    nonnegative=True,
)
n_dn = _symbol(
    "n_dn",
    "the first layers of an MoE model whose MLP is dense (DeepSeek's first_k_dense_replace), 0 without",
    "layers",
    "[DeepSeek-V3 §4.2]",
    nonnegative=True,
    integer=True,
)
F_dn = _symbol(
    "F_dn",
    "FFN width of an MoE model's dense layers, 0 without",
    "elements",
    "[DeepSeek-V3 §4.2]",
    nonnegative=True,
)
P_x = _symbol(
    "P_x",
    "expert parameters a device of an MoE model's pipeline stage holds: its n_E/E_p experts of each of the "
    "stage's MoE layers, TP-split, and the routers (P_r then counts the stage's dense part)",
    "1",
    "[GShard §2]",
    nonnegative=True,
)
E_p = _symbol(
    "E_p", "expert-parallel degree: ranks the experts are split over", "devices", "[GShard §2]", integer=True
)
C_f = _symbol(
    "C_f",
    "capacity factor: tokens an expert may take, as a multiple of the mean; the most loaded expert rank computes C_f x the mean",
    "1",
    "[Switch §2.2]",
)
B_ep = _symbol("B_ep", "bytes/s each rank of the EP all-to-all receives", "B/s", "hardware profile")
# Measured by `cp-plan calibrate` on the target machine (docs/calibration.md, [A-RingCost §11]).
X_k = _symbol(
    "X_k",
    "all-to-all knee: bytes a rank receives per exchange beyond which the kernel's copies cost extra",
    "B",
    "[A-RingCost §11]",
)
B_x = _symbol(
    "B_x",
    "all-to-all rate of the extra cost beyond the knee (copies into fresh memory)",
    "B/s",
    "[A-RingCost §11]",
)

# Packed documents and masks ([A-RingCost §5]): counts the simulator measures on one window.
E_m = _symbol(
    "E_m",
    "(query, key) pairs one layer executes under the branch's mask, all ranks, tile rule",
    "pairs",
    "[A-RingCost §5]",
    nonnegative=True,
)
E_w = _symbol(
    "E_w",
    "(query, key) pairs one layer executes over the plain (causal) window, all ranks",
    "pairs",
    "[A-RingCost §5]",
)
l_max = _symbol(
    "l_max", "tokens of the longest document in the window", "tokens", "[A-RingCost §5]", integer=True
)
l_rest = _symbol(
    "l_rest", "tokens of the longest of the other documents", "tokens", "[A-RingCost §5]", integer=True
)
T_w = _symbol(
    "T_w", "document tokens in the window (padding excluded)", "tokens", "[A-RingCost §5]", integer=True
)
l_w = _symbol(
    "l_w",
    "work-weighted document length of the window, sum l_i^3 / sum l_i^2 (each document weighted by the "
    "pairs it computes)",
    "tokens",
    "[A-RingCost §5]",
)
