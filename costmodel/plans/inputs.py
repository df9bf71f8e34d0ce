"""Every input of a plan, declared once: name, type, unit, default, help, range and check.

The command-line flags (:mod:`costmodel.cli.options` builds them from these fields), capacity-plan
files, the report's ``inputs``, sweeps and calibration all derive from the two models below. A value
is validated once, when a model is built (:func:`build`), and any problem becomes one
:class:`~costmodel.core.errors.InputError` naming the flag. To add a flag, add a field here.

Ranges are the tool's supported limits (docs/limits.md): wide enough for any real job, narrow enough
that every accepted input is answered in bounded time and memory.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)

from costmodel.core.errors import InputError
from costmodel.core.units import TOKENS_HELP, parse_tokens
from costmodel.machines.binding import Machine
from costmodel.machines.compose import ProfileChanges, override
from costmodel.machines.profiles import BYTES_PER_ELEMENT, Dtype, HardwareProfile, load_profile
from costmodel.machines.topology import parse_order, strides
from costmodel.plans.models import load_model
from costmodel.plans.packing import pack
from costmodel.plans.stages import StageSplit, split_stages
from costmodel.schedule.layouts import Layout, check_divisible
from costmodel.schedule.packed import MAX_MASKED_TOKENS, MAX_MASKED_WORK

Pass = Literal["fwd", "bwd", "fwd+bwd"]
Recompute = Literal["none", "selective", "full"]
Offload = Literal["none", "optimizer", "optimizer+params", "activations", "all"]

MAX_TOKENS = 2**34  # 16G tokens: far past any context length in use, small enough for float64 exactness
MAX_DEVICES = 2**20  # 1M accelerators
MAX_CP = 2**10  # a ring over 1,024 ranks is far past any in use (Llama 3 trained with 16); N x N stays small
MAX_HEADS = 2**16


def _tokens(value: Any) -> Any:
    """Plan files write lengths as people say them (128k); anything else is left to the type check."""
    if isinstance(value, str):
        try:
            return parse_tokens(value)
        except InputError as exc:
            raise ValueError(exc.message) from None
    return value


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML's true would pass for 1
        raise ValueError("expected a number, not a boolean")
    return value


Tokens = Annotated[int, BeforeValidator(_tokens), BeforeValidator(_no_bool), Strict()]
Count = Annotated[int, BeforeValidator(_no_bool), Strict()]
Number = Annotated[float, BeforeValidator(_no_bool), Field(allow_inf_nan=False)]
Flag = Annotated[bool, Strict()]


def flag(
    default: Any,
    help: str,
    *,
    short: str | None = None,
    unit: str | None = None,
    tokens: bool = False,
    from_model: bool = False,
    aliases: tuple[str, ...] = (),
    **constraints: Any,
) -> Any:
    """A declared input: the CLI flag is ``--`` + the field name with dashes (``pass_`` is ``--pass``).

    ``from_model``: a model preset fills it when the flag is not given. ``tokens``: accepts 256k, 1M.
    ``aliases``: further long flags for the same field (``--cp`` for ``--n``)."""
    extra = {
        "short": short,
        "unit": unit,
        "tokens": tokens,
        "from_model": from_model,
        "aliases": list(aliases),
    }
    return Field(
        default, description=help, json_schema_extra={k: v for k, v in extra.items() if v}, **constraints
    )


class PlanInputs(BaseModel):
    """One attention layer to plan: the shape, where it runs, and which pass the verdict covers."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True, populate_by_name=True)

    seq: Tokens = flag(
        262_144, f"S, tokens: {TOKENS_HELP}.", short="-s", unit="tokens", tokens=True, ge=1, le=MAX_TOKENS
    )
    n: Count = flag(
        8,
        "N, the CP degree: devices the sequence is split over.",
        short="-n",
        unit="devices",
        aliases=("--cp",),
        ge=1,
        le=MAX_CP,
    )
    batch: Count = flag(1, "b, sequences per device.", short="-b", unit="sequences", ge=1, le=MAX_HEADS)
    heads: Count = flag(32, "h, query heads.", unit="heads", from_model=True, ge=1, le=MAX_HEADS)
    kv_heads: Count = flag(
        8, "n_kv, key/value heads (GQA when fewer than h).", unit="heads", from_model=True, ge=1, le=MAX_HEADS
    )
    head_dim: Count = flag(
        128, "d, the head dimension.", unit="elements", from_model=True, ge=1, le=MAX_HEADS
    )
    dtype: Dtype = flag("bf16", "Element type of Q, K, V: sets p and the peak FLOP/s.")
    block: Tokens = flag(
        1024,
        "s_blk, compute tile rows (a kernel's query block).",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )
    causal: Flag = flag(False, "Causal mask: useful compute halves, traffic does not.")
    layout: Layout = flag(
        "contiguous", "Which tokens each device holds (zigzag and striped balance a causal mask)."
    )
    efficiency: Number | None = flag(
        None,
        "Effective / peak FLOP/s for every kernel, in [0.001, 1]; default: the profile's measured or "
        "published kernel rates where it has them, else peak.",
        ge=0.001,
        le=1,
    )
    hw: str = flag(
        "a100-nvlink", "Hardware profile: a built-in name (cp-plan hw list) or a YAML path.", max_length=4096
    )
    model: str | None = flag(
        None, "Model preset name or YAML path; sets heads, kv-heads, head-dim.", short="-m", max_length=4096
    )
    pass_: Pass = Field(
        "fwd", alias="pass", description="Which pass the verdict covers; fwd+bwd takes the worse."
    )
    docs: str | None = flag(
        None,
        "Packed documents in windows of S: lengths (200k,4kx16,512x40), a file (a length per line, or a "
        "JSON/CSV histogram), or lognormal:mean=4k,sigma=1,count=200,seed=0; first-fit in order "
        "(docs/packing.md).",
        max_length=4096,
    )
    packing: Literal["dense", "varlen"] = flag(
        "varlen",
        "How the kernel treats the document mask: dense blanks scores and computes the causal window, "
        "varlen skips masked tiles.",
    )
    window: Tokens | None = flag(
        None,
        "Sliding window W: a query sees keys within W tokens.",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )
    attention_chunk: Tokens | None = flag(
        None,
        "Chunked (local) attention: a query sees keys in its aligned chunk of C tokens.",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )

    @computed_field(description="p, bytes per element, from dtype")  # type: ignore[prop-decorator]
    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.dtype]

    @property
    def shard_tokens(self) -> int:
        return self.seq // self.n

    @property
    def masked(self) -> bool:
        """Documents, a sliding window or chunks: the schedule comes from the mask simulator."""
        return self.docs is not None or self.window is not None or self.attention_chunk is not None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.n > self.seq:
            raise InputError("n", f"CP degree {self.n} exceeds the sequence length {self.seq}")
        check_divisible(self.layout, self.seq, self.n)
        if self.kv_heads > self.heads:
            raise InputError("kv_heads", f"{self.kv_heads} exceeds --heads {self.heads}")
        if self.heads % self.kv_heads:
            raise InputError("kv_heads", f"{self.kv_heads} does not divide --heads {self.heads} (GQA groups)")
        if self.masked:  # before packing: a refused S reads no documents
            if self.seq > MAX_MASKED_TOKENS or self.seq * self.n > MAX_MASKED_WORK:
                raise InputError(
                    "docs" if self.docs else "window" if self.window else "attention_chunk",
                    f"packed and windowed masks are simulated up to S = {MAX_MASKED_TOKENS:,} tokens and "
                    f"S x N = {MAX_MASKED_WORK:,} (got S = {self.seq:,}, N = {self.n})",
                )
        if self.docs is not None:
            pack(self.docs, self.seq)
        if self.block > self.shard_tokens:
            raise InputError(
                "block", f"tile of {self.block} tokens is larger than the shard S/N = {self.shard_tokens}"
            )
        return self


