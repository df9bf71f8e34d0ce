"""--model takes a Hugging Face config.json: the shape comes from the config's own fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.plans.bind import call, layer_shape
from costmodel.plans.models import from_hf_config, load_model
from tests.support import REPO

HF = REPO / "tests" / "data" / "hf"

# file: heads, kv_heads, head_dim, layers, hidden, ffn_hidden, vocab, gated, tied, window, local layers, experts, top-k
IMPORTS = {
    "llama-3.1-8b": (32, 8, 128, 32, 4096, 14336, 128256, True, False, None, 0, None, None),
    "qwen2.5-72b": (
        64,
        8,
        128,
        80,
        8192,
        29568,
        152064,
        True,
        False,
        None,
        0,
        None,
        None,
    ),  # window switched off
    "qwen3-32b": (
        64,
        8,
        128,
        64,
        5120,
        25600,
        151936,
        True,
        False,
        None,
        0,
        None,
        None,
    ),  # d = 128, not 5120/64
    "mistral-large-2411": (96, 8, 128, 88, 12288, 28672, 32768, True, False, None, 0, None, None),
    "gemma-2-27b": (32, 16, 128, 46, 4608, 36864, 256000, True, True, 4096, 23, None, None),  # alternating
    "gemma-3-27b": (
        32,
        16,
        128,
        62,
        5376,
        21504,
        262208,
        True,
        True,
        1024,
        52,
        None,
        None,
    ),  # 5 local : 1 global
    "gpt-oss-120b": (64, 8, 64, 36, 2880, 2880, 201088, True, False, 128, 18, 128, 4),
}
FIELDS = (
    "heads",
    "kv_heads",
    "head_dim",
    "layers",
    "hidden",
    "ffn_hidden",
    "vocab",
    "gated_mlp",
    "tied_embeddings",
    "sliding_window",
    "local_layers",
    "experts",
    "experts_per_token",
)


@pytest.mark.parametrize("name", sorted(IMPORTS))
def test_config_json_maps_to_the_preset_fields(name: str) -> None:
    preset = load_model(str(HF / f"{name}.json"))
    assert tuple(getattr(preset, f) for f in FIELDS) == IMPORTS[name]
    assert preset.name == name and preset.source.endswith(f"{name}.json")


@pytest.mark.parametrize(
    ("name", "heads", "kv_heads", "head_dim"),
    [
        ("qwen3-32b", 64, 8, 128),
        ("gemma-3-27b", 32, 16, 128),
        ("gpt-oss-120b", 64, 8, 64),
        ("mistral-large-2411", 96, 8, 128),
    ],
)
def test_cli_json_inputs_come_from_the_config(
    cli, name: str, heads: int, kv_heads: int, head_dim: int
) -> None:
    path = HF / f"{name}.json"
    config = json.loads(path.read_text())
    inner = config.get("text_config", config)
    assert (inner["num_attention_heads"], inner["num_key_value_heads"], inner["head_dim"]) == (
        heads,
        kv_heads,
        head_dim,
    )
    data = cli("--seq", "128k", "--n", "8", "--model", str(path), "--format", "json").json()["inputs"]
    assert (data["heads"], data["kv_heads"], data["head_dim"], data["model"]) == (
        heads,
        kv_heads,
        head_dim,
        str(path),
    )


def test_what_is_not_modelled_is_one_line_on_stderr(cli) -> None:
    result = cli("--seq", "128k", "--n", "8", "--model", str(HF / "gpt-oss-120b.json"), "-f", "json")
    assert result.code == 0 and result.err.count("\n") == 1
    assert (
        "sliding_window=128 on 18 of 36 layers" in result.err
        and "MoE: 128 experts, 4 per token" in result.err
    )
    json.loads(result.out)  # stdout stays clean JSON
    quiet = cli("--seq", "128k", "--n", "8", "--model", str(HF / "llama-3.1-8b.json"), "-f", "json")
    assert quiet.err == ""


def test_deepseek_v3_imports_with_its_latent_attention_and_shared_expert() -> None:
    """DeepSeek-V3's config.json: 128 heads whose attention sees K of 192 and V of 128 (mean 160), MLA's
    latents, 256 routed experts of 2,048 with one shared expert of the same width, 8 per token, after 3 dense
    layers of 18,432."""
    preset, notes = from_hf_config(json.loads((HF / "deepseek-v3.json").read_text()))
    assert (preset.heads, preset.kv_heads, preset.head_dim) == (128, 128, 160)
    assert preset.mla is not None and (preset.mla.q_lora_rank, preset.mla.kv_lora_rank) == (1536, 512)
    assert (preset.mla.qk_head_dim, preset.mla.v_head_dim) == (192, 128)
    assert (preset.experts, preset.experts_per_token, preset.ffn_hidden, preset.shared_expert_ffn) == (
        256,
        8,
        2048,
        2048,
    )
    assert (preset.dense_layers, preset.dense_ffn) == (3, 18432)  # first_k_dense_replace, intermediate_size
    assert any("multi-head latent attention" in note for note in notes)


def test_latent_attention_projections_by_hand() -> None:
    """DeepSeek-V3's attention weights per layer [DeepSeek-V2 §2.1]: Q down 7168x1536 and up 1536x(128x192),
    KV down 7168x(512 + 64) and up 512x(128x(128 + 128)), output (128x128)x7168: 187,105,280."""
    preset, _ = from_hf_config(json.loads((HF / "deepseek-v3.json").read_text()))
    shape = layer_shape(preset)
    by_hand = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert by_hand == 187_105_280
    assert call("attention_qkv_params", shape) + call("attention_out_params", shape) == by_hand
    no_q_latent = shape | {"c_q": 0}  # DeepSeek-V2-Lite projects Q directly: 7168 x (128 x 192)
    assert (
        call("attention_qkv_params", no_q_latent)
        == by_hand - 128 * 128 * 7168 - 7168 * 1536 - 1536 * 128 * 192 + 7168 * 128 * 192
    )
    gqa = layer_shape(load_model("llama3-8b"))  # and GQA's stays 4096 x (32 + 2 x 8) x 128 + 4096 x 4096
    assert (
        call("attention_qkv_params", gqa) + call("attention_out_params", gqa) == 4096 * 48 * 128 + 4096 * 4096
    )


def test_a_latent_attention_model_plans_steps_and_exports(cli) -> None:
    """The single-layer plan moves K and V of 128 heads x 160 (the mean of 192 and 128); the step and the
    search price it with its projections; Megatron exports it with EP; infer refuses its latent cache."""
    model = str(HF / "deepseek-v3.json")
    plan = cli("--seq", "128k", "--n", "8", "--hw", "h100-ib", "--model", model, "--causal", "-f", "json")
    assert plan.code == 0, plan.err
    ring = json.loads(plan.out)["ring"]
    assert ring["step_recv_bytes"] == 131072 // 8 * 2 * 128 * 160 * 2  # K and V of one shard, bf16
    args = ["--model", model, "--seq", "32k", "--hw", "h100-ib", "--gpus", "2048"]
    step = cli(
        "step",
        *args,
        "--tp",
        "8",
        "--pp",
        "16",
        "--ep",
        "8",
        "--cp",
        "2",
        "--global-batch",
        "256",
        "-f",
        "json",
    )
    assert step.code == 0, step.err
    assert json.loads(step.out)["step"]["time_s"] > 0
    exported = cli("recommend", *args, "--format", "megatron")
    assert exported.code == 0, exported.err
    pick = json.loads(cli("recommend", *args, "--format", "json").out)["search"]["plans"][0]
    assert ("--expert-model-parallel-size" in exported.out) == (pick["ep"] > 1)
    assert f"--context-parallel-size {pick['cp']}" in exported.out
    refused = cli("infer", "--model", model, "--prompt", "32k", "--hw", "h100-ib", "--tp", "8")
    assert refused.code == 2 and "multi-head latent attention" in refused.err


def test_head_dim_defaults_to_hidden_over_heads_and_unknown_families_are_refused() -> None:
    config = json.loads((HF / "llama-3.1-8b.json").read_text())
    config.pop("head_dim", None)
    preset, _ = from_hf_config(config)
    assert preset.head_dim == 4096 // 32 and preset.gated_mlp
    config["novel_attention_knob"] = 3
    assert "novel_attention_knob" in from_hf_config(config)[1]
    for family in ("somethingnew", None, 7):
        config["model_type"] = family
        with pytest.raises(InputError, match="is not a family the import knows|no model_type"):
            from_hf_config(config)


FALCON_7B = {  # tiiuae/falcon-7b: multi-query attention, the first decoder
    "model_type": "falcon",
    "hidden_size": 4544,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "multi_query": True,
    "new_decoder_architecture": False,
    "vocab_size": 65024,
}
FALCON_40B = {  # tiiuae/falcon-40b: grouped K/V in the new decoder
    "model_type": "falcon",
    "hidden_size": 8192,
    "num_attention_heads": 128,
    "num_kv_heads": 8,
    "num_hidden_layers": 60,
    "new_decoder_architecture": True,
    "vocab_size": 65024,
}
REFINED_WEB = {  # the first Falcon 40B config: n_head, n_layer, n_head_kv
    "model_type": "RefinedWeb",
    "hidden_size": 8192,
    "n_head": 128,
    "n_head_kv": 8,
    "n_layer": 60,
    "vocab_size": 65024,
}
BIGCODE = {  # bigcode/starcoder: GPT-2 names, multi-query by default
    "model_type": "gpt_bigcode",
    "n_embd": 6144,
    "n_head": 48,
    "n_layer": 40,
    "n_inner": 24576,
    "vocab_size": 49152,
}


@pytest.mark.parametrize(
    ("config", "shape"),
    [
        (FALCON_7B, (71, 1, 64, 32, 4544, 4 * 4544)),
        ({**FALCON_7B, "multi_query": False}, (71, 71, 64, 32, 4544, 4 * 4544)),
        (FALCON_40B, (128, 8, 64, 60, 8192, 4 * 8192)),
        (REFINED_WEB, (128, 8, 64, 60, 8192, 4 * 8192)),
        (BIGCODE, (48, 1, 128, 40, 6144, 24576)),
        ({**BIGCODE, "multi_query": False}, (48, 48, 128, 40, 6144, 24576)),
        (
            {"model_type": "llava", "text_config": {"text_config": {**FALCON_40B}}},
            (128, 8, 64, 60, 8192, 32768),
        ),
    ],
)
def test_every_family_key_of_the_attention_shape_is_read(config: dict, shape: tuple) -> None:
    preset, notes = from_hf_config(config)
    got = (preset.heads, preset.kv_heads, preset.head_dim, preset.layers, preset.hidden, preset.ffn_hidden)
    assert got == shape
    assert not any(k in " ".join(notes) for k in ("multi_query", "num_kv_heads", "n_head", "n_layer"))


@given(
    family=st.sampled_from(["falcon", "RefinedWeb", "gpt_bigcode", "llama", "gpt2"]),
    names=st.sampled_from(
        [
            ("num_attention_heads", "num_hidden_layers", "hidden_size"),
            ("n_head", "n_layer", "n_embd"),
            ("num_heads", "num_layers", "d_model"),
        ]
    ),
    kv_key=st.sampled_from(["num_key_value_heads", "num_kv_heads", "n_head_kv"]),
    groups=st.integers(1, 8),
    kv=st.sampled_from([1, 2, 4, 8]),
    nest=st.integers(0, 3),
)
def test_kv_heads_are_read_under_any_name_at_any_nesting(family, names, kv_key, groups, kv, nest) -> None:
    heads = kv * groups
    inner = {
        "model_type": family,
        names[0]: heads,
        names[1]: 4,
        names[2]: heads * 64,
        kv_key: kv,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "new_decoder_architecture": True,
        "multi_query": False,
    }
    config = inner
    for _ in range(nest):
        config = {"model_type": "llava", "text_config": config}
    preset, _ = from_hf_config(config)
    assert (preset.heads, preset.kv_heads, preset.head_dim, preset.layers) == (heads, kv, 64, 4)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda c: c.pop("num_attention_heads"), "num_attention_heads must be a positive integer"),
        (lambda c: c.update(num_key_value_heads=5), "kv_heads 5 must divide heads 32"),
        (lambda c: c.update(hidden_size=4001, head_dim=None), "not a multiple of 32 heads"),
        (lambda c: c.update(num_hidden_layers=True), "num_hidden_layers must be a positive integer"),
        (lambda c: c.update(vocab_size=-1), "vocab_size must be a positive integer"),
    ],
)
def test_bad_configs_name_the_key(mutate, why: str) -> None:
    config = json.loads((HF / "llama-3.1-8b.json").read_text())
    mutate(config)
    with pytest.raises(InputError, match=why) as caught:
        from_hf_config(config)
    assert caught.value.field == "--model"


@pytest.mark.parametrize(
    ("text", "why"), [("{not json", "malformed JSON"), ("[1, 2]", "expected a JSON object")]
)
def test_unreadable_config_files(tmp_path: Path, cli, text: str, why: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    result = cli("--model", str(path))
    assert result.code == 2 and result.err.count("\n") == 1 and why in result.err
    assert cli("--model", str(tmp_path / "missing.json")).code == 2


@given(
    kv=st.sampled_from([1, 2, 4, 8]),
    groups=st.integers(1, 16),
    head_dim=st.sampled_from([64, 80, 128, 256]),
    layers=st.integers(1, 128),
)
def test_llama_like_configs_round_trip(kv: int, groups: int, head_dim: int, layers: int) -> None:
    heads = kv * groups
    config = {
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "hidden_size": 4096,
        "num_hidden_layers": layers,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    preset, notes = from_hf_config(config)
    assert (preset.heads, preset.kv_heads, preset.head_dim, preset.layers) == (heads, kv, head_dim, layers)
    assert notes == []


@pytest.mark.parametrize(
    ("preset", "config"),
    [
        ("qwen2.5-72b", "qwen2.5-72b"),
        ("mistral-large", "mistral-large-2411"),
        ("gemma-3-27b", "gemma-3-27b"),
    ],
)
def test_new_presets_agree_with_their_configs(preset: str, config: str) -> None:
    built_in, imported = load_model(preset), load_model(str(HF / f"{config}.json"))
    assert {f: getattr(built_in, f) for f in FIELDS} == {f: getattr(imported, f) for f in FIELDS}
    assert built_in.source.startswith("https://huggingface.co/")


def test_fields_it_cannot_map_are_reported_by_name() -> None:
    """A key the importer neither maps nor knows to be irrelevant is named, never silently dropped."""
    config = json.loads((HF / "qwen3-32b.json").read_text())
    config |= {"attn_temperature_tuning": True, "num_nextn_predict_layers": 1}
    _, notes = from_hf_config(config)
    assert notes == ["attn_temperature_tuning", "num_nextn_predict_layers"]


def test_latent_attention_down_projections_are_whole_on_every_tp_rank() -> None:
    """Megatron-Core runs MLA's down-projections as duplicated linears: DeepSeek-V3's 7168 x 1536 and
    7168 x (512 + 64), its latent norms (1536 + 512) and the two layer norms, 15,155,200 parameters a layer
    (0.92 B over 61 layers), are on every TP rank beside 1/t of the rest of the layer."""
    preset, _ = from_hf_config(json.loads((HF / "deepseek-v3.json").read_text()))
    shape = layer_shape(preset)
    whole = 7168 * 1536 + 7168 * 576 + 1536 + 512 + 2 * 7168
    assert whole == 15_155_200 and call("layer_replicated_params", shape) == whole
    layer = call("layer_params", shape)
    assert layer - whole == 187_105_280 - 7168 * (1536 + 576) + 3 * 7168 * 2048  # up, out, one expert
    for t in (1, 2, 8):
        assert call("layer_device_params", shape | {"t": t}) == pytest.approx((layer - whole) / t + whole)


@given(st.sampled_from(["llama3-8b", "llama3-70b", "qwen2.5-72b"]), st.sampled_from([1, 2, 4, 8]))
def test_a_tp_rank_holds_its_share_and_the_replicated_whole(name: str, t: int) -> None:
    """t ranks hold the model once, and the parameters TP cannot split (every layer's and the final norm)
    t - 1 more times."""
    shape = layer_shape(load_model(name)) | {"t": t}
    extra = shape["n_L"] * call("layer_replicated_params", shape) + shape["H"]
    assert t * call("tp_rank_params", shape) == pytest.approx(
        call("params", shape) + (t - 1) * extra, rel=1e-12
    )
