"""Turn `cp-plan calibrate`'s raw measurements into a measured hardware profile (docs/calibration.md).

Links: t = alpha + bytes / B by least squares weighted by 1/t², so that the small messages (where
alpha shows) and the large ones (where B shows) count alike; R² is reported on the plain times. The
all-to-all may bend upward past a knee (the kernel's copies into fresh memory outgrow alpha-beta):
t = alpha + x / B + max(0, x - X_k) / B_x, kept only when it halves the fit's relative residuals.
All-to-all: a rank keeps 1/N of what it holds, so B is fitted against the bytes it receives,
(N-1)/N of them, the quantity the Ulysses formulas use. Compute: the measured FLOP/s per block
size and concurrency are kept as curves; the profile's effective FLOP/s is the full-block rate at the
largest size with all ranks busy, and its "peak" the best rate measured.

Stability: every fitted quantity is refitted on resampled repeats (each figure's single-call samples
drawn again with replacement, its median retaken); its spread is half the interquartile range of
those refits. :func:`judge` turns R², spreads and the machine's load into a verdict that the profile
carries: a noisy calibration is written, flagged, never silently.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from costmodel.machines.binding import Machine, build_machine
from costmodel.machines.profiles import (
    Calibration,
    ComputeCurve,
    FitSpread,
    HardwareProfile,
    LinkFit,
    Quality,
    RatePoint,
    Sample,
    Sentinel,
    layer_key,
)
from costmodel.plans.inputs import PlanInputs

R2_MIN = 0.95  # a link fit explaining less than this of its times is not alpha-beta: too noisy to trust
SPREAD_MAX = 0.15  # relative spread of a link's alpha or B, or of the median compute point, to trust
FIXED_SPREAD_MAX = 0.15  # a fixed cost's spread against its tiny layer (a quiet run here reached 12 %)
DRIFT_MAX = 0.15  # the same compute or exchange timed at the start and the end may differ by this
BUSY_MAX = 0.5  # share of the CPUs other processes may use before calibrating
REPLICAS = 40  # resampled refits behind every spread


def calibrated_inputs(
    profile: HardwareProfile,
    n: int,
    tokens_per_rank: int,
    causal: bool = False,
    layout: str = "contiguous",
    documents: int = 1,
) -> PlanInputs:
    """A plan in the shape the profile was measured with, ``tokens_per_rank`` on each of ``n`` ranks; the
    window packed with ``documents`` equal documents (varlen) when more than one."""
    cal = profile.calibration
    assert cal is not None
    return PlanInputs(
        seq=tokens_per_rank * n,
        cp=n,
        batch=cal.batch,
        heads=cal.heads,
        kv_heads=cal.kv_heads,
        head_dim=cal.head_dim,
        dtype=cal.dtype,
        causal=causal,
        layout=layout,
        block=1,
        hw=profile.name,
        docs=f"{tokens_per_rank * n // documents}x{documents}" if documents > 1 else None,
    )


def calibrated_machine(profile: HardwareProfile) -> Machine:
    """The measured profile bound to the dtype it was measured in."""
    return build_machine(profile, profile.calibration.dtype)  # type: ignore[union-attr]


def fit_link(samples: list[dict[str, Any]], received_fraction: float = 1.0, weighted: bool = True) -> LinkFit:
    """Least-squares alpha and bandwidth of t = alpha + received bytes / B."""
    x = np.array([s["bytes"] for s in samples], dtype=float) * received_fraction
    t = np.array([s["seconds"] for s in samples], dtype=float)
    weights = 1.0 / t if weighted else np.ones_like(t)
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (alpha, inverse_bw), *_ = np.linalg.lstsq(design, t * weights, rcond=None)
    if inverse_bw <= 0:  # a flat curve: no bandwidth term to fit; report the fastest transfer seen
        inverse_bw = float(np.min(t / x))
    alpha = max(float(alpha), 0.0)
    predicted = alpha + x * inverse_bw
    r2 = 1.0 - float(np.sum((t - predicted) ** 2) / np.sum((t - t.mean()) ** 2)) if len(t) > 1 else 1.0
    return LinkFit(
        latency_s=alpha,
        bandwidth=1.0 / float(inverse_bw),
        r2=r2,
        samples=[Sample(bytes=int(s["bytes"]), seconds=s["seconds"], spread=s["spread"]) for s in samples],
    )


def fit_knee_link(samples: list[dict[str, Any]], received_fraction: float = 1.0) -> LinkFit:
    """:func:`fit_link`, or t = alpha + x / B + max(0, x - X_k) / B_x where that halves the weighted
    residuals: X_k at a measured size with at least three below it, both slopes positive."""
    plain = fit_link(samples, received_fraction)
    x = np.array([s["bytes"] for s in samples], dtype=float) * received_fraction
    t = np.array([s["seconds"] for s in samples], dtype=float)
    order = np.argsort(x)
    x, t = x[order], t[order]

    def residual(predicted: np.ndarray) -> float:
        return float(np.sum(((t - predicted) / t) ** 2))

    best, best_residual = None, 0.5 * residual(plain.latency_s + x / plain.bandwidth)
    for knee in x[2:-1]:
        design = np.stack([np.ones_like(x), x, np.maximum(0.0, x - knee)], axis=1) / t[:, None]
        (alpha, inverse_bw, inverse_extra), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        if inverse_bw <= 0 or inverse_extra <= 0 or alpha < 0:
            continue
        predicted = alpha + x * inverse_bw + np.maximum(0.0, x - knee) * inverse_extra
        if residual(predicted) < best_residual:
            best, best_residual = (
                (float(alpha), float(inverse_bw), float(knee), float(inverse_extra)),
                residual(predicted),
            )
    if best is None:
        return plain
    alpha, inverse_bw, knee, inverse_extra = best
    predicted = alpha + x * inverse_bw + np.maximum(0.0, x - knee) * inverse_extra
    r2 = 1.0 - float(np.sum((t - predicted) ** 2) / np.sum((t - t.mean()) ** 2))
    return plain.model_copy(
        update={
            "latency_s": alpha,
            "bandwidth": 1.0 / inverse_bw,
            "r2": r2,
            "knee_bytes": knee,
            "bandwidth_beyond_knee": 1.0 / inverse_extra,
        }
    )


def fit_overlap(points: list[dict[str, float]]) -> tuple[float, float]:
    """(overlap o, step overhead e) of ``both = max(c, m) + (1 - o)·min(c, m) + e``: o from the least-squares
    slope (clipped to [0, 1]), e the median of what o leaves unexplained (at least 0), robust to one
    noisy size."""
    shorter = np.array([min(p["compute"], p["comm"]) for p in points])
    extra = np.array([p["both"] - max(p["compute"], p["comm"]) for p in points])
    slope = np.polyfit(shorter, extra, 1)[0] if len(points) > 1 else 1.0
    overlap = float(np.clip(1 - slope, 0.0, 1.0))
    return overlap, max(0.0, float(np.median(extra - (1 - overlap) * shorter)))


def fit_sync(points: list[dict[str, float]]) -> float:
    """Median over the block sizes of (compute, then all-to-all) - compute - all-to-all, at least 0."""
    return max(0.0, float(np.median([p["compute_then_a2a"] - p["compute"] - p["a2a"] for p in points])))


def build_profile(
    raw: dict[str, Any], name: str, shape: dict[str, Any], date: str | None = None, seed: int = 0
) -> HardwareProfile:
    """A profile `--hw FILE` accepts everywhere, from rank 0's raw measurements: the fits, each with its
    spread over resampled repeats (where the raw measurements carry their samples), and the verdict."""
    profile = _profile(raw, name, shape, date)
    rng = np.random.default_rng(seed)
    replicas = (
        [fitted_values(_profile(_resampled(raw, rng), name, shape, date)) for _ in range(REPLICAS)]
        if _has_samples(raw)
        else []
    )
    fits = {}
    for key, (value, unit) in fitted_values(profile).items():
        seen = [r[key][0] for r in replicas if key in r]
        spread = float(np.subtract(*np.percentile(seen, [75, 25]))) / 2 if len(seen) > 1 else 0.0
        fits[key] = FitSpread(value=value, spread=spread, unit=unit)
    cal = profile.calibration.model_copy(update={"fits": fits})  # type: ignore[union-attr]
    cal = cal.model_copy(update={"quality": judge(cal, raw)})
    return profile.model_copy(update={"calibration": cal})


def _has_samples(raw: dict[str, Any]) -> bool:
    return any("samples" in s for links in raw["links"].values() for s in links["p2p"])


def _quantile(raw: dict[str, Any]) -> float:
    """Which quantile of its samples each figure of ``raw`` is (measurements before it was recorded: 0.5)."""
    return float(raw["meta"].get("quantile", 0.5))


def _resampled(raw: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The raw measurements with every figure retaken over its samples drawn again with replacement."""
    quantile = _quantile(raw)

    def again(values: list[float]) -> list[float]:
        return list(rng.choice(values, size=len(values), replace=True))

    def figure(values: list[float]) -> float:
        return float(np.quantile(values, quantile))

    out = {**raw, "compute": [], "links": {}}
    for curve in raw["compute"]:
        phases = {}
        for phase in ("forward", "backward"):
            phases[phase] = [
                dict(p, flops_per_s=p["flops_per_s"] * figure(p["samples"]) / figure(again(p["samples"])))
                if "samples" in p
                else p
                for p in curve[phase]
            ]
        out["compute"].append({**curve, **phases})
    for scope, links in raw["links"].items():
        out["links"][scope] = {
            **links,
            **{
                kind: [
                    dict(s, seconds=figure(again(s["samples"]))) if "samples" in s else s for s in links[kind]
                ]
                for kind in ("p2p", "alltoall")
            },
        }
    out["overlap"] = [
        {**p, **{what: figure(again(v)) for what, v in p["samples"].items()}} if "samples" in p else p
        for p in raw["overlap"]
    ]
    if raw.get("inference"):
        out["inference"] = {
            **raw["inference"],
            "kinds": [dict(k, seconds=figure(again(k["samples"]))) for k in raw["inference"]["kinds"]],
        }
    layers = raw["layers"]
    if "kinds" in layers:
        out["layers"] = {
            **layers,
            "kinds": [dict(k, seconds=figure(again(k["samples"]))) for k in layers["kinds"]],
        }
    return out


