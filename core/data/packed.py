"""What a DataLoader worker returns, its tensors packed in one block of shared memory.

Each tensor a worker returns travels on its own: a shared-memory segment made for it, a
file descriptor passed over a socket, a map in the main process — about 0.2 ms of CPU on
each side per tensor on the development machine, whatever its size. A batch carries ten
or so (each camera, the state, the action and its padding flags, the indices), and the
window of batches an episode-block worker builds that many per batch. Packed, they make
one trip: the worker copies each tensor into its place in one storage (collation's copy,
not another: a batch's frames are stacked straight into it, a window's items written
straight into their rows of its batches), and the main process views them there.
Values, dtypes, shapes and strides (``channels_last`` camera batches) are those of
the tensors packed; other values (task texts) travel as they are. A batch's block is one
the worker fills again once the main process is done with it (``shared_blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch.utils.data import default_collate, get_worker_info

from lerobot_kit.core.data.shared_blocks import ReusedBlocks, SharedBlocks, new_block, release
from lerobot_kit.core.errors import LerobotError

ALIGNMENT = 64  # bytes, of each tensor's place in the block

Batch = dict[str, Any]


class MismatchedItems(LerobotError):
    """Items to be batched together disagree on a tensor's shape or dtype."""


@dataclass(frozen=True)
class _Place:
    """Where a tensor lies in the block: its byte offset, dtype, shape and strides."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    nbytes: int  # from the first element to past the last

    def view(self, block: torch.Tensor) -> torch.Tensor:
        return block[self.offset : self.offset + self.nbytes].view(self.dtype).as_strided(self.shape, self.stride)

    def rows(self, lo: int, hi: int) -> _Place:
        """The place of rows ``lo:hi`` of the first dimension, whose rows lie one after the other."""
        shape = (hi - lo, *self.shape[1:])
        offset = self.offset + lo * self.stride[0] * self.dtype.itemsize
        return _Place(offset, self.dtype, shape, self.stride, extent(shape, self.stride) * self.dtype.itemsize)


@dataclass(frozen=True)
class Packed:
    """One collated batch (``single``) or a window's batches: per batch, each key's place in
    ``block`` or, for a value that is not a tensor, the value itself. ``slot``: the
    block's in its worker's ``SharedBlocks``, to ``release`` once nothing views it."""

    block: torch.Tensor  # uint8, in shared memory when made in a worker
    entries: list[dict[str, _Place | Any]]
    single: bool
    slot: tuple[str, int, int] | None = None

    @classmethod
    def batch(cls, items: list[Batch], blocks: SharedBlocks | ReusedBlocks | None = None) -> Packed:
        """The items collated: tensors of one shape and dtype stacked (one item's strides,
        behind the batch dimension), anything else as ``default_collate`` gathers it (or
        refuses it); in one of ``blocks`` when given."""
        places: dict[str, _Place | Any] = {}
        layout = _Layout()
        stacked: dict[str, list[torch.Tensor]] = {}
        for key in items[0]:
            values = [item[key] for item in items]
            first = values[0]
            if all(isinstance(value, torch.Tensor) and (value.shape, value.dtype) == (first.shape, first.dtype)
                   for value in values):
                places[key] = layout.add(first.dtype, (len(values), *first.shape), (first.numel(), *_strides(first)))
                stacked[key] = values
            else:
                places[key] = default_collate(values)
        block, slot = layout.block(blocks)
        packed = cls(block, [places], single=True, slot=slot)
        for key, values in stacked.items():
            rows = _Rows(key, places[key].view(packed.block))
            for position, value in enumerate(values):
                rows.put(position, value)
        return packed

    @classmethod
    def batches(cls, count: int, batch_size: int, groups: Iterable[tuple[list[int], list[Batch]]],
                blocks: SharedBlocks | ReusedBlocks | None = None) -> Packed:
        """``count`` samples as consecutive batches of ``batch_size``, filled from ``groups``
        (sample positions and their items, in any order): each item's tensors are copied
        straight into their rows, so a caller holds one group of items at a time. A key
        whose first value is a tensor is stacked (every value must then match its shape and
        dtype); anything else is gathered by ``default_collate`` per batch. Every item must
        have the first one's keys."""
        stacked: dict[str, _Place] = {}
        loose: dict[str, list[Any]] = {}
        rows: dict[str, _Rows] = {}
        keys: list[str] = []
        packed = None
        for positions, items in groups:
            if packed is None:
                keys, layout = list(items[0]), _Layout()
                for key, first in items[0].items():
                    if isinstance(first, torch.Tensor):
                        stacked[key] = layout.add(first.dtype, (count, *first.shape), (first.numel(), *_strides(first)))
                    else:
                        loose[key] = [None] * count
                block, slot = layout.block(blocks)
                packed = cls(block, [], single=False, slot=slot)
                rows = {key: _Rows(key, place.view(block)) for key, place in stacked.items()}
            for position, item in zip(positions, items):
                if list(item) != keys:
                    raise MismatchedItems(f"the dataset's items disagree on their keys: {keys} and {list(item)}, so "
                                          "they cannot be batched; make the dataset return the same keys for every item")
                for key, value in item.items():
                    if key in rows:
                        rows[key].put(position, value)
                    else:
                        loose[key][position] = value
        assert packed is not None, "a window has at least one sample"
        for lo in range(0, count, batch_size):
            packed.entries.append({key: stacked[key].rows(lo, lo + batch_size) if key in stacked
                                   else default_collate(loose[key][lo : lo + batch_size]) for key in keys})
        return packed

    def unpack(self) -> Batch | list[Batch]:
        """The batch or the window's batches, their tensors views of the block."""
        out = [{key: place.view(self.block) if isinstance(place, _Place) else place for key, place in entry.items()}
               for entry in self.entries]
        return out[0] if self.single else out

    def pin_memory(self) -> Packed:
        """The same, in page-locked memory (DataLoader's pinning thread calls this): one copy for
        all tensors, after which the worker may fill its block again."""
        pinned = Packed(self.block.pin_memory(), self.entries, self.single)
        self.release()
        return pinned

    def release(self) -> None:
        """Let the worker fill the block again: nothing may view it any more."""
        if self.slot is not None:
            release(self.slot)


