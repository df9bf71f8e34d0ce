"""``cp-plan infer``: memory per device, the prefill's CP scheme and TTFT, decode's TPOT ([CP-Infer]).

Hand-checked numbers first, then the pass-KV / pass-Q rule, properties, published figures, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.inference.published import GOAL, HELD_KEYS, HELD_OUT, NEW, ROWS, draw_held_out
from costmodel.inference.serve import Serving, evaluate_infer
from costmodel.inference.serve import bind as serving_bind
from costmodel.inference.setup import build_infer
from costmodel.machines.kernels import attention_rate
from costmodel.machines.profiles import load_profile
from costmodel.plans.rates import layer_gemm_rate
from costmodel.symbolic import numeric
from tests.support import formula

H405 = {"model": "llama3-405b", "hw": "h100-ib", "tp": 8, "weights": "fp8", "output": 0}
# What memory-bound kernels reach on the H100 profiles (device.hbm_sustained; the datasheet says 3.35 TB/s)
H100_STREAMING = 2.68e12


def infer(**values):
    return evaluate_infer(*build_infer(**values)).inference


# --- memory ----------------------------------------------------------------------------------------


def test_kv_cache_of_405b_at_1m_over_cp_16_by_hand() -> None:
    # 65,536 tokens per rank x K and V x 1 KV head per TP rank (8 over TP 8) x 128 x 2 B x 126 layers
    out = infer(**H405, prompt="1M", cp=16)
    assert out.kv_cache_bytes_per_device == 65_536 * 2 * 1 * 128 * 2 * 126
    assert out.memory.kv_cache_tokens_per_rank == 65_536


def test_fp8_cache_halves_and_pages_round_up() -> None:
    bf16 = infer(model="llama3-8b", hw="h100-nvlink", prompt=1000, cp=1, output=0)
    fp8 = infer(model="llama3-8b", hw="h100-nvlink", prompt=1000, cp=1, output=0, kv_dtype="fp8")
    paged = infer(model="llama3-8b", hw="h100-nvlink", prompt=1000, cp=1, output=0, page=16)
    assert fp8.kv_cache_bytes_per_device == pytest.approx(bf16.kv_cache_bytes_per_device / 2, rel=1e-12)
    assert paged.memory.kv_cache_tokens_per_rank == 1008  # 63 pages of 16
    assert paged.kv_cache_bytes_per_device == 1008 * 2 * 8 * 128 * 2 * 32


def test_tp_beyond_kv_heads_replicates_one_head_per_rank() -> None:
    # llama3-8b has 8 KV heads; TP 16 leaves each rank one (replicated), not half of one
    out = infer(model="llama3-8b", hw="h100-nvlink", prompt=4096, tp=16, output=0)
    assert out.kv_cache_bytes_per_device == 4096 * 2 * 1 * 128 * 2 * 32


@pytest.mark.parametrize(("pp", "layers"), [(1, 126), (2, 63), (3, 42), (4, 32), (5, 26), (7, 18)])
def test_an_uneven_pipeline_sizes_its_cache_by_the_stage_holding_the_most(pp: int, layers: int) -> None:
    """126 layers over 4 stages are 31 + 32 + 32 + 31: the device that holds 32 holds their caches, as it holds
    their weights (not 126 / 4 = 31.5 layers' worth)."""
    out = infer(**H405, prompt=32768, cp=1, pp=pp)
    assert (
        out.kv_cache_bytes_per_device == 32768 * 2 * 1 * 128 * 2 * layers
    )  # a bf16 cache beside fp8 weights


def test_weights_per_device_by_hand() -> None:
    out = infer(**H405, prompt="1M", cp=16)
    params = formula("params", n_L=126, H=16384, h=128, n_kv=8, d=128, F_ffn=53248, g=1, V=128256, e_m=2)
    norms = (126 * 2 + 1) * 16384  # whole on each of the 8 TP ranks, as the rest is split
    assert out.memory.weight_bytes_per_device == pytest.approx((params - norms) / 8 + norms, rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(cp=st.sampled_from([1, 2, 4, 8]), prompt=st.sampled_from([8192, 65536, 262144]))
def test_max_batch_is_the_largest_that_fits(cp: int, prompt: int) -> None:
    setup = {"model": "llama3-8b", "hw": "h100-nvlink", "prompt": prompt, "cp": cp, "output": 0}
    best = infer(**setup).memory.max_batch
    if best > 0:
        assert infer(**setup, batch=best).memory.fits
    assert not infer(**setup, batch=best + 1).memory.fits


# --- the prefill ----------------------------------------------------------------------------------


def test_pass_kv_hiding_threshold_by_hand() -> None:
    # T_hide = N·(n_kv/t)·p·F_attn / (2·(h/t)·B) = 16 · 1 · 2 · F / (2 · 16 · 50e9)
    pre = infer(**H405, prompt="1M", cp=16).prefill
    assert pre.passkv_hidden_min_new_tokens == pytest.approx(
        16 * 2 * pre.attention_flops_per_s / (2 * 16 * 50e9), rel=1e-12
    )
    assert pre.passq_max_new_fraction == pytest.approx(2 * 8 / 128, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    new=st.integers(1, 2**20),
    cached=st.integers(0, 2**22),
    heads_kv=st.sampled_from([(32, 32), (32, 8), (64, 8), (128, 8), (128, 1)]),
)
def test_pass_q_moves_fewer_bytes_exactly_below_2_nkv_over_h(new: int, cached: int, heads_kv) -> None:
    h, n_kv = heads_kv
    v = {"b": 1, "N": 8, "t": 1, "h": h, "n_kv": n_kv, "d": 128, "p": 2, "T_n": new, "K_c": cached}
    q = numeric.passq_step_bytes(**{a: v[a] for a in numeric.ARGS["passq_step_bytes"]})
    kv = numeric.passkv_step_bytes(**{a: v[a] for a in numeric.ARGS["passkv_step_bytes"]})
    share = numeric.passq_max_new_fraction(h=h, n_kv=n_kv, t=1)
    fraction = new / (new + cached)
    if fraction != share:
        assert (q < kv) == (fraction < share)


def test_scheme_rule_and_timing_agree_far_from_the_boundary() -> None:
    full = infer(**H405, prompt="1M", cp=16).prefill
    assert (full.scheme, full.rule_scheme) == ("pass-kv", "pass-kv")
    # a 4K follow-up after a 1M cached prefix: 0.4 % new tokens, far below 2·8/128 = 12.5 %
    follow = infer(**H405, prompt="4k", cached="1M", cp=16).prefill
    assert (follow.scheme, follow.rule_scheme) == ("pass-q", "pass-q")
    assert follow.schemes["pass-q"].ttft_s < 0.5 * follow.schemes["pass-kv"].ttft_s


def test_pass_q_returns_its_partials_by_two_all_to_alls_on_the_all_to_all_link() -> None:
    """pass-Q's partial outputs come back by an all-to-all for O and one for the LSE, each paying the CP
    group's all-to-all latency, at its all-to-all bandwidth (bisection-bound), not a ring hop's."""
    from costmodel.inference.serve import attention_bind
    from costmodel.machines.binding import build_machine
    from costmodel.machines.profiles import load_profile
    from costmodel.plans.inputs import PlanInputs

    inputs = PlanInputs(seq=8192, cp=8, hw="h100-ib", heads=32, kv_heads=8, head_dim=128)
    setup = build_infer(model="llama3-8b", hw="h100-ib", prompt=8192, cp=8, output=0)[0]
    machine = build_machine(load_profile("h100-ib"))
    values = attention_bind(inputs, setup, machine)
    a2a = machine.link(8, "alltoall")
    assert (values["B_cpa"], values["alpha_cpa"]) == (a2a.bandwidth, a2a.latency_s or 5e-6)
    # with the whole query ring hidden (o_cp = 1, attention far longer than the ring, no SM slowdown) what
    # is left is the return: 2 alpha + C_passQ_out / B of the all-to-all, whatever the ring hop's link
    v = {**values, "T_n": 8192, "K_c": 65536, "o_cp": 1.0, "s_comm": 0.0, "F_attn": 1.0}
    v |= {"B_cp": 1e3, "alpha": 1e-3}
    ret = numeric.passq_return_bytes(**{a: v[a] for a in numeric.ARGS["passq_return_bytes"]})
    assert ret == 7 * (8192 // 8) * 32 * (128 * 2 + 4)
    exposed = numeric.passq_exposed_s(**{a: v[a] for a in numeric.ARGS["passq_exposed_s"]})
    assert exposed == pytest.approx(2 * v["alpha_cpa"] + ret / v["B_cpa"], rel=1e-12)


def test_mha_pass_q_steps_are_always_the_smaller() -> None:
    # n_kv = h: a query block is half a KV block, so 2·n_kv/h = 2 exceeds any new-token share; pass-KV
    # wins only where its steps hide under attention (T >= T_hide)
    follow = infer(model="llama2-7b", hw="h100-ib", prompt="8k", cached="1M", cp=8, output=0).prefill
    assert follow.passq_max_new_fraction == 2
    assert follow.passkv_hidden_min_new_tokens > 8192 and follow.rule_scheme == "pass-q"
    full = infer(model="llama2-7b", hw="h100-ib", prompt="1M", cp=8, output=0).prefill
    assert full.passkv_hidden_min_new_tokens < 2**20 and full.rule_scheme == "pass-kv"


def test_chunked_prefill_does_the_same_attention_work() -> None:
    # sum over chunks of T_i (K_i + T_i/2) = T²/2 exactly when the chunks cover the prompt
    v = {"b": 1, "N": 4, "t": 1, "h": 32, "d": 128, "c": 0.5}
    whole = numeric.prefill_attn_flops(**v, T_n=65536, K_c=1000)
    parts = sum(numeric.prefill_attn_flops(**v, T_n=8192, K_c=1000 + i * 8192) for i in range(8))
    assert parts == pytest.approx(whole, rel=1e-12)
    one = infer(model="llama3-8b", hw="h100-nvlink", prompt="64k", cp=4, output=0)
    chunked = infer(model="llama3-8b", hw="h100-nvlink", prompt="64k", cp=4, output=0, chunk="8k")
    assert chunked.prefill.chunks == 8
    assert chunked.ttft_s >= one.ttft_s  # same FLOP on smaller kernels


def test_breakdown_sums_to_ttft() -> None:
    out = infer(**H405, prompt="128k", cp=4, pp=2, chunk="32k")
    assert sum(out.prefill.breakdown.model_dump().values()) == pytest.approx(out.ttft_s, rel=1e-12)


def test_cp_shortens_a_long_prefill_nearly_linearly() -> None:
    two, sixteen = (infer(**H405, prompt="1M", cp=n).ttft_s for n in (2, 16))
    assert 6.5 < two / sixteen <= 8.5


# --- decode ---------------------------------------------------------------------------------------


def test_decode_merge_bytes_by_hand() -> None:
    # (N-1) ranks x 16 query heads per TP rank x (128 x 2 B of O + 4 B of LSE)
    dec = infer(**H405, prompt="1M", cp=16).decode
    assert dec.merge_bytes_per_layer == 15 * 16 * (128 * 2 + 4)


def test_decode_runs_its_multiplies_then_its_attention_each_at_its_own_roofline() -> None:
    out = infer(model="llama3-8b", hw="h100-nvlink", prompt="32k", output=1)
    dec = out.decode
    assert dec.cp_merge_s == 0 and dec.tp_s == 0 and dec.partial_merge_s == 0 and dec.fixed_s == 0
    # sampling reads the fp32 logits twice: 2 x 128,256 x 4 B at the 2.68 TB/s memory-bound kernels reach
    assert dec.sampling_s == pytest.approx(2 * 128_256 * 4 / H100_STREAMING, rel=1e-12)
    assert dec.compute_s == pytest.approx(dec.matmul_compute_s + dec.attention_compute_s, rel=1e-12)
    multiplies = max(dec.weight_read_s, dec.matmul_compute_s)
    attention = max(dec.kv_read_s, dec.attention_compute_s)
    assert dec.tpot_s == pytest.approx(multiplies + attention + dec.sampling_s, rel=1e-12)
    # One-row multiplies have too few output tiles for one wave: split-K kernels, each reading its weights at
    # the 2.68 TB/s memory-bound kernels reach, then multiplying (test_step_costs), so they take longer than
    # the 32 layers' weights alone; one query against 32K cached tokens is bound by reading them.
    layer_weights = 32 * (4096 * 6144 + 4096 * 4096 + 4096 * 28_672 + 14_336 * 4096) * 2 / H100_STREAMING
    assert layer_weights < dec.matmul_compute_s and dec.attention_compute_s < dec.kv_read_s


@pytest.mark.parametrize(("batch", "sustained"), [(64, False), (896, True)])
def test_decode_multiplies_read_the_sustained_clock_only_past_the_ridge(batch: int, sustained: bool) -> None:
    """Llama 2 7B in fp8 on an H100: 2b/p_w FLOP per weight byte against the fp8 table's plateau over the
    2.68 TB/s memory-bound kernels reach, about 225: batch 64 waits on HBM at the boost clock, batch 896 is
    bound by its FLOP at the clock a compute-bound step holds."""
    flags = dict(model="llama2-7b", hw="h100-nvlink", prompt=128, output=1, batch=batch, weights="fp8")
    setup, overrides = build_infer(**flags)
    job = Serving.of(setup, overrides)
    machine = job.gemm if sustained else job.gemm.at_boost()
    values = {**serving_bind(job), "F_gemm": layer_gemm_rate(job.model, machine, 1, batch)}
    name = "decode_gemm_compute_s"
    expected = float(getattr(numeric, name)(**{a: values[a] for a in numeric.ARGS[name]}))
    assert infer(**flags).decode.matmul_compute_s == pytest.approx(expected, rel=1e-12)


def test_a_large_batch_decode_adds_its_compute_bound_multiplies_to_its_cache_reads() -> None:
    """At batch 896 the multiplies are bound by their FLOP and the attention by the cache it reads: separate
    kernels, one after the other, so the step is their sum, longer than either roofline of the whole step."""
    dec = infer(model="llama2-7b", hw="h100-nvlink", prompt=128, output=128, batch=896, weights="fp8").decode
    assert dec.matmul_compute_s > dec.weight_read_s and dec.kv_read_s > dec.attention_compute_s
    multiplies, attention = dec.matmul_compute_s, dec.kv_read_s  # the parts are the last token's
    assert dec.tpot_last_s == pytest.approx(multiplies + attention + dec.sampling_s, rel=1e-12)
    assert dec.tpot_last_s > max(dec.weight_read_s + dec.kv_read_s, dec.compute_s) + dec.sampling_s


@pytest.mark.parametrize(
    ("model", "tp", "reads"), [("llama2-70b", 2, 8), ("llama2-70b", 16, 4), ("llama2-7b", 1, 1)]
)
def test_a_decode_kernel_reading_by_query_head_reads_the_cache_once_per_query_head(
    model: str, tp: int, reads: int
) -> None:
    """TensorRT-LLM's masked MHA kernel: each of a rank's h/t query heads reads its KV head's cache, h/n_kv
    times the bytes (64 over 8 heads), h/t where TP replicates the KV heads (TP 16: 4 query heads over one KV
    head a rank), and no more for MHA; the cache it holds is the same."""
    values = {"model": model, "hw": "h100-nvlink", "prompt": 2048, "output": 128, "batch": 8, "tp": tp}
    once, per_head = infer(**values), infer(**values, decode_kv_reads="per-query-head")
    assert per_head.decode.kv_read_s == pytest.approx(reads * once.decode.kv_read_s, rel=1e-12)
    assert per_head.memory.kv_cache_bytes_per_device == once.memory.kv_cache_bytes_per_device


def test_cp_for_decode_pays_at_1m_and_only_adds_latency_at_4k() -> None:
    long = infer(**H405, prompt="1M", cp=16).decode
    assert long.cp_latency_saved_s > 0 and long.cp_latency_added_s == 0 and long.max_batch_at_cp1 == 0
    short = infer(model="llama3-8b", hw="h100-ib", prompt="4k", cp=8, output=0).decode
    assert short.cp_latency_added_s > 0 and short.cp_latency_saved_s == 0


# --- published figures ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(row, marks=pytest.mark.xfail(strict=True, reason=row.misses)) if row.misses else row
        for row in ROWS + HELD_OUT
    ],
    ids=lambda r: r.key,
)
def test_published_serving_figures(row) -> None:
    """Every published row, calibration or held out, within 15 %, or a named known miss that must still miss."""
    assert abs(row.error()) <= GOAL, f"{row.key}: {row.predicted():.4g} vs {row.published:.4g}"


def test_every_published_row_states_its_serving_and_a_miss_says_why() -> None:
    for row in ROWS + HELD_OUT:
        assert row.source.startswith("[") and row.serving and row.run
        assert any(dtype in row.serving for dtype in ("fp8", "fp16", "bf16")) and "TP" in row.serving
    assert sum(bool(row.misses) for row in ROWS) < len(ROWS)
    assert len({row.key for row in ROWS + HELD_OUT}) == len(ROWS) + len(HELD_OUT)


def test_held_out_rows_are_the_seeded_draw_and_calibrate_nothing() -> None:
    """A third of the added rows per source, by random.seed(2026); none of them in ROWS (the calibration set)."""
    assert draw_held_out(NEW) == HELD_KEYS == {row.key for row in HELD_OUT}
    assert not HELD_KEYS & {row.key for row in ROWS}
    assert {row.key for row in NEW} <= {row.key for row in ROWS + HELD_OUT}


SERVING_ROW = (
    "- {key: k, source: '[S] low latency', serving: 'fp16; TP 1', run: r, metric: ttft, published: 0.1,\n"
    "   setup: {model: llama2-7b, hw: a100-nvlink, prompt: 128, output: 1}, misses: '', added_later: false}\n"
)


@pytest.mark.parametrize(
    ("edit", "held_out", "line", "said"),
    [
        (("", ""), True, 2, "field 'added_later': a held-out row is one added later"),
        (("metric: ttft", "metric: ttfb"), False, 1, "field 'metric': expected one of ttft, tokens_per_s"),
        (("added_later: false", "added_later: 0"), False, 2, "field 'added_later': expected true or false"),
        (("source: '[S] low", "source: 'S low"), False, 1, "field 'source': must start with the bracketed"),
        (("hw: a100-nvlink, ", ""), False, 2, "field 'setup': states no hw, which ttft needs"),
    ],
)
def test_a_malformed_serving_row_names_the_file_the_line_the_key_and_the_field(
    tmp_path: Path, edit: tuple[str, str], held_out: bool, line: int, said: str
) -> None:
    from costmodel.core.errors import InputError
    from costmodel.inference.published import load

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(SERVING_ROW)
    assert load(good)[0].published == 0.1
    bad.write_text(SERVING_ROW.replace(*edit))
    with pytest.raises(InputError) as raised:
        load(bad, held_out)
    assert f"{bad}:{line}: row 'k', {said}" in str(raised.value)


def test_target_finds_the_fewest_ranks() -> None:
    out = infer(**H405, prompt="1M", cp=16, target_ttft=100.0)
    assert out.target.cp == 16 and out.target.gpus == 128
    assert infer(**H405, prompt="1M", cp=8).ttft_s > 100.0


# --- the command ----------------------------------------------------------------------------------


def test_json_contract(cli) -> None:
    result = cli(
        "infer",
        "--model",
        "llama3-70b",
        "--prompt",
        "256k",
        "--hw",
        "h100-ib",
        "--tp",
        "8",
        "--cp",
        "4",
        "--batch",
        "2",
        "--cached",
        "16k",
        "--output",
        "512",
        "--kv-dtype",
        "fp8",
        "--format",
        "json",
    )
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert out["schema"] == "cp-plan/inference/v7"
    inference = out["inference"]
    assert inference["prefill"]["scheme"] in ("pass-kv", "pass-q", "allgather")
    for key in ("kv_cache_bytes_per_device", "ttft_s", "tpot_s"):
        assert inference[key] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch: must be >= 1"),
        (["--prompt", "1000", "--cp", "16"], "--prompt: 1000 tokens do not split evenly over --cp 16"),
        (["--tp", "3"], "--tp: 3 must divide"),
        (["--chunk", "6", "--cp", "4"], "--chunk: 6 tokens do not split evenly"),
        (["--weights", "fp8", "--hw", "a100-nvlink"], "--weights: profile 'a100-nvlink' has no fp8"),
        (["--target-tpot", "0"], "--target-tpot: must be > 0"),
        (["--host-overhead", "-1"], "--host-overhead: must be >= 0"),
    ],
)
def test_bad_input_exits_2_with_one_line(cli, args: list[str], message: str) -> None:
    result = cli("infer", "--model", "llama3-8b", "--prompt", "64k", *args)
    assert result.code == 2 and result.out == ""
    assert message in result.err and result.err.count("\n") == 1


