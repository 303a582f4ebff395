"""One bounded table of open things (video decoders, mapped data files) per process.

A training run may mix hundreds of datasets, and every DataLoader worker reads all of
them. Files kept open per dataset would add up with the number of datasets — past a
process's open-file limit (often 1024), and with the memory each open decoder holds.
So every dataset of a process shares one table per kind of thing, bounded in entries
and, where an entry holds memory of its own, in its estimated bytes: when a new entry
would pass a bound, the least recently used ones are closed. Video decoders hold a file
descriptor each, so their table is bounded by a share of the process's open-file limit
(``FileBudget``: three quarters, the rest for the loader's pipes, shared memory and
libraries), read when an entry is added: the limit may be raised after the table was
made (``raise_open_file_limit``). Mapped data files hold none (``mapped``). The larger
the tables, the fewer samples of a large mixture reopen their member's files (a video
costs 0.2-0.7 ms to open and decode its first frame, a data file 0.1 ms to map).

Many systems set a soft open-file limit of 1024 under a far higher hard one. A mixture
whose members hold more videos than the decoders' share of the soft limit raises the
soft limit, once, toward what they want, never past the hard limit (one log line says
so), as trainers commonly do at start-up; where the hard limit is 1024 too, the tables
stay within it and the least recently used decoders are closed.

A forked child starts with an empty table (checked by pid on each use), as a spawned
one does: the parent's entries are dropped there, not closed — they are the parent's.

A table is shared by the threads of its process (a worker decodes a sample's cameras
on several): its bookkeeping is locked, and opening, the slow part, is not, so threads
open different files at once. An entry is closed only as the least recently used one,
and never one of the ``kept`` most recently used, so one in use by a thread is never
closed under it while no more than ``kept`` are in use at once.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import resource
import threading
from typing import Callable, Generic, Hashable, TypeVar

Value = TypeVar("Value")
MAX_FILE_BUDGET = 4096  # entries per table even where the open-file limit is far higher
DECODER_SHARE = 3 / 4  # of the open-file limit, for video decoders (data files are mapped without descriptors)

logger = logging.getLogger("lerobot_kit")


def file_budget(share: float) -> int:
    """Open files a table of this process may hold: ``share`` of its open-file limit (of the
    usual 1024, 512 for a half), at least 8."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_FILE_BUDGET if soft == resource.RLIM_INFINITY else max(8, min(MAX_FILE_BUDGET, int(soft * share)))


class FileBudget:
    """``share`` of this process's open-file limit as it is when asked (``file_budget``)."""

    def __init__(self, share: float) -> None:
        self.share = share

    def __call__(self) -> int:
        return file_budget(self.share)


def raise_open_file_limit(files: int, share: float = DECODER_SHARE) -> int:
    """Raise this process's soft open-file limit so that ``share`` of it holds ``files`` (and
    its children, forked or spawned later, inherit it), never past the hard limit nor past
    what a table may hold; say so in one log line. Returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = math.ceil(min(files, MAX_FILE_BUDGET) / share)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if raised <= soft:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    except (ValueError, OSError):  # a platform that refuses: the tables stay within the limit as it is
        return soft
    logger.info(f"raised this process's soft open-file limit from {soft} to {raised} (hard limit {hard}) so that "
                f"{min(files, file_budget(share))} of the {files} video files stay open; see docs/mixtures.md")
    return raised


class OpenFiles(Generic[Value]):
    """At most ``max_entries`` open things of this process (a number, or a function giving it
    when an entry is added), and at most ``max_cost`` of their estimated bytes (beyond the
    ``kept`` most recently used), least recently used closed first, keyed by who uses them
    and what they open.

    ``close`` releases an evicted entry; without it, an entry is released when no longer
    referenced (a memory map).
    """

    def __init__(self, max_entries: int | Callable[[], int], close: Callable[[Value], None] | None = None, *,
                 max_cost: float = math.inf, kept: int = 1) -> None:
        self.max_entries = max_entries
        self.max_cost = max_cost
        self.kept = kept
        self._close = close
        self._entries: collections.OrderedDict[Hashable, tuple[Value, float]] = collections.OrderedDict()
        self._cost = 0.0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        self._own()
        return len(self._entries)

    def get(self, key: Hashable, open_: Callable[[], Value], cost: float = 0.0) -> Value:
        """The entry of ``key``, now the most recently used; opened by ``open_`` when absent
        (its estimated bytes: ``cost``), after the least recently used were closed to make room."""
        self._own()
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        value = open_()
        max_entries = self.max_entries() if callable(self.max_entries) else self.max_entries
        with self._lock:
            found = self._entries.get(key)
            if found is not None:  # another thread opened it meanwhile
                self._release(value)
                self._entries.move_to_end(key)
                return found[0]
            while len(self._entries) >= max_entries or (
                self._cost + cost > self.max_cost and len(self._entries) >= self.kept
            ):
                self._evict()
            self._entries[key] = (value, cost)
            self._cost += cost
        return value

    def peek(self, key: Hashable) -> Value | None:
        """The entry of ``key`` if open, leaving the order as it is."""
        self._own()
        found = self._entries.get(key)
        return None if found is None else found[0]

    def discard(self, key: Hashable) -> None:
        """Close the entry of ``key``, if open."""
        self._own()
        with self._lock:
            found = self._entries.pop(key, None)
            if found is not None:
                self._cost -= found[1]
                self._release(found[0])

    def close_all(self) -> None:
        self._own()
        with self._lock:
            while self._entries:
                self._evict()

    def _evict(self) -> None:
        value, cost = self._entries.popitem(last=False)[1]
        self._cost -= cost
        self._release(value)

    def _release(self, value: Value) -> None:
        if self._close is not None:
            self._close(value)

    def _own(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the entries (and the lock's state) are its parent's
            self._entries, self._pid, self._lock = collections.OrderedDict(), os.getpid(), threading.Lock()
            self._cost = 0.0