def _rate_uncertainty(point: dict[str, Any], rng: np.random.Generator, quantile: float) -> float:
    """Half the interquartile range of the figure (the ``quantile``) over resampled samples, over the figure."""
    values = point.get("samples")
    if not values or len(values) < 2:
        return 0.0
    figures = np.quantile(rng.choice(values, size=(REPLICAS, len(values)), replace=True), quantile, axis=1)
    return float(np.subtract(*np.percentile(figures, [75, 25])) / 2 / np.quantile(values, quantile))


def _profile(raw: dict[str, Any], name: str, shape: dict[str, Any], date: str | None) -> HardwareProfile:
    meta = raw["meta"]
    rng = np.random.default_rng(1)

    def point(p: dict[str, Any]) -> RatePoint:
        return RatePoint(
            **{k: v for k, v in p.items() if k != "samples"},
            uncertainty=_rate_uncertainty(p, rng, _quantile(raw)),
        )

    curves = [
        ComputeCurve(
            concurrency=c["concurrency"],
            causal=c["causal"],
            forward=[point(p) for p in c["forward"]],
            backward=[point(p) for p in c["backward"]],
        )
        for c in raw["compute"]
    ]
    p2p, alltoall = {}, {}
    for scope, links in raw["links"].items():
        ranks = links["ranks"]
        p2p[scope] = fit_link(links["p2p"])
        alltoall[scope] = fit_knee_link(links["alltoall"], received_fraction=(ranks - 1) / ranks)
    if "intra-node" not in p2p:
        raise ValueError("calibration needs at least 2 ranks on a node to measure a link")
    busiest = max(c.concurrency for c in curves)
    full = next(c for c in curves if c.concurrency == busiest and not c.causal)
    effective = full.forward[-1].flops_per_s
    peak = max(
        p.flops_per_s for c in curves for p in (*c.forward, *c.backward)
    )  # a profile's rates stay under it
    dtype = shape["dtype"]
    overlap, step_overhead = fit_overlap(raw["overlap"])
    read = (raw.get("inference") or {}).get("read")  # absent from measurements taken before it was

    def link(scope: str, label: str) -> dict[str, Any]:
        fit, collective = p2p[scope], alltoall[scope]
        return {
            "name": f"{meta['backend']} {label} (measured)",
            "bandwidth_per_direction": fit.bandwidth,
            "latency_s": fit.latency_s,
            "alltoall": {"bandwidth_per_direction": collective.bandwidth, "latency_s": collective.latency_s},
        }

    data = {
        "name": name,
        "description": f"measured by cp-plan calibrate: {meta['nproc']} ranks, {meta['backend']}, {dtype}",
        "source": {
            "kind": "measured",
            "host": meta["host"],
            "date": date or datetime.date.today().isoformat(),
            "backend": meta["backend"],
            "torch_version": meta["torch_version"],
            "nproc": meta["nproc"],
            "notes": f"{meta['device_name']}; peak_flops is the best attention rate measured, not a datasheet figure"
            + (
                f"; hbm_bandwidth is the rate one decode query read a {read['tokens']}-token cache at"
                if read
                else ""
            ),
        },
        "device": {
            "name": meta["device_name"],
            "peak_flops": {dtype: peak},
            "effective_flops": {dtype: effective},
            "hbm_bytes": meta["memory_bytes"],
            **({"hbm_bandwidth": read["bytes_per_s"]} if read else {}),
        },
        "devices_per_node": meta["ranks_per_node"],
        "links": {"intra_node": link("intra-node", "intra-node")}
        | ({"inter_node": link("inter-node", "inter-node")} if "inter-node" in p2p else {}),
        "calibration": Calibration(
            dtype=dtype,
            batch=shape["batch"],
            heads=shape["heads"],
            kv_heads=shape["kv_heads"],
            head_dim=shape["head_dim"],
            compute=curves,
            p2p=p2p,
            alltoall=alltoall,
            overlap=overlap,
            step_overhead_s=step_overhead,
            sync_overhead_s=fit_sync(raw["overlap"]),
            overlap_samples=[{k: v for k, v in p.items() if k != "samples"} for p in raw["overlap"]],
            layer_tokens=raw["layers"]["tokens"],
            call_rates=(raw.get("inference") or {}).get("calls", []),
            quantile=_quantile(raw),
            sentinel=_sentinel(raw),
        ),
    }
    profile = HardwareProfile.model_validate(data)
    profile = _with_layer_overheads(profile, raw["layers"])
    return _with_inference_overheads(profile, raw.get("inference"))


