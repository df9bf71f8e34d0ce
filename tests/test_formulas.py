"""The symbolic model: its identities, its generated numeric twin, and what a notebook can do with it."""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import re
from typing import Any

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import codegen
from costmodel.symbolic import formulas, numeric, ops
from costmodel.symbolic.symbols import SYMBOLS, B, F, N, N_r, N_u, S, alpha, c, h, n_kv, p

f = formulas.FORMULAS


def _fits_a_runs_table(block: str) -> bool:
    """A generated block whose command fits machine terms to a table of runs: a minute or two of CPU."""
    return "--runs" in block.split() and "--fit-profile" in block.split()


def test_generated_files_are_current() -> None:
    """numeric.py, formula_text.py, resolved.py, the report's schema and every generated block of the docs are
    exactly what `python -m costmodel.codegen` writes; the blocks that fit a runs table are the slow tier's (below)."""
    targets = codegen.targets(keep=_fits_a_runs_table)
    assert {codegen.TARGET, codegen.TEXT, codegen.RESOLVED} <= set(targets)
    stale = [str(path) for path, text in targets.items() if path.read_text(encoding="utf-8") != text]
    assert not stale, f"stale: {', '.join(stale)}; run: python -m costmodel.codegen"


@pytest.mark.slow
def test_codegen_check_passes() -> None:
    """The whole check, the blocks that fit runs tables included."""
    assert codegen.main(["--check"]) == 0


def test_every_formula_is_documented() -> None:
    for formula in f.values():
        assert formula.meaning and formula.unit and formula.source, formula.name
        assert formula.expr.free_symbols <= {s.symbol for s in SYMBOLS.values()}, formula.name
    for info in SYMBOLS.values():
        assert info.meaning and info.unit and info.source


def test_every_cited_work_is_in_the_references() -> None:
    """Each [Key] a formula or a symbol cites is a row of docs/references.md, where a reader can look it up."""
    table = (codegen.DOCS / "references.md").read_text(encoding="utf-8")
    defined = {
        key
        for row in table.splitlines()
        if row.startswith("| `")
        for key in re.findall(r"`\[([^\]]+)\]`", row.split(" | ")[0])
    }
    cited = {
        key: name
        for name, source in [
            *((x.name, x.source) for x in f.values()),
            *((str(k), x.source) for k, x in SYMBOLS.items()),
        ]
        for key in re.findall(r"\[([^\]\s]+)(?: [^\]]*)?\]", source)
    }
    assert len(defined) > 100
    assert {key: name for key, name in cited.items() if key not in defined} == {}


def test_notebook_use_print_substitute_differentiate_latex() -> None:
    i_step = formulas.intensity_step
    assert str(i_step.expr) == "2*S*c*h/(N*n_kv*p)"
    assert i_step.evaluate(S=262_144, N=8, h=32, n_kv=8, p=2, c=1) == 131_072
    assert sympy.diff(i_step.expr, N) == -i_step.expr / N  # halving N doubles the intensity
    assert r"\frac{2 S c h}{N n_{kv} p}" in i_step.latex
    assert "I_{step}" in i_step.latex


def test_symbols_are_reachable_by_name() -> None:
    """``subs`` takes base symbols by their names in code; a string given to sympy's own subs is not the
    symbol (it would leave alpha in), so the documented call is ``subs(alpha=0)``."""
    l_star = formulas.critical_shard_tokens
    assert l_star.subs(alpha=0) == F * n_kv * p / (2 * B * c * h)
    assert alpha in l_star.expr.free_symbols and alpha not in l_star.subs(alpha=0).free_symbols
    assert l_star.subs(alpha=0, c=sympy.Rational(1, 2)) == F * n_kv * p / (B * h)
    with pytest.raises(TypeError, match="no symbol named beta_x"):
        l_star.subs(beta_x=1)


