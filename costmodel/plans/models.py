"""Model presets: a transformer's shape by name (configs/models/*.yaml) or from a YAML file."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodel.core.errors import InputError, describe_validation
from costmodel.core.fields import Count
from costmodel.core.fileio import load_builtin_or_file
from costmodel.core.resources import data_dir

# Ceilings far above any published model that keep products such as layers x hidden x vocab exact.
Heads = Count(maximum=2**16)
Width = Count(maximum=2**24)


class ModelPreset(BaseModel):
    """A transformer's shape (configs/models/*.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str
    description: str = ""
    source: str = Field(description="where the numbers come from (model card or config URL)")
    heads: Heads
    kv_heads: Heads
    head_dim: Heads
    layers: Heads
    hidden: Width
    ffn_hidden: Width
    vocab: Width
    gated_mlp: bool = Field(True, description="SwiGLU-style MLP with three matrices (Llama); false: GeLU, two")
    tied_embeddings: bool = Field(False, description="input and output embeddings share one matrix")
    dropout: bool = Field(False, description="dropout masks are stored for backward (GPT-3 era training)")

    @model_validator(mode="after")
    def _gqa(self) -> Self:
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads}")
        return self


def builtin_models() -> list[str]:
    return sorted(p.stem for p in (data_dir("configs") / "models").glob("*.yaml"))


def load_model(spec: str, field: str = "--model") -> ModelPreset:
    """A preset by name, or a YAML file by path."""
    data, origin, document = load_builtin_or_file(spec, data_dir("configs") / "models", field, "model")
    try:
        return ModelPreset.model_validate(data)
    except ValidationError as exc:
        raise InputError(field, f"{origin}: {describe_validation(exc, document.line)}") from None
