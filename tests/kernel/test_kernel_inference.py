"""The inference kernel: pass-Q and pass-KV ring prefills after a cached prefix and the decode merge of (O, LSE) over
ranks, exact against float64 and torch SDPA in fp32 and bf16."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import inference_workers

from costmodel.kernel.block import merge_lse
from costmodel.kernel.inference import (
    _attend,
    _merge,
    decode_attention,
    pass_kv_prefill,
    pass_q_prefill,
)
from costmodel.kernel.launch import run_local
from costmodel.kernel.masks import FULL, MaskRule
from costmodel.kernel.reference import reference_attention
from costmodel.kernel.selftest import TOLERANCES

pytestmark = pytest.mark.kernel

CASES = [
    {
        "batch": 2,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "cached": 12,
        "new": 12,
        "dtype": "float32",
        "seed": 0,
    },
    {
        "batch": 1,
        "heads": 6,
        "kv_heads": 1,
        "head_dim": 8,
        "cached": 0,
        "new": 24,
        "dtype": "float32",
        "seed": 1,
    },
    {
        "batch": 1,
        "heads": 4,
        "kv_heads": 2,
        "head_dim": 16,
        "cached": 30,
        "new": 6,
        "dtype": "bfloat16",
        "seed": 2,
    },
]


def within(got: torch.Tensor, want: torch.Tensor, dtype: str) -> bool:
    atol, rtol = TOLERANCES[dtype]
    error = (got.double() - want.double()).abs().max().item()
    return bool(torch.isfinite(got).all()) and error <= atol + rtol * want.abs().max().item()


def expected(case: dict) -> tuple[torch.Tensor, ...]:
    """Prefill (out, lse) of the new queries in float64, the same by SDPA, and decode by SDPA."""
    q, k, v, q1 = inference_workers.problem(case)
    q_pos = case["cached"] + np.arange(case["new"])
    out, lse = reference_attention(q, k, v, MaskRule(True), q_pos=q_pos)
    mask = torch.from_numpy(MaskRule(True).dense(q_pos, np.arange(k.shape[2])))
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out, lse, sdpa, F.scaled_dot_product_attention(q1, k, v, enable_gqa=True)


def test_merge_of_two_halves_is_the_whole() -> None:
    # the online-softmax example: (m, l, u) = (0, 1, 2) and (ln 3, 1, 10), i.e. (O, LSE) = (2, 0) and
    # (10, ln 3), merge to O = (1·2 + 3·10)/4 = 8 at LSE = ln 4
    out, lse = torch.tensor([[2.0]]), torch.tensor([0.0])
    merge_lse(out, lse, torch.tensor([[10.0]]), torch.tensor([np.log(3.0)]))
    assert out.item() == pytest.approx(8.0, rel=1e-6) and lse.item() == pytest.approx(np.log(4.0), rel=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['dtype']}-cached{c['cached']}")
def test_decode_merge_over_cache_shards_on_one_process(case: dict) -> None:
    q, k, v, q1 = inference_workers.problem(case)
    shards = np.array_split(np.arange(k.shape[2]), 3)
    parts = [_attend(q1, k[:, :, s], v[:, :, s], np.zeros(1, np.int64), s, FULL) for s in shards]
    out, _ = _merge(
        torch.stack([o.to(q1.dtype) for o, _ in parts]), torch.stack([l for _, l in parts]), q1.dtype
    )
    assert within(out, expected(case)[3], case["dtype"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['dtype']}-cached{c['cached']}")
def test_one_rank_prefill_and_decode_equal_sdpa(case: dict) -> None:
    q, k, v, q1 = inference_workers.problem(case)
    q_pos = case["cached"] + np.arange(case["new"])
    out, lse = pass_q_prefill(q, k, v, q_pos, np.arange(k.shape[2]))
    want_out, want_lse, sdpa, decode = expected(case)
    assert within(out, want_out, case["dtype"]) and within(out, sdpa, case["dtype"])
    assert within(lse, want_lse, "float32")
    assert within(decode_attention(q1, k, v)[0], decode, case["dtype"])
    kv_out, kv_lse = pass_kv_prefill(q, k, v, q_pos, np.arange(k.shape[2]))
    assert within(kv_out, want_out, case["dtype"]) and within(kv_lse, want_lse, "float32")


@pytest.mark.slow  # spawns three processes
@pytest.mark.parametrize("n", [3])
def test_pass_q_and_pass_kv_rings_and_decode_merge_over_gloo(n: int) -> None:
    by_rank = run_local(inference_workers.run, n, args=(CASES,), timeout_s=240.0, device="cpu")
    for index, case in enumerate(CASES):
        want_out, want_lse, sdpa, decode = expected(case)
        for rank in range(n):
            q_pos, _ = inference_workers.held(case, n, rank)
            rows = torch.from_numpy(q_pos - case["cached"])
            out, lse, dec, kv_out, kv_lse = by_rank[rank][index]
            assert within(out, want_out[:, :, rows], case["dtype"]), (case, rank)
            assert within(out, sdpa[:, :, rows], case["dtype"]), (case, rank)
            assert within(lse, want_lse[:, :, rows], "float32"), (case, rank)
            assert within(dec, decode, case["dtype"]), (case, rank)
            assert within(kv_out, want_out[:, :, rows], case["dtype"]), (case, rank)
            assert within(kv_lse, want_lse[:, :, rows], "float32"), (case, rank)


@pytest.mark.slow  # spawns two processes
def test_selftest_runs_the_inference_variants_in_bf16() -> None:
    from costmodel.kernel.selftest import SelftestConfig, run_selftest

    config = SelftestConfig(
        seq=32,
        heads=4,
        kv_heads=2,
        head_dim=16,
        causal=True,
        layout="zigzag",
        dtype="bfloat16",
        variants=("pass-q", "decode"),
        device="cpu",
    )
    result = run_selftest(config, 2, timeout_s=240.0)
    assert result.passed
    assert set(result.variants) == {"pass-q", "decode"}
    assert all(set(v.errors) == {"out", "lse"} for v in result.variants.values())
