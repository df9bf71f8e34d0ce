"""The kernel rates a step's formulas read, at the job's own shapes: its linear layers' multiplies (TP-split,
forward and backward), the output layer's, and its attention calls as its CP scheme splits them, from the
hardware profile's kernel tables (:mod:`costmodel.machines.kernels`) or its calibration. Training's step and
serving's decode both read them here."""

from __future__ import annotations

from dataclasses import replace

from costmodel.machines.binding import Machine
from costmodel.plans import cp as registry
from costmodel.plans.job import Job
from costmodel.plans.models import ModelPreset
from costmodel.symbolic import numeric


def _layer_shapes(model: ModelPreset, tp: int) -> list[tuple[int, int]]:
    """(n, k) of a layer's four forward multiplies on one TP shard: QKV, output projection, MLP in, out."""
    hidden, d = model.hidden, model.head_dim
    mlp_in = (2 if model.gated_mlp else 1) * model.ffn_hidden
    return [
        ((model.heads + 2 * model.kv_heads) * d // tp, hidden),
        (hidden, model.heads * d // tp),
        (mlp_in // tp, hidden),
        (hidden, model.ffn_hidden // tp),
    ]


def gemm_calls_rate(machine: Machine, calls: list[tuple[int, int, int]], batch: int = 1) -> float:
    """The FLOP-weighted rate of (m, n, k) multiplies run one after another, each at its own shape."""
    work = [2.0 * m * n * k for m, n, k in calls]
    seconds = sum(w / machine.gemm_rate(m, n, k, batch) for w, (m, n, k) in zip(work, calls, strict=True))
    return sum(work) / seconds


def layer_gemm_rate(
    model: ModelPreset, machine: Machine, tp: int, rows: int, backward: bool = False
) -> float:
    """F_gemm (or F_gemm_b): the rate of a layer's forward multiplies, TP-split, on ``rows`` tokens; backward,
    of their input gradients (rows x k from rows x n) and weight gradients (k x n over the rows)."""
    rows = max(rows, 1)
    shapes = _layer_shapes(model, tp)
    if backward:
        calls = [call for n, k in shapes for call in ((rows, k, n), (k, n, rows))]
    else:
        calls = [(rows, n, k) for n, k in shapes]
    return gemm_calls_rate(machine, calls)


def _unfused_rates(seq: int, heads: int, d: int, machine: Machine) -> tuple[float, float]:
    """(F_attn, F_attn_bwd) of Megatron's unfused attention: batched multiplies over the whole S x S square,
    one per head of the micro-batch (the score matrix's HBM passes are the formulas' k_sf, k_sb). The
    backward's rate is over 2.5x the forward FLOP, as the attention formulas count it."""
    forward = [(seq, seq, d), (seq, d, seq)]  # scores QK^T, then probabilities x V
    backward = [(seq, d, seq), (seq, d, seq), (seq, seq, d), (seq, d, seq)]  # dQ, dK, dP, dV
    f_fwd = gemm_calls_rate(machine, forward, heads)
    flops_fwd = sum(2.0 * m * n * k for m, n, k in forward)
    flops_bwd = sum(2.0 * m * n * k for m, n, k in backward)
    f_bwd = gemm_calls_rate(machine, backward, heads)
    return f_fwd, 2.5 * flops_fwd / (flops_bwd / f_bwd)


def linear_machine(job: Job) -> Machine:
    """The machine the linear layers' multiplies run on: the job's, in FP8 under --gemm-dtype."""
    return job.machine if job.step.gemm_dtype is None else replace(job.machine, dtype="fp8")


def layer_rates(job: Job, gemms: dict[tuple, dict[str, float]] | None = None) -> dict[str, float]:
    """F_gemm, F_gemm_b, F_head, F_attn, F_attn_bwd: the machine's rates (published kernel tables, or
    --efficiency) at this layer's shapes; ``gemms`` keeps the multiplies' rates by shape across calls (the
    layout search binds the same multiplies under many CP schemes)."""
    inputs, step, model, machine = job.inputs, job.step, job.model, job.machine
    t, d, kernel_name = job.tp, model.head_dim, job.setup.attention_kernel
    rows = step.micro_batch * inputs.seq // inputs.cp  # sequence parallel gathers the CP rank's tokens
    key = (t, rows, step.gemm_dtype)
    if gemms is None or key not in gemms:
        linear = linear_machine(job)
        found = {
            "F_gemm": layer_gemm_rate(model, linear, t, rows),
            "F_gemm_b": layer_gemm_rate(model, linear, t, rows, backward=True),
            "F_head": gemm_calls_rate(machine, [(rows, max(model.vocab // t, 1), model.hidden)]),
        }
        if gemms is None:
            gemms = {}
        gemms[key] = found
    rates = dict(gemms[key])
    if kernel_name == "unfused":
        f_attn, f_attn_bwd = _unfused_rates(inputs.seq, step.micro_batch * model.heads // t, d, machine)
        return rates | {"F_attn": f_attn, "F_attn_bwd": f_attn_bwd}
    seq, n, scheme = inputs.seq, inputs.cp, registry.get(step.cp_scheme)
    calls = (
        [(seq, seq, True, 1.0)] if n == 1 else scheme.attention_calls(seq, n, job.usp_split[1], inputs.layout)
    )
    pair = numeric.pair_flops(b=step.micro_batch, h=model.heads / t, d=d)
    kernel = None if kernel_name == "flash" else kernel_name

    def rate(backward: bool) -> float:
        total = sum(w for *_, w in calls)
        spent = sum(
            w / machine.rate(pair * q * k * (0.5 if causal else 1.0), causal, backward, n, q, k, d, kernel)
            for q, k, causal, w in calls
        )
        return total / spent

    return rates | {"F_attn": rate(False), "F_attn_bwd": rate(True)}
