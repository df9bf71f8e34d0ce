"""Helpers the tests share: evaluate a plan, round as the article rounds, wait for a launcher's ranks."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from costmodel.plans.evaluate import evaluate
from costmodel.plans.inputs import MachineOverrides, PlanInputs, machine_for
from costmodel.plans.job import Job
from costmodel.plans.schema import Report

REPO = Path(__file__).resolve().parent.parent


# torchtitan's Llama 3 8B at 8K on eight H100s (FSDP, local batch 2, selective recompute), a published run:
# more than an 80 GB H100's usable share, run on torchtitan's 96 GB part.
TITAN_8B_8K_JOB = {
    "model": "llama3-8b",
    "seq": 8192,
    "gpus": 8,
    "global_batch": 16,
    "micro_batch": 2,
    "zero": 3,
    "recompute": "selective",
    "framework": "torchtitan",
    "hw": "h100-nvlink",
}
# the same job as `cp-plan step` flags, and as a plan file's fields (a plan states its CP degree)
TITAN_8B_8K = [
    "step",
    *(part for key, value in TITAN_8B_8K_JOB.items() for part in (f"--{key.replace('_', '-')}", str(value))),
]
TITAN_8B_8K_PLAN = "name: x\ncp: 1\n" + "".join(f"{key}: {value}\n" for key, value in TITAN_8B_8K_JOB.items())


def half_up(value: float, digits: int) -> Decimal:
    """``value`` to ``digits`` significant digits, halves up ([A-RingCost] prints 0.5625 as 56.3 %)."""
    d = Decimal(repr(float(value)))
    if d == 0:
        return d
    exponent = d.adjusted() - digits + 1
    return d.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)


def plan(hw: str = "a100-nvlink", inter_bandwidth: str | None = None, **overrides: object) -> Report:
    """The worked example (256K tokens over 8 A100s) with overrides, evaluated on a built-in profile (its
    inter-node link replaced when ``inter_bandwidth`` is given, as ``--inter-node-bandwidth`` does)."""
    inputs = PlanInputs(**{"seq": 262_144, "n": 8, "hw": hw, **overrides})
    return evaluate(inputs, machine_for(inputs, MachineOverrides(inter_node_bandwidth=inter_bandwidth)))


def searched(**flags: object) -> tuple[Job, int]:
    """(the job a layout search starts from, its global batch) for flat flags: the search lays the job out
    itself, so its global batch is held apart from the job (no layout of it is checked against it yet)."""
    global_batch = int(flags.pop("global_batch"))  # type: ignore[call-overload]
    return Job.of(**flags), global_batch


def every_scheme(**flags: object) -> tuple[Job, int]:
    """:func:`searched` under the default framework running every CP scheme in every layout (the search's
    widest space, :func:`costmodel.training.search.widest`)."""
    from costmodel.frameworks import load_framework
    from costmodel.training.search import widest

    global_batch = int(flags.pop("global_batch"))  # type: ignore[call-overload]
    return Job.of(**flags, _framework=widest(load_framework("megatron"))), global_batch


def memory_values(inputs: PlanInputs, setup: object, n: int | None = None, model: object = None) -> dict:
    """The memory formulas' values of the job a single layer's ``inputs`` and a ``TrainingSetup`` make, at
    CP degree ``n`` (default the inputs'); ``model``, already loaded, stands in for ``inputs.model``."""
    from costmodel.plans.job import make_job
    from costmodel.training.memory import training_values

    job = make_job(inputs.model_copy(update={"cp": 1}), setup, model=model)  # type: ignore[arg-type]
    return training_values(job, inputs.cp if n is None else n)


@contextlib.contextmanager
def ctrl_c_reaches_children() -> Iterator[None]:
    """Processes started inside take SIGINT as a terminal's foreground job does. pytest may itself run with
    SIGINT ignored (a background job of a script, ``cmd &``, or under nohup), and an ignored signal stays
    ignored in every child across exec: a test that sends Ctrl-C would then wait for ever."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def rank_processes(pid: int) -> list[int]:
    """Live (non-zombie) child processes of ``pid`` that run ranks (multiprocessing's spawn)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if (
            fields.get("PPid", "").strip() == str(pid)
            and "spawn_main" in cmdline
            and fields["State"][0] != "Z"
        ):
            out.append(int(entry.name))
    return sorted(out)


def _holds_a_socket(pid: int) -> bool:
    """Whether ``pid`` has a socket open: a rank of the launcher does from its store connection on (before
    that it has pipes only), so it is inside the rank loop whose failures the launcher reports."""
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith("socket:"):
                    return True
    return False


def wait_for_connected_ranks(launcher: Any, count: int, seconds: float = 300) -> list[int]:
    """The ``count`` rank processes of the running ``launcher`` (a ``subprocess.Popen``) once each holds its
    store connection: a condition, not a guess of how long start-up takes on a loaded machine."""
    deadline = time.monotonic() + seconds
    while True:
        ranks = rank_processes(launcher.pid)
        if len(ranks) == count and all(map(_holds_a_socket, ranks)):
            return ranks
        assert launcher.poll() is None, (
            f"the launcher ended before its ranks connected: {launcher.returncode}"
        )
        assert time.monotonic() < deadline, f"{count} ranks did not connect within {seconds:g} s"
        time.sleep(0.05)


# What a dense model trained in full binds for what it does not use: no latent attention, no LoRA, and (for
# the MoE formulas) no dense layers before the MoE ones.
PLAIN = {"m_la": 0, "c_q": 0, "r_q": 0, "r_kv": 0, "d_qk": 0, "d_r": 0, "d_v": 0, "f_b": 1, "f_tr": 1.0}
PLAIN |= {"n_dn": 0, "F_dn": 0}


def formula(name: str, **values: Any) -> Any:
    """The generated twin of formula ``name`` at ``values`` (PLAIN filling what they leave out), each argument
    taken by name: a test states the shape it means and nothing else."""
    from costmodel.symbolic import numeric

    given = PLAIN | values
    return getattr(numeric, name)(**{a: given[a] for a in numeric.ARGS[name]})
