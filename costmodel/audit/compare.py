"""A logged run against the step model: measured and predicted step time, TFLOP/s per GPU, MFU and memory;
where the difference most likely sits; findings with a severity.

Measured figures are medians over the steady intervals (each segment's first interval is warm-up), with
their spread (interquartile range / median). The step time is the framework's own (Megatron's elapsed
time per iteration) or follows from its throughput (torchtitan: tokens per step / (tps x GPUs)). Model
TFLOP/s per GPU and MFU are recomputed from that time with the step model's FLOP count ([PaLM] appendix
B), so measured and predicted are counted alike; the framework's own figures are kept beside them.

Where a difference sits: each component of the predicted breakdown has a plausible range of error,
below as a share of its own time (published kernel rates are not every cluster's; overlap can fail),
plus, for communication the model hides, what it would cost unhidden. The component whose range covers
the difference with the least of its range used is named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from costmodel.audit.logs import ParsedLog, summary
from costmodel.core.errors import InputError
from costmodel.core.units import seconds
from costmodel.plans import cp as registry
from costmodel.plans.job import Job
from costmodel.plans.schemes import compare
from costmodel.training.report import LABELS, StepReport
from costmodel.training.step import evaluate_step

SCHEMA = "cp-plan/audit/v2"  # v2: breakdown keys and attribution components are the step's identifiers
# (share below, share above) of each component's predicted time that a real run plausibly differs by.
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "matmul_s": (-0.15, 0.6),  # cuBLAS off the published curve: odd shapes, clocks, power capping
    "attention_s": (-0.2, 1.0),  # a slower kernel than FA3 (FA2, SDPA's math path) doubles it
    "elementwise_s": (-0.3, 1.5),  # unfused norms, rotary, casts
    "recompute_s": (-0.3, 1.0),
    "head_s": (-0.3, 1.0),
    "exposed_tp_s": (-1.0, 1.5),
    "exposed_cp_s": (-1.0, 1.0),
    "cp_ring_overhead_s": (-0.5, 3.0),  # launch-bound on small shards
    "pipeline_bubble_s": (-0.3, 1.0),
    "exposed_pp_s": (-1.0, 1.0),
    "exposed_dp_s": (-1.0, 3.0),
    "zero3_gather_s": (-1.0, 2.0),
    "optimizer_s": (-0.5, 2.0),
    "host_wait_s": (-1.0, 3.0),  # an eager framework's host time per kernel
    "framework_step_s": (-1.0, 3.0),
}
# Kernels that slow down together (clocks, power capping, a slower library build) and by how much.
COMPUTE_KERNELS = ("matmul_s", "attention_s", "elementwise_s", "recompute_s", "head_s")
EVERY_KERNEL = "every compute kernel alike"
COMPUTE_TOGETHER = (-0.15, 1.0)  # a power-capped or mis-built cluster at half the published rates
TOLERANCE = 0.10  # |measured / predicted - 1| within which the model is taken to agree
FAR_BELOW = 0.25  # measured step this much slower than predicted: a warning
CP_EXPOSED_SHARE = 0.05  # predicted exposed CP communication beyond this share of the step
MEMORY_MARGIN = 1.25  # reserved memory beyond the plan's fit by this factor (allocator caching allowed)
ACCOUNTING_BAND = (0.85, 1.15)  # framework's TFLOP/s over ours from the same time


def _unhidden(job: Job, hidden: dict[str, float]) -> dict[str, float]:
    """What each communication component would add if nothing of it were hidden (overlaps 0)."""
    bare = evaluate_step(job.replace(cp_overlap=0.0, pp_overlap=0.0, tp_comm_overlap=False)).step.breakdown
    return {k: max(0.0, getattr(bare, k) - hidden[k]) for k in hidden}


def attribute(
    difference_s: float, breakdown: dict[str, float], unhidden: dict[str, float], time_s: float
) -> dict[str, Any]:
    """The component (a breakdown key) whose plausible range covers ``difference_s`` (measured - predicted)
    with the least of it used; every covering component listed."""
    if abs(difference_s) <= TOLERANCE * time_s:
        return {
            "component": None,
            "explanation": f"within the model's {TOLERANCE:.0%} tolerance",
            "candidates": [],
        }
    candidates = []
    for name, spent in breakdown.items():
        low, high = PLAUSIBLE.get(name, (-0.5, 1.0))
        reach = spent * high + unhidden.get(name, 0.0) if difference_s > 0 else spent * low
        if reach and (difference_s / reach) <= 1.0 and difference_s / reach > 0:
            candidates.append({"component": name, "share_of_range": difference_s / reach, "range_s": reach})
    compute = sum(breakdown.get(k, 0.0) for k in COMPUTE_KERNELS)
    together = compute * (COMPUTE_TOGETHER[1] if difference_s > 0 else COMPUTE_TOGETHER[0])
    if together and 0 < difference_s / together <= 1.0:
        candidates.append(
            {
                "component": EVERY_KERNEL,
                "share_of_range": difference_s / together,
                "range_s": together,
            }
        )
    candidates.sort(key=lambda c: c["share_of_range"])
    if candidates:
        best = candidates[0]
        word = "slower" if difference_s > 0 else "faster"
        return {
            "component": best["component"],
            "explanation": f"{LABELS.get(best['component'], best['component'])} {word} than modelled covers it, using "
            f"{best['share_of_range']:.0%} of its plausible range ({seconds(best['range_s'])})",
            "candidates": candidates,
        }
    return {
        "component": None,
        "explanation": "no single component's plausible range covers it: look outside the model (data "
        "loading, stragglers, host overhead, clocks) or at the configuration",
        "candidates": [],
    }


def _memory_fit(report: StepReport, job: Job) -> dict[str, float]:
    memory = report.memory
    return {
        "total_bytes": memory.bytes_per_device,
        "device_memory_bytes": memory.device_memory_bytes,
        "usable_bytes": job.machine.profile.device.usable_bytes,
        "fits": memory.fits,
    }


def measure(log: ParsedLog, predicted: dict[str, Any], gpus: int, peak: float) -> dict[str, Any]:
    """The log's steady intervals as step time, TFLOP/s per GPU and MFU: the framework's and ours."""
    step = predicted["step"]
    tokens = step["tokens_per_s"] * step["time_s"]
    # Megatron-LM and torchtitan log TFLOP/s and MFU over the full S x S square: compare in their convention.
    flops = step["model_tflops_per_gpu_full_square"] * 1e12 * gpus * step["time_s"]
    steady = log.steady()
    times = []
    for interval in steady:
        if interval.step_s is not None:
            times.append(interval.step_s)
        elif interval.tokens_per_s_per_gpu:
            times.append(tokens / (interval.tokens_per_s_per_gpu * gpus))
    if not times:
        raise InputError("LOG", f"{log.path}: no interval states a step time or a throughput")
    time = summary(times)
    reported = [i.tflops_per_gpu for i in steady if i.tflops_per_gpu is not None]
    mfu = [i.mfu for i in steady if i.mfu is not None]
    ours = flops / time["median"] / gpus / 1e12
    return {
        "step_time_s": time,
        "tflops_per_gpu": summary(reported)["median"] if reported else ours,
        "tflops_per_gpu_source": "log" if reported else "step model's FLOP count over the measured time",
        "reported_tflops_spread": summary(reported)["spread"] if reported else None,
        "model_tflops_per_gpu": ours,
        "mfu": ours * 1e12 / peak,
        "reported_mfu": summary(mfu)["median"] if mfu else None,
        "tokens_per_s_per_gpu": tokens / time["median"] / gpus,
        "memory_bytes": log.memory_bytes,
        "intervals": len(steady),
        "warmup_intervals": len(log.intervals) - len(steady),
    }


def ring_ratio(job: Job) -> float | None:
    """The plan's step comm ratio of the run's ring (ring or USP's ring part), fwd+bwd: transfer time over the
    attention it hides under ([A-RingCost §11]); None when the run has no ring."""

    scheme = registry.get(job.step.cp_scheme)
    if job.cp == 1 or not scheme.ring:
        return None
    attention = job.setup.attention(job.inputs).model_copy(update={"batch": job.step.micro_batch})
    schemes = compare(attention, job.machine.placed(job.tp), "fwd+bwd")
    feasible = [s for s in schemes if s.scheme == scheme.name and s.feasible and s.ring_ratio is not None]
    return max(feasible, key=lambda s: s.n_ulysses).ring_ratio if feasible else None


@dataclass(frozen=True)
class Evidence:
    """What the findings read about one run: its log, the measured and predicted steps, the attribution of
    their difference, the device's dense peak (FLOP/s), the plan's memory fit, the CP degree and scheme, and
    the plan's ring comm ratio (None without a ring)."""

    log: ParsedLog
    measured: dict[str, Any]
    predicted: dict[str, Any]
    attribution: dict[str, Any]
    peak: float
    memory: dict[str, float]
    cp: int
    scheme: str
    plan_ratio: float | None = None


Finding = dict[str, str]


def _finding(severity: str, kind: str, message: str) -> Finding:
    return {"severity": severity, "kind": kind, "message": message}


def _over_peak(e: Evidence, _: list[Finding]) -> list[Finding]:
    """Critical: more FLOP/s than the device has, as the framework reports them or as the step's time says."""
    measured, peak_t = e.measured, e.peak / 1e12
    out = []
    if measured["tflops_per_gpu_source"] == "log" and measured["tflops_per_gpu"] > peak_t:
        out.append(
            _finding(
                "critical",
                "over-peak",
                f"reported {measured['tflops_per_gpu']:.0f} TFLOP/s per GPU exceeds the device's dense peak "
                f"{peak_t:.0f}: the run does less work than its configuration says (CP not active, a shorter "
                "sequence, layers skipped) or the framework counts FLOP wrongly",
            )
        )
    if measured["reported_mfu"] is not None and measured["reported_mfu"] > 1:
        out.append(
            _finding("critical", "over-peak", f"reported MFU {measured['reported_mfu']:.0%} is above 100%")
        )
    if measured["model_tflops_per_gpu"] > peak_t:
        out.append(
            _finding(
                "critical",
                "over-peak",
                f"the measured step ({seconds(measured['step_time_s']['median'], 4)}) is shorter than the "
                f"hardware allows for this configuration ({measured['model_tflops_per_gpu']:.0f} model TFLOP/s "
                f"per GPU against a {peak_t:.0f} peak): the run is not the configuration stated (CP or "
                "sequence length), or the log's rank count is wrong",
            )
        )
    return out


def _against_prediction(e: Evidence, earlier: list[Finding]) -> list[Finding]:
    """Steps far slower than predicted (why, most likely), or far faster where nothing is over the peak."""
    step, measured = e.predicted["step"], e.measured
    ratio = measured["step_time_s"]["median"] / step["time_s"]
    if ratio > 1 + FAR_BELOW:
        return [
            _finding(
                "critical" if ratio > 2 else "warning",
                "below-prediction",
                f"steps take {ratio:.2f}x the predicted {seconds(step['time_s'], 4)} "
                f"({measured['model_tflops_per_gpu']:.0f} vs {step['model_tflops_per_gpu_full_square']:.0f} model TFLOP/s per "
                f"GPU); most likely: {e.attribution['explanation']}",
            )
        ]
    if ratio < 1 - FAR_BELOW and not any(f["kind"] == "over-peak" for f in earlier):
        return [
            _finding(
                "info",
                "above-prediction",
                f"steps take {ratio:.2f}x the predicted time: the profile's rates are conservative for this "
                "cluster (fit them: --fit-profile), or the configuration is not what ran",
            )
        ]
    return []


def _memory(e: Evidence, _: list[Finding]) -> list[Finding]:
    """Logged peak memory beyond the device, beyond the plan's fit, or a plan that does not fit."""
    if e.measured["memory_bytes"] is None:
        return []
    used, planned, hbm = e.measured["memory_bytes"], e.memory["total_bytes"], e.memory["device_memory_bytes"]
    device = e.memory.get("usable_bytes")
    out = []
    if device and used > device:
        out.append(
            _finding(
                "critical",
                "memory",
                f"peak memory {used / 1e9:.1f} GB exceeds the {device / 1e9:.1f} GB a process can allocate on the device: the log's "
                "figure is not one device's, or the profile is not the device that ran",
            )
        )
    if used > planned * MEMORY_MARGIN:
        out.append(
            _finding(
                "warning",
                "memory",
                f"peak memory {used / 1e9:.1f} GB is {used / planned:.2f}x the plan's fit "
                f"({planned / 1e9:.1f} GB): buffers the plan does not count (allocator fragmentation, "
                "un-recomputed activations, communication buffers)",
            )
        )
    if not e.memory["fits"]:
        out.append(
            _finding(
                "warning",
                "memory",
                f"the plan says this configuration does not fit ({planned / 1e9:.1f} GB of {hbm / 1e9:.1f} GB usable)",
            )
        )
    return out


def _cp_exposed(e: Evidence, _: list[Finding]) -> list[Finding]:
    """CP traffic the step cannot hide: a large exposed share, or a ring whose transfer outlasts its attention."""
    step = e.predicted["step"]
    share = step["breakdown"]["exposed_cp_s"] / step["time_s"]
    slow_ring = e.plan_ratio is not None and e.plan_ratio > 1
    if e.cp <= 1 or not (share > CP_EXPOSED_SHARE or slow_ring):
        return []
    ratio_said = (
        f"each ring step's transfer takes {e.plan_ratio:.2g}x the attention it hides under; "
        if slow_ring
        else ""
    )
    return [
        _finding(
            "warning",
            "cp-exposed",
            f"CP {e.cp} ({e.scheme}) cannot hide its communication here: {ratio_said}{share:.1%} of the step is "
            "exposed CP traffic; a smaller CP degree, another scheme (cp-plan recommend) or a faster link",
        )
    ]


def _flop_accounting(e: Evidence, _: list[Finding]) -> list[Finding]:
    """The framework counting other FLOP than the step model for the same time."""
    if e.measured["tflops_per_gpu_source"] != "log":
        return []
    accounting = e.measured["tflops_per_gpu"] / e.measured["model_tflops_per_gpu"]
    if ACCOUNTING_BAND[0] <= accounting <= ACCOUNTING_BAND[1]:
        return []
    return [
        _finding(
            "info",
            "flop-accounting",
            f"the framework's TFLOP/s is {accounting:.2f}x ours for the same step time: it counts FLOP "
            "differently (causal half of attention, recompute, embeddings)",
        )
    ]


def _peak(e: Evidence, _: list[Finding]) -> list[Finding]:
    """The framework's MFU dividing by another peak than the profile's."""
    if not e.log.peak_flops or abs(e.log.peak_flops / e.peak - 1) <= 0.05:
        return []
    return [
        _finding(
            "info",
            "peak",
            f"the framework's MFU divides by {e.log.peak_flops / 1e12:.0f} TFLOP/s, the profile's dense peak is "
            f"{e.peak / 1e12:.0f}: the two MFUs differ by that ratio",
        )
    ]


def _noisy(e: Evidence, _: list[Finding]) -> list[Finding]:
    spread = e.measured["step_time_s"]["spread"]
    if spread <= 0.10:
        return []
    return [
        _finding(
            "info",
            "noisy",
            f"step times spread {spread:.0%} (interquartile range / median) over the steady intervals",
        )
    ]


def _read(e: Evidence, _: list[Finding]) -> list[Finding]:
    """How the log was read: its intervals, and the restarts, repeats and cuts met."""
    log = e.log
    read = f"{log.lines} lines: {len(log.intervals)} intervals, {log.skipped} other lines skipped"
    extras = [
        (log.restarts, f"{log.restarts} restart(s), each segment's first interval left out as warm-up"),
        (log.duplicates, f"{log.duplicates} interval(s) printed again by another rank"),
        (log.cut, f"{log.cut} over-long line(s) read in part"),
        (log.truncated_last_line, "the last line is cut mid-line (a job still writing?) and was left out"),
    ]
    return [_finding("info", "read", "; ".join([read] + [text for flag, text in extras if flag]))]


# Each rule reads the evidence and the findings of the rules before it; the report lists them in this order
# within a severity.
RULES = (_over_peak, _against_prediction, _memory, _cp_exposed, _flop_accounting, _peak, _noisy, _read)
_SEVERITY = {"critical": 0, "warning": 1, "info": 2}


def findings(evidence: Evidence) -> list[Finding]:
    """What a reader must know, most severe first: critical (the numbers cannot be right), warning
    (something costs time or memory), info (how the log was read)."""
    out: list[Finding] = []
    for rule in RULES:
        out += rule(evidence, out)
    return sorted(out, key=lambda f: _SEVERITY[f["severity"]])


def audit(log: ParsedLog, values: dict[str, Any]) -> dict[str, Any]:
    """One run: measured, predicted, the comparison and the findings."""
    run = Job.of(**values)
    report = evaluate_step(run)
    predicted = report.model_dump(mode="json", by_alias=True)
    peak = run.machine.peak_flops
    measured = measure(log, predicted, run.gpus, peak)
    step = predicted["step"]
    difference = measured["step_time_s"]["median"] - step["time_s"]
    unhidden = _unhidden(run, step["breakdown"]) if difference > 0 else {}
    attribution = attribute(difference, step["breakdown"], unhidden, step["time_s"])
    memory = _memory_fit(report, run)
    plan_ratio = ring_ratio(run)
    return {
        "schema": SCHEMA,
        "log": log.path,
        "framework": log.framework,
        "config": predicted["inputs"],
        "measured": measured,
        "predicted": {
            "step_time_s": step["time_s"],
            "tflops_per_gpu": step["model_tflops_per_gpu_full_square"],
            "mfu": step["mfu_full_square"],
            "tokens_per_s_per_gpu": step["tokens_per_s_per_gpu"],
            "memory_bytes": memory["total_bytes"],
            "breakdown": step["breakdown"],
        },
        "comparison": {
            "plan_ring_comm_ratio": plan_ratio,
            "step_time_ratio": measured["step_time_s"]["median"] / step["time_s"],
            "difference_s": difference,
            "attribution": attribution,
        },
        "findings": findings(
            Evidence(
                log,
                measured,
                predicted,
                attribution,
                peak,
                memory,
                run.cp,
                run.step.cp_scheme,
                plan_ratio,
            )
        ),
    }
