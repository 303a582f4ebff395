"""A tokenizer or VLM folder holds regular files only, checked before transformers reads any of it.

transformers tests each file it wants with ``os.path.isfile`` and takes anything else for
absent: a named pipe, a link to nothing or a folder at ``tokenizer_config.json`` loads a
tokenizer without its settings, and the run fails later, far from the cause (a tokenizer
without its padding token failed the first batch as an internal error); any reader that
does open a named pipe waits for a writer for ever, and a file this user may not read
fails deep inside the load. So when a run's config is validated, before transformers or
LeRobot is imported, every entry of the folder is looked at, by its mode, opened without
blocking and never read (``open_regular``): the first that is not a readable regular file
is refused in one line naming it and the fix, as a flag error.

Entries whose names start with a dot (``.git``, ``.cache`` of a hub download) are none of
transformers' files and are left alone; subfolders are looked into one level deep (as deep
as transformers reads), but one named like a file transformers reads (``tokenizer.json/``)
is refused as a folder where a file belongs. Torch-free.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from lerobot_kit.api import NotRegularFile, open_regular
from lerobot_kit_lerobot.files_digest import WEIGHT_SUFFIXES

# What transformers reads from a model folder as files: configs, vocabularies, templates, weights.
FILE_SUFFIXES = frozenset({".json", ".jinja", ".model", ".txt", ".py", ".tiktoken", *WEIGHT_SUFFIXES})
# transformers reads a folder's own files and those of its subfolders (``additional_chat_templates/``),
# nothing deeper: a folder given by mistake (a home folder) is not walked whole.
READ_DEPTH = 1


def folder_files_problem(name: str) -> str | None:
    """Why the folder ``name`` (a flag's value) cannot be handed to transformers, in one
    line naming the entry and the fix; None when every entry is a readable regular file or
    a folder of them, or when ``name`` is not a local path (a hub id)."""
    folder = Path(name).expanduser()
    try:
        mode = os.stat(folder).st_mode
    except FileNotFoundError:
        return None  # a hub id: transformers resolves it
    except OSError as exc:
        return _unreadable(folder, exc)
    if not stat.S_ISDIR(mode):
        return f"{folder} is not a folder: give the folder holding the files (or a hub id)"
    return _folder_problem(folder, depth=0)


def _folder_problem(folder: Path, depth: int) -> str | None:
    """The first entry of ``folder`` that is not a readable regular file, or a folder of them
    down to the depth transformers reads."""
    try:
        names = sorted(name for name in os.listdir(folder) if not name.startswith("."))
    except OSError as exc:
        return _unreadable(folder, exc, listing=True)
    for path in (folder / name for name in names):
        problem = _entry_problem(path, depth)
        if problem:
            return problem
    return None


def _entry_problem(path: Path, depth: int) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return f"{path} is a link to nothing ({_target(path)}): {_FIX}"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path} is a link that leads back to itself: {_FIX}"
        return _unreadable(path, exc)
    if stat.S_ISDIR(mode):
        if path.suffix in FILE_SUFFIXES:
            return f"{path} is a folder where transformers reads a file: {_FIX}"
        return _folder_problem(path, depth + 1) if depth < READ_DEPTH else None
    try:
        open_regular(path).close()
    except NotRegularFile as exc:
        return f"{path} is {exc.kind}, not a file, and reading it would block or never end: {_FIX}"
    except OSError as exc:
        return _unreadable(path, exc)
    return None


def _target(link: Path) -> str:
    try:
        return os.readlink(link)
    except OSError:
        return "gone"


_FIX = "put the file itself there (a regular file, as save_pretrained writes it) or remove it"


def _unreadable(path: Path, exc: OSError, *, listing: bool = False) -> str:
    code = errno.errorcode.get(exc.errno or 0, "")
    verb = "listed" if listing else "read"
    return (f"{path} cannot be {verb} ({exc.strerror or exc}{f', errno {code}' if code else ''}): fix its "
            "permissions or ownership (chmod, chown) so that this user can read it")
