"""The embedded reach dataset: deterministic, episode-safe chunks, images, stats."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from lerobot_kit.core.data.dataset import DatasetMeta, InMemoryDataset
from lerobot_kit.core.errors import ConfigError
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.datasets.reach.data import IMAGE_KEY, make_reach_dataset
from lerobot_kit.core.registry.registry import get_registry

CHUNK = {"action": list(range(8))}


def small(**overrides: object) -> ReachDatasetConfig:
    return ReachDatasetConfig(**{"num_episodes": 4, "episode_length": 12, **overrides})


def test_registered_factory_is_make_reach_dataset() -> None:
    entry = get_registry().dataset("reach")
    assert entry.config_class is ReachDatasetConfig
    assert entry.load() is make_reach_dataset


def test_generation_is_deterministic_and_seeded() -> None:
    a = make_reach_dataset(ReachDatasetConfig(image=True, image_size=16), CHUNK)
    b = make_reach_dataset(ReachDatasetConfig(image=True, image_size=16), CHUNK)
    c = make_reach_dataset(ReachDatasetConfig(generation_seed=1), CHUNK)
    for key in a.frames:
        assert np.array_equal(a.frames[key], b.frames[key])
    assert a.meta.to_json() == b.meta.to_json()
    assert not np.array_equal(a.frames["observation.state"], c.frames["observation.state"])
    for key, value in a[123].items():
        assert torch.equal(value, b[123][key])


def test_default_size_generates_fast() -> None:
    start = time.perf_counter()
    dataset = make_reach_dataset(ReachDatasetConfig(), CHUNK)
    assert time.perf_counter() - start < 1.0
    assert len(dataset) == 50 * 100
    assert dataset.meta.num_episodes == 50 and dataset.meta.num_frames == 5000 and dataset.meta.fps > 0


def test_item_shapes_and_dtypes() -> None:
    dataset = make_reach_dataset(small(), CHUNK)
    item = dataset[5]
    assert item["observation.state"].shape == (6,) and item["observation.state"].dtype == torch.float32
    assert item["action"].shape == (8, 2) and item["action"].dtype == torch.float32
    assert item["action_is_pad"].shape == (8,) and item["action_is_pad"].dtype == torch.bool
    assert item["episode_index"].dtype == torch.int64 and item["episode_index"].shape == ()
    assert item["index"].item() == 5 and item["episode_index"].item() == 0
    assert IMAGE_KEY not in item
    batch = torch.utils.data.default_collate([dataset[i] for i in range(3)])
    assert batch["action"].shape == (3, 8, 2)


def test_chunks_never_cross_an_episode_and_pad_flags_are_exact() -> None:
    config = small()
    dataset = make_reach_dataset(config, CHUNK)
    actions = dataset.frames["action"]
    length = config.episode_length
    for i in range(len(dataset)):
        item = dataset[i]
        episode, frame = divmod(i, length)
        assert item["episode_index"].item() == episode
        last = episode * length + length - 1
        for k in range(8):
            padded = frame + k >= length
            assert item["action_is_pad"][k].item() == padded
            source = last if padded else i + k
            assert np.array_equal(item["action"][k].numpy(), actions[source])


def test_negative_offsets_pad_at_episode_start() -> None:
    dataset = make_reach_dataset(small(), {"observation.state": [-2, -1, 0], "action": [0]})
    item = dataset[13]  # second frame of episode 1
    assert item["observation.state_is_pad"].tolist() == [True, False, False]
    assert np.array_equal(item["observation.state"][0].numpy(), dataset.frames["observation.state"][12])


def test_unknown_delta_feature_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="observation.velocity"):
        make_reach_dataset(small(), {"observation.velocity": [0, 1]})


def test_expert_moves_the_agent_toward_the_target() -> None:
    config = ReachDatasetConfig(num_episodes=20, episode_length=100)
    states = make_reach_dataset(config, CHUNK).frames["observation.state"].reshape(20, 100, 6)
    start = np.linalg.norm(states[:, 0, 0:2] - states[:, 0, 2:4], axis=1)
    end = np.linalg.norm(states[:, -1, 0:2] - states[:, -1, 2:4], axis=1)
    assert np.all(end < 0.05) and start.mean() > 0.5


def test_images_render_the_agent_where_the_state_says() -> None:
    size = 24
    dataset = make_reach_dataset(small(image=True, image_size=size), CHUNK)
    spec = dataset.meta.features[IMAGE_KEY]
    assert spec.is_image and spec.shape == (3, size, size)
    assert dataset.frames[IMAGE_KEY].dtype == np.uint8
    for i in (0, 17, 40):
        image = dataset[i][IMAGE_KEY]
        assert image.shape == (3, size, size) and image.dtype == torch.float32
        assert 0.0 <= image.min() and image.max() <= 1.0
        x, y = dataset.frames["observation.state"][i][:2]
        col, row = round((x + 1) / 2 * (size - 1)), round((1 - y) / 2 * (size - 1))
        assert image[2, row, col] > 0.8  # the agent blob is mostly blue
    assert dataset.meta.stats[IMAGE_KEY]["mean"].shape == (3, 1, 1)


def test_stats_cover_the_whole_dataset() -> None:
    dataset = make_reach_dataset(small(image=True, image_size=16), CHUNK)
    for key in ("observation.state", "action"):
        frames = dataset.frames[key].astype(np.float64)
        stats = dataset.meta.stats[key]
        assert stats["mean"].dtype == np.float32 and stats["mean"].shape == frames.shape[1:]
        np.testing.assert_allclose(stats["mean"], frames.mean(0), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(stats["std"], frames.std(0), rtol=1e-6, atol=1e-7)
        assert np.array_equal(stats["min"], frames.min(0).astype(np.float32))
        assert np.array_equal(stats["max"], frames.max(0).astype(np.float32))
    pixels = dataset.frames[IMAGE_KEY].astype(np.float64) / 255.0
    np.testing.assert_allclose(dataset.meta.stats[IMAGE_KEY]["mean"].ravel(), pixels.mean((0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(dataset.meta.stats[IMAGE_KEY]["std"].ravel(), pixels.std((0, 2, 3)), rtol=1e-6)


def test_meta_json_round_trip_is_lossless() -> None:
    import json

    meta = make_reach_dataset(small(image=True, image_size=16), CHUNK).meta
    again = DatasetMeta.from_json(json.loads(json.dumps(meta.to_json())))
    assert again.features == meta.features
    assert (again.fps, again.num_episodes, again.num_frames) == (meta.fps, meta.num_episodes, meta.num_frames)
    for key, stats in meta.stats.items():
        for name, value in stats.items():
            assert again.stats[key][name].dtype == np.float32
            assert np.array_equal(again.stats[key][name], value)


def test_in_memory_dataset_rejects_interleaved_episodes() -> None:
    meta = make_reach_dataset(small(), CHUNK).meta
    frames = {"action": np.zeros((4, 2), dtype=np.float32)}
    with pytest.raises(ValueError, match="contiguously"):
        InMemoryDataset(meta, frames, np.array([0, 1, 0, 1]), CHUNK)
