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

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from costmodel.core.errors import InputError
from costmodel.core.units import seconds
from costmodel.machines.binding import Collective, Machine
from costmodel.plans.inputs import MAX_CP, PlanInputs, TrainingSetup
from costmodel.plans.models import ModelPreset, load_model
from costmodel.plans.stages import check_stages
from costmodel.schedule.layouts import chunks_per_rank, divisors
from costmodel.symbolic import numeric
from costmodel.training import moe
from costmodel.training.recommend import training_values, zero_fractions
from costmodel.training.step import StepSetup, bind, buckets, check_physical, step_breakdown

DEFAULT_BATCH_TOKENS = 2**22  # [Llama3 §3.4]: 4M tokens per step at the start of pre-training
MICRO_BATCHES = (1, 2, 4, 8)  # micro-batch sizes tried (sequences)
RECOMPUTE = ("none", "selective", "full")
# (scheme, layout) pairs whose step times differ: Ulysses runs whole sequences per head, so its layout does
# not enter; an all-gather's zigzag and striped shards see the same keys.
SCHEMES: tuple[tuple[str, str], ...] = (
    ("ring", "zigzag"),
    ("ring", "striped"),
    ("ring", "contiguous"),
    ("usp", "zigzag"),
    ("usp", "striped"),
    ("usp", "contiguous"),
    ("ulysses", "zigzag"),
    ("allgather", "zigzag"),
    ("allgather", "contiguous"),
)
# What each framework runs: Megatron-LM's --cp-comm-type (p2p, a2a, allgather, a2a+p2p) over its
# load-balanced (zigzag) split; torchtitan's context_parallel_rotate_method (alltoall: the ring's shuffles,
# allgather) over its head-tail (zigzag) split.
FRAMEWORKS: dict[str, frozenset[tuple[str, str]]] = {
    "megatron": frozenset(
        {("ring", "zigzag"), ("ulysses", "zigzag"), ("allgather", "zigzag"), ("usp", "zigzag")}
    ),
    "torchtitan": frozenset({("ring", "zigzag"), ("allgather", "zigzag")}),
}
EXPOSED = {  # exposed communication by kind, from the step's breakdown
    "TP": ("exposed TP comm",),
    "CP": ("exposed CP comm", "CP ring overheads (merge, copies, launches)"),
    "PP": ("exposed PP sends", "pipeline bubble"),
    "DP": ("exposed DP comm", "exposed ZeRO-3 gathers"),
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
    framework: str = "any"

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and k != "framework"}


