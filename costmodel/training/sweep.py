"""Evaluate the model over a grid of sequence lengths, CP degrees and machines, vectorised ([Korthikanti22]).

The generated formulas broadcast over numpy arrays, so a grid is one call per formula: S is a column,
N a row, and the link each N uses ([A-RingCost §9]) an array picked per N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from costmodel.core.errors import InputError
from costmodel.core.units import TOKENS_HELP, parse_integer, parse_tokens
from costmodel.machines.binding import Machine
from costmodel.plans.bind import PASSES, PHASE_PREFIX, RATIO, call, plan_values
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.job import Job
from costmodel.plans.packing import compute_fraction, pack
from costmodel.plans.verdict import AMBER, BANDS, GREEN
from costmodel.schedule.layouts import chunks_per_rank

RANGE_HELP = "a value, a list (8k,32k,128k), or a doubling range (8k..1M)"
RANGE_HELP_WHOLE = "a whole number, a list (2,4,8), or a doubling range (1..64)"

MAX_POINTS = 256  # values per axis: a grid is answered in well under a second
MAX_PROFILES = 16  # --hw entries: each is loaded, bound and swept (there are 15 built-in profiles)
# With --model and --gpus each (S, profile) pair is a layout search for the step times (40-70 ms here): 64
# pairs, 8 S values on 8 profiles, take 3-4.5 s; 256 S values on 15 profiles took 110 s.
MAX_STEP_SEARCHES = 64


def parse_grid(text: str, field: str, upper: int, tokens: bool = True) -> list[int]:
    """``8k..1M`` doubles from 8k up to 1M; ``8k,32k`` lists; ``256k`` is one value. Each in [1, upper]: token
    lengths, or with ``tokens`` False whole numbers (CP degrees: ``1..64``, ``2,4,8``)."""
    values = _grid(text.strip(), field, tokens)
    outside = next((v for v in (values[0], values[-1]) if not 1 <= v <= upper), None)
    if outside is not None:
        raise InputError(field, f"values must lie in [1, {upper:,}] (got {outside:,})")
    if len(values) > MAX_POINTS:
        raise InputError(field, f"{len(values)} values; a sweep takes at most {MAX_POINTS} per axis")
    return values


def _value(text: str, field: str, tokens: bool) -> int:
    if tokens:
        return parse_tokens(text, field)
    try:
        return parse_integer(text.strip(), field)
    except InputError:  # the grid's forms, not a lone count's
        raise InputError(
            field, f"{text.strip()[:40]!r} is not a whole number; accepted: {RANGE_HELP_WHOLE}"
        ) from None


def _grid(text: str, field: str, tokens: bool) -> list[int]:
    if ".." in text:
        low_text, _, high_text = text.partition("..")
        low, high = _value(low_text, field, tokens), _value(high_text, field, tokens)
        if low > high:
            raise InputError(field, f"range {text!r} runs downwards; write low..high")
        if low < 1:
            raise InputError(field, f"range {text!r} starts below 1")
        values, value = [], low
        while value <= high and len(values) <= MAX_POINTS:
            values.append(value)
            value *= 2
        return values
    parts = [p for p in re.split(r"\s*,\s*", text) if p]
    if len(parts) > MAX_POINTS:
        raise InputError(field, f"{len(parts)} values; a sweep takes at most {MAX_POINTS} per axis")
    if not parts:
        accepted = f"{RANGE_HELP}, each {TOKENS_HELP}" if tokens else RANGE_HELP_WHOLE
        raise InputError(field, f"empty; accepted: {accepted}")
    return sorted({_value(p, field, tokens) for p in parts})


@dataclass
class Grid:
    """Results on seqs x ns for one profile; NaN where N does not split S."""

    profile: str
    seqs: np.ndarray  # (k,)
    ns: np.ndarray  # (m,)
    ratio: np.ndarray  # (k, m) step comm ratio for the pass (fwd+bwd: the worse of the two, per cell)
    intensity: np.ndarray  # (k, m) step intensity of the pass the ratio is of
    step_compute_s: np.ndarray  # (k, m) one ring step's compute, of that pass
    step_comm_s: np.ndarray  # (k, m) one ring step's transfer, of that pass
    inter_node: np.ndarray  # (m,) whether the ring over N leaves the node
    n_max: np.ndarray  # (k,) real N where the pass's ratio reaches 100 %, topology included
    n_min_memory: np.ndarray | None = field(default=None)  # (k,) real N where training memory fits
    step_time_s: np.ndarray | None = field(default=None)  # (k, m) fastest fitting step; NaN: none fits
    pass_of_cell: np.ndarray | None = field(default=None)  # (k, m) "fwd" or "bwd": the pass of each cell

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
                out.append(
                    {
                        "hw": self.profile,
                        "seq": int(seq),
                        "n": int(n),
                        "comm_ratio_step": float(self.ratio[i, j]),
                        "ratio_pass": str(self.pass_of_cell[i, j])
                        if self.pass_of_cell is not None
                        else "fwd",
                        "verdict": names[verdicts[i, j]],
                        "intensity_step": float(self.intensity[i, j]),
                        "step_compute_s": float(self.step_compute_s[i, j]),
                        "step_comm_s": float(self.step_comm_s[i, j]),
                        "link_scope": "inter-node" if self.inter_node[j] else "intra-node",
                    }
                )
                if self.step_time_s is not None:
                    step = self.step_time_s[i, j]
                    out[-1]["step_time_s"] = None if np.isnan(step) else float(step)
        return out


def sweep(
    shape: PlanInputs,
    seqs: list[int] | np.ndarray,
    ns: list[int] | np.ndarray,
    machine: Machine,
    job: Job | None = None,
    docs: str | None = None,
) -> Grid:
    """The grid for one machine. ``shape`` gives heads, dtype, causal, pass; its seq and n are ignored.
    ``docs`` (and the shape's packing, window, chunk) make c each cell's compute fraction ([A-RingCost §5]).
    ``job``, the training job on this machine, adds N_min(memory) per S."""
    seq_col = np.asarray(seqs, dtype=float)[:, None]
    n_row = np.asarray(ns, dtype=float)[None, :]
    bandwidth, latency, inter = machine.link_arrays(np.asarray(ns))
    # The plan's binding of inputs to symbols, with S, N and the link each N uses as arrays.
    values = {
        **plan_values(
            shape.model_copy(update=dict.fromkeys(("docs", "window", "attention_chunk"))), machine, 1
        ),
        "S": seq_col,
        "N": n_row,
        "B": bandwidth[None, :],
        "alpha": latency[None, :],
    }
    c_row = None
    if docs is not None or shape.window is not None or shape.attention_chunk is not None:  # its seq is no S
        values["c"] = _compute_fractions(shape, seqs, ns, docs)
        c_row = _last_valid(values["c"])  # N_max per S at the compute fraction of the largest N swept
    profile = machine.profile

    def at(name: str, **over: object) -> np.ndarray:
        return call(name, {**values, **over})

    # Each cell's ratio, intensity and step times are of one pass: fwd+bwd's worse, per cell.
    phases = PASSES[shape.pass_]
    worse = np.argmax(np.broadcast_arrays(*[at(RATIO[phase]) for phase in phases]), axis=0)

    def of_pass(name: str) -> np.ndarray:
        per_phase = np.broadcast_arrays(*[at(PHASE_PREFIX[phase] + name) for phase in phases])
        return np.choose(worse, per_phase)

    ratio = np.where(n_row == 1, 0.0, of_pass("comm_ratio_step"))  # one device receives nothing
    valid = (seq_col % n_row == 0) & (n_row <= seq_col)
    # N_max: the intra-node bound while it stays inside the node, else the inter-node one.
    bounds = {}
    ranks = machine.ranks_per_node
    groups = {"intra": 1} | ({"inter": ranks + 1} if profile.links.inter_node is not None else {})
    for scope, group in groups.items():
        over = {"S": seq_col[:, 0], **machine.link(group).values, "r": 1.0}
        if c_row is not None:
            over["c"] = c_row
        bounds[scope] = np.min(
            [at(PHASE_PREFIX[phase] + "n_at_ratio", **over) for phase in PASSES[shape.pass_]], axis=0
        )
    n_max = bounds["intra"]
    if "inter" in bounds:
        n_max = np.where(bounds["inter"] > ranks, bounds["inter"], np.minimum(bounds["intra"], ranks))
    grid = Grid(
        profile=machine.name,
        seqs=np.asarray(seqs),
        ns=np.asarray(ns),
        ratio=np.where(valid, ratio, np.nan),
        intensity=of_pass("intensity_step"),
        step_compute_s=of_pass("step_compute_s"),
        step_comm_s=of_pass("step_comm_s"),
        pass_of_cell=np.asarray(phases)[worse],
        inter_node=inter,
        n_max=n_max,
    )
    if job is not None:
        from costmodel.training import moe
        from costmodel.training.memory import training_values

        base = training_values(job, 1)
        name = moe.twin("n_min_memory", base)  # an MoE model's every expert
        grid.n_min_memory = call(name, {**base, "S": seq_col[:, 0]})
    return grid


def step_times(grid: Grid, job: Job, global_batch: int | None = None) -> Grid:
    """``grid`` with the whole step's time per (S, N): the fastest plan of the job at that CP degree that
    fits, its TP, PP and recompute as the job states them (:func:`costmodel.training.search.fastest_by_cp`)."""
    from costmodel.training.search import fastest_by_cp

    grid.step_time_s = np.array(
        [fastest_by_cp(job.replace(seq=int(seq), cp=1), grid.ns, global_batch) for seq in grid.seqs]
    )
    return grid


def _compute_fractions(shape: PlanInputs, seqs, ns, docs: str | None) -> np.ndarray:  # noqa: ANN001
    """c of every (S, N) cell with the documents packed into S (nan where N does not divide S), at the
    plan's default tile."""

    out = np.full((len(seqs), len(ns)), np.nan)
    tile = PlanInputs.model_fields["block"].default  # the sweep has no --block: the plan's default tile
    for i, seq in enumerate(int(s) for s in seqs):
        if docs is not None:
            pack(docs, seq)  # a document longer than this S is an error on --docs
        for j, n in enumerate(int(x) for x in ns):
            if seq % n or n > seq:
                continue
            layout = shape.layout if seq % (n * chunks_per_rank(shape.layout)) == 0 else "contiguous"
            cell = shape.model_copy(
                update={
                    "seq": seq,
                    "cp": n,
                    "block": min(tile, seq // n),
                    "layout": layout,
                    "docs": docs,
                }
            )
            out[i, j] = compute_fraction(cell)
    return out


def _last_valid(grid: np.ndarray) -> np.ndarray:
    """Per row, the last value that is not nan (1 where the whole row is)."""
    out = np.ones(grid.shape[0])
    for i, row in enumerate(grid):
        valid = row[~np.isnan(row)]
        if valid.size:
            out[i] = valid[-1]
    return out
