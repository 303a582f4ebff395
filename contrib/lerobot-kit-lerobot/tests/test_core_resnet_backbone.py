"""The core ACT policy's ``resnet18`` vision backbone, planned without torch, against the built
model. It needs torchvision, which the core's CPU test venv cannot install (PyPI's
torchvision for torch 2.13 is a CUDA build whose operators a CPU torch lacks) and which
LeRobot brings here."""

from __future__ import annotations

import torch

from lerobot_kit.api import DatasetMeta, FeatureSpec, WeightShapes, build_policy, parse_train_config


def test_core_act_resnet18_planned_shapes_equal_the_built_model() -> None:
    features = {"action": FeatureSpec("float32", (2,)), "observation.state": FeatureSpec("float32", (2,)),
                "observation.images.cam0": FeatureSpec("image", (3, 16, 16))}
    meta = DatasetMeta(features=features, stats={}, fps=10, num_episodes=1, num_frames=10)
    config = parse_train_config(["--policy.type=act", "--policy.vision_backbone=resnet18"]).policy
    assert isinstance(config, WeightShapes)
    with torch.device("meta"):
        built = {k: tuple(v.shape) for k, v in build_policy(config, meta).state_dict().items()}
    assert any("backbone" in key for key in built)
    assert config.weight_shapes(meta) == built
