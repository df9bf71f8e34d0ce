"""nccl-tests tables read back and fitted: α and B per collective and scope, and a profile whose links are measured.

The table is the one ``src/common.cu`` of nccl-tests prints [nccl-tests]: ``# Collective test starting: NAME``,
``# nThread ... nGpus ...``, one ``#  Rank  r Group g Pid p on HOST device d ...`` line per rank, then per
message size ``size count type redop root | time algbw busbw #wrong`` out of place, then the same in place
(older versions have no ``root`` column; ``#wrong`` reads ``N/A`` without validation). Time is in µs,
bandwidths in GB/s.

Which bandwidth: nccl-tests' doc/PERFORMANCE.md defines algbw = size / time and busbw = algbw x a factor
that makes it the rate each link carries, comparable across rank counts and with the hardware's peak:
2(n-1)/n for all_reduce; (n-1)/n for all_gather, reduce_scatter and alltoall; 1 for sendrecv. That link
rate is what cp-plan's B means (a ring hop's bytes per second per direction; for all-to-all, the bytes
a rank receives per second), so each fit is t = α + size·factor / B over the out-of-place times: B is a
bus bandwidth. A run's scope is inter-node when its ranks sit on more than one host, or (hosts not
printed) outnumber the base profile's devices per node.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ValidationError

from costmodel.audit.logs import count, read_lines
from costmodel.calibration.fit import fit_link
from costmodel.core.errors import InputError
from costmodel.machines.profiles import HardwareProfile, LinkFit, parse_profile

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")
Scope = Literal["intra-node", "inter-node"]
# Where a ring hop's B comes from, best first: a point-to-point exchange, then ring collectives.
P2P_PREFERENCE = ("sendrecv", "all_gather", "reduce_scatter", "all_reduce")

_START = re.compile(r"#\s*Collective test starting:\s*(\w+?)(?:_perf)?(?:_mpi)?\s*$")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)")
# What nccl-tests prints when a run went wrong: its check of the results ("# Out of bounds values : 3 FAILED")
# or an error it stopped on ("Test NCCL failure common.cu:...").
_FAILED = re.compile(r"\bFAILED\b|Test (?:NCCL |CUDA )?failure|Out of bounds values\s*:\s*0*[1-9]")


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw of nccl-tests doc/PERFORMANCE.md."""
    n = ranks
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


@dataclass
class Table:
    """One nccl-tests run: which collective, over how many ranks on which hosts, and its rows."""

    path: str
    collective: str
    ranks: int
    hosts: list[str]
    rows: list[dict[str, float]] = field(default_factory=list)  # bytes, out/in-place time s, busbw
    skipped: int = 0

    def scope(self, devices_per_node: int) -> Scope:
        if self.hosts:
            return "inter-node" if len(self.hosts) > 1 else "intra-node"
        return "inter-node" if self.ranks > devices_per_node else "intra-node"


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _collective_from_name(path: str) -> str | None:
    stem = Path(path).name.lower()
    return next((c for c in COLLECTIVES if c in stem or c.replace("_", "") in stem), None)


MIN_SIZES = 4  # message sizes a table needs: two pin a line exactly (R² = 1 whatever the times)
ROW_WIDTHS = (12, 13)  # tokens of a row: without and with the root column
TIME_RANGE_US = (1e-3, 1e9)  # a nanosecond to a quarter of an hour: beyond it a time is not a transfer
R2_MIN = 0.95  # a fit explaining less than this of its times is not alpha-beta
LINK_FACTOR = 2.0  # B may exceed the base profile's link rate per direction by this (both directions)
DIP = 0.8  # a time may dip to this fraction of a smaller message's (noise at the latency floor)
RISE = 1.2  # the largest message must take this many times the smallest's: else no bandwidth shows


