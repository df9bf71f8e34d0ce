"""The ring kernel under windowed, chunked and packed masks, every layout (window-level and per
document), against the float64 reference: the same rule (:class:`costmodel.schedule.masks.MaskRule`)
the simulator counts tiles with. The ring runs in one process: a stand-in for the communicator hands
each rank the KV block the real ring would deliver next."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.kernel.masks import plan_block
from costmodel.kernel.reference import reference_attention
from costmodel.kernel.ring import RingSchedule, ring_forward
from costmodel.schedule.masks import MaskRule
from costmodel.schedule.packed import PACKED_LAYOUTS, Placement

pytestmark = pytest.mark.kernel


class HandOn:
    """The ring's communicator for one rank, in one process: step j's transfer brings rank (r - j - 1)'s KV."""

    def __init__(self, blocks: list[torch.Tensor], rank: int) -> None:
        self.blocks, self.rank, self.step = blocks, rank, 0

    def send_recv(self, _kv: torch.Tensor, _spare: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return self.blocks[(self.rank - self.step) % len(self.blocks)]

    def commit(self) -> None:
        pass

    def wait(self) -> None:
        pass


RULES = [
    MaskRule(True, None, 5),
    MaskRule(False, None, 7),
    MaskRule(True, (0, 11, 12, 30, 48), 6),
    MaskRule(True, (0, 16, 48), None, 8),
    MaskRule(True, (0, 20, 40)),  # padding after 40
]


N, SEQ = 4, 48  # documents of 16 and 32 split evenly over 2N for the per-document layouts


def _even(layout: str, rule: MaskRule) -> bool:
    """The kernel takes equal shards; a per-document split of uneven documents gives unequal ones."""
    return len({part.size for part in Placement(layout, SEQ, N, rule.cu_seqlens).rank_positions()}) == 1


@pytest.mark.parametrize(
    ("layout", "rule"), [case for case in itertools.product(PACKED_LAYOUTS, RULES) if _even(*case)]
)
def test_ring_forward_equals_reference(layout: str, rule: MaskRule) -> None:
    n, seq = N, SEQ
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, h, seq, 8, generator=generator, dtype=torch.float64) for h in (4, 2, 2))
    held = Placement(layout, seq, n, rule.cu_seqlens).rank_positions()
    index = [torch.from_numpy(part) for part in held]
    blocks = [torch.stack((k[:, :, i], v[:, :, i])) for i in index]
    want, _ = reference_attention(q, k, v, rule)
    for rank in range(n):
        plans = tuple(plan_block(rule, held[rank], held[(rank - j) % n]) for j in range(n))
        out, _ = ring_forward(
            q[:, :, index[rank]], *blocks[rank], RingSchedule(rank, plans), HandOn(blocks, rank), 8**-0.5
        )
        torch.testing.assert_close(out, want[:, :, index[rank]], atol=1e-12, rtol=1e-12)
    assert np.array_equal(np.sort(np.concatenate(held)), np.arange(seq))