class _Rows:
    """The rows of one stacked key, written an item at a time, each value checked against the
    first item's. Through a NumPy view made once where the dtype allows: one thread, where
    torch copies a large tensor on its thread pool, whose threads then spin idle for a while
    in a process with several (the main process, collating without workers), costing more
    CPU than the copy (measured: 0.96 against 0.42 ms of CPU a sample); and no torch
    indexing per item, which cost more than the copies at 96×96."""

    def __init__(self, key: str, rows: torch.Tensor) -> None:
        self.key = key
        self.rows = rows
        self.like = (rows.shape[1:], rows.dtype)
        self.array = rows.numpy() if rows.dtype in _NUMPY_DTYPES else None

    def put(self, position: int, value: Any) -> None:
        if not isinstance(value, torch.Tensor) or (value.shape, value.dtype) != self.like:
            found = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise MismatchedItems(
                f"the dataset's items disagree on {self.key!r}: {tuple(self.like[0])} {self.like[1]} and {found}, so "
                "they cannot be batched; make the dataset return one shape and dtype per key"
            )
        if self.array is not None and not value.requires_grad:
            self.array[position] = value.numpy()
        else:
            self.rows[position].copy_(value)


_NUMPY_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                           torch.float32, torch.float64, torch.bool})


class _Layout:
    """Places handed out one after the other, each aligned."""

    def __init__(self) -> None:
        self.size = 0

    def add(self, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...]) -> _Place:
        place = _Place(self.size, dtype, shape, stride, extent(shape, stride) * dtype.itemsize)
        self.size += -(-place.nbytes // ALIGNMENT) * ALIGNMENT
        return place

    def block(self, blocks: SharedBlocks | ReusedBlocks | None) -> tuple[torch.Tensor, tuple[str, int, int] | None]:
        """A block for the places and its slot: one of ``blocks`` when given, else a fresh one
        (in a worker, in shared memory, so that sending it copies nothing)."""
        if blocks is not None:
            return blocks.take(self.size)
        return (torch.empty(self.size, dtype=torch.uint8) if get_worker_info() is None else new_block(self.size)), None


def _strides(tensor: torch.Tensor) -> tuple[int, ...]:
    """The tensor's strides if its elements fill their memory without gaps, in whatever order
    of dimensions (a channel-last frame viewed channel-first); else contiguous ones."""
    expected = 1
    for dim in sorted(range(tensor.dim()), key=tensor.stride):
        if tensor.shape[dim] != 1 and tensor.stride(dim) != expected:
            return _contiguous(tuple(tensor.shape))
        expected *= tensor.shape[dim]
    return tuple(tensor.stride())


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def extent(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a view's first to past its last: 0 for an empty one."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride))
