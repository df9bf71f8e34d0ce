"""Formulas of the group 'step': The whole training step ([Megatron21], [Korthikanti22], [Llama3], [PaLM] appendix B)."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.compute import W
from costmodel.symbolic.formulas.fit import A_o, A_qkv, P, P_t, lora_widths, n_kv_a
from costmodel.symbolic.formulas.memory import C_step, L
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.formulas.ring import C_recv
from costmodel.symbolic.formulas.ulysses import C_u
from costmodel.symbolic.formulas.usp import C_ua
from costmodel.symbolic.symbols import (
    B_cp,
    B_dp,
    B_dpr,
    B_hbm,
    B_pp,
    B_tp,
    D,
    F_attn,
    F_attn_bwd,
    F_ffn,
    F_gemm,
    F_gemm_b,
    F_head,
    F_peak,
    F_peak_g,
    H,
    N,
    S,
    V,
    Z_s,
    a_dp,
    a_f8,
    a_tp,
    alpha_cp,
    alpha_tp,
    b,
    c,
    d,
    e_m,
    f8,
    f_b,
    f_tr,
    g,
    h,
    k_agm,
    k_copy,
    k_merge,
    k_opt,
    k_sb,
    k_sf,
    k_tp,
    m_mb,
    n_bkt,
    n_first,
    n_kb,
    n_kf,
    n_kv,
    n_L,
    n_last,
    n_mid,
    o_cp,
    o_dp,
    o_opt,
    o_pp,
    o_tp,
    p,
    p_acc,
    p_g,
    p_s,
    pp,
    rc_full,
    rc_sel,
    s_comm,
    sigma,
    t,
    t_cs,
    t_dev,
    t_k,
    t_launch,
    t_lay,
    t_ms,
    u_cp,
    v_pp,
    x_att,
    x_eager,
    x_rep,
    z3,
    z_o,
)

GROUP = "step"
define = definer(GROUP)

# One device, one micro-batch of b sequences: CP leaves b·S/N tokens, TP splits every matrix multiply t
# ways and, with sequence parallelism, the elementwise work too. Backward costs 2x the forward for the
# matrix multiplies and 2.5x for attention [FA2 §4]. Every overlap is a named knob (o_*, n_bkt, s_comm).


def _hidden(comm: sympy.Expr, compute: sympy.Expr, share: sympy.Expr) -> sympy.Expr:
    """Time of ``comm`` left on the critical path when ``share`` of it can hide under ``compute``; what hides
    still slows that compute by s_comm (the SMs a communication kernel takes)."""
    hideable = share * (comm - sympy.Max(comm - compute, 0, evaluate=False))  # share x min(comm, compute)
    return comm - hideable + s_comm * hideable


# A ring has one overlap law, _hidden: the step model applies it to a layer's transfers (cp_ring_*_exposed_s,
# below) and ring_step_s to one step, which the single-layer timeline sums (costmodel.plans.timing).
define(
    "ring_step_s",
    "t_ring_step",
    t_cs + _hidden(t_ms, t_cs, o_cp) + t_launch,
    "one ring step: its compute, the transfer in flight under it less the share o_cp that hides (which "
    "still slows the compute by s_comm), and the step's fixed cost",
    "s",
    "[RingAttn §3]",
)

T_mb = define(
    "mb_tokens", "T_mb", b * S / N, "tokens of one micro-batch on one CP rank", "tokens", "[Llama3 §3.3]"
)
W_qkv = define(
    "layer_qkv_flops",
    "W_qkv",
    2 * T_mb * A_qkv / t,
    "forward FLOP of the Q, K, V projections (GQA: n_kv heads for K and V; MLA: its latents), per device",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_out = define(
    "layer_out_proj_flops",
    "W_o",
    2 * T_mb * A_o / t,
    "forward FLOP of the output projection",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_mlp = define(
    "layer_mlp_flops",
    "W_mlp",
    2 * (2 + g) * T_mb * H * F_ffn / t,
    "forward FLOP of the MLP: 3 matrices gated (SwiGLU), 2 plain (GeLU)",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_gemm = define(
    "layer_gemm_flops",
    "W_gemm",
    W_qkv + W_out + W_mlp,
    "forward FLOP of a layer's matrix multiplies",
    "FLOP",
    "[Megatron21 §5.1]",
)
W_att = define(
    "layer_attn_flops",
    "W_att",
    W / t,
    "forward FLOP of attention per device: c·S²/N pairs x 4·b·h·d over t (causal c = 1/2)",
    "FLOP",
    "[FA2 §4]",
)
E_lay = define(
    "layer_elementwise_bytes",
    "E_layer",
    T_mb
    * p
    * (
        (10 + 32 * x_eager) * H / (1 + sigma * (t - 1))
        + ((2 + 8 * x_eager + 2 * x_rep) * (h + n_kv) * d + (2 + g + 2 * g * x_eager) * F_ffn) / t
    ),
    "forward HBM bytes of the memory-bound work, in elements of p bytes: two norms (2·H each fused: read, "
    "write) and two residual adds (3·H each), split t ways only with sequence parallelism (else every TP rank "
    "runs them whole), rotary on Q and K (2 an element fused) and the MLP activation ((2+g)·F_ffn fused) on the "
    "rank's heads and columns. Eager torch ops (x_eager = 1) move more: an RMSNorm upcasts to fp32 (3), "
    "squares (4), takes the mean (2), scales (4), casts back (3) and weights (2), 18 an element; a complex "
    "rotary upcasts (3), multiplies (4) and casts back (3), 10; a SwiGLU's silu (2) and product (3), 5. "
    "Where the model code repeats K and V to the query heads (x_rep = 1), the copy reads n_kv and writes h heads "
    "of each, 2 an element of h + n_kv",
    "B",
    "[Korthikanti22 §4], [torchtitan-code], [Liger]",
)
# LoRA's adapters run beside each frozen projection as PEFT writes them, y + B(A(x))·scaling [LoRA §4.1],
# [PEFT], over the widths of the matrices they adapt on the rank's shard (lora_widths, which counts their
# parameters too). Their rank r is far below a device's FLOP/byte ratio, so the two skinny multiplies are bound
# by what they move: forward, the input read again and the adapter's output scaled and added into the
# projection's (in + 6·out elements); backward, the scaled gradient, both adapters' products and the input
# gradient added into the base's (5·in + 4·out).
_lora_in, _lora_out = lora_widths(t)
E_lo_f = define(
    "layer_lora_fwd_bytes",
    "E_lo_f",
    (1 - f_b) * T_mb * p * (_lora_in + 6 * _lora_out),
    "forward HBM bytes of one layer's LoRA adapters (none when the base trains): each input read again, each "
    "adapter's output scaled and added into its projection's",
    "B",
    "[LoRA §4.1], [PEFT]",
)
E_lo_b = define(
    "layer_lora_bwd_bytes",
    "E_lo_b",
    (1 - f_b) * T_mb * p * (5 * _lora_in + 4 * _lora_out),
    "backward HBM bytes of one layer's LoRA adapters: the scaled output gradient, the adapters' products and "
    "weight gradients, and their input gradient added into the frozen projection's",
    "B",
    "[LoRA §4.1], [PEFT]",
)
K_in = define(
    "layer_gemm_input_width",
    "K_in",
    H + h * d / t + H + F_ffn / t,
    "widths of the four multiplies' inputs on one TP shard (QKV, output projection, MLP in, MLP out)",
    "elements",
    "[Megatron21 §3]",
)
N_out = define(
    "layer_gemm_output_width",
    "N_out",
    (h + 2 * n_kv) * d / t + H + (1 + g) * F_ffn / t + H,
    "widths of the four multiplies' outputs on one TP shard",
    "elements",
    "[Megatron21 §3]",
)
W_el = define(
    "layer_gemm_weight_elements",
    "W_el",
    (A_qkv + A_o + (1 + g) * F_ffn * H + H * F_ffn) / t,
    "weight elements of the four multiplies on one TP shard",
    "1",
    "[Megatron21 §3]",
)
define(
    "layer_fp8_cast_bytes",
    "E_f8",
    f8 * ((T_mb * K_in + W_el + T_mb * N_out) * (p * (1 + a_f8) + 1 + p_s) + 2 * T_mb * K_in + 2 * W_el),
    "HBM bytes one layer's forward and backward move to run its multiplies in FP8: each input cast from p "
    "bytes to one (with its scales, and under current scaling a read for its amax first), the weights cast "
    "once a micro-batch, each output gradient cast, and transposed FP8 copies of the inputs and weights for "
    "the backward's multiplies",
    "B",
    "[FP8-Formats], [MX-Formats]",
)
W_head = define(
    "head_flops",
    "W_head",
    2 * T_mb * H * V / t,
    "forward FLOP of the output layer (vocab-parallel)",
    "FLOP",
    "[Megatron21 §5.1]",
)
E_loss = define(
    "loss_bytes",
    "E_loss",
    3 * T_mb * 4 * V / t,
    "HBM bytes of the fp32 softmax cross-entropy over the logits: three passes",
    "B",
    "[Korthikanti22 §4.2]",
)
tau_tp = define(
    "tp_comm_s",
    "tau_TP",
    4 * (t - 1) / t * T_mb * H * p / B_tp + 4 * (t - 1) * alpha_tp + 2 * (1 + sigma) * a_tp,
    "TP with sequence parallelism, one layer, one pass: two all-gathers and two reduce-scatters of "
    "the layer's activations, t - 1 ring hops each (without it, two all-reduces: the same bytes and hops, "
    "half the calls), and each call's fixed latency",
    "s",
    "[Korthikanti22 §4.2.2]",
)
C_ag = define(
    "cp_allgather_bytes",
    "C_AG",
    (N - 1) / N * b * S * 2 * n_kv_a * d * p / t,
    "all-gather of K and V (the heads attention receives) over the CP group, per device per layer (the "
    "backward reduce-scatters dK, dV as many bytes)",
    "B",
    "[Llama3 §3.3]",
)
Z_sc = define(
    "layer_score_elements",
    "Z_sc",
    x_att * W_att / (4 * d),
    "score-matrix elements one device's attention computes per layer (an unfused kernel: the whole square)",
    "1",
    "[FA2 §3]",
)
t_att_f = define(
    "layer_attn_fwd_s",
    "t_att_fwd",
    (x_att * W_att / F_attn + k_sf * Z_sc / B_hbm) / u_cp,
    "attention forward of one layer, the slowest CP rank: the kernel's FLOP, and an unfused kernel's passes "
    "over the score matrix (scores, softmax, dropout) through HBM",
    "s",
    "[FA2 §4], [A-RingCost §6]",
)
t_att_b = define(
    "layer_attn_bwd_s",
    "t_att_bwd",
    (sympy.Rational(5, 2) * x_att * W_att / F_attn_bwd + k_sb * Z_sc / B_hbm) / u_cp,
    "attention backward of one layer, the slowest CP rank",
    "s",
    "[FA2 §4]",
)
M_step = define(
    "ring_merge_bytes",
    "M_merge",
    b * L * h * (k_merge * (d + 1) + 2 * k_copy * d * p) / t,
    "HBM bytes per ring step outside the kernel: the merge of the step's partial (O, LSE) into the running "
    "one (k_merge bytes an element: the framework's merge), and the queries copied when the layout shifts "
    "the mask",
    "B",
    "[ring-flash-attn], [OnlineSoftmax]",
)
t_ring_x = define(
    "ring_overhead_s",
    "t_ring_x",
    (N - 1) * (M_step / B_hbm + t_launch),
    "per layer and pass: the ring's merges, copies and launches beside the attention kernel",
    "s",
    "[ring-flash-attn]",
)
tau_ring_f = define(
    "cp_ring_fwd_s",
    "tau_ring_fwd",
    C_recv * n_kv_a / (n_kv * t * B_cp),
    "ring forward transfers of one layer (N-1 KV blocks of the heads the TP rank's attention receives)",
    "s",
    "[RingAttn §3]",
)
tau_ring_b = define(
    "cp_ring_bwd_s",
    "tau_ring_bwd",
    ((N - 1) * C_step * n_kv_a / n_kv + N * b * L * 2 * n_kv_a * d * p_acc) / (t * B_cp),
    "ring backward transfers of one layer: N-1 KV blocks and N fp32 dK/dV blocks",
    "s",
    "[RingAttn §3], [FA2 §4]",
)
define(
    "cp_ring_fwd_exposed_s",
    "x_ring_fwd",
    _hidden(tau_ring_f, t_att_f, o_cp),
    "ring forward transfers left on the critical path after hiding o_cp of them under attention",
    "s",
    "[RingAttn §3]",
)
define(
    "cp_ring_bwd_exposed_s",
    "x_ring_bwd",
    _hidden(tau_ring_b, t_att_b, o_cp),
    "ring backward transfers left on the critical path",
    "s",
    "[RingAttn §3]",
)
define(
    "cp_allgather_merge_s",
    "x_AG_m",
    k_agm * t_ring_x,
    "per layer and pass, an all-gather CP that attends the gathered blocks one by one: the merges, copies "
    "and launches a ring pays beside its kernels",
    "s",
    "[torch-CP]",
)
define(
    "cp_allgather_s",
    "tau_AG",
    C_ag / B_cp + (N - 1) * alpha_cp,
    "all-gather of K, V (forward) or reduce-scatter of dK, dV, N - 1 ring steps; exposed",
    "s",
    "[Llama3 §3.3]",
)
define(
    "cp_ulysses_s",
    "tau_U_step",
    C_u / (t * B_cp),
    "Ulysses all-to-alls of one layer and pass; exposed",
    "s",
    "[Ulysses §3]",
)
define(
    "cp_usp_a2a_s",
    "tau_USP_step",
    C_ua / (t * B_cp),
    "USP all-to-alls of one layer and pass; exposed",
    "s",
    "[USP §3]",
)
# Pipelining a collective with its multiply in k chunks hides all but the first chunk's transfer where the
# multiply is the longer, and (k - 1)/k of the multiply's time where the collective is: the share of
# _hidden, with its limit (one chunk stays exposed) built in.
define(
    "tp_overlap_share",
    "o_TP_k",
    (k_tp - 1) / k_tp,
    "share of the TP collectives that can hide under the matrix multiplies when both are split into k_tp "
    "chunks and pipelined: 0 unchunked, (t - 1)/t with Transformer Engine's userbuffers or AsyncTP",
    "1",
    "[Korthikanti22 §4.2.2], [AsyncTP]",
)
define(
    "tp_exposed_s",
    "x_TP",
    _hidden(tau_tp, W_gemm / F_gemm, o_tp),
    "TP collectives of one layer and pass left after hiding o_tp of them under the matrix multiplies",
    "s",
    "[Korthikanti22 §4.2.2]",
)
t_mm_f = define(
    "layer_gemm_fwd_s",
    "t_mm_fwd",
    W_gemm / F_gemm,
    "forward matrix multiplies of one layer, each at its own (m, n, k) per TP shard",
    "s",
    "[Megatron21 §5.1]",
)
t_mm_b = define(
    "layer_gemm_bwd_s",
    "t_mm_bwd",
    (1 + f_b) * W_gemm / F_gemm_b,
    "backward matrix multiplies of one layer: the input gradient of each and, where the base weights train, "
    "the weight gradient, at their shapes",
    "s",
    "[Megatron21 §5.1]",
)
t_fwd_c = define(
    "layer_compute_fwd_s",
    "t_fwd_c",
    t_mm_f + t_att_f + (E_lay + E_lo_f) / B_hbm,
    "forward compute of one layer: matrix multiplies, attention, memory-bound elementwise (LoRA's adapters "
    "among it)",
    "s",
    "[Megatron21 §5.1]",
)
define(
    "layer_compute_bwd_s",
    "t_bwd_c",
    t_mm_b + t_att_b + (2 * E_lay + E_lo_b) / B_hbm,
    "backward compute of one layer (matrix multiplies twice the forward)",
    "s",
    "[Megatron21 §5.1]",
)
define(
    "layer_recompute_s",
    "t_rc",
    rc_sel * t_att_f + rc_full * t_fwd_c,
    "recompute of one layer in backward: the attention core (selective) or the whole forward (full)",
    "s",
    "[Korthikanti22 §5]",
)
t_hl = define(
    "layer_host_s",
    "t_hl",
    (n_kf * (1 + rc_full) + n_kb) * t_k,
    "host time to launch one layer's kernels for one micro-batch: its forward, the forward again under full "
    "recompute, its backward",
    "s",
    "[Brrr], [CUDA-Graphs]",
)
define(
    "layer_host_wait_s",
    "t_wait",
    sympy.Max(t_hl - t_dev, 0, evaluate=False),
    "time the device waits on the host in one layer's passes: the host issues kernels one after another and "
    "the device cannot run ahead of it, so a layer takes the longer of the two",
    "s",
    "[Brrr]",
)
t_head = define(
    "head_s",
    "t_head",
    (2 + f_b) * W_head / F_head + E_loss / B_hbm,
    "output layer forward and backward with the loss, on the last pipeline stage (no weight gradient when "
    "the base is frozen)",
    "s",
    "[Megatron21 §5.1]",
)
tau_pp = define(
    "pp_send_s",
    "tau_PP",
    T_mb * H * p / (t * B_pp),
    "one stage-boundary send of a micro-batch's activations (or gradients), scattered over TP",
    "s",
    "[Megatron21 §4.1]",
)
define(
    "pp_exposed_s",
    "x_PP",
    (v_pp * pp - 1) * tau_pp * (2 + 2 * (1 - o_pp) * m_mb / pp),
    "stage-boundary sends on the critical path: the fill and drain chains, plus the share 1 - o_pp of the "
    "steady-state sends",
    "s",
    "[Megatron21 §4.1]",
)
# The pipeline: a micro-batch's pass through stage i takes L_i·t_lay, plus the output layer on the last.
# 1F1B runs m micro-batches through the slowest stage and fills and drains through the others, so a step
# takes m·T_stage + (sum of the stages - T_stage); interleaving cuts the fill and drain v-fold
# [Megatron21 §2.2]. With even stages the bubble is the textbook (pp - 1)/(v·m) of the busy time.
_last_slowest = n_last * t_lay + t_head >= sympy.Max(n_first, n_mid, evaluate=False) * t_lay
n_crit = define(
    "critical_stage_layers",
    "n_c",
    sympy.Piecewise((n_last, _last_slowest), (sympy.Max(n_first, n_mid, evaluate=False), True)),
    "layers on the pipeline stage slowest per micro-batch: the last, which also runs the output layer and "
    "the loss, unless another holds enough more layers",
    "layers",
    "[Megatron21 §2.2]",
)
h_crit = define(
    "critical_stage_head",
    "h_c",
    sympy.Piecewise((1, _last_slowest), (0, True)),
    "1 when the slowest pipeline stage is the last (it runs the output layer and loss), else 0",
    "1",
    "[Megatron21 §2.2]",
)
T_stage = define(
    "stage_max_s",
    "T_stage",
    n_crit * t_lay + h_crit * t_head,
    "one micro-batch through the slowest pipeline stage, forward and backward",
    "s",
    "[Megatron21 §2.2]",
)
T_bubble = define(
    "pipeline_bubble_s",
    "T_bubble",
    (n_L * t_lay + t_head - T_stage) / v_pp,
    "pipeline fill and drain: the other stages' share of one micro-batch's pass, cut v-fold by interleaving",
    "s",
    "[Megatron21 §2.2]",
)
define(
    "pipeline_bubble_fraction",
    "beta_PP",
    T_bubble / (m_mb * T_stage),
    "pipeline bubble over the busy time m·T_stage: (p-1)/m for 1F1B over even stages, (p-1)/(v·m) "
    "interleaved",
    "1",
    "[Megatron21 §2.2]",
)
P_dev = define(
    "device_params",
    "P_dev",
    P_t / pp,
    "parameters one device holds on average (before ZeRO-3): a TP rank's share over the pipeline's stages",
    "1",
    "[Megatron21 §3]",
)
# The ranks holding the same weights: DP x CP. A CP rank runs the whole layer on other tokens, so its
# gradients reduce, and ZeRO shards the states, over both (Megatron-Core's data-parallel group with context
# parallel, torchtitan's dp_shard_cp mesh, DeepSpeed's sequence-data-parallel group). Hybrid sharding shards
# over Z_s of them and replicates across the R_s groups: each group reduce-scatters, the groups all-reduce
# their shards, each gathers (torch's HSDP, Megatron's --num-distributed-optimizer-instances).
D_w = D * N  # the ranks holding the same weights, which reduce their gradients together
R_s = D_w / Z_s
tau_dp = define(
    "dp_comm_s",
    "tau_DP",
    (2 - z3) * (Z_s - 1) / Z_s * f_tr * P_dev * p_g / B_dp
    + 2 * (R_s - 1) / R_s * f_tr * P_dev / Z_s * p_g / B_dpr
    + n_bkt * a_dp,
    "gradient reduce-scatter plus parameter all-gather (an all-reduce's bytes) of the parameters that train "
    "over the Z_s ranks ZeRO shards over (all D·N of DP x CP unless sharding is hybrid), and the all-reduce "
    "of each shard across the D·N/Z_s hybrid groups, one call per gradient bucket; under ZeRO-3 the "
    "gathers are counted per layer instead, leaving the reduce-scatter. "
    "No latency per ring step: across many nodes NCCL reduces small buckets over trees, log D steps",
    "s",
    "[ZeRO §5], [FSDP2]",
)
define(
    "dp_exposed_s",
    "x_DP",
    tau_dp * (1 - o_dp + o_dp / n_bkt),
    "the gradient reduction after the backward ends: the last bucket of the overlapped share o_dp, and all "
    "the rest (Megatron reduces after the backward unless told to overlap)",
    "s",
    "PyTorch DDP, [Megatron21 §5]",
)
define(
    "dp_overflow_s",
    "x_DP_over",
    sympy.Max(o_dp * tau_dp * (n_bkt - 1) / n_bkt, 0),
    "the other buckets' reduction, to be compared with the last micro-batch's backward that hides it",
    "s",
    "PyTorch DDP",
)
define(
    "zero3_gather_s",
    "tau_Z3",
    z3 * 2 * (Z_s - 1) / Z_s * P_dev * p / B_dp,
    "ZeRO-3 parameter all-gathers of one micro-batch (forward and backward) over the Z_s ranks ZeRO shards "
    "over, hidden by prefetch",
    "s",
    "[ZeRO §5.3]",
)
define(
    "optimizer_s",
    "t_opt",
    (1 - o_opt) * k_opt * f_tr * P_dev * z_o / B_hbm,
    "optimizer step: Adam over the fp32 states of what trains that the device keeps (its ZeRO share z_o, all "
    "of them without ZeRO), memory-bound; none on the device under optimizer offload",
    "s",
    "[ZeRO §5]",
)
P_flop = P - (e_m - 1) * V * H  # the input embedding is a lookup, no matmul
# Model and hardware FLOP split by the precision they run in: the linear layers' multiplies (FP8 under
# --gemm-dtype) and the rest at the dtype (attention and the output layer). The FLOP formulas and the
# seconds-at-peak behind MFU and HFU are both built from these parts, so they cannot drift apart.
# A weight does 2 FLOP per token forward, 2 for its input gradient and 2 for its own gradient, which a frozen
# base weight skips (LoRA): 4 + 2·f_b; attention has no weights and keeps its 12.
k_w = 4 + 2 * f_b
mf_linear = k_w * (P_flop - H * V)
mf_rest = k_w * H * V + 12 * c * n_L * h * d * S
hf_linear = n_L * (2 + f_b + rc_full) * (W_gemm / T_mb * t)
hf_rest = n_L * (7 + 2 * rc_sel + 2 * rc_full) * c * 2 * S * h * d + k_w * H * V
mf_tok = define(
    "model_flops_per_token",
    "f_model",
    k_w * P_flop + 12 * n_L * h * d * S,
    "model FLOP per token: 6 per weight (forward and backward; 4 for a frozen one) plus attention 12·n_L·h·d·S "
    "(the full square, causal or not, as published MFUs count it)",
    "FLOP",
    "[PaLM] appendix B, [Megatron21 §5.1]",
)
define(
    "model_flops_per_token_causal",
    "f_model_c",
    mf_linear + mf_rest,
    "model FLOP per token with attention counted over the pairs the trained mask keeps (c = 1/2 causal; "
    "packed documents and windows: the share of the window's tiles the kernel executes): what MFU counts",
    "FLOP",
    "[PaLM] appendix B",
)
define(
    "model_peak_s_per_token",
    "t_model_pk",
    mf_linear / F_peak_g + mf_rest / F_peak,
    "seconds one device takes per token of model FLOP (f_model_c) at its peak: the linear layers' at the "
    "peak of their multiplies' precision, attention and the output layer at the dtype's; MFU is this share "
    "of the step's time per token, so it cannot pass 1 while no kernel outruns its peak",
    "s",
    "[PaLM] appendix B",
)
define(
    "model_square_peak_s_per_token",
    "t_square_pk",
    mf_linear / F_peak_g + (k_w * H * V + 12 * n_L * h * d * S) / F_peak,
    "t_model_pk with attention over the full S x S square (f_model), as published MFUs count a causal mask: "
    "the time behind the labelled full-square MFU of a full or causal mask",
    "s",
    "[PaLM] appendix B, [Megatron21 §5.1]",
)
define(
    "hardware_flops_per_token",
    "f_hw",
    hf_linear + hf_rest,
    "FLOP a device executes per token, recompute included and the causal half skipped",
    "FLOP",
    "[Korthikanti22 §6]",
)
define(
    "hardware_peak_s_per_token",
    "t_hw_pk",
    hf_linear / F_peak_g + hf_rest / F_peak,
    "seconds one device takes per token of what it executes (f_hw) at its peak, each part at the peak of "
    "the precision it runs in: HFU is this share of the step's time per token",
    "s",
    "[Korthikanti22 §6]",
)
define(
    "step_tokens",
    "T_step",
    b * S * m_mb * D,
    "tokens per optimizer step (global batch)",
    "tokens",
    "[Megatron21 §5.1]",
)
