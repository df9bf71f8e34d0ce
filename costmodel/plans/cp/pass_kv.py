"""Pass-KV prefill: a ring that passes the new tokens' K, V (and the cached ones) while every rank keeps
its queries; it hides once the new tokens are many enough [CP-Infer]."""

from __future__ import annotations

from costmodel.plans.cp.base import PREFILL, Scheme

NAME = "pass-kv"

SCHEME = Scheme(
    NAME,
    label="pass-KV",
    summary={PREFILL: "ring of K, V"},
    rank=4,
    phases=frozenset({PREFILL}),
    ring=True,
    prefill_exposed="passkv_exposed_s",
    prefill_bytes="passkv_step_bytes",
    prefill_extra="passkv_page_gather_s",  # the paged cache gathered into the block a step sends
)
