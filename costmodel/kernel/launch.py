"""Run a function on every rank of a process group: N local processes, or this process under torchrun.

``launch(fn, nproc)`` calls ``fn(ctx, *args)`` on each rank with a :class:`RankContext` and returns
``{rank: result}``. Locally it spawns ``nproc`` processes (``torch.multiprocessing``, a TCP store on
127.0.0.1 that this process hosts on a port the system picks, so a killed run leaves no file; gloo
on CPU, NCCL when there is a GPU per rank) under a hard timeout: when a rank raises, dies or hangs,
every process is terminated and :class:`LaunchError` names the rank ("rank 1 exited with code -9",
"rank 0 did not finish within 120 s"); Ctrl-C tears them all down too. Under ``torchrun`` (RANK and
WORLD_SIZE set; MASTER_ADDR/MASTER_PORT for the rendezvous) it runs ``fn`` in this process only, so
the same code spans nodes, and the result holds this rank's entry.
"""

from __future__ import annotations

import collections
import os
import pickle
import queue as queue_module
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from costmodel.core.errors import InputError
from costmodel.core.units import parse_integer

KILL_GRACE_S = 5.0  # after SIGTERM, how long a rank may take to exit before SIGKILL
FAILURE_GRACE_S = 1.0  # after the first failure, collect the others so the root cause is named first
MAX_WORLD = 1 << 20  # ranks in a job: as many as the planner's largest --gpus


class LaunchError(RuntimeError):
    """A rank failed, died or hung; the message names it. ``remote_traceback`` holds a raising rank's."""

    def __init__(self, message: str, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


@dataclass(frozen=True)
class RankContext:
    """What ``fn`` gets on each rank."""

    rank: int
    world_size: int
    device: Any  # torch.device
    backend: str  # "gloo" or "nccl"
    group: Any = None  # the process group (None: the default, WORLD)


@dataclass(frozen=True)
class Launcher:
    """What torchrun tells this process in its environment, each value checked."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def _env_count(name: str, low: int, high: int, default: int | None = None) -> int:
    """The launcher's variable ``name`` as a whole number from ``low`` to ``high``; a value that is not one
    is bad input naming the variable, not a traceback in every rank."""
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    try:
        value = parse_integer(text or "", name)
    except InputError:
        value = None
    if value is None or not low <= value <= high:
        raise InputError(
            name,
            f"the environment variable is {(text or '')[:20]!r}; a launcher such as torchrun sets it to a "
            f"whole number from {low} to {high}",
        )
    return value


def launcher() -> Launcher | None:
    """torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, checked: the one place that reads the
    launcher's environment. None when not under a launcher (RANK or WORLD_SIZE unset)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world = _env_count("WORLD_SIZE", 1, MAX_WORLD)
    local_world = _env_count("LOCAL_WORLD_SIZE", 1, world, default=world)
    return Launcher(
        rank=_env_count("RANK", 0, world - 1),
        world_size=world,
        local_rank=_env_count("LOCAL_RANK", 0, local_world - 1, default=0),
        local_world_size=local_world,
    )


def ranks_per_node(world_size: int) -> int:
    """Ranks that share a node: the launcher's LOCAL_WORLD_SIZE (also honoured by a local run, which then
    measures its ranks as several nodes), else all of them."""
    return min(_env_count("LOCAL_WORLD_SIZE", 1, MAX_WORLD, default=world_size), world_size)


def under_torchrun() -> bool:
    return launcher() is not None


def launch(
    fn: Callable[..., Any],
    nproc: int | None = None,
    *,
    args: tuple = (),
    timeout_s: float = 120.0,
    device: str = "auto",
) -> dict[int, Any]:
    """Run ``fn(ctx, *args)`` on every rank: under torchrun in this process, else on ``nproc`` local ones."""
    if (env := launcher()) is not None:
        return {env.rank: run_under_torchrun(fn, args=args, device=device, timeout_s=timeout_s)}
    if nproc is None:
        raise InputError("--nproc", "give the number of local processes (or run under torchrun)")
    ranks_per_node(nproc)  # checked here, before the ranks that read it start
    return dict(enumerate(run_local(fn, nproc, args=args, timeout_s=timeout_s, device=device)))


def _choose_device(device: str, local_rank: int, world_size: int) -> tuple[Any, str]:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)  # before any NCCL call, or batch_isend_irecv can hang
        return torch.device("cuda", local_rank), "nccl"
    if device != "cpu":
        raise InputError("--device", f"unknown device {device!r}; accepted: auto, cpu, cuda")
    return torch.device("cpu"), "gloo"