def test_prompt_longer_than_the_presets_context(cli, tmp_path: Path) -> None:
    preset = tmp_path / "short.yaml"
    preset.write_text(
        "name: short\nsource: test\nheads: 8\nkv_heads: 2\nhead_dim: 64\nlayers: 2\nhidden: 512\n"
        "ffn_hidden: 1024\nvocab: 1000\ncontext_length: 4096\n"
    )
    result = cli("infer", "--model", str(preset), "--prompt", "4096", "--output", "1", "--hw", "h100-nvlink")
    assert result.code == 2
    assert (
        "--prompt: cached + prompt + output = 4,097 tokens exceeds the model's context of 4,096" in result.err
    )


def test_a_mixture_of_experts_is_refused_not_undercounted(cli) -> None:
    mixtral = Path(__file__).parent / "data" / "hf" / "mixtral-8x7b.json"
    result = cli("infer", "--model", str(mixtral), "--prompt", "32k", "--hw", "h100-ib", "--tp", "8")
    assert result.code == 2 and result.out == ""
    assert "--model:" in result.err and "mixture of experts (8 experts)" in result.err


@settings(max_examples=12, deadline=None)
@given(
    cached=st.sampled_from([0, 4096, 1 << 20]),
    prompt=st.sampled_from([4096, 65536, 1 << 20]),
    cp=st.sampled_from([2, 8, 16]),
)
def test_auto_takes_the_fastest_scheme_and_an_asked_one_is_kept(cached: int, prompt: int, cp: int) -> None:
    auto = infer(**H405, prompt=prompt, cached=cached, cp=cp).prefill
    assert auto.schemes[auto.scheme].ttft_s == min(s.ttft_s for s in auto.schemes.values())
    for scheme in ("pass-kv", "pass-q", "allgather"):
        asked = infer(**H405, prompt=prompt, cached=cached, cp=cp, prefill_scheme=scheme)
        assert asked.prefill.scheme == scheme
        assert asked.ttft_s == pytest.approx(auto.schemes[scheme].ttft_s, rel=1e-12)


