"""``cp-plan infer``: memory, time to first token and time per output token of a long-context request.

Its flags are the declared inputs: the model, profile, request and serving layout of
:class:`~costmodel.inference.setup.InferenceSetup`, and the profile overrides."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from costmodel.cli.options import LevelOpt, console, declared, house_table, interval_level, whole
from costmodel.cli.output import Format, emit, format_option
from costmodel.core.errors import InputError
from costmodel.core.intervals import Interval
from costmodel.core.units import seconds, si
from costmodel.inference.report import PREFILL_LABELS
from costmodel.inference.setup import InferenceSetup
from costmodel.plans.inputs import MachineOverrides


@declared(setup=InferenceSetup, machine_overrides=MachineOverrides)
def infer_cmd(
    ctx: typer.Context,
    setup: InferenceSetup,
    machine_overrides: MachineOverrides,
    format: format_option("table", "json", "yaml") = Format.table,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 when the request does not fit the device's memory.")
    ] = False,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Also print each term of the chosen prefill (first chunk) and of decode (last token) as its "
            "formula, then with values.",
        ),
    ] = False,
    gpus: Annotated[
        Optional[int],
        whole(
            "--gpus",
            low=1,
            high=65536,
            help="Search the serving layouts of this many GPUs (TP x CP x PP, the rest as replicas) and plan "
            "with the fitting one fastest to first token; --tp, --cp and --pp are then searched, each held where "
            "given.",
        ),
    ] = None,
    level: LevelOpt = None,
) -> None:
    """Plan long-context inference: KV cache and memory per device, the prefill's CP scheme (pass-KV,
    pass-Q or all-gather) and time to first token, and the time per output token of decode.

    Example: cp-plan infer --model llama3-405b --prompt 1M --hw h100-ib --tp 8 --cp 16 --weights fp8
    """
    from costmodel.cli.render import render_terms, term_rows
    from costmodel.inference.serve import evaluate_infer

    trace: list | None = [] if explain else None
    if gpus is None:
        report = evaluate_infer(setup, machine_overrides, trace, interval_level(level)).model_dump(
            mode="json", by_alias=True
        )
    else:
        from costmodel.inference.serve import search_serving

        if explain:
            raise InputError(
                "--explain", "not with --gpus: explain one layout, named with --tp, --cp and --pp"
            )
        report = search_serving(
            setup, machine_overrides, gpus, interval_level(level), fixed=_given(ctx, setup)
        )[1].model_dump(mode="json", by_alias=True)
    if trace is not None:
        report["explain"] = term_rows(trace)

    def table() -> None:
        _table(report)
        if report.get("search") is not None:
            _search_table(report["search"])
        if trace is not None:
            render_terms(trace, console(), "The prefill and decode, term by term")

    emit(report, format, table=table)
    if strict and not report["inference"]["memory"]["fits"]:
        raise typer.Exit(1)


def _table(report: dict) -> None:

    given, out = report["inputs"], report["inference"]
    mem, pre, dec = out["memory"], out["prefill"], out["decode"]
    screen = console()
    screen.print(
        f"{given['model']} on {out['gpus']} x {given['hw']}: tp {given['tp']}, cp {given['cp']}, "
        f"pp {given['pp']}; batch {given['batch']}, prompt {given['prompt']:,} after {given['cached']:,} "
        f"cached, {given['output']:,} out; weights {given['weights']}, KV cache {given['kv_dtype']}"
        + ("" if given["attention_kernel"] == "flash" else f"; attention {given['attention_kernel']}")
        + ("; decode reads the cache per query head" if given["decode_kv_reads"] == "per-query-head" else "")
    )
    from costmodel.cli.render import changed_line, interval_text

    if report["changed"]:
        screen.print(changed_line(report["changed"]))
    fit = "fits" if mem["fits"] else "DOES NOT FIT"
    screen.print(
        f"memory per device: weights {si(mem['weight_bytes_per_device'], 'B')}, KV cache "
        f"{si(mem['kv_cache_bytes_per_device'], 'B')}, prefill working set "
        f"{si(mem['prefill_activation_bytes'], 'B')} of {si(mem['usable_bytes'], 'B')}: {fit}; "
        f"max batch {mem['max_batch']}, max context {mem['max_context_tokens']:,} tokens"
    )
    single = given["cp"] == 1  # no sequence split: no prefill scheme to choose, no CP against CP 1
    prefill = (
        f"TTFT {seconds(out['ttft_s'])} (CP 1: no prefill scheme to choose)"
        if single
        else f"TTFT {seconds(out['ttft_s'])} with {pre['scheme']} (rule: {pre['rule_scheme']}; new share "
        f"{pre['new_fraction']:.3g} vs 2·n_kv/h = {pre['passq_max_new_fraction']:.3g}, pass-KV hides from "
        f"{pre['passkv_hidden_min_new_tokens']:,.0f} new tokens)"
    )
    decode = f"TPOT {seconds(out['tpot_s'])} ({dec['tokens_per_s']:,.1f} tokens/s)"
    if not single:
        decode += "; against CP 1, CP " + (
            f"saves {seconds(dec['cp_latency_saved_s'])} per token"
            if dec["cp_latency_saved_s"] > 0
            else f"adds {seconds(dec['cp_latency_added_s'])} per token"
        )
    screen.print(f"{prefill}   {decode}")
    ttft, tpot = (Interval(**out[f"{name}_s_interval"]) for name in ("ttft", "tpot"))
    held = Interval(**mem["bytes_per_device_interval"])
    screen.print(
        f"{ttft.level:.0%} interval: TTFT {interval_text(ttft, seconds)}; TPOT "
        f"{interval_text(tpot, seconds)}; memory {interval_text(held, lambda b: si(b, 'B'))}"
    )
    table = house_table(caption="prefill" if single else "prefill, chosen scheme")
    for column in ("component", "time", "share"):
        table.add_column(column, justify="left" if column == "component" else "right")
    for name, value in pre["breakdown"].items():
        if value > 0:
            table.add_row(PREFILL_LABELS[name], seconds(value), f"{value / out['ttft_s']:.1%}")
    screen.print(table)
    if not single:
        _schemes_table(pre["schemes"])
    if out.get("fits_with") is not None:
        screen.print(_fits_with_line(out["fits_with"], given))
    if out.get("decode_target") is not None:
        _decode_target_lines(out["decode_target"], screen)
    if out["target"] is not None:
        target = out["target"]
        if target["cp"] is None:
            screen.print(f"no CP degree prefills within {seconds(target['target_ttft_s'])} and fits")
        else:
            screen.print(
                f"within {seconds(target['target_ttft_s'])}: cp {target['cp']} ({target['gpus']} GPUs), "
                f"{target['scheme']}, TTFT {seconds(target['ttft_s'])}"
            )


def _schemes_table(schemes: dict) -> None:
    """The prefill's CP schemes side by side: what each would take and move."""
    table = house_table()
    for column in ("scheme", "TTFT", "exposed CP comm", "bytes per step"):
        table.add_column(column, justify="left" if column == "scheme" else "right")
    for name, row in schemes.items():
        table.add_row(
            name, seconds(row["ttft_s"]), seconds(row["exposed_comm_s"]), si(row["step_bytes"], "B")
        )
    console().print(table)


