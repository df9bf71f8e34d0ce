"""Formulas of the group 'inference': Inference: prefill against a cached prefix, and decode, under TP x CP x PP ([CP-Infer])."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.fit import P_layer_dev, P_stage
from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.formulas.step import _hidden
from costmodel.symbolic.symbols import (
    B_cp,
    B_cpa,
    B_hbm,
    B_pp,
    B_tp,
    F_attn,
    F_ffn,
    F_gemm,
    H,
    K_c,
    N,
    S_kv,
    T_n,
    V,
    alpha,
    alpha_cpa,
    alpha_tp,
    b,
    c,
    d,
    g,
    g_pg,
    h,
    n_first,
    n_kl,
    n_kv,
    n_L,
    n_last,
    n_mid,
    o_cp,
    p,
    p_acc,
    p_kv,
    p_w,
    pp,
    t,
    t_host,
    t_k,
    t_lf,
    x_qh,
)

GROUP = "inference"
define = definer(GROUP)

# A prefill computes T_n new tokens per sequence whose queries see K_c cached tokens and, causally, each
# other; CP splits the new tokens N ways (load-balanced) and leaves each rank (K_c + T_n)/N cached tokens.
# Three ways to bring keys to queries: pass-KV rings the K and V of every rank's tokens, pass-Q rings the
# queries and returns partial (O, LSE) by all-to-all, all-gather collects K and V first. Decode keeps
# the cache sharded: every rank attends the new token to its shard and the (O, LSE) partials are merged.
# A TP rank holds n_kv/t KV heads, at least one (replicated when t > n_kv).
_kv_tp = sympy.Max(n_kv / t, 1, evaluate=False)
# The layers of the stage holding the most: n_L at pp = 1 (n_first = n_last = n_L), else the most of an uneven
# split's stages (126 layers over 4: 31, 32, 32, 31). Its KV cache and its decode step size the device.
_stage_layers = sympy.Max(n_first, n_mid, n_last, evaluate=False)
_new = b * T_n / N  # new tokens one CP rank computes
define(
    "weight_bytes_per_device",
    "M_w",
    P_stage * p_w,
    "weights one device holds: its TP share of its pipeline stage's parameters, at p_w bytes each",
    "B",
    "[Megatron21 §3]",
)
M_kv = define(
    "kv_cache_bytes_per_device",
    "M_kv",
    b * S_kv * 2 * _kv_tp * d * p_kv * _stage_layers,
    "KV cache one device holds: b sequences x S_kv tokens x K and V of the TP rank's KV heads, for the "
    "layers of the stage holding the most",
    "B",
    "[CP-Infer]",
)
define(
    "prefill_activation_bytes",
    "A_prefill",
    _new * p * (2 * H + ((h + 2 * n_kv) * d + (2 + g) * F_ffn) / t)
    + 2 * b * (T_n + K_c) / N * 2 * _kv_tp * d * p
    + _new * h / t * (d + 1) * p_acc,
    "working set of one layer's prefill per device (no backward keeps anything): the residual and "
    "normed input, the QKV and MLP intermediates, two KV blocks in flight and the fp32 (O, LSE) "
    "accumulators",
    "B",
    "[Korthikanti22 §4.1], [RingAttn §3]",
)
W_pf = define(
    "prefill_attn_flops",
    "W_prefill",
    4 * b * (h / t) * d * T_n * (K_c + c * T_n) / N,
    "attention FLOP of one layer's prefill per device: T_n new queries see the K_c cached keys and, "
    "causally (c = 1/2), the new ones; balanced over the N ranks",
    "FLOP",
    "[CP-Infer], [FA2 §4]",
)
C_pkv = define(
    "passkv_step_bytes",
    "C_passKV",
    b * (T_n + K_c) / N * 2 * _kv_tp * d * p,
    "pass-KV: K and V of one rank's cached and new tokens, sent by each TP rank every ring step",
    "B",
    "[CP-Infer]",
)
C_pq = define(
    "passq_step_bytes",
    "C_passQ",
    _new * (h / t) * d * p,
    "pass-Q: the queries of one rank's new tokens, sent by each TP rank every ring step",
    "B",
    "[CP-Infer]",
)
C_pqo = define(
    "passq_return_bytes",
    "C_passQ_out",
    (N - 1) * _new * (h / t) * (d * p + p_acc),
    "pass-Q: partial outputs and their fp32 LSE that one rank receives back from the others by all-to-all",
    "B",
    "[CP-Infer], [OnlineSoftmax]",
)
C_agp = define(
    "prefill_allgather_bytes",
    "C_AG_prefill",
    (N - 1) * C_pkv,
    "all-gather: K and V of every other rank's cached and new tokens, received before attention",
    "B",
    "[Llama3 §3.3], [CP-Infer]",
)
t_pf = define(
    "prefill_attn_s",
    "t_att_prefill",
    W_pf / F_attn,
    "attention of one layer's prefill on one device",
    "s",
    "[FA2 §4]",
)
tau_pkv = define(
    "passkv_comm_s",
    "tau_passKV",
    (N - 1) * (alpha + C_pkv / B_cp),
    "pass-KV ring transfers of one layer: N-1 steps",
    "s",
    "[CP-Infer], [RingAttn §3]",
)
tau_pq = define(
    "passq_comm_s",
    "tau_passQ",
    (N - 1) * (alpha + C_pq / B_cp),
    "pass-Q ring transfers of one layer: N-1 steps",
    "s",
    "[CP-Infer]",
)
define(
    "passkv_exposed_s",
    "x_passKV",
    _hidden(tau_pkv, t_pf, o_cp),
    "pass-KV transfers left on the critical path after hiding o_cp of them under the attention",
    "s",
    "[CP-Infer], [RingAttn §3]",
)
define(
    "passq_exposed_s",
    "x_passQ",
    _hidden(tau_pq, t_pf, o_cp) + 2 * alpha_cpa + C_pqo / B_cpa,
    "pass-Q: the query ring left after hiding under the attention, plus the all-to-alls that return the "
    "partial outputs and their LSE (two calls, on the group's all-to-all link), which wait for the last step",
    "s",
    "[CP-Infer]",
)
define(
    "prefill_allgather_s",
    "tau_AG_prefill",
    (N - 1) * alpha + C_agp / B_cp,
    "all-gather of K and V before attention, exposed",
    "s",
    "[Llama3 §3.3]",
)
define(
    "passkv_hidden_min_new_tokens",
    "T_hide",
    N * _kv_tp * p * F_attn / (2 * (h / t) * B_cp),
    "new tokens per sequence from which a pass-KV ring step hides under its attention step (every pair "
    "visible, alpha = 0): from there pass-KV costs nothing extra and wins",
    "tokens",
    "[CP-Infer] (pass-KV vs pass-Q heuristic)",
)
define(
    "passq_max_new_fraction",
    "f_passQ",
    2 * _kv_tp / (h / t),
    "share of new tokens T_n/(T_n + K_c) below which a pass-Q ring step moves fewer bytes than a "
    "pass-KV step: 2·n_kv/h",
    "1",
    "[CP-Infer] (pass-KV vs pass-Q heuristic)",
)
define(
    "layer_weight_read_s",
    "t_w_layer",
    P_layer_dev * p_w / B_hbm,
    "reading one layer's weights from HBM once: the floor under its matrix multiplies",
    "s",
    "[Roofline]",
)
define(
    "output_weight_read_s",
    "t_w_out",
    V * H * p_w / (t * B_hbm),
    "reading the output layer's weights (vocabulary x hidden, vocab-parallel) from HBM once: the floor "
    "under the first token's logits",
    "s",
    "[Roofline]",
)
t_w_dec = define(
    "decode_weight_read_s",
    "t_w_decode",
    P_stage * p_w / B_hbm,
    "reading one stage's weights from HBM once per decode step",
    "s",
    "[Roofline]",
)
# A kernel that reads by query head reads its KV head's cache once for each of the h/t query heads on the rank,
# over its _kv_tp KV heads: h/n_kv times the bytes, or h/t where TP replicates the KV heads. An upper bound on the
# traffic: where the blocks of one KV head run side by side, L2 serves part of the re-reads.
_kv_reads = 1 + x_qh * (h / (t * _kv_tp) - 1)
t_kv_dec = define(
    "decode_kv_read_s",
    "t_kv_decode",
    M_kv * _kv_reads / B_hbm,
    "reading one device's KV cache once per decode step, or once per query head where the kernel reads by "
    "query head (x_qh = 1)",
    "s",
    "[Roofline], [CP-Infer], [TRTLLM-MMHA]",
)
t_g_dec = define(
    "decode_gemm_compute_s",
    "t_gemm_decode",
    2 * b * P_stage / F_gemm,
    "FLOP of one decode step's matrix multiplies on one stage: 2 per weight per sequence",
    "s",
    "[Roofline]",
)
t_a_dec = define(
    "decode_attention_compute_s",
    "t_attn_decode",
    4 * b * (h / t) * d * S_kv * _stage_layers / F_attn,
    "FLOP of one decode step's attention on one stage: the new queries against the rank's cache",
    "s",
    "[Roofline]",
)
define(
    "decode_compute_s",
    "t_c_decode",
    t_g_dec + t_a_dec,
    "FLOP of one decode step on one stage: its multiplies' and its attention's",
    "s",
    "[Roofline]",
)
C_merge = define(
    "decode_merge_bytes",
    "C_merge",
    (N - 1) * b * (h / t) * (d * p + p_acc),
    "decode under CP, one layer: the partial output and fp32 LSE of every other CP rank for the new "
    "token, received by an all-gather and merged by log-sum-exp",
    "B",
    "[CP-Infer], [OnlineSoftmax]",
)
tau_merge = define(
    "decode_merge_s",
    "tau_merge",
    (N - 1) * alpha + C_merge / B_cp,
    "all-gather of (O, LSE) for one layer: N-1 ring steps of alpha each, latency-bound at decode sizes",
    "s",
    "[CP-Infer], [A-SPDeep]",
)
tau_tp_dec = define(
    "decode_tp_s",
    "tau_TP_decode",
    2 * (2 * (t - 1) * alpha_tp + 2 * (t - 1) / t * b * H * p / B_tp),
    "two ring all-reduces (attention and MLP outputs) of the new tokens' hidden states per layer, "
    "2(t-1) steps each",
    "s",
    "[Megatron21 §3], [A-SPDeep]",
)
t_fix = define(
    "inference_layer_fixed_s",
    "t_fix",
    t_lf + n_kl * t_k,
    "fixed cost of one inference layer beyond its modelled work: the scheme's measured fixed cost on a "
    "calibrated machine, plus the launches the device waits for",
    "s",
    "[A-RingCost §11], [CUDA-Graphs]",
)
define(
    "passkv_page_gather_s",
    "t_gather",
    g_pg * 2 * C_pkv / B_hbm,
    "pass-KV over a paged cache, one layer: each rank reads its KV pages and writes them into one "
    "contiguous block before the ring sends it (the kernel's stack of K and V)",
    "s",
    "[PagedAttention], [CP-Infer]",
)
t_pmerge = define(
    "decode_partial_merge_s",
    "t_merge_decode",
    (N - 1) * b * (h / t) * 3 * (d + 1) * p_acc / B_hbm,
    "decode under CP, one layer: merging the N-1 other ranks' partial (O, LSE) of the new token into the "
    "own by log-sum-exp, in fp32 (each merge reads two and writes one)",
    "s",
    "[OnlineSoftmax], [CP-Infer]",
)
t_sample = define(
    "decode_sampling_s",
    "t_sample",
    2 * b * V * p_acc / B_hbm,
    "sampling one token per sequence: the fp32 logits read by the softmax and again by the sampler",
    "s",
    "[Roofline]",
)
define(
    "tpot_s",
    "t_token",
    pp * (sympy.Max(t_w_dec, t_g_dec, evaluate=False) + sympy.Max(t_kv_dec, t_a_dec, evaluate=False))
    + n_L * (tau_merge + tau_tp_dec + t_pmerge + t_fix)
    + (pp - 1) * (alpha + b * H * p / B_pp)
    + t_sample
    + t_host,
    "time per output token: each stage in turn runs its multiplies, each bound by reading its weights "
    "or by its FLOP, then its attention, bound by reading the KV cache or by its FLOP (separate kernels, "
    "one after the other), every layer merges over CP, all-reduces over TP and pays its fixed cost, the "
    "stages hand the token on, it is sampled, and the host prepares the next step",
    "s",
    "[Roofline], [CP-Infer]",
)

# --- Topology: the links a group's collective waits on, from the network's shape ([Dally-Towles ch. 3], ----
# [ScalingBook], [RailOnly]). A group's shape in the fast domain comes from costmodel.machines.topology.
