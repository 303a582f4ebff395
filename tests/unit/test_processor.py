"""Normalisation processors: round trips, broadcasting, devices, bit-exact save/load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_kit.core.data.dataset import DatasetMeta, FeatureSpec
from lerobot_kit.core.errors import CheckpointError, ConfigError
from lerobot_kit.core.model.processor import NormalizeStep, PolicyProcessor, make_processors
from lerobot_kit.plugins.datasets.reach.plugin import ReachDatasetConfig
from lerobot_kit.plugins.datasets.reach.data import IMAGE_KEY, make_reach_dataset
from lerobot_kit.plugins.policies.act.configuration import ACTConfig


@pytest.fixture(scope="module")
def dataset():
    return make_reach_dataset(ReachDatasetConfig(num_episodes=6, episode_length=30, image=True, image_size=16),
                              {"action": list(range(5))})


def _batch(dataset, n: int = 6) -> dict[str, torch.Tensor]:
    return torch.utils.data.default_collate([dataset[i] for i in range(0, 7 * n, 7)])


@pytest.mark.parametrize("mode", ["mean_std", "min_max"])
def test_normalise_then_unnormalise_restores_actions(dataset, mode: str) -> None:
    pre, post = make_processors(ACTConfig(normalization=mode), dataset.meta)
    batch = _batch(dataset)
    normalised = pre(batch)
    assert normalised["action"].shape == batch["action"].shape == (6, 5, 2)
    assert not torch.allclose(normalised["action"], batch["action"])
    torch.testing.assert_close(post({"action": normalised["action"]})["action"], batch["action"], rtol=1e-5, atol=1e-6)


def test_mean_std_standardises_the_dataset(dataset) -> None:
    pre, _ = make_processors(ACTConfig(normalization="mean_std"), dataset.meta)
    out = pre({k: torch.from_numpy(dataset.frames[k]) for k in ("observation.state", "action")})
    for key in ("observation.state", "action"):
        torch.testing.assert_close(out[key].double().mean(0), torch.zeros(out[key].shape[1], dtype=torch.float64),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(out[key].double().std(0, unbiased=False),
                                   torch.ones(out[key].shape[1], dtype=torch.float64), atol=1e-4, rtol=0)


def test_min_max_maps_the_dataset_to_minus_one_one(dataset) -> None:
    pre, _ = make_processors(ACTConfig(normalization="min_max"), dataset.meta)
    out = pre({"action": torch.from_numpy(dataset.frames["action"])})["action"]
    torch.testing.assert_close(out.min(0).values, -torch.ones(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.max(0).values, torch.ones(2), atol=1e-6, rtol=0)


def test_images_are_standardised_per_channel_whatever_the_mode(dataset) -> None:
    stats = dataset.meta.stats[IMAGE_KEY]
    for mode in ("mean_std", "min_max"):
        pre, _ = make_processors(ACTConfig(normalization=mode), dataset.meta)
        image = _batch(dataset)[IMAGE_KEY]
        expected = (image - torch.from_numpy(stats["mean"])) / (torch.from_numpy(stats["std"]) + 1e-8)
        torch.testing.assert_close(pre({IMAGE_KEY: image})[IMAGE_KEY], expected)


def test_other_keys_pass_through_and_missing_keys_are_skipped(dataset) -> None:
    pre, post = make_processors(ACTConfig(), dataset.meta)
    batch = _batch(dataset)
    out = pre({"observation.state": batch["observation.state"], "index": batch["index"],
               "action_is_pad": batch["action_is_pad"]})
    assert "action" not in out
    assert out["index"] is batch["index"] and out["action_is_pad"] is batch["action_is_pad"]
    assert post({"observation.state": batch["observation.state"]})["observation.state"] is batch["observation.state"]


def test_stats_broadcast_over_leading_dims_and_follow_device_and_dtype(dataset) -> None:
    pre, post = make_processors(ACTConfig(), dataset.meta)
    action = torch.randn(2, 3, 4, 2, dtype=torch.float64)
    restored = post(pre({"action": action}))["action"]
    assert restored.dtype == torch.float64 and restored.shape == action.shape
    torch.testing.assert_close(restored, action)
    on_meta = pre({"action": torch.empty(4, 2, device="meta"), IMAGE_KEY: torch.empty(4, 3, 16, 16, device="meta")})
    assert on_meta["action"].device.type == "meta" and on_meta[IMAGE_KEY].shape == (4, 3, 16, 16)


def test_save_load_is_bit_exact(dataset, tmp_path: Path) -> None:
    pre, post = make_processors(ACTConfig(normalization="min_max"), dataset.meta)
    pre.save(tmp_path, "policy_preprocessor")
    post.save(tmp_path, "policy_postprocessor")
    saved = json.loads((tmp_path / "policy_preprocessor.json").read_text())
    assert saved["steps"][0]["registry_name"] == "normalize"
    assert saved["steps"][0]["state_file"] == "policy_preprocessor_step_0_normalize.safetensors"
    assert (tmp_path / "policy_postprocessor_step_0_unnormalize.safetensors").is_file()
    for original, name in ((pre, "policy_preprocessor"), (post, "policy_postprocessor")):
        loaded = PolicyProcessor.load(tmp_path, name)
        assert [type(s) for s in loaded.steps] == [type(s) for s in original.steps]
        for a, b in zip(original.steps, loaded.steps):
            assert a.config() == b.config()
            assert a.state_dict().keys() == b.state_dict().keys()
            for key, tensor in a.state_dict().items():
                assert torch.equal(tensor, b.state_dict()[key]) and b.state_dict()[key].dtype == torch.float32
    batch = _batch(dataset)
    again = PolicyProcessor.load(tmp_path, "policy_preprocessor")(batch)
    for key, value in pre(batch).items():
        assert torch.equal(value, again[key])


def test_loaded_stats_equal_the_dataset_meta_bitwise(dataset, tmp_path: Path) -> None:
    pre, _ = make_processors(ACTConfig(), dataset.meta)
    pre.save(tmp_path, "p")
    state = PolicyProcessor.load(tmp_path, "p").steps[0].state_dict()
    for key, stats in dataset.meta.stats.items():
        for name, value in stats.items():
            assert np.array_equal(state[f"{key}.{name}"].numpy(), value)


def test_load_errors_name_the_file(dataset, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="policy_preprocessor.json: missing"):
        PolicyProcessor.load(tmp_path, "policy_preprocessor")
    pre, _ = make_processors(ACTConfig(), dataset.meta)
    pre.save(tmp_path, "policy_preprocessor")
    (tmp_path / "policy_preprocessor_step_0_normalize.safetensors").unlink()
    missing = "refers to policy_preprocessor_step_0_normalize.safetensors, which is missing"
    with pytest.raises(CheckpointError, match=missing):
        PolicyProcessor.load(tmp_path, "policy_preprocessor")
    (tmp_path / "policy_preprocessor.json").write_text(json.dumps({"steps": [{"registry_name": "tokenize"}]}))
    with pytest.raises(CheckpointError, match="unknown processor step 'tokenize'"):
        PolicyProcessor.load(tmp_path, "policy_preprocessor")


def test_missing_stats_is_a_config_error() -> None:
    meta = DatasetMeta({"action": FeatureSpec("float32", (2,))}, {"action": {"mean": np.zeros(2, np.float32)}}, 10, 1, 1)
    with pytest.raises(ConfigError, match="no \\['std'\\] stats"):
        make_processors(ACTConfig(), meta)
    with pytest.raises(ConfigError, match="not one of"):
        NormalizeStep({"action": "zscore"}, {"action": {}})  # type: ignore[dict-item]
