"""The layout search behind `cp-plan recommend`: its flags, its JSON section, its table and its exports.

With --gpus, `recommend` answers with the fastest plan of the job that fits (:mod:`costmodel.training.search`)
and shows the CP window at that plan's TP and PP (:mod:`costmodel.training.recommend`); without it, the window at
the stated --tp and --pp. This module runs the search and draws its ranking."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any

from costmodel.cli.options import NOTES, console, house_table, searched, whole
from costmodel.core.errors import InputError
from costmodel.core.intervals import DEFAULT_LEVEL
from costmodel.core.units import si
from costmodel.plans import cp as registry
from costmodel.plans.inputs import PlanInputs, TrainingSetup
from costmodel.plans.job import Job, StepSetup

if TYPE_CHECKING:
    from costmodel.plans.uncertainty import FitMargin

TpOpt = searched(TrainingSetup, "tp", "searched with --gpus, else 1")
PpOpt = searched(TrainingSetup, "pp", "searched with --gpus, else 1")
CpOpt = searched(PlanInputs, "cp", "searched", names=("--cp",))
VppOpt = searched(StepSetup, "vpp", "searched")
MicroOpt = searched(StepSetup, "micro_batch", "1, 2, 4, 8 searched")
GlobalOpt = searched(StepSetup, "global_batch", "4M tokens' worth, at least 1")
RecomputeOpt = searched(TrainingSetup, "recompute", "searched with --gpus, else selective")
GemmDtypeOpt = searched(StepSetup, "gemm_dtype", "--dtype, in every plan")
SchemeOpt = searched(StepSetup, "cp_scheme", "searched")
LayoutOpt = searched(PlanInputs, "layout", "searched")
TopOpt = Annotated[int, whole("--top", low=1, high=50, help="Plans shown side by side.")]


def run_search(
    job: Job,
    fixed: dict[str, Any],
    global_batch: int | None,
    top: int,
    level: float = DEFAULT_LEVEL,
    *,
    margin: FitMargin | None = None,
) -> dict[str, Any]:
    """The search's JSON section: the top plans of ``job``'s GPUs, workload and framework with their intervals
    at ``level``, the pick and the rule that decided it, why each other lost, and the pick's sensitivity. With
    ``margin`` (``--confidence``), a plan fits when it fits with that probability: the search and its what-ifs
    plan within usable memory less the margin, and each plan's chance to fit is read against the device."""
    from costmodel.training.choice import choose, searched_pick
    from costmodel.training.search import (
        PLAN_KEYS,
        Constraints,
        SearchResult,
        TooManyPlans,
        check_constraints,
        default_global_batch,
        sensitivity,
        why_lost,
    )

    constraints = Constraints(**fixed)
    check_constraints(job.model, job.gpus, job.inputs.seq, constraints)
    batch = global_batch or default_global_batch(job.inputs.seq)
    planned = job if margin is None else margin.planned(job)
    try:
        found, choice = searched_pick(job, batch, constraints, top, level, margin=margin)
    except TooManyPlans:  # a bound of the work: refused, one line
        raise
    except InputError as exc:  # the step cannot be timed here (a profile without kernel tables, say)
        found = SearchResult([], 0, 0, batch, empty_reason=f"{exc.flag}: {exc.message}")
        choice = choose(found.plans, job, batch, level)
    plans = found.plans
    for plan in plans[1:]:
        plan["why_lost"] = why_lost(plan, plans[0])
    return {
        "gpus": job.gpus,
        "gemm_dtype": job.step.gemm_dtype,
        "global_batch": batch,
        "global_batch_given": global_batch is not None,
        "framework": job.framework.name,
        "constraints": constraints.given(),
        "considered": found.considered,
        "fit": found.fits,
        "plans": plans,
        "choice": choice,
        "sensitivity": sensitivity(plans[0], planned, batch, constraints, found) if plans else [],
        "confidence": None if margin is None else margin.as_dict(job.device_memory_bytes),
        "empty_reason": found.empty_reason,
        "notes": found.notes,
        "pick": {k: plans[0][k] for k in PLAN_KEYS} if plans else None,
    }


def _ms(value: float) -> str:
    ms = value * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


LAYOUT_SHORT = {"zigzag": "zz", "striped": "st", "contiguous": "ct"}


PLAN_COLUMNS = ("layout", "mb", "CP", "rc")  # what plan_cells gives
CELLS_KEY = (
    "layout: TPxCPxPPxDP (eN: EP N); mb: micro-batch; rc: recompute; PP 2v4: 2 stages of 4 virtual; zz zigzag, "
    "st striped, ct contiguous"
)


def plan_cells(plan: dict[str, Any]) -> tuple[str, str, str, str]:
    """A plan in four narrow cells (:data:`PLAN_COLUMNS`): layout, micro-batch, CP scheme, recompute."""
    from costmodel.training.search import layout_name

    scheme = "-" if plan["cp"] == 1 else plan["cp_scheme"]
    kind = registry.get(plan["cp_scheme"]) if plan["cp"] > 1 else None
    if kind and kind.hybrid:
        scheme = f"{kind.name}{plan['cp_ulysses']}x{plan['cp_ring']}"
    if kind and not kind.whole_sequence:
        scheme += "/" + LAYOUT_SHORT[plan["layout"]]
    return (
        layout_name(plan),
        str(plan["micro_batch"]),
        scheme,
        {"selective": "sel"}.get(plan["recompute"], plan["recompute"]),
    )


