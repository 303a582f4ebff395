"""The on-demand LeRobot reader serves the items the in-memory reader it replaced served."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_dataset_factory import ACTION_KEY, IMAGE_KEY, STATE_KEY, VIDEO_KEY, write_lerobot_dataset
from lerobot_kit.plugins.datasets.lerobot._legacy.reader import make_lerobot_dataset as make_in_memory_dataset
from lerobot_kit.plugins.datasets.lerobot.plugin import LeRobotDatasetConfig
from lerobot_kit.plugins.datasets.lerobot.reader import make_lerobot_dataset

LENGTHS = [7, 12, 5, 9]
HISTORY = {ACTION_KEY: list(range(8)), STATE_KEY: [-2, -1, 0], IMAGE_KEY: [-1, 0], VIDEO_KEY: [-3, -1, 0, 2]}


def assert_same_items(root: Path, delta: dict[str, list[int]], order: list[int], **fields: object) -> None:
    config = LeRobotDatasetConfig(repo_id="user/x", root=str(root), **fields)
    new, old = make_lerobot_dataset(config, delta), make_in_memory_dataset(config, delta)
    assert len(new) == len(old) and new.meta.to_json() == old.meta.to_json()
    for i in order:
        ours, theirs = new[i], old[i]
        assert ours.keys() == theirs.keys(), i
        for key in ours:
            assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), (i, key)


@pytest.mark.parametrize("order", ["sequential", "random", "backwards"])
def test_images_video_history_and_padding(tmp_path: Path, order: str) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, image=True, video=True, episodes_per_file=2)
    n = sum(LENGTHS)
    indices = {"sequential": list(range(n)), "backwards": list(range(n - 1, -1, -1)),
               "random": np.random.default_rng(0).integers(0, n, 3 * n).tolist()}[order]
    assert_same_items(tmp_path, HISTORY, indices)


def test_episode_subset_across_chunks_and_shuffled_rows(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, image=True, video=True, episodes_per_file=1, chunks_size=2)
    data_file = tmp_path / "data/chunk-001/file-000.parquet"  # episode 2
    table = pq.read_table(data_file)
    pq.write_table(table.take(np.random.default_rng(1).permutation(len(table))), data_file)
    n = LENGTHS[1] + LENGTHS[2]
    assert_same_items(tmp_path, HISTORY, list(range(n)), episodes=[2, 1])


def test_stats_computed_when_stats_json_is_missing(tmp_path: Path) -> None:
    write_lerobot_dataset(tmp_path, LENGTHS, image=True, video=True, stats=False)
    assert_same_items(tmp_path, {ACTION_KEY: list(range(4))}, [0, 5, 30])
