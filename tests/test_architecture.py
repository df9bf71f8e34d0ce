"""The house rules of docs/architecture.md, checked on the source.

Layers (``costmodel.LAYERS``, lowest first): a package imports its own modules and packages of strictly
lower layers. The torch kernel is a leaf beside the model that only the CLI reaches. Imports inside
functions count too: a lazy import is still a dependency, may not close a cycle, and must save something.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

from costmodel import KERNEL_IMPORTS, LAYERS
from tests.support import REPO

PACKAGE = REPO / "costmodel"
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}
# Run, never imported: `python -m costmodel.kernel` starts the CLI's kernel commands (under torchrun too).
ENTRY_POINTS = {PACKAGE / "kernel" / "__main__.py", PACKAGE / "__main__.py"}  # run, never imported


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _package(module: str) -> str:
    """``costmodel.plans.inputs`` -> ``plans``; ``costmodel.codegen`` -> ``codegen``; ``costmodel`` -> ``""``."""
    return module.split(".")[1] if "." in module else ""


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _named(name: str) -> str:
    """A costmodel module by its full name; anything else by its distribution's top name (``numpy``)."""
    return name if name.startswith("costmodel") else name.split(".")[0]


@cache
def _all_imports(module: str) -> tuple[tuple[str, bool, int], ...]:
    """(imported module, inside a function, line) for each import of ``module``, lazy ones included, those
    only for type checkers left out. ``from costmodel.cli import render`` imports the module
    ``costmodel.cli.render``; ``from costmodel.cli import main`` imports ``costmodel.cli``."""
    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [
                    f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in MODULES else child.module
                    for a in child.names
                ]
            found.extend((_named(name), inner, child.lineno) for name in names)
            visit(child, inner)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")), False)
    return tuple(found)


def _imports(module: str) -> tuple[tuple[str, bool, int], ...]:
    """The costmodel modules among ``_all_imports``."""
    return tuple(found for found in _all_imports(module) if found[0] in MODULES)


def _layer_breach(module: str, target: str, line: int) -> str | None:
    """Why ``module`` may not import ``target`` (at ``line``), or None where it may."""
    owner, package = _package(module), _package(target)
    if package in ("", owner):
        return None
    if owner == "kernel":
        allowed, rule = package in KERNEL_IMPORTS, f"the torch kernel reaches beyond {KERNEL_IMPORTS}"
    elif package == "kernel":
        allowed, rule = owner == "cli", "only the CLI may reach the torch kernel"
    else:
        allowed, rule = LAYER[package] < LAYER[owner], f"{package} is not below {owner}"
    return None if allowed else f"{MODULES[module].relative_to(REPO)}:{line} imports {target}: {rule}"


def test_a_package_imports_only_strictly_lower_layers() -> None:
    """Every module at once; the message lists every breach."""
    breaches = [
        breach
        for module, path in MODULES.items()
        if path not in ENTRY_POINTS
        for target, _, line in _imports(module)
        if (breach := _layer_breach(module, target, line)) is not None
    ]
    assert not breaches, "\n".join(breaches)


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {_package(m) for m, path in MODULES.items() if path not in ENTRY_POINTS} - {""}
    assert packages - {"kernel"} == set(LAYER)


def test_no_import_cycles() -> None:
    """Between modules, lazy imports included: a cycle is two modules that each need the other."""
    graph = {m: {t for t, _, _ in _imports(m) if t != m} for m in MODULES}
    state: dict[str, int] = {}  # 1 on the path being walked, 2 done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                raise AssertionError(" -> ".join([*path[path.index(target) :], target]))
            if target not in state:
                walk(target, [*path, target])
        state[module] = 2

    for module in MODULES:
        if module not in state:
            walk(module, [module])


@cache
def _started() -> frozenset[str]:
    """What Python itself has loaded before any of our code runs."""
    probe = "import sys; print(' '.join(sys.modules))"
    return frozenset(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split()
    )


@cache
def _loaded_at_import(module: str) -> frozenset[str]:
    """What importing ``module`` loads: its top-level imports and theirs, transitively (outside costmodel,
    only the names they import directly), and what Python starts with."""
    seen = {module}
    todo = [module]
    while todo:
        current = todo.pop()
        if current not in MODULES:
            continue
        for target, lazy, _ in _all_imports(current):
            parents = [".".join(target.split(".")[:i]) for i in range(1, target.count(".") + 2)]
            for name in parents:
                if not lazy and name not in seen:
                    seen.add(name)
                    todo.append(name)
    return frozenset(seen) | _started()


def test_a_lazy_import_saves_something() -> None:
    """A function-level import of what the module already loads at its top saves nothing: it goes up."""
    wasted = []
    for module, path in MODULES.items():
        loaded = _loaded_at_import(module)
        lazy_imports = {(target, line) for target, lazy, line in _all_imports(module) if lazy}
        wasted += sorted(
            f"{path.relative_to(REPO)}:{line}: {target}" for target, line in lazy_imports if target in loaded
        )
    assert not wasted, "imported lazily though the module already loads it:\n" + "\n".join(wasted)


@cache
def _every_command_loads() -> frozenset[str]:
    """What every run of the CLI loads before its command starts: ``costmodel.cli.app`` and its imports."""
    probe = "import sys, costmodel.cli.app; print(' '.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    return frozenset(done.stdout.split())


# The CLI package's root runs before any of its modules (codegen's and the tests' imports of a renderer
# too), so it stays light and loads the command line only when run.
LIGHT_ROOTS = {"costmodel.cli"}


