"""`cp-plan calibrate` and `cp-plan validate` end to end, and the calibration's fault cases: a killed
rank, a hung rank and Ctrl-C each leave no profile and no process behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import ctrl_c_reaches_children, wait_for_connected_ranks

pytestmark = [pytest.mark.kernel, pytest.mark.slow]
torch = pytest.importorskip("torch")

CP_PLAN = shutil.which("cp-plan")
QUICK = [
    "--nproc",
    "2",
    "--tokens",
    "32,64,128",
    "--message-bytes",
    "4k,16k,64k,256k,1M,4M",
    "--repeats",
    "3",
]
LONG = ["--nproc", "2", "--tokens", "64,512,2048", "--repeats", "25"]  # runs long enough to be interrupted


def cp_plan(*args: str, **kwargs):  # noqa: ANN003, ANN201
    if CP_PLAN is None:
        pytest.skip("the cp-plan console script is not installed")
    return subprocess.run([CP_PLAN, *args], capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibrate") / "quick.yaml"
    done = cp_plan("calibrate", *QUICK, "--out", str(out), timeout=300)
    import yaml

    # a loaded machine may make the quick calibration too noisy to trust: it is written all the same, and
    # the exit code says which (1, as a failed check, so that a script does not take it as good)
    trusted = yaml.safe_load(out.read_text())["calibration"]["quality"]["trusted"]
    assert done.returncode == (0 if trusted else 1), done.stderr
    assert ("too noisy to trust" in " ".join(done.stderr.split())) == (not trusted)  # wrapped at 80 columns
    return out


def test_calibrate_writes_a_measured_profile(profile: Path) -> None:
    import yaml

    data = yaml.safe_load(profile.read_text())
    assert data["source"]["kind"] == "measured" and data["source"]["nproc"] == 2
    assert data["source"]["backend"] == "gloo" and data["source"]["torch_version"] == torch.__version__
    cal = data["calibration"]
    assert len(cal["p2p"]["intra-node"]["samples"]) == 6 and cal["p2p"]["intra-node"]["r2"] <= 1
    assert {c["concurrency"] for c in cal["compute"]} == {1, 2}
    assert [p["tokens"] for p in cal["compute"][0]["forward"]] == [32, 64, 128]
    # every fitted quantity with its spread over resampled repeats, and calibrate's verdict on them
    assert {"p2p intra-node alpha", "alltoall intra-node B", "layer ring zigzag causal fwd"} <= set(
        cal["fits"]
    )
    assert all(fit["spread"] >= 0 for fit in cal["fits"].values())
    # each inference scheme's fixed cost, with its spread, and the short-query calls' measured rates
    assert set(cal["inference_overhead_s"]) == {"pass-kv", "pass-q", "decode"}
    assert {"inference pass-kv", "inference pass-q", "inference decode"} <= set(cal["fits"])
    assert {(c["queries"], c["keys"]) for c in cal["call_rates"]} >= {(64, 256), (64, 1024)}
    # the memory bandwidth one decode query streamed a long cache at: a CPU's, between 0.1 and 1,000 GB/s
    assert 1e8 < data["device"]["hbm_bandwidth"] < 1e12
    assert "hbm_bandwidth is the rate one decode query read" in data["source"]["notes"]
    assert cal["quality"]["r2_min"] == 0.95 and isinstance(cal["quality"]["trusted"], bool)
    assert cal["quality"]["trusted"] == (not cal["quality"]["reasons"])
    assert not list(profile.parent.glob(".*.tmp"))
    report = json.loads(
        cp_plan("--hw", str(profile), "--dtype", "fp32", "--seq", "4k", "--n", "2", "-f", "json").stdout
    )
    assert report["hardware"]["source"] == "measured"


def test_validate_compares_at_least_12_configurations(profile: Path) -> None:
    done = cp_plan(
        "validate",
        "--hw",
        str(profile),
        "--nproc",
        "2",
        "--repeats",
        "3",
        "--format",
        "json",
        "--max-median-error",
        "10",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = report["rows"]
    assert len(rows) >= 12
    assert {r["variant"] for r in rows} == {"ring", "ulysses"} and {r["pass"] for r in rows} == {
        "fwd",
        "fwd+bwd",
    }
    assert {r["layout"] for r in rows if r["variant"] == "ring"} == {"contiguous", "striped", "zigzag"}
    assert min(r["shard_over_critical"] for r in rows) < 1 < max(r["shard_over_critical"] for r in rows)
    assert {r["layout"] for r in rows if r["documents"] > 1} == {"contiguous", "zigzag"}  # packed, varlen
    for r in rows:
        assert r["measured_s"] > 0 and r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    assert report["median_abs_error"] <= report["max_abs_error"]
    # held-out shapes (calibrate never ran them) carry the verdict; the fitted ones are reported apart
    held_out = [r for r in rows if r["held_out"]]
    assert len(held_out) >= 12 and report["held_out_rows"] == len(held_out)
    assert {r["tokens_per_rank"] for r in rows if not r["held_out"]} == {8}
    assert all(r["uncertainty_s"] >= 0 and r["measured_spread"] >= 0 for r in rows)
    # a fresh profile measured every scheme's fixed cost: the six inference rows are in the verdict
    assert [r["scheme"] for r in report["inference_rows"]] == ["pass-kv", "pass-q", "decode"] * 2
    assert report["inference_in_verdict"] and report["inference_not_in_verdict_because"] is None
    assert report["passed"] == (report["training_passed"] and report["inference_passed"])


def test_validate_fails_past_its_threshold(profile: Path) -> None:
    done = cp_plan(
        "validate",
        "--hw",
        str(profile),
        "--nproc",
        "2",
        "--repeats",
        "3",
        "--max-median-error",
        "0.000001",
        timeout=600,
    )
    assert done.returncode == 1 and "median |error|" in done.stdout


def _alive(pid: int) -> bool:
    try:
        state = next(
            line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State")
        )
    except (OSError, StopIteration):
        return False
    return "Z" not in state.split(":", 1)[1]


def _calibrate_and(
    tmp_path: Path, act, extra: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, list[int], Path]:  # noqa: ANN001
    """Start a long calibration, wait until both ranks are up (each connected to the store: inside the rank
    loop, whatever start-up took), do ``act(process, ranks)``, wait for the end."""
    if CP_PLAN is None:
        pytest.skip("the cp-plan console script is not installed")
    out = tmp_path / "never.yaml"
    with ctrl_c_reaches_children():
        process = subprocess.Popen(
            [CP_PLAN, "calibrate", *LONG, *extra, "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    try:
        ranks = wait_for_connected_ranks(process, 2)
        act(process, ranks)
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process, ranks, out


def _no_leftovers(ranks: list[int], out: Path) -> None:
    """The launcher reaps its ranks before it exits; a rank it lost would exit within 0.5 s of noticing."""
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in ranks), "a rank outlived the calibration"
    assert not out.exists() and not list(out.parent.glob(".*.tmp")), "a profile was written"


def test_a_killed_rank_leaves_no_profile_and_no_process(tmp_path: Path) -> None:
    process, ranks, out = _calibrate_and(tmp_path, lambda p, r: os.kill(r[1], signal.SIGKILL))
    assert process.returncode == 1
    assert re.search(
        r"calibration failed, no profile written: rank \d exited with code -9", process.stderr.read()
    )
    _no_leftovers(ranks, out)


def test_a_hung_rank_times_out_and_is_named(tmp_path: Path) -> None:
    """The timeout counts from the launch, start-up included: 20 s leaves a loaded machine its start-up."""
    process, ranks, out = _calibrate_and(
        tmp_path, lambda p, r: os.kill(r[1], signal.SIGSTOP), ("--timeout", "20")
    )
    assert process.returncode == 1
    assert "did not finish within 20 s" in process.stderr.read()
    _no_leftovers(ranks, out)


def test_ctrl_c_leaves_no_profile_and_no_process(tmp_path: Path) -> None:
    process, ranks, out = _calibrate_and(tmp_path, lambda p, r: os.killpg(p.pid, signal.SIGINT))
    assert process.returncode == 130
    assert "interrupted" in process.stderr.read()
    _no_leftovers(ranks, out)
