"""Profiles compose: a device and its fast domain from a built-in, the links and placement from flags.

"H100 with 8 GPUs per node over 200 Gb/s RoCE" is ``--hw h100-nvlink --inter-node-bandwidth 200Gb``,
not a new file. :func:`override` returns a validated copy whose description and source notes say what
was changed, so a report never passes an edited machine off as the datasheet's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from costmodel.core.errors import InputError
from costmodel.machines.profiles import SUSTAINED_CLOCK_RANGE, HardwareProfile, parse_profile

BANDWIDTH_HELP = (
    "a number with a decimal prefix and b (bits) or B (bytes), per second and per direction, "
    "e.g. 200Gb, 400 Gbit/s, 25GB/s, 1.8TB/s"
)
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BANDWIDTH = re.compile(
    r"^\s*(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*"
    r"(?P<prefix>[kKMGTP]?)(?P<unit>bits?|bit|b|bytes?|B)"
    r"(?:\s*(?:/\s*s|ps|/\s*sec))?\s*$"
)
_BINARY = re.compile(r"\d\s*[kKMGTP]i")
# Beyond any link built so far (NVLink 5 is 0.9 TB/s a direction), or below any link that would carry a
# training job: a figure outside them is a unit slip.
_MOST_PLAUSIBLE = 1e15
_LEAST_PLAUSIBLE = 1e6


def parse_bandwidth(text: str, field: str) -> float:
    """Bytes per second, per direction, from ``200Gb``, ``400 Gbit/s``, ``25GB/s`` or ``1.8TB/s``.

    The case of the unit decides bits (``b``) or bytes (``B``); prefixes are decimal, as NIC and link
    datasheets print them (200 Gb/s HDR InfiniBand = 25 GB/s). Anything else is an :class:`InputError`
    naming ``field``."""
    shown = repr(text if len(text) <= 40 else text[:37] + "...")
    if _BINARY.search(text):
        raise InputError(
            field,
            f"{shown}: binary prefixes (Gi, Ti) are not accepted; datasheets quote decimal "
            f"ones. Accepted: {BANDWIDTH_HELP}",
        )
    match = _BANDWIDTH.match(text)
    if not match:
        raise InputError(field, f"{shown} is not a bandwidth; accepted: {BANDWIDTH_HELP}")
    number = float(match["number"]) * _PREFIX[match["prefix"]]
    per_second = number / 8 if match["unit"].startswith("b") else number
    if not math.isfinite(per_second) or per_second <= 0:
        raise InputError(field, f"{shown} must be a positive, finite bandwidth")
    if per_second > _MOST_PLAUSIBLE:
        raise InputError(
            field, f"{shown} is {per_second:.3g} bytes/s, beyond any link (1 PB/s); check b vs B"
        )
    if per_second < _LEAST_PLAUSIBLE:
        raise InputError(
            field, f"{shown} is {per_second:.3g} bytes/s, below any link (1 MB/s); check the prefix"
        )
    return per_second


def parse_dims(text: str, field: str = "--torus-dims") -> list[int]:
    """``4x4x8`` as [4, 4, 8]: one to three positive chip counts joined by x."""
    parts = text.lower().replace(" ", "").split("x")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise InputError(
            field, f"{text!r} is not a torus shape; give 1 to 3 chip counts joined by x, e.g. 4x4x8"
        )
    dims = [int(p) for p in parts]
    if math.prod(dims) > 2**20:
        raise InputError(field, f"{text!r} holds {math.prod(dims):,} chips, more than 1,048,576")
    return dims


def _gbytes(value: float) -> str:
    return f"{value / 1e9:g} GB/s"


@dataclass(frozen=True)
class ProfileChanges:
    """What the command line changes in a profile; None leaves it as it is. Bandwidths are bytes/s (a link's
    per direction), or strings for :func:`parse_bandwidth`; the latency is in seconds; ``torus_dims`` as 4x4x8;
    ``hbm_bytes`` the device's memory in bytes (a part of a GPU sold with more or less HBM than the profile's);
    ``clock_scale`` the part's sustained tensor-core clock as a share of the profile's part's (a lower power
    limit)."""

    inter_bandwidth: float | str | None = None
    intra_bandwidth: float | str | None = None
    devices_per_node: int | None = None
    cp_ranks_per_node: int | None = None
    inter_latency: float | None = None
    torus_dims: str | None = None
    hbm_bytes: float | None = None
    hbm_bandwidth: float | str | None = None
    clock_scale: float | None = None


def override(profile: HardwareProfile, changes: ProfileChanges) -> HardwareProfile:
    """``profile`` with other links or placement; validated, and saying so in its description and notes.

    A new link drops any measured figure of that scope (an all-to-all or a calibration fit of the old link
    would otherwise still be used). Without ``cp_ranks_per_node``, a profile whose CP ranks filled the node
    keeps filling it when ``devices_per_node`` changes; one with fewer keeps its count."""
    data = profile.model_dump(mode="python", exclude_none=True)
    said = [
        *_new_memory(data, changes),
        *_new_clock(data, profile, changes.clock_scale),
        *_new_links(data, changes),
        *_new_latency(data, profile, changes.inter_latency),
        *_new_placement(data, profile, changes),
    ]
    if not said:
        return profile
    text = "; ".join(said)
    data["description"] = f"{profile.description} [overridden: {text}]".strip()
    notes = data["source"].get("notes")
    data["source"]["notes"] = (
        f"{notes} Overridden on the command line: {text}."
        if notes
        else f"Overridden on the command line: {text}."
    )
    changed = parse_profile(data, f"{profile.name} with overrides", field="--hw")
    changed._changed = "; ".join(part for part in (profile.changed, text) if part)
    return changed


def _new_memory(data: dict, changes: ProfileChanges) -> list[str]:
    """The device's HBM: its size, with the share a process can allocate kept, and its bandwidth with the
    sustained share the profile measured kept (the same kernels on a slower or faster memory reach the same
    share of it)."""
    said = []
    device = data["device"]
    if changes.hbm_bytes is not None:
        if not math.isfinite(changes.hbm_bytes) or changes.hbm_bytes <= 0:
            raise InputError(
                "--hbm-bytes", f"must be a positive, finite number of bytes (got {changes.hbm_bytes})"
            )
        said.append(f"HBM {changes.hbm_bytes / 1e9:g} GB (was {device['hbm_bytes'] / 1e9:g} GB)")
        if device.get("allocatable_bytes") is not None:  # the runtime keeps the same share of other stacks
            device["allocatable_bytes"] *= changes.hbm_bytes / device["hbm_bytes"]
        device["hbm_bytes"] = float(changes.hbm_bytes)
    value = changes.hbm_bandwidth
    if value is not None:
        bandwidth = parse_bandwidth(value, "--hbm-bandwidth") if isinstance(value, str) else float(value)
        if not math.isfinite(bandwidth) or bandwidth <= 0:
            raise InputError("--hbm-bandwidth", f"must be a positive, finite bandwidth (got {value!r})")
        old = device.get("hbm_bandwidth")
        share = device["hbm_sustained"] / old if old and device.get("hbm_sustained") else 1.0
        least = _LEAST_PLAUSIBLE / share  # the sustained rate, the profile's share of it, is a bandwidth too
        if not least <= bandwidth <= _MOST_PLAUSIBLE:
            raise InputError(
                "--hbm-bandwidth",
                f"{value!r} is {bandwidth:.3g} bytes/s; accepted: {least:.3g} to {_MOST_PLAUSIBLE:.3g} bytes/s"
                + (f" (the profile sustains {share:.3g} of it, at least 1 MB/s)" if share < 1 else ""),
            )
        if share < 1:
            device["hbm_sustained"] = share * bandwidth
        device["hbm_bandwidth"] = bandwidth
        said.append(f"HBM {bandwidth / 1e12:g} TB/s" + (f" (was {old / 1e12:g} TB/s)" if old else ""))
    return said


def _new_clock(data: dict, profile: HardwareProfile, scale: float | None) -> list[str]:
    """The same chip at another sustained clock: held lower (a power limit under the profile's part's), or
    higher, up to the boost clock its kernel tables were measured at (a deployment that holds it under load).
    Its tables' compute rates, read at the profile's sustained clock, scale by ``scale``. What HBM and the links
    carry, the boost clock a memory-bound decode keeps, and the peak an MFU is stated against stay the
    profile's."""
    if scale is None:
        return []
    if not math.isfinite(scale) or scale <= 0:
        raise InputError("--clock-scale", f"must be a positive share of the profile's clock (got {scale})")
    kernels = data.get("kernels")
    if kernels is None:
        raise InputError(
            "--clock-scale",
            f"{profile.origin} has no kernel tables: its compute runs at --efficiency of the peak; lower that",
        )
    old = profile.kernels.sustained_clock  # type: ignore[union-attr]
    least, most = SUSTAINED_CLOCK_RANGE
    if not least <= old * scale <= most:
        bound = (
            f"under the {least:g} a profile accepts; give at least {least / old:.3g}"
            if old * scale < least
            else f"over the tables' own (boost) clock; give at most {most / old:.4g}"
        )
        raise InputError(
            "--clock-scale",
            f"{scale:g} would hold the sustained clock at {old * scale:.3g} of the tables' clock ({profile.origin} "
            f"holds {old:.3g}), {bound}",
        )
    kernels["sustained_clock"] = old * scale
    return [f"sustained clock {scale:g} of the profile's ({old * scale:.3g} of the tables', was {old:.3g})"]


