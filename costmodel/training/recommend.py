"""A training run around the attention layer: memory fit, the CP window and the recommendation (issue 5).

The seed sizes CP from the communication side only (N <= (h/n_kv)·S/beta). A plan also needs the
other side: the smallest N whose activations fit. Between the two lies the window; the recommended
N is the smallest one in it (it leaves the most data parallelism and the least traffic), run with
the scheme that exposes the least communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from costmodel.core.units import si
from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.bind import Evaluator, pass_ratio, plan_values
from costmodel.plans.inputs import PlanInputs, TrainingSetup
from costmodel.plans.models import ModelPreset
from costmodel.plans.schema import Fit, Recommendation, RecommendCandidate, RecommendReport
from costmodel.plans.timing import predict
from costmodel.plans.verdict import AMBER, BANDS, band
from costmodel.schedule.layouts import divisors, ulysses_feasibility


def zero_fractions(stage: int, group: int) -> tuple[float, float, float]:
    """Fractions of (weights, gradients, optimizer states) one device keeps under a ZeRO stage."""
    shard = 1 / group
    return (shard if stage >= 3 else 1.0, shard if stage >= 2 else 1.0, shard if stage >= 1 else 1.0)


def training_values(inputs: PlanInputs, model: ModelPreset, setup: TrainingSetup, profile: HardwareProfile,
                    n: int) -> dict[str, Any]:  # fmt: skip
    """Every symbol the memory-fit formulas need, at CP degree ``n``: the whole model's heads (the
    formulas divide by t themselves), where the comm formulas take a TP rank's (``setup.attention``)."""
    z_w, z_g, z_o = zero_fractions(setup.zero, setup.shard_group)
    return {
        **plan_values(inputs, profile, n),
        "h": model.heads, "n_kv": model.kv_heads, "H": model.hidden, "F_ffn": model.ffn_hidden, "V": model.vocab, "n_L": model.layers,
        "g": int(model.gated_mlp), "delta": int(model.dropout), "e_m": 1 if model.tied_embeddings else 2,
        "phi": 0,  # flash attention keeps no scores; "selective" recompute is what it does already
        "sigma": 1 if setup.tp > 1 else 0, "t": setup.tp, "pp": setup.pp, "rho": int(setup.recompute == "full"),
        "z_w": z_w, "z_g": z_g, "z_o": z_o,
        "M_dev": profile.device.hbm_bytes * (1 - setup.memory_headroom),
    }  # fmt: skip


def fit_at(ev: Evaluator) -> Fit:
    state, activations, buffers = ev("model_state_bytes"), ev("activation_bytes"), ev("ring_buffer_bytes")
    total = state + activations + buffers
    return Fit(
        n=ev.values["N"], params=ev("params"), model_state_bytes=state, activation_bytes=activations,
        buffer_bytes=buffers, total_bytes=total, device_memory_bytes=ev.values["M_dev"],
        fits=total <= ev.values["M_dev"],
    )  # fmt: skip


@dataclass(frozen=True)
class Option:
    """One way to run attention at a given N: its comm ratio and the communication it leaves exposed."""

    scheme: str  # ring, ulysses, usp
    layout: str | None
    n_ulysses: int
    exposed_s: float  # per layer, for the pass
    ratio: float  # ring step ratio; all-to-all time / compute for Ulysses; the sum of both for USP

    def label(self, n: int) -> str:
        return {"ring": "ring", "ulysses": "Ulysses"}.get(self.scheme, f"USP {self.n_ulysses}x{n // self.n_ulysses}")


