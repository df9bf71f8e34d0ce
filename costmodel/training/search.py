"""The fastest training layout that fits: every TP x CP x PP (x virtual stages) x DP x micro-batch x recompute x
CP scheme and layout of a job, ranked by the whole step's time.

Each plan is the step of :mod:`costmodel.training.step`, each memory the fit of
:mod:`costmodel.training.recommend` (the most loaded pipeline stage); both are the generated formulas, here
evaluated on numpy arrays holding every candidate at once. What varies per candidate but is not a formula
(kernel rates at the layer's shapes, the link a group's placement gives) is bound once per distinct shape
by :func:`costmodel.training.step.bind` itself and gathered into the arrays. :func:`search_loop` is the
plain reference: one :func:`~costmodel.training.step.evaluate_step` per candidate; a test holds the two to
the same ranking.

The global batch is an input (sequences per optimizer step). Left out, it is 4M tokens' worth of sequences
(at least one), the batch Llama 3 405B started its pre-training with [Llama3 §3.4].
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from costmodel.core.errors import InputError
from costmodel.core.units import seconds, si
from costmodel.frameworks.profiles import FrameworkProfile
from costmodel.machines.binding import Collective, LinkBinding, build_machine
from costmodel.machines.topology import NCCL_RING
from costmodel.plans import cp as registry
from costmodel.plans.bind import call
from costmodel.plans.cp import TRAINING
from costmodel.plans.inputs import MAX_CP, Parallelism
from costmodel.plans.job import Job
from costmodel.plans.models import ModelPreset
from costmodel.plans.stages import StageSplit, candidate_splits
from costmodel.schedule.layouts import chunks_per_rank, divisors
from costmodel.symbolic import numeric
from costmodel.training import moe, offload
from costmodel.training.memory import cp_buffers, keeps, training_values
from costmodel.training.report import FORMULAS as TERMS
from costmodel.training.report import SHORT
from costmodel.training.step import bind, buckets, compute_values, evaluate_step, step_terms, utilisation

DEFAULT_BATCH_TOKENS = 2**22  # [Llama3 §3.4]: 4M tokens per step at the start of pre-training
MICRO_BATCHES = (1, 2, 4, 8)  # micro-batch sizes tried (sequences)
RECOMPUTE = ("none", "selective", "full")


def scheme_pairs() -> list[tuple[str, str]]:
    """The (scheme, layout) pairs whose step times differ, simplest scheme first: each registered scheme
    names the layouts it tries (Ulysses runs whole sequences per head, so its layout does not enter; an
    all-gather's zigzag and striped shards see the same keys)."""
    return [(s.name, layout) for s in registry.schemes(TRAINING, ranked=True) for layout in s.layouts]


def widest(framework: FrameworkProfile) -> FrameworkProfile:
    """``framework`` running every registered CP scheme in every layout, its all-to-all copying KV heads where
    the ranks outnumber them: the search's widest space, to compare a framework's plans with."""
    time = framework.time.model_copy(
        update={
            "cp_schemes": list(registry.names(TRAINING)),
            "cp_layouts": ["zigzag", "striped", "contiguous"],
            "a2a_splits_kv_heads": False,
        }
    )
    return framework.model_copy(update={"name": f"{framework.name} (every scheme)", "time": time})


def framework_pairs(framework: FrameworkProfile) -> frozenset[tuple[str, str]]:
    """What a framework runs: the (scheme, layout) pairs of its profile's CP schemes and layouts that the
    registry times. A whole-sequence scheme's layout does not enter its time, so its one pair is kept
    whatever layouts the framework shards in (its ranks hold the sequence as the framework shards it:
    :meth:`~costmodel.frameworks.profiles.TimePolicy.sharding`)."""
    t = framework.time
    return frozenset(
        (s, lay)
        for s, lay in scheme_pairs()
        if s in t.cp_schemes and (lay in t.cp_layouts or registry.get(s).whole_sequence)
    )


# A plan's layout: the parallel degrees, the pipeline's stage split and the micro-batch size.
STRUCTURE = ("tp", "cp", "pp", "first_stage_layers", "middle_stage_layers", "last_stage_layers", "vpp", "dp",
             "micro_batch", "ep")  # fmt: skip
EXPOSED = {  # exposed communication by kind, from the step's breakdown
    "TP": ("exposed_tp_s",),
    "CP": ("exposed_cp_s", "cp_ring_overhead_s"),
    "PP": ("exposed_pp_s", "pipeline_bubble_s"),
    "DP": ("exposed_dp_s", "zero3_gather_s"),
}


@dataclass(frozen=True)
class Constraints:
    """Dimensions the user fixed (None: searched)."""

    tp: int | None = None
    cp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    micro_batch: int | None = None
    recompute: str | None = None
    cp_scheme: str | None = None
    layout: str | None = None
    ep: int | None = None
    tp_comm_overlap: bool | None = None

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Table:
    """Candidates as columns: one numpy array per dimension, and the scheme/layout pair's index."""

    columns: dict[str, np.ndarray]
    pairs: list[tuple[str, str]]
    kv_heads: int
    global_batch: int

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def take(self, keep: np.ndarray) -> Table:
        return Table(
            {k: v[keep] for k, v in self.columns.items()}, self.pairs, self.kv_heads, self.global_batch
        )

    def plan(self, i: int) -> dict[str, Any]:
        c = self.columns
        scheme, layout = self.pairs[int(c["pair"][i])]
        plan = {k: int(c[k][i]) for k in (*STRUCTURE, "gpus")}
        if plan["cp"] == 1:
            scheme, layout = "none", None
        kv_heads = max(self.kv_heads // plan["tp"], 1)
        ulysses = 1 if scheme == "none" else registry.get(scheme).a2a_degree(kv_heads, plan["cp"])
        return plan | {
            "tp_comm_overlap": bool(c["tpo"][i]),
            "recompute": RECOMPUTE[int(c["rc"][i])],
            "cp_scheme": scheme,
            "layout": layout,
            "cp_ulysses": ulysses,
            "cp_ring": plan["cp"] // ulysses,
        }


@dataclass
class SearchResult:
    """The plans that fit (the ``top`` fastest, or all), fastest first; how many were considered and fit,
    how many layouts each structural rule ruled out, and why nothing fits when nothing does."""

    plans: list[dict[str, Any]]
    considered: int
    fits: int
    global_batch: int
    removed: dict[str, int] = field(default_factory=dict)
    empty_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    # The shapes bound on the search's machine and the plans that fit, for what-ifs that can reuse them
    # (:func:`sensitivity`).
    shapes: _Shapes | None = field(default=None, repr=False, compare=False)
    fitting: Fitting | None = field(default=None, repr=False, compare=False)


def default_global_batch(seq: int) -> int:
    return max(1, DEFAULT_BATCH_TOKENS // seq)


def check_constraints(model: ModelPreset, gpus: int, seq: int, c: Constraints) -> None:
    """Constraints no plan can meet, as one line naming the flag: a fixed degree is honoured or refused here,
    never answered for another."""
    # The fixed degrees, through the layout's one check (a free PP leaves the stages to the search).
    Parallelism(tp=c.tp or 1, pp=c.pp or 1, vpp=(c.vpp or 1) if c.pp else 1).check(model)
    if (
        c.pp is None and c.vpp is not None and c.vpp > 1 and 2 * c.vpp > model.layers
    ):  # interleaving needs PP 2+
        raise InputError(
            "--vpp",
            f"{c.vpp} virtual stages on each of at least 2 stages make {2 * c.vpp} model chunks, more than the "
            f"model's {model.layers} layers; accepted: at most {model.layers // 2}",
        )
    fixed = (c.tp or 1) * (c.cp or 1) * (c.pp or 1)
    if fixed > gpus:
        raise InputError("--gpus", f"{gpus} GPUs are fewer than the fixed tp x cp x pp = {fixed}")
    if c.cp is not None and seq % c.cp:
        raise InputError(
            "--cp", f"{c.cp} does not divide the sequence S = {seq:,}: every CP rank holds S / N tokens"
        )
    registry.refuse_fixed_layout(c.cp_scheme, c.layout)


def enumerate_plans(
    job: Job, global_batch: int, c: Constraints, expand: bool = True
) -> tuple[Table, dict[tuple[int, int], list[int]]]:
    """Every layout of at most ``gpus`` the constraints allow: TP dividing the heads, CP the sequence, any
    number of pipeline stages (each of the splits :func:`candidate_splits` gives, with the virtual stages
    that leave no chunk empty and any micro-batch count) and, for each, the largest DP whose micro-batches
    divide the global batch on the GPUs left (more DP never slows a step: fewer micro-batches each). A plan
    uses fewer GPUs than given where no layout of them all divides; the step says how many. Returned with
    the (scheme, layout) pairs each (TP, CP) runs; ``expand`` False leaves one row per layout (its memory
    does not depend on the scheme) for :func:`with_pairs` to expand."""
    model, seq, gpus, framework = job.model, job.inputs.seq, job.gpus, job.framework
    allowed = _allowed_pairs(c, framework)
    pairs = scheme_pairs()
    structure: list[np.ndarray] = []
    shape_pairs: dict[tuple[int, int], list[int]] = {}
    for tp, cp in _tp_cp_degrees(model, seq, gpus, c):
        valid = _valid_pairs(job, allowed, pairs, tp, cp) if cp > 1 else [0]
        if not valid:
            continue
        shape_pairs[(tp, cp)] = valid
        rest = _layouts(job.model.layers, job.gpus // (tp * cp), global_batch, c, _ep_experts(job))
        structure.append(np.column_stack([np.full((len(rest), 2), (tp, cp), dtype=np.int64), rest]))
    base = np.concatenate(structure) if structure else np.zeros((0, len(STRUCTURE)), dtype=np.int64)
    levels = [r for r, name in enumerate(RECOMPUTE) if c.recompute is None or name == c.recompute]
    data = np.concatenate([np.column_stack([base, np.full(len(base), rc)]) for rc in levels])
    columns = {name: data[:, i] for i, name in enumerate((*STRUCTURE, "rc"))}
    if job.setup.zero_shard is not None:  # hybrid sharding's groups tile DP x CP
        tiled = (columns["dp"] * columns["cp"]) % job.setup.zero_shard == 0
        columns = {name: column[tiled] for name, column in columns.items()}
    columns["gpus"] = columns["tp"] * columns["cp"] * columns["pp"] * columns["dp"]
    columns["pair"] = np.full(
        len(columns["tp"]), -1, dtype=np.int64
    )  # each row stands for its shape's valid pairs
    layouts = Table(columns, pairs, model.kv_heads, global_batch)
    return (with_pairs(layouts, shape_pairs, job, c.tp_comm_overlap) if expand else layouts), shape_pairs


def _allowed_pairs(c: Constraints, framework: FrameworkProfile) -> list[tuple[str, str]]:
    """The (scheme, layout) pairs the constraints admit: the scheme, the layout (a whole-sequence scheme has
    none to fix) and the framework's."""
    runs = framework_pairs(framework)
    if not framework.time.cp_schemes:  # CP 1 only: no pair to run
        if asked := ((c.cp or 1) > 1 and str(c.cp)) or c.cp_scheme or c.layout:
            framework.refuse_cp(asked)
        return []
    allowed = [
        (s, lay)
        for s, lay in scheme_pairs()
        if (c.cp_scheme is None or s == c.cp_scheme)
        and (c.layout is None or lay == c.layout or registry.get(s).whole_sequence)
        and (s, lay) in runs
    ]
    if not allowed:
        raise InputError(
            "--cp-scheme", f"no CP scheme and layout that {framework.title} runs matches the constraints"
        )
    return allowed


def _tp_cp_degrees(model: ModelPreset, seq: int, gpus: int, c: Constraints) -> Iterator[tuple[int, int]]:
    """(TP, CP) in search order: TP dividing the heads, CP the sequence (up to MAX_CP), as fixed, on
    ``gpus``; CP 1 only where no scheme or layout is fixed."""
    for tp in divisors(model.heads):
        if (c.tp is not None and tp != c.tp) or tp > gpus:
            continue
        for cp in divisors(seq):
            if cp > MAX_CP or tp * cp > gpus:
                break
            if (c.cp is not None and cp != c.cp) or (cp == 1 and (c.cp_scheme or c.layout)):
                continue  # a fixed scheme means CP
            yield tp, cp


@functools.lru_cache(maxsize=256)
def _layouts(layers: int, room: int, global_batch: int, c: Constraints, experts: int) -> np.ndarray:
    """The layouts on the ``room`` GPUs one TP x CP group leaves, as rows of :data:`STRUCTURE` less TP and
    CP: each pipeline depth, micro-batch size, stage split and virtual-stage count the constraints allow,
    with the largest DP on the GPUs left and each EP degree it admits (``experts``: 0 where EP is not carved
    out of DP). TP and CP enter only through ``room``, so the (TP, CP) pairs of one product, and a what-if
    of the same job at another sequence, share one enumeration."""
    out: list[tuple[int, ...]] = []
    for pp in range(1, min(layers, room) + 1):
        if c.pp is not None and pp != c.pp:
            continue
        for mb, dp, micro in _micro_batches(global_batch, room // pp, c):
            for split, vpp in _stages(layers, pp, micro, c):
                out += [
                    (pp, split.first, split.middle, split.last, vpp, dp, mb, ep)
                    for ep in _experts(experts, c, dp)
                ]
    block = np.array(out, dtype=np.int64).reshape(-1, len(STRUCTURE) - 2)
    block.flags.writeable = False  # shared between calls
    return block


def _micro_batches(global_batch: int, room: int, c: Constraints) -> Iterator[tuple[int, int, int]]:
    """(micro-batch size, DP, micro-batches) for each size dividing the global batch, with the largest DP
    of at most ``room`` ranks."""
    for mb in MICRO_BATCHES:
        if (c.micro_batch is not None and mb != c.micro_batch) or global_batch % mb:
            continue
        dp = _largest_dp(global_batch // mb, room)
        yield mb, dp, global_batch // (mb * dp)


def _stages(layers: int, pp: int, micro: int, c: Constraints) -> Iterator[tuple[StageSplit, int]]:
    """(stage split, virtual stages) at a pipeline depth: interleaving needs at least ``pp`` micro-batches."""
    for split, vpps in _splits(layers, pp):
        for vpp in vpps:
            if (c.vpp is not None and vpp != c.vpp) or (vpp > 1 and micro < pp):
                continue
            yield split, vpp


def _ep_experts(job: Job) -> int:
    """The experts EP degrees must divide where EP is carved out of DP (Megatron-LM); 0 for a dense model and
    for a framework that carves EP out of other ranks (torchtitan: its FSDP shard and CP ranks)."""
    return job.model.experts if job.model.experts and job.framework.time.ep_from_dp else 0


def _experts(experts: int, c: Constraints, dp: int) -> list[int]:
    """EP degrees: carved out of DP, dividing ``experts`` (:func:`_ep_experts`); 1 where there are none."""
    if not experts:
        return [1]
    return [e for e in divisors(dp) if experts % e == 0 and (c.ep is None or e == c.ep)]


def _tp_cp_counts(table: Table) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The (TP, CP) degrees of a table's rows and how many rows hold each."""
    c = table.columns
    _, first, counts = np.unique(_key(c["tp"], c["cp"]), return_index=True, return_counts=True)
    return [(int(c["tp"][i]), int(c["cp"][i])) for i in first], counts


def _overlaps(job: Job, tp: int, cp: int, fixed: bool | None) -> tuple[int, ...]:
    """TP collectives unchunked (0) and pipelined with the multiplies (1): both where TP > 1 and its group
    shares one fast domain, unless fixed. Across domains they cannot be (userbuffers and AsyncTP need the
    fabric's peers): a fixed overlap then rules the layout out."""
    if tp == 1:
        return (0,)
    if not job.machine.inside(job.setup.rank_order, {"tp": tp, "cp": cp}, "tp"):
        return () if fixed else (0,)
    return (0, 1) if fixed is None else (int(fixed),)


def with_pairs(
    table: Table, shape_pairs: dict[tuple[int, int], list[int]], job: Job, overlap: bool | None = None
) -> Table:
    """Each layout of ``table`` once per (scheme, layout) pair its TP and CP degrees run, and with TP > 1
    inside one fast domain once more with its collectives pipelined into its multiplies (``tpo``: neither
    changes memory; :func:`_overlaps`)."""
    c = table.columns
    blocks = []
    for (tp, cp), valid in shape_pairs.items():
        rows = np.flatnonzero((c["tp"] == tp) & (c["cp"] == cp))
        blocks += [(rows, pair, tpo) for pair in valid for tpo in _overlaps(job, tp, cp, overlap)]
    index = np.concatenate([b[0] for b in blocks]) if blocks else np.zeros(0, dtype=np.int64)
    columns = {k: v[index] for k, v in c.items()}
    for name, at in (("pair", 1), ("tpo", 2)):
        columns[name] = np.concatenate([np.full(len(b[0]), b[at]) for b in blocks]) if blocks else index
    return Table(columns, table.pairs, table.kv_heads, table.global_batch)


def _valid_pairs(
    job: Job, allowed: list[tuple[str, str]], pairs: list[tuple[str, str]], tp: int, cp: int
) -> list[int]:
    """The (scheme, layout) pairs of ``allowed`` that run ``job`` at this TP and CP degree, as indices of
    ``pairs``."""
    model = job.model
    kv_heads = max(model.kv_heads // tp, 1)
    # Transformer Engine's all-to-all (Megatron-LM's a2a) splits the KV heads too; elsewhere they may be copied.
    a2a_kv = job.framework.time.a2a_splits_kv_heads
    valid = []
    for name, layout in allowed:
        scheme = registry.get(name)
        held = job.framework.time.sharding(layout) if scheme.whole_sequence else layout
        if job.inputs.seq % (cp * chunks_per_rank(held)):
            continue
        if scheme.check(model.heads // tp, kv_heads, cp, a2a_kv):
            continue
        if scheme.hybrid and scheme.a2a_degree(kv_heads, cp) in (1, cp):  # the plain ring or Ulysses
            continue
        valid.append(pairs.index((name, layout)))
    return valid


@functools.cache
def _splits(layers: int, pp: int) -> list[tuple[StageSplit, list[int]]]:
    """The stage splits the search tries at a pipeline depth, each with its virtual-stage counts: 1, and
    the divisors of the largest stage's layer count that leave no model chunk empty."""
    out = []
    for split in candidate_splits(layers, pp):
        sizes = [split.first, split.last] + ([split.middle] if pp > 2 else [])
        vpps = [1] + ([v for v in divisors(max(sizes)) if 1 < v <= min(sizes)] if pp > 1 else [])
        out.append((split, vpps))
    return out


@functools.cache
def _largest_dp(sequences: int, room: int) -> int:
    """The largest DP degree that divides ``sequences`` (a global batch's micro-batches) within ``room``."""
    return max(d for d in divisors(sequences) if d <= room)


class _Shapes:
    """The step's symbols for one (tp, cp, micro-batch, scheme, layout), from :func:`bind` itself: rates,
    the TP and CP links, the USP split; and the DP and PP links per (stride, size). A shape's compute part
    (:func:`compute_values`) is bound alone where a lower bound is all that is asked of it."""

    def __init__(self, job: Job) -> None:
        self.job, self.model, self.machine = _searched(job), job.model, job.machine
        self.jobs: dict[tuple, Job] = {}
        self.computed: dict[tuple, dict[str, Any]] = {}
        self.cache: dict[tuple, dict[str, Any]] = {}
        self.gemms: dict[tuple, dict[str, float]] = {}
        self.links: dict[tuple[int, int, Collective], LinkBinding] = {}

    def _job(self, key: tuple) -> Job:
        if key not in self.jobs:
            tp, cp, mb, scheme, layout = key
            self.jobs[key] = self.job.candidate(
                cp=cp,
                layout=layout,
                gpus=tp * cp,
                tp=tp,
                pp=1,
                first_stage_layers=None,
                last_stage_layers=None,
                micro_batch=mb,
                global_batch=mb,
                vpp=1,
                ep=1,
                cp_scheme=scheme if cp > 1 else registry.default(TRAINING).name,
            )
        return self.jobs[key]

    def compute(self, tp: int, cp: int, mb: int, scheme: str, layout: str) -> dict[str, Any]:
        key = (tp, cp, mb, scheme, layout)
        if key not in self.computed:
            self.computed[key] = compute_values(self._job(key), self.gemms)
        return self.computed[key]

    def values(self, tp: int, cp: int, mb: int, scheme: str, layout: str) -> dict[str, Any]:
        key = (tp, cp, mb, scheme, layout)
        if key not in self.cache:
            self.cache[key] = bind(self._job(key), computed=self.compute(*key))
        return self.cache[key]

    def link(self, stride: int, size: int, collective: Collective) -> LinkBinding:
        if (stride, size, collective) not in self.links:
            self.links[(stride, size, collective)] = self.machine.placed(stride).link(size, collective)
        return self.links[(stride, size, collective)]

    def links_of(
        self, strides: np.ndarray, sizes: np.ndarray, collective: Collective, *fields: str
    ) -> list[np.ndarray]:
        """``fields`` of the link (B: ``bandwidth``) of every (stride, size) group's ``collective``, each
        looked up once per distinct pair; a group of one waits on no link (its latencies are 0)."""
        _, first, index = np.unique(_key(strides, sizes), return_index=True, return_inverse=True)
        found = [self.link(int(strides[i]), int(sizes[i]), collective) for i in first]
        alone = np.asarray(sizes) <= 1

        def column(name: str) -> np.ndarray:
            values = np.array([getattr(f, name) for f in found])[index]
            return values if name == "bandwidth" else np.where(alone, 0.0, values)

        return [column(name) for name in fields]


def _key(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row of non-negative integer columns (mixed radix; every product here stays below
    2^63: a job's degrees multiply to at most its GPUs), for a fast np.unique within one table."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        key = key * (int(column.max(initial=0)) + 1) + column
    return key


def _per_shape(bound: list[dict[str, Any]], index: np.ndarray) -> dict[str, Any]:
    """The bound values of every distinct shape as the table's: a value all shapes share stays one scalar, one
    that differs (a kernel's rate, a group's link, a mask's executed share) becomes a column over the rows.
    Read from the values themselves, so that nothing lists which of them depend on the shape."""
    values: dict[str, Any] = {}
    for name, first in bound[0].items():
        column = [b[name] for b in bound]
        values[name] = first if all(x == first for x in column) else np.array(column, dtype=float)[index]
    return values


def evaluate_table(table: Table, job: Job, shapes: _Shapes | None = None) -> dict[str, Any]:
    """Step time, its breakdown, MFU and memory of every candidate of ``job``'s workload, as arrays."""
    c = table.columns
    model, machine, step = job.model, job.machine, job.step
    shapes = shapes or _Shapes(job)
    keys = _key(c["tp"], c["cp"], c["micro_batch"], c["pair"])
    unique, first, index = np.unique(keys, return_index=True, return_inverse=True)
    bound = [
        shapes.values(
            int(c["tp"][i]), int(c["cp"][i]), int(c["micro_batch"][i]), *table.pairs[int(c["pair"][i])]
        )
        for i in first
    ]
    v = _per_shape(bound, index)
    tp, cp, pp, dp = (c[k].astype(float) for k in ("tp", "cp", "pp", "dp"))
    v |= _stage_columns(c)
    v |= {
        "t": tp,
        "N": cp,
        "pp": pp,
        "D": dp,
        "b": c["micro_batch"].astype(float),
        "v_pp": c["vpp"].astype(float),
        "m_mb": table.global_batch / (c["micro_batch"] * c["dp"]),
        "rc_sel": (c["rc"] == 1).astype(float),
        "rc_full": (c["rc"] == 2).astype(float),
        "o_tp": numeric.tp_overlap_share(k_tp=np.where(c["tpo"] == 1, c["tp"], 1).astype(float)),
        **_kept_columns(c, job),
        "n_h": np.minimum(offload.devices_per_host(machine), c["gpus"]).astype(float),
    }
    # the ranks holding the same weights, DP x CP (EP inside DP): ZeRO's group, or hybrid sharding's and
    # the link between its replicas, as Job.links places them
    weights = c["dp"] * c["cp"]
    group = np.broadcast_to(job.setup.zero_group(weights), weights.shape)
    v["Z_s"] = group.astype(float)
    v["B_dp"], v["a_dp"] = shapes.links_of(c["tp"], group, NCCL_RING, "bandwidth", "call_latency_s")
    (v["B_dpr"],) = shapes.links_of(c["tp"] * group, weights // group, NCCL_RING, "bandwidth")
    if model.experts:  # EP inside DP, next to CP (tp-cp-ep-dp-pp): its all-to-all over those ranks
        v["E_p"] = c["ep"].astype(float)
        (v["B_ep"],) = shapes.links_of(c["tp"] * c["cp"], c["ep"], "alltoall", "bandwidth")
    (v["B_pp"],) = shapes.links_of(c["tp"] * c["cp"] * c["dp"], c["pp"], "p2p", "bandwidth")
    v["n_bkt"] = buckets(v, step, model)
    breakdown = {name: np.zeros(len(table)) for name in TERMS}
    time_s = np.zeros(len(table))
    for p, (scheme, _) in enumerate(table.pairs):
        rows = c["pair"] == p
        if rows.any():
            part, time_s[rows] = step_terms(
                {k: a[rows] if isinstance(a, np.ndarray) else a for k, a in v.items()}, scheme, model
            )
            for name, value in part.items():
                breakdown[name][rows] = value
    # MFU counts the trained mask's pairs, as `cp-plan step` does (costmodel.training.step.evaluate_step).
    mfu, hfu = utilisation(v, time_s, c["gpus"], machine)
    return {
        "time_s": time_s,
        "mfu": mfu,
        "hfu": hfu,
        "breakdown": breakdown,
        "memory": memory_table(table, job),
    }


def _stage_columns(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """n_first, n_mid, n_last of the pipeline formulas (a split holds no middle layers below three stages)."""
    return {
        "n_first": c["first_stage_layers"].astype(float),
        "n_mid": c["middle_stage_layers"].astype(float),
        "n_last": c["last_stage_layers"].astype(float),
    }


def _kept_columns(c: dict[str, np.ndarray], job: Job) -> dict[str, np.ndarray]:
    """Per plan: what a device keeps (:func:`costmodel.training.memory.keeps`, the one binding of one job and
    of a table of layouts), as the memory fit and the offload copies read it."""
    ones = np.ones(len(c["tp"]))
    return {k: v * ones for k, v in keeps(job, c).items()}


def memory_table(table: Table, job: Job) -> dict[str, np.ndarray]:
    """Training memory per device at the step's peak on the most loaded stage [Korthikanti22 §4], and the
    usable HBM. Rows not yet split by CP scheme (``pair`` -1) take the scheme of the framework's with the
    fewest buffers: the fit that rules a layout out holds for each of its schemes."""
    c = table.columns
    values = training_values(job, 1)
    values |= {
        "N": c["cp"].astype(float),
        "t": c["tp"].astype(float),
        "pp": c["pp"].astype(float),
        "b": c["micro_batch"].astype(float),
        **_stage_columns(c),
        "m_mb": (table.global_batch // (c["micro_batch"] * c["dp"])).astype(float),
        "v_pp": c["vpp"].astype(float),
        **_kept_columns(c, job),
        "E_p": c["ep"].astype(float),
    }
    values |= _usp_columns(table)
    values["M_cpb"] = _buffer_columns(table, values, job)
    name = moe.twin("training_memory_bytes", values)  # an MoE model's every expert, n_E/E_p per rank
    total = call(name, values)
    return {
        "total_bytes": np.asarray(total, dtype=float) * np.ones(len(table)),
        "device_bytes": values["M_dev"],
    }


def _usp_columns(table: Table) -> dict[str, np.ndarray]:
    """N_u and N_r of each row: a hybrid scheme's split, else the whole CP degree as a ring's."""
    c = table.columns
    n_u = np.ones(len(table))
    for p, (scheme, _) in enumerate(table.pairs):
        rows = c["pair"] == p
        if rows.any() and registry.get(scheme).hybrid:
            kv = np.maximum(table.kv_heads // c["tp"][rows], 1)
            # a split per distinct (KV heads, CP degree), not per row: a table holds few of them
            distinct, each = np.unique(np.stack([kv, c["cp"][rows]]).astype(int), axis=1, return_inverse=True)
            split = registry.get(scheme).a2a_degree
            n_u[rows] = np.array([split(int(k), int(n)) for k, n in distinct.T])[each.ravel()]
    return {"N_u": n_u, "N_r": c["cp"] / n_u}


def _buffer_columns(table: Table, values: dict[str, Any], job: Job) -> np.ndarray:
    """The CP scheme's buffers of every row: its pair's scheme, or the least of the framework's schemes."""
    c = table.columns
    out = np.zeros(len(table))
    unsplit = c["pair"] < 0
    schemes = {s for s, _ in framework_pairs(job.framework) if not registry.get(s).hybrid}
    if unsplit.any() and schemes:  # a framework without CP plans CP 1 only: no buffers
        at = {k: v[unsplit] if isinstance(v, np.ndarray) else v for k, v in values.items()}
        out[unsplit] = np.min(
            [np.broadcast_to(cp_buffers(s, at), unsplit.sum()) for s in sorted(schemes)], axis=0
        )
    for p, (scheme, _) in enumerate(table.pairs):
        rows = c["pair"] == p
        if rows.any():
            at = {k: v[rows] if isinstance(v, np.ndarray) else v for k, v in values.items()}
            out[rows] = np.broadcast_to(cp_buffers(scheme, at), rows.sum())
    return out


def search(
    job: Job,
    global_batch: int,
    constraints: Constraints = Constraints(),
    *,
    top: int | None = 10,
    shapes: _Shapes | None = None,
    fits: Fitting | None = None,
) -> SearchResult:
    """The ``top`` fastest plans of ``job``'s GPUs, workload and framework that the constraints allow and that
    fit (None: all), at ``global_batch`` sequences per step; ``shapes``, bound on this job already, and
    ``fits``, the plans that fit it (a job that differs only in what memory does not read), are reused."""
    model = job.model
    check_constraints(model, job.gpus, job.inputs.seq, constraints)
    removed: dict[str, int] = {}
    found = fits or fitting(job, global_batch, constraints)
    if not found.considered:
        return SearchResult([], 0, 0, global_batch, removed, _empty_reason(job, global_batch, constraints))
    if found.table is None:
        reason = (
            f"no plan fits memory: the smallest needs {si(found.least_bytes, 'B', 3)} of "
            f"the {si(found.device_bytes, 'B', 3)} usable per device"
        )
        reason += _blame(job, global_batch, constraints)
        return SearchResult([], found.considered, 0, global_batch, removed, reason, _notes(model))
    table = found.table
    fit = len(table)
    shapes = shapes or _Shapes(job)
    if top is not None:
        table = _contenders(table, top, job, shapes)
    result = evaluate_table(table, job, shapes)
    order = _fastest_first(table, result)
    if top is not None:  # of plans that differ only in their stage split, the fastest split speaks for all
        c = table.columns
        layout = _key(
            *(c[k][order] for k in ("tp", "cp", "pp", "vpp", "dp", "ep", "micro_batch", "rc", "pair", "tpo"))
        )
        order = order[np.sort(np.unique(layout, return_index=True)[1])][:top]
    plans = [_row(table, result, int(i)) for i in order]
    return SearchResult(
        plans, found.considered, fit, global_batch, removed, None, _notes(model), shapes, found
    )


@dataclass
class Fitting:
    """What fits of a job's layouts: how many plans were considered (every scheme pair and TP overlap), the
    plans that fit (None when none does), the least memory a plan needs and what a device holds."""

    considered: int
    table: Table | None
    least_bytes: float
    device_bytes: float


# Plans one search weighs at most, each sized, those that fit timed: at 128K on H100s Llama 3 405B on 16,384
# GPUs (Llama 3's published layout) weighs 508,002, the whole recommend 1.6 s of CPU here, Llama 3 70B on
# 131,072 GPUs 461,058 in 3.8 s; past the bound DeepSeek-V3 on 1M GPUs (1.9M plans; 2.5M took 21 s and 1.5 GB
# before TP groups leaving a node lost their pipelined variant).
MAX_WEIGHED = 1_500_000
MAX_LISTED = 500_000  # plans a --all-plans table lists at most (about 60 MB of CSV), each timed in full


class TooManyPlans(InputError):
    """A search past :data:`MAX_WEIGHED` plans: refused, where another error may leave a search empty."""


def _weighed_count(
    job: Job, layouts: Table, shape_pairs: dict[tuple[int, int], list[int]], fixed: bool | None
) -> int:
    """The plans a search of these layouts weighs (each layout once per scheme pair and TP overlap), refused
    past :data:`MAX_WEIGHED` before any is sized or timed."""
    runs = {
        (tp, cp): len(valid) * len(_overlaps(job, tp, cp, fixed)) for (tp, cp), valid in shape_pairs.items()
    }
    considered = sum(runs[key] * int(n) for key, n in zip(*_tp_cp_counts(layouts), strict=True))
    if considered > MAX_WEIGHED:
        raise TooManyPlans(
            "--gpus",
            f"{job.gpus:,} GPUs give {considered:,} plans to weigh; a search weighs at most {MAX_WEIGHED:,}: "
            "fix a dimension (--tp, --pp, --cp, --micro-batch)",
        )
    return considered


def fitting(job: Job, global_batch: int, constraints: Constraints = Constraints()) -> Fitting:
    """Every plan the constraints allow that fits memory, timed by nobody: the search's first half, and all
    of what the inverse questions (the longest sequence that fits) ask."""
    layouts, shape_pairs = enumerate_plans(job, global_batch, constraints, expand=False)
    fixed = constraints.tp_comm_overlap
    considered = _weighed_count(job, layouts, shape_pairs, fixed)
    if not considered:
        return Fitting(0, None, float("inf"), float(training_values(job, 1)["M_dev"]))
    memory = memory_table(layouts, job)
    device = float(memory["device_bytes"])
    fits = memory["total_bytes"] <= memory["device_bytes"]
    if not fits.any():  # a lower bound: each scheme's own buffers come on top
        return Fitting(considered, None, float(memory["total_bytes"].min()), device)
    table = with_pairs(layouts.take(fits), shape_pairs, job, fixed)  # then each scheme's own buffers
    exact = memory_table(table, job)
    keep = exact["total_bytes"] <= exact["device_bytes"]
    least = float(exact["total_bytes"].min())
    return Fitting(considered, table.take(keep) if keep.any() else None, least, device)


def fastest(
    job: Job,
    global_batch: int,
    constraints: Constraints,
    within: float,
    *,
    shapes: _Shapes | None = None,
    fits: Fitting | None = None,
) -> dict[str, Any] | None:
    """The plan :func:`search` ranks first, given a fitting plan of ``within`` seconds a step: only the plans
    whose compute bound (:func:`_compute_bound`, never above their step) lies within it can beat that one,
    so memory is evaluated for them alone (a what-if's search, which needs no count of what fits). ``fits``:
    the plans known to fit this job (a what-if that memory does not read), bounded without enumerating."""
    shapes, limit = shapes or _Shapes(job), within * (1 + 1e-12)
    if fits is not None:
        if fits.table is None:
            return None
        table = fits.table.take(_compute_bound(fits.table, shapes) <= limit)
    else:
        layouts, shape_pairs = enumerate_plans(job, global_batch, constraints, expand=False)
        if not _weighed_count(job, layouts, shape_pairs, constraints.tp_comm_overlap):
            return None
        layouts = layouts.take(
            _compute_bound(layouts, shapes, shape_pairs) <= limit
        )  # before the pairs multiply them
        table = with_pairs(layouts, shape_pairs, job, constraints.tp_comm_overlap)
        table = table.take(_compute_bound(table, shapes) <= limit)
        memory = memory_table(table, job)
        table = table.take(memory["total_bytes"] <= memory["device_bytes"])
    if not len(table):
        return None
    result = evaluate_table(table, job, shapes)
    return _row(table, result, int(_fastest_first(table, result)[0]))


def weighed(job: Job, global_batch: int, constraints: Constraints = Constraints()) -> list[dict[str, Any]]:
    """Every plan the search weighs, fitting or not, each timed and sized as the search's pick is, fastest
    first: the table behind the ranking, one flat row per plan (its breakdown as ``*_s`` columns)."""
    check_constraints(job.model, job.gpus, job.inputs.seq, constraints)
    table, _ = enumerate_plans(job, global_batch, constraints)
    if len(table) > MAX_LISTED:
        raise InputError(
            "--all-plans",
            f"{len(table):,} plans; a table lists at most {MAX_LISTED:,}: fix a dimension (--tp, --pp)",
        )
    if not len(table):
        return []
    result = evaluate_table(table, job)
    order = _fastest_first(table, result)
    rows = []
    for i in order:
        row = _row(table, result, int(i))
        breakdown, exposed = row.pop("breakdown"), row.pop("exposed_s")
        row["fits"] = row["memory_bytes"] <= row["device_memory_bytes"]
        rows.append(
            row | {f"x{k.lower()}_s": v for k, v in exposed.items()} | breakdown
        )  # as its table heads them
    return rows


def _fastest_first(table: Table, result: dict[str, Any]) -> np.ndarray:
    """The rank order of evaluated plans: step time, then memory, then fewer GPUs."""
    return np.lexsort((table.columns["gpus"], result["memory"]["total_bytes"], result["time_s"]))


FIRST_ROUND = 4096  # plans timed before the bound prunes the rest


def _contenders(table: Table, top: int, job: Job, shapes: _Shapes) -> Table:
    """The plans that can be among the ``top`` fastest: a step is never shorter than its slowest stage's
    matrix multiplies and attention for every micro-batch, so after timing the plans with the lowest such
    bound, any plan whose bound exceeds the ``top``-th time found cannot place (branch and bound)."""
    if len(table) <= FIRST_ROUND:
        return table
    bound = _compute_bound(table, shapes)
    first = np.argsort(bound, kind="stable")[: max(FIRST_ROUND, 64 * top)]
    times = evaluate_table(table.take(first), job, shapes)["time_s"]
    threshold = np.sort(times)[min(top, len(times)) - 1]
    return table.take(bound <= threshold * (1 + 1e-12))


def _compute_bound(
    table: Table, shapes: _Shapes, shape_pairs: dict[tuple[int, int], list[int]] | None = None
) -> np.ndarray:
    """One layer's multiplies and attention, forward and backward, times m x (the most layers a stage holds)
    plus the pipeline's fill and drain, (the other layers) / v: a lower bound on every plan's step. A step is
    m stage times and a bubble of (all layers' time - a stage's) / v [Megatron21 §2.2], and since m >= 1/v,
    replacing every layer's and stage's time by its multiplies and attention only lowers it. Layouts not yet run under each (scheme, layout) pair (``shape_pairs``
    given: :func:`with_pairs`) are bounded by the fastest pair their TP and CP run (none: no bound below inf)."""
    c = table.columns
    shape = ("tp", "cp", "micro_batch") if shape_pairs is not None else ("tp", "cp", "micro_batch", "pair")
    _, first, index = np.unique(_key(*(c[k] for k in shape)), return_index=True, return_inverse=True)

    def per_layer(i: int) -> float:
        tp, cp, mb = int(c["tp"][i]), int(c["cp"][i]), int(c["micro_batch"][i])
        pairs = [int(c["pair"][i])] if shape_pairs is None else shape_pairs.get((tp, cp), [])
        bound = (_layer_compute_s(shapes.compute(tp, cp, mb, *table.pairs[p])) for p in pairs)
        return min(bound, default=float("inf"))

    stage = np.maximum(np.maximum(c["first_stage_layers"], c["last_stage_layers"]), c["middle_stage_layers"])
    micro = table.global_batch // (c["micro_batch"] * c["dp"])
    pp, ends = c["pp"], c["first_stage_layers"] + c["last_stage_layers"]
    layers = np.where(
        pp == 1, c["first_stage_layers"], ends + c["middle_stage_layers"] * np.maximum(pp - 2, 0)
    )
    bubble = (layers - stage) / c["vpp"]
    return (micro * stage + bubble) * np.array([per_layer(int(i)) for i in first])[index]


def _layer_compute_s(values: dict[str, Any]) -> float:
    names = ("layer_gemm_fwd_s", "layer_gemm_bwd_s", "layer_attn_fwd_s", "layer_attn_bwd_s")
    return float(sum(call(n, values) for n in names))


def _notes(model: ModelPreset) -> list[str]:
    """How the search treats what a user may expect it to hold fixed."""
    if not model.experts:
        return []
    return [
        f"MoE: EP searched over the divisors of DP that divide the {model.experts} experts (carved out of DP, "
        "next to CP in the rank order: tp-cp-ep-dp-pp)"
    ]


def _row(table: Table, result: dict[str, Any], i: int) -> dict[str, Any]:
    breakdown = {k: float(v[i]) for k, v in result["breakdown"].items()}
    return table.plan(i) | {
        "step_time_s": float(result["time_s"][i]),
        "mfu": float(result["mfu"][i]),
        "memory_bytes": float(result["memory"]["total_bytes"][i]),
        "device_memory_bytes": float(result["memory"]["device_bytes"]),
        "exposed_s": {kind: sum(breakdown[n] for n in names) for kind, names in EXPOSED.items()},
        "breakdown": breakdown,
    }


def _empty_reason(job: Job, global_batch: int, c: Constraints) -> str:
    text = (
        "no layout of the job meets every rule (TP dividing the heads, CP the sequence, the scheme's heads)"
    )
    return text + _blame(job, global_batch, c)


def _blame(job: Job, global_batch: int, c: Constraints) -> str:
    """Which single fixed dimension, freed, gives plans that fit: the constraint that empties the set."""
    culprits = []
    usable = float(training_values(job, 1)["M_dev"])
    for name in c.given():
        freed = Constraints(**(c.__dict__ | {name: None}))
        table, _ = enumerate_plans(job, global_batch, freed)
        if len(table) and (memory_table(table, job)["total_bytes"] <= usable).any():
            culprits.append("--" + name.replace("_", "-"))
    if culprits:
        return f"; the constraint that empties it: {', '.join(culprits)} (plans fit without it)"
    return "; no single constraint is to blame: more GPUs, ZeRO-3 or a shorter sequence would be needed"


def _searched(job: Job) -> Job:
    """The job a search varies: each plan's USP split is the scheme's own (the plan's ``cp_ulysses``), so a
    job's fixed ``--ulysses-degree``, a degree of its own CP degree, is not carried into other plans."""
    return job if job.step.ulysses_degree is None else job.replace(ulysses_degree=None)


def plan_as_job(plan: dict[str, Any], job: Job, global_batch: int) -> Job:
    """The job of a searched plan, as `cp-plan step` makes it from the plan's flags: the same flags give the
    same step."""
    return _searched(job).replace(
        cp=plan["cp"],
        layout=plan["layout"] or job.inputs.layout,
        gpus=plan["gpus"],
        tp=plan["tp"],
        pp=plan["pp"],
        first_stage_layers=plan["first_stage_layers"] if plan["pp"] > 1 else None,
        last_stage_layers=plan["last_stage_layers"] if plan["pp"] > 1 else None,
        recompute=plan["recompute"],
        vpp=plan["vpp"],
        micro_batch=plan["micro_batch"],
        global_batch=global_batch,
        cp_scheme=registry.default(TRAINING).name if plan["cp_scheme"] == "none" else plan["cp_scheme"],
        ep=plan["ep"],
        tp_comm_overlap=plan["tp_comm_overlap"],
    )


def search_loop(
    job: Job, global_batch: int, constraints: Constraints = Constraints()
) -> list[dict[str, Any]]:
    """The plain reference: one :func:`~costmodel.training.step.evaluate_step` and one memory fit per
    candidate, fastest first among those that fit."""

    check_constraints(job.model, job.gpus, job.inputs.seq, constraints)
    table, _ = enumerate_plans(job, global_batch, constraints)
    rows = []
    for i in range(len(table)):
        plan = table.plan(i)
        result = evaluate_step(plan_as_job(plan, job, global_batch))
        if result.fits:
            rows.append(
                plan
                | {
                    "step_time_s": result.step.time_s,
                    "mfu": result.step.mfu,
                    "memory_bytes": result.memory.bytes_per_device,
                }
            )
    return sorted(rows, key=lambda r: (r["step_time_s"], r["memory_bytes"]))


def why_lost(plan: dict[str, Any], best: dict[str, Any]) -> str:
    """Why a runner-up is not the pick: where it spends more, the two components that grow most; or, for a plan
    predicted faster than a pick chosen for simplicity or memory, that rule, not time."""
    behind = plan["step_time_s"] - best["step_time_s"]
    if behind < 0:
        return (
            f"predicted {-behind / best['step_time_s']:.1%} faster, but cannot be told from the pick, which is "
            "simpler or safer"
        )
    deltas = sorted(
        ((plan["breakdown"][k] - best["breakdown"][k], k) for k in plan["breakdown"]), reverse=True
    )
    worse = [f"{SHORT[name]} +{seconds(delta, 2)}" for delta, name in deltas[:2] if delta > 0]
    return f"lost by +{behind / best['step_time_s']:.1%}" + (": " + ", ".join(worse) if worse else "")


def table_of(plans: list[dict[str, Any]], kv_heads: int, global_batch: int) -> Table:
    """Plans (as :meth:`Table.plan` gives them) back as a table, to evaluate them again elsewhere."""
    pairs = scheme_pairs()
    columns = {k: np.array([p[k] for p in plans], dtype=np.int64) for k in (*STRUCTURE, "gpus")}
    columns["rc"] = np.array([RECOMPUTE.index(p["recompute"]) for p in plans], dtype=np.int64)
    columns["tpo"] = np.array([int(p["tp_comm_overlap"]) for p in plans], dtype=np.int64)
    columns["pair"] = np.array(
        [pairs.index((p["cp_scheme"], p["layout"])) if p["cp"] > 1 else 0 for p in plans], dtype=np.int64
    )
    return Table(columns, pairs, kv_heads, global_batch)


def evaluate_plan(plan: dict[str, Any], job: Job, global_batch: int) -> dict[str, Any]:
    """One plan's row (time, MFU, memory, breakdown) on possibly another workload or machine."""
    table = table_of([plan], job.model.kv_heads, global_batch)
    return _row(table, evaluate_table(table, job), 0)


def sensitivity(
    plan: dict[str, Any],
    job: Job,
    global_batch: int,
    constraints: Constraints = Constraints(),
    found: SearchResult | None = None,
) -> list[dict[str, Any]]:
    """What the pick's step becomes under a 2x slower inter-node link, a 10 % longer sequence, one more
    recompute level and, where ZeRO spans nodes, sharding per node (hybrid), and whether another plan would
    then be fastest. ``found``: the search of these same
    arguments, whose shapes bound inside one node the slower link leaves as they are."""

    def scenario(
        change: str, at: Job, shapes: _Shapes | None = None, fits: Fitting | None = None
    ) -> dict[str, Any]:
        """The pick and the fastest plan under ``at``, the job changed: the pick evaluated again, and the search
        (bounded by the pick's step where the pick still fits); ``shapes`` and ``fits``, found for ``at``."""
        row = evaluate_plan(plan, at, global_batch)
        try:
            if row["memory_bytes"] <= row["device_memory_bytes"]:
                best = fastest(at, global_batch, constraints, row["step_time_s"], shapes=shapes, fits=fits)
                if best is not None and best["step_time_s"] <= row["step_time_s"]:
                    return _describe(change, plan, row, best)  # nothing left out beats it
            plans = search(at, global_batch, constraints, top=1, shapes=shapes, fits=fits).plans
        except TooManyPlans as exc:  # more plans than a search weighs: the pick is re-timed alone
            said = _describe(change, plan, row, None)
            return said | {"text": f"{said['text']}; not searched again ({exc.message.split(':')[0]})"}
        return _describe(change, plan, row, plans[0] if plans else None)

    out = []
    machine = job.machine
    inter = machine.profile.links.inter_node
    if inter is not None:
        change = "inter-node link 2x slower"
        slower = build_machine(
            machine.profile,
            machine.dtype,
            machine.efficiency,
            changes={"inter_bandwidth": inter.bandwidth_per_direction / 2},
        )
        only_the_link = replace(slower, profile=machine.profile) == machine
        if only_the_link and not _reaches_inter_node(job):
            out.append(_describe(change, plan, plan, plan))  # no group waits on that link: nothing moves
        else:
            shapes, fits = _Shapes(job.on(slower)), None
            if found is not None and found.shapes is not None and only_the_link:
                shapes.cache |= {
                    key: values
                    for key, values in found.shapes.cache.items()
                    if key[0] * key[1] <= machine.profile.ranks_per_node
                }
                # kernel rates and the rest of a layer's compute do not depend on the links
                shapes.gemms, shapes.computed = found.shapes.gemms, found.shapes.computed
                fits = found.fitting  # nor does memory: the same plans fit
            out.append(scenario(change, job.on(slower), shapes, fits))
    unit = 2 * plan["cp"]
    longer = -(-job.inputs.seq * 11 // (10 * unit)) * unit
    out.append(scenario(f"sequence 10 % longer ({longer:,} tokens)", job.replace(seq=longer)))
    level = RECOMPUTE.index(plan["recompute"])
    if level + 1 < len(RECOMPUTE):
        more = plan | {"recompute": RECOMPUTE[level + 1]}
        row = evaluate_plan(more, job, global_batch)
        item = _describe(f"recompute {RECOMPUTE[level + 1]} instead of {plan['recompute']}", plan, row, None)
        if row["memory_bytes"] >= plan["memory_bytes"]:  # flash attention keeps no scores to drop
            item["text"] += ": it saves no memory"
        out.append(item)
    else:
        out.append(
            {"change": "one more recompute level", "text": "none left: the pick already recomputes fully"}
        )
    group = _node_group(plan, job)
    if group is not None:  # the pick as it is, sharded per node and replicated across nodes
        at = plan_as_job(plan, job, global_batch).replace(zero_shard=group)
        row = evaluate_plan(plan, at, global_batch)
        out.append(_describe(f"ZeRO in groups of {group}, one node each (hybrid sharding)", plan, row, None))
    return out


def _node_group(plan: dict[str, Any], job: Job) -> int | None:
    """Hybrid sharding's group of one node for a plan whose ZeRO shards over more: the DP x CP ranks one node
    holds beside TP (Megatron's rank order); None where there is nothing to try (no ZeRO, hybrid already, an
    MoE model, a node holding fewer than two of them or all of them)."""
    weights, per_node = plan["dp"] * plan["cp"], job.machine.profile.ranks_per_node // plan["tp"]
    if job.setup.zero == 0 or job.setup.zero_shard is not None or job.model.experts:
        return None
    return per_node if 2 <= per_node < weights and weights % per_node == 0 else None


def _reaches_inter_node(job: Job) -> bool:
    """Whether some group of the job can wait on the inter-node link: a group's members all lie within the
    job's GPUs, so a job inside one node never does (:meth:`Machine.link`)."""
    return job.gpus > job.machine.profile.ranks_per_node


def _describe(
    change: str, plan: dict[str, Any], row: dict[str, Any], best: dict[str, Any] | None
) -> dict[str, Any]:
    before, after = plan["step_time_s"], row["step_time_s"]
    fits = row["memory_bytes"] <= row["device_memory_bytes"]
    text = (
        f"step {seconds(before)} -> {seconds(after)} ({after / before - 1:+.1%}), memory "
        f"{si(plan['memory_bytes'], 'B', 3)} -> {si(row['memory_bytes'], 'B', 3)}"
        + ("" if fits else " (no longer fits)")
    )
    new_best = None
    if best is not None:
        same = all(
            best[k] == plan[k] for k in (*STRUCTURE, "recompute", "cp_scheme", "layout", "tp_comm_overlap")
        )
        if same and fits:
            text += "; the pick stays the fastest"
        else:
            new_best = best
            text += f"; the fastest becomes {label(best)} at {seconds(best['step_time_s'])}"
    return {
        "change": change,
        "step_time_s": after,
        "step_time_change": after / before - 1,
        "memory_bytes": row["memory_bytes"],
        "fits": bool(fits),
        "best": None if new_best is None else {k: new_best[k] for k in PLAN_KEYS},
        "text": text,
    }


PLAN_KEYS = (
    "gpus",
    "tp",
    "tp_comm_overlap",
    "cp",
    "pp",
    "first_stage_layers",
    "middle_stage_layers",
    "last_stage_layers",
    "vpp",
    "dp",
    "micro_batch",
    "recompute",
    "cp_scheme",
    "layout",
    "step_time_s",
    "mfu",
)


def layout_name(plan: dict[str, Any]) -> str:
    """``8x4x2v4x16`` (``e8`` after DP with EP): TP x CP x PP (with its virtual stages) x DP, as tables print it."""
    pp = str(plan["pp"]) + (f"v{plan['vpp']}" if plan["vpp"] > 1 else "")
    ep = f"e{plan['ep']}" if plan.get("ep", 1) > 1 else ""
    return f"{plan['tp']}x{plan['cp']}x{pp}x{plan['dp']}{ep}"


def label(plan: dict[str, Any]) -> str:
    """``TP 8 · CP 4 (zigzag ring) · PP 2 (v 2) · DP 16 · mb 1 · recompute full`` (``EP 8`` after DP)."""
    cp = f"CP {plan['cp']}"
    if plan["cp"] > 1:
        scheme = registry.get(plan["cp_scheme"])
        name = (
            scheme.split_label(plan.get("cp_ulysses", "?"), plan.get("cp_ring", "?"))
            if scheme.hybrid
            else scheme.name
        )
        cp += f" ({name}" + (f", {plan['layout']})" if not scheme.whole_sequence else ")")
    split = StageSplit.of(plan).text()
    stages = ", ".join(part for part in (split, f"v {plan['vpp']}" if plan["vpp"] > 1 else "") if part)
    pp = f"PP {plan['pp']}" + (f" ({stages})" if stages else "")
    ep = f" · EP {plan['ep']}" if plan.get("ep", 1) > 1 else ""
    tp = f"TP {plan['tp']}" + (" (overlapped)" if plan.get("tp_comm_overlap") else "")
    return (
        f"{tp} · {cp} · {pp} · DP {plan['dp']}{ep} · mb {plan['micro_batch']} · recompute {plan['recompute']}"
    )


def fastest_by_cp(job: Job, ns: list[int] | np.ndarray, global_batch: int | None = None) -> np.ndarray:
    """The fastest fitting step at each CP degree of ``ns``, with the job's TP, PP and recompute held and
    micro-batch, virtual stages and CP scheme searched (Megatron-LM's plans); NaN where none fits."""

    setup = job.setup
    fixed = Constraints(tp=setup.tp, pp=setup.pp, recompute=setup.recompute)
    out = np.full(len(ns), np.nan)
    try:
        check_constraints(job.model, setup.gpus, job.inputs.seq, fixed)
    except InputError:
        return out
    wanted = {int(n): j for j, n in enumerate(ns)}
    batch = global_batch or default_global_batch(job.inputs.seq)
    for plan in search(job, batch, fixed, top=None).plans:
        j = wanted.get(plan["cp"])
        if j is not None and np.isnan(out[j]):  # fastest first
            out[j] = plan["step_time_s"]
    return out