# --- decode's fixed costs and the TPOT target --------------------------------------------------------


def test_eager_decode_pays_every_layer_s_launches_and_the_host_its_time() -> None:
    # llama3-8b, TP 1: 32 layers x 12 kernels x the profile's 25 us of eager host time per kernel; the host's
    # 0.2 ms once
    base = {"model": "llama3-8b", "hw": "h100-nvlink", "prompt": "32k", "output": 1}
    graphs = infer(**base).decode
    eager = infer(**base, cuda_graphs=False).decode
    host = infer(**base, host_overhead=2e-4).decode
    assert graphs.fixed_s == 0 and eager.fixed_s == pytest.approx(32 * 12 * 25e-6, rel=1e-12)
    assert eager.tpot_s - graphs.tpot_s == pytest.approx(32 * 12 * 25e-6, rel=1e-9)
    assert host.host_s == 2e-4 and host.tpot_s - graphs.tpot_s == pytest.approx(2e-4, rel=1e-9)


def test_decode_merges_the_other_ranks_partials_in_fp32() -> None:
    # 15 other ranks x 16 heads per TP rank x 3 x 129 x 4 B through HBM at 3.35 TB/s, 126 layers
    dec = infer(**H405, prompt="1M", cp=16).decode
    assert dec.partial_merge_s == pytest.approx(126 * 15 * 16 * 3 * 129 * 4 / H100_STREAMING, rel=1e-12)


