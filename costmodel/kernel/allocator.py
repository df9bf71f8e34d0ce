"""PyTorch's CUDA caching allocator, replayed: what it reserves for a sequence of allocations and frees.

``torch.cuda.max_memory_reserved`` is what a job needs of a device, and it exceeds the peak of live tensors by
what the caching allocator holds in free blocks it cannot use for the request at hand. That excess follows
the sizes that come and go and their order, not only their sum, so it is replayed here, block by block, with
the allocator's default policy ([PyTorch-Allocator]: ``c10/cuda/CUDACachingAllocator.cpp``, no
``PYTORCH_CUDA_ALLOC_CONF``):

- a request is rounded up to 512 bytes; up to 1 MiB it is served from the small pool, above from the large;
- a free block of the request's pool is taken best-fit (the smallest that holds it, the lowest address among
  equals); with none, a segment is allocated from the device: 2 MiB for a small request, 20 MiB for a large
  one under 10 MiB, else the request rounded up to 2 MiB;
- the block is split when what is left over is worth keeping (at least 512 bytes in the small pool, more than
  1 MiB in the large), the request taking its start;
- a freed block is merged with free neighbours of its segment; segments are never returned to the device.

One stream, as a training step's compute runs on: FSDP's collectives allocate on streams of their own, whose
blocks another stream cannot reuse, and a replay of one stream cannot place them.

:class:`Replay` feeds it from a program run on fake tensors: every storage an op returns is a request, and the
storage's end its free, in the program's order; with what the device allocates beside the tensors
(:data:`WORKSPACE_BYTES`, :data:`INTERNAL`). Checked on one H200 (docs/validation.md, "The reference on a real
GPU"): the replayed ``max_memory_reserved`` of 12 of 13 training stages equals the device's to the byte.
"""

from __future__ import annotations

import bisect
import itertools
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to it
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to it use the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small pool's segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: a large pool's segment for a request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests get a segment of their size rounded up to it


def rounded(nbytes: int) -> int:
    """A request's size as the allocator serves it."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(nbytes: int) -> int:
    """The segment the allocator asks the device for when no free block holds a rounded request."""
    if nbytes <= SMALL_SIZE:
        return SMALL_BUFFER
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-nbytes // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class CachingAllocator:
    """The allocator's state: its segments and free blocks; ``malloc`` and ``free`` by the caller's keys."""

    reserved: int = 0  # bytes of every segment taken from the device
    peak_reserved: int = 0
    allocated: int = 0  # bytes of the blocks serving live requests (rounded)
    segments: int = 0
    # each pool's free blocks as (size, address), sorted: best fit is the first that holds a request
    _free: dict[bool, list[tuple[int, int]]] = field(default_factory=lambda: {True: [], False: []})
    _blocks: dict[int, _Block] = field(default_factory=dict)  # free blocks by address
    _live: dict[Hashable, _Block] = field(default_factory=dict)
    _top: int = 0  # the next segment's address: segments never overlap

    def malloc(self, key: Hashable, nbytes: int) -> None:
        size = rounded(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        at = bisect.bisect_left(pool, (size, -1))
        if at < len(pool):
            _, address = pool.pop(at)
            block = self._blocks.pop(address)
        else:
            grant = segment_size(size)
            block = _Block(self._top, grant, small)
            self._top += grant
            self.reserved += grant
            self.segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        left = block.size - size
        if left >= MIN_BLOCK if small else left > SMALL_SIZE:
            rest = _Block(block.address + size, left, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size

    def free(self, key: Hashable) -> None:
        block = self._live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert(block)

    def free_blocks(self) -> list[int]:
        """The sizes of the blocks it holds free, small pool and large."""
        return [size for pool in self._free.values() for size, _ in pool]

    def _insert(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address))
        self._blocks[block.address] = block

    def _remove(self, block: _Block) -> None:
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.address))]
        del self._blocks[block.address]


# cuBLAS's workspace, taken through the allocator by each thread that runs GEMMs (a handle per thread: the
# forward's and autograd's) at its first one ([PyTorch-Allocator], ``CublasHandlePool.cpp``): 32 MiB on Hopper, as
# measured on an H200 (max_memory_allocated is the tensors' peak plus exactly 64 MiB in every stage).
WORKSPACE_BYTES = 32 << 20
GEMMS = frozenset(
    op.default for op in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm)
)


def _logsumexp(x: torch.Tensor, *_: object) -> list[int]:
    """``logsumexp`` (``ReduceOps.cpp``) makes the maxima, then ``exp(x - max)`` whole, before its sum."""
    return [x.numel() // max(x.shape[-1], 1) * x.element_size(), x.numel() * x.element_size()]


# Ops whose device kernels allocate temporaries a fake tensor's meta kernel does not: their sizes, in the
# order taken (freed at the op's end, last first).
INTERNAL: dict[object, Callable[..., list[int]]] = {torch.ops.aten.logsumexp.default: _logsumexp}


class Replay(TorchDispatchMode):
    """A dispatch mode that replays a program's storages through a :class:`CachingAllocator` (``allocator``):
    each new storage an op returns is allocated, and freed when it goes (gc paused, as the memory reference
    runs, so at its last reference). ``thread()`` names the thread a GEMM would run on (forward or
    backward), for the workspace each takes."""

    def __init__(self, thread: Callable[[], str]) -> None:
        super().__init__()
        self.allocator = CachingAllocator()
        self._thread = thread
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._keys = itertools.count()
        self._workspaces: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._allocate(tensor.untyped_storage())
        if func in GEMMS and (thread := self._thread()) not in self._workspaces:
            self._workspaces.add(thread)
            self.allocator.malloc(("workspace", thread), WORKSPACE_BYTES)
        if func in INTERNAL:
            sizes = INTERNAL[func](*args)
            keys = [("internal", next(self._keys)) for _ in sizes]
            for key, size in zip(keys, sizes, strict=True):
                self.allocator.malloc(key, size)
            for key in reversed(keys):
                self.allocator.free(key)
        return out

    def _allocate(self, storage: torch.UntypedStorage) -> None:
        if storage in self._seen or not storage.nbytes():
            return
        key = next(self._keys)
        self._seen[storage] = key
        self.allocator.malloc(key, storage.nbytes())
        weakref.finalize(storage, self.allocator.free, key)
