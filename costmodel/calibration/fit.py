"""Turn `cp-plan calibrate`'s raw measurements into a measured hardware profile (docs/calibration.md).

Links: t = alpha + bytes / B by least squares weighted by 1/t², so that the small messages (where
alpha shows) and the large ones (where B shows) count alike; R² is reported on the plain times.
All-to-all: a rank keeps 1/N of what it holds, so B is fitted against the bytes it receives,
(N-1)/N of them, the quantity the Ulysses formulas use. Compute: the measured FLOP/s per block
size and concurrency are kept as curves; the profile's effective FLOP/s is the full-block rate at the
largest size with all ranks busy, and its "peak" the best rate measured.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from costmodel.machines.profiles import (
    Calibration,
    ComputeCurve,
    HardwareProfile,
    LinkFit,
    RatePoint,
    Sample,
)


def fit_link(samples: list[dict[str, float]], received_fraction: float = 1.0) -> LinkFit:
    """Least-squares alpha and bandwidth of t = alpha + received bytes / B."""
    x = np.array([s["bytes"] for s in samples], dtype=float) * received_fraction
    t = np.array([s["seconds"] for s in samples], dtype=float)
    weights = 1.0 / t
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
    raw: dict[str, Any], name: str, shape: dict[str, Any], date: str | None = None
) -> HardwareProfile:
    """A profile `--hw FILE` accepts everywhere, from rank 0's raw measurements."""
    meta = raw["meta"]
    curves = [
        ComputeCurve(
            concurrency=c["concurrency"],
            causal=c["causal"],
            forward=[RatePoint(**point) for point in c["forward"]],
            backward=[RatePoint(**point) for point in c["backward"]],
        )
        for c in raw["compute"]
    ]
    p2p, alltoall = {}, {}
    for scope, links in raw["links"].items():
        ranks = links["ranks"]
        p2p[scope] = fit_link(links["p2p"])
        alltoall[scope] = fit_link(links["alltoall"], received_fraction=(ranks - 1) / ranks)
    if "intra-node" not in p2p:
        raise ValueError("calibration needs at least 2 ranks on a node to measure a link")
    busiest = max(c.concurrency for c in curves)
    full = next(c for c in curves if c.concurrency == busiest and not c.causal)
    effective = full.forward[-1].flops_per_s
    peak = max(p.flops_per_s for c in curves for p in c.forward)
    dtype = shape["dtype"]
    overlap, step_overhead = fit_overlap(raw["overlap"])

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
            "notes": f"{meta['device_name']}; peak_flops is the best attention rate measured, not a datasheet figure",
        },
        "device": {
            "name": meta["device_name"],
            "peak_flops": {dtype: peak},
            "effective_flops": {dtype: effective},
            "hbm_bytes": meta["memory_bytes"],
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
            overlap_samples=raw["overlap"],
        ),
    }
    profile = HardwareProfile.model_validate(data)
    return _with_layer_overheads(profile, raw["layers"])


def _with_layer_overheads(profile: HardwareProfile, layers: dict[str, Any]) -> HardwareProfile:
    """Each layer kind's fixed cost: its time at a tiny shard less the model's prediction without it."""
    from costmodel.calibration.compare import calibrated_inputs, calibrated_machine
    from costmodel.plans.timing import predict

    cal = profile.calibration
    assert cal is not None
    n = profile.source.nproc or profile.devices_per_node
    inputs = calibrated_inputs(profile, n, layers["tokens"])
    machine = calibrated_machine(profile)
    overheads = {}
    for variant in ("ring", "ulysses"):
        for pass_ in ("fwd", "fwd+bwd"):
            modelled = predict(inputs, machine, variant, backward=pass_ == "fwd+bwd").total_s
            overheads[f"{variant} {pass_}"] = max(0.0, layers[f"{variant} {pass_}"] - modelled)
    return profile.model_copy(update={"calibration": cal.model_copy(update={"layer_overhead_s": overheads})})


def profile_yaml(profile: HardwareProfile) -> str:
    """The profile as YAML, with a header that says what it is and how it was made."""
    import yaml

    body = yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False, width=110)
    head = (
        f"# Measured hardware profile written by `cp-plan calibrate` on {profile.source.date}.\n"
        "# Units are SI: FLOP/s, bytes, bytes/s, seconds. Bandwidths are PER DIRECTION (a ring step's receive);\n"
        "# all-to-all bandwidth counts the bytes each rank receives. Use it anywhere: --hw this-file.yaml\n"
    )
    return head + body