def parse_table(path: str, field_name: str = "FILE") -> Table:
    """Read one nccl-tests output; anything but the table and its header is skipped and counted.

    The table must be one: one collective (a second ``# Collective test starting`` is refused, not
    pooled), every row as wide as the first (12 or 13 columns), sizes strictly increasing, times positive,
    within :data:`TIME_RANGE_US` and rising (:data:`DIP`, :data:`RISE`), algbw = size / time as printed,
    and at least :data:`MIN_SIZES` sizes. Each refusal is one :class:`InputError` with its line."""
    collective, threads_gpus, ranks, hosts = None, None, {}, []
    rows, skipped, width = [], 0, None

    def refuse(line: int, problem: str) -> InputError:
        return InputError(field_name, f"{path}:{line}: {problem}")

    for number, (text, _) in enumerate(read_lines(path, field_name, kind="nccl"), start=1):
        if (m := _START.search(text)) is not None:
            if collective is not None or rows:
                raise refuse(
                    number,
                    f"a second table ({m.group(1)}) after {collective or 'the first'}; one collective per file",
                )
            collective = m.group(1)
            continue
        if (m := _HEADER.search(text)) is not None and len(text) < 1000:
            threads_gpus = int(m.group(1)) * int(m.group(2))
            continue
        if (m := _RANK.search(text)) is not None and len(text) < 1000:
            ranks[int(m.group(1))] = m.group(2)
            if m.group(2) not in hosts:
                hosts.append(m.group(2))
            continue
        tokens = text.split()
        size = count(tokens[0]) if tokens and not text.lstrip().startswith("#") else None
        if size is None or len(tokens) < 12:
            skipped += _not_a_row(text, number, refuse)
            continue
        try:
            rows.append(_row(tokens, size, rows, width) | {"line": number})
        except _BadRow as exc:
            raise refuse(number, str(exc)) from None
        width = len(tokens)
    collective = collective or _collective_from_name(path)
    if collective not in COLLECTIVES:
        raise InputError(
            field_name,
            f"{path}: cannot tell which collective this is (no '# Collective test starting:' line and "
            f"no name in the file name); accepted: {', '.join(c + '_perf' for c in COLLECTIVES)}",
        )
    _check_rows(rows, path, field_name)
    size = len(ranks) or threads_gpus or 0
    if size < 2:
        raise InputError(field_name, f"{path}: {size or 'unknown'} ranks; a link needs at least 2")
    _check_busbw(rows, collective, size, refuse)
    return Table(path, collective, size, hosts, rows, skipped)


def _check_busbw(rows: list[dict[str, Any]], collective: str, ranks: int, refuse: Any) -> None:
    """Each row's busbw is its algbw x the collective's factor (nccl-tests doc/PERFORMANCE.md), within the
    5 % and the 0.01 GB/s of printing: two bandwidths that disagree leave B without one value."""
    factor = bus_factor(collective, ranks)
    for row in rows:
        expected = row["algbw"] * factor
        if abs(row["busbw"] - expected) > 0.05 * expected + 0.02e9:
            raise refuse(
                row["line"],
                f"busbw {row['busbw'] / 1e9:g} GB/s is not algbw {row['algbw'] / 1e9:g} GB/s x {factor:.4g} "
                f"({collective} over {ranks} ranks): the columns are not nccl-tests'",
            )


def _not_a_row(text: str, number: int, refuse: Any) -> int:
    """A line that is no row of the table is skipped (1 to count) unless it says the run failed."""
    if _FAILED.search(text) is not None:
        raise refuse(
            number, f"{text.strip()[:80]!r}: nccl-tests reports a failed run; its times are not a link's"
        )
    return 1


class _BadRow(ValueError):
    """A row that is not one of this table's: the text says why."""


