"""Model presets: a transformer's shape by name (configs/models/*.yaml), from a YAML file, or imported from
a Hugging Face ``config.json`` (Llama, Qwen2/3, Mistral, Mixtral, Gemma 2/3, GPT-OSS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodel.core.errors import InputError, another_kind, describe_validation
from costmodel.core.fields import Count, Switch
from costmodel.core.fileio import load_builtin_or_file, read_json
from costmodel.core.resources import data_dir

# Ceilings far above any published model that keep products such as layers x hidden x vocab exact.
Heads = Count(maximum=2**16)
Width = Count(maximum=2**24)


class LatentAttention(BaseModel):
    """Multi-head latent attention ([DeepSeek-V2 §2.1]): the latents' ranks and the heads' dimensions."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    q_lora_rank: Width | None = Field(None, description="the query latent's rank; none: Q projected directly")
    kv_lora_rank: Width = Field(
        description="the key-value latent's rank (what a decode cache keeps per token)"
    )
    qk_nope_head_dim: Heads = Field(description="each head's query and key dimensions without rotary")
    qk_rope_head_dim: Heads = Field(description="the rotary dimensions, one key shared by every head")
    v_head_dim: Heads = Field(description="each head's value dimension")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def attention_head_dim(self) -> int:
        """The head dimension attention and its traffic see on average: QK^T at d_qk, PV at d_v."""
        return (self.qk_head_dim + self.v_head_dim) // 2


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
    gated_mlp: Switch = Field(
        True, description="SwiGLU-style MLP with three matrices (Llama); false: GeLU, two"
    )
    tied_embeddings: Switch = Field(False, description="input and output embeddings share one matrix")
    dropout: Switch = Field(False, description="dropout masks are stored for backward (GPT-3 era training)")
    sliding_window: Width | None = Field(
        None,
        description="tokens a local-attention layer sees (Gemma, GPT-OSS); recorded, not yet used by the cost model",
    )
    local_layers: Count(0) = Field(
        0, description="layers with sliding-window attention; the rest attend globally"
    )
    context_length: Width | None = Field(
        None, description="longest context the model serves, tokens; inference refuses longer requests"
    )
    experts: Width | None = Field(
        None,
        description="routed MoE experts per layer (ffn_hidden is then one expert's width); the step uses them",
    )
    experts_per_token: Width | None = Field(None, description="experts each token is routed to")
    shared_expert_ffn: Width | None = Field(
        None, description="FFN width of the always-active shared expert(s) of an MoE layer (Qwen-MoE)"
    )
    dense_layers: Count(0) = Field(
        0,
        description="the first layers of an MoE model whose MLP is dense, of dense_ffn (DeepSeek's "
        "first_k_dense_replace); the rest are MoE",
    )
    dense_ffn: Width | None = Field(None, description="FFN width of the dense layers (with dense_layers)")
    mla: LatentAttention | None = Field(
        None,
        description="multi-head latent attention (DeepSeek-V2/V3, Kimi K2); head_dim is then the mean of the "
        "query-key and value dimensions and kv_heads equals heads: the K and V a ring or all-gather CP moves",
    )

    @model_validator(mode="after")
    def _gqa(self) -> Self:
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads}")
        if self.local_layers > self.layers:
            raise ValueError(f"local_layers {self.local_layers} exceeds layers {self.layers}")
        if self.local_layers and self.sliding_window is None:
            raise ValueError("local_layers needs sliding_window")
        if (self.experts is None) != (self.experts_per_token is None):
            raise ValueError("experts and experts_per_token come together")
        if self.experts and self.experts_per_token > self.experts:  # type: ignore[operator]
            raise ValueError(f"experts_per_token {self.experts_per_token} exceeds experts {self.experts}")
        if self.shared_expert_ffn and not self.experts:
            raise ValueError("shared_expert_ffn needs experts")
        if self.dense_layers and (not self.experts or self.dense_ffn is None):
            raise ValueError("dense_layers needs experts and dense_ffn")
        if self.dense_layers >= self.layers:
            raise ValueError(f"dense_layers {self.dense_layers} must leave an MoE layer of {self.layers}")
        if self.mla is not None:
            if (self.mla.qk_head_dim + self.mla.v_head_dim) % 2:
                raise ValueError("mla: qk_nope_head_dim + qk_rope_head_dim + v_head_dim must be even")
            if self.kv_heads != self.heads or self.head_dim != self.mla.attention_head_dim:
                raise ValueError(
                    f"mla: kv_heads must equal heads ({self.heads}) and head_dim the mean of the query-key "
                    f"and value dimensions ({self.mla.attention_head_dim})"
                )
        return self


