"""A write that found its disk full, said in one line: the path, the bytes it needed, the bytes free.

The system's own words, "No space left on device", name neither the file nor the disk (a
failed ``write`` carries no file name), nor how much room the write wanted. So a writer
of the user's files turns ``ENOSPC`` (and a quota's ``EDQUOT``) into a line naming the
file it was writing, the bytes that write needs where it knows them, and the free space
of the disk it was writing to. Torch-free.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from lerobot_kit.core.layout.byte_size import byte_size

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is the system saying the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


def free_bytes(path: Path) -> int | None:
    """Free bytes of the file system ``path`` is (or would be) on; None when the system does not say."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free
    except OSError:
        return None


def no_space_line(path: Path, needed: int | None, exc: OSError | None = None) -> str:
    """``<path>: No space left on device (errno ENOSPC) writing it; it needs <n>, and its disk has <m> free``.

    ``needed``: the bytes that write needs (None when unknown: the free space then says
    how far it got); ``exc``: the failed write, None for a write refused before it began."""
    if exc is None:
        failed = "not enough room on its disk to write it"
    else:
        failed = f"{exc.strerror or 'No space left on device'} (errno {errno.errorcode.get(exc.errno or 0, exc.errno)})"
        failed += " writing it"
    free = free_bytes(path.parent)
    room = "its disk's free space is unknown" if free is None else f"its disk has {byte_size(free, exact=True)} free"
    need = f"it needs {byte_size(needed, exact=True)}, and " if needed is not None else ""
    return f"{path}: {failed}; {need}{room}"
