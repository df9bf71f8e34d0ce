"""The symbols of the cost model (SPEC §2), each with its meaning, unit and source.

Every formula in :mod:`costmodel.symbolic.formulas` is an expression over these symbols and nothing else.
Units are SI throughout: bytes, FLOP, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class SymbolInfo:
    """A base symbol: the sympy object plus what it stands for."""

    symbol: sympy.Symbol
    meaning: str
    unit: str
    source: str

    @property
    def name(self) -> str:
        return self.symbol.name

    @property
    def latex(self) -> str:
        return sympy.latex(self.symbol)


SYMBOLS: dict[str, SymbolInfo] = {}


def _symbol(name: str, meaning: str, unit: str, source: str, **assumptions: bool) -> sympy.Symbol:
    """Positive unless told otherwise; counts (tokens, heads, devices) are also integers."""
    if "nonnegative" not in assumptions:
        assumptions = {"positive": True, **assumptions}
    sym = sympy.Symbol(name, **assumptions)
    SYMBOLS[name] = SymbolInfo(sym, meaning, unit, source)
    return sym


# Workload shape.
S = _symbol("S", "sequence length", "tokens", "seed 000 §2", integer=True)
b = _symbol("b", "batch size", "sequences", "seed 000 §2", integer=True)
N = _symbol("N", "CP degree: devices the sequence is split over", "devices", "seed 000 §2", integer=True)
h = _symbol("h", "query heads", "heads", "seed 000 §2", integer=True)
n_kv = _symbol("n_kv", "key/value heads (GQA when < h)", "heads", "seed 000 §2", integer=True)
d = _symbol("d", "head dimension", "elements", "seed 000 §2", integer=True)
p = _symbol("p", "bytes per element of Q, K, V, O", "B", "seed 000 §2", integer=True)
p_acc = _symbol(
    "p_acc", "bytes per element of the fp32 softmax accumulators (m, l, O)", "B", "seed 000 §1", integer=True
)
s_blk = _symbol("s_blk", "compute tile rows (not the shard length)", "tokens", "seed 000 §1", integer=True)
c = _symbol("c", "causal compute fraction: 1 non-causal, 1/2 causal (useful FLOP halve)", "1", "seed 000 §4")

# Machine.
F_peak = _symbol("F_peak", "peak dense FLOP/s of one accelerator for the dtype", "FLOP/s", "SPEC §8")
eta = _symbol("eta", "compute efficiency: effective / peak FLOP/s", "1", "seed 000 §8 step 2")
F = _symbol("F", "FLOP/s used by the model (effective = eta · peak, or measured)", "FLOP/s", "seed 000 §4")
B = _symbol("B", "link bandwidth per direction", "B/s", "seed 000 §4")
alpha = _symbol("alpha", "per-message latency of the link", "s", "SPEC §4.2", nonnegative=True)

# Planning knobs.
r = _symbol("r", "target ratio of step receive time to step compute time", "1", "SPEC §5")
N_u = _symbol("N_u", "USP all-to-all (Ulysses) degree", "devices", "SPEC §4.5", integer=True)
N_r = _symbol("N_r", "USP ring degree", "devices", "SPEC §4.5", integer=True)

# Whole model and training setup (issue 5: memory fit). Activation terms follow Korthikanti et al.
# 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.
KORTHIKANTI = "Korthikanti et al. 2022 §4"
H = _symbol("H", "hidden size", "elements", KORTHIKANTI, integer=True)
F_ffn = _symbol("F_ffn", "MLP inner size", "elements", KORTHIKANTI, integer=True)
V = _symbol("V", "vocabulary size", "tokens", KORTHIKANTI, integer=True)
n_L = _symbol("n_L", "transformer layers", "layers", KORTHIKANTI, integer=True)
g = _symbol("g", "gated MLP (SwiGLU): 1, plain (GeLU): 0", "1", "model preset", nonnegative=True, integer=True)
delta = _symbol("delta", "dropout masks stored: 1, no dropout: 0", "1", KORTHIKANTI, nonnegative=True, integer=True)
phi = _symbol("phi", "attention scores kept for backward: 0 with flash attention or selective recompute, 1 "
              "otherwise", "1", KORTHIKANTI, nonnegative=True, integer=True)  # fmt: skip
sigma = _symbol("sigma", "sequence parallel with TP: 1 on, 0 off", "1", KORTHIKANTI, nonnegative=True, integer=True)
t = _symbol("t", "tensor-parallel degree", "devices", KORTHIKANTI, integer=True)
pp = _symbol("pp", "pipeline-parallel degree", "devices", "issue 5", integer=True)
z_w = _symbol("z_w", "fraction of the bf16 weights a device keeps (1/D under ZeRO-3)", "1", "ZeRO (Rajbhandari 2020)")
z_g = _symbol("z_g", "fraction of the fp32 gradients a device keeps (1/D from ZeRO-2)", "1", "ZeRO (Rajbhandari 2020)")
z_o = _symbol("z_o", "fraction of the fp32 master weights and Adam moments kept (1/D from ZeRO-1)", "1",
              "ZeRO (Rajbhandari 2020)")  # fmt: skip
rho = _symbol("rho", "full activation recompute: 1 (only layer inputs kept), else 0", "1", KORTHIKANTI,
              nonnegative=True, integer=True)  # fmt: skip
e_m = _symbol("e_m", "embedding matrices: 2 untied input and output, 1 tied", "1", "model preset", integer=True)
M_dev = _symbol("M_dev", "usable device memory: HBM x (1 - headroom)", "B", "issue 5")