def test_module_docstring_examples_run() -> None:
    import doctest

    failures, tried = doctest.testmod(formulas, verbose=False)
    assert tried >= 3 and failures == 0


def test_notebook_import_reads_the_cache_and_builds_nothing() -> None:
    """Importing the formulas builds nothing: every simplified form comes from the generated cache, so the
    first `.expr` of each one is a lookup, and the unsimplified ones are substituted without sympy comparing
    a Max's or Min's arguments again (its pairwise search, `_find_localzeros`, is never entered; it made
    `cp-plan formulas --latex` take 47 s). (How long the import takes is a benchmark's figure,
    benchmarks/cli_latency.py, not a test's: a fresh environment's first import also compiles bytecode.)"""
    import subprocess
    import sys

    probe = (
        "from sympy.functions.elementary.miscellaneous import MinMaxBase\n"
        "from costmodel.symbolic import formulas as f\n"
        "compared = []\n"
        "search = MinMaxBase._find_localzeros.__func__\n"
        "MinMaxBase._find_localzeros = classmethod(lambda cls, *a: compared.append(1) or search(cls, *a))\n"
        "[x.expr for x in f.FORMULAS.values()]\n"
        "print(len(f.COMPUTED), len(compared))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    computed, compared = map(int, out.split())
    assert computed == 0, "the cache is stale: run python -m costmodel.codegen"
    assert compared == 0, "a Max or Min was evaluated again while resolving the formulas"


def test_seed_short_forms_at_bf16() -> None:
    """With p = 2 the article's forms reappear: I = (h/n_kv)·S/(N-1), I_step = (h/n_kv)·S/N."""
    bf16 = {p: 2, c: 1}
    assert sympy.simplify(f["intensity_layer"].expr.subs(bf16) - h / n_kv * S / (N - 1)) == 0
    assert sympy.simplify(f["intensity_step"].expr.subs(bf16) - h / n_kv * S / N) == 0
    assert sympy.simplify(f["n_max"].expr.subs({**bf16, alpha: 0}) - h / n_kv * S / (F / B)) == 0


def test_intensity_step_is_layer_intensity_times_n_minus_1_over_n() -> None:
    assert sympy.simplify(f["intensity_step"].expr - (N - 1) / N * f["intensity_layer"].expr) == 0


def test_critical_shard_length_closed_form_and_causal_doubling() -> None:
    """[A-SPDeep]: with alpha = 0, L* = beta·n_kv·p/(2·h·c); causal (c = 1/2) doubles it."""
    l_star = f["critical_shard_tokens"].expr.subs(alpha, 0)
    assert sympy.simplify(l_star - (F / B) * n_kv * p / (2 * h * c)) == 0
    assert sympy.simplify(l_star.subs(c, sympy.Rational(1, 2)) / l_star.subs(c, 1)) == 2


def test_critical_shard_length_balances_comm_and_compute() -> None:
    """At L = L*, step comm equals step compute, alpha included."""
    at = {S: f["critical_shard_tokens"].expr * N}
    gap = f["step_compute_s"].expr.subs(at) - f["step_comm_s"].expr.subs(at)
    values = {s.symbol: v for s, v in zip(SYMBOLS.values(), range(3, 40), strict=False)}
    assert abs(float(gap.subs(values))) < 1e-9 * float(f["step_comm_s"].expr.subs(at).subs(values))


def test_usp_reduces_to_ring_and_to_ulysses() -> None:
    """[USP §3]: N_u = 1 is the ring, N_r = 1 is Ulysses."""
    usp = f["usp_recv_bytes_per_layer"].expr
    ring = f["recv_bytes_per_layer"].expr
    ulysses = f["ulysses_recv_bytes_per_layer"].expr
    assert sympy.simplify(usp.subs({N_u: 1, N_r: N}) - ring) == 0
    assert sympy.simplify(usp.subs({N_r: 1, N_u: N}) - ulysses) == 0
    ring_ratio = f["usp_ring_comm_ratio_step"].expr.subs({N_u: 1, N_r: N})
    assert sympy.simplify(ring_ratio - f["comm_ratio_step"].expr) == 0


def test_ulysses_replicates_kv_heads_beyond_n_kv() -> None:
    assert numeric.ulysses_kv_heads(N=16, n_kv=8) == 16
    assert numeric.ulysses_kv_heads(N=4, n_kv=8) == 8


def test_ring_traffic_independent_of_h_and_layer_intensity_of_d_and_b() -> None:
    """[A-RingCost §4]: I depends only on h/n_kv, S, N (and p); not on d or b."""
    assert (
        not {sympy.Symbol("d", positive=True), sympy.Symbol("b", positive=True)}
        & f["intensity_layer"].expr.free_symbols
    )
    assert h not in f["recv_bytes_per_layer"].expr.free_symbols


def test_utilisation_block_models() -> None:
    assert f["utilization_coarse"].evaluate(N=8) == pytest.approx(9 / 16)
    assert f["utilization_fine"].evaluate(N=8) == pytest.approx(8 / 15)


positive = st.integers(min_value=1, max_value=64)


DRAWS = {
    "seq_per": st.integers(1, 4096),
    "n": positive,
    "heads_per_kv": st.integers(1, 8),
    "kv": st.integers(1, 16),
    "d": st.sampled_from([64, 80, 128, 256]),
    "p_": st.sampled_from([1, 2, 4]),
    "b": st.integers(1, 4),
    "causal": st.booleans(),
    "flops": st.floats(1e11, 2e15),
    "bw": st.floats(1e8, 1e12),
    "lat": st.floats(0, 1e-4),
}


@settings(max_examples=30, deadline=None)
@given(**DRAWS)
def test_numeric_twin_matches_exact_sympy(
    seq_per, n, heads_per_kv, kv, d, p_, b, causal, flops, bw, lat
) -> None:
    """Property: every generated function equals the exact sympy evaluation of its formula."""
    values = _draw_values(seq_per, n, heads_per_kv, kv, d, p_, b, causal, flops, bw, lat)
    for name, formula in f.items():
        args = {a: values[a] for a in numeric.ARGS[name]}
        if n == 1 and name in {"intensity_layer", "tp_to_ring_ratio", "dynamic_cp_recv_share"}:
            continue  # N - 1 = 0: undefined at N = 1, reported as null
        fast = float(getattr(numeric, name)(**args))
        exact = formula.evaluate(**args)
        assert math.isclose(fast, exact, rel_tol=1e-9, abs_tol=1e-300), name


class _NumpyOps:
    """numpy's functions under ops' names, but for the formulas' ceiling, which ops means to differ from numpy's:
    a ratio of counts within a few ulps of an integer is that integer (ops.ceil on an array, numpy throughout)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def ceil(x: Any) -> Any:
        return ops.ceil(np.asarray(x, dtype=float))


@functools.cache
def _numpy_twins() -> dict[str, Any]:
    """The twins as they were before ops: the same generated source calling numpy's functions directly."""
    source = inspect.getsource(numeric).replace("from costmodel.symbolic import ops", "")
    namespace: dict[str, Any] = {"ops": _NumpyOps()}
    exec(compile(source, "numeric_numpy", "exec"), namespace)
    return namespace


def _same(fast: Any, slow: Any) -> bool:
    """Equal values, NaN equal to NaN and -0. not equal to 0. (numpy scalars and 0-d arrays as numbers)."""
    fast, slow = np.asarray(fast, dtype=float), np.asarray(slow, dtype=float)
    return fast.shape == slow.shape and bool(
        np.all((fast == slow) & (np.signbit(fast) == np.signbit(slow)) | (np.isnan(fast) & np.isnan(slow)))
    )


@settings(max_examples=30, deadline=None)
@given(**DRAWS)
def test_numeric_twins_on_numbers_equal_numpys(
    seq_per, n, heads_per_kv, kv, d, p_, b, causal, flops, bw, lat
):  # noqa: PLR0913
    """Property: every twin gives on Python numbers (ops without numpy) exactly what it gave calling numpy's
    functions, and on arrays exactly numpy's answer too."""
    values = _draw_values(seq_per, n, heads_per_kv, kv, d, p_, b, causal, flops, bw, lat)
    twins = _numpy_twins()
    with np.errstate(all="ignore"):
        for name in numeric.ARGS:
            args = {a: values[a] for a in numeric.ARGS[name]}
            assert _same(*_both(getattr(numeric, name), twins[name], args)), name
            arrays = {a: np.array([v, v]) for a, v in args.items()}
            assert _same(getattr(numeric, name)(**arrays), twins[name](**arrays)), name


def _both(fast: Any, slow: Any, args: dict[str, Any]) -> tuple[Any, Any]:
    """Both twins' answers, (0, 0) where the twin on numbers raises: Python's arithmetic raises on 1/(N - 1)
    at N = 1 as numpy's did (a plain division), or where numpy gave NaN or inf (a division of its scalar)."""
    try:
        answer = fast(**args)
    except ArithmeticError:
        try:
            former = slow(**args)
        except ArithmeticError:
            return 0.0, 0.0
        assert not np.all(np.isfinite(former))
        return 0.0, 0.0
    return answer, slow(**args)


_EDGES = [0, 1, -1, 3, True, False, 0.0, -0.0, 0.5, -0.5, 2.5, -1e308, math.inf, -math.inf, math.nan]
_EDGES += [2**53 + 1, float(2**53), 1e-320]


def _typed(value: Any) -> tuple[type, Any]:
    """A numpy scalar or 0-d array as the Python number it holds, with its type (float NaN as a marker)."""
    value = value.item() if isinstance(value, np.ndarray | np.generic) else value
    return type(value), "nan" if value != value else (value, math.copysign(1, value))


def test_ops_give_numpys_answers_on_numbers() -> None:
    """Each function of ops on Python numbers: numpy's value, NaN, the sign of a zero and int, float or bool
    as numpy's scalar holds it, at the edges (ties of signed zeros, NaN on either side, mixed int and float)."""
    with np.errstate(all="ignore"):
        for name in (
            "maximum",
            "minimum",
            "equal",
            "not_equal",
            "less",
            "less_equal",
            "greater",
            "greater_equal",
        ):
            for a, b in itertools.product(_EDGES, _EDGES):
                assert _typed(getattr(ops, name)(a, b)) == _typed(getattr(np, name)(a, b)), (name, a, b)
        for name in ("sqrt", "ceil"):
            for a in _EDGES:
                assert _typed(getattr(ops, name)(a)) == _typed(getattr(np, name)(a)), (name, a)
        for conditions in itertools.product([True, False], repeat=2):
            for choices in itertools.product([1, 2.5, -0.0, True], [3, math.nan]):
                got = ops.select(list(conditions), list(choices), default=ops.nan)
                assert _typed(got) == _typed(np.select(list(conditions), list(choices), default=np.nan))
    assert "numpy" not in ops.__dict__


def test_a_ceiling_of_a_ratio_of_counts_is_not_pushed_up_by_rounding() -> None:
    """5,439 tokens x 21 / 38,073 is 3 exactly; the twin computes 21 / 38,073 first (a subexpression it shares)
    and gets 3.0000000000000004, which numpy.ceil takes to 4 (a CP degree one too many). ops.ceil reads a value
    within 4 ulps of an integer as that integer, on numbers and arrays alike; a value further off still
    rounds up."""
    near = 5439 * (21 / 38073)
    assert near != 3.0 and ops.ceil(near) == 3.0 and ops.ceil(np.array([near, 3.0 + 1e-9]))[0] == 3.0
    assert ops.ceil(3.0 + 1e-9) == 4.0 and ops.ceil(np.array([3.0 + 1e-9]))[0] == 4.0


def _draw_values(seq_per, n, heads_per_kv, kv, d, p_, b, causal, flops, bw, lat) -> dict[str, float]:  # noqa: PLR0913
    """Every base symbol's value for one draw of the properties below."""
    return {
        "S": seq_per * n,
        "N": n,
        "h": heads_per_kv * kv,
        "n_kv": kv,
        "d": d,
        "p": p_,
        "b": b,
        "c": 0.5 if causal else 1,
        "F": flops,
        "B": bw,
        "alpha": lat,
        "s_blk": 128,
        "p_acc": 4,
        "r": 0.05,
        "eta": 0.5,
        "F_peak": flops,
        "F_peak_g": 2 * flops,
        "N_u": 1,
        "N_r": n,
        "H": heads_per_kv * kv * d,
        "F_ffn": 4 * heads_per_kv * kv * d,
        "V": 32_000,
        "n_L": 32,
        "g": int(causal),
        "delta": 1 - int(causal),
        "phi": int(causal),
        "phi_u": 1,  # unfused: kept where phi, made again where not
        "sigma": 1,
        "s_ag": int(causal),
        "t": 2,
        "pp": 2,
        "z_w": 1,
        "z_g": 0.25,
        "z_o": 0.25,
        "rho": 0,
        "e_m": 2,
        "M_dev": 80e9,
        "m_mb": 8,
        "v_pp": 2,
        "D": 4,
        "Z_s": 2 * n,  # hybrid sharding: groups of 2N of the D·N = 4N ranks
        "B_hbm": 3e12,
        "F_gemm": 0.7 * flops,
        "F_attn": 0.6 * flops,
        "F_attn_bwd": 0.5 * flops,
        "F_gemm_b": 0.65 * flops,
        # latent attention and LoRA, exercised on the causal draws (their terms vanish elsewhere)
        "m_la": int(causal),
        "c_q": b % 2,
        "r_q": 64,
        "r_kv": 32,
        "d_qk": d + 16,
        "d_r": 16,
        "d_v": d - 16,
        "f_b": 1 - int(causal),
        "f_tr": 0.01 if causal else 1.0,
        "r_lo": 16 * int(causal),
        "F_head": 0.75 * flops,
        "x_att": 2,
        "k_sf": 9,
        "k_sb": 11,
        "n_kf": 17,
        "n_kb": 31,
        "t_dev": 1e-3,
        "t_lay": 2e-3,
        "x_CP_f": 1e-4,
        "x_CP_b": 2e-4,
        "x_CP_r": 3e-5,
        "F_e": 1536,
        "x_DP_all": 5e-3,
        "x_DPo_all": 4e-2,
        "tau_Z3_all": 6e-3,
        "t_opt_all": 7e-3,
        "t_fw": 1e-2,
        "k_tp": 4,
        "n_first": 15,  # pp = 2: a first and a last stage, uneven
        "n_mid": 0,
        "n_last": 17,
        "t_step": 1e-2,
        "o_dp": 0.5,
        "f8": 1,
        "p_s": 1 / 32,
        "a_f8": 1,
        "k_n": 4,
        "alpha_cp": lat / 3,
        "B_tp": bw,
        "B_cp": bw,
        "B_cpa": bw / 3,
        "B_pp": bw / 4,
        "B_dp": bw / 8,
        "B_dpr": bw / 16,
        "rc_sel": int(causal),
        "rc_full": 1 - int(causal),
        "u_cp": 0.75,
        "o_tp": 0.0,
        "o_cp": 1.0,
        "o_pp": 0.5,
        "n_bkt": 40,
        "z3": 1,
        "p_g": 4,
        "k_opt": 30,
        "s_comm": 0.12,
        "t_launch": 1e-5,
        "t_cs": 3e-4,
        "t_ms": 2e-4,
        "k_copy": 1,
        "k_merge": 38.0,
        "k_agm": 1,
        "x_eager": int(not causal),
        "x_rep": int(causal),
        "x_qh": int(causal),
        "x_lf": int(causal),
        "a_q": 1,
        "a_k": int(causal),
        "a_v": 1,
        "a_o": int(not causal),
        "a_g": 1,
        "a_u": 1,
        "a_d": int(causal),
        "x_ek": int(not causal),
        "k_li": 2 - int(causal),  # bf16 linear inputs, or Transformer Engine's FP8 ones
        "t_lf": 3e-4,
        "n_kl": 12,
        "t_k": 4e-6,
        "t_host": 2e-4,
        "g_pg": 1,
        "T_n": seq_per * n,
        "K_c": 3 * seq_per,
        "S_kv": seq_per + 7,
        "p_w": 1,
        "p_kv": p_,
        "alpha_tp": lat / 2,
        "alpha_cpa": 2 * lat,
        "a_tp": 3 * lat,
        "a_dp": 2 * lat,
        "B_l": bw,
        "n_l": 6,
        "l_h": 1,
        "P_g": 8,
        "B_bis": 2 * bw,
        "w_t": 2,
        "L_t": 4,
        "D_g": 2,
        "B_nic": bw / 8,
        "n_nic": 2,
        "o_x": 1.5,
        "n_x": 2,
        "alpha_in": lat / 4,
        "alpha_out": lat,
        "n_E": 64,
        "k_E": 8,
        "F_sh": 1024,
        "n_dn": int(causal),  # a dense layer before the MoE ones on the causal draws
        "F_dn": 4096,
        "E_p": 8,
        "C_f": 1.25,
        "B_ep": bw,
        "X_k": 2e6,
        "B_x": bw / 3,
        "E_m": 0.3 * seq_per * n * seq_per,
        "E_w": 0.6 * seq_per * n * seq_per,
        "l_max": seq_per * n // 2 + 1,
        "l_rest": max(1, seq_per * n // 7),
        "T_w": seq_per * n,
        "l_w": seq_per / 3 + 1,
        "o_opt": 1,
        "o_par": 1,
        "o_act": 1,
        "B_h": bw / 2,
        "R_h": 1.4e9,
        "n_h": 4,
        # what the framework keeps (frameworks/*.yaml): FSDP2's copies, kept through a pipeline's step
        "P_r": 7e8,
        "P_x": 3e9,  # an MoE stage's experts beside its dense part
        "q_w": 4,
        "q_c": 2,
        "q_m": 0,
        "q_g": 4,
        "q_o": 4,
        "u_w": 1,
        "u_g": 1,
        "r_k": int(causal),
        "f_pf": 1,
        "w_op": 1 - int(causal),
        "g_p": 0,
        "c_gm": int(causal),
        "f_fe": 1,
        "k_l": 12,
        "l_f": int(causal),
        "T_c": 4096,
        "M_fw": 2e9,
        "f_fr": 0.25,
        "M_cpb": 3e8,
    }


@settings(max_examples=60, deadline=None)
@given(
    seq_per=st.integers(64, 1 << 16),
    n=st.integers(2, 256),
    ratio_edge=st.sampled_from([0.05, 0.15, 1.0]),
    lat=st.floats(0, 1e-3),
)
def test_n_at_ratio_inverts_the_step_ratio(seq_per, n, ratio_edge, lat) -> None:
    """Property: at N = n_at_ratio(r) the step comm ratio is exactly r (the bound is tight)."""
    common = {
        "S": seq_per * n,
        "b": 1,
        "c": 1,
        "d": 128,
        "h": 32,
        "n_kv": 8,
        "p": 2,
        "F": 312e12,
        "B": 300e9,
        "alpha": lat,
    }
    bound = numeric.n_at_ratio(r=ratio_edge, **common)
    assert numeric.comm_ratio_step(N=bound, **common) == pytest.approx(ratio_edge, rel=1e-9)