def _new_links(data: dict, changes: ProfileChanges) -> list[str]:
    said = []
    given = {"inter_node": changes.inter_bandwidth, "intra_node": changes.intra_bandwidth}
    for scope, value in given.items():
        if value is None:
            continue
        flag = f"--{scope.replace('_', '-')}-bandwidth"
        bandwidth = parse_bandwidth(value, flag) if isinstance(value, str) else float(value)
        if not math.isfinite(bandwidth) or bandwidth <= 0:
            raise InputError(flag, f"must be a positive, finite bandwidth (got {value!r})")
        if 2 * bandwidth > _MOST_PLAUSIBLE:  # both directions are a bandwidth too
            raise InputError(
                flag,
                f"{value!r} is {bandwidth:.3g} bytes/s a direction; accepted: at most {_MOST_PLAUSIBLE / 2:.3g} "
                f"({_MOST_PLAUSIBLE / 1e15:g} PB/s both ways)",
            )
        old = data["links"].get(scope)
        # only the bandwidth changes: the link's latencies and the share of it NCCL's collectives reach stay
        # (an all-to-all measured on the old link does not)
        link = {k: v for k, v in (old or {}).items() if k not in ("name", "source", "alltoall")}
        data["links"][scope] = link | {
            "name": f"{value.strip() if isinstance(value, str) else _gbytes(bandwidth)} link ({flag})",
            "bandwidth_per_direction": bandwidth,
            "bandwidth_bidirectional": 2 * bandwidth,
        }
        was = f" (was {old['name']}, {_gbytes(old['bandwidth_per_direction'])})" if old else ""
        said.append(f"{scope.replace('_', '-')} {_gbytes(bandwidth)} per direction{was}")
        _drop_measured(data, scope.replace("_", "-"))
    return said


