"""Benchmarks of the torch reference kernel, ratios measured in one run (docs/kernel.md, item 7).

1. Block kernel against torch SDPA on the same shape (goal: throughput >= 0.8x), forward and
   forward+backward, fully visible and causal-diagonal blocks.
2. Ring attention at N=2 (local processes, gloo on CPU): measured forward / backward time against
   Σ_steps max(compute_step, comm_step) with each timed on its own (overlap efficiency; goal >= 0.85).

Timings vary up to 2x run to run on a shared CPU: every figure is the lower quartile of single calls, and the ring's figures are
measured in interleaved rounds so that a slow spell hits all of them alike.

    python benchmarks/kernel.py [--tokens 2048 --ring-tokens 1024 256 --heads 8 --kv-heads 8 --head-dim 64
                                 --dtypes bfloat16 float32 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

from costmodel.kernel.block import block_attention, block_attention_backward
from costmodel.kernel.launch import run_local
from costmodel.kernel.masks import MaskRule, plan_block
from costmodel.kernel.timing import LayerShape, Repeats, random_qkv, time_ring_overlap, typical_times

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def block_and_sdpa_times(q, k, v, dout, causal: bool, repeats: int) -> dict[str, float]:
    """Our block kernel and SDPA on the same inputs, forward and forward+backward, interleaved rounds."""
    leaves = [x.requires_grad_() for x in (q, k, v)]
    token = np.arange(q.shape[2])
    plan = plan_block(MaskRule(causal), token, token)

    def ours_fwd_bwd() -> None:
        out, lse = block_attention(q, k, v, plan)
        block_attention_backward(dout, q, k, v, out, lse, plan)

    def sdpa_fwd() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)

    def sdpa_fwd_bwd() -> None:
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
        torch.autograd.grad(out, leaves, dout)

    runs = {
        "ours": lambda: block_attention(q, k, v, plan),
        "sdpa": sdpa_fwd,
        "ours fwd+bwd": ours_fwd_bwd,
        "sdpa fwd+bwd": sdpa_fwd_bwd,
    }
    times = typical_times(runs, torch.device("cpu"), repeats=repeats)
    times["flops"] = 4.0 * q.shape[0] * q.shape[1] * plan.visible_pairs * q.shape[3]
    return times


def block_vs_sdpa(args) -> list[dict]:
    rows = []
    for dtype_name in args.dtypes:
        q, k, v, dout = random_qkv(
            1, args.heads, args.kv_heads, args.tokens, args.head_dim, DTYPES[dtype_name]
        )
        for causal in (False, True):
            t = block_and_sdpa_times(q, k, v, dout, causal, args.repeats)
            rows.append(
                {
                    "dtype": dtype_name,
                    "causal": causal,
                    "block_forward_s": t["ours"],
                    "sdpa_forward_s": t["sdpa"],
                    "forward_ratio": t["sdpa"] / t["ours"],
                    "block_forward_backward_s": t["ours fwd+bwd"],
                    "sdpa_forward_backward_s": t["sdpa fwd+bwd"],
                    "forward_backward_ratio": t["sdpa fwd+bwd"] / t["ours fwd+bwd"],
                    "block_forward_gflops": t["flops"] / t["ours"] / 1e9,
                }
            )
    return rows


def _ring_rank(ctx, args, cases) -> list[dict]:
    rows = []
    for tokens, dtype_name, layout, causal, backward in cases:
        overlap = time_ring_overlap(
            LayerShape(tokens, args.heads, args.kv_heads, args.head_dim, DTYPES[dtype_name]),
            layout=layout,
            causal=causal,
            backward=backward,
            repeats=Repeats(args.ring_repeats),
        )
        rows.append(
            {
                "tokens_per_rank": tokens,
                "dtype": dtype_name,
                "layout": layout,
                "causal": causal,
                "pass": "backward" if backward else "forward",
                "measured_s": overlap.measured_s,
                "compute_step_s": list(overlap.compute_step_s),
                "comm_step_s": list(overlap.comm_step_s),
                "exposed_s": overlap.exposed_s,
                "bound_s": overlap.bound_s,
                "efficiency": overlap.efficiency,
            }
        )
    return rows


def ring_overlap(args) -> list[dict]:
    cases = [
        (tokens, dtype, layout, causal, backward)
        for tokens in args.ring_tokens
        for dtype in args.dtypes
        for layout, causal in (("contiguous", False), ("zigzag", True))
        for backward in (False, True)
    ]
    return run_local(_ring_rank, 2, args=(args, cases), timeout_s=args.timeout, device="cpu")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=2048, help="block kernel: queries = keys per block")
    parser.add_argument(
        "--ring-tokens",
        type=int,
        nargs="+",
        default=[1024, 256],
        help="ring: tokens per rank (S = 2x this); the small one shows comm-heavy steps",
    )
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=5, help="block kernel: timed runs per figure")
    parser.add_argument("--ring-repeats", type=int, default=9, help="ring: interleaved rounds per figure")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes, one timing each: the suite runs it"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.tokens, args.ring_tokens, args.heads, args.kv_heads, args.head_dim = 64, [64], 2, 2, 16
        args.dtypes, args.repeats, args.ring_repeats = ["float32"], 1, 1

    shape = f"b=1 h={args.heads} n_kv={args.kv_heads} d={args.head_dim}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"\nBlock kernel vs torch SDPA, {shape}, L_q = L_k = {args.tokens} (ratio = SDPA time / ours)")
    block_rows = block_vs_sdpa(args)
    for r in block_rows:
        print(
            f"  {r['dtype']:8} {'causal' if r['causal'] else 'full  '}  fwd {r['block_forward_s'] * 1e3:7.1f} ms "
            f"vs {r['sdpa_forward_s'] * 1e3:7.1f} ms = {r['forward_ratio']:.2f}x   fwd+bwd "
            f"{r['block_forward_backward_s'] * 1e3:7.1f} vs {r['sdpa_forward_backward_s'] * 1e3:7.1f} ms = "
            f"{r['forward_backward_ratio']:.2f}x   ({r['block_forward_gflops']:.0f} GFLOP/s fwd)"
        )

    print(
        f"\nRing N=2 (gloo, 2 local processes, 1 thread each), {shape} "
        "(efficiency = Σ max(compute, comm) / measured)"
    )
    ring_rows = ring_overlap(args)
    for r in ring_rows:
        steps = ", ".join(
            f"{c * 1e3:.1f}/{m * 1e3:.1f}" for c, m in zip(r["compute_step_s"], r["comm_step_s"])
        )
        print(
            f"  L={r['tokens_per_rank']:<5} {r['dtype']:8} {r['layout']:10} {'causal' if r['causal'] else 'full  '} {r['pass']:8} measured "
            f"{r['measured_s'] * 1e3:7.1f} ms  bound {r['bound_s'] * 1e3:7.1f} ms  efficiency "
            f"{r['efficiency']:.2f}   steps compute/comm ms: {steps}"
            + (f" + exposed {r['exposed_s'] * 1e3:.1f}" if r["exposed_s"] else "")
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "shape": shape,
                    "block_tokens": args.tokens,
                    "block_vs_sdpa": block_rows,
                    "ring_overlap": ring_rows,
                },
                handle,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