@settings(max_examples=8, deadline=None)
@given(target=st.sampled_from([0.008, 0.012, 0.02, 0.05]), cp=st.sampled_from([2, 4]))
def test_target_tpot_is_the_largest_batch_within_it(target: float, cp: int) -> None:
    setup = {"model": "llama3-8b", "hw": "h100-nvlink", "prompt": "32k", "output": 256, "cp": cp}
    layout = infer(**setup, target_tpot=target).decode_target.cp_layout
    assert (layout.tp, layout.cp) == (1, cp)
    if layout.max_batch:
        best = infer(**setup, batch=layout.max_batch)
        assert best.memory.fits and best.tpot_s <= target
        assert best.tpot_s == pytest.approx(layout.tpot_at_max_batch_s, rel=1e-12)
        assert layout.tokens_per_s == pytest.approx(layout.max_batch / best.tpot_s, rel=1e-12)
    beyond = infer(**setup, batch=layout.max_batch + 1)
    assert not beyond.memory.fits or beyond.tpot_s > target
    assert layout.limited_by == ("memory" if not beyond.memory.fits else "tpot")


def test_cp_over_the_cache_beats_tp_only_where_the_cache_needs_it() -> None:
    # 405B at 1M: the whole cache on every TP rank of 128 does not fit, the CP shards do
    long = infer(**{**H405, "output": 1024}, prompt="1M", cp=16, target_tpot=0.06).decode_target
    assert long.tp_layout.max_batch == 0 and long.tp_layout.limited_by == "none"
    assert long.cp_layout.max_batch >= 1 and long.cp_beats_tp
    # 70B fp8 at 32K on one node: TP 8 holds a quarter of the weights per GPU, so more caches fit
    short = infer(
        model="llama3-70b",
        hw="h100-nvlink",
        prompt="32k",
        tp=2,
        cp=4,
        weights="fp8",
        output=256,
        batch=8,
        target_tpot=0.03,
    ).decode_target
    cp, tp = short.cp_layout, short.tp_layout
    assert (tp.tp, tp.cp) == (8, 1) and cp.limited_by == tp.limited_by == "memory"
    assert tp.max_batch > cp.max_batch > 8 and tp.tpot_at_max_batch_s <= 0.03
    assert tp.tokens_per_s > cp.tokens_per_s and short.cp_beats_tp is False


