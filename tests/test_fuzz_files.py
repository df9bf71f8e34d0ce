"""Fuzzing the YAML inputs: hardware profiles, model presets and plan files, through the real CLI.

Each case is a valid file with one or two fields set to a valid, boundary or hostile value (huge,
negative, zero, nan, inf, booleans, strings, lists, deep nesting), or a hostile document (aliases,
duplicate keys, deep nesting, binary bytes, a truncated or corrupted file). It runs ``cp-plan``'s
entry point in a forked child under an address-space limit (the parent's size + 2 GiB), a CPU time limit
(the work a case may do, whatever else loads the machine) and a far wall clock limit (a case that waits
on nothing for that long hangs), and must end with exit 0, 1 or 2, no traceback, one stderr line naming
the field on exit 2, and only finite, non-negative numbers in its JSON.

Default: a few dozen cases per input kind (well under a minute on two cores). For a long run:
``pytest tests/test_fuzz_files.py --hypothesis-profile=deep``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import resource
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.core.resources import data_dir

DEEP = settings.default.max_examples >= 1000  # the "deep" profile of tests/conftest.py
EXAMPLES = settings.default.max_examples if DEEP else 30
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MEMORY_HEADROOM = 2 << 30  # bytes of address space a case may add to the forked parent's
CPU_S = 60  # CPU seconds a case may use (SIGXCPU past them); the slowest default case takes well under one
WALL_S = 300  # wall seconds before a case counts as hung (SIGALRM): far, so that no load reaches it


# --- running one case ----------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int | None  # exit code; None when a signal ended the child
    signal: int | None
    out: str
    err: str
    wall_s: float
    cpu_s: float  # user + system time of the child: what a bound on work is checked against
    peak_rss_bytes: int  # the child's peak beyond its resident memory when it began (the case's own)


@dataclass
class Stats:
    cases: int = 0
    slowest: tuple[float, str] = (0.0, "")
    peak: tuple[int, str] = (0, "")
    codes: dict[int, int] = field(default_factory=dict)

    def summary(self) -> str:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return (
            f"fuzz: {self.cases} cases, exit codes {dict(sorted(self.codes.items(), key=str))}; "
            f"slowest {self.slowest[0]:.2f} s of CPU ({self.slowest[1][:120]}); peak RSS of a case "
            f"{self.peak[0] / 2**20:.0f} MiB ({self.peak[1][:120]}); pytest itself {base / 2**20:.0f} MiB"
        )

    def add(self, outcome: Outcome, label: str) -> None:
        self.cases += 1
        self.codes[outcome.code] = self.codes.get(outcome.code, 0) + 1
        self.slowest = max(self.slowest, (outcome.cpu_s, label))
        self.peak = max(self.peak, (outcome.peak_rss_bytes, label))


STATS = Stats()


def run_cli(args: list[str], cpu_s: int = CPU_S, wall_s: int = WALL_S) -> Outcome:
    """``cp-plan ARGS`` in a forked child: the real entry point, its own limits, its own stdout/stderr."""
    from costmodel.cli import main

    with tempfile.TemporaryDirectory(prefix="cp-plan-fuzz-") as folder:
        out_path, err_path = Path(folder) / "out", Path(folder) / "err"
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        gc.freeze()  # the child's collections then leave pytest's objects alone, unwritten: not copied into it
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 99
            try:
                (Path(folder) / "rss").write_text(str(_resident_bytes()))
                _limit_child(cpu_s, wall_s)
                with open(out_path, "w") as out, open(err_path, "w") as err, open(os.devnull) as null:
                    os.dup2(null.fileno(), 0)
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    sys.stdout, sys.stderr = out, err
                    code = main(args)
                    out.flush()
                    err.flush()
            except BaseException:  # noqa: BLE001 - reported to the parent as a traceback on stderr
                import traceback

                with open(err_path, "a") as err:
                    err.write(traceback.format_exc())
            finally:
                os._exit(code if isinstance(code, int) else 99)
        gc.unfreeze()
        _, status, usage = _wait(pid, start + wall_s + 5)
        wall = time.monotonic() - start
        began = Path(folder) / "rss"
        inherited = int(began.read_text()) if began.is_file() else 0
        return Outcome(
            code=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            out=out_path.read_text(errors="replace"),
            err=err_path.read_text(errors="replace"),
            wall_s=wall,
            cpu_s=usage.ru_utime + usage.ru_stime,
            peak_rss_bytes=max(0, usage.ru_maxrss * 1024 - inherited),
        )


def _resident_bytes() -> int:
    """This process's resident memory: a forked child's peak counts what it held when it began, so a case's own
    peak is its peak less this."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0  # no /proc: the peak is read whole
    return pages * os.sysconf("SC_PAGE_SIZE")