def _sentinel(raw: dict[str, Any]) -> Sentinel | None:
    """The sentinel's end-of-calibration figures, for validate to time again (None before they were kept)."""
    sentinel = raw.get("sentinel")
    if not sentinel or "tokens" not in sentinel:
        return None
    end = sentinel["end"]
    return Sentinel(tokens=sentinel["tokens"], compute_s=end["compute"], exchange_s=end["exchange"])


def layer_kinds(layers: dict[str, Any]) -> list[dict[str, Any]]:
    """The tiny layers timed, as {variant, layout, causal, pass, seconds}; older raw measurements named
    only 'ring fwd', 'ulysses fwd+bwd' (contiguous, no mask)."""
    if "kinds" in layers:
        return layers["kinds"]
    return [
        {
            "variant": key.split()[0],
            "layout": "contiguous",
            "causal": False,
            "pass": key.split()[1],
            "seconds": value,
        }
        for key, value in layers.items()
        if key != "tokens"
    ]


def _with_layer_overheads(profile: HardwareProfile, layers: dict[str, Any]) -> HardwareProfile:
    """Each layer kind's fixed cost: its time at a tiny shard less the model's prediction without it."""
    from costmodel.plans.timing import predict

    cal = profile.calibration
    assert cal is not None
    n = profile.source.nproc or profile.devices_per_node
    machine = calibrated_machine(profile)
    overheads = {}
    for kind in layer_kinds(layers):
        inputs = calibrated_inputs(profile, n, layers["tokens"], kind["causal"], kind["layout"])
        backward = kind["pass"] == "fwd+bwd"
        modelled = predict(inputs, machine, kind["variant"], backward).total_s
        key = layer_key(kind["variant"], kind["layout"], kind["causal"], kind["pass"])
        overheads[key] = max(0.0, kind["seconds"] - modelled)
    return profile.model_copy(update={"calibration": cal.model_copy(update={"layer_overhead_s": overheads})})