@pytest.mark.parametrize(("weights", "tp"), [("bf16", 8), ("bf16", 2), ("fp8", 8)])
def test_the_output_layer_reads_its_weights(weights: str, tp: int) -> None:
    """The first token's logits read the whole vocab-parallel output matrix from HBM: Llama 3 70B's
    128,256 x 8,192 at 3.35 TB/s is 78.4 µs in bf16 over TP 8 (its FLOP alone took 1.3 µs)."""
    report = evaluate_infer(*build_infer(model="llama3-70b", hw="h100-nvlink", tp=tp, prompt=131072,
                                         weights=weights))  # fmt: skip
    head = report.inference.prefill.breakdown.output_layer_s
    per_weight = {"bf16": 2, "fp8": 1}[weights]
    assert head == pytest.approx(128_256 * 8_192 * per_weight / (tp * H100_STREAMING), rel=1e-6)


def test_infer_strict_exits_1_when_the_request_does_not_fit(cli) -> None:
    """405B with a 1M prompt on one node of H100s needs 294.3 GB a device: 213.6 GB more than the 80.7 GB usable
    (the 79.11 GiB a process can allocate, less the default 5 % headroom)."""
    args = ("infer", "--model", "llama3-405b", "--hw", "h100-nvlink", "--tp", "8", "--prompt", "1M")
    data = cli(*args, "-f", "json").json()["inference"]["memory"]
    assert data["fits"] is False and data["shortfall_bytes"] == pytest.approx(
        2.9427e11 - 0.95 * 79.11 * 2**30, rel=1e-4
    )
    assert cli(*args).code == 0 and "DOES NOT FIT" in cli(*args).out
    assert cli(*args, "--strict").code == 1
    assert cli("infer", "--model", "llama3-8b", "--hw", "h100-nvlink", "--prompt", "8k", "--strict").code == 0