class MachineOverrides(BaseModel):
    """What a command line changes in a profile: "H100 with 8 GPUs per node over 200 Gb/s RoCE" is
    ``--hw h100-ib --inter-node-bandwidth 200Gb``, not a new file (:func:`costmodel.machines.compose.override`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    inter_node_bandwidth: str | None = flag(
        None,
        "Replace the profile's inter-node link, per direction: 200Gb (bits), 25GB/s (bytes), 1.8TB/s.",
        max_length=40,
    )
    intra_node_bandwidth: str | None = flag(
        None,
        "Replace the profile's intra-node link, per direction, as --inter-node-bandwidth.",
        max_length=40,
    )
    devices_per_node: Count | None = flag(
        None,
        "Accelerators per node: the fast domain (NVLink, xGMI or ICI slice).",
        unit="devices",
        ge=1,
        le=MAX_DEVICES,
    )
    cp_ranks_per_node: Count | None = flag(
        None,
        "Consecutive CP ranks on one node; the ring leaves the node beyond them.",
        unit="devices",
        ge=1,
        le=MAX_DEVICES,
    )
    torus_dims: str | None = flag(
        None,
        "A torus profile's slice shape, e.g. 4x4x8 (TPU v5p) or 4x8 (v5e): sets the fast domain to its chips.",
        max_length=40,
    )


def machine_for(
    inputs: PlanInputs, overrides: MachineOverrides | None = None, profile: HardwareProfile | None = None
) -> Machine:
    """The plan's machine: its profile (``inputs.hw``, or ``profile`` already loaded), changed as the command
    line says, bound to its dtype and efficiency."""

    profile = profile or load_profile(inputs.hw)
    if overrides is not None and any(value is not None for value in overrides.model_dump().values()):
        o = overrides
        profile = override(
            profile,
            ProfileChanges(
                inter_bandwidth=o.inter_node_bandwidth,
                intra_bandwidth=o.intra_node_bandwidth,
                devices_per_node=o.devices_per_node,
                cp_ranks_per_node=o.cp_ranks_per_node,
                torus_dims=o.torus_dims,
            ),
        )
    return Machine(profile, inputs.dtype, inputs.efficiency)


def job_machine(
    inputs: PlanInputs, overrides: MachineOverrides | None = None, profile: HardwareProfile | None = None
) -> Machine:
    """The machine of a job that states its layout (`step`, `recommend`, `check`, `report`, the HTML page).

    A profile's ``cp_ranks_per_node`` stands in for the TP a single-layer plan does not know (the -ib
    profiles put one CP rank per node: TP fills it). A job states TP and the rank order, so a node holds
    devices_per_node consecutive ranks, and every group is placed from them, unless ``cp_ranks_per_node``
    is given (``--cp-ranks-per-node``, a plan file's key). ``profile``, already loaded, stands in for
    reading ``inputs.hw`` again."""
    machine = machine_for(inputs, overrides, profile)
    stated = overrides.cp_ranks_per_node if overrides is not None else None
    profile = machine.profile.model_copy(update={"cp_ranks_per_node": stated})
    return Machine(profile, machine.dtype, machine.efficiency)


def cp_stride(setup: TrainingSetup, n: int) -> int:
    """Ranks between CP neighbours under the job's rank order (TP's degree in Megatron's tp-cp-dp-pp)."""

    dp = max(1, setup.gpus // (setup.tp * n * setup.pp))
    return strides(setup.rank_order, {"tp": setup.tp, "cp": n, "dp": dp, "pp": setup.pp})["cp"]


# What a training job defaults to, where one attention layer defaults to the forward of a full mask.
TRAINING_DEFAULTS: dict[str, Any] = {"causal": True, "layout": "zigzag", "pass_": "fwd+bwd"}


class TrainingSetup(BaseModel):
    """How the rest of the job is laid out around CP."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    gpus: Count = flag(8, "G: accelerators in the job.", short="-g", unit="devices", ge=1, le=MAX_DEVICES)
    tp: Count = flag(1, "Tensor-parallel degree.", unit="devices", ge=1, le=MAX_HEADS)
    pp: Count = flag(1, "Pipeline-parallel degree.", unit="devices", ge=1, le=MAX_HEADS)
    first_stage_layers: Count | None = flag(
        None,
        "Layers on the first pipeline stage (Megatron's --decoder-first-pipeline-num-layers); the middle "
        "stages share the rest evenly [default: the balanced split].",
        unit="layers",
        ge=1,
        le=MAX_HEADS,
    )
    last_stage_layers: Count | None = flag(
        None,
        "Layers on the last pipeline stage, which also runs the output layer and loss (Megatron's "
        "--decoder-last-pipeline-num-layers) [default: the balanced split].",
        unit="layers",
        ge=1,
        le=MAX_HEADS,
    )
    zero: Annotated[Literal[0, 1, 2, 3], BeforeValidator(_no_bool)] = flag(
        1, "ZeRO stage over DP x CP (1 = distributed optimizer)."
    )
    recompute: Recompute = flag("selective", "Activation recompute: selective recomputes the attention core.")
    offload: Offload = flag(
        "none",
        "What lives in host memory over the profile's host link: optimizer (fp32 master weights and Adam "
        "moments; the CPU runs Adam, as ZeRO-Offload), optimizer+params (the weights too, fetched per layer, "
        "as ZeRO-3 or FSDP CPU offload), activations (each layer's copied out in the forward, back in the "
        "backward), all.",
    )
    sequence_parallel: Flag | None = flag(
        None, "Sequence parallelism with TP: splits norms and dropouts too [default: on when TP > 1]."
    )
    flash_attention: Flag = flag(True, "Flash attention: the score matrix is never stored for backward.")
    memory_headroom: Number = flag(0.10, "Fraction of HBM left free, in [0, 0.9].", ge=0, le=0.9)
    rank_order: str = flag(
        "tp-cp-dp-pp",
        "How ranks are numbered, innermost first: the inner groups share the fast domain (Megatron: tp-cp-dp-pp).",
        max_length=40,
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.gpus % (self.tp * self.pp):
            raise InputError(
                "gpus", f"{self.gpus} GPUs do not split into TP x PP = {self.tp * self.pp} groups"
            )
        return self

    @field_validator("rank_order")
    @classmethod
    def _order(cls, value: str) -> str:

        try:
            return "-".join(parse_order(value))
        except InputError as exc:
            raise ValueError(exc.message) from None

    @property
    def offloaded(self) -> dict[str, int]:
        """o_opt, o_par, o_act of the offload formulas: what ``offload`` keeps in host memory."""
        parts = {"all": "optimizer+params+activations"}.get(self.offload, self.offload).split("+")
        params = "params" in parts
        return {
            "o_opt": int(params or "optimizer" in parts),
            "o_par": int(params),
            "o_act": int("activations" in parts),
        }

    @property
    def sp(self) -> bool:
        """Sequence parallel in effect: as asked, else on whenever TP splits the layer."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel and self.tp > 1

    def stages(self, layers: int, vpp: int = 1) -> StageSplit:
        """The pipeline split of ``layers``: the first and last stages' counts as given, else balanced."""
        return split_stages(layers, self.pp, vpp, self.first_stage_layers, self.last_stage_layers)

    @property
    def shard_group(self) -> int:
        """D = DP x CP: ranks that hold the same weights, over which ZeRO shards optimizer states."""
        return self.gpus // (self.tp * self.pp)

    def attention(self, inputs: PlanInputs) -> PlanInputs:
        """The attention one TP rank runs: h/t query heads and n_kv/t KV heads (at least one, replicated)."""
        if inputs.heads % self.tp:
            raise InputError("tp", f"TP {self.tp} does not divide the {inputs.heads} query heads")
        if self.tp == 1:
            return inputs
        return inputs.model_copy(
            update={"heads": inputs.heads // self.tp, "kv_heads": max(inputs.kv_heads // self.tp, 1)}
        )


M = TypeVar("M", bound=BaseModel)


def flag_name(model: type[BaseModel], field: str) -> str:
    """The flag of a field: ``kv_heads`` -> ``--kv-heads``; ``pass_`` -> ``--pass``."""
    info = model.model_fields.get(field)
    name = info.alias if info is not None and info.alias else field
    return "--" + name.replace("_", "-")


def build(declaration: type[M], /, **values: Any) -> M:
    """Validate ``values`` into ``model``; the first problem becomes one :class:`InputError` naming its flag."""
    try:
        return declaration.model_validate(values)
    except ValidationError as exc:
        field, message = problems(exc)[0]
        raise InputError(flag_name(declaration, field) if field else "input", message) from None


def problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Every error of ``exc`` as (field, message): a check's InputError keeps its field, pydantic's own are
    put in our words. Unknown keys are named as unknown."""
    out = []
    for error in exc.errors():
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, InputError):
            out.append((cause.field, cause.message))
            continue
        loc = ".".join(str(part) for part in error["loc"])
        out.append((loc, "unknown field" if error["type"] == "extra_forbidden" else _message(error)))
    return out


def shape_from_model(values: dict[str, Any]) -> dict[str, Any]:
    """Fill the fields a model preset sets (``from_model``) that were not given: from ``values["model"]``
    when one is named, else from the declared defaults. Returns a new dict."""

    filled = dict(values)
    preset = load_model(values["model"]) if values.get("model") else None
    for name, info in PlanInputs.model_fields.items():
        if (info.json_schema_extra or {}).get("from_model") and filled.get(name) is None:
            filled[name] = getattr(preset, name) if preset else info.default
    return filled


_MESSAGES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "string_too_long": "is longer than {max_length} characters",
}


def _message(error: dict[str, Any]) -> str:
    """pydantic's message in our words, with the value that was given."""
    template = _MESSAGES.get(error["type"])
    text = template.format(**error.get("ctx", {})) if template else error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    if error["type"] == "missing" or isinstance(got, dict | list):
        return text
    shown = repr(got) if not isinstance(got, str) else repr(got[:60] + ("..." if len(got) > 60 else ""))
    return f"{text} (got {shown})"
