"""Files of a checkpoint get the mode the user's umask gives, whichever library wrote them.

Python's ``open`` creates a file ``0o666`` minus the umask (``0644`` under the usual
``022``), so colleagues on a shared cluster can read it. Some writers do not: safetensors
writes into a private temporary file (``0600``) and renames it over the target, so
every ``*.safetensors`` would stay unreadable to anyone else, beside world-readable
JSON. ``save_safetensors`` is the toolkit's one safetensors writer and gives the file
the umask's mode; ``match_umask_tree`` does the same for a whole folder just before it
is published, so files a plugin writes its own way follow the same rule.

Torch-free at import: ``inspect-checkpoint`` imports the layout package.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

# safetensors' Rust writer reports a failed system call as text: "... (os error 30) at path ...".
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (changing it, even
    for an instant, would give a file another thread creates meanwhile the wrong mode)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open`` gives a new file: ``0o666`` minus the umask."""
    return 0o666 & ~current_umask()


def match_umask(path: Path, mode: int | None = None) -> None:
    """Give the file at ``path`` the umask's mode (or ``mode``), if it has another."""
    wanted = file_mode() if mode is None else mode
    if os.stat(path).st_mode & 0o777 != wanted:
        os.chmod(path, wanted)


def match_umask_tree(root: Path) -> None:
    """Every regular file under ``root`` gets the umask's mode; links and folders are left as they are."""
    mode = file_mode()
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                match_umask(path, mode)


def save_safetensors(tensors: Mapping[str, Tensor], path: Path, metadata: dict[str, str] | None = None) -> Path:
    """``safetensors.torch.save_file`` with the umask's mode, and an ``OSError`` naming ``path``
    (not the writer's temporary file) when the file system refuses the write."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(dict(tensors), str(path), metadata=metadata)
    except SafetensorError as exc:
        found = _OS_ERROR.search(str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code) if code in errno.errorcode else str(exc), str(path)) from exc
    match_umask(Path(path))
    return Path(path)
