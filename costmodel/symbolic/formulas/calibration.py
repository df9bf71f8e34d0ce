"""Formulas of the group 'calibration': Calibrated terms ([A-RingCost §11]): what a measured profile adds, each measured by calibrate."""

from __future__ import annotations

import sympy

from costmodel.symbolic.formulas.registry import definer
from costmodel.symbolic.formulas.ulysses import C_u
from costmodel.symbolic.symbols import B_x, X_k

GROUP = "calibration"
define = definer(GROUP)

m_u = define(
    "ulysses_exchange_recv_bytes",
    "m_U",
    C_u / 4,
    "bytes a rank receives in one of Ulysses' four all-to-alls (their mean under GQA)",
    "B",
    "[A-RingCost §4.2]",
)
tau_ux = define(
    "alltoall_excess_s",
    "tau_Ux",
    4 * sympy.Max(0, m_u - X_k, evaluate=False) / B_x,
    "extra time of Ulysses' all-to-alls beyond the knee, where the kernel's copies outgrow alpha-beta "
    "(added to tau_U on a measured profile)",
    "s",
    "[A-RingCost §11]",
)