@dataclass
class Table:
    """Candidates as columns: one numpy array per dimension, and the scheme/layout pair's index."""

    columns: dict[str, np.ndarray]
    pairs: list[tuple[str, str]]
    kv_heads: int

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def take(self, keep: np.ndarray) -> Table:
        return Table({k: v[keep] for k, v in self.columns.items()}, self.pairs, self.kv_heads)

    def plan(self, i: int) -> dict[str, Any]:
        c = self.columns
        scheme, layout = self.pairs[int(c["pair"][i])]
        plan = {k: int(c[k][i]) for k in ("tp", "cp", "pp", "vpp", "dp", "micro_batch")}
        if plan["cp"] == 1:
            scheme, layout = "none", None
        ulysses = {"ring": 1, "allgather": 1, "ulysses": plan["cp"], "none": 1}.get(scheme)
        if ulysses is None:
            ulysses = _usp_degree(self.kv_heads, plan["tp"], plan["cp"])
        return plan | {
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
    # The candidates and their bound shapes, for what-ifs that re-evaluate them (:func:`sensitivity`).
    evaluated: Evaluated | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Evaluated:
    """Candidates evaluated on one machine: the table, its arrays (:func:`evaluate_table`), and the shapes
    bound for it."""

    table: Table
    result: dict[str, Any]
    shapes: _Shapes

    def ranked(self) -> np.ndarray:
        """The rows that fit memory, fastest first, then the least memory: the search's ranking."""
        memory = self.result["memory"]
        fits = memory["total_bytes"] <= memory["device_bytes"]
        order = np.lexsort((memory["total_bytes"], self.result["time_s"]))
        return order[fits[order]]

    def row_of(self, plan: dict[str, Any]) -> dict[str, Any] | None:
        """The plan's row (as :func:`evaluate_plan` gives it), or None when the table lacks the plan."""
        one = table_of([plan], self.table.kv_heads).columns
        c = self.table.columns
        match = np.flatnonzero(np.logical_and.reduce([c[k] == one[k][0] for k in one]))
        return _row(self.table, self.result, int(match[0])) if len(match) else None


def default_global_batch(seq: int) -> int:
    return max(1, DEFAULT_BATCH_TOKENS // seq)


def check_constraints(model: ModelPreset, gpus: int, c: Constraints) -> None:
    """Constraints no plan can meet, as one line naming the flag."""
    if c.tp is not None and model.heads % c.tp:
        raise InputError("--tp", f"{c.tp} does not divide the model's {model.heads} heads")
    if c.pp is not None:
        check_stages(model.layers, c.pp, c.vpp or 1)
    if c.pp is not None and model.layers % c.pp:
        raise InputError("--pp", f"{c.pp} does not divide the model's {model.layers} layers")
    fixed = (c.tp or 1) * (c.cp or 1) * (c.pp or 1)
    if fixed > gpus:
        raise InputError("--gpus", f"{gpus} GPUs are fewer than the fixed tp x cp x pp = {fixed}")
    if gpus % fixed:
        raise InputError("--gpus", f"{gpus} GPUs are not divisible by the fixed tp x cp x pp = {fixed}")
    if c.framework not in ("any", *FRAMEWORKS):
        raise InputError("--framework", f"unknown {c.framework!r}; accepted: any, {', '.join(FRAMEWORKS)}")


def enumerate_plans(
    model: ModelPreset, seq: int, gpus: int, global_batch: int, c: Constraints
) -> tuple[Table, dict[str, int]]:
    """Every layout of ``gpus`` the constraints allow, and how many each structural rule removed."""
    removed: dict[str, int] = {}
    allowed = [
        (s, lay)
        for s, lay in SCHEMES
        if (c.cp_scheme is None or s == c.cp_scheme)
        and (c.layout is None or lay == c.layout or s == "ulysses")
        and (c.framework == "any" or (s, lay) in FRAMEWORKS[c.framework])
    ]
    if not allowed:
        raise InputError("--cp-scheme", f"no CP scheme and layout of {c.framework} matches the constraints")
    pairs = list(SCHEMES)
    rows: list[tuple[int, ...]] = []
    kv_heads = model.kv_heads
    # Transformer Engine's all-to-all (Megatron-LM's a2a) splits the KV heads too; elsewhere they may be copied.
    a2a_kv = c.framework == "megatron"
    for tp in divisors(gpus):
        if (c.tp is not None and tp != c.tp) or model.heads % tp:
            continue
        for cp in divisors(gpus // tp):
            if (c.cp is not None and cp != c.cp) or cp > MAX_CP or cp > seq:
                continue
            if cp == 1 and (c.cp_scheme is not None or c.layout is not None):  # a fixed scheme means CP
                continue
            usp = _usp_degree(kv_heads, tp, cp) not in (1, cp)
            for pp in divisors(gpus // (tp * cp)):
                if (c.pp is not None and pp != c.pp) or model.layers % pp:
                    continue
                dp = gpus // (tp * cp * pp)
                if global_batch % dp:
                    removed["global batch not divisible by DP"] = (
                        removed.get("global batch not divisible by DP", 0) + 1
                    )
                    continue
                stages = divisors(model.layers // pp) if pp > 1 else [1]
                for vpp in stages:
                    if c.vpp is not None and vpp != c.vpp:
                        continue
                    for mb in MICRO_BATCHES:
                        if (c.micro_batch is not None and mb != c.micro_batch) or (global_batch // dp) % mb:
                            continue
                        if pp > 1 and global_batch // (dp * mb) < pp:
                            continue
                        for rc, recompute in enumerate(RECOMPUTE):
                            if c.recompute is not None and recompute != c.recompute:
                                continue
                            for scheme, layout in allowed if cp > 1 else [allowed[0]]:
                                if cp > 1:
                                    if seq % (cp * chunks_per_rank(layout)):
                                        continue
                                    if scheme == "ulysses" and (model.heads // tp) % cp:
                                        continue
                                    if scheme == "ulysses" and a2a_kv and max(kv_heads // tp, 1) % cp:
                                        continue
                                    if scheme == "usp" and not usp:  # the plain ring or Ulysses
                                        continue
                                rows.append((tp, cp, pp, vpp, dp, mb, rc, pairs.index((scheme, layout))))
    names = ("tp", "cp", "pp", "vpp", "dp", "micro_batch", "rc", "pair")
    data = np.array(rows, dtype=np.int64).reshape(-1, len(names))
    return Table({name: data[:, i] for i, name in enumerate(names)}, pairs, kv_heads), removed


def _usp_degree(kv_heads: int, tp: int, cp: int) -> int:
    heads = max(kv_heads // tp, 1)
    return max(u for u in divisors(cp) if heads % u == 0)


class _Shapes:
    """The step's symbols for one (tp, cp, micro-batch, scheme, layout), from :func:`bind` itself: rates,
    the TP and CP links, the USP split; and the DP and PP links per (stride, size)."""

    def __init__(
        self, inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, model: ModelPreset, machine: Machine
    ) -> None:
        self.inputs, self.setup, self.step, self.model, self.machine = inputs, setup, step, model, machine
        self.cache: dict[tuple, dict[str, Any]] = {}
        self.links: dict[tuple[int, int, Collective], float] = {}

    def values(self, tp: int, cp: int, mb: int, scheme: str, layout: str) -> dict[str, Any]:
        key = (tp, cp, mb, scheme, layout)
        if key not in self.cache:
            inputs = self.inputs.model_copy(update={"n": cp, "layout": layout})
            setup = self.setup.model_copy(update={"gpus": tp * cp, "tp": tp, "pp": 1})
            step = self.step.model_copy(
                update={
                    "micro_batch": mb,
                    "global_batch": mb,
                    "vpp": 1,
                    "cp_scheme": scheme if cp > 1 else "ring",
                }
            )
            self.cache[key] = bind(inputs, setup, step, self.model, self.machine)
        return self.cache[key]

    def link(self, stride: int, size: int, collective: Collective) -> float:
        if (stride, size, collective) not in self.links:
            self.links[(stride, size, collective)] = (
                self.machine.placed(stride).link(size, collective).bandwidth
            )
        return self.links[(stride, size, collective)]

    def links_of(self, strides: np.ndarray, sizes: np.ndarray, collective: Collective) -> np.ndarray:
        """B of every (stride, size) group's ``collective``, looked up once per distinct pair."""
        _, first, index = np.unique(_key(strides, sizes), return_index=True, return_inverse=True)
        return np.array([self.link(int(strides[i]), int(sizes[i]), collective) for i in first])[index]


def _key(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row of non-negative integer columns (mixed radix; every product here stays below
    2^63: a job's degrees multiply to at most its GPUs), for a fast np.unique."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        key = key * (int(column.max(initial=0)) + 1) + column
    return key


# c too: a packed or windowed mask's executed share depends on the CP degree and the layout.
PER_SHAPE = (
    "c",
    "u_cp",
    "k_copy",
    "B_tp",
    "alpha_tp",
    "alpha_cp",
    "B_cp",
    "N_u",
    "N_r",
    "F_gemm",
    "F_gemm_b",
    "F_head",
    "F_attn",
    "F_attn_bwd",
)


def evaluate_table(
    table: Table,
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    model: ModelPreset,
    machine: Machine,
    shapes: _Shapes | None = None,
) -> dict[str, Any]:
    """Step time, its breakdown, MFU and memory of every candidate, as arrays."""
    c = table.columns
    shapes = shapes or _Shapes(inputs, setup, step, model, machine)
    keys = _key(c["tp"], c["cp"], c["micro_batch"], c["pair"])
    unique, first, index = np.unique(keys, return_index=True, return_inverse=True)
    bound = [
        shapes.values(
            int(c["tp"][i]), int(c["cp"][i]), int(c["micro_batch"][i]), *table.pairs[int(c["pair"][i])]
        )
        for i in first
    ]
    base = bound[0]
    v: dict[str, Any] = dict(base)
    for name in PER_SHAPE:
        v[name] = np.array([b[name] for b in bound], dtype=float)[index]
    tp, cp, pp, dp = (c[k].astype(float) for k in ("tp", "cp", "pp", "dp"))
    v |= {
        "t": tp,
        "N": cp,
        "pp": pp,
        "D": dp,
        "b": c["micro_batch"].astype(float),
        "v_pp": c["vpp"].astype(float),
        "m_mb": step.global_batch / (c["micro_batch"] * c["dp"]),
        "rc_sel": (c["rc"] == 1).astype(float),
        "rc_full": (c["rc"] == 2).astype(float),
    }
    v["B_dp"] = shapes.links_of(c["tp"] * c["cp"], c["dp"], "ring")
    v["B_pp"] = shapes.links_of(c["tp"] * c["cp"] * c["dp"], c["pp"], "p2p")
    v["n_bkt"] = buckets(v, step, model)
    breakdown = {name: np.zeros(len(table)) for name in step_breakdown(base, "ring", model)}
    for p, (scheme, _) in enumerate(table.pairs):
        rows = c["pair"] == p
        if rows.any():
            part = step_breakdown(
                {k: a[rows] if isinstance(a, np.ndarray) else a for k, a in v.items()}, scheme, model
            )
            for name, value in part.items():
                breakdown[name][rows] = value
    time_s = sum(breakdown.values())
    tokens = numeric.step_tokens(**{a: v[a] for a in numeric.ARGS["step_tokens"]})
    peak = machine.peak_flops * setup.gpus

    def per_token(name: str) -> Any:
        return getattr(numeric, name)(**{a: v[a] for a in numeric.ARGS[name]})

    # MFU counts the trained mask's pairs, as `cp-plan step` does (costmodel.training.step.evaluate_step).
    hfu = per_token("hardware_flops_per_token") * tokens / (time_s * peak)
    check_physical(hfu, v, machine)
    return {
        "time_s": time_s,
        "mfu": per_token("model_flops_per_token_causal") * tokens / (time_s * peak),
        "hfu": hfu,
        "breakdown": breakdown,
        "memory": memory_table(table, inputs, setup, model, machine),
    }


def memory_table(
    table: Table, inputs: PlanInputs, setup: TrainingSetup, model: ModelPreset, machine: Machine
) -> dict[str, np.ndarray]:
    """Training memory per device on the most loaded stage [Korthikanti22 §4], and the usable HBM."""
    c = table.columns
    values = training_values(inputs, model, setup, machine, 1)
    group = (c["dp"] * c["cp"]).astype(float)
    z_w, z_g, z_o = zero_fractions(setup.zero, group)  # type: ignore[arg-type]
    ones = np.ones(len(table))
    values |= {
        "N": c["cp"].astype(float),
        "t": c["tp"].astype(float),
        "pp": c["pp"].astype(float),
        "b": c["micro_batch"].astype(float),
        "rho": (c["rc"] == 2).astype(float),
        "phi": ((c["rc"] == 0) & (not setup.flash_attention)).astype(float),
        "sigma": (c["tp"] > 1).astype(float)
        if setup.sequence_parallel is None
        else (c["tp"] > 1) & setup.sequence_parallel,
        "z_w": z_w * ones,
        "z_g": z_g * ones,
        "z_o": z_o * ones,
    }
    name = moe.twin("training_memory_bytes", values)  # an MoE model's every expert, EP 1
    total = getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]})
    return {"total_bytes": np.asarray(total, dtype=float) * ones, "device_bytes": values["M_dev"]}


def search(
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    machine: Machine,
    constraints: Constraints = Constraints(),
    top: int | None = 10,
) -> SearchResult:
    """The ``top`` fastest plans of ``setup.gpus`` that the constraints allow and that fit (None: all)."""
    model = _model(inputs)
    check_constraints(model, setup.gpus, constraints)
    table, removed = enumerate_plans(model, inputs.seq, setup.gpus, step.global_batch, constraints)
    considered = len(table)
    if not considered:
        return SearchResult(
            [],
            0,
            0,
            step.global_batch,
            removed,
            _empty_reason(model, inputs, setup, step, constraints, machine, removed),
        )
    shapes = _Shapes(inputs, setup, step, model, machine)
    evaluated = Evaluated(table, evaluate_table(table, inputs, setup, step, model, machine, shapes), shapes)
    result = evaluated.result
    fits = result["memory"]["total_bytes"] <= result["memory"]["device_bytes"]
    order = evaluated.ranked()
    if top is not None:
        order = order[:top]
    plans = [_row(table, result, int(i)) for i in order]
    reason = None
    if not plans:
        smallest = float(result["memory"]["total_bytes"].min())
        reason = (
            f"no plan fits memory: the smallest needs {smallest / 2**30:.1f} GiB of the "
            f"{result['memory']['device_bytes'] / 2**30:.1f} GiB usable per device"
        )
        reason += _blame(model, inputs, setup, step, constraints, machine)
    return SearchResult(
        plans, considered, int(fits.sum()), step.global_batch, removed, reason, _notes(model), evaluated
    )


def _notes(model: ModelPreset) -> list[str]:
    """What the search holds fixed that a user may expect searched."""
    if not model.experts:
        return []
    return [
        f"MoE: every plan keeps all {model.experts} experts on each TP x PP slice (EP 1: the search does not "
        "split experts; cp-plan step --ep times a plan with EP)"
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


def _model(inputs: PlanInputs) -> ModelPreset:
    if inputs.model is None:
        raise InputError("--model", "the layout search needs a model preset; e.g. --model llama3-8b")
    return load_model(inputs.model)


def _empty_reason(
    model: ModelPreset,
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    c: Constraints,
    machine: Machine,
    removed: dict[str, int],
) -> str:
    text = "no layout of the job meets every rule (divisibility of heads, layers, sequence and batch)"
    batch = removed.get("global batch not divisible by DP", 0)
    if batch:
        text += (
            f"; {batch} factorisations leave a DP degree that does not divide the global batch of "
            f"{step.global_batch} sequences (--global-batch)"
        )
    return text + _blame(model, inputs, setup, step, c, machine)


def _blame(
    model: ModelPreset,
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    c: Constraints,
    machine: Machine,
) -> str:
    """Which single fixed dimension, freed, gives plans that fit: the constraint that empties the set."""
    culprits = []
    for name in c.given():
        freed = Constraints(**(c.__dict__ | {name: None}))
        table, _ = enumerate_plans(model, inputs.seq, setup.gpus, step.global_batch, freed)
        if (
            len(table)
            and (
                memory_table(table, inputs, setup, model, machine)["total_bytes"]
                <= _usable(inputs, setup, model, machine)
            ).any()
        ):
            culprits.append("--" + name.replace("_", "-"))
    if culprits:
        return f"; the constraint that empties it: {', '.join(culprits)} (plans fit without it)"
    return "; no single constraint is to blame: more GPUs, ZeRO-3 or a shorter sequence would be needed"


def _usable(inputs: PlanInputs, setup: TrainingSetup, model: ModelPreset, machine: Machine) -> float:
    return float(training_values(inputs, model, setup, machine, 1)["M_dev"])


def search_loop(
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    machine: Machine,
    constraints: Constraints = Constraints(),
) -> list[dict[str, Any]]:
    """The plain reference: one :func:`~costmodel.training.step.evaluate_step` and one memory fit per
    candidate, fastest first among those that fit."""
    from costmodel.plans.bind import Evaluator
    from costmodel.training.recommend import fit_at
    from costmodel.training.step import evaluate_step

    model = _model(inputs)
    check_constraints(model, setup.gpus, constraints)
    table, _ = enumerate_plans(model, inputs.seq, setup.gpus, step.global_batch, constraints)
    rows = []
    for i in range(len(table)):
        plan = table.plan(i)
        at = inputs.model_copy(update={"n": plan["cp"], "layout": plan["layout"] or inputs.layout})
        job = setup.model_copy(update={"tp": plan["tp"], "pp": plan["pp"], "recompute": plan["recompute"]})
        knobs = step.model_copy(
            update={
                "vpp": plan["vpp"],
                "micro_batch": plan["micro_batch"],
                "cp_scheme": "ring" if plan["cp_scheme"] == "none" else plan["cp_scheme"],
            }
        )
        result = evaluate_step(at, job, knobs, machine)["step"]
        values = training_values(
            at.model_copy(update={"batch": plan["micro_batch"]}), model, job, machine, plan["cp"]
        )
        fit = fit_at(Evaluator(values))
        if fit.fits:
            rows.append(
                plan
                | {"step_time_s": result["time_s"], "mfu": result["mfu"], "memory_bytes": fit.total_bytes}
            )
    return sorted(rows, key=lambda r: (r["step_time_s"], r["memory_bytes"]))


SHORT = {  # breakdown components as a table cell names them
    "matrix multiplies": "matmuls",
    "elementwise (memory-bound)": "elementwise",
    "output layer and loss": "output layer",
    "exposed TP comm": "TP comm",
    "exposed CP comm": "CP comm",
    "CP ring overheads (merge, copies, launches)": "ring overheads",
    "exposed PP sends": "PP sends",
    "exposed DP comm": "DP comm",
    "exposed ZeRO-3 gathers": "ZeRO-3 gathers",
    "optimizer step": "optimizer",
}


def why_lost(plan: dict[str, Any], best: dict[str, Any]) -> str:
    """Where a runner-up spends more than the pick: the two components that grow most."""
    behind = plan["step_time_s"] - best["step_time_s"]
    deltas = sorted(
        ((plan["breakdown"][k] - best["breakdown"][k], k) for k in plan["breakdown"]), reverse=True
    )
    worse = [f"{SHORT.get(name, name)} +{seconds(delta, 2)}" for delta, name in deltas[:2] if delta > 0]
    return f"+{behind / best['step_time_s']:.1%}: " + ", ".join(worse)


def table_of(plans: list[dict[str, Any]], kv_heads: int) -> Table:
    """Plans (as :meth:`Table.plan` gives them) back as a table, to evaluate them again elsewhere."""
    pairs = list(SCHEMES)
    columns = {
        k: np.array([p[k] for p in plans], dtype=np.int64)
        for k in ("tp", "cp", "pp", "vpp", "dp", "micro_batch")
    }
    columns["rc"] = np.array([RECOMPUTE.index(p["recompute"]) for p in plans], dtype=np.int64)
    columns["pair"] = np.array(
        [pairs.index((p["cp_scheme"], p["layout"])) if p["cp"] > 1 else 0 for p in plans], dtype=np.int64
    )
    return Table(columns, pairs, kv_heads)


def evaluate_plan(
    plan: dict[str, Any], inputs: PlanInputs, setup: TrainingSetup, step: StepSetup, machine: Machine
) -> dict[str, Any]:
    """One plan's row (time, MFU, memory, breakdown) on possibly other inputs or another machine."""
    model = _model(inputs)
    table = table_of([plan], model.kv_heads)
    return _row(table, evaluate_table(table, inputs, setup, step, model, machine), 0)


def sensitivity(
    plan: dict[str, Any],
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    machine: Machine,
    constraints: Constraints = Constraints(),
    found: SearchResult | None = None,
) -> list[dict[str, Any]]:
    """What the pick's step becomes under a 2x slower inter-node link, a 10 % longer sequence and one more
    recompute level, and whether another plan would then be fastest. ``found``: the search of these same
    arguments, whose candidates and bound shapes the what-ifs reuse."""
    from costmodel.machines.compose import override

    out = []
    model = _model(inputs)
    base = found.evaluated if found is not None else None
    inter = machine.profile.links.inter_node
    if inter is not None:
        change = "inter-node link 2x slower"
        slower = Machine(
            override(machine.profile, inter_bandwidth=inter.bandwidth_per_direction / 2),
            machine.dtype,
            machine.efficiency,
        )
        only_the_link = replace(slower, profile=machine.profile) == machine
        if only_the_link and not _reaches_inter_node(setup, machine):
            out.append(_describe(change, plan, plan, plan))  # no group waits on that link: nothing moves
        else:  # the same candidates on other links: the table stands, and so do shapes inside one node
            table = base.table if base is not None else None
            shapes = _Shapes(inputs, setup, step, model, slower)
            if base is not None and only_the_link:
                shapes.cache |= {
                    key: values
                    for key, values in base.shapes.cache.items()
                    if key[0] * key[1] <= machine.profile.ranks_per_node
                }
            out.append(
                _scenario(change, plan, inputs, setup, step, slower, constraints, model, table, shapes)
            )
    unit = 2 * plan["cp"]
    longer = -(-inputs.seq * 11 // (10 * unit)) * unit
    out.append(
        _scenario(
            f"sequence 10 % longer ({longer:,} tokens)",
            plan,
            inputs.model_copy(update={"seq": longer}),
            setup,
            step,
            machine,
            constraints,
            model,
        )
    )
    level = RECOMPUTE.index(plan["recompute"])
    if level + 1 < len(RECOMPUTE):
        more = plan | {"recompute": RECOMPUTE[level + 1]}
        row = (base.row_of(more) if base is not None else None) or evaluate_plan(
            more, inputs, setup, step, machine
        )
        item = _describe(f"recompute {RECOMPUTE[level + 1]} instead of {plan['recompute']}", plan, row, None)
        if row["memory_bytes"] >= plan["memory_bytes"]:  # flash attention keeps no scores to drop
            item["text"] += ": it saves no memory"
        out.append(item)
    else:
        out.append(
            {"change": "one more recompute level", "text": "none left: the pick already recomputes fully"}
        )
    return out


def _reaches_inter_node(setup: TrainingSetup, machine: Machine) -> bool:
    """Whether some group of the job can wait on the inter-node link: a group's members all lie within the
    job's GPUs, so a job inside one node never does (:meth:`Machine.link`)."""
    return setup.gpus > machine.profile.ranks_per_node


def _scenario(
    change: str,
    plan: dict[str, Any],
    inputs: PlanInputs,
    setup: TrainingSetup,
    step: StepSetup,
    machine: Machine,
    constraints: Constraints,
    model: ModelPreset,
    table: Table | None = None,
    shapes: _Shapes | None = None,
) -> dict[str, Any]:
    """The pick and the fastest plan under changed inputs, from one evaluation of every candidate (``table``,
    when they are the search's own; ``shapes``, bindings still valid there)."""
    if table is None:
        table, _ = enumerate_plans(model, inputs.seq, setup.gpus, step.global_batch, constraints)
    if not len(table):
        return _describe(change, plan, evaluate_plan(plan, inputs, setup, step, machine), None)
    shapes = shapes or _Shapes(inputs, setup, step, model, machine)
    evaluated = Evaluated(table, evaluate_table(table, inputs, setup, step, model, machine, shapes), shapes)
    order = evaluated.ranked()
    best = _row(table, evaluated.result, int(order[0])) if len(order) else None
    row = evaluated.row_of(plan) or evaluate_plan(plan, inputs, setup, step, machine)
    return _describe(change, plan, row, best)


def _describe(
    change: str, plan: dict[str, Any], row: dict[str, Any], best: dict[str, Any] | None
) -> dict[str, Any]:
    before, after = plan["step_time_s"], row["step_time_s"]
    fits = row["memory_bytes"] <= row["device_memory_bytes"]
    text = (
        f"step {seconds(before)} -> {seconds(after)} ({after / before - 1:+.1%}), memory "
        f"{plan['memory_bytes'] / 2**30:.1f} -> {row['memory_bytes'] / 2**30:.1f} GiB"
        + ("" if fits else " (no longer fits)")
    )
    new_best = None
    if best is not None:
        same = all(
            best[k] == plan[k]
            for k in ("tp", "cp", "pp", "vpp", "micro_batch", "recompute", "cp_scheme", "layout")
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
    "tp",
    "cp",
    "pp",
    "vpp",
    "dp",
    "micro_batch",
    "recompute",
    "cp_scheme",
    "layout",
    "step_time_s",
    "mfu",
)


def label(plan: dict[str, Any]) -> str:
    """``TP 8 · CP 4 (zigzag ring) · PP 2 (v 2) · DP 16 · mb 1 · recompute full``."""
    cp = f"CP {plan['cp']}"
    if plan["cp"] > 1:
        scheme = {"usp": f"USP {plan.get('cp_ulysses', '?')}x{plan.get('cp_ring', '?')}"}.get(
            plan["cp_scheme"], plan["cp_scheme"]
        )
        cp += f" ({scheme}" + (f", {plan['layout']})" if plan["cp_scheme"] != "ulysses" else ")")
    pp = f"PP {plan['pp']}" + (f" (v {plan['vpp']})" if plan["vpp"] > 1 else "")
    return (
        f"TP {plan['tp']} · {cp} · {pp} · DP {plan['dp']} · mb {plan['micro_batch']} · "
        f"recompute {plan['recompute']}"
    )


def fastest_by_cp(
    inputs: PlanInputs,
    setup: TrainingSetup,
    machine: Machine,
    ns: list[int] | np.ndarray,
    global_batch: int | None = None,
) -> np.ndarray:
    """The fastest fitting step at each CP degree of ``ns``, with the job's TP, PP and recompute held and
    micro-batch, virtual stages and CP scheme searched (Megatron-LM's plans); NaN where none fits."""
    from costmodel.plans.inputs import build

    model = _model(inputs)
    step = build(StepSetup, global_batch=global_batch or default_global_batch(inputs.seq))
    fixed = Constraints(tp=setup.tp, pp=setup.pp, recompute=setup.recompute, framework="megatron")
    out = np.full(len(ns), np.nan)
    try:
        check_constraints(model, setup.gpus, fixed)
    except InputError:
        return out
    wanted = {int(n): j for j, n in enumerate(ns)}
    for plan in search(inputs, setup, step, machine, fixed, top=None).plans:
        j = wanted.get(plan["cp"])
        if j is not None and np.isnan(out[j]):  # fastest first
            out[j] = plan["step_time_s"]
    return out