def test_the_table_weighs_prefill_schemes_only_where_the_prompt_is_split(cli) -> None:
    """At CP 1 there is no scheme to choose and no CP to compare decode against: the table says so in one
    phrase and prints no scheme table; at CP 4 it names the chosen scheme and lists all three."""
    job = ["infer", "--model", "llama3-8b", "--prompt", "128k", "--hw", "h100-ib"]
    alone = cli(*job).out
    assert "CP 1: no prefill scheme to choose" in alone
    assert "pass-q" not in alone and "against CP 1" not in alone
    split = cli(*job, "--cp", "4").out
    assert "with pass-kv (rule:" in split and "against CP 1, CP" in split
    assert all(scheme in split for scheme in ("pass-kv", "pass-q", "allgather"))


def test_tp_comm_overlap_hides_all_but_one_chunk_of_the_prefills_tp_collectives(cli) -> None:
    """--tp-comm-overlap pipelines TP's collectives with the multiplies in t chunks, as in training: the
    prefill at TP 8 gets faster; at TP 1 there is nothing to hide and nothing moves."""
    job = ["infer", "--model", "llama3-70b", "--prompt", "32k", "--hw", "h100-nvlink", "-f", "json"]
    plain = cli(*job, "--tp", "8").json()["inference"]
    overlapped = cli(*job, "--tp", "8", "--tp-comm-overlap").json()["inference"]
    assert overlapped["ttft_s"] < plain["ttft_s"]
    single = [
        cli(*job, "--tp", "1", *flag).json()["inference"]["ttft_s"] for flag in ([], ["--tp-comm-overlap"])
    ]
    assert single[0] == single[1]


