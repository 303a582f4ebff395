"""File access for the LeRobot reader: every failure names the file and what to do.

The optional dependencies (pyarrow, Pillow) are imported here, on first use, so that a
missing one is reported as the extra to install rather than as an ImportError deep in
the loader.
"""

from __future__ import annotations

import stat
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lerobot_kit.api import LerobotError, not_a_file_problem
from lerobot_kit.api import read_json as api_read_json

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

MISSING = "missing"  # what ``file_problem`` says of a path that does not exist
DATASET_EXTRA = "pip install 'lerobot-kit[dataset]'"
THREADED_READ_ROWS = 10_000  # a parquet file of more rows is read by pyarrow's thread pool


class LeRobotDatasetError(LerobotError):
    """A LeRobot-format dataset is missing, malformed or uses something this reader does not support."""


def require_pyarrow() -> ModuleType:
    """``pyarrow.parquet``, or a one-line error naming the extra that provides it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise LeRobotDatasetError(f"reading LeRobot-format datasets needs pyarrow: {DATASET_EXTRA}") from exc
    return pq


def require_pil() -> ModuleType:
    """``PIL.Image`` for decoding image features stored as PNG/JPEG bytes."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise LeRobotDatasetError(
            f"this dataset stores image features as encoded images, which need Pillow: {DATASET_EXTRA}"
        ) from exc
    return Image


def read_json(path: Path) -> Any:
    """A metadata file of the dataset, or one line naming it, what is wrong and the fix."""
    return api_read_json(path, "the dataset is incomplete or damaged: re-copy or re-download it",
                         error=LeRobotDatasetError)


def parquet_columns(path: Path, what: str) -> list[str]:
    """Column names of a parquet file, read from its footer only."""
    with _open_parquet(path, what) as handle:
        return list(handle.schema_arrow.names)


def read_parquet(path: Path, columns: list[str], what: str, optional: tuple[str, ...] = ()) -> pa.Table:
    """The named columns of a parquet file, and those of ``optional`` it has; ``what`` says
    what the file holds, for the error.

    The footer is read once, for the check and the read together: a mixture opens a few
    small metadata files per member, hundreds of members at start-up, where reading a
    footer costs as much as the data (and ``pq.read_table``'s dataset layer several times
    more). A small file is read on the calling thread: waking pyarrow's pool costs more
    than reading it."""
    with _open_parquet(path, what) as handle:
        present = list(handle.schema_arrow.names)
        missing = [c for c in columns if c not in present]
        if missing:
            raise LeRobotDatasetError(f"{path}: missing column(s) {missing}; it holds {what} and has {present}")
        try:
            wanted = [*columns, *(c for c in optional if c in present and c not in columns)]
            return handle.read(columns=wanted, use_threads=handle.metadata.num_rows > THREADED_READ_ROWS)
        except Exception as exc:  # noqa: BLE001
            raise LeRobotDatasetError(f"{path}: not a readable parquet file ({exc}); it holds {what}") from exc


def _open_parquet(path: Path, what: str) -> pq.ParquetFile:
    """A parquet file with its footer read."""
    parquet = require_pyarrow()
    require_file(path, what)
    try:
        return parquet.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise LeRobotDatasetError(f"{path}: not a readable parquet file ({exc}); it holds {what}") from exc


def require_file(path: Path, what: str) -> None:
    """The dataset's file ``path`` (which holds ``what``) is a regular file, or one line saying what it is instead."""
    if problem := file_problem(path):
        raise LeRobotDatasetError(
            f"{path}: {problem}; it should hold {what}. The dataset is incomplete: re-copy or re-download it"
        )


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as one of the dataset's files ("missing", "a named pipe,
    not a file"), or None for a regular file: a named pipe or a device is named as what it
    is, since calling it missing sends the user looking for a file that is there."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    return not_a_file_problem(mode)
