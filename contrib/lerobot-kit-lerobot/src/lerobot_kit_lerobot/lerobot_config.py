"""lerobot-kit's config and dataset description -> LeRobot's own config object.

LeRobot's config dataclass is the one source of truth for what a policy needs: it is
decoded by draccus exactly as LeRobot decodes a ``config.json`` (enums, tuples, checks
in ``__post_init__``), its features come from the dataset by LeRobot's own
``dataset_to_policy_features``, and the frame offsets a run stacks are its
``*_delta_indices`` properties.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import draccus
import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies import ACTConfig  # noqa: F401 - importing it registers every LeRobot policy type
from lerobot.utils.feature_utils import dataset_to_policy_features

from lerobot_kit.api import ACTION_KEY, ALL_OBSERVATIONS, ConfigError, DatasetMeta

if TYPE_CHECKING:
    from lerobot_kit_lerobot.configuration import LerobotPolicyConfig

def to_lerobot_config(config: LerobotPolicyConfig, meta: DatasetMeta | None = None) -> PreTrainedConfig:
    """LeRobot's config for ``config``; with ``meta``, its input and output features too.

    Raises ``ValueError`` (a flag error when validating) for settings LeRobot refuses.
    """
    config_class = PreTrainedConfig.get_choice_class(config.lerobot_type)
    raw = {
        **config.lerobot_values(),
        # The device a lerobot-kit run trains on (LeRobot would guess it, warning each time).
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "repo_id": config.repo_id,
        "push_to_hub": config.push_to_hub,
        "private": config.private,
    }
    try:
        lerobot_config = draccus.decode(config_class, raw)
    except (ValueError, TypeError, NotImplementedError, draccus.ParsingError) as exc:
        # draccus wraps what __post_init__ raised; LeRobot's own message is the cause.
        reason = exc.__cause__ if isinstance(exc, draccus.ParsingError) and exc.__cause__ else exc
        raise ValueError(f"LeRobot's {config_class.__name__} refuses these settings: {reason}") from exc
    if meta is not None:
        features = dataset_to_policy_features(lerobot_features(meta))
        # As LeRobot's make_policy does: actions are outputs, every other feature an input.
        lerobot_config.output_features = {k: f for k, f in features.items() if k == ACTION_KEY}
        lerobot_config.input_features = {k: f for k, f in features.items() if k != ACTION_KEY}
        # As make_policy does: the action's joint names, for π0/π0.5's relative actions.
        if getattr(lerobot_config, "action_feature_names", False) is None and ACTION_KEY in meta.features:
            lerobot_config.action_feature_names = meta.features[ACTION_KEY].names
        try:
            lerobot_config.validate_features()
        except ValueError as exc:
            raise ConfigError(
                f"policy.type={config.type} cannot use this dataset (features {sorted(meta.features)}): {exc}"
            ) from exc
    return lerobot_config


def lerobot_features(meta: DatasetMeta) -> dict[str, dict[str, Any]]:
    """The dataset's float and image features in LeRobot's dataset ``features`` format
    (images channel-first, so named ``channels, height, width``)."""
    features: dict[str, dict[str, Any]] = {}
    for key, spec in meta.features.items():
        if spec.is_image:
            features[key] = {"dtype": "video", "shape": tuple(spec.shape), "names": ["channels", "height", "width"]}
        elif spec.dtype == "float32":
            features[key] = {"dtype": "float32", "shape": tuple(spec.shape), "names": spec.names}
    return features


def delta_indices(config: LerobotPolicyConfig) -> dict[str, list[int]]:
    """The frame offsets LeRobot's ``delta_timestamps`` would load, as lerobot-kit's
    ``delta_indices``: LeRobot applies the observation offsets to every feature named
    ``observation.*`` (the state, every camera, an environment state)."""
    lerobot_config = to_lerobot_config(config)
    offsets: dict[str, list[int]] = {}
    if lerobot_config.action_delta_indices is not None:
        offsets[ACTION_KEY] = list(lerobot_config.action_delta_indices)
    if lerobot_config.observation_delta_indices is not None:
        offsets[ALL_OBSERVATIONS] = list(lerobot_config.observation_delta_indices)
    if lerobot_config.reward_delta_indices is not None:
        raise ConfigError(
            f"policy.type={config.type} learns from rewards (reinforcement learning), which lerobot-kit's "
            "datasets do not hold; train it with LeRobot's own scripts"
        )
    return offsets
