"""Normalisation stats for the features ``meta/stats.json`` leaves out.

LeRobot always writes ``meta/stats.json``, so this runs only for datasets written by
other tools. Vectors are exact over the selected episodes (read from the column cache,
one episode at a time). Cameras are measured on at most ``CAMERA_STATS_FRAMES`` frames
spread evenly over the selected episodes, decoded in batches, so the memory stays flat
in dataset size; below that many frames the stats are exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from lerobot_kit.api import PixelStats, vector_stats

if TYPE_CHECKING:
    from lerobot_kit.plugins.datasets.lerobot.columns import FileColumns
    from lerobot_kit.plugins.datasets.lerobot.reader import LeRobotDataset

CAMERA_STATS_FRAMES = 1000
DECODE_BATCH = 32  # frames decoded at once: bounds memory for large cameras


def complete_stats(
    dataset: LeRobotDataset, stats: dict[str, dict[str, np.ndarray]]
) -> dict[str, dict[str, np.ndarray]]:
    """``stats`` plus computed stats for every float or camera feature it lacks."""
    out = dict(stats)
    for key, spec in dataset.meta.features.items():
        if key in out:
            continue
        if spec.dtype == "float32":
            rows = [columns.numeric[key][frames] for columns, frames in _episodes(dataset)]
            out[key] = vector_stats(np.concatenate(rows), spec.shape)
        elif spec.is_image:
            out[key] = _camera_stats(dataset, key, spec.shape[0])
    return out


def _episodes(dataset: LeRobotDataset) -> Iterator[tuple[FileColumns, np.ndarray]]:
    for position in range(len(dataset.episodes)):
        yield dataset.episode_arrays(position)


def _camera_stats(dataset: LeRobotDataset, key: str, channels: int) -> dict[str, np.ndarray]:
    total = len(dataset)
    picked = np.unique(np.linspace(0, total - 1, min(total, CAMERA_STATS_FRAMES)).round().astype(np.int64))
    pixels = PixelStats(channels)
    for position in range(len(dataset.episodes)):
        start, end = dataset.windows.starts[position], dataset.windows.starts[position + 1]
        frames = picked[(picked >= start) & (picked < end)]
        if not len(frames):
            continue
        _, rows = dataset.episode_arrays(position)
        for chunk in range(0, len(frames), DECODE_BATCH):
            decoded = dataset.camera_frames(key, position, rows[frames[chunk : chunk + DECODE_BATCH] - start])
            pixels.add(np.stack(decoded).transpose(0, 3, 1, 2))
    return pixels.result()