def _limit_child(cpu_s: int, wall_s: int) -> None:
    size = _address_space()
    resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_HEADROOM, size + MEMORY_HEADROOM))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)  # a forked child's CPU time starts from zero
    resource.setrlimit(
        resource.RLIMIT_CPU, (cpu_s if hard == resource.RLIM_INFINITY else min(cpu_s, hard), hard)
    )
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no core file
    for number in (signal.SIGALRM, signal.SIGXCPU):
        signal.signal(number, signal.SIG_DFL)
    signal.alarm(wall_s)


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return resource.getrlimit(resource.RLIMIT_AS)[0]


def _wait(pid: int, deadline: float) -> tuple[int, int, Any]:
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return done, status, usage
        if time.monotonic() > deadline:  # the alarm did not fire: kill it and report it
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


# --- what every outcome must satisfy -------------------------------------------------------------


def check_outcome(outcome: Outcome, names: set[str], where: set[str], label: str) -> None:
    """``where``: the file or flag the error names; a flag of the command also does, since a file's field
    can clash with one (a profile without the ``--dtype`` asked for). ``names``: the fields it may name."""
    STATS.add(outcome, label)
    assert outcome.signal is None, (
        f"{label}: killed by signal {outcome.signal} (time or memory limit)\n{outcome.err}"
    )
    assert "Traceback" not in outcome.err, f"{label}:\n{outcome.err}"
    assert outcome.code in (0, 1, 2), f"{label}: exit {outcome.code}\n{outcome.err}"
    if outcome.code == 2:
        lines = outcome.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("cp-plan: error: "), f"{label}:\n{outcome.err}"
        assert any(w in lines[0] for w in where) or re.match(r"cp-plan: error: --[a-z][a-z-]*: ", lines[0]), (
            f"{label}: the error names none of {where}: {lines[0]}"
        )
        assert any(name in lines[0] for name in names), f"{label}: the error names no field: {lines[0]}"
    else:
        assert outcome.out.strip(), f"{label}: exit {outcome.code} with no output"
        assert_finite_non_negative(json.loads(outcome.out), label, known=frozenset(KNOWN_NEGATIVE))


KNOWN_NEGATIVE: set[str] = set()  # none: every number of every answer is finite and not negative


def assert_finite_non_negative(
    value: Any, label: str, path: str = "", known: frozenset[str] = frozenset()
) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert_finite_non_negative(item, label, f"{path}.{key}", known)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            assert_finite_non_negative(item, label, f"{path}[{index}]", known)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        assert math.isfinite(value) and (value >= 0 or path in known), (
            f"{label}: {path} = {value!r} in the JSON output"
        )


# --- the inputs ----------------------------------------------------------------------------------


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _measured_profile() -> dict:
    from costmodel.calibration.fit import build_profile
    from tests.test_calibration import SHAPE, raw_measurements

    profile = build_profile(raw_measurements(), "box", SHAPE, date="2026-11-30")
    return profile.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class Kind:
    """One kind of YAML input: a valid example, the command that reads it, where its errors point."""

    name: str
    base: dict
    command: tuple[str, ...]  # "{path}" stands for the file
    flag: str | None  # the flag errors start with; None: the file path
    extra: tuple[tuple[str, ...], ...] = ()  # optional fields the base leaves out

    def args(self, path: str) -> list[str]:
        return [part.replace("{path}", path) for part in self.command]


