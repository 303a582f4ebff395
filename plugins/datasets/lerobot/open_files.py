"""One bounded table of open things (video decoders, mapped data files) per process.

A training run may mix hundreds of datasets, and every DataLoader worker reads all of
them. Files kept open per dataset would add up with the number of datasets — past a
process's open-file limit (often 1024), and with the memory each open decoder or map
holds. So every dataset of a process shares one table per kind of thing, bounded in
entries: when a new entry would pass the bound, the least recently used one is closed.

A forked child starts with an empty table (checked by pid on each use), as a spawned
one does: the parent's entries are dropped there, not closed — they are the parent's.
"""

from __future__ import annotations

import collections
import os
from typing import Callable, Generic, Hashable, TypeVar

Value = TypeVar("Value")


class OpenFiles(Generic[Value]):
    """At most ``max_entries`` open things of this process, least recently used closed first,
    keyed by who uses them and what they open.

    ``close`` releases an evicted entry; without it, an entry is released when no longer
    referenced (a memory map).
    """

    def __init__(self, max_entries: int, close: Callable[[Value], None] | None = None) -> None:
        self.max_entries = max_entries
        self._close = close
        self._entries: collections.OrderedDict[Hashable, Value] = collections.OrderedDict()
        self._pid = os.getpid()

    def __len__(self) -> int:
        self._own()
        return len(self._entries)

    def get(self, key: Hashable, open_: Callable[[], Value]) -> Value:
        """The entry of ``key``, now the most recently used; opened by ``open_`` when absent,
        after the least recently used was closed to make room."""
        self._own()
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        while len(self._entries) >= self.max_entries:
            self._release(self._entries.popitem(last=False)[1])
        value = self._entries[key] = open_()
        return value

    def peek(self, key: Hashable) -> Value | None:
        """The entry of ``key`` if open, leaving the order as it is."""
        self._own()
        return self._entries.get(key)

    def discard(self, key: Hashable) -> None:
        """Close the entry of ``key``, if open."""
        self._own()
        found = self._entries.pop(key, None)
        if found is not None:
            self._release(found)

    def close_all(self) -> None:
        self._own()
        while self._entries:
            self._release(self._entries.popitem(last=False)[1])

    def _release(self, value: Value) -> None:
        if self._close is not None:
            self._close(value)

    def _own(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the entries are its parent's
            self._entries, self._pid = collections.OrderedDict(), os.getpid()