def _row(tokens: list[str], size: int, rows: list[dict[str, Any]], width: int | None) -> dict[str, Any]:
    """One row of the table, checked alone and against the rows before it (see :func:`parse_table`)."""
    if len(tokens) not in ROW_WIDTHS or (width is not None and len(tokens) != width):
        raise _BadRow(
            f"a row of {len(tokens)} columns"
            + (f" after rows of {width}" if width is not None else "")
            + "; nccl-tests rows have 12 or 13 (size count type redop [root] then time algbw busbw #wrong twice)",
        )
    out_time, algbw, in_time = _float(tokens[-8]), _float(tokens[-7]), _float(tokens[-4])
    if out_time is None or not TIME_RANGE_US[0] <= out_time <= TIME_RANGE_US[1] or size <= 0:
        raise _BadRow(
            f"time {tokens[-8]!r} us: times must be numbers from {TIME_RANGE_US[0]:g} to "
            f"{TIME_RANGE_US[1]:g} us, sizes positive",
        )
    if rows and size <= rows[-1]["bytes"]:
        raise _BadRow(f"size {size} after {rows[-1]['bytes']}: sizes must increase (one table, one run)")
    expected = size / (out_time * 1e3)  # GB/s, as nccl-tests computes algbw
    if algbw is None or abs(algbw - expected) > 0.05 * expected + 0.02:
        raise _BadRow(
            f"algbw {tokens[-7]} GB/s is not size / time = {expected:.2f} GB/s: the columns are not nccl-tests'",
        )
    wrong = [w for w in (tokens[-5], tokens[-1]) if w not in ("0", "N/A")]
    if wrong:
        raise _BadRow(
            f"#wrong {wrong[0]}: nccl-tests found wrong results; its times are not a working link's"
        )
    floor = max(r["out_of_place_s"] for r in rows) * DIP if rows else 0.0
    if out_time * 1e-6 < floor:
        raise _BadRow(f"time {out_time:g} us falls below smaller messages' times: times must rise with size")
    return {
        "bytes": size,
        "out_of_place_s": out_time * 1e-6,
        "in_place_s": in_time * 1e-6 if in_time and TIME_RANGE_US[0] <= in_time <= TIME_RANGE_US[1] else None,
        "algbw": algbw * 1e9,
        "busbw": (_float(tokens[-6]) or 0.0) * 1e9,
    }


def _check_rows(rows: list[dict[str, Any]], path: str, field_name: str) -> None:
    """Enough sizes, and times that rise enough across them to show a bandwidth."""
    if not rows:
        raise InputError(
            field_name, f"{path}: no rows of an nccl-tests table (size count type ... time algbw busbw)"
        )
    if len(rows) < MIN_SIZES:
        raise InputError(field_name, f"{path}: {len(rows)} message sizes; a fit needs at least {MIN_SIZES}")
    if rows[-1]["out_of_place_s"] < RISE * rows[0]["out_of_place_s"]:
        raise InputError(
            field_name,
            f"{path}: the largest message takes {rows[-1]['out_of_place_s'] * 1e6:g} us, the smallest "
            f"{rows[0]['out_of_place_s'] * 1e6:g} us: times must rise at least {RISE}x to show a bandwidth",
        )


def fit_table(table: Table) -> LinkFit:
    """α and bus bandwidth B of t = α + size·factor / B over the out-of-place times (weighted by 1/t)."""
    samples = [
        {
            "bytes": r["bytes"],
            "seconds": r["out_of_place_s"],
            "spread": abs(r["in_place_s"] - r["out_of_place_s"]) / r["out_of_place_s"]
            if r["in_place_s"]
            else 0.0,
        }
        for r in table.rows
    ]

    try:
        return fit_link(samples, received_fraction=bus_factor(table.collective, table.ranks))
    except (ValidationError, np.linalg.LinAlgError, ValueError, ZeroDivisionError):  # B past 1e30 B/s, ...
        raise InputError("FILE", f"{table.path}: the times admit no fit of t = α + size / B") from None


def _unclamped_alpha(table: Table) -> float:
    """The weighted least-squares α before :func:`fit_link` clips it at 0."""
    x = np.array([r["bytes"] for r in table.rows], dtype=float) * bus_factor(table.collective, table.ranks)
    t = np.array([r["out_of_place_s"] for r in table.rows])
    design = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    (alpha, _), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return float(alpha)


