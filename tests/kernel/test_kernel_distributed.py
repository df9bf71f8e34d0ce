"""Ring and Ulysses attention over real process groups (gloo, local processes), and the launcher.

Every spawn is guarded by the launcher's own hard timeout, so a deadlock fails the test instead of
hanging CI. Spawning is slow (seconds per group), so each group runs many cases; the parent then
compares every case with float64 and with torch SDPA + autograd.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import kernel_workers

from costmodel.core.errors import InputError
from costmodel.kernel.launch import KILL_GRACE_S, LaunchError, run_local
from costmodel.kernel.masks import MaskRule
from costmodel.kernel.reference import reference_attention
from costmodel.kernel.selftest import TOLERANCES
from costmodel.kernel.sharding import unshard
from costmodel.schedule.layouts import LAYOUTS, ulysses_feasibility
from tests.support import ctrl_c_reaches_children

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

SPAWN_TIMEOUT_S = 240.0
OUTPUTS = ("out", "lse", "dq", "dk", "dv")
GQA = [(4, 2, 8), (6, 1, 12)]  # (heads, kv_heads, head_dim): GQA 2:1 and 6:1 (odd head count per group)


def cases_for(n: int) -> list[dict]:
    """Every layout × causal × varlen × GQA shape × variant in fp32, and a bf16 subset."""
    seq = 8 * n  # two chunks per rank for zigzag, at least 4 tokens each
    varlen = (0, 3, seq // 2 + 1, seq)  # boundaries that cut across shards
    cases = []
    for layout, causal, packed, (heads, kv_heads, head_dim), variant in itertools.product(
        LAYOUTS, (False, True), (False, True), GQA, ("ring", "ulysses")
    ):
        if variant == "ulysses" and not ulysses_feasibility(heads, kv_heads, n)[0]:
            continue
        cases.append(
            {
                "seq": seq,
                "batch": 2,
                "heads": heads,
                "kv_heads": kv_heads,
                "head_dim": head_dim,
                "layout": layout,
                "causal": causal,
                "varlen": varlen if packed else None,
                "variant": variant,
                "dtype": "float32",
                "seed": len(cases),
            }
        )
    for layout, variant in itertools.product(LAYOUTS, ("ring", "ulysses")):
        if variant == "ulysses" and not ulysses_feasibility(4, 2, n)[0]:
            continue
        cases.append(
            {
                "seq": seq,
                "batch": 1,
                "heads": 4,
                "kv_heads": 2,
                "head_dim": 16,
                "layout": layout,
                "causal": True,
                "varlen": None,
                "variant": variant,
                "dtype": "bfloat16",
                "seed": len(cases),
            }
        )
    return cases


def expected(case: dict) -> tuple[torch.Tensor, ...]:
    q, k, v, dout = kernel_workers.full_inputs(case)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    out, lse = reference_attention(*leaves, MaskRule(case["causal"], case["varlen"]))
    return (out, lse, *torch.autograd.grad(out, leaves, dout.double()))


def sdpa(case: dict) -> tuple[torch.Tensor, ...]:
    q, k, v, dout = kernel_workers.full_inputs(case)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=case["causal"], enable_gqa=True)
    return (out, *torch.autograd.grad(out, leaves, dout))


def within(got: torch.Tensor, want: torch.Tensor, dtype: str) -> tuple[bool, str]:
    atol, rtol = TOLERANCES[dtype]
    error, bound = (got.double() - want.double()).abs().max().item(), atol + rtol * want.abs().max().item()
    return bool(torch.isfinite(got).all()) and error <= bound, f"{error:.2e} > {bound:.2e}"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_and_ulysses_are_exact(n: int) -> None:
    """N ranks, each layout, causal and not, varlen, GQA 4/2 and 6/1: forward and backward equal float64
    (fp32 tight, bf16 looser) and, without varlen, torch SDPA with is_causal / enable_gqa and autograd."""
    cases = cases_for(n)
    by_rank = run_local(kernel_workers.run_cases, n, args=(cases,), timeout_s=SPAWN_TIMEOUT_S, device="cpu")
    failures = []
    for index, case in enumerate(cases):
        got = [unshard([by_rank[r][index][o] for r in range(n)], case["layout"]) for o in range(len(OUTPUTS))]
        for name, g, w in zip(OUTPUTS, got, expected(case), strict=True):
            ok, why = within(g, w, case["dtype"])
            if not ok:
                failures.append(f"{case} {name} vs float64: {why}")
        if case["varlen"] is None and case["dtype"] == "float32":
            for name, g, w in zip(("out", "dq", "dk", "dv"), [got[0], *got[2:]], sdpa(case), strict=True):
                ok, why = within(g, w, "float32")
                if not ok:
                    failures.append(f"{case} {name} vs SDPA: {why}")
    assert not failures, "\n".join(failures)
    assert {c["variant"] for c in cases} == {"ring", "ulysses"}  # at N = 3 too (6 heads / 1 KV head)


def test_results_come_back_in_rank_order() -> None:
    assert run_local(kernel_workers.rank_and_size, 2, timeout_s=SPAWN_TIMEOUT_S, device="cpu") == [
        (0, 2),
        (1, 2),
    ]


def assert_reaped(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_hung_rank_is_named_and_every_rank_killed(tmp_path: Path) -> None:
    """The timeout counts from the launch, start-up included: 30 s leaves a loaded machine its start-up,
    so that rank 0 has returned and rank 1 is the one named."""
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"^rank 1 did not finish within 30 s"):
        run_local(kernel_workers.hang_on_rank_1, 2, args=(str(tmp_path),), timeout_s=30, device="cpu")
    assert time.monotonic() - start < 30 + KILL_GRACE_S + 30  # the timeout, the SIGTERM grace, then SIGKILL
    assert_reaped([int(p.read_text()) for p in tmp_path.glob("rank*")])


def test_a_dead_rank_is_named() -> None:
    with pytest.raises(LaunchError, match=r"^rank 1 exited with code -9"):
        run_local(kernel_workers.die_on_rank_1, 2, timeout_s=SPAWN_TIMEOUT_S, device="cpu")


def test_a_raising_rank_is_named_with_its_traceback() -> None:
    with pytest.raises(LaunchError, match=r"^rank 0 raised ValueError: boom") as caught:
        run_local(kernel_workers.raise_on_rank_0, 2, args=("value",), timeout_s=SPAWN_TIMEOUT_S, device="cpu")
    assert "raise ValueError" in caught.value.remote_traceback


def test_bad_input_on_a_rank_stays_bad_input() -> None:
    with pytest.raises(InputError, match=r"^--seq: not on this rank"):
        run_local(kernel_workers.raise_on_rank_0, 2, args=("input",), timeout_s=SPAWN_TIMEOUT_S, device="cpu")


def test_ctrl_c_tears_every_rank_down(tmp_path: Path) -> None:
    """SIGINT to the launching process (Ctrl-C) leaves no rank behind."""
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[2])]!r}
        import kernel_workers
        from costmodel.kernel.launch import run_local
        run_local(kernel_workers.hang_on_rank_1, 2, args=({str(tmp_path)!r},), timeout_s=120, device="cpu")
    """)
    with ctrl_c_reaches_children():
        launcher = subprocess.Popen([sys.executable, "-c", script])
    try:
        pids = _pids_written(tmp_path, 2, launcher)
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert_reaped(pids)


def _pids_written(folder: Path, count: int, launcher: subprocess.Popen) -> list[int]:
    """The pids ``count`` ranks wrote (hang_on_rank_1, each file renamed into place whole), once all are
    there: a condition, not a guess of how long start-up takes on a loaded machine."""
    deadline = time.monotonic() + 300
    while True:
        written = list(folder.glob("rank*"))
        if len(written) == count:
            return [int(path.read_text()) for path in written]
        assert launcher.poll() is None and time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.05)


def test_calibration_timings_run_on_a_group() -> None:
    """Every collective timing the calibration builds on returns the same positive figures on each rank."""
    by_rank = run_local(kernel_workers.time_everything, 2, timeout_s=SPAWN_TIMEOUT_S, device="cpu")
    assert by_rank[0] == by_rank[1]  # the slowest rank's time, agreed by all-reduce
    times = by_rank[0]
    assert times["exchange_s"] > 0 and times["all_to_all_s"] > 0
    for variant in ("ring", "ulysses"):
        assert 0 < times[variant].forward_s and 0 < times[variant].forward_backward_s
    compute, comm, exposed, efficiency = times["overlap"]
    assert len(compute) == len(comm) == 2 and all(t > 0 for t in (*compute, *comm, exposed, efficiency))