def test_a_lazy_import_saves_start_up_of_some_command() -> None:
    """A function-level import of a module that every command loads anyway saves no command anything."""
    loaded = _every_command_loads()
    wasted = [
        f"{MODULES[module].relative_to(REPO)}:{line}: {target}"
        for module in sorted(set(MODULES) - LIGHT_ROOTS)
        for target, line in sorted(
            {(t, line) for t, lazy, line in _all_imports(module) if lazy and t in loaded}
        )
    ]
    assert not wasted, "imported lazily though every command loads it:\n" + "\n".join(wasted)


def test_the_model_layers_import_no_torch_and_no_cli() -> None:
    model = {p for p in LAYER if LAYER[p] < LAYER["cli"]}
    for module, path in MODULES.items():
        if _package(module) in model:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert not any(n == "torch" or n.startswith(("torch.", "costmodel.cli")) for n in names), path


PLAN = ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink", "--format", "json"]
# What the plan command (the single-layer report) must not load: it answers before any of these would help.
# numpy costs ~50 ms to import: a plan's few ranks run on Python floats (costmodel.symbolic.ops,
# costmodel.core.scalars, schedule_rows); rich is for the table, not the JSON; a built-in profile is built
# from what codegen validated (costmodel/machines/builtin_profiles.py), so no YAML is parsed; pydantic's
# plugin loader (importlib.metadata) stays out while the command line turns plugins off; tempfile is for writes;
# the formulas' text is for --explain.
PLAN_NEVER_LOADS = (
    "torch",
    "sympy",
    "numpy",
    "rich",
    "yaml",
    "importlib.metadata",
    "tempfile",
    "costmodel.symbolic.formula_text",
    "costmodel.training.step",
    "costmodel.training.search",
    "costmodel.audit",
    "costmodel.calibration",
    "costmodel.kernel",
    "costmodel.inference",
)


def test_the_plan_command_loads_only_what_it_needs() -> None:
    probe = (
        "import contextlib, io, json, sys\n"
        "from costmodel.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = main({PLAN!r})\n"
        "json.loads(out.getvalue())\n"
        "print(json.dumps([code, sorted(sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    code, loaded = json.loads(done.stdout)
    assert code == 0
    unwanted = [
        m for m in loaded if m in PLAN_NEVER_LOADS or m.startswith(tuple(f"{p}." for p in PLAN_NEVER_LOADS))
    ]
    assert not unwanted, f"the plan command loads {unwanted}"


# A function of a job takes the Job (plans/job.py) whole, not its pieces. Outside the CLI (a command's signature
# is its flags), the torch kernel and the symbolic model, these alone take more than five parameters, keyword-only
# options aside; none is given a job's state:
MANY_PARAMETERS = {
    # a kernel rate's, a ring step's, a decode step's or one attention layer's operands; a layout walk's arrays
    "machines.binding.rate",
    "machines.binding.call_rate",
    "machines.kernels.attention_rate",
    "machines.kernels.gemm_rate",
    "machines.kernels.gemm_shape",
    "plans.timing.predict",
    "plans.timing.ring_layer_time",
    "plans.cp.usp._split",
    "inference.serve.decode_values",
    "schedule.packed._walk_key_tiles",
    # a fit's measurements, folds and provenance
    "audit.fit.as_fitted",
    "audit.fit.cross_validate",
    "audit.fit.kfold_fit",
    "audit.fit.runs_profile",
    "audit.runs.fit_runs",
    "calibration.compare.compare",
    "calibration.fit.calibrated_inputs",
    # a regime's keys, which a job and a measured run both have
    "plans.uncertainty.calibration",
    # the layout's pieces, which the validator splits before a Job exists
    "plans.stages.split_stages",
    # a grid's axes (lengths, CP degrees, one machine of several) beside the job
    "training.sweep.sweep",
}


def _many_parameters() -> set[str]:
    """The functions, nested ones too, with more than five positional parameters (``self`` and ``cls`` aside),
    each as its module's name in the package and its own."""
    many = set()
    for module, path in MODULES.items():
        if _package(module) in ("cli", "kernel", "symbolic"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = {a.arg for a in node.args.posonlyargs + node.args.args} - {"self", "cls"}
                if len(names) > 5:
                    many.add(f"{module.removeprefix('costmodel.')}.{node.name}")
    return many


def test_a_function_takes_at_most_five_parameters_but_the_named_few() -> None:
    many = _many_parameters()
    assert many == MANY_PARAMETERS, (
        f"more than five parameters (a job's functions take the Job whole): {sorted(many - MANY_PARAMETERS)}; "
        f"five or fewer now, or gone (drop them from MANY_PARAMETERS): {sorted(MANY_PARAMETERS - many)}"
    )


def test_only_the_command_line_turns_pydantic_plugins_off() -> None:
    """The CLI turns plugins off unless the environment names some, and then stands in for pydantic's loader;
    a library user keeps pydantic's own loader and whatever plugins the environment has."""
    probe = (
        "import os, sys\n"
        "if sys.argv[1] == 'cli':\n"
        "    from costmodel.cli import main\n"
        "    main(['--version'])\n"
        "import costmodel.plans.inputs, pydantic\n"
        "pydantic.TypeAdapter(int)  # builds a validator, so pydantic asks its loader\n"
        "loader = sys.modules['pydantic.plugin._loader']\n"
        "print(os.environ.get('PYDANTIC_DISABLE_PLUGINS'), hasattr(loader, 'entry_points'), list(loader.get_plugins()))\n"
    )

    def run(how: str, **env: str) -> str:
        environ = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"} | env
        done = subprocess.run(
            [sys.executable, "-c", probe, how],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=environ,
            check=True,
        )
        return done.stdout.splitlines()[-1]

    assert run("library") == "None True []"
    assert run("cli") == "__all__ False []"
    assert run("cli", PYDANTIC_DISABLE_PLUGINS="some-plugin") == "some-plugin True []"
