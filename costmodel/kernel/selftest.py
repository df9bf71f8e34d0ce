"""Self-test: the distributed kernel on random inputs against the float64 reference, like nccl-tests.

Every rank draws the same full-sequence inputs from one seed (in the tested dtype), takes its layout
shard, runs ring (and Ulysses) attention forward and backward, and compares its shard of out, lse,
dq, dk, dv with :func:`~costmodel.kernel.reference.reference_attention` on the same (rounded) inputs.
The largest error over ranks (an all-reduce) must stay within ``atol + rtol · max|reference|``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from costmodel.core.errors import InputError
from costmodel.schedule.layouts import LAYOUTS, check_divisible, positions, ulysses_feasibility

SCHEMA = "cp-plan.kernel.selftest/1"
OUTPUTS = ("out", "lse", "dq", "dk", "dv")
VARIANTS = ("ring", "ulysses", "pass-q", "decode")
INFERENCE_VARIANTS = ("pass-q", "decode")  # forward only: out and lse
# (atol, rtol) per input dtype. fp32 kernels agree with float64 to ~1e-6. Half-precision fused
# kernels round probabilities before the P·V and dS·Q matmuls and return each block in bf16/fp16, so
# they get four units in the last place of the largest value (torch's own SDPA needs about as much).
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-5),
    "bfloat16": (2e-3, 2.0**-5),
    "float16": (1e-3, 2.0**-8),
}
TOLERANCE_RULE = "max|kernel - float64 reference| <= atol + rtol * max|reference|"


@dataclass(frozen=True)
class SelftestConfig:
    """One self-test problem. Field names follow the CLI flags (``kv_heads`` is ``--kv-heads``)."""

    seq: int = 512
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    batch: int = 1
    causal: bool = False
    layout: str = "contiguous"
    varlen: tuple[int, ...] | None = None  # document boundaries (cu_seqlens), global positions
    dtype: str = "float32"
    variants: tuple[str, ...] = VARIANTS
    seed: int = 0
    atol: float | None = None  # None: TOLERANCES[dtype]
    rtol: float | None = None
    device: str = "auto"

    def tolerance(self) -> tuple[float, float]:
        atol, rtol = TOLERANCES[self.dtype]
        return (atol if self.atol is None else self.atol, rtol if self.rtol is None else self.rtol)

    def check(self, world_size: int) -> None:
        """Raise :class:`InputError` naming the CLI flag at fault."""
        from costmodel.kernel.masks import check_cu_seqlens

        for name in ("seq", "heads", "kv_heads", "head_dim", "batch"):
            if getattr(self, name) < 1:
                raise InputError(_flag(name), f"must be at least 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise InputError("--kv-heads", f"{self.kv_heads} KV heads do not divide {self.heads} query heads")
        if self.layout not in LAYOUTS:
            raise InputError("--layout", f"unknown layout {self.layout!r}; accepted: {', '.join(LAYOUTS)}")
        check_divisible(self.layout, self.seq, world_size, field="--seq")
        if self.dtype not in TOLERANCES:
            raise InputError("--dtype", f"unknown dtype {self.dtype!r}; accepted: {', '.join(TOLERANCES)}")
        if self.varlen is not None:
            check_cu_seqlens(self.varlen, self.seq, field="--varlen")
        unknown = set(self.variants) - set(VARIANTS)
        if unknown or not self.variants:
            raise InputError("--variant", f"accepted: {', '.join(VARIANTS)}, all")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def ulysses_skip_reason(config: SelftestConfig, world_size: int) -> str | None:

    feasible, reason = ulysses_feasibility(config.heads, config.kv_heads, world_size)
    return None if feasible else reason


@dataclass
class VariantResult:
    errors: dict[str, float] = field(default_factory=dict)  # output -> max abs error over ranks
    tolerances: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return self.skipped is not None or all(self.errors[o] <= self.tolerances[o] for o in self.errors)


@dataclass
class SelftestResult:
    config: SelftestConfig
    world_size: int
    backend: str
    device: str
    variants: dict[str, VariantResult]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.variants.values())

    def to_json(self) -> dict[str, Any]:
        atol, rtol = self.config.tolerance()
        config = asdict(self.config) | {
            "nproc": self.world_size,
            "backend": self.backend,
            "device": self.device,
        }
        config["varlen"] = list(self.config.varlen) if self.config.varlen else None
        config["variants"] = list(self.config.variants)
        import torch

        variants: dict[str, Any] = {}
        for name, result in self.variants.items():
            if result.skipped is not None:
                variants[name] = {"skipped": result.skipped, "passed": True}
                continue
            variants[name] = {
                "passed": result.passed,
                "outputs": {
                    o: {
                        "max_abs_error": result.errors[o],
                        "tolerance": result.tolerances[o],
                        "passed": result.errors[o] <= result.tolerances[o],
                    }
                    for o in result.errors
                },
            }
        return {
            "schema": SCHEMA,
            "passed": self.passed,
            "config": config,
            "torch": torch.__version__,
            "tolerance_rule": TOLERANCE_RULE,
            "atol": atol,
            "rtol": rtol,
            "variants": variants,
        }


def selftest_rank(ctx: Any, config: SelftestConfig) -> dict[str, Any]:
    """What every rank runs; returns errors already reduced (max) over ranks, the same on every rank."""
    import torch
    import torch.distributed as dist

    from costmodel.kernel.masks import AttentionOptions, MaskRule
    from costmodel.kernel.reference import reference_attention
    from costmodel.kernel.ring import ring_attention
    from costmodel.kernel.sharding import shard
    from costmodel.kernel.ulysses import ulysses_attention

    dtype = getattr(torch, config.dtype)
    generator = torch.Generator().manual_seed(config.seed)
    b, h, n_kv, s, d = config.batch, config.heads, config.kv_heads, config.seq, config.head_dim

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(b, heads, s, d, generator=generator).to(ctx.device, dtype)

    q, k, v, dout = draw(h), draw(n_kv), draw(n_kv), draw(h)
    full = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = reference_attention(*full, MaskRule(config.causal, config.varlen))
    references = (ref_out, ref_lse, *torch.autograd.grad(ref_out, full, dout.double()))

    def mine(x: torch.Tensor) -> torch.Tensor:
        return shard(x, config.layout, ctx.world_size, ctx.rank)

    atol, rtol = config.tolerance()
    results: dict[str, Any] = {}
    for variant in config.variants:
        if variant == "ulysses" and (reason := ulysses_skip_reason(config, ctx.world_size)):
            results[variant] = {"skipped": reason}
            continue
        if variant in INFERENCE_VARIANTS:
            results[variant] = _inference_errors(variant, ctx, config, q, k, v, references, mine)
            continue
        attention = ring_attention if variant == "ring" else ulysses_attention
        local = [mine(x).requires_grad_() for x in (q, k, v)]
        options = AttentionOptions(causal=config.causal, cu_seqlens=config.varlen)
        out, lse = attention(*local, options, group=ctx.group, layout=config.layout)
        grads = torch.autograd.grad(out, local, mine(dout))
        errors = torch.stack(
            [
                (got.double() - mine(ref.detach())).abs().max()
                for got, ref in zip((out, lse, *grads), references, strict=True)
            ]
        )
        errors = torch.nan_to_num(errors, nan=torch.inf)  # a NaN anywhere must fail, not compare False
        dist.all_reduce(errors, op=dist.ReduceOp.MAX, group=ctx.group)
        scales = [ref.detach().abs().max().item() for ref in references]
        results[variant] = {
            "errors": dict(zip(OUTPUTS, errors.tolist(), strict=True)),
            "tolerances": {o: atol + rtol * scale for o, scale in zip(OUTPUTS, scales, strict=True)},
        }
    return {"variants": results, "backend": ctx.backend, "device": str(ctx.device)}


def _inference_errors(variant, ctx, config, q, k, v, references, mine) -> dict[str, Any]:
    """pass-q: the whole sequence prefilled by passing the queries (keys stay in the layout's shards);
    decode: the last token's query against the cache sharded by the layout, every key visible."""
    import torch
    import torch.distributed as dist

    from costmodel.kernel.inference import decode_attention, pass_q_prefill
    from costmodel.kernel.masks import AttentionOptions, MaskRule
    from costmodel.kernel.reference import reference_attention

    held = positions(config.layout, config.seq, ctx.world_size)[ctx.rank]
    if variant == "pass-q":
        got = pass_q_prefill(
            mine(q),
            mine(k),
            mine(v),
            held,
            held,
            AttentionOptions(causal=config.causal, cu_seqlens=config.varlen),
            group=ctx.group,
        )
        wanted = [mine(ref.detach()) for ref in references[:2]]
    else:
        last = q[:, :, -1:].contiguous()
        got = decode_attention(last, mine(k), mine(v), group=ctx.group)
        wanted = list(reference_attention(last.double(), k.double(), v.double(), MaskRule(False)))
    errors = torch.stack([(g.double() - w).abs().max() for g, w in zip(got, wanted, strict=True)])
    errors = torch.nan_to_num(errors, nan=torch.inf)
    dist.all_reduce(errors, op=dist.ReduceOp.MAX, group=ctx.group)
    atol, rtol = config.tolerance()
    return {
        "errors": dict(zip(OUTPUTS[:2], errors.tolist(), strict=True)),
        "tolerances": {
            o: atol + rtol * w.abs().max().item() for o, w in zip(OUTPUTS[:2], wanted, strict=True)
        },
    }


def run_selftest(config: SelftestConfig, nproc: int | None, timeout_s: float = 300.0) -> SelftestResult:
    """Check ``config`` and run it on ``nproc`` local processes, or on this rank under torchrun."""

    from costmodel.kernel.launch import launch, launcher

    env = launcher()
    world_size = env.world_size if env is not None else nproc
    if world_size is None or world_size < 1:
        raise InputError("--nproc", f"must be at least 1, got {world_size}")
    config.check(world_size)
    if config.variants == ("ulysses",) and (reason := ulysses_skip_reason(config, world_size)):
        raise InputError("--heads", f"Ulysses infeasible: {reason}")
    by_rank = launch(selftest_rank, nproc, args=(config,), timeout_s=timeout_s, device=config.device)
    report = next(iter(by_rank.values()))
    variants = {
        name: VariantResult(**entry) if "errors" in entry else VariantResult(skipped=entry["skipped"])
        for name, entry in report["variants"].items()
    }
    return SelftestResult(config, world_size, report["backend"], report["device"], variants)
