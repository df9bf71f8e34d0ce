"""The registry of context-parallel schemes: one module each, listed here once.

Every command that weighs schemes iterates :func:`schemes` (the step, the search, serving, ``recommend``,
the single-layer comparison and the reports) and looks one up with :func:`get`; a scheme's name is written
in its module and nowhere else. Adding one: a module with a ``SCHEME`` (:class:`~.base.Scheme`), built on
its formulas, and a line in ``REGISTRY``.
"""

from __future__ import annotations

from costmodel.core.errors import InputError
from costmodel.plans.cp import allgather, pass_kv, pass_q, ring, ulysses, usp
from costmodel.plans.cp.base import PREFILL, TRAINING, Scheme, SchemeResult

__all__ = [
    "FRAMEWORK_DEFAULTS",
    "PREFILL",
    "TRAINING",
    "Scheme",
    "SchemeResult",
    "choices",
    "default",
    "from_framework",
    "get",
    "listed",
    "names",
    "schemes",
]


# Every scheme, in the order flags and reports list them.
REGISTRY: list[Scheme] = [module.SCHEME for module in (ring, ulysses, usp, pass_kv, pass_q, allgather)]
# The CP setting a framework runs when a job leaves it unset (Scheme.exports holds each scheme's value).
FRAMEWORK_DEFAULTS = {"megatron": "p2p", "torchtitan": "allgather"}


def schemes(phase: str | None = None, *, ranked: bool = False) -> list[Scheme]:
    """The registered schemes (of one phase), in listing order or, ``ranked``, simplest first."""
    out = [s for s in REGISTRY if phase is None or s.serves(phase)]
    return sorted(out, key=lambda s: s.rank) if ranked else out


def names(phase: str | None = None) -> tuple[str, ...]:
    return tuple(s.name for s in schemes(phase))


def choices(phase: str) -> str:
    """``ring, ulysses (all-to-all), ...``: a phase's schemes for a flag's help."""
    return ", ".join(f"{s.name} ({s.summary[phase]})" if s.summary[phase] else s.name for s in schemes(phase))


def listed(phase: str) -> str:
    """``ring, ulysses, usp or allgather``: a phase's scheme names in prose."""
    *most, last = names(phase)
    return f"{', '.join(most)} or {last}" if most else last


def default(phase: str) -> Scheme:
    """The scheme of a phase a plan uses unless told, and where nothing is split (N = 1): the first listed."""
    return schemes(phase)[0]


def get(name: str) -> Scheme:
    for scheme in REGISTRY:
        if scheme.name == name:
            return scheme
    raise KeyError(f"no CP scheme {name!r}; registered: {', '.join(names())}")


def refuse_fixed_layout(scheme: str | None, layout: str | None) -> None:
    """A layout given beside a scheme that attends the whole sequence per head, refused naming --layout: a
    flag echoed back unchanged would read as if it had changed the answer."""
    if scheme is not None and layout is not None and get(scheme).whole_sequence:
        raise InputError("--layout", f"{scheme} attends the whole sequence per head: it has no layout to fix")


def from_framework(framework: str, value: str | None = None, fallback: str | None = None) -> Scheme:
    """The scheme a framework's setting selects (Megatron-LM's --cp-comm-type, torchtitan's
    context_parallel_rotate_method): its default where ``value`` is None, and the scheme of the ``fallback``
    value for a value no scheme exports."""
    value = FRAMEWORK_DEFAULTS[framework] if value is None else value
    for scheme in REGISTRY:
        if scheme.exports.get(framework) == value:
            return scheme
    if fallback is None:
        raise KeyError(f"{framework} has no CP setting {value!r}")
    return from_framework(framework, fallback)
