"""The lines of a column cache entry that cannot be written, or rewritten once damaged.

The system's "No space left on device" names neither the file nor the disk, and a
build runs in a DataLoader worker of a run that may be hours from its first step
elsewhere. So a failed build is one line naming the entry, the data file it was built
from, about how many bytes it needs, the free space of the cache's disk, and where else
the cache can go. A damaged entry that cannot be rebuilt (its folder is read-only) is
one line naming the folder to delete.
"""

from __future__ import annotations

import errno
import math
import shutil
from pathlib import Path

import numpy as np

from lerobot_kit.api import byte_size
from lerobot_kit.plugins.datasets.lerobot.cache_entry import ALIGNMENT, EntryDamaged
from lerobot_kit.plugins.datasets.lerobot.files import require_pyarrow
from lerobot_kit.plugins.datasets.lerobot.meta import LeRobotInfo

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
MANIFEST_BYTES = 1024  # about, beyond the arrays


def estimated_bytes(info: LeRobotInfo, source: Path, rows: int) -> int | None:
    """About the size of ``source``'s entry: numeric arrays from the schema, cameras from
    the parquet footer's uncompressed sizes; None when the footer cannot be read."""
    numeric = [f for f in info.features.values() if f.kind == "numeric"]
    cameras = info.keys("image")
    size = sum(rows * math.prod(f.spec.shape) * np.dtype(f.spec.dtype).itemsize for f in numeric)
    size += rows * (8 + 8 + 16 * len(cameras))  # timestamp, task_index, each camera's spans
    image_columns = {*cameras, *(f"{key}.bytes" for key in cameras)}  # plain binary, or LeRobot's struct
    try:
        metadata = require_pyarrow().ParquetFile(source).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            for column in range(row_group.num_columns):
                chunk = row_group.column(column)
                if chunk.path_in_schema in image_columns:
                    size += chunk.total_uncompressed_size
    except Exception:  # noqa: BLE001 - an estimate for a message: the build's own error is the one to report
        return None
    return size + ALIGNMENT * (len(numeric) + 2 + 2 * len(cameras)) + MANIFEST_BYTES


def build_failed_line(entry: Path, source: Path, exc: OSError, needed: int | None, user_cache: bool) -> str:
    """A build of ``entry`` from ``source`` that the system refused (its temporary folder is gone)."""
    where = entry.parent.parent  # the cache folder, above v<FORMAT>/
    failed = _errno_text(exc)
    if exc.errno in NO_SPACE_ERRNOS:
        need = f"it needs about {byte_size(needed, exact=True)}, and " if needed is not None else ""
        fix = ("free space there, or point XDG_CACHE_HOME at a larger disk" if user_cache else
               "free space there (a dataset folder this user may not write keeps its cache under "
               "$XDG_CACHE_HOME/lerobot_kit/ instead)")
        return (f"{entry}: building the column cache of {source} failed: {failed}; {need}the disk of {where} has "
                f"{_free(where)} free; nothing of it was left: {fix}")
    return (f"{entry}: building the column cache of {source} failed: {_where(exc)}{failed}; nothing of it was left: "
            f"check that the disk of {where} is writable and sound, then run again")


def cannot_lock_line(folder: Path, exc: OSError) -> str:
    """The cache folder (where an entry's lock lives) that cannot be written."""
    free = f"; its disk has {_free(folder)} free" if exc.errno in NO_SPACE_ERRNOS else ""
    return (f"{folder}: cannot write the dataset's column cache there ({_where(exc)}{_errno_text(exc)}{free}); "
            "free disk space or make the folder writable")


def cannot_rebuild_line(entry: Path, source: Path, damage: EntryDamaged, exc: OSError) -> str:
    """A damaged entry whose folder does not let it be replaced."""
    return (f"{entry}: this column cache entry of {source} is damaged ({damage}), and it cannot be rebuilt there "
            f"({_errno_text(exc)}): delete that folder (rm -r {entry}) or make {entry.parent} "
            "writable, then run again; the entry is rebuilt from the dataset's files")


def _errno_text(exc: OSError) -> str:
    return f"{exc.strerror or exc} (errno {errno.errorcode.get(exc.errno or 0, exc.errno)})"


def _where(exc: OSError) -> str:
    return f"{exc.filename}: " if exc.filename is not None else ""


def _free(folder: Path) -> str:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return byte_size(shutil.disk_usage(existing).free, exact=True)
    except OSError:
        return "an unknown amount"