def builtin_models() -> list[str]:
    return sorted(p.stem for p in (data_dir("configs") / "models").glob("*.yaml"))


def load_model(spec: str, field: str = "--model", unmapped: list[str] | None = None) -> ModelPreset:
    """A preset by name, a YAML file by path, or a Hugging Face ``config.json`` (a ``.json`` path); what
    such a config holds that the preset does not use is appended to ``unmapped`` when given."""
    if spec.endswith(".json"):
        preset, left = from_hf_config(_read_json(spec, field), origin=spec, field=field)
        if unmapped is not None:
            unmapped.extend(left)
        return preset
    try:
        data, origin, document = load_builtin_or_file(spec, data_dir("configs") / "models", field, "model")
    except InputError as exc:
        if exc.message.startswith("unknown model"):
            raise InputError(field, f"{exc.message}, or a Hugging Face config.json") from None
        raise
    try:
        return ModelPreset.model_validate(data)
    except ValidationError as exc:
        said = another_kind(data, "model preset") or describe_validation(exc, document.line, ModelPreset)
        raise InputError(field, f"{origin}: {said}") from None


def _read_json(path: str, field: str) -> Any:

    return read_json(path, field)


# Families whose MLP is gated (three matrices: gate, up, down), whatever the activation is called: Gemma's
# GeGLU uses gelu, GPT-2's plain MLP does too, so the activation alone does not decide it.
_GATED = {
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gpt_oss",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "olmo2",
    "phi3",
    "granite",
}
_UNGATED = {
    "gpt2",
    "gpt_neox",
    "gptj",
    "opt",
    "bloom",
    "falcon",
    "gpt_bigcode",
    "RefinedWeb",
    "RefinedWebModel",
}
_KNOWN = _GATED | _UNGATED
# Other names the families give the shape, as transformers' attribute_map reads them [HF-Transformers]:
# GPT-2, GPT-J and BigCode say n_embd, n_head, n_layer, n_inner; BLOOM and Falcon's first configs n_head and
# n_layer; Falcon num_kv_heads (RefinedWeb n_head_kv); OPT ffn_dim.
_ALIASES = {
    "num_attention_heads": ("n_head", "num_heads"),
    "num_hidden_layers": ("n_layer", "num_layers"),
    "hidden_size": ("n_embd", "d_model"),
    "intermediate_size": ("n_inner", "ffn_dim", "ffn_hidden_size"),
    "num_key_value_heads": ("num_kv_heads", "n_head_kv"),
}
# The switches the import reads: JSON true or false, nothing else.
_SWITCHES = ("tie_word_embeddings", "use_sliding_window", "multi_query", "new_decoder_architecture")
# Families whose configs may leave the MLP width out: transformers then uses 4 x hidden.
_FOUR_X_FFN = {"gpt2", "gptj", "gpt_bigcode", "bloom", "falcon", "RefinedWeb", "RefinedWebModel"}
MAX_NESTING = 4  # text_config inside text_config: multimodal wrappers nest one or two deep
# Defaults the published configs leave out because transformers' config classes supply them.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "sliding_window_pattern": 6, "tie_word_embeddings": True},
    "gemma2": {"sliding_window_pattern": 2, "tie_word_embeddings": True},
    "gemma": {"tie_word_embeddings": True},
}
_MAPPED = {
    "first_k_dense_replace",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "hidden_act",
    "hidden_activation",
    "sliding_window",
    "use_sliding_window",
    "sliding_window_pattern",
    "layer_types",
    "max_window_layers",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "model_type",
    "text_config",
    "moe_intermediate_size",
    "sliding_window_size",
    "shared_expert_intermediate_size",
    "n_shared_experts",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "multi_query",
    "new_decoder_architecture",
    *(alias for names in _ALIASES.values() for alias in names),
}
# Keys that do not change what attention moves or the memory it holds.
_IRRELEVANT = {
    "architectures",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "rms_norm_eps",
    "layer_norm_eps",
    "use_cache",
    "rope_theta",
    "max_position_embeddings",
    "attention_dropout",
    "attention_bias",
    "mlp_bias",
    "pretraining_tp",
    "_name_or_path",
    "cache_implementation",
    "initial_context_length",
    "output_router_logits",
    "router_aux_loss_coef",
    "vision_config",
    "boi_token_index",
    "eoi_token_index",
    "image_token_index",
    "mm_tokens_per_image",
    "quantization_config",
    "tokenizer_class",
    "auto_map",
    "rope_scaling",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "swiglu_limit",
    "rope_local_base_freq",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_jitter_noise",
    "bos_token",
    "eos_token",
}


# Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): the ring could send the compressed latent instead
# of per-head K and V, a traffic the model does not have yet.
def from_hf_config(
    data: object, origin: str = "config.json", field: str = "--model"
) -> tuple[ModelPreset, list[str]]:
    """A preset from a Hugging Face ``config.json`` (already parsed), and what it could not map.

    Head dimension is the config's ``head_dim`` when given (Qwen3 and Gemma set it apart from
    ``hidden_size / heads``), else that quotient. Sliding windows are recorded in the preset but not yet used
    by the cost model; MoE counts are used by the step only; both appear in the returned list so the caller
    can say so.
    Multi-head latent attention keeps its projections' shapes; attention and its CP traffic see every head
    at the mean of the query-key and value dimensions."""
    data, family = _normalized(data, origin, field)

    def need(key: str) -> int:
        value = data.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(field, f"{origin}: {key} must be a positive integer (got {value!r})")
        return value

    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    kv_heads = _kv_heads(data, family, heads, need, field)
    mla = _latent(data, need) if data.get("kv_lora_rank") is not None else None
    if mla is not None:  # attention and its traffic see every head at the mean of d_qk and d_v
        kv_heads = heads
        head_dim = (mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] + mla["v_head_dim"]) // 2
    elif data.get("head_dim") is not None:
        head_dim = need("head_dim")
    elif hidden % heads:
        raise InputError(
            field, f"{origin}: no head_dim, and hidden_size {hidden} is not a multiple of {heads} heads"
        )
    else:
        head_dim = hidden // heads
    layers = need("num_hidden_layers")
    notes: list[str] = []
    gated = family in _GATED
    window, local = _sliding(data, layers)
    experts, top_k, ffn, shared = _experts(data, need)
    if window:
        notes.append(
            f"sliding_window={window} on {local} of {layers} layers (attention there sees at most "
            f"{window} keys; the plan treats every layer as global)"
        )
    dense = data.get("first_k_dense_replace") if experts else None
    dense_layers, dense_ffn = (
        (need("first_k_dense_replace"), need("intermediate_size")) if dense else (0, None)
    )
    if mla is not None:
        notes.append(
            "multi-head latent attention: the projections at their own shapes; attention and CP traffic at "
            f"{heads} heads of {head_dim} (the mean of query-key {mla['qk_nope_head_dim'] + mla['qk_rope_head_dim']} "
            f"and value {mla['v_head_dim']}): the K and V a ring or all-gather moves"
        )
    if experts:
        notes.append(
            f"MoE: {experts} experts, {top_k} per token, ffn_hidden={ffn} each"
            + (f", shared expert {shared}" if shared else "")
            + (f", after {dense_layers} dense layers of {dense_ffn}" if dense_layers else "")
            + " (step: --ep and --capacity-factor; memory counts every expert; the single-layer plan reads"
            " attention only)"
        )
    notes.extend(sorted(k for k in data if k not in _MAPPED | _IRRELEVANT and not k.startswith("_")))
    path = Path(origin)
    name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    fields = {
        "name": name,
        "description": f"imported from {origin} (model_type {family or 'unknown'})",
        "source": origin,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "layers": layers,
        "hidden": hidden,
        "ffn_hidden": ffn,
        "vocab": need("vocab_size"),
        "gated_mlp": gated,
        "tied_embeddings": data.get("tie_word_embeddings") is True,
        "sliding_window": window,
        "local_layers": local,
        "experts": experts,
        "experts_per_token": top_k,
        "shared_expert_ffn": shared,
        "dense_layers": dense_layers,
        "dense_ffn": dense_ffn,
        "mla": mla,
    }
    try:
        return ModelPreset.model_validate(fields), notes
    except ValidationError as exc:
        raise InputError(field, f"{origin}: {describe_validation(exc)}") from None


