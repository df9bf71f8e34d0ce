"""What is being planned: the attention shape (from flags or a model preset) and its checks."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from costmodel.core.errors import InputError
from costmodel.machines.profiles import BYTES_PER_ELEMENT, Dtype, HardwareProfile
from costmodel.schedule.layouts import Layout, check_divisible

PositiveInt = Annotated[int, Field(ge=1)]
Pass = Literal["fwd", "bwd", "fwd+bwd"]
Recompute = Literal["none", "selective", "full"]

_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
TOKENS_HELP = "a positive integer, optionally with k, M or G (k = 1,024), e.g. 262144, 256k, 1M"


def parse_tokens(text: str | int, field: str = "seq") -> int:
    """``262144``, ``256k`` or ``1M`` (binary multiples, as sequence lengths are) to an int."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _TOKENS.match(str(text))
        if not match:
            raise InputError(field, f"{text!r} is not a length; accepted: {TOKENS_HELP}")
        number = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
        if number != int(number):
            raise InputError(field, f"{text!r} is not a whole number of tokens")
        value = int(number)
    if value < 1:
        raise InputError(field, f"must be at least 1 token (got {value})")
    return value


class PlanInputs(BaseModel):
    """One attention layer to plan. Field names are the CLI's flags (``kv_heads`` is ``--kv-heads``)."""

    model_config = ConfigDict(frozen=True, defer_build=True, populate_by_name=True)

    seq: int = Field(description="S, tokens")
    n: int = Field(description="N, CP degree")
    batch: int = Field(1, description="b, sequences")
    heads: int = Field(32, description="h, query heads")
    kv_heads: int = Field(8, description="n_kv, key/value heads")
    head_dim: int = Field(128, description="d")
    dtype: Dtype = "bf16"
    block: int = Field(1024, description="s_blk, compute tile rows")
    causal: bool = False
    layout: Layout = "contiguous"
    efficiency: float = Field(1.0, description="effective / peak FLOP/s")
    hw: str = "a100-nvlink"
    model: str | None = None
    pass_: Pass = Field("fwd", alias="pass", description="which pass the headline verdict covers")

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.dtype]

    @property
    def shard_tokens(self) -> int:
        return self.seq // self.n

    def check(self) -> Self:
        """Raise :class:`InputError` naming the field for anything the model cannot evaluate."""
        for field in ("seq", "n", "batch", "heads", "kv_heads", "head_dim", "block"):
            value = getattr(self, field)
            if value < 1:
                raise InputError(field, f"must be a positive integer (got {value})")
        if self.n > self.seq:
            raise InputError("n", f"CP degree {self.n} exceeds the sequence length {self.seq}")
        check_divisible(self.layout, self.seq, self.n)
        if self.kv_heads > self.heads:
            raise InputError("kv_heads", f"{self.kv_heads} exceeds --heads {self.heads}")
        if self.heads % self.kv_heads:
            raise InputError("kv_heads", f"{self.kv_heads} does not divide --heads {self.heads} (GQA groups)")
        if self.block > self.shard_tokens:
            raise InputError(
                "block", f"tile of {self.block} tokens is larger than the shard S/N = {self.shard_tokens}"
            )
        if not 0 < self.efficiency <= 1:
            raise InputError("efficiency", f"must be in (0, 1] (got {self.efficiency})")
        return self


class TrainingSetup(BaseModel):
    """How the rest of the job is laid out around CP."""

    model_config = ConfigDict(frozen=True, defer_build=True, populate_by_name=True)

    gpus: int = Field(description="G: accelerators in the job")
    tp: int = Field(1, description="tensor-parallel degree (sequence parallel on when > 1)")
    pp: int = Field(1, description="pipeline-parallel degree")
    zero: Literal[0, 1, 2, 3] = Field(1, description="ZeRO stage over DP x CP (1 = distributed optimizer)")
    recompute: Recompute = Field("selective", description="activation recompute")
    memory_headroom: float = Field(0.10, description="fraction of HBM left free")
    pass_: Pass = Field("fwd+bwd", alias="pass", description="which passes must hide their transfers")

    def check(self) -> Self:
        for field in ("gpus", "tp", "pp"):
            if getattr(self, field) < 1:
                raise InputError(field, f"must be a positive integer (got {getattr(self, field)})")
        if self.gpus % (self.tp * self.pp):
            raise InputError("gpus", f"{self.gpus} GPUs do not split into TP x PP = {self.tp * self.pp} groups")
        if not 0 <= self.memory_headroom < 1:
            raise InputError("memory_headroom", f"must be in [0, 1) (got {self.memory_headroom})")
        return self

    def attention(self, inputs: PlanInputs) -> PlanInputs:
        """The attention one TP rank runs: h/t query heads and n_kv/t KV heads (at least one, replicated)."""
        if inputs.heads % self.tp:
            raise InputError("tp", f"TP {self.tp} does not divide the {inputs.heads} query heads")
        if self.tp == 1:
            return inputs
        return inputs.model_copy(update={"heads": inputs.heads // self.tp,
                                         "kv_heads": max(inputs.kv_heads // self.tp, 1)})  # fmt: skip

    def placed(self, profile: HardwareProfile) -> HardwareProfile:
        """The profile as this job lays CP out: TP is innermost (Megatron's order), so a node of
        ``cp_ranks_per_node`` ranks holds that many over TP CP ranks; TP 8 on 8-GPU nodes puts every
        CP neighbour on another node."""
        return profile.model_copy(update={"cp_ranks_per_node": max(1, profile.ranks_per_node // self.tp)})

    @property
    def shard_group(self) -> int:
        """D = DP x CP: ranks that hold the same weights, over which ZeRO shards optimizer states."""
        return self.gpus // (self.tp * self.pp)
