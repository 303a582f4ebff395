"""Opening a file for reading only when it is a regular file: one check for every reader.

A path that should name a file can name a named pipe (``open`` then blocks until a
writer comes, forever), a character device such as ``/dev/zero`` (which reads until
memory runs out), a socket or a folder. Every reader of a checkpoint's files and of a
config file opens through ``open_regular``: the path is opened without blocking and
checked through the descriptor itself, so nothing but a regular file is ever read, and a
path replaced between a check and the open is not read either. Torch-free.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(Exception):
    """The path names something other than a regular file; ``kind`` says what ("a named pipe")."""

    def __init__(self, path: Path | str, mode: int) -> None:
        self.path = Path(path)
        self.mode = mode
        self.kind = kind_of(mode)
        super().__init__(f"{path}: {self.kind}, not a file")

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, as messages call it."""
    if stat.S_ISREG(mode):
        return "a file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path | str) -> BinaryIO:
    """``path`` (links followed) open for binary reading; ``NotRegularFile`` when it is not a
    regular file, ``OSError`` as the system raises it (missing, no permission, ...)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
        os.set_blocking(fd, True)  # reads of a regular file never block; later readers expect a plain file
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
