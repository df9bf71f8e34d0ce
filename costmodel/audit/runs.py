"""Measured training runs as data: a table of runs, each predicted by the step model and held against its
measured iteration time, with the error over the table and by group (docs/audit.md, "Measured runs").

One row is one run: the model (a preset, a YAML or config.json, or its shape as columns), the parallel
layout, the batch, recompute and precision, and what was measured. Columns take the names below or the
header of the vTrain dataset ([vTrain]) exactly as it is; a column the table lacks takes the value of
``--assume COLUMN=VALUE`` or the step's default, and the report says which were assumed. A row given by its
shape is a GPT model as Megatron-LM builds it: GeLU MLP of 4 x hidden, tied embeddings, the GPT-2
vocabulary (50,257 tokens) and dropout.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import ValidationError

from costmodel.audit.logs import STEP_MS
from costmodel.core.errors import InputError
from costmodel.core.intervals import DEFAULT_LEVEL, LayoutResiduals, Residuals
from costmodel.core.tables import GOAL, errors_summary, read_csv
from costmodel.core.units import parse_integer, parse_number
from costmodel.machines.profiles import HardwareProfile, load_profile
from costmodel.plans import cp as registry
from costmodel.plans.bind import call, layer_shape
from costmodel.plans.cp import TRAINING
from costmodel.plans.job import Job
from costmodel.plans.models import ModelPreset, load_model
from costmodel.training.report import StepReport
from costmodel.training.step import bind, evaluate_step

SCHEMA = "cp-plan/runs/v3"  # v2: a miss names its component by the step's breakdown key (matmul_s, ...); v3: runs.interval_coverage and each row's inside_interval
LARGE_MISS = GOAL  # |error| beyond which a row's miss is explained by component
MAX_ROWS = (
    2_000  # each run is a job and a step evaluated, ~5 ms of CPU; vTrain's single-node table holds 1,440
)
# A fit evaluates the step over every fold's and grid value's trials and predicts each run before and after
# it: 8.3 s of CPU here for 162 runs, 9.2 s for 200; `audit --fit-profile` takes what it answers in ~10 s.
MAX_FIT_RUNS = 200
GPT_VOCAB = 50257  # the GPT-2 tokenizer's, as Megatron-LM's GPT examples use


def boolean(text: str) -> bool:
    """true/false (also yes/no, on/off, 1/0), as a column or ``--assume`` states a switch."""
    word = text.strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(text)


def integer(text: str) -> int:
    """A count as a flag reads one (:func:`parse_integer`): ASCII digits, not ``1_024``, ``+8`` or ``8.0``."""
    return parse_integer(text, "")


def number(text: str) -> float:
    """A number as a flag reads one (:func:`parse_number`): a finite decimal, not ``1_00``, ``nan`` or ``inf``."""
    return parse_number(text, "")


EXPECTED = {
    integer: "a whole number",
    number: "a finite number in decimal",
    boolean: "true or false",
    str: "text",
}

# column: (type, what it holds). Every name is also accepted with spaces for underscores.
COLUMNS: dict[str, tuple[Callable[[str], Any], str]] = {
    "label": (str, "a name for the run (default: its row number)"),
    "model": (str, "model preset, YAML or config.json (else give hidden, heads, layers)"),
    "hidden": (integer, "hidden size"),
    "heads": (integer, "attention heads"),
    "kv_heads": (integer, "key/value heads (default: heads)"),
    "layers": (integer, "transformer layers"),
    "ffn_hidden": (integer, "MLP inner size (default: 4 x hidden)"),
    "vocab": (int, f"vocabulary (default: {GPT_VOCAB:,})"),
    "seq": (integer, "sequence length, tokens"),
    "gpus": (integer, "accelerators in the job"),
    "tp": (integer, "tensor-parallel degree"),
    "cp": (integer, "context-parallel degree (default 1)"),
    "pp": (integer, "pipeline-parallel degree (default 1)"),
    "vpp": (integer, "virtual pipeline stages (default 1)"),
    "dp": (integer, "data-parallel degree, checked against gpus / (tp x cp x pp)"),
    "micro_batch": (integer, "sequences per micro-batch"),
    "global_batch": (integer, "sequences per optimizer step"),
    "recompute": (str, "none, selective or full (default none)"),
    "precision": (str, "bf16 or fp16 (default bf16); fp16 reduces fp16 gradients, bf16 fp32 ones"),
    "attention_kernel": (str, "flash or unfused (default flash)"),
    "dp_overlap": (number, "share of the gradient reduction overlapped with the backward (default 1)"),
    "sequence_parallel": (boolean, "true or false: sequence parallelism with TP (default: on where TP > 1)"),
    "cp_scheme": (str, f"{registry.listed(TRAINING)} (default {registry.default(TRAINING).name})"),
    "zero": (integer, "ZeRO stage 0-3 (default: the framework profile's)"),
    "hw": (str, "hardware profile of the run (default --hw)"),
    "framework": (
        str,
        "framework profile of the run (default megatron): its host time per kernel and defaults",
    ),
    "iteration_ms": (number, "measured time per iteration, ms"),
    "iteration_s": (number, "measured time per iteration, s"),
    "tokens_per_s": (number, "measured tokens per second, whole job"),
    "params_b": (number, "parameters, billions (stated; the model's own count is used)"),
}
# vTrain's headers (data/ground_truth_single.csv and ground_truth_multi.csv), lower-cased.
ALIASES = {
    "# gpus": "gpus",
    "global batch": "global_batch",
    "micro batch": "micro_batch",
    "hidden size": "hidden",
    "attention heads": "heads",
    "# layers": "layers",
    "sequence length": "seq",
    "tensor parallelism": "tp",
    "data parallelism": "dp",
    "pipeline parallelism": "pp",
    "iteration time (ms)": "iteration_ms",
    "parameters (billion)": "params_b",
}
MEASURED = ("iteration_ms", "iteration_s", "tokens_per_s")
STEP_KEYS = ("seq", "gpus", "tp", "cp", "pp", "vpp", "micro_batch", "global_batch", "recompute")
STEP_KEYS += ("attention_kernel", "dp_overlap", "cp_scheme", "zero", "sequence_parallel", "framework")


@dataclass(frozen=True)
class MeasuredRun:
    """One row: the step's keyword values (``cp-plan step``'s flags), its model and its measured step time."""

    label: str
    values: dict[str, Any]
    model: ModelPreset
    measured_s: float
    where: str = ""  # the table and line it was read from, for a value the step refuses
    assumed: tuple[str, ...] = ()  # the columns --assume gave it


@dataclass
class RunTable:
    """The runs of one table and what was assumed for the columns it lacks."""

    path: str
    runs: list[MeasuredRun]
    assumed: dict[str, str] = field(default_factory=dict)


def _column(name: str) -> str:
    key = name.strip().lower()
    return ALIASES.get(key, key.replace(" ", "_"))


def parse_assumptions(items: Iterable[str]) -> dict[str, str]:
    """``--assume COLUMN=VALUE`` pairs, each a known column, each given once."""
    out: dict[str, str] = {}
    for item in items:
        column, sep, value = item.partition("=")
        column = _column(column)
        if not sep or not value.strip():
            raise InputError("--assume", f"{item!r} is not COLUMN=VALUE, e.g. recompute=full")
        if column not in COLUMNS:
            raise InputError("--assume", f"unknown column {column!r}; columns: {', '.join(COLUMNS)}")
        if out.get(column, value.strip()) != value.strip():
            raise InputError("--assume", f"{column} is given twice, {out[column]!r} and {value.strip()!r}")
        kind = COLUMNS[column][0]
        try:
            kind(value.strip())
        except ValueError:  # read as the table's cells are
            raise InputError(
                "--assume", f"{column} is {value.strip()[:20]!r}, expected {EXPECTED[kind]}"
            ) from None
        out[column] = value.strip()
    return out


def _typed(column: str, text: str, where: str) -> Any:
    kind = COLUMNS[column][0]
    try:
        value = kind(text.strip())
    except ValueError:  # InputError too: a number read as a flag reads it
        raise InputError(
            "--runs", f"{where}: column {column} is {text[:20]!r}, expected {EXPECTED[kind]}"
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError("--runs", f"{where}: column {column} is {text!r}, expected a finite number")
    return value


def _gpt(row: dict[str, Any], where: str) -> ModelPreset:
    """A GPT model as Megatron-LM builds it, from the row's shape columns."""
    missing = [c for c in ("hidden", "heads", "layers") if c not in row]
    if missing:
        raise InputError("--runs", f"{where}: give a model column or {', '.join(missing)}")
    hidden, heads = row["hidden"], row["heads"]
    if heads < 1 or hidden % heads:
        raise InputError("--runs", f"{where}: heads {heads} must divide hidden {hidden}")

    try:
        return ModelPreset(
            name=f"gpt-{hidden}x{row['layers']}",
            source="shape from the runs table: a GPT layer as Megatron-LM builds it",
            heads=heads,
            kv_heads=row.get("kv_heads", heads),
            head_dim=hidden // heads,
            layers=row["layers"],
            hidden=hidden,
            ffn_hidden=row.get("ffn_hidden", 4 * hidden),
            vocab=row.get("vocab", GPT_VOCAB),
            gated_mlp=False,
            tied_embeddings=True,
            dropout=True,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError("--runs", f"{where}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


# A measured step takes from a microsecond to a day, as a logged one does (costmodel.audit.logs).
STEP_S = (STEP_MS[0] / 1e3, STEP_MS[1] / 1e3)
AGREE = 0.01  # two measured columns of one row must give the same step time to 1 %


def _seconds(column: str, row: dict[str, Any]) -> float:
    """The step time a measured column states."""
    value = row[column]
    if column == "iteration_ms":
        return value / 1e3
    if column == "tokens_per_s":
        return row["global_batch"] * row["seq"] / value if value > 0 else 0.0
    return value


def _measured_s(row: dict[str, Any], where: str) -> float:
    """The row's measured step time: one value, however many columns state it, from 1 µs to one day."""
    stated = {column: _seconds(column, row) for column in MEASURED if column in row}
    if not stated:
        raise InputError("--runs", f"{where}: no measured column ({', '.join(MEASURED)})")
    (first, seconds), *others = stated.items()
    for other, value in others:
        if abs(value - seconds) > AGREE * max(abs(value), abs(seconds)):
            raise InputError(
                "--runs",
                f"{where}: column {first} gives a step of {seconds:.6g} s and column {other} {value:.6g} s; "
                "the measured time must be stated once, or agree to 1 %",
            )
    if not STEP_S[0] <= seconds <= STEP_S[1]:
        raise InputError(
            "--runs",
            f"{where}: column {first}: a step of {seconds:.6g} s; a measured step takes from 1 µs to one day",
        )
    return float(seconds)


def read_runs(path: str, assume: dict[str, str] | None = None, hw: str | None = None) -> RunTable:
    """The runs of a CSV table (see the module's docstring), every value checked with its row named."""

    assume = assume or {}
    columns, rows = _csv_rows(path)
    stated = sorted(set(assume) & set(columns))
    if stated:  # the table's own value would silently win
        raise InputError("--assume", f"{', '.join(stated)}: a column of {path}; --assume gives one it lacks")
    models: dict[str, ModelPreset] = {}
    profiles: set[str] = set()
    runs = []
    for line, cells in rows:
        where = f"{path} line {line}"
        row = {c: _typed(c, text, where) for c, text in {**assume, **cells}.items() if text.strip()}
        spec = row.get("model")
        if spec is not None and spec not in models:
            models[spec] = _named(load_model, spec, where, _from("model", assume))
        if "hw" in row and row["hw"] not in profiles:
            _named(load_profile, row["hw"], where, _from("hw", assume))  # checked where its row is known
            profiles.add(row["hw"])
        model = models[spec] if spec is not None else _gpt(row, where)
        label = str(row.get("label", f"line {line}"))
        values, measured = _step_values(row, where, hw), _measured_s(row, where)
        runs.append(MeasuredRun(label, values, model, measured, where, tuple(assume)))
    return RunTable(path, runs, assume)


def _from(column: str, assume: dict[str, str]) -> str:
    return f"{column} (from --assume)" if column in assume else column


def _named(load: Callable[[str], Any], spec: str, where: str, column: str) -> Any:
    """A model or profile a row names, loaded; what is wrong with it named by its row and column."""
    try:
        return load(spec)
    except InputError as exc:
        raise InputError("--runs", f"{where}: column {column}: {exc.message}") from None


def _csv_rows(path: str) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The table's columns, and each run's line number and cells by column."""

    def known(header: list[str]) -> None:
        unknown = [name for name in header if _column(name) not in COLUMNS]
        if unknown:
            shown = ", ".join(repr(name[:40]) for name in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise InputError(
                "--runs",
                f"{path}: unknown column(s) {shown} in its first line, the header; see docs/audit.md",
            )

    header, cells = read_csv(path, "--runs", "runs", MAX_ROWS, check_header=known)
    columns = [_column(name) for name in header]
    return columns, [(number, _cells(columns, row, f"{path} line {number}")) for number, row in cells]


def _cells(columns: list[str], cells: list[str], where: str) -> dict[str, str]:
    """One row's cells by column; a column the header names twice (``iteration_ms`` and vTrain's
    ``Iteration time (ms)``) must hold the same value in both places."""
    row: dict[str, str] = {}
    place: dict[str, int] = {}
    for index, (column, cell) in enumerate(zip(columns, cells, strict=True), start=1):
        if column in row and row[column].strip() != cell.strip():
            raise InputError(
                "--runs",
                f"{where}: column {column} is given twice, {row[column].strip()!r} in column {place[column]} "
                f"and {cell.strip()!r} in column {index}; give it once",
            )
        row.setdefault(column, cell)
        place.setdefault(column, index)
    return row


def _step_values(row: dict[str, Any], where: str, hw: str | None) -> dict[str, Any]:
    """The step's inputs of one run, checked: the parallel degrees against the GPUs, the precision."""
    missing = [c for c in ("seq", "gpus", "tp", "micro_batch", "global_batch") if c not in row]
    if missing:
        raise InputError("--runs", f"{where}: missing {', '.join(missing)}")
    degrees = row["tp"] * row.get("cp", 1) * row.get("pp", 1)
    if "dp" in row and row["dp"] * degrees != row["gpus"]:
        raise InputError(
            "--runs", f"{where}: tp x cp x pp x dp = {row['dp'] * degrees} is not the {row['gpus']} GPUs"
        )
    precision = row.get("precision", "bf16")
    if precision not in ("bf16", "fp16"):
        raise InputError("--runs", f"{where}: precision {precision!r}; give bf16 or fp16")
    values = {k: row[k] for k in STEP_KEYS if k in row}
    run_hw = row.get("hw", hw)
    if run_hw is None:
        raise InputError("--hw", "give the runs' hardware profile (or an hw column)")
    return values | {"hw": run_hw, "dtype": precision, "grad_bytes": 2 if precision == "fp16" else 4}


class Profiles:
    """Each named profile loaded once (many runs share one; reading a profile's YAML is the slow part)."""

    def __init__(self, override: HardwareProfile | None = None) -> None:
        self.override = override
        self.loaded: dict[str, HardwareProfile] = {}

    def __call__(self, name: str) -> HardwareProfile:
        if self.override is not None:
            return self.override
        if name not in self.loaded:
            self.loaded[name] = load_profile(name)
        return self.loaded[name]


def run_job(run: MeasuredRun, profiles: Profiles) -> Job:
    """The training job a row of the table ran, on its profile (or the one ``profiles`` puts in its place).
    A value the step refuses is named by its row and column, not by a flag the user never typed."""
    profile = profiles(run.values["hw"])
    try:
        return Job.of(**run.values, _profile=profile, _model=run.model)
    except InputError as exc:
        column = exc.field.removeprefix("--").replace("-", "_")
        if column not in COLUMNS:
            raise
        said = " (from --assume)" if column in run.assumed else ""
        raise InputError("--runs", f"{run.where}: column {column}{said}: {exc.message}") from None


def predict(run: MeasuredRun, profiles: Profiles) -> StepReport:
    """The step model's report for one run."""
    return evaluate_step(run_job(run, profiles))


def bound(run: MeasuredRun, profiles: Profiles) -> dict[str, Any]:
    """One run's bound step symbols and what a fit needs to know of them (:class:`~costmodel.audit.fit.FastSteps`)."""
    at = run_job(run, profiles)
    return {
        "values": bind(at),
        "scheme": at.step.cp_scheme,
        "model": run.model,
        "unfused": at.setup.attention_kernel == "unfused",
        # the links the step reads (the gradients' over DP x CP), as bind() placed them
        "tp_inter": at.links["tp"].scope == "inter-node",
        "dp_inter": at.links["dp"].scope == "inter-node",
    }


def _params(model: ModelPreset) -> float:
    return float(call("params", layer_shape(model)))


def size_group(params: float) -> str:
    for bound, name in ((1e9, "< 1B"), (10e9, "1-10B"), (100e9, "10-100B")):
        if params < bound:
            return name
    return ">= 100B"


def spans_nodes(report: StepReport) -> bool:
    """Whether any parallel group of the run crosses the fast domain (its collectives use the NICs)."""
    groups = report.topology["groups"]
    return any(g["size"] > 1 and g["scope"] == "inter-node" for g in groups.values())


def explain(breakdown: dict[str, float], predicted: float, measured: float) -> dict[str, Any]:
    """Where a large miss most likely sits: the component whose plausible range covers it with the least of
    that range used, as ``cp-plan audit LOG`` attributes a logged run's difference."""
    from costmodel.audit.compare import attribute

    found = attribute(measured - predicted, breakdown, {}, predicted)
    return {"component": found["component"], "explanation": found["explanation"]}


def compare_row(run: MeasuredRun, report: StepReport) -> dict[str, Any]:
    """One run's measured and predicted step time, its error, groups and, for a large miss, its component."""
    predicted = report.step.time_s
    error = predicted / run.measured_s - 1
    row = {
        "label": run.label,
        "model": run.model.name,
        "params": _params(run.model),
        **{
            k: report.inputs[k]
            for k in ("seq", "gpus", "tp", "cp", "pp", "dp", "micro_batch", "global_batch")
        },
        "measured_s": run.measured_s,
        "predicted_s": predicted,
        "error": error,
        "spans_nodes": spans_nodes(report),
        "inside_interval": report.step.time_s_interval.holds(run.measured_s),
    }
    if abs(error) > LARGE_MISS:
        row["miss"] = explain(report.step.breakdown.model_dump(), predicted, run.measured_s)
    return row


# Runs of one job measured within 5 % of each other are ties: run-to-run noise, not an order to get right.
TIE = 0.05
RHO_LAYOUTS = 4  # Spearman's rho is reported for a job run in this many layouts or more: below, it is coarse
RHO_GOAL = 0.8


def spearman(measured: list[float], predicted: list[float]) -> float | None:
    """Spearman's rank correlation of two equally long lists (ties take their mean rank); None when either
    list is constant (no order to agree with)."""

    def ranks(values: list[float]) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        out = np.empty(len(values))
        out[order] = np.arange(len(values), dtype=float)
        array = np.asarray(values, dtype=float)
        for value in np.unique(array):  # ties share the mean of the ranks they span
            same = array == value
            out[same] = out[same].mean()
        return out

    a, b = ranks(measured), ranks(predicted)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def job(row: dict[str, Any]) -> tuple:
    """What a planner holds fixed while it searches layouts: the model, sequence, GPUs and global batch."""
    return row["model"], row["seq"], row["gpus"], row["global_batch"]


def ranking(rows: list[dict[str, Any]], predicted: list[float] | None = None) -> dict[str, Any] | None:
    """How well the predictions order the layouts of each job run in two or more (what a search needs of
    them): how often the run predicted fastest is the measured fastest, its measured time over the
    fastest's (the regret of trusting the prediction), and the share of pairs measured more than
    :data:`TIE` apart that the predictions put in the same order. ``predicted`` replaces the rows'
    ``predicted_s`` (held-out predictions); None when no job has two runs."""
    times = predicted if predicted is not None else [row["predicted_s"] for row in rows]
    jobs: dict[tuple, list[tuple[float, float]]] = {}
    for row, guess in zip(rows, times, strict=True):
        jobs.setdefault(job(row), []).append((row["measured_s"], guess))
    regrets, pairs, ordered, rhos = [], 0, 0, []
    for key, runs in jobs.items():
        if len(runs) < 2:
            continue
        if len(runs) >= RHO_LAYOUTS:
            rho = spearman([m for m, _ in runs], [p for _, p in runs])
            rhos.append({"job": "/".join(map(str, key)), "layouts": len(runs), "rho": rho})
        fastest = min(measured for measured, _ in runs)
        regrets.append(min(runs, key=lambda run: run[1])[0] / fastest - 1)
        for i, (m_i, p_i) in enumerate(runs):
            for m_j, p_j in runs[i + 1 :]:
                if abs(m_i - m_j) > TIE * min(m_i, m_j):
                    pairs += 1
                    ordered += (m_i < m_j) == (p_i < p_j)
    if not regrets:
        return None
    return {
        "jobs": len(regrets),
        "fastest_found": sum(r == 0 for r in regrets) / len(regrets),
        "median_regret": statistics.median(regrets),
        "max_regret": max(regrets),
        "pairs": pairs,
        "pairs_ordered": ordered / pairs if pairs else None,
        "tie": TIE,
        "spearman": _rho_summary(rhos),
    }


def _rho_summary(rhos: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Spearman's rho per job run in :data:`RHO_LAYOUTS` layouts or more: the median, the worst and how many
    fall below :data:`RHO_GOAL`; None when no job has that many."""
    values = [r["rho"] for r in rhos if r["rho"] is not None]
    if not values:
        return None
    return {
        "jobs": len(values),
        "min_layouts": RHO_LAYOUTS,
        "median": statistics.median(values),
        "min": min(values),
        "below_goal": sum(v < RHO_GOAL - 1e-9 for v in values),  # 0.8 computed as 0.79999... meets it
        "goal": RHO_GOAL,
        "per_job": sorted(rhos, key=lambda r: math.inf if r["rho"] is None else r["rho"]),
    }


GROUPS: dict[str, Callable[[dict[str, Any]], str]] = {
    "model size": lambda row: size_group(row["params"]),
    "groups span nodes": lambda row: "yes" if row["spans_nodes"] else "no",
    "pipeline": lambda row: "PP > 1" if row["pp"] > 1 else "PP = 1",
    "tensor parallel": lambda row: f"TP {row['tp']}",
}


def grouped(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The error summary of every value of every grouping."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, key in GROUPS.items():
        buckets: dict[str, list[float]] = {}
        for row in rows:
            buckets.setdefault(key(row), []).append(row["error"])
        out[name] = {value: errors_summary(errs) for value, errs in sorted(buckets.items())}
    return out


def predictions(table: RunTable, profiles: Profiles) -> list[StepReport]:
    """The step model's report for every run of ``table``."""
    return [predict(run, profiles) for run in table.runs]


def audit_runs(table: RunTable, reports: list[StepReport]) -> dict[str, Any]:
    """Every run of ``table`` compared with its prediction, the error over the table and by group."""
    rows = [compare_row(run, report) for run, report in zip(table.runs, reports, strict=True)]
    return summarise(table, rows)


def coverage(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How many measured runs lie inside their prediction's 80 % interval: the intervals checked on the
    user's own runs (None where no run had one)."""
    given = [row["inside_interval"] for row in rows if row["inside_interval"] is not None]
    if not given:
        return None
    return {"level": DEFAULT_LEVEL, "runs": len(given), "covered": sum(given) / len(given)}


def summarise(table: RunTable, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "path": table.path,
        "assumed": table.assumed,
        **errors_summary([row["error"] for row in rows]),
        "groups": grouped(rows),
        "ranking": ranking(rows),
        "interval_coverage": coverage(rows),
        "rows": rows,
    }


def check_fit_size(table: RunTable) -> None:
    """``audit --runs --fit-profile`` refuses a table past :data:`MAX_FIT_RUNS` before any run is predicted
    (a benchmark may fit more, knowing it waits)."""
    if len(table.runs) > MAX_FIT_RUNS:
        raise InputError(
            "--fit-profile",
            f"{len(table.runs):,} runs; a fit takes at most {MAX_FIT_RUNS:,} (about 10 s of CPU): fit to a "
            "sample of the table, and audit the whole of it without --fit-profile",
        )


def fit_runs(
    table: RunTable,
    base: HardwareProfile,
    folds: int,
    name: str,
    date: str,
    terms: list[str] | None = None,
    reports: list[StepReport] | None = None,
) -> dict[str, Any]:
    """Named machine terms of ``base`` fitted to the table's single-node runs by k-fold cross-validation; the
    runs whose groups span nodes are never fitted to, only predicted with the fit (how it transfers).
    ``reports`` are the runs' predictions on ``base`` where the caller has them already."""
    from costmodel.audit import fit

    if reports is None:
        reports = predictions(table, Profiles(base))
    inside = [i for i, report in enumerate(reports) if not spans_nodes(report)]
    if not inside:
        raise InputError(
            "--fit-profile", "no run stays inside one node; the fit learns from single-node runs"
        )

    def bind_all(profile: HardwareProfile) -> list[dict[str, Any]]:
        at = Profiles(profile)
        return [bound(run, at) for run in table.runs]

    steps = fit.Steps(bind_all, base)
    measured = np.array([run.measured_s for run in table.runs])
    result = fit.kfold_fit(steps, measured, np.array(inside), folds, terms)
    fitted_terms = {n: t["value"] for n, t in result["terms"].items()}
    cv = errors_summary([float(e) for e in result["cv_errors"]])
    said = (
        ", ".join(f"{n} {t['value']:.4g}" for n, t in result["terms"].items())
        + f"; fitted to {len(inside)} single-node runs of {table.path}, {folds}-fold MAPE {cv['mape']:.1%}"
    )
    held_out = np.asarray(result["held_out_s"], dtype=float)
    logs = np.log(measured[inside] / held_out).tolist()
    groups = [reports[i].topology["groups"] for i in inside]
    by_layout = LayoutResiduals.grouped(
        [(g["tp"]["size"], g["pp"]["size"], r) for g, r in zip(groups, logs, strict=True)]
    )
    profile = fit.runs_profile(base, fitted_terms, name, said, date, Residuals.of(logs), by_layout)
    fitted = Profiles(profile)
    rows = [compare_row(run, predict(run, fitted)) for run in table.runs]
    across = [row for i, row in enumerate(rows) if i not in set(inside)]
    return {
        "terms": result["terms"],
        "not_fitted": result["not_fitted"],
        "not_needed": result["not_needed"],
        "folds": folds,
        "fitted_runs": len(inside),
        "cv": cv,
        "cv_mape": cv["mape"],
        "cv_ranking": ranking([rows[i] for i in inside], [float(t) for t in result["held_out_s"]]),
        "in_sample": errors_summary([rows[i]["error"] for i in inside]),
        "transfer": errors_summary([row["error"] for row in across]) if across else None,
        "transfer_ranking": ranking(across) if across else None,
        "profile": profile,
        "rows": rows,
    }