def _with_inference_overheads(profile: HardwareProfile, inference: dict[str, Any] | None) -> HardwareProfile:
    """Each inference scheme's fixed cost: its whole layer's time at a tiny shard less what the inference
    formulas predict for it without one (profiles measured before it: none)."""
    if not inference:
        return profile
    from costmodel.inference.kernel_runs import predict_run

    cal = profile.calibration
    assert cal is not None
    n = profile.source.nproc or profile.devices_per_node
    machine = calibrated_machine(profile)
    inputs = calibrated_inputs(profile, n, 1)
    overheads = {
        kind["scheme"]: max(
            0.0,
            kind["seconds"]
            - predict_run(inputs, machine, kind["scheme"], kind["new_per_rank"], kind["cached_per_rank"]),
        )
        for kind in inference["kinds"]
    }
    return profile.model_copy(
        update={"calibration": cal.model_copy(update={"inference_overhead_s": overheads})}
    )


# --- Every fitted quantity by name: what the spreads are of, and what validate perturbs. ----------------
def _fit_paths(cal: dict[str, Any]) -> dict[str, tuple[tuple[str, ...], str]]:
    """Fitted quantity -> (its path in the dumped calibration, its unit)."""
    paths: dict[str, tuple[tuple[str, ...], str]] = {}
    for kind in ("p2p", "alltoall"):
        for scope, fit in cal[kind].items():
            paths[f"{kind} {scope} alpha"] = ((kind, scope, "latency_s"), "s")
            paths[f"{kind} {scope} B"] = ((kind, scope, "bandwidth"), "B/s")
            if fit.get("knee_bytes"):
                paths[f"{kind} {scope} X_k"] = ((kind, scope, "knee_bytes"), "B")
                paths[f"{kind} {scope} B_x"] = ((kind, scope, "bandwidth_beyond_knee"), "B/s")
    paths["overlap"] = (("overlap",), "1")
    paths["step overhead"] = (("step_overhead_s",), "s")
    paths["sync overhead"] = (("sync_overhead_s",), "s")
    for key in cal.get("layer_overhead_s", {}):
        paths[f"layer {key}"] = (("layer_overhead_s", key), "s")
    for key in cal.get("inference_overhead_s", {}):
        paths[f"inference {key}"] = (("inference_overhead_s", key), "s")
    return paths


