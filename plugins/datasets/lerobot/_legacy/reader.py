"""Loads a LeRobot v3.0 dataset (``--dataset.repo_id``) into memory as a ``PolicyDataset``.

Everything the selected episodes hold is read up front into numpy arrays: vectors as
float32, camera frames (images and decoded videos) as uint8 ``[N, C, H, W]``, so memory
is about ``N × (C·H·W + 4·dims)`` bytes — fine for the single-task datasets this kit
trains on (50 episodes × 400 frames of two 96x96 cameras is ~1.1 GB), not for
million-frame corpora. In exchange, items are plain array slices: fast, deterministic,
picklable into DataLoader workers. Chunking and padding at episode ends are
``InMemoryDataset``'s (a chunk never reads into the next episode).

Normalisation stats come from ``meta/stats.json`` (dataset-wide, also when
``--dataset.episodes`` selects a subset, as in LeRobot); features it lacks get stats
computed from the loaded frames.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lerobot_kit.core.data.dataset import DatasetMeta, InMemoryDataset, compute_stats
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot._legacy.frames import load_episode_frames
from lerobot_kit.plugins.datasets.lerobot.locate import locate_dataset
from lerobot_kit.plugins.datasets.lerobot.meta import (
    read_episodes,
    read_info,
    read_stats,
    read_tasks,
    select_episodes,
)
from lerobot_kit.plugins.datasets.lerobot._legacy.video import decode_episodes, require_video_decoder


class LeRobotDataset(InMemoryDataset):
    """An ``InMemoryDataset`` that also remembers where it came from and its task texts.

    ``tasks`` maps task index to text and ``task_index`` gives each frame's task (-1 when
    the dataset stores none); they stay out of items, which carry tensors only.
    """

    def __init__(
        self,
        meta: DatasetMeta,
        frames: dict[str, np.ndarray],
        episode_index: np.ndarray,
        delta_indices: dict[str, list[int]],
        *,
        repo_id: str,
        root: Path,
        tasks: dict[int, str],
        task_index: np.ndarray,
    ) -> None:
        super().__init__(meta, frames, episode_index, delta_indices)
        self.repo_id = repo_id
        self.root = root
        self.tasks = tasks
        self.task_index = task_index


def make_lerobot_dataset(config: LeRobotDatasetConfig, delta_indices: dict[str, list[int]]) -> LeRobotDataset:
    """The dataset factory registered as ``--dataset.type=lerobot``."""
    assert config.repo_id is not None  # the config validator requires it
    root = locate_dataset(config.repo_id, config.root, config.revision, config.allow_download)
    info = read_info(root)
    video_keys = info.keys("video")
    av = require_video_decoder(config.video_backend, video_keys) if video_keys else None
    episodes = select_episodes(read_episodes(info), config.episodes)
    tasks = read_tasks(root)
    loaded = load_episode_frames(info, episodes)
    for key in video_keys:
        timestamps = {row.index: loaded[row.index].timestamp for row in episodes}
        for index, frames in decode_episodes(av, info, key, episodes, timestamps).items():
            loaded[index].arrays[key] = frames

    features = {key: source.spec for key, source in info.features.items()}
    frames = {key: np.concatenate([loaded[row.index].arrays[key] for row in episodes]) for key in features}
    episode_index = np.concatenate([np.full(row.length, row.index, dtype=np.int64) for row in episodes])
    task_index = np.concatenate([
        loaded[row.index].task_index if loaded[row.index].task_index is not None else np.full(row.length, -1)
        for row in episodes
    ]).astype(np.int64)

    stats = read_stats(root, features)
    missing = {k: frames[k] for k, spec in features.items() if k not in stats and spec.dtype in ("float32", "image")}
    stats.update(compute_stats(missing, features))
    meta = DatasetMeta(
        features=features, stats=stats, fps=info.fps, num_episodes=len(episodes), num_frames=len(episode_index)
    )
    return LeRobotDataset(
        meta, frames, episode_index, delta_indices,
        repo_id=config.repo_id, root=root, tasks=tasks, task_index=task_index,
    )
