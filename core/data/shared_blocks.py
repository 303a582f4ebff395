"""Blocks of shared memory a DataLoader worker fills again once the main process is done.

A fresh block of shared memory for every batch costs more than filling it: each of its
pages is allocated, zeroed and faulted in by the worker, mapped and faulted again by the
main process, and unmapped — about 20 ms of CPU for the 22 MB batch of three 480×640
cameras on the development machine, against 2.5 ms to copy the frames into a block
used before. So each worker keeps a few blocks (``SLOTS``) and the main process says,
through a small table of flags both share, when it is done with one: no tensor it handed
out views the block any more (``LentBlocks``), or it copied the block into page-locked
memory for the GPU. A block larger than what a worker packs serves it (an episode-block
window is smaller where an epoch ends); one too small is replaced. A worker that finds none of its blocks free makes a fresh one, as
before: it never waits for the main process.

The table is made in the main process before the workers start; a worker inherits it
(fork) or receives it pickled, shared (spawn). Its blocks are its own, made on first use.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

import torch
from torch.utils.data import get_worker_info

SLOTS = 4  # per worker: the batches it prefetches, the one the main process holds, one spare

_IN_MAIN: weakref.WeakValueDictionary[str, SharedBlocks] = weakref.WeakValueDictionary()  # by id, for release


class SharedBlocks:
    """The reusable blocks of one loader's workers, and the flags saying which are free."""

    def __init__(self, workers: int) -> None:
        self.id = uuid.uuid4().hex
        self.free = torch.ones(workers, SLOTS, dtype=torch.int32).share_memory_()  # 1: the main process is done
        self._blocks: list[torch.Tensor | None] = [None] * SLOTS  # this worker's, made on first use
        _IN_MAIN[self.id] = self

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_blocks": [None] * SLOTS}

    def take(self, size: int) -> tuple[torch.Tensor, tuple[str, int, int] | None]:
        """A uint8 block of at least ``size`` bytes to fill in a worker, and its slot for
        ``release`` (None: a fresh block, not to be reused). A free block that is large
        enough is taken first, then a free slot is given a new block."""
        worker = get_worker_info()
        if worker is None:
            return new_block(size), None
        free = [slot for slot in range(SLOTS) if self.free[worker.id, slot]]
        if not free:
            return new_block(size), None
        fitting = [slot for slot in free if (block := self._blocks[slot]) is not None and block.numel() >= size]
        slot = min(fitting, key=lambda s: self._blocks[s].numel()) if fitting else free[0]  # type: ignore[union-attr]
        block = self._blocks[slot]
        if block is None or block.numel() < size:
            block = self._blocks[slot] = new_block(size)
        self.free[worker.id, slot] = 0
        return block, (self.id, worker.id, slot)


def release(slot: tuple[str, int, int]) -> None:
    """In the main process: the block of ``slot`` may be filled again (nothing views it any more)."""
    blocks_id, worker, index = slot
    blocks = _IN_MAIN.get(blocks_id)
    if blocks is not None:
        blocks.free[worker, index] = 1


class LentBlocks:
    """In the main process: the blocks of the batches it handed out, each released to its worker
    once nothing views it any more, so a batch is delivered without copying it out of its block.

    A block is in use while its storage has more references than it had when it arrived:
    every tensor viewing it (a batch's tensors, their views, NumPy arrays of them) holds one.
    A bare ``UntypedStorage`` object taken from a batch's tensor is not counted (torch keeps
    one per storage from the start): keep the tensor, or a copy. Where torch does not
    expose the count, the batch is copied out of its block and the block released at once.
    """

    COUNTED = hasattr(torch._C, "_storage_Use_Count")

    def __init__(self) -> None:
        self._lent: list[tuple[int, torch.Tensor, tuple[str, int, int]]] = []  # users when lent, block, slot

    def lend(self, block: torch.Tensor, slot: tuple[str, int, int]) -> None:
        """``block`` (of ``slot``), not yet viewed by anything handed out: from now on, watched."""
        self._lent.append((users(block), block, slot))

    def release_unviewed(self) -> None:
        """Release every lent block that no tensor views any more."""
        kept = []
        for unviewed, block, slot in self._lent:
            if users(block) <= unviewed:
                release(slot)
            else:
                kept.append((unviewed, block, slot))
        self._lent = kept


class ReusedBlocks:
    """Blocks of the main process that a loader without workers packs block sampling's
    windows into, each filled again once no tensor views it any more, as ``LentBlocks``
    tells. A fresh block per window costs more than the copies into it: its pages (236 MB
    for 256 samples of one 480×640 camera) are allocated, zeroed and faulted in each time
    (about 0.5 ms of CPU a sample on the development machine). ``take`` has
    ``SharedBlocks.take``'s form, so ``Packed`` fills either."""

    def __init__(self, count: int = SLOTS) -> None:
        self.count = count
        self._blocks: list[tuple[torch.Tensor, int]] = []  # each block and its storage's use count when unviewed

    def take(self, size: int) -> tuple[torch.Tensor, None]:
        for block, unviewed in self._blocks:
            if block.numel() >= size and users(block) <= unviewed:
                return block, None
        block = torch.empty(size, dtype=torch.uint8)
        if LentBlocks.COUNTED:
            if len(self._blocks) == self.count:  # all in use: the smallest makes room
                del self._blocks[min(range(self.count), key=lambda i: self._blocks[i][0].numel())]
            self._blocks.append((block, users(block)))
        return block, None


def users(block: torch.Tensor) -> int:
    """References to ``block``'s storage: one more for every tensor that views it."""
    return torch._C._storage_Use_Count(block.untyped_storage()._cdata)


def new_block(size: int) -> torch.Tensor:
    """A block in shared memory, as ``default_collate`` allocates in a worker: sending it copies nothing."""
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(size))