def render_search(data: dict[str, Any]) -> None:
    """The ranking under the screen's answer: the top plans side by side, why each lost, the sensitivity."""
    from rich.text import Text

    from costmodel.training.search import layout_name

    out = console()
    out.print()
    title = (
        f"Layout search: {data['considered']:,} plans of the job ({data['framework']} plans, global batch "
        f"{data['global_batch']:,} sequences), {data['fit']:,} fit"
    )
    out.print(Text(title, style="bold"))
    for note in data.get("notes", []):
        out.print(Text(note, style="dim"))
    sure = data.get("confidence")
    if sure is not None:
        out.print(
            f"fits at {sure['level']:.0%} or more: each plan within {si(sure['planned_bytes'], 'B', 3)} a device, "
            f"{1 - 1 / sure['margin']:.1%} under usable memory (the margin read on {sure['from']})"
        )
    if not data["plans"]:
        out.print(Text(f"no plan: {data['empty_reason']}", style="bold red"))
        return
    table = house_table(padding=(0, 1), collapse_padding=True)
    for name in (
        "#",
        *PLAN_COLUMNS,
        "step s",
        "MFU",
        "GB",
        "xTP",
        "xCP",
        "xPP",
        "xDP",
    ):
        wide = max(len(layout_name(plan)) for plan in data["plans"]) if name == "layout" else None
        table.add_column(name, justify="left" if name in {"CP", "rc"} else "right", min_width=wide)
    for i, plan in enumerate(data["plans"], 1):
        exposed = plan["exposed_s"]
        table.add_row(
            f"{i}≈" if plan.get("cannot_order_with_pick") else str(i),
            *plan_cells(plan),
            f"{plan['step_time_s']:.4g}",
            f"{plan['mfu']:.0%}",
            f"{plan['memory_bytes'] / 1e9:.0f}",
            *(_ms(exposed[k]) for k in ("TP", "CP", "PP", "DP")),
        )
    out.print(table)
    out.print(
        f"{CELLS_KEY}; MFU: attention counted over the mask's pairs (causal: half the S² square); GB: memory "
        "on the most loaded stage; xTP..xDP: ms of communication left exposed per step (xPP with the pipeline "
        "bubble)",
        style="dim",
    )
    choice = data["choice"]
    spread = choice["order_spread"]
    out.print(
        f"#1 picked: {choice['rule']}"
        + (
            f"; ≈: cannot be ordered against #1 at {choice['level']:.0%} (predicted within "
            f"{math.exp(spread) - 1:.1%}: the spread of {choice['order_spread_from']})"
            if spread is not None
            else f"; too few measured layouts of one job to order plans at {choice['level']:.0%}"
        )
    )
    for i, plan in enumerate(data["plans"][1:], 2):
        out.print(f"#{i} {plan['why_lost']}")
    for item in data["sensitivity"]:
        out.print(f"if    {item['change']}: {item['text']}")


def export(data: dict[str, Any], fmt: str, inputs: PlanInputs, setup: TrainingSetup) -> str:
    """The pick as Megatron-LM arguments or torchtitan TOML; no plan is a one-line error."""
    from costmodel.training.export import (
        MEGATRON_VERSION,
        TORCHTITAN_VERSION,
        megatron_arguments,
        torchtitan_tables,
    )

    if not data["plans"]:
        reason = data["empty_reason"] or "no plan"
        named = [f"--{k.replace('_', '-')}" for k in data["constraints"]]
        blamed = next(
            (flag for flag in named if f"{flag} (plans fit" in reason or f"{flag}," in reason), None
        )
        if reason.startswith("--"):  # the search could not run: its own error names the flag
            blamed, _, reason = reason.partition(": ")
        raise InputError(blamed or "--gpus", f"nothing to export: {reason}")
    if setup.finetune != "full":  # neither pretraining entry point trains adapters
        raise InputError(
            "--finetune",
            f"{MEGATRON_VERSION}'s pretrain_gpt.py and {TORCHTITAN_VERSION} train every weight: a LoRA plan has "
            "no export there (NeMo's and torchtune's PEFT recipes take one)",
        )
    plan = data["plans"][0]
    if fmt == "megatron":
        NOTES.append(f"cp-plan: note: arguments as {MEGATRON_VERSION} declares them")
        return megatron_command(
            megatron_arguments(plan, inputs.seq, data["global_batch"], setup.zero, setup.zero_shard)
        )
    tables = torchtitan_tables(plan, inputs.seq, data["global_batch"], setup.zero, setup.zero_shard)
    return f"# {TORCHTITAN_VERSION} job file (later releases configure a job in Python)\n" + toml(tables)


def megatron_command(args: list[str]) -> str:
    """One argument per line, as launch scripts write them."""
    lines, current = [], []
    for token in args:
        if token.startswith("--") and current:
            lines.append(" ".join(current))
            current = []
        current.append(token)
    lines.append(" ".join(current))
    return " \\\n".join(lines) + "\n"


def toml(tables: dict[str, dict[str, Any]]) -> str:
    """TOML tables of plain values (a torchtitan job file's), each followed by a blank line."""
    text = []
    for name, table in tables.items():
        text.append(f"[{name}]")
        text += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
        text.append("")
    return "\n".join(text)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)