KINDS = {
    "datasheet-profile": Kind(
        "datasheet-profile",
        _load(data_dir("hardware") / "a100-nvlink.yaml"),
        (
            "--seq",
            "256k",
            "--n",
            "16",
            "--hw",
            "{path}",
            "--causal",
            "--layout",
            "zigzag",
            "--pass",
            "fwd+bwd",
            "-f",
            "json",
        ),
        "--hw",
        (
            ("cp_ranks_per_node",),
            ("device", "effective_flops", "bf16"),
            ("device", "peak_flops", "fp8"),
            ("links", "intra_node", "alltoall", "bandwidth_per_direction"),
            ("links", "intra_node", "alltoall", "latency_s"),
            ("links", "inter_node"),
            ("calibration",),
            ("source", "host"),
            ("source", "nproc"),
        ),
    ),
    "measured-profile": Kind(
        "measured-profile",
        {},
        (
            "--seq",
            "16k",
            "--n",
            "2",
            "--hw",
            "{path}",
            "--dtype",
            "fp32",
            "--causal",
            "--pass",
            "fwd+bwd",
            "-f",
            "json",
        ),
        "--hw",
    ),
    "model-preset": Kind(
        "model-preset",
        _load(data_dir("configs") / "models" / "llama3-8b.yaml"),
        (
            "recommend",
            "--seq",
            "128k",
            "--model",
            "{path}",
            "--hw",
            "a100-nvlink",
            "--gpus",
            "64",
            "-f",
            "json",
        ),
        "--model",
        (("gated_mlp",), ("tied_embeddings",), ("dropout",), ("description",)),
    ),
    "plan-file": Kind(
        "plan-file",
        _load(data_dir("configs") / "plans" / "llama3-8b-128k-a100-nvlink.yaml"),
        ("check", "{path}", "-f", "json"),
        None,
        (
            ("tp",),
            ("pp",),
            ("zero",),
            ("memory_headroom",),
            ("dtype",),
            ("batch",),
            ("block",),
            ("efficiency",),
            ("expect", "max_comm_ratio"),
            ("model",),
            ("hw",),
        ),
    ),
}


def _base(kind: Kind) -> dict:
    return _measured_profile() if kind.name == "measured-profile" else kind.base


