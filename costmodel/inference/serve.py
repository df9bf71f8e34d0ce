"""Memory, time to first token and time per output token of one long-context request ([CP-Infer]).

Every quantity is a formula of the "inference" group of :mod:`costmodel.symbolic.formulas` or of the
training step's ("step" group, evaluated at the prefill's new tokens); this module binds them to the model
preset and the machine (links and kernel rates through :class:`~costmodel.machines.binding.Machine`, as
:mod:`costmodel.training.step` does) and adds the terms.

Ranks are placed TP innermost, then CP, then PP. A prefill of ``prompt`` new tokens after ``cached`` ones
runs in chunks; each chunk's queries see the cache and the chunks before it. The stages of a pipeline
take a chunk in turn, so with PP the chunks overlap and the prefill costs the chunks' sum plus the
slowest chunk once per further stage. Decode keeps the cache sharded over CP ranks and merges their
partial (O, LSE) for every new token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from costmodel.core.errors import InputError
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.frameworks.profiles import FUSED_MERGE_BYTES
from costmodel.inference.report import (
    SCHEMA,
    Decode,
    DecodeLayout,
    DecodeTarget,
    FitsWith,
    Inference,
    InferenceReport,
    Memory,
    Prefill,
    PrefillBreakdown,
    SchemeTime,
    ServingLayout,
    ServingSearch,
    Target,
)
from costmodel.inference.setup import MAX_CHUNKS, InferenceSetup
from costmodel.machines.binding import Collective, Machine
from costmodel.machines.profiles import BYTES_PER_ELEMENT
from costmodel.plans import cp as registry
from costmodel.plans.bind import (
    Evaluation,
    Evaluator,
    attention_shape,
    call,
    layer_shape,
    layout_degrees,
    overlaps,
)
from costmodel.plans.cp import PREFILL, pass_kv, pass_q
from costmodel.plans.inputs import (
    MAX_CP,
    MachineOverrides,
    Parallelism,
    PlanInputs,
    job_machine,
    reading_kernel,
)
from costmodel.plans.models import ModelPreset, load_model
from costmodel.plans.rates import layer_gemm_rate
from costmodel.plans.stages import check_stages
from costmodel.plans.uncertainty import serving_interval, serving_memory_interval
from costmodel.schedule.layouts import divisors
from costmodel.symbolic import numeric

SCHEMES = registry.names(PREFILL)
# A datasheet profile states no latency; a few microseconds per step is the order of NCCL's low-latency
# protocol on NVLink and InfiniBand. A stated assumption: calibrate the profile or pass --comm-latency.
DEFAULT_LATENCY_S = 5e-6
RIDGE_SQUARE = 8192  # a multiply on the plateau of every profile's table
# B_hbm of a profile that states none (a measured CPU profile): so large that the memory terms vanish, and
# finite, since the compiled formulas' simplified forms would divide infinity by infinity.
UNSTATED_HBM_BANDWIDTH = 1e30
# Kernels one decode layer launches in an eager framework, without TP: two norms, the QKV projection, the
# rotary embedding, the cache write, attention, the output projection and its residual add, the gate-up
# projection, the activation, the down projection and its residual add (TP adds two all-reduces). Counted
# from the layer's operations, as unfused kernels; a fused implementation launches fewer.
LAYER_KERNELS = 12

# Where serving binds the step's shared symbols otherwise than training: every norm and residual runs whole
# on each TP rank (no sequence parallelism), nothing is recomputed (there is no backward), and alpha_tp is
# the stated or default latency per message with the call's fixed part included; serving engines run their
# norms, rotary and activation as fused kernels (vLLM's and SGLang's custom ops) and their attention reads
# GQA's KV heads as they are.
SERVING = {"sigma": 0, "rc_sel": 0, "rc_full": 0, "a_tp": 0.0, "x_eager": 0, "x_rep": 0}


def _call(name: str, values: dict[str, Any], trace: list[Evaluation] | None = None) -> float:
    """One formula at ``values``; ``trace`` records it (``--explain``)."""
    if trace is None:
        return float(call(name, values))
    return float(Evaluator(values, trace)(name))


def _check(setup: InferenceSetup, model: ModelPreset) -> int:
    """The chunk size; one line naming the flag for any impossible combination."""
    Parallelism.of(setup).check(model)  # the layout's one check: TP against the heads, the stages
    if setup.prompt % setup.cp:
        raise InputError("--prompt", f"{setup.prompt} tokens do not split evenly over --cp {setup.cp} ranks")
    context = setup.cached + setup.prompt + setup.output
    if model.context_length is not None and context > model.context_length:
        raise InputError(
            "--prompt",
            f"cached + prompt + output = {context:,} tokens exceeds the model's context of "
            f"{model.context_length:,}",
        )
    chunk = setup.prompt if setup.chunk is None else setup.chunk
    if chunk > setup.prompt:
        raise InputError("--chunk", f"{chunk} is longer than the prompt of {setup.prompt} tokens")
    if chunk % setup.cp:
        raise InputError("--chunk", f"{chunk} tokens do not split evenly over --cp {setup.cp} ranks")
    if -(-setup.prompt // chunk) > MAX_CHUNKS:
        raise InputError("--chunk", f"{chunk} cuts the prompt into more than {MAX_CHUNKS} chunks")
    return chunk


@dataclass(frozen=True)
class Serving:
    """One request bound once: its setup, the attention layers' inputs, the model, the machines that run its
    attention (at the attention dtype) and its multiplies (at the weights'), and the prefill's chunk."""

    setup: InferenceSetup
    inputs: PlanInputs
    model: ModelPreset
    attention: Machine
    gemm: Machine
    chunk: int

    @classmethod
    def of(cls, setup: InferenceSetup, overrides: MachineOverrides | None) -> Serving:
        """The request checked and bound: one line naming the flag for anything it cannot serve."""
        if setup.model is None:
            raise InputError(
                "--model",
                "inference needs a model preset (layers, hidden size, vocabulary); e.g. --model llama3-70b",
            )
        model = load_model(setup.model)
        if model.mla is not None:  # a decode cache of latents, read through absorbed projections
            raise InputError(
                "--model",
                f"{setup.model} uses multi-head latent attention, whose cache holds latents; infer models "
                "caches of K and V heads (cp-plan step and recommend model MLA training)",
            )
        if (
            model.experts
        ):  # its weights, reads and FLOP per token differ from a dense layer's: never undercount
            raise InputError(
                "--model",
                f"{setup.model} is a mixture of experts ({model.experts} experts); infer models dense layers "
                "only (cp-plan step and recommend model MoE training)",
            )
        inputs = setup.attention_inputs()
        chunk = _check(setup, model)
        attention = reading_kernel(job_machine(inputs, overrides), setup.attention_kernel)
        return cls(setup, inputs, model, attention, _machine(attention, setup.weights, "--weights"), chunk)

    def at(self, **degrees: int) -> Serving:
        """The same request on another layout (``tp``, ``cp``, ``pp``), its chunk as stated."""
        return replace(self, setup=self.setup.model_copy(update=degrees))


def _machine(machine: Machine, dtype: str, flag: str) -> Machine:
    if dtype not in machine.profile.device.peak_flops:
        raise InputError(flag, f"{machine.profile.origin} has no {dtype} FLOP/s")
    return machine.at(dtype)


def _link(
    machine: Machine, stride: int, size: int, latency: float | None, collective: Collective = "p2p"
) -> tuple[float, float]:
    """(B, alpha) of a ``collective`` over a group of ``size`` ranks ``stride`` apart."""
    link = machine.placed(stride).link(size, collective)
    alpha = latency if latency is not None else (link.latency_s or DEFAULT_LATENCY_S)
    return link.bandwidth, alpha


def bind(job: Serving, cp: int | None = None) -> dict[str, Any]:
    """The base symbols every inference formula shares (the chunk's T_n, K_c, S, F_attn, F_gemm are set
    per chunk). ``cp`` replaces the CP degree (decode's comparison with CP 1, the target search)."""
    setup, machine = job.setup, job.attention
    if machine.profile.device.hbm_bandwidth is None:
        raise InputError("--hw", f"{machine.profile.origin} states no hbm_bandwidth; decode reads HBM")
    return {
        **attention_bind(job.inputs, setup, machine, cp),
        **layer_shape(job.model),
        **check_stages(job.model.layers, setup.pp).values(),  # the most loaded stage holds the weights read
        "n_kl": 0 if setup.cuda_graphs else LAYER_KERNELS + (2 if setup.tp > 1 else 0),
    }


def attention_bind(
    inputs: PlanInputs, setup: InferenceSetup, machine: Machine, cp: int | None = None
) -> dict[str, Any]:
    """The symbols of the attention layers (the plan's heads) and the links, without the model's weights:
    what `cp-plan validate` predicts the reference kernel's inference runs with. A profile stating no HBM
    bandwidth (a measured CPU profile) gets no memory terms: its measured rates already include the
    kernel's reads."""
    t, n, pp = setup.tp, setup.cp if cp is None else cp, setup.pp
    device, kernels = machine.profile.device, machine.profile.kernels
    b_tp, alpha_tp = _link(machine, 1, t, setup.comm_latency)
    b_cp, alpha_cp = _link(machine, t, n, setup.comm_latency)
    b_cpa, alpha_cpa = _link(machine, t, n, setup.comm_latency, "alltoall")
    b_pp, _ = _link(machine, t * n, pp, setup.comm_latency)
    if machine.calibrated:  # the measured fixed cost per waited ring step
        launch = machine.fixed("step_overhead_s")
    else:
        launch = kernels.ring_step_launch_s if kernels else 0.0
    shape = attention_shape(inputs, n)
    del shape["S"]  # serving's S is a chunk's context, set per chunk and per decoded token
    return {
        **shape,
        **layout_degrees(t, pp, {}),
        "p_w": BYTES_PER_ELEMENT[setup.weights],
        "p_kv": BYTES_PER_ELEMENT[setup.kv_dtype],
        "x_qh": int(setup.decode_kv_reads == "per-query-head"),
        "c": 0.5,
        "k_merge": FUSED_MERGE_BYTES,  # the merge as one fused kernel
        "k_copy": 1.0,  # a load-balanced (zigzag) shard copies its queries per step, as training's ring
        "B_hbm": device.streaming_bandwidth or UNSTATED_HBM_BANDWIDTH,
        "B_tp": b_tp,
        "B_cp": b_cp,
        "B_pp": b_pp,
        "alpha": alpha_cp,
        "B_cpa": b_cpa,
        "alpha_cpa": alpha_cpa,
        "alpha_tp": alpha_tp,
        **overlaps(machine, t, setup.tp_comm_overlap, setup.cp_overlap),
        "t_launch": launch,
        **SERVING,
        "t_lf": 0.0,  # a calibrated machine's fixed cost per scheme: set where the scheme is known
        "n_kl": 0,  # set by bind: a model's layer launches when decode runs without CUDA graphs
        "t_k": kernels.launch_s if kernels else 0.0,
        "t_host": setup.host_overhead,
        "g_pg": int(setup.page > 0),
    }


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page) * page if page else tokens


def _kv_tokens(context: int, n: int, page: int) -> int:
    """Cache tokens per sequence on the CP rank holding most, rounded up to whole pages."""
    return _pages(-(-context // n), page)


def _attention_rate(machine: Machine, scheme: str, values: dict[str, Any]) -> float:
    """F_attn of a chunk: its FLOP over the seconds of its kernel calls. A ring step's queries are a rank's
    T_n/N new tokens: at the own step one call against the rank's K_c/N cached keys and one, causal,
    against its own new ones; at each other step one call against the keys it sees there, the cached
    ones and (load-balanced) c of the new ones. All-gather: one call against every key."""
    n, d = values["N"], values["d"]
    queries, cached, new = values["T_n"] / n, values["K_c"] / n, values["T_n"] / n
    pair = numeric.pair_flops(b=values["b"], h=values["h"] / values["t"], d=d)
    if not registry.get(scheme).ring or n == 1:
        calls = [(queries, (cached + new) * n, True, 1.0)]
    else:
        calls = [(queries, cached, False, 1.0), (queries, new, True, 1.0)]
        calls.append((queries, cached + values["c"] * new, False, n - 1.0))
    work = spent = 0.0
    for q, k, causal, count in calls:
        if q * k <= 0:
            continue
        flops = pair * q * k * (0.5 if causal else 1.0)
        work += count * flops
        spent += count * flops / machine.call_rate(flops, causal, n, q, k, d)
    return work / spent


def prefill_attention(
    values: dict[str, Any], scheme: str, attention: Machine, trace: list[Evaluation] | None = None
) -> dict[str, float]:
    """Seconds of one layer's attention in a chunk with ``scheme``, per field of
    :class:`~costmodel.inference.report.PrefillBreakdown`, and its rate ``_F_attn`` (``values`` holds the
    chunk's T_n and K_c)."""
    v = {**values, "S": values["T_n"]}  # the step formulas read the chunk's tokens as S
    v["F_attn"] = _attention_rate(attention, scheme, v)
    kind = registry.get(scheme)
    ring = v["N"] > 1 and kind.ring
    cp = 0.0 if v["N"] == 1 else _call(kind.prefill_exposed, v, trace)
    gather = _call(kind.prefill_extra, v, trace) if ring and kind.prefill_extra else 0.0
    return {
        "attention_s": _call("prefill_attn_s", v, trace),
        "exposed_cp_s": cp,
        "cp_ring_overhead_s": (_call("ring_overhead_s", v, trace) if ring else 0.0) + gather,
        # a prefill's launches hide under its long kernels: only a calibrated scheme's fixed cost is charged
        "fixed_s": _call(
            "inference_layer_fixed_s", {**v, "t_lf": attention.inference_overhead(scheme), "n_kl": 0}, trace
        ),
        "_F_attn": v["F_attn"],
    }


def _chunk_layer(
    job: Serving, values: dict[str, Any], scheme: str, trace: list[Evaluation] | None = None
) -> dict[str, float]:
    """Seconds per component of one layer of one chunk (``values`` holds its T_n and K_c)."""
    v = {**values, "S": values["T_n"]}  # the step formulas read the chunk's tokens as S
    parts = prefill_attention(values, scheme, job.attention, trace)
    v["F_gemm"] = layer_gemm_rate(job.model, job.gemm, v["t"], v["b"] * v["T_n"] // v["N"])
    return {
        "matmul_s": max(
            _call("layer_gemm_flops", v, trace) / v["F_gemm"], _call("layer_weight_read_s", v, trace)
        ),
        "elementwise_s": _call("layer_elementwise_bytes", v, trace) / v["B_hbm"],
        "exposed_tp_s": _call("tp_exposed_s", v, trace) if v["t"] > 1 else 0.0,
        **parts,
        "_F_gemm": v["F_gemm"],
    }


def _chunks(setup: InferenceSetup, chunk: int) -> list[tuple[int, int]]:
    """(new tokens, cached tokens before it) of every chunk."""
    return [
        (min(chunk, setup.prompt - start), setup.cached + start) for start in range(0, setup.prompt, chunk)
    ]


def prefill(
    job: Serving, values: dict[str, Any], scheme: str, trace: list[Evaluation] | None = None
) -> tuple[float, PrefillBreakdown, dict[str, float]]:
    """(TTFT, breakdown summing to it, rates of the first chunk) of the prefill with ``scheme``; ``trace``
    records the first chunk's formulas and the output layer's (``--explain``)."""
    setup = job.setup
    stage_layers = job.model.layers / setup.pp
    breakdown = dict.fromkeys(PrefillBreakdown.model_fields, 0.0)
    stages, rates = [], {}
    for new, cached in _chunks(setup, job.chunk):
        v = {**values, "T_n": new, "K_c": cached}
        first = trace if not rates else None  # the first chunk's formulas stand for every chunk's
        layer = _chunk_layer(job, v, scheme, first)
        chunk_rates = {"attention": layer.pop("_F_attn"), "gemm": layer.pop("_F_gemm")}
        rates = rates or chunk_rates  # the first chunk's, as reported
        for name, seconds in layer.items():
            breakdown[name] += stage_layers * seconds
        stages.append(stage_layers * sum(layer.values()))
        if setup.pp > 1:
            send = _call("pp_send_s", {**v, "S": new}, first)
            breakdown["pipeline_send_s"] += (setup.pp - 1) * (v["alpha"] + send)
    if setup.pp > 1:  # chunks flow through the stages: each further stage adds the slowest chunk once
        breakdown["pipeline_fill_s"] = (setup.pp - 1) * max(stages)
    # The first token's logits: one token per sequence through the output layer, which reads all its
    # weights (the HBM floor; at one token the FLOP alone take microseconds).
    head = {**values, "S": 1, "N": 1}
    breakdown["output_layer_s"] = max(
        _call("head_flops", head, trace) / rates["gemm"], _call("output_weight_read_s", head, trace)
    )
    return sum(breakdown.values()), PrefillBreakdown(**breakdown), rates


def decode_attention_rate(attention: Machine, values: dict[str, Any], context: int) -> float:
    """F_attn of a decode step: the new token's query against the rank's share of ``context`` cached keys,
    one call of that many FLOP."""
    keys = max(context // values["N"], 1)
    flops = numeric.pair_flops(b=values["b"], h=values["h"] / values["t"], d=values["d"]) * keys
    return attention.call_rate(flops, False, values["N"], 1, keys, values["d"])


def decode_values(
    values: dict[str, Any],
    context: int,
    page: int,
    gemm_rate: float,
    attn_rate: float,
    attention: Machine | None = None,
) -> dict[str, Any]:
    """The symbols of a decode step with ``context`` tokens cached (each rank's share rounded up to pages);
    ``attention``: the machine whose measured decode fixed cost it pays."""
    return {
        **values,
        "S_kv": _kv_tokens(context, values["N"], page),
        "F_gemm": gemm_rate,
        "F_attn": attn_rate,
        "t_lf": attention.inference_overhead("decode") if attention is not None else values.get("t_lf", 0.0),
    }


def _multiplies_past_ridge(gemm: Machine, values: dict[str, Any]) -> bool:
    """Whether a decode step's multiplies are past the device's ridge [Roofline]: at the plateau of its
    multiply table their FLOP take longer than reading their weights."""
    plateau = gemm.gemm_rate(RIDGE_SQUARE, RIDGE_SQUARE, RIDGE_SQUARE)
    flops_s = _call("decode_gemm_compute_s", {**values, "F_gemm": plateau})
    return flops_s >= _call("decode_weight_read_s", values)


def decode(job: Serving, values: dict[str, Any], trace: list[Evaluation] | None = None) -> dict[str, Any]:
    """TPOT over the output, its parts at the last token, and what CP changes against CP 1; ``trace``
    records the last token's formulas (``--explain``)."""
    setup = job.setup
    start = setup.cached + setup.prompt
    end = start + max(setup.output - 1, 0)
    # a memory-bound decode's kernels run at the boost clock; past the ridge its multiplies are bound by their
    # FLOP and draw the power that holds a compute-bound step at its sustained clock
    gemm = job.gemm if _multiplies_past_ridge(job.gemm, values) else job.gemm.at_boost()
    gemm_rate = layer_gemm_rate(job.model, gemm, setup.tp, values["b"])
    attn_rate = decode_attention_rate(job.attention.at_boost(), values, start)

    def at(context: int, trace: list[Evaluation] | None = None) -> tuple[dict[str, Any], float]:
        v = decode_values(values, context, setup.page, gemm_rate, attn_rate, job.attention)
        return v, _call("tpot_s", v, trace)

    _, first = at(start)
    last_v, last = at(end, trace)
    pp, layers = setup.pp, job.model.layers

    def term(name: str) -> float:
        return _call(name, last_v, trace)

    return {
        "first": first,
        "last": last,
        "weight_read_s": pp * term("decode_weight_read_s"),
        "kv_read_s": pp * term("decode_kv_read_s"),
        "compute_s": pp * term("decode_compute_s"),
        "matmul_compute_s": pp * term("decode_gemm_compute_s"),
        "attention_compute_s": pp * term("decode_attention_compute_s"),
        "cp_merge_s": layers * term("decode_merge_s"),
        "tp_s": layers * term("decode_tp_s"),
        "partial_merge_s": layers * term("decode_partial_merge_s"),
        "fixed_s": layers * term("inference_layer_fixed_s"),
        "sampling_s": term("decode_sampling_s"),
        "host_s": last_v["t_host"],
        "merge_bytes_per_layer": term("decode_merge_bytes"),
        "rates": (gemm_rate, attn_rate),
    }


def memory(job: Serving, values: dict[str, Any]) -> dict[str, Any]:
    """Weights, cache at the end of the output, the largest chunk's working set, and the largest batch
    and context that fit."""
    setup = job.setup
    usable = job.attention.profile.device.usable_bytes * (1 - setup.memory_headroom)
    context = setup.cached + setup.prompt + setup.output
    kv_tokens = _kv_tokens(context, values["N"], setup.page)
    weights = _call("weight_bytes_per_device", values)
    chunks = _chunks(setup, job.chunk)
    working = max(  # the first chunk computes the most new tokens, the last carries the most cache
        _call("prefill_activation_bytes", {**values, "T_n": new, "K_c": cached})
        for new, cached in (chunks[0], chunks[-1])
    )
    kv = _call("kv_cache_bytes_per_device", {**values, "S_kv": kv_tokens})
    one = _call("kv_cache_bytes_per_device", {**values, "S_kv": kv_tokens, "b": 1})
    per_token = _call("kv_cache_bytes_per_device", {**values, "S_kv": 1})
    working_one = working / values["b"]
    room = usable - weights
    max_tokens = max(0, math.floor((room - working) / per_token)) if per_token else 0
    if setup.page:
        max_tokens -= max_tokens % setup.page
    return {
        "usable_bytes": usable,
        "weight_bytes_per_device": weights,
        "kv_cache_bytes_per_device": kv,
        "kv_cache_tokens_per_rank": kv_tokens,
        "prefill_activation_bytes": working,
        "bytes_per_device": weights + kv + working,
        "free_bytes": max(0.0, room - kv - working),
        "shortfall_bytes": max(0.0, kv + working - room),
        "fits": room - kv - working >= 0,
        "max_batch": max(0, math.floor(room / (one + working_one))),  # both scale with the batch
        "max_context_tokens": max_tokens * values["N"],
    }


def _rule(
    values: dict[str, Any], setup: InferenceSetup, attention_rate: float
) -> tuple[str, float, float, float]:
    """The published pass-KV / pass-Q rule on the whole request: pass-KV once its ring step hides under
    attention or once new tokens are a large enough share that its steps are the smaller ([CP-Infer])."""
    v = {**values, "T_n": setup.prompt, "K_c": setup.cached, "F_attn": attention_rate}
    hide = _call("passkv_hidden_min_new_tokens", v)
    share = _call("passq_max_new_fraction", v)
    fraction = setup.prompt / (setup.prompt + setup.cached)
    scheme = pass_kv.NAME if setup.prompt >= hide or fraction >= share else pass_q.NAME
    return scheme, hide, share, fraction


def _ttft_schemes(job: Serving, values: dict[str, Any]) -> dict[str, tuple[float, PrefillBreakdown, dict]]:
    setup = job.setup
    schemes = SCHEMES if values["N"] > 1 else (registry.default(PREFILL).name,)
    if setup.prefill_scheme != "auto" and values["N"] > 1:
        schemes = (setup.prefill_scheme, *(s for s in SCHEMES if s != setup.prefill_scheme))
    return {s: prefill(job, values, s) for s in schemes}


def _chosen(setup: InferenceSetup, timed: dict[str, tuple[float, dict, dict]]) -> str:
    if setup.prefill_scheme != "auto" and setup.prefill_scheme in timed:
        return setup.prefill_scheme
    return min(timed, key=lambda s: timed[s][0])


def _target(job: Serving) -> Target:
    """The fewest CP ranks, powers of two, whose prefill meets --target-ttft and whose memory fits."""
    setup, goal = job.setup, job.setup.target_ttft
    n = 1
    while n <= MAX_CP:
        if setup.prompt % n == 0 and job.chunk % n == 0 and n <= setup.prompt:
            try:
                values = bind(job, cp=n)
            except InputError:  # the profile has no link for a group this large
                break
            timed = _ttft_schemes(job, values)
            scheme = _chosen(setup, timed)
            ttft = timed[scheme][0]
            if ttft <= goal and memory(job, values)["fits"]:
                return Target(
                    target_ttft_s=goal, cp=n, gpus=setup.tp * n * setup.pp, ttft_s=ttft, scheme=scheme
                )
        n *= 2
    return Target(target_ttft_s=goal, cp=None, gpus=None, ttft_s=None, scheme=None)


def _fits_with(job: Serving) -> FitsWith:
    """The fewest CP ranks (doubling from the stated degree) whose memory fits the request; where none up to
    the largest CP does, the smallest TP (doubling, dividing the KV heads) at the stated CP."""
    setup, model = job.setup, job.model

    def fits(**degrees: int) -> bool:
        changed = job.at(**degrees)
        try:
            _check(changed.setup, model)
            values = bind(changed, cp=changed.setup.cp)
        except InputError:  # a degree the prompt, the heads or the profile's links refuse
            return False
        return bool(memory(changed, values)["fits"])

    n = setup.cp * 2
    while n <= MAX_CP:
        if setup.prompt % n == 0 and job.chunk % n == 0 and fits(cp=n):
            return FitsWith(cp=n, tp=None, gpus=setup.tp * n * setup.pp)
        n *= 2
    t = setup.tp * 2
    while t <= model.kv_heads:
        if model.kv_heads % t == 0 and fits(tp=t):
            return FitsWith(cp=None, tp=t, gpus=t * setup.cp * setup.pp)
        t *= 2
    return FitsWith(cp=None, tp=None, gpus=None)


def _decode_layout(job: Serving, tp: int, cp: int) -> DecodeLayout | None:
    """The largest batch within --target-tpot whose caches fit, on TP x CP; None when TP does not divide
    the heads or the profile has no link for the group."""
    setup = job.setup
    if job.model.heads % tp or setup.prompt % cp or job.chunk % cp:
        return None
    layout = job.at(tp=tp, cp=cp)
    try:
        base = bind(layout)
    except InputError:
        return None
    goal = setup.target_tpot

    def at(batch: int) -> tuple[float, bool]:
        values = {**base, "b": batch}
        dec = decode(layout, values)
        return (dec["first"] + dec["last"]) / 2, memory(layout, values)["fits"]

    asked, asked_fits = at(setup.batch)
    cap = memory(layout, {**base, "b": 1})["max_batch"]
    low, high = 0, cap  # the largest batch within the target: TPOT grows with the batch
    while low < high:
        middle = (low + high + 1) // 2
        seconds, fits = at(middle)
        if seconds <= goal and fits:
            low = middle
        else:
            high = middle - 1
    best = at(low)[0] if low else None
    limited = "none" if cap == 0 else ("memory" if low == cap else "tpot")
    return DecodeLayout(
        tp=tp,
        cp=cp,
        tpot_s=asked if asked_fits else None,
        max_batch=low,
        tpot_at_max_batch_s=best,
        tokens_per_s=low / best if best else 0.0,
        limited_by=limited,
    )


def _decode_target(job: Serving) -> DecodeTarget:
    """--target-tpot on the asked layout and on its GPUs all in TP."""
    setup = job.setup
    mine = _decode_layout(job, setup.tp, setup.cp)
    assert mine is not None  # the asked layout was checked
    other = _decode_layout(job, setup.tp * setup.cp, 1) if setup.cp > 1 else None
    beats = None
    if other is not None:
        if mine.tokens_per_s != other.tokens_per_s:
            beats = mine.tokens_per_s > other.tokens_per_s
        else:
            beats = (mine.tpot_s or math.inf) < (other.tpot_s or math.inf)
    return DecodeTarget(target_tpot_s=setup.target_tpot, cp_layout=mine, tp_layout=other, cp_beats_tp=beats)


def evaluate_infer(
    setup: InferenceSetup,
    overrides: MachineOverrides | None = None,
    trace: list[Evaluation] | None = None,
    level: float = DEFAULT_LEVEL,
) -> InferenceReport:
    """Memory, TTFT with every CP scheme and the one chosen, TPOT, and the target search when asked;
    ``trace`` records the chosen scheme's prefill formulas (first chunk) and decode's (last token)."""
    job = Serving.of(setup, overrides)
    chunk, generation = job.chunk, job.attention.profile.device.generation
    values = bind(job)
    timed = _ttft_schemes(job, values)
    scheme = _chosen(setup, timed)
    ttft, breakdown, rates = timed[scheme]
    if trace is not None:  # the same evaluation again, recorded: the chosen scheme only
        prefill(job, values, scheme, trace)
    rule, hide, share, fraction = _rule(values, setup, rates["attention"])
    whole = {**values, "T_n": setup.prompt, "K_c": setup.cached}
    schemes = {
        s: SchemeTime(
            ttft_s=t,
            exposed_comm_s=parts.exposed_cp_s,
            step_bytes=_call(
                registry.get(s).prefill_bytes,
                {**whole, "T_n": chunk, "K_c": setup.cached + setup.prompt - chunk},
            )
            if values["N"] > 1
            else 0.0,
        )
        for s, (t, parts, _) in timed.items()
    }
    mem = memory(job, values)
    dec = decode(job, values, trace)
    solo = bind(job, cp=1)
    at_one = decode(job, solo) if setup.cp > 1 else dec
    mem_one = memory(job, solo) if setup.cp > 1 else mem
    tpot = (dec["first"] + dec["last"]) / 2  # linear in the cache between the first and the last token
    gain = (at_one["first"] + at_one["last"]) / 2 - tpot
    stated = {
        **setup.model_dump(),
        **{k: v for k, v in (overrides.model_dump() if overrides else {}).items() if v is not None},
    }
    return InferenceReport(
        schema=SCHEMA,
        inputs=stated,
        changed=job.attention.profile.changed,
        inference=Inference(
            kv_cache_bytes_per_device=mem["kv_cache_bytes_per_device"],
            ttft_s=ttft,
            tpot_s=tpot,
            ttft_s_interval=serving_interval(ttft, generation, level),
            tpot_s_interval=serving_interval(tpot, generation, level),
            gpus=setup.tp * setup.cp * setup.pp,
            memory=Memory(
                **mem, bytes_per_device_interval=serving_memory_interval(mem["bytes_per_device"], level)
            ),
            prefill=Prefill(
                scheme=scheme if values["N"] > 1 else registry.default(PREFILL).name,
                rule_scheme=rule,
                new_fraction=fraction,
                passkv_hidden_min_new_tokens=hide,
                passq_max_new_fraction=share,
                chunks=len(_chunks(setup, chunk)),
                chunk_tokens=chunk,
                gemm_flops_per_s=rates["gemm"],
                attention_flops_per_s=rates["attention"],
                schemes=schemes,
                breakdown=breakdown,
            ),
            decode=Decode(
                tpot_s=tpot,
                tpot_first_s=dec["first"],
                tpot_last_s=dec["last"],
                tokens_per_s=setup.batch / tpot,
                weight_read_s=dec["weight_read_s"],
                kv_read_s=dec["kv_read_s"],
                compute_s=dec["compute_s"],
                matmul_compute_s=dec["matmul_compute_s"],
                attention_compute_s=dec["attention_compute_s"],
                cp_merge_s=dec["cp_merge_s"],
                tp_s=dec["tp_s"],
                partial_merge_s=dec["partial_merge_s"],
                fixed_s=dec["fixed_s"],
                sampling_s=dec["sampling_s"],
                host_s=dec["host_s"],
                merge_bytes_per_layer=dec["merge_bytes_per_layer"],
                cp_latency_saved_s=max(0.0, gain),
                cp_latency_added_s=max(0.0, -gain),
                max_batch_at_cp1=mem_one["max_batch"],
            ),
            target=_target(job) if setup.target_ttft is not None else None,
            decode_target=_decode_target(job) if setup.target_tpot is not None else None,
            fits_with=None if mem["fits"] else _fits_with(job),
        ),
    )


MAX_SERVING_LAYOUTS = 2_000  # layouts a serving search weighs at most (each is a whole infer evaluation)


def search_serving(
    setup: InferenceSetup,
    overrides: MachineOverrides | None,
    gpus: int,
    level: float = DEFAULT_LEVEL,
    *,
    fixed: Mapping[str, int] | None = None,
) -> tuple[ServingSearch, InferenceReport]:
    """Every serving layout of ``gpus`` for the request, and the full report of the pick: the fitting layout
    fastest to first token (then the fewest GPUs, then the fastest decode). ``fixed`` holds some of TP, CP
    and PP (the flags given beside --gpus); the others are searched."""
    if setup.model is None:
        raise InputError("--model", "inference needs a model preset; e.g. --model llama3-70b")
    model = load_model(setup.model)
    shapes = [
        (tp, cp, pp)
        for tp in divisors(model.heads)
        for cp in (2**k for k in range(MAX_CP.bit_length()))
        for pp in divisors(model.layers)
        if gpus % (tp * cp * pp) == 0
        and cp <= MAX_CP
        and all({"tp": tp, "cp": cp, "pp": pp}[name] == value for name, value in (fixed or {}).items())
    ]
    if len(shapes) > MAX_SERVING_LAYOUTS:
        raise InputError(
            "--gpus", f"{len(shapes):,} layouts; a serving search weighs at most {MAX_SERVING_LAYOUTS:,}"
        )
    rows = []
    for tp, cp, pp in shapes:
        changed = setup.model_copy(
            update={"tp": tp, "cp": cp, "pp": pp, "target_ttft": None, "target_tpot": None}
        )
        try:
            out = evaluate_infer(changed, overrides, level=level).inference
        except InputError:  # a degree the prompt, the stages or the profile's links refuse
            continue
        mem = out.memory
        rows.append(
            ServingLayout(
                tp=tp,
                cp=cp,
                pp=pp,
                gpus=tp * cp * pp,
                replicas=gpus // (tp * cp * pp),
                fits=mem.fits,
                ttft_s=out.ttft_s,
                tpot_s=out.tpot_s,
                ttft_s_interval=out.ttft_s_interval,
                tpot_s_interval=out.tpot_s_interval,
                memory_bytes=mem.bytes_per_device,
                usable_bytes=mem.usable_bytes,
            )
        )
    if not rows:
        held = "".join(f", {name.upper()} {value}" for name, value in (fixed or {}).items())
        raise InputError(
            "--gpus",
            f"no layout of {gpus} GPUs{held} serves this request (TP dividing the heads, CP a power of two "
            "dividing the prompt, PP the layers, their product dividing the GPUs)",
        )
    rows.sort(key=lambda r: (not r.fits, r.ttft_s, r.gpus, r.tpot_s))
    found = ServingSearch(gpus=gpus, considered=len(rows), fit=sum(r.fits for r in rows), layouts=rows)
    pick = rows[0]
    report = evaluate_infer(
        setup.model_copy(update={"tp": pick.tp, "cp": pick.cp, "pp": pick.pp}), overrides, level=level
    )
    return found, report.model_copy(update={"search": found})
