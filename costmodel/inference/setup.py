"""The inputs of ``cp-plan infer``, declared once: the model and profile, the serving layout, the request and
the knobs, all fields of :class:`InferenceSetup`.

The model, the profile, the attention dtype, the efficiency and the batch take the declarations of the
training plan's (:class:`~costmodel.plans.inputs.PlanInputs`): one help, range and check for each flag.
:meth:`InferenceSetup.attention_inputs` binds them, with the model's heads, to the attention layers' inputs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from costmodel.core.errors import InputError
from costmodel.machines.profiles import Dtype
from costmodel.plans import cp as registry
from costmodel.plans.cp import PREFILL
from costmodel.plans.inputs import (
    MAX_TOKENS,
    Count,
    Flag,
    MachineOverrides,
    Number,
    Overlaps,
    Parallelism,
    PlanInputs,
    Tokens,
    TrainingSetup,
    build,
    declared_as,
    flag,
    layer_kernel,
    shape_from_model,
)

CacheDtype = Literal["bf16", "fp8"]
DecodeKvReads = Literal["per-kv-head", "per-query-head"]
PrefillScheme = Literal[("auto", *registry.names(PREFILL))]
MAX_CHUNKS = 1024  # chunks of one prefill the model walks one by one


class InferenceSetup(BaseModel):
    """One inference request and where it runs: the prompt, its cached prefix and output, and TP x CP x PP."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    dtype: Dtype = declared_as(PlanInputs, "dtype")
    efficiency: Number | None = declared_as(PlanInputs, "efficiency")
    hw: str = declared_as(PlanInputs, "hw")
    model: str | None = declared_as(PlanInputs, "model")
    batch: Count = declared_as(PlanInputs, "batch")
    attention_kernel: str = layer_kernel()
    prompt: Tokens = flag(
        ...,
        "New prompt tokens per sequence to prefill (after any cached prefix).",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )
    cached: Tokens = flag(
        0,
        "Tokens per sequence already in the KV cache (a cached prefix or earlier turns).",
        unit="tokens",
        tokens=True,
        ge=0,
        le=MAX_TOKENS,
    )
    output: Tokens = flag(
        1, "Tokens to generate per sequence.", unit="tokens", tokens=True, ge=0, le=MAX_TOKENS
    )
    tp: Count = declared_as(Parallelism, "tp")
    cp: Count = declared_as(Parallelism, "cp")
    pp: Count = declared_as(Parallelism, "pp")
    weights: CacheDtype = flag(
        "bf16", "Weight element type; fp8 also runs the matrix multiplies at the profile's fp8 rate."
    )
    kv_dtype: CacheDtype = flag("bf16", "KV-cache element type.")
    decode_kv_reads: DecodeKvReads = flag(
        "per-kv-head",
        "How the decode attention kernel reads a GQA model's cache: per-kv-head (each KV head's cache once a "
        "step: XQA, FlashInfer, FlashAttention) or per-query-head (one thread block per query head reading its "
        "KV head's cache: TensorRT-LLM before v0.7), h/n_kv times the bytes, an upper bound where L2 serves "
        "some of the re-reads.",
    )
    chunk: Tokens | None = flag(
        None,
        "Chunked prefill: new tokens per chunk, each attending to the cache and the chunks before it "
        "[default: the whole prompt at once].",
        unit="tokens",
        tokens=True,
        ge=1,
        le=MAX_TOKENS,
    )
    page: Count = flag(
        0,
        "KV-cache page in tokens (paged attention; vLLM uses 16): each rank's cache rounds up to whole "
        "pages; 0 keeps exact token counts.",
        unit="tokens",
        tokens=True,
        ge=0,
        le=2**20,
    )
    prefill_scheme: PrefillScheme = flag(
        "auto",
        f"How CP brings keys to queries in the prefill: {registry.choices(PREFILL)}; auto takes the fastest.",
    )
    memory_headroom: Number = declared_as(TrainingSetup, "memory_headroom")
    comm_latency: Number | None = flag(
        None,
        "alpha, seconds per message of a TP or CP collective step; default: the profile's link latency, "
        "else 5 us.",
        unit="s",
        ge=0,
        le=1,
    )
    tp_comm_overlap: Flag | None = declared_as(Overlaps, "tp_comm_overlap")
    cp_overlap: Number = declared_as(Overlaps, "cp_overlap")
    target_ttft: Number | None = flag(
        None,
        "Also find the fewest CP ranks (powers of two at this TP and PP) that prefill within this many "
        "seconds and fit in memory.",
        unit="s",
        gt=0,
        le=1e9,
    )

    target_tpot: Number | None = flag(
        None,
        "Also find the largest batch whose mean time per output token is within this many seconds and "
        "whose caches fit, and whether CP over the KV cache or TP over the same GPUs serves more tokens/s "
        "within it.",
        unit="s",
        gt=0,
        le=1e3,
    )
    cuda_graphs: bool = flag(
        True,
        "Decode runs as CUDA graphs (vLLM, SGLang and TensorRT-LLM do by default): no per-kernel launch "
        "cost; --no-cuda-graphs pays the profile's launch cost for every kernel of every layer.",
    )
    host_overhead: Number = flag(
        0.0,
        "Serving framework's host time per decode step that the device waits for (0: an overlap "
        "scheduler hides it).",
        unit="s",
        ge=0,
        le=1,
    )

    @model_validator(mode="before")
    @classmethod
    def _serving_defaults(cls, data: Any) -> Any:
        """A serving engine pipelines no TP collective with its multiplies unless told to."""
        if isinstance(data, dict) and data.get("tp_comm_overlap") is None:
            data = {**data, "tp_comm_overlap": False}
        return data

    def attention_inputs(self) -> PlanInputs:
        """The attention layers' inputs of the training plan's binders: this request's model (its heads and head
        size), profile, element type, efficiency and batch."""
        stated = {"model": self.model, "hw": self.hw, "dtype": self.dtype, "efficiency": self.efficiency}
        return build(
            PlanInputs,
            **shape_from_model({k: v for k, v in stated.items() if v is not None}),
            batch=self.batch,
        )


_DECLARED: tuple[type[BaseModel], ...] = (InferenceSetup, MachineOverrides)


def build_infer(**values: Any) -> tuple[InferenceSetup, MachineOverrides]:
    """The inference inputs from flat keyword values named as the command's flags (``model``, ``prompt``,
    ``hw``, ``tp``, ``cp``, ``batch``, ``cached``, ``weights``, ...), each model validated once: for tests
    and notebooks."""
    parts: dict[type[BaseModel], dict[str, Any]] = {model: {} for model in _DECLARED}
    for name, value in values.items():
        owner = next((m for m in _DECLARED if name in m.model_fields), None)
        if owner is None:
            raise InputError(name, "not an input of the inference plan")
        parts[owner][name] = value
    return build(InferenceSetup, **parts[InferenceSetup]), build(MachineOverrides, **parts[MachineOverrides])