def options_at(ev: Evaluator, inputs: PlanInputs, profile: HardwareProfile, n: int, pass_: str) -> list[Option]:
    """Ring (zigzag when causal), Ulysses and every USP split that fits the head counts, at CP degree n,
    with the communication each leaves exposed per layer (:func:`costmodel.plans.timing.predict`)."""
    backward = pass_ == "fwd+bwd"
    compute = sum(float(ev(name)) for phase, name in (("fwd", "layer_compute_s"), ("bwd", "bwd_layer_compute_s"))
                  if phase in pass_)  # fmt: skip
    layout = "zigzag" if inputs.causal and inputs.seq % (2 * n) == 0 else "contiguous"
    ring = inputs.model_copy(update={"n": n, "layout": layout})
    out = [Option("ring", layout, 1, predict(ring, profile, "ring", backward).exposed_s, pass_ratio(ev, pass_))]
    for n_u in divisors(n)[1:]:
        ok, _ = ulysses_feasibility(inputs.heads, inputs.kv_heads, n_u)
        if not ok:
            continue
        # The all-to-all of N_u ranks; on the ring's side, N_r = N/N_u steps over h/N_u heads and
        # max(n_kv, N_u)/N_u KV heads, on the link a group of all N ranks uses.
        a2a_only = inputs.model_copy(update={"n": n_u, "seq": inputs.seq // (n // n_u), "layout": "contiguous"})
        a2a = predict(a2a_only, profile, "ulysses", backward)
        if n_u == n:
            out.append(Option("ulysses", None, n_u, a2a.exposed_s, a2a.exposed_s / compute))
            continue
        sub = inputs.model_copy(update={"n": n // n_u, "heads": inputs.heads // n_u,
                                        "kv_heads": max(inputs.kv_heads, n_u) // n_u,
                                        "layout": layout if inputs.seq % (2 * n // n_u) == 0 else "contiguous"})  # fmt: skip
        ring_link, _ = profile.link_for(n)
        sub_ev = Evaluator({**plan_values(sub, profile), "B": ring_link.bandwidth_per_direction,
                            "alpha": ring_link.latency_s})  # fmt: skip
        exposed = a2a.exposed_s + predict(sub, profile, "ring", backward, span=n).exposed_s
        # Its ratio adds the all-to-alls' share of compute (not overlapped) to the ring step's (overlapped).
        out.append(Option("usp", layout, n_u, exposed, pass_ratio(sub_ev, pass_) + a2a.exposed_s / compute))
    return out


def recommend(inputs: PlanInputs, model: ModelPreset, setup: TrainingSetup, profile: HardwareProfile,
              suggest: bool = True) -> RecommendReport:  # fmt: skip
    """The window [N_min(memory), N_max(comm)] over the CP degrees the job can use, and the pick.

    Each usable N is scored by its best scheme (ring, Ulysses or a USP split), so USP can extend the
    window past where the plain ring turns red. With ``suggest``, an empty window also gets the setup
    changes that would open it, each checked by re-running this function.
    """
    setup.check()
    profile = setup.placed(profile)
    attention = setup.attention(inputs)
    candidates = [n for n in divisors(setup.shard_group) if inputs.seq % n == 0]
    rows, best_at, evaluators = [], {}, {}
    for n in candidates:
        evaluators[n] = Evaluator(training_values(inputs, model, setup, profile, n))
        ev = Evaluator(plan_values(attention, profile, n))
        if n == 1:  # one device receives nothing
            best = Option("ring", None, 1, 0.0, 0.0)
            ring_ratio = 0.0
        else:
            options = options_at(ev, attention, profile, n, setup.pass_)
            ring_ratio = options[0].ratio
            best = min(options, key=lambda o: (BANDS.index(band(o.ratio)), o.exposed_s))
        best_at[n] = best
        fit = fit_at(evaluators[n])
        rows.append(RecommendCandidate(
            n=n, dp=setup.shard_group // n, fits=fit.fits, total_bytes=fit.total_bytes,
            ring_comm_ratio_step=ring_ratio, best_scheme=best.label(n), comm_ratio=best.ratio,
            verdict=band(best.ratio).verdict, link_scope=profile.link_for(n)[1],
        ))  # fmt: skip
    n_min = min((r.n for r in rows if r.fits), default=None)
    n_max = max((r.n for r in rows if r.comm_ratio <= AMBER.upper), default=None)
    window = [r for r in rows if r.fits and r.comm_ratio <= AMBER.upper]
    n_min_real = float(evaluators[candidates[-1]]("n_min_memory"))
    common = {"n_min_memory": n_min, "n_max_comm": n_max, "n_min_memory_real": n_min_real}
    if window:
        pick = min(window, key=lambda r: (r.verdict != "green", r.n))
        best = best_at[pick.n]
        recommendation = Recommendation(
            **common, n_recommended=pick.n, dp=pick.dp, scheme=best.scheme, layout=best.layout,
            n_ulysses=best.n_ulysses, reason=_reason(pick, best, n_min, setup), fixes=[],
        )  # fmt: skip
        fit = fit_at(evaluators[pick.n])
    else:
        recommendation = Recommendation(
            **common, n_recommended=None, dp=None, scheme=None, layout=None, n_ulysses=None,
            reason=_failure(rows, n_min, n_max, setup),
            fixes=_fixes(inputs, model, setup, profile, n_min, n_max) if suggest else [],
        )  # fmt: skip
        fit = fit_at(evaluators[n_min or candidates[-1]])
    return RecommendReport(inputs=inputs, setup=setup, hw=profile.name, fit=fit, recommendation=recommendation,
                           candidates=rows)  # fmt: skip


def _reason(pick: RecommendCandidate, best: Option, n_min: int | None, setup: TrainingSetup) -> str:
    if pick.n == 1:
        why = f"no CP is needed: {si(pick.total_bytes, 'B', 3)} per device fits on one"
    elif pick.n == n_min:
        why = f"the smallest CP degree whose memory fits ({si(pick.total_bytes, 'B', 3)} of HBM per device)"
    else:
        why = f"the smallest green CP degree that fits (N = {n_min} fits but is amber)"
    how = {"ring": f"a {best.layout} ring", "ulysses": "Ulysses all-to-all",
           "usp": f"{best.label(pick.n)}, the all-to-all inside a node and a {best.layout} ring across"}[best.scheme]  # fmt: skip
    return (f"N = {pick.n} is {why}; with {how} its {setup.pass_} comm ratio is {pick.comm_ratio:.2%} "
            f"({pick.verdict}, {pick.link_scope}), leaving DP = {pick.dp}.")


def _failure(rows: list[RecommendCandidate], n_min: int | None, n_max: int | None, setup: TrainingSetup) -> str:
    if n_min is None:
        largest = rows[-1]
        return (f"Memory fails: even N = {largest.n}, every rank of a TP x PP slice, needs "
                f"{si(largest.total_bytes, 'B', 3)} per device.")
    at_min = next(r for r in rows if r.n == n_min)
    return (f"Communication fails: memory needs N >= {n_min}, where the best scheme ({at_min.best_scheme}) has a "
            f"{setup.pass_} comm ratio of {at_min.comm_ratio:.1%}; it stays within 15 % only up to N = {n_max}.")


def _fixes(inputs: PlanInputs, model: ModelPreset, setup: TrainingSetup, profile: HardwareProfile,
           n_min: int | None, n_max: int | None) -> list[str]:  # fmt: skip
    """What would open the window; the setup changes are checked by re-running the recommendation."""
    trials = []
    if setup.recompute != "full":
        trials.append(("full activation recompute (--recompute full)", {"recompute": "full"}))
    if setup.zero < 3:
        trials.append(("ZeRO-3 (--zero 3)", {"zero": 3}))
    if 2 * setup.tp <= profile.devices_per_node and setup.gpus % (2 * setup.tp * setup.pp) == 0:
        trials.append((f"TP {2 * setup.tp} (--tp {2 * setup.tp})", {"tp": 2 * setup.tp}))
    fixes = []
    for text, change in trials:
        trial = recommend(inputs, model, setup.model_copy(update=change), profile, suggest=False)
        if trial.recommendation.n_recommended:
            fixes.append(f"{text}: N = {trial.recommendation.n_recommended} then works")
    if n_min is not None and (n_max is None or n_min > n_max):
        fixes += [
            "a faster link, or CP ranks inside one node: raises N_max(comm)",
            f"fewer KV heads (GQA): ring traffic scales with n_kv = {inputs.kv_heads}",
            "longer shards: fewer CP ranks, with more TP or PP to fit memory",
        ]
    return fixes
