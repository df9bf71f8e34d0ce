"""What one GPU's attention kernels achieve, beside what cp-plan assumes: measure on a CUDA machine, compare here.

    python benchmarks/gpu_kernels.py measure --out gpu.json      # on the GPU (torch only; ~2 minutes)
    python benchmarks/gpu_kernels.py compare gpu.json --hw h200-nvlink   # anywhere: the model beside it
    python benchmarks/gpu_kernels.py linears-csv gpu.json --out gemm.csv # for cp-plan hw fit-kernels --gemm

``measure`` times, in bf16:

- torch's scaled_dot_product_attention per backend (flash, cuDNN) over the FlashAttention papers' grid
  (batch x length = 16k tokens, 2,048 = heads x head_dim), forward and forward+backward, FLOP counted as
  those papers count them (forward 4·b·h·d·L² halved when causal, backward 2.5x the forward);
- packed windows and sliding windows through FlexAttention, whose block mask skips the 128 x 128 tiles
  with no visible pair, the rule cp-plan's simulator counts ("a tile pair costs if any pair in it is
  unmasked"); the block counts are saved with the timings, and torch's varlen kernel on the same
  documents where this torch has it;
- square bf16 matrix products.

``compare`` reads that file and prints: the simulator's executed tiles against FlexAttention's block
counts (they must be equal), the measured time of each mask against the time its executed tiles predict
at the causal window's rate per tile, the varlen kernel against the rate cp-plan reads for a block of
short documents (the rate at their work-weighted length), and the measured curves against the profile's
published kernel tables.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

TILE = 128


# --- measure (torch only: the CUDA machine need not have cp-plan's dependencies) -----------------------
def _timer(device):  # noqa: ANN001, ANN202
    import torch

    def median_ms(fn, repeats: int = 10, warmup: int = 3, inner: int = 1) -> float:  # noqa: ANN001
        """Median time of one ``fn()``; ``inner`` calls back to back per sample, so that a short kernel is
        timed as it runs in a busy stream (the next launch queued) rather than as the host's launch gap."""
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeats):
            if device.type != "cuda":
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                samples.append((time.perf_counter() - start) * 1e3 / inner)
                continue
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(inner):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(begin.elapsed_time(end) / inner)
        return statistics.median(samples)

    return median_ms


def _fwd_bwd(fn, q, k, v):  # noqa: ANN001, ANN202
    """forward and forward+backward closures of fn(q, k, v) with fresh gradients each call."""
    grad = None

    def forward():  # noqa: ANN202
        with __import__("torch").no_grad():
            return fn(q, k, v)

    def both():  # noqa: ANN202
        nonlocal grad
        if not q.requires_grad:  # FlexAttention has no CPU backward: the smoke run times the forward
            return forward()
        for t in (q, k, v):
            t.grad = None
        out = fn(q, k, v)
        if grad is None:
            grad = __import__("torch").randn_like(out)
        out.backward(grad)

    return forward, both


def attention_flops(batch: int, heads: int, head_dim: int, q_len: int, k_len: int, causal: bool) -> float:
    """Forward FLOP as the FlashAttention papers count them (causal: half)."""
    return 4.0 * batch * heads * head_dim * q_len * k_len / (2 if causal else 1)