def fit_problem(table: Table, fit: LinkFit, base: HardwareProfile) -> str | None:
    """Why a fit cannot stand for a link, or None: R² under :data:`R2_MIN`, a negative α (the least-squares
    line crosses below zero), or B above :data:`LINK_FACTOR` x the base profile's link of that scope."""
    scope = table.scope(base.devices_per_node)
    link = (base.links.inter_node if scope == "inter-node" else None) or base.links.intra_node
    cap = LINK_FACTOR * link.bandwidth_per_direction
    if not (math.isfinite(fit.r2) and fit.r2 >= R2_MIN):
        return f"the fit's R² is {fit.r2:.3f}, under {R2_MIN}: the times do not follow t = α + size / B"
    alpha = _unclamped_alpha(table)
    if alpha < -0.01 * table.rows[0]["out_of_place_s"]:
        return f"the fit's α is {alpha * 1e6:.2f} us, below 0: the small messages are too fast for the large"
    if not (math.isfinite(fit.bandwidth) and fit.bandwidth <= cap):
        return (
            f"bus bandwidth {fit.bandwidth / 1e9:.4g} GB/s exceeds {LINK_FACTOR:g} x the {scope} link of "
            f"{base.name} ({link.bandwidth_per_direction / 1e9:.4g} GB/s per direction)"
        )
    return None


def fit_all(paths: list[str], base: HardwareProfile) -> list[dict[str, Any]]:
    """One fit per file: collective, scope, ranks, hosts, α, B, R²; the largest run of a (collective, scope)
    first."""
    fits = []
    for path in paths:
        table = parse_table(path)
        fit = fit_table(table)
        problem = fit_problem(table, fit, base)
        if problem is not None:  # refused, not flagged: no profile is written from it
            raise InputError("FILE", f"{path}: {problem}")
        fits.append(
            {
                "file": path,
                "collective": table.collective,
                "scope": table.scope(base.devices_per_node),
                "ranks": table.ranks,
                "hosts": table.hosts,
                "latency_s": fit.latency_s,
                "bus_bandwidth": fit.bandwidth,
                "r2": fit.r2,
                "sizes": len(table.rows),
                "skipped_lines": table.skipped,
                "largest_busbw": max(r["busbw"] for r in table.rows),
            }
        )
    return sorted(fits, key=lambda f: (f["scope"], f["collective"], -f["ranks"]))


# Ring steps of one call over n ranks [NCCL-Tuning]: an all-reduce is a reduce-scatter then an all-gather.
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (n - 1)


@dataclass(frozen=True)
class RingFit:
    """A ring collective's cost, t = call + steps·hop + size·busbw factor / B, fitted over several tables."""

    call_latency_s: float
    hop_latency_s: float
    bus_bandwidth: float
    mean_error: float  # mean |relative error| of the fit over its samples
    samples: int


def fit_ring(samples: list[tuple[str, int, float, float]]) -> RingFit:
    """The fixed latency per call, the latency per ring step and the bus bandwidth of ring collectives from
    ``(collective, ranks, bytes, seconds)`` samples, least squares in relative error. The latency per step is
    told apart from the call's only where the samples span two or more rank counts; else it is 0 and the
    call holds all the latency. A negative coefficient is fixed at 0 and the rest refitted."""
    steps = np.array([RING_STEPS[c] * (n - 1) for c, n, _, _ in samples], dtype=float)
    x = np.array([size * bus_factor(c, n) for c, n, size, _ in samples], dtype=float)
    t = np.array([seconds for *_, seconds in samples], dtype=float)
    columns = {"call": np.ones_like(t), "hop": steps, "inverse_bw": x}
    free = ["call", "hop", "inverse_bw"] if len(set(steps)) > 1 else ["call", "inverse_bw"]
    while True:
        design = np.stack([columns[k] for k in free], axis=1) / t[:, None]
        solved, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        found = dict(zip(free, (float(v) for v in solved), strict=True))
        negative = [k for k in ("hop", "call") if k in found and found[k] < 0]
        if not negative or found.get("inverse_bw", 0.0) <= 0:
            break
        free.remove(negative[0])
    if found.get("inverse_bw", 0.0) <= 0:
        raise InputError("FILE", "the ring collectives' times do not grow with size: no bandwidth to fit")
    call, hop = max(found.get("call", 0.0), 0.0), max(found.get("hop", 0.0), 0.0)
    predicted = call + steps * hop + x * found["inverse_bw"]
    return RingFit(call, hop, 1.0 / found["inverse_bw"], float(np.mean(np.abs(predicted / t - 1))), len(t))


