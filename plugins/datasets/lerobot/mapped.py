"""Read-only memory maps of whole files that hold no file descriptor.

A map does not need its file to stay open: the kernel keeps the mapping alive on its own.
Python's ``mmap`` (before 3.13's ``trackfd=False``) keeps a duplicate of the descriptor
for as long as the map lives, so every mapped data file of a mixture's member would count
against the process's open-file limit beside its video decoders: at the usual limit of
1024, a mixture of 500 members could not keep its 500 videos and 500 data files open at
once, and about half of its samples reopened one. Mapped here, through the C library's
``mmap``, a data file costs an address range and no descriptor, so the open-file limit is
left to the video decoders.

The buffer is read-only (so are the arrays NumPy views on it, as the pages are) and the
range is unmapped when the last array viewing it is freed.
"""

from __future__ import annotations

import ctypes
import mmap
import os

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
_LIBC.munmap.restype = ctypes.c_int
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """Owns one mapped range; unmaps it when garbage collected (after every view of it)."""

    def __init__(self, address: int, size: int) -> None:
        self.address = address
        self.size = size

    def __del__(self) -> None:
        _LIBC.munmap(self.address, self.size)


def map_read_only(fd: int, size: int) -> memoryview:
    """The first ``size`` bytes of the open file ``fd`` (``size`` > 0), mapped read-only and
    shared (the page cache's copy, one per machine). ``fd`` may be closed right after."""
    address = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    buffer = (ctypes.c_char * size).from_address(address)
    buffer._mapping = _Mapping(address, size)  # type: ignore[attr-defined]  # freed with the buffer
    return memoryview(buffer).cast("B").toreadonly()