def _get(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def fitted_values(profile: HardwareProfile) -> dict[str, tuple[float, str]]:
    """Every fitted quantity of a measured profile: name -> (value, unit)."""
    cal = profile.calibration.model_dump(mode="json")  # type: ignore[union-attr]
    return {key: (float(_get(cal, path)), unit) for key, (path, unit) in _fit_paths(cal).items()}


def with_fit(profile: HardwareProfile, key: str, value: float) -> HardwareProfile:
    """The profile with one fitted quantity set to ``value`` (clipped to what the schema accepts)."""
    data = profile.model_dump(mode="json", exclude_none=True)
    path, _ = _fit_paths(data["calibration"])[key]
    parent = _get(data["calibration"], path[:-1])
    low = 1e-12 if path[-1] in ("bandwidth", "bandwidth_beyond_knee", "knee_bytes") else 0.0
    parent[path[-1]] = float(np.clip(value, low, 1.0 if key == "overlap" else np.inf))
    return HardwareProfile.model_validate(data)


def with_compute_scaled(profile: HardwareProfile, sign: float = 1.0) -> HardwareProfile:
    """The profile with every measured rate moved by its own uncertainty (``sign`` +1: faster)."""
    data = profile.model_dump(mode="json", exclude_none=True)
    for curve in data["calibration"]["compute"]:
        for phase in ("forward", "backward"):
            for p in curve[phase]:
                p["flops_per_s"] *= 1 + sign * p.get("uncertainty", 0.0)
    return HardwareProfile.model_validate(data)


def judge(cal: Calibration, raw: dict[str, Any]) -> Quality:
    """Trusted unless a link fit's R² is under :data:`R2_MIN`, a link's alpha or B or the median compute
    point moves by more than :data:`SPREAD_MAX` over resampled repeats, a fixed cost moves by more than
    :data:`FIXED_SPREAD_MAX` of the tiny layer it was measured on, the same compute or exchange took
    more than :data:`DRIFT_MAX` longer or shorter at the end than at the start, or the machine was busy
    before. Resampling sees the noise within a run; the last two see a machine that changed under it."""
    meta = raw["meta"]
    reasons = [*_fit_reasons(cal), *_fixed_cost_reasons(cal, raw), *_drift_reasons(raw), *_busy_reasons(meta)]
    cpus, before, busy = meta.get("cpus"), meta.get("load_before"), meta.get("busy_before")
    return Quality(
        trusted=not reasons,
        reasons=reasons,
        r2_min=R2_MIN,
        spread_max=SPREAD_MAX,
        load_before=before,
        busy_before=busy,
        load_after=meta.get("load_after"),
        cpus=cpus,
    )


def _fit_reasons(cal: Calibration) -> list[str]:
    """Link fits under R2_MIN; link alphas, Bs and the median compute point that move past SPREAD_MAX."""
    reasons = []
    for kind, fits in (("point-to-point", cal.p2p), ("all-to-all", cal.alltoall)):
        for scope, fit in fits.items():
            if fit.r2 < R2_MIN:
                reasons.append(f"{scope} {kind} fit R² {fit.r2:.2f} < {R2_MIN}")
    for key, fit in cal.fits.items():
        kind = key.split()[0]
        if kind in ("p2p", "alltoall") and key.split()[-1] in ("alpha", "B") and fit.relative > SPREAD_MAX:
            reasons.append(f"{key} moves ±{fit.relative:.0%} over resampled repeats (> {SPREAD_MAX:.0%})")
    compute = [p.uncertainty for c in cal.compute for p in (*c.forward, *c.backward)]
    if compute and float(np.median(compute)) > SPREAD_MAX / 3:
        reasons.append(f"compute rates move ±{np.median(compute):.1%} (median point; > {SPREAD_MAX / 3:.0%})")
    return reasons


def _fixed_cost_reasons(cal: Calibration, raw: dict[str, Any]) -> list[str]:
    """Fixed costs that move past FIXED_SPREAD_MAX of the tiny layer they were measured on."""
    tiny = {
        layer_key(k["variant"], k["layout"], k["causal"], k["pass"]): k["seconds"]
        for k in layer_kinds(raw["layers"])
    }
    smallest = min(tiny.values()) if tiny else None
    tiny |= {f"inference {k['scheme']}": k["seconds"] for k in (raw.get("inference") or {}).get("kinds", [])}
    reasons = []
    for key, fit in cal.fits.items():
        if key.startswith(("layer ", "inference ")) or key in ("step overhead", "sync overhead"):
            scale = tiny.get(key.removeprefix("layer "), smallest)
            if scale and fit.spread > FIXED_SPREAD_MAX * scale:
                reasons.append(
                    f"{key} moves ±{fit.spread * 1e3:.2f} ms, > {FIXED_SPREAD_MAX:.0%} of its "
                    f"{scale * 1e3:.2f} ms layer"
                )
    return reasons


def _drift_reasons(raw: dict[str, Any]) -> list[str]:
    """The same work timed at the start and the end, apart by more than DRIFT_MAX."""
    sentinel = raw.get("sentinel")
    if not sentinel:
        return []
    return [
        f"the machine changed speed while calibrating: the same {what} took {change:+.0%} longer at the end "
        "than at the start"
        for what, start in sentinel["start"].items()
        if abs(change := sentinel["end"][what] / start - 1) > DRIFT_MAX
    ]


def _busy_reasons(meta: dict[str, Any]) -> list[str]:
    """A machine busy before calibrating: measured just before (a job that has just ended does not count),
    else by its load average."""
    cpus, before, busy = meta.get("cpus"), meta.get("load_before"), meta.get("busy_before")
    if busy is not None:
        if busy > BUSY_MAX:
            return [f"the machine was busy before calibrating: other processes used {busy:.0%} of its CPUs"]
    elif cpus and before is not None and before > BUSY_MAX * cpus:
        return [f"the machine was busy before calibrating: load {before:.1f} on {cpus} CPUs"]
    return []