def _search_table(found: dict) -> None:
    screen = console()
    table = house_table(
        title=f"Serving layouts of {found['gpus']:,} GPUs: {found['considered']:,} weighed, {found['fit']:,} fit",
        caption="ranked by time to first token among those that fit, then fewer GPUs, then TPOT; memory: "
        "weights, KV cache and prefill working set per device" + _spread(found["layouts"][0]),
    )
    for column in ("#", "TP", "CP", "PP", "replicas", "TTFT", "TPOT", "memory", "fits"):
        table.add_column(column, justify="right")
    for i, row in enumerate(found["layouts"][:10], 1):
        table.add_row(
            str(i),
            str(row["tp"]),
            str(row["cp"]),
            str(row["pp"]),
            str(row["replicas"]),
            seconds(row["ttft_s"]),
            seconds(row["tpot_s"]),
            si(row["memory_bytes"], "B", 3),
            "yes" if row["fits"] else "no",
        )
    screen.print(table)


def _spread(row: dict) -> str:
    """Every layout's times share one calibration (the serving runs of the GPU's generation), so their intervals
    are one ratio of each figure: said once, under the table."""
    band = Interval(**row["ttft_s_interval"])
    if not band.known:
        return f"; no interval ({band.note})"
    low, high = band.lo / row["ttft_s"], band.hi / row["ttft_s"]  # type: ignore[operator]
    return f"; {band.level:.0%} intervals: each time x{low:.2f} to x{high:.2f} ({band.regime})"


def _fits_with_line(found: dict, given: dict) -> str:
    """What would fit a request that does not: another CP or TP degree, or what to shrink."""
    if found["cp"] is not None:
        return f"fix   fits with --cp {found['cp']} ({found['gpus']:,} GPUs), the rest as given"
    if found["tp"] is not None:
        return f"fix   fits with --tp {found['tp']} ({found['gpus']:,} GPUs), the rest as given"
    return (
        "fix   no CP degree up to the largest nor TP up to the KV heads fits it: a smaller batch, a shorter "
        "context, fp8 weights or KV cache, or more pipeline stages (--pp)"
    )


def _decode_target_lines(target: dict, screen) -> None:  # noqa: ANN001
    """--target-tpot: the largest batch within it on the asked layout and with every GPU in TP."""

    goal = seconds(target["target_tpot_s"])
    for key in ("cp_layout", "tp_layout"):
        layout = target[key]
        if layout is None:
            continue
        name = f"tp {layout['tp']} x cp {layout['cp']}"
        if layout["max_batch"] == 0:
            why = "nothing fits" if layout["limited_by"] == "none" else "batch 1 is slower"
            screen.print(f"decode within {goal}, {name}: no batch ({why})")
            continue
        screen.print(
            f"decode within {goal}, {name}: max batch {layout['max_batch']:,} (by {layout['limited_by']}), "
            f"TPOT {seconds(layout['tpot_at_max_batch_s'])}, {layout['tokens_per_s']:,.0f} tokens/s"
        )
    if target["cp_beats_tp"] is not None:
        screen.print(
            "CP over the KV cache "
            + ("beats" if target["cp_beats_tp"] else "does not beat")
            + " TP over the same GPUs for this request mix"
        )


def _given(ctx: typer.Context, setup: InferenceSetup) -> dict[str, int]:
    """The TP, CP and PP given beside --gpus: held, the others searched."""
    held = {}
    for name in ("tp", "cp", "pp"):
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":  # typer's own click: compare by name
            held[name] = getattr(setup, name)
    return held
