"""Watch files and folders through Linux inotify, to see what launched processes do to them.

The kernel reports every open, create and rename in the order they happened, whichever
process did it and however it did it (Python's ``open``, a Rust reader's ``open(2)``, an
``mmap``-ing loader). So a test can count how often a file was opened during a run, or
check the order in which checkpoint folders appeared and were renamed, without touching
the code under test. Only ctypes and libc: nothing to install.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
from dataclasses import dataclass
from pathlib import Path

IN_OPEN = 0x00000020
IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name[len]


@dataclass(frozen=True)
class Event:
    path: Path  # the watched path, joined with the entry's name for events inside a folder
    mask: int


class Watch:
    """One inotify instance; events queue in the kernel until ``events()`` reads them."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._paths: dict[int, Path] = {}

    def add(self, path: Path, mask: int) -> None:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch({path}) failed")
        self._paths[wd] = path

    def events(self, wait: float = 0.0) -> list[Event]:
        """Every event queued since the last call, oldest first; if none, wait up to ``wait`` seconds for one."""
        if wait > 0:
            select.select([self._fd], [], [], wait)
        found = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset : offset + length].rstrip(b"\0").decode()
                offset += length
                found.append(Event(self._paths[wd] / name if name else self._paths[wd], mask))

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