def _new_latency(data: dict, profile: HardwareProfile, latency: float | None) -> list[str]:
    if latency is None:
        return []
    if not math.isfinite(latency) or latency < 0:
        raise InputError("--inter-node-latency", f"must be a non-negative number of seconds (got {latency})")
    if "inter_node" not in data["links"]:
        raise InputError(
            "--inter-node-latency",
            f"{profile.origin} has no inter-node link; give --inter-node-bandwidth too",
        )
    data["links"]["inter_node"]["latency_s"] = latency
    return [f"inter-node latency {latency:g} s"]


def _new_placement(data: dict, profile: HardwareProfile, changes: ProfileChanges) -> list[str]:
    """Devices per node (a torus's from its shape) and CP ranks per node."""
    said = []
    devices = changes.devices_per_node
    torus = data.get("topology", {}).get("kind") == "torus"
    if changes.torus_dims is not None:
        dims = parse_dims(changes.torus_dims)
        if not torus:
            raise InputError("--torus-dims", f"{profile.origin} is not a torus; use --devices-per-node")
        largest = data["topology"]["dims"]  # the profile's largest slice: a slice's shape fits inside it
        shown = "x".join(map(str, largest))
        if len(dims) != len(largest):
            raise InputError(
                "--torus-dims",
                f"{changes.torus_dims!r}: {profile.origin} is a {len(largest)}-D torus (its largest slice "
                f"{shown}); give {len(largest)} chip counts",
            )
        if any(d > most for d, most in zip(sorted(dims), sorted(largest), strict=True)):
            raise InputError(
                "--torus-dims",
                f"{changes.torus_dims!r} does not fit in the largest slice of {profile.origin}, {shown}",
            )
        if devices is not None and devices != math.prod(dims):
            raise InputError(
                "--devices-per-node",
                f"{devices} is not the {math.prod(dims)} chips of --torus-dims {changes.torus_dims}",
            )
        data["topology"]["dims"] = dims
        devices = math.prod(dims)
        said.append(f"torus {'x'.join(map(str, dims))}")
    elif torus and devices is not None:
        raise InputError(
            "--devices-per-node",
            f"{profile.origin} is a torus: give its slice's shape with --torus-dims (e.g. 4x4x8) instead",
        )
    if devices is not None:
        said.append(_new_devices_per_node(data, profile, devices, changes.cp_ranks_per_node))
    ranks = changes.cp_ranks_per_node
    if ranks is not None:
        if ranks < 1:
            raise InputError("--cp-ranks-per-node", f"must be at least 1 (got {ranks})")
        if ranks > data["devices_per_node"]:
            raise InputError(
                "--cp-ranks-per-node", f"{ranks} exceeds the {data['devices_per_node']} devices per node"
            )
        data["cp_ranks_per_node"] = ranks
        if ranks != profile.ranks_per_node:  # a placement restated as it is changes nothing to report
            said.append(f"{ranks} consecutive CP ranks per node (was {profile.ranks_per_node})")
    return said


def _new_devices_per_node(data: dict, profile: HardwareProfile, devices: int, ranks: int | None) -> str:
    if devices < 1:
        raise InputError("--devices-per-node", f"must be at least 1 (got {devices})")
    filled = profile.ranks_per_node == profile.devices_per_node
    data["devices_per_node"] = devices
    if ranks is None:
        if filled:
            data.pop("cp_ranks_per_node", None)
        elif profile.ranks_per_node > devices:
            raise InputError(
                "--devices-per-node",
                f"{devices} is fewer than the profile's "
                f"{profile.ranks_per_node} CP ranks per node; give --cp-ranks-per-node too",
            )
    return f"{devices} devices per node (was {profile.devices_per_node})"


def _drop_measured(data: dict, scope: str) -> None:
    """Forget what calibrate measured on the link being replaced: its point-to-point and all-to-all tables."""
    calibration = data.get("calibration")
    if calibration:
        for kind in ("p2p", "alltoall"):
            calibration.get(kind, {}).pop(scope, None)