def run_under_torchrun(
    fn: Callable[..., Any], *, args: tuple = (), device: str = "auto", timeout_s: float = 600.0
) -> Any:
    """Initialise from torchrun's environment (env://), run ``fn`` on this rank, tear down."""
    import torch.distributed as dist

    env = launcher()
    if env is None:
        raise InputError("RANK", "not set: run under torchrun, or without it on --nproc local ranks")
    torch_device, backend = _choose_device(device, env.local_rank, env.local_world_size)
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        return fn(RankContext(env.rank, env.world_size, torch_device, backend), *args)
    finally:
        dist.destroy_process_group()


def _watch_parent(parent_pid: int) -> None:
    """Exit if the launching process goes away (even by SIGKILL), so no rank outlives it."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(0.5)


@dataclass(frozen=True)
class _LocalRun:
    """What every spawned rank is started with, beside its rank and its end of the result pipe."""

    world_size: int
    store_port: int
    device: str
    threads: int
    timeout_s: float
    parent_pid: int
    fn: Callable[..., Any]
    args: tuple


def _rank_main(rank: int, run: _LocalRun, results: Any) -> None:
    threading.Thread(target=_watch_parent, args=(run.parent_pid,), daemon=True).start()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(run.threads)
        torch_device, backend = _choose_device(run.device, rank, run.world_size)
        timeout = timedelta(seconds=run.timeout_s)
        store = dist.TCPStore("127.0.0.1", run.store_port, run.world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=run.world_size, timeout=timeout)
        try:
            result = run.fn(RankContext(rank, run.world_size, torch_device, backend), *run.args)
            results.send((rank, "returned", None))  # a hang after this is a peer's, not ours
            dist.barrier()  # nobody tears down while a peer still exchanges with it
        finally:
            dist.destroy_process_group()
        # Plain pickle copies tensors by value: torch's shared-memory handles die with this process.
        results.send((rank, "ok", pickle.dumps(result)))
    except InputError as exc:
        results.send((rank, "input", (exc.field, exc.message)))
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent, named by rank
        results.send((rank, "error", (f"{type(exc).__name__}: {exc}", traceback.format_exc())))


def run_local(
    fn: Callable[..., Any],
    nproc: int,
    *,
    args: tuple = (),
    timeout_s: float = 120.0,
    device: str = "auto",
    threads_per_rank: int | None = None,
) -> list[Any]:
    """Spawn ``nproc`` ranks running ``fn(ctx, *args)``; return their results in rank order.

    ``fn`` must be importable by name (defined at module level), and its result picklable. The whole
    run, start-up included, must finish within ``timeout_s``; otherwise all ranks are killed.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if nproc < 1:
        raise InputError("--nproc", f"must be at least 1, got {nproc}")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = threads_per_rank or max(1, cpus // nproc)
    context = mp.get_context("spawn")
    # One pipe per rank, not a Queue: a Queue's semaphores outlive a SIGKILLed parent as a warning.
    pipes = [context.Pipe(duplex=False) for _ in range(nproc)]
    # Port 0: the system picks a free one, with no window for another program to take it.
    store = dist.TCPStore(
        "127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    run = _LocalRun(nproc, store.port, device, threads, timeout_s, os.getpid(), fn, args)
    processes = [
        context.Process(
            target=_rank_main, name=f"cp-plan-rank-{rank}", daemon=True, args=(rank, run, pipes[rank][1])
        )
        for rank in range(nproc)
    ]
    try:
        for process in processes:
            process.start()
        for _, writer in pipes:
            writer.close()  # the ranks hold their ends; a dead rank's pipe then reads as closed
        return _collect(processes, _Inbox([reader for reader, _ in pipes]), timeout_s)
    finally:
        _terminate(processes)
        for reader, writer in pipes:
            reader.close()
            writer.close()
        del store


class _Inbox:
    """The messages of every rank's pipe, in arrival order."""

    def __init__(self, readers: list[Any]) -> None:
        self.open = list(readers)
        self.pending: collections.deque = collections.deque()

    def get(self, timeout: float) -> tuple[int, str, Any]:
        from multiprocessing.connection import wait

        if not self.pending:
            if not self.open:
                time.sleep(timeout)
            for reader in wait(self.open, timeout):
                try:
                    self.pending.append(reader.recv())
                except (
                    EOFError,
                    OSError,
                    pickle.UnpicklingError,
                ):  # the rank is gone; its exit code says how
                    self.open.remove(reader)
        if not self.pending:
            raise queue_module.Empty
        return self.pending.popleft()


class _Tally:
    """What the parent has heard of the ranks: results, failures (one line and a remote traceback each),
    and since when something failed."""

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self.done: dict[int, Any] = {}
        self.returned: set[int] = set()  # fn returned; the result may still be on its way
        self.failures: dict[int, tuple[str, str]] = {}
        self.input_error: InputError | None = None
        self.failed_at: float | None = None
        self.silent_exit_at: dict[int, float] = {}  # ranks that exited with code 0 and no result (yet)

    def receive(self, rank: int, status: str, payload: Any) -> None:
        if status == "returned":
            self.returned.add(rank)
        elif status == "ok":
            self.done[rank] = pickle.loads(payload)
        elif status == "input":
            self.input_error = self.input_error or InputError(*payload)
        elif status == "error":
            self.failures[rank] = (f"rank {rank} raised {payload[0]}", payload[1])

    def check_exits(self, processes: list, now: float) -> None:
        """A rank that exited without sending a result failed, by its exit code."""
        for index, process in enumerate(processes):
            if process.exitcode is None or index in self.done or index in self.failures:
                continue
            if process.exitcode != 0:
                self.failures[index] = (f"rank {index} exited with code {process.exitcode}", "")
            # Exit code 0 with the result still in the queue is fine; with none after a while, not.
            elif now - self.silent_exit_at.setdefault(index, now) > FAILURE_GRACE_S:
                self.failures[index] = (f"rank {index} exited with code 0 without a result", "")
        if (self.failures or self.input_error) and self.failed_at is None:
            self.failed_at = time.monotonic()

    def time_out(self, timeout_s: float) -> None:
        """Name the ranks still running, those whose ``fn`` never returned first."""
        late = [rank for rank in range(self.nproc) if rank not in self.done and rank not in self.failures]
        late = [rank for rank in late if rank not in self.returned] or late
        ranks = "rank " + str(late[0]) if len(late) == 1 else "ranks " + ", ".join(map(str, late))
        self.failures.setdefault(late[0], (f"{ranks} did not finish within {timeout_s:g} s", ""))

    def results(self) -> list[Any]:
        """Every rank's result in rank order, or the error that explains the run best."""
        if self.input_error is not None:
            raise self.input_error
        if self.failures:
            # A rank that died is usually the cause; the others then fail talking to it.
            order = sorted(self.failures, key=lambda rank: ("exited" not in self.failures[rank][0], rank))
            message = "; ".join(self.failures[rank][0] for rank in order)
            tracebacks = "\n".join(self.failures[rank][1] for rank in order if self.failures[rank][1])
            raise LaunchError(message, tracebacks)
        return [self.done[rank] for rank in range(self.nproc)]


def _collect(processes: list, results: _Inbox, timeout_s: float) -> list[Any]:
    """Wait for every rank's result; after the first failure, only a grace period for the others."""
    deadline = time.monotonic() + timeout_s
    tally = _Tally(len(processes))
    while len(tally.done) < len(processes):
        now = time.monotonic()
        if tally.failed_at is not None and now - tally.failed_at > FAILURE_GRACE_S:
            break
        if now > deadline:
            tally.time_out(timeout_s)
            break
        try:
            tally.receive(*results.get(timeout=0.05))
        except queue_module.Empty:
            pass
        tally.check_exits(processes, now)
    return tally.results()


def _terminate(processes: list) -> None:
    """SIGTERM every live rank, then SIGKILL any still alive after a grace period; reap them all."""
    started = [process for process in processes if process.pid is not None]
    for process in started:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + KILL_GRACE_S
    for process in started:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
