"""Memory the main process keeps episode-block items in while they wait in the shuffle buffer.

A task's items arrive in a worker's block of shared memory, which goes back to the worker
at once: under the shuffle, a task's last item waits about three buffers' worth of
outputs, and holding every block that long held about three times the buffer's items.
Copying the items into fresh tensors instead pays a page fault per 4 KB each time (0.5 ms
of CPU for a 480×640 frame on the development machine, more than the copy). So each kind
of value (key, dtype, shape, strides) has rows allocated once, in chunks, and an item's
row is filled again once the item is collated into a batch: the rows grow to what the
buffer holds at most, then stay.
"""

from __future__ import annotations

import torch

from lerobot_kit.core.data.packed import Batch, copy_into, extent

CHUNK_ROWS = 32  # rows allocated at a time for one kind of value

_Kind = tuple[str, torch.dtype, tuple[int, ...], tuple[int, ...]]


class ItemRows:
    """Reused rows for items' tensors: ``keep`` copies an item in, ``release`` frees its rows."""

    def __init__(self) -> None:
        self._free: dict[_Kind, list[torch.Tensor]] = {}

    def keep(self, item: Batch) -> Batch:
        """A copy of ``item`` whose tensors lie in rows of this store (other values as they are)."""
        kept = {}
        for key, value in item.items():
            if isinstance(value, torch.Tensor):
                kept[key] = self._row(key, value)
                copy_into(kept[key], value)
            else:
                kept[key] = value
        return kept

    def release(self, item: Batch) -> None:
        """The rows of ``item`` (one ``keep`` returned) may be filled again: nothing reads it any more."""
        for key, value in item.items():
            if isinstance(value, torch.Tensor):
                self._free[_kind(key, value)].append(value)

    def _row(self, key: str, like: torch.Tensor) -> torch.Tensor:
        free = self._free.setdefault(_kind(key, like), [])
        if not free:
            row = extent(tuple(like.shape), like.stride())
            chunk = torch.empty_strided((CHUNK_ROWS, *like.shape), (row, *like.stride()), dtype=like.dtype)
            free.extend(chunk.unbind(0))
        return free.pop()


def _kind(key: str, value: torch.Tensor) -> _Kind:
    return key, value.dtype, tuple(value.shape), tuple(value.stride())