def test_explain_shows_the_chosen_prefill_and_decode_terms(cli) -> None:
    result = cli("infer", "--model", "llama3-8b", "--hw", "h100-nvlink", "--prompt", "64k", "--cp", "4",
                 "--output", "16", "--explain", "--format", "json")  # fmt: skip
    data = result.json()
    rows = {row["name"]: row for row in data["explain"]}
    prefill, decode = data["inference"]["prefill"], data["inference"]["decode"]
    layers = 32  # llama3-8b, pp 1, one chunk: a layer's attention x layers is the breakdown's
    attention = float(rows["prefill_attn_s"]["value"].split()[0])
    assert layers * attention == pytest.approx(prefill["breakdown"]["attention_s"], rel=1e-5)
    # decode's formulas at the last output token: its TPOT, and the terms behind it
    assert float(rows["tpot_s"]["value"].split()[0]) == pytest.approx(decode["tpot_last_s"], rel=1e-5)
    exposed = {"pass-kv": "passkv_exposed_s", "pass-q": "passq_exposed_s", "allgather": "prefill_allgather_s"}
    assert {"decode_kv_read_s", "decode_merge_s", exposed[prefill["scheme"]]} <= set(rows)
    assert not (set(exposed.values()) - {exposed[prefill["scheme"]]}) & set(rows)  # the chosen scheme only
    assert rows["tpot_s"]["formula"].startswith("t_token = ")
    table = cli("infer", "--model", "llama3-8b", "--hw", "h100-nvlink", "--prompt", "64k", "--cp", "4",
                "--explain").out  # fmt: skip
    assert "term by term" in table and "exposed CP comm" in table  # labels on screen, keys in JSON
    assert "exposed_cp_s" in prefill["breakdown"]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--model", "llama3-70b", "--prompt", "1M", "--hw", "h100-ib", "--tp", "8"], "cp"),
        (["--model", "llama3-70b", "--prompt", "128k", "--hw", "h100-ib", "--tp", "1"], "tp"),
    ],
)
def test_a_request_that_does_not_fit_says_what_would(cli, args: list[str], flag: str) -> None:
    """The suggestion is checked by asking again: at the degree named it fits, at half of it it does not."""
    result = cli("infer", *args, "--format", "json")
    out = json.loads(result.out)["inference"]
    assert result.code == 0 and not out["memory"]["fits"]
    degree = out["fits_with"][flag]
    assert degree is not None and out["fits_with"]["gpus"] > out["gpus"]
    named = [*args, f"--{flag}", str(degree)] if flag == "cp" else [*args[:-1], str(degree)]
    assert json.loads(cli("infer", *named, "--format", "json").out)["inference"]["memory"]["fits"]
    if degree // 2 > int(args[-1] if flag == "tp" else 1):
        half = [*args, f"--{flag}", str(degree // 2)] if flag == "cp" else [*args[:-1], str(degree // 2)]
        assert not json.loads(cli("infer", *half, "--format", "json").out)["inference"]["memory"]["fits"]
    table = cli("infer", *args)
    assert f"fix   fits with --{flag} {degree}" in table.out
    assert cli("infer", *args, "--strict").code == 1  # as `step --strict`: a plan that does not fit fails
    fits = json.loads(cli("infer", *named, "--format", "json").out)["inference"]
    assert fits["fits_with"] is None


def test_infer_gpus_searches_the_serving_layouts_and_plans_with_the_fastest_that_fits(cli) -> None:
    args = ["infer", "--model", "llama3-70b", "--prompt", "1M", "--hw", "h100-ib"]
    result = cli(*args, "--gpus", "64", "--format", "json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    rows = data["search"]["layouts"]
    assert data["search"]["considered"] == len(rows) and data["search"]["fit"] == sum(r["fits"] for r in rows)
    assert all(64 % r["gpus"] == 0 and r["replicas"] * r["gpus"] == 64 for r in rows)
    assert all(r["gpus"] == r["tp"] * r["cp"] * r["pp"] for r in rows)
    fitting = [r for r in rows if r["fits"]]
    pick = rows[0]
    assert pick["fits"] and pick["ttft_s"] == min(r["ttft_s"] for r in fitting)
    assert (data["inputs"]["tp"], data["inputs"]["cp"], data["inputs"]["pp"]) == (
        pick["tp"],
        pick["cp"],
        pick["pp"],
    )
    # the pick is what infer says of that layout when it is named
    named = ["--tp", str(pick["tp"]), "--cp", str(pick["cp"]), "--pp", str(pick["pp"])]
    alone = json.loads(cli(*args, *named, "--format", "json").out)["inference"]
    assert alone["ttft_s"] == pytest.approx(pick["ttft_s"], rel=1e-12) and alone["memory"]["fits"]
    table = cli(*args, "--gpus", "64")
    assert "Serving layouts of 64 GPUs" in table.out
    refused = cli(*args, "--gpus", "8", "--explain")
    assert refused.code == 2 and refused.err.startswith("cp-plan: error: --explain: not with --gpus")
    # a degree given beside --gpus is held, the others searched (as recommend holds its fixed layout)
    held = json.loads(cli(*args, "--gpus", "64", "--tp", "8", "--format", "json").out)
    assert {row["tp"] for row in held["search"]["layouts"]} == {8} and held["inputs"]["tp"] == 8
    searched = {(r["tp"], r["cp"], r["pp"]): r["ttft_s"] for r in rows}
    for row in held["search"]["layouts"]:  # the open search's TP 8 layouts, each timed as it times them
        assert searched[(row["tp"], row["cp"], row["pp"])] == pytest.approx(row["ttft_s"], rel=1e-12)
    assert len(held["search"]["layouts"]) == sum(tp == 8 for tp, _, _ in searched)
    refused = cli(*args, "--gpus", "8", "--tp", "3")
    assert refused.code == 2 and "no layout of 8 GPUs, TP 3 serves this request" in refused.err


@pytest.mark.parametrize("kernel", ["flash", "sdpa-flash", "sdpa-cudnn", "cudnn"])
def test_the_prefill_reads_the_attention_kernel_asked_for(kernel: str) -> None:
    """One 128K prefill at CP 1: its attention is one causal forward call, read on the named kernel's table at
    the sustained clock, and the same FLOP whatever the kernel (time x rate unchanged); decode, memory-bound,
    does not move."""

    def infer(name: str) -> dict:
        return evaluate_infer(
            *build_infer(model="llama3-8b", prompt=131072, hw="h100-nvlink", attention_kernel=name)
        ).model_dump()["inference"]

    profile = load_profile("h100-nvlink")
    table = attention_rate(
        profile, "bf16", 131072, 131072, 128, True, False, None if kernel == "flash" else kernel
    )
    asked, default = infer(kernel), infer("flash")
    rate = asked["prefill"]["attention_flops_per_s"]
    assert rate == pytest.approx(profile.kernels.sustained_clock * table, rel=1e-12)
    work = asked["prefill"]["breakdown"]["attention_s"] * rate
    assert work == pytest.approx(
        default["prefill"]["breakdown"]["attention_s"] * default["prefill"]["attention_flops_per_s"], rel=1e-9
    )
    assert asked["tpot_s"] == default["tpot_s"]


@pytest.mark.parametrize(
    ("hw", "kernel", "said"),
    [
        (
            "h100-nvlink",
            "unfused",
            "unfused is Megatron's training attention (cp-plan step); profile 'h100-nvlink' has tables for "
            "flash, cudnn, fa2, sdpa-cudnn, sdpa-flash",
        ),
        ("a100-nvlink", "cudnn", "'cudnn': profile 'a100-nvlink' has tables for flash"),
    ],
)
def test_an_attention_kernel_a_prefill_cannot_read_is_one_line(cli, hw: str, kernel: str, said: str) -> None:
    result = cli("infer", "--model", "llama3-8b", "--prompt", "32k", "--hw", hw, "--attention-kernel", kernel)
    assert result.code == 2
    assert result.err.splitlines() == [f"cp-plan: error: --attention-kernel: {said}"]