def measure_sdpa(device, dtype, smoke: bool, long: bool = False) -> list[dict]:  # noqa: ANN001
    """SDPA per backend on the FlashAttention papers' grid (16K tokens a call, 512-16K long), or with
    ``long`` one sequence of 32K-128K a call, the lengths a long-context shard reaches."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    median_ms = _timer(device)
    backends = (
        {"math": SDPBackend.MATH}
        if smoke
        else {
            "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
        }
    )
    total, width = (1024, 128) if smoke else (16384, 2048)
    lengths = [256, 512] if smoke else [512, 1024, 2048, 4096, 8192, 16384]
    if long:
        lengths = [1024] if smoke else [32768, 65536, 131072]
        total = lengths[-1]  # one sequence a call at the longest; more at the shorter, as many tokens
    repeats, warmup = (5, 2) if long else (10, 3)
    rows = []
    for name, backend in backends.items():
        for head_dim in (64, 128):
            heads = width // head_dim
            for causal in (False, True):
                for length in lengths:
                    batch = total // length
                    q, k, v = (
                        torch.randn(
                            batch, heads, length, head_dim, device=device, dtype=dtype, requires_grad=True
                        )
                        for _ in range(3)
                    )

                    def call(q, k, v, causal=causal, backend=backend):  # noqa: ANN001, ANN202
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    forward, both = _fwd_bwd(call, q, k, v)
                    try:
                        fwd_ms = median_ms(forward, repeats=repeats, warmup=warmup)
                        both_ms = median_ms(both, repeats=repeats, warmup=warmup)
                    except RuntimeError as error:  # a backend that does not take this shape
                        rows.append(
                            {
                                "backend": name,
                                "head_dim": head_dim,
                                "causal": causal,
                                "seq": length,
                                "error": str(error).splitlines()[0][:200],
                            }
                        )
                        continue
                    flops = attention_flops(batch, heads, head_dim, length, length, causal)
                    rows.append(
                        {
                            "backend": name,
                            "head_dim": head_dim,
                            "heads": heads,
                            "batch": batch,
                            "causal": causal,
                            "seq": length,
                            "fwd_ms": fwd_ms,
                            "fwd_bwd_ms": both_ms,
                            "fwd_tflops": flops / fwd_ms / 1e9,
                            "bwd_tflops": 2.5 * flops / max(both_ms - fwd_ms, 1e-9) / 1e9,
                        }
                    )
                    print(
                        f"sdpa {name:5} d={head_dim:3} causal={causal!s:5} L={length:6}: "
                        f"fwd {rows[-1]['fwd_tflops']:6.1f}, bwd {rows[-1]['bwd_tflops']:6.1f} TFLOP/s",
                        flush=True,
                    )
                    del q, k, v
    return rows


def lognormal_documents(seq: int, count: int, sigma: float, seed: int) -> list[int]:
    """``count`` log-normal lengths scaled to fill ``seq`` exactly (each at least 1 token)."""
    draws = np.random.default_rng(seed).lognormal(0.0, sigma, count)
    lengths = np.maximum(1, (draws / draws.sum() * seq).astype(np.int64))
    lengths[-1] += seq - lengths.sum()
    return [int(x) for x in lengths]


def mask_cases(seq: int) -> list[dict]:
    """The packed and windowed masks timed: every one causal, on one window of ``seq`` tokens."""
    k = seq // 32
    return [
        {"name": "causal", "docs": [seq]},
        {"name": f"{seq // 4}x4", "docs": [seq // 4] * 4},
        {"name": f"{k}x32", "docs": [k] * 32},
        {"name": "long+short", "docs": [seq // 2] + [seq // 8] * 2 + [seq // 64] * 16},
        {"name": "lognormal 64", "docs": lognormal_documents(seq, 64, 1.0, 0)},
        {"name": "lognormal 512", "docs": lognormal_documents(seq, 512, 1.0, 1)},
        {"name": "padded 3/4", "docs": [seq // 8] * 6},
        {"name": f"window {seq // 8}", "docs": [seq], "window": seq // 8},
        {"name": f"window {seq // 32}", "docs": [seq], "window": seq // 32},
    ]


def measure_masks(device, dtype, smoke: bool) -> list[dict]:  # noqa: ANN001
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    median_ms = _timer(device)
    seq, heads, head_dim = (1024, 2, 64) if smoke else (32768, 16, 128)
    flex = flex_attention if smoke else torch.compile(flex_attention, dynamic=False)
    # One mask function over two buffers refilled in place for every case: one compilation serves all
    # (a closure per case would recompile per case, and past the recompile limit fall back to eager).
    doc = torch.full((seq,), -1, dtype=torch.int64, device=device)
    window = torch.full((), seq, dtype=torch.int64, device=device)

    def mask_mod(b, h, q, kv):  # noqa: ANN001, ANN202
        return (doc[q] == doc[kv]) & (doc[q] >= 0) & (q >= kv) & (q - kv < window)

    rows = []
    for case in mask_cases(seq):
        bounds = np.r_[0, np.cumsum(case["docs"])]
        doc_ids = np.full(seq, -1, dtype=np.int64)  # padding: -1, sees nothing
        for i in range(len(case["docs"])):
            doc_ids[bounds[i] : bounds[i + 1]] = i
        doc.copy_(torch.from_numpy(doc_ids))
        window.fill_(case.get("window") or seq)
        block_mask = create_block_mask(
            mask_mod, None, None, seq, seq, device=device, BLOCK_SIZE=TILE, _compile=not smoke
        )
        partial = int(block_mask.kv_num_blocks.sum())
        full = int(block_mask.full_kv_num_blocks.sum()) if block_mask.full_kv_num_blocks is not None else 0
        q, k, v = (
            torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=not smoke)
            for _ in range(3)
        )
        forward, both = _fwd_bwd(lambda q, k, v, m=block_mask: flex(q, k, v, block_mask=m), q, k, v)
        row = {
            "name": case["name"],
            "seq": seq,
            "heads": heads,
            "head_dim": head_dim,
            "cu_seqlens": [int(x) for x in bounds],
            "window": case.get("window"),
            "partial_blocks": partial,
            "full_blocks": full,
            "flex_fwd_ms": median_ms(forward),
            "flex_fwd_bwd_ms": median_ms(both),
        }
        row.update(_varlen(device, dtype, case["docs"], heads, head_dim, case.get("window"), median_ms))
        rows.append(row)
        print(
            f"mask {case['name']:14}: blocks {partial + full:6} (full {full:6}), flex fwd {row['flex_fwd_ms']:7.2f} ms, "
            f"fwd+bwd {row['flex_fwd_bwd_ms']:7.2f} ms, varlen fwd {row.get('varlen_fwd_ms', float('nan')):7.2f} ms",
            flush=True,
        )
    return rows


def _varlen(device, dtype, docs, heads, head_dim, window, median_ms) -> dict:  # noqa: ANN001
    """torch's varlen (FlashAttention) kernel on the same documents, where this torch and device have it."""
    import torch

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return {}
    if device.type != "cuda":
        return {}
    tokens = sum(docs)
    cu = torch.tensor([0, *np.cumsum(docs)], device=device, dtype=torch.int32)
    q, k, v = (
        torch.randn(tokens, heads, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    params = inspect.signature(varlen_attn).parameters
    extra = (
        {"window_size": ((window - 1) if window else -1, 0)}
        if "window_size" in params
        else {"is_causal": True}
    )
    if window and "window_size" not in params:
        return {}

    def call(q, k, v):  # noqa: ANN001, ANN202
        return varlen_attn(q, k, v, cu, cu, max(docs), max(docs), **extra)

    forward, both = _fwd_bwd(call, q, k, v)
    try:
        return {"varlen_fwd_ms": median_ms(forward), "varlen_fwd_bwd_ms": median_ms(both)}
    except Exception as error:  # noqa: BLE001 - an older torch's varlen may lack a backward or a mask
        return {"varlen_error": f"{type(error).__name__}: {error}".splitlines()[0][:200]}


# --- linear layers at model shapes, bf16 and fp8 -------------------------------------------------------
# hidden, MLP width, query heads, KV heads, head_dim of the models whose published FP8 runs cp-plan prices
LINEAR_MODELS = {
    "llama2-7b": (4096, 11008, 32, 32, 128),
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "llama3-70b": (8192, 28672, 64, 8, 128),
}


def linear_shapes(smoke: bool) -> list[tuple[int, int, int, str]]:
    """(m, n, k, what) of the multiplies one decoder layer runs at TP 1-8 and 1K-16K tokens a rank: each linear's
    forward (tokens x out by in), its input gradient (tokens x in by out) and its weight gradient (out x in by
    tokens), as Megatron-LM and Transformer Engine run them; and squares, the profile table's own axis."""
    if smoke:
        return [(64, 96, 128, "smoke"), (128, 128, 128, "square")]
    shapes: dict[tuple[int, int, int], str] = {}
    for name, (hidden, ffn, heads, kv_heads, head_dim) in LINEAR_MODELS.items():
        for tp in (1, 2, 4, 8):
            linears = {
                "qkv": ((heads + 2 * kv_heads) * head_dim // tp, hidden),
                "proj": (hidden, heads * head_dim // tp),
                "fc1": (2 * ffn // tp, hidden),
                "fc2": (hidden, ffn // tp),
            }
            for tokens in (1024, 4096, 16384):
                for linear, (out, inp) in linears.items():
                    what = f"{name} tp{tp} {linear}"
                    shapes.setdefault((tokens, out, inp), f"{what} fwd")
                    shapes.setdefault((tokens, inp, out), f"{what} dgrad")
                    shapes.setdefault((out, inp, tokens), f"{what} wgrad")
    for edge in (256, 512, 1024, 2048, 4096, 8192, 16384):
        shapes.setdefault((edge, edge, edge), "square")
    return [(*shape, what) for shape, what in shapes.items()]


def measure_linears(device, dtype, smoke: bool) -> list[dict]:  # noqa: ANN001
    """bf16 ``a @ b`` and fp8 (e4m3, one scale per tensor: Transformer Engine's delayed and current scaling,
    torchao's tensorwise recipe) ``torch._scaled_mm`` into bf16, on the same shapes; the casts are timed
    apart (``measure_casts``). Rows go to ``cp-plan hw fit-kernels --gemm`` as they are (``gemm_csv``)."""
    import torch

    median_ms = _timer(device)
    fp8 = getattr(torch, "float8_e4m3fn", None)

    def kernel_ms(fn, repeats: int) -> float:  # noqa: ANN001
        """The kernel's own time: a call shorter than 100 us is replayed from a CUDA graph of many, since
        eagerly the host's launch (~10 us for ``a @ b``) outlasts it and the device waits."""
        quick = median_ms(fn, repeats=3, warmup=2)
        if device.type != "cuda" or quick > 0.1:
            return median_ms(fn, repeats=repeats)
        calls = max(1, min(500, int(2.0 / quick)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return median_ms(graph.replay, repeats=repeats) / calls

    rows = []
    for m, n, k, what in linear_shapes(smoke):
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        flops = 2.0 * m * n * k
        repeats = 5 if smoke else max(5, min(30, int(2e14 / flops)))  # ~0.3 s a shape at 700 TFLOP/s
        row = {"m": m, "n": n, "k": k, "what": what}
        row["bf16_ms"] = kernel_ms(lambda a=a, b=b: a @ b, repeats)
        if fp8 is not None:
            a8 = a.to(fp8)
            b8 = b.t().contiguous().to(fp8).t()  # the second operand column-major, as the fp8 kernels want
            one = torch.ones((), device=device, dtype=torch.float32)
            try:
                row["fp8_ms"] = kernel_ms(
                    lambda a8=a8, b8=b8, one=one: torch._scaled_mm(
                        a8, b8, scale_a=one, scale_b=one, out_dtype=dtype
                    ),
                    repeats,
                )
            except (RuntimeError, NotImplementedError) as error:  # no fp8 kernel on this device or build
                row["fp8_error"] = str(error).splitlines()[0][:200]
            del a8, b8
        rows.append(row)
        fp8_text = f"{flops / row['fp8_ms'] / 1e9:7.1f}" if "fp8_ms" in row else "      -"
        print(
            f"linear {m:6} x {n:6} x {k:6} {what:28}: bf16 {flops / row['bf16_ms'] / 1e9:7.1f}, fp8 {fp8_text} TFLOP/s",
            flush=True,
        )
        del a, b
    return rows


def measure_casts(device, dtype, smoke: bool) -> list[dict]:  # noqa: ANN001
    """A bf16 activation to fp8 with a scale of its own (dynamic, per tensor), as torchao's tensorwise recipe
    writes it in eager PyTorch (amax, scale, multiply in fp32, saturate, cast) and compiled, and its
    transposed fp8 copy (the backward's operand), against a plain copy of the same tensor: how many HBM
    passes a cast really costs, which cp-plan's step times at its bytes."""
    import torch

    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        return []
    median_ms = _timer(device)
    top = torch.finfo(fp8).max

    def cast(x):  # noqa: ANN001, ANN202
        amax = x.abs().amax().float().clamp(min=1e-12)
        scale = top / amax
        return (x.float() * scale).clamp(-top, top).to(fp8), scale

    compiled = None if smoke else torch.compile(cast, dynamic=False)  # static shapes, as torchtitan compiles
    rows = []
    for m, k in ((64, 128),) if smoke else ((4096, 4096), (16384, 4096), (16384, 14336), (8192, 8192)):
        x = torch.randn(m, k, device=device, dtype=dtype)
        row = {"m": m, "k": k, "elements": m * k, "input_bytes": x.element_size()}
        row["copy_ms"] = median_ms(lambda x=x: x.clone(), inner=10)
        row["eager_ms"] = median_ms(lambda x=x: cast(x), inner=10)
        if compiled is not None:
            try:
                row["compiled_ms"] = median_ms(lambda x=x: compiled(x), inner=10)
            except Exception as error:  # noqa: BLE001 - a compiler failure leaves the eager figure
                row["compiled_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        y, _ = cast(x)
        row["transpose_ms"] = median_ms(lambda y=y: y.t().contiguous(), inner=10)
        rows.append(row)
        copy_gbs = 2 * m * k * x.element_size() / row["copy_ms"] / 1e6
        print(
            f"cast {m:6} x {k:6}: copy {row['copy_ms']:.3f} ms ({copy_gbs:.0f} GB/s), eager {row['eager_ms']:.3f}, "
            f"compiled {row.get('compiled_ms', float('nan')):.3f}, fp8 transpose {row['transpose_ms']:.3f} ms",
            flush=True,
        )
        del x, y
    return rows


# --- ring attention's split on one device --------------------------------------------------------------
def measure_split(device, dtype, smoke: bool) -> list[dict]:  # noqa: ANN001
    """What splitting attention over a ring costs in compute alone: every (rank, step) block of the reference
    kernel's ring (cp-plan's own, :mod:`costmodel.kernel.ring`: the pieces each layout's mask leaves, the fused
    kernel on each, the fp32 merge), timed forward and backward on this one device, beside the single call of
    one rank's tokens that published ring-efficiency figures divide by. A ring's step lasts as long as its
    slowest rank, so the ring's compute is the sum over steps of the slowest rank's block; no transfer is
    made, so what separates it from N single calls is the split, the merges and the kernels' own length
    dependence, not the links."""
    import torch

    from costmodel.kernel.block import Grads, OutLse, block_backward, block_forward
    from costmodel.kernel.masks import AttentionOptions
    from costmodel.kernel.ring import ring_schedule

    median_ms = _timer(device)
    local, heads, head_dim = (256, 2, 64) if smoke else (8192, 32, 128)
    scale = head_dim**-0.5
    rule = AttentionOptions(causal=True).mask_rule()

    def shard() -> object:
        return torch.randn(1, heads, local, head_dim, device=device, dtype=dtype)

    q, k, v, dout = shard(), shard(), shard(), shard()
    wide = torch.float32
    out = torch.zeros(q.shape, dtype=wide, device=device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=wide, device=device)
    single = ring_schedule(rule, "contiguous", local, 1, 0).plans[0]
    block_forward(q, k, v, single, scale, out, lse)
    saved = OutLse(out.to(dtype), lse.clone())
    grads = Grads(*(torch.zeros(x.shape, dtype=wide, device=device) for x in (q, k, v)))

    def forward(plan):  # noqa: ANN001, ANN202
        return lambda: block_forward(q, k, v, plan, scale, out, lse)

    def backward(plan):  # noqa: ANN001, ANN202
        return lambda: block_backward(dout, q, k, v, saved, plan, scale, grads)

    rows = [
        {
            "layout": "single",
            "world": 1,
            "rank": 0,
            "step": 0,
            "pieces": len(single.pieces),
            "fwd_ms": median_ms(forward(single)),
            "bwd_ms": median_ms(backward(single)),
        }
    ]
    print(
        f"split single {local} causal: fwd {rows[0]['fwd_ms']:.3f} ms, bwd {rows[0]['bwd_ms']:.3f} ms",
        flush=True,
    )
    for world in (2, 4) if smoke else (2, 4, 8):
        for layout in ("contiguous", "zigzag"):
            for rank in range(world):
                schedule = ring_schedule(rule, layout, local * world, world, rank)
                for step, plan in enumerate(schedule.plans):
                    row = {
                        "layout": layout,
                        "world": world,
                        "rank": rank,
                        "step": step,
                        "pieces": len(plan.pieces),
                        "pairs": plan.visible_pairs,
                    }
                    if plan.pieces:
                        row["fwd_ms"] = median_ms(forward(plan), repeats=5)
                        row["bwd_ms"] = median_ms(backward(plan), repeats=5)
                    rows.append(row)
            ring = [r for r in rows if r["layout"] == layout and r["world"] == world]
            totals = {
                p: sum(max(r.get(f"{p}_ms", 0.0) for r in ring if r["step"] == s) for s in range(world))
                for p in ("fwd", "bwd")
            }
            print(
                f"split {layout:10} N={world}: ring compute fwd {totals['fwd']:.3f} ms "
                f"({world * rows[0]['fwd_ms'] / totals['fwd']:.3f} of N single calls), bwd {totals['bwd']:.3f} ms "
                f"({world * rows[0]['bwd_ms'] / totals['bwd']:.3f})",
                flush=True,
            )
    return rows


def measure_gemm(device, dtype, smoke: bool) -> list[dict]:  # noqa: ANN001
    import torch

    median_ms = _timer(device)
    rows = []
    for edge in (256, 512) if smoke else (1024, 2048, 4096, 8192, 16384):
        a, b = (
            torch.randn(edge, edge, device=device, dtype=dtype),
            torch.randn(edge, edge, device=device, dtype=dtype),
        )
        ms = median_ms(lambda a=a, b=b: a @ b)
        rows.append({"edge": edge, "ms": ms, "tflops": 2.0 * edge**3 / ms / 1e9})
        print(f"gemm {edge:6}: {rows[-1]['tflops']:7.1f} TFLOP/s", flush=True)
    return rows


SECTIONS = {
    "gemm": measure_gemm,
    "masks": measure_masks,
    "sdpa": measure_sdpa,
    "sdpa-long": lambda device, dtype, smoke: measure_sdpa(device, dtype, smoke, long=True),
    "linears": measure_linears,
    "casts": measure_casts,
    "split": measure_split,
}


def measure(out: str, smoke: bool, parts: list[str] | None = None) -> None:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    started = time.perf_counter()
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
    }
    path = Path(out)
    for section, run in SECTIONS.items():
        if parts and section not in parts:
            continue
        try:
            result[section] = run(device, dtype, smoke)
        except Exception as error:  # noqa: BLE001 - a lease is short: keep what the other sections measure
            result[section] = []
            result[f"{section}_error"] = f"{type(error).__name__}: {error}"[:2000]
            print(f"{section} failed: {result[f'{section}_error']}", flush=True)
        result["seconds"] = time.perf_counter() - started
        path.with_suffix(".tmp").write_text(json.dumps(result, indent=1))  # written after every section
        path.with_suffix(".tmp").replace(path)
    print(f"wrote {out} in {result['seconds']:.0f} s")


# --- compare (cp-plan's model beside the measurement) --------------------------------------------------
def compare(path: str, hw: str) -> None:
    from costmodel.calibration.gpu import check_masks, linear_errors
    from costmodel.machines.kernels import attention_rate, gemm_rate
    from costmodel.machines.profiles import load_profile

    data = json.loads(Path(path).read_text())
    profile = load_profile(hw)
    print(f"{data['device']}, torch {data['torch']}, {data['dtype']}; model: {hw}\n")
    if data.get("linears"):
        print("Linear layers at model shapes against the profile's GEMM tables (predicted / measured - 1):")
        for dtype in ("bf16", "fp8"):
            errors = sorted(linear_errors(profile, data["linears"], dtype))
            if errors:
                tenth = errors[len(errors) // 10], errors[9 * len(errors) // 10]
                print(
                    f"  {dtype}: {len(errors)} shapes, signed median {statistics.median(errors):+.1%}, MAPE "
                    f"{statistics.mean(abs(e) for e in errors):.1%}, 10th / 90th percentile {tenth[0]:+.1%} / {tenth[1]:+.1%}"
                )
        print()
    if not data.get("sdpa"):
        return

    print("Packed and windowed masks, one window of one rank: FlexAttention's 128 x 128 block mask against")
    print("the simulator, and each time against cp-plan's forward on the measured SDPA flash curves:")
    print(
        f"{'mask':14} {'tiles':>7} {'simulated':>9} {'predicted':>9} {'varlen':>8} {'error':>7} {'flex':>8} {'error':>7}"
    )
    checks = check_masks(profile, data)
    for c in checks:
        varlen = f"{c.varlen_ms:8.2f} {c.varlen_error:+7.1%}" if c.varlen_ms else f"{'-':>8} {'-':>7}"
        print(
            f"{c.name:14} {c.tiles_measured:7} {c.tiles_simulated:9} {c.predicted_ms:9.2f} {varlen} "
            f"{c.flex_ms:8.2f} {c.flex_error:+7.1%}"
        )
    varlen = [abs(c.varlen_error) for c in checks if c.varlen_error is not None]
    if varlen:
        print(f"varlen: median |error| {statistics.median(varlen):.1%}, max {max(varlen):.1%}\n")

    print("SDPA against the profile's kernel tables (TFLOP/s; table = what cp-plan reads for that call):")
    print(
        f"{'backend':7} {'d':>4} {'mask':6} {'L':>6} {'fwd':>6} {'table':>6} {'ratio':>6} {'bwd':>6} {'table':>6} {'ratio':>6}"
    )
    for row in data["sdpa"]:
        if "error" in row:
            print(
                f"{row['backend']:7} {row['head_dim']:4} {'causal' if row['causal'] else 'full':6} "
                f"{row['seq']:6}  {row['error'][:60]}"
            )
            continue
        L, d, causal = row["seq"], row["head_dim"], row["causal"]
        fwd_table = attention_rate(profile, "bf16", L, L, d, causal, False) / 1e12
        bwd_table = attention_rate(profile, "bf16", L, L, d, causal, True) / 1e12
        print(
            f"{row['backend']:7} {d:4} {'causal' if causal else 'full':6} {L:6} {row['fwd_tflops']:6.0f} "
            f"{fwd_table:6.0f} {row['fwd_tflops'] / fwd_table:6.2f} {row['bwd_tflops']:6.0f} {bwd_table:6.0f} "
            f"{row['bwd_tflops'] / bwd_table:6.2f}"
        )
    print("\nbf16 matrix products against the profile's GEMM table (TFLOP/s):")
    peak = profile.device.peak_flops["bf16"]
    for row in data["gemm"]:
        table = gemm_rate(profile, "bf16", row["edge"], row["edge"], row["edge"]) / 1e12
        print(
            f"  {row['edge']:6}: measured {row['tflops']:6.0f}, table {table:6.0f}, ratio {row['tflops'] / table:5.2f}, "
            f"of peak {row['tflops'] * 1e12 / peak:5.1%}"
        )


def linears_csv(path: str, out: str) -> None:
    """The measured linears as ``cp-plan hw fit-kernels --gemm`` reads them: one row per shape and dtype."""
    data = json.loads(Path(path).read_text())
    source = f"{data['device']} torch {data['torch']} (benchmarks/gpu_kernels.py measure --parts linears)"
    lines = ["m,n,k,dtype,ms,source"]
    for row in data["linears"]:
        for dtype in ("bf16", "fp8"):
            if f"{dtype}_ms" in row:
                lines.append(
                    f"{row['m']},{row['n']},{row['k']},{dtype},{row[f'{dtype}_ms']:.6g},{source}: {row['what']}"
                )
    target = Path(out)
    target.with_suffix(".tmp").write_text("\n".join(lines) + "\n")
    target.with_suffix(".tmp").replace(target)
    print(f"wrote {len(lines) - 1} rows to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    m.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU: checks the script, not a GPU"
    )
    m.add_argument(
        "--parts",
        help=f"comma-separated sections to run (default: all): {', '.join(SECTIONS)}",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
    )
    c = sub.add_parser("compare")
    c.add_argument("file")
    c.add_argument("--hw", default="h200-nvlink")
    csv = sub.add_parser(
        "linears-csv", help="the measured linears as `cp-plan hw fit-kernels --gemm` reads them"
    )
    csv.add_argument("file")
    csv.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out, args.smoke, args.parts)
    elif args.command == "linears-csv":
        linears_csv(args.file, args.out)
    else:
        compare(args.file, args.hw)


if __name__ == "__main__":
    sys.exit(main())