def _normalized(data: object, origin: str, field: str) -> tuple[dict[str, Any], str]:
    """The config's fields under their canonical names, the language model's out of a multimodal wrapper,
    with the family's defaults; and the family. Refuses what the import cannot plan."""
    if not isinstance(data, dict):
        raise InputError(
            field, f"{origin}: expected a JSON object of config fields, got {type(data).__name__}"
        )
    for _ in range(MAX_NESTING):  # multimodal wrappers (Gemma 3, LLaVA) keep the LM in text_config
        if not isinstance(data.get("text_config"), dict):
            break
        data = {**{k: v for k, v in data.items() if k != "text_config"}, **data["text_config"]}
    else:
        raise InputError(field, f"{origin}: text_config nested more than {MAX_NESTING} deep")
    family = data.get("model_type")
    if not isinstance(family, str) or family not in _KNOWN:
        shown = repr(family)[:60] if family is not None else "no model_type"
        raise InputError(
            field,
            f"{origin}: {shown} is not a family the import knows (known: {', '.join(sorted(_KNOWN))}); "
            "write a preset YAML with heads, kv_heads, head_dim, layers, hidden, ffn_hidden and vocab",
        )
    data = {**_DEFAULTS.get(family, {}), **data}
    for key, names in _ALIASES.items():  # one value a field, under any of its names
        stated = [name for name in (key, *names) if data.get(name) is not None]
        if any(data[name] != data[stated[0]] for name in stated):
            raise InputError(
                field,
                f"{origin}: {' and '.join(f'{name} {data[name]!r}' for name in stated)} name the same field "
                "with different values; keep one",
            )
        if stated:
            data[key] = data[stated[0]]
    for key in _SWITCHES:  # "false" in quotes is a non-empty string: bool() would read it as true
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise InputError(field, f"{origin}: {key} must be true or false (got {str(data[key])[:40]!r})")
    if (
        data.get("intermediate_size") is None
        and family in _FOUR_X_FFN
        and isinstance(data.get("hidden_size"), int)
    ):
        data["intermediate_size"] = 4 * data["hidden_size"]
    return data, family


def _experts(data: dict[str, Any], need: Any) -> tuple[int | None, int | None, int, int | None]:
    """Experts, experts per token, each expert's (or the dense) FFN width and a shared expert's: MoE fields
    under any of their names."""
    experts_key = next(
        (k for k in ("num_local_experts", "n_routed_experts", "num_experts") if data.get(k)), None
    )
    top_k_key = next((k for k in ("num_experts_per_tok", "experts_per_token") if data.get(k)), None)
    experts = need(experts_key) if experts_key else None
    top_k = need(top_k_key) if experts_key and top_k_key else None
    moe_ffn = experts and data.get("moe_intermediate_size")
    ffn = need("moe_intermediate_size") if moe_ffn else need("intermediate_size")
    if experts and data.get("shared_expert_intermediate_size"):  # Qwen-MoE: the shared experts' width
        return experts, top_k, ffn, need("shared_expert_intermediate_size")
    if experts and data.get("n_shared_experts"):  # DeepSeek: that many experts of the routed width
        return experts, top_k, ffn, need("n_shared_experts") * ffn
    return experts, top_k, ffn, None


def _latent(data: dict[str, Any], need: Any) -> dict[str, int | None]:
    """Multi-head latent attention's ranks and head dimensions, each a positive integer (no Q latent: null)."""
    fields = {k: need(k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    return {"q_lora_rank": need("q_lora_rank") if data.get("q_lora_rank") is not None else None, **fields}


def _kv_heads(data: dict[str, Any], family: str, heads: int, need: Any, field: str) -> int:
    """K/V heads: Falcon's rule (its new decoder reads num_kv_heads; else multi_query means one), else the
    count under any of its names, else multi_query's one (GPT-BigCode defaults to it), else every head."""
    multi_query = data.get("multi_query", family == "gpt_bigcode")
    if not isinstance(multi_query, bool):
        raise InputError(field, f"multi_query must be true or false (got {str(multi_query)[:40]!r})")
    if family in ("falcon", "RefinedWeb", "RefinedWebModel") and not data.get("new_decoder_architecture"):
        if family == "falcon" and "multi_query" not in data:
            multi_query = True  # transformers' FalconConfig default
        if multi_query:
            return 1
        return heads if data.get("num_key_value_heads") is None else need("num_key_value_heads")
    if data.get("num_key_value_heads") is not None:
        return need("num_key_value_heads")
    return 1 if multi_query else heads


def _sliding(data: dict[str, Any], layers: int) -> tuple[int | None, int]:
    """(window, layers using it) from ``layer_types``, a local:global pattern, or Qwen's switch."""
    window = data.get("sliding_window")
    if (
        not isinstance(window, int)
        or isinstance(window, bool)
        or window < 1
        or data.get("use_sliding_window") is False
    ):
        return None, 0
    types = data.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        local = sum(1 for t in types if t == "sliding_attention")
    elif isinstance(data.get("sliding_window_pattern"), int) and data["sliding_window_pattern"] >= 1:
        every = data["sliding_window_pattern"]  # one global layer in each group of ``every``
        local = layers - layers // every
    elif data.get("use_sliding_window") and isinstance(data.get("max_window_layers"), int):
        local = max(
            0, layers - data["max_window_layers"]
        )  # Qwen2: layers from max_window_layers on are local
    else:
        local = layers  # Mistral 7B v0.1: every layer local
    return (window, local) if local else (None, 0)