def _schema_names() -> set[str]:
    """Every field name of the YAML models: an error line must name one of them (or the mutated key)."""
    from pydantic import BaseModel

    from costmodel.machines.profiles import HardwareProfile
    from costmodel.plans.models import ModelPreset
    from costmodel.training.check import PlanFile

    names: set[str] = set()
    todo: list[type[BaseModel]] = [HardwareProfile, ModelPreset, PlanFile]
    seen: set[type] = set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            names.add(info.alias or name)
            for arg in _types_in(info.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    todo.append(arg)
    return names


def _types_in(annotation: Any) -> list[Any]:
    from typing import get_args

    found, todo = [], [annotation]
    while todo:
        item = todo.pop()
        found.append(item)
        todo.extend(get_args(item))
    return found


SCHEMA_NAMES = _schema_names()


def leaf_paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(data, dict) and data:
        return [p for key, value in data.items() for p in leaf_paths(value, (*prefix, key))]
    if isinstance(data, list) and data:
        return [p for index, value in enumerate(data) for p in leaf_paths(value, (*prefix, index))]
    return [prefix]


def all_paths(kind: Kind) -> list[tuple]:
    """Every leaf, every mapping above a leaf, and the optional fields."""
    leaves = leaf_paths(_base(kind))
    inner = {leaf[:end] for leaf in leaves for end in range(1, len(leaf))}
    return sorted(set(leaves) | inner | set(kind.extra), key=lambda p: tuple(map(str, p)))


SPECIAL = [
    0,
    -1,
    1,
    2,
    3,
    7,
    8,
    1024,
    2**31,
    2**53 + 1,
    2**63,
    2**64,
    10**30,
    10**300,
    -(10**300),
    0.0,
    -0.0,
    0.5,
    1e-30,
    1e30,
    1.0000001e30,
    1e-320,
    5e-324,
    1e300,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
    None,
    "",
    "0",
    "8k",
    "1M",
    "1e400",
    "-1",
    "nan",
    ".inf",
    "x" * 5000,
    "a\nb",
    "\x00\x1b",
    [],
    {},
    [1],
    [[[]]],
    {"a": 1},
    {"bf16": True},
    b"\x00\xff",
]

scalars = st.one_of(
    st.sampled_from(SPECIAL),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.booleans(),
    st.integers(min_value=1, max_value=2**20),
    st.floats(min_value=1e-6, max_value=1e16),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@dataclass(frozen=True)
class Mutation:
    path: tuple
    action: str  # "set", "delete", "rename"
    value: Any = None


def _get(data: Any, path: tuple) -> Any:
    for key in path:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def near(original: Any) -> st.SearchStrategy[Any]:
    """Valid and boundary values for a field: its own value scaled by powers of ten, or small counts;
    for other fields (strings, choices) the hostile ones."""
    if isinstance(original, bool):
        return st.booleans()
    if isinstance(original, int):
        # Counts just past every ceiling (2^16, 2^20, 2^34) are refused. S in (2^24, 2^34] and N or G
        # near 2^20 are left to test_a_huge_plan_is_answered_in_bounded_time_and_memory, which fails today.
        return st.one_of(
            st.integers(1, 2 * original + 8),
            st.sampled_from([1, 2, 4, 8, 2**16, 2**16 + 1, 2**20 + 1, 2**34 + 16, 2**41]),
        )
    if isinstance(original, float):
        scaled = st.integers(-40, 40).map(lambda k: original * 10.0**k if original else 10.0**k)
        return st.one_of(scaled, st.floats(original / 2, original * 2) if original else st.just(0.0))
    return st.just(original) if original is not None else values


def mutations(kind: Kind) -> st.SearchStrategy[list[Mutation]]:
    base = _base(kind)

    @st.composite
    def one(draw: st.DrawFn) -> Mutation:
        path = draw(st.sampled_from(all_paths(kind)))
        action = draw(st.sampled_from(["set"] * 8 + ["delete", "rename"]))
        plausible = draw(st.integers(0, 4)) > 0  # four in five: a value of the right kind
        value = draw(near(_get(base, path)) if plausible else values)
        return Mutation(path, action, value)

    return st.lists(one(), min_size=1, max_size=2)


def apply(data: Any, mutation: Mutation) -> Any:
    import copy

    data = copy.deepcopy(data)
    *parents, last = mutation.path
    node = data
    for key in parents:
        if isinstance(node, dict):
            node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict | list) else node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return data  # an earlier mutation replaced the way down
        if not isinstance(node, dict | list):
            return data
    if isinstance(node, dict):
        if mutation.action == "delete":
            node.pop(last, None)
        elif mutation.action == "rename" and last in node:
            node[f"{last}x"] = node.pop(last)
        else:
            node[last] = mutation.value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = mutation.value
    return data


# Documents no mutation of the data can express: the text itself is hostile.
def alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 {x: 1, y: 2}"]
    lines += [f"a{i}: &a{i} {{x: *a{i - 1}, y: *a{i - 1}, z: *a{i - 1}}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def hostile_text(kind: Kind) -> st.SearchStrategy[tuple[str, bytes]]:
    valid = yaml.safe_dump(_base(kind), sort_keys=False)
    first_key = next(iter(_base(kind)))
    return st.one_of(
        st.integers(1, 25).map(lambda n: ("alias-bomb", (alias_bomb(n) + valid).encode())),
        st.just(("anchor", valid.replace(f"{first_key}:", f"{first_key}: &x", 1).encode())),
        st.integers(60, 200_000).map(
            lambda n: ("deep-flow", f"{first_key}: {'[' * n}{']' * n}\n{valid}".encode())
        ),
        st.integers(60, 300).map(
            lambda n: (
                "deep-block",
                ("".join("  " * i + f"k{i}:\n" for i in range(n)) + "  " * n + "v\n").encode(),
            )
        ),
        st.sampled_from(leaf_paths(_base(kind))).map(
            lambda p: ("duplicate-key", (valid + f"{p[0]}: 1\n").encode())
        ),
        st.binary(max_size=300).map(lambda b: ("binary", b)),
        st.integers(0, len(valid)).map(lambda n: ("truncated", valid[:n].encode())),
        st.tuples(st.integers(0, len(valid)), st.text(min_size=1, max_size=3)).map(
            lambda t: ("corrupted", (valid[: t[0]] + t[1] + valid[t[0] :]).encode())
        ),
        st.just(("oversize", valid.encode() + b"#" * (1 << 20) + b"\n")),
        st.just(("empty", b"")),
    )


# --- the fuzz tests ------------------------------------------------------------------------------


def _write(folder: Path, data: bytes) -> str:
    path = folder / "input.yaml"
    path.write_bytes(data)
    return str(path)


def _fuzz_fields(kind: Kind, changes: list[Mutation]) -> None:
    data = _base(kind)
    for change in changes:
        data = apply(data, change)
    with tempfile.TemporaryDirectory(prefix="cp-plan-fuzz-in-") as folder:
        path = _write(Path(folder), yaml.safe_dump(data, sort_keys=False, allow_unicode=False).encode())
        names = {str(part) for change in changes for part in change.path if isinstance(part, str)}
        names |= {f"{name}x" for name in names} | SCHEMA_NAMES
        label = f"{kind.name}: " + ", ".join(
            f"{c.action} {'.'.join(map(str, c.path))}" + (f" = {c.value!r:.60}" if c.action == "set" else "")
            for c in changes
        )
        check_outcome(run_cli(kind.args(path)), names, {kind.flag or path}, label)


def _fuzz_text(kind: Kind, case: tuple[str, bytes]) -> None:
    what, text = case
    with tempfile.TemporaryDirectory(prefix="cp-plan-fuzz-in-") as folder:
        path = _write(Path(folder), text)
        # A hostile document is named by its file; a field need not be at fault.
        check_outcome(
            run_cli(kind.args(path)), {path}, {kind.flag or path}, f"{kind.name}: {what} ({len(text)} bytes)"
        )


@pytest.mark.parametrize("kind", list(KINDS), ids=list(KINDS))
def test_every_field_of_every_input(kind: str, request: pytest.FixtureRequest) -> None:
    @FUZZ
    @given(changes=mutations(KINDS[kind]))
    def fuzz(changes: list[Mutation]) -> None:
        _fuzz_fields(KINDS[kind], changes)

    fuzz()


@pytest.mark.parametrize("kind", list(KINDS), ids=list(KINDS))
def test_hostile_documents(kind: str) -> None:
    @settings(FUZZ, max_examples=max(EXAMPLES // 2, 10))
    @given(case=hostile_text(KINDS[kind]))
    def fuzz(case: tuple[str, bytes]) -> None:
        _fuzz_text(KINDS[kind], case)

    fuzz()


@pytest.mark.parametrize(
    ("seq", "n", "block", "gpus"), [(2**31, 8, 1024, 64), (2**20, 8, 1, 64), (2**17, 8, 1024, 2**20)]
)
def test_a_huge_plan_is_answered_in_bounded_time_and_memory(
    tmp_path, seq: int, n: int, block: int, gpus: int
) -> None:
    plan = dict(KINDS["plan-file"].base, seq=seq, n=n, block=block, gpus=gpus)
    path = _write(tmp_path, yaml.safe_dump(plan).encode())
    check_outcome(
        run_cli(["check", path, "-f", "json"], cpu_s=10),
        SCHEMA_NAMES,
        {path},
        f"plan: S = {seq}, N = {n}, block = {block}, G = {gpus}",
    )


def test_a_model_too_large_for_the_device_has_no_negative_n_min(tmp_path) -> None:
    preset = dict(KINDS["model-preset"].base, ffn_hidden=65536)
    path = _write(tmp_path, yaml.safe_dump(preset).encode())
    outcome = run_cli(KINDS["model-preset"].args(path))
    assert outcome.code == 0, outcome.err
    assert_finite_non_negative(json.loads(outcome.out), "model-preset: ffn_hidden = 65536")


def _work_for_ever(args: list[str]) -> None:
    while True:
        pass


def test_the_runner_reports_what_the_cli_did() -> None:
    """The harness itself: a plain run, bad input, and children that blow their memory, wall clock and CPU
    limits."""
    ok = run_cli(["--seq", "256k", "--n", "8", "-f", "json"])
    assert ok.code == 0 and json.loads(ok.out)["verdict"]["verdict"] in {"green", "amber", "red"}
    bad = run_cli(["--seq", "0"])
    assert bad.code == 2 and bad.err.startswith("cp-plan: error: ") and "--seq" in bad.err
    with pytest.raises(AssertionError, match="in the JSON output"):
        assert_finite_non_negative({"a": [1.0, math.inf]}, "probe")
    import costmodel.cli

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(costmodel.cli, "main", lambda args: len(bytearray(MEMORY_HEADROOM + (1 << 30))))
        greedy = run_cli([])
        assert greedy.code == 99 and "MemoryError" in greedy.err
        patch.setattr(costmodel.cli, "main", lambda args: time.sleep(30))
        stuck = run_cli([], wall_s=1)
        assert stuck.signal == signal.SIGALRM
        patch.setattr(costmodel.cli, "main", _work_for_ever)
        busy = run_cli([], cpu_s=1)
        assert busy.signal == signal.SIGXCPU
    with pytest.raises(AssertionError, match="in the JSON output"):
        assert_finite_non_negative({"a": -1}, "probe")


# --- every reader against files that are not regular files ---------------------------------------

AUDIT = Path(__file__).parent / "data" / "audit"
LOG = str(AUDIT / "megatron_tp2_cp2_8k.log")
# Where each kind of file enters, "{path}" the hostile file, and the flag or field its refusal names.
READERS = {
    "--hw": (["--hw", "{path}", "--seq", "64k"], "--hw"),
    "--model yaml": (["--model", "{path}", "--seq", "64k"], "--model"),
    "--model json": (["--model", "{path}.json", "--seq", "64k"], "--model"),
    "check": (["check", "{path}"], "{path}"),
    "hw show": (["hw", "show", "{path}"], "NAME"),
    "audit log": (["audit", "{path}", "--hw", "h100-nvlink"], "LOG"),
    "audit toml": (["audit", LOG, "--config", "{path}.toml", "--hw", "h100-nvlink"], "--config"),
    "audit flags": (["audit", LOG, "--config", "{path}.sh", "--hw", "h100-nvlink"], "--config"),
    "nccl table": (["hw", "from-nccl-tests", "{path}"], "FILE"),
    "--docs": (["--seq", "64k", "--docs", "{path}"], "--docs"),
}
SPECIAL = ["fifo", "link to /dev/zero", "link to /dev/urandom", "folder", "device", "link to a fifo"]


def _special(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a fifo":
        os.mkfifo(path.with_name("pipe"))
        path.symlink_to(path.with_name("pipe"))
    elif kind.startswith("link to /dev/"):
        path.symlink_to(kind.removeprefix("link to "))
    elif kind == "folder":
        path.mkdir()
    else:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # a copy of /dev/zero


@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(st.sampled_from(sorted(READERS)), st.sampled_from(SPECIAL))
def test_no_reader_waits_on_a_pipe_or_reads_a_device_for_ever(reader: str, kind: str) -> None:
    """A FIFO blocks an open() for ever and /dev/zero never ends: each reader refuses them at once."""
    if kind == "device" and os.geteuid() != 0:
        return  # mknod needs root
    args, names = READERS[reader]
    with tempfile.TemporaryDirectory() as folder:
        template = str(Path(folder) / "input")
        path = Path(args[[i for i, a in enumerate(args) if "{path}" in a][0]].replace("{path}", template))
        _special(kind, path)
        argv = [a.replace("{path}", template) for a in args]
        outcome = run_cli(argv, cpu_s=10, wall_s=30)  # a reader blocked on the FIFO meets the alarm
        where = names.replace("{path}", str(path))
        check_outcome(outcome, {where, "input"}, {where, str(path), "input"}, f"{reader} on a {kind}")
        assert outcome.code == 2, (reader, kind, outcome.wall_s, outcome.err)
