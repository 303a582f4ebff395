"""Peak bytes of the tensor storages that ops allocate inside a block: the memory a
training step adds on top of what existed before it.

A ``TorchDispatchMode`` sees every aten op, forward and backward (autograd runs its
backward ops through the same dispatcher, checkpoint recomputation included). An op's
output either aliases one of its inputs (a view, an in-place op) or has storage of its
own, which is a new allocation; that rule needs no list of the model's parameters and
buffers, which only ever appear as inputs or get updated in place. A storage is freed
when its last tensor goes (a saved tensor released by autograd, a temporary dropped by
Python); a weakref callback on the storage records that moment. Counting storages, not
tensors, counts views once. Under ``FakeTensorMode`` nothing is allocated for real, yet
the storages report the bytes the real ones would take and die when they would, so the
peak of a fake step is the peak of the real one (a size that depends on tensor values
counts at its largest: ``largest_bytes``).

The events are kept rather than only a running maximum, so that storages found to
serve another purpose afterwards (parameter gradients, which the plan counts at their
sharded size) can be taken out of the timeline before the peak is read.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_DEVICE_QUERY = torch.ops.prim.device.default


class UnboundedSize(Exception):
    """A storage whose size depends on tensor values without a known largest value."""


def largest_bytes(size: int | torch.SymInt) -> int:
    """A storage's bytes. Under ``FakeTensorMode`` with a shape environment, an op whose output
    size depends on tensor values (``x[mask]``: ``aten.nonzero``) makes a symbolic size, with
    the range the op allows (at most every element selected): such a size counts at its
    largest, so the peak is one the real step cannot exceed."""
    if isinstance(size, int):
        return size
    node = size.node
    upper = node.shape_env.bound_sympy(node.expr).upper
    if not upper.is_integer or not upper.is_finite:
        raise UnboundedSize(f"a tensor of {node.expr} bytes, with no largest value")
    return int(upper)


def _storages(tree: Any) -> list[torch.UntypedStorage]:
    return [leaf.untyped_storage() for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


class StorageTimeline(TorchDispatchMode):
    """Allocations and frees of op-created storages, in the order they happened."""

    def __init__(self) -> None:
        super().__init__()
        # (allocation number, +bytes when allocated / -bytes when freed)
        self._events: list[tuple[int, int]] = []
        # id(storage) -> (allocation number, weakref keeping the free callback); live storages only,
        # so an id reused after a free is a new allocation.
        self._live: dict[int, tuple[int, weakref.ref[torch.UntypedStorage]]] = {}
        self._allocations = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is _DEVICE_QUERY:  # a fake tensor's ``.device``: most of the calls under FakeTensorMode
            return out
        inputs = {id(s) for s in _storages((args, kwargs))}
        for storage in _storages(out):
            key = id(storage)
            if key not in inputs and key not in self._live:
                self._record(storage)
        return out

    def _record(self, storage: torch.UntypedStorage) -> None:
        number, size, key = self._allocations, largest_bytes(storage.nbytes()), id(storage)
        self._allocations += 1
        self._events.append((number, size))

        def freed(_: object) -> None:
            self._events.append((number, -size))
            self._live.pop(key, None)

        self._live[key] = (number, weakref.ref(storage, freed))

    def peak_bytes(self, excluding: Iterable[torch.Tensor] = ()) -> int:
        """The most bytes live at once, leaving out the storages of ``excluding`` (still alive)."""
        left_out = {self._live[id(s)][0] for s in _storages(list(excluding)) if id(s) in self._live}
        live = peak = 0
        for number, delta in self._events:
            if number not in left_out:
                live += delta
                peak = max(peak, live)
        return peak
