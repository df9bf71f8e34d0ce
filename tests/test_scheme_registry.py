"""The CP scheme registry: a scheme's name is written in its module and nowhere else, and a scheme added as one
module built on existing formulas is compared, ranked and searched like the built-in ones."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from costmodel.machines.binding import Machine
from costmodel.machines.profiles import load_profile
from costmodel.plans import cp as registry
from costmodel.plans.bind import call as formula
from costmodel.plans.cp import PREFILL, TRAINING, Scheme, SchemeResult, ring
from costmodel.plans.inputs import PlanInputs
from costmodel.plans.schemes import best, compare
from costmodel.plans.timing import ring_layer_time
from costmodel.training.search import scheme_pairs, search
from tests.support import REPO, every_scheme

PACKAGE = REPO / "costmodel"
REGISTRY = PACKAGE / "plans" / "cp"
# Places that may write a string equal to a scheme's name, because there it names something else, with how
# many times each may. Whole folders: the torch kernel is a leaf with its own variant names (ring, ulysses,
# pass-q), and the layers below the registry name NCCL's algorithms and collectives (ring, allgather), the
# hardware profiles' measured overheads (pass-kv, pass-q) and the formulas' groups (ring, ulysses, usp).
EXEMPT_FOLDERS = ("kernel", "machines", "symbolic")
EXEMPT = {
    # the time model's kernel variants, as calibration measures them and profiles key their overheads
    ("plans/timing.py", "ring"): 2,
    ("plans/timing.py", "ulysses"): 2,
    ("plans/gantt.py", "ring"): 1,
    # the kernel's own variant names: `cp-plan kernel`'s choices and its measured rows
    ("cli/kernel.py", "ring"): 1,
    ("cli/kernel.py", "ulysses"): 1,
    ("cli/kernel.py", "pass-q"): 1,
    ("cli/render.py", "ulysses"): 1,
    ("cli/render.py", "pass-kv"): 1,
    ("cli/render.py", "pass-q"): 1,
}


def _string_constants(path: Path) -> list[str]:
    """Every string constant of the code (docstrings left out: prose may name a scheme)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def _outside_the_registry() -> Counter[tuple[str, str]]:
    names = set(registry.names())
    found: Counter[tuple[str, str]] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if path.is_relative_to(REGISTRY) or relative.parts[0] in EXEMPT_FOLDERS:
            continue
        found.update((relative.as_posix(), value) for value in _string_constants(path) if value in names)
    return found


def test_no_scheme_name_is_written_outside_the_registry() -> None:
    over = {key: count for key, count in _outside_the_registry().items() if count > EXEMPT.get(key, 0)}
    assert not over, f"scheme names written outside costmodel/plans/cp (ask the registry instead): {over}"


def test_every_scheme_gives_what_its_phases_ask() -> None:
    assert len(set(registry.names())) == len(registry.REGISTRY)
    for scheme in registry.schemes(TRAINING):
        assert scheme.exposure and scheme.attention_calls and scheme.layouts, scheme.name
    for scheme in registry.schemes(PREFILL):
        assert scheme.prefill_exposed and scheme.prefill_bytes, scheme.name
    ranks = [s.rank for s in registry.REGISTRY]
    assert len(set(ranks)) == len(ranks)


def test_framework_settings_read_back_as_the_scheme_that_exports_them() -> None:
    for scheme in registry.REGISTRY:
        for framework, value in scheme.exports.items():
            assert registry.from_framework(framework, value) is scheme
    assert registry.from_framework("megatron", "nonsense", "p2p") is registry.from_framework("megatron")


def _hidden_ring_rows(inputs: PlanInputs, machine: Machine, pass_: str) -> list[SchemeResult]:
    return [
        replace(r, scheme=HIDDEN_RING.name, time_s=(r.time_s or 0.0) - (r.exposed_s or 0.0), exposed_s=0.0)
        for r in ring.layer(inputs, machine, pass_)
    ]


def _hidden_ring_exposure(values: dict[str, Any]) -> tuple[Any, Any, Any]:
    return 0.0, 0.0, formula("ring_overhead_s", values)


# A toy scheme, as a new module would declare it: a ring whose transfers all hide, built on the ring's formulas.
HIDDEN_RING = Scheme(
    "hidden-ring",
    label="hidden ring",
    summary={TRAINING: "a ring whose transfers all hide"},
    rank=99,
    phases=frozenset({TRAINING}),
    ring=True,
    layouts=("zigzag",),
    exports={"toy-framework": "hide"},
    exposure=_hidden_ring_exposure,
    attention_calls=ring.SCHEME.attention_calls,
    layer=_hidden_ring_rows,
    describe=lambda layout, n, n_u: f"{layout} ring, hidden",
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Scheme:
    monkeypatch.setattr(registry, "REGISTRY", [*registry.REGISTRY, HIDDEN_RING])
    return HIDDEN_RING


def test_a_registered_scheme_joins_the_comparison_and_wins_it_when_it_exposes_least(toy: Scheme) -> None:
    inputs = PlanInputs(seq=32768, n=8, causal=True, layout="zigzag", pass_="fwd+bwd")
    rows = compare(inputs, Machine(load_profile("a100-ib")))
    assert [r.scheme for r in rows][-1] == toy.name and registry.get(rows[-1].scheme).split_label(
        1, 8
    ) == "hidden ring"
    assert next(r for r in rows if r.scheme == ring.NAME).exposed_s > 0
    assert best(rows).scheme == toy.name


def test_a_registered_scheme_joins_the_search_of_a_framework_that_runs_it(toy: Scheme) -> None:
    assert (toy.name, "zigzag") in scheme_pairs()
    built = every_scheme(model="llama3-8b", seq=131072, hw="a100-nvlink", gpus=64, global_batch=32)
    pick = search(*built, top=1).plans[0]
    assert pick["cp"] > 1 and pick["cp_scheme"] == toy.name


@pytest.mark.parametrize("overlap", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("bandwidth", [5e9, 5e11])  # the transfer longer, then shorter, than the attention
def test_the_timeline_overlaps_a_step_by_the_formulas_law(overlap: float, bandwidth: float) -> None:
    """One ring-overlap law: a timeline step computing t while m is in flight takes t plus what the formula
    leaves exposed, m - o·min(m, t) (`cp_ring_fwd_exposed_s`, no SM slowdown)."""
    values = {"S": 65536, "N": 8, "b": 1, "d": 128, "h": 32, "n_kv": 8, "p": 2, "t": 1, "B_cp": bandwidth}
    values["x_rep"] = 0  # GQA read natively
    values |= {"B_hbm": 2e12, "F_attn": 2e14, "c": 0.5, "k_sf": 0, "u_cp": 1, "x_att": 1, "o_cp": overlap}
    compute, comm = formula("layer_attn_fwd_s", values), formula("cp_ring_fwd_s", values)
    exposed = formula("cp_ring_fwd_exposed_s", values | {"s_comm": 0.0})
    step = ring_layer_time([compute], [comm], overlap=overlap)
    assert step == pytest.approx(compute + exposed, rel=1e-12)