def ring_fit_of(paths: list[str], scope: str, base: HardwareProfile) -> RingFit | None:
    """:func:`fit_ring` over every ring-collective table of one scope, or None where there is none."""
    samples = []
    for path in paths:
        table = parse_table(path)
        if table.collective in RING_STEPS and table.scope(base.devices_per_node) == scope:
            samples += [(table.collective, table.ranks, r["bytes"], r["out_of_place_s"]) for r in table.rows]
    return fit_ring(samples) if samples else None


def _pick(fits: list[dict[str, Any]], scope: str, collectives: tuple[str, ...]) -> dict[str, Any] | None:
    for collective in collectives:
        found = [f for f in fits if f["scope"] == scope and f["collective"] == collective]
        if found:
            return found[0]
    return None


def measured_profile(
    base: HardwareProfile, fits: list[dict[str, Any]], name: str, date: str | None = None
) -> HardwareProfile:
    """``base`` with every link that nccl-tests measured replaced: the point-to-point B and α from the best
    collective (:data:`P2P_PREFERENCE`), the all-to-all from alltoall_perf; device and kernel tables kept."""
    data = base.model_dump(mode="python", exclude_none=True)
    said = []
    for scope in ("intra-node", "inter-node"):
        key = scope.replace("-", "_")
        p2p = _pick(fits, scope, P2P_PREFERENCE)
        a2a = _pick(fits, scope, ("alltoall",))
        if p2p is None and a2a is None:
            continue
        old = data["links"].get(key) or {"name": f"{scope} link"}
        chosen = p2p or a2a
        assert chosen is not None
        link: dict[str, Any] = {
            "name": f"{old['name']} (measured by nccl-tests)",
            "bandwidth_per_direction": chosen["bus_bandwidth"],
            "latency_s": chosen["latency_s"],
            "source": "; ".join(
                f"{f['collective']}_perf {Path(f['file']).name}: {f['ranks']} ranks, "
                f"alpha {f['latency_s'] * 1e6:.1f} us, busbw {f['bus_bandwidth'] / 1e9:.1f} GB/s"
                for f in (p2p, a2a)
                if f is not None
            ),
        }
        ring = ring_fit_of([f["file"] for f in fits], scope, base)
        if ring is not None:  # what TP and DP collectives pay: the call, each ring step, the bus bandwidth
            link["collective_efficiency"] = min(1.0, ring.bus_bandwidth / link["bandwidth_per_direction"])
            link["hop_latency_s"] = ring.hop_latency_s
            link["call_latency_s"] = ring.call_latency_s
            link["source"] += (
                f"; ring collectives: {ring.call_latency_s * 1e6:.1f} us a call, {ring.hop_latency_s * 1e6:.2f} "
                f"us a step, busbw {ring.bus_bandwidth / 1e9:.1f} GB/s ({ring.mean_error:.1%} mean error)"
            )
        if a2a is not None:
            link["alltoall"] = {
                "bandwidth_per_direction": a2a["bus_bandwidth"],
                "latency_s": a2a["latency_s"],
            }
        data["links"][key] = link
        said.append(f"{scope} from {chosen['collective']}_perf")
    if not said:
        raise InputError("FILE", "no run measured a link")
    hosts = sorted({h for f in fits for h in f["hosts"]}) or ["unknown host"]
    files = ", ".join(Path(f["file"]).name for f in fits)
    data["name"] = name
    data["description"] = f"{base.description} [links measured by nccl-tests: {'; '.join(said)}]".strip()
    data["source"] = {
        "kind": "measured",
        "url": base.source.url,
        "host": ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else ""),
        "date": date or datetime.date.today().isoformat(),
        "backend": "nccl",
        "nproc": max(f["ranks"] for f in fits),
        "notes": f"Links fitted to nccl-tests outputs ({files}): t = alpha + size x busbw factor / B, "
        f"out-of-place times; B is the bus bandwidth of nccl-tests doc/PERFORMANCE.md. Device and kernel "
        f"tables from {base.name}.",
    }
    return parse_profile(data, f"profile measured from {files}", field="--out")
