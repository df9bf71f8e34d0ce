"""``cp-plan step``: the whole training step's time, tokens/s, MFU and HFU, with a breakdown.

Its flags are the declarations of a training job (:mod:`costmodel.plans.job`): the workload
(:class:`~costmodel.plans.inputs.Workload`, ``--cp``, or ``--n``, the CP degree), the job's layout and memory
knobs (:class:`~costmodel.plans.inputs.TrainingSetup`), the step's own knobs (:class:`~costmodel.plans.job.StepSetup`),
the machine's changes and the framework (:class:`~costmodel.plans.job.FrameworkKnobs`); they make one Job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from costmodel.cli.options import (
    REQUIRED,
    LevelOpt,
    PriceOpt,
    TokensOpt,
    console,
    declared,
    house_table,
    interval_level,
    token_budget,
)
from costmodel.cli.output import Format, emit, format_option
from costmodel.core.errors import InputError
from costmodel.core.units import seconds, si
from costmodel.plans import cp as registry
from costmodel.plans.inputs import MachineOverrides, TrainingSetup, Workload
from costmodel.plans.job import (
    JOB_DEFAULTS,
    FrameworkKnobs,
    Job,
    StepSetup,
    make_job,
    refuse_unread_recompute,
)
from costmodel.plans.stages import StageSplit
from costmodel.training.memory import reference_cases
from costmodel.training.report import LABELS
from costmodel.training.step import evaluate_step

if TYPE_CHECKING:
    from costmodel.plans.schema import MemoryCategories
    from costmodel.training.report import StepReport


@declared(
    workload=Workload,
    setup=TrainingSetup,
    step=StepSetup,
    machine_overrides=MachineOverrides,
    knobs=FrameworkKnobs,
    defaults=JOB_DEFAULTS | {"global_batch": REQUIRED},
)
def step_cmd(
    workload: Workload,
    setup: TrainingSetup,
    step: StepSetup,
    machine_overrides: MachineOverrides,
    knobs: FrameworkKnobs,
    format: format_option("table", "json", "yaml") = Format.table,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 when the plan does not fit the device's memory.")
    ] = False,
    explain: Annotated[
        bool,
        typer.Option("--explain", help="Also print each term of the step as its formula, then with values."),
    ] = False,
    memory_reference: Annotated[
        bool,
        typer.Option(
            "--memory-reference",
            help="Also run the torch memory reference: this job's stages as real model code on fake tensors "
            "(PyTorch's MemTracker, allocating nothing), its peak and what PyTorch's caching allocator would "
            "reserve for it beside the model's (needs torch: the kernel extra; each stage is run whole, twice: "
            "8 s for an 8B job, a minute for a 405B pipeline).",
        ),
    ] = False,
    tokens: TokensOpt = None,
    price: PriceOpt = None,
    level: LevelOpt = None,
) -> None:
    """Predict one training step: time, tokens/s, model TFLOP/s per GPU, MFU, HFU and where the time goes.

    Example: cp-plan step --model llama3-8b --seq 8192 --hw h100-nvlink --gpus 8 --global-batch 16
    """
    from costmodel.cli.render import render_terms, term_rows

    trace: list | None = [] if explain else None
    budget_tokens, per_hour = token_budget(tokens, price)
    refuse_unread_recompute(setup, knobs)
    job = make_job(workload, setup, step, machine_overrides, knobs)
    result = evaluate_step(job, trace=trace, level=interval_level(level))
    if budget_tokens is not None:
        from costmodel.training.capacity import budget

        spent = budget(
            budget_tokens,
            job.inputs.seq * job.step.global_batch,
            result.step.time_s,
            job.gpus,
            per_hour,
            step_interval=result.step.time_s_interval,
        )
        result = result.model_copy(update={"budget": spent})
    data = result.model_dump(mode="json", by_alias=True)
    if trace is not None:
        data["explain"] = term_rows(trace)
    reference = _memory_reference(job) if memory_reference else None
    if reference is not None:
        data["memory"]["reference"] = reference

    def table() -> None:
        _table(result)
        if reference is not None:
            _reference_line(reference, result.memory.by_category)
        if trace is not None:
            render_terms(trace, console())

    emit(data, format, table=table)
    if strict and not result.fits:
        raise typer.Exit(1)


def _memory_reference(job: Job) -> dict:
    """The torch reference's peak of the job: the largest of its stages', as allocated bytes by category, and
    the caching allocator's reservation for that stage, replayed over two iterations (None under ZeRO-3,
    whose collectives allocate on streams of their own): each stage is run whole, not extrapolated."""
    from costmodel.cli.kernel import require_torch

    require_torch("--memory-reference")
    if job.model.mla is not None:
        raise InputError(
            "--memory-reference", "the torch reference builds GQA attention; not a latent-attention model"
        )
    from costmodel.kernel.memory import stages_peak

    where, peak = stages_peak(reference_cases(job), reserved=True)
    return {
        "total_bytes": peak.peak_bytes,
        "by_category": peak.by_category,
        "stage": where,
        "moment": peak.moment,
        "kind": "allocated",
        "reserved_bytes": peak.reserved_bytes,
    }


def _reference_line(reference: dict, model: MemoryCategories) -> None:
    allocated, reserved = model.allocated_bytes, model.reserved_bytes
    parts = ", ".join(f"{name} {si(value, 'B')}" for name, value in reference["by_category"].items() if value)
    line = (
        f"torch reference (fake tensors): {si(reference['total_bytes'], 'B')} allocated at its peak "
        f"({reference['stage']}, {reference['moment']}): {parts}; the model's {si(allocated, 'B')} is "
        f"{allocated / reference['total_bytes'] - 1:+.1%}. "
    )
    if reference["reserved_bytes"] is None:
        line += "Its reservation is not replayed under ZeRO-3 (FSDP's collectives allocate on streams of their own)."
    else:
        line += (
            f"PyTorch's caching allocator, replayed, reserves {si(reference['reserved_bytes'], 'B')}; the model's "
            f"{si(reserved, 'B')} is {reserved / reference['reserved_bytes'] - 1:+.1%}."
        )
    console().print(line)


def _label(name: str, inputs: dict) -> str:
    """A component's row label; the elementwise row says when the framework runs those ops eagerly (about 3x
    the bytes of fused kernels: --elementwise), the CP row when it moves K and V repeated to the query heads
    (h/n_kv times the bytes: --gqa)."""
    if name == "elementwise_s" and inputs.get("elementwise") == "eager":
        return "elementwise (eager torch ops)"
    if name == "exposed_cp_s" and inputs.get("gqa") == "repeat":
        return "exposed CP comm (K, V repeated)"
    return LABELS[name]


def _table(report: StepReport) -> None:

    from costmodel.cli.render import certainty_lines, changed_line, memory_line, topology_lines

    result = report.model_dump(mode="json", by_alias=True)
    step, inputs = result["step"], result["inputs"]
    split = StageSplit.of(inputs).text()
    stages = f"{split} layers, v {inputs['vpp']}" if split else f"v {inputs['vpp']}"
    scheme = ""  # CP 1 splits nothing; a whole-sequence scheme has no layout
    if inputs["cp"] > 1:
        whole = registry.get(inputs["cp_scheme"]).whole_sequence
        scheme = f" ({inputs['cp_scheme']})" if whole else f" ({inputs['cp_scheme']}, {inputs['layout']})"
    pipeline = f" ({stages})" if inputs["pp"] > 1 or inputs["vpp"] > 1 else ""
    screen = console()
    screen.print(
        f"{inputs['model']} S={inputs['seq']} on {inputs['gpus']} x {inputs['hw']}: tp {inputs['tp']}, "
        f"cp {inputs['cp']}{scheme}, pp {inputs['pp']}{pipeline}, "
        f"dp {inputs['dp']}, {inputs['micro_batches']} micro-batch{'es' if inputs['micro_batches'] != 1 else ''} "
        f"of {inputs['micro_batch']}, "
        f"recompute {inputs['recompute']}"
        + (f", offload {inputs['offload']}" if inputs.get("offload", "none") != "none" else "")
        + (f", fine-tuning {inputs['finetune']}" if inputs.get("finetune", "full") != "full" else "")
    )
    if report.changed:
        screen.print(changed_line(report.changed))
    for line in topology_lines(result["topology"]):
        screen.print(line)
    screen.print(f"kernel rates: {result['rates']['source']}")
    memory = report.memory
    screen.print(
        "memory per device at the peak: "
        + memory_line(memory.by_category, memory.bytes_per_device, memory.device_memory_bytes, memory.fits)
    )
    screen.print(
        f"step {seconds(step['time_s'])}   {step['tokens_per_s']:,.0f} tokens/s "
        f"({step['tokens_per_s_per_gpu']:,.0f} per GPU)   {step['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU   "
        f"MFU {step['mfu']:.1%} (attention over the mask's pairs, c = {step['attention_fraction']:.4g}"
        f"{_full_square(step['mfu_full_square'])})   HFU {step['hfu']:.1%}"
    )
    table = house_table(
        caption="MFU: 6·P + 12·n_L·h·d·S·c model FLOP per token, c the share of the S² square the mask keeps "
        "[PaLM]; HFU: the FLOP that run, recompute included",
    )
    for column in ("component", "time", "share"):
        table.add_column(column, justify="left" if column == "component" else "right")
    for name, value in report.step.breakdown:
        if value > 0:
            table.add_row(_label(name, inputs), seconds(value), f"{value / report.step.time_s:.1%}")
    screen.print(table)
    for line in certainty_lines(
        report.step.time_s_interval,
        memory.bytes_per_device_interval,
        memory.fits_probability,
        memory.fits,
    ):
        screen.print(line)
    if report.budget is not None:
        from costmodel.cli.render import budget_line

        screen.print("budget  " + budget_line(report.budget))


def _full_square(mfu: float | None) -> str:
    """The full-square MFU beside the headline: published MFUs count a causal mask's whole S² square. None
    for packed documents, windows and chunks, whose attention is no share of it."""
    return "" if mfu is None else f"; full S² square: {mfu:.1%}"
