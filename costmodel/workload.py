"""What is being planned: the attention shape (from flags or a model preset) and its checks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodel.errors import InputError, describe_validation
from costmodel.fileio import load_yaml
from costmodel.hardware import BYTES_PER_ELEMENT, Dtype
from costmodel.layouts import Layout, check_divisible
from costmodel.resources import data_dir

PositiveInt = Annotated[int, Field(ge=1)]

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


class ModelPreset(BaseModel):
    """A transformer's shape (configs/models/*.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    description: str = ""
    source: str = Field(description="where the numbers come from (model card or config URL)")
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    layers: PositiveInt
    hidden: PositiveInt
    ffn_hidden: PositiveInt
    vocab: PositiveInt

    @model_validator(mode="after")
    def _gqa(self) -> Self:
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads}")
        return self


def builtin_models() -> list[str]:
    return sorted(p.stem for p in (data_dir("configs") / "models").glob("*.yaml"))


def load_model(spec: str, field: str = "--model") -> ModelPreset:
    """A preset by name, or a YAML file by path."""
    path = Path(spec)
    if spec in builtin_models():
        path = data_dir("configs") / "models" / f"{spec}.yaml"
    elif path.suffix not in {".yaml", ".yml"} and not path.exists():
        raise InputError(field, f"unknown model {spec!r}; presets: {', '.join(builtin_models())}, or a YAML path")
    data = load_yaml(path, field)
    if not isinstance(data, dict):
        raise InputError(field, f"{path}: expected a mapping of model fields, got {type(data).__name__}")
    try:
        return ModelPreset.model_validate(data)
    except ValidationError as exc:
        raise InputError(field, f"{path}: {describe_validation(exc)}") from None


class PlanInputs(BaseModel):
    """One attention layer to plan. Field names are the CLI's flags (``kv_heads`` is ``--kv-heads``)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

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
