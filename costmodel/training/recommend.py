"""A training run around the attention layer: memory fit, the CP window and the recommendation.

Communication alone sizes CP from above (N <= (h/n_kv)·S/beta [A-RingCost §4]). A plan also needs the
other side: the smallest N whose activations fit [Korthikanti22]. Between the two lies the window.

The rules. N is usable for communication when some scheme's ratio is within amber (the band that
guards the time model's overlap assumption); the window is the usable N whose memory fits. At each N
the scheme is the one that leaves the least communication exposed (:func:`costmodel.plans.schemes.best`),
and the row says when a scheme with a lower ratio exists. The recommended N is the smallest in the
window whose lowest ratio is green, else the smallest in the window. The smallest
leaves the most data parallelism and the least traffic.

Where the layout search has picked a plan, :func:`recommend_plan` makes it the recommendation and
evaluates the window at its TP, PP, recompute and micro-batch, so that a report gives one answer.
"""

from __future__ import annotations

import math
from typing import Any

from costmodel.core.errors import InputError
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.core.units import seconds, si
from costmodel.machines import topology
from costmodel.machines.binding import Machine
from costmodel.plans import cp as registry
from costmodel.plans.bind import Evaluator
from costmodel.plans.inputs import MAX_CP, PlanInputs, TrainingSetup, cp_stride
from costmodel.plans.job import Job
from costmodel.plans.schema import Fit, Recommendation, RecommendCandidate, RecommendReport
from costmodel.plans.schemes import SchemeResult, best, compare, lowest_ratio
from costmodel.plans.uncertainty import certain_fit
from costmodel.plans.verdict import AMBER, GREEN
from costmodel.schedule.layouts import divisors
from costmodel.training.memory import fit_at, memory, training_values
from costmodel.training.search import plan_as_job
from costmodel.training.step import evaluate_step


