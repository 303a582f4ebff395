"""The torch-free ``weight_shapes`` of the built-in policies equal their built models' ``state_dict`` shapes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lerobot_kit.api import WeightShapes
from lerobot_kit.core.data.dataset import DatasetMeta, FeatureSpec
from lerobot_kit.core.model.policy import make_policy
from lerobot_kit.plugins.policies.act.configuration import ACTConfig
from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig


def _meta(state: int, action: int, cameras: int) -> DatasetMeta:
    features = {"action": FeatureSpec("float32", (action,))}
    if state:
        features["observation.state"] = FeatureSpec("float32", (state,))
    for i in range(cameras):
        features[f"observation.images.cam{i}"] = FeatureSpec("image", (3, 16, 16))
    return DatasetMeta(features=features, stats={}, fps=10, num_episodes=1, num_frames=10)


def _assert_equal_to_built(config: ACTConfig | DiffusionConfig, meta: DatasetMeta) -> None:
    assert isinstance(config, WeightShapes)
    with torch.device("meta"):
        built = {k: tuple(v.shape) for k, v in make_policy(config, meta).state_dict().items()}
    assert config.weight_shapes(meta) == built


ACT_CASES = [
    (dict(), (2, 2, 0)),
    (dict(dim_model=32, n_heads=2, dim_feedforward=48, n_encoder_layers=3, n_decoder_layers=2, chunk_size=7,
          n_action_steps=3, latent_dim=5, n_vae_encoder_layers=1), (4, 3, 1)),
    (dict(use_vae=False, pre_norm=True), (0, 2, 2)),
    (dict(pre_norm=True, feedforward_activation="gelu"), (3, 6, 0)),
]


@pytest.mark.parametrize(("fields", "sizes"), ACT_CASES)
def test_act_shapes_equal_the_model(fields: dict, sizes: tuple[int, int, int]) -> None:
    _assert_equal_to_built(ACTConfig(**fields), _meta(*sizes))


DIFFUSION_CASES = [
    (dict(dim_model=32, n_heads=2, dim_feedforward=64, n_layers=2), (2, 2, 0)),
    (dict(dim_model=16, n_heads=4, dim_feedforward=40, n_layers=1, n_obs_steps=3, horizon=6, n_action_steps=2,
          image_keypoints=5), (3, 4, 2)),
    (dict(dim_model=24, n_heads=3, n_layers=1, n_obs_steps=1), (0, 2, 1)),
]


@pytest.mark.parametrize(("fields", "sizes"), DIFFUSION_CASES)
def test_diffusion_shapes_equal_the_model(fields: dict, sizes: tuple[int, int, int]) -> None:
    _assert_equal_to_built(DiffusionConfig(**fields), _meta(*sizes))


def test_shapes_refuse_a_dataset_the_model_refuses() -> None:
    with pytest.raises(ValueError, match="needs an 'action' feature"):
        ACTConfig().weight_shapes(DatasetMeta(features={}, stats={}, fps=10, num_episodes=1, num_frames=1))
    with pytest.raises(ValueError, match="needs 'observation.state' or an image feature"):
        DiffusionConfig().weight_shapes(_meta(0, 2, 0))


def test_shapes_are_computed_without_torch() -> None:
    code = (
        "import sys\n"
        "from lerobot_kit.core.data.dataset import DatasetMeta, FeatureSpec\n"
        "from lerobot_kit.plugins.policies.act.configuration import ACTConfig\n"
        "from lerobot_kit.plugins.policies.diffusion.configuration import DiffusionConfig\n"
        "features = {'action': FeatureSpec('float32', (2,)), 'observation.images.a': FeatureSpec('image', (3, 8, 8))}\n"
        "meta = DatasetMeta(features, {}, 10, 1, 1)\n"
        "assert ACTConfig().weight_shapes(meta) and DiffusionConfig().weight_shapes(meta)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
