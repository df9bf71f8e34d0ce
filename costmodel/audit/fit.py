"""A profile whose efficiency terms are fitted to logged runs, with the leave-one-out error across them.

Two factors, both on the profile so every command uses them: ``compute`` multiplies the published kernel
rates (matrix multiply and attention tables) and the HBM bandwidth; ``comm`` multiplies every link's
bandwidth. The step's breakdown is split into what each moves (compute: multiplies, attention,
elementwise, recompute, output layer, optimizer, bubble; communication: every exposed transfer; the rest,
fixed launch costs, stays), and a step time is taken as ``C/compute + M/comm + rest``; the factors
minimise the squared relative error of that over the runs. One run, or runs whose communication shares do
not differ, fit ``compute`` alone. The errors are the full step model's, re-evaluated with the fitted
profile; leave-one-out fits on all runs but one and predicts that one.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.core.errors import InputError
from costmodel.core.intervals import LayoutResiduals, Residuals
from costmodel.machines.profiles import HardwareProfile, parse_profile
from costmodel.plans.bind import Evaluator
from costmodel.plans.job import Job
from costmodel.training.report import StepTimes
from costmodel.training.step import evaluate_step, term_values

COMPUTE = (
    "matmul_s",
    "attention_s",
    "elementwise_s",
    "recompute_s",
    "head_s",
    "optimizer_s",
    "pipeline_bubble_s",
)
COMM = ("exposed_tp_s", "exposed_cp_s", "exposed_pp_s", "exposed_dp_s", "zero3_gather_s")
FACTOR_RANGE = (0.05, 20.0)  # outside it a fitted factor says the runs do not pin it down
LINK_FACTOR = 2.0  # links may be fitted up to this many times the profile's rate per direction, no more
ERROR_MAX = 0.25  # a fitted profile that still misses its own runs by a median 25 % has learnt nothing


@dataclass(frozen=True)
class Run:
    """One logged run: its step values (as ``cp-plan step``'s flags) and its measured median step time."""

    label: str
    values: dict[str, Any]
    measured_s: float


def scaled_profile(profile: HardwareProfile, compute: float, comm: float) -> HardwareProfile:
    """``profile`` with kernel rates and HBM bandwidth x ``compute`` and every link x ``comm``."""
    data = profile.model_dump(mode="python", exclude_none=True)
    kernels = data.get("kernels")
    if kernels is None:
        raise InputError("--hw", f"{profile.origin} has no published kernel tables to fit")
    for table in ("gemm", "gemm_fp8"):
        if table in kernels:
            kernels[table]["flops_per_s"] = [r * compute for r in kernels[table]["flops_per_s"]]
    for curve in kernels["attention"]:
        curve["flops_per_s"] = [r * compute for r in curve["flops_per_s"]]
    for bandwidth in ("hbm_bandwidth", "hbm_sustained"):
        if bandwidth in data["device"]:
            data["device"][bandwidth] *= compute
    for link in data["links"].values():
        link["bandwidth_per_direction"] *= comm
        link.pop("bandwidth_bidirectional", None)
        if "alltoall" in link:
            link["alltoall"]["bandwidth_per_direction"] *= comm
    return parse_profile(data, f"{profile.name} scaled", field="--fit-profile")


def most_compute(profile: HardwareProfile, dtype: str = "bf16") -> float:
    """The largest compute factor that keeps every published rate at or below the dense peak."""
    kernels = profile.kernels
    assert kernels is not None
    fastest = max([*kernels.gemm.flops_per_s, *(r for c in kernels.attention for r in c.flops_per_s)])
    factor = profile.device.peak_flops.get(dtype, fastest) / fastest
    fp8_peak = profile.device.peak_flops.get("fp8")
    if kernels.gemm_fp8 is not None and fp8_peak:  # the fp8 table stays under the fp8 peak too
        factor = min(factor, fp8_peak / max(kernels.gemm_fp8.flops_per_s))
    return factor


def predict(run: Run, profile: HardwareProfile | None = None) -> StepTimes:
    """The step model for ``run``, on its own profile or on ``profile``."""
    return evaluate_step(Job.of(**run.values, _profile=profile)).step


def _groups(step: StepTimes) -> tuple[float, float, float]:
    compute = sum(getattr(step.breakdown, k) for k in COMPUTE)
    comm = sum(getattr(step.breakdown, k) for k in COMM)
    return compute, comm, step.time_s - compute - comm


def fit_factors(runs: list[Run], base: HardwareProfile) -> tuple[float, float]:
    """(compute, comm) factors for ``base`` from ``runs`` (see the module's docstring)."""
    rows = np.array([[*_groups(predict(r, base)), r.measured_s] for r in runs])
    compute, comm, rest, measured = rows.T
    target = 1 - rest / measured
    both = np.stack([compute / measured, comm / measured], axis=1)
    inverse = None
    if len(runs) >= 3 and np.ptp(comm / (compute + comm)) > 0.02:
        (a, b), *_ = np.linalg.lstsq(both, target, rcond=None)
        if a > 0 and b > 0 and all(FACTOR_RANGE[0] <= 1 / x <= FACTOR_RANGE[1] for x in (a, b)):
            inverse = (float(a), float(b))
    if inverse is None:  # communication as the profile has it; compute alone from the runs
        a = float(np.dot(both[:, 0], target - both[:, 1]) / np.dot(both[:, 0], both[:, 0]))
        inverse = (a, 1.0)
    speed = min(1 / inverse[0], most_compute(base))
    return float(np.clip(speed, *FACTOR_RANGE)), float(np.clip(1 / inverse[1], *FACTOR_RANGE))


def calibrate(runs: list[Run], base: HardwareProfile) -> dict[str, Any]:
    """Factors from every run, each run's error with them, and the leave-one-out error of each."""
    if not runs:
        raise InputError("LOG", "no runs to fit")
    compute, comm = fit_factors(runs, base)
    fitted = scaled_profile(base, compute, comm)
    rows = []
    for i, run in enumerate(runs):
        before = predict(run, base).time_s
        after = predict(run, fitted).time_s
        row = {
            "run": run.label,
            "measured_s": run.measured_s,
            "base_predicted_s": before,
            "base_error": before / run.measured_s - 1,
            "fitted_predicted_s": after,
            "fitted_error": after / run.measured_s - 1,
        }
        others = runs[:i] + runs[i + 1 :]
        if others:
            held = scaled_profile(base, *fit_factors(others, base))
            left_out = predict(run, held).time_s
            row |= {"left_out_predicted_s": left_out, "left_out_error": left_out / run.measured_s - 1}
        rows.append(row)
    loo = [abs(r["left_out_error"]) for r in rows if "left_out_error" in r]
    return {
        "compute_factor": compute,
        "comm_factor": comm,
        "runs": rows,
        "base_median_abs_error": statistics.median(abs(r["base_error"]) for r in rows),
        "fitted_median_abs_error": statistics.median(abs(r["fitted_error"]) for r in rows),
        "left_out_median_abs_error": statistics.median(loo) if loo else None,
        "left_out_max_abs_error": max(loo) if loo else None,
        "profile": fitted,
    }


def fit_problem(result: dict[str, Any], base: HardwareProfile) -> str | None:
    """Why a fit must not become a profile, or None: a factor at the end of :data:`FACTOR_RANGE` (the runs
    do not pin it down; the fit clipped it), links above :data:`LINK_FACTOR` x the profile's, a non-finite
    number, or a median error over the fitted runs above :data:`ERROR_MAX`."""
    compute, comm = result["compute_factor"], result["comm_factor"]
    numbers = [compute, comm, result["fitted_median_abs_error"], result["base_median_abs_error"]]
    if not all(np.isfinite(numbers)):
        return "the fit is not finite; the logs' step times admit no profile"
    for name, value in (("kernel-rate", compute), ("link", comm)):
        if not FACTOR_RANGE[0] < value < FACTOR_RANGE[1]:
            return (
                f"the {name} factor reached {value:g}, the end of the range {FACTOR_RANGE[0]:g} to "
                f"{FACTOR_RANGE[1]:g}: the runs do not pin it down"
            )
    if comm > LINK_FACTOR:
        return (
            f"links x {comm:.3f} would carry more than {LINK_FACTOR:g} x {base.name}'s link rates; "
            "measure the links with nccl-tests instead (cp-plan hw from-nccl-tests)"
        )
    if result["fitted_median_abs_error"] > ERROR_MAX:
        return (
            f"the fitted profile still misses its runs by a median {result['fitted_median_abs_error']:.0%} "
            f"(more than {ERROR_MAX:.0%}): the step model does not describe these runs"
        )
    return None


def fitted_profile(result: dict[str, Any], base: HardwareProfile, name: str, date: str) -> HardwareProfile:
    """The fitted profile, its source saying which runs it was fitted to and how well it predicts."""
    profile: HardwareProfile = result["profile"]
    runs = ", ".join(r["run"] for r in result["runs"])
    loo = result["left_out_median_abs_error"]
    said = (
        f"kernel rates and HBM x {result['compute_factor']:.3f}, links x {result['comm_factor']:.3f}, "
        f"fitted to {len(result['runs'])} logged run(s): {runs}; median |error| "
        f"{result['base_median_abs_error']:.1%} before, {result['fitted_median_abs_error']:.1%} after"
        + (f", {loo:.1%} left out" if loo is not None else "")
    )
    return as_fitted(profile, base, name, "training logs", "cp-plan audit --fit-profile", said, date)


def as_fitted(
    profile: HardwareProfile, base: HardwareProfile, name: str, host: str, command: str, said: str, date: str
) -> HardwareProfile:
    """``profile`` named and sourced as a measured one: what it was fitted to (``host``), by which command,
    and how well it predicts (``said``)."""
    data = profile.model_dump(mode="python", exclude_none=True)
    data.pop("fit_residuals", None)  # they were the base's errors: a new fit earns its own
    data.pop("fit_residuals_by_layout", None)
    data["name"] = name
    data["description"] = f"{base.description} [fitted to {host}]".strip()
    data["source"] = {
        "kind": "measured",
        "url": base.source.url,
        "host": host,
        "date": date,
        "notes": f"{base.source.notes or ''} Fitted by {command}: {said}.".strip(),
    }
    return parse_profile(data, "fitted profile", field="--fit-profile")


# --- Named machine terms fitted to a table of measured runs, with k-fold cross-validation ---------------
# Each term is one field of the profile; the step reads it through the machine binding, so a fitted profile
# changes every command alike. A term is fitted only where the runs move the prediction by it.


@dataclass(frozen=True)
class Term:
    """A profile field the fit may set: where it lives, what it means, the range a fit may give it."""

    path: tuple[str, ...]
    meaning: str
    unit: str
    bounds: tuple[float, float]


TERMS: dict[str, Term] = {
    "gemm_scale": Term(
        ("kernels", "gemm_scale"), "factor on the matrix-multiply tables' rates", "1", (0.1, 2.0)
    ),
    "attention_scale": Term(
        ("kernels", "attention_scale"), "factor on the fused attention tables' rates", "1", (0.1, 2.0)
    ),
    "launch_s": Term(
        ("kernels", "launch_s"),
        "host time per kernel launch (the device waits when it is ahead)",
        "s",
        (0.0, 1e-3),
    ),
    "step_s": Term(
        ("kernels", "step_s"),
        "fixed host time per optimizer step (the framework between iterations)",
        "s",
        (0.0, 1.0),
    ),
    "intra_node_collective_efficiency": Term(
        ("links", "intra_node", "collective_efficiency"),
        "ring collectives' bus bandwidth inside a node, share of the link",
        "1",
        (0.05, 1.0),
    ),
    "inter_node_collective_efficiency": Term(
        ("links", "inter_node", "collective_efficiency"),
        "ring collectives' bus bandwidth across nodes, share of the NICs",
        "1",
        (0.05, 1.0),
    ),
}
# A term that changes which rate each multiply reads cannot be applied to bound rates: it is fitted over a
# grid of values, the runs re-bound at each.
GRID_TERMS: dict[str, tuple[Term, tuple[float, ...]]] = {
    "gemm_size_exponent": (
        Term(
            ("kernels", "gemm_size_exponent"),
            "slope of the matrix multiplies' efficiency in problem size below a 4096 edge",
            "1",
            (0.0, 0.6),
        ),
        (0.0, 0.15, 0.3, 0.45, 0.6),
    ),
}
IDENTIFIED = 1e-3  # a term that moves no run's prediction by 0.1 % anywhere in its range is not fitted


def _term(name: str) -> Term:
    return TERMS[name] if name in TERMS else GRID_TERMS[name][0]


def term_bounds(profile: HardwareProfile) -> dict[str, tuple[float, float]]:
    """Each term's range on this profile: the multiply table may be scaled up only as far as the most a
    tuned matmul reaches on the device (``device.max_matmul_flops``, [MAMF]; else its dense peak), the
    attention tables only as far as the peak (a profile above it is refused)."""
    out = {name: term.bounds for name, term in TERMS.items()}
    kernels = profile.kernels
    if kernels is not None:
        ceiling = profile.device.max_matmul_flops or profile.device.peak_flops.get("bf16")
        if ceiling:
            out["gemm_scale"] = (TERMS["gemm_scale"].bounds[0], ceiling / max(kernels.gemm.flops_per_s))
        fastest = max(max(curve.flops_per_s) for curve in kernels.attention)
        low, high = TERMS["attention_scale"].bounds
        out["attention_scale"] = (low, min(high, profile.device.table_peak / fastest))
    return out


def term_value(profile: HardwareProfile, name: str) -> float:
    node: Any = profile
    for part in _term(name).path:
        node = getattr(node, part)
    return float(node)


def with_terms(profile: HardwareProfile, terms: dict[str, float]) -> HardwareProfile:
    """``profile`` with the named terms set."""
    data = profile.model_dump(mode="python", exclude_none=True)
    for name, value in terms.items():
        *parents, leaf = _term(name).path
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return parse_profile(data, f"{profile.name} fitted", field="--fit-profile")


CHUNK = 16384  # (run, terms) pairs evaluated at once: larger arrays leave the cache and cost page faults


class FastSteps:
    """Step times of many runs at any term values, from one binding of each run: a term only scales bound
    rates and bandwidths or sets the launch cost, so the formulas are re-evaluated, not re-bound, and the
    (run, term values) pairs of a group (one CP scheme; an MoE model's runs apart) are evaluated together as
    arrays: one call of the step's formulas per group and :data:`CHUNK` pairs, however many runs and trials."""

    def __init__(self, bound: list[dict[str, Any]], base: HardwareProfile) -> None:

        self.base = {name: term_value(base, name) for name in TERMS}
        self.bounds = term_bounds(base)
        self.groups: list[tuple[dict[str, Any], str, Any]] = []
        self.group_of = np.empty(len(bound), dtype=int)  # each run's group, and its place in the group
        self.position = np.empty(len(bound), dtype=int)
        # An MoE model's step branches on its expert count (moe.per_layer, moe.twin): its runs are grouped by
        # model, where a dense model's are all one group.
        keyed: dict[tuple[str, str | None], list[int]] = {}
        for i, b in enumerate(bound):
            model = b["model"]
            keyed.setdefault((b["scheme"], model.model_dump_json() if model.experts else None), []).append(i)
        for part in keyed.values():
            first = bound[part[0]]
            values = {key: self._column([bound[i]["values"][key] for i in part]) for key in first["values"]}
            flags = {
                key: np.array([bound[i][key] for i in part], dtype=float)
                for key in ("unfused", "tp_inter", "dp_inter")
            }
            self.group_of[part], self.position[part] = len(self.groups), np.arange(len(part))
            self.groups.append((values | {"_flags": flags}, first["scheme"], first["model"]))
        self.n = len(bound)

    @staticmethod
    def _column(items: list[Any]) -> Any:
        first = items[0]
        if all(isinstance(x, (int, float)) and x == first for x in items):
            return first
        return np.array(items, dtype=float)

    def times(self, terms: Mapping[str, Any], runs: np.ndarray) -> np.ndarray:
        """Step time, seconds, of each run of ``runs`` (indices) at the term values beside it: each of ``terms``
        a number or an array as long as ``runs`` (unnamed terms at the base profile's values)."""
        value = {
            name: np.broadcast_to(np.asarray(terms.get(name, base), dtype=float), runs.shape)
            for name, base in self.base.items()
        }
        ratio = {
            name: value[name] / base if base else np.zeros(runs.shape) for name, base in self.base.items()
        }
        out = np.empty(runs.shape)
        for group in range(len(self.groups)):
            at = np.flatnonzero(self.group_of[runs] == group)
            for first in range(0, at.size, CHUNK):
                part = at[first : first + CHUNK]
                out[part] = self._group_times(
                    group,
                    runs[part],
                    {k: x[part] for k, x in value.items()},
                    {k: x[part] for k, x in ratio.items()},
                )
        return out

    def _group_times(
        self, group: int, runs: np.ndarray, value: dict[str, np.ndarray], ratio: dict[str, np.ndarray]
    ) -> np.ndarray:
        """Step times of ``runs``, all of one group, at the term values (and their ratios to the base's)
        beside them."""
        values, scheme, model = self.groups[group]
        place = self.position[runs]
        v = {k: a[place] if isinstance(a, np.ndarray) else a for k, a in values.items() if k != "_flags"}
        flags = {k: a[place] for k, a in values["_flags"].items()}
        g, a = ratio["gemm_scale"], ratio["attention_scale"]
        for key in ("F_gemm", "F_gemm_b", "F_head"):
            v[key] = v[key] * g
        attn = np.where(flags["unfused"] > 0, g, a)
        v["F_attn"], v["F_attn_bwd"] = v["F_attn"] * attn, v["F_attn_bwd"] * attn
        v["t_k"], v["t_fw"] = value["launch_s"], value["step_s"]
        intra, inter = ratio["intra_node_collective_efficiency"], ratio["inter_node_collective_efficiency"]
        v["B_tp"] = v["B_tp"] * np.where(flags["tp_inter"] > 0, inter, intra)
        v["B_dp"] = v["B_dp"] * np.where(flags["dp_inter"] > 0, inter, intra)
        # The total alone: the fit reads no term of the breakdown, and step_time_s sums them in itself.
        time_s = Evaluator(term_values(v, scheme, model))("step_time_s")
        return np.broadcast_to(time_s, runs.shape)


class Steps:
    """:class:`FastSteps` over the runs bound at each value of the grid terms, side by side (run ``i`` bound at
    the grid's ``j``-th value is its run ``j * n + i``), so trials at any grid values are evaluated together."""

    def __init__(self, bind: Any, base: HardwareProfile) -> None:
        ((name, (_, grid)),) = GRID_TERMS.items()
        self.grid_name, self.grid = name, grid
        self.start = term_value(base, name)
        self.grid_values = np.array(sorted({self.start, *grid}))
        bound = [bind(with_terms(base, {name: float(g)})) for g in self.grid_values]
        self.n = len(bound[0])
        self.fast = FastSteps([b for runs in bound for b in runs], base)
        self.bounds = self.fast.bounds
        self.base = {**self.fast.base, name: self.start}

    def times_each(self, terms: Mapping[str, Any], rows: list[np.ndarray]) -> list[np.ndarray]:
        """Step times, seconds, of a batch of trials, each at its own runs ``rows[i]``, evaluated together
        (:meth:`FastSteps.times`): each term a number or an array of one value per trial (the grid term's among the grid's values),
        unnamed terms at the base profile's values."""
        sizes = [len(r) for r in rows]
        columns = {k: np.broadcast_to(np.asarray(v, dtype=float), (len(rows),)) for k, v in terms.items()}
        grid = columns.pop(self.grid_name, np.full(len(rows), self.start))
        at = np.searchsorted(self.grid_values, grid)
        last = len(self.grid_values) - 1
        assert np.array_equal(self.grid_values[np.minimum(at, last)], grid), "a value off the grid"
        runs = np.concatenate([i * self.n + r for i, r in zip(at, rows, strict=True)])
        pairs = {k: np.repeat(c, sizes) for k, c in columns.items()}
        return np.split(self.fast.times(pairs, runs), np.cumsum(sizes)[:-1])

    def times(self, terms: Mapping[str, Any], rows: np.ndarray) -> np.ndarray:
        """Step times, seconds, of the runs ``rows`` at each of a batch of trials (:meth:`times_each`): an array
        (trials x rows)."""
        trials = max((np.size(v) for v in terms.values()), default=1)
        return np.stack(self.times_each(terms, [rows] * trials))


def _squash(u: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    lo, hi = bounds.T
    return lo + (hi - lo) / (1 + np.exp(-np.clip(u, -50, 50)))


def _unsquash(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    lo, hi = bounds.T
    share = np.clip((x - lo) / (hi - lo), 1e-6, 1 - 1e-6)
    return np.log(share / (1 - share))


def _grid(name: str, bounds: dict[str, tuple[float, float]]) -> np.ndarray:
    """Trial values across a term's range, short of its ends (where the logistic change of variable is flat)."""
    lo, hi = bounds[name]
    return np.geomspace(max(lo, hi * 1e-4) * 1.05, hi * 0.95, 13)


HUBER = 0.01  # log errors below 1 % count squared, above it as their size: the fit minimises about the MAPE


def _robust(log_error: np.ndarray) -> np.ndarray:
    """Residuals whose squares sum to twice the pseudo-Huber loss of the log errors (a smooth |error|)."""
    return np.sign(log_error) * np.sqrt(2 * (np.sqrt(log_error**2 + HUBER**2) - HUBER))


class Fits:
    """Fits of the continuous terms ``names`` run side by side, each to its own runs ``rows[i]`` at its own
    value ``grid[i]`` of the grid term: every trial of every fit is evaluated in one call
    (:meth:`Steps.times_each`)."""

    def __init__(
        self, steps: Steps, rows: list[np.ndarray], grid: list[float], measured: np.ndarray, names: list[str]
    ) -> None:
        self.steps, self.rows, self.grid, self.names = steps, rows, grid, names
        self.measured = [measured[r] for r in rows]
        self.bounds = np.array([steps.bounds[n] for n in names], dtype=float).reshape(-1, 2)

    def residuals(self, which: list[int], x: np.ndarray) -> list[np.ndarray]:
        """The robust log errors (:func:`_robust`) of each fit ``which[i]`` at its trials ``x[i]`` (trials x
        names): one array (trials x its runs) a fit."""
        trials = x.shape[1]
        terms = {n: x[:, :, j].ravel() for j, n in enumerate(self.names)}
        terms[self.steps.grid_name] = np.repeat([self.grid[i] for i in which], trials)
        times = self.steps.times_each(terms, [self.rows[i] for i in which for _ in range(trials)])
        return [
            _robust(np.log(np.stack(times[k * trials : (k + 1) * trials]) / self.measured[i]))
            for k, i in enumerate(which)
        ]


def _start(fits: Fits) -> np.ndarray:
    """Each fit's starting point off any flat region (a launch cost the device hides has no gradient): each
    term in turn at the best of a coarse grid over its range, the others where they stand (fits x names)."""
    grids = [_grid(n, fits.steps.bounds) for n in fits.names]
    start = [
        np.clip(fits.steps.base[n], grid[0], grid[-1]) for n, grid in zip(fits.names, grids, strict=True)
    ]
    x = np.tile(np.array(start, dtype=float), (len(fits.grid), 1))
    every = list(range(len(fits.grid)))
    for j, grid in enumerate(grids):
        trials = np.repeat(x[:, None, :], 1 + len(grid), axis=1)
        trials[:, :, j] = np.column_stack([x[:, j], np.tile(grid, (len(x), 1))])
        for i, errors in enumerate(fits.residuals(every, trials)):
            scores = [float(e @ e) for e in errors]
            x[i, j] = trials[i, min(range(len(scores)), key=scores.__getitem__), j]
    return x


def fit_terms(
    steps: Steps, runs: list[np.ndarray], measured: np.ndarray, names: list[str], iterations: int = 60
) -> list[dict[str, float]]:
    """The terms ``names`` fitted to each of ``runs`` (a list of run indices each; ``measured``: every run's
    time): a grid term at the best of its values, the continuous terms fitted at each
    (:func:`fit_continuous`); every fit at every grid value run side by side."""
    continuous = [n for n in names if n in TERMS]
    grid = list(steps.grid) if steps.grid_name in names else [steps.start]
    fits = Fits(steps, [rows for rows in runs for _ in grid], grid * len(runs), measured, continuous)
    terms, scores = fit_continuous(fits, iterations)
    out = []
    for first in range(0, len(fits.grid), len(grid)):
        best = min(range(first, first + len(grid)), key=scores.__getitem__)
        grid_term = {steps.grid_name: fits.grid[best]} if steps.grid_name in names else {}
        out.append(terms[best] | grid_term)
    return out


def fit_continuous(fits: Fits, iterations: int = 60) -> tuple[list[dict[str, float]], list[float]]:
    """Each fit's terms minimising its runs' robust log error (:func:`_robust`, Levenberg-Marquardt from
    :func:`_start`, each term kept in its range by a logistic change of variable), and that error's sum of
    squares. An iteration evaluates, for every fit still running, its trial point and the finite-difference
    Jacobian there in one call: when the step is taken, the next iteration's Jacobian is at hand."""
    names, bounds = fits.names, fits.bounds
    nudge = np.vstack([np.zeros(len(names)), np.eye(len(names)) * 1e-4])  # the point, then each term moved

    def at(which: list[int], points: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        errors = fits.residuals(which, _squash(points[:, None, :] + nudge, bounds))
        return [(e[0], (e[1:] - e[0]).T / 1e-4) for e in errors]

    u = _unsquash(_start(fits), bounds)
    every = list(range(len(u)))
    r, jac = (list(x) for x in zip(*at(every, u), strict=True))
    damping = np.full(len(u), 1e-2)
    running = every if names else []
    for _ in range(iterations):
        if not running:
            break
        step = {}
        for i in running:
            normal = jac[i].T @ jac[i]
            step[i] = np.linalg.solve(
                normal + damping[i] * np.diag(np.diag(normal) + 1e-12), -jac[i].T @ r[i]
            )
        tried = at(running, np.array([u[i] + step[i] for i in running]))
        still = []
        for i, (trial, trial_jac) in zip(running, tried, strict=True):
            if trial @ trial < r[i] @ r[i]:
                u[i], r[i], jac[i], damping[i] = u[i] + step[i], trial, trial_jac, damping[i] / 3
                if np.max(np.abs(step[i])) < 1e-6:
                    continue
            else:
                damping[i] *= 4
                if damping[i] > 1e8:
                    continue
            still.append(i)
        running = still
    terms = [dict(zip(names, (float(x) for x in _squash(point, bounds)), strict=True)) for point in u]
    return terms, [float(e @ e) for e in r]


def identified(steps: Steps, rows: np.ndarray, candidates: list[str]) -> list[str]:
    """The terms that move some run's prediction somewhere in their range: the others the runs cannot pin
    down (no run crosses nodes, no run uses a fused attention kernel, ...)."""
    base = steps.times({}, rows)[0]

    def moves(name: str) -> bool:
        trials = steps.grid if name == steps.grid_name else _grid(name, steps.bounds)
        return bool(np.any(np.max(np.abs(steps.times({name: trials}, rows) / base - 1), axis=1) > IDENTIFIED))

    return [name for name in candidates if moves(name)]


@dataclass(frozen=True)
class CrossValidation:
    """Each run's prediction by the fit that did not see it, and each fold's fitted terms."""

    held_s: np.ndarray
    fold_terms: list[dict[str, float]]
    fold_mape: list[float]

    @property
    def mape(self) -> float:
        return float(np.mean(self.fold_mape))

    @property
    def standard_error(self) -> float:
        return float(np.std(self.fold_mape, ddof=1) / np.sqrt(len(self.fold_mape)))


def cross_validate(
    steps: Steps, measured: np.ndarray, rows: np.ndarray, names: list[str], folds: int, seed: int = 0
) -> CrossValidation:
    parts = np.array_split(np.random.default_rng(seed).permutation(rows), folds)
    fold_terms = fit_terms(steps, [np.setdiff1d(rows, part) for part in parts], measured, names)
    held = np.empty(steps.n)
    fold_mape = []
    for part, terms in zip(parts, fold_terms, strict=True):
        held[part] = steps.times(terms, part)[0]
        fold_mape.append(float(np.mean(np.abs(held[part] / measured[part] - 1))))
    return CrossValidation(held, fold_terms, fold_mape)


def kfold_fit(
    steps: Steps,
    measured: np.ndarray,
    rows: np.ndarray,
    folds: int,
    candidates: list[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit on all ``rows`` and, by k-fold cross-validation, the error on runs each fit did not see; every
    term's spread is half the interquartile range of its fold fits.

    Terms are chosen on these runs alone, fewest first: of the terms that move the predictions, each in turn
    is dropped (kept at the base profile's value) when the held-out MAPE without it is within one standard
    error of the folds' MAPE with it, so no term is fitted that the held-out runs do not ask for."""
    if len(rows) < max(folds, 2):
        raise InputError("--folds", f"{len(rows)} single-node runs cannot be split into {folds} folds")
    moving = identified(steps, rows, candidates or [*TERMS, *GRID_TERMS])
    if not moving:
        raise InputError("--fit-profile", "no machine term moves these runs' predictions")
    names = list(moving)
    cv = cross_validate(steps, measured, rows, names, folds, seed)
    dropped = []
    for name in list(moving):
        if len(names) == 1:
            break
        trial = cross_validate(steps, measured, rows, [n for n in names if n != name], folds, seed)
        if trial.mape <= cv.mape + cv.standard_error:
            names.remove(name)
            dropped.append(name)
            cv = trial
    (final,) = fit_terms(steps, [rows], measured, names)
    spread = {
        n: float(np.subtract(*np.percentile([t[n] for t in cv.fold_terms], [75, 25])) / 2) for n in names
    }
    return {
        "terms": {
            n: {
                "value": final[n],
                "spread": spread[n],
                "unit": _term(n).unit,
                "meaning": _term(n).meaning,
                "base": steps.base[n],
            }
            for n in names
        },
        "not_fitted": [n for n in candidates or [*TERMS, *GRID_TERMS] if n not in moving],
        "not_needed": dropped,
        "folds": folds,
        "cv_errors": cv.held_s[rows] / measured[rows] - 1,
        "cv_standard_error": cv.standard_error,
        "held_out_s": cv.held_s[rows],
    }


def runs_profile(
    base: HardwareProfile,
    terms: dict[str, float],
    name: str,
    said: str,
    date: str,
    residuals: Residuals,
    by_layout: list[LayoutResiduals],
) -> HardwareProfile:
    """The base profile with fitted terms, its source saying what it was fitted to and how well it predicts,
    and its k-fold residuals, pooled and by layout class, which its step-time intervals are calibrated on."""
    fitted = with_terms(base, terms)
    profile = as_fitted(
        fitted, base, name, "measured training runs", "cp-plan audit --runs --fit-profile", said, date
    )
    return profile.model_copy(update={"fit_residuals": residuals, "fit_residuals_by_layout": by_layout})