def schemes_at(attention: PlanInputs, machine: Machine, n: int) -> list[SchemeResult]:
    """The scheme comparison at CP degree ``n`` for one TP rank's attention: the same one `cp-plan` prints."""
    layout = "zigzag" if attention.causal else "contiguous"
    at_n = attention.model_copy(
        update={"cp": n, "layout": layout, "block": min(attention.block, attention.seq // n)}
    )
    return compare(at_n, machine)


def recommend(
    job: Job, suggest: bool = True, _schemes: dict | None = None, level: float = DEFAULT_LEVEL
) -> RecommendReport:
    """The window [N_min(memory), N_max(comm)] over the CP degrees the job can use, and the pick.

    With ``suggest``, an empty window also gets the setup changes that would open it, each checked by
    re-running this function.
    """
    inputs, setup, base = job.inputs, job.setup, job.machine
    attention = setup.attention(inputs)
    # The comparison depends on the attention and the placement only; the fixes' re-runs change memory knobs.
    schemes = {} if _schemes is None else _schemes
    runs_cp = bool(job.framework.time.cp_schemes)  # a framework without CP has the window N = 1 only
    candidates = [
        n for n in divisors(setup.shard_group) if inputs.seq % n == 0 and n <= MAX_CP and (runs_cp or n == 1)
    ]
    rows, best_at, evaluators = [], {}, {}
    for n in candidates:
        machine = base.placed(cp_stride(setup, n))  # CP neighbours as far apart as the rank order puts them
        evaluators[n] = Evaluator(training_values(job, n))
        key = (attention, machine.ranks_per_node, machine.stride, n)
        if key not in schemes:
            schemes[key] = schemes_at(attention, machine, n)
        results = schemes[key]
        chosen, safest = best(results), lowest_ratio(results)
        best_at[n] = chosen
        fit = fit_at(evaluators[n])
        rows.append(
            RecommendCandidate(
                n=n,
                dp=setup.shard_group // n,
                fits=fit.fits,
                total_bytes=fit.total_bytes,
                ring_comm_ratio_step=results[0].ratio or 0.0,
                best_scheme=_label(chosen, n),
                comm_ratio=chosen.ratio or 0.0,
                exposed_comm_s=chosen.exposed_s or 0.0,
                verdict=chosen.verdict or "green",
                lowest_ratio=safest.ratio or 0.0,
                lowest_ratio_scheme=_label(safest, n),
                link_scope=machine.scope(n) if n > 1 else "none",
            )
        )
    n_min = min((r.n for r in rows if r.fits), default=None)
    n_max = max((r.n for r in rows if r.lowest_ratio <= AMBER.upper), default=None)
    window = [r for r in rows if r.fits and r.lowest_ratio <= AMBER.upper]
    largest = evaluators[candidates[-1]]
    states_fit = float(memory(largest, "model_state_bytes")) < largest.values["M_dev"]
    n_min_real = float(memory(largest, "n_min_memory")) if states_fit else None
    common = {"n_min_memory": n_min, "n_max_comm": n_max, "n_min_memory_real": n_min_real}
    if window:
        pick = min(window, key=lambda r: (r.lowest_ratio >= GREEN.upper, r.n))
        chosen = best_at[pick.n]
        none = pick.n == 1
        recommendation = Recommendation(
            **common,
            n_recommended=pick.n,
            dp=pick.dp,
            scheme="none" if none else chosen.scheme,
            layout=None if none or registry.get(chosen.scheme).whole_sequence else chosen.layout,
            n_ulysses=None if none else chosen.n_ulysses,
            reason=_reason(pick, chosen, n_min, inputs.pass_),
            fixes=[],
        )
        fit = fit_at(evaluators[pick.n])
    else:
        recommendation = Recommendation(
            **common,
            n_recommended=None,
            dp=None,
            scheme=None,
            layout=None,
            n_ulysses=None,
            reason=_failure(job, rows, n_min, n_max, largest),
            fixes=_fixes(job, n_min, n_max, schemes) if suggest else [],
        )
        fit = fit_at(evaluators[n_min or candidates[-1]])
    return RecommendReport(
        inputs=inputs,
        setup=setup,
        hw=machine.name,
        changed=machine.profile.changed,
        topology=topology.describe(machine.profile),
        fit=certain_fit(fit, job, level),
        recommendation=recommendation,
        candidates=rows,
    )


def _at_plan(job: Job, plan: dict[str, Any], global_batch: int) -> Job:
    """The job a searched plan runs, every dimension of it (virtual stages, micro-batch (b, which activations
    and the ring's traffic scale with), global batch, scheme, EP, TP overlap): the window's row at the plan's
    CP degree is then the plan's own memory, the figure the screen's top line gives."""
    tile = min(
        job.inputs.block, job.inputs.seq // plan["cp"]
    )  # the tile of a shard shorter than it: all of it
    return plan_as_job(plan, job.replace(block=tile), global_batch).replace(batch=plan["micro_batch"])


def recommend_plan(job: Job, search: dict[str, Any]) -> RecommendReport:
    """The report of the layout search's pick (``search["plans"][0]``): the window, its rows and the fit
    are at the plan's TP, PP, recompute and micro-batch, and ``recommendation`` is the plan itself, so
    that the report gives one answer."""
    plan = search["plans"][0]
    at = _at_plan(job, plan, search["global_batch"])
    window = recommend(at, suggest=False)
    cp = plan["cp"]
    planned = plan_as_job(plan, job.training(), search["global_batch"])
    fit = certain_fit(fit_at(Evaluator(training_values(planned))), planned, search["choice"]["level"])
    rec = window.recommendation
    recommendation = Recommendation(
        n_min_memory=rec.n_min_memory,
        n_min_memory_real=rec.n_min_memory_real,
        n_max_comm=rec.n_max_comm,
        n_recommended=cp,
        dp=plan["dp"],
        scheme="none" if cp == 1 else plan["cp_scheme"],
        layout=None if cp == 1 or registry.get(plan["cp_scheme"]).whole_sequence else plan["layout"],
        n_ulysses=None if cp == 1 else plan["cp_ulysses"],
        reason=_plan_reason(job, search, window, fit),
        fixes=[],
        **{
            k: plan[k]
            for k in (
                "gpus",
                "tp",
                "cp",
                "pp",
                "first_stage_layers",
                "last_stage_layers",
                "vpp",
                "micro_batch",
                "recompute",
                "cp_scheme",
            )
        },
        global_batch=search["global_batch"],
        step_time_s=plan["step_time_s"],
        mfu=plan["mfu"],
    )
    return window.model_copy(update={"fit": fit, "recommendation": recommendation, "search": search})


def _at_confidence(search: dict[str, Any]) -> str:
    sure = search.get("confidence")
    return "" if sure is None else f" at {sure['level']:.0%} or more"


def _plan_reason(job: Job, search: dict[str, Any], window: RecommendReport, fit: Fit) -> str:
    """Why the search's pick, and where its CP degree lies against ``window``, the CP window at its TP and PP;
    ``fit``: the pick's memory."""
    plan, bounds = search["plans"][0], window.recommendation
    cp = plan["cp"]
    row = next(r for r in window.candidates if r.n == cp)  # CP divides G / (TP x PP) and S: always a row
    chosen = f"The {search.get('choice', {}).get('decided_by') or 'fastest'}"
    text = (
        f"{chosen} of the {search['fit']:,} plans that fit{_at_confidence(search)}, of {search['considered']:,}: "
        f"{seconds(plan['step_time_s'])} per step at {plan['mfu']:.0%} MFU, "
        f"{si(fit.total_bytes, 'B', 3)} of {si(fit.device_memory_bytes, 'B', 3)} usable per device. "
    )
    if plan["gpus"] < job.gpus:  # no layout of every GPU divides the batch and the model as fast
        text += f"It uses {plan['gpus']:,} of the {job.gpus:,} GPUs. "
    text += _tight(fit, search["plans"])
    span = f"[{bounds.n_min_memory or '-'}, {bounds.n_max_comm or '-'}]"
    scheme = f"{row.lowest_ratio_scheme}, {row.lowest_ratio:.2%}, {row.link_scope}"
    lowest = f"its lowest {job.inputs.pass_} comm ratio ({scheme})"
    if cp == 1:
        return text + f"CP 1: memory fits without context parallelism, in the window {span}."
    if row.lowest_ratio <= AMBER.upper:
        return text + f"CP {cp} lies in the window {span}: memory fits and {lowest} is within 15 %."
    # The window caps a layer's comm ratio; the step charges only what stays exposed, and can still win.
    return (
        text + f"CP {cp} is past N_max(comm) of the window {span}: {lowest} is above 15 %; the step time "
        "counts the communication the plan leaves exposed."
    )


TIGHT = 0.95  # a pick above this share of usable memory is closer to the limit than the memory model is sure


def _tight(fit: Fit, plans: list[dict[str, Any]]) -> str:
    """A word of warning when the pick all but fills the device, naming the fastest shown plan with room."""
    share = fit.total_bytes / fit.device_memory_bytes
    if share <= TIGHT:
        return ""
    roomy = next(
        (i for i, p in enumerate(plans[1:], 2) if p["memory_bytes"] <= TIGHT * p["device_memory_bytes"]), None
    )
    other = (
        f"; #{roomy} needs {plans[roomy - 1]['memory_bytes'] / fit.device_memory_bytes:.0%} at "
        f"{plans[roomy - 1]['step_time_s'] / plans[0]['step_time_s'] - 1:+.1%} step time"
        if roomy
        else ""
    )
    return (
        f"Caution: it fills {share:.1%} of the usable memory, closer to the limit than the memory model's error "
        f"on measured peaks (docs/validation.md){other}. "
    )


def _label(scheme: SchemeResult, n: int) -> str:
    return "none" if n == 1 else registry.get(scheme.scheme).split_label(scheme.n_ulysses, scheme.n_ring)


def describe_scheme(scheme: str | None, layout: str | None, n: int | None, n_ulysses: int | None) -> str:
    """``zigzag ring``, ``Ulysses``, ``USP 2x4 (all-to-all in node), zigzag ring``, or no CP at N = 1."""
    if not n or scheme in (None, "none"):
        return "no context parallelism"
    return registry.get(scheme).describe(layout, n, n_ulysses)


def _reason(pick: RecommendCandidate, chosen: SchemeResult, n_min: int | None, pass_: str) -> str:
    if pick.n == 1:
        return (
            f"N = 1: no CP is needed; {si(pick.total_bytes, 'B', 3)} per device fits on one device, "
            f"leaving DP = {pick.dp}."
        )
    if pick.n == n_min:
        why = f"the smallest CP degree whose memory fits ({si(pick.total_bytes, 'B', 3)} of HBM per device)"
    else:
        why = f"the smallest green CP degree that fits (N = {n_min} fits but is amber)"
    how = describe_scheme(chosen.scheme, chosen.layout, pick.n, chosen.n_ulysses)
    text = (
        f"N = {pick.n} is {why}; {how} exposes the least communication, its {pass_} comm ratio is "
        f"{pick.comm_ratio:.2%} ({pick.verdict}, {pick.link_scope}), leaving DP = {pick.dp}."
    )
    if pick.lowest_ratio_scheme != pick.best_scheme:
        text += (
            f" {pick.lowest_ratio_scheme} has the lower ratio ({pick.lowest_ratio:.2%}) but exposes more; "
            "the pick relies on overlapping its transfers."
        )
    return text


def _failure(
    job: Job, rows: list[RecommendCandidate], n_min: int | None, n_max: int | None, largest: Evaluator
) -> str:
    """Why the window is empty: memory fits at no CP degree, or only past N_max(comm). ``largest``: the
    binding at the largest CP degree the job can use."""
    if n_min is None:
        biggest = rows[-1]
        states, usable = float(memory(largest, "model_state_bytes")), largest.values["M_dev"]
        if states >= usable:
            return (
                f"Memory fails: the model states alone need {si(states, 'B', 3)} per device, more than the "
                f"{si(usable, 'B', 3)} usable; no CP degree can fit them."
            )
        real = float(memory(largest, "n_min_memory"))
        return (
            f"Memory fails: even N = {biggest.n}, every rank of a TP x PP slice (G / (TP x PP) = "
            f"{job.setup.shard_group}), needs {si(biggest.total_bytes, 'B', 3)} per device; memory would fit "
            f"from N = {real:.1f}, which this job cannot reach."
        )
    at_min = next(r for r in rows if r.n == n_min)
    return (
        f"Communication fails: memory needs N >= {n_min}, where the lowest comm ratio ({at_min.lowest_ratio_scheme}) "
        f"is {at_min.lowest_ratio:.1%} for {job.inputs.pass_}; some scheme stays within 15 % only up to N = {n_max}."
    )


def _trials(job: Job, n_min: int | None) -> list[tuple[str, dict[str, Any]]]:
    """The changes to a job that may open its window, each with its flags: one at a time, and where memory
    fits at no N the GPUs doubled and the strongest memory savers together. The flags hold the window's TP
    and PP too, so that a hint run as written asks for the window it was found in, not a layout search."""
    model, setup, machine = job.model, job.setup, job.machine
    changes: list[tuple[str, dict[str, Any]]] = []
    if setup.recompute != "full":
        changes.append(("full activation recompute", {"recompute": "full"}))
    if setup.zero < 3:
        changes.append(("ZeRO-3", {"zero": 3}))
    if job.framework.memory.loss == "materialized":  # the logits whole, upcast: tens of GB at long S
        changes.append(("a chunked loss", {"loss": "chunked"}))
    tp2 = 2 * setup.tp
    if (
        tp2 <= machine.profile.devices_per_node
        and setup.gpus % (tp2 * setup.pp) == 0
        and model.heads % tp2 == 0
    ):
        changes.append((f"TP {tp2}", {"tp": tp2}))
    pp2 = 2 * setup.pp
    if setup.gpus % (setup.tp * pp2) == 0 and model.layers % pp2 == 0:
        changes.append((f"PP {pp2}", {"pp": pp2}))
    if n_min is None:
        changes.append(("twice the GPUs", {"gpus": 2 * setup.gpus}))
        node_tp = max(
            (
                k
                for k in divisors(machine.profile.devices_per_node)
                if model.heads % k == 0 and setup.gpus % (k * setup.pp) == 0
            ),
            default=setup.tp,
        )
        wanted = {"recompute": "full", "zero": 3, "tp": max(node_tp, setup.tp)}
        combined = {key: value for key, value in wanted.items() if getattr(setup, key) != value}
        if len(combined) > 1:
            names = {"recompute": "full recompute", "zero": "ZeRO-3", "tp": f"TP {wanted['tp']}"}
            changes.append((f"{_joined([names[key] for key in combined])} together", combined))
    return [(f"{text} ({_flags(setup, change)})", change) for text, change in changes]


def _flags(setup: TrainingSetup, change: dict[str, Any]) -> str:
    """The flags of ``change``, then the window's TP and PP where it keeps them."""
    held = {key: getattr(setup, key) for key in ("tp", "pp") if key not in change}
    return " ".join(f"--{key} {value}" for key, value in (change | held).items())


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _throughput(job: Job, n: int, global_batch: int) -> float | None:
    """Tokens a second per GPU of the training step at CP degree ``n`` (memory aside); None where the job
    has no such layout."""
    try:
        return evaluate_step(
            job.training().replace(cp=n, global_batch=global_batch)
        ).step.tokens_per_s_per_gpu
    except InputError:
        return None


def _price(job: Job, changed: Job, n: int) -> str:
    """What a fix costs in time: its throughput per GPU at N against the job's own at N, which did not fit.
    Both run the job's global batch, or where it states none, four micro-batches a stage of the deeper
    pipeline on every DP rank of either (a pipeline's bubble is a cost only against a batch)."""
    ranks = [j.setup.gpus // (j.setup.tp * j.setup.pp * n) for j in (job, changed)]
    if min(ranks) < 1:
        return ""
    batch = job.step.global_batch or math.lcm(*ranks) * job.step.micro_batch * 4 * max(
        job.setup.pp, changed.setup.pp
    )
    before, after = _throughput(job, n, batch), _throughput(changed, n, batch)
    if not before or not after:
        return ""
    loss = 1 - after / before
    if abs(loss) < 0.005:
        return ", at no cost in time"
    return (
        f", {abs(loss):.0%} {'fewer' if loss > 0 else 'more'} tokens a second per GPU than N = {n} without it"
    )


def _fixes(job: Job, n_min: int | None, n_max: int | None, schemes: dict) -> list[str]:
    """What would open the window, and what each costs in time; every setup change is checked by re-running
    the recommendation."""
    trials = _trials(job, n_min)
    fixes = []
    for text, change in trials:
        try:
            changed = job.replace(**change)
            trial = recommend(changed, suggest=False, _schemes=schemes)
        except InputError:  # the change needs what this machine lacks (an inter-node link, say)
            continue
        n = trial.recommendation.n_recommended
        if n:
            fixes.append(f"{text}: N = {n} then works{_price(job, changed, n)}")
    if n_min is not None and (n_max is None or n_min > n_max):
        fixes += [
            "a faster link, or CP ranks inside one node: raises N_max(comm)",
            f"fewer KV heads (GQA): ring traffic scales with n_kv = {job.inputs.kv_heads}",
            "longer shards: fewer CP ranks, with more TP or PP to fit memory",
        ]
    if not fixes:
        tried = ", ".join(text.split(" (")[0] for text, _ in trials)
        fixes.append(f"none of these opens the window alone: {tried}")
    return fixes
