"""File access for the LeRobot reader: every failure names the file and what to do.

The optional dependencies (pyarrow, Pillow) are imported here, on first use, so that a
missing one is reported as the extra to install rather than as an ImportError deep in
the loader.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lerobot_kit.api import LerobotError

if TYPE_CHECKING:
    import pyarrow as pa

DATASET_EXTRA = "pip install 'lerobot-kit[dataset]'"


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
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise LeRobotDatasetError(f"{path}: missing; the dataset is incomplete (re-copy or re-download it)") from exc
    except OSError as exc:
        raise LeRobotDatasetError(f"{path}: cannot be read: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise LeRobotDatasetError(f"{path}: not valid JSON ({exc}); the file is corrupt or truncated") from exc


def parquet_columns(path: Path, what: str) -> list[str]:
    """Column names of a parquet file, read from its footer only."""
    pq = require_pyarrow()
    _check_exists(path, what)
    try:
        return list(pq.read_schema(path).names)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise LeRobotDatasetError(f"{path}: not a readable parquet file ({exc}); it holds {what}") from exc


def read_parquet(path: Path, columns: list[str], what: str) -> pa.Table:
    """The named columns of a parquet file; ``what`` says what the file holds, for the error."""
    pq = require_pyarrow()
    present = parquet_columns(path, what)
    missing = [c for c in columns if c not in present]
    if missing:
        raise LeRobotDatasetError(f"{path}: missing column(s) {missing}; it holds {what} and has {present}")
    try:
        return pq.read_table(path, columns=columns)
    except Exception as exc:  # noqa: BLE001
        raise LeRobotDatasetError(f"{path}: not a readable parquet file ({exc}); it holds {what}") from exc


def _check_exists(path: Path, what: str) -> None:
    if not path.is_file():
        raise LeRobotDatasetError(
            f"{path}: missing; it should hold {what}. The dataset is incomplete: re-copy or re-download it"
        )
