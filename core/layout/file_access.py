"""A checkpoint's file that cannot be read at all: named as what it is, never as damage.

A file whose permissions or owner keep this user out, or that the disk fails to read,
says nothing about the checkpoint's contents: calling it damaged, with advice to resume
an earlier step (which deletes the later step folders), would delete intact
checkpoints. So an ``OSError`` on a checkpoint's file is a ``CheckpointAccessError``
whose line names the path, the errno and the fix (the permissions or the ownership, the
disk), and a path that is not a regular file (a named pipe, a device, a socket) is
refused before it is opened (``core.layout.regular_file``): a checkpoint holds files
and folders only. Torch-free.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from lerobot_kit.core.errors import CheckpointError
from lerobot_kit.core.layout.regular_file import NotRegularFile, kind_of, open_regular


class NotAFileError(CheckpointError):
    """A checkpoint's path that should be a file is a folder, a named pipe, a device or a socket."""


class CheckpointAccessError(CheckpointError):
    """The system refused to read (or list) a checkpoint's file: its line names the errno and
    the fix; the contents were not read, so nothing is known to be damaged. ``file``: the
    path as the line names it."""

    def __init__(self, line: str, file: str | None = None) -> None:
        super().__init__(line)
        self.file = file


def open_checkpoint_file(path: Path, label: str | None = None) -> BinaryIO:
    """``path`` open for binary reading, when it is a regular file; else one ``CheckpointError``
    line starting with ``label`` (default: the path): missing, not a file (``NotAFileError``),
    or unreadable (``CheckpointAccessError``)."""
    name = label or str(path)
    try:
        return open_regular(path)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{name}: missing") from exc
    except NotRegularFile as exc:
        raise NotAFileError(not_a_file_line(name, exc.mode)) from exc
    except OSError as exc:
        raise CheckpointAccessError(access_line(name, exc), name) from exc


def entry_mode(path: Path, label: str | None = None) -> int | None:
    """``st_mode`` of ``path`` (links followed), None when there is nothing there (or a link
    leads nowhere); ``CheckpointAccessError`` when the system does not let this user look."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise CheckpointAccessError(access_line(label or str(path), exc), label or str(path)) from exc


def not_a_file_line(name: str, mode: int) -> str:
    return f"{name}: {not_a_file_problem(mode)}"


def not_a_file_problem(mode: int) -> str:
    """``a named pipe, not a file`` (a directory is called a folder, as everywhere in messages)."""
    kind = "a folder" if kind_of(mode) == "a directory" else kind_of(mode)
    return f"{kind}, not a file"


def access_line(name: str, exc: OSError, *, folder: bool = False) -> str:
    """``<name>: cannot be read: <strerror> (errno <NAME>); <the fix>``."""
    return f"{name}: {access_problem(exc, folder=folder)}; {_fix(exc.errno, folder)}"


def access_problem(exc: OSError, *, folder: bool = False) -> str:
    """``cannot be read: <strerror> (errno <NAME>)``: what the system refused, without a fix."""
    code = errno.errorcode.get(exc.errno or 0)
    verb = "listed" if folder else "read"
    return f"cannot be {verb}: {exc.strerror or exc}" + (f" (errno {code})" if code else "")


def _fix(code: int | None, folder: bool) -> str:
    unchecked = "its contents were not checked, and nothing needs deleting"
    if code in (errno.EACCES, errno.EPERM):
        what = "list it" if folder else "read it"
        return (f"this user (uid {_uid()}) lacks permission to {what} or a folder above it: fix the permissions "
                f"or the ownership (chmod, chown), or run as the checkpoint's owner; {unchecked}")
    if code == errno.EIO:
        return f"the disk or file system failed to read it: check the storage (dmesg) and run again; {unchecked}"
    if code in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return f"the machine is out of file handles or memory: free some and run again; {unchecked}"
    return f"fix what the system reports and run again; {unchecked}"


def _uid() -> int | str:
    return os.geteuid() if hasattr(os, "geteuid") else "?"
