"""Training logs read back: Megatron-LM and torchtitan, streamed line by line.

What each framework prints, and where:

- Megatron-LM [Megatron-LM], ``megatron/training/training.py`` ``training_log()``: one line per logging interval,
  ``[date] iteration  N/ T | consumed samples: ... | elapsed time per iteration (ms): X |
  throughput per GPU (TFLOP/s/GPU): Y | learning rate: ... | global batch size: G | lm loss: ... |``
  (printed by the last rank); ``megatron/training/utils.py`` ``report_memory()``: ``[Rank r] (after N
  iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved: ...``;
  ``megatron/training/arguments.py`` ``_print_args()``: the run's arguments between
  ``---- arguments ----`` and ``---- end of arguments ----``, one ``  name ..... value`` a line.
- torchtitan [torchtitan-code], ``torchtitan/components/metrics.py`` ``MetricsProcessor.log()``: ``step: N  loss: L
  grad_norm: g  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%`` (in ANSI colours, behind the
  ``[titan] date - root - INFO -`` logger prefix and torchrun's ``[rankR]:``); ``torchtitan/train.py``
  ``Trainer``: ``Training starts at step N``, ``Building 2-D device mesh with [names], [sizes]`` and
  ``Building llama3 8B with ...``, ``Trainer is initialized with local batch size b, global batch size B,
  gradient accumulation steps a, sequence length S, ...`` and ``Peak FLOPS used for computing MFU: P``;
  the rest of the run's settings are its TOML file (``--config``).

Lines are read in bounded pieces (a binary blob or a megabyte line never lands in memory whole); lines of
neither format are skipped and counted. A restart (the iteration count going back, or torchtitan saying
where training starts) opens a new segment; each segment's first logged interval is warm-up.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from costmodel.core.errors import InputError
from costmodel.core.fileio import KINDS, check_raw_text, open_input
from costmodel.core.text import displayed
from costmodel.core.units import GIB
from costmodel.plans import cp as registry

Framework = Literal["megatron", "torchtitan"]
MAX_LINE_BYTES = 64 * 1024  # Megatron's longest line (an argument holding a file list) fits
SNIFF_BYTES = 8 * 1024
# A logged step takes from a microsecond to a day, a device from one to 10^12 tokens a second: values
# outside (1e-300 ms, 5e-324) are no step, and their quotients would overflow.
STEP_MS = (1e-3, 86_400e3)
TPS = (1e-3, 1e12)
MIB = 1024**2

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# torchrun --tee prefix, srun --label, mpirun --tag-output: which rank printed the line.
_RANK = re.compile(r"^\s*(?:\[rank(\d+)\]:|\[default(\d+)\]:|(\d+):\s|\[\d+,(\d+)\]<std\w+>:)")
_MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_MEGATRON_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \((MB|GB)\)(.*)$")
_ARGS_START = re.compile(r"-{8,} arguments -{8,}")
_ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
_ARG_LINE = re.compile(r"^\s*(\w+) \.+ ?(.*?)\s*$")
_TITAN_STEP = re.compile(
    r"\bstep:\s*(\d+)\s+loss:\s*(\S+)(?P<rest>.*?)\btps:\s*([\d,]+)(?:\s+tflops:\s*([\d,.]+))?"
    r"(?:\s+mfu:\s*([\d.]+)%)?"
)
_TITAN_MEMORY = re.compile(r"\bmemory:\s*([\d.]+)GiB\(([\d.]+)%\)")
_TITAN_START = re.compile(r"Training starts at step (\d+)")
_TITAN_MESH = re.compile(r"Building (\d+)-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
_TITAN_MODEL = re.compile(r"Building (\w+) (\w+) with ")
_TITAN_BATCH = re.compile(
    r"initialized with local batch size (\d+), global batch size (\d+), gradient accumulation steps (\d+), "
    r"sequence length (\d+)"
)
_TITAN_PEAK = re.compile(r"Peak FLOPS used for computing MFU: ([\d.eE+]+)")
_TITAN_DEVICE = re.compile(r"(?:CUDA|ROCm|XPU) capacity: (.+?) with ([\d.]+)GiB memory")


@dataclass
class Interval:
    """One logged interval: what the framework printed for it, as numbers."""

    iteration: int
    segment: int
    line: int
    step_s: float | None = None  # Megatron: elapsed time per iteration
    tflops_per_gpu: float | None = None  # as the framework counts FLOP
    tokens_per_s_per_gpu: float | None = None  # torchtitan's tps
    mfu: float | None = None  # fraction, as the framework counts it
    memory_bytes: float | None = None  # torchtitan: max reserved since the last log
    warmup: bool = False


@dataclass
class ParsedLog:
    """A log as read: its intervals, the configuration it states, and what was skipped."""

    path: str
    framework: Framework | None = None
    intervals: list[Interval] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # named as cp-plan step's flags
    sources: dict[str, tuple[int, str]] = field(default_factory=dict)  # config key -> (line, what said it)
    model_shape: dict[str, int] = field(default_factory=dict)  # layers, hidden, heads, ... when printed
    model_name: str | None = None  # torchtitan's "llama3 8B"
    device_name: str | None = None
    peak_flops: float | None = None  # the peak the framework's MFU divides by (torchtitan prints it)
    memory_bytes: float | None = None  # the largest peak memory any rank reported
    lines: int = 0
    skipped: int = 0  # lines of neither format (kept count, not kept)
    cut: int = 0  # lines longer than MAX_LINE_BYTES, read up to it
    duplicates: int = 0  # the same interval printed again by another rank
    restarts: int = 0
    truncated_last_line: bool = False
    ranks: set[int] = field(default_factory=set)

    def steady(self) -> list[Interval]:
        return [i for i in self.intervals if not i.warmup]


def read_lines(path: str | Path, field: str = "LOG", kind: str = "log") -> Iterator[tuple[str, bool]]:
    """(line, complete) for every line of ``path``, decoded leniently, cut at :data:`MAX_LINE_BYTES`.

    The file is opened by the one reader (:func:`costmodel.core.fileio.open_input`: a regular file
    under the kind's size bound, or ``-`` for standard input). A file that is not text (a NUL byte, or
    mostly undecodable bytes, in its first 8 KiB) is refused as one :class:`InputError`; so are missing,
    unreadable and empty files. A line of any kind but a training log holding a control character or a line
    separator is refused with its line (:func:`costmodel.core.fileio.check_raw_text`); a log is noisy
    (torchtitan colours its lines), so what is shown of it is escaped instead (:func:`displayed`)."""

    name = str(path)
    noun, bound, most_lines = KINDS[kind].noun, KINDS[kind].max_bytes, KINDS[kind].max_lines
    lines = 0
    handle = open_input(name, field, kind)
    with handle:
        head = handle.read(SNIFF_BYTES)
        if not head:
            raise InputError(field, f"{name}: empty file, expected a {noun}")
        undecodable = head.decode("utf-8", errors="replace").count("\ufffd")
        if b"\x00" in head or undecodable > len(head) // 20:
            raise InputError(field, f"{name}: a binary file, expected a text {noun}")
        handle.seek(0)  # a regular file, or standard input already read into memory
        number = 0
        while True:
            number += 1
            raw = handle.readline(MAX_LINE_BYTES)
            if not raw:
                return
            if handle.tell() > bound:  # the file grew past its bound while it was read
                raise InputError(field, f"{name}: larger than {bound >> 20} MiB, the bound for a {noun}")
            lines += 1
            if most_lines is not None and lines > most_lines:
                raise InputError(field, f"{name}: more than {most_lines:,} lines, the bound for a {noun}")
            complete = raw.endswith(b"\n")
            if not complete and len(raw) == MAX_LINE_BYTES:
                while True:  # the rest of an over-long line is dropped without holding it
                    rest = handle.readline(MAX_LINE_BYTES)
                    if not rest or rest.endswith(b"\n"):
                        break
                complete = None  # type: ignore[assignment]  # cut, not truncated
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if kind != "log":
                check_raw_text(text, field, name, line_offset=number - 1)
            yield text, complete  # type: ignore[misc]


def _number(text: str) -> float | None:
    """A finite number as printed (thousands commas allowed), else None: a log may print nan or inf."""
    try:
        value = float(text.replace(",", "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _bounded(value: float | None, high: float) -> float | None:
    """``value`` when it is from 0 to ``high`` (TFLOP/s up to 10^6, MFU up to 10^4 %), else None."""
    return value if value is not None and 0 <= value <= high else None


def count(text: str) -> int | None:
    """A plain ASCII count, else None (``str.isdigit`` admits superscripts ``int`` refuses)."""
    text = text.strip()
    return int(text) if re.fullmatch(r"[0-9]{1,12}", text) else None


def _megatron_fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def strict_count(text: str) -> int:
    """A count as Megatron prints one; anything else (``True``, ``2.5``) is a ValueError, never a default."""
    value = count(text)
    if value is None:
        raise ValueError(f"{text.strip()[:40]!r} is not a count")
    return value


# Megatron argument -> (cp-plan step flag, conversion)
def _recompute(value: str) -> str:
    if value.lower() not in ("none", "selective", "full"):
        raise ValueError(f"{value.strip()[:40]!r} is not none, selective or full")
    return value.lower()


def _cp_comm(value: str) -> str:
    first = re.sub(r"[\[\]'\" ]", "", value).split(",")[0]
    return registry.from_framework("megatron", first, fallback=registry.FRAMEWORK_DEFAULTS["megatron"]).name


_MEGATRON_ARGS = {
    "tensor_model_parallel_size": ("tp", strict_count),
    "pipeline_model_parallel_size": ("pp", strict_count),
    "context_parallel_size": ("cp", strict_count),
    "virtual_pipeline_model_parallel_size": ("vpp", strict_count),
    "world_size": ("gpus", strict_count),
    "seq_length": ("seq", strict_count),
    "micro_batch_size": ("micro_batch", strict_count),
    "global_batch_size": ("global_batch", strict_count),
    "recompute_granularity": ("recompute", _recompute),
    "cp_comm_type": ("cp_scheme", _cp_comm),
}
# Arguments whose printed ``None`` is a setting, not "unset": Megatron's recompute_granularity None is no
# recompute at all.
_NONE_MEANS = {"recompute_granularity": "none"}
_MEGATRON_SHAPE = {
    "num_layers": "layers",
    "hidden_size": "hidden",
    "num_attention_heads": "heads",
    "num_query_groups": "kv_heads",
    "ffn_hidden_size": "ffn_hidden",
    "kv_channels": "head_dim",
}


class LogRefused(Exception):  # noqa: N818 - not a ValueError: parse_log turns it into one InputError
    """A log whose stated configuration cannot be read as one value per setting."""


class TwoRuns(LogRefused):
    """The log holds two runs: a stated configuration changes after intervals were logged."""


class _Reader:
    def __init__(self, path: str) -> None:
        self.log = ParsedLog(path)
        self.segment = 0
        self.last_iteration = -1
        self.in_args = False
        self.args: dict[str, tuple[str, int]] = {}  # Megatron argument -> (value as printed, line)
        self.args_line = 0

    def feed(self, number: int, text: str) -> bool:
        """Read one line; True when it was understood."""
        if not text or text.isspace():  # nothing to match: spared the patterns
            return False
        rank = _RANK.match(text)
        if rank:
            self.log.ranks.add(int(next(g for g in rank.groups() if g is not None)))
        text = _ANSI.sub("", text)
        if self.in_args:
            return self._argument(number, text, text[rank.end() :] if rank else text)
        for pattern, handler in _LINES:
            if (m := pattern.search(text)) is not None:
                return handler(self, number, m)
        return False

    def _argument(self, number: int, text: str, body: str) -> bool:
        """A line inside Megatron's argument block: one argument, or the block's end."""
        if _ARGS_END.search(text):
            self.in_args = False
            self.args_line = number
            self._use_args()
            return True
        match = _ARG_LINE.match(body)
        if match:
            name, value = match.groups()
            before = self.args.get(name)
            if before is not None and before[0] != value:  # one block, one value: else which is the run's?
                raise LogRefused(
                    f"line {number}: {name} is {value[:40]!r} here and {before[0][:40]!r} on line {before[1]} "
                    "of the same arguments block; one run prints each argument once"
                )
            self.args[name] = (value, number)
            return True
        return False

    def _args_start(self, number: int, m: re.Match[str]) -> bool:
        self.in_args, self.args = True, {}
        if self.log.intervals and self.last_iteration >= 0:  # Megatron started again
            self._restart()
        self.log.framework = self.log.framework or "megatron"
        return True

    def _megatron_memory(self, number: int, m: re.Match[str]) -> bool:
        fields = _megatron_fields(m.group(4))
        peak = _bounded(
            _number(fields.get("max reserved", fields.get("reserved", "")) or ""), 1e9
        )  # MB: 1 PB
        if peak is not None:
            scale = MIB if m.group(3) == "MB" else 1e9
            self.log.memory_bytes = max(self.log.memory_bytes or 0.0, peak * scale)
        return True

    def _titan_start(self, number: int, m: re.Match[str]) -> bool:
        self.log.framework = "torchtitan"
        if self.log.intervals:
            self._restart()
        return True

    def _titan_mesh(self, number: int, m: re.Match[str]) -> bool:
        names = [n.strip(" '\"") for n in m.group(2).split(",")]
        sizes = [count(s) for s in m.group(3).split(",")]
        if len(sizes) != len(names) or not all(sizes):
            return False
        mesh = dict(zip(names, sizes, strict=False))
        for key in ("tp", "cp", "pp"):
            self._state(number, key, mesh.get(key, 1), "device mesh")
        gpus = 1
        for size in sizes:
            gpus *= size
        self._state(number, "gpus", gpus, "device mesh")
        # context_parallel_rotate_method unset: torchtitan's default
        self.log.config.setdefault("cp_scheme", registry.from_framework("torchtitan").name)
        if mesh.get("dp_shard", 1) > 1:  # FSDP2 shards parameters, gradients and optimizer states
            self.log.config.setdefault("zero", 3)
        return True

    def _titan_model(self, number: int, m: re.Match[str]) -> bool:
        self.log.model_name = self.log.model_name or f"{m.group(1)} {m.group(2)}"  # \w+: nothing to escape
        return True

    def _titan_batch(self, number: int, m: re.Match[str]) -> bool:
        local, batch, _, seq = (int(g) for g in m.groups())
        for key, value in (("global_batch", batch), ("seq", seq), ("_local_batch", local)):
            self._state(number, key, value, "batch and sequence length")
        return True

    def _titan_peak(self, number: int, m: re.Match[str]) -> bool:
        self.log.peak_flops = _number(m.group(1))
        return True

    def _titan_device(self, number: int, m: re.Match[str]) -> bool:
        self.log.device_name = displayed(m.group(1).strip())
        return True

    def _state(self, number: int, key: str, value: Any, said: str) -> None:
        """Record a configuration value the log states (``said``: what printed it, at line ``number``); a
        different value after intervals were logged is a second run in the same file (its step times must
        not be pooled with the first's)."""
        before = self.log.config.get(key)
        if before is not None and before != value and self.log.intervals:
            raise TwoRuns(
                f"line {number}: {key.lstrip('_').replace('_', ' ')} {value} after {before} (set by the "
                f"run logged before it): two runs in one file; audit each run's log on its own"
            )
        self.log.config[key] = value
        self.log.sources[key] = (number, said)

    def _restart(self) -> None:
        self.segment += 1
        self.log.restarts += 1
        self.last_iteration = -1

    def _add(self, interval: Interval) -> bool:
        recent = [i.iteration for i in self.log.intervals[-4:] if i.segment == self.segment]
        if interval.iteration in recent:  # another rank printed the same interval
            self.log.duplicates += 1
            return True
        if interval.iteration <= self.last_iteration:  # resumed from a checkpoint
            self._restart()
            interval.segment = self.segment
        # Intervals arrive in segment order: the segment's first is the last one's successor (constant
        # time a line, where scanning every interval made a log of many restarts quadratic).
        last = self.log.intervals[-1] if self.log.intervals else None
        interval.warmup = last is None or last.segment != self.segment
        self.last_iteration = interval.iteration
        self.log.intervals.append(interval)
        return True

    def _megatron_iteration(self, number: int, m: re.Match[str]) -> bool:
        iteration, fields = int(m.group(1)), _megatron_fields(m.group(3))
        elapsed = _number(fields.get("elapsed time per iteration (ms)", ""))
        if elapsed is None or not STEP_MS[0] <= elapsed <= STEP_MS[1]:
            return False
        self.log.framework = self.log.framework or "megatron"
        tflops = _bounded(_number(fields.get("throughput per GPU (TFLOP/s/GPU)", "")), 1e6)
        batch = _number(fields.get("global batch size", ""))
        if batch is not None:
            self.log.config.setdefault("global_batch", int(batch))  # may ramp up within one run
        return self._add(
            Interval(iteration, self.segment, number, step_s=elapsed / 1e3, tflops_per_gpu=tflops)
        )

    def _titan_step(self, number: int, m: re.Match[str]) -> bool:
        tps = _number(m.group(4))
        if tps is None or not TPS[0] <= tps <= TPS[1]:
            return False
        self.log.framework = "torchtitan"
        memory = _TITAN_MEMORY.search(m.group("rest"))
        mfu = _bounded(_number(m.group(6)), 1e4) if m.group(6) else None
        interval = Interval(
            int(m.group(1)),
            self.segment,
            number,
            tokens_per_s_per_gpu=tps,
            tflops_per_gpu=_bounded(_number(m.group(5)), 1e6) if m.group(5) else None,
            mfu=mfu / 100 if mfu is not None else None,
            memory_bytes=float(memory.group(1)) * GIB if memory else None,
        )
        if interval.memory_bytes is not None:
            self.log.memory_bytes = max(self.log.memory_bytes or 0.0, interval.memory_bytes)
        return self._add(interval)

    def _printed(self, name: str, convert: Callable[[str], Any]) -> Any:
        """An argument of the block, converted; None when it is not printed or unset (``None``). A value
        of the wrong type (``True`` for a size) is refused naming it, never read as a default."""
        value, line = self.args.get(name, ("None", self.args_line))
        if value == "None":
            return None
        try:
            return convert(value)
        except ValueError as exc:
            raise LogRefused(f"line {line}: {name}: {exc}") from None

    def _use_args(self) -> None:
        for name, (flag, convert) in _MEGATRON_ARGS.items():
            converted = self._printed(name, convert)
            if converted is None and name in self.args:
                converted = _NONE_MEANS.get(name)
            if converted is not None:
                self._state(self.args[name][1], flag, converted, name)
        for name, key in _MEGATRON_SHAPE.items():
            value = self._printed(name, strict_count)
            if value:
                before = self.log.model_shape.get(key)
                if before is not None and before != value and self.log.intervals:
                    raise TwoRuns(
                        f"line {self.args_line}: {name} {value} after {before}: two runs of different models "
                        "in one file; audit each run's log on its own"
                    )
                self.log.model_shape[key] = value
        if self.args.get("group_query_attention", ("",))[0] != "True":
            self.log.model_shape.pop("kv_heads", None)
        self.log.config["zero"] = 1 if self.args.get("use_distributed_optimizer", ("",))[0] == "True" else 0
        if self.args.get("fp8", ("None",))[0] != "None":
            self.log.config["dtype"] = "fp8"


# Each kind of line outside the argument block, tried in this order (the first match reads the line): a
# new log format is rows here and a handler each.
_LINES: list[tuple[re.Pattern[str], Callable[[_Reader, int, re.Match[str]], bool]]] = [
    (_ARGS_START, _Reader._args_start),
    (_MEGATRON_ITERATION, _Reader._megatron_iteration),
    (_TITAN_STEP, _Reader._titan_step),
    (_MEGATRON_MEMORY, _Reader._megatron_memory),
    (_TITAN_START, _Reader._titan_start),
    (_TITAN_MESH, _Reader._titan_mesh),
    (_TITAN_MODEL, _Reader._titan_model),
    (_TITAN_BATCH, _Reader._titan_batch),
    (_TITAN_PEAK, _Reader._titan_peak),
    (_TITAN_DEVICE, _Reader._titan_device),
]


def parse_log(path: str | Path, field: str = "LOG") -> ParsedLog:
    """Read one log; a file with no interval of either framework is an :class:`InputError`."""
    reader = _Reader(str(path))
    number = 0
    for number, (text, complete) in enumerate(read_lines(path, field), start=1):
        if complete is None:
            reader.log.cut += 1
        try:
            understood = reader.feed(number, text)
        except (ValueError, OverflowError):  # a number of more digits than Python converts
            understood = False
        except LogRefused as exc:
            raise InputError(field, f"{path}: {exc}") from None
        if complete is False:  # the file ends mid-line: a job still writing, or a copy cut short
            reader.log.truncated_last_line = True
            if understood and reader.log.intervals and reader.log.intervals[-1].line == number:
                reader.log.intervals.pop()  # its numbers may be cut mid-digit
        if not understood:
            reader.log.skipped += 1
    reader.log.lines = number
    _one_run(reader.log, field)
    if not reader.log.intervals:
        raise InputError(
            field,
            f"{path}: no iteration lines of Megatron-LM ('iteration N/ T | ... elapsed time per iteration "
            f"(ms): ...') or torchtitan ('step: N  loss: ...  tps: ...') in {number} lines",
        )
    if not reader.log.steady():  # only warm-up intervals: use them rather than nothing
        for interval in reader.log.intervals:
            interval.warmup = False
    return reader.log


RUN_RATIO = 1.5  # a segment started over whose median step differs from the first's by this is another run


def _one_run(log: ParsedLog, field: str) -> None:
    """Refuse a log that starts over from its first iteration at another speed: a second run (a resumed
    one continues past its checkpoint, and a run's speed does not jump by half at a restart)."""
    if not log.restarts or not log.intervals:
        return
    first = log.intervals[0].iteration
    per_segment: dict[int, list[Interval]] = {}
    for interval in log.intervals:
        per_segment.setdefault(interval.segment, []).append(interval)

    def speed(intervals: list[Interval]) -> float | None:
        steps = [i.step_s for i in intervals if i.step_s is not None]
        if steps:
            return statistics.median(steps)
        rates = [i.tokens_per_s_per_gpu for i in intervals if i.tokens_per_s_per_gpu is not None]
        return 1 / statistics.median(rates) if rates else None

    segments = list(per_segment.values())
    base = speed(segments[0])
    for intervals in segments[1:]:
        other = speed(intervals)
        if intervals[0].iteration > first or base is None or other is None:
            continue  # resumed from a checkpoint: the same run
        if max(base, other) > RUN_RATIO * min(base, other):
            raise InputError(
                field,
                f"{log.path}:{intervals[0].line}: the iteration count starts over at {intervals[0].iteration} "
                f"and the steps take {max(base, other) / min(base, other):.1f}x as long or short: two runs "
                "in one file; audit each run's log on its own",
            )


def summary(values: list[float]) -> dict[str, float]:
    """Median, spread (interquartile range / median), min, max and count of ``values``."""
    ordered = sorted(values)
    median = statistics.median(ordered)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {
        "median": median,
        "spread": (q3 - q1) / median if median else 0.0,
        "min": ordered[0],
        "max": ordered[-1],
        "count": len(ordered),
    }
