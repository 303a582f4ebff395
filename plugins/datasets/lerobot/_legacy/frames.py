"""Per-frame columns of ``data/chunk-*/file-*.parquet`` as numpy arrays, episode by episode.

A data file packs many episodes; only the rows of the selected episodes are kept.
Vectors (fixed-size or plain list columns, or scalars for shape (1,)) become
``[N, *shape]`` arrays; image features (struct ``{bytes, path}`` of PNG/JPEG bytes)
are decoded to uint8 ``[N, C, H, W]``.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lerobot_kit.plugins.datasets.lerobot.files import (
    LeRobotDatasetError,
    parquet_columns,
    read_parquet,
    require_pil,
)
from lerobot_kit.plugins.datasets.lerobot.meta import EpisodeRow, LeRobotInfo, SourceFeature

if TYPE_CHECKING:
    import pyarrow as pa

PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


@dataclass
class EpisodeFrames:
    """One episode's rows: feature arrays, plus ``timestamp``/``task_index`` when stored."""

    arrays: dict[str, np.ndarray]
    timestamp: np.ndarray | None
    task_index: np.ndarray | None


def load_episode_frames(info: LeRobotInfo, episodes: list[EpisodeRow]) -> dict[int, EpisodeFrames]:
    """Frames of ``episodes`` from their data files (each file read once), keyed by episode index."""
    by_file: dict[tuple[int, int], list[EpisodeRow]] = defaultdict(list)
    for row in episodes:
        by_file[row.data_file].append(row)
    stored = [f for f in info.features.values() if f.kind != "video"]
    out: dict[int, EpisodeFrames] = {}
    for (chunk, file), rows in sorted(by_file.items()):
        path = info.data_file(chunk, file)
        out.update(_read_file(path, stored, rows, need_timestamp=bool(info.keys("video"))))
    return out


def _read_file(
    path: Path, stored: list[SourceFeature], rows: list[EpisodeRow], need_timestamp: bool
) -> dict[int, EpisodeFrames]:
    what = f"the frames of episode(s) {[r.index for r in rows]}"
    present = parquet_columns(path, what)
    columns = ["episode_index", *(f.key for f in stored)]
    columns += [c for c in ("frame_index", "task_index") if c in present]
    if need_timestamp:
        columns.append("timestamp")
    table = read_parquet(path, columns, what)
    episode_column = table.column("episode_index").to_numpy()
    frame_index = table.column("frame_index").to_numpy() if "frame_index" in columns else None
    numeric = {f.key: _numeric(path, f, table.column(f.key)) for f in stored if f.kind == "numeric"}
    out = {}
    for row in rows:
        picked = np.flatnonzero(episode_column == row.index)
        if len(picked) != row.length:
            raise LeRobotDatasetError(
                f"{path}: holds {len(picked)} frames of episode {row.index}, but meta/episodes says {row.length}; "
                "the dataset is inconsistent (re-copy or re-download it)"
            )
        if frame_index is not None:
            picked = picked[np.argsort(frame_index[picked], kind="stable")]
        arrays = {}
        for feature in stored:
            if feature.kind == "image":
                arrays[feature.key] = _decode_images(path, feature, table.column(feature.key), picked)
            else:
                arrays[feature.key] = numeric[feature.key][picked]
        out[row.index] = EpisodeFrames(
            arrays,
            _scalar(table, "timestamp", picked),
            _scalar(table, "task_index", picked),
        )
    return out


def _scalar(table: pa.Table, name: str, picked: np.ndarray) -> np.ndarray | None:
    if name not in table.column_names:
        return None
    return table.column(name).to_numpy()[picked]


def _numeric(path: Path, feature: SourceFeature, column: pa.ChunkedArray) -> np.ndarray:
    """``[N, *shape]`` from a scalar, list, or nested fixed-size-list column."""
    import pyarrow as pa

    values = column.combine_chunks()
    n = len(values)
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(
        values.type
    ):
        values = values.flatten()
    shape = feature.spec.shape
    if len(values) != n * math.prod(shape):
        raise LeRobotDatasetError(
            f"{path}: column {feature.key!r} holds {len(values)} values for {n} frames; "
            f"meta/info.json declares shape {list(shape)}"
        )
    if values.null_count:
        raise LeRobotDatasetError(f"{path}: column {feature.key!r} has {values.null_count} missing values")
    return values.to_numpy(zero_copy_only=False).astype(feature.spec.dtype).reshape(n, *shape)


def _decode_images(path: Path, feature: SourceFeature, column: pa.ChunkedArray, picked: np.ndarray) -> np.ndarray:
    """uint8 ``[len(picked), C, H, W]`` from the encoded image bytes of the picked rows."""
    import pyarrow as pa

    image_module = require_pil()
    values = column.combine_chunks()
    if pa.types.is_struct(values.type) and values.type.get_field_index("bytes") >= 0:
        values = values.field("bytes")
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise LeRobotDatasetError(
            f"{path}: image column {feature.key!r} has type {values.type}; "
            "expected struct<bytes, path> of encoded images"
        )
    channels, height, width = feature.spec.shape
    mode = PIL_MODES.get(channels)
    if mode is None:
        raise LeRobotDatasetError(f"{path}: image feature {feature.key!r} has {channels} channels; supported: 1, 3, 4")
    out = np.empty((len(picked), channels, height, width), dtype=np.uint8)
    for j, row in enumerate(picked):
        data = values[int(row)].as_py()
        if data is None:
            raise LeRobotDatasetError(
                f"{path}: row {row} of {feature.key!r} has no embedded image bytes "
                "(images referenced by path only are not supported)"
            )
        try:
            with image_module.open(io.BytesIO(data)) as image:
                pixels = np.asarray(image.convert(mode))
        except Exception as exc:  # noqa: BLE001 - PIL raises several types for bad bytes
            raise LeRobotDatasetError(f"{path}: row {row} of {feature.key!r} is not a decodable image ({exc})") from exc
        pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], -1).transpose(2, 0, 1)
        if pixels.shape != (channels, height, width):
            raise LeRobotDatasetError(
                f"{path}: row {row} of {feature.key!r} is a {pixels.shape[2]}x{pixels.shape[1]} image; "
                f"meta/info.json declares {width}x{height}"
            )
        out[j] = pixels
    return out
