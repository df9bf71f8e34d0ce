"""Evaluate the model over a grid of sequence lengths, CP degrees and machines, vectorised (issue 5).

The generated formulas broadcast over numpy arrays, so a grid is one call per formula: S is a column,
N a row, and the link each N uses (SPEC §4.6) an array picked per N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from costmodel.core.errors import InputError
from costmodel.machines.profiles import HardwareProfile
from costmodel.plans.bind import PASSES, RATIO, plan_values
from costmodel.plans.inputs import TOKENS_HELP, PlanInputs, TrainingSetup, parse_tokens
from costmodel.plans.models import ModelPreset
from costmodel.plans.verdict import AMBER, BANDS, GREEN
from costmodel.symbolic import numeric

RANGE_HELP = "a value, a list (8k,32k,128k), or a doubling range (8k..1M)"


def parse_grid(text: str, field: str) -> list[int]:
    """``8k..1M`` doubles from 8k up to 1M; ``8k,32k`` lists; ``256k`` is one value."""
    text = text.strip()
    if ".." in text:
        low_text, _, high_text = text.partition("..")
        low, high = parse_tokens(low_text, field), parse_tokens(high_text, field)
        if low > high:
            raise InputError(field, f"range {text!r} runs downwards; write low..high")
        values, value = [], low
        while value <= high:
            values.append(value)
            value *= 2
        return values
    parts = [p for p in re.split(r"\s*,\s*", text) if p]
    if not parts:
        raise InputError(field, f"empty; accepted: {RANGE_HELP}, each {TOKENS_HELP}")
    return sorted({parse_tokens(p, field) for p in parts})


@dataclass
class Grid:
    """Results on seqs x ns for one profile; NaN where N does not split S."""

    profile: str
    seqs: np.ndarray  # (k,)
    ns: np.ndarray  # (m,)
    ratio: np.ndarray  # (k, m) step comm ratio for the pass
    intensity: np.ndarray  # (k, m) forward step intensity
    step_compute_s: np.ndarray
    step_comm_s: np.ndarray
    inter_node: np.ndarray  # (m,) whether the ring over N leaves the node
    n_max: np.ndarray  # (k,) real N where the pass's ratio reaches 100 %, topology included
    n_min_memory: np.ndarray | None = field(default=None)  # (k,) real N where training memory fits

    def verdicts(self) -> np.ndarray:
        """0 green, 1 amber, 2 red, -1 where undefined."""
        codes = np.where(self.ratio < GREEN.upper, 0, np.where(self.ratio <= AMBER.upper, 1, 2))
        return np.where(np.isnan(self.ratio), -1, codes)

    def rows(self) -> list[dict[str, object]]:
        """One record per (S, N), for CSV and JSON."""
        names = [band.verdict for band in BANDS]
        out = []
        verdicts = self.verdicts()
        for i, seq in enumerate(self.seqs):
            for j, n in enumerate(self.ns):
                if np.isnan(self.ratio[i, j]):
                    continue
                out.append({
                    "hw": self.profile, "seq": int(seq), "n": int(n), "comm_ratio_step": float(self.ratio[i, j]),
                    "verdict": names[verdicts[i, j]], "intensity_step": float(self.intensity[i, j]),
                    "step_compute_s": float(self.step_compute_s[i, j]), "step_comm_s": float(self.step_comm_s[i, j]),
                    "link_scope": "inter-node" if self.inter_node[j] else "intra-node",
                })  # fmt: skip
        return out


def _link_arrays(profile: HardwareProfile, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inter = ns > profile.ranks_per_node
    intra_link, inter_link = profile.links.intra_node, profile.links.inter_node or profile.links.intra_node
    if inter.any() and profile.links.inter_node is None:
        raise InputError("--n", f"profile {profile.name!r} has no inter-node link for N > {profile.ranks_per_node}")
    bandwidth = np.where(inter, inter_link.bandwidth_per_direction, intra_link.bandwidth_per_direction)
    latency = np.where(inter, inter_link.latency_s, intra_link.latency_s)
    return bandwidth, latency, inter


def sweep(shape: PlanInputs, seqs: list[int] | np.ndarray, ns: list[int] | np.ndarray, profile: HardwareProfile,
          model: ModelPreset | None = None, setup: TrainingSetup | None = None) -> Grid:  # fmt: skip
    """The grid for one profile. ``shape`` gives heads, dtype, causal, pass; its seq and n are ignored."""
    seq_col = np.asarray(seqs, dtype=float)[:, None]
    n_row = np.asarray(ns, dtype=float)[None, :]
    bandwidth, latency, inter = _link_arrays(profile, np.asarray(ns))
    # The plan's binding of inputs to symbols, with S, N and the link each N uses as arrays.
    values = {**plan_values(shape, profile), "S": seq_col, "N": n_row, "B": bandwidth[None, :],
              "alpha": latency[None, :]}  # fmt: skip

    def call(name: str, **over: object) -> np.ndarray:
        return getattr(numeric, name)(**{a: over.get(a, values.get(a)) for a in numeric.ARGS[name]})

    ratio = np.max([call(RATIO[phase]) for phase in PASSES[shape.pass_]], axis=0)
    ratio = np.where(n_row == 1, 0.0, ratio)  # one device receives nothing
    valid = (seq_col % n_row == 0) & (n_row <= seq_col)
    # N_max: the intra-node bound while it stays inside the node, else the inter-node one.
    bound_of = {"fwd": "n_at_ratio", "bwd": "bwd_n_at_ratio"}  # N where the phase's step ratio reaches r
    bounds = {}
    for scope, link in (("intra", profile.links.intra_node), ("inter", profile.links.inter_node)):
        if link is not None:
            over = {"S": seq_col[:, 0], "B": link.bandwidth_per_direction, "alpha": link.latency_s, "r": 1.0}
            bounds[scope] = np.min([call(bound_of[phase], **over) for phase in PASSES[shape.pass_]], axis=0)
    ranks = profile.ranks_per_node
    n_max = bounds["intra"]
    if "inter" in bounds:
        n_max = np.where(bounds["inter"] > ranks, bounds["inter"], np.minimum(bounds["intra"], ranks))
    grid = Grid(
        profile=profile.name, seqs=np.asarray(seqs), ns=np.asarray(ns), ratio=np.where(valid, ratio, np.nan),
        intensity=np.broadcast_to(call("intensity_step"), ratio.shape).copy(),
        step_compute_s=np.broadcast_to(call("step_compute_s"), ratio.shape).copy(),
        step_comm_s=np.broadcast_to(call("step_comm_s"), ratio.shape).copy(), inter_node=inter, n_max=n_max,
    )  # fmt: skip
    if model is not None and setup is not None:
        from costmodel.training.recommend import training_values

        base = training_values(shape, model, setup, profile, 1)
        grid.n_min_memory = numeric.n_min_memory(
            **{a: (seq_col[:, 0] if a == "S" else base[a]) for a in numeric.ARGS["n_min_memory"]}
        )
    return grid
