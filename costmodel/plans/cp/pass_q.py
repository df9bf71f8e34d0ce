"""Pass-Q prefill: a ring that passes the queries (and merges outputs) while the cache stays put: the
smaller transfer when few new tokens meet a long cache [CP-Infer]."""

from __future__ import annotations

from costmodel.plans.cp.base import PREFILL, Scheme

NAME = "pass-q"

SCHEME = Scheme(
    NAME,
    label="pass-Q",
    summary={PREFILL: "ring of queries, partial outputs returned"},
    rank=5,
    phases=frozenset({PREFILL}),
    ring=True,
    prefill_exposed="passq_exposed_s",
    prefill_bytes="passq_step_bytes",
)
