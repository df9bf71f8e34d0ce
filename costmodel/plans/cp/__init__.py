"""The registry of context-parallel schemes: one module each, listed here once.

Every command that weighs schemes iterates :func:`schemes` (the step, the search, serving, ``recommend``,
the single-layer comparison and the reports) and looks one up with :func:`get`; a scheme's name is written
in its module and nowhere else. Adding one: a module with a ``SCHEME`` (:class:`~.base.Scheme`), built on
its formulas, and a line in ``REGISTRY``.
"""

from __future__ import annotations

from costmodel.plans.cp.base import PREFILL, TRAINING, Scheme, SchemeResult

__all__ = [
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


def _registered() -> list[Scheme]:
    from costmodel.plans.cp import allgather, pass_kv, pass_q, ring, ulysses, usp

    # The order flags and reports list them in.
    return [module.SCHEME for module in (ring, ulysses, usp, pass_kv, pass_q, allgather)]


REGISTRY: list[Scheme] = _registered()


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


def from_framework(framework: str, value: str, default: str | None = None) -> Scheme:
    """The scheme a framework's setting selects (Megatron-LM's --cp-comm-type, torchtitan's rotate method);
    for a value none exports, the scheme of the framework's ``default`` value."""
    for scheme in REGISTRY:
        if scheme.exports.get(framework) == value:
            return scheme
    if default is None:
        raise KeyError(f"{framework} has no CP setting {value!r}")
    return from_framework(framework, default)
